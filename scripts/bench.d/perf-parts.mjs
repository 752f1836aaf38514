// Where a process's CPU goes, by part, from `perf script` on stdin (a
// `perf record -g` of the origin; scripts/bench.d/cost.sh). Each sample is
// weighed by its period and given to the part that owns it: the nearest
// frame, from the leaf up, that belongs to a part below (the allocator's
// and the kernel's frames are skipped, so a malloc or a send(2) counts
// for whoever asked for it). A second table says what kind of code the
// leaf itself is: the allocator, the kernel, or the rest.
//
//   perf script -i perf.data | node scripts/bench.d/perf-parts.mjs
import { createInterface } from 'node:readline';

/** Parts, first match wins; each frame's symbol is tested in this order. */
const PARTS = [
  ['token check (HMAC, SHA-256, base64)', /\btoken::|\bhmac::|\bsha2::|\bbase64::/],
  ['JSON (serde_json)', /\bserde_json::|\bserde::/],
  ['Redis client (redis crate)', /\bredis::|\bcombine::/],
  ['Postgres client (sqlx)', /\bsqlx|\bsqlx_core::|\bsqlx_postgres::/],
  ['tracing', /\btracing(_core|_subscriber)?::/],
  ['metrics', /\bmetrics(_exporter_prometheus|_util)?::/],
  ['workers (settlement, relay, expiry)', /\borigin::(settle|events|expiry|ops::workers)/],
  ["handler (the origin's own code)", /\borigin::/],
  ['HTTP (hyper, axum, tower)', /\bhyper(_util)?::|\baxum(_core)?::|\btower(_http)?::|\bhttp::|\bhttparse::/],
  ['tokio runtime', /\btokio::|\bmio::/],
];
/** A kernel sample, by the first user frame above it (libc's wrapper). */
const KERNEL = [
  ['kernel: socket writes', /(^|_)(send|sendto|sendmsg|write|writev)$/],
  ['kernel: socket reads', /(^|_)(recv|recvfrom|recvmsg|read|readv)$/],
  ['kernel: epoll (waiting for I/O)', /epoll/],
  ['kernel: futex (thread wake-ups)', /futex|^syscall$|pthread_cond|parking_lot/],
];
const ALLOC = /(^|[^a-z])(_?mi_|mi_|malloc|calloc|realloc|free|__libc_malloc|cfree)/;

const byPart = new Map();
const byLeaf = new Map();
const byThread = new Map();
let thread = '';
let total = 0;
let frames = [];
let period = 1;

function add(map, k, w) {
  map.set(k, (map.get(k) ?? 0) + w);
}

function flush() {
  if (!frames.length) return;
  total += period;
  const leaf = frames[0];
  const leafKind = leaf.kernel ? 'kernel' : ALLOC.test(leaf.sym) ? 'allocator' : 'user code';
  add(byLeaf, leafKind, period);
  add(byThread, thread, period);
  let part = null;
  if (leaf.kernel) {
    // In the kernel: named by the system call's user-side wrapper.
    const user = frames.find((f) => !f.kernel);
    const sym = user?.sym ?? '';
    part = KERNEL.find(([, re]) => re.test(sym))?.[0] ?? 'kernel: other';
  }
  for (const f of part ? [] : frames) {
    if (f.kernel || ALLOC.test(f.sym)) continue;
    const p = PARTS.find(([, re]) => re.test(f.sym));
    if (p) {
      part = p[0];
      break;
    }
  }
  if (!part) part = frames.every((f) => f.kernel) ? 'kernel only (no user frame)' : 'other (libc, std)';
  add(byPart, part, period);
  frames = [];
}

const rl = createInterface({ input: process.stdin });
for await (const line of rl) {
  if (!line.trim()) {
    flush();
    continue;
  }
  if (/^\S/.test(line)) {
    // A sample's header: "comm pid/tid time: period event:".
    flush();
    const m = line.match(/:\s+(\d+)\s+\S+:\s*$/);
    period = m ? Number(m[1]) : 1;
    // Tokio's workers are "tokio-rt-worker"; the workers' thread "origin-workers".
    thread = line.split(/\s+\d+[/ ]/)[0];
    continue;
  }
  // A frame: "\taddr symbol+0xoff (dso)".
  const m = line.match(/^\s+[0-9a-f]+\s+(.*?)\s+\((.*)\)\s*$/);
  if (!m) continue;
  const sym = m[1].replace(/\+0x[0-9a-f]+$/, '');
  frames.push({ sym, kernel: m[2].includes('kernel') || m[2].startsWith('[k') });
}
flush();

function table(title, map) {
  console.log(`| ${title} | share of the origin's CPU |`);
  console.log('|---|---:|');
  for (const [k, w] of [...map].sort((a, b) => b[1] - a[1])) {
    console.log(`| ${k} | ${((100 * w) / total).toFixed(1)} % |`);
  }
  console.log();
}
table('part (kernel samples by system call; the rest by the nearest owning frame)', byPart);
table('leaf (what ran)', byLeaf);
table('thread', byThread);
