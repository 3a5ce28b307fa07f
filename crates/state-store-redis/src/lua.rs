//! The Lua scripts that make every check-and-write one atomic step in Redis.
//!
//! Each script is loaded once and run by its SHA1 (`EVALSHA`; the `redis` crate loads it
//! again when the server answers `NOSCRIPT`, after a restart or a `SCRIPT FLUSH`). Redis
//! runs one script at a time, so a script's reads and writes see no other node's in
//! between: the fencing, `NX`/`NEX`, VDEL and quota checks, the write, the clock's advance
//! and the change's entry in the feed happen together or not at all.
//!
//! The layout (`P` is the namespace, a hash tag such as `{statehub}`, so that every key
//! of one store lies in one Redis Cluster slot):
//! - `P:e:<key>`: a hash per key: `v` value, `vw`/`vc`/`vn` version (wall, counter,
//!   node), `fw`/`fc`/`fn` fencing token (absent if none), `x` expiry in ms (absent if
//!   none).
//! - `P:keys`: a sorted set of every key, all scored 0, so `ZRANGEBYLEX` pages through
//!   them in byte order (the scan cursor is the last key returned).
//! - `P:exp`: a sorted set of the keys that expire, scored by expiry time.
//! - `P:meta`: a hash: `keys` and `bytes` (the quota's counts), `cw`/`cc`/`cs` (the
//!   cluster's clock: wall, counter, and whether it was stepped), `seq` (the change feed's
//!   last sequence number).
//! - `P:o:<key>`: the nodes observing `<key>`; a change of an observed key is fed.
//! - `P:events`: the change feed, a stream capped near a configured length.
//!
//! The sweep of due keys that scripts carry (`sweep`) removes keys that no `KEYS`
//! argument names (it finds them in `P:exp`); they share the namespace's hash tag, so
//! they lie in the same Redis Cluster slot as the keys passed.
//!
//! Numbers: Lua's are doubles. Wall clocks (at most 15 digits, [`statehub_state_store::hlc`])
//! are exact in them; counters (up to `u64::MAX - 1`) are not, so counters stay decimal
//! strings, compared by length then bytes and incremented digit by digit. Node ids and
//! values are compared byte by byte (`==` on Lua strings is), never with `<`, which follows
//! the server's locale.

use redis::Script;

/// The helpers every script begins with.
const PRELUDE: &str = r#"
local MAXC = '18446744073709551614'
local function bcmp(a, b)
  local n = math.min(#a, #b)
  for i = 1, n do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return (x < y) and -1 or 1 end
  end
  if #a == #b then return 0 end
  return (#a < #b) and -1 or 1
end
local function ncmp(a, b)
  if #a ~= #b then return (#a < #b) and -1 or 1 end
  return bcmp(a, b)
end
local function hcmp(w1, c1, n1, w2, c2, n2)
  if w1 ~= w2 then return (w1 < w2) and -1 or 1 end
  local c = ncmp(c1, c2)
  if c ~= 0 or n1 == nil or n2 == nil then return c end
  return bcmp(n1, n2)
end
local function fmt(w) return string.format('%.0f', w) end
local function inc(c)
  if #c < 15 then return fmt(tonumber(c) + 1) end
  local t = {}
  for i = 1, #c do t[i] = string.byte(c, i) - 48 end
  local i = #c
  while i >= 1 do
    if t[i] == 9 then t[i] = 0; i = i - 1 else t[i] = t[i] + 1; break end
  end
  local s = table.concat(t)
  if i == 0 then s = '1' .. s end
  return s
end
-- The cluster's clock, with the stamps of the requests since the last script merged in
-- their order (ARGV[first..last], in triples wall, counter, now: `now` is '' for a
-- plain merge, HlcClock::observe; else HlcClock::observe_request at that time).
local function observed(meta, first, last)
  local st = redis.call('HMGET', meta, 'cw', 'cc', 'cs')
  local w, c, stepped = tonumber(st[1] or '0'), st[2] or '0', st[3] == '1'
  for i = first, last, 3 do
    local tw, tc, tn = tonumber(ARGV[i]), ARGV[i + 1], ARGV[i + 2]
    local d = hcmp(tw, tc, nil, w, c, nil)
    if tn ~= '' and tw == tonumber(tn) and d >= 0 then w, c, stepped = tw + 1, '0', true
    elseif d > 0 then w, c, stepped = tw, tc, false end
  end
  return w, c, stepped
end
-- Merges the stamps and keeps the clock so (a request that writes nothing).
local function observe(meta, first)
  if #ARGV < first then return end
  local w, c, stepped = observed(meta, first, #ARGV)
  redis.call('HSET', meta, 'cw', fmt(w), 'cc', c, 'cs', stepped and '1' or '0')
end
-- Merges the stamps ARGV[first..last], then issues a version (HlcClock::tick). Returns
-- wall, counter.
local function tick(meta, now, first, last)
  local w, c, stepped = observed(meta, first, last)
  if now > w then w, c = now, '0'
  elseif not stepped then
    if ncmp(c, MAXC) >= 0 then w, c = w + 1, '0' else c = inc(c) end
  end
  redis.call('HSET', meta, 'cw', fmt(w), 'cc', c, 'cs', '0')
  return w, c
end
-- Feeds a change of an observed key: one stream entry, numbered by `seq`. Returns that
-- number as a string, '0' when the key is not observed (nothing fed).
local function feed(obs, events, meta, maxlen, key, value, w, c)
  if redis.call('EXISTS', obs) == 0 then return '0' end
  local seq = redis.call('HINCRBY', meta, 'seq', 1)
  if value then
    redis.call('XADD', events, 'MAXLEN', '~', maxlen, '*', 's', seq, 'k', key, 'w', fmt(w), 'c', c, 'v', value)
  else
    redis.call('XADD', events, 'MAXLEN', '~', maxlen, '*', 's', seq, 'k', key, 'w', fmt(w), 'c', c)
  end
  return tostring(seq)
end
-- Forgets an entry whose fields `cur` (v, ...) were read: index, expiry, quota counts.
local function forget(e, idx, exp, meta, key, cur)
  redis.call('DEL', e)
  redis.call('ZREM', idx, key)
  redis.call('ZREM', exp, key)
  redis.call('HINCRBY', meta, 'keys', -1)
  redis.call('HINCRBY', meta, 'bytes', -(#key + #cur[1]))
end
-- The fencing rule: nil if allowed, else the refusal's name.
local function fenced(cur, tw, tc, tn)
  if not cur[5] then return nil end
  if tw == '' then return 'fencing_required' end
  if hcmp(tonumber(tw), tc, tn, tonumber(cur[5]), cur[6], cur[7]) < 0 then return 'fencing_lower' end
  return nil
end
-- The machine's sweep of due keys before a request (Engine::carry_sweep), run first
-- thing by the script the request's first command is: ARGV[at] its time ('' for none),
-- ARGV[at + 1] the most keys it removes, ARGV[at + 2] how many of the stamp triples from
-- ARGV[at + 3] on came before it (the first removal merges those). Each due key is
-- removed as EXPIRE does; `own`, the request's key, too if it is due and `limit` keys
-- were (Machine::expire_key_if_due). Returns how many it removed, the number of the last
-- change it fed ('0' for none) and where the stamps still to merge begin.
local function sweep(idx, exp, meta, events, maxlen, at, own)
  local first = at + 3
  if ARGV[at] == '' then return '0', '0', first end
  local now, limit = tonumber(ARGV[at]), tonumber(ARGV[at + 1])
  local last = first + 3 * tonumber(ARGV[at + 2]) - 1
  local prefix = string.sub(idx, 1, #idx - 4)
  local due = redis.call('ZRANGEBYSCORE', exp, '-inf', ARGV[at], 'LIMIT', 0, limit)
  if own and #due == limit then due[#due + 1] = own end
  local n, fed = 0, '0'
  for _, key in ipairs(due) do
    local e = prefix .. 'e:' .. key
    local cur = redis.call('HMGET', e, 'v', 'x')
    if cur[2] and tonumber(cur[2]) <= now then
      forget(e, idx, exp, meta, key, cur)
      local w, c = tick(meta, now, first, last)
      first = last + 1
      local f = feed(prefix .. 'o:' .. key, events, meta, maxlen, key, nil, w, c)
      if f ~= '0' then fed = f end
      n = n + 1
    end
  end
  return tostring(n), fed, first
end
"#;

/// Every script that carries the sweep replies `{fed, removed, ...}` first: the number of
/// the last change the sweep fed (`0` for none) and how many keys it removed.
///
/// KEYS: e, idx, exp, meta, obs, events. ARGV: key, value, condition (`A`, `N`, `E`),
/// expiry (`''` for none), fencing token wall/counter/node (`''` for none), now, max
/// keys, max bytes, max key length, max value length, version node, feed length, the
/// sweep (see `sweep`), then the stamps to merge (see `observed`).
/// Returns (after the sweep's two) `{'W', wall, counter, fed}` (`fed`: the change's number
/// in the feed, `0` if not fed), `{'K', wall, counter, node}` or `{'R', refusal}`.
const SET: &str = r#"
local e, idx, exp, meta, obs, events = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local key, value, cond, x = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local now = tonumber(ARGV[8])
local n, sfed, first = sweep(idx, exp, meta, events, ARGV[14], 15, key)
local cur = redis.call('HMGET', e, 'v', 'vw', 'vc', 'vn', 'fw', 'fc', 'fn')
local exists = cur[2] ~= false
if exists then
  local refusal = fenced(cur, ARGV[5], ARGV[6], ARGV[7])
  if refusal then observe(meta, first); return {sfed, n, 'R', refusal} end
  if cond == 'N' or (cond == 'E' and cur[1] ~= value) then
    observe(meta, first)
    return {sfed, n, 'K', cur[2], cur[3], cur[4]}
  end
end
if #key > tonumber(ARGV[11]) or #value > tonumber(ARGV[12]) then
  observe(meta, first)
  return {sfed, n, 'R', 'quota'}
end
local stats = redis.call('HMGET', meta, 'keys', 'bytes')
local nkeys, nbytes = tonumber(stats[1] or '0'), tonumber(stats[2] or '0')
local old = exists and (#key + #cur[1]) or 0
local new = #key + #value
if (not exists and nkeys + 1 > tonumber(ARGV[9]))
  or (new > old and nbytes - old + new > tonumber(ARGV[10])) then
  observe(meta, first)
  return {sfed, n, 'R', 'quota'}
end
local w, c = tick(meta, now, first, #ARGV)
redis.call('DEL', e)
redis.call('HSET', e, 'v', value, 'vw', fmt(w), 'vc', c, 'vn', ARGV[13])
if ARGV[5] ~= '' then redis.call('HSET', e, 'fw', ARGV[5], 'fc', ARGV[6], 'fn', ARGV[7]) end
if x ~= '' then
  redis.call('HSET', e, 'x', x)
  redis.call('ZADD', exp, x, key)
else
  redis.call('ZREM', exp, key)
end
if not exists then
  redis.call('ZADD', idx, 0, key)
  redis.call('HINCRBY', meta, 'keys', 1)
end
redis.call('HINCRBY', meta, 'bytes', new - old)
local fed = feed(obs, events, meta, ARGV[14], key, value, w, c)
return {sfed, n, 'W', fmt(w), c, fed}
"#;

/// KEYS: e, idx, exp, meta, obs, events. ARGV: key, whether a value must match (`1`/`0`),
/// that value, fencing token wall/counter/node, now, feed length, the sweep, then the
/// stamps to merge.
/// Returns (after the sweep's two) `{'A'}`, `{'D', wall, counter, fed}` (as SET's `W`),
/// `{'K', wall, counter, node}` or `{'R', refusal}`.
const DELETE: &str = r#"
local e, idx, exp, meta, obs, events = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local key = ARGV[1]
local n, sfed, first = sweep(idx, exp, meta, events, ARGV[8], 9, key)
local cur = redis.call('HMGET', e, 'v', 'vw', 'vc', 'vn', 'fw', 'fc', 'fn')
if not cur[2] then observe(meta, first); return {sfed, n, 'A'} end
local refusal = fenced(cur, ARGV[4], ARGV[5], ARGV[6])
if refusal then observe(meta, first); return {sfed, n, 'R', refusal} end
if ARGV[2] == '1' and cur[1] ~= ARGV[3] then
  observe(meta, first)
  return {sfed, n, 'K', cur[2], cur[3], cur[4]}
end
forget(e, idx, exp, meta, key, cur)
local w, c = tick(meta, tonumber(ARGV[7]), first, #ARGV)
local fed = feed(obs, events, meta, ARGV[8], key, nil, w, c)
return {sfed, n, 'D', fmt(w), c, fed}
"#;

/// KEYS: e, idx, exp, meta, obs, events. ARGV: key, now, feed length, the sweep, then the
/// stamps to merge. Removes the key if it is still due. Returns (after the sweep's two)
/// nothing or `{wall, counter, fed}` (as SET's `W`).
const EXPIRE: &str = r#"
local e, idx, exp, meta, obs, events = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local key, now = ARGV[1], tonumber(ARGV[2])
local n, sfed, first = sweep(idx, exp, meta, events, ARGV[3], 4, nil)
local cur = redis.call('HMGET', e, 'v', 'x')
if not cur[2] or tonumber(cur[2]) > now then observe(meta, first); return {sfed, n} end
forget(e, idx, exp, meta, key, cur)
local w, c = tick(meta, now, first, #ARGV)
local fed = feed(obs, events, meta, ARGV[3], key, nil, w, c)
return {sfed, n, fmt(w), c, fed}
"#;

/// KEYS: e, idx, exp, meta, events. ARGV: key, feed length, the sweep, then the stamps
/// (the sweep's are merged only if it removes a key; the rest wait for the next write).
/// A GET with the sweep before it. Returns (after the sweep's two) the entry's fields
/// `v vw vc vn fw fc fn x`.
const GET: &str = r#"
local e, idx, exp, meta, events = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local n, sfed = sweep(idx, exp, meta, events, ARGV[2], 3, ARGV[1])
local cur = redis.call('HMGET', e, 'v', 'vw', 'vc', 'vn', 'fw', 'fc', 'fn', 'x')
return {sfed, n, cur[1], cur[2], cur[3], cur[4], cur[5], cur[6], cur[7], cur[8]}
"#;

/// KEYS: idx, exp, meta, events. ARGV: feed length, the sweep, then the stamps (as GET).
/// The sweep alone, when the request's first command cannot carry it. Returns the
/// sweep's two.
const SWEEP: &str = r#"
local n, sfed = sweep(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1], 2, nil)
return {sfed, n}
"#;

/// KEYS: e, idx, exp, meta. ARGV: key, value, version wall/counter/node, fencing token
/// wall/counter/node (`''` for none), expiry (`''` for none).
/// The raw write of [`statehub_state_store::Engine::put`]: no checks, the version given,
/// the clock moved up to it. Returns the old entry's fields (as `ENTRY` reads them).
const PUT: &str = r#"
local e, idx, exp, meta = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local key, value = ARGV[1], ARGV[2]
local cur = redis.call('HMGET', e, 'v', 'vw', 'vc', 'vn', 'fw', 'fc', 'fn', 'x')
local old = 0
if cur[2] then old = #key + #cur[1] else
  redis.call('ZADD', idx, 0, key)
  redis.call('HINCRBY', meta, 'keys', 1)
end
redis.call('HINCRBY', meta, 'bytes', #key + #value - old)
redis.call('DEL', e)
redis.call('HSET', e, 'v', value, 'vw', ARGV[3], 'vc', ARGV[4], 'vn', ARGV[5])
if ARGV[6] ~= '' then redis.call('HSET', e, 'fw', ARGV[6], 'fc', ARGV[7], 'fn', ARGV[8]) end
if ARGV[9] ~= '' then
  redis.call('HSET', e, 'x', ARGV[9])
  redis.call('ZADD', exp, ARGV[9], key)
else
  redis.call('ZREM', exp, key)
end
local st = redis.call('HMGET', meta, 'cw', 'cc')
if hcmp(tonumber(ARGV[3]), ARGV[4], nil, tonumber(st[1] or '-1'), st[2] or '0', nil) > 0 then
  redis.call('HSET', meta, 'cw', ARGV[3], 'cc', ARGV[4], 'cs', '0')
end
return cur
"#;

/// KEYS: e, idx, exp, meta. ARGV: key. The raw removal of
/// [`statehub_state_store::Engine::remove`]. Returns the old entry's fields.
const REMOVE: &str = r#"
local cur = redis.call('HMGET', KEYS[1], 'v', 'vw', 'vc', 'vn', 'fw', 'fc', 'fn', 'x')
if cur[2] then forget(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1], cur) end
return cur
"#;

/// KEYS: obs, meta. ARGV: node. Registers the node as an observer of the key and
/// returns the feed's current sequence number: later changes are news.
const OBSERVE: &str = r#"
redis.call('SADD', KEYS[1], ARGV[1])
return tonumber(redis.call('HGET', KEYS[2], 'seq') or '0')
"#;

/// The scripts, each hashed once.
#[derive(Debug)]
pub(crate) struct Scripts {
    pub(crate) set: Script,
    pub(crate) delete: Script,
    pub(crate) expire: Script,
    pub(crate) put: Script,
    pub(crate) remove: Script,
    pub(crate) observe: Script,
    pub(crate) get: Script,
    pub(crate) sweep: Script,
    /// The code of the scripts pipelines send by their hash (`queued.rs`): set,
    /// delete, get.
    pub(crate) pipelined: [String; 3],
}

impl Scripts {
    pub(crate) fn new() -> Self {
        let code = |body: &str| format!("{PRELUDE}{body}");
        let with_prelude = |body: &str| Script::new(&code(body));
        Self {
            set: with_prelude(SET),
            delete: with_prelude(DELETE),
            expire: with_prelude(EXPIRE),
            put: with_prelude(PUT),
            remove: with_prelude(REMOVE),
            observe: Script::new(OBSERVE),
            get: with_prelude(GET),
            sweep: with_prelude(SWEEP),
            pipelined: [SET, DELETE, GET].map(code),
        }
    }
}
