//! The `SaleQueue` Durable Object (Wasm only): a sale's queue coordinator,
//! one per sale, SQLite storage. The entries themselves live in the sale's
//! `QueueShard` objects.
//!
//! Role: holds the sale's draw seed (commitment published before anyone
//! joins, seed after the draw), the admission frontier (a checkpoint plus a
//! rate, advanced by its alarm once a second), every shard's draw index and
//! the shards' per-second arrival reports; answers the Worker's snapshot
//! (cached ≤ 1 s per isolate) and the immutable pieces places are computed
//! from (`/index`, `/arrivals`).
//!
//! Invariants kept here:
//! - the seed is drawn from the CSPRNG the first time the object runs and
//!   is given to nobody before `starts_at` (shards ask for it to draw);
//! - snapshot and read requests commit nothing: the frontier they show is
//!   the stored checkpoint advanced in memory; only the alarm, shard
//!   reports and the sold-out hint write;
//! - the sale counts as drawn once every shard has sent its index; a second
//!   of arrivals is complete once every shard has reported it, and what is
//!   served for a complete second never changes;
//! - sale settings come from the origin (at most one fetch a second); when
//!   it fails the last stored settings stand;
//! - the frontier moves at the admission controller's rate
//!   (`control::Controller`, stepped by the alarm once a second with the
//!   origin's `health` from that fetch and the sale's `paused` flag) on the
//!   service clock, which stands still while the controller is frozen: no
//!   one is admitted while the origin does not answer or the sale is
//!   paused, and every open window is extended by the freeze;
//! - abandoned turns (issue 13 #4): the shards report when admitted people
//!   were last seen and who made a reservation; the alarm closes the turns
//!   of people not seen for 30 s who hold nothing (`turns`), once and for
//!   good, and their share of the inventory cap goes to the next people.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};

use serde::Deserialize;
use serde_json::{Value, json};
use worker::{
    DurableObject, Env, Fetch, Method, Request, Response, Result, SqlStorage, State,
    durable_object, js_sys,
};

use crate::admission::control::{Controller, Limits, Mode, Reason, Sample};
use crate::admission::frontier::{Frontier, Inputs, Params};
use crate::admission::turns::{self, Turn};
use crate::api::error::ApiError;
use crate::api::error::ApiResult;
use crate::api::metrics::AdmissionFigures;
use crate::api::routes;
use crate::draw::freeze::{CHUNK, ChunkIndex, Freeze, Item, LISTING_MAX, Page};
use crate::draw::hash::{self, BeaconNext};
use crate::draw::index::{BUCKET_SIZE, ShardIndex};
use crate::draw::phases::{self, Phase};
use crate::http::origin::send_with_timeout;
use crate::http::respond::{now_ms, query};
use crate::objects::call::{Meta, TurnRow, call_object, respond, sql_err};
use crate::queue::places::{Arrival, SecondArrivals, SecondReport, Watermarks};
use crate::queue::shards;
use crate::queue::status::{self, ADMIT_TTL_SECS, Snapshot};

const CONFIG_REFRESH_MS: u64 = 1_000;
/// The sale's p99 target when the origin names none (DESIGN default).
const DEFAULT_P99_MS: f64 = 50.0;
const SOLD_OUT_HINT_MS: u64 = 3_000;

#[durable_object]
pub struct SaleQueue {
    state: State,
    env: Env,
    meta: Meta,
    /// Last time the origin's summary was fetched (memory only: a cache).
    fetched_ms: Cell<u64>,
    /// Isolate requests served since the object started (a statistic,
    /// memory only; shards' reports are not counted).
    requests: Cell<u64>,
    /// Whether an alarm is known to be set (memory only).
    alarm_known: Cell<bool>,
    /// The origin's health from the last summary fetch; `None` when that
    /// fetch failed (memory only: the alarm fetches before it steps).
    sample: Cell<Option<Sample>>,
    /// What the snapshots this object served in the last horizon let
    /// isolates show (`status::Promise`): the frontier never falls behind
    /// any of them at the same moment, so a freeze (origin silent, pause)
    /// that stops the service clock never takes back a turn someone was
    /// just told they have. Memory only (an evicted object forgets them;
    /// its isolates then fall back by at most one horizon).
    promises: RefCell<Vec<status::Promise>>,
    /// Pages of leaves in hand for the freeze, and of `value ‖ leaf` for the
    /// listing, one per shard (memory only: refetched after the stored
    /// cursors when the object was evicted).
    leaf_pages: RefCell<Vec<Page<hash::Hash>>>,
    rank_pages: RefCell<Vec<Page<[u8; 64]>>>,
    /// When the shards were last woken (memory only: at most once a second).
    poked_ms: Cell<u64>,
    /// How long the alarm waits before the next draw step (set by a step).
    next_step_ms: Cell<u64>,
}

/// Leaves (or listing items) asked of a shard at once, and the most one
/// draw step merges. Small steps, because in `wrangler dev` every object
/// shares one thread and polls queue behind whole steps: with 1,024 / 8,192
/// the 200,000-entrant benchmark's slowest poll waited 2.5 s (45 of 2,206
/// over 1 s), with 512 / 2,048 1.5 s (1 of 2,761), the draw done 20 s after
/// the start either way (BENCHMARKS.md).
const DRAW_PAGE: usize = 512;
const DRAW_MAX_OUT: usize = 2_048;
/// Time between two merge steps of the listing (see `draw_step`).
const LISTING_STEP_GAP_MS: u64 = 100;

#[derive(Deserialize)]
struct ChunkRow {
    first: String,
    root: String,
}

#[derive(Deserialize)]
struct LeavesRow {
    leaves: String,
}

#[derive(Deserialize)]
struct ItemsRow {
    j: f64,
    items: String,
}

#[derive(Deserialize)]
struct ShardRow {
    shard: f64,
    count: Option<f64>,
    firsts: Option<String>,
    through: Option<f64>,
    requests: f64,
    prequeue: f64,
}

#[derive(Deserialize)]
struct ArrivalRow {
    shard: f64,
    stamps: String,
}

#[derive(Deserialize)]
struct SumRow {
    n: Option<f64>,
}

#[derive(Deserialize)]
struct Drawn {
    shard: u32,
    count: u64,
    firsts: Vec<String>,
    #[serde(default)]
    requests: u64,
}

#[derive(Deserialize)]
struct Report {
    shard: u32,
    #[serde(default)]
    through: Option<u64>,
    #[serde(default)]
    seconds: Vec<SecondReport>,
    #[serde(default)]
    prequeue: Option<u64>,
    #[serde(default)]
    requests: u64,
    /// Admitted people's turns changed since the last report: (place,
    /// last seen ms, made a reservation).
    #[serde(default)]
    turns: Vec<(u64, u64, bool)>,
}

#[derive(Deserialize)]
struct PlaceRow {
    place: f64,
}

#[derive(Deserialize)]
struct CountRow {
    n: f64,
}

/// Most abandoned places the snapshot lists (those in open windows).
const MAX_ABANDONED_LISTED: u64 = 20_000;
/// Most turns one alarm closes.
const MAX_ABANDONED_PER_STEP: usize = 5_000;

impl SaleQueue {
    fn sql(&self) -> SqlStorage {
        self.state.storage().sql()
    }

    fn set(&self, k: &str, v: impl ToString) -> ApiResult<()> {
        self.meta.set(&self.sql(), k, v)
    }

    fn init(&self) -> ApiResult<()> {
        let sql = self.sql();
        self.meta.load(&sql)?;
        for q in [
            "CREATE TABLE IF NOT EXISTS shards (
                shard INTEGER PRIMARY KEY,
                count INTEGER,
                firsts TEXT,
                through INTEGER,
                requests INTEGER NOT NULL DEFAULT 0,
                prequeue INTEGER NOT NULL DEFAULT 0)",
            "CREATE TABLE IF NOT EXISTS turns (
                place INTEGER PRIMARY KEY,
                seen_ms INTEGER NOT NULL,
                held INTEGER NOT NULL)",
            "CREATE TABLE IF NOT EXISTS abandoned (place INTEGER PRIMARY KEY, at_ms INTEGER NOT NULL)",
            // The frozen entrant set in chunks of `freeze::CHUNK` sorted
            // leaves (receipts' audit paths), and the drawn listing in pages
            // of `freeze::CHUNK` `value ‖ leaf` items (places j·CHUNK + 1…).
            "CREATE TABLE IF NOT EXISTS chunks (j INTEGER PRIMARY KEY, first TEXT NOT NULL,
                root TEXT NOT NULL, leaves TEXT NOT NULL)",
            "CREATE TABLE IF NOT EXISTS listing (j INTEGER PRIMARY KEY, items TEXT NOT NULL)",
            "CREATE TABLE IF NOT EXISTS arrivals (
                second INTEGER NOT NULL,
                shard INTEGER NOT NULL,
                n INTEGER NOT NULL,
                stamps TEXT NOT NULL,
                PRIMARY KEY (second, shard))",
        ] {
            sql.exec(q, None).map_err(sql_err)?;
        }
        if self.meta.get("commitment").is_none() {
            let mut seed = [0u8; hash::SEED_BYTES];
            getrandom::fill(&mut seed)
                .map_err(|_| ApiError::new(500, "rng", "CSPRNG unavailable"))?;
            self.set("seed", hex::encode(seed))?;
            self.set("commitment", hash::commitment(&seed))?;
        }
        Ok(())
    }

    fn shards(&self) -> u32 {
        shards::clamp_shards(self.meta.u64("shards").unwrap_or(1))
    }

    fn drawn(&self) -> bool {
        self.meta.flag("drawn")
    }

    /// Refreshes the sale settings from the origin at most once a second.
    async fn ensure_config(&self, sale: &str) -> ApiResult<()> {
        let now = now_ms();
        let have = self.meta.get("starts_at_ms").is_some();
        if have && now.saturating_sub(self.fetched_ms.get()) < CONFIG_REFRESH_MS {
            return Ok(());
        }
        self.fetched_ms.set(now);
        let origin = self
            .env
            .var("ORIGIN_URL")
            .map(|v| v.to_string())
            .unwrap_or_else(|_| "http://127.0.0.1:8080".into());
        let url = format!("{}/api/sales/{}", origin.trim_end_matches('/'), sale);
        let fetched = match worker::Url::parse(&url) {
            Ok(u) => send_with_timeout(Fetch::Url(u), 2_000).await.ok(),
            Err(_) => None,
        };
        let (status, body) = match fetched {
            Some(mut r) => (r.status_code(), r.text().await.unwrap_or_default()),
            None => (0, String::new()),
        };
        if status == 404 {
            return Err(ApiError::sale_not_found(sale));
        }
        let parsed = (status == 200)
            .then(|| serde_json::from_str::<Value>(&body).ok())
            .flatten();
        let Some(v) = parsed else {
            self.sample.set(None);
            return if have {
                Ok(())
            } else {
                Err(ApiError::origin_unavailable())
            };
        };
        self.sample.set(Some(health_sample(&v, now)));
        self.apply_config(&v)
    }

    /// Stores what changed (an unchanged value writes nothing).
    fn apply_config(&self, v: &Value) -> ApiResult<()> {
        let time = |k: &str| {
            v[k].as_str()
                .map(js_sys::Date::parse)
                .filter(|ms| ms.is_finite())
                .map(|ms| ms.max(0.0) as u64)
        };
        let Some(starts) = time("starts_at") else {
            return Err(ApiError::new(502, "origin_error", "sale has no starts_at"));
        };
        // The start is frozen once it has come (the shards draw at it).
        let stored = self.meta.u64("starts_at_ms");
        if stored.is_none_or(|s| now_ms() < s) {
            self.set("starts_at_ms", starts)?;
        }
        match time("ends_at") {
            Some(e) => self.set("ends_at_ms", e)?,
            None => self.meta.delete(&self.sql(), "ends_at_ms")?,
        }
        if self.meta.get("shards").is_none() {
            // Fixed at creation (the origin refuses a change).
            let n = v["queue"]["shards"].as_u64().unwrap_or(1);
            self.set("shards", shards::clamp_shards(n))?;
        }
        let rate = v["admission_rate"]
            .as_f64()
            .filter(|r| r.is_finite() && *r > 0.0);
        self.set("rate", rate.unwrap_or(10.0))?;
        let factor = v["admission_factor"]
            .as_f64()
            .filter(|f| f.is_finite() && *f > 0.0);
        self.set("factor", factor.unwrap_or(2.0))?;
        if let Some(u) = v["units_available"].as_u64() {
            self.set("units_available", u)?;
        }
        let sold_out = v["sold_out"].as_bool() == Some(true)
            || v["phase"].as_str() == Some("sold_out")
            || v["units_available"].as_u64() == Some(0);
        self.set("origin_sold_out", u8::from(sold_out))?;
        let closed = v["phase"].as_str() == Some("ended");
        self.set("closed", u8::from(closed))?;
        self.set("paused", u8::from(v["paused"].as_bool() == Some(true)))?;
        let p99 = v["admission_p99_ms"]
            .as_f64()
            .filter(|p| p.is_finite() && *p > 0.0);
        self.set("p99_ms", p99.unwrap_or(DEFAULT_P99_MS))?;
        // The beacon is the sale's (set at creation); fixed once the set froze.
        if self.meta.get("entrants_root").is_none() {
            match v["draw_beacon"].as_str().filter(|u| !u.is_empty()) {
                Some(u) => self.set("beacon_url", u)?,
                None => self.meta.delete(&self.sql(), "beacon_url")?,
            }
        }
        Ok(())
    }

    fn limits(&self) -> Limits {
        // A bad setting is refused on every request (glue::check_config);
        // here, where no request is answered, it falls back to adaptive.
        let setting = self
            .env
            .var("ADMISSION_CONTROL")
            .ok()
            .map(|v| v.to_string());
        Limits {
            ceiling: self.meta.f64("rate").unwrap_or(10.0),
            p99_target_ms: self.meta.f64("p99_ms").unwrap_or(DEFAULT_P99_MS),
            mode: Mode::from_setting(setting.as_deref()).unwrap_or_default(),
        }
    }

    /// The stored controller (none before the first step after the start).
    fn controller(&self) -> Option<Controller> {
        self.meta
            .get("control")
            .and_then(|c| serde_json::from_str(&c).ok())
    }

    /// One controller step (the alarm's, once a second from the start);
    /// stored, and logged when the reason changes.
    fn step_controller(&self, now: u64) -> ApiResult<()> {
        let limits = self.limits();
        let mut c = self
            .controller()
            .unwrap_or_else(|| Controller::new(limits, now));
        let before = (c.reason, c.rate);
        c.step(limits, now, self.sample.get(), self.meta.flag("paused"));
        if before.0 != c.reason {
            worker::console_log!(
                "admission {}: {:?} -> {:?}, rate {:.2} -> {:.2}/s",
                self.meta.get("sale").unwrap_or_default(),
                before.0,
                c.reason,
                before.1,
                c.rate
            );
            let key = format!("rate_changes_{}", c.reason.label());
            self.set(&key, self.meta.u64(&key).unwrap_or(0) + 1)?;
        }
        self.set("control", serde_json::to_string(&c).unwrap_or_default())
    }

    /// Makes sure the alarm chain runs (a write only when it does not).
    async fn ensure_alarm(&self) -> ApiResult<()> {
        if self.alarm_known.get() || self.meta.get("starts_at_ms").is_none() {
            return Ok(());
        }
        let storage = self.state.storage();
        if storage.get_alarm().await.map_err(sql_err)?.is_none() && !self.meta.flag("closed") {
            let starts = self.meta.u64("starts_at_ms").unwrap_or(0);
            let wait = starts.saturating_sub(now_ms());
            storage.set_alarm(wait as i64).await.map_err(sql_err)?;
        }
        self.alarm_known.set(true);
        Ok(())
    }

    fn sold_out(&self, now: u64) -> bool {
        self.meta.flag("origin_sold_out")
            || self.meta.u64("sold_out_until_ms").is_some_and(|u| now < u)
    }

    /// The frontier's settings; its rate is the controller's (0 while
    /// frozen), the sale's ceiling until the controller's first step.
    fn params(&self) -> Params {
        let ctl = self.controller();
        Params {
            rate: ctl.map_or_else(|| self.limits().ceiling, |c| c.effective_rate()),
            factor: self.meta.f64("factor").unwrap_or(2.0),
            window_ms: ADMIT_TTL_SECS * 1000,
        }
    }

    fn shard_rows(&self) -> ApiResult<Vec<ShardRow>> {
        self.sql()
            .exec(
                "SELECT shard, count, firsts, through, requests, prequeue FROM shards ORDER BY shard",
                None,
            )
            .map_err(sql_err)?
            .to_array::<ShardRow>()
            .map_err(sql_err)
    }

    fn watermarks(&self, rows: &[ShardRow]) -> Watermarks {
        let mut w = Watermarks::new(self.shards());
        for r in rows {
            if let Some(t) = r.through {
                w.record(r.shard as u32, t as u64);
            }
        }
        w
    }

    fn arrivals_before(&self, second: u64) -> ApiResult<u64> {
        Ok(self
            .sql()
            .exec(
                "SELECT SUM(n) AS n FROM arrivals WHERE second < ?",
                Some(vec![(second as f64).into()]),
            )
            .map_err(sql_err)?
            .to_array::<SumRow>()
            .map_err(sql_err)?
            .first()
            .and_then(|r| r.n)
            .unwrap_or(0.0) as u64)
    }

    /// People with a final place: the drawn pre-queue plus the arrivals of
    /// every complete second.
    fn placed(&self, rows: &[ShardRow]) -> ApiResult<(u64, Option<u64>)> {
        if !self.drawn() {
            return Ok((0, None));
        }
        let pre = self.meta.u64("prequeue").unwrap_or(0);
        let complete = self.watermarks(rows).complete_through();
        let after = match complete {
            Some(s) => self.arrivals_before(s + 1)?,
            None => 0,
        };
        Ok((pre + after, complete))
    }

    /// The service clock at wall time `now`: less every frozen ms.
    fn service_ms(&self, now: u64) -> u64 {
        let frozen = self.controller().map_or(0, |c| c.frozen_ms_at(now));
        now.saturating_sub(frozen)
    }

    /// The frontier at `now` (advanced in memory on the service clock; the
    /// alarm stores it), with its cap and rate from here (what isolates
    /// extrapolate by).
    fn frontier_at(&self, now: u64, placed: u64) -> (Frontier, f64, f64) {
        let service = self.service_ms(now);
        let mut f: Frontier = self
            .meta
            .get("frontier")
            .and_then(|f| serde_json::from_str(&f).ok())
            .unwrap_or_default();
        let Some(starts) = self.meta.u64("starts_at_ms") else {
            return (f, 0.0, 0.0);
        };
        let expired = f
            .expired_at(service, self.params().window_ms)
            .floor()
            .max(0.0) as u64;
        let inp = Inputs {
            now_ms: service,
            starts_at_ms: starts,
            placed,
            units_available: self.meta.u64("units_available"),
            sold_out: self.sold_out(now),
            freed: self.freed_after(expired),
        };
        f.advance(self.params(), inp);
        // Never behind what isolates are showing now (a freeze stops this
        // object's clock, not theirs); taken after the advance, so the
        // promise's own time is not added twice.
        let shown = self
            .promises
            .borrow()
            .iter()
            .map(|p| p.at(now))
            .max()
            .unwrap_or(0);
        f.admitted = f.admitted.max(shown.min(placed) as f64);
        let (cap, rate) = f.ceiling(self.params(), inp);
        (f, cap, rate)
    }

    /// The snapshot isolates extrapolate from; notes how far they may go.
    fn snapshot(&self, sale: &str, now: u64) -> ApiResult<Snapshot> {
        let s = self.snapshot_now(sale, now)?;
        let mut promises = self.promises.borrow_mut();
        promises.retain(|p| p.live(now));
        if promises.len() < 256 {
            promises.push(status::Promise::of(&s));
        }
        Ok(s)
    }

    fn snapshot_now(&self, sale: &str, now: u64) -> ApiResult<Snapshot> {
        let rows = self.shard_rows()?;
        let (placed, complete) = self.placed(&rows)?;
        let (f, cap, rate) = self.frontier_at(now, placed);
        let p = self.params();
        let service = self.service_ms(now);
        let ctl = self.controller();
        let drawn = self.drawn();
        let reported_pre: u64 = rows.iter().map(|r| r.prequeue as u64).sum();
        let prequeue = if drawn {
            self.meta.u64("prequeue").unwrap_or(0)
        } else {
            reported_pre
        };
        let all_arrivals = self.arrivals_before(u64::MAX)?;
        let shard_requests: u64 = rows.iter().map(|r| r.requests as u64).sum();
        Ok(Snapshot {
            sale: sale.to_string(),
            now_ms: now,
            starts_at_ms: self.meta.u64("starts_at_ms").unwrap_or(0),
            ends_at_ms: self.meta.u64("ends_at_ms"),
            // The rate people move at now (for the ETA): the controller's.
            rate: ctl.as_ref().map_or(p.rate, |c| c.rate),
            drawn,
            entries: prequeue + all_arrivals,
            prequeue,
            placed,
            frontier: f.admitted_places(),
            expired: f.expired_at(service, p.window_ms).floor().max(0.0) as u64,
            sold_out: self.sold_out(now),
            closed: self.meta.flag("closed"),
            commitment: self.meta.get("commitment").unwrap_or_default(),
            seed: if drawn { self.meta.get("seed") } else { None },
            key: if drawn { self.meta.get("key") } else { None },
            draw: self.draw_public(),
            do_requests: self.requests.get() + shard_requests,
            shards: self.shards(),
            fifo_through_ms: complete.map(|s| (s + 1) * 1000).unwrap_or(0),
            frontier_rate: rate,
            frontier_cap: cap.floor().max(0.0) as u64,
            frontier_history: f
                .checkpoints
                .iter()
                .filter(|(t, _)| service.saturating_sub(*t) < p.window_ms)
                .copied()
                .collect(),
            service_ms: Some(service),
            frozen: ctl.as_ref().is_some_and(|c| c.frozen),
            paused: self.meta.flag("paused"),
            abandoned: self
                .abandoned_after(f.expired_at(service, p.window_ms).floor().max(0.0) as u64)?,
        })
    }

    /// What operators see of admission (`metrics::render` formats it).
    fn figures(&self, sale: &str, now: u64) -> ApiResult<AdmissionFigures> {
        let snap = self.snapshot(sale, now)?;
        let ctl = self.controller();
        let ceiling = self.limits().ceiling;
        Ok(AdmissionFigures {
            admitted: snap.frontier,
            windows_ended: snap.expired,
            abandoned: self.meta.u64("abandoned").unwrap_or(0),
            placed: snap.placed,
            waiting: snap.placed.saturating_sub(snap.frontier),
            rate: ctl.as_ref().map_or(ceiling, |c| c.rate),
            ceiling,
            frozen: snap.frozen,
            paused: snap.paused,
            reason: ctl.as_ref().map_or(Reason::Start, |c| c.reason),
            frozen_ms: ctl.as_ref().map_or(0, |c| c.frozen_ms_at(now)),
            rate_changes: Reason::ALL
                .iter()
                .filter_map(|r| {
                    self.meta
                        .u64(&format!("rate_changes_{}", r.label()))
                        .map(|n| (*r, n))
                })
                .collect(),
        })
    }

    /// Abandoned places above `expired` (their windows are still open),
    /// ascending.
    /// Admitted places in open windows (`> expired`) that no longer need a
    /// share of the inventory cap: turns given back (abandoned), and people
    /// who made a reservation (their unit has already left `units
    /// available`; counting them too would shrink the cap twice and stall
    /// the frontier near the end of a sale).
    fn freed_after(&self, expired: u64) -> u64 {
        let held = self
            .sql()
            .exec(
                "SELECT count(*) AS n FROM turns WHERE place > ? AND held = 1",
                Some(vec![(expired as f64).into()]),
            )
            .and_then(|c| c.one::<CountRow>())
            .map_or(0, |r| r.n.max(0.0) as u64);
        let abandoned = self.abandoned_after(expired).map_or(0, |v| v.len() as u64);
        held + abandoned
    }

    fn abandoned_after(&self, expired: u64) -> ApiResult<Vec<u64>> {
        Ok(self
            .sql()
            .exec(
                "SELECT place FROM abandoned WHERE place > ? ORDER BY place LIMIT ?",
                Some(vec![
                    (expired as f64).into(),
                    (MAX_ABANDONED_LISTED as f64).into(),
                ]),
            )
            .map_err(sql_err)?
            .to_array::<PlaceRow>()
            .map_err(sql_err)?
            .into_iter()
            .map(|r| r.place as u64)
            .collect())
    }

    /// Closes the turns of admitted people not seen for 30 s who hold
    /// nothing (`turns::newly_abandoned`); the alarm's, after the frontier
    /// is stored.
    fn close_abandoned(&self, f: &Frontier, now: u64) -> ApiResult<()> {
        let service = self.service_ms(now);
        let window = self.params().window_ms;
        let expired = f.expired_at(service, window).floor().max(0.0) as u64;
        let frontier = f.admitted_places();
        if frontier <= expired {
            return Ok(());
        }
        let sql = self.sql();
        let turns: HashMap<u64, Turn> = sql
            .exec(
                "SELECT place, seen_ms, held FROM turns WHERE place > ? AND place <= ?",
                Some(vec![(expired as f64).into(), (frontier as f64).into()]),
            )
            .map_err(sql_err)?
            .to_array::<TurnRow>()
            .map_err(sql_err)?
            .into_iter()
            .map(|r| {
                let t = Turn {
                    seen_ms: r.seen_ms as u64,
                    held: r.held as u64 == 1,
                };
                (r.place as u64, t)
            })
            .collect();
        let already: HashSet<u64> = self.abandoned_after(expired)?.into_iter().collect();
        let frozen = self.controller().is_some_and(|c| c.frozen);
        let lost = turns::newly_abandoned(
            turns::Now {
                history: &f.checkpoints,
                expired,
                frontier,
                service_ms: service,
                wall_ms: now,
                frozen,
            },
            &turns,
            &already,
            MAX_ABANDONED_PER_STEP,
        );
        for p in &lost {
            sql.exec(
                "INSERT OR IGNORE INTO abandoned (place, at_ms) VALUES (?, ?)",
                Some(vec![(*p as f64).into(), (now as f64).into()]),
            )
            .map_err(sql_err)?;
        }
        if !lost.is_empty() {
            let n = self.meta.u64("abandoned").unwrap_or(0) + lost.len() as u64;
            self.set("abandoned", n)?;
        }
        Ok(())
    }

    fn upsert_shard(&self, shard: u32, requests: u64) -> ApiResult<()> {
        self.sql()
            .exec(
                "INSERT INTO shards (shard, requests) VALUES (?, ?)
                 ON CONFLICT(shard) DO UPDATE SET requests = excluded.requests",
                Some(vec![(shard as f64).into(), (requests as f64).into()]),
            )
            .map_err(sql_err)?;
        Ok(())
    }

    fn record_drawn(&self, d: Drawn, now: u64) -> ApiResult<Value> {
        if d.shard >= self.shards() {
            return Err(ApiError::new(400, "bad_request", "no such shard"));
        }
        self.upsert_shard(d.shard, d.requests)?;
        let index = ShardIndex {
            count: d.count,
            firsts: d.firsts,
        };
        self.sql()
            .exec(
                "UPDATE shards SET count = ?, firsts = ? WHERE shard = ? AND count IS NULL",
                Some(vec![
                    (index.count as f64).into(),
                    serde_json::to_string(&index.firsts)
                        .unwrap_or_default()
                        .as_str()
                        .into(),
                    (d.shard as f64).into(),
                ]),
            )
            .map_err(sql_err)?;
        let rows = self.shard_rows()?;
        let done: Vec<&ShardRow> = rows.iter().filter(|r| r.count.is_some()).collect();
        if !self.drawn() && done.len() as u32 == self.shards() {
            let total: u64 = done.iter().map(|r| r.count.unwrap_or(0.0) as u64).sum();
            self.set("prequeue", total)?;
            self.set("drawn_at_ms", now)?;
            self.set("drawn", 1)?;
        }
        Ok(json!({"ok": true}))
    }

    fn record_report(&self, r: Report) -> ApiResult<Value> {
        if r.shard >= self.shards() {
            return Err(ApiError::new(400, "bad_request", "no such shard"));
        }
        self.upsert_shard(r.shard, r.requests)?;
        let sql = self.sql();
        if let Some(p) = r.prequeue {
            sql.exec(
                "UPDATE shards SET prequeue = ? WHERE shard = ?",
                Some(vec![(p as f64).into(), (r.shard as f64).into()]),
            )
            .map_err(sql_err)?;
        }
        for s in &r.seconds {
            if s.shard != r.shard {
                continue;
            }
            sql.exec(
                "INSERT OR REPLACE INTO arrivals (second, shard, n, stamps) VALUES (?, ?, ?, ?)",
                Some(vec![
                    (s.second as f64).into(),
                    (s.shard as f64).into(),
                    (s.stamps.len() as f64).into(),
                    serde_json::to_string(&s.stamps)
                        .unwrap_or_default()
                        .as_str()
                        .into(),
                ]),
            )
            .map_err(sql_err)?;
        }
        for (place, seen, held) in &r.turns {
            sql.exec(
                "INSERT INTO turns (place, seen_ms, held) VALUES (?, ?, ?)
                 ON CONFLICT(place) DO UPDATE SET seen_ms = MAX(seen_ms, excluded.seen_ms),
                     held = MAX(held, excluded.held)",
                Some(vec![
                    (*place as f64).into(),
                    (*seen as f64).into(),
                    i64::from(*held).into(),
                ]),
            )
            .map_err(sql_err)?;
        }
        if let Some(t) = r.through {
            sql.exec(
                "UPDATE shards SET through = MAX(COALESCE(through, 0), ?) WHERE shard = ?",
                Some(vec![(t as f64).into(), (r.shard as f64).into()]),
            )
            .map_err(sql_err)?;
        }
        Ok(json!({"ok": true}))
    }

    fn index(&self) -> ApiResult<Value> {
        if !self.drawn() {
            return Err(ApiError::new(409, "not_drawn", "not drawn yet"));
        }
        let shards: Vec<ShardIndex> = self
            .shard_rows()?
            .into_iter()
            .map(|r| ShardIndex {
                count: r.count.unwrap_or(0.0) as u64,
                firsts: r
                    .firsts
                    .and_then(|f| serde_json::from_str(&f).ok())
                    .unwrap_or_default(),
            })
            .collect();
        Ok(json!({"shards": shards, "key": self.meta.get("key")}))
    }

    fn arrivals(&self, url: &worker::Url) -> ApiResult<Value> {
        let second = query(url, "s")
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or_else(|| ApiError::new(400, "bad_request", "s missing"))?;
        let rows = self.shard_rows()?;
        let complete = self
            .watermarks(&rows)
            .complete_through()
            .is_some_and(|c| second <= c);
        let mut arrivals = Vec::new();
        for r in self
            .sql()
            .exec(
                "SELECT shard, stamps FROM arrivals WHERE second = ?",
                Some(vec![(second as f64).into()]),
            )
            .map_err(sql_err)?
            .to_array::<ArrivalRow>()
            .map_err(sql_err)?
        {
            let stamps: Vec<(u64, u64)> = serde_json::from_str(&r.stamps).unwrap_or_default();
            arrivals.extend(stamps.into_iter().map(|(t_ms, seq)| Arrival {
                t_ms,
                shard: r.shard as u32,
                seq,
            }));
        }
        let out = SecondArrivals {
            second,
            before: self.arrivals_before(second)?,
            complete,
            arrivals,
        };
        Ok(json!({"arrivals": out, "prequeue": self.meta.u64("prequeue").unwrap_or(0)}))
    }

    /// The draw as published (DESIGN.md "The draw, v2"): each part once
    /// known, the seed once drawn.
    fn draw_public(&self) -> Value {
        let get = |k: &str| self.meta.get(k);
        let beacon = match get("beacon_url") {
            None => json!("none"),
            Some(url) => json!({
                "url": url,
                "round": self.meta.u64("beacon_round"),
                "value": get("beacon_value"),
                "missed": self.meta.flag("beacon_missed"),
            }),
        };
        let drawn = self.drawn();
        json!({
            "version": 2,
            "commitment": get("commitment"),
            "method": hash::METHOD,
            "entrants": self.meta.u64("entrants"),
            "entrants_root": get("entrants_root"),
            "beacon": beacon,
            "key": if drawn { get("key") } else { None },
            "seed": if drawn { get("seed") } else { None },
            "listed": self.meta.flag("listed"),
        })
    }

    /// Asks every shard in `wants` for its page after the cursor (all at
    /// once); `None` when a shard is not ready (not frozen / not drawn).
    async fn fetch_pages<T: Item>(
        &self,
        sale: &str,
        path: &str,
        field: &str,
        wants: Vec<crate::draw::freeze::Want>,
        pages: &mut [Page<T>],
    ) -> ApiResult<bool> {
        let calls = wants.iter().map(|w| {
            let name = shards::object_name(sale, w.shard as u32);
            let q = format!(
                "{path}?after={}&limit={DRAW_PAGE}",
                w.after.clone().unwrap_or_default()
            );
            let env = &self.env;
            async move { call_object(env, "QUEUE_SHARD", &name, sale, Method::Get, &q, None).await }
        });
        let got = futures::future::join_all(calls).await;
        for (w, r) in wants.iter().zip(got) {
            let v = match r {
                Ok(v) => v,
                Err(e) if e.status == 409 => return Ok(false),
                Err(e) => return Err(e),
            };
            let items: Vec<T> = v[field]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|x| x.as_str().and_then(T::from_hex))
                        .collect()
                })
                .unwrap_or_default();
            pages[w.shard].extend(items, DRAW_PAGE);
        }
        Ok(true)
    }

    /// One bounded merge step over every shard's sorted pages of `path`
    /// (`field` in the answer), resumed from the state stored under
    /// `state_key`; each completed chunk goes to `put`. Returns the state
    /// after the step, or `None` when a shard is not ready yet.
    async fn merge_step<T: Item>(
        &self,
        sale: &str,
        (state_key, path, field): (&str, &str, &str),
        held: &RefCell<Vec<Page<T>>>,
        put: impl Fn(&Self, &crate::draw::freeze::Chunk<T>) -> ApiResult<()>,
    ) -> ApiResult<Option<Freeze<T>>> {
        let n = self.shards() as usize;
        let mut f: Freeze<T> = self
            .meta
            .get(state_key)
            .and_then(|x| serde_json::from_str(&x).ok())
            .unwrap_or_else(|| Freeze::start(n as u32));
        let mut pages = std::mem::take(&mut *held.borrow_mut());
        pages.resize_with(n, Page::default);
        let wants = f.wants(&pages, DRAW_PAGE / 2);
        let ready = self.fetch_pages(sale, path, field, wants, &mut pages).await;
        let merged = match ready {
            Ok(true) => f.merge(&mut pages, DRAW_MAX_OUT),
            other => {
                *held.borrow_mut() = pages;
                return other.map(|_| None);
            }
        };
        let Some(merged) = merged else {
            // A stored state that does not add up: start this merge over
            // (its chunks are rewritten by index).
            worker::console_error!("{state_key} state unreadable: starting over");
            self.meta.delete(&self.sql(), state_key)?;
            return Ok(Some(Freeze::start(n as u32)));
        };
        for c in &merged.chunks {
            put(self, c)?;
        }
        self.set(state_key, serde_json::to_string(&f).unwrap_or_default())?;
        *held.borrow_mut() = pages;
        Ok(Some(f))
    }

    /// One bounded step of the draw v2 at the coordinator, in the order
    /// `phases::next` gives: the freeze (merge every shard's sorted
    /// leaves into the Merkle tree, in chunks), the beacon and the key;
    /// then, once every shard has drawn with that key, the listing (merge
    /// every shard's values). Returns whether more can be done at once (the
    /// alarm comes back at once, else in a second). Each step's state is
    /// stored before the next, so an evicted object resumes; nothing here
    /// runs in a request.
    async fn draw_step(&self, sale: &str, now: u64) -> ApiResult<bool> {
        let starts = self.meta.u64("starts_at_ms").unwrap_or(u64::MAX);
        let facts = phases::Facts {
            now_ms: now,
            freeze_at_ms: starts.saturating_add(crate::draw::phases::DRAW_GRACE_MS),
            frozen: self.meta.get("entrants_root").is_some(),
            keyed: self.meta.get("key").is_some(),
            drawn: self.drawn(),
            drawn_at_ms: self.meta.u64("drawn_at_ms").unwrap_or(0),
            listed: self.meta.flag("listed"),
        };
        match phases::next(&facts) {
            Phase::Wait | Phase::Done => Ok(false),
            Phase::Freeze => {
                let put = |q: &Self, c: &crate::draw::freeze::Chunk<hash::Hash>| {
                    let leaves: Vec<String> = c.leaves.iter().map(Item::to_hex).collect();
                    q.sql()
                        .exec(
                            "INSERT OR REPLACE INTO chunks (j, first, root, leaves) VALUES (?, ?, ?, ?)",
                            Some(vec![
                                (c.index as f64).into(),
                                leaves.first().cloned().unwrap_or_default().into(),
                                hash::to_hex_hash(&c.root).into(),
                                serde_json::to_string(&leaves).unwrap_or_default().into(),
                            ]),
                        )
                        .map(|_| ())
                        .map_err(sql_err)
                };
                let Some(f) = self
                    .merge_step(sale, ("freeze", "/leaves", "leaves"), &self.leaf_pages, put)
                    .await?
                else {
                    return Ok(false);
                };
                if let Some(root) = &f.root {
                    self.set("entrants", f.merged)?;
                    self.set("frozen_at_ms", now)?;
                    self.set("entrants_root", root)?;
                }
                Ok(true)
            }
            Phase::Key => {
                let beacon = match self.meta.get("beacon_url") {
                    None => Vec::new(),
                    Some(url) => match self.beacon_step(&url, starts, now).await? {
                        Some(b) => b,
                        None => return Ok(false),
                    },
                };
                let (Some(seed), Some(root)) = (
                    self.meta.get("seed").and_then(|x| hex::decode(x).ok()),
                    self.meta
                        .get("entrants_root")
                        .and_then(|x| ::draw::from_hex(&x)),
                ) else {
                    return Err(ApiError::new(
                        500,
                        "queue_storage",
                        "seed or root unreadable",
                    ));
                };
                self.set(
                    "key",
                    hash::to_hex_hash(&::draw::key(&seed, &root, &beacon)),
                )?;
                // The shards waiting for the key are woken now.
                self.poked_ms.set(0);
                Ok(false)
            }
            Phase::List => {
                let put = |q: &Self, c: &crate::draw::freeze::Chunk<[u8; 64]>| {
                    let items: Vec<String> = c.leaves.iter().map(Item::to_hex).collect();
                    q.sql()
                        .exec(
                            "INSERT OR REPLACE INTO listing (j, items) VALUES (?, ?)",
                            Some(vec![
                                (c.index as f64).into(),
                                serde_json::to_string(&items).unwrap_or_default().into(),
                            ]),
                        )
                        .map(|_| ())
                        .map_err(sql_err)
                };
                let Some(f) = self
                    .merge_step(sale, ("listing", "/ranked", "items"), &self.rank_pages, put)
                    .await?
                else {
                    return Ok(false);
                };
                if !f.is_done() {
                    // Paced: the listing is published for audits, nobody
                    // waits on it, and back-to-back merge steps would keep
                    // every request to this object (snapshot refreshes, the
                    // index for first polls) queued behind them.
                    self.next_step_ms.set(LISTING_STEP_GAP_MS);
                    return Ok(true);
                }
                if f.merged == self.meta.u64("entrants").unwrap_or(0) {
                    self.set("listed", 1)?;
                } else {
                    // Shards drew another set than the one frozen: never
                    // publish it.
                    worker::console_error!(
                        "listing has {} entries, the frozen set {:?}",
                        f.merged,
                        self.meta.u64("entrants")
                    );
                }
                Ok(false)
            }
        }
    }

    /// The beacon's value for the sale's round, once it can be had; an
    /// empty value once it is given up (the summary says `missed`); `None`:
    /// not yet.
    async fn beacon_step(&self, url: &str, starts: u64, now: u64) -> ApiResult<Option<Vec<u8>>> {
        if let Some(v) = self.meta.get("beacon_value") {
            return Ok(Some(hex::decode(v).unwrap_or_default()));
        }
        if self.meta.flag("beacon_missed") {
            return Ok(Some(Vec::new()));
        }
        let base = url.trim_end_matches('/');
        let info = self
            .meta
            .u64("beacon_genesis")
            .zip(self.meta.u64("beacon_period"));
        let frozen = self.meta.u64("frozen_at_ms").unwrap_or(now);
        let wait = hash::beacon_wait_ms(
            self.env
                .var("DRAW_BEACON_WAIT_SECS")
                .ok()
                .map(|v| v.to_string())
                .as_deref(),
        );
        match hash::beacon_next(now, starts, frozen, info, wait) {
            BeaconNext::Info => {
                if let Some(v) = get_json(&format!("{base}/info")).await
                    && let (Some(g), Some(p)) = (v["genesis_time"].as_u64(), v["period"].as_u64())
                    && p > 0
                {
                    self.set("beacon_genesis", g)?;
                    self.set("beacon_period", p)?;
                    if let Some(r) = ::draw::beacon_round(g, p, starts.div_ceil(1000)) {
                        self.set("beacon_round", r)?;
                    }
                }
                Ok(None)
            }
            BeaconNext::WaitUntil(_) => Ok(None),
            BeaconNext::Fetch(round) => {
                let v = get_json(&format!("{base}/public/{round}")).await;
                let value = v.as_ref().and_then(|v| {
                    (v["round"].as_u64() == Some(round))
                        .then(|| v["randomness"].as_str().and_then(|x| hex::decode(x).ok()))
                        .flatten()
                        .filter(|b| !b.is_empty())
                });
                match value {
                    Some(b) => {
                        self.set("beacon_value", hex::encode(&b))?;
                        Ok(Some(b))
                    }
                    None => Ok(None),
                }
            }
            BeaconNext::GiveUp => {
                worker::console_error!("beacon {base} did not answer in time: drawing without it");
                self.set("beacon_missed", 1)?;
                Ok(Some(Vec::new()))
            }
        }
    }

    /// A receipt's `(leaf_index, audit_path)` for `leaf`, from the stored
    /// chunks of the frozen set.
    fn proof(&self, url: &worker::Url) -> ApiResult<Value> {
        let leaf = query(url, "leaf")
            .and_then(|l| ::draw::from_hex(&l))
            .ok_or_else(|| ApiError::new(400, "bad_request", "leaf must be 64 hex digits"))?;
        let entrants = self
            .meta
            .u64("entrants")
            .filter(|_| self.meta.get("entrants_root").is_some())
            .ok_or_else(|| ApiError::new(409, "not_frozen", "the entrant set is not frozen yet"))?;
        let rows = self
            .sql()
            .exec("SELECT first, root FROM chunks ORDER BY j", None)
            .map_err(sql_err)?
            .to_array::<ChunkRow>()
            .map_err(sql_err)?;
        let index = ChunkIndex {
            entrants,
            firsts: rows.iter().map(|r| r.first.clone()).collect(),
            roots: rows.into_iter().map(|r| r.root).collect(),
        };
        let missing = || ApiError::new(404, "not_in_draw", "this leaf is not in the frozen set");
        let j = index
            .chunk_of(&hash::to_hex_hash(&leaf))
            .ok_or_else(missing)?;
        let chunk: Vec<hash::Hash> = self
            .sql()
            .exec(
                "SELECT leaves FROM chunks WHERE j = ?",
                Some(vec![(j as f64).into()]),
            )
            .map_err(sql_err)?
            .to_array::<LeavesRow>()
            .map_err(sql_err)?
            .into_iter()
            .next()
            .and_then(|r| serde_json::from_str::<Vec<String>>(&r.leaves).ok())
            .map(|v| v.iter().filter_map(|x| ::draw::from_hex(x)).collect())
            .unwrap_or_default();
        let (at, path) = index.locate(&leaf, &chunk).ok_or_else(missing)?;
        Ok(json!({
            "leaf_index": at,
            "audit_path": path.iter().map(hash::to_hex_hash).collect::<Vec<_>>(),
            "entrants": entrants,
        }))
    }

    /// Places `from .. from + limit` of the drawn listing: `{place, leaf,
    /// value}` (immutable once listed).
    fn listing(&self, url: &worker::Url) -> ApiResult<Value> {
        if !self.meta.flag("listed") {
            return Err(ApiError::new(
                409,
                "not_drawn",
                "the draw is not listed yet",
            ));
        }
        let n = self.meta.u64("entrants").unwrap_or(0);
        let num = |k: &str| query(url, k).and_then(|v| v.parse::<u64>().ok());
        let from = num("from").filter(|f| *f >= 1).unwrap_or(1);
        let limit = num("limit").unwrap_or(LISTING_MAX).clamp(1, LISTING_MAX);
        let last = (from + limit - 1).min(n);
        let mut entries = Vec::new();
        if from <= n {
            let c = CHUNK as u64;
            let rows = self
                .sql()
                .exec(
                    "SELECT j, items FROM listing WHERE j >= ? AND j <= ? ORDER BY j",
                    Some(vec![
                        (((from - 1) / c) as f64).into(),
                        (((last - 1) / c) as f64).into(),
                    ]),
                )
                .map_err(sql_err)?
                .to_array::<ItemsRow>()
                .map_err(sql_err)?;
            for r in rows {
                let items: Vec<String> = serde_json::from_str(&r.items).unwrap_or_default();
                for (i, it) in items.iter().enumerate() {
                    let place = r.j as u64 * c + i as u64 + 1;
                    if (from..=last).contains(&place) && it.len() == 128 {
                        entries
                            .push(json!({"place": place, "value": &it[..64], "leaf": &it[64..]}));
                    }
                }
            }
        }
        Ok(json!({"entries": entries}))
    }

    fn draw_header(&self) -> ApiResult<Value> {
        let drawn = self.drawn();
        let mut body = self.draw_public();
        body["drawn"] = json!(drawn);
        body["shards"] = json!(self.shards());
        if drawn {
            let rows = self.shard_rows()?;
            body["drawn_at_ms"] = json!(self.meta.u64("drawn_at_ms"));
            body["prequeue"] = json!(self.meta.u64("prequeue"));
            body["per_shard"] = rows
                .iter()
                .map(|r| {
                    let count = r.count.unwrap_or(0.0) as u64;
                    json!({"shard": r.shard as u64, "count": count,
                           "buckets": count.div_ceil(BUCKET_SIZE as u64)})
                })
                .collect();
        }
        Ok(body)
    }

    async fn handle(&self, req: &mut Request) -> ApiResult<Value> {
        let sale = req
            .headers()
            .get("x-sale")
            .ok()
            .flatten()
            .filter(|s| routes::valid_id(s))
            .ok_or_else(|| ApiError::new(400, "bad_request", "x-sale missing"))?;
        self.set("sale", &sale)?;
        let url = req.url().map_err(|_| ApiError::not_found())?;
        if !matches!(url.path(), "/key" | "/drawn" | "/report") {
            // Calls from isolates (what the benchmark counts), not shards'.
            self.requests.set(self.requests.get() + 1);
        }
        self.ensure_config(&sale).await?;
        self.ensure_alarm().await?;
        let now = now_ms();
        let bad = |_| ApiError::new(400, "bad_request", "bad body");
        match (req.method(), url.path()) {
            (Method::Get, "/snapshot") => {
                Ok(serde_json::to_value(self.snapshot(&sale, now)?).unwrap_or(Value::Null))
            }
            (Method::Post, "/sold_out") => {
                self.set("sold_out_until_ms", now + SOLD_OUT_HINT_MS)?;
                Ok(serde_json::to_value(self.snapshot(&sale, now)?).unwrap_or(Value::Null))
            }
            (Method::Get, "/key") => match self.meta.get("key") {
                Some(k) => Ok(json!({"key": k})),
                None => Err(ApiError::new(
                    409,
                    "key_pending",
                    "the key needs the frozen set and the beacon",
                )),
            },
            (Method::Get, "/proof") => self.proof(&url),
            (Method::Get, "/listing") => self.listing(&url),
            (Method::Post, "/drawn") => {
                let d: Drawn = req.json().await.map_err(bad)?;
                self.record_drawn(d, now)
            }
            (Method::Post, "/report") => {
                let r: Report = req.json().await.map_err(bad)?;
                self.record_report(r)
            }
            (Method::Get, "/index") => self.index(),
            (Method::Get, "/arrivals") => self.arrivals(&url),
            (Method::Get, "/draw") => self.draw_header(),
            (Method::Get, "/metrics") => {
                Ok(serde_json::to_value(self.figures(&sale, now)?).unwrap_or(Value::Null))
            }
            _ => Err(ApiError::not_found()),
        }
    }

    /// Wakes the shards that have not sent their index (nobody joined
    /// them, or they were evicted between steps).
    async fn poke_shards(&self, sale: &str) {
        let Ok(rows) = self.shard_rows() else { return };
        let body = |k: u32| {
            json!({"sub": "-", "shard": k, "shards": self.shards(),
                   "starts_at_ms": self.meta.u64("starts_at_ms"),
                   "ends_at_ms": self.meta.u64("ends_at_ms")})
        };
        for k in 0..self.shards() {
            let drawn = rows
                .iter()
                .any(|r| r.shard as u32 == k && r.count.is_some());
            if !drawn {
                let name = shards::object_name(sale, k);
                let _ = call_object(
                    &self.env,
                    "QUEUE_SHARD",
                    &name,
                    sale,
                    Method::Post,
                    "/poke",
                    Some(&body(k)),
                )
                .await;
            }
        }
    }
}

/// The controller's sample from an origin summary fetched at `now`: its
/// `health` (an origin without one counts as healthy: it answered).
/// GET `url` as JSON within 2 s (the beacon); `None` on any failure.
async fn get_json(url: &str) -> Option<Value> {
    let u = worker::Url::parse(url).ok()?;
    let mut r = send_with_timeout(Fetch::Url(u), 2_000).await.ok()?;
    if r.status_code() != 200 {
        return None;
    }
    serde_json::from_str(&r.text().await.ok()?).ok()
}

fn health_sample(v: &Value, now: u64) -> Sample {
    let h = &v["health"];
    let share = |k: &str| h[k].as_f64().filter(|x| x.is_finite()).unwrap_or(0.0);
    Sample {
        at_ms: now,
        shed_share: share("shed_share"),
        error_share: share("error_share"),
        p99_ms: share("p99_ms"),
    }
}

impl DurableObject for SaleQueue {
    fn new(state: State, env: Env) -> Self {
        let q = SaleQueue {
            state,
            env,
            meta: Meta::default(),
            fetched_ms: Cell::new(0),
            requests: Cell::new(0),
            alarm_known: Cell::new(false),
            sample: Cell::new(None),
            promises: RefCell::new(Vec::new()),
            leaf_pages: RefCell::new(Vec::new()),
            rank_pages: RefCell::new(Vec::new()),
            poked_ms: Cell::new(0),
            next_step_ms: Cell::new(0),
        };
        if let Err(e) = q.init() {
            worker::console_error!("sale queue init: {}", e.message);
        }
        q
    }

    async fn fetch(&self, mut req: Request) -> Result<Response> {
        respond(self.handle(&mut req).await)
    }

    /// Once a second from the start: refresh settings, store the frontier
    /// checkpoint, wake shards that have not drawn.
    async fn alarm(&self) -> Result<Response> {
        let Some(sale) = self.meta.get("sale") else {
            return Response::ok("no sale");
        };
        if let Err(e) = self.ensure_config(&sale).await {
            worker::console_error!("coordinator config: {}", e.message);
        }
        let now = now_ms();
        let starts = self.meta.u64("starts_at_ms").unwrap_or(u64::MAX);
        let storage = self.state.storage();
        if now < starts {
            storage.set_alarm(starts.saturating_sub(now) as i64).await?;
            return Response::ok("waiting");
        }
        if !self.drawn() && now.saturating_sub(self.poked_ms.get()) >= 1_000 {
            self.poked_ms.set(now);
            self.poke_shards(&sale).await;
        }
        let more = match self.draw_step(&sale, now).await {
            Ok(m) => m,
            Err(e) => {
                worker::console_error!("draw step: {}", e.message);
                false
            }
        };
        if let Err(e) = self.step_controller(now) {
            worker::console_error!("admission controller: {}", e.message);
        }
        match self.shard_rows().and_then(|rows| self.placed(&rows)) {
            Ok((placed, _)) => {
                let (f, _, _) = self.frontier_at(now, placed);
                if let Err(e) = self.set("frontier", serde_json::to_string(&f).unwrap_or_default())
                {
                    worker::console_error!("frontier: {}", e.message);
                }
                if let Err(e) = self.close_abandoned(&f, now) {
                    worker::console_error!("abandoned turns: {}", e.message);
                }
            }
            Err(e) => worker::console_error!("frontier: {}", e.message),
        }
        if more {
            // The next draw step at once (the listing's after a short gap):
            // requests queued meanwhile go first.
            storage
                .set_alarm(self.next_step_ms.replace(0) as i64)
                .await?;
        } else if !self.meta.flag("closed") {
            storage.set_alarm(1_000i64).await?;
        } else {
            self.alarm_known.set(false);
        }
        Response::ok("ok")
    }
}
