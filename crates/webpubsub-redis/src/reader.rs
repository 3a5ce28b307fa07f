//! The reader thread: every other node's operations, in stream order, applied to this
//! node's sessions once each.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::mpsc::SyncSender;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::streams::{StreamId, StreamRangeReply, StreamReadOptions, StreamReadReply};
use redis::{Client, Commands, Connection, Value};
use statehub_webpubsub::WebPubSub;
use tokio::runtime::Handle;

use crate::session::stream_id;
use crate::streams::is_fenced;
use crate::{lock, open, ClaimRecord, Job, Names, Options, Shared, WpsRedisError, BACKOFF};

/// How long one read blocks, so that a stop is seen this often.
const BLOCK: Duration = Duration::from_millis(500);
/// Most entries one read takes.
const BATCH: usize = 256;

pub(crate) struct Reader {
    client: Client,
    names: Names,
    shared: Arc<Shared>,
    node: String,
    timeout: Duration,
    /// The id of the last entry read; `None` until positioned at the stream's end.
    last_id: Option<String>,
    /// Per node: its incarnation and the last sequence number applied.
    seen: HashMap<String, (String, u64)>,
    /// Where the writer hears of this reader's position.
    jobs: SyncSender<Job>,
}

/// One entry's fields.
struct Entry {
    node: String,
    incarnation: String,
    seq: u64,
    op: Vec<u8>,
}

impl Reader {
    pub(crate) fn new(
        options: &Options,
        client: Client,
        names: Names,
        shared: Arc<Shared>,
        jobs: SyncSender<Job>,
    ) -> Self {
        Self {
            client,
            names,
            shared,
            node: options.node.clone(),
            timeout: options.timeout,
            last_id: None,
            seen: HashMap::new(),
            jobs,
        }
    }

    pub(crate) fn spawn(
        mut self,
        service: WebPubSub,
        runtime: Handle,
    ) -> Result<(), WpsRedisError> {
        // Positioned before any client connects, when Redis is up, so nothing is missed.
        if let Ok(mut con) = open(&self.client, self.timeout) {
            let _ = self.position(&mut con);
        }
        std::thread::Builder::new()
            .name("wps-cluster-reader".into())
            .spawn(move || self.run(&service, &runtime))?;
        Ok(())
    }

    fn run(mut self, service: &WebPubSub, runtime: &Handle) {
        let mut con: Option<Connection> = None;
        let mut logged_down = false;
        while !self.shared.stop.load(Ordering::Relaxed)
            && !self.shared.leaving.load(Ordering::Relaxed)
        {
            let c = match con.as_mut() {
                Some(c) => c,
                None => match open(&self.client, self.timeout + BLOCK) {
                    Ok(c) => con.insert(c),
                    Err(error) => {
                        if !logged_down {
                            tracing::warn!(%error, "web pubsub cluster reader: redis unreachable; retrying");
                            logged_down = true;
                        }
                        std::thread::sleep(BACKOFF);
                        continue;
                    }
                },
            };
            match self.read(c, service, runtime) {
                Ok(()) => logged_down = false,
                Err(error) => {
                    self.shared
                        .counters
                        .read_errors
                        .fetch_add(1, Ordering::Relaxed);
                    if !logged_down {
                        tracing::warn!(%error, "web pubsub cluster reader: read failed; reconnecting");
                        logged_down = true;
                    }
                    con = None;
                    std::thread::sleep(BACKOFF);
                }
            }
        }
        self.shared.reader_stopped.store(true, Ordering::Relaxed);
    }

    fn position(&mut self, con: &mut Connection) -> Result<(), WpsRedisError> {
        if self.last_id.is_none() {
            let last: StreamRangeReply = con.xrevrange_count(&self.names.ops, "+", "-", 1)?;
            let id = last
                .ids
                .first()
                .map_or_else(|| "0-0".to_owned(), |e| e.id.clone());
            let _ = self.jobs.try_send(Job::Position(id.clone()));
            self.last_id = Some(id);
        }
        Ok(())
    }

    fn read(
        &mut self,
        con: &mut Connection,
        service: &WebPubSub,
        runtime: &Handle,
    ) -> Result<(), WpsRedisError> {
        self.position(con)?;
        let last_id = self.last_id.clone().unwrap_or_else(|| "0-0".to_owned());
        let options = StreamReadOptions::default()
            .block(usize::try_from(BLOCK.as_millis()).unwrap_or(usize::MAX))
            .count(BATCH);
        let reply: Option<StreamReadReply> =
            con.xread_options(&[&self.names.ops], &[&last_id], &options)?;
        let _runtime = runtime.enter();
        let (mut moved, mut own) = (false, None);
        let keys = reply.map(|r| r.keys).unwrap_or_default();
        let read: usize = keys.iter().map(|k| k.ids.len()).sum();
        let lag = match keys.last().and_then(|k| k.ids.last()) {
            Some(last) if read >= BATCH => statehub_redis_common::stream_age_ms(&last.id),
            _ => 0,
        };
        let lag_ms = &self.shared.counters.reader_lag_ms;
        lag_ms.store(lag, Ordering::Relaxed);
        for key in keys {
            for entry in key.ids {
                let id = entry.id.clone();
                let at = stream_id(&id).unwrap_or_default();
                let entry = parse(&entry)?;
                if entry.node != self.node {
                    // A fenced fragment's entry counts for its number only.
                    if self.fresh(&entry) && !is_fenced(&entry.op) {
                        service.apply_remote(&entry.op, at);
                    }
                } else if entry.incarnation == self.shared.incarnation.to_string() {
                    service.answer_own(&entry.op);
                    self.own(con, service, &id, &entry)?;
                    own = Some(entry.seq);
                }
                self.last_id = Some(id);
                self.shared
                    .counters
                    .entries_read
                    .fetch_add(1, Ordering::Relaxed);
                moved = true;
            }
        }
        if moved {
            // The position is queued after the mirror's writes of everything up to it:
            // what the reader applied is queued already; what this node's own sends
            // delivered here, once they have all delivered.
            if let Some(through) = own {
                service.settled(through);
            }
            if let Some(id) = &self.last_id {
                let _ = self.jobs.try_send(Job::Position(id.clone()));
            }
        }
        Ok(())
    }

    /// This node's own entry `id`: if a claim's marker, the session is taken over here
    /// now.
    fn own(
        &mut self,
        con: &mut Connection,
        service: &WebPubSub,
        id: &str,
        entry: &Entry,
    ) -> Result<(), WpsRedisError> {
        if let Some(record) = self.wait_for_claim(entry.seq) {
            let served = self.restore(con, service, id, entry.seq, record);
            self.shared.claim_served();
            return served;
        }
        Ok(())
    }

    /// The claim whose marker has number `seq`, once the writer has its answer.
    fn wait_for_claim(&self, seq: u64) -> Option<ClaimRecord> {
        let deadline = Instant::now() + self.timeout * 2;
        loop {
            let mut claims = lock(&self.shared.claims);
            match claims.get(&seq) {
                None => return None,
                Some(Some(_)) => return claims.remove(&seq).flatten(),
                Some(None) if Instant::now() >= deadline => {
                    claims.remove(&seq);
                    return None;
                }
                Some(None) => {}
            }
            drop(claims);
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Serves a claim at its marker `id`: the operations between what the stored
    /// session reflects and the marker are replayed to it, then it is reachable here.
    fn restore(
        &mut self,
        con: &mut Connection,
        service: &WebPubSub,
        marker: &str,
        claim: u64,
        record: ClaimRecord,
    ) -> Result<(), WpsRedisError> {
        let c = record.claimed;
        let (hub, id) = (c.restored.hub.clone(), c.restored.id.clone());
        let from = format!("{}-{}", c.from.0, c.from.1);
        if self.trimmed_after(con, c.from)? {
            service.restore_failed(
                &hub,
                &id,
                "messages for it were trimmed from the cluster's stream before another node could take it over",
            );
            return Ok(());
        }
        let mut replay = Vec::new();
        let mut start = format!("({from}");
        loop {
            let page: StreamRangeReply =
                con.xrange_count(&self.names.ops, &start, format!("({marker}"), 1000)?;
            let Some(last) = page.ids.last() else { break };
            start = format!("({}", last.id);
            for e in &page.ids {
                let entry = parse(e)?;
                let owner = format!("{}:{}", entry.node, entry.incarnation);
                if owner == c.old_owner && entry.seq <= c.own_through || is_fenced(&entry.op) {
                    continue;
                }
                replay.push((stream_id(&e.id).unwrap_or_default(), entry.op));
            }
        }
        tracing::debug!(
            hub,
            id,
            replay = replay.len(),
            from,
            "web pubsub cluster: restoring a claimed session"
        );
        service.restore(c.restored, replay, claim);
        Ok(())
    }

    /// Whether the stream dropped any entry after `from`.
    fn trimmed_after(&self, con: &mut Connection, from: (u64, u64)) -> Result<bool, WpsRedisError> {
        let info: Value = redis::cmd("XINFO")
            .arg("STREAM")
            .arg(&self.names.ops)
            .query(con)?;
        let Value::Array(fields) = info else {
            return Ok(false);
        };
        for pair in fields.chunks(2) {
            if let [Value::BulkString(k), Value::BulkString(v)] = pair {
                if k == b"max-deleted-entry-id" {
                    let deleted = std::str::from_utf8(v).ok().and_then(stream_id);
                    return Ok(deleted.is_some_and(|d| d > from));
                }
            }
        }
        Ok(false)
    }

    /// Whether the entry is new (not one written twice), counting any gap before it.
    fn fresh(&mut self, entry: &Entry) -> bool {
        match self.seen.get_mut(&entry.node) {
            Some((incarnation, last)) if *incarnation == entry.incarnation => {
                if entry.seq <= *last {
                    return false;
                }
                if entry.seq > *last + 1 {
                    let missed = entry.seq - *last - 1;
                    self.shared.lost.fetch_add(missed, Ordering::Relaxed);
                    tracing::warn!(
                        missed,
                        node = entry.node,
                        "web pubsub cluster: operations trimmed before this node read them"
                    );
                }
                *last = entry.seq;
            }
            _ => {
                self.seen
                    .insert(entry.node.clone(), (entry.incarnation.clone(), entry.seq));
            }
        }
        true
    }
}

fn parse(entry: &StreamId) -> Result<Entry, WpsRedisError> {
    let field = |name: &str| match entry.map.get(name) {
        Some(Value::BulkString(bytes)) => Ok(bytes.clone()),
        _ => Err(WpsRedisError::Corrupt("operation entry")),
    };
    let text = |name: &str| {
        String::from_utf8(field(name)?).map_err(|_| WpsRedisError::Corrupt("operation entry"))
    };
    Ok(Entry {
        node: text("n")?,
        incarnation: text("r")?,
        seq: text("s")?
            .parse()
            .map_err(|_| WpsRedisError::Corrupt("operation sequence"))?,
        op: field("o")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reader() -> Reader {
        let options = Options {
            url: "redis://127.0.0.1:1".into(),
            namespace: "t".into(),
            node: "me".into(),
            timeout: Duration::from_secs(1),
            stream_len: 10,
            queue: 10,
            wait: None,
        };
        let client = Client::open(options.url.as_str()).expect("a valid url");
        let (jobs, _queue) = std::sync::mpsc::sync_channel(1);
        Reader::new(&options, client, Names::new("t"), Arc::default(), jobs)
    }

    fn entry(node: &str, incarnation: &str, seq: u64) -> Entry {
        Entry {
            node: node.into(),
            incarnation: incarnation.into(),
            seq,
            op: Vec::new(),
        }
    }

    #[test]
    fn an_entry_written_twice_is_applied_once_and_a_gap_is_counted() {
        let mut r = reader();
        assert!(r.fresh(&entry("b", "1", 1)));
        assert!(r.fresh(&entry("b", "1", 2)));
        assert!(
            !r.fresh(&entry("b", "1", 2)),
            "a retried write's second copy"
        );
        assert!(
            r.fresh(&entry("c", "9", 7)),
            "another node's numbering is its own"
        );
        assert_eq!(r.shared.lost.load(Ordering::Relaxed), 0);
        assert!(r.fresh(&entry("b", "1", 5)));
        assert_eq!(r.shared.lost.load(Ordering::Relaxed), 2, "3 and 4 trimmed");
        assert!(
            r.fresh(&entry("b", "2", 1)),
            "a restarted node starts again"
        );
    }
}
