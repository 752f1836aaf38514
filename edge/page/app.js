// The queue page: one script for every sale (the sale id is in the path).
// Invariants:
// - polls keep the place in a background tab: a Web Worker timer (timer.js;
//   a hidden tab's own timers are throttled) at poll_after_ms plus jitter,
//   a catch-up poll when shown, exponential back-off on errors;
// - the shop's user token (`#token=…`) lives in sessionStorage only and
//   leaves the address bar before any request;
// - one Idempotency-Key per reservation attempt and one body ({sku, qty})
//   per key: a retry reuses both; a new choice or attempt, a new key;
// - the live region speaks on changes of state, never on a mere poll;
// - a pow:<bits> bot check is solved in a Web Worker (pow.js) before the
//   join; a refused solution is retried with a fresh challenge;
// - every text comes from the catalogue MSG (en, vi).
'use strict';
(() => {
  const $ = (id) => document.getElementById(id);

  // Sign-in from the shop (#token=), first of all.
  const USER_KEY = 'flashsale:user';
  const fragToken = new URLSearchParams(location.hash.slice(1)).get('token');
  if (location.hash) history.replaceState(null, '', location.pathname + location.search);
  if (fragToken) sessionStorage.setItem(USER_KEY, fragToken.trim());

  // Every text: [English, Vietnamese].
  const MSG = {
    eyebrow: ['Flash sale'],
    language: ['Language', 'Ngôn ngữ'],
    loading: ['Loading…', 'Đang tải…'],
    sold: ['Sold', 'Đã bán'],
    sold_pct: ['{pct} sold', 'Đã bán {pct}'],
    price: ['Price {price}', 'Giá {price}'],
    from: ['From {price}', 'Từ {price}'],
    skus_h: ['Items', 'Sản phẩm'],
    notice_h: ['From the shop:', 'Thông báo từ cửa hàng:'],
    item: ['Item', 'Sản phẩm'],
    price_h: ['Price', 'Giá'],
    left_h: ['Availability', 'Tình trạng'],
    band_in: ['In stock', 'Còn hàng'],
    band_few: ['Few left', 'Sắp hết'],
    band_out: ['Sold out', 'Hết hàng'],
    turn_h: ['At your turn', 'Khi đến lượt bạn'],
    ol_likely: ['Likely left', 'Nhiều khả năng còn'],
    ol_maybe: ['May run out', 'Có thể hết'],
    ol_unlikely: ['Likely gone', 'Nhiều khả năng hết'],
    ol_sold_out: ['Sold out', 'Hết hàng'],
    ol_unknown: ['Too early to tell', 'Chưa đủ dữ liệu'],
    sku_pick: ['Choose an item', 'Chọn sản phẩm'],
    sku_out: ['(sold out)', '(hết hàng)'],
    sku_sold_out: ['This item is sold out — please pick another.', 'Sản phẩm này đã hết hàng — vui lòng chọn sản phẩm khác.'],
    sku_per_user_limit: ['You have reached the limit for this item.', 'Bạn đã mua đến giới hạn của sản phẩm này.'],
    phase_upcoming: ['Starts soon', 'Sắp mở bán'],
    phase_live: ['On sale now', 'Đang mở bán'],
    phase_sold_out: ['Sold out', 'Hết hàng'],
    phase_ended: ['Ended', 'Đã kết thúc'],
    phase_paused: ['Paused', 'Tạm dừng'],
    starts: ['Starts at {time} (in {dur})', 'Bắt đầu lúc {time} (còn {dur})'],
    started: ['Started at {time}', 'Đã bắt đầu lúc {time}'],
    no_sale: ['No such sale', 'Không có đợt bán này'],
    no_sale_text: ['There is no sale at this address. Please check the link from the shop.', 'Không có đợt bán nào ở địa chỉ này. Vui lòng kiểm tra lại liên kết từ cửa hàng.'],
    signin_h: ['Sign in to join', 'Đăng nhập để xếp hàng'],
    signin_shop: ["Open this page from the shop's sale page while signed in there: the shop signs you in here.", 'Hãy mở trang này từ trang khuyến mãi của cửa hàng khi đã đăng nhập ở đó: cửa hàng sẽ đăng nhập cho bạn tại đây.'],
    token_label: ['Your account token (local dev mode only)', 'Mã tài khoản của bạn (chỉ ở chế độ phát triển)'],
    token_btn: ['Use this token', 'Dùng mã này'],
    dev_label: ['Name (local dev mode only)', 'Tên (chỉ ở chế độ phát triển)'],
    dev_btn: ['Sign in as this name', 'Đăng nhập bằng tên này'],
    dev_refused: ['Dev mode is off: {why}', 'Chế độ phát triển đang tắt: {why}'],
    signin_refused: ['Sign-in refused: {why}', 'Đăng nhập bị từ chối: {why}'],
    join_h: ['Join the queue', 'Vào hàng chờ'],
    join_btn: ['Join the queue', 'Vào hàng chờ'],
    who: ['Signed in as {who}.', 'Đã đăng nhập: {who}.'],
    pow_label: ['Bot check', 'Kiểm tra chống bot'],
    pow_t: ['Your browser is doing a short check that makes joining with many accounts expensive for bots. It needs nothing from you and you join as soon as it is done.', 'Trình duyệt của bạn đang thực hiện một bước kiểm tra ngắn khiến việc dùng nhiều tài khoản để xếp hàng trở nên tốn kém đối với bot. Bạn không cần làm gì, và sẽ vào hàng chờ ngay khi kiểm tra xong.'],
    pow_retry: ['The check has to be done again ({why}) — starting over.', 'Cần kiểm tra lại ({why}) — đang bắt đầu lại.'],
    ts_t: ['Please complete the check below; you join as soon as it passes.', 'Vui lòng hoàn tất bước kiểm tra bên dưới; bạn sẽ vào hàng chờ ngay khi kiểm tra đạt.'],
    bot_check_required: ['this sale asks for a bot check', 'đợt bán này yêu cầu kiểm tra chống bot'],
    bot_check_failed: ['the check did not pass', 'kiểm tra không đạt'],
    challenge_expired: ['it took too long', 'mất quá nhiều thời gian'],
    challenge_reused: ['it was already used', 'mã kiểm tra đã được dùng'],
    challenge_invalid: ['the check was not recognised', 'mã kiểm tra không hợp lệ'],
    bad_nonce: ['the answer was malformed', 'câu trả lời không đúng định dạng'],
    bot_check_unavailable: ['The bot check cannot be verified just now — trying again in a moment.', 'Hiện chưa xác minh được bước kiểm tra chống bot — sẽ thử lại trong giây lát.'],
    join_refused: ['You could not join: {why}.', 'Bạn chưa vào được hàng chờ: {why}.'],
    too_many_joins: ['Too many people joined from your network just now — trying again in {dur}.', 'Có quá nhiều người từ mạng của bạn vừa vào hàng chờ — sẽ thử lại sau {dur}.'],
    line_label: ['Progress through the line', 'Tiến độ trong hàng chờ'],
    notify_why: ['Want to switch tabs while you wait? This page keeps your place in the background and can notify you when it is your turn.', 'Muốn chuyển sang thẻ khác trong lúc chờ? Trang này vẫn giữ chỗ cho bạn khi chạy nền và có thể thông báo khi đến lượt bạn.'],
    notify_btn: ['Notify me when it is my turn', 'Thông báo cho tôi khi đến lượt'],
    qty: ['Quantity', 'Số lượng'],
    reserve: ['Reserve', 'Đặt giữ hàng'],
    pay: ['Pay', 'Thanh toán'],
    cancel: ['Cancel reservation', 'Hủy đặt giữ'],
    prequeue_h: ['You are in the pre-queue', 'Bạn đang ở hàng chờ trước giờ mở bán'],
    prequeue_t: ['Your place in line is drawn at {time}. Everyone who joins before then has the same chance: arriving early gives no advantage.', 'Thứ tự của bạn sẽ được bốc thăm lúc {time}. Ai vào trước giờ đó đều có cơ hội như nhau: đến sớm không được ưu tiên.'],
    drawing_h: ['Drawing the order', 'Đang bốc thăm thứ tự'],
    drawing_t: ['The order of the pre-queue is being drawn right now. Your place appears in a moment.', 'Thứ tự hàng chờ đang được bốc thăm. Vị trí của bạn sẽ hiện ra trong giây lát.'],
    placing_h: ['You are in line', 'Bạn đã vào hàng chờ'],
    placing_t: ['Your place in line is being confirmed (a second or two).', 'Vị trí của bạn đang được xác nhận (một hai giây).'],
    waiting_h: ['Your place in line: {place}', 'Vị trí của bạn: {place}'],
    waiting_t: ['People ahead of you: {ahead}. Estimated wait: {range}.', 'Số người phía trước: {ahead}. Thời gian chờ ước tính: {range}.'],
    unknown: ['unknown', 'chưa rõ'],
    admitted_h: ["It's your turn", 'Đã đến lượt bạn'],
    admitted_t: ['Your place in line: {place}. You may reserve now.', 'Vị trí của bạn: {place}. Bạn có thể đặt giữ hàng ngay.'],
    turn_left: ['Your turn ends in {dur} (at {time}).', 'Lượt của bạn kết thúc sau {dur} (lúc {time}).'],
    turn_over: ['Your turn has ended.', 'Lượt của bạn đã kết thúc.'],
    paused_h: ['The sale is paused', 'Đợt bán đang tạm dừng'],
    paused_t: ['The sale is paused for a moment. You keep your place; this page carries on by itself when it resumes.', 'Đợt bán tạm dừng trong giây lát. Bạn vẫn giữ nguyên vị trí; trang sẽ tự tiếp tục khi mở bán lại.'],
    sold_out_h: ['Sold out', 'Hết hàng'],
    sold_out_t: ['Every unit is taken right now. If reserved units are released, the line moves again — keep this page open.', 'Hiện mọi sản phẩm đã được giữ. Nếu có hàng được trả lại, hàng chờ sẽ tiếp tục — hãy để trang này mở.'],
    closed_h: ['Closed', 'Đã đóng'],
    closed_t: ['This sale is over, or your turn to reserve has passed.', 'Đợt bán đã kết thúc, hoặc lượt đặt giữ của bạn đã qua.'],
    abandoned_h: ['Your turn has passed', 'Lượt của bạn đã qua'],
    abandoned_t: ['This page stopped checking in for 30 seconds while you held nothing, so your turn went to the next person. You may join again, at the back of the line.', 'Trang này đã ngừng cập nhật trong 30 giây khi bạn chưa giữ hàng nào, nên lượt của bạn đã chuyển cho người kế tiếp. Bạn có thể vào hàng chờ lại, ở cuối hàng.'],
    held_h: ['Reserved — complete your payment', 'Đã giữ hàng — hãy hoàn tất thanh toán'],
    held_t: ['{qty} unit(s) are held for you.', 'Đang giữ {qty} sản phẩm cho bạn.'],
    hold_left: ['Held for {dur} more (until {time}).', 'Còn giữ trong {dur} (đến {time}).'],
    hold_over: ['The hold has expired.', 'Thời gian giữ hàng đã hết.'],
    paying_h: ['Payment in progress', 'Đang thanh toán'],
    paying_t: ['Waiting for the payment provider to confirm…', 'Đang chờ nhà cung cấp thanh toán xác nhận…'],
    paid_h: ['Paid — your order is confirmed', 'Đã thanh toán — đơn hàng đã được xác nhận'],
    paid_t: ['You bought {qty}. Thank you!', 'Bạn đã mua {qty} sản phẩm. Cảm ơn bạn!'],
    res_expired: ['Your hold expired and the units went back on sale.', 'Thời gian giữ hàng đã hết và sản phẩm được mở bán lại.'],
    res_cancelled: ['Your reservation was cancelled and the units went back on sale.', 'Đã hủy đặt giữ và sản phẩm được mở bán lại.'],
    res_rejected: ['The shop could not confirm your reservation.', 'Cửa hàng không thể xác nhận đặt giữ của bạn.'],
    again: ['While your turn lasts you can reserve again.', 'Trong lượt của bạn, bạn có thể đặt giữ lại.'],
    live_prequeue: ['You are in the pre-queue.', 'Bạn đang ở hàng chờ trước giờ mở bán.'],
    live_drawing: ['The order is being drawn.', 'Đang bốc thăm thứ tự.'],
    live_waiting: ['You are in line.', 'Bạn đang trong hàng chờ.'],
    live_admitted: ["It's your turn: you may reserve now.", 'Đã đến lượt bạn: bạn có thể đặt giữ hàng ngay.'],
    live_paused: ['The sale is paused; you keep your place.', 'Đợt bán đang tạm dừng; bạn vẫn giữ vị trí.'],
    live_sold_out: ['Sold out.', 'Hết hàng.'],
    live_closed: ['Closed.', 'Đã đóng.'],
    live_abandoned: ['Your turn has passed; you may join again.', 'Lượt của bạn đã qua; bạn có thể vào hàng chờ lại.'],
    live_held: ['Reserved: complete your payment.', 'Đã giữ hàng: hãy hoàn tất thanh toán.'],
    live_paying: ['Payment in progress.', 'Đang thanh toán.'],
    live_paid: ['Paid: your order is confirmed.', 'Đã thanh toán: đơn hàng đã được xác nhận.'],
    live_no_sale: ['No such sale.', 'Không có đợt bán này.'],
    title_turn: ["It's your turn — {name}", 'Đến lượt bạn — {name}'],
    title: ['{name} — flash sale'],
    notif_title: ["It's your turn", 'Đã đến lượt bạn'],
    notif_body: ['You may reserve {name} now.', 'Bạn có thể đặt giữ {name} ngay.'],
    trouble: ['Connection trouble — retrying in {dur}. You keep your place.', 'Lỗi kết nối — thử lại sau {dur}. Bạn vẫn giữ vị trí.'],
    busy: ['The shop is busy — trying again…', 'Cửa hàng đang bận — đang thử lại…'],
    network: ['Network error — please try again.', 'Lỗi mạng — vui lòng thử lại.'],
    dev_pay: ['Completing payment with the local dev payment provider…', 'Đang thanh toán qua nhà cung cấp thử nghiệm…'],
    error_n: ['Error {status}', 'Lỗi {status}'],
    draw_h: ['How the fair draw works', 'Cách bốc thăm công bằng'],
    draw_p1: ['Everyone who joins before the start is in the pre-queue. At the start their order is drawn at random, so arriving early gives no advantage. After the start, people are added in order of arrival.', 'Ai vào trước giờ mở bán đều ở hàng chờ trước. Lúc mở bán, thứ tự của họ được bốc thăm ngẫu nhiên, nên đến sớm không được ưu tiên. Sau giờ mở bán, người đến sau xếp theo thứ tự đến.'],
    draw_commit: ['Commitment (SHA-256 of the secret seed, published before anyone joined):', 'Cam kết (SHA-256 của hạt giống bí mật, công bố trước khi có người tham gia):'],
    draw_seed: ['Seed (published after the draw):', 'Hạt giống (công bố sau khi bốc thăm):'],
    not_drawn: ['not yet drawn', 'chưa bốc thăm'],
    draw_value: ['At the start the entrant list is sealed and mixed with a public random number nobody knew before: “Check my draw” verifies your place.', 'Lúc mở bán, danh sách được niêm phong rồi trộn với một số ngẫu nhiên công khai chưa ai biết: “Kiểm tra lượt bốc thăm của tôi” xác minh vị trí của bạn.'],
    draw_list: ['Full list of draw values', 'Danh sách đầy đủ các giá trị'],
    check: ['Check my draw', 'Kiểm tra lượt bốc thăm của tôi'],
    check_wait: ['Checking…', 'Đang kiểm tra…'],
    dur_s: ['{s} s', '{s} giây'],
    dur_ms: ['{m} min {s} s', '{m} phút {s} giây'],
    dur_hm: ['{h} h {m} min', '{h} giờ {m} phút'],
  };
  const LANGS = ['en', 'vi'];
  const LANG_KEY = 'flashsale:lang';
  const pickLang = () => {
    const saved = localStorage.getItem(LANG_KEY);
    if (LANGS.includes(saved)) return saved;
    for (const l of navigator.languages || [navigator.language]) {
      const p = String(l).toLowerCase().split('-')[0];
      if (LANGS.includes(p)) return p;
    }
    return 'en';
  };
  let lang = pickLang();
  // Formats: the person's locale if in the chosen language (en-GB), else it.
  const locale = () => (navigator.languages || []).find((l) => l.toLowerCase().split('-')[0] === lang) || lang;
  const t = (key, vars = {}) => ((MSG[key] || [])[LANGS.indexOf(lang)] ?? (MSG[key] || [key])[0])
    .replace(/\{(\w+)\}/g, (_, k) => (vars[k] ?? ''));
  const num = (n) => new Intl.NumberFormat(locale()).format(n);
  const CURRENCY = (document.querySelector('meta[name="flashsale-currency"]') || {}).content || 'EUR';
  const money = (cents, cur) => {
    try {
      return new Intl.NumberFormat(locale(), { style: 'currency', currency: cur }).format(cents / 100);
    } catch { return `${num(cents / 100)} ${cur}`; }
  };
  const clock = (ms) => new Date(ms).toLocaleTimeString(locale(), { hour: '2-digit', minute: '2-digit', second: '2-digit' });
  function dur(s) {
    s = Math.max(0, Math.round(s));
    if (s < 60) return t('dur_s', { s: num(s) });
    if (s < 3600) return t('dur_ms', { m: num(Math.floor(s / 60)), s: num(s % 60) });
    return t('dur_hm', { h: num(Math.floor(s / 3600)), m: num(Math.floor((s % 3600) / 60)) });
  }

  const sale = decodeURIComponent(location.pathname.split('/')[2] || '');
  const KEY = `flashsale:${sale}`;
  const API = `/api/sales/${encodeURIComponent(sale)}`;
  let st = {};
  try { st = JSON.parse(localStorage.getItem(KEY)) || {}; } catch { st = {}; }
  delete st.user; // older pages kept it here; it lives in sessionStorage now
  let user = sessionStorage.getItem(USER_KEY);
  const save = () => localStorage.setItem(KEY, JSON.stringify(st));
  let summary = null;
  let status = null;
  let devMode = false;
  let errors = 0;
  let noSale = false;
  let spoken = '';
  let wasAdmitted = false;
  let lastPoll = 0;
  // The SKU the person chose (else the first not sold out), those a 410
  // sku_sold_out took (for 15 s: the summary may be older), a refusal's text.
  let picked = st.resBody?.sku;
  const gone = {};
  let resMsg = null;
  const skus = () => summary?.skus || [];
  const skuOut = (k) => k.sold_out === true || Date.now() - (gone[k.id] || 0) < 15000;
  const band = (k) => (skuOut(k) ? 'band_out' : k.units_available <= Math.max(5, k.units_total / 10) ? 'band_few' : 'band_in');
  const skuOf = () => {
    const l = skus();
    return l.find((k) => k.id === picked) || l.find((k) => !skuOut(k)) || l[0];
  };

  const jitter = (ms) => Math.round(ms * (0.9 + Math.random() * 0.2));
  const nowS = () => Date.now() / 1000;
  const uuid = () => (crypto.randomUUID ? crypto.randomUUID()
    : [...crypto.getRandomValues(new Uint8Array(16))].map((b) => b.toString(16).padStart(2, '0')).join(''));
  function subOf(token) {
    try {
      return JSON.parse(atob(token.split('.')[2].replace(/-/g, '+').replace(/_/g, '/'))).sub;
    } catch { return null; }
  }
  async function api(method, path, { token, body, idem, held } = {}) {
    const headers = {};
    if (token) headers.authorization = `Bearer ${token}`;
    if (held) headers['x-queue-ticket'] = held;
    if (body !== undefined) headers['content-type'] = 'application/json';
    if (idem) headers['idempotency-key'] = idem;
    const r = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
    let data = null;
    try { data = await r.json(); } catch { data = null; }
    return { status: r.status, data, retryAfter: Number(r.headers.get('retry-after')) || 0 };
  }
  const say = (id, text) => { if ($(id).textContent !== text) $(id).textContent = text; };
  const show = (id, on) => { $(id).hidden = !on; };
  const errCode = (r) => r.data?.error?.code;
  const errorText = (r) => r.data?.error?.message || t('error_n', { status: r.status });

  const assets = (document.currentScript || {}).dataset || {};
  // Timers: one per job, on the worker; setTimeout only if it cannot start.
  const jobs = {};
  let timerSeq = 0;
  let worker = null;
  try {
    const src = assets.timer;
    if (src) {
      worker = new Worker(src);
      worker.onmessage = (e) => fire(e.data);
      worker.onerror = () => { worker = null; };
    }
  } catch { worker = null; }
  function fire(id) {
    for (const [job, j] of Object.entries(jobs)) {
      if (j.id === id) { delete jobs[job]; j.fn(); }
    }
  }
  function later(job, ms, fn) {
    const id = ++timerSeq;
    jobs[job] = { id, fn, at: Date.now() + ms };
    if (worker) worker.postMessage({ id, ms });
    else setTimeout(() => fire(id), ms);
  }
  const stopAll = () => { for (const job of Object.keys(jobs)) delete jobs[job]; };
  // Back in view: anything due (a worker message may still be queued behind
  // the page's throttled tasks) runs now — one catch-up poll.
  document.addEventListener('visibilitychange', () => {
    if (document.hidden) return;
    for (const [job, j] of Object.entries(jobs)) {
      if (j.at <= Date.now() || (job === 'poll' && Date.now() - lastPoll > 2000)) { delete jobs[job]; j.fn(); }
    }
  });
  function backoff(job, fn, r) {
    errors += 1;
    const ms = Math.max((r && r.retryAfter) * 1000 || 0, Math.min(60000, 1000 * 2 ** Math.min(errors, 6)));
    say('note', t('trouble', { dur: dur(ms / 1000) }));
    later(job, jitter(ms), fn);
  }

  function unknownSale(r) {
    noSale = true;
    stopAll();
    say('error', '');
    say('note', r?.data?.error ? errorText(r) : '');
    render();
  }

  async function loadSummary() {
    if (noSale) return;
    try {
      const r = await api('GET', API);
      if (r.status === 200) {
        summary = r.data;
        render();
      } else if (r.status === 404) {
        unknownSale(r);
        return;
      }
    } catch { /* next round */ }
    // While in line, the shop's message (issue 47) must show within 5 s of
    // being posted: 1 s of edge cache plus at most 3.3 s here. Others need
    // the summary less often.
    later('summary', jitter(inLine() ? SUMMARY_IN_LINE_MS : 5000), loadSummary);
  }
  const SUMMARY_IN_LINE_MS = 3000;
  const inLine = () => status && !['closed', 'sold_out'].includes(status.status);

  async function poll() {
    if (!st.ticket || st.res || noSale) return;
    lastPoll = Date.now();
    try {
      const r = await api('GET', `${API}/queue`, { token: st.ticket });
      if (r.status === 200) {
        errors = 0;
        if (!st.ended) say('note', '');
        applyStatus(r.data);
        if (r.data.status !== 'closed') later('poll', jitter(r.data.poll_after_ms || 5000), poll);
      } else if (r.status === 404) {
        unknownSale(r);
      } else if (r.status === 401 || r.status === 403) {
        st.ticket = null; save();
        if (user) join(); else render();
      } else backoff('poll', poll, r);
    } catch { backoff('poll', poll); }
  }

  function applyStatus(s) {
    status = s;
    // Just in line (a join, the first poll): the summary read scheduled
    // at the slower pace comes sooner.
    const next = jobs.summary;
    if (inLine() && next && next.at - Date.now() > SUMMARY_IN_LINE_MS * 1.1) {
      later('summary', jitter(SUMMARY_IN_LINE_MS), loadSummary);
    }
    if (s.ticket) st.ticket = s.ticket;
    if (s.admission_token) {
      st.admit = s.admission_token;
      st.admitExp = s.admission_expires_at;
      // The window's end, fixed by the edge: re-polls do not move it.
      st.windowEnd = s.window_ends_at_ms || s.admission_expires_at * 1000;
    }
    if (resMsg && s.status !== 'admitted') { resMsg = null; say('error', ''); }
    save();
    render();
    const admitted = s.status === 'admitted' && !st.res;
    if (admitted && !wasAdmitted) turnCame();
    wasAdmitted = admitted;
  }

  // The turn came: title, notification, keyboard on Reserve.
  function turnCame() {
    const name = summary?.name || sale;
    document.title = t('title_turn', { name });
    try {
      if (window.Notification && Notification.permission === 'granted') {
        new Notification(t('notif_title'), { body: t('notif_body', { name }), tag: `flashsale-${sale}` });
      }
    } catch { /* some browsers only notify from a service worker */ }
    $('reserve-btn').focus();
  }

  // Proof of work (pow:<bits>): a fresh challenge solved in the pow.js
  // worker. Answers { body } or { refused }.
  async function solveChallenge() {
    const c = await api('GET', `${API}/challenge`, { token: user });
    if (c.status !== 200) return { refused: c };
    if (c.data.kind !== 'pow') return { body: undefined };
    const expected = 2 ** c.data.difficulty;
    show('pow', true);
    $('pow-bar').value = 0;
    try {
      const nonce = await new Promise((resolve, reject) => {
        const w = new Worker(assets.pow);
        w.onmessage = (e) => {
          if (e.data.nonce != null) { w.terminate(); resolve(e.data.nonce); }
          // Share of the expected work, never shown as done before it is.
          else $('pow-bar').value = Math.min(99, Math.round((100 * e.data.tries) / expected));
        };
        w.onerror = (e) => { w.terminate(); reject(e); };
        w.postMessage({ challenge: c.data.challenge, difficulty: c.data.difficulty });
      });
      $('pow-bar').value = 100;
      return { body: { challenge: c.data.challenge, nonce } };
    } finally {
      show('pow', false);
    }
  }

  // Turnstile: Cloudflare's widget, loaded only for such sales (their CSP
  // allows it). Answers { body } or { refused }.
  const TS_SCRIPT = 'https://challenges.cloudflare.com/turnstile/v0/api.js?render=explicit';
  let tsLoaded = null;
  let tsWidget = null;
  async function turnstileToken() {
    const c = await api('GET', `${API}/challenge`, { token: user });
    if (c.status !== 200) return { refused: c };
    if (c.data.kind !== 'turnstile') return { body: undefined };
    tsLoaded = tsLoaded || new Promise((resolve, reject) => {
      const el = document.createElement('script');
      el.src = TS_SCRIPT;
      el.onload = resolve;
      el.onerror = reject;
      document.head.append(el);
    });
    await tsLoaded;
    show('ts', true);
    try {
      const token = await new Promise((resolve, reject) => {
        if (tsWidget != null) window.turnstile.remove(tsWidget);
        tsWidget = window.turnstile.render('#ts-box', {
          sitekey: c.data.site_key, language: lang, callback: resolve,
          'error-callback': () => reject(new Error('turnstile')),
          'expired-callback': () => reject(new Error('turnstile expired')),
        });
      });
      return { body: { turnstile: token } };
    } finally {
      show('ts', false);
    }
  }

  // Refusals a fresh challenge can pass (a bad nonce too).
  const RETRY_BOT = ['challenge_expired', 'challenge_reused', 'bot_check_failed', 'bot_check_required',
    'challenge_invalid', 'bad_nonce'];
  let botRetries = 0;
  async function join() {
    $('join-btn').disabled = true;
    say('error', '');
    try {
      let body;
      const check = summary?.bot_check || '';
      // A re-join (e.g. a turn given back) sends the ticket: no check.
      const held = st.ticket || null;
      if (!held && check === 'turnstile') {
        const s = await turnstileToken();
        if (s.refused) { joinRefused(s.refused); $('join-btn').disabled = false; return; }
        body = s.body;
      } else if (!held && (/^pow:/.test(check) || botRetries > 0)) {
        const s = await solveChallenge();
        if (s.refused) { joinRefused(s.refused); $('join-btn').disabled = false; return; }
        body = s.body;
      }
      const r = await api('POST', `${API}/queue`, { token: user, body, held });
      if (r.status === 200) { botRetries = 0; applyStatus(r.data); later('poll', jitter(r.data.poll_after_ms), poll); }
      else joinRefused(r);
    } catch { backoff('poll', join); }
    $('join-btn').disabled = false;
  }

  function joinRefused(r) {
    const code = errCode(r);
    if (r.status === 401) {
      user = null; sessionStorage.removeItem(USER_KEY);
      say('error', t('signin_refused', { why: errorText(r) })); render();
    } else if (r.status === 404) unknownSale(r);
    else if ((r.status === 403 || r.status === 400) && RETRY_BOT.includes(code) && botRetries < 3) {
      // A new challenge may pass (e.g. this one expired): a few tries.
      botRetries += 1;
      // A ticket the edge did not answer from (expired) is no use: solve.
      if (st.ticket) { st.ticket = null; save(); }
      say('note', t('pow_retry', { why: t(code) }));
      later('poll', 500, join);
    } else if (r.status === 403 || r.status === 400) {
      // In the person's words when the catalogue has them.
      say('error', MSG[code] ? t('join_refused', { why: t(code) }) : errorText(r));
    } else if (r.status === 429 && code === 'too_many_joins') {
      const ms = Math.max(1000, r.retryAfter * 1000);
      say('note', t('too_many_joins', { dur: dur(ms / 1000) }));
      later('poll', jitter(ms), join);
    } else if (r.status === 503 && code === 'bot_check_unavailable') {
      say('note', t('bot_check_unavailable'));
      backoff('poll', join, r);
    } else backoff('poll', join, r);
  }

  async function reserve() {
    const btn = $('reserve-btn');
    btn.disabled = true;
    say('error', '');
    resMsg = null;
    // One key per attempt, kept with its body until the attempt resolves:
    // a retry replays it, never reserves twice; another choice, a new key.
    const k = skuOf();
    const qty = Number($('qty').value);
    const body = k ? { sku: k.id, qty } : { qty };
    if (!st.resIdem || JSON.stringify(st.resBody) !== JSON.stringify(body)) {
      st.resIdem = uuid();
      st.resBody = body;
    }
    st.ended = null;
    save();
    try {
      const r = await api('POST', `${API}/reservations`,
        { token: st.admit, body: st.resBody, idem: st.resIdem });
      if (r.status === 202 || r.status === 200) {
        st.res = { id: r.data.reservation_id, expires_at: r.data.expires_at, status: r.data.status, qty: r.data.qty };
        save();
        say('note', '');
        document.title = t('title', { name: summary?.name || sale });
        render();
        later('res', 2000, pollReservation);
      } else if (r.status === 410 && errCode(r) === 'sku_sold_out') {
        // Others are left: the picker marks it, falls back and takes focus.
        st.resIdem = null; save();
        gone[body.sku] = Date.now();
        picked = null;
        resMsg = 'sku_sold_out';
        render();
        $('sku').focus();
      } else if (r.status === 410) {
        st.resIdem = null; save();
        applyStatus({ ...(status || {}), status: 'sold_out', admission_token: undefined });
        later('poll', jitter(5000), poll);
      } else if (r.status === 429 || r.status === 503) {
        say('note', t('busy'));
        later('reserve', jitter(Math.max(1000, r.retryAfter * 1000)), reserve);
      } else {
        // Refused (limit, bad token, reused key): this attempt is over.
        st.resIdem = null; save();
        if (errCode(r) === 'sku_per_user_limit') { resMsg = errCode(r); render(); } else say('error', errorText(r));
        if (r.status === 401 || r.status === 403) poll();
      }
    } catch { say('error', t('network')); }
    btn.disabled = false;
    countdowns();
  }

  const authToken = () => (st.admit && st.admitExp > nowS() + 5 ? st.admit : user);

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
          say('note', t('dev_pay'));
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
    } catch { say('error', t('network')); }
    btn.disabled = false;
  }

  async function cancel() {
    const btn = $('cancel-btn');
    btn.disabled = true;
    say('error', '');
    try {
      const r = await api('DELETE', `/api/reservations/${encodeURIComponent(st.res.id)}`, { token: authToken() });
      if (r.status === 200 || r.status === 204) reservationEnded('cancelled');
      else if (r.status === 409) pollReservation(); // no longer held: learn what it is
      else say('error', errorText(r));
    } catch { say('error', t('network')); }
    btn.disabled = false;
  }

  // Expired, cancelled or rejected: say so, forget the attempt (and its key)
  // and ask the queue where the person stands.
  function reservationEnded(how) {
    st.res = null;
    st.resIdem = null;
    st.resBody = null;
    st.payIdem = null;
    st.ended = how;
    save();
    delete jobs.res;
    wasAdmitted = false;
    status = null;
    render();
    poll();
  }

  async function pollReservation() {
    if (!st.res) return;
    try {
      const r = await api('GET', `/api/reservations/${encodeURIComponent(st.res.id)}`, { token: authToken() });
      if (r.status === 200) {
        errors = 0;
        if (['expired', 'cancelled', 'rejected'].includes(r.data.status)) { reservationEnded(r.data.status); return; }
        st.res.status = r.data.status;
        st.res.expires_at = r.data.expires_at || st.res.expires_at;
        save();
        render();
        if (r.data.status !== 'paid') {
          later('res', jitter(st.res.status === 'pending_payment' ? 1000 : 5000), pollReservation);
        }
      } else backoff('res', pollReservation, r);
    } catch { backoff('res', pollReservation); }
  }

  function setState(kind, cls, title, text) {
    $('state').className = `card ${cls}`;
    say('state-h', title);
    say('state-text', text);
    // The live region keeps its text while the numbers beside it move.
    if (kind !== spoken) { spoken = kind; say('live', t(`live_${kind}`)); }
  }

  // The phase as a shopper sees it now: the summary is up to 5 s old and
  // says "upcoming" until it is refreshed after the start.
  function phase(s) {
    if (s.paused || status?.status === 'paused') return 'paused';
    if (s.sold_out || s.phase === 'sold_out') return 'sold_out';
    if (s.phase === 'upcoming' && Date.parse(s.starts_at) <= Date.now()) return 'live';
    return s.phase;
  }

  function translateStatic() {
    document.documentElement.lang = lang;
    for (const el of document.querySelectorAll('[data-t]')) say2(el, t(el.dataset.t));
    $('lang').value = lang;
  }
  function say2(el, text) { if (el.textContent !== text) el.textContent = text; }

  function render() {
    if (noSale) {
      document.title = t('no_sale');
      say('name', t('no_sale'));
      say('error', t('no_sale_text'));
      for (const id of ['signin', 'join', 'state', 'draw', 'sold', 'start', 'price', 'phase', 'skus']) show(id, false);
      if (spoken !== 'no_sale') { spoken = 'no_sale'; say('note', t('live_no_sale')); }
      return;
    }
    const s = summary;
    if (s) {
      document.title = t(status?.status === 'admitted' && !st.res ? 'title_turn' : 'title', { name: s.name });
      say('name', s.name);
      // The operator's message: text, never markup (textContent).
      say('notice-text', typeof s.message === 'string' ? s.message : '');
      show('notice', typeof s.message === 'string' && s.message !== '');
      const cur = s.currency || CURRENCY;
      const list = skus();
      const ps = list.map((k) => k.price_cents);
      const lo = ps.length ? Math.min(...ps) : s.price_cents;
      say('price', lo != null ? t(lo < Math.max(...ps) ? 'from' : 'price', { price: money(lo, cur) }) : '');
      const p = phase(s);
      say('phase', t(`phase_${p}`));
      $('phase').className = `badge phase-${p}`;
      const pct = Math.round(Number(s.percent_sold) || 0);
      $('sold-bar').value = pct;
      say('sold-pct', t('sold_pct', { pct: new Intl.NumberFormat(locale(), { style: 'percent' }).format(pct / 100) }));
      const startMs = Date.parse(s.starts_at);
      say('start', startMs > Date.now()
        ? t('starts', { time: clock(startMs), dur: dur((startMs - Date.now()) / 1000) })
        : t('started', { time: clock(startMs) }));
      if (s.draw) {
        say('commitment', s.draw.commitment || '–');
        say('seed', s.draw.seed || t('not_drawn'));
        // A receipt exists once the draw is listed, for a ticket's holder.
        $('check-btn').disabled = !(s.draw.listed && st.sub && st.ticket);
        $('audit').href = s.draw.audit || '#';
      } else say('seed', t('not_drawn'));
      renderSkus(list, cur);
    }
    const signedIn = Boolean(user);
    show('signin', !signedIn);
    show('token-form', !signedIn && devMode);
    show('dev-form', !signedIn && devMode);
    say('who', st.sub ? t('who', { who: st.sub }) : '');
    // A turn lost for not checking in may join again, at the back.
    const again = status?.status === 'closed' && status.reason === 'abandoned';
    show('join', signedIn && (!st.ticket || again));
    show('state', Boolean(st.ticket) || Boolean(st.res));
    show('line', false);
    show('admit', false);
    show('held', false);
    show('notify', false);
    if (st.res) renderReservation();
    else if (status) renderStatus(s);
    // What became of the last attempt stays said until the next one.
    if (st.ended && !st.res) say('note', `${t(`res_${st.ended}`)} ${t('again')}`);
    if (resMsg) say('error', t(resMsg));
    countdowns();
  }

  // The SKUs: a row each; a picker if several, updated in place (choice and
  // focus stay); Quantity up to the sale's limit and the chosen SKU's own.
  function renderSkus(list, cur) {
    const rows = $('sku-rows');
    const sel = $('sku');
    show('skus', list.length);
    show('sku-box', list.length > 1);
    if (`${list.map((k) => k.id)}` !== `${[...sel.options].map((o) => o.value)}`) {
      rows.replaceChildren(...list.map(() => rows.insertRow()));
      for (const r of rows.rows) r.innerHTML = '<th scope="row"></th><td></td><td></td><td></td>';
      sel.replaceChildren(...list.map((k) => new Option('', k.id)));
    }
    // While waiting: per SKU, whether it is likely left at this person's
    // turn (the edge's estimate, docs/skus.md), in a fourth column.
    const ol = status?.status === 'waiting' ? status.sku_outlook : null;
    const olBy = Object.fromEntries((ol || []).map((o) => [o.sku, o.band]));
    show('turn-h', ol);
    list.forEach((k, i) => {
      const b = band(k);
      const price = money(k.price_cents, cur);
      [k.name, price, t(b), olBy[k.id] ? t(`ol_${olBy[k.id]}`) : ''].forEach((x, c) => say2(rows.rows[i].cells[c], x));
      rows.rows[i].cells[3].hidden = !ol;
      rows.rows[i].className = b;
      say2(sel.options[i], `${k.name} — ${price}${skuOut(k) ? ` ${t('sku_out')}` : ''}`);
      sel.options[i].disabled = skuOut(k);
    });
    const k = skuOf();
    if (k && sel.value !== k.id) sel.value = k.id;
    const limit = Math.max(1, Math.min(Number(summary.per_user_limit) || 1, k?.per_user_limit || 1e9));
    const q = $('qty');
    if (q.options.length !== limit) {
      const v = Math.min(Number(q.value) || 1, limit);
      q.replaceChildren(...Array.from({ length: limit }, (_, i) => new Option(num(i + 1), String(i + 1))));
      q.value = v;
    }
  }

  function renderStatus(s) {
    const x = status;
    const kind = x.status;
    if (kind === 'prequeue') {
      const at = x.starts_at_ms || (s && Date.parse(s.starts_at));
      setState(kind, 'prequeue', t('prequeue_h'), t('prequeue_t', { time: clock(at) }));
    } else if (kind === 'drawing') {
      setState(kind, 'prequeue', t('drawing_h'), t('drawing_t'));
    } else if (kind === 'waiting' && x.place == null) {
      setState(kind, 'waiting', t('placing_h'), t('placing_t'));
    } else if (kind === 'waiting') {
      const eta = x.eta_seconds;
      const range = eta == null ? t('unknown') : `${dur(eta * 0.8)} – ${dur(eta * 1.3 + 5)}`;
      setState(kind, 'waiting', t('waiting_h', { place: num(x.place) }),
        t('waiting_t', { ahead: num(x.ahead), range }));
      show('line', true);
      $('line-bar').value = x.place ? Math.round(100 * (1 - x.position / x.place)) : 0;
    } else if (kind === 'admitted') {
      setState(kind, 'admitted', t('admitted_h'), t('admitted_t', { place: num(x.place) }));
      show('admit', true);
    } else if (kind === 'paused') {
      setState(kind, 'paused', t('paused_h'), t('paused_t'));
    } else if (kind === 'sold_out') {
      setState(kind, 'sold-out', t('sold_out_h'), t('sold_out_t'));
    } else if (kind === 'closed' && x.reason === 'abandoned') {
      setState('abandoned', 'closed', t('abandoned_h'), t('abandoned_t'));
    } else if (kind === 'closed') {
      setState(kind, 'closed', t('closed_h'), t('closed_t'));
    }
    const waitingKind = ['prequeue', 'drawing', 'waiting', 'paused'].includes(kind);
    show('notify', waitingKind && Boolean(window.Notification) && Notification.permission === 'default' && !st.notifyAsked);
  }

  function renderReservation() {
    const r = st.res;
    if (r.status === 'paid') {
      setState('paid', 'paid', t('paid_h'), t('paid_t', { qty: num(r.qty || 1) }));
    } else if (r.status === 'pending_payment') {
      setState('paying', 'held', t('paying_h'), t('paying_t'));
    } else {
      setState('held', 'held', t('held_h'), t('held_t', { qty: num(r.qty || 1) }));
      show('held', true);
    }
  }

  function countdowns() {
    if (status?.status === 'admitted' && !st.res) {
      const end = st.windowEnd || 0;
      const left = end / 1000 - nowS();
      say('admit-left', left > 0 ? t('turn_left', { dur: dur(left), time: clock(end) }) : t('turn_over'));
      $('reserve-btn').disabled = left <= 0;
      // The window closed: learn the new state now, not at the next poll.
      if (left <= 0 && !jobs.closing) later('closing', 1000, () => { delete jobs.poll; poll(); });
    }
    if (st.res && st.res.expires_at) {
      const end = Date.parse(st.res.expires_at);
      const h = end / 1000 - nowS();
      say('hold-left', h > 0 ? t('hold_left', { dur: dur(h), time: clock(end) }) : t('hold_over'));
    }
  }

  let startSeen = false;
  let endSeen = false;
  function tick() {
    // The announced end passed: ask now, not at the next poll.
    if (summary && summary.ends_at && !endSeen && Date.parse(summary.ends_at) <= Date.now()) {
      endSeen = true;
      if (st.ticket && !st.res) later('poll', 500, poll);
      later('summary', 1000, loadSummary);
    }
    if (summary && Date.parse(summary.starts_at) > Date.now() - 1000) render();
    else countdowns();
    // The start just passed: fetch the new phase (and the seed) soon.
    if (summary && !startSeen && Date.parse(summary.starts_at) <= Date.now()) {
      startSeen = true;
      if (summary.phase === 'upcoming') later('summary', jitter(2500), loadSummary);
    }
  }

  // "Check my draw": check.js is loaded only when asked for (page weight).
  let checker = null;
  const loadChecker = () => checker || (checker = new Promise((resolve, reject) => {
    const el = document.createElement('script');
    el.src = assets.check;
    el.onload = () => resolve(self.flashsaleCheckDraw);
    el.onerror = () => { checker = null; reject(new Error('check.js')); };
    document.head.appendChild(el);
  }));
  async function checkDraw() {
    say('check-out', t('check_wait'));
    try {
      const run = await loadChecker();
      say('check-out', await run({ sale, sub: st.sub, ticket: st.ticket, api, lang, num }));
    } catch { say('check-out', t('network')); }
  }

  function signIn(token) {
    user = token;
    sessionStorage.setItem(USER_KEY, token);
    st = { sub: subOf(token), notifyAsked: st.notifyAsked };
    save();
    render();
    join();
  }

  $('token-form').addEventListener('submit', (e) => {
    e.preventDefault();
    const v = $('token-input').value.trim();
    if (v) signIn(v);
  });
  $('dev-form').addEventListener('submit', async (e) => {
    e.preventDefault();
    const r = await api('POST', '/api/dev/token', { body: { name: $('dev-name').value.trim() } });
    if (r.status === 200) signIn(r.data.user_token); else say('error', errorText(r));
  });
  $('join-btn').addEventListener('click', join);
  $('reserve-btn').addEventListener('click', reserve);
  $('sku').addEventListener('change', () => { picked = $('sku').value; render(); });
  $('pay-btn').addEventListener('click', pay);
  $('cancel-btn').addEventListener('click', cancel);
  $('check-btn').addEventListener('click', checkDraw);
  $('notify-btn').addEventListener('click', async () => {
    st.notifyAsked = true; // asked once, whatever the answer
    save();
    show('notify', false);
    try { await Notification.requestPermission(); } catch { /* unsupported */ }
  });
  $('lang').addEventListener('change', () => {
    lang = LANGS.includes($('lang').value) ? $('lang').value : 'en';
    localStorage.setItem(LANG_KEY, lang);
    translateStatic();
    spoken = '';
    render();
  });

  (async () => {
    translateStatic();
    // A token from the shop for another account replaces this tab's state.
    if (user && st.sub && subOf(user) !== st.sub) st = { notifyAsked: st.notifyAsked };
    if (user && !st.sub) st.sub = subOf(user);
    save();
    try {
      const h = (await api('GET', '/api/health')).data;
      devMode = h.dev_mode === true;
      // DEV_MODE refused (the origin is not local): say why.
      if (typeof h.dev_mode_refused === 'string') {
        say('dev-refused', t('dev_refused', { why: h.dev_mode_refused }));
        show('dev-refused', true);
      }
    } catch { devMode = false; }
    render();
    await loadSummary();
    if (noSale) return;
    if (st.res) pollReservation();
    else if (st.ticket) poll();
    else if (user && fragToken) join();
    setInterval(tick, 1000);
  })();
})();
