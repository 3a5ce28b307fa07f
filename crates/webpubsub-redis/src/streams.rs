//! Client streams of mirrored sessions (the webpubsub crate's `hub/stream.rs` says
//! why they move with their session): how their state is kept in the session's hash,
//! read back by a claim, and written in the same script call as the operation that
//! publishes a fragment or an end, so that Redis holds both or neither.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::mpsc::TrySendError;

use redis::Value;
use statehub_webpubsub::{ClusterError, MirroredStream, SessionWrite, Taken};
use tokio::sync::oneshot;

use crate::session::{Keys, Scripts};
use crate::{lock, unavailable, Down, Job, RedisCluster};

/// A session write that travels with an operation
/// ([`statehub_webpubsub::Cluster::broadcast_with`]):
/// (hub, id), the write and its ticket, and who waits to hear whether the store took
/// it (`false`: fenced).
#[derive(Debug)]
pub(crate) struct Attached {
    pub(crate) hub: String,
    pub(crate) id: String,
    pub(crate) write: SessionWrite,
    pub(crate) ticket: u64,
    pub(crate) fate: Option<oneshot::Sender<bool>>,
}

impl RedisCluster {
    /// Queues an operation, with `attached` (hub, id, write) if any: both or neither.
    /// Returns its number, the write's ticket (0: none) and, with a write, whether the
    /// store took both.
    pub(crate) fn enqueue_op(
        &self,
        operation: Vec<u8>,
        attached: Option<(&str, &str, SessionWrite)>,
    ) -> Result<(u64, u64, Option<Taken>), ClusterError> {
        if !self.shared.up.load(Ordering::Relaxed) {
            return Err(unavailable(Down));
        }
        if self.shared.ops_waiting.load(Ordering::Relaxed) >= self.queue {
            return Err(ClusterError::Backlog(self.queue));
        }
        let mut assigned = lock(&self.shared.assigned);
        let seq = assigned.last + 1;
        let kept = (assigned.claims > 0).then(|| operation.clone());
        let mut tickets = attached.as_ref().map(|_| lock(&self.shared.tickets));
        let ticket = tickets.as_deref().map_or(0, |t| *t + 1);
        let mut taken = None;
        let attached = attached.map(|(hub, id, write)| {
            let (fate, answer) = oneshot::channel();
            taken = Some(answer);
            Box::new(Attached {
                hub: hub.to_owned(),
                id: id.to_owned(),
                write,
                ticket,
                fate: Some(fate),
            })
        });
        match self.jobs.try_send(Job::Broadcast(seq, operation, attached)) {
            Ok(()) => {
                self.shared.ops_waiting.fetch_add(1, Ordering::Relaxed);
                assigned.last = seq;
                if let Some(t) = tickets.as_deref_mut() {
                    *t = ticket;
                }
                if let Some(op) = kept {
                    if assigned.kept.len() < self.queue {
                        assigned.kept.push_back((seq, op));
                    } else {
                        assigned.overflow = true;
                    }
                }
                // A writer gone before answering: the other nodes never get it.
                let taken =
                    taken.map(|t| -> Taken { Box::pin(async { t.await.unwrap_or(false) }) });
                Ok((seq, ticket, taken))
            }
            Err(TrySendError::Full(_)) => Err(ClusterError::Backlog(self.queue)),
            Err(TrySendError::Disconnected(_)) => Err(unavailable(Down)),
        }
    }
}

/// An operation as the stream holds it: `ops` (the stream's key), its length bound,
/// the node, its incarnation, the operation's number and bytes.
pub(crate) struct OpEntry<'a> {
    pub(crate) ops: &'a str,
    pub(crate) stream_len: u64,
    pub(crate) node: &'a str,
    pub(crate) incarnation: u64,
    pub(crate) seq: u64,
    pub(crate) op: &'a [u8],
}

/// Adds a client stream's fragment or end to `pipe`: its operation and its stream's
/// state (`write`, a `StreamAccepted` or `StreamClosed`), or a client's send and its
/// `ackId`'s record (`write`, an `Ack`), in one script call, both fenced by `epoch`
/// (0: this node does not hold the session); any other write adds the operation alone.
/// Its reply is not ignored: 1 if written, 0 if fenced (the stream then has the
/// operation's number with no operation: see [`is_fenced`]).
pub(crate) fn add_fragment(
    pipe: &mut redis::Pipeline,
    scripts: &Scripts,
    keys: &Keys,
    (epoch, ttl_ms): (u64, u64),
    write: &SessionWrite,
    entry: &OpEntry<'_>,
) {
    let (kind, first, second) = match write {
        SessionWrite::StreamAccepted {
            id,
            expected,
            deadline_ms,
        } => (
            "fragment",
            id.clone(),
            next_expected(*expected, *deadline_ms),
        ),
        SessionWrite::StreamClosed(id) => ("fragment", id.clone(), "0".to_owned()),
        SessionWrite::Ack { ack_id, keep } => ("sent", ack_id.to_string(), keep.to_string()),
        _ => ("fragment", String::new(), "0".to_owned()),
    };
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(scripts.write.get_hash())
        .arg(4)
        .arg(&keys.all()[..])
        .arg(entry.ops)
        .arg(if first.is_empty() { 0 } else { epoch })
        .arg(ttl_ms)
        .arg(kind)
        .arg(first)
        .arg(second)
        .arg(entry.stream_len)
        .arg(entry.node)
        .arg(entry.incarnation)
        .arg(entry.seq)
        .arg(entry.op);
    pipe.add_command(cmd);
}

/// A stream's `sq:{streamId}` value: `{next expected id}|{idle deadline, Unix ms}`
/// (the deadline rides in the value the fragment's call writes anyway).
pub(crate) fn next_expected(expected: u64, deadline_ms: u64) -> String {
    format!("{expected}|{deadline_ms}")
}

/// Parses [`next_expected`]'s value; a value without a deadline (0: not known) is read
/// too.
fn parse_expected(value: &[u8]) -> Option<(u64, u64)> {
    let text = std::str::from_utf8(value).ok()?;
    match text.split_once('|') {
        Some((expected, deadline)) => Some((expected.parse().ok()?, deadline.parse().ok()?)),
        None => Some((text.parse().ok()?, 0)),
    }
}

/// Whether an operation entry is a fenced fragment's: its number, with nothing to apply.
pub(crate) fn is_fenced(op: &[u8]) -> bool {
    op.is_empty()
}

/// A client stream's options in the session's hash (`sm:{streamId}`), written once
/// when it opens: `{noEcho 0|1}|{idle ms}|{group}`; its next expected id and idle
/// deadline (`sq:{streamId}`, [`next_expected`]) per fragment, keepalive, repeat, nack.
pub(crate) struct StreamMeta {
    pub(crate) group: String,
    pub(crate) no_echo: bool,
    pub(crate) idle_ms: u64,
}

impl StreamMeta {
    pub(crate) fn encode(&self) -> String {
        format!("{}|{}|{}", u8::from(self.no_echo), self.idle_ms, self.group)
    }

    fn decode(bytes: &[u8]) -> Option<Self> {
        let mut parts = std::str::from_utf8(bytes).ok()?.splitn(3, '|');
        let no_echo = parts.next()? == "1";
        let idle_ms = parts.next()?.parse().ok()?;
        Some(Self {
            no_echo,
            idle_ms,
            group: parts.next()?.to_owned(),
        })
    }
}

/// The open streams of a claimed session, from the `sq:`/`sm:` fields of its hash; a
/// stream missing either half (cannot happen: both are written in one call) is left
/// out.
pub(crate) fn streams(value: &Value) -> Option<Vec<MirroredStream>> {
    let Value::Array(fields) = value else {
        return Some(Vec::new());
    };
    let mut expected = HashMap::new();
    let mut meta = HashMap::new();
    for pair in fields.chunks(2) {
        let (Value::BulkString(k), Value::BulkString(v)) = (pair.first()?, pair.get(1)?) else {
            return None;
        };
        let k = std::str::from_utf8(k).ok()?;
        if let Some(id) = k.strip_prefix("sq:") {
            expected.insert(id.to_owned(), parse_expected(v)?);
        } else if let Some(id) = k.strip_prefix("sm:") {
            meta.insert(id.to_owned(), StreamMeta::decode(v)?);
        }
    }
    let mut out: Vec<MirroredStream> = (meta.into_iter())
        .filter_map(|(id, m)| {
            let (expected, deadline_ms) = *expected.get(&id)?;
            Some(MirroredStream {
                expected,
                deadline_ms,
                id,
                group: m.group,
                no_echo: m.no_echo,
                idle_ms: m.idle_ms,
            })
        })
        .collect();
    out.sort_by(|a, b| a.id.cmp(&b.id));
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_restores_the_streams_whose_options_and_next_id_are_stored() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let meta = StreamMeta {
            group: "g|h".into(),
            no_echo: true,
            idle_ms: 900,
        };
        let fields = Value::Array(vec![
            bulk("sm:a"),
            bulk(&meta.encode()),
            bulk("sq:a"),
            bulk(&next_expected(7, 1_700_000_000_000)),
            bulk("sm:b"),
            bulk(&meta.encode()),
            bulk("sq:b"),
            bulk("4"),
            bulk("sq:orphan"),
            bulk("2"),
        ]);
        let a = MirroredStream {
            id: "a".into(),
            group: "g|h".into(),
            no_echo: true,
            idle_ms: 900,
            expected: 7,
            deadline_ms: 1_700_000_000_000,
        };
        let b = MirroredStream {
            id: "b".into(),
            expected: 4,
            deadline_ms: 0,
            ..a.clone()
        };
        assert_eq!(
            streams(&fields),
            Some(vec![a, b]),
            "b: no deadline recorded"
        );
        assert_eq!(streams(&Value::Nil), Some(vec![]), "none stored");
        let bad = Value::Array(vec![bulk("sq:a"), bulk("x")]);
        assert_eq!(streams(&bad), None, "corrupt");
    }
}
