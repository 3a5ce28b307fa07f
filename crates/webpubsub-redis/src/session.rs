//! Reliable sessions in Redis (the webpubsub crate's `mirror.rs` says why and what):
//! per session a hash `{ns}:wps:s:{hub}:{id}` (epoch, owner, token digest, subprotocol,
//! user, roles (its permissions, once a grant or revoke changed them), groups, sequence
//! state, the last operation it reflects, the upstream's `ce-connectionState`, per open
//! client stream `sq:{streamId}` its next expected id and idle deadline and
//! `sm:{streamId}` its group and options), a stream `…:f` of the frames its replay
//! buffer holds (entry id = sequence id, trimmed as the buffer is) and a list `…:a` of
//! its last processed ackIds. Every write but the creation is one script call that
//! first checks the epoch: a node that lost the session to a claim writes nothing
//! more. All three keys expire with the session's retention unless the owner
//! refreshes them.

use redis::{Script, Value};
use statehub_webpubsub::{Provenance, Restored, SessionWrite};

use crate::streams::{next_expected, streams, StreamMeta};

use crate::WpsRedisError;

/// The session's writes. KEYS: hash, frames, acks (and for a fragment the operations
/// stream). ARGV: epoch, ttl (ms), kind, ….
const WRITE: &str = r"
local kind = ARGV[3]
if kind == 'fragment' or kind == 'sent' then
  -- A client stream's fragment (or end): the operation into the stream and the
  -- stream's next expected id (0: its removal) into the session, in one call, if this
  -- node still owns the session; a client's send ('sent') with its ackId (ARGV[4], the
  -- list keeping ARGV[5]) likewise. If not (claimed elsewhere), neither: the entry
  -- keeps only the operation's number, with no operation, so that readers count no gap.
  if (kind == 'sent' or ARGV[4] ~= '') and redis.call('HGET', KEYS[1], 'ep') ~= ARGV[1] then
    redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[6], '*', 'n', ARGV[7], 'r', ARGV[8],
      's', ARGV[9], 'o', '')
    return 0
  end
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[6], '*', 'n', ARGV[7], 'r', ARGV[8],
    's', ARGV[9], 'o', ARGV[10])
  if kind == 'sent' then
    redis.call('RPUSH', KEYS[3], ARGV[4])
    redis.call('LTRIM', KEYS[3], -tonumber(ARGV[5]), -1)
    redis.call('PEXPIRE', KEYS[3], ARGV[2])
    return 1
  end
  if ARGV[4] == '' then return 1 end
  if ARGV[5] == '0' then
    redis.call('HDEL', KEYS[1], 'sq:' .. ARGV[4], 'sm:' .. ARGV[4])
  else
    redis.call('HSET', KEYS[1], 'sq:' .. ARGV[4], ARGV[5])
  end
  return 1
end
if kind == 'open' then
  redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
  redis.call('HSET', KEYS[1], 'ep', '1', 'tok', ARGV[4], 'pro', ARGV[5], 'rol', ARGV[6],
    'grp', '[]', 'nxt', '1', 'akd', '0', 'evt', '0', 'own', ARGV[7], 'o', ARGV[8], 'lo', '0')
  if ARGV[9] ~= '' then redis.call('HSET', KEYS[1], 'usr', ARGV[10]) end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if redis.call('HGET', KEYS[1], 'ep') ~= ARGV[1] then return 0 end
if kind == 'frame' then
  -- Frames in order, five arguments each: sequence id, bytes, deadline, provenance.
  local h = redis.call('HMGET', KEYS[1], 'nxt', 'o', 'lo')
  local nxt, o, lo = tonumber(h[1] or '1'), h[2] or '0-0', tonumber(h[3] or '0')
  local o1, o2 = string.match(o, '(%d+)-(%d+)')
  o1, o2 = tonumber(o1 or '0'), tonumber(o2 or '0')
  for i = 4, #ARGV, 5 do
    local seq = tonumber(ARGV[i])
    if seq >= nxt then
      redis.call('XADD', KEYS[2], ARGV[i] .. '-0', 'f', ARGV[i + 1], 'd', ARGV[i + 2])
      nxt = seq + 1
    end
    if ARGV[i + 3] == 's' then
      local a1, a2 = string.match(ARGV[i + 4], '(%d+)-(%d+)')
      a1, a2 = tonumber(a1), tonumber(a2)
      if a1 > o1 or (a1 == o1 and a2 > o2) then o1, o2 = a1, a2 end
    elseif ARGV[i + 3] == 'w' then
      local w = tonumber(ARGV[i + 4])
      if w > lo then lo = w end
    end
  end
  redis.call('HSET', KEYS[1], 'nxt', string.format('%d', nxt), 'o',
    string.format('%d-%d', o1, o2), 'lo', string.format('%d', lo))
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
elseif kind == 'trim' then
  redis.call('XTRIM', KEYS[2], 'MINID', ARGV[4] .. '-0')
  redis.call('HSET', KEYS[1], 'akd', ARGV[5], 'evt', ARGV[6])
elseif kind == 'groups' then
  redis.call('HSET', KEYS[1], 'grp', ARGV[4])
elseif kind == 'roles' then
  redis.call('HSET', KEYS[1], 'rol', ARGV[4])
elseif kind == 'state' then
  redis.call('HSET', KEYS[1], 'cst', ARGV[4])
elseif kind == 'stream' then
  -- A client stream: its next expected id, and when it opens its group and options.
  redis.call('HSET', KEYS[1], 'sq:' .. ARGV[4], ARGV[5])
  if ARGV[6] ~= '' then redis.call('HSET', KEYS[1], 'sm:' .. ARGV[4], ARGV[6]) end
elseif kind == 'unstream' then
  redis.call('HDEL', KEYS[1], 'sq:' .. ARGV[4], 'sm:' .. ARGV[4])
elseif kind == 'ack' then
  redis.call('RPUSH', KEYS[3], ARGV[4])
  redis.call('LTRIM', KEYS[3], -tonumber(ARGV[5]), -1)
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
elseif kind == 'lost' then
  redis.call('HSET', KEYS[1], 'lost', '1')
elseif kind == 'delete' then
  redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
end
return 1
";

/// The claim. KEYS: hash, frames, acks, operations stream. ARGV: token digest,
/// subprotocol, new owner, ttl (ms), node, incarnation, sequence number, marker,
/// stream length, the position keys' prefix.
const CLAIM: &str = r"
if redis.call('EXISTS', KEYS[1]) == 0 then return {'gone'} end
local f = redis.call('HMGET', KEYS[1], 'tok', 'pro', 'lost', 'ep', 'own', 'o', 'lo',
  'usr', 'rol', 'grp', 'nxt', 'akd', 'evt', 'cst')
if f[1] ~= ARGV[1] or f[2] ~= ARGV[2] then return {'gone'} end
if f[3] == '1' then return {'lost'} end
local pos = redis.call('GET', ARGV[10] .. (f[5] or '')) or ''
local k = redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[9], '*', 'n', ARGV[5], 'r', ARGV[6],
  's', ARGV[7], 'o', ARGV[8])
local ep = tonumber(f[4]) + 1
redis.call('HSET', KEYS[1], 'ep', ep, 'own', ARGV[3], 'lo', '0')
for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], ARGV[4]) end
local st, all = {}, redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local p = string.sub(all[i], 1, 3)
  if p == 'sq:' or p == 'sm:' then st[#st + 1] = all[i]; st[#st + 1] = all[i + 1] end
end
return {'ok', tostring(ep), k, f[5] or '', f[6] or '0-0', f[7] or '0', pos, f[8] or '',
  f[9] or '[]', f[10] or '[]', f[11] or '1', f[12] or '0', f[13] or '0',
  redis.call('XRANGE', KEYS[2], '-', '+'), redis.call('LRANGE', KEYS[3], 0, -1),
  f[14] or false, st}
";

/// The scripts, hashed once.
#[derive(Debug)]
pub(crate) struct Scripts {
    pub(crate) write: Script,
    pub(crate) claim: Script,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Self {
            write: Script::new(WRITE),
            claim: Script::new(CLAIM),
        }
    }

    /// Loads both (after every new connection, so `EVALSHA` in a pipeline finds them).
    pub(crate) fn load(&self, con: &mut redis::Connection) -> redis::RedisResult<()> {
        redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(WRITE)
            .query::<String>(con)?;
        redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(CLAIM)
            .query::<String>(con)?;
        Ok(())
    }
}

/// A session's three keys.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    pub(crate) hash: String,
    pub(crate) frames: String,
    pub(crate) acks: String,
}

impl Keys {
    pub(crate) fn new(prefix: &str, hub: &str, id: &str) -> Self {
        let hash = format!("{prefix}s:{hub}:{id}");
        Self {
            frames: format!("{hash}:f"),
            acks: format!("{hash}:a"),
            hash,
        }
    }

    pub(crate) fn all(&self) -> [&str; 3] {
        [&self.hash, &self.frames, &self.acks]
    }
}

/// Adds one write to `pipe` (`epoch`: the session's, as this node holds it; `owner`
/// and `position`: this node and its reader's last position, for a creation).
pub(crate) fn add_write(
    pipe: &mut redis::Pipeline,
    scripts: &Scripts,
    keys: &Keys,
    (epoch, ttl_ms): (u64, u64),
    write: &SessionWrite,
    (owner, position): (&str, &str),
) {
    let mut cmd = write_call(scripts, keys, (epoch, ttl_ms));
    match write {
        SessionWrite::Open {
            token,
            protocol,
            user,
            roles,
        } => {
            cmd.arg("open")
                .arg(token)
                .arg(protocol)
                .arg(json_list(roles))
                .arg(owner)
                .arg(position)
                .arg(if user.is_some() { "1" } else { "" })
                .arg(user.as_deref().unwrap_or_default());
        }
        SessionWrite::Frame { .. } => {
            cmd.arg("frame");
            add_frame(&mut cmd, write);
        }
        SessionWrite::Trim {
            first,
            acked,
            evicted_through,
        } => {
            cmd.arg("trim")
                .arg(*first)
                .arg(*acked)
                .arg(*evicted_through);
        }
        SessionWrite::Groups(groups) => {
            cmd.arg("groups").arg(json_list(groups));
        }
        SessionWrite::Roles(roles) => {
            cmd.arg("roles").arg(json_list(roles));
        }
        SessionWrite::Ack { ack_id, keep } => {
            cmd.arg("ack").arg(*ack_id).arg(*keep);
        }
        SessionWrite::State(state) => {
            cmd.arg("state").arg(state);
        }
        SessionWrite::StreamOpened(_)
        | SessionWrite::StreamAccepted { .. }
        | SessionWrite::StreamClosed(_) => add_stream(&mut cmd, write),
        SessionWrite::Delete => {
            cmd.arg("delete");
        }
    }
    pipe.add_command(cmd).ignore();
}

/// A call of the session's write script on its three keys, before the write's kind and
/// arguments.
fn write_call(scripts: &Scripts, keys: &Keys, (epoch, ttl_ms): (u64, u64)) -> redis::Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(scripts.write.get_hash())
        .arg(3)
        .arg(&keys.all()[..])
        .arg(epoch)
        .arg(ttl_ms);
    cmd
}

/// Groups or roles as the session's hash keeps them: a JSON array.
fn json_list(list: &[String]) -> String {
    serde_json::to_string(list).unwrap_or_else(|_| "[]".into())
}

/// A client stream's change: its next expected id and idle deadline, with its group
/// and options when it opens; its removal when it closes.
fn add_stream(cmd: &mut redis::Cmd, write: &SessionWrite) {
    match write {
        SessionWrite::StreamOpened(stream) => {
            let meta = StreamMeta {
                group: stream.group.clone(),
                no_echo: stream.no_echo,
                idle_ms: stream.idle_ms,
            };
            cmd.arg("stream")
                .arg(&stream.id)
                .arg(next_expected(stream.expected, stream.deadline_ms))
                .arg(meta.encode());
        }
        SessionWrite::StreamAccepted {
            id,
            expected,
            deadline_ms,
        } => {
            cmd.arg("stream")
                .arg(id)
                .arg(next_expected(*expected, *deadline_ms))
                .arg("");
        }
        SessionWrite::StreamClosed(id) => {
            cmd.arg("unstream").arg(id);
        }
        _ => {}
    }
}

/// Adds a session's consecutive frames to `pipe` as one script call.
pub(crate) fn add_frames(
    pipe: &mut redis::Pipeline,
    scripts: &Scripts,
    keys: &Keys,
    (epoch, ttl_ms): (u64, u64),
    frames: &[&SessionWrite],
) {
    let mut cmd = write_call(scripts, keys, (epoch, ttl_ms));
    cmd.arg("frame");
    for frame in frames {
        add_frame(&mut cmd, frame);
    }
    pipe.add_command(cmd).ignore();
}

fn add_frame(cmd: &mut redis::Cmd, write: &SessionWrite) {
    let SessionWrite::Frame {
        seq,
        frame,
        deadline_ms,
        from,
    } = write
    else {
        return;
    };
    let (kind, value) = match from {
        Provenance::Stream(ms, n) => ("s", format!("{ms}-{n}")),
        Provenance::Own(n) => ("w", n.to_string()),
        Provenance::Unknown => ("", String::new()),
    };
    cmd.arg(*seq)
        .arg(frame.as_slice())
        .arg(*deadline_ms)
        .arg(kind)
        .arg(value);
}

/// Marks a session whose writes could not all be queued: no other node may serve it.
pub(crate) fn add_lost(pipe: &mut redis::Pipeline, scripts: &Scripts, keys: &Keys, epoch: u64) {
    let mut cmd = write_call(scripts, keys, (epoch, 0));
    cmd.arg("lost");
    pipe.add_command(cmd).ignore();
}

/// What a successful claim returned.
#[derive(Debug)]
pub(crate) struct Claimed {
    pub(crate) epoch: u64,
    /// The previous owner (`node:incarnation`) and the last of its own operations it
    /// delivered to the session.
    pub(crate) old_owner: String,
    pub(crate) own_through: u64,
    /// The last stream entry the stored session reflects.
    pub(crate) from: (u64, u64),
    pub(crate) restored: Restored,
}

/// A claim's outcome: `Ok(None)` when the session is gone, `Err` with the reason
/// when it cannot be served.
pub(crate) fn parse_claim(
    value: Value,
    hub: &str,
    id: &str,
) -> Result<Result<Option<Claimed>, &'static str>, WpsRedisError> {
    let corrupt = || WpsRedisError::Corrupt("claim reply");
    let Value::Array(items) = value else {
        return Err(corrupt());
    };
    let text = |v: &Value| -> Result<String, WpsRedisError> {
        match v {
            Value::BulkString(b) => String::from_utf8(b.clone()).map_err(|_| corrupt()),
            Value::SimpleString(s) => Ok(s.clone()),
            Value::Int(i) => Ok(i.to_string()),
            Value::Nil => Ok(String::new()),
            _ => Err(corrupt()),
        }
    };
    let head = items.first().map(&text).transpose()?.unwrap_or_default();
    match head.as_str() {
        "gone" => return Ok(Ok(None)),
        "lost" => return Ok(Err("messages for it could not be kept for other nodes")),
        "ok" if items.len() == 17 => {}
        _ => return Err(corrupt()),
    }
    let t = |i: usize| text(&items[i]);
    let n = |i: usize| -> Result<u64, WpsRedisError> { t(i)?.parse().map_err(|_| corrupt()) };
    let list = |i: usize| -> Vec<String> {
        serde_json::from_str(&t(i).unwrap_or_default()).unwrap_or_default()
    };
    let o = stream_id(&t(4)?).unwrap_or((0, 0));
    let pos = stream_id(&t(6)?).unwrap_or((0, 0));
    let user = t(7)?;
    let mut frames = Vec::new();
    if let Value::Array(entries) = &items[13] {
        for e in entries {
            frames.push(frame(e).ok_or_else(corrupt)?);
        }
    }
    let mut acks = Vec::new();
    if let Value::Array(ids) = &items[14] {
        for a in ids {
            acks.push(text(a)?.parse().map_err(|_| corrupt())?);
        }
    }
    Ok(Ok(Some(Claimed {
        epoch: n(1)?,
        old_owner: t(3)?,
        own_through: n(5)?,
        from: o.max(pos),
        restored: Restored {
            hub: hub.to_owned(),
            id: id.to_owned(),
            token: String::new(),
            protocol: String::new(),
            user: (!user.is_empty()).then_some(user),
            roles: list(8),
            groups: list(9),
            acks,
            next: n(10)?,
            acked: n(11)?,
            evicted_through: n(12)?,
            frames,
            connection_state: match &items[15] {
                Value::Nil => None,
                v => Some(text(v)?),
            },
            streams: streams(&items[16]).ok_or_else(corrupt)?,
        },
    })))
}

/// One stored frame: `[id, [f, bytes, d, deadline]]`.
fn frame(entry: &Value) -> Option<(u64, Vec<u8>, u64)> {
    let Value::Array(parts) = entry else {
        return None;
    };
    let Value::BulkString(id) = parts.first()? else {
        return None;
    };
    let seq = stream_id(std::str::from_utf8(id).ok()?)?.0;
    let Value::Array(fields) = parts.get(1)? else {
        return None;
    };
    let mut bytes = Vec::new();
    let mut deadline = 0;
    for pair in fields.chunks(2) {
        match (pair.first()?, pair.get(1)?) {
            (Value::BulkString(k), Value::BulkString(v)) if k == b"f" => bytes.clone_from(v),
            (Value::BulkString(k), Value::BulkString(v)) if k == b"d" => {
                deadline = std::str::from_utf8(v).ok()?.parse().ok()?;
            }
            _ => {}
        }
    }
    Some((seq, bytes, deadline))
}

/// A stream entry id's two numbers.
pub(crate) fn stream_id(id: &str) -> Option<(u64, u64)> {
    let (ms, n) = id.split_once('-')?;
    Some((ms.parse().ok()?, n.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_ids_compare_by_their_numbers() {
        assert_eq!(stream_id("17-3"), Some((17, 3)));
        assert!(stream_id("9-0") < stream_id("10-0"), "not as text");
        assert_eq!(stream_id("x"), None);
    }
}
