//! The coordinator's snapshot as the Worker keeps it (Wasm only): in
//! isolate memory ≤ 2.5 s (single flight), shared through the Cache API,
//! so the isolates of one location together ask the coordinator about once
//! per refresh, not once each.
//!
//! Invariants kept here: a snapshot is never taken for younger than it is
//! (its age is the coordinator's clock reading); a busy coordinator does
//! not hold a poll that has a cached snapshot (it stands in, as between
//! refreshes); a stale one stands in for at most a minute when the
//! coordinator fails.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use worker::{Cache, Env, Method};

use crate::api::error::{ApiError, ApiResult};
use crate::http::cache::{cache_key, cache_put_json};
use crate::http::respond::now_ms;
use crate::http::sold_out::set_sold_out_local;
use crate::queue::status::{self, Snapshot};
use crate::worker::calls::call_coordinator;
use crate::worker::memory::{MAX_SALES, bounded};

/// How long a queue snapshot is reused from isolate memory. Between
/// refreshes the frontier is extrapolated from its checkpoint and rate
/// (`status::frontier_at`), so a longer life costs no admission speed.
const SNAPSHOT_TTL_MS: u64 = 3_000;

/// From this age on, one request refreshes the snapshot while the others
/// keep using the cached one (single flight: no herd on the object).
const SNAPSHOT_REFRESH_MS: u64 = status::FRONTIER_HORIZON_MS;

/// How long a stale snapshot may stand in when the object cannot answer.
const SNAPSHOT_STALE_MS: u64 = 60_000;

/// How long a request with a cached snapshot waits for a fresh one.
const SNAPSHOT_BUDGET_MS: u64 = 300;

thread_local! {
    static SNAPSHOTS: RefCell<HashMap<String, (u64, Rc<Snapshot>)>> = RefCell::new(HashMap::new());
    static REFRESHING: RefCell<HashMap<String, u64>> = RefCell::new(HashMap::new());
}

/// Keeps `s` in isolate memory as taken at `at` (unix ms): the time the
/// coordinator answered, so a snapshot from the Cache API is not made
/// younger than it is.
fn remember_snapshot(s: Snapshot, at: u64) -> Rc<Snapshot> {
    let s = Rc::new(s);
    let sale = s.sale.clone();
    if s.sold_out {
        set_sold_out_local(&sale);
    }
    SNAPSHOTS.with(|m| bounded(&mut m.borrow_mut(), MAX_SALES, sale, (at, s.clone())));
    s
}

/// A snapshot another isolate of this location took less than `refresh_ms`
/// ago (Cache API), if any. Its age is the coordinator's own clock reading
/// (`now_ms` in the snapshot), so a copy never passes for fresher than it
/// is however often it is passed on.
async fn shared_snapshot(sale: &str, now: u64, refresh_ms: u64) -> Option<Snapshot> {
    let key = cache_key("snapshot", sale);
    let mut r = Cache::default().get(key.as_str(), false).await.ok()??;
    let s: Snapshot = serde_json::from_str(&r.text().await.ok()?).ok()?;
    (s.sale == sale && now.saturating_sub(s.now_ms) < refresh_ms).then_some(s)
}

/// Forgets the snapshots (DEV_MODE hook).
pub(crate) fn forget_memory() {
    SNAPSHOTS.with(|m| m.borrow_mut().clear());
    REFRESHING.with(|m| m.borrow_mut().clear());
}

/// The queue snapshot from isolate memory: fresh for 2.5 s; from then on a
/// single request refreshes it from the coordinator while the others go on
/// using the cached one (at most 3 s plus one object round trip old).
pub(crate) async fn snapshot(env: &Env, sale: &str) -> ApiResult<Rc<Snapshot>> {
    refreshed_snapshot(env, sale, SNAPSHOT_REFRESH_MS, Some(SNAPSHOT_BUDGET_MS)).await
}

/// The snapshot, refreshed once older than `refresh_ms` (the summary asks
/// for one at most 1 s old, as DESIGN promises for its figures, and waits
/// for it).
pub(crate) async fn snapshot_within(
    env: &Env,
    sale: &str,
    refresh_ms: u64,
) -> ApiResult<Rc<Snapshot>> {
    refreshed_snapshot(env, sale, refresh_ms, None).await
}

/// The snapshot, refreshed once older than `refresh_ms`; with a `budget`,
/// a request holding a cached snapshot waits at most that long for a fresh
/// one (status polls: the frontier is extrapolated from the cached one
/// meanwhile, as between refreshes).
async fn refreshed_snapshot(
    env: &Env,
    sale: &str,
    refresh_ms: u64,
    budget: Option<u64>,
) -> ApiResult<Rc<Snapshot>> {
    let now = now_ms();
    let cached = SNAPSHOTS.with(|m| m.borrow().get(sale).cloned());
    let in_flight = REFRESHING.with(|m| {
        m.borrow()
            .get(sale)
            .is_some_and(|t| now.saturating_sub(*t) < 2 * SNAPSHOT_TTL_MS)
    });
    if let Some((at, s)) = &cached {
        let age = now.saturating_sub(*at);
        if age < refresh_ms || (in_flight && age < 2 * SNAPSHOT_TTL_MS) {
            return Ok(s.clone());
        }
    }
    let refreshing = Refreshing::start(sale, now);
    if let Some(s) = shared_snapshot(sale, now, refresh_ms).await {
        drop(refreshing);
        let at = s.now_ms.min(now);
        return Ok(remember_snapshot(s, at));
    }
    let ask = call_coordinator(env, sale, Method::Get, "/snapshot", None);
    let got = match (&cached, budget) {
        // A busy coordinator (a draw step under way) does not hold the
        // poll: the cached snapshot stands in, as between refreshes, and a
        // later request asks again.
        (Some((at, s)), Some(budget)) if now.saturating_sub(*at) < SNAPSHOT_STALE_MS => {
            match within(budget, ask).await {
                Some(got) => got,
                None => return Ok(s.clone()),
            }
        }
        _ => ask.await,
    };
    drop(refreshing);
    match got {
        Ok(v) => {
            let s: Snapshot = serde_json::from_value(v)
                .map_err(|_| ApiError::new(502, "queue_error", "bad snapshot"))?;
            if let Ok(body) = serde_json::to_string(&s) {
                let secs = SNAPSHOT_TTL_MS.div_ceil(1000) as u32;
                cache_put_json(&cache_key("snapshot", sale), 200, &body, secs).await;
            }
            Ok(remember_snapshot(s, now_ms()))
        }
        Err(e) if e.status >= 500 => match cached {
            // People keep their place and see `waiting`, not an error page.
            Some((at, s)) if now.saturating_sub(at) < SNAPSHOT_STALE_MS => Ok(s),
            _ => Err(e),
        },
        Err(e) => Err(e),
    }
}

/// `fut`'s output if it is ready within `ms`, else `None` (and `fut` is
/// dropped).
pub(crate) async fn within<T>(ms: u64, fut: impl Future<Output = T>) -> Option<T> {
    let fut = std::pin::pin!(fut);
    let delay = std::pin::pin!(worker::Delay::from(std::time::Duration::from_millis(ms)));
    match futures::future::select(fut, delay).await {
        futures::future::Either::Left((v, _)) => Some(v),
        futures::future::Either::Right(_) => None,
    }
}

/// Marks a sale's snapshot as being refreshed by this request for as long
/// as it lives (a refresh given up half way unmarks it).
struct Refreshing<'a>(&'a str);

impl<'a> Refreshing<'a> {
    fn start(sale: &'a str, now: u64) -> Self {
        REFRESHING.with(|m| bounded(&mut m.borrow_mut(), MAX_SALES, sale.to_string(), now));
        Refreshing(sale)
    }
}

impl Drop for Refreshing<'_> {
    fn drop(&mut self) {
        REFRESHING.with(|m| m.borrow_mut().remove(self.0));
    }
}
