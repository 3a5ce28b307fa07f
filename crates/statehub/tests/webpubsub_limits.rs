//! Web PubSub limits against the binary: an oversize frame is answered with close
//! 1009 on every subprotocol; an idle WebSocket holds little memory.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{rss_kib, start_configured, Server};
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

const KEY: &str = "webpubsub-limits-test-key";
const SUBPROTOCOLS: [Option<&str>; 5] = [
    None,
    Some("json.webpubsub.azure.v1"),
    Some("json.reliable.webpubsub.azure.v1"),
    Some("protobuf.webpubsub.azure.v1"),
    Some("protobuf.reliable.webpubsub.azure.v1"),
];

use common::wps::Ws;

/// The binary with Web PubSub on and these `[webpubsub.limits]` lines.
fn start_wps(limits: &str) -> Server {
    start_configured(
        &format!("[webpubsub]\naccess_keys = [\"{KEY}\"]\n\n[webpubsub.limits]\n{limits}\n"),
        &[],
    )
}

async fn connect(addr: SocketAddr, protocol: Option<&str>) -> Ws {
    common::wps::client(addr, KEY, "chat", protocol).await
}

/// Reads until the server's close frame; `None` if the connection ends without one.
async fn close_code(ws: &mut futures_util::stream::SplitStream<Ws>) -> Option<u16> {
    while let Some(frame) = ws.next().await {
        match frame {
            Ok(Message::Close(frame)) => return frame.map(|f| u16::from(f.code)),
            Ok(_) => continue,
            Err(_) => return None,
        }
    }
    None
}

#[tokio::test]
async fn an_oversize_frame_is_closed_with_1009_on_every_subprotocol() {
    let server = start_wps("max_frame_bytes = 65536");
    for protocol in SUBPROTOCOLS {
        let ws = connect(server.http, protocol).await;
        let (mut sink, mut stream) = ws.split();
        // 1 MiB: more than the socket buffers hold, so the server must read past it
        // for the close frame to arrive. A real client reads while it writes.
        let big = vec![b'x'; 1 << 20];
        let frame = if protocol.is_some_and(|p| p.starts_with("json")) {
            Message::text(String::from_utf8(big).unwrap())
        } else {
            Message::binary(big)
        };
        let writer = tokio::spawn(async move {
            let _ = sink.send(frame).await;
            sink
        });
        let code = tokio::time::timeout(Duration::from_secs(60), close_code(&mut stream))
            .await
            .expect("the connection ends");
        assert_eq!(code, Some(1009), "subprotocol {protocol:?}");
        drop(writer.await);
    }
}

/// Opens `n` reliable JSON connections and reads each one's `connected` message.
async fn idle_connections(addr: SocketAddr, n: usize) -> Vec<Ws> {
    let mut all = Vec::with_capacity(n);
    for _ in 0..n {
        let mut ws = connect(addr, Some("json.reliable.webpubsub.azure.v1")).await;
        match ws.next().await {
            Some(Ok(Message::Text(t))) => assert!(t.contains("connected"), "{t}"),
            other => panic!("expected the connected message, got {other:?}"),
        }
        all.push(ws);
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_websocket_holds_little_memory() {
    const N: usize = 500;
    let server = start_wps("");
    let pid = server.child.id();
    // One connection first, so the hub and the runtime's lazy parts exist.
    let first = idle_connections(server.http, 1).await;
    let before = rss_kib(pid);
    let conns = idle_connections(server.http, N).await;
    let after = rss_kib(pid);
    let per_connection = (after.saturating_sub(before) * 1024) / N as u64;
    eprintln!(
        "RSS {before} KiB -> {after} KiB with {N} idle WebSockets: {per_connection} bytes each"
    );
    drop((first, conns));
}
