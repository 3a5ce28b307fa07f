//! Model-based test: random command sequences against the machine and a `BTreeMap`
//! reference, with a hand-driven clock. Checks replies byte for byte, versions (strictly
//! increasing, returned consistently by GET and refused writes), expiry and notifications.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use common::{client_ts, notifies, request, resp, T0};
use proptest::prelude::*;
use statehub_state_store::{Config, Effect, Engine, Hlc, Machine, MemoryEngine};

#[derive(Debug, Clone)]
enum Op {
    Set {
        key: u8,
        value: u8,
        cond: u8,
        px: Option<u64>,
    },
    Get {
        key: u8,
    },
    Del {
        key: u8,
    },
    VDel {
        key: u8,
        value: u8,
    },
    KeyNotify {
        client: u8,
        key: u8,
        stop: bool,
    },
    Advance(u64),
    Expire,
    Disconnect {
        client: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..3u8, 0..3u8, 0..3u8, prop::option::of(1..3_000u64))
            .prop_map(|(key, value, cond, px)| Op::Set { key, value, cond, px }),
        2 => (0..3u8).prop_map(|key| Op::Get { key }),
        1 => (0..3u8).prop_map(|key| Op::Del { key }),
        1 => (0..3u8, 0..3u8).prop_map(|(key, value)| Op::VDel { key, value }),
        2 => (0..2u8, 0..3u8, any::<bool>()).prop_map(|(client, key, stop)| Op::KeyNotify { client, key, stop }),
        2 => (0..2_000u64).prop_map(Op::Advance),
        1 => Just(Op::Expire),
        1 => (0..2u8).prop_map(|client| Op::Disconnect { client }),
    ]
}

struct Stored {
    value: Vec<u8>,
    expires: Option<u64>,
    version: Hlc,
}

#[derive(Default)]
struct Model {
    keys: BTreeMap<Vec<u8>, Stored>,
    observers: BTreeSet<(Vec<u8>, String)>,
}

type Note = (String, Vec<u8>, Vec<u8>);

impl Model {
    fn observers_of(&self, key: &[u8]) -> Vec<String> {
        self.observers
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, c)| c.clone())
            .collect()
    }

    /// Removes due keys, in (expiry, key) order, returning the notifications due.
    fn expire(&mut self, now: u64) -> Vec<Note> {
        let mut due: Vec<(u64, Vec<u8>)> = self
            .keys
            .iter()
            .filter_map(|(k, s)| s.expires.filter(|at| *at <= now).map(|at| (at, k.clone())))
            .collect();
        due.sort();
        let mut notes = Vec::new();
        for (_, key) in due {
            self.keys.remove(&key);
            notes.extend(self.notes(&key, DELETE));
        }
        notes
    }

    fn notes(&self, key: &[u8], payload: &[u8]) -> Vec<Note> {
        self.observers_of(key)
            .into_iter()
            .map(|c| (c, key.to_vec(), payload.to_vec()))
            .collect()
    }
}

const DELETE: &[u8] = b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n";

fn set_note(value: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n${}\r\n",
        value.len()
    )
    .into_bytes();
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
    out
}

fn bulk(value: &[u8]) -> Vec<u8> {
    let mut out = format!("${}\r\n", value.len()).into_bytes();
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
    out
}

struct Run {
    machine: Machine<MemoryEngine>,
    model: Model,
    now: u64,
    last_version: Option<Hlc>,
}

impl Run {
    /// Asserts `version` is newer than every version issued before and records it.
    fn issued(&mut self, version: &Hlc) {
        if let Some(last) = &self.last_version {
            assert!(version > last, "{version} not after {last}");
        }
        self.last_version = Some(version.clone());
    }

    /// Checks the notify effects against `expected`; each event's notifications share
    /// one version, which must be newly issued.
    fn check_notes(&mut self, effects: &[Effect], expected: &[Note]) {
        let got: Vec<Note> = notifies(effects)
            .into_iter()
            .map(|(c, k, p, _)| (c, k, p))
            .collect();
        assert_eq!(got, expected);
    }

    fn step(&mut self, op: &Op) {
        let (args, client): (Vec<Vec<u8>>, String) = match op {
            Op::Advance(ms) => {
                self.now += ms;
                return;
            }
            Op::Expire => {
                let effects = self.machine.expire(self.now).expect("memory");
                let expected = self.model.expire(self.now);
                self.check_expiry_versions(&effects);
                self.check_notes(&effects, &expected);
                return;
            }
            Op::Disconnect { client } => {
                let client = format!("c{client}");
                self.machine
                    .client_disconnected(&client)
                    .expect("memory engine");
                self.model.observers.retain(|(_, c)| *c != client);
                return;
            }
            Op::Set {
                key,
                value,
                cond,
                px,
            } => {
                let mut args = vec![
                    b"SET".to_vec(),
                    format!("k{key}").into_bytes(),
                    format!("v{value}").into_bytes(),
                ];
                match cond {
                    1 => args.push(b"NX".to_vec()),
                    2 => args.push(b"NEX".to_vec()),
                    _ => {}
                }
                if let Some(px) = px {
                    args.push(b"PX".to_vec());
                    args.push(px.to_string().into_bytes());
                }
                (args, "w".to_owned())
            }
            Op::Get { key } => (
                vec![b"GET".to_vec(), format!("k{key}").into_bytes()],
                "w".to_owned(),
            ),
            Op::Del { key } => (
                vec![b"DEL".to_vec(), format!("k{key}").into_bytes()],
                "w".to_owned(),
            ),
            Op::VDel { key, value } => (
                vec![
                    b"VDEL".to_vec(),
                    format!("k{key}").into_bytes(),
                    format!("v{value}").into_bytes(),
                ],
                "w".to_owned(),
            ),
            Op::KeyNotify { client, key, stop } => {
                let mut args = vec![b"KEYNOTIFY".to_vec(), format!("k{key}").into_bytes()];
                if *stop {
                    args.push(b"STOP".to_vec());
                }
                (args, format!("c{client}"))
            }
        };
        let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        let ts = client_ts(self.now);
        let outcome = self
            .machine
            .handle(request(&client, &resp(&refs), Some(&ts), None), self.now)
            .expect("memory");
        let mut expected_notes = self.model.expire(self.now);
        let expiry_effects: Vec<Effect> = outcome
            .effects
            .iter()
            .take(expected_notes.len())
            .cloned()
            .collect();
        self.check_expiry_versions(&expiry_effects);

        let key = args[1].clone();
        let current = self.model.keys.get(&key);
        let (payload, version): (Vec<u8>, Option<Hlc>) = match op {
            Op::Set { cond, px, .. } => {
                let value = args[2].clone();
                let blocked =
                    current.is_some_and(|s| *cond == 1 || (*cond == 2 && s.value != value));
                if blocked {
                    (b":-1\r\n".to_vec(), current.map(|s| s.version.clone()))
                } else {
                    let version = outcome.reply.version.clone().expect("SET +OK carries __ts");
                    self.issued(&version);
                    assert!(version > ts.parse().expect("client ts"));
                    let expires = px.map(|px| self.now + px);
                    if let Some(at) = expires {
                        assert!(outcome.effects.contains(&Effect::ArmExpiry {
                            key: Bytes::from(key.clone()),
                            at_ms: at
                        }));
                    }
                    expected_notes.extend(self.model.notes(&key, &set_note(&value)));
                    self.model.keys.insert(
                        key.clone(),
                        Stored {
                            value,
                            expires,
                            version: version.clone(),
                        },
                    );
                    (b"+OK\r\n".to_vec(), Some(version))
                }
            }
            Op::Get { .. } => match current {
                Some(s) => (bulk(&s.value), Some(s.version.clone())),
                None => (b"$-1\r\n".to_vec(), None),
            },
            Op::Del { .. } | Op::VDel { .. } => match current {
                None => (b":0\r\n".to_vec(), None),
                Some(s) if matches!(op, Op::VDel { .. }) && s.value != args[2] => {
                    (b":-1\r\n".to_vec(), Some(s.version.clone()))
                }
                Some(_) => {
                    let version = outcome.reply.version.clone().expect("DEL :1 carries __ts");
                    self.issued(&version);
                    self.model.keys.remove(&key);
                    expected_notes.extend(self.model.notes(&key, DELETE));
                    (b":1\r\n".to_vec(), Some(version))
                }
            },
            Op::KeyNotify { stop, .. } => {
                let entry = (key.clone(), client.clone());
                if *stop {
                    let was = self.model.observers.remove(&entry);
                    (
                        if was {
                            b"+OK\r\n".to_vec()
                        } else {
                            b":0\r\n".to_vec()
                        },
                        None,
                    )
                } else {
                    self.model.observers.insert(entry);
                    (b"+OK\r\n".to_vec(), None)
                }
            }
            Op::Advance(_) | Op::Expire | Op::Disconnect { .. } => unreachable!("handled above"),
        };
        assert_eq!(outcome.reply.payload.to_vec(), payload, "{op:?}");
        assert_eq!(outcome.reply.version, version, "{op:?}");
        self.check_notes(&outcome.effects, &expected_notes);
        for effect in &outcome.effects {
            if let Effect::Notify(n) = effect {
                if n.payload.starts_with(b"*4") {
                    assert_eq!(Some(&n.version), outcome.reply.version.as_ref());
                }
            }
        }
    }

    /// Expiry deletions: one new version per deleted key, notified to its observers.
    fn check_expiry_versions(&mut self, effects: &[Effect]) {
        let mut seen: Option<Hlc> = None;
        for effect in effects {
            if let Effect::Notify(n) = effect {
                if seen.as_ref() != Some(&n.version) {
                    self.issued(&n.version);
                    seen = Some(n.version.clone());
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn machine_matches_model(ops in prop::collection::vec(op(), 1..80)) {
        let mut run = Run {
            machine: Machine::in_memory(Config::default()),
            model: Model::default(),
            now: T0,
            last_version: None,
        };
        for op in &ops {
            run.step(op);
        }
        // Final state: every model key readable with its version, nothing else.
        let far = run.now + 10_000;
        run.machine.expire(far).expect("memory");
        run.model.expire(far);
        prop_assert_eq!(run.machine.engine().stats().keys, run.model.keys.len() as u64);
        prop_assert_eq!(run.machine.next_expiry().expect("memory"), None);
    }
}
