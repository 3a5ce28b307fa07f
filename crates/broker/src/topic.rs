//! Topic name and filter matching (MQTT 5 section 4.7).

/// Whether `filter` matches `topic`; topics starting with `$` are not matched by a
/// filter starting with a wildcard [MQTT-4.7.2-1]. The authorization rules match with
/// the same function.
pub use statehub_authz::topic::matches;

/// Number of levels of a topic name or filter.
pub fn levels(topic: &str) -> usize {
    memchr::memchr_iter(b'/', topic.as_bytes()).count() + 1
}

/// Whether `topic` has more than `max` levels; cheap for a topic too short to.
pub fn too_deep(topic: &str, max: usize) -> bool {
    topic.len() >= max && levels(topic) > max
}

/// The start of a client-given topic or filter, short enough for a log line.
pub(crate) fn for_log(topic: &str) -> &str {
    let mut end = topic.len().min(100);
    while !topic.is_char_boundary(end) {
        end -= 1;
    }
    &topic[..end]
}

/// The topic level the server keeps to itself: the answers to the admin view's state
/// store requests travel under `$statehub/admin/`, so no client may subscribe there.
pub const RESERVED_LEVEL: &str = "$statehub";

/// Whether a filter (without its `$share/` prefix) reaches into [`RESERVED_LEVEL`].
/// Wildcards at the first level never match `$` topics [MQTT-4.7.2-1].
pub fn is_reserved_filter(filter: &str) -> bool {
    filter.split('/').next() == Some(RESERVED_LEVEL)
}

/// Whether a filter contains a wildcard.
pub fn has_wildcard(filter: &str) -> bool {
    filter.contains(['+', '#'])
}

#[cfg(test)]
pub(crate) mod strategies;

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn wildcards() {
        assert!(matches("a/+/c", "a/b/c"));
        assert!(matches("a/#", "a"));
        assert!(matches("a/#", "a/b/c"));
        assert!(matches("#", "a/b"));
        assert!(matches("+", ""));
        assert!(matches("+/+", "/"));
        assert!(!matches("a/+", "a/b/c"));
        assert!(!matches("a/b", "a/b/c"));
        assert!(matches("/+", "/x"));
        assert!(!matches("+", "/x"));
    }

    #[test]
    fn dollar_topics_not_matched_by_leading_wildcards() {
        assert!(!matches("#", "$SYS/x"));
        assert!(!matches("+/x", "$SYS/x"));
        assert!(matches("$SYS/#", "$SYS/x"));
        assert!(matches("$SYS/+", "$SYS/x"));
    }
}
