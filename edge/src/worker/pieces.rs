//! A person's place from immutable pieces (Wasm only): the shards' draw
//! index and buckets, or one complete second of arrivals, each cached in
//! isolate memory and the Cache API, so an object serves each piece about
//! once per cache. Which piece a ticket needs is decided by
//! `queue::poll::place_from`; the arithmetic is `queue::places`.
//!
//! Invariants kept here: a piece is cached for good only once it is
//! immutable (the draw is done, the second is complete); a request waits
//! for another one fetching the same piece, not for a second fetch.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use serde_json::Value;
use token::TicketData;
use worker::{Cache, Env, Method};

use crate::api::error::{ApiError, ApiResult};
use crate::draw::hash;
use crate::draw::index::ShardIndex;
use crate::http::cache::{cache_key, cache_put_json};
use crate::http::respond::now_ms;
use crate::queue::places::{Arrival, SecondArrivals, is_member, place_of};
use crate::queue::poll::{PlaceFrom, place_from};
use crate::queue::status::Snapshot;
use crate::worker::calls::{call_coordinator, call_shard};
use crate::worker::memory::{MAX_BUCKETS, MAX_SALES, bounded};

/// Immutable pieces stay in the Cache API this long.
const IMMUTABLE_SECS: u32 = 86_400;

/// Most bytes the cached buckets may take in an isolate (of its 128 MB).
const MAX_BUCKET_BYTES: usize = 32 * 1024 * 1024;

/// Bytes a bucket of values takes in memory, about: each value's text and
/// its `String`, and the `Vec` and map entry.
fn bucket_bytes(values: &[String]) -> usize {
    values.iter().map(|v| v.len() + 24).sum::<usize>() + 96
}

/// How long a request waits for another one fetching the same piece.
const PIECE_WAIT_MS: u64 = 3_000;

thread_local! {
    static INDEXES: RefCell<HashMap<String, Rc<Vec<ShardIndex>>>> = RefCell::new(HashMap::new());
    static BUCKETS: RefCell<HashMap<String, Rc<Vec<String>>>> = RefCell::new(HashMap::new());
    static SECONDS: RefCell<HashMap<String, Rc<SecondArrivals>>> = RefCell::new(HashMap::new());
    /// Pieces being fetched by a request of this isolate (single flight).
    static LOADING: RefCell<HashMap<String, u64>> = RefCell::new(HashMap::new());
    /// Bytes the cached buckets take (an estimate: see `bucket_bytes`).
    static BUCKET_BYTES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// Short-lived answers (`fresh_for`): id → (fetched ms, value).
    static FRESH: RefCell<HashMap<String, (u64, Value)>> = RefCell::new(HashMap::new());
}

/// Forgets the pieces (DEV_MODE hook).
pub(crate) fn forget_memory() {
    INDEXES.with(|m| m.borrow_mut().clear());
    BUCKETS.with(|m| m.borrow_mut().clear());
    BUCKET_BYTES.with(|b| b.set(0));
    SECONDS.with(|m| m.borrow_mut().clear());
    LOADING.with(|m| m.borrow_mut().clear());
    FRESH.with(|m| m.borrow_mut().clear());
}

/// An answer at most `max_age_ms` old, shared by the requests of this
/// isolate: one `load` at a time (others wait for it, then read it), so a
/// crowd asking at once costs one object call per `max_age_ms` per
/// isolate, not one each (issue 44 #3).
pub(crate) async fn fresh_for(
    id: &str,
    max_age_ms: u64,
    load: impl Future<Output = ApiResult<Value>>,
) -> ApiResult<Value> {
    let fresh = || {
        FRESH.with(|m| {
            m.borrow()
                .get(id)
                .filter(|(at, _)| now_ms().saturating_sub(*at) < max_age_ms)
                .map(|(_, v)| v.clone())
        })
    };
    if let Some(v) = fresh() {
        return Ok(v);
    }
    await_piece(id, || fresh().is_some()).await;
    if let Some(v) = fresh() {
        return Ok(v);
    }
    let _loading = Loading::start(id);
    let v = load.await?;
    FRESH.with(|m| {
        bounded(
            &mut m.borrow_mut(),
            MAX_SALES,
            id.to_string(),
            (now_ms(), v.clone()),
        )
    });
    Ok(v)
}

/// The place of a ticket's holder once it is final: from the ticket, or
/// computed from the immutable pieces (see the module doc).
pub(crate) async fn place_of_ticket(
    env: &Env,
    sale: &str,
    sub: &str,
    tkt: &TicketData,
    snap: &Snapshot,
) -> Option<u64> {
    match place_from(sub, tkt, snap) {
        PlaceFrom::Ticket(p) => Some(p),
        PlaceFrom::Arrivals(me) => fifo_place(env, sale, me).await,
        PlaceFrom::Draw { salt, shard } => prequeue_place(env, sale, sub, salt, shard, snap).await,
        PlaceFrom::NotYet => None,
    }
}

/// Waits while another request of this isolate fetches piece `id` (the
/// first poll after the draw comes in a crowd: one fetch per piece, not one
/// per concurrent poll). Returns once it is no longer being fetched.
async fn await_piece(id: &str, in_memory: impl Fn() -> bool) {
    let start = now_ms();
    while !in_memory()
        && now_ms().saturating_sub(start) < PIECE_WAIT_MS
        && LOADING.with(|m| {
            m.borrow()
                .get(id)
                .is_some_and(|t| now_ms().saturating_sub(*t) < PIECE_WAIT_MS)
        })
    {
        worker::Delay::from(std::time::Duration::from_millis(20)).await;
    }
}

/// Marks piece `id` as being fetched by this request for as long as it
/// lives: a fetch given up half way (a poll past its budget) unmarks it,
/// so other requests fetch it themselves instead of waiting for nobody.
struct Loading<'a>(&'a str);

impl<'a> Loading<'a> {
    fn start(id: &'a str) -> Self {
        LOADING.with(|m| bounded(&mut m.borrow_mut(), MAX_BUCKETS, id.to_string(), now_ms()));
        Loading(id)
    }
}

impl Drop for Loading<'_> {
    fn drop(&mut self) {
        LOADING.with(|m| m.borrow_mut().remove(self.0));
    }
}

/// An immutable JSON piece: Cache API, else `load` (then cached for good).
pub(crate) async fn immutable(
    id: &str,
    load: impl Future<Output = ApiResult<Value>>,
) -> Option<Value> {
    // Another request of this isolate fetching it: wait, then read what it
    // cached, instead of a second fetch (a crowd asking for one page).
    await_piece(id, || false).await;
    let _loading = Loading::start(id);
    immutable_uncounted(id, load).await
}

async fn immutable_uncounted(
    id: &str,
    load: impl Future<Output = ApiResult<Value>>,
) -> Option<Value> {
    let ck = cache_key("piece", id);
    if let Ok(Some(mut r)) = Cache::default().get(ck.as_str(), false).await
        && let Ok(t) = r.text().await
        && let Ok(v) = serde_json::from_str::<Value>(&t)
    {
        return Some(v);
    }
    let v = load.await.ok()?;
    cache_put_json(&ck, 200, &v.to_string(), IMMUTABLE_SECS).await;
    Some(v)
}

async fn draw_index(env: &Env, sale: &str, commitment: &str) -> Option<Rc<Vec<ShardIndex>>> {
    let id = format!("{sale}/{commitment}/index");
    await_piece(&id, || INDEXES.with(|m| m.borrow().contains_key(&id))).await;
    if let Some(x) = INDEXES.with(|m| m.borrow().get(&id).cloned()) {
        return Some(x);
    }
    let v = immutable(
        &id,
        call_coordinator(env, sale, Method::Get, "/index", None),
    )
    .await?;
    let x: Vec<ShardIndex> = serde_json::from_value(v["shards"].clone()).ok()?;
    let x = Rc::new(x);
    INDEXES.with(|m| bounded(&mut m.borrow_mut(), MAX_SALES, id, x.clone()));
    Some(x)
}

async fn bucket(
    env: &Env,
    sale: &str,
    commitment: &str,
    k: u32,
    j: u64,
) -> Option<Rc<Vec<String>>> {
    let id = format!("{sale}/{commitment}/b/{k}/{j}");
    await_piece(&id, || BUCKETS.with(|m| m.borrow().contains_key(&id))).await;
    if let Some(x) = BUCKETS.with(|m| m.borrow().get(&id).cloned()) {
        return Some(x);
    }
    let path = format!("/bucket?j={j}");
    let v = immutable(&id, call_shard(env, sale, k, Method::Get, &path, None)).await?;
    let x: Vec<String> = serde_json::from_value(v["values"].clone()).ok()?;
    let x = Rc::new(x);
    // Bounded by bytes as well as by count: 4,096 buckets of 512 values are
    // ~180 MB, more than an isolate's 128 MB (issue 44 #7).
    let bytes = bucket_bytes(&x);
    BUCKETS.with(|m| {
        let mut m = m.borrow_mut();
        if BUCKET_BYTES.with(|b| b.get()) + bytes > MAX_BUCKET_BYTES {
            m.clear();
            BUCKET_BYTES.with(|b| b.set(0));
        }
        if m.len() >= MAX_BUCKETS {
            BUCKET_BYTES.with(|b| b.set(0));
        }
        bounded(&mut m, MAX_BUCKETS, id, x.clone());
        BUCKET_BYTES.with(|b| b.set(b.get() + bytes));
    });
    Some(x)
}

/// Every shard's bucket straddling `v` (empty where none does), fetched
/// at once: one person's first poll after the draw waits for the slowest of
/// them, not for their sum.
async fn straddling_buckets(
    env: &Env,
    sale: &str,
    commitment: &str,
    index: &[ShardIndex],
    v: &str,
) -> Option<Vec<Rc<Vec<String>>>> {
    let fetches = index.iter().enumerate().map(|(k, ix)| async move {
        match ix.straddling(v) {
            Some(j) => bucket(env, sale, commitment, k as u32, j).await,
            None => Some(Rc::new(Vec::new())),
        }
    });
    futures::future::join_all(fetches)
        .await
        .into_iter()
        .collect::<Option<_>>()
}

pub(crate) async fn prequeue_place(
    env: &Env,
    sale: &str,
    sub: &str,
    salt: &str,
    shard: u32,
    snap: &Snapshot,
) -> Option<u64> {
    let key = snap.key.as_deref().and_then(::draw::from_hex)?;
    let index = draw_index(env, sale, &snap.commitment).await?;
    let own = index.get(shard as usize)?;
    let v = hash::value_hex(&key, &hash::leaf_of_ticket(sub, salt)?);
    own.straddling(&v)?;
    // The own shard's bucket is one of the buckets the place needs: they
    // are fetched in one concurrent round (right after the draw every first
    // poll waits for these round trips; a membership check first would add
    // a round).
    let held = straddling_buckets(env, sale, &snap.commitment, &index, &v).await?;
    if !is_member(own, &v, held.get(shard as usize)?) {
        // A ticket of someone who joined after the entrant set froze.
        return None;
    }
    let parts: Vec<(&ShardIndex, &[String])> = index
        .iter()
        .zip(&held)
        .map(|(ix, b)| (ix, b.as_slice()))
        .collect();
    place_of(&v, &parts)
}

async fn fifo_place(env: &Env, sale: &str, me: Arrival) -> Option<u64> {
    let second = me.t_ms / 1000;
    let id = format!("{sale}/s/{second}");
    await_piece(&id, || SECONDS.with(|m| m.borrow().contains_key(&id))).await;
    let sec = match SECONDS.with(|m| m.borrow().get(&id).cloned()) {
        Some(s) => s,
        None => {
            let path = format!("/arrivals?s={second}");
            // Only a complete second is immutable: an incomplete one is an
            // error to `immutable`, so it is neither cached nor answered.
            let load = async {
                let v = call_coordinator(env, sale, Method::Get, &path, None).await?;
                if v["arrivals"]["complete"].as_bool() == Some(true) {
                    Ok(v)
                } else {
                    Err(ApiError::new(503, "queue_error", "second not complete"))
                }
            };
            let v = immutable(&id, load).await?;
            let mut s: SecondArrivals = serde_json::from_value(v["arrivals"].clone()).ok()?;
            if !s.complete {
                return None;
            }
            // The pre-queue goes into `before`: the cached piece is whole.
            s.before += v["prequeue"].as_u64().unwrap_or(0);
            let s = Rc::new(s);
            SECONDS.with(|m| bounded(&mut m.borrow_mut(), MAX_BUCKETS, id, s.clone()));
            s
        }
    };
    sec.place_of(0, me)
}
