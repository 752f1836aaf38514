// Proof-of-work solve times in headless Chromium (scripts/bench-botcheck):
// the page's own solver (edge/page/pow.js, WebCrypto SHA-256 in a Web
// Worker) served by a local server under the page's CSP, solving fresh
// challenge-shaped strings at 16, 18, 20 and 22 bits. Prints a markdown
// table: median and p90 solve time, tries per second, and the CPU-seconds
// Chromium's processes spent (from /proc) per solve, scaled to 1,000
// accounts. Never a test.
//
//   BENCH_POW_SAMPLES="16:30,18:12,20:6,22:3"   samples per difficulty
import { createServer } from 'node:http';
import { randomBytes } from 'node:crypto';
import { readFileSync, readdirSync } from 'node:fs';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const here = dirname(fileURLToPath(import.meta.url));
const POW = readFileSync(join(here, '..', 'page', 'pow.js'));
const CHROMIUM = process.env.CHROMIUM_PATH || '/usr/bin/chromium';
const SAMPLES = (process.env.BENCH_POW_SAMPLES || '16:30,18:12,20:6,22:3')
  .split(',').map((p) => p.split(':').map(Number));
const log = (m) => process.stderr.write(`bench-pow: ${m}\n`);
const CSP = "default-src 'none'; script-src 'self'; worker-src 'self'; connect-src 'self'";
const PAGE = `<!doctype html><meta charset="utf-8"><title>pow</title><script src="/bench.js"></script>`;
// Runs one solve in a fresh worker, as the page does per join.
const BENCH_JS = `window.solve = (challenge, difficulty) => new Promise((resolve, reject) => {
  const t0 = performance.now();
  const w = new Worker('/pow.js');
  w.onmessage = (e) => { if (e.data.nonce != null) { w.terminate(); resolve({ nonce: e.data.nonce, tries: e.data.tries, ms: performance.now() - t0 }); } };
  w.onerror = (e) => { w.terminate(); reject(new Error(e.message)); };
  w.postMessage({ challenge, difficulty });
});`;

const server = createServer((req, res) => {
  const h = { 'content-security-policy': CSP, 'cache-control': 'no-store' };
  if (req.url === '/') res.writeHead(200, { ...h, 'content-type': 'text/html' }).end(PAGE);
  else if (req.url === '/pow.js') res.writeHead(200, { ...h, 'content-type': 'text/javascript' }).end(POW);
  else if (req.url === '/bench.js') res.writeHead(200, { ...h, 'content-type': 'text/javascript' }).end(BENCH_JS);
  else res.writeHead(404).end();
}).listen(0, '127.0.0.1');
await new Promise((r) => server.once('listening', r));
const url = `http://127.0.0.1:${server.address().port}/`;

/** CPU seconds (user + system) of all descendants of `pid` (not itself). */
function treeCpu(pid) {
  const tick = 100; // USER_HZ on Linux
  const stats = new Map();
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const s = readFileSync(`/proc/${d}/stat`, 'utf8');
      const f = s.slice(s.lastIndexOf(')') + 2).split(' ');
      stats.set(Number(d), { ppid: Number(f[1]), cpu: (Number(f[11]) + Number(f[12])) / tick });
    } catch { /* gone */ }
  }
  let sum = 0;
  const want = new Set([pid]);
  let grew = true;
  while (grew) {
    grew = false;
    for (const [p, s] of stats) if (!want.has(p) && want.has(s.ppid)) { want.add(p); grew = true; }
  }
  for (const p of want) if (p !== pid) sum += stats.get(p)?.cpu || 0;
  return sum;
}

const browser = await chromium.launch({ executablePath: CHROMIUM,
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking', '--no-first-run'] });
const pid = process.pid; // Chromium's processes are this one's descendants
const page = await browser.newPage();
page.on('console', (m) => { if (m.type() === 'error') log(`console: ${m.text()}`); });
await page.goto(url);
await page.waitForFunction(() => typeof window.solve === 'function');
const challenge = () => `c1.a1.${randomBytes(150).toString('base64url')}.${randomBytes(32).toString('base64url')}`;
await page.evaluate(([c]) => window.solve(c, 8), [challenge()]); // warm up

const q = (xs, p) => { const s = [...xs].sort((a, b) => a - b); return s[Math.min(s.length - 1, Math.floor(p * s.length))]; };
console.log(`Chromium ${browser.version()} (headless, ${CHROMIUM}); the page's pow.js, one fresh Web Worker per solve; ${challenge().length}-byte challenges.`);
console.log('');
console.log('| bits | samples | median s | p90 s | mean tries | tries/s | Chromium CPU-s per solve | CPU-s per 1,000 accounts |');
console.log('|---|---|---|---|---|---|---|---|');
for (const [bits, n] of SAMPLES) {
  const times = [];
  let tries = 0;
  let ms = 0;
  const cpu0 = treeCpu(pid);
  for (let i = 0; i < n; i++) {
    const r = await page.evaluate(([c, b]) => window.solve(c, b), [challenge(), bits]);
    times.push(r.ms / 1000);
    tries += r.tries;
    ms += r.ms;
  }
  const cpu = (treeCpu(pid) - cpu0) / n;
  log(`${bits} bits: ${n} solves, median ${q(times, 0.5).toFixed(2)} s`);
  console.log(`| ${bits} | ${n} | ${q(times, 0.5).toFixed(2)} | ${q(times, 0.9).toFixed(2)} | ${Math.round(tries / n)} | ${Math.round(tries / (ms / 1000))} | ${cpu.toFixed(2)} | ${Math.round(cpu * 1000)} |`);
}
await browser.close();
server.close();
