//! State store requests from a raw MQTT 5 client (`statehub_test_support::RawClient`),
//! for tests that pipeline them and look at each packet that comes back.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use statehub_broker::codec::{ByteString, Packet, PubResponse, QoS};
use statehub_redis_common::test_server::RedisServer;
use statehub_test_support::{publish, resp, RawClient};

use super::{now_ts, PATIENCE, REQUEST_TOPIC};

/// A state store request as the SDKs send it: QoS 1, packet id and Correlation Data
/// `id`, answered on `clients/{client}/response`.
pub fn request(client: &str, id: u16, args: &[&[u8]]) -> Packet {
    let mut p = publish(REQUEST_TOPIC, QoS::AtLeastOnce, &resp(args));
    p.packet_id = Some(id);
    let props = &mut p.properties;
    props.response_topic = Some(ByteString::from(format!("clients/{client}/response")));
    props.correlation_data = Some(Bytes::copy_from_slice(&id.to_be_bytes()));
    props.message_expiry_interval = Some(60);
    props.user_properties = vec![
        ("__protVer".into(), "1.0".into()),
        ("__ts".into(), now_ts().into()),
    ];
    Packet::Publish(p)
}

/// Reads until `count` PUBACKs and `count` answers came (each answer acknowledged):
/// the PUBACKs' packet ids in the order they came, and each answer's payload by its
/// Correlation Data.
pub async fn acks_and_answers(
    c: &mut RawClient,
    count: usize,
) -> (Vec<u16>, BTreeMap<u16, Vec<u8>>) {
    let mut acked = Vec::new();
    let mut answers = BTreeMap::new();
    while acked.len() < count || answers.len() < count {
        match c.expect_within(PATIENCE).await {
            Packet::PubAck(a) => acked.push(a.packet_id),
            Packet::Publish(p) => {
                let id = p.properties.correlation_data.as_deref().unwrap();
                let id = u16::from_be_bytes(id.try_into().unwrap());
                answers.insert(id, p.payload.to_vec());
                c.send(&Packet::PubAck(PubResponse::ok(p.packet_id.unwrap())))
                    .await;
            }
            other => panic!("expected PUBACKs and answers, got {other:?}"),
        }
    }
    (acked, answers)
}

/// Waits until at least `count` state store connections of `redis` (named
/// `statehub-store:<node>...`) are held by `CLIENT PAUSE` on a script call at once
/// (state store requests reached Redis and wait there).
pub async fn script_calls_paused(redis: &RedisServer, count: usize) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let list = redis.command(&["CLIENT", "LIST"]);
        let paused = list
            .lines()
            .filter(|l| {
                let flag = l.split(' ').find_map(|f| f.strip_prefix("flags="));
                l.contains(" name=statehub-store:")
                    && l.contains(" cmd=evalsha ")
                    && flag.is_some_and(|f| f.contains('b'))
            })
            .count();
        if paused >= count {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "fewer than {count} state store requests reached the paused Redis at once:\n{list}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
