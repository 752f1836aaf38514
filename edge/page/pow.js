// The queue page's proof-of-work solver (see app.js; DESIGN.md "Bot check
// at join"): finds a decimal nonce such that SHA-256(challenge ":" nonce)
// starts with `difficulty` zero bits, with WebCrypto, off the page's main
// thread. Digests are asked for in batches (WebCrypto answers each with a
// promise; a batch keeps its thread busy).
// Message in: {challenge, difficulty}; out: {tries} now and then, then
// {nonce, tries, ms} once solved.
'use strict';
const BATCH = 512;
const enc = new TextEncoder();

function zeroBits(h) {
  let n = 0;
  for (const b of h) {
    if (b === 0) { n += 8; continue; }
    return n + Math.clz32(b) - 24;
  }
  return n;
}

onmessage = async (e) => {
  const { challenge, difficulty } = e.data || {};
  if (typeof challenge !== 'string' || !Number.isInteger(difficulty) || difficulty < 0 || difficulty > 64) return;
  const prefix = enc.encode(`${challenge}:`);
  const t0 = performance.now();
  let lastReport = t0;
  for (let n = 0; ; n += BATCH) {
    const batch = [];
    for (let i = 0; i < BATCH; i++) {
      const digits = enc.encode(String(n + i));
      const buf = new Uint8Array(prefix.length + digits.length);
      buf.set(prefix);
      buf.set(digits, prefix.length);
      batch.push(crypto.subtle.digest('SHA-256', buf));
    }
    const hashes = await Promise.all(batch);
    for (let i = 0; i < BATCH; i++) {
      if (zeroBits(new Uint8Array(hashes[i])) >= difficulty) {
        postMessage({ nonce: String(n + i), tries: n + i + 1, ms: performance.now() - t0 });
        return;
      }
    }
    const now = performance.now();
    if (now - lastReport > 200) { lastReport = now; postMessage({ tries: n + BATCH }); }
  }
};
