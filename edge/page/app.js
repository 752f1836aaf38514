// The queue page: one script for every sale (the sale id is in the path).
// Polls the edge at the server's poll_after_ms plus jitter, backs off
// exponentially on errors, pauses while the tab is hidden.
'use strict';
(() => {
  const $ = (id) => document.getElementById(id);
  const sale = decodeURIComponent(location.pathname.split('/')[2] || '');
  const KEY = `flashsale:${sale}`;
  let st = {};
  try { st = JSON.parse(localStorage.getItem(KEY)) || {}; } catch { st = {}; }
  const save = () => localStorage.setItem(KEY, JSON.stringify(st));
  let summary = null;
  let status = null;
  let devMode = false;
  let timers = {};
  let errors = 0;
  let hiddenWork = {};

  const jitter = (ms) => Math.round(ms * (0.9 + Math.random() * 0.2));
  const nowS = () => Date.now() / 1000;
  const uuid = () => (crypto.randomUUID ? crypto.randomUUID()
    : [...crypto.getRandomValues(new Uint8Array(16))].map((b) => b.toString(16).padStart(2, '0')).join(''));
  const clock = (ms) => new Date(ms).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit' });
  function dur(s) {
    s = Math.max(0, Math.round(s));
    if (s < 60) return `${s} s`;
    if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
    return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  }
  function subOf(token) {
    try {
      return JSON.parse(atob(token.split('.')[2].replace(/-/g, '+').replace(/_/g, '/'))).sub;
    } catch { return null; }
  }
  async function api(method, path, { token, body, idem } = {}) {
    const headers = {};
    if (token) headers.authorization = `Bearer ${token}`;
    if (body !== undefined) headers['content-type'] = 'application/json';
    if (idem) headers['idempotency-key'] = idem;
    const r = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
    let data = null;
    try { data = await r.json(); } catch { data = null; }
    return { status: r.status, data, retryAfter: Number(r.headers.get('retry-after')) || 0 };
  }
  const say = (id, text) => { if ($(id).textContent !== text) $(id).textContent = text; };
  const show = (id, on) => { $(id).hidden = !on; };
  const errorText = (r) => (r.data && r.data.error && r.data.error.message) || `Error ${r.status}`;

  // One timer per job; jobs wait while the tab is hidden.
  function later(job, ms, fn) {
    clearTimeout(timers[job]);
    timers[job] = setTimeout(() => {
      if (document.hidden) { hiddenWork[job] = fn; return; }
      fn();
    }, ms);
  }
  document.addEventListener('visibilitychange', () => {
    if (document.hidden) return;
    const work = hiddenWork;
    hiddenWork = {};
    for (const [job, fn] of Object.entries(work)) later(job, jitter(400), fn);
  });
  function backoff(job, fn, r) {
    errors += 1;
    const ms = Math.max((r && r.retryAfter) * 1000 || 0, Math.min(60000, 1000 * 2 ** Math.min(errors, 6)));
    say('note', `Connection trouble — retrying in ${dur(ms / 1000)}. You keep your place.`);
    later(job, jitter(ms), fn);
  }

  async function loadSummary() {
    try {
      const r = await api('GET', `/api/sales/${encodeURIComponent(sale)}`);
      if (r.status === 200) {
        summary = r.data;
        render();
      } else if (r.status === 404) {
        say('name', 'No such sale');
        say('error', errorText(r));
        return;
      }
    } catch { /* next round */ }
    later('summary', jitter(5000), loadSummary);
  }

  async function poll() {
    if (!st.ticket || st.res) return;
    try {
      const r = await api('GET', `/api/sales/${encodeURIComponent(sale)}/queue`, { token: st.ticket });
      if (r.status === 200) {
        errors = 0;
        say('note', '');
        applyStatus(r.data);
        if (!['closed'].includes(r.data.status)) later('poll', jitter(r.data.poll_after_ms), poll);
      } else if (r.status === 401 || r.status === 403) {
        st.ticket = null; save();
        if (st.user) join(); else render();
      } else backoff('poll', poll, r);
    } catch { backoff('poll', poll); }
  }

  function applyStatus(s) {
    status = s;
    if (s.ticket) st.ticket = s.ticket;
    if (s.admission_token) { st.admit = s.admission_token; st.admitExp = s.admission_expires_at; }
    save();
    render();
  }

  async function join() {
    $('join-btn').disabled = true;
    say('error', '');
    try {
      const r = await api('POST', `/api/sales/${encodeURIComponent(sale)}/queue`, { token: st.user });
      if (r.status === 200) { applyStatus(r.data); later('poll', jitter(r.data.poll_after_ms), poll); }
      else if (r.status === 401) { st.user = null; save(); say('error', `Sign-in refused: ${errorText(r)}`); render(); }
      else backoff('poll', join, r);
    } catch { backoff('poll', join); }
    $('join-btn').disabled = false;
  }

  async function reserve() {
    const btn = $('reserve-btn');
    btn.disabled = true;
    say('error', '');
    st.resIdem = st.resIdem || uuid();
    save();
    try {
      const r = await api('POST', `/api/sales/${encodeURIComponent(sale)}/reservations`,
        { token: st.admit, body: { qty: Number($('qty').value) }, idem: st.resIdem });
      if (r.status === 202 || r.status === 200) {
        st.res = { id: r.data.reservation_id, expires_at: r.data.expires_at, status: r.data.status, qty: r.data.qty };
        save();
        render();
        later('res', 2000, pollReservation);
      } else if (r.status === 410) {
        applyStatus({ ...(status || {}), status: 'sold_out', admission_token: undefined });
      } else if (r.status === 429 || r.status === 503) {
        say('note', 'The shop is busy — trying again…');
        later('reserve', jitter(Math.max(1000, r.retryAfter * 1000)), reserve);
      } else {
        say('error', errorText(r));
      }
    } catch { say('error', 'Network error — please try again.'); }
    btn.disabled = false;
  }

  const authToken = () => (st.admit && st.admitExp > nowS() + 5 ? st.admit : st.user);

  async function pay() {
    const btn = $('pay-btn');
    btn.disabled = true;
    say('error', '');
    st.payIdem = st.payIdem || uuid();
    save();
    try {
      const r = await api('POST', `/api/reservations/${encodeURIComponent(st.res.id)}/purchase`,
        { token: authToken(), idem: st.payIdem });
      if (r.status === 200 || r.status === 201 || r.status === 202) {
        st.payment = r.data;
        st.res.status = 'pending_payment';
        save();
        const url = r.data.checkout_url;
        if (url && devMode && url.startsWith('/api/dev/')) {
          say('note', 'Completing payment with the local dev payment provider…');
          await api('POST', url, { body: { outcome: 'succeeded' } });
          say('note', '');
        } else if (url) {
          location.assign(url);
          return;
        }
        render();
        later('res', 500, pollReservation);
      } else if (r.status === 503 || r.status === 429) {
        later('pay', jitter(Math.max(1000, r.retryAfter * 1000)), pay);
      } else say('error', errorText(r));
    } catch { say('error', 'Network error — please try again.'); }
    btn.disabled = false;
  }

  async function pollReservation() {
    if (!st.res) return;
    try {
      const r = await api('GET', `/api/reservations/${encodeURIComponent(st.res.id)}`, { token: authToken() });
      if (r.status === 200) {
        errors = 0;
        st.res.status = r.data.status;
        st.res.expires_at = r.data.expires_at || st.res.expires_at;
        save();
        render();
        if (!['paid', 'expired', 'cancelled', 'rejected'].includes(r.data.status)) {
          later('res', jitter(st.res.status === 'pending_payment' ? 1000 : 5000), pollReservation);
        }
      } else backoff('res', pollReservation, r);
    } catch { backoff('res', pollReservation); }
  }

  function setState(cls, title, text) {
    $('state').className = `card ${cls}`;
    say('state-h', title);
    say('state-text', text);
  }

  function render() {
    const s = summary;
    if (s) {
      document.title = `${s.name} — flash sale`;
      say('name', s.name);
      say('price', s.price_cents != null ? `Price ${(s.price_cents / 100).toFixed(2)}` : '');
      say('phase', s.sold_out ? 'sold out' : s.phase);
      const pct = Math.round(Number(s.percent_sold) || 0);
      $('sold-bar').value = pct;
      say('sold-pct', `${pct} % sold`);
      const startMs = Date.parse(s.starts_at);
      say('start', startMs > Date.now() ? `Starts at ${clock(startMs)} (in ${dur((startMs - Date.now()) / 1000)})` : `Started at ${clock(startMs)}`);
      if (s.draw) {
        say('commitment', s.draw.commitment);
        say('seed', s.draw.seed || 'not yet drawn');
        $('check-btn').disabled = !(s.draw.seed && st.sub);
        $('audit').href = s.draw.audit || '#';
      }
      const limit = Math.max(1, Number(s.per_user_limit) || 1);
      if ($('qty').options.length !== limit) {
        $('qty').replaceChildren(...Array.from({ length: limit }, (_, i) => new Option(String(i + 1), String(i + 1))));
      }
    }
    const signedIn = Boolean(st.user);
    show('signin', !signedIn);
    show('dev-form', !signedIn && devMode);
    say('who', st.sub || '');
    show('join', signedIn && !st.ticket);
    show('state', Boolean(st.ticket) || Boolean(st.res));
    show('line', false);
    show('admit', false);
    show('held', false);
    if (st.res) renderReservation();
    else if (status) renderStatus(s);
    countdowns();
  }

  function renderStatus(s) {
    const x = status;
    if (x.status === 'prequeue') {
      const at = x.starts_at_ms || (s && Date.parse(s.starts_at));
      setState('prequeue', 'You are in the pre-queue',
        `Your place in line is drawn at ${clock(at)}. Everyone who joins before then has the same chance: arriving early gives no advantage.`);
    } else if (x.status === 'drawing') {
      setState('prequeue', 'The draw is running',
        'Places in line are being drawn for everyone who joined before the start. This takes a few seconds.');
    } else if (x.status === 'waiting' && x.place == null) {
      setState('waiting', 'You are in line',
        'Your place in line is being confirmed (a second or two).');
    } else if (x.status === 'waiting') {
      const eta = x.eta_seconds;
      const range = eta == null ? 'unknown' : `${dur(eta * 0.8)} – ${dur(eta * 1.3 + 5)}`;
      setState('waiting', `Your place in line: ${x.place}`,
        `People ahead of you: ${x.ahead}. Estimated wait: ${range}.`);
      show('line', true);
      $('line-bar').value = x.place ? Math.round(100 * (1 - x.position / x.place)) : 0;
    } else if (x.status === 'admitted') {
      setState('admitted', "It's your turn", `Your place in line: ${x.place}. You may reserve now.`);
      show('admit', true);
    } else if (x.status === 'sold_out') {
      setState('sold-out', 'Sold out', 'Every unit is taken right now. If reserved units are released, the line moves again — keep this page open.');
    } else if (x.status === 'closed') {
      setState('closed', 'Closed', 'This sale is over, or your turn to reserve has passed.');
    }
  }

  function renderReservation() {
    const r = st.res;
    if (r.status === 'paid') {
      setState('paid', 'Paid — your order is confirmed', `You bought ${r.qty || 1}. Thank you!`);
    } else if (r.status === 'pending_payment') {
      setState('held', 'Payment in progress', 'Waiting for the payment provider to confirm…');
    } else if (['expired', 'cancelled', 'rejected'].includes(r.status)) {
      setState('closed', `Reservation ${r.status}`, 'The units went back on sale.');
    } else {
      setState('held', 'Reserved — complete your payment', `${r.qty || 1} unit(s) are held for you.`);
      show('held', true);
    }
  }

  function countdowns() {
    const left = st.admitExp ? st.admitExp - nowS() : 0;
    if (status && status.status === 'admitted' && !st.res) {
      say('admit-left', left > 0 ? `Your turn lasts ${dur(left)} more.` : 'Your turn has ended.');
      $('reserve-btn').disabled = left <= 0;
    }
    if (st.res && st.res.expires_at) {
      const h = Date.parse(st.res.expires_at) / 1000 - nowS();
      say('hold-left', h > 0 ? `Held for ${dur(h)} more.` : 'The hold has expired.');
    }
  }

  let startSeen = false;
  function tick() {
    if (summary && Date.parse(summary.starts_at) > Date.now() - 1000) render();
    else countdowns();
    // The start just passed: fetch the new phase (and the seed) soon.
    if (summary && !startSeen && Date.parse(summary.starts_at) <= Date.now()) {
      startSeen = true;
      if (summary.phase === 'upcoming') later('summary', jitter(2500), loadSummary);
    }
  }

  async function checkDraw() {
    const hex = async (data) => [...new Uint8Array(await crypto.subtle.digest('SHA-256', data))]
      .map((b) => b.toString(16).padStart(2, '0')).join('');
    const seed = summary.draw.seed;
    const bytes = new Uint8Array(seed.match(/../g).map((h) => parseInt(h, 16)));
    const ok = (await hex(bytes)) === summary.draw.commitment;
    const mine = await hex(new TextEncoder().encode(`${seed}:${st.sub}`));
    say('check-out', `${ok ? 'The seed matches the commitment.' : 'Warning: the seed does NOT match the commitment!'} Your draw value: ${mine}. Find it in the full list: its position there is your place.`);
  }

  function signIn(token) {
    st = { user: token, sub: subOf(token) };
    save();
    render();
    join();
  }

  $('token-form').addEventListener('submit', (e) => {
    e.preventDefault();
    const t = $('token-input').value.trim();
    if (t) signIn(t);
  });
  $('dev-form').addEventListener('submit', async (e) => {
    e.preventDefault();
    const r = await api('POST', '/api/dev/token', { body: { name: $('dev-name').value.trim() } });
    if (r.status === 200) signIn(r.data.user_token); else say('error', errorText(r));
  });
  $('join-btn').addEventListener('click', join);
  $('reserve-btn').addEventListener('click', reserve);
  $('pay-btn').addEventListener('click', pay);
  $('check-btn').addEventListener('click', checkDraw);

  (async () => {
    try {
      const h = (await api('GET', '/api/health')).data;
      devMode = h.dev_mode === true;
      // DEV_MODE set but refused (the origin is not local): say why, so
      // nobody wonders where the name sign-in went.
      if (typeof h.dev_mode_refused === 'string') {
        say('dev-refused', `Dev mode is off: ${h.dev_mode_refused}`);
        show('dev-refused', true);
      }
    } catch { devMode = false; }
    render();
    await loadSummary();
    if (st.res) pollReservation();
    else if (st.ticket) poll();
    setInterval(tick, 1000);
  })();
})();
