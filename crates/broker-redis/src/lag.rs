//! Flow control between the writers and the slowest reader: every entry carries its
//! number (`q`, counted in `{ns}:mqtt:seq` by the script that appends it,
//! `append.rs`), each reader says the number of the last entry it applied
//! (`{ns}:mqtt:read:{node}`, renewed on every read and lapsing after the node TTL),
//! and a writer appends no more while a live node's reader (its own included: its
//! reader skips its entries, but they would push the others' out of the stream) is
//! more than `reader_lag_limit` entries behind. Its PUBACKs then wait, and the
//! connections' bounded in-flight windows hold their publishers: no reader that keeps
//! reading falls past the stream's trim. A reader that made no progress for the node
//! TTL is not waited for (its key lapsed). No reader waits for its own held writer
//! (`flush.rs`), so no two nodes wait for each other.

use redis::{Pipeline, Value};

/// What the writer knows of how far behind the nodes' readers are.
#[derive(Debug)]
pub(crate) struct Lag {
    limit: u64,
    /// The other nodes whose positions the last probe asked for.
    asked: usize,
    /// Entries between the stream's head and the slowest live reader, at the last
    /// probe; `None` without a live reader elsewhere.
    behind: Option<u64>,
}

impl Lag {
    pub(crate) fn new(limit: u64) -> Self {
        Self {
            limit,
            asked: 0,
            behind: None,
        }
    }

    /// How many more entries may be appended before the slowest reader is at the
    /// limit (`usize::MAX` without a limit or a reader to wait for).
    pub(crate) fn room(&self) -> usize {
        match self.behind {
            Some(behind) if self.limit > 0 => {
                usize::try_from(self.limit.saturating_sub(behind)).unwrap_or(usize::MAX)
            }
            _ => usize::MAX,
        }
    }

    /// Adds, at the end of `pipe`, the reads of the head's number and of `others`'
    /// positions; [`Lag::observe`] takes their replies.
    pub(crate) fn probe(&mut self, pipe: &mut Pipeline, seq: &str, others: &[String]) {
        if self.limit == 0 {
            self.asked = 0;
            return;
        }
        pipe.get(seq);
        if !others.is_empty() {
            pipe.mget(others);
        }
        self.asked = others.len();
    }

    /// Takes the probe's replies from the front of `replies`; the rest are left.
    pub(crate) fn observe(&mut self, replies: &mut std::vec::IntoIter<Value>) {
        if self.limit == 0 {
            return;
        }
        let head = replies.next().and_then(|v| number(&v)).unwrap_or(0);
        let slowest = if self.asked == 0 {
            None
        } else {
            match replies.next() {
                Some(Value::Array(positions)) => positions.iter().filter_map(number).min(),
                _ => None,
            }
        };
        self.behind = slowest.map(|s| head.saturating_sub(s));
    }

    pub(crate) fn behind(&self) -> Option<u64> {
        self.behind
    }
}

fn number(value: &Value) -> Option<u64> {
    redis::from_redis_value::<Option<u64>>(value).ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn observed(limit: u64, asked: &[&str], replies: Vec<Value>) -> Lag {
        let mut lag = Lag::new(limit);
        let others: Vec<String> = asked.iter().map(|s| (*s).to_owned()).collect();
        lag.probe(&mut redis::pipe(), "seq", &others);
        lag.observe(&mut replies.into_iter());
        lag
    }

    fn bulk(n: u64) -> Value {
        Value::BulkString(n.to_string().into_bytes())
    }

    #[test]
    fn the_slowest_live_reader_sets_the_room() {
        let replies = vec![
            bulk(100),
            Value::Array(vec![bulk(95), Value::Nil, bulk(90)]),
        ];
        let lag = observed(20, &["a", "b", "c"], replies);
        assert_eq!(lag.behind(), Some(10));
        assert_eq!(lag.room(), 10);
    }

    #[test]
    fn past_the_limit_there_is_no_room() {
        let lag = observed(20, &["a"], vec![bulk(100), Value::Array(vec![bulk(70)])]);
        assert_eq!(lag.room(), 0);
    }

    #[test]
    fn lapsed_readers_and_no_limit_are_not_waited_for() {
        let lag = observed(20, &["a"], vec![bulk(100), Value::Array(vec![Value::Nil])]);
        assert_eq!(lag.room(), usize::MAX);
        let lag = observed(20, &[], vec![bulk(100)]);
        assert_eq!(lag.room(), usize::MAX);
        let lag = observed(0, &["a"], vec![]);
        assert_eq!(lag.room(), usize::MAX);
    }
}
