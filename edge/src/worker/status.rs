//! `GET /api/sales/{sale}/queue` (Wasm only): a status poll — a ticket
//! check plus arithmetic on the coordinator's snapshot (`queue::poll`,
//! `queue::status`); a place not yet in the ticket is computed once
//! (`worker::pieces`) and goes into a re-minted ticket.
//!
//! Invariants kept here: no poll writes to an object, except that an
//! admitted person's polls are reported to their shard, batched (one call
//! per shard per 2 s per isolate; issue 13's abandoned turns); no poll
//! waits more than `PLACE_BUDGET_MS` for its place.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

use serde_json::{Value, json};
use token::{Claims, TicketData, TokenType};
use worker::{Env, Method, Request, Response, js_sys};

use crate::api::error::ApiResult;
use crate::http::keys::{bearer_of, ring, ticket_claims};
use crate::http::origin::recent_summary;
use crate::http::respond::{internal, json_response, now_ms};
use crate::http::sold_out::sold_out_local;
use crate::queue::outlook;
use crate::queue::poll;
use crate::queue::shards;
use crate::queue::status::{Snapshot, TICKET_TTL_SECS, holds_turn};
use crate::worker::calls::call_shard;
use crate::worker::memory::{MAX_JOINED, MAX_SALES, bounded, remember_join};
use crate::worker::pieces::place_of_ticket;
use crate::worker::snapshot::{snapshot, within};

/// An admitted person's polls are told to their shard at most this often
/// per isolate (they poll every ~10 s; the turn is lost after 30 s unseen).
const SEEN_EVERY_MS: u64 = 5_000;

/// A shard's seen reports wait this long for company...
const SEEN_FLUSH_MS: u64 = 2_000;

/// ...or once this many are pending.
const SEEN_BATCH_MAX: usize = 500;

/// How long a status poll waits for the pieces its place needs. Past it the
/// poll answers without the place (`drawing`, ask again soon) and the next
/// one finds the pieces loaded meanwhile: right after the draw every
/// waiting person's first poll wants pieces at once, and none of them
/// should wait for all of that (issue 20: "no request waits > 1 s").
const PLACE_BUDGET_MS: u64 = 500;

/// A poll slower than this is logged with where its time went.
const SLOW_POLL_MS: u64 = 400;

thread_local! {
    /// `sale/sub` → when this isolate last told the shard the admitted
    /// person was seen.
    static SEEN: RefCell<HashMap<String, u64>> = RefCell::new(HashMap::new());
    /// `sale/shard` → seen reports not yet sent.
    static SEEN_BATCH: RefCell<HashMap<String, Rc<RefCell<SeenBatch>>>> = RefCell::new(HashMap::new());
    /// A request's `waitUntil` will send the pending batches
    /// ([`scheduled_flush`]).
    static FLUSH_SCHEDULED: Cell<bool> = const { Cell::new(false) };
}

/// One seen report: `(sub, place, seen ms)`.
type SeenReport = (String, u64, u64);

/// Seen reports waiting for one shard, since `started`.
struct SeenBatch {
    sale: String,
    shard: u32,
    started: u64,
    pending: Vec<SeenReport>,
}

/// Forgets the seen reports (DEV_MODE hook).
pub(crate) fn forget_memory() {
    SEEN.with(|m| m.borrow_mut().clear());
    SEEN_BATCH.with(|m| m.borrow_mut().clear());
    SKU_FIGURES.with(|m| m.borrow_mut().clear());
    FLUSH_SCHEDULED.with(|f| f.set(false));
}

/// The status answer of the holder of `ticket` at `now` (the sale's
/// sold-out flag of this isolate counts too).
fn status_body(
    env: &Env,
    sale: &str,
    sub: &str,
    ticket: &str,
    place: Option<u64>,
    after_start: bool,
    snap: &Snapshot,
) -> ApiResult<Value> {
    let mut s = snap.clone();
    s.sold_out = s.sold_out || sold_out_local(sale);
    let admits = || ring(env, "ADMISSION_TOKEN_KEYS");
    let jitter = js_sys::Math::random();
    let mut body = poll::status_body(
        admits,
        sale,
        sub,
        ticket,
        place,
        after_start,
        &s,
        now_ms(),
        jitter,
    )?;
    with_outlook(sale, &mut body);
    Ok(body)
}

/// A waiting person's answer carries, per SKU, whether it is likely to be
/// left at their turn (`queue::outlook`), from the sale's per-SKU figures
/// this isolate read from the summary in the last few seconds: memory only,
/// no object or origin call per poll (none in memory: no outlook).
fn with_outlook(sale: &str, body: &mut Value) {
    if body["status"] != "waiting" {
        return;
    }
    let (Some(place), Some(position), Some(ahead)) = (
        body["place"].as_u64(),
        body["position"].as_u64(),
        body["ahead"].as_u64(),
    ) else {
        return;
    };
    let Some(skus) = sku_figures(sale) else {
        return;
    };
    // Places up to the frontier are admitted: place - position of them.
    body["sku_outlook"] = outlook::outlook(&skus, ahead, place.saturating_sub(position));
}

/// A sale's per-SKU figures and when they were read (ms).
type ReadFigures = (u64, Rc<Vec<outlook::SkuFigures>>);

thread_local! {
    /// `sale` → its per-SKU figures: parsed once per second at most, not on
    /// every poll.
    static SKU_FIGURES: RefCell<HashMap<String, ReadFigures>> = RefCell::new(HashMap::new());
}

/// The sale's per-SKU figures, from the summary this isolate holds (at most
/// 5 s old), re-read at most once a second.
fn sku_figures(sale: &str) -> Option<Rc<Vec<outlook::SkuFigures>>> {
    let now = now_ms();
    if let Some(f) = SKU_FIGURES.with(|m| {
        m.borrow()
            .get(sale)
            .filter(|(at, _)| now.saturating_sub(*at) < 1_000)
            .map(|(_, f)| f.clone())
    }) {
        return Some(f);
    }
    let figures = Rc::new(outlook::figures(&recent_summary(sale, 5_000)?));
    SKU_FIGURES.with(|m| {
        bounded(
            &mut m.borrow_mut(),
            MAX_SALES,
            sale.to_string(),
            (now, figures.clone()),
        )
    });
    Some(figures)
}

/// A JSON answer that no cache keeps.
pub(crate) fn reply(body: &Value) -> ApiResult<Response> {
    json_response(200, body, "no-store").map_err(internal)
}

/// `GET /api/sales/{sale}/queue`.
pub(crate) async fn status(env: &Env, req: &Request, sale: &str) -> ApiResult<Response> {
    let token = bearer_of(req)?;
    status_for(env, sale, &token).await
}

/// The status object of the holder of `ticket`; learns the place (once)
/// when it has become known and re-mints the ticket with it.
pub(crate) async fn status_for(env: &Env, sale: &str, ticket: &str) -> ApiResult<Response> {
    let t0 = now_ms();
    let tickets = ring(env, "ADMISSION_TOKEN_KEYS")?;
    let claims = ticket_claims(&tickets, sale, ticket)?;
    let tkt = claims.tkt.clone().unwrap_or_default();
    let snap = snapshot(env, sale).await?;
    if tkt.shadow {
        // Never a shard or coordinator call, never a place within reach.
        let place = crate::queue::poll::shadow_place(&snap, tkt.seq, now_ms());
        let body = status_body(env, sale, &claims.sub, ticket, place, true, &snap)?;
        return reply(&body);
    }
    let t_snap = now_ms();
    flush_seen(env, sale).await;
    let t_seen = now_ms();
    let after_start = tkt.t_ms.is_some();
    if let Some(p) = tkt.place {
        let body = status_body(
            env,
            sale,
            &claims.sub,
            ticket,
            tkt.place,
            after_start,
            &snap,
        )?;
        if holds_turn(p, &snap, now_ms()) {
            let shard = tkt
                .shard
                .unwrap_or_else(|| shards::shard_of(&claims.sub, snap.shards));
            seen(env, sale, &claims.sub, shard, p).await;
        }
        return reply(&body);
    }
    let shard = tkt
        .shard
        .unwrap_or_else(|| shards::shard_of(&claims.sub, snap.shards));
    let place = within(
        PLACE_BUDGET_MS,
        place_of_ticket(env, sale, &claims.sub, &tkt, &snap),
    )
    .await
    .flatten();
    let t_place = now_ms();
    if t_place.saturating_sub(t0) > SLOW_POLL_MS {
        worker::console_warn!(
            "slow poll {sale}: {} ms (snapshot {}, seen {}, place {}: {})",
            t_place - t0,
            t_snap - t0,
            t_seen - t_snap,
            t_place - t_seen,
            if place.is_some() { "known" } else { "not yet" }
        );
    }
    let Some(p) = place else {
        let body = status_body(env, sale, &claims.sub, ticket, None, after_start, &snap)?;
        return reply(&body);
    };
    let fresh = Claims::new(
        TokenType::Ticket,
        claims.sub.as_str(),
        Some(sale.to_string()),
        now_ms() / 1000,
        TICKET_TTL_SECS,
    )
    .with_ticket(TicketData {
        place: Some(p),
        shard: Some(shard),
        ..tkt
    });
    let renewed = tickets.sign(&fresh);
    remember_join(sale, &claims.sub, &renewed, fresh.exp);
    let body = status_body(
        env,
        sale,
        &claims.sub,
        &renewed,
        Some(p),
        after_start,
        &snap,
    )?;
    if holds_turn(p, &snap, now_ms()) {
        seen(env, sale, &claims.sub, shard, p).await;
    }
    reply(&body)
}

/// Tells the account's shard an admitted person was seen (at their poll's
/// time): at most once per [`SEEN_EVERY_MS`] per person and isolate, in
/// batches of one call per shard per [`SEEN_FLUSH_MS`] — a batch starts
/// when its first report comes and is sent by the `waitUntil` of the
/// request that started it ([`scheduled_flush`]), or by an earlier poll
/// that finds it due — so admitted people's polls cost their shard a write
/// per batch, not per poll.
async fn seen(env: &Env, sale: &str, sub: &str, shard: u32, place: u64) {
    let key = format!("{sale}/{sub}");
    let now = now_ms();
    let fresh = SEEN.with(|m| {
        m.borrow()
            .get(&key)
            .is_some_and(|t| now.saturating_sub(*t) < SEEN_EVERY_MS)
    });
    if fresh {
        return;
    }
    SEEN.with(|m| bounded(&mut m.borrow_mut(), MAX_JOINED, key, now));
    let full = SEEN_BATCH.with(|m| {
        let mut m = m.borrow_mut();
        let batch_key = format!("{sale}/{shard}");
        // Full: the batches are dropped from the map, not lost: a flush
        // already scheduled holds them (`scheduled_flush`).
        if m.len() >= MAX_SALES && !m.contains_key(&batch_key) {
            m.clear();
        }
        let b = m.entry(batch_key).or_insert_with(|| {
            Rc::new(RefCell::new(SeenBatch {
                sale: sale.to_string(),
                shard,
                started: now,
                pending: Vec::new(),
            }))
        });
        let mut b = b.borrow_mut();
        if b.pending.is_empty() {
            b.started = now;
        }
        b.pending.push((sub.to_string(), place, now));
        b.pending.len() >= SEEN_BATCH_MAX
    });
    if full {
        flush_seen(env, sale).await;
    }
}

/// The pending seen batches' delivery, for the request's `waitUntil`
/// (`worker/entry.rs`): sent [`SEEN_FLUSH_MS`] from now whatever comes
/// next. They used to wait for a later poll of the same sale in the same
/// isolate, and were lost with the isolate, or never sent when the
/// person's next polls went to other isolates (issue 44 #5: a person
/// polling steadily across isolates lost the turn at 30 s). The future
/// holds the batches themselves, so an isolate's memory being dropped
/// meanwhile loses none. `None` when nothing is pending or a delivery is
/// already scheduled.
pub(crate) fn scheduled_flush(
    env: &Env,
) -> Option<impl std::future::Future<Output = ()> + 'static> {
    if FLUSH_SCHEDULED.with(Cell::get) {
        return None;
    }
    let batches: Vec<Rc<RefCell<SeenBatch>>> = SEEN_BATCH.with(|m| {
        m.borrow()
            .values()
            .filter(|b| !b.borrow().pending.is_empty())
            .cloned()
            .collect()
    });
    if batches.is_empty() {
        return None;
    }
    FLUSH_SCHEDULED.with(|f| f.set(true));
    let env = env.clone();
    Some(async move {
        worker::Delay::from(std::time::Duration::from_millis(SEEN_FLUSH_MS)).await;
        FLUSH_SCHEDULED.with(|f| f.set(false));
        // The batches held since scheduling, and those begun since.
        let mut batches = batches;
        SEEN_BATCH.with(|m| {
            for b in m.borrow().values() {
                if !batches.iter().any(|held| Rc::ptr_eq(held, b)) {
                    batches.push(b.clone());
                }
            }
        });
        for b in batches {
            let (sale, shard, batch) = {
                let mut b = b.borrow_mut();
                (b.sale.clone(), b.shard, std::mem::take(&mut b.pending))
            };
            if !batch.is_empty() {
                send_seen(&env, &sale, shard, batch).await;
            }
        }
    })
}

async fn send_seen(env: &Env, sale: &str, shard: u32, batch: Vec<SeenReport>) {
    let body = json!({ "seen": batch });
    let _ = call_shard(env, sale, shard, Method::Post, "/seen", Some(&body)).await;
}

/// Sends this sale's seen batches that are due (see [`seen`]).
pub(crate) async fn flush_seen(env: &Env, sale: &str) {
    let now = now_ms();
    let due: Vec<(u32, Vec<SeenReport>)> = SEEN_BATCH.with(|m| {
        m.borrow()
            .values()
            .filter_map(|b| {
                let mut b = b.borrow_mut();
                let due = b.sale == sale
                    && !b.pending.is_empty()
                    && (now.saturating_sub(b.started) >= SEEN_FLUSH_MS
                        || b.pending.len() >= SEEN_BATCH_MAX);
                due.then(|| (b.shard, std::mem::take(&mut b.pending)))
            })
            .collect()
    });
    for (shard, batch) in due {
        send_seen(env, sale, shard, batch).await;
    }
}
