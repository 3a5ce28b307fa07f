//! A linearizability checker: the Wing & Gong search with Lowe's memoization, as
//! Porcupine implements it ("Faster linearizability checking via P-compositionality",
//! Horn and Kroening), over a history of operations with invoke and complete times.
//!
//! The search walks the history's events in time order and linearizes a call as early
//! as it can: the model must accept the call's recorded result in the current state.
//! Reaching an operation's return before it was linearized means an earlier choice was
//! wrong, so it backtracks. A set of (linearized operations, state) pairs already
//! explored cuts the search: the same pair can never lead anywhere new.
//!
//! An operation whose completion was never seen (its client lost the server) has an
//! open result: the model decides what it may have done. Its return is placed at the
//! given instant (the crash), so that it either took effect before it or not at all.

use std::collections::HashSet;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// A sequential specification.
pub trait Model {
    /// The state of the object; hashed for the memo, so keep it small.
    type State: Clone + Eq + Hash;
    /// An operation with its arguments.
    type Op;
    /// A result.
    type Ret;
    /// The state before any operation.
    fn init(&self) -> Self::State;
    /// The state after `op` in `state` when it returned `ret` (`None`: the result was
    /// never seen), or `None` if the model cannot return that there.
    fn step(
        &self,
        state: &Self::State,
        op: &Self::Op,
        ret: Option<&Self::Ret>,
    ) -> Option<Self::State>;
}

/// One operation of a history: times in any unit that orders them (nanoseconds since
/// the run began, here).
#[derive(Debug, Clone)]
pub struct Operation<O, R> {
    pub client: usize,
    pub call: u64,
    /// Completion time and result; `None` for a call never answered.
    pub ret: Option<(u64, R)>,
    pub op: O,
}

/// The checker's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Linearizable,
    NotLinearizable,
    /// The time budget ran out first.
    Unknown,
}

#[derive(Debug, Clone, Copy)]
struct Node {
    /// Operation index.
    op: usize,
    is_call: bool,
    /// The call's return node, for calls.
    partner: usize,
    prev: usize,
    next: usize,
}

/// A doubly linked list of events with a head sentinel at index `HEAD`.
struct Events {
    nodes: Vec<Node>,
}

const HEAD: usize = 0;
const NIL: usize = usize::MAX;

impl Events {
    fn new<O, R>(ops: &[Operation<O, R>], open_until: u64) -> Self {
        // (time, kind, op): calls sort before returns at the same instant, which makes
        // touching operations concurrent (the permissive reading of equal clocks).
        let mut events: Vec<(u64, u8, usize)> = Vec::with_capacity(ops.len() * 2);
        for (i, o) in ops.iter().enumerate() {
            events.push((o.call, 0, i));
            let end = o.ret.as_ref().map_or(open_until, |(t, _)| *t);
            events.push((end.max(o.call), 1, i));
        }
        events.sort_unstable();
        let sentinel = Node {
            op: NIL,
            is_call: false,
            partner: NIL,
            prev: NIL,
            next: NIL,
        };
        let mut nodes = vec![sentinel];
        let mut call_node = vec![NIL; ops.len()];
        for &(_, kind, op) in &events {
            let index = nodes.len();
            nodes.push(Node {
                op,
                is_call: kind == 0,
                partner: NIL,
                prev: index - 1,
                next: NIL,
            });
            nodes[index - 1].next = index;
            if kind == 0 {
                call_node[op] = index;
            } else {
                nodes[call_node[op]].partner = index;
            }
        }
        Self { nodes }
    }

    fn first(&self) -> usize {
        self.nodes[HEAD].next
    }

    /// Takes a call and its return out of the list.
    fn lift(&mut self, call: usize) {
        for n in [call, self.nodes[call].partner] {
            let Node { prev, next, .. } = self.nodes[n];
            self.nodes[prev].next = next;
            if next != NIL {
                self.nodes[next].prev = prev;
            }
        }
    }

    /// Puts them back (in the reverse order of `lift`).
    fn unlift(&mut self, call: usize) {
        for n in [self.nodes[call].partner, call] {
            let Node { prev, next, .. } = self.nodes[n];
            self.nodes[prev].next = n;
            if next != NIL {
                self.nodes[next].prev = n;
            }
        }
    }
}

/// A set of operation indexes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Bits(Vec<u64>);

impl Bits {
    fn new(n: usize) -> Self {
        Self(vec![0; n.div_ceil(64)])
    }

    fn flip(&mut self, i: usize) {
        self.0[i / 64] ^= 1 << (i % 64);
    }
}

/// Is the history linearizable with respect to the model? Open operations return at
/// `open_until`. Gives up with [`Verdict::Unknown`] after `budget`.
pub fn check<M: Model>(
    model: &M,
    ops: &[Operation<M::Op, M::Ret>],
    open_until: u64,
    budget: Duration,
) -> Verdict {
    let deadline = Instant::now() + budget;
    let mut events = Events::new(ops, open_until);
    let mut linearized = Bits::new(ops.len());
    let mut memo: HashSet<(Bits, M::State)> = HashSet::new();
    let mut stack: Vec<(usize, M::State)> = Vec::new();
    let mut state = model.init();
    let mut entry = events.first();
    let mut steps: u64 = 0;
    while entry != NIL {
        steps += 1;
        if steps.is_multiple_of(4096) && Instant::now() > deadline {
            return Verdict::Unknown;
        }
        let node = events.nodes[entry];
        if node.is_call {
            let op = &ops[node.op];
            let next_state = model.step(&state, &op.op, op.ret.as_ref().map(|(_, r)| r));
            if let Some(next_state) = next_state {
                let mut next_bits = linearized.clone();
                next_bits.flip(node.op);
                if memo.insert((next_bits.clone(), next_state.clone())) {
                    stack.push((entry, std::mem::replace(&mut state, next_state)));
                    linearized = next_bits;
                    events.lift(entry);
                    entry = events.first();
                    continue;
                }
            }
            entry = node.next;
        } else {
            // A return reached before its call was linearized: undo the last choice.
            let Some((call, previous)) = stack.pop() else {
                return Verdict::NotLinearizable;
            };
            state = previous;
            linearized.flip(events.nodes[call].op);
            events.unlift(call);
            entry = events.nodes[call].next;
        }
    }
    Verdict::Linearizable
}
