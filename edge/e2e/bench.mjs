// Edge benchmark through local `wrangler dev` (run by scripts/bench-edge).
// Local throughput is the dev stack's (Node proxy + workerd on 2 cores),
// so every figure is also given as a ratio against a plain-text route
// measured in the same run. Prints a markdown table; asserts nothing.
import { EDGE, call, createSale, pool, rid, sleep, userToken } from './lib.mjs';

const SECONDS = Number(process.env.BENCH_SECONDS || 8);
const C = Number(process.env.BENCH_CONCURRENCY || 16);

/** Runs `next()`-built requests for `seconds` with `C` in flight. */
async function load(makeReq, seconds = SECONDS) {
  const lat = [];
  let ok = 0;
  let n = 0;
  const end = Date.now() + seconds * 1000;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: C }, async () => {
      while (Date.now() < end) {
        const i = n++;
        const s = performance.now();
        const r = await makeReq(i);
        lat.push(performance.now() - s);
        if (r.status === 200) ok++;
      }
    }),
  );
  const secs = (performance.now() - t0) / 1000;
  lat.sort((a, b) => a - b);
  const q = (p) => lat[Math.min(lat.length - 1, Math.floor(p * lat.length))];
  return { n: lat.length, ok, rps: lat.length / secs, p50: q(0.5), p99: q(0.99) };
}

const ping = () => fetch(`${EDGE}/api/ping`).then(async (r) => (await r.text(), r));

const SALE = `bench-${rid()}`;
createSale({
  sale: SALE, name: 'bench', units: 100000, 'per-user-limit': 1, shards: 2,
  'starts-at': 'now', 'admission-rate': 0.05, 'admission-factor': 2,
});
// Warm up the isolate, the DO and the connection pool.
await pool(Array.from({ length: 200 }, (_, i) => i), C, () => ping());
await call('POST', `${EDGE}/api/sales/${SALE}/queue`, { token: userToken(`warm-${rid()}`) });

const plain1 = await load(() => ping());

const tokens = Array.from({ length: 40000 }, (_, i) => userToken(`bench-${i}-${rid()}`));
const tickets = [];
const joins = await load(async (i) => {
  const r = await call('POST', `${EDGE}/api/sales/${SALE}/queue`, { token: tokens[i] });
  if (r.status === 200 && tickets.length < 500) tickets.push(r.body.ticket);
  return r;
});

await sleep(1200);
const doRequests = async () => (await call('GET', `${EDGE}/api/sales/${SALE}`)).body.queue.do_requests;
const doBefore = await doRequests();
const statuses = new Map();
const polls = await load(async (i) => {
  const r = await call('GET', `${EDGE}/api/sales/${SALE}/queue`, { token: tickets[i % tickets.length] });
  statuses.set(r.body.status, (statuses.get(r.body.status) || 0) + 1);
  return r;
});
await sleep(1200);
const doAfter = await doRequests();
// The two summary reads may each have refreshed the snapshot once.
const doCalls = Math.max(0, doAfter - doBefore - 1);
const plain2 = await load(() => ping());

const plain = (plain1.rps + plain2.rps) / 2;
const fmt = (x, d = 0) => x.toFixed(d);
const verify = process.env.WASM_VERIFY_US || 'n/a';
const rows = [
  ['plain-text route `GET /api/ping` (baseline, mean of 2 runs)', plain, 1, plain1],
  ['join `POST /api/sales/{sale}/queue` (DO write + ticket)', joins.rps, joins.rps / plain, joins],
  ['status poll `GET /api/sales/{sale}/queue` (ticket check + cached frontier)', polls.rps, polls.rps / plain, polls],
];
console.log(`\n### Edge through local wrangler dev (c=${C}, ${SECONDS} s per run)\n`);
console.log('| what | req/s | × plain route | p50 ms | p99 ms | requests |');
console.log('|---|---|---|---|---|---|');
for (const [name, rps, ratio, r] of rows) {
  console.log(`| ${name} | ${fmt(rps)} | ${fmt(ratio, 2)} | ${fmt(r.p50, 1)} | ${fmt(r.p99, 1)} | ${r.n} |`);
}
console.log('');
console.log('| edge figure | value | target |');
console.log('|---|---|---|');
console.log(`| status poll throughput / plain route | ${fmt(polls.rps / plain, 2)} | ≥ 0.8 |`);
console.log(`| Durable Object calls per 1,000 status polls | ${fmt((doCalls * 1000) / polls.n, 2)} (${doCalls} calls / ${polls.n} polls) | 0 in steady state (≤ 1 per isolate per second) |`);
console.log(`| token verify in Wasm (release, wasm32 under Node) | ${verify} µs | ≤ 10 µs |`);
console.log(`\nstatus mix of the polls: ${JSON.stringify(Object.fromEntries(statuses))}; non-200 answers: joins ${joins.n - joins.ok}, polls ${polls.n - polls.ok}`);
