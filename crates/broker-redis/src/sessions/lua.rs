//! The scripts of the session store. Each runs atomically in Redis, so a batch of
//! changes is all or nothing, and every change to a session checks first that this
//! node owns it (its `_o` field): a node that handed a session over, or was taken
//! for dead, can no longer write it (its change is counted as fenced and the barrier
//! that covers it fails).
//!
//! Keys, under the prefix `{ns}:mqtt:`: `s:{incarnation}` the session's hash (`_o`
//! owner, `_c` client id, `_m` session record, `_e` how long it lives without a
//! client, in ms, 0 for ever, `_r` the stream id where its owner released it,
//! `_xn`, `_x` the node that released it and the stream entry up to which that
//! node's own messages are in it, `m:{seq}` a message record, `b:{seq}` its body's id (the message's origin, see
//! `origins.rs`), `o:{origin}` a tombstone, `q:{id}` a QoS 2 receipt);
//! `owners` client id → incarnation; `b:{id}` a body (`d` data, `r` how many message
//! records refer to it); `handoff:{incarnation}` a list pushed when a session is
//! released; `pos:{owner}` how far that owner applied the message stream (read when
//! a session is taken from that owner dead), kept while the owner is alive or owns a
//! session: `owned` counts, by owner, the sessions whose `_o` it is, and a dead
//! owner's position goes when its count reaches 0 (or at a sweep, if it owned none).
//!
//! Expiry without the owner's help (a node that died, a session nobody claimed):
//! `dl` holds, by deadline (Redis's clock, ms), every session no live node holds
//! connected; `conn:{owner}` the sessions an owner holds connected (or just claimed),
//! `runs` the owners that have such a set. [`SWEEP`] starts the clock of a dead
//! owner's connected sessions and forgets, bodies included, the sessions past their
//! deadline. Redis key TTLs are not used: a key that expired on its own would leave
//! its bodies' counts behind.

/// Redis's clock in ms, and what forgetting a session and starting its expiry clock
/// take (shared by the scripts, after their arguments).
macro_rules! common {
    () => {
        r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function own(o, d)
  if not o or o == '' then return end
  local n = redis.call('HINCRBY', p .. 'owned', o, d)
  if n <= 0 and redis.call('EXISTS', p .. 'alive:' .. o) == 0 then
    redis.call('DEL', p .. 'pos:' .. o)
    redis.call('HDEL', p .. 'owned', o)
  end
end
local function release(bid)
  local b = p .. 'b:' .. bid
  if redis.call('HINCRBY', b, 'r', -1) <= 0 then redis.call('DEL', b) end
end
local function drop(s, inc, o)
  local f = redis.call('HGETALL', s)
  for j = 1, #f, 2 do
    if string.sub(f[j], 1, 2) == 'b:' then release(f[j + 1]) end
  end
  redis.call('DEL', s)
  redis.call('ZREM', p .. 'dl', inc)
  if o and o ~= '' then
    redis.call('SREM', p .. 'conn:' .. o, inc)
    own(o, -1)
  end
end
local function forget(s, inc)
  local c = redis.call('HGET', s, '_c')
  drop(s, inc, redis.call('HGET', s, '_o'))
  if c and redis.call('HGET', p .. 'owners', c) == inc then
    redis.call('HDEL', p .. 'owners', c)
  end
end
local function hold(s, inc, owner, held)
  local life = tonumber(redis.call('HGET', s, '_e') or '0') or 0
  if held and life > 0 then
    redis.call('ZREM', p .. 'dl', inc)
    redis.call('SADD', p .. 'conn:' .. owner, inc)
    redis.call('SADD', p .. 'runs', owner)
  else
    redis.call('SREM', p .. 'conn:' .. owner, inc)
    if life > 0 then redis.call('ZADD', p .. 'dl', now + life, inc)
    else redis.call('ZREM', p .. 'dl', inc) end
  end
end
"
    };
}

/// Applies a batch of changes. ARGV: prefix, owner, then the changes (see
/// `sessions/mod.rs::Op`). Returns how many were fenced, then the ordinals (from 1)
/// of the message records among them refused only because their body is not in
/// Redis (the writer sends those again with it).
pub(crate) const APPLY: &str = concat!(
    r"
local p, me = ARGV[1], ARGV[2]
",
    common!(),
    r"
local fenced = 0
local bodiless = {}
-- Bodies carried by refused records, for a later record of this batch that needs one.
local spare = {}
local i = 3
local n = 0
while i <= #ARGV do
  local op = ARGV[i]
  n = n + 1
  if op == 'P' then
    redis.call('SET', p .. 'pos:' .. me, ARGV[i + 1])
    redis.call('HINCRBY', p .. 'owned', me, 0)
    i = i + 2
  else
    local inc = ARGV[i + 1]
    local s = p .. 's:' .. inc
    local o = redis.call('HGET', s, '_o')
    local mine = o == me
    if op == 'S' then
      if mine or (ARGV[i + 2] == '1' and redis.call('EXISTS', s) == 0) then
        local c = ARGV[i + 3]
        -- A new session replaces the client's older one: gone with it unless its
        -- owner is alive (that owner ends it when the stream tells it).
        local old = redis.call('HGET', p .. 'owners', c)
        if ARGV[i + 2] == '1' and old and old ~= inc then
          local oo = redis.call('HGET', p .. 's:' .. old, '_o')
          if oo and (oo == '' or redis.call('EXISTS', p .. 'alive:' .. oo) == 0) then
            drop(p .. 's:' .. old, old, oo)
          end
        end
        if not mine then own(me, 1) end
        redis.call('HSET', s, '_o', me, '_c', c, '_m', ARGV[i + 4], '_e', ARGV[i + 5])
        redis.call('HSET', p .. 'owners', c, inc)
        hold(s, inc, me, ARGV[i + 6] ~= '1')
      else fenced = fenced + 1 end
      i = i + 7
    elseif op == 'M' then
      local bid, data = ARGV[i + 4], ARGV[i + 5]
      local b = p .. 'b:' .. bid
      if data == '' then data = spare[bid] end
      if not mine then
        -- Refused: nothing is written, no body nothing refers to.
        if data then spare[bid] = data end
        fenced = fenced + 1
      elseif not data and redis.call('HEXISTS', b, 'd') == 0 then
        -- Its body is not in Redis (only a refused record carried it): a record
        -- without it would lose the message, so it is refused too, and what waits
        -- for it is refused, unless the writer can send it again with its body.
        fenced = fenced + 1
        bodiless[#bodiless + 1] = n
      else
        if data then redis.call('HSETNX', b, 'd', data) end
        if redis.call('HSETNX', s, 'b:' .. ARGV[i + 2], bid) == 1 then
          redis.call('HINCRBY', b, 'r', 1)
        end
        redis.call('HSET', s, 'm:' .. ARGV[i + 2], ARGV[i + 3])
      end
      i = i + 6
    elseif op == 'D' then
      if mine then
        local bid = redis.call('HGET', s, 'b:' .. ARGV[i + 2])
        if bid then
          redis.call('HDEL', s, 'b:' .. ARGV[i + 2], 'm:' .. ARGV[i + 2])
          release(bid)
        end
        if ARGV[i + 3] ~= '' then redis.call('HSET', s, 'o:' .. ARGV[i + 3], '') end
      else fenced = fenced + 1 end
      i = i + 4
    elseif op == 'X' then
      if mine then redis.call('HDEL', s, 'o:' .. ARGV[i + 2]) end
      i = i + 3
    elseif op == 'Q' or op == 'q' then
      if mine then
        if op == 'Q' then redis.call('HSET', s, 'q:' .. ARGV[i + 2], '')
        else redis.call('HDEL', s, 'q:' .. ARGV[i + 2]) end
      else fenced = fenced + 1 end
      i = i + 3
    elseif op == 'E' then
      if mine then
        forget(s, inc)
      elseif o then fenced = fenced + 1 end
      i = i + 2
    elseif op == 'R' then
      if mine then
        redis.call('HSET', s, '_o', '', '_r', ARGV[i + 2])
        own(me, -1)
        if ARGV[i + 4] ~= '' then redis.call('HSET', s, '_xn', ARGV[i + 3], '_x', ARGV[i + 4])
        else redis.call('HDEL', s, '_xn', '_x') end
        hold(s, inc, me, false)
        local h = p .. 'handoff:' .. inc
        redis.call('RPUSH', h, ARGV[i + 2])
        redis.call('PEXPIRE', h, 60000)
      end
      i = i + 5
    else
      return redis.error_reply('unknown session change ' .. op)
    end
  end
end
local out = {fenced}
for _, k in ipairs(bodiless) do out[#out + 1] = k end
return out
"
);

/// Takes a session over for this node. ARGV: prefix, owner (this node), client id,
/// incarnation, the owner it is taken from, '1' if that owner is dead. Returns `{0}`:
/// no such session; `{1, owner}`: another node owns it now; `{2, from, fields, bodies,
/// node, upto}`: taken, with the stream id to replay messages from (where it was
/// released, or the dead owner's position), the session's hash (with its tombstones,
/// which stay while the new owner keeps them, see `adopted.rs`), the bodies its messages
/// refer to, and, if the node that released it said, that node and the entry up to
/// which its own messages are in the session already.
pub(crate) const CLAIM: &str = concat!(
    r"
local p, me, client, inc, expect, dead = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
",
    common!(),
    r"
local s = p .. 's:' .. inc
local o = redis.call('HGET', s, '_o')
if not o then
  if redis.call('HGET', p .. 'owners', client) == inc then redis.call('HDEL', p .. 'owners', client) end
  return {0}
end
local from, xn, x
if o == '' then
  from = redis.call('HGET', s, '_r')
  xn, x = redis.call('HGET', s, '_xn'), redis.call('HGET', s, '_x')
elseif o == expect and dead == '1' then
  from = redis.call('GET', p .. 'pos:' .. o)
else
  return {1, o}
end
redis.call('HSET', s, '_o', me)
if o ~= me then
  own(o, -1)
  own(me, 1)
end
redis.call('HDEL', s, '_r', '_xn', '_x')
local f = redis.call('HGETALL', s)
if o ~= '' then redis.call('SREM', p .. 'conn:' .. o, inc) end
hold(s, inc, me, true)
local bodies, seen = {}, {}
for j = 1, #f, 2 do
  if string.sub(f[j], 1, 2) == 'b:' and not seen[f[j + 1]] then
    seen[f[j + 1]] = true
    local d = redis.call('HGET', p .. 'b:' .. f[j + 1], 'd')
    if d then
      table.insert(bodies, f[j + 1])
      table.insert(bodies, d)
    end
  end
end
return {2, from or '', f, bodies, xn or '', x or ''}
"
);

/// One round of expiry without the owners' help, if this node is alive and no other
/// node holds this period. ARGV: prefix, owner (this node), the period in ms, the most
/// sessions handled. A dead owner's connected sessions get their deadline from now
/// (as if disconnected when found dead), then the sessions past their deadline are
/// forgotten with their bodies' counts, and the positions of dead owners that own no
/// session go. Returns `{status, started, forgotten}`:
/// status 0 swept (call again at once if `started + forgotten` reached the limit),
/// 1 this node is taken for dead, 2 another node holds this period.
pub(crate) const SWEEP: &str = concat!(
    r"
local p, me, period, limit = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
",
    common!(),
    r"
if redis.call('EXISTS', p .. 'alive:' .. me) == 0 then return {1, 0, 0} end
local holder = redis.call('GET', p .. 'sweep')
if holder and holder ~= me then return {2, 0, 0} end
if not holder then redis.call('SET', p .. 'sweep', me, 'PX', period) end
local work, started = 0, 0
for _, o in ipairs(redis.call('SMEMBERS', p .. 'runs')) do
  if work >= limit then break end
  if redis.call('EXISTS', p .. 'alive:' .. o) == 0 then
    local c = p .. 'conn:' .. o
    for _, inc in ipairs(redis.call('SPOP', c, limit - work)) do
      local s = p .. 's:' .. inc
      if redis.call('HGET', s, '_o') == o then
        hold(s, inc, o, false)
        started = started + 1
      end
      work = work + 1
    end
    if redis.call('EXISTS', c) == 0 then redis.call('SREM', p .. 'runs', o) end
  end
end
if work < limit then
  local due = redis.call('ZRANGE', p .. 'dl', '-inf', now, 'BYSCORE', 'LIMIT', 0, limit - work)
  for _, inc in ipairs(due) do
    forget(p .. 's:' .. inc, inc)
    work = work + 1
  end
end
-- Dead owners that owned no session: their position is of no use any more.
local owned = redis.call('HGETALL', p .. 'owned')
for j = 1, #owned, 2 do
  if tonumber(owned[j + 1]) <= 0 then own(owned[j], 0) end
end
return {0, started, work - started}
"
);
