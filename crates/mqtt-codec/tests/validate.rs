//! Topic name, topic filter and shared-subscription checks.

use statehub_mqtt_codec::validate::{shared_filter, topic_filter, topic_name};
use statehub_mqtt_codec::DecodeError;

fn clause(r: Result<(), DecodeError>) -> &'static str {
    match r {
        Ok(()) => "ok",
        Err(DecodeError::Protocol { clause, .. } | DecodeError::Malformed { clause, .. }) => clause,
        Err(e) => panic!("unexpected {e:?}"),
    }
}

#[test]
fn topic_names() {
    for ok in [
        "a",
        "a/b",
        "/",
        "//",
        "$SYS/x",
        "sport/tennis/player1",
        "ü/∑",
    ] {
        assert_eq!(clause(topic_name(ok)), "ok", "{ok}");
    }
    assert_eq!(clause(topic_name("")), "MQTT-4.7.3-1");
    assert_eq!(clause(topic_name("a/+")), "MQTT-3.3.2-2");
    assert_eq!(clause(topic_name("#")), "MQTT-3.3.2-2");
    assert_eq!(clause(topic_name("a#b")), "MQTT-3.3.2-2");
    assert_eq!(clause(topic_name("a\0b")), "MQTT-4.7.3-2");
}

#[test]
fn topic_filters() {
    for ok in [
        "#",
        "+",
        "a/#",
        "a/+/b",
        "+/+",
        "/+",
        "a//b",
        "+/#",
        "$share",
        "sport/tennis/#",
    ] {
        assert_eq!(clause(topic_filter(ok)), "ok", "{ok}");
    }
    assert_eq!(clause(topic_filter("")), "MQTT-4.7.3-1");
    assert_eq!(clause(topic_filter("a#")), "MQTT-4.7.1-1");
    assert_eq!(clause(topic_filter("#/a")), "MQTT-4.7.1-1");
    assert_eq!(clause(topic_filter("a/#/")), "MQTT-4.7.1-1");
    assert_eq!(clause(topic_filter("a+")), "MQTT-4.7.1-2");
    assert_eq!(clause(topic_filter("a/+b/c")), "MQTT-4.7.1-2");
    assert_eq!(clause(topic_filter("a/\0")), "MQTT-4.7.3-2");
}

#[test]
fn shared_filters() {
    assert_eq!(shared_filter("a/b"), Ok(None));
    assert_eq!(shared_filter("$sharefoo/a"), Ok(None));
    assert_eq!(shared_filter("$share/g/a/b"), Ok(Some(("g", "a/b"))));
    assert_eq!(shared_filter("$share/group1/#"), Ok(Some(("group1", "#"))));
    assert_eq!(shared_filter("$share/g/+/x"), Ok(Some(("g", "+/x"))));
    let err = |f| match shared_filter(f) {
        Err(DecodeError::Protocol { clause, .. }) => clause,
        other => panic!("{f}: {other:?}"),
    };
    assert_eq!(err("$share/"), "MQTT-4.8.2-1");
    assert_eq!(err("$share//a"), "MQTT-4.8.2-1");
    assert_eq!(err("$share/g"), "MQTT-4.8.2-2");
    assert_eq!(err("$share/g/"), "MQTT-4.8.2-2");
    assert_eq!(err("$share/g+/a"), "MQTT-4.8.2-2");
    assert_eq!(err("$share/#/a"), "MQTT-4.8.2-2");
    assert_eq!(err("$share/g/a#"), "MQTT-4.7.1-1");
}
