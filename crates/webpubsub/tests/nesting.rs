//! Recursion over client-controlled structure is bounded, and hitting the bound gets the
//! protocol's error rather than a stack overflow: JSON nesting in client frames (serde_json's
//! limit of 128 levels), protobuf nesting (prost's limit of 100 levels; the client schema
//! has no recursive message, only unknown groups can nest), and OData filters in REST
//! calls (64 levels of parentheses, `not`s and calls).

mod common;

use common::api::{Api, V};
use common::*;
use futures_util::SinkExt;
use prost::Message as _;
use serde_json::json;
use statehub_webpubsub::proto::{
    Data, Downstream, MessageData, SendToGroupMessage, Upstream, UpstreamMessage,
};
use statehub_webpubsub::Limits;
use tokio_tungstenite::tungstenite::Message;

const ALL: &[&str] = &["webpubsub.joinLeaveGroup", "webpubsub.sendToGroup"];
const PROTOBUF: &str = "protobuf.webpubsub.azure.v1";

fn nested(depth: usize) -> String {
    format!("{}{}", "[".repeat(depth), "]".repeat(depth))
}

#[tokio::test]
async fn json_frames_nested_past_the_limit_close_with_1008() {
    let addr = start(Limits::default()).await;
    let t = token(addr, "chat", Some("u"), ALL, &["g"]);
    let (mut ws, _) = connect(addr, "chat", &t, Some(JSON)).await;
    let frame = |ack: u64, depth: usize| {
        format!(
            r#"{{"type":"sendToGroup","ackId":{ack},"group":"g","dataType":"json","data":{}}}"#,
            nested(depth)
        )
    };
    ws.send(Message::text(frame(1, 100))).await.unwrap();
    let echoed = recv(&mut ws).await;
    assert_eq!(echoed["type"], "message", "{echoed}");
    assert_eq!(
        recv(&mut ws).await,
        json!({"type":"ack","ackId":1,"success":true})
    );

    // 100,000 levels (200 KB, under the frame limit): a parser without a depth limit
    // would overflow the reader's stack.
    ws.send(Message::text(frame(2, 100_000))).await.unwrap();
    let d = recv(&mut ws).await;
    assert_eq!(d["event"], "disconnected", "{d}");
    assert!(
        d["message"].as_str().unwrap().contains("recursion limit"),
        "{d}"
    );
    assert_eq!(close_code(&mut ws).await, Some(1008));

    let (mut again, _) = connect(addr, "chat", &t, Some(JSON)).await;
    assert!(sync(&mut again).await.is_empty(), "the server still serves");
}

#[tokio::test]
async fn protobuf_frames_nested_past_the_limit_are_refused() {
    let addr = start(Limits::default()).await;
    let t = token(addr, "chat", Some("u"), ALL, &["g"]);
    let url = format!("ws://{addr}/client/hubs/chat?access_token={t}");
    let mut ws = try_connect(&url, Some(PROTOBUF)).await.unwrap();
    assert!(matches!(recv_pb(&mut ws).await, Downstream::System(_)));

    // JSON data inside a protobuf frame: its ack says why.
    let deep_json = UpstreamMessage {
        message: Some(Upstream::SendToGroup(SendToGroupMessage {
            group: "g".into(),
            ack_id: Some(7),
            data: Some(MessageData {
                data: Some(Data::Json(nested(200))),
            }),
            no_echo: None,
        })),
    };
    ws.send(Message::binary(deep_json.encode_to_vec()))
        .await
        .unwrap();
    let Downstream::Ack(ack) = recv_pb(&mut ws).await else {
        panic!("an ack")
    };
    assert_eq!((ack.ack_id, ack.success), (7, false));
    assert_eq!(ack.error.unwrap().name, "BadRequest");

    // 100,000 nested groups of an unknown field (start-group tags of field 15).
    ws.send(Message::binary(vec![0x7b; 100_000])).await.unwrap();
    let Downstream::System(sys) = recv_pb(&mut ws).await else {
        panic!("a disconnected message")
    };
    assert!(format!("{sys:?}").contains("recursion limit"), "{sys:?}");
    assert_eq!(close_code(&mut ws).await, Some(1008));

    let mut again = try_connect(&url, Some(PROTOBUF)).await.unwrap();
    assert!(matches!(recv_pb(&mut again).await, Downstream::System(_)));
}

#[tokio::test]
async fn odata_filters_nested_past_the_limit_get_400() {
    let addr = start(Limits::default()).await;
    let api = Api::new(addr);
    for filter in [
        format!("{}true{}", "(".repeat(1000), ")".repeat(1000)),
        format!("{}true", "not ".repeat(1000)),
        format!("{}'a'{}", "tolower(".repeat(1000), ")".repeat(1000)),
    ] {
        let filter = filter.replace(' ', "%20");
        let r = api
            .post(
                &format!("/api/hubs/chat/:send?{V}&filter={filter}"),
                "text/plain",
                b"x",
            )
            .await;
        let e = r.error(400);
        assert!(
            e["message"]
                .as_str()
                .unwrap()
                .contains("nested more than 64 levels"),
            "{e}"
        );
    }
}
