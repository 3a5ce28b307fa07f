//! What the engine's integration tests share.

use bytes::Bytes;
use statehub_state_store::Request;

/// A request from the client "client" with the RESP array `args` and, when given, a
/// `__ts` of `ts_ms`. Its `__ts` string is leaked: a few bytes per request, and the tests
/// stay one call per request.
pub fn request(args: &[&[u8]], ts_ms: Option<u64>) -> Request<'static> {
    let mut payload = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        payload.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        payload.extend_from_slice(a);
        payload.extend_from_slice(b"\r\n");
    }
    Request {
        client_id: "client",
        payload: Bytes::from(payload),
        timestamp: ts_ms.map(|ms| &*format!("{ms:015}:00000:client").leak()),
        fencing_token: None,
        access: None,
    }
}
