//! The protobuf subprotocols on a real socket, talking with a JSON client.

mod common;

use common::*;
use futures_util::SinkExt;
use prost::Message as _;
use serde_json::json;
use statehub_webpubsub::proto::{
    AckMessage, Data, DataMessage, Downstream, GroupMessage, MessageData, SendToGroupMessage,
    SequenceAckMessage, System, Upstream, UpstreamMessage,
};
use statehub_webpubsub::Limits;
use tokio_tungstenite::tungstenite::Message;

const PB_RELIABLE: &str = "protobuf.reliable.webpubsub.azure.v1";
const ALL: &[&str] = &["webpubsub.joinLeaveGroup", "webpubsub.sendToGroup"];

async fn send_pb(ws: &mut Ws, m: Upstream) {
    let bytes = UpstreamMessage { message: Some(m) }.encode_to_vec();
    ws.send(Message::binary(bytes)).await.unwrap();
}

fn data(d: Data) -> Option<MessageData> {
    Some(MessageData { data: Some(d) })
}

#[tokio::test]
async fn protobuf_and_json_clients_share_groups_and_recover() {
    let addr = start(Limits::default()).await;
    let t = token(addr, "chat", Some("pb"), ALL, &[]);
    let url = format!("ws://{addr}/client/hubs/chat?access_token={t}");
    let mut pb = try_connect(&url, Some(PB_RELIABLE)).await.unwrap();
    let Downstream::System(sys) = recv_pb(&mut pb).await else {
        panic!("connected first")
    };
    let Some(System::Connected(connected)) = sys.message else {
        panic!("{sys:?}")
    };
    assert_eq!(connected.user_id, "pb");
    assert!(!connected.reconnection_token.is_empty());

    send_pb(
        &mut pb,
        Upstream::JoinGroup(GroupMessage {
            group: "g".into(),
            ack_id: Some(1),
        }),
    )
    .await;
    assert_eq!(
        recv_pb(&mut pb).await,
        Downstream::Ack(AckMessage {
            ack_id: 1,
            success: true,
            error: None
        })
    );

    let (mut js, _) = connect(
        addr,
        "chat",
        &token(addr, "chat", Some("js"), ALL, &["g"]),
        Some(JSON),
    )
    .await;
    send(
        &mut js,
        json!({"type":"sendToGroup","group":"g","noEcho":true,"data":{"n":1}}),
    )
    .await;
    assert_eq!(
        recv_pb(&mut pb).await,
        Downstream::Data(DataMessage {
            from: "group".into(),
            group: Some("g".into()),
            data: data(Data::Json(r#"{"n":1}"#.into())),
            sequence_id: 1
        })
    );

    let publish = SendToGroupMessage {
        group: "g".into(),
        ack_id: Some(2),
        data: data(Data::Binary(vec![1, 2, 3])),
        no_echo: Some(true),
    };
    send_pb(&mut pb, Upstream::SendToGroup(publish)).await;
    assert_eq!(
        recv_pb(&mut pb).await,
        Downstream::Ack(AckMessage {
            ack_id: 2,
            success: true,
            error: None
        })
    );
    let got = recv(&mut js).await;
    assert_eq!(
        got,
        json!({"type":"message","from":"group","group":"g","fromUserId":"pb","dataType":"binary","data":"AQID"})
    );

    send_pb(
        &mut pb,
        Upstream::SequenceAck(SequenceAckMessage { sequence_id: 1 }),
    )
    .await;
    send(
        &mut js,
        json!({"type":"sendToGroup","group":"g","noEcho":true,"dataType":"text","data":"later"}),
    )
    .await;
    sync(&mut js).await;
    drop(pb);
    let rt = &connected.reconnection_token;
    let recover = format!(
        "{url}&awps_connection_id={}&awps_reconnection_token={rt}",
        connected.connection_id
    );
    let mut pb = try_connect(&recover, Some(PB_RELIABLE)).await.unwrap();
    assert!(matches!(recv_pb(&mut pb).await, Downstream::System(_)));
    let Downstream::Data(replayed) = recv_pb(&mut pb).await else {
        panic!("replay")
    };
    assert_eq!(
        (replayed.sequence_id, replayed.data),
        (2, data(Data::Text("later".into())))
    );
}

#[tokio::test]
async fn text_frames_on_protobuf_and_garbage_close_the_connection() {
    let addr = start(Limits::default()).await;
    let url = format!(
        "ws://{addr}/client/hubs/chat?access_token={}",
        token(addr, "chat", None, ALL, &[])
    );
    let mut pb = try_connect(&url, Some(PB_RELIABLE)).await.unwrap();
    recv_pb(&mut pb).await;
    pb.send(Message::text(r#"{"type":"ping"}"#)).await.unwrap();
    assert!(
        matches!(recv_pb(&mut pb).await, Downstream::System(_)),
        "disconnected"
    );
    assert_eq!(close_code(&mut pb).await, Some(1003));

    let mut pb = try_connect(&url, Some(PB_RELIABLE)).await.unwrap();
    recv_pb(&mut pb).await;
    pb.send(Message::binary(vec![0xffu8, 0xff, 0xff]))
        .await
        .unwrap();
    let Downstream::System(sys) = recv_pb(&mut pb).await else {
        panic!()
    };
    assert!(
        matches!(sys.message, Some(System::Disconnected(d)) if d.reason.contains("Invalid message"))
    );
    assert_eq!(close_code(&mut pb).await, Some(1008));
}
