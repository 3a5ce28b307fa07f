//! What every statehub layer on Redis shares (the state store's engine, the broker's
//! fabric and Web PubSub's cluster): `WAIT` after a script for synchronous replication
//! ([`Wait`]), the age of a stream entry by its id ([`stream_age_ms`]), and, behind the
//! `test-server` feature, a real `redis-server` for tests ([`test_server`]). Kept apart
//! so the three layers, which do not depend on each other, run these the same way.

#[cfg(feature = "test-server")]
pub mod test_server;
mod wait;

pub use wait::{check, invoke, NotReplicated, ShortfallLog, Wait};

/// How long ago Redis appended the stream entry `id` (`{milliseconds}-{n}`), by this
/// node's clock; 0 if that is in the future (the clocks differ) or the id is not one.
pub fn stream_age_ms(id: &str) -> u64 {
    let appended = id
        .split_once('-')
        .and_then(|(ms, _)| ms.parse::<u64>().ok())
        .unwrap_or(u64::MAX);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    now.saturating_sub(appended)
}

#[cfg(test)]
mod tests {
    use super::stream_age_ms;

    #[test]
    fn a_stream_id_is_aged_by_its_milliseconds_and_a_future_or_bad_one_is_zero() {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let age = stream_age_ms(&format!("{}-3", now - 5_000));
        assert!((5_000..60_000).contains(&age), "{age}");
        assert_eq!(stream_age_ms(&format!("{}-0", now + 60_000)), 0);
        assert_eq!(stream_age_ms("garbage"), 0);
    }
}
