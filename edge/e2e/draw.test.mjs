// The draw v2 end to end (issue 15, DESIGN.md "The draw, v2"): 300 real
// joins over 4 queue shards, a local drand-style beacon, the entrant set
// frozen into a Merkle tree at the start, the key from seed, root and the
// beacon round at or after the start; then the independent verifier
// (`origin audit draw`) passes on what the edge published and fails, naming
// the discrepancy, on a swapped pair, an injected leaf, another seed and
// another beacon value; receipts check out and each person's place is the
// one the published numbers give. (The page's own check of a receipt in
// Chromium is in page.test.mjs.)
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { cpSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  EDGE, call, createSale, decode, drawKey, leafOf, listedDraw, listingOf, merkleRoot, placesOf, pool,
  rid, sha256hex, spearman, userToken, until,
} from './lib.mjs';

const N = 300;
const SHARDS = 4;
const PERIOD = 2;
const randomness = (r) => sha256hex(`local-beacon-${r}`);

/** A drand-style beacon: round r is published at genesis + (r − 1) × period. */
async function startBeacon() {
  const genesis = Math.floor(Date.now() / 1000) - 100;
  const asked = [];
  const server = createServer((req, res) => {
    asked.push(req.url);
    const send = (status, body) => {
      res.writeHead(status, { 'content-type': 'application/json' });
      res.end(JSON.stringify(body));
    };
    if (req.url === '/info') return send(200, { period: PERIOD, genesis_time: genesis });
    const m = req.url.match(/^\/public\/(\d+)$/);
    if (!m) return send(404, { error: 'no such path' });
    const round = Number(m[1]);
    if (Date.now() < (genesis + (round - 1) * PERIOD) * 1000) return send(404, { error: 'not yet' });
    return send(200, { round, randomness: randomness(round) });
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  return { url: `http://127.0.0.1:${server.address().port}`, genesis, asked, close: () => server.close() };
}

/**
 * `origin audit draw …`: exit code and output. Asynchronous: the verifier
 * asks the beacon, which is served by this very process.
 */
async function audit(...args) {
  try {
    const { stdout } = await promisify(execFile)(process.env.ORIGIN_BIN, ['audit', 'draw', ...args], {
      encoding: 'utf8', env: process.env, timeout: 60_000,
    });
    return { code: 0, out: stdout };
  } catch (e) {
    return { code: e.code, out: `${e.stdout}${e.stderr}` };
  }
}

test(`${N} entrants over ${SHARDS} shards with a local beacon: the verifier passes, and tampering fails it`, async () => {
  const beacon = await startBeacon();
  try {
    const SALE = `e2e-draw-${rid()}`;
    const startsAtMs = Date.now() + 20_000;
    createSale({
      sale: SALE, name: 'E2E draw v2', units: 10, 'per-user-limit': 1, shards: 1, 'queue-shards': SHARDS,
      'starts-at': new Date(startsAtMs).toISOString(), 'admission-rate': 50, 'draw-beacon': beacon.url,
    });
    const accounts = Array.from({ length: N }, (_, i) => `draw-${rid()}-${i}`);
    const tickets = await pool(accounts, 16, async (a) => {
      const r = await call('POST', `${EDGE}/api/sales/${SALE}/queue`, { token: userToken(a) });
      assert.equal(r.status, 200, JSON.stringify(r.body));
      assert.equal(r.body.status, 'prequeue');
      const salt = decode(r.body.ticket).tkt.salt;
      assert.match(salt, /^[0-9a-f]{32}$/, 'a 16-byte salt in the ticket');
      return r.body.ticket;
    });
    assert.ok(Date.now() < startsAtMs - 1_000, 'joined before the start');

    // Before the start: the commitment and the beacon named; nothing else.
    const before = (await call('GET', `${EDGE}/api/sales/${SALE}`)).body.draw;
    assert.match(before.commitment, /^[0-9a-f]{64}$/);
    assert.equal(before.beacon.url, beacon.url);
    assert.equal(before.seed, null);
    assert.equal(before.key, null);
    assert.equal(before.entrants_root, null);
    const early = await call('GET', `${EDGE}/api/sales/${SALE}/queue/receipt`, { token: tickets[0] });
    assert.equal(early.status, 409);
    assert.equal(early.body.error.code, 'not_drawn');
    const noTicket = await call('GET', `${EDGE}/api/sales/${SALE}/queue/receipt`, { token: userToken(accounts[0]) });
    assert.equal(noTicket.status, 401, 'a user token is no ticket');

    const d = await listedDraw(SALE, 90_000);
    // The published draw adds up, recomputed here from the tickets' salts.
    assert.equal(d.version, 2);
    assert.equal(d.entrants, N);
    assert.equal(sha256hex(Buffer.from(d.seed, 'hex')), d.commitment);
    const leaves = accounts.map((a, i) => leafOf(a, decode(tickets[i]).tkt.salt));
    const root = merkleRoot(leaves).toString('hex');
    assert.equal(d.entrants_root, root);
    const expectRound = Math.ceil((Math.ceil(startsAtMs / 1000) - beacon.genesis) / PERIOD) + 1;
    assert.equal(d.beacon.round, expectRound, 'the first round at or after the start');
    assert.equal(d.beacon.value, randomness(expectRound));
    assert.equal(d.beacon.missed, false);
    const key = drawKey(d.seed, root, d.beacon.value);
    assert.equal(d.key, key.toString('hex'));
    assert.ok(beacon.asked.includes(`/public/${expectRound}`), 'the edge asked the beacon for that round');
    assert.ok(!beacon.asked.some((u) => u.startsWith('/public/') && u !== `/public/${expectRound}`), `only that round: ${beacon.asked}`);

    // Every person's place is the one the published numbers give.
    const expected = placesOf(key, leaves);
    const places = await pool(tickets, 16, async (t) => {
      const got = await until(15_000, async () => {
        const r = await call('GET', `${EDGE}/api/sales/${SALE}/queue`, { token: t });
        return r.body.place;
      });
      return got;
    });
    assert.deepEqual(places, expected);
    // Fairness: arrival order does not predict the place.
    const rho = spearman(accounts.map((_, i) => i + 1), places);
    assert.ok(Math.abs(rho) < 0.25, `Spearman rho ${rho}`);
    const listed = await listingOf(SALE, N);
    assert.equal(listed.length, N);
    assert.ok(listed.every((e) => !JSON.stringify(e).includes('draw-')), 'the listing carries no account ids');

    // The independent verifier passes on what the edge published…
    const dir = mkdtempSync(join(tmpdir(), 'draw-audit-'));
    const ok = await audit('--edge', EDGE, '--sale', SALE, '--save', dir);
    assert.equal(ok.code, 0, ok.out);
    assert.match(ok.out, /the draw checks out/);
    assert.match(ok.out, new RegExp(`beacon round ${expectRound} matches`));
    // …with a receipt too.
    const rc = await call('GET', `${EDGE}/api/sales/${SALE}/queue/receipt`, { token: tickets[7] });
    assert.equal(rc.status, 200, JSON.stringify(rc.body));
    assert.equal(rc.body.place, places[7]);
    assert.equal(rc.body.leaf, leaves[7].toString('hex'));
    assert.match(rc.headers.get('cache-control'), /no-store/);
    const receiptFile = join(dir, 'receipt.json');
    writeFileSync(receiptFile, JSON.stringify(rc.body));
    const withReceipt = await audit('--from', dir, '--receipt', receiptFile);
    assert.equal(withReceipt.code, 0, withReceipt.out);
    const otherAccount = { ...rc.body, account: accounts[8] };
    writeFileSync(receiptFile, JSON.stringify(otherAccount));
    assert.equal((await audit('--from', dir, '--receipt', receiptFile)).code, 1, 'a receipt for another account fails');

    // …and fails on each tampering, naming what does not add up.
    const tampered = async (name, change) => {
      const t = mkdtempSync(join(tmpdir(), `draw-${name}-`));
      cpSync(dir, t, { recursive: true });
      const summary = JSON.parse(readFileSync(join(t, 'summary.json'), 'utf8'));
      const draw = JSON.parse(readFileSync(join(t, 'draw.json'), 'utf8'));
      change(summary, draw);
      writeFileSync(join(t, 'summary.json'), JSON.stringify(summary));
      writeFileSync(join(t, 'draw.json'), JSON.stringify(draw));
      return audit('--from', t);
    };
    const cases = {
      'swapped-pair': [(s, l) => {
        const [a, b] = [l.entries[10], l.entries[11]];
        [a.leaf, b.leaf, a.value, b.value] = [b.leaf, a.leaf, b.value, a.value];
      }, /not above|ranks/],
      'injected-leaf': [(s, l) => {
        const leaf = sha256hex('an account nobody saw join');
        l.entries.splice(5, 0, { place: 6, leaf, value: sha256hex(Buffer.concat([key, Buffer.from(leaf, 'hex')])) });
        l.entries.forEach((e, i) => { e.place = i + 1; });
        s.draw.entrants += 1;
      }, /entrants_root|ranks|not above/],
      'other-seed': [(s) => { s.draw.seed = sha256hex('another seed'); }, /commitment/],
      'other-beacon': [(s) => { s.draw.beacon.value = sha256hex('another beacon value'); }, /key/],
    };
    for (const [name, [change, message]] of Object.entries(cases)) {
      const r = await tampered(name, change);
      assert.equal(r.code, 1, `${name}: ${r.out}`);
      assert.match(r.out, message, name);
    }

    // Someone who joined after the start has no receipt: their place
    // follows arrival.
    const late = await call('POST', `${EDGE}/api/sales/${SALE}/queue`, { token: userToken(`late-${rid()}`) });
    assert.equal(late.status, 200, JSON.stringify(late.body));
    const lateRc = await call('GET', `${EDGE}/api/sales/${SALE}/queue/receipt`, { token: late.body.ticket });
    assert.equal(lateRc.status, 409);
    assert.equal(lateRc.body.error.code, 'not_in_draw');
  } finally {
    beacon.close();
  }
});

// The stack's DRAW_BEACON_WAIT_SECS (scripts/test-edge: 10; 60 by default).
const WAIT_S = Number(process.env.EDGE_DRAW_BEACON_WAIT_SECS || 60);

test('a beacon that never answers: the draw goes on without it after the configured wait, and says so', async () => {
  const SALE = `e2e-draw-nobeacon-${rid()}`;
  const startsAtMs = Date.now() + 8_000;
  // A port nothing listens on.
  const dead = createServer();
  await new Promise((r) => dead.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${dead.address().port}`;
  dead.close();
  createSale({
    sale: SALE, name: 'E2E draw, silent beacon', units: 10, 'per-user-limit': 1, shards: 1, 'queue-shards': 2,
    'starts-at': new Date(startsAtMs).toISOString(), 'admission-rate': 50, 'draw-beacon': url,
  });
  const t = await call('POST', `${EDGE}/api/sales/${SALE}/queue`, { token: userToken(`nb-${rid()}`) });
  assert.equal(t.status, 200);
  const d = await listedDraw(SALE, (WAIT_S + 60) * 1000);
  const listedAfter = Date.now() - startsAtMs;
  // Given up no sooner than the wait after the freeze (3 s after the start).
  assert.ok(listedAfter >= (3 + WAIT_S) * 1000 - 1_000, `listed ${listedAfter} ms after the start`);
  assert.equal(d.beacon.missed, true);
  assert.equal(d.beacon.value, null);
  assert.equal(d.entrants, 1);
  assert.equal(d.key, drawKey(d.seed, d.entrants_root, '').toString('hex'), 'an empty beacon in the key');
  const r = await call('GET', `${EDGE}/api/sales/${SALE}/queue/receipt`, { token: t.body.ticket });
  assert.equal(r.status, 200, JSON.stringify(r.body));
  assert.equal(r.body.place, 1);
});
