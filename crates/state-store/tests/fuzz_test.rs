//! Arbitrary request bytes and properties never panic, and always get a well-formed reply.

mod common;

use bytes::Bytes;
use common::{request, resp, T0};
use proptest::prelude::*;
use statehub_state_store::{Config, Machine, Request};

fn well_formed(payload: &[u8]) -> bool {
    payload.ends_with(b"\r\n")
        && [&b"+OK"[..], b":", b"$", b"-ERR ", b"*"]
            .iter()
            .any(|p| payload.starts_with(p))
}

fn verb() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(b"SET".to_vec()),
        Just(b"GET".to_vec()),
        Just(b"DEL".to_vec()),
        Just(b"VDEL".to_vec()),
        Just(b"KEYNOTIFY".to_vec()),
        Just(b"SCAN".to_vec()),
        Just(b"NX".to_vec()),
        Just(b"PX".to_vec()),
        prop::collection::vec(any::<u8>(), 0..6),
    ]
}

fn property() -> impl Strategy<Value = Option<String>> {
    prop::option::of(prop_oneof![
        Just(format!("{T0:015}:00000:c")),
        Just(format!("{:015}:00000:c", T0 + 120_000)),
        "[0-9:a-z]{0,24}",
    ])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    #[test]
    fn raw_bytes_never_panic(payload in prop::collection::vec(any::<u8>(), 0..64),
                             ts in property(), ft in property()) {
        let mut machine = Machine::in_memory(Config::default());
        let outcome = machine.handle(Request {
            client_id: "c",
            payload: Bytes::from(payload),
            timestamp: ts.as_deref(),
            fencing_token: ft.as_deref(),
            access: None,
        }, T0).expect("memory");
        prop_assert!(well_formed(&outcome.reply.payload));
    }

    #[test]
    fn structured_requests_never_panic(
        requests in prop::collection::vec(
            (verb(), prop::collection::vec(prop::collection::vec(any::<u8>(), 0..5), 0..6), property(), property(), 0..5_000u64),
            1..20,
        )
    ) {
        let mut machine = Machine::in_memory(Config { scan_count: 2, max_keys: 5, ..Config::default() });
        let mut now = T0;
        for (verb, args, ts, ft, advance) in requests {
            now += advance;
            let mut all: Vec<&[u8]> = vec![&verb];
            all.extend(args.iter().map(Vec::as_slice));
            let outcome = machine
                .handle(request("c", &resp(&all), ts.as_deref(), ft.as_deref()), now)
                .expect("memory");
            prop_assert!(well_formed(&outcome.reply.payload));
            machine.expire(now).expect("memory");
        }
    }
}
