//! proptest strategies producing packets that are valid for a given version and
//! already in the normalised form decoding produces (no property set explicitly to
//! its spec default, see `convert` in the crate).

use bytes::Bytes;
use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use statehub_mqtt_codec::*;

fn text(re: &'static str) -> impl Strategy<Value = ByteString> {
    re.prop_map(ByteString::from)
}

pub fn any_text() -> impl Strategy<Value = ByteString> {
    text("[a-zA-Z0-9 /+#$é∑]{0,12}")
}

fn topic() -> impl Strategy<Value = ByteString> {
    text("[a-z0-9/$é]{1,16}")
}

fn filter() -> impl Strategy<Value = ByteString> {
    text("[a-z0-9/+#]{1,16}")
}

pub fn binary() -> impl Strategy<Value = Bytes> {
    vec(any::<u8>(), 0..16).prop_map(Bytes::from)
}

pub fn user_props() -> impl Strategy<Value = UserProperties> {
    vec((any_text(), any_text()), 0..4)
}

fn qos() -> impl Strategy<Value = QoS> {
    prop_oneof![
        Just(QoS::AtMostOnce),
        Just(QoS::AtLeastOnce),
        Just(QoS::ExactlyOnce)
    ]
}

pub fn nonzero_u16() -> impl Strategy<Value = u16> {
    1..=u16::MAX
}

fn nonzero_u32() -> impl Strategy<Value = u32> {
    1..=u32::MAX
}

fn sub_id() -> impl Strategy<Value = u32> {
    1..=268_435_455u32
}

pub fn codes(
    set: &'static [u8],
    n: std::ops::Range<usize>,
) -> impl Strategy<Value = Vec<ReasonCode>> {
    vec(proptest::sample::select(set).prop_map(ReasonCode), n)
}

pub fn publish(v: ProtocolVersion) -> impl Strategy<Value = Packet> {
    let v5 = v == ProtocolVersion::V5;
    let props = (
        any::<bool>(),
        option::of(any::<u32>()),
        option::of(nonzero_u16()),
        option::of(topic()),
        option::of(binary()),
        user_props(),
        vec(sub_id(), 0..3),
        option::of(any_text()),
    )
        .prop_map(
            |(utf8, expiry, alias, resp, corr, user, subs, ct)| PublishProperties {
                payload_format_utf8: utf8,
                message_expiry_interval: expiry,
                topic_alias: alias,
                response_topic: resp,
                correlation_data: corr,
                user_properties: user,
                subscription_identifiers: subs,
                content_type: ct,
            },
        );
    (
        qos(),
        any::<bool>(),
        any::<bool>(),
        topic(),
        nonzero_u16(),
        vec(any::<u8>(), 0..64),
        props,
        any::<bool>(),
    )
        .prop_map(
            move |(qos, dup, retain, topic, id, payload, props, alias_only)| {
                let properties = if v5 {
                    props
                } else {
                    PublishProperties::default()
                };
                let topic = if alias_only && properties.topic_alias.is_some() {
                    ByteString::new()
                } else {
                    topic
                };
                let packet_id = (qos != QoS::AtMostOnce).then_some(id);
                let dup = dup && packet_id.is_some();
                Packet::Publish(Publish {
                    dup,
                    qos,
                    retain,
                    topic,
                    packet_id,
                    payload: payload.into(),
                    properties,
                })
            },
        )
}

pub fn subscribe(v: ProtocolVersion) -> impl Strategy<Value = Packet> {
    let v5 = v == ProtocolVersion::V5;
    let opts =
        (qos(), any::<bool>(), any::<bool>(), 0u8..=2).prop_map(move |(qos, nl, rap, rh)| {
            if v5 {
                SubscriptionOptions {
                    qos,
                    no_local: nl,
                    retain_as_published: rap,
                    retain_handling: rh,
                }
            } else {
                SubscriptionOptions {
                    qos,
                    ..Default::default()
                }
            }
        });
    (
        nonzero_u16(),
        option::of(sub_id()),
        user_props(),
        vec((filter(), opts), 1..5),
    )
        .prop_map(move |(packet_id, id, user, filters)| {
            Packet::Subscribe(Subscribe {
                packet_id,
                subscription_identifier: id.filter(|_| v5),
                user_properties: if v5 { user } else { Vec::new() },
                filters,
            })
        })
}

pub fn unsubscribe(v: ProtocolVersion) -> impl Strategy<Value = Packet> {
    let v5 = v == ProtocolVersion::V5;
    (nonzero_u16(), user_props(), vec(filter(), 1..5)).prop_map(
        move |(packet_id, user, filters)| {
            Packet::Unsubscribe(Unsubscribe {
                packet_id,
                user_properties: if v5 { user } else { Vec::new() },
                filters,
            })
        },
    )
}

fn will(v5: bool) -> impl Strategy<Value = LastWill> {
    let props = (
        option::of(any::<u32>()),
        any::<bool>(),
        option::of(nonzero_u32()),
        option::of(any_text()),
        option::of(topic()),
        option::of(binary()),
        user_props(),
    )
        .prop_map(
            |(delay, utf8, expiry, ct, resp, corr, user)| WillProperties {
                will_delay_interval: delay,
                payload_format_utf8: utf8,
                message_expiry_interval: expiry,
                content_type: ct,
                response_topic: resp,
                correlation_data: corr,
                user_properties: user,
            },
        );
    (qos(), any::<bool>(), topic(), binary(), props).prop_map(
        move |(qos, retain, topic, payload, props)| LastWill {
            qos,
            retain,
            topic,
            payload,
            properties: if v5 { props } else { WillProperties::default() },
        },
    )
}

pub fn connect(v: ProtocolVersion) -> impl Strategy<Value = Packet> {
    let v5 = v == ProtocolVersion::V5;
    let props = (
        option::of(nonzero_u32()),
        option::of(nonzero_u16()),
        option::of(nonzero_u32()),
        option::of(nonzero_u16()),
        option::of(Just(true)),
        option::of(Just(false)),
        user_props(),
        option::of(any_text()),
        option::of(binary()),
    )
        .prop_map(
            |(sei, rm, mps, tam, rri, rpi, user, am, ad)| ConnectProperties {
                session_expiry_interval: sei,
                receive_maximum: rm,
                maximum_packet_size: mps,
                topic_alias_maximum: tam,
                request_response_information: rri,
                request_problem_information: rpi,
                user_properties: user,
                // Authentication Data without a method is a Protocol Error
                // [MQTT-3.1.2.11.10].
                authentication_data: ad.filter(|_| am.is_some()),
                authentication_method: am,
            },
        );
    let ids = (
        any::<bool>(),
        any::<u16>(),
        text("[a-zA-Z0-9]{0,23}"),
        option::of(any_text()),
        option::of(binary()),
    );
    (ids, option::of(will(v5)), props).prop_map(
        move |((clean, ka, id, user, pass), will, props)| {
            let client_id = if !v5 && !clean && id.is_empty() {
                ByteString::from("c")
            } else {
                id
            };
            let password = if v5 || user.is_some() { pass } else { None };
            Packet::Connect(Box::new(Connect {
                protocol: v,
                clean_start: clean,
                keep_alive: ka,
                client_id,
                username: user,
                password,
                will,
                properties: if v5 {
                    props
                } else {
                    ConnectProperties::default()
                },
            }))
        },
    )
}

const CONNACK_V5: &[u8] = &[
    0x00, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8A, 0x8C, 0x90, 0x95, 0x97,
    0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9F,
];
const CONNACK_V311: &[u8] = &[0x00, 0x84, 0x85, 0x88, 0x86, 0x87];

pub fn connack(v: ProtocolVersion) -> impl Strategy<Value = Packet> {
    let v5 = v == ProtocolVersion::V5;
    let props = (
        (
            option::of(any::<u32>()),
            option::of(1..u16::MAX),
            option::of(prop_oneof![Just(QoS::AtMostOnce), Just(QoS::AtLeastOnce)]),
            option::of(Just(false)),
        ),
        (
            option::of(any::<u32>()),
            option::of(any_text()),
            option::of(nonzero_u16()),
            option::of(any_text()),
        ),
        (
            user_props(),
            option::of(Just(false)),
            option::of(Just(false)),
            option::of(Just(false)),
        ),
        (
            option::of(any::<u16>()),
            option::of(any_text()),
            option::of(any_text()),
            option::of(any_text()),
        ),
        option::of(binary()),
    )
        .prop_map(
            |((sei, rm, mq, ra), (mps, aci, tam, rs), (user, w, si, ss), (ka, ri, sr, am), ad)| {
                ConnAckProperties {
                    session_expiry_interval: sei,
                    receive_maximum: rm,
                    maximum_qos: mq,
                    retain_available: ra,
                    maximum_packet_size: mps,
                    assigned_client_identifier: aci,
                    topic_alias_maximum: tam,
                    reason_string: rs,
                    user_properties: user,
                    wildcard_subscription_available: w,
                    subscription_identifiers_available: si,
                    shared_subscription_available: ss,
                    server_keep_alive: ka,
                    response_information: ri,
                    server_reference: sr,
                    authentication_method: am,
                    authentication_data: ad,
                }
            },
        );
    let code_set = if v5 { CONNACK_V5 } else { CONNACK_V311 };
    (any::<bool>(), codes(code_set, 1..2), props).prop_map(move |(sp, rc, props)| {
        Packet::ConnAck(ConnAck {
            session_present: sp,
            reason_code: rc[0],
            properties: if v5 {
                props
            } else {
                ConnAckProperties::default()
            },
        })
    })
}
