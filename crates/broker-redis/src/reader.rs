//! The reader: one thread reads the stream strictly after the last entry it read and
//! applies each entry in stream order: another node's message is delivered to this
//! node's subscribers, another node's connection ends this node's session of the same
//! client id, a change of any node's shared groups reloads the groups hash, a retained
//! change (a retained message's, or one written after Redis was out of reach:
//! `retain.rs`) of any node is applied, but not over one of this node's own still to
//! come (`own_retained.rs`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use redis::streams::{StreamId, StreamRangeReply, StreamReadOptions, StreamReadReply};
use redis::{Client, Commands, Connection, RedisResult, Value};
use statehub_broker::{Broker, Gate};
use tokio_util::sync::CancellationToken;

use crate::writer::open;
use crate::{wire, Options, Shared};

/// How long one read blocks, so that a stop is seen this often.
const BLOCK: Duration = Duration::from_millis(500);
/// Most entries one read takes.
const BATCH: usize = 512;
/// Pause between attempts to reach Redis.
const RETRY: Duration = Duration::from_millis(250);

pub(crate) struct Reader {
    client: Client,
    shared: Arc<Shared>,
    timeout: Duration,
    /// The last entry read; `None` until first connected (then: the stream's end).
    last_id: Option<String>,
    /// The retained hash was loaded (on the first connection).
    loaded: bool,
    /// Whether entries may have been trimmed before this reader read them: after a
    /// reconnect, or a full batch (it is behind).
    check_gap: bool,
    /// The number of the last entry read (`lag.rs`), once known.
    seq: Option<u64>,
    /// Where this reader says how far it read, and how long that lives unrenewed.
    position_key: String,
    position_ttl_ms: u64,
}

impl Reader {
    pub(crate) fn new(client: Client, shared: Arc<Shared>, options: &Options) -> Self {
        Self {
            client,
            timeout: options.timeout,
            last_id: None,
            loaded: false,
            check_gap: false,
            seq: None,
            position_key: shared.keys.read_position(&shared.node),
            position_ttl_ms: u64::try_from(options.node_ttl.as_millis()).unwrap_or(u64::MAX),
            shared,
        }
    }

    /// Positions at the stream's end and loads retained messages and shared groups, if
    /// Redis answers now (true); otherwise [`Reader::run`] does when it first connects.
    pub(crate) fn start(&mut self, broker: &Broker) -> bool {
        let started =
            open(&self.client, self.timeout).and_then(|mut con| self.position(&mut con, broker));
        if let Err(e) = &started {
            tracing::warn!(
                "mqtt cluster: redis is unreachable ({e}); this node serves its own clients until it is back"
            );
        }
        started.is_ok()
    }

    /// Applies every entry until the broker shuts down.
    pub(crate) fn run(mut self, broker: &Broker, stop: &CancellationToken) {
        let mut connection: Option<Connection> = None;
        let mut down = false;
        while !stop.is_cancelled() {
            let con = match connection.as_mut() {
                Some(con) => con,
                None => match open(&self.client, self.timeout + BLOCK) {
                    Ok(con) => connection.insert(con),
                    Err(e) => {
                        if !down {
                            tracing::warn!(
                                "mqtt cluster reader: redis unreachable ({e}); retrying"
                            );
                            down = true;
                        }
                        std::thread::sleep(RETRY);
                        continue;
                    }
                },
            };
            match self.read(con, broker) {
                Ok(()) => {
                    if down {
                        tracing::info!("mqtt cluster reader: redis is back");
                        down = false;
                    }
                }
                Err(e) => {
                    self.shared
                        .counters
                        .read_errors
                        .fetch_add(1, Ordering::Relaxed);
                    if !down {
                        tracing::warn!("mqtt cluster reader: read failed ({e}); reconnecting");
                        down = true;
                    }
                    connection = None;
                    self.check_gap = true;
                    std::thread::sleep(RETRY);
                }
            }
        }
    }

    fn position(&mut self, con: &mut Connection, broker: &Broker) -> RedisResult<()> {
        if self.last_id.is_none() {
            let last: StreamRangeReply =
                con.xrevrange_count(&self.shared.keys.feed, "+", "-", 1)?;
            let last_entry = last.ids.first();
            self.seq = Some(last_entry.and_then(entry_number).unwrap_or(0));
            let last = last_entry.map_or_else(|| "0-0".to_owned(), |e| e.id.clone());
            self.shared.sessions.applied(&last);
            self.shared.cut.lock().last_id = Some(last.clone());
            self.last_id = Some(last);
        }
        if !self.loaded {
            // After positioning: a change made meanwhile is read from the stream again.
            // Not over a change of this node's own still to come (`own_retained.rs`).
            let retained: Vec<(String, Vec<u8>)> = con.hgetall(&self.shared.keys.retained)?;
            let now = wire::Now::at(broker.now());
            let own = &self.shared.own_retained;
            let mut held = std::collections::HashSet::with_capacity(retained.len());
            for (topic, value) in retained {
                match wire::decode(&value, now) {
                    Ok(Some(msg)) => {
                        broker.apply_retained_unless(&Arc::new(msg), |t| own.holds(t));
                        held.insert(topic);
                    }
                    Ok(None) => {}
                    Err(e) => {
                        self.malformed(&topic, &e);
                        // Unreadable, not known to be gone: what this node has stays.
                        held.insert(topic);
                    }
                }
            }
            // What the hash no longer holds was cleared (or expired) in entries this
            // node did not read, a trimmed gap's: gone here too.
            broker.retain_only(|t| held.contains(t) || own.holds(t));
            self.reload_groups(con)?;
            self.loaded = true;
        }
        Ok(())
    }

    fn read(&mut self, con: &mut Connection, broker: &Broker) -> RedisResult<()> {
        self.position(con, broker)?;
        let last_id = self.last_id.clone().unwrap_or_else(|| "0-0".to_owned());
        if std::mem::take(&mut self.check_gap) {
            self.count_gap(con, &last_id)?;
        }
        let options = StreamReadOptions::default()
            .block(usize::try_from(BLOCK.as_millis()).unwrap_or(usize::MAX))
            .count(BATCH);
        let reply: Option<StreamReadReply> =
            con.xread_options(&[&self.shared.keys.feed], &[&last_id], &options)?;
        let entries: Vec<StreamId> = reply
            .map(|r| r.keys)
            .unwrap_or_default()
            .into_iter()
            .flat_map(|k| k.ids)
            .collect();
        self.skipped(&entries, &last_id);
        let counters = &self.shared.counters;
        let lag = match entries.last() {
            Some(last) if entries.len() >= BATCH => statehub_redis_common::stream_age_ms(&last.id),
            _ => 0,
        };
        counters.reader_lag_ms.store(lag, Ordering::Relaxed);
        if entries.is_empty() {
            return self.report_position(con);
        }
        self.check_gap = entries.len() >= BATCH;
        // Applied under the cut's lock (a session moving here joins between two
        // batches), and as one group with the mark of how far they went: after a
        // crash, exactly the entries past the mark are to be replayed.
        let mut cut = self.shared.cut.lock();
        let sessions = &self.shared.sessions;
        sessions.begin_group();
        // The QoS 2 copies this batch stores wait until the group is written.
        let gate = Arc::new(Gate::default());
        let mut applied = Ok(());
        // This node's messages read back: covered by the position mark from now on
        // (their origins, and where each is in `entries`).
        let (mut own, mut own_at) = (Vec::new(), Vec::new());
        let mut done = 0usize;
        for entry in &entries {
            applied = self.apply(con, broker, entry, &gate);
            if applied.is_err() {
                break;
            }
            if let Some(origin) = self.own_origin(entry) {
                own.push(origin);
                own_at.push(done);
            }
            counters.entries_read.fetch_add(1, Ordering::Relaxed);
            self.seq = entry_number(entry).or(self.seq);
            done += 1;
        }
        if let Some(last) = done.checked_sub(1).and_then(|i| entries.get(i)) {
            self.last_id = Some(last.id.clone());
        }
        for (origin, clients) in sessions.read_back(&own) {
            let at = own.iter().position(|o| *o == origin).map(|i| own_at[i]);
            if let Some(entry) = at.and_then(|i| entries.get(i)) {
                self.give_withdrawn(broker, entry, (origin, &clients), &gate);
            }
        }
        if let Some(last) = &self.last_id {
            sessions.applied(last);
            cut.last_id = Some(last.clone());
        }
        sessions.end_group_gated(Some(gate));
        drop(cut);
        applied?;
        self.report_position(con)
    }

    /// Tells the writers how far this reader is (`lag.rs`); renewed on every read, so
    /// it lapses when the reader makes no progress.
    fn report_position(&self, con: &mut Connection) -> RedisResult<()> {
        let Some(seq) = self.seq else {
            return Ok(());
        };
        redis::cmd("SET")
            .arg(&self.position_key)
            .arg(seq)
            .arg("PX")
            .arg(self.position_ttl_ms.max(1))
            .query(con)
    }

    fn apply(
        &self,
        con: &mut Connection,
        broker: &Broker,
        entry: &StreamId,
        gate: &Arc<Gate>,
    ) -> RedisResult<()> {
        let field = |name: &str| match entry.map.get(name) {
            Some(Value::BulkString(bytes)) => Some(bytes.as_slice()),
            _ => None,
        };
        let text = |name: &str| field(name).and_then(|b| std::str::from_utf8(b).ok());
        let ours = text("n") == Some(&*self.shared.node);
        match text("t") {
            Some("p") if !ours => {
                let sessions = &self.shared.sessions;
                let held_by = field("o").map_or_else(Vec::new, |o| sessions.held_by(o));
                let msg = (field("m"), field("s"));
                let expired = !self.deliver(broker, msg, &held_by, &entry.id, gate);
                // Expired before it was read, a retained message still replaces the
                // topic's older one (the hash's reads as none).
                let change = text("rs").or_else(|| text("rc"));
                if let Some(topic) = change.filter(|_| expired) {
                    self.retained(broker, (Some(topic), None), (&entry.id, false));
                }
            }
            // This node's own retained message, read back.
            Some("p") => {
                if let Some(topic) = text("rs").or_else(|| text("rc")) {
                    self.retained(broker, (Some(topic), field("m")), (&entry.id, true));
                }
            }
            Some("k") => match (text("c"), ours) {
                (Some(client), true) => self.shared.announced(client),
                // A resumed session moves with its stored form (the other node
                // fetched it, or will); a Clean Start ends it.
                (Some(client), false) if text("r") == Some("1") => {
                    if let Some((incarnation, messages)) = broker.resumed_elsewhere(client) {
                        self.shared
                            .sessions
                            .released(incarnation, &entry.id, &messages, None);
                    }
                }
                (Some(client), false) => {
                    broker.taken_elsewhere(client);
                }
                (None, _) => self.malformed(&entry.id, &"no client id"),
            },
            Some("g") => self.reload_groups(con)?,
            Some("r") => self.retained(broker, (text("c"), field("m")), (&entry.id, ours)),
            Some("h") if !ours => match text("c") {
                Some(client) => self.hand_off(con, broker, client, (text("i"), &entry.id)),
                None => self.malformed(&entry.id, &"no client id"),
            },
            _ => {}
        }
        Ok(())
    }

    /// A retained change of any node, this one's (`ours`) included: applied in stream
    /// order, but not over a change this node made to the topic that is still to
    /// come (`own_retained.rs`): that one is later in the stream. This node's own
    /// changes are applied too, as its changes of one topic may reach the stream in
    /// another order than they took effect here (two publishers).
    fn retained(
        &self,
        broker: &Broker,
        (topic, value): (Option<&str>, Option<&[u8]>),
        (id, ours): (&str, bool),
    ) {
        let Some(topic) = topic else {
            return self.malformed(id, &"no topic");
        };
        let own = &self.shared.own_retained;
        match crate::retain::from_entry(topic, value, wire::Now::at(broker.now())) {
            Ok(msg) if ours => broker.apply_retained_unless(&msg, |t| own.read_back(t)),
            Ok(msg) => broker.apply_retained_unless(&msg, |t| own.holds(t)),
            Err(e) => {
                if ours {
                    own.dropped(topic);
                }
                self.malformed(id, &e);
            }
        }
    }

    /// The origin of a message this node published (see `sessions/origins.rs`).
    fn own_origin(&self, entry: &StreamId) -> Option<u64> {
        let field = |name: &str| match entry.map.get(name) {
            Some(Value::BulkString(bytes)) => Some(bytes.as_slice()),
            _ => None,
        };
        let ours = field("n") == Some(self.shared.node.as_bytes());
        (ours && field("t") == Some(b"p"))
            .then(|| field("o").and_then(crate::sessions::origin_of))
            .flatten()
    }

    /// This node's own message, refused to its publisher, reached the stream after
    /// all: the sessions whose QoS 2 copies were taken back then get it now, once
    /// (`Broker::withdraw_refused`), stored under its origin like a replayed copy.
    fn give_withdrawn(
        &self,
        broker: &Broker,
        entry: &StreamId,
        (origin, clients): (u64, &[Arc<str>]),
        gate: &Arc<Gate>,
    ) {
        let now = wire::Now::at(broker.now());
        let msg = match entry.map.get("m") {
            Some(Value::BulkString(m)) => wire::decode(m, now),
            _ => Err(wire::WireError::Malformed("no message")),
        };
        let msg = match msg {
            Ok(Some(msg)) => msg,
            Ok(None) => return,
            Err(e) => return self.malformed(&entry.id, &e),
        };
        let sessions = &self.shared.sessions;
        let mut named = None;
        let routed = broker.route_withdrawn(msg, clients, gate, |copy| {
            sessions.name(copy, &crate::sessions::body_id(origin), false);
            named = Some(copy.clone());
        });
        if let Some(copy) = named {
            sessions.unname(&copy);
        }
        let given = &sessions.counters.withdrawn_given;
        given.fetch_add(routed as u64, Ordering::Relaxed);
    }

    /// Delivers another node's message to this node's subscribers but the sessions
    /// `held_by` names (they moved here holding it: `sessions/adopted.rs`); false if
    /// it had expired.
    fn deliver(
        &self,
        broker: &Broker,
        (msg, picks): (Option<&[u8]>, Option<&[u8]>),
        held_by: &[Arc<str>],
        id: &str,
        gate: &Arc<Gate>,
    ) -> bool {
        let now = wire::Now::at(broker.now());
        let decoded = msg
            .ok_or(wire::WireError::Malformed("no message"))
            .and_then(|m| wire::decode(m, now));
        let picks = wire::decode_picks(picks.unwrap_or_default(), &self.shared.node);
        match (decoded, picks) {
            (Ok(Some(msg)), Ok(picks)) => {
                self.shared
                    .counters
                    .received
                    .fetch_add(1, Ordering::Relaxed);
                let own = &self.shared.own_retained;
                broker.route_remote_gated_unless(msg, (&picks, held_by), gate, |t| own.holds(t));
                if !held_by.is_empty() {
                    let skipped = &self.shared.sessions.counters.not_redelivered;
                    skipped.fetch_add(held_by.len() as u64, Ordering::Relaxed);
                }
            }
            (Ok(None), _) => return false,
            (Err(e), _) => self.malformed(id, &e),
            (_, Err(e)) => self.malformed(id, &e),
        }
        true
    }

    /// Another node asks for `client`'s session (incarnation `asked`): it leaves this
    /// node, marked released at `at` once what it recorded is written; one this node
    /// does not hold is released in Redis if this node owns it there
    /// (`Inner::asked`).
    ///
    /// While the session leaves, this node's publishers wait: its messages routed to
    /// the session are then all on the stream, up to the stream's last entry, and
    /// those routed after are past it, so the next node skips the former in its
    /// replay (the session has them) and gives the latter. Without that bound (Redis
    /// out of reach, or this node's writer holding for a reader elsewhere, which this
    /// thread never waits for: `flush.rs`) the next node tells them apart by their
    /// origins (`sessions/origins.rs`).
    fn hand_off(
        &self,
        con: &mut Connection,
        broker: &Broker,
        client: &str,
        (asked, at): (Option<&str>, &str),
    ) {
        let sessions = &self.shared.sessions;
        let settle = || {
            // A writer holding for a slow reader is not waited for: the
            // session is then released without a bound (`flush.rs`).
            sessions.flush_stream_unless_held().ok()?;
            let last: StreamRangeReply = con
                .xrevrange_count(&self.shared.keys.feed, "+", "-", 1)
                .ok()?;
            last.ids.first().map(|e| e.id.clone())
        };
        match broker.hand_off_session_settled(client, settle) {
            Some(((incarnation, messages), upto)) => {
                sessions.released(incarnation, at, &messages, upto.as_deref());
            }
            None => {
                if let Some(incarnation) = asked.and_then(|i| i.parse().ok()) {
                    sessions.asked(incarnation, at);
                }
            }
        }
    }

    /// Counts (and logs) entries trimmed after `last_id` before this reader read them,
    /// seen by the numbers of the entries read: the next read reloads the retained
    /// hash, which has the trimmed entries' changes (the entries read after it are
    /// applied again, in order).
    fn skipped(&mut self, entries: &[StreamId], last_id: &str) {
        let first = entries.first().and_then(entry_number);
        // Positioned on an empty stream (0), the counter may be further on.
        if let (true, Some(seq @ 1..), Some(first)) = (self.loaded, self.seq, first) {
            if first > seq + 1 {
                self.gap(last_id, &entries[0].id);
            }
        }
    }

    fn gap(&mut self, last_read: &str, trimmed_up_to: &str) {
        self.shared.counters.gaps.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            last_read,
            trimmed_up_to,
            "mqtt cluster reader: entries were trimmed from the stream before this node read them (mqtt_stream_len); their messages are lost for this node's subscribers, its retained messages are reloaded"
        );
        self.loaded = false;
        // This node's changes among the trimmed entries will never be read back.
        self.shared.own_retained.clear();
    }

    /// Counts (and logs) entries trimmed after `last_id` before this reader read them:
    /// the stream's largest deleted id is past it.
    fn count_gap(&mut self, con: &mut Connection, last_id: &str) -> RedisResult<()> {
        let info: Value = redis::cmd("XINFO")
            .arg("STREAM")
            .arg(&self.shared.keys.feed)
            .query(con)
            .or_else(|e| match e.kind() {
                redis::ErrorKind::ResponseError => Ok(Value::Nil),
                _ => Err(e),
            })?;
        let deleted = match info {
            Value::Array(items) => items
                .chunks_exact(2)
                .find(|kv| matches!(&kv[0], Value::BulkString(k) if k == b"max-deleted-entry-id"))
                .and_then(|kv| redis::from_redis_value::<String>(&kv[1]).ok()),
            Value::Map(items) => items
                .iter()
                .find(|(k, _)| matches!(k, Value::BulkString(k) if k == b"max-deleted-entry-id"))
                .and_then(|(_, v)| redis::from_redis_value::<String>(v).ok()),
            _ => None,
        };
        if let Some(deleted) = deleted {
            use crate::sessions::stream_id;
            if stream_id(&deleted) > stream_id(last_id) {
                self.gap(last_id, &deleted);
            }
        }
        Ok(())
    }

    fn reload_groups(&self, con: &mut Connection) -> RedisResult<()> {
        let fields: Vec<(String, Vec<u8>)> = con.hgetall(&self.shared.keys.groups)?;
        self.shared.groups.load(fields);
        Ok(())
    }

    fn malformed(&self, what: &str, e: &dyn std::fmt::Display) {
        self.shared
            .counters
            .malformed
            .fetch_add(1, Ordering::Relaxed);
        tracing::warn!("mqtt cluster: entry {what} skipped: {e}");
    }
}

/// The number an entry was appended with (`lag.rs`); entries appended otherwise
/// (a session's hand-off request) have none.
fn entry_number(entry: &StreamId) -> Option<u64> {
    match entry.map.get("q") {
        Some(Value::BulkString(b)) => std::str::from_utf8(b).ok()?.parse().ok(),
        Some(Value::Int(n)) => u64::try_from(*n).ok(),
        _ => None,
    }
}
