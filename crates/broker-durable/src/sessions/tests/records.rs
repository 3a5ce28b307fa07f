//! The record encodings: every field back as it was, time spent down counted against
//! a message's expiry, the first format still read, damage refused.

use bytes::{BufMut, BytesMut};

use super::*;
use crate::sessions::records::*;
use crate::stored::{put_message, put_str, wall_ms};

#[test]
fn message_records_round_trip_with_every_per_subscriber_field() {
    let d = delivery("a/b", b"\x00payload", None);
    let record = encode_message(d.as_ref(), true, 42);
    let back = decode_message(&record, wall_ms(), Instant::now()).unwrap();
    assert!(back.fields.released);
    assert_eq!(
        (
            back.fields.qos,
            back.fields.retain,
            &back.fields.subscription_ids
        ),
        (QoS::AtLeastOnce, true, &vec![7, 9])
    );
    assert_eq!(back.fields.shared, d.shared);
    assert!(matches!(back.body, Body::Ref(42)));
}

#[test]
fn bodies_round_trip_and_time_spent_down_counts_against_their_expiry() {
    let d = delivery("a/b", b"\x00payload", Some(10));
    let record = encode_body(&d.msg, Instant::now());
    let now = wall_ms();
    let back = decode_body(&record, now, Instant::now()).unwrap().unwrap();
    assert_eq!(
        (&back.topic, &back.payload, back.qos),
        (&d.msg.topic, &d.msg.payload, d.msg.qos)
    );
    let later = decode_body(&record, now + 3_500, Instant::now())
        .unwrap()
        .unwrap();
    assert_eq!(
        later.properties.message_expiry_interval,
        Some(7),
        "10 s - 3.5 s, rounded up"
    );
    assert!(
        decode_body(&record, now + 11_000, Instant::now())
            .unwrap()
            .is_none(),
        "expired while down"
    );
}

/// A message record of the first format, which held its message itself.
fn first_format(d: &Queued, written_ms: u64) -> Vec<u8> {
    let mut v = BytesMut::new();
    v.put_u8(FORMAT);
    v.put_u64(written_ms);
    v.put_u8(d.qos as u8);
    v.put_u8(u8::from(d.retain));
    v.put_u8(0);
    v.put_u16(d.subscription_ids.len() as u16);
    for id in &d.subscription_ids {
        v.put_u32(*id);
    }
    v.put_u8(1);
    let via = d.shared.as_ref().unwrap();
    put_str(&mut v, &via.filter);
    put_str(&mut v, &via.group);
    put_message(&mut v, &d.msg, Instant::now());
    v.to_vec()
}

#[test]
fn message_records_of_the_first_format_are_still_read() {
    let d = delivery("a/b", b"inline", Some(10));
    let now = wall_ms();
    let back = decode_message(&first_format(&d, now), now + 3_500, Instant::now()).unwrap();
    assert_eq!(back.fields.subscription_ids, d.subscription_ids);
    assert_eq!(back.fields.shared, d.shared);
    let Body::Inline(Some(msg)) = back.body else {
        panic!("the message is in the record: {:?}", back.body);
    };
    assert_eq!(msg.payload, d.msg.payload);
    assert_eq!(msg.properties.message_expiry_interval, Some(7));
    let expired = decode_message(&first_format(&d, now), now + 11_000, Instant::now()).unwrap();
    assert!(matches!(expired.body, Body::Inline(None)));
}

#[test]
fn damaged_records_are_errors() {
    let now = Instant::now();
    let record = encode_message(delivery("a", b"x", None).as_ref(), false, 1);
    assert!(decode_message(&record[..record.len() - 1], 0, now).is_err());
    let mut longer = record.clone();
    longer.push(0);
    assert!(decode_message(&longer, 0, now).is_err());
    assert!(decode_message(&[3; 20], 0, now).is_err());
    assert!(decode_message(&[], 0, now).is_err());
    let body = encode_body(&delivery("a", b"x", None).msg, now);
    assert!(decode_body(&body[..body.len() - 1], 0, now).is_err());
    assert!(decode_body(&[], 0, now).is_err());
    assert!(decode_session(&[FORMAT, 0, 0], 1, 0).is_err());
    assert!(decode_session(&[9; 30], 1, 0).is_err());
}

/// The bytes on disk, field by field: a data directory written by an earlier build must
/// keep loading, so neither layout may change by accident.
#[test]
fn records_keep_their_exact_bytes() {
    let d = delivery("a/b", b"p", None);
    let mut message = vec![FORMAT_REF, 1, 1, 1, 0, 2, 0, 0, 0, 7, 0, 0, 0, 9, 1];
    message.extend_from_slice(b"\0\x03a/#\0\x01g");
    message.extend_from_slice(&42u64.to_be_bytes());
    assert_eq!(encode_message(d.as_ref(), true, 42), message);

    let filter = statehub_broker::codec::ByteString::from("x/y");
    let sub = Subscription {
        options: SubscriptionOptions {
            qos: QoS::AtLeastOnce,
            no_local: true,
            retain_as_published: false,
            retain_handling: 2,
        },
        identifier: Some(5),
    };
    let session = encode_session("c", 60, true, &[(&filter, sub)]);
    assert_eq!(session[0], FORMAT);
    let mut rest = vec![1, 0, 0, 0, 60, 0, 1, b'c', 0, 0, 0, 1];
    rest.extend_from_slice(b"\0\x03x/y\x25\0\0\0\x05");
    assert_eq!(session[9..], rest[..], "after the write time");
}
