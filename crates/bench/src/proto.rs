//! A deliberately minimal MQTT 3.1.1 / 5.0 client codec: just the packets the
//! benchmark sends and receives, encoded straight into caller-owned buffers.
//!
//! It is independent of `statehub-mqtt-codec` on purpose: the benchmark must not
//! share the broker's bugs, and it must cost as little CPU per message as possible
//! so that it measures the broker rather than itself.

use std::fmt;

/// Protocol version spoken on a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V311,
    V5,
}

pub const PUBLISH: u8 = 0x30;
pub const CONNACK: u8 = 0x20;
pub const PUBACK: u8 = 0x40;
pub const SUBACK: u8 = 0x90;
pub const DISCONNECT: u8 = 0xE0;

/// Maximum remaining length allowed by MQTT (256 MiB - 1).
const MAX_REMAINING: usize = 268_435_455;

#[derive(Debug)]
pub struct ProtoError(pub String);

impl fmt::Display for ProtoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ProtoError {}

fn err<T>(msg: impl Into<String>) -> Result<T, ProtoError> {
    Err(ProtoError(msg.into()))
}

pub fn put_varint(out: &mut Vec<u8>, mut n: usize) {
    debug_assert!(n <= MAX_REMAINING);
    loop {
        let mut b = (n & 0x7F) as u8;
        n >>= 7;
        if n > 0 {
            b |= 0x80;
        }
        out.push(b);
        if n == 0 {
            break;
        }
    }
}

fn put_str(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&(s.len() as u16).to_be_bytes());
    out.extend_from_slice(s);
}

/// CONNECT with clean start / clean session and no will, username or password.
pub fn encode_connect(out: &mut Vec<u8>, v: Version, client_id: &str, keep_alive: u16) {
    let mut body = Vec::with_capacity(32 + client_id.len());
    put_str(&mut body, b"MQTT");
    body.push(match v {
        Version::V311 => 4,
        Version::V5 => 5,
    });
    body.push(0x02); // clean start / clean session
    body.extend_from_slice(&keep_alive.to_be_bytes());
    if v == Version::V5 {
        body.push(0); // no properties: session expiry 0, receive maximum 65535
    }
    put_str(&mut body, client_id.as_bytes());
    out.push(0x10);
    put_varint(out, body.len());
    out.extend_from_slice(&body);
}

/// SUBSCRIBE for `filters`, all at `qos`.
pub fn encode_subscribe(
    out: &mut Vec<u8>,
    v: Version,
    packet_id: u16,
    filters: &[String],
    qos: u8,
) {
    let mut body = Vec::with_capacity(8 + filters.iter().map(|f| f.len() + 3).sum::<usize>());
    body.extend_from_slice(&packet_id.to_be_bytes());
    if v == Version::V5 {
        body.push(0);
    }
    for f in filters {
        put_str(&mut body, f.as_bytes());
        body.push(qos & 0x03);
    }
    out.push(0x82);
    put_varint(out, body.len());
    out.extend_from_slice(&body);
}

/// Length of a PUBLISH packet's variable header + payload (the remaining length).
#[inline]
pub fn publish_remaining(v: Version, topic_len: usize, qos: u8, payload_len: usize) -> usize {
    2 + topic_len + if qos > 0 { 2 } else { 0 } + usize::from(v == Version::V5) + payload_len
}

/// Writes the fixed and variable header of a PUBLISH; the caller appends the payload.
#[inline]
pub fn encode_publish_header(
    out: &mut Vec<u8>,
    v: Version,
    topic: &[u8],
    qos: u8,
    packet_id: u16,
    payload_len: usize,
) {
    out.push(PUBLISH | (qos << 1));
    put_varint(out, publish_remaining(v, topic.len(), qos, payload_len));
    put_str(out, topic);
    if qos > 0 {
        out.extend_from_slice(&packet_id.to_be_bytes());
    }
    if v == Version::V5 {
        out.push(0);
    }
}

/// PUBACK with implicit "success" (valid for both versions).
#[inline]
pub fn encode_puback(out: &mut Vec<u8>, packet_id: u16) {
    let id = packet_id.to_be_bytes();
    out.extend_from_slice(&[PUBACK, 2, id[0], id[1]]);
}

/// Normal DISCONNECT (valid for both versions).
pub fn encode_disconnect(out: &mut Vec<u8>) {
    out.extend_from_slice(&[DISCONNECT, 0]);
}

/// Bytes of `n` as a variable byte integer.
#[inline]
pub fn varint_len(n: usize) -> usize {
    match n {
        0..=127 => 1,
        128..=16_383 => 2,
        16_384..=2_097_151 => 3,
        _ => 4,
    }
}

/// MQTT 5 CONNECT with a Session Expiry Interval and an explicit clean-start flag
/// (the Azure IoT Operations SDKs connect with clean start false and 3600 s).
pub fn encode_connect_v5_session(
    out: &mut Vec<u8>,
    client_id: &str,
    keep_alive: u16,
    clean_start: bool,
    session_expiry: u32,
) {
    let mut body = Vec::with_capacity(32 + client_id.len());
    put_str(&mut body, b"MQTT");
    body.push(5);
    body.push(if clean_start { 0x02 } else { 0x00 });
    body.extend_from_slice(&keep_alive.to_be_bytes());
    body.push(5); // properties: session expiry interval
    body.push(0x11);
    body.extend_from_slice(&session_expiry.to_be_bytes());
    put_str(&mut body, client_id.as_bytes());
    out.push(0x10);
    put_varint(out, body.len());
    out.extend_from_slice(&body);
}

/// MQTT 5 DISCONNECT (normal) that also ends the session (Session Expiry 0).
pub fn encode_disconnect_v5_end_session(out: &mut Vec<u8>) {
    out.extend_from_slice(&[DISCONNECT, 7, 0x00, 5, 0x11, 0, 0, 0, 0]);
}

/// Appends an MQTT 5 property with a binary / UTF-8 value.
#[inline]
pub fn put_prop_bin(out: &mut Vec<u8>, id: u8, value: &[u8]) {
    out.push(id);
    put_str(out, value);
}

/// Appends an MQTT 5 user property.
#[inline]
pub fn put_user_prop(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.push(0x26);
    put_str(out, name);
    put_str(out, value);
}

/// Bytes of a user property as [`put_user_prop`] writes it.
#[inline]
pub fn user_prop_len(name: &[u8], value: &[u8]) -> usize {
    5 + name.len() + value.len()
}

/// Writes the fixed header, topic, packet id and the properties' length of an
/// MQTT 5 QoS 1 PUBLISH; the caller appends `props_len` bytes of properties and
/// then `payload_len` bytes of payload.
#[inline]
pub fn encode_publish_v5_qos1_header(
    out: &mut Vec<u8>,
    topic: &[u8],
    packet_id: u16,
    props_len: usize,
    payload_len: usize,
) {
    out.push(PUBLISH | (1 << 1));
    let remaining = 2 + topic.len() + 2 + varint_len(props_len) + props_len + payload_len;
    put_varint(out, remaining);
    put_str(out, topic);
    out.extend_from_slice(&packet_id.to_be_bytes());
    put_varint(out, props_len);
}

/// If `buf` starts with a complete packet, returns `(first_byte, header_len, remaining_len)`.
#[inline]
pub fn frame(buf: &[u8]) -> Result<Option<(u8, usize, usize)>, ProtoError> {
    if buf.len() < 2 {
        return Ok(None);
    }
    let mut len = 0usize;
    let mut shift = 0;
    let mut i = 1;
    loop {
        let Some(&b) = buf.get(i) else {
            return Ok(None);
        };
        len |= usize::from(b & 0x7F) << shift;
        i += 1;
        if b & 0x80 == 0 {
            break;
        }
        shift += 7;
        if i > 4 {
            return err("malformed remaining length");
        }
    }
    if buf.len() < i + len {
        return Ok(None);
    }
    Ok(Some((buf[0], i, len)))
}

/// Minimal cursor over a packet body.
struct Cur<'a> {
    b: &'a [u8],
    p: usize,
}

impl<'a> Cur<'a> {
    fn new(b: &'a [u8]) -> Self {
        Cur { b, p: 0 }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], ProtoError> {
        if self.p + n > self.b.len() {
            return err("truncated packet");
        }
        let s = &self.b[self.p..self.p + n];
        self.p += n;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, ProtoError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, ProtoError> {
        let s = self.take(2)?;
        Ok(u16::from_be_bytes([s[0], s[1]]))
    }
    fn u32(&mut self) -> Result<u32, ProtoError> {
        let s = self.take(4)?;
        Ok(u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn varint(&mut self) -> Result<usize, ProtoError> {
        let mut n = 0usize;
        for shift in [0, 7, 14, 21] {
            let b = self.u8()?;
            n |= usize::from(b & 0x7F) << shift;
            if b & 0x80 == 0 {
                return Ok(n);
            }
        }
        err("malformed variable byte integer")
    }
    fn bin(&mut self) -> Result<&'a [u8], ProtoError> {
        let n = self.u16()? as usize;
        self.take(n)
    }
    fn rest(&self) -> &'a [u8] {
        &self.b[self.p..]
    }
    fn at_end(&self) -> bool {
        self.p >= self.b.len()
    }
}

/// What the benchmark needs from a CONNACK.
#[derive(Debug, Clone, Default)]
pub struct ConnAck {
    pub reason: u8,
    pub receive_maximum: Option<u16>,
    pub maximum_qos: Option<u8>,
    pub server_keep_alive: Option<u16>,
    pub reason_string: Option<String>,
}

/// v5 properties: calls `f(id, cursor)` is overkill here; we decode the few we use
/// and skip the rest by type.
fn parse_props<'a>(c: &mut Cur<'a>, mut on: impl FnMut(u8, PropVal<'a>)) -> Result<(), ProtoError> {
    let len = c.varint()?;
    let body = c.take(len)?;
    let mut p = Cur::new(body);
    while !p.at_end() {
        let id = p.varint()? as u8;
        let val = match id {
            0x01 | 0x17 | 0x19 | 0x24 | 0x25 | 0x28 | 0x29 | 0x2A => {
                PropVal::Int(u32::from(p.u8()?))
            }
            0x13 | 0x21 | 0x22 | 0x23 => PropVal::Int(u32::from(p.u16()?)),
            0x02 | 0x11 | 0x18 | 0x27 => PropVal::Int(p.u32()?),
            0x0B => PropVal::Int(p.varint()? as u32),
            0x03 | 0x08 | 0x12 | 0x15 | 0x1A | 0x1C | 0x1F | 0x09 | 0x16 => PropVal::Bin(p.bin()?),
            0x26 => {
                let name = p.bin()?;
                PropVal::Pair(name, p.bin()?)
            }
            other => return err(format!("unknown property id 0x{other:02x}")),
        };
        on(id, val);
    }
    Ok(())
}

enum PropVal<'a> {
    Int(u32),
    Bin(&'a [u8]),
    /// A user property: name, value.
    Pair(&'a [u8], &'a [u8]),
}

pub fn parse_connack(v: Version, body: &[u8]) -> Result<ConnAck, ProtoError> {
    let mut c = Cur::new(body);
    let _flags = c.u8()?;
    let mut ack = ConnAck {
        reason: c.u8()?,
        ..ConnAck::default()
    };
    if v == Version::V5 && !c.at_end() {
        parse_props(&mut c, |id, val| match (id, val) {
            (0x21, PropVal::Int(n)) => ack.receive_maximum = Some(n as u16),
            (0x24, PropVal::Int(n)) => ack.maximum_qos = Some(n as u8),
            (0x13, PropVal::Int(n)) => ack.server_keep_alive = Some(n as u16),
            (0x1F, PropVal::Bin(s)) => {
                ack.reason_string = Some(String::from_utf8_lossy(s).into_owned())
            }
            _ => {}
        })?;
    }
    Ok(ack)
}

/// Returns the SUBACK's reason codes.
pub fn parse_suback(v: Version, body: &[u8]) -> Result<(u16, Vec<u8>), ProtoError> {
    let mut c = Cur::new(body);
    let pid = c.u16()?;
    if v == Version::V5 {
        parse_props(&mut c, |_, _| {})?;
    }
    Ok((pid, c.rest().to_vec()))
}

/// A received PUBLISH, borrowing from the read buffer.
#[derive(Debug)]
pub struct Publish<'a> {
    pub qos: u8,
    pub packet_id: u16,
    pub payload: &'a [u8],
}

#[inline]
pub fn parse_publish(v: Version, first: u8, body: &[u8]) -> Result<Publish<'_>, ProtoError> {
    let qos = (first >> 1) & 0x03;
    let mut c = Cur::new(body);
    let _topic = c.bin()?;
    let packet_id = if qos > 0 { c.u16()? } else { 0 };
    if v == Version::V5 {
        let len = c.varint()?;
        c.take(len)?;
    }
    Ok(Publish {
        qos,
        packet_id,
        payload: c.rest(),
    })
}

/// A received MQTT 5 PUBLISH with what an RPC response needs.
#[derive(Debug)]
pub struct RpcPublish<'a> {
    pub qos: u8,
    pub packet_id: u16,
    pub correlation: Option<&'a [u8]>,
    /// The `__stat` user property.
    pub status: Option<&'a [u8]>,
    pub payload: &'a [u8],
}

#[inline]
pub fn parse_publish_rpc(first: u8, body: &[u8]) -> Result<RpcPublish<'_>, ProtoError> {
    let qos = (first >> 1) & 0x03;
    let mut c = Cur::new(body);
    let _topic = c.bin()?;
    let packet_id = if qos > 0 { c.u16()? } else { 0 };
    let mut correlation = None;
    let mut status = None;
    parse_props(&mut c, |id, val| match (id, val) {
        (0x09, PropVal::Bin(b)) => correlation = Some(b),
        (0x26, PropVal::Pair(b"__stat", v)) => status = Some(v),
        _ => {}
    })?;
    Ok(RpcPublish {
        qos,
        packet_id,
        correlation,
        status,
        payload: c.rest(),
    })
}

/// Returns `(packet_id, reason_code)`.
#[inline]
pub fn parse_puback(body: &[u8]) -> Result<(u16, u8), ProtoError> {
    let mut c = Cur::new(body);
    let pid = c.u16()?;
    let rc = if c.at_end() { 0 } else { c.u8()? };
    Ok((pid, rc))
}

/// Describes a DISCONNECT sent by the server.
pub fn describe_disconnect(v: Version, body: &[u8]) -> String {
    if v == Version::V311 || body.is_empty() {
        return "server sent DISCONNECT".to_string();
    }
    let mut c = Cur::new(body);
    let rc = c.u8().unwrap_or(0);
    let mut reason = None;
    if !c.at_end() {
        let _ = parse_props(&mut c, |id, val| {
            if let (0x1F, PropVal::Bin(s)) = (id, val) {
                reason = Some(String::from_utf8_lossy(s).into_owned());
            }
        });
    }
    match reason {
        Some(r) => format!("server sent DISCONNECT reason 0x{rc:02x} ({r})"),
        None => format!("server sent DISCONNECT reason 0x{rc:02x}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varint_roundtrip_via_frame() {
        for n in [0usize, 1, 127, 128, 16_383, 16_384, 2_097_151, 2_097_152] {
            let mut out = vec![0x30];
            put_varint(&mut out, n);
            let hdr = out.len();
            out.resize(hdr + n, 0);
            assert_eq!(frame(&out).unwrap(), Some((0x30, hdr, n)));
            assert_eq!(frame(&out[..out.len() - 1]).unwrap(), None);
        }
    }

    #[test]
    fn publish_roundtrip() {
        for v in [Version::V311, Version::V5] {
            for qos in [0u8, 1] {
                let mut out = Vec::new();
                let payload = b"hello world";
                encode_publish_header(&mut out, v, b"a/b", qos, 7, payload.len());
                out.extend_from_slice(payload);
                let (first, hl, rl) = frame(&out).unwrap().unwrap();
                assert_eq!(hl + rl, out.len());
                let p = parse_publish(v, first, &out[hl..]).unwrap();
                assert_eq!(p.qos, qos);
                assert_eq!(p.payload, payload);
                if qos == 1 {
                    assert_eq!(p.packet_id, 7);
                }
            }
        }
    }

    #[test]
    fn connack_v5_props() {
        // flags 0, rc 0, props: receive maximum 20, topic alias max 10, reason string "ok"
        let body = [0, 0, 11, 0x21, 0, 20, 0x22, 0, 10, 0x1F, 0, 2, b'o', b'k'];
        let ack = parse_connack(Version::V5, &body).unwrap();
        assert_eq!(ack.reason, 0);
        assert_eq!(ack.receive_maximum, Some(20));
        assert_eq!(ack.reason_string.as_deref(), Some("ok"));
    }

    #[test]
    fn rpc_publish_roundtrip() {
        let mut props = Vec::new();
        put_prop_bin(&mut props, 0x09, &[7u8; 16]);
        put_user_prop(&mut props, b"__ts", b"x");
        put_user_prop(&mut props, b"__stat", b"200");
        assert_eq!(
            props.len(),
            19 + user_prop_len(b"__ts", b"x") + user_prop_len(b"__stat", b"200")
        );
        let mut out = Vec::new();
        encode_publish_v5_qos1_header(&mut out, b"r/t", 9, props.len(), 5);
        out.extend_from_slice(&props);
        out.extend_from_slice(b"+OK\r\n");
        let (first, hl, rl) = frame(&out).unwrap().unwrap();
        assert_eq!(hl + rl, out.len());
        let p = parse_publish_rpc(first, &out[hl..]).unwrap();
        assert_eq!((p.qos, p.packet_id), (1, 9));
        assert_eq!(p.correlation, Some(&[7u8; 16][..]));
        assert_eq!(p.status, Some(&b"200"[..]));
        assert_eq!(p.payload, b"+OK\r\n");
        for n in [0usize, 127, 128, 16_383, 16_384, 2_097_151, 2_097_152] {
            let mut v = Vec::new();
            put_varint(&mut v, n);
            assert_eq!(v.len(), varint_len(n));
        }
    }

    #[test]
    fn suback_codes() {
        assert_eq!(
            parse_suback(Version::V311, &[0, 1, 1, 0x80]).unwrap(),
            (1, vec![1, 0x80])
        );
        assert_eq!(
            parse_suback(Version::V5, &[0, 1, 0, 1]).unwrap(),
            (1, vec![1])
        );
    }
}
