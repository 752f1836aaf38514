// Helpers for the edge end-to-end tests: HTTP calls, tokens in the DESIGN.md
// v1 format (minted here independently of the Rust crate, so a token from
// either side must verify on the other), the origin CLI and its metrics.
import { createHmac, randomBytes, createHash } from 'node:crypto';
import { execFileSync, spawn } from 'node:child_process';
import { appendFileSync, mkdirSync, openSync, readFileSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';

export const EDGE = process.env.EDGE_URL;
export const ORIGIN = process.env.ORIGIN_URL;
const ORIGIN_BIN = process.env.ORIGIN_BIN;

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
export const sha256hex = (s) => createHash('sha256').update(s).digest('hex');

/** Signs claims with the first key of a `kid:base64key,...` ring. */
export function sign(ring, claims) {
  const [kid, b64] = ring.split(',')[0].split(':');
  const payload = Buffer.from(JSON.stringify(claims)).toString('base64url');
  const head = `v1.${kid}.${payload}`;
  const sig = createHmac('sha256', Buffer.from(b64, 'base64')).update(head).digest('base64url');
  return `${head}.${sig}`;
}

export function claims(typ, sub, sale, ttl = 3600, now = Math.floor(Date.now() / 1000)) {
  const c = { typ, sub };
  if (sale !== undefined) c.sale = sale;
  c.iat = now;
  c.exp = now + ttl;
  c.jti = randomBytes(16).toString('base64url');
  return c;
}

export const userToken = (sub, ttl) =>
  sign(process.env.USER_TOKEN_KEYS, claims('user', sub, undefined, ttl));

/** The secret of admin key `i` of the stack's `ADMIN_KEYS` (`id[:scope]:secret,…`). */
export const adminKey = (i = 0) => process.env.ADMIN_KEYS.split(',')[i].split(':').at(-1);
/** The origin's admin API (`ADMIN_ADDR`), with the stack's first (write) admin key. */
export async function admin(method, path, body, { key = adminKey(0) } = {}) {
  return call(method, `${process.env.ADMIN_URL}/admin/api/${path}`, {
    headers: { authorization: `Bearer ${key}` }, body,
  });
}

/**
 * The sale's admission metrics from the edge (operators only: the admin
 * key); answers { status, text }.
 */
export async function edgeMetrics(sale, { key = adminKey(), timeoutMs = 20_000 } = {}) {
  const headers = key === null ? {} : { authorization: `Bearer ${key}` };
  const r = await fetch(`${EDGE}/api/sales/${sale}/metrics`, { headers, signal: AbortSignal.timeout(timeoutMs) });
  return { status: r.status, headers: r.headers, text: await r.text() };
}

export function decode(token) {
  return JSON.parse(Buffer.from(token.split('.')[2], 'base64url').toString());
}

/** One HTTP call; answers { status, headers, body (parsed JSON or text) }. */
export async function call(method, url, { token, body, headers = {}, timeoutMs = 15000 } = {}) {
  const h = { ...headers };
  if (token) h.authorization = `Bearer ${token}`;
  if (body !== undefined) h['content-type'] = 'application/json';
  const r = await fetch(url, {
    method,
    headers: h,
    body: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
    signal: AbortSignal.timeout(timeoutMs),
  });
  const text = await r.text();
  let parsed = text;
  try {
    parsed = JSON.parse(text);
  } catch {}
  return { status: r.status, headers: r.headers, body: parsed };
}

/** Runs `fn(item, index)` over items with at most `n` in flight; keeps order. */
export async function pool(items, n, fn) {
  const out = new Array(items.length);
  let next = 0;
  const workers = Array.from({ length: Math.min(n, items.length) }, async () => {
    while (next < items.length) {
      const i = next++;
      out[i] = await fn(items[i], i);
    }
  });
  await Promise.all(workers);
  return out;
}

export function origin(...args) {
  return execFileSync(ORIGIN_BIN, args, { encoding: 'utf8', env: process.env, timeout: 30000 });
}

/** Queue shards the e2e sales get (scripts/test runs the suite with 1 and 8). */
export const QUEUE_SHARDS = Number(process.env.EDGE_QUEUE_SHARDS || 1);

/** How long a sale started "now" lasts when a test gives no end. */
export const SALE_LIFE_MS = 10 * 60_000;

export function createSale(opts) {
  if (opts['queue-shards'] === undefined) opts = { ...opts, 'queue-shards': QUEUE_SHARDS };
  // A live sale's queue shards report to its coordinator every second until
  // the sale ends: sales without an end, one pass's worth of them (8 shards
  // each), kept one wrangler dev busy with their alarms and slowed the
  // later files several times over. A sale started now ends in 10 minutes
  // unless the test says otherwise (no file uses one sale for that long).
  if (opts['starts-at'] === 'now' && opts['ends-at'] === undefined) {
    opts = { ...opts, 'ends-at': new Date(Date.now() + SALE_LIFE_MS).toISOString() };
  }
  const args = ['sale', 'create'];
  // `true`: a flag without a value (e.g. --bot-shadow).
  for (const [k, v] of Object.entries(opts)) args.push(...(v === true ? [`--${k}`] : [`--${k}`, String(v)]));
  const out = origin(...args);
  return JSON.parse(out.slice(out.indexOf('{')));
}

/** Sum of flashsale_reservation_requests_total over all outcomes. */
export async function reservationRequests() {
  const r = await fetch(`${ORIGIN}/metrics`, { signal: AbortSignal.timeout(5000) });
  const text = await r.text();
  let sum = 0;
  for (const line of text.split('\n')) {
    if (line.startsWith('flashsale_reservation_requests_total')) {
      sum += Number(line.trim().split(/\s+/).pop());
    }
  }
  return sum;
}

export const rid = () => randomBytes(4).toString('hex');

/**
 * The positive control of an object-call bound (issue 44 test audit): the
 * counter the bounds read (`queue.do_requests`, reported about once a
 * second) must count at least `n` calls for `n` joins of `account` from
 * fresh isolates without a ticket, each of which reaches the account's
 * shard. A bound read from a counter that did not move proves nothing.
 */
export async function assertObjectCallsCounted(sale, account, n = 6) {
  const count = async () => (await call('GET', `${EDGE}/api/sales/${sale}`)).body.queue.do_requests;
  await sleep(1100);
  const before = await count();
  for (let i = 0; i < n; i++) {
    const f = await call('POST', `${EDGE}/api/dev/isolate/forget`);
    if (f.status !== 200) throw new Error(`isolate forget: ${f.status}`);
    const r = await call('POST', `${EDGE}/api/sales/${sale}/queue`, { token: userToken(account) });
    if (r.status !== 200) throw new Error(`control join: ${r.status} ${JSON.stringify(r.body)}`);
  }
  // Shards report their calls with their next report (about a second, or
  // later): wait for all n, then until the count stands still, so that none
  // of them lands in the next measurement.
  const enough = await until(15_000, async () => (await count()) - before >= n, 500);
  const seen = (await count()) - before;
  if (!enough) throw new Error(`control: ${seen} object calls counted for ${n} joins that each reach a shard`);
  // (Each read of the count may itself refresh the summary: one call.)
  let last = await count();
  for (let i = 0; i < 8; i++) {
    await sleep(2500);
    const now = await count();
    if (now - last <= 1) return;
    last = now;
  }
}

/** The coordinator's own calls so far (`queue.coordinator_requests`). */
export const coordinatorCalls = async (sale) =>
  (await call('GET', `${EDGE}/api/sales/${sale}`)).body.queue.coordinator_requests;

/**
 * The positive control of a coordinator-call bound: `queue.coordinator_requests`
 * must move when a fresh isolate polls after the shared snapshot copy
 * (2.5 s) has gone stale, so a bound read from it is not read from a
 * counter that never moves.
 */
export async function assertCoordinatorCallsCounted(sale, ticket) {
  const before = await coordinatorCalls(sale);
  await sleep(2600);
  const f = await call('POST', `${EDGE}/api/dev/isolate/forget`);
  if (f.status !== 200) throw new Error(`isolate forget: ${f.status}`);
  const r = await call('GET', `${EDGE}/api/sales/${sale}/queue`, { token: ticket });
  if (r.status !== 200) throw new Error(`control poll: ${r.status} ${JSON.stringify(r.body)}`);
  const after = await coordinatorCalls(sale);
  if (!(after - before >= 1)) {
    throw new Error(`control: ${after - before} coordinator calls counted for a poll with no fresh copy`);
  }
}

/** Polls `fn` until it returns a truthy value or `ms` pass. */
export async function until(ms, fn, every = 250) {
  const end = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > end) return v;
    await sleep(every);
  }
}

/** Spearman rank correlation of two equally long lists of distinct ranks. */
export function spearman(a, b) {
  const n = a.length;
  let d2 = 0;
  for (let i = 0; i < n; i++) d2 += (a[i] - b[i]) ** 2;
  return 1 - (6 * d2) / (n * (n * n - 1));
}

/** A free loopback port. */
export function freePort() {
  return new Promise((resolve, reject) => {
    const s = createServer().listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
    s.on('error', reject);
  });
}

/**
 * Starts another `wrangler dev` of the same build (the stack's config with
 * `ORIGIN_URL` replaced, its own `.dev.vars` and Durable Object state) for
 * tests of the edge's own configuration. Waits until it answers at all (a
 * refusing edge answers errors); answers { url, log, stop }.
 */
export async function startEdge({ originUrl, devVars }) {
  // A free port can be taken before wrangler binds it (the two e2e passes
  // start instances side by side: "Address already in use" seen in a full
  // run): then again on other ports.
  for (let attempt = 1; ; attempt++) {
    try {
      return await startEdgeOnce({ originUrl, devVars });
    } catch (e) {
      if (attempt >= 5 || !/Address already in use/.test(String(e.message))) throw e;
    }
  }
}

async function startEdgeOnce({ originUrl, devVars }) {
  const dir = join(process.env.RUN_DIR, `edge-cfg-${rid()}`);
  mkdirSync(dir, { recursive: true });
  const toml = readFileSync(join(process.env.RUN_DIR, 'edge', 'wrangler.toml'), 'utf8')
    .replace(/^ORIGIN_URL = .*$/m, `ORIGIN_URL = ${JSON.stringify(originUrl)}`);
  writeFileSync(join(dir, 'wrangler.toml'), toml);
  writeFileSync(join(dir, '.dev.vars'),
    Object.entries(devVars).map(([k, v]) => `${k}=${v}`).join('\n') + '\n');
  const port = await freePort();
  const inspector = await freePort();
  const log = join(dir, 'wrangler.log');
  const out = openSync(log, 'w');
  const child = spawn('wrangler', ['dev', '--config', join(dir, 'wrangler.toml'),
    '--port', String(port), '--ip', '127.0.0.1', '--inspector-port', String(inspector),
    '--persist-to', join(dir, 'state'), '--show-interactive-dev-session=false',
    '--log-level', 'warn'], {
    cwd: dir, env: { ...process.env, EDGE_SKIP_BUILD: '1' }, detached: true,
    stdio: ['ignore', out, out],
  });
  const url = `http://127.0.0.1:${port}`;
  const stop = async () => {
    if (child.exitCode !== null) return;
    const gone = new Promise((r) => child.once('exit', r));
    try { process.kill(-child.pid, 'SIGTERM'); } catch {}
    const t = setTimeout(() => { try { process.kill(-child.pid, 'SIGKILL'); } catch {} }, 5000);
    await gone;
    clearTimeout(t);
  };
  const up = await until(90_000, async () => {
    if (child.exitCode !== null) return 'exited';
    try {
      await fetch(`${url}/api/ping`, { signal: AbortSignal.timeout(2000) });
      return 'up';
    } catch {
      return null;
    }
  }, 200);
  if (up !== 'up') {
    await stop();
    throw new Error(`wrangler dev on ${url} did not answer (${up}); log: ${readFileSync(log, 'utf8').slice(-2000)}`);
  }
  return { url, log, stop };
}

/** The account's queue shard, as the edge computes it (edge/src/queue/shards.rs). */
export function shardOf(account, shards) {
  const h = createHash('sha256').update(`fs-shard:${account}`).digest().readBigUInt64BE(0);
  return Number((h * BigInt(shards)) >> 64n);
}

/**
 * Polls a ticket's status until it carries a place (a join after the start
 * learns it once every shard has reported that second: ~1-3 s). Returns the
 * last status body; its ticket carries the place.
 */
export async function placeOf(sale, ticket, ms = 15000) {
  let last;
  await until(ms, async () => {
    const r = await call('GET', `${EDGE}/api/sales/${sale}/queue`, { token: ticket });
    if (r.status !== 200) throw new Error(`status ${r.status}: ${JSON.stringify(r.body)}`);
    last = r.body;
    if (r.body.ticket) ticket = r.body.ticket;
    return r.body.place != null;
  }, 250);
  return last;
}

/**
 * The `skip` option of a test that needs something the machine may lack.
 * In CI (`CI=true`) nothing is skipped: the test runs and fails on what is
 * missing. Elsewhere the skip is recorded in `TEST_SKIPS_FILE` (set by
 * scripts/test) so the final summary says so instead of "all passed".
 */
export function skipUnless(present, reason) {
  if (present || process.env.CI === 'true') return false;
  if (process.env.TEST_SKIPS_FILE) appendFileSync(process.env.TEST_SKIPS_FILE, `e2e: ${reason}\n`);
  return reason;
}

// ------------------------------------------------------------ draw v2
// The outside script's side of DESIGN.md "The draw, v2", in plain node
// crypto: what anyone can recompute from what the edge publishes.
const H = (...parts) => { const h = createHash('sha256'); for (const p of parts) h.update(p); return h.digest(); };

/** An entrant's leaf (Buffer) from account and salt (hex). */
export const leafOf = (account, saltHex) => H(`fs-leaf:${account}:${saltHex}`);

/** The DEV_MODE bulk hook's salt of a synthetic entrant (hex). */
export const bulkSalt = (sale, account) => H(`fs-bulk-salt:${sale}:${account}`).subarray(0, 16).toString('hex');

/** RFC 6962 Merkle root of leaves (Buffers, any order: sorted here). */
export function merkleRoot(leaves) {
  const sorted = [...leaves].sort(Buffer.compare);
  const mth = (a, lo, hi) => {
    if (hi - lo === 0) return H(Buffer.alloc(0));
    if (hi - lo === 1) return H(Buffer.from([0]), a[lo]);
    let k = 1;
    while (k * 2 < hi - lo) k *= 2;
    return H(Buffer.from([1]), mth(a, lo, lo + k), mth(a, lo + k, hi));
  };
  return mth(sorted, 0, sorted.length);
}

/** `key = SHA-256(seed ‖ entrants_root ‖ beacon)` (hex in, Buffer out). */
export const drawKey = (seedHex, rootHex, beaconHex = '') =>
  H(Buffer.from(seedHex, 'hex'), Buffer.from(rootHex, 'hex'), Buffer.from(beaconHex || '', 'hex'));

/** Places (1-based) of `leaves` (Buffers) under `key`: ranks of SHA-256(key ‖ leaf). */
export function placesOf(key, leaves) {
  const valued = leaves.map((l, i) => [H(key, l).toString('hex'), i]).sort((x, y) => (x[0] < y[0] ? -1 : 1));
  const places = new Array(leaves.length);
  valued.forEach(([, i], rank) => { places[i] = rank + 1; });
  return places;
}

/** The whole published listing (pages of 512), waiting until it is listed. */
export async function listingOf(sale, n) {
  const entries = [];
  for (let from = 1; from <= n; from += 512) {
    const r = await call('GET', `${EDGE}/api/sales/${sale}/draw?from=${from}&limit=512`, { timeoutMs: 60_000 });
    if (r.status !== 200) throw new Error(`listing ${from}: ${r.status} ${JSON.stringify(r.body)}`);
    entries.push(...r.body.entries);
  }
  return entries;
}

/** Waits (≤ ms) until the sale's draw is listed; returns the summary's draw. */
export async function listedDraw(sale, ms = 60_000) {
  const d = await until(ms, async () => {
    const r = await call('GET', `${EDGE}/api/sales/${sale}`);
    return r.body.draw?.listed ? r.body.draw : null;
  }, 250);
  if (!d) throw new Error(`the draw of ${sale} was not listed within ${ms} ms`);
  return d;
}
