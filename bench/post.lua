-- wrk script for the QuoteFlow benchmark: POST /api/quotes, one connection per
-- thread, so request() and response() alternate and one timestamp per thread
-- gives each request's latency. Every response is counted by status and its
-- latency put into a per-status histogram (4 significant digits, in µs).
--
-- Parameters come from the environment (wrk passes no arguments to done()):
--   BENCH_SCENARIO  normal|slow|broken|malformed|flaky   (default normal)
--   BENCH_QUANTITY  integer                              (default 2)
--   BENCH_SKU       the SKU asked for                    (default KB-001)
--   BENCH_ZIPF_SKUS N > 0: each request asks for one of the lab's HOT-01 …
--                   HOT-N instead, HOT-k with probability ∝ 1/k (Zipf, s = 1)
--   BENCH_INSPECT   1: also read 200 bodies (boreal quoted or failed, atlas or
--                   cedar failed, circuit_open answers, no failure at all,
--                   elapsed_ms)
--   BENCH_TIMELINE  1: also count 200s and boreal's quotes per 100 ms slot
--   BENCH_CODES     1: also count each supplier's failure codes in 200 bodies
--                   (`x code <supplier> <code>`)
--   BENCH_WRK_OUT   file done() writes its tab-separated results to
--   BENCH_AUTHORIZATION  an Authorization header to send (a caller's key)
--
-- wrk copies only flat tables between its Lua states (a nested table
-- crashes it), so each thread keeps one flat table `bench` of string keys.

local ffi = require("ffi")
ffi.cdef [[
typedef struct { long tv_sec; long tv_nsec; } bench_timespec;
int clock_gettime(int clk_id, bench_timespec *tp);
]]
local CLOCK_MONOTONIC = 1
local ts = ffi.new("bench_timespec")

local function now_us()
  ffi.C.clock_gettime(CLOCK_MONOTONIC, ts)
  return tonumber(ts.tv_sec) * 1000000 + math.floor(tonumber(ts.tv_nsec) / 1000)
end

local function bucket(us)
  if us < 10000 then
    return us
  end
  local width = 10 ^ (math.floor(math.log10(us)) - 3)
  return math.floor(us / width) * width
end

local scenario = os.getenv("BENCH_SCENARIO") or "normal"
local quantity = os.getenv("BENCH_QUANTITY") or "2"
local inspect = os.getenv("BENCH_INSPECT") == "1"
local timeline = os.getenv("BENCH_TIMELINE") == "1"
local codes = os.getenv("BENCH_CODES") == "1"
local sku = os.getenv("BENCH_SKU") or "KB-001"
local zipf_skus = tonumber(os.getenv("BENCH_ZIPF_SKUS") or "0")

local function body_for(asked)
  return '{"sku": "' .. asked .. '", "quantity": ' .. quantity .. ', "scenario": "' .. scenario .. '"}'
end

local threads = {}
local req = nil
local hot = nil -- Zipf: the N requests, and the cumulative weight up to each
local cumulative = nil
local started = nil

function setup(thread)
  table.insert(threads, thread)
  thread:set("thread_no", #threads)
end

local authorization = os.getenv("BENCH_AUTHORIZATION")

function init(args)
  local headers = { ["Content-Type"] = "application/json" }
  if authorization ~= nil and authorization ~= "" then
    headers["Authorization"] = authorization
  end
  req = wrk.format("POST", "/api/quotes", headers, body_for(sku))
  if zipf_skus > 0 then
    hot, cumulative = {}, {}
    local total = 0
    for k = 1, zipf_skus do
      total = total + 1 / k
      cumulative[k] = total
      hot[k] = wrk.format("POST", "/api/quotes", headers, body_for(string.format("HOT-%02d", k)))
    end
    for k = 1, zipf_skus do
      cumulative[k] = cumulative[k] / total
    end
    -- Each thread draws its own sequence.
    math.randomseed(now_us() + 7919 * (thread_no or 0))
  end
  bench = {}
end

local function zipf_request()
  local u = math.random()
  local low, high = 1, zipf_skus
  while low < high do -- the first k whose cumulative weight reaches u
    local mid = math.floor((low + high) / 2)
    if cumulative[mid] < u then
      low = mid + 1
    else
      high = mid
    end
  end
  return hot[low]
end

function request()
  started = now_us()
  if hot ~= nil then
    return zipf_request()
  end
  return req
end

local function add(key, n)
  bench[key] = (bench[key] or 0) + n
end

function response(status, headers, resp_body)
  if started == nil then
    return
  end
  local now = now_us()
  local us = now - started
  started = nil
  add("n " .. status, 1)
  add("h " .. status .. " " .. string.format("%d", bucket(us)), 1)
  if codes and status == 200 then
    for supplier, code in resp_body:gmatch('"supplier":%s*"([%w_%-]+)",%s*"code":%s*"([%w_]+)"') do
      add("x code " .. supplier .. " " .. code, 1)
    end
  end
  if inspect and status == 200 then
    local slot = nil
    if timeline then
      slot = string.format("t %d ", math.floor(now / 100000))
      add(slot .. "n", 1)
    end
    if resp_body:find('"supplier":%s*"boreal",%s*"sku"') then
      add("x boreal_quoted", 1)
      if slot then
        add(slot .. "q", 1)
      end
    end
    if resp_body:find('"supplier":%s*"boreal",%s*"code"') then
      add("x boreal_failed", 1)
    end
    if resp_body:find('"code":%s*"circuit_open"') then
      add("x circuit_open", 1)
    end
    if resp_body:find('"failures":%s*%[%]') then
      add("x complete", 1)
    end
    if resp_body:find('"supplier":%s*"atlas",%s*"code"') or resp_body:find('"supplier":%s*"cedar",%s*"code"') then
      add("x healthy_failed", 1)
    end
    local elapsed = tonumber(resp_body:match('"elapsed_ms":%s*([-%d%.eE+]+)'))
    if elapsed ~= nil and elapsed > (bench["x elapsed_ms_max"] or -1) then
      bench["x elapsed_ms_max"] = elapsed
    end
  end
end

function done(summary, latency, requests)
  local path = os.getenv("BENCH_WRK_OUT")
  if path == nil then
    return
  end
  local out = assert(io.open(path, "w"))
  out:write(string.format("s duration_us\t%d\n", summary.duration))
  out:write(string.format("s requests\t%d\n", summary.requests))
  out:write(string.format("s bytes\t%d\n", summary.bytes))
  for _, name in ipairs({ "connect", "read", "write", "status", "timeout" }) do
    out:write(string.format("s errors_%s\t%d\n", name, summary.errors[name]))
  end
  for _, p in ipairs({ 50, 90, 99, 99.9 }) do
    out:write(string.format("s wrk_p%s_us\t%d\n", p, latency:percentile(p)))
  end
  out:write(string.format("s wrk_max_us\t%d\n", latency.max))
  for _, thread in ipairs(threads) do
    local data = thread:get("bench")
    if data ~= nil then
      for key, value in pairs(data) do
        out:write(string.format("%s\t%.17g\n", key, value))
      end
    end
  end
  out:close()
end
