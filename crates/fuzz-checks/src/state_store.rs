//! The state store: its RESP request parser, and whole requests through
//! [`Machine::handle`] with a clock the input drives.

use std::collections::HashSet;

use bytes::Bytes;
use statehub_state_store::hlc::Stamp;
use statehub_state_store::resp::{encode_array, parse_request};
use statehub_state_store::{Command, Config, Effect, Hlc, Machine, Request};

use crate::input::Input;

/// 2023-10-03T23:07:05Z, the protocol page's example time: the clock starts here.
const T0: u64 = 1_696_374_425_000;

/// The RESP request parser: no panic; what parses, re-encoded in canonical form,
/// parses to the same arguments; [`Command::parse`] takes any payload.
pub fn resp(data: &[u8]) {
    if let Ok(args) = parse_request(data) {
        let canonical = encode_array(&args);
        let again = parse_request(&canonical).expect("a canonical request parses");
        assert_eq!(again, args, "canonical form parses differently");
    }
    let _ = Command::parse(&Bytes::copy_from_slice(data));
}

/// A sequence of requests through one [`Machine`] (small quotas, so they are hit).
///
/// Each request is: a flags byte (client, which `__ts` and `__ft`, how far the clock
/// moves first), the property strings it asks for, then the payload as a length-prefixed
/// chunk (see [`Input::chunk`]). Asserted besides "no panic": every reply is one of the
/// response forms and ends in CRLF; a reply carries `__ts` exactly when the protocol
/// says (SET `+OK`/`:-1`, a GET hit, DEL/VDEL `:1`/`:-1`); versions of writes are new,
/// strictly increasing and above the request's `__ts`; versions of reads are ones
/// already issued.
pub fn state_store(data: &[u8]) {
    let config = Config {
        max_keys: 6,
        max_bytes: 2_048,
        max_key_bytes: 64,
        max_value_bytes: 512,
        max_observations_per_client: 3,
        max_observations: 5,
        scan_count: 3,
        ..Config::default()
    };
    let mut machine = Machine::in_memory(config);
    let mut input = Input::new(data);
    let mut now = T0;
    let mut issued: HashSet<Hlc> = HashSet::new();
    let mut latest: Option<Hlc> = None;
    while !input.is_empty() {
        let flags = input.byte();
        now += u64::from(flags >> 5) * 400;
        let client = ["a", "b", "c", "d"][usize::from(flags & 0b11)];
        let ts = property(&mut input, (flags >> 2) & 0b11, now);
        let ft = match flags & 0b1_0000 {
            0 => None,
            _ => {
                let choice = input.byte() & 0b11;
                property(&mut input, choice, now)
            }
        };
        let payload = Bytes::copy_from_slice(input.chunk());
        let command = Command::parse(&payload).ok();
        let outcome = machine
            .handle(
                Request {
                    client_id: client,
                    payload,
                    timestamp: ts.as_deref(),
                    fencing_token: ft.as_deref(),
                    access: None,
                },
                now,
            )
            .expect("the memory engine never fails");
        let reply = &outcome.reply;
        check_form(&reply.payload);
        let kind = reply_kind(command.as_ref(), &reply.payload);
        assert_eq!(
            reply.version.is_some(),
            kind != Kind::Plain,
            "__ts on {:?}",
            reply.payload
        );
        for effect in &outcome.effects {
            if let Effect::Notify(n) = effect {
                issued.insert(n.version.clone());
            }
        }
        match (&reply.version, kind) {
            (Some(v), Kind::Write) => {
                assert!(latest.as_ref().is_none_or(|l| v > l), "version {v} not new");
                if let Some(ts) = ts.as_deref().and_then(|t| t.parse::<Stamp>().ok()) {
                    assert!(Stamp::from(v) > ts, "version {v} not above __ts {ts:?}");
                }
                issued.insert(v.clone());
                latest = Some(v.clone());
            }
            (Some(v), Kind::Read) => assert!(issued.contains(v), "version {v} never issued"),
            _ => {}
        }
        for effect in machine.expire(now).expect("the memory engine never fails") {
            if let Effect::Notify(n) = effect {
                assert!(latest.as_ref().is_none_or(|l| n.version > *l));
                latest = Some(n.version.clone());
                issued.insert(n.version);
            }
        }
    }
}

/// A `__ts` or `__ft`: none, the client clock at `now`, a token from a small set, or
/// bytes from the input.
fn property(input: &mut Input<'_>, choice: u8, now: u64) -> Option<String> {
    match choice {
        0 => None,
        1 => Some(format!("{now:015}:00000:client")),
        2 => Some(format!("{T0:015}:{:05}:ft", input.byte() % 4)),
        _ => Some(String::from_utf8_lossy(input.chunk()).into_owned()),
    }
}

/// `+OK`, an integer, a bulk string, `$-1`, an error or a SCAN array; one CRLF at the end.
fn check_form(payload: &[u8]) {
    let ok = payload.ends_with(b"\r\n")
        && [&b"+OK\r\n"[..], b":", b"$", b"-ERR ", b"*"]
            .iter()
            .any(|p| payload.starts_with(p));
    assert!(ok, "malformed reply {payload:?}");
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// No `__ts`.
    Plain,
    /// A new version.
    Write,
    /// An existing key's version.
    Read,
}

fn reply_kind(command: Option<&Command>, payload: &[u8]) -> Kind {
    let ok = payload == b"+OK\r\n";
    let refused = payload == b":-1\r\n";
    match command {
        _ if payload.starts_with(b"-ERR ") => Kind::Plain,
        Some(Command::Set { .. }) if ok => Kind::Write,
        Some(Command::Set { .. } | Command::VDel { .. }) if refused => Kind::Read,
        Some(Command::Get { .. }) if payload.starts_with(b"$") && payload != b"$-1\r\n" => {
            Kind::Read
        }
        Some(Command::Del { .. } | Command::VDel { .. }) if payload == b":1\r\n" => Kind::Write,
        _ => Kind::Plain,
    }
}
