-- One caller's rate for the whole fleet: GCRA kept as a level (quoteflow/callers/meter.py).
--
-- KEYS[1]  <prefix>:caller:<name>, a string "<used> <at ms>"
-- KEYS[2]  <prefix>:switched: when the fleet last found itself on another server
--          (a promoted replica, ms): a level written before it may have been lost, so
--          every rate counts as spent whole then, refilling from zero (fleet/sync.lua).
-- ARGV[1]  burst: the most requests that may be used at once (the quota)
-- ARGV[2]  interval: ms for one used request to drain back (window / quota)
-- ARGV[3]  want: requests asked for at once (a lease; 1 near the quota)
-- Reply    {granted (1..want), used after them}, or {0, used now}: refused.
--
-- One clock for the fleet: Redis' own (TIME). A refusal writes nothing (but a
-- longer expiry after a lowered rate). The key expires once it has drained:
-- an idle caller costs no memory.
local burst = tonumber(ARGV[1])
local interval = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + tonumber(clock[2]) / 1000

local used = 0
local written = -1
local state = redis.call('GET', KEYS[1])
if state then
  local level, at = string.match(state, '^(%S+) (%S+)$')
  level, at = tonumber(level), tonumber(at)
  if level and at then
    used = math.max(0, level - math.max(0, now - at) / interval)
    written = at
  end
end
local switched = tonumber(redis.call('GET', KEYS[2]))
if switched and written < switched then
  used = math.max(used, burst - math.max(0, now - switched) / interval)
end

if used + 1 > burst then
  -- A rate a reload lowered drains the level more slowly than the expiry set
  -- at the old rate allowed for: keep the key until it has drained, or the
  -- fleet would forget what was used and grant a whole burst again.
  local keep = math.ceil(used * interval) + 1000
  if redis.call('PTTL', KEYS[1]) < keep then
    redis.call('PEXPIRE', KEYS[1], keep)
  end
  return {0, string.format('%.6f', used)}
end
local granted = math.min(want, math.floor(burst - used))
used = used + granted
local ttl = math.ceil(used * interval) + 1000
redis.call('SET', KEYS[1], string.format('%.6f %.3f', used, now), 'PX', ttl)
return {granted, string.format('%.6f', used)}
