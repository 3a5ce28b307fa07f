//! MQTT 5 property identifiers (spec 2.2.2.2, table 2-4) of the properties the hand-written
//! decoders (`connect.rs`, `publish.rs`) look at.

pub const PAYLOAD_FORMAT: u8 = 0x01;
pub const MESSAGE_EXPIRY: u8 = 0x02;
pub const CONTENT_TYPE: u8 = 0x03;
pub const RESPONSE_TOPIC: u8 = 0x08;
pub const CORRELATION_DATA: u8 = 0x09;
pub const SUBSCRIPTION_ID: u8 = 0x0B;
pub const SESSION_EXPIRY: u8 = 0x11;
pub const AUTH_METHOD: u8 = 0x15;
pub const AUTH_DATA: u8 = 0x16;
pub const REQUEST_PROBLEM: u8 = 0x17;
pub const WILL_DELAY: u8 = 0x18;
pub const REQUEST_RESPONSE: u8 = 0x19;
pub const RECEIVE_MAXIMUM: u8 = 0x21;
pub const TOPIC_ALIAS_MAXIMUM: u8 = 0x22;
pub const TOPIC_ALIAS: u8 = 0x23;
pub const USER_PROPERTY: u8 = 0x26;
pub const MAXIMUM_PACKET_SIZE: u8 = 0x27;
