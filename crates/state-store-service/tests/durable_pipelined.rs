//! The state store over a data directory takes a client's requests as its connection
//! reads them: one whose write waits for the disk holds up none of the connection's
//! other packets, and the acknowledgements still come in the requests' order.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{now_ts, resp, start_durable};
use statehub_broker::codec::{ByteString, Packet, PubResponse, QoS};
use statehub_state_store_service::{Settings, REQUEST_TOPIC};
use statehub_storage::{Options, Store};
use statehub_test_support::{opts, publish, RawClient, V5};

/// A state store request from a raw client: packet id and Correlation Data `id`.
fn request(client: &str, id: u16, args: &[&[u8]], expiry: u32) -> Packet {
    let mut p = publish(REQUEST_TOPIC, QoS::AtLeastOnce, &resp(args));
    p.packet_id = Some(id);
    let props = &mut p.properties;
    props.response_topic = Some(ByteString::from(format!("clients/{client}/response")));
    props.correlation_data = Some(Bytes::copy_from_slice(&id.to_be_bytes()));
    props.message_expiry_interval = Some(expiry);
    props.user_properties = vec![
        ("__protVer".into(), "1.0".into()),
        ("__ts".into(), now_ts().into()),
    ];
    Packet::Publish(p)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waiting_for_the_disk_does_not_stop_its_connection_being_read() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), Options::default()).unwrap();
    let (_broker, addr) = start_durable(Settings::default(), &store).await;
    let mut c = RawClient::connect(addr, V5, "piper").await;
    c.subscribe("clients/piper/response", opts(QoS::AtLeastOnce))
        .await;

    // The disk fills as the SET is written: it waits for room (its deadline is far).
    store.set_disk_full(true);
    c.send(&request("piper", 1, &[b"SET", b"k", b"v"], 600))
        .await;
    tokio::time::timeout(Duration::from_secs(30), async {
        while store.stall_error().is_none() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("no stall reported");
    // The connection reads on: the PINGREQ is answered, and a later request is taken
    // (a write refused at once while the disk is full), but nothing is acknowledged
    // before the SET.
    c.send(&request("piper", 2, &[b"SET", b"other", b"w"], 600))
        .await;
    c.ping().await;
    let refused = c.expect_publish().await;
    assert_eq!(
        refused.properties.correlation_data.as_deref(),
        Some(&[0u8, 2][..])
    );
    c.send(&Packet::PubAck(PubResponse::ok(refused.packet_id.unwrap())))
        .await;
    c.expect_nothing(Duration::from_millis(300)).await;

    store.set_disk_full(false);
    let mut acked = Vec::new();
    while acked.len() < 2 {
        match c.expect_within(Duration::from_secs(30)).await {
            Packet::PubAck(a) => acked.push(a.packet_id),
            Packet::Publish(p) => {
                assert_eq!(p.payload, Bytes::from_static(b"+OK\r\n"));
                c.send(&Packet::PubAck(PubResponse::ok(p.packet_id.unwrap())))
                    .await;
            }
            other => panic!("expected PUBACKs and the SET's answer, got {other:?}"),
        }
    }
    assert_eq!(acked, [1, 2], "PUBACKs in the order of the requests");
}
