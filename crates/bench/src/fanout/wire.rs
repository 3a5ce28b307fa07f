//! The two wire protocols the fan-out scenario speaks, reduced to what it needs:
//! Web PubSub's `json.reliable.webpubsub.azure.v1` and Socket.IO v5 over Engine.IO
//! v4's WebSocket transport.
//!
//! Incoming frames are classified by scanning for the few fields the scenario
//! reads instead of parsing the whole JSON: with 1,000 subscribers the load tool
//! reads hundreds of thousands of frames a second on one core, and must not be the
//! bottleneck it measures.

/// Which server the scenario drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Target {
    /// statehub's Web PubSub service, reliable JSON subprotocol.
    Statehub,
    /// A Socket.IO 4 server (`scripts/socketio-bench/server.mjs`).
    Socketio,
}

/// The reliable JSON subprotocol.
pub const WPS_SUBPROTOCOL: &str = "json.reliable.webpubsub.azure.v1";

/// The group (Socket.IO: room) every subscriber is in.
pub const GROUP: &str = "bench";

/// What an incoming text frame means to the scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Incoming {
    /// A fanned-out message: publisher's sequence number and send time, and the
    /// reliable sequence id (0 on Socket.IO).
    Data { i: u64, t: u64, seq: u64 },
    /// The server acknowledged publish `id`.
    Ack { id: u64 },
    /// Engine.IO ping: answer `3`.
    Ping,
    /// The handshake is complete (`connected` system message; Socket.IO `40…`).
    Connected,
    /// Anything else (Engine.IO open packet, pongs…).
    Other,
}

/// Classifies one frame.
pub fn classify(target: Target, frame: &str) -> Incoming {
    match target {
        Target::Statehub => classify_wps(frame),
        Target::Socketio => classify_sio(frame),
    }
}

fn classify_wps(frame: &str) -> Incoming {
    if frame.starts_with(r#"{"type":"message""#) {
        return data(frame, number_after(frame, "\"sequenceId\":").unwrap_or(0));
    }
    if frame.starts_with(r#"{"type":"ack""#) {
        if let Some(id) = number_after(frame, "\"ackId\":") {
            return Incoming::Ack { id };
        }
    }
    if frame.contains(r#""event":"connected""#) {
        return Incoming::Connected;
    }
    Incoming::Other
}

fn classify_sio(frame: &str) -> Incoming {
    match frame.as_bytes() {
        [b'2', ..] if frame.len() == 1 => Incoming::Ping,
        [b'4', b'2', ..] => data(frame, 0),
        [b'4', b'3', ..] => {
            let digits = frame[2..].bytes().take_while(u8::is_ascii_digit).count();
            frame[2..2 + digits]
                .parse()
                .map_or(Incoming::Other, |id| Incoming::Ack { id })
        }
        [b'4', b'0', ..] => Incoming::Connected,
        _ => Incoming::Other,
    }
}

fn data(frame: &str, seq: u64) -> Incoming {
    match (number_after(frame, "\"i\":"), number_after(frame, "\"t\":")) {
        (Some(i), Some(t)) => Incoming::Data { i, t, seq },
        _ => Incoming::Other,
    }
}

/// The unsigned integer right after the first `key` in `frame`.
fn number_after(frame: &str, key: &str) -> Option<u64> {
    let at = frame.find(key)? + key.len();
    let digits = frame[at..].bytes().take_while(u8::is_ascii_digit).count();
    frame[at..at + digits].parse().ok()
}

/// The JSON payload of publish `i` sent at `t` ns, padded to about `size` bytes.
pub fn payload(i: u64, t: u64, padding: &str) -> String {
    format!(r#"{{"i":{i},"t":{t},"p":"{padding}"}}"#)
}

/// The frame that publishes `payload` with ack id `id`.
pub fn publish_frame(target: Target, id: u64, payload: &str) -> String {
    match target {
        Target::Statehub => format!(
            r#"{{"type":"sendToGroup","group":"{GROUP}","ackId":{id},"dataType":"json","data":{payload}}}"#
        ),
        Target::Socketio => format!(r#"42{id}["pub",{payload}]"#),
    }
}

/// A reliable subscriber's acknowledgement of everything up to `seq`.
pub fn sequence_ack(seq: u64) -> String {
    format!(r#"{{"type":"sequenceAck","sequenceId":{seq}}}"#)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn web_pubsub_frames() {
        let msg = r#"{"type":"message","from":"group","group":"bench","dataType":"json","data":{"i":7,"t":123,"p":"xx"},"sequenceId":42}"#;
        assert_eq!(
            classify(Target::Statehub, msg),
            Incoming::Data {
                i: 7,
                t: 123,
                seq: 42
            }
        );
        let ack = r#"{"type":"ack","ackId":9,"success":true}"#;
        assert_eq!(classify(Target::Statehub, ack), Incoming::Ack { id: 9 });
        let connected =
            r#"{"type":"system","event":"connected","connectionId":"c","reconnectionToken":"r"}"#;
        assert_eq!(classify(Target::Statehub, connected), Incoming::Connected);
        assert_eq!(
            classify(Target::Statehub, r#"{"type":"pong"}"#),
            Incoming::Other
        );
    }

    #[test]
    fn socket_io_frames() {
        assert_eq!(classify(Target::Socketio, "2"), Incoming::Ping);
        assert_eq!(classify(Target::Socketio, "3"), Incoming::Other);
        assert_eq!(
            classify(Target::Socketio, r#"0{"sid":"a","pingInterval":25000}"#),
            Incoming::Other
        );
        assert_eq!(
            classify(Target::Socketio, r#"40{"sid":"b","pid":"p"}"#),
            Incoming::Connected
        );
        let event = r#"42["msg",{"i":3,"t":99,"p":""},"offset-1"]"#;
        assert_eq!(
            classify(Target::Socketio, event),
            Incoming::Data {
                i: 3,
                t: 99,
                seq: 0
            }
        );
        assert_eq!(
            classify(Target::Socketio, "4317[]"),
            Incoming::Ack { id: 17 }
        );
    }

    #[test]
    fn frames_round_trip_through_the_classifier() {
        let p = payload(5, 6, "abc");
        let wps = publish_frame(Target::Statehub, 11, &p);
        let v: serde_json::Value = serde_json::from_str(&wps).unwrap();
        assert_eq!(v["data"]["i"], 5);
        assert_eq!(v["ackId"], 11);
        let sio = publish_frame(Target::Socketio, 12, &p);
        assert!(sio.starts_with("4212[\"pub\",{"));
        let v: serde_json::Value = serde_json::from_str(&sio[4..]).unwrap();
        assert_eq!(v[1]["t"], 6);
        assert_eq!(sequence_ack(8), r#"{"type":"sequenceAck","sequenceId":8}"#);
    }
}
