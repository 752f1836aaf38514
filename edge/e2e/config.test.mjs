// The edge's own configuration (issue 21, items 11): two more `wrangler
// dev` instances of the same build, each with one misconfiguration, next to
// the stack's well-configured edge (the control).
// - DEV_MODE=1 with an ORIGIN_URL that is not a loopback address: dev mode
//   stays off (no user tokens for typed names) and health and the page say why.
// - USER_TOKEN_KEYS and ADMISSION_TOKEN_KEYS sharing a secret: every request
//   to the Worker is answered with a 500 config_error.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { chromium } from 'playwright-core';
import { EDGE, call, rid, skipUnless, startEdge, userToken } from './lib.mjs';

const CHROMIUM = process.env.CHROMIUM_PATH || '/usr/bin/chromium';
const FLAGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking',
  '--disable-component-update', '--disable-sync', '--no-first-run'];
const keys = {
  USER_TOKEN_KEYS: process.env.USER_TOKEN_KEYS,
  ADMISSION_TOKEN_KEYS: process.env.ADMISSION_TOKEN_KEYS,
};
let remote; // DEV_MODE=1, origin elsewhere
let shared; // rings sharing a secret

before(async () => {
  const userSecret = keys.USER_TOKEN_KEYS.split(',')[0].split(':')[1];
  const started = await Promise.allSettled([
    startEdge({ originUrl: 'http://192.0.2.10:8080', devVars: { ...keys, DEV_MODE: 1 } }),
    startEdge({
      originUrl: process.env.ORIGIN_URL,
      devVars: {
        USER_TOKEN_KEYS: keys.USER_TOKEN_KEYS,
        ADMISSION_TOKEN_KEYS: `${keys.ADMISSION_TOKEN_KEYS},x9:${userSecret}`,
        DEV_MODE: 0,
      },
    }),
  ]);
  // Kept even when the other failed, so that `after` stops it: an instance
  // left running kept the file alive until its 480 s timeout.
  [remote, shared] = started.map((r) => (r.status === 'fulfilled' ? r.value : undefined));
  const failed = started.find((r) => r.status === 'rejected');
  if (failed) throw failed.reason;
});

after(async () => {
  await Promise.all([remote?.stop(), shared?.stop()]);
});

test('control: with a loopback origin, dev mode mints a user token for a typed name', async () => {
  const h = await call('GET', `${EDGE}/api/health`);
  assert.equal(h.body.dev_mode, true);
  assert.equal(h.body.dev_mode_refused, undefined);
  const t = await call('POST', `${EDGE}/api/dev/token`, { body: { name: `ctl-${rid()}` } });
  assert.equal(t.status, 200, JSON.stringify(t.body));
});

test('DEV_MODE=1 with a non-loopback ORIGIN_URL: no dev tokens, and health and the page say why', async () => {
  const h = await call('GET', `${remote.url}/api/health`);
  assert.equal(h.status, 200, JSON.stringify(h.body));
  assert.equal(h.body.dev_mode, false, JSON.stringify(h.body));
  assert.match(String(h.body.dev_mode_refused), /not a loopback address/);
  const t = await call('POST', `${remote.url}/api/dev/token`, { body: { name: 'mallory' } });
  assert.equal(t.status, 404, JSON.stringify(t.body));
  assert.equal(t.body.user_token, undefined);
  const pay = await call('POST', `${remote.url}/api/dev/payments/s.0.abc/complete`, { body: {} });
  assert.equal(pay.status, 404, JSON.stringify(pay.body));
  const forget = await call('POST', `${remote.url}/api/dev/isolate/forget`);
  assert.equal(forget.status, 404, JSON.stringify(forget.body));
  const bulk = await call('POST', `${remote.url}/api/dev/sales/cfg-${rid()}/bulk`,
    { body: { prefix: 'bot', from: 0, to: 1000 } });
  assert.equal(bulk.status, 404, JSON.stringify(bulk.body));
});

test('DEV_MODE=1 with a non-loopback ORIGIN_URL: the page says dev mode is off and offers no name sign-in',
  { skip: skipUnless(existsSync(CHROMIUM), `${CHROMIUM} missing (scripts/setup installs it)`) }, async () => {
  const browser = await chromium.launch({ executablePath: CHROMIUM, args: FLAGS });
  try {
    const page = await browser.newPage();
    await page.goto(`${remote.url}/sales/cfg-${rid()}`);
    await page.waitForFunction(() => document.body.innerText.includes('not a loopback address'),
      null, { timeout: 20_000 });
    const text = await page.evaluate(() => document.body.innerText);
    assert.match(text, /Dev mode is off/);
    assert.equal(await page.locator('#dev-form').isVisible(), false, 'no name sign-in form');
  } finally {
    await browser.close();
  }
});

test('key rings sharing a secret: every request is refused with a 500 config_error', async () => {
  const user = userToken(`cfg-${rid()}`);
  for (const [method, path, opts] of [
    ['GET', '/api/health', {}],
    ['GET', '/api/ping', {}],
    ['GET', `/api/sales/cfg-${rid()}`, {}],
    ['POST', `/api/sales/cfg-${rid()}/queue`, { token: user }],
    ['GET', `/sales/cfg-${rid()}`, {}],
    ['GET', '/api/nope', {}],
  ]) {
    const r = await call(method, `${shared.url}${path}`, opts);
    assert.equal(r.status, 500, `${method} ${path}: ${r.status} ${JSON.stringify(r.body)}`);
    assert.equal(r.body.error?.code, 'config_error', `${method} ${path}`);
    assert.match(r.body.error.message, /share a secret/);
    assert.ok(!r.body.error.message.includes(keys.USER_TOKEN_KEYS.split(':')[1]), 'no secret in the answer');
  }
});
