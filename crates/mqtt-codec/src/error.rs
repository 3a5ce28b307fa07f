//! Decode and encode errors. Every decode error names the spec statement it
//! enforces and maps to the reason code the peer is disconnected with.

use crate::ReasonCode;

/// Why bytes from a peer could not be turned into a packet. Fatal for the connection:
/// the broker answers with DISCONNECT carrying [`DecodeError::reason_code`] (MQTT 5)
/// or closes the socket (3.1.1).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The bytes do not form a valid packet (bad lengths, bad flags, bad property, ...).
    #[error("malformed packet [{clause}]: {detail}")]
    Malformed {
        clause: &'static str,
        detail: &'static str,
    },
    /// A well-formed packet that the protocol forbids here.
    #[error("protocol error [{clause}]: {detail}")]
    Protocol {
        clause: &'static str,
        detail: &'static str,
    },
    /// A string field is not valid UTF-8 or contains forbidden code points.
    #[error("invalid UTF-8 string [MQTT-1.5.4-1]")]
    InvalidUtf8,
    /// The packet is larger than the server's Maximum Packet Size.
    #[error("packet of {size} bytes exceeds the maximum of {max} [MQTT-3.2.2-15]")]
    PacketTooLarge { size: u64, max: u32 },
    /// CONNECT names a protocol level we do not speak.
    #[error("unsupported protocol version {0} [MQTT-3.1.2-2]")]
    UnsupportedProtocolVersion(u8),
    /// The first packet on a connection was not CONNECT.
    #[error("first packet was not CONNECT [MQTT-3.1.0-1]")]
    ExpectedConnect,
}

impl DecodeError {
    /// The reason code to disconnect the peer with (or to refuse a CONNECT with).
    /// An empty 3.1.1 Client Identifier without Clean Session gives 0x85, which a
    /// 3.1.1 CONNACK carries as return code 2, as [MQTT-3.1.3-8] requires. Two
    /// protocol errors have a code of their own: a wildcard in a Topic Name is 0x90
    /// Topic Name invalid, Topic Alias 0 is 0x94 Topic Alias invalid (spec 3.3.2.1,
    /// 3.3.2.3.4).
    pub fn reason_code(&self) -> ReasonCode {
        match self {
            DecodeError::Protocol {
                clause: "MQTT-3.1.3-8",
                ..
            } => ReasonCode::CLIENT_IDENTIFIER_NOT_VALID,
            DecodeError::Protocol {
                clause: "MQTT-3.3.2-2",
                ..
            } => ReasonCode::TOPIC_NAME_INVALID,
            DecodeError::Protocol {
                clause: "MQTT-3.3.2-8",
                ..
            } => ReasonCode::TOPIC_ALIAS_INVALID,
            DecodeError::Malformed { .. } | DecodeError::InvalidUtf8 => {
                ReasonCode::MALFORMED_PACKET
            }
            DecodeError::Protocol { .. } | DecodeError::ExpectedConnect => {
                ReasonCode::PROTOCOL_ERROR
            }
            DecodeError::PacketTooLarge { .. } => ReasonCode::PACKET_TOO_LARGE,
            DecodeError::UnsupportedProtocolVersion(_) => ReasonCode::UNSUPPORTED_PROTOCOL_VERSION,
        }
    }
}

/// Why a packet could not be written. The broker treats this as a bug in what it
/// built (never a peer's fault) and closes the connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    #[error("packet cannot be encoded: {0}")]
    Invalid(&'static str),
    #[error("packet type not available in MQTT 3.1.1")]
    NotInV311,
    #[error("encoder has no protocol version yet (no CONNECT seen)")]
    NoVersion,
}
