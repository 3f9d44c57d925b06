local id = ARGV[1]
local ttl, limit = tonumber(ARGV[2]), tonumber(ARGV[3])
local fresh, quiet_ms = tonumber(ARGV[4]), tonumber(ARGV[5])
local joined, bye = ARGV[6] == '1', ARGV[7] == '1'
local channel, n = ARGV[8], tonumber(ARGV[9])
local may_announce = ARGV[10] == '1'
local grace_ms, check_server = tonumber(ARGV[11]), ARGV[12] == '1'
local last_server = ARGV[13]
-- Each supplier's own share and retry bucket size come with every call, as
-- this worker's catalogue states them: Redis keeps no limit of its own, so a
-- reload that changes one needs nothing but the next call (redis-cell's way).
local names, held, want, deposit, withdraw, pool = {}, {}, {}, {}, {}, {}
local shares, capacities = {}, {}
for i = 1, n do
  local b = 13 + 8 * (i - 1)
  names[i], held[i], want[i] = ARGV[b + 1], tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
  deposit[i], withdraw[i] = tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5])
  pool[i], shares[i], capacities[i] = tonumber(ARGV[b + 6]), tonumber(ARGV[b + 7]),
    tonumber(ARGV[b + 8])
end

-- "atlas 2 1 0.5 boreal 0 0 3 cedar 1 0 2 <ms>" -> {name -> {held, want, pool}}, ms
local function parse(record)
  local f = {}
  for token in string.gmatch(record, '%S+') do f[#f + 1] = token end
  local entry = {}
  for i = 1, #f - 1, 4 do
    entry[f[i]] = {tonumber(f[i + 1]), tonumber(f[i + 2]), tonumber(f[i + 3])}
  end
  return entry, tonumber(f[#f])
end

-- safe.py's safe_share: what a worker that knew ``workers`` (its place ``rank``)
-- may send on its own; the outbound limit's with no rank.
local function safe(cap, workers, rank)
  if workers <= 0 then return 1 end
  local part = math.floor(cap / workers)
  if part > 0 or not rank then return math.max(1, part) end
  if rank < cap then return 1 end
  return 0
end

-- <p>:safe, "<total> <total before> atlas 1 1 boreal 2 1 ...": what a worker
-- would send on its own, as its last two syncs told it (a reply may be lost),
-- each by its own catalogue. -> {total = the larger, per = {name -> the larger}}
local function parse_safe(text)
  if not text then return nil end
  local f = {}
  for token in string.gmatch(text, '%S+') do f[#f + 1] = token end
  local known = {total = math.max(tonumber(f[1]), tonumber(f[2])), per = {}, now = {}}
  for i = 3, #f - 2, 3 do
    known.per[f[i]] = math.max(tonumber(f[i + 1]), tonumber(f[i + 2]))
    known.now[f[i]] = tonumber(f[i + 1])
  end
  known.now_total = tonumber(f[1])
  return known
end

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

-- (2) A worker silent for ttl may be cut off alone, still sending on its own
-- within the larger of its last holdings and its safe share: for grace_ms after
-- its record lapsed it stays, as a ghost holding that much (of the limit, no
-- more than it could send in all). Then it is gone, with what it held. One that
-- said goodbye, or that its master saw die, is dropped at once. A record is
-- judged by its own time too, should <p>:workers itself have lapsed. A worker
-- whose safe share is unknown (older code) is held to the whole share.
local share_of = {}
for i = 1, n do share_of[names[i]] = shares[i] end
local expiry, ghosts = {}, {}
local z = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
for k = 1, #z, 2 do expiry[z[k]] = tonumber(z[k + 1]) end
local g = redis.call('HGETALL', KEYS[5])
for k = 1, #g, 2 do
  local ends, total = string.match(g[k + 1], '^(%S+) (%S+)$')
  ghosts[g[k]] = {tonumber(ends), tonumber(total)}
end
local dropped, changed = 0, false
local function forget(wid, entry)
  for _, hw in pairs(entry) do dropped = dropped + hw[1] end
  redis.call('HDEL', KEYS[2], wid)
  redis.call('HDEL', KEYS[5], wid)
  redis.call('HDEL', KEYS[8], wid)
  redis.call('ZREM', KEYS[1], wid)
  ghosts[wid], changed = nil, true
end
local rows = redis.call('HGETALL', KEYS[2])
for k = 1, #rows, 2 do
  local wid = rows[k]
  if wid ~= id then
    local entry, at = parse(rows[k + 1])
    local lapse = expiry[wid] or (at + ttl)
    if ghosts[wid] then
      if ghosts[wid][1] <= now then forget(wid, entry) end
    elseif lapse <= now then
      if now < lapse + grace_ms then
        local known = parse_safe(redis.call('HGET', KEYS[8], wid))
        local parts, held_sum, kept_sum = {}, 0, 0
        for name, hw in pairs(entry) do
          local own = hw[1]
          if known then own = known.per[name] or 0 elseif share_of[name] then own = share_of[name] end
          local kept = math.max(hw[1], own)
          held_sum, kept_sum = held_sum + hw[1], kept_sum + kept
          parts[#parts + 1] = name .. ' ' .. kept .. ' 0 ' .. hw[3]
        end
        parts[#parts + 1] = at
        local total = math.min(kept_sum, math.max(held_sum, known and known.total or limit))
        redis.call('HSET', KEYS[2], wid, table.concat(parts, ' '))
        redis.call('HSET', KEYS[5], wid, (lapse + grace_ms) .. ' ' .. total)
        redis.call('ZREM', KEYS[1], wid)
        ghosts[wid], changed = {lapse + grace_ms, total}, true
      else
        forget(wid, entry)
      end
    end
  end
end
redis.call('HDEL', KEYS[5], id)

-- An emptied Redis (restart, FLUSHALL) has no epoch. Found so by a worker that
-- had joined, it grants nothing for quiet_ms: every holder reports first.
local epoch = tonumber(redis.call('GET', KEYS[4]))
local reset = false
if not epoch then
  epoch = now - quiet_ms
  if joined then epoch, reset = now, true end
  redis.call('SET', KEYS[4], epoch)
end
-- A promoted replica holds the fleet's keys as they were some writes ago, the
-- epoch among them: found by its run id differing from the one the fleet last
-- ran on (<p>:server, "<run id> s" after a switch). Treated as an emptied Redis,
-- and every rate as just spent (quota.lua reads <p>:switched): no lost write
-- may let a supplier or a caller receive more than promised. INFO refused (an
-- ACL, a renamed command) or without a run id: no switch can be found.
local switched, moved, run_id = false, false, ''
if check_server then
  local info = redis.pcall('INFO', 'server')
  if type(info) == 'string' then run_id = string.match(info, 'run_id:(%x+)') or '' end
end
if run_id ~= '' then
  local known = redis.call('GET', KEYS[6])
  local known_id, kind = '', ''
  if known then known_id, kind = string.match(known, '^(%S+) ?(%S*)$') end
  if known_id ~= run_id then
    -- Whoever finds it first, a worker just started included: the others learn it.
    if known and not reset then
      switched, reset, epoch = true, true, now
      redis.call('SET', KEYS[4], epoch)
    end
    kind = switched and 's' or 'f'
    redis.call('SET', KEYS[6], run_id .. ' ' .. kind)
  end
  -- This worker last synced on the old server, though the fleet found the
  -- switch already (its message may have gone to a subscription on the old one).
  moved = switched or (kind == 's' and last_server ~= '' and last_server ~= run_id)
end
if switched then redis.call('SET', KEYS[7], now, 'PX', 86400000) end
local quiet = now < epoch + quiet_ms

-- Whether this worker now holds fewer slots of some supplier than its last record said.
local previous = redis.call('HGET', KEYS[2], id)
local lowered = false
local function lower(now_held)
  if previous then
    local entry = parse(previous)
    for i = 1, n do
      local before = entry[names[i]]
      if before and before[1] > now_held[i] then lowered = true end
    end
  end
end

-- (4) Everyone else: what they hold, and what they want if they said so lately.
local held_all, total_all, others, others_want, pools = {}, 0, {}, 0, {}
for i = 1, n do held_all[names[i]], pools[names[i]] = 0, 0 end
if changed then rows = redis.call('HGETALL', KEYS[2]) end
for k = 1, #rows, 2 do
  if rows[k] ~= id then
    local entry, at = parse(rows[k + 1])
    local ghost = ghosts[rows[k]]
    local live = at + fresh > now
    local demand = {id = rows[k], total = 0, per = {}}
    for name, hw in pairs(entry) do
      local w = live and hw[2] or 0
      held_all[name] = (held_all[name] or 0) + hw[1]
      pools[name] = (pools[name] or 0) + hw[3]
      total_all = total_all + hw[1]
      demand.per[name] = hw[1] + w
      demand.total = demand.total + hw[1] + w
      others_want = others_want + w
    end
    if ghost then
      -- A ghost holds its whole safe share of each supplier, but no more of the
      -- limit than it could send in all.
      total_all = total_all - demand.total + ghost[2]
      demand.total = ghost[2]
    end
    others[#others + 1] = demand
  end
end

local starved, full = false, false
local function publish()
  if switched then
    redis.call('PUBLISH', channel, 'switched ' .. id .. ' ' .. run_id)
  elseif reset then
    redis.call('PUBLISH', channel, 'reset ' .. id)
  elseif others_want > 0 and (lowered or dropped > 0) and not full then
    redis.call('PUBLISH', channel, 'freed ' .. id)
  elseif starved then
    redis.call('PUBLISH', channel, 'wanted ' .. id)
    return 1
  end
  return 0
end

-- (7) Tokens: deposits first, then a withdrawal of whole tokens. Every token is
-- in the bucket or in a worker's pool, so the bucket holds at most the capacity
-- less every pool: the fleet together never has more than one bucket.
local levels = redis.call('HMGET', KEYS[3], unpack(names))
local taken, level = {}, {}
local writes = {}
for i = 1, n do
  local room = math.max(0, capacities[i] - pools[names[i]] - pool[i])
  local l = math.min(room, (tonumber(levels[i]) or room) + deposit[i])
  local t = 0
  if not bye then t = math.max(0, math.min(withdraw[i], math.floor(l))) end
  taken[i], level[i] = t, l - t
  if l ~= tonumber(levels[i]) or t > 0 then
    writes[#writes + 1] = names[i]
    writes[#writes + 1] = string.format('%.6f', level[i])
  end
end
if #writes > 0 then redis.call('HSET', KEYS[3], unpack(writes)) end

if bye then
  redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id)
  redis.call('HDEL', KEYS[8], id)
  local none = {}
  for i = 1, n do none[i] = 0 end
  lower(none)
  publish()
  return {0, 0, 0, #others, 0, 0, 0, ''}
end

local mine, my_demand = 0, 0
for i = 1, n do
  mine = mine + held[i]
  my_demand = my_demand + held[i] + want[i]
  held_all[names[i]] = held_all[names[i]] + held[i]
end
total_all = total_all + mine

-- (5) Max-min fair division of cap among demands: the small ones in full, the
-- rest an equal part each; the slots left over rotate among them every second.
local function fill(cap, my, key)
  local list = {{id = id, d = my}}
  for _, o in ipairs(others) do
    local d = o.total
    if key then d = o.per[key] or 0 end
    list[#list + 1] = {id = o.id, d = d}
  end
  table.sort(list, function(a, b)
    if a.d == b.d then return a.id < b.id end
    return a.d < b.d
  end)
  local left, i = cap, 1
  while i <= #list and list[i].d * (#list - i + 1) <= left do
    if list[i].id == id then return my end
    left = left - list[i].d
    i = i + 1
  end
  local rest = {}
  for j = i, #list do rest[#rest + 1] = list[j].id end
  table.sort(rest)
  local m = #rest
  local part = math.floor(left / m)
  local extra = left - part * m
  local start = math.floor(now / 1000) % m
  for j = 1, m do
    if rest[j] == id then
      if (j - 1 - start) % m < extra then return part + 1 end
      return part
    end
  end
  return my
end

local allowed_total = fill(limit, my_demand, nil)
local allowed = {}
for i = 1, n do allowed[i] = fill(shares[i], held[i] + want[i], names[i]) end

-- (6) Grants, one slot at a time, each to the wanted supplier this worker
-- holds fewest of (ties rotate): every request asks every supplier, so a
-- worker with two cedar slots and no atlas slot finishes nothing.
local granted, room, cap = {}, {}, {}
local room_total, cap_total = limit - total_all, math.huge
for i = 1, n do
  granted[i] = 0
  room[i] = shares[i] - held_all[names[i]]
  cap[i] = math.huge
  if others_want > 0 then cap[i] = allowed[i] - held[i] end
end
if others_want > 0 then cap_total = allowed_total - mine end
if not quiet then
  -- Rotate over the suppliers themselves: a hedge bucket's entry (share 0,
  -- after them) holds and wants no slot and must not tilt the ties.
  local suppliers_n = 0
  for i = 1, n do if shares[i] > 0 then suppliers_n = suppliers_n + 1 end end
  local start = now % math.max(1, suppliers_n)
  while room_total > 0 and cap_total > 0 do
    local best
    for j = 0, n - 1 do
      local i = (start + j) % n + 1
      if granted[i] < want[i] and room[i] > 0 and cap[i] > 0
          and (not best or held[i] + granted[i] < held[best] + granted[best]) then
        best = i
      end
    end
    if not best then break end
    granted[best], room[best], cap[best] = granted[best] + 1, room[best] - 1, cap[best] - 1
    room_total, cap_total = room_total - 1, cap_total - 1
  end
end

-- A slot given back and taken again in the same call (a lopsided lease
-- traded) frees nothing for anyone else: no message then.
full = room_total <= 0

-- Still waiting below its fair part while the slots are taken: someone holds
-- more than theirs, and learns it now rather than at its next heartbeat.
local after = mine
for i = 1, n do after = after + granted[i] end
for i = 1, n do
  if may_announce and not quiet and granted[i] < want[i] and after < allowed_total
      and (room_total == 0 or (room[i] == 0 and held[i] + granted[i] < allowed[i])) then
    starved = true
  end
end

local after_grants = {}
for i = 1, n do after_grants[i] = held[i] + granted[i] end
lower(after_grants)

-- This worker's place among the live ones, by id: while Redis is out, a share
-- smaller than the workers goes one slot each to the first ``share`` (safe.py).
local rank = 0
for _, o in ipairs(others) do
  if o.id < id then rank = rank + 1 end
end

-- (3) This worker's whole truth, with a new expiry.
local parts = {}
for i = 1, n do
  parts[#parts + 1] = names[i]
  parts[#parts + 1] = held[i] + granted[i]
  parts[#parts + 1] = want[i] - granted[i]
  parts[#parts + 1] = string.format('%.3f', pool[i] + taken[i])
end
parts[#parts + 1] = now
redis.call('HSET', KEYS[2], id, table.concat(parts, ' '))
redis.call('ZADD', KEYS[1], now + ttl, id)
-- What it would send on its own, should this be its last sync: by what this
-- reply tells it, or (the reply lost) by what the one before did.
local workers_now = #others + 1
local before = parse_safe(redis.call('HGET', KEYS[8], id))
local known = {safe(limit, workers_now), before and before.now_total or safe(limit, workers_now)}
for i = 1, n do
  local mine = safe(shares[i], workers_now, rank)
  known[#known + 1] = names[i] .. ' ' .. mine .. ' ' .. (before and before.now[names[i]] or mine)
end
redis.call('HSET', KEYS[8], id, table.concat(known, ' '))
-- Keys of a fleet that stopped altogether vanish on their own, together.
for key = 1, 8 do
  if key ~= 3 and key ~= 7 then redis.call('PEXPIRE', KEYS[key], 10 * ttl + grace_ms) end
end

local announced = publish()

local reply = {quiet and 1 or 0, others_want > 0 and 1 or 0, allowed_total, #others + 1,
  announced, rank, moved and 1 or 0, run_id}
for i = 1, n do
  local free = math.max(0, math.min(room[i], room_total, cap[i], cap_total))
  -- Could have been granted, were the limit not full: worth trading a slot for.
  local grantable = math.max(0, math.min(room[i], cap[i]))
  if quiet then free, grantable = 0, 0 end
  reply[#reply + 1] = granted[i]
  reply[#reply + 1] = allowed[i]
  reply[#reply + 1] = free
  reply[#reply + 1] = grantable
  reply[#reply + 1] = taken[i]
  reply[#reply + 1] = string.format('%.6f', level[i])
end
return reply
