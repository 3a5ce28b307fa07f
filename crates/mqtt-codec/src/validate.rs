//! Protocol checks on topic names, topic filters and payloads, each error tagged
//! with the MQTT 5.0 statement it enforces.
//!
//! The codec itself calls [`topic_name`] on every PUBLISH it decodes. Filters are
//! left to the broker because an invalid filter is answered with a SUBACK/UNSUBACK
//! failure code, not a disconnect; likewise [`payload_utf8`] returns a reason code
//! so the broker can choose between PUBACK/PUBREC with 0x99 and DISCONNECT.

use crate::{DecodeError, Publish, ReasonCode};

const fn protocol(clause: &'static str, detail: &'static str) -> DecodeError {
    DecodeError::Protocol { clause, detail }
}

fn no_null(s: &str) -> Result<(), DecodeError> {
    if s.contains('\0') {
        return Err(protocol("MQTT-4.7.3-2", "topic contains U+0000"));
    }
    Ok(())
}

/// A Topic Name as used in PUBLISH (and Will Topic): at least one character
/// [MQTT-4.7.3-1], no wildcards [MQTT-3.3.2-2], no U+0000 [MQTT-4.7.3-2].
/// A PUBLISH that uses a Topic Alias may have an empty topic; callers skip this
/// check in that case.
pub fn topic_name(topic: &str) -> Result<(), DecodeError> {
    if topic.is_empty() {
        return Err(protocol("MQTT-4.7.3-1", "empty topic name"));
    }
    // Every PUBLISH comes through here: one vectorised pass over the bytes for the
    // common, valid case ('+', '#' and NUL are ASCII, never inside a multi-byte
    // character). A byte-at-a-time loop cost about 7 instructions a byte (callgrind).
    if memchr::memchr3(b'+', b'#', 0, topic.as_bytes()).is_none() {
        return Ok(());
    }
    if topic.contains(['+', '#']) {
        return Err(protocol(
            "MQTT-3.3.2-2",
            "wildcard character in a topic name",
        ));
    }
    no_null(topic)
}

/// A Topic Filter as used in SUBSCRIBE/UNSUBSCRIBE: at least one character
/// [MQTT-4.7.3-1]; `#` only as the whole last level [MQTT-4.7.1-1]; `+` only as a
/// whole level [MQTT-4.7.1-2]; no U+0000 [MQTT-4.7.3-2].
pub fn topic_filter(filter: &str) -> Result<(), DecodeError> {
    if filter.is_empty() {
        return Err(protocol("MQTT-4.7.3-1", "empty topic filter"));
    }
    let mut levels = filter.split('/').peekable();
    while let Some(level) = levels.next() {
        if level.contains('#') && (level != "#" || levels.peek().is_some()) {
            return Err(protocol(
                "MQTT-4.7.1-1",
                "'#' must be the whole last level of a topic filter",
            ));
        }
        if level.contains('+') && level != "+" {
            return Err(protocol(
                "MQTT-4.7.1-2",
                "'+' must occupy a whole topic level",
            ));
        }
    }
    no_null(filter)
}

/// Splits a Shared Subscription filter `$share/{group}/{filter}` into
/// `(group, filter)`; `Ok(None)` for a filter that is not shared. The group must
/// be non-empty [MQTT-4.8.2-1] and free of `/`, `+`, `#`, and be followed by `/`
/// and a valid topic filter [MQTT-4.8.2-2].
pub fn shared_filter(filter: &str) -> Result<Option<(&str, &str)>, DecodeError> {
    let Some(rest) = filter.strip_prefix("$share/") else {
        return Ok(None);
    };
    let Some((group, inner)) = rest.split_once('/') else {
        return Err(if rest.is_empty() {
            protocol("MQTT-4.8.2-1", "empty share name")
        } else {
            protocol(
                "MQTT-4.8.2-2",
                "share name must be followed by '/' and a topic filter",
            )
        });
    };
    if group.is_empty() {
        return Err(protocol("MQTT-4.8.2-1", "empty share name"));
    }
    if group.contains(['+', '#']) {
        return Err(protocol("MQTT-4.8.2-2", "share name contains a wildcard"));
    }
    if inner.is_empty() {
        return Err(protocol(
            "MQTT-4.8.2-2",
            "shared subscription without a topic filter",
        ));
    }
    topic_filter(inner)?;
    no_null(group)?;
    Ok(Some((group, inner)))
}

/// When the Payload Format Indicator says UTF-8, the payload must be valid UTF-8;
/// otherwise the receiver may answer 0x99 Payload Format Invalid (MQTT 5 section
/// 3.3.2.3.2). Returns that reason code on failure.
pub fn payload_utf8(publish: &Publish) -> Result<(), ReasonCode> {
    if publish.properties.payload_format_utf8 && std::str::from_utf8(&publish.payload).is_err() {
        return Err(ReasonCode::PAYLOAD_FORMAT_INVALID);
    }
    Ok(())
}
