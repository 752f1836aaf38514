// The queue page in a real browser (headless Chromium from Debian driven by
// playwright-core): pre-queue before the start, a position after the draw,
// admitted, reserve, pay through the dev payment provider, paid; a second
// browser context (360 px wide) sees "Sold out" when the last unit is gone.
// Screenshots of each state go to $SCREENSHOT_DIR, each checked for its
// text; no console errors; page weight under 50 KB before gzip.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { chromium } from 'playwright-core';
import { EDGE, call, createSale, placeOf, rid, userToken } from './lib.mjs';

const CHROMIUM = process.env.CHROMIUM_PATH || '/usr/bin/chromium';
const OUT = process.env.SCREENSHOT_DIR || join(process.cwd(), 'test-output', 'edge-page');
const FLAGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking',
  '--disable-component-update', '--disable-sync', '--no-first-run'];

async function waitText(page, text, timeout = 30_000) {
  await page.waitForFunction((t) => document.body.innerText.includes(t), text, { timeout });
}

async function shot(page, name, text) {
  const body = await page.evaluate(() => document.body.innerText);
  assert.ok(body.includes(text), `${name}: expected "${text}" in:\n${body}`);
  const path = join(OUT, `${name}.png`);
  await page.screenshot({ path, fullPage: true });
  assert.ok(existsSync(path));
}

async function signIn(page, name) {
  await page.goto(`${EDGE}/sales/${page.saleId}`);
  await waitText(page, page.saleName);
  await page.getByLabel('Name (local dev mode only)').fill(name);
  await page.getByRole('button', { name: 'Sign in as this name' }).click();
}

test('the queue page: pre-queue, position, admitted, reserve, pay, paid; sold out for the next person',
  { skip: !existsSync(CHROMIUM) && `${CHROMIUM} missing (scripts/setup installs it)` }, async () => {
    mkdirSync(OUT, { recursive: true });
    const SALE = `e2e-page-${rid()}`;
    const NAME = 'Page test sneakers';
    createSale({
      sale: SALE, name: NAME, units: 1, 'per-user-limit': 1, shards: 1,
      'starts-at': new Date(Date.now() + 20_000).toISOString(), 'admission-rate': 0.25,
      'admission-factor': 2, 'price-cents': 12900, 'hold-seconds': 300,
    });
    const browser = await chromium.launch({ executablePath: CHROMIUM, args: FLAGS });
    const problems = [];
    const bytes = new Map();
    try {
      const watch = (page, who) => {
        page.saleId = SALE;
        page.saleName = NAME;
        page.on('console', (m) => { if (m.type() === 'error') problems.push(`${who} console: ${m.text()}`); });
        page.on('pageerror', (e) => problems.push(`${who} page error: ${e.message}`));
        page.on('requestfailed', (r) => problems.push(`${who} request failed: ${r.url()}`));
        page.on('request', (r) => {
          if (!r.url().startsWith(EDGE) && !r.url().startsWith('data:')) problems.push(`${who} external request: ${r.url()}`);
        });
        page.on('response', async (r) => {
          const u = new URL(r.url());
          if (u.origin === EDGE && !u.pathname.startsWith('/api/') && r.status() === 200) {
            try { bytes.set(u.pathname, (await r.body()).length); } catch { /* redirects */ }
          }
        });
        return page;
      };
      const a = watch(await (await browser.newContext({ viewport: { width: 900, height: 1000 } })).newPage(), 'A');
      const b = watch(await (await browser.newContext({ viewport: { width: 360, height: 780 } })).newPage(), 'B');

      await signIn(a, `alice-${rid()}`);
      await waitText(a, 'You are in the pre-queue');
      await shot(a, '1-prequeue', 'Your place in line is drawn at');
      await signIn(b, `bob-${rid()}`);
      await waitText(b, 'You are in the pre-queue');
      await shot(b, '1b-prequeue-360px', 'You are in the pre-queue');

      // After the draw: a place in line, then the turn comes.
      await a.waitForFunction(() => /Your place in line: \d+/.test(document.body.innerText), null, { timeout: 45_000 });
      await shot(a, '2-position', 'Your place in line: ');
      await waitText(a, "It's your turn", 45_000);
      await waitText(a, 'Your turn lasts', 5000);
      await shot(a, '3-admitted', 'You may reserve now');

      await a.getByRole('button', { name: 'Reserve' }).click();
      await waitText(a, 'Reserved — complete your payment');
      await waitText(a, 'Held for', 5000);
      await shot(a, '4-held', 'Held for');

      // The only unit is held: the other person is told at once.
      await waitText(b, 'Sold out', 30_000);
      await shot(b, '6-sold-out', 'Sold out');
      const overflow = await b.evaluate(() => document.documentElement.scrollWidth);
      assert.ok(overflow <= 360, `no horizontal scrolling at 360 px (${overflow})`);

      await a.getByRole('button', { name: 'Pay' }).click();
      await waitText(a, 'Paid — your order is confirmed', 30_000);
      await shot(a, '5-paid', 'Paid — your order is confirmed');

      // The draw can be checked from the page.
      await a.getByText('How the fair draw works').click();
      await a.getByRole('button', { name: 'Check my draw' }).click();
      await waitText(a, 'The seed matches the commitment.');

      // Accessibility basics: a live region for position updates, labelled controls.
      assert.equal(await a.getAttribute('#live', 'aria-live'), 'polite');
      assert.equal(await a.locator('select#qty').count(), 1);
      assert.ok(await a.getByLabel('Quantity').count());
    } finally {
      await browser.close();
    }
    assert.deepEqual(problems, [], 'no console errors, failed or external requests');
    // HTML short-cached, hashed assets cached for good.
    const html = await fetch(`${EDGE}/sales/${SALE}`);
    assert.match(html.headers.get('cache-control'), /max-age=30\b/);
    const js = [...bytes.keys()].find((p) => /^\/assets\/app\.[0-9a-f]{10}\.js$/.test(p));
    assert.ok(js, `hashed script among ${[...bytes.keys()]}`);
    const asset = await fetch(`${EDGE}${js}`);
    assert.match(asset.headers.get('cache-control'), /immutable/);
    const total = [...bytes.values()].reduce((x, y) => x + y, 0);
    assert.ok(bytes.size >= 3, `html, js and css were loaded: ${[...bytes.keys()]}`);
    assert.ok(total < 50 * 1024, `page weight ${total} bytes`);
  });

test('inventory-capped admission keeps the second person waiting; the page polls at the advised pace and not while hidden',
  { skip: !existsSync(CHROMIUM) && `${CHROMIUM} missing (scripts/setup installs it)` }, async () => {
    // One unit and k = 1: the first person is admitted, the second waits
    // (for one admission window) with ~1 s polls: a steady, real state.
    const SALE = `e2e-hide-${rid()}`;
    const NAME = 'Hidden tab test';
    createSale({
      sale: SALE, name: NAME, units: 1, 'per-user-limit': 1, shards: 1,
      'starts-at': 'now', 'admission-rate': 10, 'admission-factor': 1,
    });
    const first = await call('POST', `${EDGE}/api/sales/${SALE}/queue`, { token: userToken(`first-${rid()}`) });
    assert.equal((await placeOf(SALE, first.body.ticket)).place, 1);
    const browser = await chromium.launch({ executablePath: CHROMIUM, args: FLAGS });
    try {
      const page = await (await browser.newContext({ viewport: { width: 360, height: 780 } })).newPage();
      page.saleId = SALE;
      page.saleName = NAME;
      const polls = [];
      page.on('request', (r) => {
        if (r.method() === 'GET' && r.url().endsWith(`/api/sales/${SALE}/queue`)) polls.push(Date.now());
      });
      await signIn(page, `carol-${rid()}`);
      await waitText(page, 'Your place in line: 2', 20_000);
      const count = (from, to) => polls.filter((t) => t >= from && t < to).length;
      let t0 = Date.now();
      await new Promise((r) => setTimeout(r, 4000));
      const visible = count(t0, Date.now());
      assert.ok(visible >= 2 && visible <= 6, `~1 s polls while visible: ${visible} in 4 s`);
      await page.evaluate(() => {
        Object.defineProperty(document, 'hidden', { value: true, configurable: true });
        Object.defineProperty(document, 'visibilityState', { value: 'hidden', configurable: true });
        document.dispatchEvent(new Event('visibilitychange'));
      });
      await new Promise((r) => setTimeout(r, 1500)); // a poll already due may still go out
      t0 = Date.now();
      await new Promise((r) => setTimeout(r, 4000));
      assert.equal(count(t0, Date.now()), 0, 'no polls while hidden');
      const shown = Date.now();
      await page.evaluate(() => {
        delete document.hidden;
        delete document.visibilityState;
        document.dispatchEvent(new Event('visibilitychange'));
      });
      await new Promise((r) => setTimeout(r, 2500));
      assert.ok(count(shown, Date.now()) >= 1, 'polling resumes when the tab is shown');
      // Still waiting ~10 s later although the rate (10/s) alone would
      // have admitted place 2 at once: k × units available = 1 × 1.
      await shot(page, '7-waiting-360px', 'Your place in line: 2');
    } finally {
      await browser.close();
    }
  });
