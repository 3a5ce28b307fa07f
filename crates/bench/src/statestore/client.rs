//! Request building for the `statestore` scenario: a [`Client`] holds the
//! per-connection state (id, HLC, packet ids, outstanding requests) and encodes
//! SET/GET requests the way the Rust SDK sends them. Responses are handled in
//! [`super::response`].

use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

use super::{Op, KEY_LEN, REQUEST_TOPIC};
use crate::common::now_ns;
use crate::proto::{self, Version};

/// The client's hybrid logical clock, for `__ts`.
struct Hlc {
    last_ms: u64,
    counter: u32,
}

impl Hlc {
    /// `{ms:15}:{counter:5}:{node}` into `out` (cleared first).
    fn next(&mut self, node: &str, out: &mut String) {
        use std::fmt::Write as _;
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        if ms > self.last_ms {
            self.last_ms = ms;
            self.counter = 0;
        } else {
            self.counter += 1;
        }
        out.clear();
        let _ = write!(out, "{:015}:{:05}:{}", self.last_ms, self.counter, node);
    }
}

#[inline]
pub(super) fn key_bytes(k: u64) -> [u8; KEY_LEN] {
    let mut b = *b"key:000000000000";
    let mut n = k;
    for i in (4..KEY_LEN).rev() {
        b[i] = b'0' + (n % 10) as u8;
        n /= 10;
    }
    b
}

fn push_bulk_len(out: &mut Vec<u8>, n: usize) {
    out.push(b'$');
    out.extend_from_slice(n.to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Everything a client needs to build requests.
pub(super) struct Client {
    pub(super) index: u32,
    pub(super) id: String,
    pub(super) version: Version,
    /// Properties every request carries (all but Correlation Data and `__ts`).
    static_props: Vec<u8>,
    /// RESP prefix of a SET up to the key's bytes, and what follows the key.
    set_head: Vec<u8>,
    set_tail: Vec<u8>,
    get_head: Vec<u8>,
    get_tail: Vec<u8>,
    hlc: Hlc,
    ts: String,
    seq: u64,
    next_pid: u16,
    /// seq -> (sent ns, op, [`super::stats::ANSWERED`] when sent)
    pub(super) outstanding: HashMap<u64, (u64, Op, u64)>,
    /// PUBACKs still due for our requests.
    pub(super) pubacks_due: u64,
}

impl Client {
    pub(super) fn new(index: u32, id: String, message_expiry: u32, value_size: usize) -> Self {
        let response_topic = format!("clients/{id}/services/{REQUEST_TOPIC}");
        let mut sp = Vec::with_capacity(256);
        sp.push(0x02); // message expiry interval
        sp.extend_from_slice(&message_expiry.to_be_bytes());
        proto::put_prop_bin(&mut sp, 0x03, b"application/octet-stream");
        proto::put_prop_bin(&mut sp, 0x08, response_topic.as_bytes());
        proto::put_user_prop(&mut sp, b"__srcId", id.as_bytes());
        proto::put_user_prop(&mut sp, b"__protVer", b"1.0");
        proto::put_user_prop(&mut sp, b"$partition", id.as_bytes());

        let mut set_head = b"*3\r\n$3\r\nSET\r\n".to_vec();
        push_bulk_len(&mut set_head, KEY_LEN);
        let mut set_tail = b"\r\n".to_vec();
        push_bulk_len(&mut set_tail, value_size);
        set_tail.resize(set_tail.len() + value_size, b'x');
        set_tail.extend_from_slice(b"\r\n");
        let mut get_head = b"*2\r\n$3\r\nGET\r\n".to_vec();
        push_bulk_len(&mut get_head, KEY_LEN);
        let get_tail = b"\r\n".to_vec();

        Client {
            index,
            id,
            version: Version::V5,
            static_props: sp,
            set_head,
            set_tail,
            get_head,
            get_tail,
            hlc: Hlc {
                last_ms: 0,
                counter: 0,
            },
            ts: String::with_capacity(64),
            seq: 0,
            next_pid: 0,
            outstanding: HashMap::new(),
            pubacks_due: 0,
        }
    }

    pub(super) fn response_topic(&self) -> String {
        format!("clients/{}/services/{REQUEST_TOPIC}", self.id)
    }

    /// Appends one request PUBLISH to `out` and registers it as outstanding.
    pub(super) fn encode(&mut self, out: &mut Vec<u8>, op: Op, key: u64) {
        self.hlc.next(&self.id, &mut self.ts);
        let seq = self.seq;
        self.seq += 1;
        self.next_pid = if self.next_pid == u16::MAX {
            1
        } else {
            self.next_pid + 1
        };
        let mut corr = [0u8; 16];
        corr[..8].copy_from_slice(&seq.to_le_bytes());
        corr[8..12].copy_from_slice(&self.index.to_le_bytes());
        corr[12..].copy_from_slice(b"shb!");
        let props_len = self.static_props.len()
            + 3
            + corr.len()
            + proto::user_prop_len(b"__ts", self.ts.as_bytes());
        let (head, tail) = match op {
            Op::Set => (&self.set_head, &self.set_tail),
            Op::Get => (&self.get_head, &self.get_tail),
        };
        let payload_len = head.len() + KEY_LEN + tail.len();
        proto::encode_publish_v5_qos1_header(
            out,
            REQUEST_TOPIC.as_bytes(),
            self.next_pid,
            props_len,
            payload_len,
        );
        out.extend_from_slice(&self.static_props);
        proto::put_prop_bin(out, 0x09, &corr);
        proto::put_user_prop(out, b"__ts", self.ts.as_bytes());
        out.extend_from_slice(head);
        out.extend_from_slice(&key_bytes(key));
        out.extend_from_slice(tail);
        let answered = super::stats::ANSWERED.load(std::sync::atomic::Ordering::Relaxed);
        self.outstanding.insert(seq, (now_ns(), op, answered));
        self.pubacks_due += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_fixed_width() {
        assert_eq!(&key_bytes(0), b"key:000000000000");
        assert_eq!(&key_bytes(1234), b"key:000000001234");
    }

    #[test]
    fn request_encoding() {
        let mut c = Client::new(3, "cid".into(), 10, 5);
        let mut out = Vec::new();
        c.encode(&mut out, Op::Set, 7);
        let (first, hl, rl) = proto::frame(&out).unwrap().unwrap();
        assert_eq!(hl + rl, out.len());
        assert_eq!(first, 0x32);
        assert!(out.ends_with(b"*3\r\n$3\r\nSET\r\n$16\r\nkey:000000000007\r\n$5\r\nxxxxx\r\n"));
        let text = String::from_utf8_lossy(&out);
        assert!(text.contains("clients/cid/services/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke"));
        assert!(text.contains(":00000:cid"));
        // Parse it back as a PUBLISH: properties are well formed.
        let p = proto::parse_publish_rpc(first, &out[hl..]).unwrap();
        assert_eq!(p.correlation.map(<[u8]>::len), Some(16));
        assert!(p.payload.starts_with(b"*3\r\n"));
        out.clear();
        c.encode(&mut out, Op::Get, 8);
        assert!(out.ends_with(b"*2\r\n$3\r\nGET\r\n$16\r\nkey:000000000008\r\n"));
        assert_eq!(c.outstanding.len(), 2);
    }
}
