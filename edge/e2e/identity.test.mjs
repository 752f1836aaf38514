// Standard user tokens and request tracing, end to end through `wrangler
// dev` and a real origin (issue 18 items 4 and 2):
// - a shop's `user` token minted by a JWT library (jose, not this product's
//   code) joins a queue, and reads back the reservation its admit token made,
//   verified by the edge and again by the origin;
// - JWTs with alg none, an unknown kid, expired or tampered are refused, each
//   with its own code, at the join and on a reservation route; a JWT is never
//   an admit token;
// - one reservation's request id is echoed to the caller and found in the
//   edge's log (wrangler dev) and in the origin's access log.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { SignJWT, UnsecuredJWT } from 'jose';
import { EDGE, call, createSale, decode, rid, until } from './lib.mjs';

const SALE = `e2e-jwt-${rid()}`;
const [KID, KEY_B64] = process.env.USER_TOKEN_KEYS.split(',')[0].split(':');
const KEY = Buffer.from(KEY_B64, 'base64');
const RUN_DIR = process.env.RUN_DIR;
const now = () => Math.floor(Date.now() / 1000);

/** A shop's user token, minted by the jose library. */
function shopJwt(sub, { kid = KID, key = KEY, iat = now(), exp = now() + 3600 } = {}) {
  return new SignJWT({})
    .setProtectedHeader({ alg: 'HS256', kid, typ: 'JWT' })
    .setSubject(sub)
    .setIssuedAt(iat)
    .setExpirationTime(exp)
    .sign(key);
}

const alice = { account: `jwt-alice-${rid()}` };

async function admitted(p, ms = 20_000) {
  return until(ms, async () => {
    const r = await call('GET', `${EDGE}/api/sales/${SALE}/queue`, { token: p.ticket });
    assert.equal(r.status, 200, JSON.stringify(r.body));
    if (r.body.ticket) p.ticket = r.body.ticket;
    return r.body.status === 'admitted' ? r.body : null;
  }, 300);
}

const logs = () => ({
  edge: readFileSync(join(RUN_DIR, 'wrangler.log'), 'utf8'),
  origin: readFileSync(join(RUN_DIR, 'origin.log'), 'utf8'),
});

test("a shop's JWT joins, and reads back the reservation its admit token made", async () => {
  createSale({
    sale: SALE, name: 'E2E JWT sale', units: 5, 'per-user-limit': 1, shards: 1,
    'starts-at': 'now', 'admission-rate': 200, 'admission-factor': 2,
  });
  alice.jwt = await shopJwt(alice.account);
  assert.equal(alice.jwt.split('.').length, 3, 'a compact JWS');
  const j = await call('POST', `${EDGE}/api/sales/${SALE}/queue`, { token: alice.jwt });
  assert.equal(j.status, 200, JSON.stringify(j.body));
  assert.equal(decode(j.body.ticket).sub, alice.account, 'the ticket is for the JWT subject');
  alice.ticket = j.body.ticket;
  const a = await admitted(alice);
  assert.ok(a, 'admitted');
  alice.admit = a.admission_token;

  alice.rid = `e2e-jwt-${rid()}${rid()}`;
  const r = await call('POST', `${EDGE}/api/sales/${SALE}/reservations`, {
    token: alice.admit, body: { qty: 1 },
    headers: { 'idempotency-key': `idem-${rid()}`, 'x-request-id': alice.rid },
  });
  assert.equal(r.status, 202, JSON.stringify(r.body));
  assert.equal(r.headers.get('x-request-id'), alice.rid, 'request id echoed to the caller');
  alice.reservation = r.body.reservation_id;

  // Edge verifies the JWT, forwards it, the origin verifies it again.
  const g = await call('GET', `${EDGE}/api/reservations/${alice.reservation}`, { token: alice.jwt });
  assert.equal(g.status, 200, JSON.stringify(g.body));
  assert.ok(JSON.stringify(g.body).includes(alice.reservation), JSON.stringify(g.body));

  // Another account's valid JWT does not open it.
  const other = await shopJwt(`jwt-bob-${rid()}`);
  const o = await call('GET', `${EDGE}/api/reservations/${alice.reservation}`, { token: other });
  assert.ok([403, 404].includes(o.status), `${o.status} ${JSON.stringify(o.body)}`);
});

test('refused JWTs get their own code at the join and on a reservation route', async () => {
  assert.ok(alice.reservation, 'first test made a reservation');
  const mallory = `jwt-mallory-${rid()}`;
  const good = await shopJwt(mallory);
  const [h, , s] = good.split('.');
  const cases = [
    {
      name: 'alg none',
      token: new UnsecuredJWT({}).setSubject(alice.account).setIssuedAt()
        .setExpirationTime(now() + 3600).encode(),
      code: 'token_alg_refused',
    },
    {
      name: 'unknown kid',
      token: await shopJwt(alice.account, { kid: 'shop-unknown', key: randomBytes(32) }),
      code: 'token_unknown_kid',
    },
    {
      name: 'expired',
      token: await shopJwt(alice.account, { iat: now() - 7200, exp: now() - 60 }),
      code: 'token_expired',
    },
    {
      // mallory's header and signature around a payload naming alice
      name: 'tampered',
      token: `${h}.${(await shopJwt(alice.account)).split('.')[1]}.${s}`,
      code: 'token_bad_signature',
    },
  ];
  for (const c of cases) {
    const j = await call('POST', `${EDGE}/api/sales/${SALE}/queue`, { token: c.token });
    assert.equal(j.status, 401, `${c.name}: ${JSON.stringify(j.body)}`);
    assert.equal(j.body.error.code, c.code, `${c.name} at join`);
    const g = await call('GET', `${EDGE}/api/reservations/${alice.reservation}`, { token: c.token });
    assert.equal(g.status, 401, `${c.name}: ${JSON.stringify(g.body)}`);
    assert.equal(g.body.error.code, c.code, `${c.name} on a reservation route`);
  }
  // A valid JWT is a user token only: never an admit token.
  const r = await call('POST', `${EDGE}/api/sales/${SALE}/reservations`, {
    token: good, body: { qty: 1 }, headers: { 'idempotency-key': `idem-${rid()}` },
  });
  assert.equal(r.status, 401, JSON.stringify(r.body));
  assert.equal(r.body.error.code, 'token_malformed');
});

test("one reservation's request id is in the edge's and the origin's logs", async () => {
  assert.ok(alice.rid, 'first test made a reservation');
  const found = await until(10_000, () => {
    const l = logs();
    return l.edge.includes(`request_id=${alice.rid}`) && l.origin.includes(alice.rid) ? l : null;
  }, 250);
  const l = found ?? logs();
  const edgeLine = l.edge.split('\n').find((x) => x.includes(alice.rid));
  const originLine = l.origin.split('\n').find((x) => x.includes(alice.rid) && /status=/.test(x));
  assert.ok(edgeLine, `edge log (${RUN_DIR}/wrangler.log) has ${alice.rid}`);
  assert.ok(originLine, `origin log (${RUN_DIR}/origin.log) has ${alice.rid}`);
  assert.match(edgeLine, new RegExp(`POST /api/sales/${SALE}/reservations 202 \\d+ms request_id=${alice.rid}`));
  assert.match(originLine, /status=202/);
});

test('without a sane request id the edge makes one and echoes it', async () => {
  for (const sent of [undefined, 'not sane: spaces']) {
    const headers = sent === undefined ? {} : { 'x-request-id': sent };
    const g = await call('GET', `${EDGE}/api/reservations/${alice.reservation}`, {
      token: alice.jwt, headers,
    });
    assert.equal(g.status, 200, JSON.stringify(g.body));
    const id = g.headers.get('x-request-id');
    assert.match(id ?? '', /^[A-Za-z0-9._:-]{1,128}$/, `made id for ${sent}`);
    assert.notEqual(id, sent);
  }
});
