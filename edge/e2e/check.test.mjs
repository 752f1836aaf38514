// "Check my draw" (edge/page/check.js) against draws made here in plain
// node crypto (DESIGN.md "The draw, v2"): it passes an honest listing, and
// names what is wrong with a listing that moved the holder or lost people
// (issue 44 #8: it checked only the entry at the receipt's place, which
// the same edge serves, so a swapped listing read as "exactly what the
// published numbers give"). The page's code runs as the browser would run
// it (WebCrypto, `self`), fed the published documents of each draw.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { drawKey, leafOf, merkleRoot } from './lib.mjs';

const H = (...parts) => { const h = createHash('sha256'); for (const p of parts) h.update(p); return h.digest(); };
const mth = (a) => {
  if (a.length === 1) return H(Buffer.from([0]), a[0]);
  let k = 1;
  while (k * 2 < a.length) k *= 2;
  return H(Buffer.from([1]), mth(a.slice(0, k)), mth(a.slice(k)));
};
/** RFC 6962 audit path of leaf `m` among `a` (sorted leaves), bottom-up. */
const auditPath = (m, a) => {
  if (a.length <= 1) return [];
  let k = 1;
  while (k * 2 < a.length) k *= 2;
  return m < k
    ? [...auditPath(m, a.slice(0, k)), mth(a.slice(k))]
    : [...auditPath(m - k, a.slice(k)), mth(a.slice(0, k))];
};

function loadChecker() {
  const code = readFileSync(new URL('../page/check.js', import.meta.url), 'utf8');
  const self = {};
  new Function('self', 'crypto', code)(self, globalThis.crypto);
  return self.flashsaleCheckDraw;
}

/** A draw of `n` people: the summary's draw, the listing, and a receipt maker. */
function draw(n) {
  const people = Array.from({ length: n }, (_, i) => ({ sub: `p${i}`, salt: randomBytes(16).toString('hex') }));
  for (const p of people) p.leaf = leafOf(p.sub, p.salt);
  const sorted = people.map((p) => p.leaf).sort(Buffer.compare);
  const root = merkleRoot(sorted).toString('hex');
  const seed = randomBytes(32).toString('hex');
  const key = drawKey(seed, root);
  for (const p of people) p.value = H(key, p.leaf).toString('hex');
  const listing = [...people].sort((a, b) => (a.value < b.value ? -1 : 1))
    .map((p, i) => ({ place: i + 1, leaf: p.leaf.toString('hex'), value: p.value }));
  const summary = {
    commitment: H(Buffer.from(seed, 'hex')).toString('hex'), entrants: n, entrants_root: root,
    beacon: 'none', seed, key: key.toString('hex'),
  };
  const receipt = (p, place) => {
    const index = sorted.findIndex((l) => l.equals(p.leaf));
    return { leaf: p.leaf.toString('hex'), salt: p.salt, leaf_index: index,
      audit_path: auditPath(index, sorted).map((b) => b.toString('hex')), place };
  };
  return { people, listing, summary, receipt };
}

/** What the edge answers, from these documents. */
const edgeOf = ({ summary, listing, receipt }) => async (method, url) => {
  const u = new URL(url, 'http://edge.test');
  if (u.pathname.endsWith('/queue/receipt')) return { status: 200, data: receipt };
  if (u.pathname.endsWith('/draw')) {
    const from = Number(u.searchParams.get('from'));
    const limit = Number(u.searchParams.get('limit'));
    return { status: 200, data: { entries: listing.filter((e) => e.place >= from && e.place < from + limit) } };
  }
  return { status: 200, data: { draw: summary } };
};

const ask = (check, p, edge) => check({
  sale: 's', sub: p.sub, ticket: 't', api: edge, lang: 'en', num: (x) => String(x),
});

test('an honest draw checks out, for the first, a middle and the last place', async () => {
  const check = loadChecker();
  const d = draw(12);
  for (const place of [1, 6, 12]) {
    const p = d.people.find((q) => q.value === d.listing[place - 1].value);
    const said = await ask(check, p, edgeOf({ ...d, receipt: d.receipt(p, place) }));
    assert.match(said, /^Your draw checks out/, `place ${place}: ${said}`);
  }
});

test('a listing that moved the holder two places down is caught by the neighbours', async () => {
  const check = loadChecker();
  const d = draw(12);
  const p = d.people.find((q) => q.value === d.listing[4].value); // truly 5th
  const moved = d.listing.filter((e) => e.value !== p.value);
  moved.splice(6, 0, d.listing[4]); // listed 7th
  const listing = moved.map((e, i) => ({ ...e, place: i + 1 }));
  const said = await ask(check, p, edgeOf({ ...d, listing, receipt: d.receipt(p, 7) }));
  assert.match(said, /does NOT check out.*not in the order/, said);
});

test('a listing that lost people is named as such, not "try again"', async () => {
  const check = loadChecker();
  const d = draw(12);
  const p = d.people.find((q) => q.value === d.listing[2].value);
  const listing = d.listing.slice(0, 10);
  const said = await ask(check, p, edgeOf({ ...d, listing, receipt: d.receipt(p, 3) }));
  assert.match(said, /does NOT check out.*12 people of the sealed set/, said);
});
