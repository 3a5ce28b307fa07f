//! The state store as a sequential specification of one key, for [`super::wgl`].
//!
//! Keys are independent in the store except for the version clock, which is shared:
//! every write of any key gets a version above every version issued before it. So a
//! history is checked per key (P-compositionality: a history is linearizable iff each
//! key's sub-history is) against this model, which checks values, conditions, fencing
//! and that each key's versions grow along its linearization, and
//! [`check_versions`] checks the cross-key part: a write's version is above every
//! version any operation saw before the write was invoked, and no version is issued
//! twice.
//!
//! An operation with an open result (in flight when the server was killed) may or may
//! not have happened: the state is the set of states the key may be in (a
//! nondeterministic model made deterministic, as Porcupine does). A write that may
//! have happened has a version nobody saw; the first operation to see it binds it.

use std::collections::{BTreeSet, HashSet};

use super::wgl::{Model, Operation};

/// A version (`__ts`): wall clock ms and counter; the node id is the server's constant.
pub type Version = (u64, u64);

/// A fencing token, by rank: higher is a later HLC.
pub type Token = u8;

/// A value, by index (`v0`, `v1`...).
pub type Val = u8;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cond {
    Always,
    Nx,
    Nex,
}

/// One operation on the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    Set {
        value: Val,
        cond: Cond,
        ft: Option<Token>,
    },
    Get,
    Del {
        ft: Option<Token>,
    },
    VDel {
        value: Val,
        ft: Option<Token>,
    },
}

/// What the server answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ret {
    /// SET `+OK`, with the new version.
    Ok(Version),
    /// SET `:-1`, with the current version.
    NotSet(Version),
    /// GET hit.
    Value(Val, Version),
    /// GET `$-1`.
    Nil,
    /// DEL/VDEL `:1`, with the deletion's version.
    Deleted(Version),
    /// DEL/VDEL `:0`.
    Absent,
    /// VDEL `:-1`, with the current version.
    Mismatch(Version),
    /// `a fencing token is required for this request`.
    FenceRequired,
    /// `the request fencing token is a lower version than ...`.
    FenceLower,
}

/// What a key holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Entry {
    value: Val,
    /// `None`: written by an operation whose answer was lost, not seen since.
    version: Option<Version>,
    ft: Option<Token>,
}

/// One possible state of the key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyState {
    entry: Option<Entry>,
    /// The greatest version known to be issued for this key: a new one must exceed it.
    floor: Version,
}

/// What the sequential store does, before versions are compared.
enum Outcome {
    /// A new version; the key then holds this (or nothing, for a deletion).
    Write(Option<(Val, Option<Token>)>),
    /// Nothing changes; the answer carries the current version (or none).
    Read,
    /// Refused before any change.
    Refused(Ret),
    Absent,
}

fn fence(entry: Option<&Entry>, request: Option<Token>) -> Result<Option<Token>, Ret> {
    match (entry.and_then(|e| e.ft), request) {
        (None, request) => Ok(request),
        (Some(_), None) => Err(Ret::FenceRequired),
        (Some(current), Some(request)) if request < current => Err(Ret::FenceLower),
        (Some(_), Some(request)) => Ok(Some(request)),
    }
}

fn outcome(entry: Option<&Entry>, op: &Op) -> Outcome {
    match *op {
        Op::Set { value, cond, ft } => match fence(entry, ft) {
            Err(refusal) => Outcome::Refused(refusal),
            Ok(ft) => {
                let blocked = entry.is_some_and(|e| match cond {
                    Cond::Always => false,
                    Cond::Nx => true,
                    Cond::Nex => e.value != value,
                });
                if blocked {
                    Outcome::Read
                } else {
                    Outcome::Write(Some((value, ft)))
                }
            }
        },
        Op::Get => Outcome::Read,
        Op::Del { .. } | Op::VDel { .. } if entry.is_none() => Outcome::Absent,
        Op::Del { ft } => match fence(entry, ft) {
            Err(refusal) => Outcome::Refused(refusal),
            Ok(_) => Outcome::Write(None),
        },
        Op::VDel { value, ft } => match fence(entry, ft) {
            Err(refusal) => Outcome::Refused(refusal),
            Ok(_) if entry.is_some_and(|e| e.value != value) => Outcome::Read,
            Ok(_) => Outcome::Write(None),
        },
    }
}

impl KeyState {
    /// The state after `op` answered `ret` (`None`: unseen, and it did happen).
    fn step(&self, op: &Op, ret: Option<&Ret>) -> Option<KeyState> {
        let entry = self.entry.as_ref();
        match (outcome(entry, op), ret) {
            (Outcome::Refused(_) | Outcome::Absent | Outcome::Read, None) => Some(self.clone()),
            (Outcome::Refused(expected), Some(got)) => (expected == *got).then(|| self.clone()),
            (Outcome::Absent, Some(got)) => matches!(got, Ret::Absent).then(|| self.clone()),
            (Outcome::Read, Some(got)) => self.read(op, got),
            (Outcome::Write(next), None) => Some(KeyState {
                entry: next.map(|(value, ft)| Entry {
                    value,
                    version: None,
                    ft,
                }),
                floor: self.floor,
            }),
            (Outcome::Write(next), Some(got)) => {
                let version = match (next, got) {
                    (Some(_), Ret::Ok(v)) | (None, Ret::Deleted(v)) => *v,
                    _ => return None,
                };
                (version > self.floor).then(|| KeyState {
                    entry: next.map(|(value, ft)| Entry {
                        value,
                        version: Some(version),
                        ft,
                    }),
                    floor: version,
                })
            }
        }
    }

    /// An answer that shows the current entry: its value and version must match (an
    /// unseen version is bound to the first one shown, if it is new).
    fn read(&self, op: &Op, got: &Ret) -> Option<KeyState> {
        let Some(entry) = &self.entry else {
            return matches!((op, got), (Op::Get, Ret::Nil)).then(|| self.clone());
        };
        let shown = match (op, got) {
            (Op::Get, Ret::Value(value, v)) if *value == entry.value => *v,
            (Op::Set { .. }, Ret::NotSet(v)) | (Op::VDel { .. }, Ret::Mismatch(v)) => *v,
            _ => return None,
        };
        match entry.version {
            Some(known) => (known == shown).then(|| self.clone()),
            None if shown > self.floor => Some(KeyState {
                entry: Some(Entry {
                    version: Some(shown),
                    ..entry.clone()
                }),
                floor: shown,
            }),
            None => None,
        }
    }
}

/// The model of one key: the set of states it may be in.
#[derive(Debug, Clone, Copy, Default)]
pub struct KeyModel;

impl Model for KeyModel {
    type State = BTreeSet<KeyState>;
    type Op = Op;
    type Ret = Ret;

    fn init(&self) -> Self::State {
        BTreeSet::from([KeyState {
            entry: None,
            floor: (0, 0),
        }])
    }

    fn step(&self, states: &Self::State, op: &Op, ret: Option<&Ret>) -> Option<Self::State> {
        let mut next = BTreeSet::new();
        for state in states {
            if ret.is_none() {
                // It may not have happened at all.
                next.insert(state.clone());
            }
            next.extend(state.step(op, ret));
        }
        (!next.is_empty()).then_some(next)
    }
}

/// The versions an answer shows: (the new version it issued, the existing one it saw).
pub fn versions(ret: &Ret) -> (Option<Version>, Option<Version>) {
    match *ret {
        Ret::Ok(v) | Ret::Deleted(v) => (Some(v), None),
        Ret::NotSet(v) | Ret::Value(_, v) | Ret::Mismatch(v) => (None, Some(v)),
        Ret::Nil | Ret::Absent | Ret::FenceRequired | Ret::FenceLower => (None, None),
    }
}

/// The cross-key rule of the shared clock, over the whole history: every version an
/// operation issued is new and above every version shown by any operation that
/// completed before it was invoked. `Err` names the first offending operation.
pub fn check_versions<K>(ops: &[Operation<(K, Op), Ret>]) -> Result<(), String> {
    let mut issued = HashSet::new();
    for op in ops {
        if let Some((_, ret)) = &op.ret {
            if let (Some(v), _) = versions(ret) {
                if !issued.insert(v) {
                    return Err(format!("version {v:?} issued twice"));
                }
            }
        }
    }
    let mut by_return: Vec<(u64, Version)> = ops
        .iter()
        .filter_map(|o| o.ret.as_ref())
        .filter_map(|(t, r)| {
            let (new, seen) = versions(r);
            new.or(seen).map(|v| (*t, v))
        })
        .collect();
    by_return.sort_unstable();
    let mut by_call: Vec<(u64, Version, usize)> = ops
        .iter()
        .enumerate()
        .filter_map(|(i, o)| {
            let (new, _) = versions(&o.ret.as_ref()?.1);
            new.map(|v| (o.call, v, i))
        })
        .collect();
    by_call.sort_unstable();
    let (mut max_before, mut next) = ((0, 0), 0);
    for (call, version, i) in by_call {
        while next < by_return.len() && by_return[next].0 < call {
            max_before = max_before.max(by_return[next].1);
            next += 1;
        }
        if version <= max_before {
            return Err(format!(
                "operation {i} issued {version:?}, not above {max_before:?} seen before it began"
            ));
        }
    }
    Ok(())
}
