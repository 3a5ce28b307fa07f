//! The two scripts of the session store. Each runs atomically in Redis, so a batch of
//! changes is all or nothing, and every change to a session checks first that this
//! node owns it (its `_o` field): a node that handed a session over, or was taken
//! for dead, can no longer write it (its change is counted as fenced and the barrier
//! that covers it fails).
//!
//! Keys, under the prefix `{ns}:mqtt:`: `s:{incarnation}` the session's hash (`_o`
//! owner, `_c` client id, `_m` session record, `_r` the stream id where its owner
//! released it, `m:{seq}` a message record, `b:{seq}` its body's id, `q:{id}` a QoS 2
//! receipt); `owners` client id → incarnation; `b:{id}` a body (`d` data, `r` how many
//! message records refer to it); `handoff:{incarnation}` a list pushed when a session
//! is released; `pos:{owner}` how far that owner applied the message stream.

/// Applies a batch of changes. ARGV: prefix, owner, then the changes (see
/// `sessions/mod.rs::Op`). Returns how many were fenced.
pub(crate) const APPLY: &str = r"
local p, me = ARGV[1], ARGV[2]
local fenced = 0
local function release(bid)
  local b = p .. 'b:' .. bid
  if redis.call('HINCRBY', b, 'r', -1) <= 0 then redis.call('DEL', b) end
end
local function drop(s)
  local f = redis.call('HGETALL', s)
  for j = 1, #f, 2 do
    if string.sub(f[j], 1, 2) == 'b:' then release(f[j + 1]) end
  end
  redis.call('DEL', s)
end
local i = 3
while i <= #ARGV do
  local op = ARGV[i]
  if op == 'P' then
    redis.call('SET', p .. 'pos:' .. me, ARGV[i + 1])
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
            drop(p .. 's:' .. old)
          end
        end
        redis.call('HSET', s, '_o', me, '_c', c, '_m', ARGV[i + 4])
        redis.call('HSET', p .. 'owners', c, inc)
        local ttl = tonumber(ARGV[i + 5])
        if ttl > 0 then redis.call('PEXPIRE', s, ttl) else redis.call('PERSIST', s) end
      else fenced = fenced + 1 end
      i = i + 6
    elseif op == 'M' then
      local bid = ARGV[i + 4]
      if ARGV[i + 5] ~= '' then redis.call('HSETNX', p .. 'b:' .. bid, 'd', ARGV[i + 5]) end
      if mine then
        if redis.call('HSETNX', s, 'b:' .. ARGV[i + 2], bid) == 1 then
          redis.call('HINCRBY', p .. 'b:' .. bid, 'r', 1)
        end
        redis.call('HSET', s, 'm:' .. ARGV[i + 2], ARGV[i + 3])
      else fenced = fenced + 1 end
      i = i + 6
    elseif op == 'D' then
      if mine then
        local bid = redis.call('HGET', s, 'b:' .. ARGV[i + 2])
        if bid then
          redis.call('HDEL', s, 'b:' .. ARGV[i + 2], 'm:' .. ARGV[i + 2])
          release(bid)
        end
      else fenced = fenced + 1 end
      i = i + 3
    elseif op == 'Q' or op == 'q' then
      if mine then
        if op == 'Q' then redis.call('HSET', s, 'q:' .. ARGV[i + 2], '')
        else redis.call('HDEL', s, 'q:' .. ARGV[i + 2]) end
      else fenced = fenced + 1 end
      i = i + 3
    elseif op == 'E' then
      if mine then
        local c = redis.call('HGET', s, '_c')
        drop(s)
        if c and redis.call('HGET', p .. 'owners', c) == inc then
          redis.call('HDEL', p .. 'owners', c)
        end
      elseif o then fenced = fenced + 1 end
      i = i + 2
    elseif op == 'R' then
      if mine then
        redis.call('HSET', s, '_o', '', '_r', ARGV[i + 2])
        local h = p .. 'handoff:' .. inc
        redis.call('RPUSH', h, ARGV[i + 2])
        redis.call('PEXPIRE', h, 60000)
      end
      i = i + 3
    else
      return redis.error_reply('unknown session change ' .. op)
    end
  end
end
return fenced
";

/// Takes a session over for this node. ARGV: prefix, owner (this node), client id,
/// incarnation, the owner it is taken from, '1' if that owner is dead. Returns `{0}`:
/// no such session; `{1, owner}`: another node owns it now; `{2, from, fields, bodies}`:
/// taken, with the stream id to replay messages from (where it was released, or the
/// dead owner's position), the session's hash and the bodies its messages refer to.
pub(crate) const CLAIM: &str = r"
local p, me, client, inc, expect, dead = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local s = p .. 's:' .. inc
local o = redis.call('HGET', s, '_o')
if not o then
  if redis.call('HGET', p .. 'owners', client) == inc then redis.call('HDEL', p .. 'owners', client) end
  return {0}
end
local from
if o == '' then
  from = redis.call('HGET', s, '_r')
elseif o == expect and dead == '1' then
  from = redis.call('GET', p .. 'pos:' .. o)
else
  return {1, o}
end
redis.call('HSET', s, '_o', me)
redis.call('HDEL', s, '_r')
redis.call('PERSIST', s)
local f = redis.call('HGETALL', s)
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
return {2, from or '', f, bodies}
";
