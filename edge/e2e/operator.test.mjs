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
