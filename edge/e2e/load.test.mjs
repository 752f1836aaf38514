// Invariant 8 (bounded origin load) end to end: many people, fast clients
// that ignore every `poll_after_ms` and `Retry-After`, through real
// `wrangler dev` to a real origin. The origin's own request counter
// (`flashsale_reservation_requests_total` on /metrics) must stay within
// what the admission rate and the per-account window allow:
//   admitted people ≤ rate × elapsed (+1), and
//   origin reservations ≤ Σ over admitted people of 10 per started 10 s
//   window (the edge limiter) — i.e. ≤ (rate × W + 1) × 10 × ⌈W / 10 s⌉,
// while the clients attempt many times that.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { EDGE, call, createSale, pool, reservationRequests, rid, sleep, userToken, until } from './lib.mjs';

const SALE = `e2e-load-${rid()}`;
const RATE = 2; // people admitted per second
const PEOPLE = 80;
const WINDOW_MS = 15_000;
const PER_WINDOW = 10; // edge limiter: reservations per account per 10 s

test(`${PEOPLE} fast clients for ${WINDOW_MS / 1000} s: origin reservation traffic stays within rate × window`, async () => {
  createSale({
    sale: SALE, name: 'E2E load', units: 100_000, 'per-user-limit': 1_000, shards: 2,
    'starts-at': 'now', 'admission-rate': RATE, 'admission-factor': 2,
  });
  const t0 = Date.now();
  const before = await reservationRequests();
  const people = Array.from({ length: PEOPLE }, (_, i) => ({ account: `ld-${i}-${rid()}`, attempts: 0 }));
  await pool(people, 16, async (p) => {
    const r = await call('POST', `${EDGE}/api/sales/${SALE}/queue`, { token: userToken(p.account) });
    assert.equal(r.status, 200, JSON.stringify(r.body));
    p.ticket = r.body.ticket;
  });
  const end = t0 + WINDOW_MS;
  let edge429 = 0;
  let fromOrigin = 0; // answers only the origin gives (202, 409)
  // Each person runs LANES loops at once (a script, not a browser tab).
  const LANES = 8;
  await Promise.all(people.flatMap((p) => Array.from({ length: LANES }, (_, lane) => [p, lane])).map(async ([p, lane]) => {
    while (Date.now() < end) {
      if (!p.admit) {
        if (lane > 0) {
          await sleep(150);
          continue;
        }
        const r = await call('GET', `${EDGE}/api/sales/${SALE}/queue`, { token: p.ticket });
        assert.equal(r.status, 200, JSON.stringify(r.body));
        if (r.body.ticket) p.ticket = r.body.ticket;
        if (r.body.status === 'admitted') {
          p.admit = r.body.admission_token;
          p.admittedAt = Date.now();
        }
        await sleep(150); // a fast client: ignores poll_after_ms
        continue;
      }
      p.attempts++;
      const r = await call('POST', `${EDGE}/api/sales/${SALE}/reservations`, {
        token: p.admit, body: { qty: 1 }, headers: { 'idempotency-key': `ld-${rid()}` },
      });
      if (r.status === 429) {
        edge429++;
        assert.ok(Number(r.headers.get('retry-after')) >= 1, 'Retry-After on 429');
      } else {
        assert.ok([202, 409].includes(r.status), `${r.status} ${JSON.stringify(r.body)}`);
        fromOrigin++;
      }
      await sleep(20); // and Retry-After
    }
  }));
  const elapsedS = (Date.now() - t0) / 1000;
  // Not a fixed wait: the counter must first show every request the
  // origin answered (a bound on a counter that did not move proves nothing).
  const counted = await until(5_000, async () => (await reservationRequests()) - before >= fromOrigin, 100);
  const reached = (await reservationRequests()) - before;
  assert.ok(counted, `the origin's counter shows ${reached} reservations; ${fromOrigin} answers came from it`);
  const admitted = people.filter((p) => p.admit);
  const attempts = people.reduce((s, p) => s + p.attempts, 0);
  const windows = Math.ceil(WINDOW_MS / 10_000);
  const bound = (RATE * elapsedS + 1) * PER_WINDOW * windows;
  // The exact budget of the people actually admitted, window by window.
  const budget = admitted.reduce((s, p) => s + PER_WINDOW * Math.ceil(Math.max(end - p.admittedAt, 1) / 10_000), 0);
  console.log(`load: ${admitted.length} admitted in ${elapsedS.toFixed(1)} s, ${attempts} attempts, `
    + `${edge429} refused at the edge, ${reached} reached the origin (budget ${budget}, bound ${bound.toFixed(0)})`);
  assert.ok(admitted.length >= 5, `people were admitted: ${admitted.length}`);
  assert.ok(admitted.length <= RATE * elapsedS + 1, `admitted ${admitted.length} in ${elapsedS} s at ${RATE}/s`);
  assert.ok(reached <= budget, `origin saw ${reached} reservations; the admitted people's budget is ${budget}`);
  assert.ok(reached <= bound, `origin saw ${reached} > rate × window bound ${bound}`);
  // Meaningful only if the clients asked for more than their budget (else
  // an edge that let everything through would pass too).
  assert.ok(attempts > budget && edge429 > 0,
    `the clients must exceed their budget: ${attempts} attempts, budget ${budget}, ${edge429} refused`);
});
