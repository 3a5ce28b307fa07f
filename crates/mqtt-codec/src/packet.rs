//! statehub's own MQTT packet types, one shape for both protocol versions.
//!
//! The broker is written against these types only; the wire format (and the
//! crate that implements it) stays behind [`crate::Codec`]. MQTT 3.1.1 packets
//! decode into the same structs with empty properties, and encoding for a 3.1.1
//! peer ignores the fields that version has no room for.
//!
//! Strings are [`ByteString`] (UTF-8 checked once at decode, cheap to clone) and
//! binary data is [`Bytes`], so a PUBLISH payload decoded from one socket is shared,
//! never copied, by every subscriber it is forwarded to.

use bytes::Bytes;
use bytestring::ByteString;

pub use crate::reason::ReasonCode;

/// Name/value pairs, in wire order, duplicates kept.
pub type UserProperties = Vec<(ByteString, ByteString)>;

/// Which MQTT revision a connection speaks; fixed by its CONNECT.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProtocolVersion {
    /// MQTT 3.1.1 (protocol level 4).
    V311,
    /// MQTT 5.0 (protocol level 5).
    V5,
}

/// Quality of service of a message or a subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum QoS {
    #[default]
    AtMostOnce = 0,
    AtLeastOnce = 1,
    ExactlyOnce = 2,
}

impl QoS {
    /// The QoS for a wire value, `None` for 3 or more (a malformed packet).
    pub fn from_u8(v: u8) -> Option<QoS> {
        match v {
            0 => Some(QoS::AtMostOnce),
            1 => Some(QoS::AtLeastOnce),
            2 => Some(QoS::ExactlyOnce),
            _ => None,
        }
    }
}

/// Every MQTT control packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Packet {
    Connect(Box<Connect>),
    ConnAck(ConnAck),
    Publish(Publish),
    PubAck(PubResponse),
    PubRec(PubResponse),
    PubRel(PubResponse),
    PubComp(PubResponse),
    Subscribe(Subscribe),
    SubAck(SubAck),
    Unsubscribe(Unsubscribe),
    UnsubAck(UnsubAck),
    PingReq,
    PingResp,
    Disconnect(Disconnect),
    /// MQTT 5 only.
    Auth(Auth),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connect {
    pub protocol: ProtocolVersion,
    pub clean_start: bool,
    pub keep_alive: u16,
    /// May be empty: the server then assigns one.
    pub client_id: ByteString,
    pub username: Option<ByteString>,
    pub password: Option<Bytes>,
    pub will: Option<LastWill>,
    pub properties: ConnectProperties,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConnectProperties {
    pub session_expiry_interval: Option<u32>,
    pub receive_maximum: Option<u16>,
    pub maximum_packet_size: Option<u32>,
    pub topic_alias_maximum: Option<u16>,
    pub request_response_information: Option<bool>,
    pub request_problem_information: Option<bool>,
    pub user_properties: UserProperties,
    pub authentication_method: Option<ByteString>,
    pub authentication_data: Option<Bytes>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastWill {
    pub qos: QoS,
    pub retain: bool,
    pub topic: ByteString,
    pub payload: Bytes,
    pub properties: WillProperties,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WillProperties {
    pub will_delay_interval: Option<u32>,
    /// Payload Format Indicator = 1.
    pub payload_format_utf8: bool,
    pub message_expiry_interval: Option<u32>,
    pub content_type: Option<ByteString>,
    pub response_topic: Option<ByteString>,
    pub correlation_data: Option<Bytes>,
    pub user_properties: UserProperties,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConnAck {
    pub session_present: bool,
    /// MQTT 5 reason code; for 3.1.1 the codec maps it to the nearest return code.
    pub reason_code: ReasonCode,
    pub properties: ConnAckProperties,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConnAckProperties {
    pub session_expiry_interval: Option<u32>,
    pub receive_maximum: Option<u16>,
    pub maximum_qos: Option<QoS>,
    pub retain_available: Option<bool>,
    pub maximum_packet_size: Option<u32>,
    pub assigned_client_identifier: Option<ByteString>,
    pub topic_alias_maximum: Option<u16>,
    pub reason_string: Option<ByteString>,
    pub user_properties: UserProperties,
    pub wildcard_subscription_available: Option<bool>,
    pub subscription_identifiers_available: Option<bool>,
    pub shared_subscription_available: Option<bool>,
    pub server_keep_alive: Option<u16>,
    pub response_information: Option<ByteString>,
    pub server_reference: Option<ByteString>,
    pub authentication_method: Option<ByteString>,
    pub authentication_data: Option<Bytes>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Publish {
    pub dup: bool,
    pub qos: QoS,
    pub retain: bool,
    /// Empty when the sender used a topic alias only (MQTT 5).
    pub topic: ByteString,
    /// Present iff `qos > 0`.
    pub packet_id: Option<u16>,
    pub payload: Bytes,
    pub properties: PublishProperties,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PublishProperties {
    pub payload_format_utf8: bool,
    pub message_expiry_interval: Option<u32>,
    pub topic_alias: Option<u16>,
    pub response_topic: Option<ByteString>,
    pub correlation_data: Option<Bytes>,
    pub user_properties: UserProperties,
    pub subscription_identifiers: Vec<u32>,
    pub content_type: Option<ByteString>,
}

/// PUBACK, PUBREC, PUBREL and PUBCOMP share one shape.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PubResponse {
    pub packet_id: u16,
    pub reason_code: ReasonCode,
    pub reason_string: Option<ByteString>,
    pub user_properties: UserProperties,
}

impl PubResponse {
    /// A success acknowledgement with no properties.
    pub fn ok(packet_id: u16) -> Self {
        PubResponse {
            packet_id,
            ..Default::default()
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SubscriptionOptions {
    pub qos: QoS,
    pub no_local: bool,
    pub retain_as_published: bool,
    /// 0: send retained on subscribe; 1: only if the subscription is new; 2: never.
    pub retain_handling: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Subscribe {
    pub packet_id: u16,
    pub subscription_identifier: Option<u32>,
    pub user_properties: UserProperties,
    pub filters: Vec<(ByteString, SubscriptionOptions)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SubAck {
    pub packet_id: u16,
    /// One per filter; for 3.1.1 the granted QoS (0x00..0x02) or 0x80.
    pub reason_codes: Vec<ReasonCode>,
    pub reason_string: Option<ByteString>,
    pub user_properties: UserProperties,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Unsubscribe {
    pub packet_id: u16,
    pub user_properties: UserProperties,
    pub filters: Vec<ByteString>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UnsubAck {
    pub packet_id: u16,
    /// One per filter (MQTT 5 only; a 3.1.1 UNSUBACK carries none).
    pub reason_codes: Vec<ReasonCode>,
    pub reason_string: Option<ByteString>,
    pub user_properties: UserProperties,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Disconnect {
    pub reason_code: ReasonCode,
    pub session_expiry_interval: Option<u32>,
    pub reason_string: Option<ByteString>,
    pub user_properties: UserProperties,
    pub server_reference: Option<ByteString>,
}

impl Disconnect {
    pub fn with_reason(reason_code: ReasonCode) -> Self {
        Disconnect {
            reason_code,
            ..Default::default()
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Auth {
    pub reason_code: ReasonCode,
    pub authentication_method: Option<ByteString>,
    pub authentication_data: Option<Bytes>,
    pub reason_string: Option<ByteString>,
    pub user_properties: UserProperties,
}
