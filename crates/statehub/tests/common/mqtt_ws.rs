//! MQTT over a WebSocket byte for byte, for `mqtt_ws.rs` (`ws://`) and `mqtt_wss.rs`
//! (`wss://`): the packets they send and expect, and reading what the server sends.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

/// Generous: a loaded machine runs everything several times slower.
pub const WAIT: Duration = Duration::from_secs(30);

/// MQTT 3.1.1 CONNECT, clean session, keep alive 60, client id "c1".
pub const CONNECT: [u8; 16] = [
    0x10, 14, 0, 4, b'M', b'Q', b'T', b'T', 4, 0x02, 0, 60, 0, 2, b'c', b'1',
];
pub const CONNACK: [u8; 4] = [0x20, 2, 0, 0];
/// SUBSCRIBE id 1 to "t" QoS 0.
pub const SUBSCRIBE: [u8; 8] = [0x82, 6, 0, 1, 0, 1, b't', 0];
pub const SUBACK: [u8; 5] = [0x90, 3, 0, 1, 0];
/// PUBLISH QoS 0 "t" "hi".
pub const PUBLISH: [u8; 7] = [0x30, 5, 0, 1, b't', b'h', b'i'];
pub const PINGREQ: [u8; 2] = [0xC0, 0];
pub const PINGRESP: [u8; 2] = [0xD0, 0];

/// Reads binary messages until `want` bytes came, then checks they are exactly `want`.
pub async fn expect_bytes<S: AsyncRead + AsyncWrite + Unpin>(
    ws: &mut WebSocketStream<S>,
    want: &[u8],
) {
    let mut got = Vec::new();
    while got.len() < want.len() {
        let next = tokio::time::timeout(WAIT, ws.next()).await;
        match next
            .expect("no answer from the server")
            .expect("stream ended")
        {
            Ok(Message::Binary(b)) => got.extend_from_slice(&b),
            Ok(Message::Ping(_) | Message::Pong(_)) => {}
            other => panic!("expected binary MQTT bytes, got {other:?}"),
        }
    }
    assert_eq!(got, want);
}

/// Reads until the server's close frame: its code; `None` if the connection ends
/// without one.
pub async fn close_code<S: AsyncRead + AsyncWrite + Unpin>(
    ws: &mut WebSocketStream<S>,
) -> Option<u16> {
    loop {
        let next = tokio::time::timeout(WAIT, ws.next()).await;
        match next.expect("the server did not close the connection") {
            Some(Ok(Message::Close(frame))) => return frame.map(|f| u16::from(f.code)),
            Some(Ok(_)) => continue,
            Some(Err(_)) | None => return None,
        }
    }
}

/// Sends [`CONNECT`] and expects [`CONNACK`].
pub async fn mqtt_connect<S: AsyncRead + AsyncWrite + Unpin>(ws: &mut WebSocketStream<S>) {
    ws.send(Message::binary(CONNECT.to_vec())).await.unwrap();
    expect_bytes(ws, &CONNACK).await;
}

/// CONNECT split over three messages (inside the fixed header, inside the protocol
/// name), then SUBSCRIBE, PUBLISH (to itself) and PINGREQ packed in one message: all
/// three are handled before the delivery is written.
pub async fn split_and_packed<S: AsyncRead + AsyncWrite + Unpin>(ws: &mut WebSocketStream<S>) {
    for part in [&CONNECT[..1], &CONNECT[1..6], &CONNECT[6..]] {
        ws.send(Message::binary(part.to_vec())).await.unwrap();
    }
    expect_bytes(ws, &CONNACK).await;
    let three = [&SUBSCRIBE[..], &PUBLISH[..], &PINGREQ[..]].concat();
    ws.send(Message::binary(three)).await.unwrap();
    let answers = [&SUBACK[..], &PINGRESP[..], &PUBLISH[..]].concat();
    expect_bytes(ws, &answers).await;
}
