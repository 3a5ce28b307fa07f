//! proptest strategies for the acknowledgement and control packets, and for any
//! packet (split from `arb.rs` to keep files short).

use proptest::option;
use proptest::prelude::*;
use statehub_mqtt_codec::*;

use crate::arb::{
    any_text, binary, codes, connack, connect, nonzero_u16, publish, subscribe, unsubscribe,
    user_props,
};

const PUBACK_CODES: &[u8] = &[0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99];
const PUBREL_CODES: &[u8] = &[0x00, 0x92];
const SUBACK_CODES: &[u8] = &[
    0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2,
];
const UNSUBACK_CODES: &[u8] = &[0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91];
const DISCONNECT_CODES: &[u8] = &[
    0x00, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8D, 0x8E, 0x8F, 0x90, 0x93, 0x94, 0x95,
    0x96, 0x97, 0x98, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9E, 0x9F, 0xA0, 0xA1, 0xA2,
];

fn pub_response(set: &'static [u8]) -> impl Strategy<Value = PubResponse> {
    (
        nonzero_u16(),
        codes(set, 1..2),
        option::of(any_text()),
        user_props(),
    )
        .prop_map(|(id, rc, rs, user)| PubResponse {
            packet_id: id,
            reason_code: rc[0],
            reason_string: rs,
            user_properties: user,
        })
}

/// Every other packet type, for `v`.
pub fn other(v: ProtocolVersion) -> BoxedStrategy<Packet> {
    if v == ProtocolVersion::V311 {
        let id = 1..=u16::MAX;
        return prop_oneof![
            id.clone().prop_map(|i| Packet::PubAck(PubResponse::ok(i))),
            id.clone().prop_map(|i| Packet::PubRec(PubResponse::ok(i))),
            id.clone().prop_map(|i| Packet::PubRel(PubResponse::ok(i))),
            id.clone().prop_map(|i| Packet::PubComp(PubResponse::ok(i))),
            (id.clone(), codes(&[0, 1, 2, 0x80], 0..5)).prop_map(|(i, c)| Packet::SubAck(SubAck {
                packet_id: i,
                reason_codes: c,
                ..Default::default()
            })),
            id.prop_map(|i| Packet::UnsubAck(UnsubAck {
                packet_id: i,
                ..Default::default()
            })),
            Just(Packet::PingReq),
            Just(Packet::PingResp),
            Just(Packet::Disconnect(Disconnect::default())),
        ]
        .boxed();
    }
    prop_oneof![
        pub_response(PUBACK_CODES).prop_map(Packet::PubAck),
        pub_response(PUBACK_CODES).prop_map(Packet::PubRec),
        pub_response(PUBREL_CODES).prop_map(Packet::PubRel),
        pub_response(PUBREL_CODES).prop_map(Packet::PubComp),
        (
            nonzero_u16(),
            codes(SUBACK_CODES, 0..5),
            option::of(any_text()),
            user_props()
        )
            .prop_map(|(i, c, rs, u)| {
                Packet::SubAck(SubAck {
                    packet_id: i,
                    reason_codes: c,
                    reason_string: rs,
                    user_properties: u,
                })
            }),
        (
            nonzero_u16(),
            codes(UNSUBACK_CODES, 0..5),
            option::of(any_text()),
            user_props()
        )
            .prop_map(|(i, c, rs, u)| {
                Packet::UnsubAck(UnsubAck {
                    packet_id: i,
                    reason_codes: c,
                    reason_string: rs,
                    user_properties: u,
                })
            }),
        Just(Packet::PingReq),
        Just(Packet::PingResp),
        (
            codes(DISCONNECT_CODES, 1..2),
            option::of(any::<u32>()),
            option::of(any_text()),
            user_props(),
            option::of(any_text())
        )
            .prop_map(|(rc, sei, rs, u, sr)| Packet::Disconnect(Disconnect {
                reason_code: rc[0],
                session_expiry_interval: sei,
                reason_string: rs,
                user_properties: u,
                server_reference: sr,
            })),
        (
            codes(&[0x00, 0x18, 0x19], 1..2),
            option::of(any_text()),
            option::of(binary()),
            option::of(any_text()),
            user_props()
        )
            .prop_map(|(rc, am, ad, rs, u)| Packet::Auth(Auth {
                reason_code: rc[0],
                authentication_method: am,
                authentication_data: ad,
                reason_string: rs,
                user_properties: u,
            })),
    ]
    .boxed()
}

/// Any packet valid for `v`.
pub fn packet(v: ProtocolVersion) -> BoxedStrategy<Packet> {
    prop_oneof![
        publish(v),
        subscribe(v),
        unsubscribe(v),
        connect(v),
        connack(v),
        other(v)
    ]
    .boxed()
}
