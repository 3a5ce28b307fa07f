//! The state store browser's API: SCAN, GET, SET and DEL run in-process through the
//! state store service, as requests of the client id `$statehub-admin`, each answered
//! on a random `$statehub/admin/...` Response Topic that a broker tap reads back (the
//! service publishes answers through the broker like any other). Writes go through the
//! same path as a client's, durability and notifications included.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use bytes::{Bytes, BytesMut};
use serde::Deserialize;
use serde_json::{json, Value};
use statehub_broker::codec::{ProtocolVersion, Publish, PublishProperties, QoS};
use statehub_broker::{ClientInfo, Service, Tapped};
use statehub_state_store_service::REQUEST_TOPIC;

use super::{Admin, ApiError};

/// The client id the admin's requests run as.
pub(super) const ADMIN_CLIENT_ID: &str = "$statehub-admin";
/// How long a request may take (its Message Expiry, and how long we wait).
const REQUEST_SECS: u32 = 10;

pub(super) fn routes() -> Router<Admin> {
    Router::new()
        .route("/admin/api/store/scan", get(scan))
        .route("/admin/api/store/key", get(read).put(write).delete(delete))
}

/// A RESP3 reply as the state store writes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Resp {
    Simple(String),
    Error(String),
    Int(i64),
    Null,
    Bulk(Bytes),
    Array(Vec<Resp>),
}

/// A reply and its `__ts` (the key's version, when the reply has one).
#[derive(Debug)]
pub(super) struct Answer {
    pub reply: Resp,
    pub version: Option<String>,
}

fn unavailable(why: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("state store: {why}"),
    )
}

/// Runs one request (`args`, a RESP array of bulk strings) and returns its answer.
pub(super) async fn call(admin: &Admin, args: &[&[u8]]) -> Result<Answer, ApiError> {
    call_as(admin, ADMIN_CLIENT_ID, args).await
}

/// As [`call`], as the client `client_id` (a watch observes keys under its own id).
pub(super) async fn call_as(
    admin: &Admin,
    client_id: &str,
    args: &[&[u8]],
) -> Result<Answer, ApiError> {
    let broker = admin.broker();
    let service: Arc<dyn Service> = broker
        .service_for_topic(REQUEST_TOPIC)
        .ok_or_else(|| unavailable("not running"))?;
    let id = format!("{:032x}", rand::random::<u128>());
    let topic = format!("$statehub/admin/{id}");
    let mut tap = broker.tap(&topic, 2).map_err(unavailable)?;
    let publish = Publish {
        dup: false,
        qos: QoS::AtLeastOnce,
        retain: false,
        topic: REQUEST_TOPIC.into(),
        packet_id: Some(1),
        payload: encode(args),
        properties: PublishProperties {
            message_expiry_interval: Some(REQUEST_SECS),
            response_topic: Some(topic.as_str().into()),
            correlation_data: Some(Bytes::from(id.clone().into_bytes())),
            user_properties: vec![
                ("__protVer".into(), "1.0".into()),
                ("__ts".into(), timestamp().into()),
            ],
            ..PublishProperties::default()
        },
    };
    // The dashboard acts with the admin key, which grants every key: no access list.
    let from = ClientInfo {
        client_id: client_id.into(),
        protocol: ProtocolVersion::V5,
        access: None,
        principal: std::sync::Arc::new(statehub_broker::Principal {
            client_id: client_id.into(),
            ..Default::default()
        }),
    };
    let wait = Duration::from_secs(u64::from(REQUEST_SECS));
    let answer = async {
        service.on_publish(broker, &from, &publish).await;
        tap.recv().await
    };
    let msg = match tokio::time::timeout(wait, answer).await {
        Ok(Some(Tapped::Message(msg))) => msg,
        Ok(_) => return Err(unavailable("no answer")),
        Err(_) => return Err(unavailable("no answer in time")),
    };
    let prop = |name: &str| {
        msg.properties
            .user_properties
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.to_string())
    };
    if let Some(stat) = prop("__stat").filter(|s| s != "200") {
        let text = prop("__stMsg").unwrap_or_default();
        return Err(unavailable(format!("status {stat} {text}")));
    }
    let reply = parse(&msg.payload).ok_or_else(|| unavailable("unreadable answer"))?;
    Ok(Answer {
        reply,
        version: prop("__ts"),
    })
}

/// The request's HLC timestamp (`__ts`, which writes require): now, counter 0.
fn timestamp() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!("{ms:015}:00000:{ADMIN_CLIENT_ID}")
}

/// A request: a RESP array of bulk strings.
pub(super) fn encode(args: &[&[u8]]) -> Bytes {
    let mut out = BytesMut::new();
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out.freeze()
}

/// Parses a whole reply (arrays nest at most twice, as SCAN's do).
pub(super) fn parse(bytes: &[u8]) -> Option<Resp> {
    let (resp, rest) = parse_one(bytes, 2)?;
    rest.is_empty().then_some(resp)
}

fn parse_one(bytes: &[u8], depth: u8) -> Option<(Resp, &[u8])> {
    let end = bytes.windows(2).position(|w| w == b"\r\n")?;
    let (head, rest) = (&bytes[..end], &bytes[end + 2..]);
    let (&kind, text) = head.split_first()?;
    let text = std::str::from_utf8(text).ok()?;
    match kind {
        b'+' => Some((Resp::Simple(text.to_owned()), rest)),
        b'-' => Some((Resp::Error(text.to_owned()), rest)),
        b':' => Some((Resp::Int(text.parse().ok()?), rest)),
        b'_' => Some((Resp::Null, rest)),
        b'$' if text == "-1" => Some((Resp::Null, rest)),
        b'$' => {
            let len: usize = text.parse().ok()?;
            let body = rest.get(..len)?;
            let after = rest.get(len..)?.strip_prefix(b"\r\n")?;
            Some((Resp::Bulk(Bytes::copy_from_slice(body)), after))
        }
        b'*' if depth > 0 => {
            let n: usize = text.parse().ok()?;
            // Each item takes at least 3 bytes: no allocation beyond what is there.
            let mut items = Vec::with_capacity(n.min(rest.len() / 3));
            let mut rest = rest;
            for _ in 0..n {
                let (item, after) = parse_one(rest, depth - 1)?;
                items.push(item);
                rest = after;
            }
            Some((Resp::Array(items), rest))
        }
        _ => None,
    }
}

/// Bytes as the page shows them: text if UTF-8, else hex; cut at `max` bytes.
pub(super) fn show(bytes: &[u8], max: usize) -> Value {
    let cut = bytes.len() > max;
    let shown = &bytes[..bytes.len().min(max)];
    match std::str::from_utf8(shown) {
        Ok(text) => json!({"text": text, "bytes": bytes.len(), "truncated": cut}),
        Err(_) => {
            let hex: String = shown.iter().map(|b| format!("{b:02x}")).collect();
            json!({"hex": hex, "bytes": bytes.len(), "truncated": cut})
        }
    }
}

fn refused(reply: &Resp) -> Option<ApiError> {
    match reply {
        Resp::Error(text) => Some(ApiError::new(StatusCode::BAD_REQUEST, text.clone())),
        _ => None,
    }
}

#[derive(Debug, Deserialize)]
struct ScanQuery {
    pattern: Option<String>,
    token: Option<String>,
}

/// `GET /admin/api/store/scan?pattern=&token=`: one SCAN page (the store bounds it).
async fn scan(
    State(admin): State<Admin>,
    Query(q): Query<ScanQuery>,
) -> Result<Json<Value>, ApiError> {
    let pattern = q.pattern.unwrap_or_else(|| "*".to_owned());
    let mut args: Vec<&[u8]> = vec![b"SCAN", pattern.as_bytes()];
    if let Some(token) = &q.token {
        args.push(token.as_bytes());
    }
    let answer = call(&admin, &args).await?;
    if let Some(e) = refused(&answer.reply) {
        return Err(e);
    }
    let Resp::Array(parts) = answer.reply else {
        return Err(unavailable("unexpected SCAN answer"));
    };
    let max = admin.config().value_bytes;
    let keys = match parts.first() {
        Some(Resp::Array(keys)) => keys
            .iter()
            .filter_map(|k| match k {
                Resp::Bulk(b) => Some(show(b, max)),
                _ => None,
            })
            .collect::<Vec<_>>(),
        _ => Vec::new(),
    };
    let token = match parts.get(1) {
        Some(Resp::Bulk(t)) => Some(String::from_utf8_lossy(t).into_owned()),
        _ => None,
    };
    Ok(Json(json!({"keys": keys, "token": token})))
}

#[derive(Debug, Deserialize)]
pub(super) struct KeyQuery {
    pub key: String,
}

/// `GET /admin/api/store/key?key=`: the value and its version; 404 if absent.
async fn read(
    State(admin): State<Admin>,
    Query(q): Query<KeyQuery>,
) -> Result<Json<Value>, ApiError> {
    let answer = call(&admin, &[b"GET", q.key.as_bytes()]).await?;
    match answer.reply {
        Resp::Bulk(value) => Ok(Json(json!({
            "key": q.key,
            "value": show(&value, admin.config().value_bytes),
            "version": answer.version,
        }))),
        Resp::Null => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no key {}", q.key),
        )),
        other => Err(refused(&other).unwrap_or_else(|| unavailable("unexpected GET answer"))),
    }
}

#[derive(Debug, Deserialize)]
struct SetBody {
    key: String,
    value: String,
}

/// `PUT /admin/api/store/key {"key","value"}`: SET; the new version.
async fn write(
    State(admin): State<Admin>,
    Json(body): Json<SetBody>,
) -> Result<Json<Value>, ApiError> {
    let answer = call(
        &admin,
        &[b"SET", body.key.as_bytes(), body.value.as_bytes()],
    )
    .await?;
    match answer.reply {
        Resp::Simple(ok) if ok == "OK" => {
            tracing::info!(key = body.key, "state store key set from the admin API");
            Ok(Json(json!({"key": body.key, "version": answer.version})))
        }
        other => Err(refused(&other).unwrap_or_else(|| unavailable("unexpected SET answer"))),
    }
}

/// `DELETE /admin/api/store/key?key=`: DEL; how many keys went (0 or 1).
async fn delete(
    State(admin): State<Admin>,
    Query(q): Query<KeyQuery>,
) -> Result<Json<Value>, ApiError> {
    let answer = call(&admin, &[b"DEL", q.key.as_bytes()]).await?;
    match answer.reply {
        Resp::Int(n) => {
            tracing::info!(key = q.key, "state store key deleted from the admin API");
            Ok(Json(json!({"key": q.key, "deleted": n})))
        }
        other => Err(refused(&other).unwrap_or_else(|| unavailable("unexpected DEL answer"))),
    }
}

#[cfg(test)]
mod tests {
    use super::{encode, parse, Resp};

    #[test]
    fn replies_parse_and_requests_encode() {
        assert_eq!(parse(b"+OK\r\n"), Some(Resp::Simple("OK".into())));
        assert_eq!(parse(b":-1\r\n"), Some(Resp::Int(-1)));
        assert_eq!(parse(b"$-1\r\n"), Some(Resp::Null));
        assert_eq!(parse(b"$2\r\nhi\r\n"), Some(Resp::Bulk("hi".into())));
        assert_eq!(
            parse(b"-ERR syntax error\r\n"),
            Some(Resp::Error("ERR syntax error".into()))
        );
        let scan = b"*2\r\n*1\r\n$1\r\na\r\n$1\r\nt\r\n";
        assert_eq!(
            parse(scan),
            Some(Resp::Array(vec![
                Resp::Array(vec![Resp::Bulk("a".into())]),
                Resp::Bulk("t".into())
            ]))
        );
        // Truncated, trailing bytes, too deep, huge counts: refused, no panic.
        assert_eq!(parse(b"$5\r\nhi\r\n"), None);
        assert_eq!(parse(b"+OK\r\nx"), None);
        assert_eq!(parse(b"*1\r\n*1\r\n*1\r\n:1\r\n"), None);
        assert_eq!(parse(b"*99999999999\r\n"), None);
        assert_eq!(
            &encode(&[b"GET", b"k"])[..],
            b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"
        );
    }
}
