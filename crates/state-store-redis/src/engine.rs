//! [`Engine`] for [`RedisEngine`]: the raw reads and writes the conformance suite checks,
//! and the checked writes the machine calls, each one script.

use super::*;

/// The fields of an entry, in the order [`RedisEngine::entry`] reads them.
const FIELDS: [&str; 8] = ["v", "vw", "vc", "vn", "fw", "fc", "fn", "x"];

impl Engine for RedisEngine {
    /// With the sweep before it when one is pending (a GET): one round trip that reads
    /// the entry and whether any key is due; only if one is, a script sweeps and reads
    /// again.
    fn peek(&self, key: &[u8]) -> Result<Option<Cow<'_, Entry>>, EngineError> {
        let names = &self.names;
        let entry = names.entry(key);
        let sweep_at = self.carry.borrow().sweep_now();
        let Some(now_ms) = sweep_at else {
            let fields =
                self.call(|con| redis::cmd("HMGET").arg(&entry).arg(&FIELDS[..]).query(con))?;
            return Ok(self.entry(fields)?.map(Cow::Owned));
        };
        let (due, fields): (Vec<Vec<u8>>, Vec<Option<Vec<u8>>>) = self.call(|con| {
            redis::pipe()
                .cmd("ZRANGEBYSCORE")
                .arg(&names.exp)
                .arg("-inf")
                .arg(now_ms)
                .arg("LIMIT")
                .arg(0)
                .arg(1)
                .cmd("HMGET")
                .arg(&entry)
                .arg(&FIELDS[..])
                .query(con)
        })?;
        // The entry's own expiry too: another node may have written it, already due by
        // this node's clock, between the two reads.
        let expires = fields.get(7).and_then(Option::as_deref);
        let own_due = expires
            .map(number)
            .transpose()?
            .is_some_and(|x| x <= now_ms);
        let fields = if due.is_empty() && !own_due {
            // Nothing was due: the sweep would have removed nothing, merged nothing.
            self.carry.borrow_mut().swept(false);
            fields
        } else {
            let mut invocation = self.scripts.get.prepare_invoke();
            invocation
                .key(&entry)
                .key(&names.idx)
                .key(&names.exp)
                .key(&names.meta)
                .key(&names.events)
                .arg(key)
                .arg(self.feed_len);
            self.read_with_sweep(&mut invocation)?
        };
        Ok(self.entry(fields)?.map(Cow::Owned))
    }

    fn put(&mut self, key: &[u8], entry: Entry) -> Result<Option<Entry>, EngineError> {
        let names = &self.names;
        let version = &entry.version;
        let [fw, fc, fnode] = token_args(entry.fencing_token.as_deref());
        let x = entry
            .expires_at_ms
            .map_or_else(Vec::new, |x| x.to_string().into_bytes());
        let mut invocation = self.scripts.put.prepare_invoke();
        names
            .entry_keys(&mut invocation, key)
            .arg(key)
            .arg(entry.value.as_bytes())
            .arg(version.wall_ms)
            .arg(version.counter)
            .arg(version.node_id.as_bytes())
            .arg(fw)
            .arg(fc)
            .arg(fnode)
            .arg(x);
        let old = self.run(|con| invocation.invoke(con))?;
        self.entry(old)
    }

    fn remove(&mut self, key: &[u8]) -> Result<Option<Entry>, EngineError> {
        let names = &self.names;
        let mut invocation = self.scripts.remove.prepare_invoke();
        names.entry_keys(&mut invocation, key).arg(key);
        let old = self.run(|con| invocation.invoke(con))?;
        self.entry(old)
    }

    fn scan(&self, cursor: Option<&[u8]>, count: usize) -> Result<ScanBatch, EngineError> {
        let count = count.max(1);
        let start = match cursor {
            Some(cursor) => [&b"("[..], cursor].concat(),
            None => b"-".to_vec(),
        };
        let limit = i64::try_from(count).unwrap_or(i64::MAX - 1) + 1;
        let mut keys: Vec<Vec<u8>> = self.run(|con| {
            redis::cmd("ZRANGEBYLEX")
                .arg(&self.names.idx)
                .arg(start)
                .arg("+")
                .arg("LIMIT")
                .arg(0)
                .arg(limit)
                .query(con)
        })?;
        let more = keys.len() > count;
        keys.truncate(count);
        let keys: Vec<Bytes> = keys.into_iter().map(Bytes::from).collect();
        let cursor = if more { keys.last().cloned() } else { None };
        Ok(ScanBatch { keys, cursor })
    }

    fn next_expiry(&self) -> Result<Option<u64>, EngineError> {
        let first: Vec<(Vec<u8>, f64)> = self.run(|con| {
            redis::cmd("ZRANGE")
                .arg(&self.names.exp)
                .arg(0)
                .arg(0)
                .arg("WITHSCORES")
                .query(con)
        })?;
        let Some((key, score)) = first.into_iter().next() else {
            return Ok(None);
        };
        // A score is a double: exact below 2^53, and beyond that the entry's own field is.
        if score < 9_007_199_254_740_992.0 {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            return Ok(Some(score as u64));
        }
        let exact: Option<Vec<u8>> = self.run(|con| {
            redis::cmd("HGET")
                .arg(self.names.entry(&key))
                .arg("x")
                .query(con)
        })?;
        Ok(Some(
            exact
                .as_deref()
                .map(number)
                .transpose()?
                .unwrap_or(u64::MAX),
        ))
    }

    fn expired(&self, now_ms: u64, limit: usize) -> Result<Vec<Bytes>, EngineError> {
        let limit = i64::try_from(limit).unwrap_or(-1);
        let keys: Vec<Vec<u8>> = self.run(|con| {
            redis::cmd("ZRANGEBYSCORE")
                .arg(&self.names.exp)
                .arg("-inf")
                .arg(now_ms)
                .arg("LIMIT")
                .arg(0)
                .arg(limit)
                .query(con)
        })?;
        Ok(keys.into_iter().map(Bytes::from).collect())
    }

    fn stats(&self) -> Stats {
        let read: Result<(Option<u64>, Option<u64>), EngineError> = self.run(|con| {
            redis::cmd("HMGET")
                .arg(&self.names.meta)
                .arg("keys")
                .arg("bytes")
                .query(con)
        });
        match read {
            Ok((keys, bytes)) => {
                let stats = Stats {
                    keys: keys.unwrap_or(0),
                    bytes: bytes.unwrap_or(0),
                };
                self.stats.set(stats);
                stats
            }
            Err(error) => {
                tracing::debug!(%error, "state store stats: redis unavailable, last known");
                self.stats.get()
            }
        }
    }

    fn max_version(&self) -> Result<Option<Hlc>, EngineError> {
        let (wall, counter): (Option<Vec<u8>>, Option<Vec<u8>>) = self.run(|con| {
            redis::cmd("HMGET")
                .arg(&self.names.meta)
                .arg("cw")
                .arg("cc")
                .query(con)
        })?;
        match (wall, counter) {
            (Some(wall), Some(counter)) => Ok(Some(self.hlc(&wall, &counter, None)?)),
            _ => Ok(None),
        }
    }

    fn max_key_len(&self) -> usize {
        MAX_KEY_LEN
    }

    /// Every write is done when its script returns (what Redis then keeps through a
    /// crash is its own persistence's business). What a reply waits for instead is this
    /// node's change feed: the number of the last change the call fed, if it fed one, so
    /// that the node's own observers are notified before the writer hears back (see
    /// [`RedisEngine::written`]).
    /// A sweep no command of the call carried (a request refused before reaching the
    /// engine, an expiry run) runs here, on its own.
    fn seal(&mut self, _clock: &HlcClock) -> Result<Option<WriteSeq>, EngineError> {
        if self.carry.get_mut().sweep_pending() {
            self.sweep()?;
        }
        Ok(self.carry.get_mut().take_fed())
    }

    fn observe_request(&mut self, _clock: &mut HlcClock, stamp: Option<Stamp>, now_ms: u64) {
        if let Some(stamp) = stamp {
            self.carry.get_mut().queue(stamp, now_ms);
        }
    }

    /// Carried into the call's first command (see `carry.rs`): the sweep's removals and
    /// notifications are the machine's, fed like every change.
    fn carry_sweep(&mut self, now_ms: u64, limit: usize) -> bool {
        self.carry.get_mut().sweep_at(now_ms, limit);
        true
    }

    fn set_checked(
        &mut self,
        _clock: &mut HlcClock,
        request: &SetRequest<'_>,
        limits: &Limits,
    ) -> Result<SetOutcome, EngineError> {
        let reply = self.write(self.set_invocation(request, limits))?;
        self.set_outcome(&reply)
    }

    fn delete_checked(
        &mut self,
        _clock: &mut HlcClock,
        key: &[u8],
        expected: Option<&[u8]>,
        fencing_token: Option<&Hlc>,
        now_ms: u64,
    ) -> Result<DelOutcome, EngineError> {
        let invocation = self.delete_invocation(key, expected, fencing_token, now_ms);
        let reply = self.write(invocation)?;
        self.delete_outcome(&reply)
    }

    fn remove_expired(
        &mut self,
        _clock: &mut HlcClock,
        key: &Bytes,
        now_ms: u64,
    ) -> Result<Option<Hlc>, EngineError> {
        let (now, feed_len) = (now_ms.to_string(), self.feed_len.to_string());
        let invocation = self.write_invocation(
            &self.scripts.expire,
            key,
            &[key, now.as_bytes(), feed_len.as_bytes()],
        );
        let reply = self.write(invocation)?;
        match reply.as_slice() {
            [] => Ok(None),
            [wall, counter, fed] => {
                self.carry.get_mut().note_fed(number(fed)?);
                Ok(Some(self.hlc(wall, counter, None)?))
            }
            _ => Err(corrupt("expiry script reply")),
        }
    }

    fn publishes_changes(&self) -> bool {
        true
    }

    fn queue(&mut self, op: &statehub_state_store::Op) -> bool {
        self.queue_op(op)
    }

    fn run_queued(&mut self) -> Vec<Result<statehub_state_store::OpOutcome, EngineError>> {
        self.run_pipeline()
    }

    fn observe_key(&mut self, key: &[u8]) -> Result<u64, EngineError> {
        let mut invocation = self.scripts.observe.prepare_invoke();
        invocation
            .key(self.names.observers(key))
            .key(&self.names.meta)
            .arg(&self.node);
        self.run(|con| invocation.invoke(con))
    }

    fn forget_key(&mut self, key: &[u8]) -> Result<(), EngineError> {
        self.run(|con| {
            redis::cmd("SREM")
                .arg(self.names.observers(key))
                .arg(&self.node)
                .query(con)
        })
    }
}

impl RedisEngine {
    /// The SET script's invocation, before the sweep and stamps.
    pub(crate) fn set_invocation(
        &self,
        request: &SetRequest<'_>,
        limits: &Limits,
    ) -> redis::ScriptInvocation<'_> {
        let condition: &[u8] = match request.condition {
            SetCondition::Always => b"A",
            SetCondition::IfAbsent => b"N",
            SetCondition::IfAbsentOrEqual => b"E",
        };
        let x = request
            .expires_at_ms()
            .map_or_else(Vec::new, |x| x.to_string().into_bytes());
        let [fw, fc, fnode] = token_args(request.fencing_token);
        let numbers = [
            request.now_ms.to_string(),
            limits.max_keys.to_string(),
            limits.max_bytes.to_string(),
            limits.max_key_len.min(MAX_KEY_LEN).to_string(),
            limits.max_value_bytes.to_string(),
            self.feed_len.to_string(),
        ];
        self.write_invocation(
            &self.scripts.set,
            request.key,
            &[
                request.key,
                request.value,
                condition,
                &x,
                &fw,
                &fc,
                &fnode,
                numbers[0].as_bytes(),
                numbers[1].as_bytes(),
                numbers[2].as_bytes(),
                numbers[3].as_bytes(),
                numbers[4].as_bytes(),
                self.version_node.as_bytes(),
                numbers[5].as_bytes(),
            ],
        )
    }

    /// The SET script's reply (after the sweep's two fields) as its outcome.
    pub(crate) fn set_outcome(&self, reply: &[Vec<u8>]) -> Result<SetOutcome, EngineError> {
        match reply.first().map(Vec::as_slice) {
            Some(b"W") => Ok(SetOutcome::Written(self.written(reply)?)),
            Some(b"K") => Ok(SetOutcome::Kept(self.versioned(reply)?)),
            Some(b"R") if reply.len() == 2 => Ok(SetOutcome::Refused(refusal(&reply[1])?)),
            _ => Err(corrupt("SET script reply")),
        }
    }

    /// The DEL (VDEL with `expected`) script's invocation, before the sweep and stamps.
    pub(crate) fn delete_invocation(
        &self,
        key: &[u8],
        expected: Option<&[u8]>,
        fencing_token: Option<&Hlc>,
        now_ms: u64,
    ) -> redis::ScriptInvocation<'_> {
        let [fw, fc, fnode] = token_args(fencing_token);
        let (now, feed_len) = (now_ms.to_string(), self.feed_len.to_string());
        self.write_invocation(
            &self.scripts.delete,
            key,
            &[
                key,
                if expected.is_some() { b"1" } else { b"0" },
                expected.unwrap_or_default(),
                &fw,
                &fc,
                &fnode,
                now.as_bytes(),
                feed_len.as_bytes(),
            ],
        )
    }

    /// The DEL script's reply (after the sweep's two fields) as its outcome.
    pub(crate) fn delete_outcome(&self, reply: &[Vec<u8>]) -> Result<DelOutcome, EngineError> {
        match reply.first().map(Vec::as_slice) {
            Some(b"A") => Ok(DelOutcome::Absent),
            Some(b"D") => Ok(DelOutcome::Deleted(self.written(reply)?)),
            Some(b"K") => Ok(DelOutcome::Kept(self.versioned(reply)?)),
            Some(b"R") if reply.len() == 2 => Ok(DelOutcome::Refused(refusal(&reply[1])?)),
            _ => Err(corrupt("DEL script reply")),
        }
    }
}
