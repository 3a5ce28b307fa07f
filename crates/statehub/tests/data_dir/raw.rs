//! A blocking MQTT 5 client for the data directory tests: CONNECT, SUBSCRIBE to its
//! response topic, state store request/response, QoS 1 PUBLISH.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::common::connect_tcp;

/// A blocking MQTT 5 client: CONNECT, SUBSCRIBE to its response topic, request/response.
pub struct Raw {
    pub stream: std::net::TcpStream,
    response_topic: String,
    next_id: u16,
}

fn varint(mut n: usize, out: &mut Vec<u8>) {
    loop {
        let mut b = (n % 128) as u8;
        n /= 128;
        if n > 0 {
            b |= 0x80;
        }
        out.push(b);
        if n == 0 {
            return;
        }
    }
}

fn string(s: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&(s.len() as u16).to_be_bytes());
    out.extend_from_slice(s);
}

fn packet(header: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![header];
    varint(body.len(), &mut out);
    out.extend_from_slice(body);
    out
}

impl Raw {
    pub fn connect(addr: SocketAddr, id: &str) -> Raw {
        Raw::connect_with(addr, id, &[0x02, 0, 60, 0])
    }

    /// A persistent session (Clean Start 0, Session Expiry 3600).
    pub fn connect_persistent(addr: SocketAddr, id: &str) -> Raw {
        Raw::connect_with(addr, id, &[0x00, 0, 60, 5, 0x11, 0, 0, 0x0e, 0x10])
    }

    /// CONNECT with `flags_to_props` (flags, keep alive, properties), then SUBSCRIBE
    /// to the response topic.
    pub fn connect_with(addr: SocketAddr, id: &str, flags_to_props: &[u8]) -> Raw {
        let mut stream = connect_tcp(addr);
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut body = vec![0, 4, b'M', b'Q', b'T', b'T', 5];
        body.extend_from_slice(flags_to_props);
        string(id.as_bytes(), &mut body);
        stream.write_all(&packet(0x10, &body)).unwrap();
        let mut raw = Raw {
            stream,
            response_topic: format!("clients/{id}/response"),
            next_id: 1,
        };
        let (kind, _) = raw.read_packet();
        assert_eq!(kind >> 4, 2, "expected CONNACK");
        let mut body = vec![0, 1, 0];
        string(raw.response_topic.as_bytes(), &mut body);
        body.push(0x01);
        raw.stream.write_all(&packet(0x82, &body)).unwrap();
        let (kind, _) = raw.read_packet();
        assert_eq!(kind >> 4, 9, "expected SUBACK");
        raw
    }

    pub fn read_packet(&mut self) -> (u8, Vec<u8>) {
        self.try_read_packet().expect("read packet")
    }

    /// The next packet, `None` if none came within the read timeout (or the connection
    /// closed).
    pub fn try_read_packet(&mut self) -> Option<(u8, Vec<u8>)> {
        let mut head = [0u8; 1];
        self.stream.read_exact(&mut head).ok()?;
        let (mut len, mut shift) = (0usize, 0);
        loop {
            let mut b = [0u8; 1];
            self.stream.read_exact(&mut b).unwrap();
            len |= usize::from(b[0] & 0x7f) << shift;
            shift += 7;
            if b[0] & 0x80 == 0 {
                break;
            }
        }
        let mut body = vec![0u8; len];
        self.stream.read_exact(&mut body).unwrap();
        Some((head[0], body))
    }

    /// One request (QoS 1, as the SDKs send it); returns the response payload.
    pub fn call(&mut self, args: &[&[u8]]) -> Vec<u8> {
        self.send_request(args, 10);
        loop {
            if let Some(reply) = self.reply() {
                return reply.payload;
            }
        }
    }

    /// Sends one request with a Message Expiry of `expiry_secs`, without waiting for its
    /// reply; returns its Correlation Data (the packet id, big-endian).
    pub fn send_request(&mut self, args: &[&[u8]], expiry_secs: u32) -> [u8; 2] {
        let mut payload = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            payload.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            payload.extend_from_slice(a);
            payload.extend_from_slice(b"\r\n");
        }
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis();
        let correlation = self.next_id.to_be_bytes();
        let mut props = vec![0x08];
        string(self.response_topic.as_bytes(), &mut props);
        props.push(0x09);
        string(&correlation, &mut props);
        props.push(0x02);
        props.extend_from_slice(&expiry_secs.to_be_bytes());
        props.push(0x26);
        string(b"__ts", &mut props);
        string(format!("{ms:015}:00000:client").as_bytes(), &mut props);
        let mut body = Vec::new();
        string(
            b"statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke",
            &mut body,
        );
        body.extend_from_slice(&self.next_id.to_be_bytes());
        varint(props.len(), &mut body);
        body.extend_from_slice(&props);
        body.extend_from_slice(&payload);
        self.stream.write_all(&packet(0x32, &body)).unwrap();
        self.next_id += 1;
        correlation
    }

    /// Reads one packet: a reply if it is a PUBLISH (acknowledged), `None` for any other
    /// packet. Panics if none comes within the read timeout.
    pub fn reply(&mut self) -> Option<Reply> {
        let (kind, body) = self.read_packet();
        self.publish(kind, body)
    }

    /// The next reply within `wait`, skipping other packets; `None` if none came.
    pub fn reply_within(&mut self, wait: Duration) -> Option<Reply> {
        let deadline = std::time::Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return None;
            }
            self.stream.set_read_timeout(Some(left)).unwrap();
            let packet = self.try_read_packet();
            self.stream
                .set_read_timeout(Some(Duration::from_secs(20)))
                .unwrap();
            let (kind, body) = packet?;
            if let Some(reply) = self.publish(kind, body) {
                return Some(reply);
            }
        }
    }

    fn publish(&mut self, kind: u8, body: Vec<u8>) -> Option<Reply> {
        if kind >> 4 != 3 {
            return None;
        }
        // PUBLISH QoS 1: topic, packet id, properties, payload. Acknowledge it.
        let topic_len = usize::from(u16::from_be_bytes([body[0], body[1]]));
        let id = [body[2 + topic_len], body[3 + topic_len]];
        self.stream.write_all(&[0x40, 2, id[0], id[1]]).unwrap();
        let mut at = 4 + topic_len;
        let props_len = read_varint(&body, &mut at);
        let end = at + props_len;
        let mut reply = Reply {
            payload: body[end..].to_vec(),
            ..Reply::default()
        };
        while at < end {
            let id = body[at];
            at += 1;
            let take = |at: &mut usize| {
                let len = usize::from(u16::from_be_bytes([body[*at], body[*at + 1]]));
                *at += 2 + len;
                body[*at - len..*at].to_vec()
            };
            match id {
                0x01 => at += 1,
                0x02 => at += 4,
                0x23 => at += 2,
                0x0B => drop(read_varint(&body, &mut at)),
                0x09 => reply.correlation = take(&mut at),
                0x26 => {
                    let k = String::from_utf8(take(&mut at)).unwrap();
                    let v = String::from_utf8(take(&mut at)).unwrap();
                    reply.user.push((k, v));
                }
                _ => drop(take(&mut at)),
            }
        }
        Some(reply)
    }
}

fn read_varint(body: &[u8], at: &mut usize) -> usize {
    let (mut n, mut shift) = (0usize, 0);
    loop {
        let b = body[*at];
        *at += 1;
        n |= usize::from(b & 0x7f) << shift;
        shift += 7;
        if b & 0x80 == 0 {
            return n;
        }
    }
}

/// A state store reply.
#[derive(Debug, Default)]
pub struct Reply {
    pub correlation: Vec<u8>,
    pub user: Vec<(String, String)>,
    pub payload: Vec<u8>,
}

impl Reply {
    pub fn user(&self, name: &str) -> Option<&str> {
        self.user
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

impl Raw {
    /// Sends a QoS 1 PUBLISH without waiting for its PUBACK.
    pub fn send_publish(&mut self, topic: &str, payload: &[u8], retain: bool) {
        let mut body = Vec::new();
        string(topic.as_bytes(), &mut body);
        body.extend_from_slice(&self.next_id.to_be_bytes());
        body.push(0);
        body.extend_from_slice(payload);
        let header = if retain { 0x33 } else { 0x32 };
        self.stream.write_all(&packet(header, &body)).unwrap();
        self.next_id += 1;
    }

    /// The reason code of the next PUBACK within `wait`, skipping other packets; `None` if
    /// none came (a DISCONNECT panics).
    pub fn puback_within(&mut self, wait: Duration) -> Option<u8> {
        let deadline = std::time::Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return None;
            }
            self.stream.set_read_timeout(Some(left)).unwrap();
            let packet = self.try_read_packet();
            self.stream
                .set_read_timeout(Some(Duration::from_secs(20)))
                .unwrap();
            let (kind, body) = packet?;
            match kind >> 4 {
                4 => return Some(body.get(2).copied().unwrap_or(0)),
                14 => panic!("DISCONNECT {:#04x} instead of a PUBACK", body[0]),
                _ => {}
            }
        }
    }

    /// SUBSCRIBEs to `filter` and returns the payload of the first (retained) message
    /// that arrives within `wait`.
    pub fn retained(&mut self, filter: &str, wait: Duration) -> Option<Vec<u8>> {
        let mut body = vec![0, 2, 0];
        string(filter.as_bytes(), &mut body);
        body.push(0x01);
        self.stream.write_all(&packet(0x82, &body)).unwrap();
        self.reply_within(wait).map(|r| r.payload)
    }

    /// A QoS 1 PUBLISH, waiting for its PUBACK.
    pub fn publish_to(&mut self, topic: &str, payload: &[u8]) {
        let mut body = Vec::new();
        string(topic.as_bytes(), &mut body);
        body.extend_from_slice(&self.next_id.to_be_bytes());
        body.push(0);
        body.extend_from_slice(payload);
        self.stream.write_all(&packet(0x32, &body)).unwrap();
        self.next_id += 1;
        loop {
            let (kind, _) = self.read_packet();
            if kind >> 4 == 4 {
                return;
            }
        }
    }
}

/// Every key, through SCAN (pages of keys without their values).
pub fn scan(c: &mut Raw) -> std::collections::HashSet<Vec<u8>> {
    let mut keys = std::collections::HashSet::new();
    let mut token: Vec<u8> = Vec::new();
    loop {
        let page = c.call(&[b"SCAN", b"*", &token]);
        let mut lines = page
            .split(|&b| b == b'\n')
            .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
        let parts = lines.next().expect("array header") == b"*2";
        let count: usize = std::str::from_utf8(&lines.next().expect("keys header")[1..])
            .unwrap()
            .parse()
            .unwrap();
        for _ in 0..count {
            lines.next();
            keys.insert(lines.next().expect("key").to_vec());
        }
        if !parts {
            return keys;
        }
        lines.next();
        token = lines.next().expect("token").to_vec();
    }
}

pub fn key(i: usize) -> Vec<u8> {
    format!("k{i:04}").into_bytes()
}
