//! MQTT 3.1.1 and 5.0 wire codec for statehub.
//!
//! * [`packet`]: statehub's own packet types. The broker depends on these only.
//! * [`Codec`]: sans-IO framing. `decode(&mut BytesMut) -> Result<Option<Packet>, DecodeError>`
//!   where `Ok(None)` means "not enough bytes yet"; `encode(&Packet, &mut BytesMut)`
//!   appends one packet. No sockets here: the connection task owns the I/O.
//! * The byte-level work is delegated to `rmqtt-codec` (see ARCHITECTURE.md for why);
//!   `convert` maps between its types and ours, and [`validate`] adds the protocol
//!   checks it leaves to the caller, each tagged with its spec clause.
//! * Where rmqtt-codec is wrong or lossy, this crate does the work itself: framing
//!   (`frame`), PUBLISH (`publish`), the CONNECT layout checks (`connect`) and the
//!   MQTT 5 short-form acknowledgements (see [`Codec`]); `wire` holds the byte-level
//!   helpers they share.

mod codec;
mod connect;
mod convert;
mod error;
mod frame;
pub mod packet;
mod property_id;
mod publish;
mod reason;
mod room;
mod strings;
pub mod validate;
mod wire;

pub use bytestring::ByteString;
pub use codec::Codec;
pub use error::{DecodeError, EncodeError};
pub use packet::*;
pub use publish::PublishRef;
pub use reason::ReasonCode;
