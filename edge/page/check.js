// "Check my draw" for the queue page (loaded by app.js on demand): verifies
// the holder's receipt against everything the edge published, in the
// browser, and answers in plain words (en, vi).
(() => {
  const MSG = {
    en: {
      check_not_yet: 'Your receipt is ready once the draw is finished — try again in a moment.',
      check_not_in: 'You joined after the start, so your place follows arrival order, not the draw.',
      check_ok: 'Your draw checks out: your entry is in the sealed list of {n} people, the secret seed matches what was published before anyone joined, and place {place} is exactly what the published numbers give.',
      check_bad: 'Warning: your draw does NOT check out — {why}. Please tell the shop.',
      why_commit: 'the seed does not match the commitment published before the sale',
      why_leaf: 'your receipt is not for your account', why_path: 'your entry is not in the sealed list',
      why_key: 'the mixing key is not made from the seed, the sealed list and the beacon',
      why_place: 'the list does not have you at your place', why_error: 'the receipt could not be fetched',
      why_rank: 'the people next to you in the list are not in the order the published numbers give',
      why_count: 'the published list does not have the {n} people of the sealed set',
    },
    vi: {
      check_not_yet: 'Biên nhận của bạn có khi bốc thăm xong — hãy thử lại sau giây lát.',
      check_not_in: 'Bạn tham gia sau giờ mở bán, nên thứ tự của bạn theo thứ tự đến, không theo bốc thăm.',
      check_ok: 'Lượt bốc thăm của bạn hợp lệ: bạn có trong danh sách niêm phong gồm {n} người, hạt giống bí mật khớp với cam kết công bố trước khi có người tham gia, và vị trí {place} đúng như các số đã công bố cho ra.',
      check_bad: 'Cảnh báo: lượt bốc thăm của bạn KHÔNG hợp lệ — {why}. Hãy báo cho cửa hàng.',
      why_commit: 'hạt giống không khớp với cam kết công bố trước đợt bán',
      why_leaf: 'biên nhận không phải của tài khoản bạn', why_path: 'bạn không có trong danh sách niêm phong',
      why_key: 'khóa trộn không được tạo từ hạt giống, danh sách niêm phong và số ngẫu nhiên công khai',
      why_place: 'danh sách không có bạn ở vị trí của bạn', why_error: 'không lấy được biên nhận',
      why_rank: 'những người cạnh bạn trong danh sách không theo thứ tự mà các số công bố cho ra',
      why_count: 'danh sách công bố không có đủ {n} người của danh sách niêm phong',
    },
  };
  // "Check my draw" (DESIGN.md "The draw, v2"), all in the browser with
  // WebCrypto: the receipt's leaf is SHA-256("fs-leaf:" ‖ account ‖ ":" ‖
  // hex(salt)); its RFC 6962 audit path leads to the published
  // entrants_root; SHA-256(seed) is the commitment published before anyone
  // joined; key = SHA-256(seed ‖ root ‖ beacon); the listing has this
  // leaf at the receipt's place with value SHA-256(key ‖ leaf); the
  // neighbours on either side have their values recomputed from their
  // leaves, below and above the holder's (a listing that moved the holder
  // shows out of order there; issue 44 #8: the entry at the place alone,
  // from the same edge, proved nothing about the rank); and the listing
  // ends exactly at the sealed set's count.
  const fromHex = (h) => new Uint8Array((h || '').match(/../g)?.map((x) => parseInt(x, 16)) || []);
  const toHex = (b) => [...new Uint8Array(b)].map((x) => x.toString(16).padStart(2, '0')).join('');
  const cat = (...parts) => {
    const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
    let o = 0;
    for (const p of parts) { out.set(p, o); o += p.length; }
    return out;
  };
  const sha = async (...parts) => new Uint8Array(await crypto.subtle.digest('SHA-256', cat(...parts)));
  // RFC 9162 §2.1.3.2: the root from a leaf, its index, the tree size and
  // its audit path (bottom-up).
  async function rootFromPath(leaf, index, size, path) {
    if (index >= size) return null;
    let fn = index;
    let sn = size - 1;
    let r = await sha(new Uint8Array([0]), leaf);
    for (const p of path) {
      if (sn === 0) return null;
      if (fn % 2 === 1 || fn === sn) {
        r = await sha(new Uint8Array([1]), p, r);
        if (fn % 2 === 0) while (fn % 2 === 0 && fn !== 0) { fn = Math.floor(fn / 2); sn = Math.floor(sn / 2); }
      } else r = await sha(new Uint8Array([1]), r, p);
      fn = Math.floor(fn / 2);
      sn = Math.floor(sn / 2);
    }
    return sn === 0 ? toHex(r) : null;
  }
  self.flashsaleCheckDraw = async ({ sale, sub, ticket, api, lang, num }) => {
    const t = (key, vars = {}) => (MSG[lang]?.[key] ?? MSG.en[key] ?? key)
      .replace(/\{(\w+)\}/g, (_, k) => String(vars[k] ?? ''));
    const r = await api('GET', `/api/sales/${encodeURIComponent(sale)}/queue/receipt`, { token: ticket });
    if (r.status !== 200) {
      const code = r.data && r.data.error && r.data.error.code;
      return code === 'not_drawn' ? t('check_not_yet')
        : code === 'not_in_draw' ? t('check_not_in') : t('check_bad', { why: t('why_error') });
    }
    const rc = r.data;
    const s = await api('GET', `/api/sales/${encodeURIComponent(sale)}`);
    const d = (s.data && s.data.draw) || {};
    const beacon = d.beacon && d.beacon !== 'none' ? fromHex(d.beacon.value) : new Uint8Array(0);
    const leaf = await sha(new TextEncoder().encode(`fs-leaf:${sub}:${rc.salt}`));
    let why = null;
    if (toHex(await sha(fromHex(d.seed))) !== d.commitment) why = 'why_commit';
    else if (toHex(leaf) !== rc.leaf) why = 'why_leaf';
    else if (await rootFromPath(leaf, rc.leaf_index, d.entrants, (rc.audit_path || []).map(fromHex)) !== d.entrants_root) why = 'why_path';
    else if (toHex(await sha(fromHex(d.seed), fromHex(d.entrants_root), beacon)) !== d.key) why = 'why_key';
    else {
      const from = Math.max(1, rc.place - 1);
      const l = await api('GET', `/api/sales/${encodeURIComponent(sale)}/draw?from=${from}&limit=3`);
      const near = (l.data && l.data.entries) || [];
      const e = near.find((x) => x.place === rc.place);
      const value = toHex(await sha(fromHex(d.key), leaf));
      if (!e || e.leaf !== rc.leaf || e.value !== value) why = 'why_place';
      else {
        for (let i = 0; i < near.length && !why; i++) {
          const x = near[i];
          const v = toHex(await sha(fromHex(d.key), fromHex(x.leaf)));
          if (x.value !== v || x.place !== from + i) why = 'why_rank';
          else if (i > 0 && !(near[i - 1].value < x.value)) why = 'why_rank';
        }
        const expected = Math.min(3, d.entrants - from + 1);
        if (!why && near.length !== expected) why = 'why_count';
      }
      if (!why) {
        const end = await api('GET', `/api/sales/${encodeURIComponent(sale)}/draw?from=${d.entrants}&limit=2`);
        const tail = (end.data && end.data.entries) || [];
        if (tail.length !== 1 || tail[0].place !== d.entrants) why = 'why_count';
      }
    }
    return why ? t('check_bad', { why: t(why, { n: num(d.entrants) }) })
      : t('check_ok', { n: num(d.entrants), place: num(rc.place) });
  };

})();
