//! The SDKs' command protocol around the state store's payloads.
//!
//! The Azure IoT Operations clients do not speak raw MQTT request/response: they wrap
//! every call in their RPC convention (`doc/reference/command-errors.md` in the SDK
//! repository), and fail a call whose response lacks `__stat`. This module checks a
//! request the way the SDKs' own command executor does (same order, same status codes,
//! same property names) and builds the response messages.

use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use statehub_broker::codec::{ByteString, PublishProperties, QoS, UserProperties};
use statehub_broker::Message;
use statehub_state_store::{Hlc, FENCING_TOKEN_PROPERTY, REQUEST_TOPIC, TIMESTAMP_PROPERTY};

/// Content Type of every response and notification.
pub const CONTENT_TYPE: &str = "application/octet-stream";
/// Status of the call (`200` or a fault code).
pub const STATUS_PROPERTY: &str = "__stat";
/// Human-readable reason of a fault.
pub const STATUS_MESSAGE_PROPERTY: &str = "__stMsg";
/// Whether a fault comes from the application rather than the protocol.
pub const APPLICATION_ERROR_PROPERTY: &str = "__apErr";
/// Name of the property that made a request invalid.
pub const PROPERTY_NAME_PROPERTY: &str = "__propName";
/// RPC protocol version of a request or response.
pub const PROTOCOL_VERSION_PROPERTY: &str = "__protVer";
/// Major versions the server supports (space separated), on a 505.
pub const SUPPORTED_MAJOR_PROPERTY: &str = "__supProtMajVer";
/// The version the request asked for, on a 505.
pub const REQUEST_VERSION_PROPERTY: &str = "__requestProtVer";
/// The version this server speaks.
pub const PROTOCOL_VERSION: &str = "1.0";
/// Response topics under this prefix are the store's own (notifications).
pub const RESERVED_RESPONSE_PREFIX: &str =
    "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8";
/// Lifetime the SDK executor assumes for a request without Message Expiry.
const DEFAULT_EXPIRY: Duration = Duration::from_secs(10);

/// A request the store refuses at the RPC level (before reading its payload).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    /// `__stat`.
    pub status: u16,
    /// `__stMsg`.
    pub message: String,
    /// `__propName`.
    pub property_name: Option<&'static str>,
    /// `__requestProtVer` (and then `__supProtMajVer=1`).
    pub request_version: Option<String>,
}

impl Fault {
    fn bad_request(message: &str, property: &'static str) -> Self {
        Self {
            status: 400,
            message: message.to_owned(),
            property_name: Some(property),
            request_version: None,
        }
    }

    fn version(message: String, requested: &str) -> Self {
        Self {
            status: 505,
            message,
            property_name: None,
            request_version: Some(requested.to_owned()),
        }
    }

    /// A write while the data directory's disk is full: refused before it changed
    /// anything; reads are still answered, and writes are taken again once there is room.
    pub fn no_space() -> Self {
        Self {
            status: 503,
            message: "the state store cannot write: its disk is full; writes are refused until \
                      there is room, reads are answered"
                .to_owned(),
            property_name: None,
            request_version: None,
        }
    }

    /// A request sent at QoS 0: the protocol needs QoS 1 (the SDKs always use it; a
    /// hand-made request, `mosquitto_rr` without `-q 1`, may not).
    pub fn qos0() -> Self {
        Self::bad_request(QOS0_MESSAGE, "QoS")
    }

    /// The state store's queue of requests for its networked engine is full
    /// (`state_store.network_queue`): this request is refused before it ran.
    pub fn busy() -> Self {
        Self {
            status: 503,
            message: "the state store is busy: too many requests wait for its storage; retry"
                .to_owned(),
            property_name: None,
            request_version: None,
        }
    }

    /// The store failed (its engine broke): every request gets this from then on.
    pub fn unavailable() -> Self {
        Self {
            status: 503,
            message: "the state store is unavailable".to_owned(),
            property_name: None,
            request_version: None,
        }
    }
}

/// Why a QoS 0 request is refused, in `__stMsg` and in its `-ERR` payload.
const QOS0_MESSAGE: &str =
    "state store requests must be sent at QoS 1 (mosquitto_rr: -q 1); this one was QoS 0";

/// Whether a Response Topic is one a client may never use: the request topic itself or
/// the store's notification space. The protocol page says such clients are disconnected.
pub fn is_forbidden_response_topic(topic: &str) -> bool {
    topic == REQUEST_TOPIC || topic.starts_with(RESERVED_RESPONSE_PREFIX)
}

/// The user properties a request is read for, each its first value: found in one pass
/// over the request's list rather than one search each (every request reads all three).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestProps<'a> {
    /// `__ts`.
    pub timestamp: Option<&'a str>,
    /// `__ft`.
    pub fencing_token: Option<&'a str>,
    /// `__protVer`.
    pub protocol_version: Option<&'a str>,
}

impl<'a> RequestProps<'a> {
    pub fn of(props: &'a PublishProperties) -> Self {
        let mut found = RequestProps::default();
        for (k, v) in &props.user_properties {
            let slot = match &**k {
                TIMESTAMP_PROPERTY => &mut found.timestamp,
                FENCING_TOKEN_PROPERTY => &mut found.fencing_token,
                PROTOCOL_VERSION_PROPERTY => &mut found.protocol_version,
                _ => continue,
            };
            slot.get_or_insert(&**v);
        }
        found
    }
}

/// The request's deadline: receipt plus its Message Expiry (or the SDK default).
pub fn deadline(props: &PublishProperties, received: Instant) -> Instant {
    let lifetime = props
        .message_expiry_interval
        .map_or(DEFAULT_EXPIRY, |s| Duration::from_secs(u64::from(s)));
    received + lifetime
}

/// The checks of the SDKs' command executor, in its order: Correlation Data, Message
/// Expiry, then `__protVer` (absent means 1.0).
pub fn check(props: &PublishProperties, request: &RequestProps<'_>) -> Result<(), Fault> {
    if props.correlation_data.is_none() {
        return Err(Fault::bad_request(
            "Correlation data missing",
            "Correlation Data",
        ));
    }
    if props.message_expiry_interval.is_none() {
        return Err(Fault::bad_request(
            "Message expiry interval missing",
            "Message Expiry",
        ));
    }
    let Some(version) = request.protocol_version else {
        return Ok(());
    };
    // The version this server speaks, as the SDKs send it: no parsing.
    if version == PROTOCOL_VERSION {
        return Ok(());
    }
    let major = version.split_once('.').and_then(|(major, minor)| {
        minor.parse::<u16>().ok()?;
        major.parse::<u16>().ok()
    });
    match major {
        Some(1) => Ok(()),
        Some(_) => Err(Fault::version(
            format!("The command executor that received the request only supports major protocol versions '[1]', but '{version}' was sent on the request."),
            version,
        )),
        None => Err(Fault::version(format!("Unparsable protocol version value provided: {version}."), version)),
    }
}

fn pair(k: &str, v: &str) -> (ByteString, ByteString) {
    (ByteString::from(k), ByteString::from(v))
}

/// A user property made of constants: no allocation (every response carries some).
fn static_pair(k: &'static str, v: &'static str) -> (ByteString, ByteString) {
    (ByteString::from_static(k), ByteString::from_static(v))
}

/// A response on `topic` (QoS 1, same Correlation Data) expiring at `deadline`.
fn response(
    topic: ByteString,
    correlation: Option<Bytes>,
    payload: Bytes,
    user: UserProperties,
    deadline: Instant,
    recipient: Option<ByteString>,
) -> Message {
    Message {
        topic,
        payload,
        qos: QoS::AtLeastOnce,
        retain: false,
        properties: PublishProperties {
            correlation_data: correlation,
            content_type: Some(ByteString::from_static(CONTENT_TYPE)),
            user_properties: user,
            ..PublishProperties::default()
        },
        expires_at: Some(deadline),
        publisher: None,
        recipient,
    }
}

/// What a `__stat=200` response is made of besides its payload: its topic, Correlation
/// Data and `__ts`, copied out of the request into one buffer of their own (slices of the
/// request would pin the whole read buffer it arrived in): one allocation instead of three.
///
/// The response cache keeps these parts and the payload rather than the message, so the
/// message itself is freed once delivered, while its memory is still warm; evicting an entry
/// a minute later then frees one buffer, not a message, its property list and that buffer.
#[derive(Debug, Clone)]
pub struct OkParts {
    buf: Bytes,
    topic_end: usize,
    /// End of the Correlation Data in `buf`, if the request had one.
    correlation_end: Option<usize>,
}

impl OkParts {
    /// The parts of the response to a request on `topic` with `correlation`, versioned
    /// `version`.
    pub fn new(topic: &str, correlation: Option<&[u8]>, version: Option<&Hlc>) -> Self {
        let correlation_len = correlation.map_or(0, <[u8]>::len);
        let mut buf = BytesMut::with_capacity(
            topic.len() + correlation_len + if version.is_some() { 48 } else { 0 },
        );
        buf.put_slice(topic.as_bytes());
        if let Some(c) = correlation {
            buf.put_slice(c);
        }
        if let Some(v) = version {
            v.put_wire(&mut buf);
        }
        let topic_end = topic.len();
        Self {
            buf: buf.freeze(),
            topic_end,
            correlation_end: correlation.map(|_| topic_end + correlation_len),
        }
    }

    /// The Correlation Data (empty if none).
    pub fn correlation(&self) -> &[u8] {
        self.correlation_end
            .map_or(&[][..], |end| &self.buf[self.topic_end..end])
    }

    /// The response (QoS 1) carrying `payload`, expiring at `deadline`, for
    /// `recipient` alone if given (see [`Message::recipient`]).
    pub fn message(
        &self,
        payload: Bytes,
        deadline: Instant,
        recipient: Option<ByteString>,
    ) -> Message {
        let buf = &self.buf;
        let text = |range: std::ops::Range<usize>| {
            ByteString::try_from(buf.slice(range)).unwrap_or_default()
        };
        let end = self.correlation_end.unwrap_or(self.topic_end);
        let mut user = Vec::with_capacity(3);
        user.push(static_pair(STATUS_PROPERTY, "200"));
        user.push(static_pair(PROTOCOL_VERSION_PROPERTY, PROTOCOL_VERSION));
        if end < buf.len() {
            user.push((
                ByteString::from_static(TIMESTAMP_PROPERTY),
                text(end..buf.len()),
            ));
        }
        let correlation = self.correlation_end.map(|c| buf.slice(self.topic_end..c));
        response(
            text(0..self.topic_end),
            correlation,
            payload,
            user,
            deadline,
            recipient,
        )
    }
}

/// A fault response, with the properties the SDK invoker reads for that status.
pub fn fault_response(
    topic: ByteString,
    correlation: Option<Bytes>,
    fault: &Fault,
    deadline: Instant,
) -> Message {
    let mut user = vec![
        pair(APPLICATION_ERROR_PROPERTY, "false"),
        pair(STATUS_PROPERTY, &fault.status.to_string()),
        pair(PROTOCOL_VERSION_PROPERTY, PROTOCOL_VERSION),
        pair(STATUS_MESSAGE_PROPERTY, &fault.message),
    ];
    if let Some(name) = fault.property_name {
        user.push(pair(PROPERTY_NAME_PROPERTY, name));
    }
    if let Some(requested) = &fault.request_version {
        user.push(pair(SUPPORTED_MAJOR_PROPERTY, "1"));
        user.push(pair(REQUEST_VERSION_PROPERTY, requested));
    }
    // The caller addresses it to the requester.
    response(topic, correlation, Bytes::new(), user, deadline, None)
}

/// The answer to a QoS 0 request: the SDK executor's fault (`__stat` 400), and the same
/// reason as a RESP error payload, which is all a raw client such as `mosquitto_rr`
/// prints (the SDKs never send QoS 0, so only such clients see it).
pub fn qos0_response(topic: ByteString, correlation: Option<Bytes>, deadline: Instant) -> Message {
    let mut reply = fault_response(topic, correlation, &Fault::qos0(), deadline);
    reply.payload = Bytes::from(format!("-ERR {QOS0_MESSAGE}\r\n"));
    reply
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(correlation: bool, expiry: Option<u32>, version: Option<&str>) -> PublishProperties {
        PublishProperties {
            correlation_data: correlation.then(|| Bytes::from_static(&[7; 16])),
            message_expiry_interval: expiry,
            user_properties: version
                .map(|v| pair(PROTOCOL_VERSION_PROPERTY, v))
                .into_iter()
                .collect(),
            ..PublishProperties::default()
        }
    }

    fn check(props: &PublishProperties) -> Result<(), Fault> {
        super::check(props, &RequestProps::of(props))
    }

    #[test]
    fn request_props_take_the_first_value_of_each() {
        let props = PublishProperties {
            user_properties: vec![
                pair("__t", "no"),
                pair("__ts", "1"),
                pair("__protVer", "1.0"),
                pair("__ts", "2"),
                pair("__ftx", "no"),
                pair("__ft", "f"),
                pair("__ft", "g"),
            ],
            ..PublishProperties::default()
        };
        let found = RequestProps::of(&props);
        assert_eq!(found.timestamp, Some("1"));
        assert_eq!(found.fencing_token, Some("f"));
        assert_eq!(found.protocol_version, Some("1.0"));
        assert_eq!(
            RequestProps::of(&PublishProperties::default()),
            RequestProps::default()
        );
    }

    #[test]
    fn checks_follow_the_executor_order() {
        assert_eq!(
            check(&props(false, None, Some("2.0")))
                .unwrap_err()
                .property_name,
            Some("Correlation Data")
        );
        assert_eq!(
            check(&props(true, None, Some("2.0")))
                .unwrap_err()
                .property_name,
            Some("Message Expiry")
        );
        assert_eq!(
            check(&props(true, Some(5), Some("2.0")))
                .unwrap_err()
                .status,
            505
        );
        assert_eq!(
            check(&props(true, Some(5), Some("x")))
                .unwrap_err()
                .request_version
                .as_deref(),
            Some("x")
        );
        assert!(check(&props(true, Some(5), Some("1.7"))).is_ok());
        assert!(check(&props(true, Some(5), Some("1.0"))).is_ok());
        assert_eq!(
            check(&props(true, Some(5), Some("1.0.0")))
                .unwrap_err()
                .status,
            505
        );
        assert!(check(&props(true, Some(5), None)).is_ok());
    }

    #[test]
    fn reserved_response_topics() {
        assert!(is_forbidden_response_topic(REQUEST_TOPIC));
        assert!(is_forbidden_response_topic(
            "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/x"
        ));
        assert!(!is_forbidden_response_topic(
            "clients/me/services/statestore/_any_/command/invoke/response"
        ));
    }
}
