//! The state store protocol as a client speaks it: topics, RESP request and response
//! payloads, notification payloads and HLC timestamps. Pure functions, no I/O; the
//! tests pin every byte.

use std::fmt;

use bytes::Bytes;

/// Where requests go.
pub use statehub_state_store::REQUEST_TOPIC;
/// Notification topics: this, HEX(client id), `/command/notify/`, HEX(key).
const NOTIFY_PREFIX: &str = "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/";
const NOTIFY_MIDDLE: &str = "/command/notify/";

/// RPC user properties (the SDKs' command protocol).
pub const TIMESTAMP: &str = "__ts";
pub const FENCING_TOKEN: &str = "__ft";
pub const PROTOCOL_VERSION: &str = "__protVer";
pub const SOURCE_ID: &str = "__srcId";
pub const STATUS: &str = "__stat";
pub const STATUS_MESSAGE: &str = "__stMsg";
pub const VERSION_1_0: &str = "1.0";
pub const CONTENT_TYPE: &str = "application/octet-stream";

/// Where this client's responses come back: under `clients/`, keyed by the client id
/// in hex so that any id makes a valid topic name.
pub fn response_topic(client_id: &str) -> String {
    let mut topic = String::from("clients/");
    push_hex(&mut topic, client_id.as_bytes());
    topic.push_str("/statehub-cli/statestore/response");
    topic
}

/// The filter matching every notification for this client.
pub fn notify_filter(client_id: &str) -> String {
    let mut filter = String::from(NOTIFY_PREFIX);
    push_hex(&mut filter, client_id.as_bytes());
    filter.push_str(NOTIFY_MIDDLE);
    filter.push('+');
    filter
}

/// The key a notification topic names, if it is one.
pub fn notified_key(topic: &str) -> Option<Vec<u8>> {
    let rest = topic.strip_prefix(NOTIFY_PREFIX)?;
    let (_, key) = rest.split_once(NOTIFY_MIDDLE)?;
    from_hex(key)
}

fn push_hex(out: &mut String, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in bytes {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0xf)]));
    }
}

fn from_hex(s: &str) -> Option<Vec<u8>> {
    let digit = |c: u8| {
        char::from(c)
            .to_digit(16)
            .and_then(|d| u8::try_from(d).ok())
    };
    let s = s.as_bytes();
    if !s.len().is_multiple_of(2) {
        return None;
    }
    s.chunks(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

/// When a SET applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Condition {
    #[default]
    Always,
    /// `NX`: only if the key does not exist.
    NotExists,
    /// `NEX`: if the key does not exist or holds the same value.
    NotExistsOrEqual,
}

/// One request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request<'a> {
    Set {
        key: &'a [u8],
        value: &'a [u8],
        condition: Condition,
        px_ms: Option<u64>,
    },
    Get {
        key: &'a [u8],
    },
    Del {
        key: &'a [u8],
    },
    VDel {
        key: &'a [u8],
        value: &'a [u8],
    },
    KeyNotify {
        key: &'a [u8],
        stop: bool,
    },
    Scan {
        pattern: &'a [u8],
        token: Option<&'a [u8]>,
    },
}

impl Request<'_> {
    /// The payload: one RESP array of bulk strings, verbs in upper case.
    pub fn encode(&self) -> Bytes {
        let px;
        let args: Vec<&[u8]> = match *self {
            Request::Set {
                key,
                value,
                condition,
                px_ms,
            } => {
                let mut args = vec![&b"SET"[..], key, value];
                match condition {
                    Condition::Always => {}
                    Condition::NotExists => args.push(b"NX"),
                    Condition::NotExistsOrEqual => args.push(b"NEX"),
                }
                if let Some(ms) = px_ms {
                    px = ms.to_string();
                    args.extend([&b"PX"[..], px.as_bytes()]);
                }
                args
            }
            Request::Get { key } => vec![b"GET", key],
            Request::Del { key } => vec![b"DEL", key],
            Request::VDel { key, value } => vec![b"VDEL", key, value],
            Request::KeyNotify { key, stop: false } => vec![b"KEYNOTIFY", key],
            Request::KeyNotify { key, stop: true } => vec![b"KEYNOTIFY", key, b"STOP"],
            Request::Scan { pattern, token } => {
                let mut args = vec![&b"SCAN"[..], pattern];
                args.extend(token);
                args
            }
        };
        // The same encoder the store uses for requests and notifications.
        statehub_state_store::resp::encode_array(&args)
    }
}

/// One response payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    /// `+OK`
    Ok,
    /// `:n`
    Integer(i64),
    /// `$len` and the bytes.
    Bulk(Bytes),
    /// `$-1`
    Null,
    /// `-ERR text` (the text without `ERR `).
    Error(String),
    /// SCAN: `*1` or `*2`, then the array of keys and the optional continuation token.
    Scan {
        keys: Vec<Bytes>,
        token: Option<Bytes>,
    },
}

/// A payload that is not one of the response forms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed RESP at byte {0}")]
pub struct Malformed(pub usize);

impl Response {
    pub fn parse(payload: &Bytes) -> Result<Response, Malformed> {
        let mut r = Reader {
            buf: payload,
            pos: 0,
        };
        let response = match r.peek()? {
            b'+' => {
                let line = r.line(b'+')?;
                if line != b"OK" {
                    return Err(Malformed(1));
                }
                Response::Ok
            }
            b':' => Response::Integer(r.integer(b':')?),
            b'$' => match r.bulk()? {
                Some(b) => Response::Bulk(b),
                None => Response::Null,
            },
            b'-' => {
                let line = r.line(b'-')?;
                let text = line.strip_prefix(b"ERR ").unwrap_or(line);
                Response::Error(String::from_utf8_lossy(text).into_owned())
            }
            b'*' => r.scan()?,
            _ => return Err(Malformed(0)),
        };
        r.end()?;
        Ok(response)
    }
}

/// A key-change notification's payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notification {
    /// `NOTIFY SET VALUE <value>`
    Set(Bytes),
    /// `NOTIFY DELETE`
    Delete,
}

impl Notification {
    pub fn parse(payload: &Bytes) -> Result<Notification, Malformed> {
        let mut r = Reader {
            buf: payload,
            pos: 0,
        };
        let n = r.integer(b'*')?;
        let mut items = Vec::new();
        for _ in 0..n.clamp(0, 4) {
            items.push(r.bulk()?.ok_or(Malformed(r.pos))?);
        }
        r.end()?;
        match items.as_slice() {
            [notify, set, value_word, value]
                if &notify[..] == b"NOTIFY"
                    && &set[..] == b"SET"
                    && &value_word[..] == b"VALUE" =>
            {
                Ok(Notification::Set(value.clone()))
            }
            [notify, delete] if &notify[..] == b"NOTIFY" && &delete[..] == b"DELETE" => {
                Ok(Notification::Delete)
            }
            _ => Err(Malformed(0)),
        }
    }
}

struct Reader<'a> {
    buf: &'a Bytes,
    pos: usize,
}

impl Reader<'_> {
    fn peek(&self) -> Result<u8, Malformed> {
        self.buf.get(self.pos).copied().ok_or(Malformed(self.pos))
    }

    /// `<prefix><text>\r\n`, the text without the prefix.
    fn line(&mut self, prefix: u8) -> Result<&[u8], Malformed> {
        if self.peek()? != prefix {
            return Err(Malformed(self.pos));
        }
        let start = self.pos + 1;
        let rest = self.buf.get(start..).ok_or(Malformed(start))?;
        let len = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or(Malformed(start))?;
        self.pos = start + len + 2;
        Ok(&self.buf[start..start + len])
    }

    fn integer(&mut self, prefix: u8) -> Result<i64, Malformed> {
        let at = self.pos;
        let line = self.line(prefix)?;
        std::str::from_utf8(line)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or(Malformed(at))
    }

    /// `$len\r\n<bytes>\r\n`, or `None` for `$-1\r\n`.
    fn bulk(&mut self) -> Result<Option<Bytes>, Malformed> {
        let at = self.pos;
        let len = self.integer(b'$')?;
        if len == -1 {
            return Ok(None);
        }
        let len = usize::try_from(len).map_err(|_| Malformed(at))?;
        let end = self.pos.checked_add(len).ok_or(Malformed(at))?;
        if self.buf.get(end..end + 2) != Some(&b"\r\n"[..]) {
            return Err(Malformed(end));
        }
        let bytes = self.buf.slice(self.pos..end);
        self.pos = end + 2;
        Ok(Some(bytes))
    }

    /// `*1\r\n*<n>\r\n<n bulks>` or `*2\r\n*<n>\r\n<n bulks><token bulk>`.
    fn scan(&mut self) -> Result<Response, Malformed> {
        let at = self.pos;
        let parts = self.integer(b'*')?;
        if !(1..=2).contains(&parts) {
            return Err(Malformed(at));
        }
        let count = self.integer(b'*')?;
        let mut keys = Vec::new();
        for _ in 0..count.max(0) {
            keys.push(self.bulk()?.ok_or(Malformed(self.pos))?);
        }
        let token = match parts {
            2 => self.bulk()?.filter(|t| !t.is_empty()),
            _ => None,
        };
        Ok(Response::Scan { keys, token })
    }

    fn end(&self) -> Result<(), Malformed> {
        if self.pos == self.buf.len() {
            Ok(())
        } else {
            Err(Malformed(self.pos))
        }
    }
}

/// A hybrid logical clock value, `{ms:015}:{counter:05}:{node}` on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hlc {
    pub wall_ms: u64,
    pub counter: u32,
    pub node: String,
}

impl Hlc {
    /// Now, on this client's clock.
    pub fn now(node: &str) -> Hlc {
        let wall_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or_default();
        Hlc {
            wall_ms,
            counter: 0,
            node: node.replace(':', "_"),
        }
    }

    /// Reads the wire form (digits of any width, as versions are printed).
    pub fn parse(s: &str) -> Option<Hlc> {
        let mut parts = s.splitn(3, ':');
        let wall = parts.next()?;
        let counter = parts.next()?;
        let node = parts.next()?;
        let digits = |d: &str| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit());
        if !digits(wall) || !digits(counter) || node.is_empty() || node.contains(':') {
            return None;
        }
        Some(Hlc {
            wall_ms: wall.parse().ok()?,
            counter: counter.parse().ok()?,
            node: node.to_owned(),
        })
    }
}

impl fmt::Display for Hlc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:015}:{:05}:{}", self.wall_ms, self.counter, self.node)
    }
}

#[cfg(test)]
#[path = "proto_test.rs"]
mod tests;
