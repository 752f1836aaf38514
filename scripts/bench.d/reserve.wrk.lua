-- wrk script: POST reservations, each request with its own Idempotency-Key,
-- spread over the admit tokens in $BENCH_TOKENS (one per line).
--
-- The keys are unique across wrk runs, not only within one: each thread of
-- each run draws its own prefix from /dev/urandom. With a prefix of
-- $BENCH_RUN and the thread alone, every run after the first on the same
-- sale began by re-sending the earlier runs' keys, and a replay (one GET,
-- the first answer back) costs the origin far less than a new hold: the
-- second of two 3 s runs answered 61,963 requests but made 20,001 holds,
-- and scripts/bench's peak was mostly replays (issue 16).
--
-- No response() callback: with one, wrk parses every answer's headers and
-- body into Lua, and wrk shares the 2 cores with the origin (its CPU at
-- the peak: 30 % of a core with one, 27 % without, pidstat); wrk counts
-- non-2xx answers itself, and scripts/bench checks every answer made a hold.
--
-- Each request is built from parts made once in init(): wrk.format per
-- request (a headers table, five string.formats and a concat in LuaJIT)
-- cost wrk ~15 µs of CPU per request at the peak, against ~12 µs for one
-- concatenation of a prebuilt head, the counter and a fixed tail (pidstat of
-- wrk over three alternating pairs of 8 s peak runs, 2026-12-04). The bytes
-- sent are the same request: method, path, Host, Content-Type,
-- Content-Length, Authorization, Idempotency-Key, body.
local threads = {}
local next_id = 0
-- $BENCH_BODY: the reservation's body (scripts/bench sends
-- {"sku":"hot","qty":1} to its 20-SKU sale); one SKU's sale: {"qty":1}.
-- $BENCH_SKU_IDS: a file of SKU ids, one per line, all of one length
-- (uniform demand, issue 45): request i asks for id i mod n, so every SKU
-- is asked equally, and the body keeps one length (Content-Length is in
-- the prebuilt head).
local body = os.getenv("BENCH_BODY") or '{"qty":1}'
local sku_file = os.getenv("BENCH_SKU_IDS")
local tails = nil
if sku_file then
  tails = {}
  for id in io.lines(sku_file) do
    local b = '{"sku":"' .. id .. '","qty":1}'
    assert(#tails == 0 or #b == #body, "BENCH_SKU_IDS: ids of one length")
    body = b
    tails[#tails + 1] = "\r\n\r\n" .. b
  end
end

function setup(thread)
  thread:set("tid", next_id)
  next_id = next_id + 1
  table.insert(threads, thread)
end

function init(args)
  local f = assert(io.open("/dev/urandom", "rb"))
  local bytes = f:read(8)
  f:close()
  local hex = bytes:gsub(".", function(c) return string.format("%02x", c:byte()) end)
  local prefix = os.getenv("BENCH_RUN") .. "-" .. hex .. "-" .. tid .. "-"
  -- wrk.init (run before this) has set the Host header to host:port.
  local head = "POST " .. wrk.path .. " HTTP/1.1\r\nHost: " .. wrk.headers["Host"]
    .. "\r\nContent-Type: application/json\r\nContent-Length: " .. #body
    .. "\r\nAuthorization: Bearer "
  heads = {}
  for line in io.lines(os.getenv("BENCH_TOKENS")) do
    heads[#heads + 1] = head .. line .. "\r\nIdempotency-Key: " .. prefix
  end
  counter = 0
end

local tail = "\r\n\r\n" .. body

function request()
  counter = counter + 1
  if tails then
    return heads[(counter % #heads) + 1] .. counter .. tails[(counter % #tails) + 1]
  end
  return heads[(counter % #heads) + 1] .. counter .. tail
end
