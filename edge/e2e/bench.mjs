// Edge benchmark through local `wrangler dev` (run by scripts/bench-edge).
// Local throughput is the dev stack's (Node proxy + workerd on 2 cores),
// so every figure is also given as a ratio against a plain-text route
// measured in the same run. Load comes from wrk (C, little client CPU).
// Prints a markdown table; asserts nothing.
import { execFileSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { EDGE, call, createSale, pool, rid, sleep, userToken } from './lib.mjs';

const SECONDS = Number(process.env.BENCH_SECONDS || 8);
const C = Number(process.env.BENCH_CONCURRENCY || 16);
const DIR = process.env.RUN_DIR;

function wrk(path, script, env = {}) {
  const args = ['-t2', `-c${C}`, `-d${SECONDS}s`, '--latency', '--timeout', '10s'];
  if (script) args.push('-s', script);
  const out = execFileSync('wrk', [...args, `${EDGE}${path}`], {
    encoding: 'utf8', env: { ...process.env, ...env }, timeout: (SECONDS + 30) * 1000,
  });
  const num = (re) => { const m = out.match(re); return m ? Number(m[1]) : NaN; };
  const ms = (re) => {
    const m = out.match(re);
    if (!m) return NaN;
    const v = Number(m[1]);
    return m[2] === 'us' ? v / 1000 : m[2] === 's' ? v * 1000 : v;
  };
  const n = num(/(\d+) requests in/);
  return {
    rps: num(/Requests\/sec:\s+([\d.]+)/),
    n,
    bad: num(/Non-2xx or 3xx responses: (\d+)/) || 0,
    errors: out.match(/Socket errors:.*/)?.[0] || '',
    p50: ms(/50%\s+([\d.]+)(us|ms|s)/),
    p99: ms(/99%\s+([\d.]+)(us|ms|s)/),
  };
}

const SALE = `bench-${rid()}`;
createSale({
  sale: SALE, name: 'bench', units: 100000, 'per-user-limit': 1, shards: 2,
  'starts-at': 'now', 'admission-rate': 0.05, 'admission-factor': 2, 'queue-shards': 1,
  'join-limit': 0, // joins/s from one address is what this measures
});
// The same joins against a sale whose queue has 8 shards (issue 20).
const SALE8 = `bench8-${rid()}`;
createSale({
  sale: SALE8, name: 'bench 8 shards', units: 100000, 'per-user-limit': 1, shards: 2,
  'starts-at': 'now', 'admission-rate': 0.05, 'admission-factor': 2, 'queue-shards': 8,
  'join-limit': 0,
});

// Tickets to poll with (people who stay waiting: the rate is tiny).
const first = Array.from({ length: 300 }, (_, i) => userToken(`bench-first-${i}-${rid()}`));
const tickets = (await pool(first, 8, async (t) =>
  (await call('POST', `${EDGE}/api/sales/${SALE}/queue`, { token: t })).body.ticket)).filter(Boolean);
const ticketsFile = join(DIR, 'tickets.txt');
writeFileSync(ticketsFile, `${tickets.join('\n')}\n`);
const tokensFile = join(DIR, 'tokens.txt');
writeFileSync(tokensFile, `${Array.from({ length: 60000 }, (_, i) => userToken(`bench-${i}-${rid()}`)).join('\n')}\n`);

const pollLua = join(DIR, 'poll.lua');
writeFileSync(pollLua, `
local tickets = {}
for line in io.lines(os.getenv("TICKETS_FILE")) do tickets[#tickets + 1] = line end
local i = math.random(1, #tickets)
request = function()
  i = i + 1
  return wrk.format("GET", nil, { ["Authorization"] = "Bearer " .. tickets[(i % #tickets) + 1] })
end
`);
const joinLua = join(DIR, 'join.lua');
writeFileSync(joinLua, `
local tokens = {}
for line in io.lines(os.getenv("TOKENS_FILE")) do tokens[#tokens + 1] = line end
local next_tid = 0
function setup(thread) thread:set("tid", next_tid); next_tid = next_tid + 1 end
local k = 0
request = function()
  -- two threads take alternate tokens: every join is a new account
  local idx = (k * 2 + tid) % #tokens + 1
  k = k + 1
  return wrk.format("POST", nil, { ["Authorization"] = "Bearer " .. tokens[idx] })
end
`);

// Warm up, then joins; then plain route and polls alternate three times
// each (the machine's background load drifts) and medians are reported.
wrk('/api/ping');
const joins = wrk(`/api/sales/${SALE}/queue`, joinLua, { TOKENS_FILE: tokensFile });
const joins8 = wrk(`/api/sales/${SALE8}/queue`, joinLua, { TOKENS_FILE: tokensFile });
await sleep(1500);
const doRequests = async () => (await call('GET', `${EDGE}/api/sales/${SALE}`)).body.queue.do_requests;
const plains = [];
const pollRuns = [];
let doCalls = 0;
for (let round = 0; round < 3; round++) {
  plains.push(wrk('/api/ping'));
  const before = await doRequests();
  pollRuns.push(wrk(`/api/sales/${SALE}/queue`, pollLua, { TICKETS_FILE: ticketsFile }));
  await sleep(1500);
  doCalls += Math.max(0, (await doRequests()) - before - 1); // minus the summary's own refresh
}
const sample = await call('GET', `${EDGE}/api/sales/${SALE}/queue`, { token: tickets[0] });
const median = (runs) => [...runs].sort((a, b) => a.rps - b.rps)[1];
const plain1 = median(plains);
const polls = { ...median(pollRuns), n: pollRuns.reduce((n, r) => n + r.n, 0) };
const plain = plain1.rps;
const f = (x, d = 0) => (Number.isFinite(x) ? x.toFixed(d) : 'n/a');
console.log(`\n### Edge through local wrangler dev (wrk -t2 -c${C}, ${SECONDS} s per run)\n`);
console.log('| what | req/s | × plain route | p50 ms | p99 ms | requests | non-2xx |');
console.log('|---|---|---|---|---|---|---|');
for (const [name, r] of [
  ['plain-text route `GET /api/ping` (median of 3 runs)', { ...plain1, n: plains.reduce((n, r) => n + r.n, 0), bad: plains.reduce((n, r) => n + r.bad, 0) }],
  ['join `POST /api/sales/{sale}/queue`, queue of 1 shard (new account: one shard write + ticket)', joins],
  ['join, the same accounts, queue of 8 shards', joins8],
  ['status poll `GET /api/sales/{sale}/queue` (median of 3 runs, alternating with the plain route)', { ...polls, bad: pollRuns.reduce((n, r) => n + r.bad, 0) }],
]) {
  console.log(`| ${name} | ${f(r.rps)} | ${f(r.rps / plain, 2)} | ${f(r.p50, 1)} | ${f(r.p99, 1)} | ${r.n} | ${r.bad} |`);
}
console.log(`\nruns (req/s): plain ${plains.map((r) => f(r.rps)).join(', ')}; polls ${pollRuns.map((r) => f(r.rps)).join(', ')}; ratio per round ${pollRuns.map((r, i) => f(r.rps / plains[i].rps, 2)).join(', ')}\n`);
console.log('| edge figure | value | target |');
console.log('|---|---|---|');
console.log(`| status poll throughput / plain route | ${f(polls.rps / plain, 2)} | ≥ 0.8 |`);
console.log(`| Durable Object calls per 1,000 status polls | ${f((doCalls * 1000) / polls.n, 2)} (${doCalls} calls / ${polls.n} polls in 3 × ${SECONDS} s) | 0 per poll; ≤ 1 per isolate per second |`);
console.log(`| token verify in Wasm (release, wasm32 under Node) | ${process.env.WASM_VERIFY_US || 'n/a'} µs | ≤ 10 µs |`);
console.log(`\nsample poll answer: status=${sample.body.status} place=${sample.body.place} poll_after_ms=${sample.body.poll_after_ms}`);
