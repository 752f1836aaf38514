// The queue page: one script for every sale (the sale id is in the path).
//
// Invariants:
// - the place is kept in a background tab: polls run on a Web Worker timer
//   (timer.js; a hidden tab's own timers are throttled) at the edge's
//   poll_after_ms plus jitter, with a catch-up poll when the tab is shown;
//   errors back off exponentially;
// - the user token from the shop (`#token=…`) lives in sessionStorage only
//   and leaves the address bar before any request is made;
// - one Idempotency-Key per reservation attempt: a retry of the same attempt
//   reuses it, a new attempt after expired / cancelled / rejected gets a new one;
// - the live region speaks when the state changes, never on a mere poll;
// - a sale with a proof-of-work bot check (summary.bot_check = pow:<bits>):
//   a join first fetches a challenge and solves it in a Web Worker
//   (pow.js, WebCrypto) with a progress bar; a refused solution that can
//   be retried (expired, reused, failed) is retried with a fresh challenge;
// - every text comes from the message catalogue MSG (en, vi).
'use strict';
(() => {
  const $ = (id) => document.getElementById(id);

  // Sign-in from the shop: the fragment is read, stored for this tab and
  // removed from the address bar (and history) first of all.
  const USER_KEY = 'flashsale:user';
  const fragToken = new URLSearchParams(location.hash.slice(1)).get('token');
  if (location.hash) history.replaceState(null, '', location.pathname + location.search);
  if (fragToken) sessionStorage.setItem(USER_KEY, fragToken.trim());

  const MSG = {
    en: {
      eyebrow: 'Flash sale', language: 'Language', loading: 'Loading…', sold: 'Sold',
      sold_pct: '{pct} sold', price: 'Price {price}',
      phase_upcoming: 'Starts soon', phase_live: 'On sale now', phase_sold_out: 'Sold out',
      phase_ended: 'Ended', phase_paused: 'Paused',
      starts: 'Starts at {time} (in {dur})', started: 'Started at {time}',
      no_sale: 'No such sale', no_sale_text: 'There is no sale at this address. Please check the link from the shop.',
      signin_h: 'Sign in to join',
      signin_shop: "Open this page from the shop's sale page while signed in there: the shop signs you in here.",
      token_label: 'Your account token (local dev mode only)', token_btn: 'Use this token',
      dev_label: 'Name (local dev mode only)', dev_btn: 'Sign in as this name',
      dev_refused: 'Dev mode is off: {why}', signin_refused: 'Sign-in refused: {why}',
      join_h: 'Join the queue', join_btn: 'Join the queue', who: 'Signed in as {who}.',
      pow_label: 'Bot check',
      pow_t: 'Your browser is doing a short check that makes joining with many accounts expensive for bots. It needs nothing from you and you join as soon as it is done.',
      pow_retry: 'The check has to be done again ({why}) — starting over.',
      ts_t: 'Please complete the check below; you join as soon as it passes.',
      bot_check_required: 'this sale asks for a bot check', bot_check_failed: 'the check did not pass',
      challenge_expired: 'it took too long', challenge_reused: 'it was already used',
      challenge_invalid: 'the check was not recognised', bad_nonce: 'the answer was malformed',
      bot_check_unavailable: 'The bot check cannot be verified just now — trying again in a moment.',
      join_refused: 'You could not join: {why}.',
      too_many_joins: 'Too many people joined from your network just now — trying again in {dur}.',
      line_label: 'Progress through the line',
      notify_why: 'Want to switch tabs while you wait? This page keeps your place in the background and can notify you when it is your turn.',
      notify_btn: 'Notify me when it is my turn',
      qty: 'Quantity', reserve: 'Reserve', pay: 'Pay', cancel: 'Cancel reservation',
      prequeue_h: 'You are in the pre-queue',
      prequeue_t: 'Your place in line is drawn at {time}. Everyone who joins before then has the same chance: arriving early gives no advantage.',
      drawing_h: 'Drawing the order',
      drawing_t: 'The order of the pre-queue is being drawn right now. Your place appears in a moment.',
      placing_h: 'You are in line',
      placing_t: 'Your place in line is being confirmed (a second or two).',
      waiting_h: 'Your place in line: {place}',
      waiting_t: 'People ahead of you: {ahead}. Estimated wait: {range}.',
      unknown: 'unknown',
      admitted_h: "It's your turn", admitted_t: 'Your place in line: {place}. You may reserve now.',
      turn_left: 'Your turn ends in {dur} (at {time}).', turn_over: 'Your turn has ended.',
      paused_h: 'The sale is paused',
      paused_t: 'The sale is paused for a moment. You keep your place; this page carries on by itself when it resumes.',
      sold_out_h: 'Sold out',
      sold_out_t: 'Every unit is taken right now. If reserved units are released, the line moves again — keep this page open.',
      closed_h: 'Closed', closed_t: 'This sale is over, or your turn to reserve has passed.',
      abandoned_h: 'Your turn has passed',
      abandoned_t: 'This page stopped checking in for 30 seconds while you held nothing, so your turn went to the next person. You may join again, at the back of the line.',
      held_h: 'Reserved — complete your payment', held_t: '{qty} unit(s) are held for you.',
      hold_left: 'Held for {dur} more (until {time}).', hold_over: 'The hold has expired.',
      paying_h: 'Payment in progress', paying_t: 'Waiting for the payment provider to confirm…',
      paid_h: 'Paid — your order is confirmed', paid_t: 'You bought {qty}. Thank you!',
      res_expired: 'Your hold expired and the units went back on sale.',
      res_cancelled: 'Your reservation was cancelled and the units went back on sale.',
      res_rejected: 'The shop could not confirm your reservation.',
      again: 'While your turn lasts you can reserve again.',
      live_prequeue: 'You are in the pre-queue.', live_drawing: 'The order is being drawn.',
      live_waiting: 'You are in line.', live_admitted: "It's your turn: you may reserve now.",
      live_paused: 'The sale is paused; you keep your place.', live_sold_out: 'Sold out.',
      live_closed: 'Closed.', live_abandoned: 'Your turn has passed; you may join again.', live_held: 'Reserved: complete your payment.',
      live_paying: 'Payment in progress.', live_paid: 'Paid: your order is confirmed.',
      live_no_sale: 'No such sale.',
      title_turn: "It's your turn — {name}", title: '{name} — flash sale',
      notif_title: "It's your turn", notif_body: 'You may reserve {name} now.',
      trouble: 'Connection trouble — retrying in {dur}. You keep your place.',
      busy: 'The shop is busy — trying again…', network: 'Network error — please try again.',
      dev_pay: 'Completing payment with the local dev payment provider…',
      error_n: 'Error {status}',
      draw_h: 'How the fair draw works',
      draw_p1: 'Everyone who joins before the start is in the pre-queue. At the start their order is drawn at random, so arriving early gives no advantage. After the start, people are added in order of arrival.',
      draw_commit: 'Commitment (SHA-256 of the secret seed, published before anyone joined):',
      draw_seed: 'Seed (published after the draw):', not_drawn: 'not yet drawn',
      draw_value: 'At the start the entrant list is sealed and mixed with a public random number nobody knew before: “Check my draw” verifies your place.',
      draw_list: 'Full list of draw values', check: 'Check my draw',
      check_wait: 'Checking…',
      dur_s: '{s} s', dur_ms: '{m} min {s} s', dur_hm: '{h} h {m} min',
    },
    vi: {
      eyebrow: 'Flash sale', language: 'Ngôn ngữ', loading: 'Đang tải…', sold: 'Đã bán',
      sold_pct: 'Đã bán {pct}', price: 'Giá {price}',
      phase_upcoming: 'Sắp mở bán', phase_live: 'Đang mở bán', phase_sold_out: 'Hết hàng',
      phase_ended: 'Đã kết thúc', phase_paused: 'Tạm dừng',
      starts: 'Bắt đầu lúc {time} (còn {dur})', started: 'Đã bắt đầu lúc {time}',
      no_sale: 'Không có đợt bán này', no_sale_text: 'Không có đợt bán nào ở địa chỉ này. Vui lòng kiểm tra lại liên kết từ cửa hàng.',
      signin_h: 'Đăng nhập để xếp hàng',
      signin_shop: 'Hãy mở trang này từ trang khuyến mãi của cửa hàng khi đã đăng nhập ở đó: cửa hàng sẽ đăng nhập cho bạn tại đây.',
      token_label: 'Mã tài khoản của bạn (chỉ ở chế độ phát triển)', token_btn: 'Dùng mã này',
      dev_label: 'Tên (chỉ ở chế độ phát triển)', dev_btn: 'Đăng nhập bằng tên này',
      dev_refused: 'Chế độ phát triển đang tắt: {why}', signin_refused: 'Đăng nhập bị từ chối: {why}',
      join_h: 'Vào hàng chờ', join_btn: 'Vào hàng chờ', who: 'Đã đăng nhập: {who}.',
      pow_label: 'Kiểm tra chống bot',
      pow_t: 'Trình duyệt của bạn đang thực hiện một bước kiểm tra ngắn khiến việc dùng nhiều tài khoản để xếp hàng trở nên tốn kém đối với bot. Bạn không cần làm gì, và sẽ vào hàng chờ ngay khi kiểm tra xong.',
      pow_retry: 'Cần kiểm tra lại ({why}) — đang bắt đầu lại.',
      ts_t: 'Vui lòng hoàn tất bước kiểm tra bên dưới; bạn sẽ vào hàng chờ ngay khi kiểm tra đạt.',
      bot_check_required: 'đợt bán này yêu cầu kiểm tra chống bot', bot_check_failed: 'kiểm tra không đạt',
      challenge_expired: 'mất quá nhiều thời gian', challenge_reused: 'mã kiểm tra đã được dùng',
      challenge_invalid: 'mã kiểm tra không hợp lệ', bad_nonce: 'câu trả lời không đúng định dạng',
      bot_check_unavailable: 'Hiện chưa xác minh được bước kiểm tra chống bot — sẽ thử lại trong giây lát.',
      join_refused: 'Bạn chưa vào được hàng chờ: {why}.',
      too_many_joins: 'Có quá nhiều người từ mạng của bạn vừa vào hàng chờ — sẽ thử lại sau {dur}.',
      line_label: 'Tiến độ trong hàng chờ',
      notify_why: 'Muốn chuyển sang thẻ khác trong lúc chờ? Trang này vẫn giữ chỗ cho bạn khi chạy nền và có thể thông báo khi đến lượt bạn.',
      notify_btn: 'Thông báo cho tôi khi đến lượt',
      qty: 'Số lượng', reserve: 'Đặt giữ hàng', pay: 'Thanh toán', cancel: 'Hủy đặt giữ',
      prequeue_h: 'Bạn đang ở hàng chờ trước giờ mở bán',
      prequeue_t: 'Thứ tự của bạn sẽ được bốc thăm lúc {time}. Ai vào trước giờ đó đều có cơ hội như nhau: đến sớm không được ưu tiên.',
      drawing_h: 'Đang bốc thăm thứ tự',
      drawing_t: 'Thứ tự hàng chờ đang được bốc thăm. Vị trí của bạn sẽ hiện ra trong giây lát.',
      placing_h: 'Bạn đã vào hàng chờ',
      placing_t: 'Vị trí của bạn đang được xác nhận (một hai giây).',
      waiting_h: 'Vị trí của bạn: {place}',
      waiting_t: 'Số người phía trước: {ahead}. Thời gian chờ ước tính: {range}.',
      unknown: 'chưa rõ',
      admitted_h: 'Đã đến lượt bạn', admitted_t: 'Vị trí của bạn: {place}. Bạn có thể đặt giữ hàng ngay.',
      turn_left: 'Lượt của bạn kết thúc sau {dur} (lúc {time}).', turn_over: 'Lượt của bạn đã kết thúc.',
      paused_h: 'Đợt bán đang tạm dừng',
      paused_t: 'Đợt bán tạm dừng trong giây lát. Bạn vẫn giữ nguyên vị trí; trang sẽ tự tiếp tục khi mở bán lại.',
      sold_out_h: 'Hết hàng',
      sold_out_t: 'Hiện mọi sản phẩm đã được giữ. Nếu có hàng được trả lại, hàng chờ sẽ tiếp tục — hãy để trang này mở.',
      closed_h: 'Đã đóng', closed_t: 'Đợt bán đã kết thúc, hoặc lượt đặt giữ của bạn đã qua.',
      abandoned_h: 'Lượt của bạn đã qua',
      abandoned_t: 'Trang này đã ngừng cập nhật trong 30 giây khi bạn chưa giữ hàng nào, nên lượt của bạn đã chuyển cho người kế tiếp. Bạn có thể vào hàng chờ lại, ở cuối hàng.',
      held_h: 'Đã giữ hàng — hãy hoàn tất thanh toán', held_t: 'Đang giữ {qty} sản phẩm cho bạn.',
      hold_left: 'Còn giữ trong {dur} (đến {time}).', hold_over: 'Thời gian giữ hàng đã hết.',
      paying_h: 'Đang thanh toán', paying_t: 'Đang chờ nhà cung cấp thanh toán xác nhận…',
      paid_h: 'Đã thanh toán — đơn hàng đã được xác nhận', paid_t: 'Bạn đã mua {qty} sản phẩm. Cảm ơn bạn!',
      res_expired: 'Thời gian giữ hàng đã hết và sản phẩm được mở bán lại.',
      res_cancelled: 'Đã hủy đặt giữ và sản phẩm được mở bán lại.',
      res_rejected: 'Cửa hàng không thể xác nhận đặt giữ của bạn.',
      again: 'Trong lượt của bạn, bạn có thể đặt giữ lại.',
      live_prequeue: 'Bạn đang ở hàng chờ trước giờ mở bán.', live_drawing: 'Đang bốc thăm thứ tự.',
      live_waiting: 'Bạn đang trong hàng chờ.', live_admitted: 'Đã đến lượt bạn: bạn có thể đặt giữ hàng ngay.',
      live_paused: 'Đợt bán đang tạm dừng; bạn vẫn giữ vị trí.', live_sold_out: 'Hết hàng.',
      live_closed: 'Đã đóng.', live_abandoned: 'Lượt của bạn đã qua; bạn có thể vào hàng chờ lại.', live_held: 'Đã giữ hàng: hãy hoàn tất thanh toán.',
      live_paying: 'Đang thanh toán.', live_paid: 'Đã thanh toán: đơn hàng đã được xác nhận.',
      live_no_sale: 'Không có đợt bán này.',
      title_turn: 'Đến lượt bạn — {name}', title: '{name} — flash sale',
      notif_title: 'Đã đến lượt bạn', notif_body: 'Bạn có thể đặt giữ {name} ngay.',
      trouble: 'Lỗi kết nối — thử lại sau {dur}. Bạn vẫn giữ vị trí.',
      busy: 'Cửa hàng đang bận — đang thử lại…', network: 'Lỗi mạng — vui lòng thử lại.',
      dev_pay: 'Đang thanh toán qua nhà cung cấp thử nghiệm…',
      error_n: 'Lỗi {status}',
      draw_h: 'Cách bốc thăm công bằng',
      draw_p1: 'Ai vào trước giờ mở bán đều ở hàng chờ trước. Lúc mở bán, thứ tự của họ được bốc thăm ngẫu nhiên, nên đến sớm không được ưu tiên. Sau giờ mở bán, người đến sau xếp theo thứ tự đến.',
      draw_commit: 'Cam kết (SHA-256 của hạt giống bí mật, công bố trước khi có người tham gia):',
      draw_seed: 'Hạt giống (công bố sau khi bốc thăm):', not_drawn: 'chưa bốc thăm',
      draw_value: 'Lúc mở bán, danh sách được niêm phong rồi trộn với một số ngẫu nhiên công khai chưa ai biết: “Kiểm tra lượt bốc thăm của tôi” xác minh vị trí của bạn.',
      draw_list: 'Danh sách đầy đủ các giá trị', check: 'Kiểm tra lượt bốc thăm của tôi',
      check_wait: 'Đang kiểm tra…',
      dur_s: '{s} giây', dur_ms: '{m} phút {s} giây', dur_hm: '{h} giờ {m} phút',
    },
  };
  const LANG_KEY = 'flashsale:lang';
  const pickLang = () => {
    const saved = localStorage.getItem(LANG_KEY);
    if (saved && MSG[saved]) return saved;
    for (const l of navigator.languages || [navigator.language]) {
      const p = String(l).toLowerCase().split('-')[0];
      if (MSG[p]) return p;
    }
    return 'en';
  };
  let lang = pickLang();
  // Formats follow the person's own locale when it is in the chosen language
  // (en-GB stays en-GB), else the language itself.
  const locale = () => (navigator.languages || []).find((l) => l.toLowerCase().split('-')[0] === lang) || lang;
  const t = (key, vars = {}) => (MSG[lang][key] ?? MSG.en[key] ?? key)
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
  const errorText = (r) => (r.data && r.data.error && r.data.error.message) || t('error_n', { status: r.status });

  const powSrc = (document.currentScript && document.currentScript.dataset.pow) || '';
  // Timers: one per job, run by the worker (not throttled while hidden);
  // the page's own setTimeout only if no worker could start.
  const jobs = {};
  let timerSeq = 0;
  let worker = null;
  try {
    const src = document.currentScript && document.currentScript.dataset.timer;
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
    say('note', r && r.data && r.data.error ? errorText(r) : '');
    render();
  }

  async function loadSummary() {
    if (noSale) return;
    try {
      const r = await api('GET', `/api/sales/${encodeURIComponent(sale)}`);
      if (r.status === 200) {
        summary = r.data;
        render();
      } else if (r.status === 404) {
        unknownSale(r);
        return;
      }
    } catch { /* next round */ }
    later('summary', jitter(5000), loadSummary);
  }

  async function poll() {
    if (!st.ticket || st.res || noSale) return;
    lastPoll = Date.now();
    try {
      const r = await api('GET', `/api/sales/${encodeURIComponent(sale)}/queue`, { token: st.ticket });
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
    if (s.ticket) st.ticket = s.ticket;
    if (s.admission_token) {
      st.admit = s.admission_token;
      st.admitExp = s.admission_expires_at;
      // The window's end, fixed by the edge: re-polls do not move it.
      st.windowEnd = s.window_ends_at_ms || s.admission_expires_at * 1000;
    }
    save();
    render();
    const admitted = s.status === 'admitted' && !st.res;
    if (admitted && !wasAdmitted) turnCame();
    wasAdmitted = admitted;
  }

  // The turn came: say so where the person may be (title, notification),
  // and put the keyboard on Reserve.
  function turnCame() {
    const name = (summary && summary.name) || sale;
    document.title = t('title_turn', { name });
    try {
      if (window.Notification && Notification.permission === 'granted') {
        new Notification(t('notif_title'), { body: t('notif_body', { name }), tag: `flashsale-${sale}` });
      }
    } catch { /* some browsers only notify from a service worker */ }
    $('reserve-btn').focus();
  }

  // The proof of work of a join (sale with bot_check pow:<bits>): a fresh
  // challenge, solved in the pow.js worker while the bar shows the share of
  // the expected work done. Answers the join body, or null (error said).
  async function solveChallenge() {
    const c = await api('GET', `/api/sales/${encodeURIComponent(sale)}/challenge`, { token: user });
    if (c.status !== 200) return { refused: c };
    if (c.data.kind !== 'pow') return { body: undefined };
    const expected = 2 ** c.data.difficulty;
    show('pow', true);
    $('pow-bar').value = 0;
    try {
      const nonce = await new Promise((resolve, reject) => {
        const w = new Worker(powSrc);
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

  // A Turnstile sale: Cloudflare's widget (its script is loaded only for
  // such sales, whose page CSP allows challenges.cloudflare.com) gives a
  // token the edge verifies. Answers the join body, or { refused }.
  const TS_SCRIPT = 'https://challenges.cloudflare.com/turnstile/v0/api.js?render=explicit';
  let tsLoaded = null;
  let tsWidget = null;
  async function turnstileToken() {
    const c = await api('GET', `/api/sales/${encodeURIComponent(sale)}/challenge`, { token: user });
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

  // Refusals a fresh challenge can pass (a bad nonce or an unrecognised
  // challenge too: the page solves a new one).
  const RETRY_BOT = ['challenge_expired', 'challenge_reused', 'bot_check_failed', 'bot_check_required',
    'challenge_invalid', 'bad_nonce'];
  let botRetries = 0;
  async function join() {
    $('join-btn').disabled = true;
    say('error', '');
    try {
      let body;
      const check = (summary && summary.bot_check) || '';
      // A re-join by someone who holds a ticket (e.g. after their turn was
      // given back) sends it: the edge answers from it, no check needed.
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
      const r = await api('POST', `/api/sales/${encodeURIComponent(sale)}/queue`, { token: user, body, held });
      if (r.status === 200) { botRetries = 0; applyStatus(r.data); later('poll', jitter(r.data.poll_after_ms), poll); }
      else joinRefused(r);
    } catch { backoff('poll', join); }
    $('join-btn').disabled = false;
  }

  function joinRefused(r) {
    const code = r.data && r.data.error && r.data.error.code;
    if (r.status === 401) {
      user = null; sessionStorage.removeItem(USER_KEY);
      say('error', t('signin_refused', { why: errorText(r) })); render();
    } else if (r.status === 404) unknownSale(r);
    else if ((r.status === 403 || r.status === 400) && RETRY_BOT.includes(code) && botRetries < 3) {
      // A new challenge can pass where this one did not (e.g. it expired
      // while the tab slept): say so and start over, a few times at most.
      botRetries += 1;
      // A ticket the edge did not answer from (expired) is no use: solve.
      if (st.ticket) { st.ticket = null; save(); }
      say('note', t('pow_retry', { why: t(code) }));
      later('poll', 500, join);
    } else if (r.status === 403 || r.status === 400) {
      // In the person's words when the catalogue has them.
      say('error', MSG.en[code] ? t('join_refused', { why: t(code) }) : errorText(r));
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
    // One key per attempt; kept until the attempt resolves, so a retry
    // of the same attempt replays instead of reserving twice.
    st.resIdem = st.resIdem || uuid();
    st.ended = null;
    save();
    try {
      const r = await api('POST', `/api/sales/${encodeURIComponent(sale)}/reservations`,
        { token: st.admit, body: { qty: Number($('qty').value) }, idem: st.resIdem });
      if (r.status === 202 || r.status === 200) {
        st.res = { id: r.data.reservation_id, expires_at: r.data.expires_at, status: r.data.status, qty: r.data.qty };
        save();
        say('note', '');
        document.title = t('title', { name: (summary && summary.name) || sale });
        render();
        later('res', 2000, pollReservation);
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
        say('error', errorText(r));
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

  // Expired, cancelled or rejected: say so, forget the attempt (the next one
  // gets a new Idempotency-Key) and ask the queue where the person stands.
  function reservationEnded(how) {
    st.res = null;
    st.resIdem = null;
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
    // Speak changes of state only: the live region keeps its text while
    // the numbers beside it move.
    if (kind !== spoken) { spoken = kind; say('live', t(`live_${kind}`)); }
  }

  // The phase as a shopper sees it now: the summary is up to 5 s old and
  // says "upcoming" until it is refreshed after the start.
  function phase(s) {
    if (s.paused || (status && status.status === 'paused')) return 'paused';
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
      for (const id of ['signin', 'join', 'state', 'draw', 'sold', 'start', 'price', 'phase']) show(id, false);
      if (spoken !== 'no_sale') { spoken = 'no_sale'; say('note', t('live_no_sale')); }
      return;
    }
    const s = summary;
    if (s) {
      document.title = t(status && status.status === 'admitted' && !st.res ? 'title_turn' : 'title', { name: s.name });
      say('name', s.name);
      const cur = s.currency || CURRENCY;
      say('price', s.price_cents != null ? t('price', { price: money(s.price_cents, cur) }) : '');
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
      const limit = Math.max(1, Number(s.per_user_limit) || 1);
      if ($('qty').options.length !== limit) {
        $('qty').replaceChildren(...Array.from({ length: limit }, (_, i) => new Option(num(i + 1), String(i + 1))));
      }
    }
    const signedIn = Boolean(user);
    show('signin', !signedIn);
    show('token-form', !signedIn && devMode);
    show('dev-form', !signedIn && devMode);
    say('who', st.sub ? t('who', { who: st.sub }) : '');
    // A turn lost for not checking in may join again, at the back.
    const again = status && status.status === 'closed' && status.reason === 'abandoned';
    show('join', signedIn && (!st.ticket || again));
    show('state', Boolean(st.ticket) || Boolean(st.res));
    show('line', false);
    show('admit', false);
    show('held', false);
    show('notify', false);
    if (st.res) renderReservation();
    else if (status) renderStatus(s);
    // What became of the last attempt stays said (in the current language)
    // until the next attempt.
    if (st.ended && !st.res) say('note', `${t(`res_${st.ended}`)} ${t('again')}`);
    countdowns();
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
    if (status && status.status === 'admitted' && !st.res) {
      const end = st.windowEnd || 0;
      const left = end / 1000 - nowS();
      say('admit-left', left > 0 ? t('turn_left', { dur: dur(left), time: clock(end) }) : t('turn_over'));
      $('reserve-btn').disabled = left <= 0;
      // The window just closed: learn the new state now, not at the next poll.
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
    // The sale's announced end passed: ask now, not at the next (maybe 30 s
    // away) poll.
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

  // "Check my draw": the verifier (check.js) is loaded only when asked for,
  // so the page everyone loads stays light.
  const checkSrc = (document.currentScript && document.currentScript.dataset.check) || '';
  let checker = null;
  const loadChecker = () => checker || (checker = new Promise((resolve, reject) => {
    const el = document.createElement('script');
    el.src = checkSrc;
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
    lang = MSG[$('lang').value] ? $('lang').value : 'en';
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
      // DEV_MODE set but refused (the origin is not local): say why, so
      // nobody wonders where the name sign-in went.
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
