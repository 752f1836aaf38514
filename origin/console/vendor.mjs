// Copies the console's chart library (uPlot, pinned exactly in package.json)
// from node_modules into origin/console/vendor/, where the origin's
// include_str! finds it at build time (the container build has no
// node_modules, so the copies are committed). Run after changing the
// version: `npm install --save-dev --save-exact uplot@<version>` then
// `node origin/console/vendor.mjs`; `--check` fails if vendor/ is not what
// node_modules holds (edge/e2e/console.test.mjs runs it).
import { readFileSync, writeFileSync, readdirSync, rmSync, mkdirSync, existsSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, '..', '..');
const lib = join(root, 'node_modules', 'uplot');
const vendor = join(here, 'vendor');
const check = process.argv.includes('--check');

// node_modules/uplot/<from> → vendor/<to>. The names are the ones served
// under /admin/assets/ (origin/src/admin/console.rs); the licence travels
// with the code (MIT).
const FILES = [
  ['dist/uPlot.iife.min.js', 'uPlot.iife.min.js'],
  ['dist/uPlot.min.css', 'uPlot.min.css'],
  ['LICENSE', 'uPlot.LICENSE'],
];

const pinned = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')).devDependencies?.uplot;
if (!existsSync(join(lib, 'package.json'))) {
  console.error('node_modules/uplot is missing: run npm ci (scripts/setup)');
  process.exit(1);
}
const installed = JSON.parse(readFileSync(join(lib, 'package.json'), 'utf8')).version;
if (!pinned || pinned !== installed) {
  console.error(`package.json pins uplot ${JSON.stringify(pinned)} (an exact version) but node_modules holds ${installed}: run npm ci`);
  process.exit(1);
}

const out = new Map(FILES.map(([from, to]) => [join(vendor, to), readFileSync(join(lib, from))]));
const stale = existsSync(vendor) ? readdirSync(vendor).map((f) => join(vendor, f)).filter((f) => !out.has(f)) : [];
if (check) {
  const bad = [...out].filter(([f, b]) => !existsSync(f) || !readFileSync(f).equals(b)).map(([f]) => f);
  if (bad.length || stale.length) {
    console.error(`origin/console/vendor is out of date (${[...bad, ...stale].map((f) => relative(root, f)).join(', ')}): run node origin/console/vendor.mjs`);
    process.exit(1);
  }
  console.log(`origin/console/vendor holds uplot ${installed}`);
} else {
  mkdirSync(vendor, { recursive: true });
  for (const f of stale) rmSync(f);
  for (const [f, b] of out) if (!existsSync(f) || !readFileSync(f).equals(b)) writeFileSync(f, b);
  console.log(`copied uplot ${installed} into origin/console/vendor (${[...out.values()].reduce((n, b) => n + b.length, 0)} bytes)`);
}
