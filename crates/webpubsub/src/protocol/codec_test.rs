use prost::Message as _;
use serde_json::json;

use super::*;
use crate::protocol::proto::{Any, Data, GroupMessage, SendToGroupMessage, UpstreamMessage};

fn proto_out(m: Message) -> proto::DownstreamMessage {
    match m {
        Message::Binary(b) => proto::DownstreamMessage::decode(b.as_ref()).unwrap(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn json_and_protobuf_requests_agree() {
    let json = decode_text(
        r#"{"type":"sendToGroup","group":"g","ackId":3,"noEcho":true,"dataType":"text","data":"hi"}"#,
    );
    let pb = UpstreamMessage {
        message: Some(proto::Upstream::SendToGroup(SendToGroupMessage {
            group: "g".into(),
            ack_id: Some(3),
            data: Some(MessageData {
                data: Some(Data::Text("hi".into())),
            }),
            no_echo: Some(true),
        })),
    };
    assert_eq!(json, decode_binary(&pb.encode_to_vec()));
    assert_eq!(
        json.unwrap(),
        Request::SendToGroup {
            group: "g".into(),
            ack_id: Some(3),
            no_echo: true,
            payload: Ok(Payload::Text("hi".into()))
        }
    );
    let join = UpstreamMessage {
        message: Some(proto::Upstream::JoinGroup(GroupMessage {
            group: "g".into(),
            ack_id: None,
        })),
    };
    assert_eq!(
        decode_binary(&join.encode_to_vec()).unwrap(),
        Request::JoinGroup {
            group: "g".into(),
            ack_id: None
        }
    );
    assert!(matches!(
        decode_binary(&[0xff, 0xff]),
        Err(ProtocolError::Protobuf(_))
    ));
}

#[test]
fn protobuf_data_must_be_an_any() {
    let any = Any {
        type_url: "type.googleapis.com/x".into(),
        value: vec![8, 1],
    };
    let good = base64::Engine::encode(
        &base64::engine::general_purpose::STANDARD,
        any.encode_to_vec(),
    );
    let r = decode_text(
        &json!({"type":"sendToGroup","group":"g","dataType":"protobuf","data":good}).to_string(),
    )
    .unwrap();
    assert!(matches!(
        r,
        Request::SendToGroup {
            payload: Ok(Payload::Protobuf(_)),
            ..
        }
    ));
    let r =
        decode_text(r#"{"type":"sendToGroup","group":"g","dataType":"protobuf","data":"//8="}"#)
            .unwrap();
    assert!(matches!(
        r,
        Request::SendToGroup {
            payload: Err(ProtocolError::Protobuf(_)),
            ..
        }
    ));
}

#[test]
fn replies_per_subprotocol() {
    let ack = Downstream::ack_err(1, "Duplicate", "m");
    assert_eq!(
        encode_reply(Subprotocol::Json, &ack).unwrap(),
        Message::Text(ack.to_text().into())
    );
    let out = proto_out(encode_reply(Subprotocol::ProtobufReliable, &ack).unwrap());
    assert_eq!(
        out.message,
        Some(proto::Downstream::Ack(proto::AckMessage {
            ack_id: 1,
            success: false,
            error: Some(proto::ErrorMessage {
                name: "Duplicate".into(),
                message: "m".into()
            })
        }))
    );
    let connected = Downstream::System(SystemEvent::Connected {
        connection_id: "c".into(),
        user_id: None,
        reconnection_token: Some("t".into()),
    });
    let out = proto_out(encode_reply(Subprotocol::ProtobufReliable, &connected).unwrap());
    assert_eq!(
        out.message,
        Some(proto::Downstream::System(proto::SystemMessage {
            message: Some(proto::System::Connected(proto::ConnectedMessage {
                connection_id: "c".into(),
                user_id: String::new(),
                reconnection_token: "t".into()
            }))
        }))
    );
    assert_eq!(
        proto_out(encode_reply(Subprotocol::Protobuf, &Downstream::Pong).unwrap()).message,
        Some(proto::Downstream::Pong(proto::Empty {}))
    );
}

#[test]
fn data_per_subprotocol() {
    let payload = Payload::Json(json!({"a":1}));
    let msg = DataMessageRef {
        from: MessageSource::Group,
        group: Some("g"),
        from_user_id: Some("u"),
        payload: &payload,
        stream: None,
    };
    assert_eq!(
        encode_data(Subprotocol::Raw, &msg, None),
        Message::Text(r#"{"a":1}"#.into())
    );
    let bin = Payload::Binary(vec![1, 2]);
    let raw_bin = DataMessageRef {
        payload: &bin,
        stream: None,
        ..msg
    };
    assert_eq!(
        encode_data(Subprotocol::Raw, &raw_bin, None),
        Message::Binary(vec![1u8, 2].into())
    );
    assert!(
        matches!(encode_data(Subprotocol::JsonReliable, &msg, Some(2)), Message::Text(t) if t.as_str().contains(r#""sequenceId":2"#))
    );
    let out = proto_out(encode_data(Subprotocol::ProtobufReliable, &msg, Some(9)));
    assert_eq!(
        out.message,
        Some(proto::Downstream::Data(proto::DataMessage {
            from: "group".into(),
            group: Some("g".into()),
            data: Some(MessageData {
                data: Some(Data::Json(r#"{"a":1}"#.into()))
            }),
            sequence_id: 9,
        }))
    );
}
