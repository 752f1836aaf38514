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
local threads = {}
local next_id = 0

function setup(thread)
  thread:set("tid", next_id)
  next_id = next_id + 1
  table.insert(threads, thread)
end

function init(args)
  tokens = {}
  for line in io.lines(os.getenv("BENCH_TOKENS")) do
    tokens[#tokens + 1] = line
  end
  local f = assert(io.open("/dev/urandom", "rb"))
  local bytes = f:read(8)
  f:close()
  local hex = bytes:gsub(".", function(c) return string.format("%02x", c:byte()) end)
  prefix = os.getenv("BENCH_RUN") .. "-" .. hex .. "-" .. tid .. "-"
  counter = 0
end

function request()
  counter = counter + 1
  local t = tokens[(counter % #tokens) + 1]
  return wrk.format("POST", nil, {
    ["Authorization"] = "Bearer " .. t,
    ["Idempotency-Key"] = prefix .. counter,
    ["Content-Type"] = "application/json",
  }, '{"qty":1}')
end
