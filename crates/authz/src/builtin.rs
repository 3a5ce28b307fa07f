//! Protections that hold with or without rules: the state store's per-client topics
//! belong to their client, and `$` topics belong to the server.
//!
//! The state store uses two kinds of per-client topics:
//!
//! * **notifications**: `clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/<HEX(client id)>/command/notify/<HEX(key)>`,
//!   which the server delivers straight into the observer's session and never routes;
//! * **responses**: whatever Response Topic a request names; the SDKs name one under
//!   `clients/<client id>/` (Rust and .NET) or `clients/<HEX(client id)>/` (Go) with the
//!   store's id `FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8` as a later level. The server
//!   routes a response to its requester's subscriptions only (see the broker's
//!   `Message::recipient`), never to anyone else's.
//!
//! So nothing another client publishes or subscribes to can ever put a response or a
//! notification in front of anyone but its owner. On top of that, these checks refuse
//! what can only be an attack or a mistake:
//!
//! * PUBLISH on a `$` topic (only the server publishes there), on any notification topic
//!   (a forged notification), or on another client's response topic (a forged response);
//! * SUBSCRIBE to a filter that names another client's notification or response topics
//!   (a literal client level that is not the subscriber's). A filter with a wildcard
//!   there (`clients/#`, `clients/+/services/#`) is allowed: it can match those topics,
//!   but nothing is ever delivered to it from them, as said above.
//!
//! A client owns a notification space by the upper-case hex of its id only (a raw id
//! such as `41` could otherwise name the space of client `A`); a response space by its id
//! or that hex, as the SDKs use both.

use statehub_state_store::REQUEST_TOPIC;

/// The state store's id, a level of every topic it uses.
pub const STATE_STORE_ID: &str = "FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8";

/// Why a built-in protection refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Protected {
    #[error("only the server publishes on $ topics")]
    DollarTopic,
    #[error("state store notifications are published by the server only")]
    Notification,
    #[error("the topic belongs to another client's state store responses or notifications")]
    OtherClient,
}

/// Checks a PUBLISH's Topic Name (or a will topic).
pub fn check_publish(client_id: &str, topic: &str) -> Result<(), Protected> {
    if topic.starts_with('$') && topic != REQUEST_TOPIC {
        return Err(Protected::DollarTopic);
    }
    let Some(rest) = topic.strip_prefix("clients/") else {
        return Ok(());
    };
    let mut levels = rest.split('/');
    match space(&mut levels) {
        Some(Space::Notification(_)) => Err(Protected::Notification),
        Some(Space::Client(owner)) if !owns_response(client_id, owner) => {
            match levels.any(|l| l == STATE_STORE_ID) {
                true => Err(Protected::OtherClient),
                false => Ok(()),
            }
        }
        _ => Ok(()),
    }
}

/// Checks a SUBSCRIBE filter (shared or not).
pub fn check_subscribe(client_id: &str, filter: &str) -> Result<(), Protected> {
    let (_, filter) = crate::topic::split_shared(filter);
    let Some(rest) = filter.strip_prefix("clients/") else {
        return Ok(());
    };
    let mut levels = rest.split('/');
    match space(&mut levels) {
        Some(Space::Notification(owner)) if !is_wildcard(owner) && !is_hex_of(owner, client_id) => {
            Err(Protected::OtherClient)
        }
        Some(Space::Client(owner)) if !is_wildcard(owner) && !owns_response(client_id, owner) => {
            match levels.any(|l| l == STATE_STORE_ID) {
                true => Err(Protected::OtherClient),
                false => Ok(()),
            }
        }
        _ => Ok(()),
    }
}

/// Whose space the levels after `clients/` are in. Consumes the levels it reads.
enum Space<'a> {
    /// `statestore/v1/<id>/<owner>/...`: notifications.
    Notification(&'a str),
    /// `<owner>/...`: maybe responses (if the store's id follows).
    Client(&'a str),
}

fn space<'a>(levels: &mut std::str::Split<'a, char>) -> Option<Space<'a>> {
    let first = levels.next()?;
    if first != "statestore" {
        return Some(Space::Client(first));
    }
    let mut ahead = levels.clone();
    if ahead.next() == Some("v1") && ahead.next() == Some(STATE_STORE_ID) {
        *levels = ahead.clone();
        return levels.next().map(Space::Notification);
    }
    Some(Space::Client(first))
}

fn is_wildcard(level: &str) -> bool {
    level == "+" || level == "#"
}

fn owns_response(client_id: &str, level: &str) -> bool {
    level == client_id || is_hex_of(level, client_id)
}

/// Whether `level` is the upper-case hex of `client_id`'s bytes.
fn is_hex_of(level: &str, client_id: &str) -> bool {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let level = level.as_bytes();
    level.len() == 2 * client_id.len()
        && client_id
            .bytes()
            .zip(level.chunks_exact(2))
            .all(|(b, pair)| {
                pair[0] == HEX[usize::from(b >> 4)] && pair[1] == HEX[usize::from(b & 0xf)]
            })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOTIFY: &str = "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8";

    #[test]
    fn publishing() {
        assert_eq!(check_publish("a", "$SYS/x"), Err(Protected::DollarTopic));
        assert_eq!(check_publish("a", REQUEST_TOPIC), Ok(()));
        assert_eq!(check_publish("a", "sensors/1"), Ok(()));
        let own_notify = format!("{NOTIFY}/61/command/notify/6B");
        assert_eq!(
            check_publish("a", &own_notify),
            Err(Protected::Notification)
        );
        let other = format!("clients/b/services/statestore/v1/{STATE_STORE_ID}/command/invoke");
        assert_eq!(check_publish("a", &other), Err(Protected::OtherClient));
        assert_eq!(check_publish("b", &other), Ok(()));
        assert_eq!(check_publish("a", "clients/b/telemetry"), Ok(()));
        let go = format!("clients/62/statestore/v1/{STATE_STORE_ID}/command/invoke");
        assert_eq!(check_publish("b", &go), Ok(()));
        assert_eq!(check_publish("a", &go), Err(Protected::OtherClient));
    }

    #[test]
    fn subscribing() {
        let own = format!("{NOTIFY}/61/command/notify/#");
        assert_eq!(check_subscribe("a", &own), Ok(()));
        assert_eq!(check_subscribe("b", &own), Err(Protected::OtherClient));
        // The raw id does not own a notification space: "41" is the hex of "A".
        let raw = format!("{NOTIFY}/41/command/notify/#");
        assert_eq!(check_subscribe("41", &raw), Err(Protected::OtherClient));
        assert_eq!(check_subscribe("A", &raw), Ok(()));
        for wild in [
            "clients/#",
            "#",
            "clients/+/services/#",
            &format!("{NOTIFY}/+/command/notify/#"),
        ] {
            assert_eq!(check_subscribe("a", wild), Ok(()), "{wild}");
        }
        let other = format!("clients/b/services/statestore/v1/{STATE_STORE_ID}/command/invoke");
        assert_eq!(check_subscribe("a", &other), Err(Protected::OtherClient));
        assert_eq!(
            check_subscribe("a", &format!("$share/g/{other}")),
            Err(Protected::OtherClient)
        );
        assert_eq!(check_subscribe("b", &other), Ok(()));
        assert_eq!(check_subscribe("a", "clients/b/telemetry/#"), Ok(()));
    }

    #[test]
    fn hex() {
        assert!(is_hex_of("61", "a"));
        assert!(is_hex_of("6D792D636C69656E74", "my-client"));
        assert!(!is_hex_of("6d", "m"));
        assert!(!is_hex_of("61", "ab"));
    }
}
