-- wrk script: POST reservations, each request with its own Idempotency-Key,
-- spread over the admit tokens in $BENCH_TOKENS (one per line).
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
  prefix = os.getenv("BENCH_RUN") .. "-" .. tid .. "-"
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

function response(status, headers, body)
  if status ~= 202 then
    bad = (bad or 0) + 1
  end
end
