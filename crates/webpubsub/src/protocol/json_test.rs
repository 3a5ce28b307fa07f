use serde_json::{json, Value};

use super::*;

fn parse(text: &str) -> Upstream {
    decode_upstream(text).unwrap()
}

fn exact(msg: &Downstream, expected: Value) {
    let text = msg.to_text();
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap(),
        expected,
        "{text}"
    );
    assert_eq!(
        &serde_json::from_str::<Downstream>(&text).unwrap(),
        msg,
        "round trip of {text}"
    );
}

#[test]
fn join_and_leave() {
    assert_eq!(
        parse(r#"{"type":"joinGroup","group":"g","ackId":1}"#),
        Upstream::JoinGroup {
            group: "g".into(),
            ack_id: Some(1)
        }
    );
    assert_eq!(
        parse(r#"{"type":"leaveGroup","group":"g"}"#),
        Upstream::LeaveGroup {
            group: "g".into(),
            ack_id: None
        }
    );
}

#[test]
fn send_to_group_defaults_to_json_and_echo() {
    let m = parse(r#"{"type":"sendToGroup","group":"g","ackId":7,"data":{"x":1}}"#);
    assert_eq!(
        m,
        Upstream::SendToGroup {
            group: "g".into(),
            ack_id: Some(7),
            no_echo: false,
            data_type: DataType::Json,
            data: json!({"x":1}),
            stream: None,
        }
    );
    let m = parse(
        r#"{"type":"sendToGroup","group":"g","noEcho":true,"dataType":"binary","data":"AQID"}"#,
    );
    assert!(matches!(
        m,
        Upstream::SendToGroup {
            no_echo: true,
            data_type: DataType::Binary,
            ..
        }
    ));
}

/// Found by the `webpubsub_json` fuzz target: a number is read as the double nearest
/// to its digits, so subscribers get the number the publisher sent. The default float
/// parser can be one unit in the last place off: it read this one (the shortest form
/// of its double, as `JSON.stringify` writes it) as 0.11111911111111113.
#[test]
fn json_numbers_are_delivered_exactly() {
    let m = parse(r#"{"type":"sendToGroup","group":"g","data":[0.11111911111111111]}"#);
    let Upstream::SendToGroup { data, .. } = m else {
        panic!("{m:?}")
    };
    assert_eq!(data.to_string(), "[0.11111911111111111]");
}

#[test]
fn event_sequence_ack_ping_unknown() {
    assert_eq!(
        parse(r#"{"type":"event","event":"e","dataType":"text","data":"hi","ackId":2}"#),
        Upstream::Event {
            event: "e".into(),
            ack_id: Some(2),
            data_type: DataType::Text,
            data: json!("hi")
        }
    );
    assert_eq!(
        parse(r#"{"type":"sequenceAck","sequenceId":5}"#),
        Upstream::SequenceAck { sequence_id: 5 }
    );
    assert_eq!(parse(r#"{"type":"ping"}"#), Upstream::Ping);
    assert_eq!(parse(r#"{"type":"somethingNew","x":1}"#), Upstream::Unknown);
}

#[test]
fn upstream_round_trips() {
    for m in [
        Upstream::JoinGroup {
            group: "a".into(),
            ack_id: Some(1),
        },
        Upstream::LeaveGroup {
            group: "a".into(),
            ack_id: None,
        },
        Upstream::SendToGroup {
            group: "a".into(),
            ack_id: Some(u64::MAX),
            no_echo: true,
            data_type: DataType::Protobuf,
            data: json!("AQ=="),
            stream: None,
        },
        Upstream::Event {
            event: "e".into(),
            ack_id: None,
            data_type: DataType::Json,
            data: json!([1, 2]),
        },
        Upstream::SequenceAck { sequence_id: 9 },
        Upstream::Ping,
    ] {
        let text = serde_json::to_string(&m).unwrap();
        assert_eq!(parse(&text), m, "{text}");
    }
}

#[test]
fn invalid_frames_keep_the_ack_id() {
    assert!(matches!(
        decode_upstream("{not json"),
        Err(ProtocolError::Json(_))
    ));
    assert!(matches!(
        decode_upstream("[1,2]"),
        Err(ProtocolError::NotAnObject)
    ));
    match decode_upstream(r#"{"type":"joinGroup","ackId":3}"#) {
        Err(ProtocolError::Invalid {
            ack_id: Some(3), ..
        }) => {}
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        decode_upstream(r#"{"group":"g"}"#),
        Err(ProtocolError::Invalid { ack_id: None, .. })
    ));
}

#[test]
fn ack_shapes() {
    exact(
        &Downstream::ack_ok(1),
        json!({"type":"ack","ackId":1,"success":true}),
    );
    exact(
        &Downstream::ack_err(1, "Duplicate", "Message with ack-id: 1 has been processed"),
        json!({"type":"ack","ackId":1,"success":false,
               "error":{"name":"Duplicate","message":"Message with ack-id: 1 has been processed"}}),
    );
}

#[test]
fn system_and_pong_shapes() {
    exact(
        &Downstream::System(SystemEvent::Connected {
            connection_id: "c1".into(),
            user_id: Some("u".into()),
            reconnection_token: Some("t".into()),
        }),
        json!({"type":"system","event":"connected","connectionId":"c1","userId":"u","reconnectionToken":"t"}),
    );
    exact(
        &Downstream::System(SystemEvent::Connected {
            connection_id: "c1".into(),
            user_id: None,
            reconnection_token: None,
        }),
        json!({"type":"system","event":"connected","connectionId":"c1"}),
    );
    exact(
        &Downstream::System(SystemEvent::Disconnected {
            message: "bye".into(),
        }),
        json!({"type":"system","event":"disconnected","message":"bye"}),
    );
    exact(&Downstream::Pong, json!({"type":"pong"}));
}

#[test]
fn data_message_encoder_matches_the_owned_shape() {
    let cases = [
        (Payload::Text("hi".into()), DataType::Text, json!("hi")),
        (
            Payload::Json(json!({"k":[true]})),
            DataType::Json,
            json!({"k":[true]}),
        ),
        (
            Payload::Binary(vec![1, 2, 3]),
            DataType::Binary,
            json!("AQID"),
        ),
        (
            Payload::Protobuf(vec![8, 1]),
            DataType::Protobuf,
            json!("CAE="),
        ),
    ];
    for (payload, data_type, data) in cases {
        let r = DataMessageRef {
            from: MessageSource::Group,
            group: Some("g"),
            from_user_id: Some("u"),
            payload: &payload,
            stream: None,
        };
        let text = encode_data_message(&r, Some(4));
        let expected = Downstream::Message {
            from: MessageSource::Group,
            group: Some("g".into()),
            from_user_id: Some("u".into()),
            data_type,
            data: data.clone(),
            sequence_id: Some(4),
        };
        assert_eq!(serde_json::from_str::<Downstream>(&text).unwrap(), expected);
        assert_eq!(
            serde_json::from_str::<Value>(&text).unwrap(),
            json!({"type":"message","from":"group","group":"g","fromUserId":"u","dataType":data_type,"data":data,"sequenceId":4})
        );
    }
    let p = Payload::Text("s".into());
    let r = DataMessageRef {
        from: MessageSource::Server,
        group: None,
        from_user_id: None,
        payload: &p,
        stream: None,
    };
    assert_eq!(
        serde_json::from_str::<Value>(&encode_data_message(&r, None)).unwrap(),
        json!({"type":"message","from":"server","dataType":"text","data":"s"})
    );
}
