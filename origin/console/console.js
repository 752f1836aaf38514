// The operator console (issue 47): one page over the origin's admin API
// (origin/src/admin/routes.rs), served at /admin/ under a strict CSP.
// Invariants:
// - the admin key lives in this tab's sessionStorage only and is sent as
//   `Authorization: Bearer <key>` on every call; a 401 forgets it;
// - every text from the API (names, messages, keys, errors) goes in with
//   textContent, never as markup;
// - the live figures come from the Server-Sent Events stream, read with
//   fetch() (EventSource cannot send the header), reconnected with
//   exponential back-off; the charts keep the last 5 minutes;
// - every write is confirmed in a <dialog> that names the action and the
//   sale, and its answer (or error) is shown; the audit log is reloaded;
// - every text comes from the catalogue MSG (en, vi).
'use strict';
(() => {
  const $ = (id) => document.getElementById(id);

  // Every text: [English, Vietnamese].
  const MSG = {
    brand: ['Flash sale', 'Flash sale'],
    title: ['Operator console', 'Bảng điều khiển vận hành'],
    doc_title: ['{name} — operator console', '{name} — bảng điều khiển vận hành'],
    language: ['Language', 'Ngôn ngữ'],
    login_h: ['Sign in', 'Đăng nhập'],
    login_t: ['Enter an admin key (one of ADMIN_KEYS). It is kept in this browser tab only and forgotten when the tab closes.', 'Nhập một khóa quản trị (trong ADMIN_KEYS). Khóa chỉ được giữ trong thẻ trình duyệt này và bị xóa khi đóng thẻ.'],
    key_label: ['Admin key', 'Khóa quản trị'],
    login_btn: ['Sign in', 'Đăng nhập'],
    logout_btn: ['Sign out', 'Đăng xuất'],
    key_rejected: ['Key not accepted — check it and sign in again.', 'Khóa không được chấp nhận — hãy kiểm tra lại và đăng nhập lại.'],
    read_only: ['Refused: this key may only read.', 'Bị từ chối: khóa này chỉ được phép đọc.'],
    rate_limited: ['Too many requests from this address — retry in {s} s.', 'Quá nhiều yêu cầu từ địa chỉ này — thử lại sau {s} giây.'],
    network: ['Network error — the origin did not answer.', 'Lỗi mạng — máy chủ gốc không phản hồi.'],
    error_n: ['Error {status}', 'Lỗi {status}'],
    refused: ['Refused ({code}): {message}', 'Bị từ chối ({code}): {message}'],
    sale_label: ['Sale', 'Đợt bán'],
    sale_pick: ['Choose a sale…', 'Chọn đợt bán…'],
    no_sales: ['No sales yet', 'Chưa có đợt bán nào'],
    sale_option: ['{name} ({id})', '{name} ({id})'],
    reload: ['Reload list', 'Tải lại danh sách'],
    no_sale: ['There is no sale “{id}”.', 'Không có đợt bán “{id}”.'],
    times: ['Starts {start} · {end} · {units} units', 'Bắt đầu {start} · {end} · {units} sản phẩm'],
    ends: ['ends {time}', 'kết thúc {time}'],
    no_end: ['no end set', 'chưa đặt giờ kết thúc'],
    conn_connecting: ['Connecting to the live figures…', 'Đang kết nối số liệu trực tiếp…'],
    conn_live: ['Live', 'Trực tiếp'],
    conn_retry: ['Connection lost — reconnecting in {s} s', 'Mất kết nối — kết nối lại sau {s} giây'],
    conn_stopped: ['Live figures stopped.', 'Đã dừng số liệu trực tiếp.'],
    updated: ['updated {time}', 'cập nhật lúc {time}'],
    phase_upcoming: ['Upcoming', 'Sắp mở bán'],
    phase_live: ['Live', 'Đang mở bán'],
    phase_sold_out: ['Sold out', 'Hết hàng'],
    phase_ended: ['Ended', 'Đã kết thúc'],
    phase_unknown: ['Phase unknown', 'Chưa rõ giai đoạn'],
    paused_badge: ['Paused', 'Tạm dừng'],
    now_h: ['Now', 'Hiện tại'],
    f_waiting: ['People waiting', 'Người đang chờ'],
    f_placed: ['Placed in line', 'Đã có vị trí'],
    f_admitted: ['Admitted so far', 'Đã cho vào'],
    f_admitted_s: ['Admitted per second', 'Cho vào mỗi giây'],
    f_rate: ["Controller's rate", 'Tốc độ của bộ điều khiển'],
    f_ceiling: ['Admission ceiling (set)', 'Trần tốc độ (đã đặt)'],
    f_holds_s: ['Holds per second', 'Lượt giữ hàng mỗi giây'],
    f_units: ['Units left / total', 'Còn lại / tổng số'],
    f_held: ['Units held', 'Đang được giữ'],
    f_sold: ['Units sold', 'Đã bán'],
    f_settle: ['Settlement lag', 'Độ trễ đối soát'],
    f_outbox: ['Outbox lag (pending)', 'Độ trễ outbox (đang chờ)'],
    f_passed: ['Turns passed on (of them revoked)', 'Lượt được chuyển tiếp (trong đó bị thu hồi)'],
    f_bot: ['Failed bot checks: refused / shadow queue', 'Không qua kiểm tra bot: bị từ chối / hàng chờ ảo'],
    f_reason: ["The controller's reason:", 'Lý do của bộ điều khiển:'],
    f_message: ['Message on the waiting pages:', 'Thông báo trên trang chờ:'],
    frozen: ['frozen', 'đứng yên'],
    none: ['none', 'không có'],
    per_s: ['{n}/s', '{n}/giây'],
    people_s: ['{n} people/s', '{n} người/giây'],
    secs: ['{n} s', '{n} giây'],
    outbox_v: ['{lag} ({n})', '{lag} ({n})'],
    notes_h: ['Why some figures are missing', 'Vì sao thiếu một số số liệu'],
    note_queue: ['Queue figures: {why}', 'Số liệu hàng chờ: {why}'],
    charts_h: ['Last 5 minutes', '5 phút gần nhất'],
    c_waiting: ['People waiting', 'Người đang chờ'],
    c_admission: ['Admission (people per second)', 'Cho vào (người mỗi giây)'],
    c_holds: ['Holds per second', 'Lượt giữ hàng mỗi giây'],
    c_lags: ['Lags (seconds)', 'Độ trễ (giây)'],
    s_time: ['time', 'thời gian'],
    s_waiting: ['waiting', 'đang chờ'],
    s_admitted: ['admitted/s', 'cho vào/giây'],
    s_rate: ["controller's rate", 'tốc độ bộ điều khiển'],
    s_holds: ['holds/s', 'lượt giữ/giây'],
    s_settle: ['settlement', 'đối soát'],
    s_outbox: ['outbox', 'outbox'],
    skus_h: ['Sold per SKU', 'Đã bán theo SKU'],
    sku_id: ['SKU', 'Mã SKU'],
    sku_name: ['Name', 'Tên'],
    sku_sold: ['Sold', 'Đã bán'],
    sku_left: ['Left', 'Còn lại'],
    sku_total: ['Total', 'Tổng'],
    sku_share: ['Sold share', 'Tỉ lệ đã bán'],
    sku_out: ['sold out', 'hết hàng'],
    errors_h: ['Error answers of this origin (public API)', 'Lỗi máy chủ gốc này đã trả về (API công khai)'],
    errors_none: ['None so far.', 'Chưa có.'],
    err_code: ['Code', 'Mã'],
    err_total: ['Total', 'Tổng'],
    err_per_s: ['Per second', 'Mỗi giây'],
    controls_h: ['Controls', 'Điều khiển'],
    admission_h: ['Admission', 'Cho vào'],
    pause: ['Pause', 'Tạm dừng'],
    resume: ['Resume', 'Tiếp tục'],
    rate_h: ['Admission rate', 'Tốc độ cho vào'],
    rate_label: ['People per second (the ceiling)', 'Số người mỗi giây (mức trần)'],
    rate_btn: ['Set admission rate', 'Đặt tốc độ cho vào'],
    rate_invalid: ['Enter a rate above 0 and at most 100,000.', 'Nhập tốc độ lớn hơn 0 và không quá 100.000.'],
    message_h: ['Message to waiting people', 'Thông báo cho người đang chờ'],
    message_label: ['Message (plain text)', 'Thông báo (văn bản thuần)'],
    message_count: ['{n} / 280 characters.', '{n} / 280 ký tự.'],
    message_hint: ['Empty: takes the message down.', 'Để trống: gỡ thông báo.'],
    message_btn: ['Post message', 'Đăng thông báo'],
    message_long: ['At most 280 characters.', 'Tối đa 280 ký tự.'],
    revoke_h: ["Revoke a person's admission", 'Thu hồi lượt vào của một người'],
    revoke_label: ['Account', 'Tài khoản'],
    revoke_btn: ['Revoke admission', 'Thu hồi lượt vào'],
    account_required: ['Enter an account.', 'Nhập tài khoản.'],
    end_h: ['End the sale', 'Kết thúc đợt bán'],
    end_t: ['New reservations are refused at once; holds already granted stay payable until they expire.', 'Các lượt đặt giữ mới bị từ chối ngay; lượt giữ đã cấp vẫn thanh toán được đến khi hết hạn.'],
    end_btn: ['End sale now', 'Kết thúc đợt bán ngay'],
    confirm_h: ['Please confirm', 'Vui lòng xác nhận'],
    confirm: ['Confirm', 'Xác nhận'],
    cancel: ['Cancel', 'Hủy'],
    cf_pause: ['Pause sale “{name}” ({id})? Nobody new is admitted; everyone keeps their place.', 'Tạm dừng đợt bán “{name}” ({id})? Không ai được cho vào thêm; mọi người vẫn giữ vị trí.'],
    cf_resume: ['Resume sale “{name}” ({id})? Admission goes on.', 'Tiếp tục đợt bán “{name}” ({id})? Việc cho vào sẽ tiếp tục.'],
    cf_rate: ['Set the admission rate of sale “{name}” ({id}) to {rate} people per second?', 'Đặt tốc độ cho vào của đợt bán “{name}” ({id}) thành {rate} người mỗi giây?'],
    cf_end: ['End sale “{name}” ({id}) now? New reservations are refused at once. This cannot be undone from the console.', 'Kết thúc đợt bán “{name}” ({id}) ngay? Các lượt đặt giữ mới bị từ chối ngay lập tức. Không thể hoàn tác từ bảng điều khiển.'],
    cf_message: ['Post this message to everyone waiting in sale “{name}” ({id})?', 'Đăng thông báo này cho mọi người đang chờ trong đợt bán “{name}” ({id})?'],
    cf_unmessage: ['Take down the message of sale “{name}” ({id})?', 'Gỡ thông báo của đợt bán “{name}” ({id})?'],
    cf_revoke: ['Revoke the admission of account “{account}” in sale “{name}” ({id})?', 'Thu hồi lượt vào của tài khoản “{account}” trong đợt bán “{name}” ({id})?'],
    act_pause: ['Pause', 'Tạm dừng'],
    act_resume: ['Resume', 'Tiếp tục'],
    act_rate: ['Admission rate', 'Tốc độ cho vào'],
    act_end: ['End', 'Kết thúc'],
    act_message: ['Message', 'Thông báo'],
    act_revoke: ['Revoke', 'Thu hồi'],
    sending: ['{action}: sending…', '{action}: đang gửi…'],
    done: ['{action}: done for “{name}”. The API answered:', '{action}: đã thực hiện cho “{name}”. API trả lời:'],
    failed: ['{action}: {why}', '{action}: {why}'],
    audit_h: ['Audit log', 'Nhật ký thao tác'],
    audit_refresh: ['Refresh', 'Làm mới'],
    audit_more: ['More', 'Xem thêm'],
    audit_empty: ['No entries yet.', 'Chưa có mục nào.'],
    a_at: ['At', 'Thời điểm'],
    a_key: ['Key id', 'Mã khóa'],
    a_action: ['Action', 'Thao tác'],
    a_refused: ['Refused (error code)', 'Bị từ chối (mã lỗi)'],
    a_request: ['Request', 'Yêu cầu'],
  };
  const LANGS = ['en', 'vi'];
  const LANG_KEY = 'flashsale:console-lang';
  const KEY_KEY = 'flashsale:admin-key';
  const WINDOW_S = 300;
  const DASH = '—';

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
  const t = (key, vars = {}) => ((MSG[key] || [])[LANGS.indexOf(lang)] ?? (MSG[key] || [key])[0])
    .replace(/\{(\w+)\}/g, (_, k) => String(vars[k] ?? ''));
  const locale = () => (navigator.languages || []).find((l) => l.toLowerCase().split('-')[0] === lang) || lang;
  const num = (n, digits = 0) => (n == null || !Number.isFinite(Number(n)) ? DASH
    : new Intl.NumberFormat(locale(), { maximumFractionDigits: digits }).format(n));
  const clock = (ms) => new Date(ms).toLocaleTimeString(locale(), { hour: '2-digit', minute: '2-digit', second: '2-digit' });
  const when = (iso) => {
    const ms = Date.parse(iso);
    return Number.isFinite(ms) ? new Date(ms).toLocaleString(locale(), { dateStyle: 'short', timeStyle: 'medium' }) : DASH;
  };
  const say = (el, text) => {
    if (typeof el === 'string') el = $(el);
    if (el.textContent !== text) el.textContent = text;
  };
  const show = (id, on) => { $(id).hidden = !on; };
  const el = (tag, text, cls) => {
    const e = document.createElement(tag);
    if (text != null) e.textContent = text;
    if (cls) e.className = cls;
    return e;
  };
  const sleep = (ms, signal) => new Promise((resolve) => {
    const done = () => { clearTimeout(timer); signal?.removeEventListener('abort', done); resolve(); };
    const timer = setTimeout(done, ms);
    signal?.addEventListener('abort', done, { once: true });
  });

  // ------------------------------------------------------------ the key
  let key = sessionStorage.getItem(KEY_KEY);
  const auth = () => ({ authorization: `Bearer ${key}` });

  /** One admin API call: { status, data, retryAfter } (status 0: no answer). */
  async function api(method, path, body) {
    const headers = auth();
    if (body !== undefined) headers['content-type'] = 'application/json';
    let r;
    try {
      r = await fetch(`/admin/api/${path}`, {
        method, headers, cache: 'no-store', body: body === undefined ? undefined : JSON.stringify(body),
      });
    } catch {
      return { status: 0, data: null, retryAfter: 0 };
    }
    let data = null;
    try { data = await r.json(); } catch { data = null; }
    return { status: r.status, data, retryAfter: Number(r.headers.get('retry-after')) || 0 };
  }

  /** Why a call failed, in the operator's language (API text as sent). */
  function why(r) {
    if (r.status === 0) return t('network');
    if (r.status === 401) return t('key_rejected');
    if (r.status === 403) return t('read_only');
    if (r.status === 429) return t('rate_limited', { s: r.retryAfter || 1 });
    const e = r.data?.error;
    if (e && typeof e === 'object') return t('refused', { code: String(e.code ?? ''), message: String(e.message ?? '') });
    return t('error_n', { status: r.status });
  }

  /** Back to the sign-in form; `keep`: the tab's stored key stays (the
   *  origin did not answer: a reload tries it again). */
  function signOut(reason, keep = false) {
    key = null;
    if (!keep) sessionStorage.removeItem(KEY_KEY);
    closeView();
    sales = [];
    show('app', false);
    show('logout', false);
    show('login', true);
    say('login-error', reason || '');
    $('key').focus();
  }

  async function signIn(candidate) {
    key = candidate;
    const r = await api('GET', 'sales');
    if (r.status !== 200) {
      // Only a refusal of the key forgets it.
      signOut(why(r), r.status !== 401 && sessionStorage.getItem(KEY_KEY) === candidate);
      return;
    }
    sessionStorage.setItem(KEY_KEY, key);
    say('login-error', '');
    $('key').value = '';
    show('login', false);
    show('app', true);
    show('logout', true);
    listSales(r.data?.sales || []);
    route();
  }

  // ------------------------------------------------------------ sales
  let sales = [];
  let current = null; // { id, name, entry, ctrl }

  function listSales(list) {
    sales = Array.isArray(list) ? list : [];
    const sel = $('sale-pick');
    const opts = [new Option(t(sales.length ? 'sale_pick' : 'no_sales'), '')];
    for (const s of sales) opts.push(new Option(t('sale_option', { name: String(s.name ?? s.sale), id: String(s.sale) }), String(s.sale)));
    sel.replaceChildren(...opts);
    sel.value = current?.id && sales.some((s) => s.sale === current.id) ? current.id : '';
  }

  async function reloadSales() {
    const r = await api('GET', 'sales');
    if (r.status === 401) return signOut(t('key_rejected'));
    if (r.status !== 200) return say('app-error', why(r));
    say('app-error', '');
    listSales(r.data?.sales || []);
  }

  const hashSale = () => new URLSearchParams(location.hash.slice(1)).get('sale');

  function route() {
    if (!key) return;
    const id = hashSale();
    if (!id) { closeView(); $('sale-pick').value = ''; return; }
    if (current?.id === id) return;
    openView(id);
  }

  // ------------------------------------------------------------ one sale
  function closeView() {
    if (current) current.ctrl.abort();
    current = null;
    destroyCharts();
    hist = [];
    show('view', false);
    document.title = t('title');
  }

  function openView(id) {
    closeView();
    const entry = sales.find((s) => s.sale === id) || null;
    current = { id, name: String(entry?.name ?? id), entry, ctrl: new AbortController(), frame: null };
    $('sale-pick').value = entry ? id : '';
    show('view', true);
    say('app-error', '');
    resetFigures();
    renderHeader();
    makeCharts();
    result('', null, null);
    stream(current);
    loadAudit(true);
  }

  function renderHeader() {
    if (!current) return;
    document.title = t('doc_title', { name: current.name });
    say('sale-name', current.name);
    say('sale-id', current.id);
    const e = current.entry;
    say('sale-times', e ? t('times', {
      start: when(e.starts_at), end: e.ends_at ? t('ends', { time: when(e.ends_at) }) : t('no_end'), units: num(e.units_total),
    }) : '');
  }

  // ------------------------------------------------------------ live stream
  let conn = { state: 'connecting', s: 0 };
  function setConn(state, s = 0) {
    conn = { state, s };
    say('conn', state === 'retry' ? t('conn_retry', { s }) : t(`conn_${state}`));
    $('conn').className = `conn-${state}`;
  }

  /**
   * Reads `GET …/live/stream` until the view closes: `event: frame` /
   * `data: {json}` blocks; reconnects after 1, 2, 4… 30 s when it drops
   * (or a 429's Retry-After), and when nothing at all (not even the
   * keep-alive comment, every 15 s) came for 40 s.
   */
  async function stream(view) {
    const { signal } = view.ctrl;
    const url = `/admin/api/sales/${encodeURIComponent(view.id)}/live/stream`;
    let delay = 1000;
    while (!signal.aborted) {
      setConn('connecting');
      const link = new AbortController();
      const stop = () => link.abort();
      signal.addEventListener('abort', stop, { once: true });
      let watchdog = setTimeout(stop, 40_000);
      const alive = () => { clearTimeout(watchdog); watchdog = setTimeout(stop, 40_000); };
      let wait = 0;
      try {
        const r = await fetch(url, { headers: { ...auth(), accept: 'text/event-stream' }, cache: 'no-store', signal: link.signal });
        if (r.status === 401) { clearTimeout(watchdog); signOut(t('key_rejected')); return; }
        if (r.status === 404) {
          clearTimeout(watchdog);
          say('app-error', t('no_sale', { id: view.id }));
          setConn('stopped');
          return;
        }
        if (r.status === 429) wait = (Number(r.headers.get('retry-after')) || 1) * 1000;
        if (r.ok && r.body) {
          const reader = r.body.getReader();
          const dec = new TextDecoder();
          let buf = '';
          let event = '';
          let data = [];
          for (;;) {
            const { value, done } = await reader.read();
            if (done) break;
            alive();
            buf += dec.decode(value, { stream: true });
            let nl;
            while ((nl = buf.search(/\r\n|\r|\n/)) >= 0) {
              // A lone \r at the end may be the first half of \r\n.
              if (buf[nl] === '\r' && nl === buf.length - 1) break;
              const line = buf.slice(0, nl);
              buf = buf.slice(nl + (buf.startsWith('\r\n', nl) ? 2 : 1));
              if (line === '') {
                if ((event || 'message') === 'frame' && data.length) {
                  try {
                    onFrame(view, JSON.parse(data.join('\n')));
                    if (conn.state !== 'live') setConn('live');
                    delay = 1000;
                  } catch { /* a malformed frame: the next one */ }
                }
                event = '';
                data = [];
                continue;
              }
              if (line.startsWith(':')) continue;
              const colon = line.indexOf(':');
              const field = colon < 0 ? line : line.slice(0, colon);
              let v = colon < 0 ? '' : line.slice(colon + 1);
              if (v.startsWith(' ')) v = v.slice(1);
              if (field === 'event') event = v;
              else if (field === 'data') data.push(v);
            }
          }
        }
      } catch { /* dropped, aborted or no answer: retried below */ }
      clearTimeout(watchdog);
      signal.removeEventListener('abort', stop);
      if (signal.aborted) return;
      const ms = Math.max(wait, delay);
      // The countdown, a second at a time.
      for (let left = Math.ceil(ms / 1000); left > 0 && !signal.aborted; left--) {
        setConn('retry', left);
        await sleep(1000, signal);
      }
      delay = Math.min(delay * 2, 30_000);
    }
  }

  // ------------------------------------------------------------ figures
  let hist = []; // { t (s), waiting, admitted_s, rate, holds, settle, outbox }

  function resetFigures() {
    for (const d of document.querySelectorAll('.figures dd')) say(d, DASH);
    say('f-reason', DASH);
    say('f-message', t('none'));
    say('updated', '');
    show('paused', false);
    say('phase', '');
    $('phase').hidden = true;
    show('notes', false);
    $('sku-rows').replaceChildren();
    $('error-rows').replaceChildren();
    show('errors-table', false);
    show('errors-none', true);
    $('charts').dataset.points = '0';
  }

  function onFrame(view, f) {
    if (view !== current || !f || typeof f !== 'object') return;
    view.frame = f;
    const at = Date.parse(f.at);
    const ts = Number.isFinite(at) ? at / 1000 : Date.now() / 1000;
    const q = f.queue || null;
    const point = {
      t: ts,
      waiting: q ? q.waiting : null,
      admitted_s: q?.admitted_per_s ?? null,
      rate: q ? q.rate : null,
      holds: f.holds_per_s ?? null,
      settle: f.settlement_lag_s ?? null,
      outbox: f.outbox ? f.outbox.lag_s : null,
    };
    if (hist.length && hist[hist.length - 1].t >= ts) hist[hist.length - 1] = point;
    else hist.push(point);
    while (hist.length && hist[0].t < ts - WINDOW_S) hist.shift();
    renderFrame();
    updateCharts();
  }

  function renderFrame() {
    const f = current?.frame;
    if (!f) return;
    const q = f.queue || null;
    const rate = (n) => (n == null ? DASH : t('people_s', { n: num(n, 2) }));
    const secs = (n) => (n == null ? DASH : t('secs', { n: num(n, 1) }));
    say('f-waiting', q ? num(q.waiting) : DASH);
    say('f-placed', q ? num(q.placed) : DASH);
    say('f-admitted', q ? num(q.admitted) : DASH);
    say('f-admitted-s', rate(q?.admitted_per_s ?? null));
    say('f-rate', q ? rate(q.rate) + (q.frozen ? ` (${t('frozen')})` : '') : DASH);
    say('f-ceiling', rate(f.admission_rate));
    say('f-holds-s', f.holds_per_s == null ? DASH : t('per_s', { n: num(f.holds_per_s, 2) }));
    say('f-units', `${num(f.units_left)} / ${num(f.units_total)}`);
    say('f-held', num(f.units_held));
    say('f-sold', num(f.units_sold));
    say('f-settle', secs(f.settlement_lag_s));
    say('f-outbox', f.outbox ? t('outbox_v', { lag: secs(f.outbox.lag_s), n: num(f.outbox.pending) }) : DASH);
    say('f-passed', q ? `${num(q.turns_passed_on)} (${num(q.revoked)})` : DASH);
    say('f-bot', q ? `${num(q.bot_refused)} / ${num(q.shadowed)}` : DASH);
    say('f-reason', q && q.reason ? String(q.reason) : DASH);
    say('f-message', typeof f.message === 'string' && f.message !== '' ? f.message : t('none'));
    say('updated', t('updated', { time: clock(Date.parse(f.at) || Date.now()) }));
    const phase = ['upcoming', 'live', 'sold_out', 'ended'].includes(f.phase) ? f.phase : 'unknown';
    say('phase', t(`phase_${phase}`));
    $('phase').className = `badge phase-${phase}`;
    $('phase').hidden = false;
    show('paused', f.paused === true);
    // Why a figure is null: the frame says.
    const notes = [];
    if (f.queue_error != null) notes.push(t('note_queue', { why: String(f.queue_error) }));
    for (const n of Array.isArray(f.notes) ? f.notes : []) notes.push(String(n));
    const list = $('notes-list');
    if (`${notes}` !== [...list.children].map((li) => li.textContent).join(',')) {
      list.replaceChildren(...notes.map((n) => el('li', n)));
    }
    show('notes', notes.length > 0);
    renderSkus(Array.isArray(f.skus) ? f.skus : []);
    renderErrors(Array.isArray(f.errors) ? f.errors : []);
  }

  function renderSkus(skus) {
    const rows = $('sku-rows');
    if (rows.rows.length !== skus.length) {
      rows.replaceChildren(...skus.map(() => {
        const tr = document.createElement('tr');
        const th = el('th');
        th.scope = 'row';
        const bar = document.createElement('progress');
        bar.max = 1;
        const share = el('td');
        share.append(bar, el('span'));
        tr.append(th, el('td'), el('td', null, 'num'), el('td', null, 'num'), el('td', null, 'num'), share);
        return tr;
      }));
    }
    skus.forEach((k, i) => {
      const c = rows.rows[i].cells;
      say(c[0], String(k.id ?? ''));
      say(c[1], String(k.name ?? ''));
      say(c[2], num(k.units_sold));
      say(c[3], num(k.units_left));
      say(c[4], num(k.units_total));
      const share = k.units_total > 0 ? k.units_sold / k.units_total : 0;
      const bar = c[5].firstChild;
      bar.value = share;
      bar.setAttribute('aria-label', `${k.id}: ${num(share * 100, 1)} %`);
      say(c[5].lastChild, ` ${num(share * 100, 1)} %${k.sold_out ? ` · ${t('sku_out')}` : ''}`);
    });
  }

  function renderErrors(errors) {
    const seen = errors.filter((e) => e.total > 0);
    show('errors-table', seen.length > 0);
    show('errors-none', seen.length === 0);
    const rows = $('error-rows');
    if (rows.rows.length !== seen.length) {
      rows.replaceChildren(...seen.map(() => {
        const tr = document.createElement('tr');
        tr.append(el('td'), el('td', null, 'num'), el('td', null, 'num'));
        return tr;
      }));
    }
    seen.forEach((e, i) => {
      const c = rows.rows[i].cells;
      say(c[0], String(e.code));
      say(c[1], num(e.total));
      say(c[2], e.per_s == null ? DASH : num(e.per_s, 2));
    });
  }

  // ------------------------------------------------------------ charts
  const CHARTS = [
    { id: 'c-waiting', series: [['s_waiting', '#0b57d0', 'waiting', 0]] },
    { id: 'c-admission', series: [['s_admitted', '#0b57d0', 'admitted_s', 2], ['s_rate', '#b3261e', 'rate', 2, [6, 4]]] },
    { id: 'c-holds', series: [['s_holds', '#146c2e', 'holds', 2]] },
    { id: 'c-lags', series: [['s_settle', '#6a1b9a', 'settle', 1], ['s_outbox', '#8a4b00', 'outbox', 1, [6, 4]]] },
  ];
  let plots = [];

  const chartData = (c) => [hist.map((h) => h.t), ...c.series.map(([, , field]) => hist.map((h) => h[field]))];
  const plotWidth = (c) => Math.max(200, Math.floor($(c.id).clientWidth || 300));

  function makeCharts() {
    destroyCharts();
    if (typeof window.uPlot !== 'function') return;
    const axis = { stroke: '#44444c', grid: { stroke: '#e6e6ec', width: 1 }, ticks: { stroke: '#c8c8d0', width: 1 } };
    plots = CHARTS.map((c) => new window.uPlot({
      width: plotWidth(c),
      height: 200,
      cursor: { drag: { x: false, y: false } },
      scales: { x: { time: true }, y: { range: (u, min, max) => [0, max > 0 ? max * 1.15 : 1] } },
      series: [
        { label: t('s_time'), value: (u, v) => (v == null ? DASH : clock(v * 1000)) },
        ...c.series.map(([label, stroke, , digits, dash]) => ({
          label: t(label), stroke, width: 2, dash, spanGaps: false,
          value: (u, v) => (v == null ? DASH : num(v, digits)),
        })),
      ],
      axes: [
        // Whole seconds at least: frames are a second apart.
        { ...axis, space: 80, incrs: [1, 2, 5, 10, 15, 30, 60, 120, 300], values: (u, splits) => splits.map((s) => clock(s * 1000)) },
        { ...axis, size: 56, values: (u, splits) => splits.map((s) => num(s, 2)) },
      ],
    }, chartData(c), $(c.id)));
  }

  function destroyCharts() {
    for (const p of plots) p.destroy();
    plots = [];
  }

  function updateCharts() {
    CHARTS.forEach((c, i) => plots[i]?.setData(chartData(c)));
    $('charts').dataset.points = String(hist.length);
  }

  let resizeTimer = 0;
  window.addEventListener('resize', () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => CHARTS.forEach((c, i) => plots[i]?.setSize({ width: plotWidth(c), height: 200 })), 150);
  });

  // ------------------------------------------------------------ writes
  let answer = null;
  /** The <dialog>: resolves true on Confirm, false on Cancel or Escape. */
  function confirmWith(text, extra) {
    const d = $('confirm');
    say('confirm-text', text);
    say('confirm-extra', extra || '');
    show('confirm-extra', Boolean(extra));
    return new Promise((resolve) => {
      answer = resolve;
      d.showModal();
      $('confirm-cancel').focus();
    });
  }
  $('confirm-ok').addEventListener('click', () => $('confirm').close('confirm'));
  $('confirm-cancel').addEventListener('click', () => $('confirm').close('cancel'));
  $('confirm').addEventListener('close', () => {
    const r = answer;
    answer = null;
    r?.($('confirm').returnValue === 'confirm');
    $('confirm').returnValue = '';
  });

  // The last write's outcome: its text is made again in a new language.
  let shown = null;
  function result(kind, text, body) {
    shown = { kind, text, body };
    $('result').className = `result ${kind}`;
    say('result-text', text ? text() : '');
    say('result-body', body == null ? '' : JSON.stringify(body, null, 2));
    show('result-body', body != null);
  }

  const writeButtons = () => document.querySelectorAll('#pause-btn, #resume-btn, #end-btn, #rate-form button, #message-form button, #revoke-form button');

  /** Confirms, sends one write, shows its answer, reloads the audit log. */
  async function write(action, path, body, question, extra) {
    const view = current;
    if (!view) return;
    if (!(await confirmWith(question, extra))) return;
    for (const b of writeButtons()) b.disabled = true;
    result('', () => t('sending', { action: t(`act_${action}`) }));
    const r = await api('POST', `sales/${encodeURIComponent(view.id)}/${path}`, body);
    for (const b of writeButtons()) b.disabled = false;
    if (view !== current) return;
    const name = () => t(`act_${action}`);
    if (r.status === 200) result('ok', () => t('done', { action: name(), name: view.name }), r.data);
    else if (r.status === 401) return signOut(t('key_rejected'));
    else result('bad', () => t('failed', { action: name(), why: why(r) }), r.data?.error ? null : r.data);
    loadAudit(true);
  }

  const named = (k, vars = {}) => t(k, { name: current?.name ?? '', id: current?.id ?? '', ...vars });
  $('pause-btn').addEventListener('click', () => write('pause', 'pause', {}, named('cf_pause')));
  $('resume-btn').addEventListener('click', () => write('resume', 'resume', {}, named('cf_resume')));
  $('end-btn').addEventListener('click', () => write('end', 'end', {}, named('cf_end')));
  $('rate-form').addEventListener('submit', (e) => {
    e.preventDefault();
    const rate = Number($('rate').value);
    if ($('rate').value.trim() === '' || !Number.isFinite(rate) || rate <= 0 || rate > 100_000) {
      result('bad', () => t('rate_invalid'));
      $('rate').focus();
      return;
    }
    write('rate', 'rate', { rate }, named('cf_rate', { rate: num(rate, 3) }));
  });
  const chars = (s) => [...s].length;
  const countMessage = () => say('message-count', t('message_count', { n: num(chars($('message').value)) }));
  $('message').addEventListener('input', countMessage);
  $('message-form').addEventListener('submit', (e) => {
    e.preventDefault();
    const text = $('message').value;
    if (chars(text.trim()) > 280) { result('bad', () => t('message_long')); return; }
    if (text.trim() === '') write('message', 'message', { text: '' }, named('cf_unmessage'));
    else write('message', 'message', { text }, named('cf_message'), text);
  });
  $('revoke-form').addEventListener('submit', (e) => {
    e.preventDefault();
    const account = $('account').value.trim();
    if (!account) { result('bad', () => t('account_required')); $('account').focus(); return; }
    write('revoke', 'revoke', { account }, named('cf_revoke', { account }));
  });

  // ------------------------------------------------------------ audit log
  let auditNext = null;
  let auditSeq = 0;
  async function loadAudit(fresh) {
    const view = current;
    if (!view) return;
    const seq = ++auditSeq;
    const before = fresh ? '' : `&before=${encodeURIComponent(auditNext)}`;
    const r = await api('GET', `audit?sale=${encodeURIComponent(view.id)}&limit=50${before}`);
    if (seq !== auditSeq || view !== current) return;
    if (r.status === 401) return signOut(t('key_rejected'));
    if (r.status !== 200) { say('audit-error', why(r)); return; }
    say('audit-error', '');
    const entries = Array.isArray(r.data?.entries) ? r.data.entries : [];
    const rows = entries.map((a) => {
      const tr = document.createElement('tr');
      const at = el('td', when(a.at));
      at.dataset.at = String(a.at ?? '');
      const refused = el('td', a.error ? String(a.error) : DASH, a.error ? 'refused' : '');
      const req = el('td');
      req.append(el('code', a.request == null ? DASH : JSON.stringify(a.request)));
      tr.append(at, el('td', a.key_id == null ? DASH : String(a.key_id)), el('td', String(a.action ?? '')), refused, req);
      tr.dataset.action = String(a.action ?? '');
      return tr;
    });
    if (fresh) $('audit-rows').replaceChildren(...rows);
    else $('audit-rows').append(...rows);
    auditNext = r.data?.next_before ?? null;
    show('audit-more', auditNext != null);
    show('audit-empty', $('audit-rows').rows.length === 0);
  }
  $('audit-refresh').addEventListener('click', () => loadAudit(true));
  $('audit-more').addEventListener('click', () => loadAudit(false));

  // ------------------------------------------------------------ language
  function translate() {
    document.documentElement.lang = lang;
    for (const e of document.querySelectorAll('[data-t]')) say(e, t(e.dataset.t));
    $('lang').value = lang;
    countMessage();
    if (sales.length || key) listSales(sales);
    setConn(conn.state, conn.s);
    if (current) {
      renderHeader();
      if (shown) result(shown.kind, shown.text, shown.body);
      if (current.frame) renderFrame();
      else resetFigures();
      makeCharts();
      updateCharts();
      // The audit's times, in the new locale.
      for (const td of document.querySelectorAll('#audit-rows td[data-at]')) say(td, when(td.dataset.at));
    } else document.title = t('title');
  }
  $('lang').addEventListener('change', () => {
    lang = LANGS.includes($('lang').value) ? $('lang').value : 'en';
    localStorage.setItem(LANG_KEY, lang);
    translate();
  });

  // ------------------------------------------------------------ start
  $('login-form').addEventListener('submit', (e) => {
    e.preventDefault();
    const k = $('key').value.trim();
    if (k) signIn(k);
  });
  $('logout').addEventListener('click', () => { signOut(''); });
  $('reload').addEventListener('click', reloadSales);
  $('sale-pick').addEventListener('change', () => {
    const id = $('sale-pick').value;
    location.hash = id ? `sale=${encodeURIComponent(id)}` : '';
  });
  window.addEventListener('hashchange', route);

  translate();
  if (key) signIn(key);
  else signOut('');
})();
