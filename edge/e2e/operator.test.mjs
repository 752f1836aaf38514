// The operator's hand through the origin's admin API (issue 47), end to
// end: a pause reaches every queue shard's waiting people within 5 s, a
// message reaches the edge's summary (what every waiting page reads)
// within 5 s, and the admin API's live view carries the edge's queue
// figures. The sale has 4 queue shards whatever the pass, so "every shard"
// is more than one.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { EDGE, admin, call, createSale, rid, shardOf, sleep, userToken, until } from './lib.mjs';

const SALE = `e2e-op-${rid()}`;
const SHARDS = 4;
const BOUND_MS = 5_000;
// The end of checkout is not an operator's change (those are bound by 5 s,
// issue 47): its figure is measured and printed (2.4-2.6 s on an idle
// 2-core machine). Its path is longer by the origin's call to the edge
// after the webhook, and one CI run on a loaded runner took 5.1 s; what
// this bound must catch is a turn that passes on only when the hold ends
// (minutes) or after 30 s unseen.
const PAID_BOUND_MS = 8_000;
const people = Array.from({ length: 32 }, (_, i) => ({ account: `op-${i}-${rid()}` }));

async function status(p) {
  const r = await call('GET', `${EDGE}/api/sales/${SALE}/queue`, { token: p.ticket, timeoutMs: 20_000 });
  assert.equal(r.status, 200, JSON.stringify(r.body));
  if (r.body.ticket) p.ticket = r.body.ticket;
  return r.body;
}

/** Polls `check` every 200 ms until true; answers the milliseconds it took (or Infinity). */
async function timeUntil(check, ms = 20_000) {
  const t0 = Date.now();
  const ok = await until(ms, check, 200);
  return ok ? Date.now() - t0 : Infinity;
}

test('setup: a live sale on 4 queue shards, people waiting on each', async () => {
  createSale({
    sale: SALE, name: 'E2E operator', units: 50, 'per-user-limit': 1, shards: 1,
    'queue-shards': SHARDS, 'starts-at': 'now', 'admission-rate': 0.2,
  });
  for (const p of people) {
    const r = await call('POST', `${EDGE}/api/sales/${SALE}/queue`, { token: userToken(p.account) });
    assert.equal(r.status, 200, JSON.stringify(r.body));
    p.ticket = r.body.ticket;
    p.shard = shardOf(p.account, SHARDS);
  }
  const shards = new Set(people.map((p) => p.shard));
  assert.equal(shards.size, SHARDS, 'someone waits on every shard');
  // Everyone has a place (and the last of each shard waits).
  const placed = await until(30_000, async () => {
    for (const p of people) if ((await status(p)).place == null) return false;
    return true;
  }, 500);
  assert.ok(placed, 'every person placed');
});

test('a pause from the admin API reaches a waiting person on every shard within 5 s; resume too', async () => {
  // The last-placed person of each shard: surely still waiting.
  const waiting = [];
  for (let s = 0; s < SHARDS; s++) waiting.push(people.filter((p) => p.shard === s).at(-1));
  for (const p of waiting) assert.equal((await status(p)).status, 'waiting');
  const r = await admin('POST', `sales/${SALE}/pause`);
  assert.equal(r.status, 200, JSON.stringify(r.body));
  const took = await timeUntil(async () => {
    const all = await Promise.all(waiting.map(status));
    return all.every((s) => s.status === 'paused');
  });
  assert.ok(took <= BOUND_MS, `every shard's waiting person saw paused after ${took} ms`);
  console.log(`pause seen on all ${SHARDS} shards after ${took} ms`);
  // The admin live view reads the edge's figures (ADMIN_EDGE_URL).
  const live = await until(10_000, async () => {
    const l = await admin('GET', `sales/${SALE}/live`);
    assert.equal(l.status, 200, JSON.stringify(l.body));
    return l.body.queue?.paused === true && l.body.queue.placed >= people.length ? l.body : false;
  }, 500);
  assert.ok(live, 'the live view shows the edge paused with everyone placed');

  const back = await admin('POST', `sales/${SALE}/resume`);
  assert.equal(back.status, 200);
  const resumed = await timeUntil(async () => {
    const all = await Promise.all(waiting.map(status));
    return all.every((s) => s.status !== 'paused');
  });
  assert.ok(resumed <= BOUND_MS, `resume seen on every shard after ${resumed} ms`);
});

test('a message from the admin API is in the edge summary within 5 s, as text, and comes down again', async () => {
  const text = `Size 42 is <b>sold out</b> ${rid()}`;
  const r = await admin('POST', `sales/${SALE}/message`, { text });
  assert.equal(r.status, 200, JSON.stringify(r.body));
  const took = await timeUntil(async () => {
    const s = await call('GET', `${EDGE}/api/sales/${SALE}`);
    return s.body.message === text;
  });
  assert.ok(took <= BOUND_MS, `the message reached the edge after ${took} ms`);
  const long = await admin('POST', `sales/${SALE}/message`, { text: 'x'.repeat(281) });
  assert.equal(long.body.error?.code, 'message_too_long');
  await sleep(1200);
  assert.equal((await call('GET', `${EDGE}/api/sales/${SALE}`)).body.message, text, 'a refused message changed nothing');
  assert.equal((await admin('POST', `sales/${SALE}/message`, { text: '' })).status, 200);
  const gone = await timeUntil(async () => (await call('GET', `${EDGE}/api/sales/${SALE}`)).body.message == null);
  assert.ok(gone <= BOUND_MS, `taken down after ${gone} ms`);
  // Every write, and the refused one, in the audit log.
  const a = await admin('GET', `audit?sale=${SALE}`);
  assert.deepEqual(a.body.entries.map((e) => [e.action, e.refused]),
    [['message', false], ['message', true], ['message', false], ['resume', false], ['pause', false]]);
  assert.ok(a.body.entries.every((e) => e.key_id === 'ops-e2e'));
});

test('a revoke from the admin API passes the turn on at once: the next person is admitted, the revoked one can no longer reserve', async () => {
  // Two units, factor 1: two people admitted, the third waits for a share
  // of the inventory cap, which only a given-back turn frees.
  const REV = `e2e-rev-${rid()}`;
  createSale({
    sale: REV, name: 'E2E revoke', units: 2, 'per-user-limit': 1, shards: 1,
    'queue-shards': 2, 'starts-at': 'now', 'admission-rate': 5, 'admission-factor': 1,
  });
  const line = Array.from({ length: 4 }, (_, i) => ({ account: `rev-${i}-${rid()}` }));
  const st = async (p) => {
    const r = await call('GET', `${EDGE}/api/sales/${REV}/queue`, { token: p.ticket, timeoutMs: 20_000 });
    assert.equal(r.status, 200, JSON.stringify(r.body));
    if (r.body.ticket) p.ticket = r.body.ticket;
    p.last = r.body;
    return r.body;
  };
  for (const p of line) {
    const r = await call('POST', `${EDGE}/api/sales/${REV}/queue`, { token: userToken(p.account) });
    assert.equal(r.status, 200, JSON.stringify(r.body));
    p.ticket = r.body.ticket;
    await sleep(1100); // one a second: places follow this order
  }
  const two = await until(30_000, async () => {
    for (const p of line) await st(p);
    return line.filter((p) => p.last.status === 'admitted').length === 2 && line.some((p) => p.last.status === 'waiting');
  }, 500);
  assert.ok(two, `two admitted, one waiting: ${JSON.stringify(line.map((p) => [p.last.place, p.last.status]))}`);
  // Seen while admitted (the page polls), then held at the cap for a moment.
  await sleep(3000);
  for (const p of line) await st(p);
  const admitted = line.filter((p) => p.last.status === 'admitted');
  assert.equal(admitted.length, 2, 'the cap holds the third');
  const next = line.filter((p) => p.last.status === 'waiting').sort((a, b) => a.last.place - b.last.place)[0];
  const gone = admitted[0];
  const oldToken = gone.last.admission_token;
  assert.ok(oldToken, 'an admitted person holds an admit token');
  const r = await admin('POST', `sales/${REV}/revoke`, { account: gone.account });
  assert.equal(r.status, 200, JSON.stringify(r.body));
  assert.equal(r.body.after.edge, 'passed_on');
  const t0 = Date.now();
  const took = await timeUntil(async () => (await st(next)).status === 'admitted', 30_000);
  console.log(`revoke → next person admitted after ${took} ms (t0 = the admin API's answer)`);
  assert.ok(took <= BOUND_MS, `the next person was admitted ${took} ms after the revoke`);
  const closed = await until(10_000, async () => (await st(gone)).status === 'closed', 250);
  assert.ok(closed, `the revoked person's turn is over: ${JSON.stringify(gone.last)}`);
  assert.ok(Date.now() - t0 < 15_000);
  // Their admit token from before the revoke no longer buys.
  const res = await call('POST', `${EDGE}/api/sales/${REV}/reservations`, {
    token: oldToken, body: { qty: 1 }, headers: { 'idempotency-key': `rev-${rid()}` },
  });
  assert.equal(res.status, 403, JSON.stringify(res.body));
  assert.equal(res.body.error.code, 'admission_revoked');
  const live = await admin('GET', `sales/${REV}/live`);
  assert.ok(live.body.queue == null || live.body.queue.turns_passed_on >= 1, JSON.stringify(live.body.queue));
});

test('a failed bot check of a sale with a shadow queue gets a place that never moves up, counted; without it, the error, counted too', async () => {
  const SHADOW = `e2e-shadow-${rid()}`;
  createSale({
    sale: SHADOW, name: 'E2E shadow', units: 50, 'per-user-limit': 1, shards: 1, 'queue-shards': 2,
    'starts-at': 'now', 'admission-rate': 50, 'bot-check': 'pow:20', 'bot-shadow': true,
  });
  const bots = Array.from({ length: 3 }, (_, i) => ({ account: `bot-${i}-${rid()}` }));
  for (const b of bots) {
    // No proof of work at all: a real sale answers 4xx bot_check_required.
    const r = await call('POST', `${EDGE}/api/sales/${SHADOW}/queue`, { token: userToken(b.account), body: {} });
    assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.ok(r.body.ticket && r.body.admission_token === undefined, JSON.stringify(r.body));
    b.ticket = r.body.ticket;
  }
  // Polled for a while at a rate that would admit 50 people a second: never.
  const end = Date.now() + 6_000;
  while (Date.now() < end) {
    for (const b of bots) {
      const s = await call('GET', `${EDGE}/api/sales/${SHADOW}/queue`, { token: b.ticket });
      assert.equal(s.status, 200, JSON.stringify(s.body));
      assert.equal(s.body.status, 'waiting', JSON.stringify(s.body));
      assert.ok(s.body.place >= 1 && s.body.position >= 1 && s.body.admission_token === undefined, JSON.stringify(s.body));
    }
    await sleep(500);
  }
  const live = await until(10_000, async () => {
    const l = await admin('GET', `sales/${SHADOW}/live`);
    return l.body.queue?.shadowed >= bots.length ? l.body.queue : false;
  }, 500);
  assert.ok(live, 'the live view counts the shadowed joins');
  assert.equal(live.placed, 0, 'no shard knows them');
  // Turned off: the same join is refused with its own code again (the edge
  // reads the setting from a summary up to a minute old: a fresh sale).
  const PLAIN = `e2e-noshadow-${rid()}`;
  createSale({
    sale: PLAIN, name: 'E2E no shadow', units: 5, 'per-user-limit': 1, shards: 1, 'queue-shards': 1,
    'starts-at': 'now', 'bot-check': 'pow:20',
  });
  const r = await call('POST', `${EDGE}/api/sales/${PLAIN}/queue`, { token: userToken(`bot-x-${rid()}`), body: {} });
  assert.ok(r.status >= 400 && r.status < 500, JSON.stringify(r.body));
  assert.match(r.body.error.code, /^bot_check_/);
  const refused = await until(10_000, async () => {
    const l = await admin('GET', `sales/${PLAIN}/live`);
    return l.body.queue?.bot_refused === 1 ? l.body.queue : false;
  }, 500);
  assert.ok(refused, 'the live view counts the refusal');
  assert.equal(refused.shadowed, 0);
});

test('after a paid purchase that uses up the account\'s limit, the origin ends its admission: the turn passes on', async () => {
  const BUY = `e2e-buy-${rid()}`;
  createSale({
    sale: BUY, name: 'E2E buy', units: 5, 'per-user-limit': 1, shards: 1, 'queue-shards': 4,
    'starts-at': 'now', 'admission-rate': 5, 'price-cents': 1000,
  });
  const p = { account: `buyer-${rid()}` };
  const j = await call('POST', `${EDGE}/api/sales/${BUY}/queue`, { token: userToken(p.account) });
  assert.equal(j.status, 200, JSON.stringify(j.body));
  p.ticket = j.body.ticket;
  let s;
  assert.ok(await until(20_000, async () => {
    s = (await call('GET', `${EDGE}/api/sales/${BUY}/queue`, { token: p.ticket })).body;
    if (s.ticket) p.ticket = s.ticket;
    return s.status === 'admitted';
  }, 300), 'admitted');
  const hold = await call('POST', `${EDGE}/api/sales/${BUY}/reservations`, {
    token: s.admission_token, body: { qty: 1 }, headers: { 'idempotency-key': `buy-${rid()}` },
  });
  assert.equal(hold.status, 202, JSON.stringify(hold.body));
  const id = hold.body.reservation_id;
  const pay = await call('POST', `${EDGE}/api/reservations/${encodeURIComponent(id)}/purchase`, {
    token: s.admission_token, headers: { 'idempotency-key': `pay-${rid()}` },
  });
  assert.ok([200, 201, 202].includes(pay.status), JSON.stringify(pay.body));
  const done = await call('POST', `${EDGE}${pay.body.checkout_url}`, { body: { outcome: 'succeeded' } });
  assert.equal(done.status, 200, JSON.stringify(done.body));
  const t0 = Date.now();
  const took = await timeUntil(async () => {
    const b = (await call('GET', `${EDGE}/api/sales/${BUY}/queue`, { token: p.ticket })).body;
    return b.status === 'closed' && b.reason === 'abandoned';
  }, 20_000);
  console.log(`paid → the buyer's turn passed on after ${took} ms`);
  assert.ok(took <= PAID_BOUND_MS, `the buyer's turn passed on ${took} ms after the payment`);
  const again = await call('POST', `${EDGE}/api/sales/${BUY}/reservations`, {
    token: s.admission_token, body: { qty: 1 }, headers: { 'idempotency-key': `buy2-${rid()}` },
  });
  assert.equal(again.status, 409, 'at its limit: told so, as before');
  assert.equal(again.body.error.code, 'per_user_limit');
});
