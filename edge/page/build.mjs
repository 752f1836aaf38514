// Builds the queue page into edge/public/ (the Worker's static assets):
// content-hashed app.<hash>.js / app.<hash>.css (long-cached, immutable)
// and sale.html referring to them (short-cached). Run after editing
// edge/page/: `node edge/page/build.mjs`; `--check` fails if edge/public
// is not what the sources build to (the e2e tests run it).
import { createHash } from 'node:crypto';
import { readFileSync, writeFileSync, readdirSync, rmSync, mkdirSync, existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { transformSync } from 'esbuild';

const here = dirname(fileURLToPath(import.meta.url));
const pub = join(here, '..', 'public');
const assets = join(pub, 'assets');
const check = process.argv.includes('--check');

const out = new Map();
let html = readFileSync(join(here, 'sale.html'), 'utf8');
// Scripts and the stylesheet are minified (esbuild, pinned in
// package.json, so a build is the same bytes every time): the page weight
// bound (50 KB, edge/e2e/page.test.mjs) is on what a phone downloads, and
// the sources keep their comments.
for (const name of ['app.js', 'app.css', 'timer.js', 'pow.js', 'check.js']) {
  const source = readFileSync(join(here, name), 'utf8');
  const loader = name.endsWith('.css') ? 'css' : 'js';
  const body = Buffer.from(transformSync(source, { loader, minify: true, target: 'es2020', legalComments: 'none' }).code);
  const hash = createHash('sha256').update(body).digest('hex').slice(0, 10);
  const [base, ext] = name.split('.');
  const hashed = `${base}.${hash}.${ext}`;
  out.set(join(assets, hashed), body);
  html = html.replace(`{{${name}}}`, hashed);
}
const currency = (process.env.SALE_CURRENCY || 'EUR').toUpperCase();
if (!/^[A-Z]{3}$/.test(currency)) {
  console.error(`SALE_CURRENCY must be an ISO 4217 code like EUR, not ${JSON.stringify(currency)}`);
  process.exit(1);
}
html = html.replace('{{currency}}', currency);
out.set(join(pub, 'sale.html'), Buffer.from(html));
const CSP = [
  "default-src 'none'", "script-src 'self'", "worker-src 'self'", "style-src 'self'",
  "img-src 'self' data:", "connect-src 'self'", "base-uri 'none'", "form-action 'none'",
  "frame-ancestors 'none'",
].join('; ');
const security = `  Content-Security-Policy: ${CSP}\n  Referrer-Policy: no-referrer\n  X-Content-Type-Options: nosniff\n`;
out.set(join(pub, '_headers'), Buffer.from(
  `/*\n${security}/assets/*\n  Cache-Control: public, max-age=31536000, immutable\n/*.html\n  Cache-Control: public, max-age=30\n/\n  Cache-Control: public, max-age=30\n`,
));

const stale = existsSync(assets) ? readdirSync(assets).map((f) => join(assets, f)).filter((f) => !out.has(f)) : [];
if (check) {
  const bad = [...out].filter(([f, b]) => !existsSync(f) || !readFileSync(f).equals(b)).map(([f]) => f);
  if (bad.length || stale.length) {
    console.error(`edge/public is out of date (${[...bad, ...stale].join(', ')}): run node edge/page/build.mjs`);
    process.exit(1);
  }
  console.log('edge/public is up to date');
} else {
  mkdirSync(assets, { recursive: true });
  for (const f of stale) rmSync(f);
  // Only what changed is written: two stacks started side by side (the e2e
  // passes in scripts/test) never serve a file the other is rewriting.
  for (const [f, b] of out) if (!existsSync(f) || !readFileSync(f).equals(b)) writeFileSync(f, b);
  const total = [...out].reduce((n, [, b]) => n + b.length, 0);
  console.log(`built the queue page into edge/public (${total} bytes before gzip)`);
}
