//! A sale's queue coordinator's logic (plain Rust, host-tested): what the
//! `SaleQueue` object decides, over the objects' SQL ([`Sql`]) and an
//! [`Io`] for the little it asks of the world (its shards' pages, the
//! beacon, a log line). The object (`objects::sale_queue`) only reads
//! requests, fetches the origin's summary, keeps the clock and the alarm.
//! The entries themselves live in the sale's shards (`queue::entries`).
//!
//! Role: holds the sale's draw seed (commitment published before anyone
//! joins, seed after the draw), the admission frontier (a checkpoint plus a
//! rate, advanced by the alarm once a second), every shard's draw index and
//! the shards' per-second arrival reports; answers the Worker's snapshot
//! (cached ≤ 1 s per isolate) and the immutable pieces places are computed
//! from (`/index`, `/arrivals`).
//!
//! Invariants kept here:
//! - the seed is drawn from the CSPRNG the first time the object runs and
//!   is given to nobody before the draw (the shards get only the key,
//!   which needs the frozen set's root and the beacon too);
//! - snapshot and read requests commit nothing: the frontier they show is
//!   the stored checkpoint advanced in memory; only the alarm, shard
//!   reports and the sold-out hint write;
//! - the sale counts as drawn once every shard has sent its index; a second
//!   of arrivals is complete once every shard has reported it, and what is
//!   served for a complete second never changes;
//! - when the origin's summary cannot be had the last stored settings
//!   stand;
//! - the frontier moves at the admission controller's rate
//!   (`admission::control::Controller`, stepped by the alarm once a second
//!   with the origin's `health` and the sale's `paused` flag) on the
//!   service clock, which stands still while the controller is frozen: no
//!   one is admitted while the origin does not answer or the sale is
//!   paused, and every open window is extended by the freeze; nor does it
//!   pass the sale's remaining units (`admission::frontier`), or move once
//!   the sale is sold out;
//! - abandoned turns (issue 13 #4): the shards report when admitted people
//!   were last seen and who made a reservation; the alarm closes the turns
//!   of people not seen for 30 s who hold nothing (`admission::turns`),
//!   once and for good, and their share of the inventory cap goes to the
//!   next people.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};

use serde::Deserialize;
use serde_json::{Value, json};

use crate::admission::control::{Controller, Limits, Mode, Reason, Sample};
use crate::admission::frontier::{Frontier, Inputs, Params};
use crate::admission::turns::{self, Turn};
use crate::api::error::{ApiError, ApiResult};
use crate::api::metrics::AdmissionFigures;
use crate::draw::freeze::{CHUNK, ChunkIndex, Freeze, Item, LISTING_MAX, Page};
use crate::draw::hash::{self, BeaconNext};
use crate::draw::index::{BUCKET_SIZE, ShardIndex};
use crate::draw::phases::{self, Phase};
use crate::queue::entries::TurnRow;
use crate::queue::places::{Arrival, SecondArrivals, SecondReport, Watermarks};
use crate::queue::shards;
use crate::queue::status::{self, ADMIT_TTL_SECS, Snapshot};
use crate::store::sql::{Meta, Sql, SqlValue};

/// The sale's p99 target when the origin names none (DESIGN default).
const DEFAULT_P99_MS: f64 = 50.0;
/// How long the sold-out hint of a reservation's 410 stands.
pub const SOLD_OUT_HINT_MS: u64 = 3_000;
/// Leaves (or listing items) asked of a shard at once, and the most one
/// draw step merges. Small steps, because in `wrangler dev` every object
/// shares one thread and polls queue behind whole steps: with 1,024 / 8,192
/// the 200,000-entrant benchmark's slowest poll waited 2.5 s (45 of 2,206
/// over 1 s), with 512 / 2,048 1.5 s (1 of 2,761), the draw done 20 s after
/// the start either way (BENCHMARKS.md).
pub const DRAW_PAGE: usize = 512;
const DRAW_MAX_OUT: usize = 2_048;
/// Time between two merge steps of the listing (see `draw_step`).
const LISTING_STEP_GAP_MS: u64 = 100;
/// The shards that have not drawn are woken at most this often.
const POKE_EVERY_MS: u64 = 1_000;

/// What the coordinator's logic asks of the world. The object implements
/// it with Durable Object calls, `fetch` and the console; host tests with
/// the shards' logic in memory.
// Wasm futures are not `Send`, and nothing here needs them to be.
#[allow(async_fn_in_trait)]
pub trait Io {
    /// GETs `path?query` of shard `k` of `sale` for every `(k, path)`, all
    /// at once; the answers in the same order.
    async fn shard_pages(&self, sale: &str, calls: Vec<(u32, String)>) -> Vec<ApiResult<Value>>;
    /// GETs `url` as JSON within 2 s (the beacon); `None` on any failure.
    async fn get_json(&self, url: &str) -> Option<Value>;
    /// A time of the origin's summary (RFC 3339) in unix ms.
    fn parse_time(&self, text: &str) -> Option<u64>;
    /// Logs a line an operator should see (an error).
    fn log(&self, line: &str);
    /// Logs a line of note (not an error: a change of the admission rate's
    /// reason).
    fn note(&self, line: &str);
}

/// Settings of the Worker's environment the logic needs.
#[derive(Debug, Clone, Copy, Default)]
pub struct Settings {
    /// `ADMISSION_CONTROL` (a bad setting is refused on every request by
    /// the Worker; here, where no request is answered, it is adaptive).
    pub mode: Mode,
    /// How long the draw waits for the beacon (`DRAW_BEACON_WAIT_SECS`).
    pub beacon_wait_ms: u64,
}

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
pub struct ShardRow {
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
pub struct Drawn {
    shard: u32,
    count: u64,
    firsts: Vec<String>,
    #[serde(default)]
    requests: u64,
}

#[derive(Deserialize)]
pub struct Report {
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
    /// last seen ms, until when a hold they made may exist; 0: none). The
    /// shard owning the place sends its reports one at a time, so the
    /// latest report's hold end is the one that holds.
    #[serde(default)]
    turns: Vec<(u64, u64, u64)>,
    /// Places whose admission was revoked (issue 47): passed on at once.
    #[serde(default)]
    revoked: Vec<u64>,
    /// When the shard reported (wall ms; 0 from an older shard).
    #[serde(default)]
    at_ms: u64,
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

/// A sale's coordinator over its SQL storage, with what it keeps in memory
/// (only ever caches and statistics: an evicted object starts over from
/// storage).
pub struct Coordinator<S> {
    sql: S,
    meta: Meta,
    settings: Settings,
    /// The origin's health from the last summary fetch; `None` when that
    /// fetch failed.
    sample: Cell<Option<Sample>>,
    /// Isolate requests served since the object started (a statistic;
    /// shards' reports are not counted).
    requests: Cell<u64>,
    /// What the snapshots served in the last horizon let isolates show
    /// (`status::Promise`): the frontier never falls behind any of them at
    /// the same moment, so a freeze (origin silent, pause) that stops the
    /// service clock never takes back a turn someone was just told they
    /// have. An evicted object forgets them; its isolates then fall back by
    /// at most one horizon.
    promises: RefCell<Vec<status::Promise>>,
    /// Pages of leaves in hand for the freeze, and of `value ‖ leaf` for the
    /// listing, one per shard (refetched after the stored cursors when the
    /// object was evicted).
    leaf_pages: RefCell<Vec<Page<hash::Hash>>>,
    rank_pages: RefCell<Vec<Page<[u8; 64]>>>,
    /// When the shards were last woken (at most once a second).
    poked_ms: Cell<u64>,
    /// How long the alarm waits before the next draw step (set by a step).
    next_step_ms: Cell<u64>,
}

impl<S: Sql> Coordinator<S> {
    /// The coordinator over `sql`: its tables created if needed, its
    /// settings loaded, its seed drawn the first time.
    pub fn open(sql: S, settings: Settings) -> ApiResult<Self> {
        let c = Self::unopened(sql, settings);
        c.init()?;
        Ok(c)
    }

    /// The coordinator over `sql` without touching it (an object whose
    /// storage failed at start answers errors, not a panic).
    pub fn unopened(sql: S, settings: Settings) -> Self {
        Coordinator {
            sql,
            meta: Meta::default(),
            settings,
            sample: Cell::new(None),
            requests: Cell::new(0),
            promises: RefCell::new(Vec::new()),
            leaf_pages: RefCell::new(Vec::new()),
            rank_pages: RefCell::new(Vec::new()),
            poked_ms: Cell::new(0),
            next_step_ms: Cell::new(0),
        }
    }

    /// Names the sale (every request carries it).
    pub fn set_sale(&self, sale: &str) -> ApiResult<()> {
        self.set("sale", sale)
    }

    /// The sale, once a request named it.
    pub fn sale(&self) -> Option<String> {
        self.meta.get("sale")
    }

    /// Counts an isolate's request (see [`counts_as_isolate_call`]).
    pub fn count_request(&self, path: &str) {
        if counts_as_isolate_call(path) {
            self.requests.set(self.requests.get() + 1);
        }
    }

    /// The sale's start, once the origin told it.
    pub fn starts_at(&self) -> Option<u64> {
        self.meta.u64("starts_at_ms")
    }

    /// Whether the sale has ended (the alarm chain stops).
    pub fn closed(&self) -> bool {
        self.meta.flag("closed")
    }

    /// Records the sold-out hint of a reservation's `410 sold_out`.
    pub fn sold_out_hint(&self, now: u64) -> ApiResult<()> {
        self.set("sold_out_until_ms", now + SOLD_OUT_HINT_MS)
    }

    /// The draw's key for a shard (`GET /key`): 409 until the frozen set
    /// and the beacon gave it.
    pub fn key(&self) -> ApiResult<Value> {
        match self.meta.get("key") {
            Some(k) => Ok(json!({"key": k})),
            None => Err(ApiError::new(
                409,
                "key_pending",
                "the key needs the frozen set and the beacon",
            )),
        }
    }

    /// Every shard's `/poke` with the sale's end, once it has changed since
    /// the shards were last told (an operator extended or moved it). A
    /// shard learns the end from the joins it gets, and stops its alarm,
    /// and so its reports, at the end it knows: one that got no join since
    /// the change kept reporting until the old end, and later arrivals
    /// stayed without a place on every shard (issue 44 #6). The first end
    /// seen is only recorded: the shards learnt it with their joins.
    fn end_changes(&self) -> Vec<(u32, Value)> {
        let ends = self.meta.u64("ends_at_ms");
        let now = ends.map_or_else(|| "none".to_string(), |e| e.to_string());
        let told = self.meta.get("ends_told");
        if told.as_deref() == Some(now.as_str()) {
            return Vec::new();
        }
        if self.set("ends_told", now.as_str()).is_err() || told.is_none() {
            return Vec::new();
        }
        (0..self.shards())
            .map(|k| {
                let body = json!({"sub": "-", "shard": k, "shards": self.shards(),
                                  "starts_at_ms": self.meta.u64("starts_at_ms"),
                                  "ends_at_ms": ends});
                (k, body)
            })
            .collect()
    }

    /// The shards to wake at `now` and each one's `/poke` body: those that
    /// have not sent their index (nobody joined them, or they were evicted
    /// between steps), at most once a second, never once drawn.
    pub fn pokes(&self, now: u64) -> Vec<(u32, Value)> {
        let told = self.end_changes();
        if !told.is_empty() {
            return told;
        }
        if self.drawn() || now.saturating_sub(self.poked_ms.get()) < POKE_EVERY_MS {
            return Vec::new();
        }
        self.poked_ms.set(now);
        let Ok(rows) = self.shard_rows() else {
            return Vec::new();
        };
        (0..self.shards())
            .filter(|k| {
                !rows
                    .iter()
                    .any(|r| r.shard as u32 == *k && r.count.is_some())
            })
            .map(|k| {
                let body = json!({"sub": "-", "shard": k, "shards": self.shards(),
                                  "starts_at_ms": self.meta.u64("starts_at_ms"),
                                  "ends_at_ms": self.meta.u64("ends_at_ms")});
                (k, body)
            })
            .collect()
    }

    /// How long the alarm waits before the next draw step (0: at once).
    pub fn take_step_gap(&self) -> u64 {
        self.next_step_ms.replace(0)
    }

    /// The alarm's checkpoint at `now`: the frontier stored, then the turns
    /// abandoned by now closed. Failures are logged, not fatal: the next
    /// alarm tries again.
    pub fn checkpoint(&self, now: u64, io: &impl Io) {
        match self.shard_rows().and_then(|rows| self.placed(&rows)) {
            Ok((placed, _)) => {
                let (f, _, _) = self.frontier_at(now, placed);
                if let Err(e) = self.set("frontier", serde_json::to_string(&f).unwrap_or_default())
                {
                    io.log(&format!("frontier: {}", e.message));
                }
                if let Err(e) = self.close_abandoned(&f, now) {
                    io.log(&format!("abandoned turns: {}", e.message));
                }
            }
            Err(e) => io.log(&format!("frontier: {}", e.message)),
        }
    }

    fn set(&self, k: &str, v: impl ToString) -> ApiResult<()> {
        self.meta.set(&self.sql, k, v)
    }

    fn init(&self) -> ApiResult<()> {
        let sql = &self.sql;
        self.meta.load(sql)?;
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
                held INTEGER NOT NULL,
                held_until_ms INTEGER NOT NULL DEFAULT 0)",
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
            sql.exec(q, &[])?;
        }
        // Objects created before holds had an end (issue 44 #2): the column
        // is added (an error means it is there), and a turn stored as held
        // is held for the longest a hold can live from its last report.
        let _ = sql.exec(
            "ALTER TABLE turns ADD COLUMN held_until_ms INTEGER NOT NULL DEFAULT 0",
            &[],
        );
        sql.exec(
            "UPDATE turns SET held_until_ms = seen_ms + ? WHERE held = 1 AND held_until_ms = 0",
            &[SqlValue::from(turns::MAX_HOLD_MS)],
        )?;
        if self.meta.get("commitment").is_none() {
            let mut seed = [0u8; hash::SEED_BYTES];
            getrandom::fill(&mut seed)
                .map_err(|_| ApiError::new(500, "rng", "CSPRNG unavailable"))?;
            self.set("seed", hex::encode(seed))?;
            self.set("commitment", hash::commitment(&seed))?;
        }
        Ok(())
    }

    /// The sale's shard count (fixed at creation).
    pub fn shards(&self) -> u32 {
        shards::clamp_shards(self.meta.u64("shards").unwrap_or(1))
    }

    /// Whether every shard has sent its draw index.
    pub fn drawn(&self) -> bool {
        self.meta.flag("drawn")
    }

    /// The origin's health for the controller's next step (`None`: the
    /// summary could not be had; see [`health_sample`]).
    pub fn set_sample(&self, sample: Option<Sample>) {
        self.sample.set(sample);
    }

    /// Applies the origin's summary `v` of the sale at `now`: only what
    /// changed is stored. Times are read by `io.parse_time`.
    pub fn apply_config(&self, v: &Value, now: u64, io: &impl Io) -> ApiResult<()> {
        let time = |k: &str| v[k].as_str().and_then(|t| io.parse_time(t));
        let Some(starts) = time("starts_at") else {
            return Err(ApiError::new(502, "origin_error", "sale has no starts_at"));
        };
        // The start is frozen once it has come (the shards draw at it).
        let stored = self.meta.u64("starts_at_ms");
        if stored.is_none_or(|s| now < s) {
            self.set("starts_at_ms", starts)?;
        }
        match time("ends_at") {
            Some(e) => self.set("ends_at_ms", e)?,
            None => self.meta.delete(&self.sql, "ends_at_ms")?,
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
                None => self.meta.delete(&self.sql, "beacon_url")?,
            }
        }
        Ok(())
    }

    pub fn limits(&self) -> Limits {
        Limits {
            ceiling: self.meta.f64("rate").unwrap_or(10.0),
            p99_target_ms: self.meta.f64("p99_ms").unwrap_or(DEFAULT_P99_MS),
            mode: self.settings.mode,
        }
    }

    /// The stored controller (none before the first step after the start).
    pub fn controller(&self) -> Option<Controller> {
        self.meta
            .get("control")
            .and_then(|c| serde_json::from_str(&c).ok())
    }

    /// One controller step (the alarm's, once a second from the start);
    /// stored, and logged when the reason changes.
    pub fn step_controller(&self, now: u64, io: &impl Io) -> ApiResult<()> {
        let limits = self.limits();
        let mut c = self
            .controller()
            .unwrap_or_else(|| Controller::new(limits, now));
        let before = (c.reason, c.rate);
        let was_frozen = c.frozen;
        c.step(limits, now, self.sample.get(), self.meta.flag("paused"));
        if was_frozen && !c.frozen {
            // A pause or an outage just ended: every admitted person has
            // the whole idle time from now to poll again (issue 44 #0).
            self.set("thawed_ms", now)?;
        }
        if before.0 != c.reason {
            io.note(&format!(
                "admission {}: {:?} -> {:?}, rate {:.2} -> {:.2}/s",
                self.meta.get("sale").unwrap_or_default(),
                before.0,
                c.reason,
                before.1,
                c.rate
            ));
            let key = format!("rate_changes_{}", c.reason.label());
            self.set(&key, self.meta.u64(&key).unwrap_or(0) + 1)?;
        }
        self.set("control", serde_json::to_string(&c).unwrap_or_default())
    }

    pub fn sold_out(&self, now: u64) -> bool {
        self.meta.flag("origin_sold_out")
            || self.meta.u64("sold_out_until_ms").is_some_and(|u| now < u)
    }

    /// The frontier's settings; its rate is the controller's (0 while
    /// frozen), the sale's ceiling until the controller's first step.
    pub fn params(&self) -> Params {
        let ctl = self.controller();
        Params {
            rate: ctl.map_or_else(|| self.limits().ceiling, |c| c.effective_rate()),
            factor: self.meta.f64("factor").unwrap_or(2.0),
            window_ms: ADMIT_TTL_SECS * 1000,
        }
    }

    pub fn shard_rows(&self) -> ApiResult<Vec<ShardRow>> {
        self.sql.rows::<ShardRow>(
            "SELECT shard, count, firsts, through, requests, prequeue FROM shards ORDER BY shard",
            &[],
        )
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
            .sql
            .rows::<SumRow>(
                "SELECT SUM(n) AS n FROM arrivals WHERE second < ?",
                &[SqlValue::from(second)],
            )?
            .first()
            .and_then(|r| r.n)
            .unwrap_or(0.0) as u64)
    }

    /// People with a final place: the drawn pre-queue plus the arrivals of
    /// every complete second.
    pub fn placed(&self, rows: &[ShardRow]) -> ApiResult<(u64, Option<u64>)> {
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
    pub fn service_ms(&self, now: u64) -> u64 {
        let frozen = self.controller().map_or(0, |c| c.frozen_ms_at(now));
        now.saturating_sub(frozen)
    }

    /// The frontier at `now` (advanced in memory on the service clock; the
    /// alarm stores it), with its cap and rate from here (what isolates
    /// extrapolate by).
    pub fn frontier_at(&self, now: u64, placed: u64) -> (Frontier, f64, f64) {
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
            freed: self.freed_after(expired, now),
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
    pub fn snapshot(&self, sale: &str, now: u64) -> ApiResult<Snapshot> {
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
            coordinator_requests: self.requests.get(),
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
    pub fn figures(&self, sale: &str, now: u64) -> ApiResult<AdmissionFigures> {
        let snap = self.snapshot(sale, now)?;
        let ctl = self.controller();
        let ceiling = self.limits().ceiling;
        Ok(AdmissionFigures {
            admitted: snap.frontier,
            windows_ended: snap.expired,
            abandoned: self.meta.u64("abandoned").unwrap_or(0),
            revoked: self.meta.u64("revoked").unwrap_or(0),
            shadowed: self.meta.u64("shadowed").unwrap_or(0),
            bot_refused: self.meta.u64("bot_refused").unwrap_or(0),
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
    /// A place both abandoned and held counts once (issue 44 #2). A hold
    /// counts while it may exist (until its end at `now`): once it expired
    /// or was cancelled, its unit is back in `units available` and the
    /// person, still admitted, needs a share again.
    fn freed_after(&self, expired: u64, now: u64) -> u64 {
        self.sql
            .first::<CountRow>(
                "SELECT count(*) AS n FROM (
                     SELECT place FROM turns WHERE place > ? AND held_until_ms > ?
                     UNION SELECT place FROM abandoned WHERE place > ?)",
                &[
                    SqlValue::from(expired),
                    SqlValue::from(now),
                    SqlValue::from(expired),
                ],
            )
            .ok()
            .flatten()
            .map_or(0, |r| r.n.max(0.0) as u64)
    }

    fn abandoned_after(&self, expired: u64) -> ApiResult<Vec<u64>> {
        Ok(self
            .sql
            .rows::<PlaceRow>(
                "SELECT place FROM abandoned WHERE place > ? ORDER BY place LIMIT ?",
                &[
                    SqlValue::from(expired),
                    SqlValue::from(MAX_ABANDONED_LISTED),
                ],
            )?
            .into_iter()
            .map(|r| r.place as u64)
            .collect())
    }

    /// Closes the turns of admitted people not seen for 30 s who hold
    /// nothing (`turns::newly_abandoned`); the alarm's, after the frontier
    /// is stored.
    pub fn close_abandoned(&self, f: &Frontier, now: u64) -> ApiResult<()> {
        let service = self.service_ms(now);
        let window = self.params().window_ms;
        let expired = f.expired_at(service, window).floor().max(0.0) as u64;
        let frontier = f.admitted_places();
        if frontier <= expired {
            return Ok(());
        }
        let sql = &self.sql;
        let turns: HashMap<u64, Turn> = sql
            .rows::<TurnRow>(
                "SELECT place, seen_ms, held_until_ms FROM turns WHERE place > ? AND place <= ?",
                &[SqlValue::from(expired), SqlValue::from(frontier)],
            )?
            .into_iter()
            .map(|r| {
                let t = Turn {
                    seen_ms: r.seen_ms as u64,
                    held_until_ms: r.held_until_ms as u64,
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
                thawed_ms: self.meta.u64("thawed_ms").unwrap_or(0),
            },
            &turns,
            &already,
            MAX_ABANDONED_PER_STEP,
        );
        for p in &lost {
            sql.exec(
                "INSERT OR IGNORE INTO abandoned (place, at_ms) VALUES (?, ?)",
                &[SqlValue::from(*p), SqlValue::from(now)],
            )?;
        }
        if !lost.is_empty() {
            let n = self.meta.u64("abandoned").unwrap_or(0) + lost.len() as u64;
            self.set("abandoned", n)?;
        }
        Ok(())
    }

    fn upsert_shard(&self, shard: u32, requests: u64) -> ApiResult<()> {
        self.sql.exec(
            "INSERT INTO shards (shard, requests) VALUES (?, ?)
                 ON CONFLICT(shard) DO UPDATE SET requests = excluded.requests",
            &[SqlValue::from(shard), SqlValue::from(requests)],
        )?;
        Ok(())
    }

    pub fn record_drawn(&self, d: Drawn, now: u64) -> ApiResult<Value> {
        if d.shard >= self.shards() {
            return Err(ApiError::new(400, "bad_request", "no such shard"));
        }
        self.upsert_shard(d.shard, d.requests)?;
        let index = ShardIndex {
            count: d.count,
            firsts: d.firsts,
        };
        self.sql.exec(
            "UPDATE shards SET count = ?, firsts = ? WHERE shard = ? AND count IS NULL",
            &[
                SqlValue::from(index.count),
                serde_json::to_string(&index.firsts)
                    .unwrap_or_default()
                    .as_str()
                    .into(),
                SqlValue::from(d.shard),
            ],
        )?;
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

    /// Counts a join answered with a shadow ticket (a failed bot check of
    /// a sale with `bot_shadow`): the only trace one leaves here.
    pub fn shadowed(&self) -> ApiResult<Value> {
        let n = self.meta.u64("shadowed").unwrap_or(0) + 1;
        self.set("shadowed", n)?;
        Ok(json!({ "shadowed": n }))
    }

    /// Counts a join refused for failing the bot check (a sale without a
    /// shadow queue), for the operator's live view.
    pub fn bot_refused(&self) -> ApiResult<Value> {
        let n = self.meta.u64("bot_refused").unwrap_or(0) + 1;
        self.set("bot_refused", n)?;
        Ok(json!({ "bot_refused": n }))
    }

    pub fn record_report(&self, r: Report) -> ApiResult<Value> {
        if r.shard >= self.shards() {
            return Err(ApiError::new(400, "bad_request", "no such shard"));
        }
        self.upsert_shard(r.shard, r.requests)?;
        let sql = &self.sql;
        if let Some(p) = r.prequeue {
            sql.exec(
                "UPDATE shards SET prequeue = ? WHERE shard = ?",
                &[SqlValue::from(p), SqlValue::from(r.shard)],
            )?;
        }
        for s in &r.seconds {
            if s.shard != r.shard {
                continue;
            }
            sql.exec(
                "INSERT OR REPLACE INTO arrivals (second, shard, n, stamps) VALUES (?, ?, ?, ?)",
                &[
                    SqlValue::from(s.second),
                    SqlValue::from(s.shard),
                    SqlValue::from(s.stamps.len()),
                    serde_json::to_string(&s.stamps)
                        .unwrap_or_default()
                        .as_str()
                        .into(),
                ],
            )?;
        }
        // A revoked turn is given back now, as an abandoned one is after
        // 30 s unseen: its share of the inventory cap goes to the next
        // person, and its holder's polls say the turn is over.
        let mut revoked = 0;
        for place in &r.revoked {
            let known = sql
                .first::<PlaceRow>(
                    "SELECT place FROM abandoned WHERE place = ?",
                    &[SqlValue::from(*place)],
                )?
                .is_some();
            if !known {
                sql.exec(
                    "INSERT INTO abandoned (place, at_ms) VALUES (?, ?)",
                    &[SqlValue::from(*place), SqlValue::from(r.at_ms)],
                )?;
                revoked += 1;
            }
        }
        if revoked > 0 {
            let n = self.meta.u64("abandoned").unwrap_or(0) + revoked as u64;
            self.set("abandoned", n)?;
            let n = self.meta.u64("revoked").unwrap_or(0) + revoked as u64;
            self.set("revoked", n)?;
        }
        for (place, seen, held_until) in &r.turns {
            // The hold's end is the shard's latest word (a cancel lowers it);
            // `held` stays for older readers of the table.
            sql.exec(
                "INSERT INTO turns (place, seen_ms, held, held_until_ms) VALUES (?, ?, ?, ?)
                 ON CONFLICT(place) DO UPDATE SET seen_ms = MAX(seen_ms, excluded.seen_ms),
                     held = excluded.held, held_until_ms = excluded.held_until_ms",
                &[
                    SqlValue::from(*place),
                    SqlValue::from(*seen),
                    SqlValue::from(*held_until > 0),
                    SqlValue::from(*held_until),
                ],
            )?;
        }
        if let Some(t) = r.through {
            sql.exec(
                "UPDATE shards SET through = MAX(COALESCE(through, 0), ?) WHERE shard = ?",
                &[SqlValue::from(t), SqlValue::from(r.shard)],
            )?;
        }
        Ok(json!({"ok": true}))
    }

    pub fn index(&self) -> ApiResult<Value> {
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

    pub fn arrivals(&self, q: impl Fn(&str) -> Option<String>) -> ApiResult<Value> {
        let second = q("s")
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or_else(|| ApiError::new(400, "bad_request", "s missing"))?;
        let rows = self.shard_rows()?;
        let complete = self
            .watermarks(&rows)
            .complete_through()
            .is_some_and(|c| second <= c);
        let mut arrivals = Vec::new();
        for r in self.sql.rows::<ArrivalRow>(
            "SELECT shard, stamps FROM arrivals WHERE second = ?",
            &[SqlValue::from(second)],
        )? {
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
    pub fn draw_public(&self) -> Value {
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
        io: &impl Io,
        sale: &str,
        path: &str,
        field: &str,
        wants: Vec<crate::draw::freeze::Want>,
        pages: &mut [Page<T>],
    ) -> ApiResult<bool> {
        let calls = wants
            .iter()
            .map(|w| {
                let q = format!(
                    "{path}?after={}&limit={DRAW_PAGE}",
                    w.after.clone().unwrap_or_default()
                );
                (w.shard as u32, q)
            })
            .collect();
        let got = io.shard_pages(sale, calls).await;
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
        io: &impl Io,
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
        let ready = self
            .fetch_pages(io, sale, path, field, wants, &mut pages)
            .await;
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
            io.log(&format!("{state_key} state unreadable: starting over"));
            self.meta.delete(&self.sql, state_key)?;
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
    pub async fn draw_step(&self, io: &impl Io, sale: &str, now: u64) -> ApiResult<bool> {
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
                    q.sql.exec(
                            "INSERT OR REPLACE INTO chunks (j, first, root, leaves) VALUES (?, ?, ?, ?)",
                            &[
                                SqlValue::from(c.index),
                                leaves.first().cloned().unwrap_or_default().into(),
                                hash::to_hex_hash(&c.root).into(),
                                serde_json::to_string(&leaves).unwrap_or_default().into(),
                            ],
                        )
                        .map(|_| ())
                };
                let Some(f) = self
                    .merge_step(
                        io,
                        sale,
                        ("freeze", "/leaves", "leaves"),
                        &self.leaf_pages,
                        put,
                    )
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
                    Some(url) => match self.beacon_step(io, &url, starts, now).await? {
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
                    q.sql
                        .exec(
                            "INSERT OR REPLACE INTO listing (j, items) VALUES (?, ?)",
                            &[
                                SqlValue::from(c.index),
                                serde_json::to_string(&items).unwrap_or_default().into(),
                            ],
                        )
                        .map(|_| ())
                };
                let Some(f) = self
                    .merge_step(
                        io,
                        sale,
                        ("listing", "/ranked", "items"),
                        &self.rank_pages,
                        put,
                    )
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
                    io.log(&format!(
                        "listing has {} entries, the frozen set {:?}",
                        f.merged,
                        self.meta.u64("entrants")
                    ));
                }
                Ok(false)
            }
        }
    }

    /// The beacon's value for the sale's round, once it can be had; an
    /// empty value once it is given up (the summary says `missed`); `None`:
    /// not yet.
    async fn beacon_step(
        &self,
        io: &impl Io,
        url: &str,
        starts: u64,
        now: u64,
    ) -> ApiResult<Option<Vec<u8>>> {
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
        let wait = self.settings.beacon_wait_ms;
        match hash::beacon_next(now, starts, frozen, info, wait) {
            BeaconNext::Info => {
                if let Some(v) = io.get_json(&format!("{base}/info")).await
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
                let v = io.get_json(&format!("{base}/public/{round}")).await;
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
                io.log(&format!(
                    "beacon {base} did not answer in time: drawing without it"
                ));
                self.set("beacon_missed", 1)?;
                Ok(Some(Vec::new()))
            }
        }
    }

    /// A receipt's `(leaf_index, audit_path)` for `leaf`, from the stored
    /// chunks of the frozen set.
    pub fn proof(&self, q: impl Fn(&str) -> Option<String>) -> ApiResult<Value> {
        let leaf = q("leaf")
            .and_then(|l| ::draw::from_hex(&l))
            .ok_or_else(|| ApiError::new(400, "bad_request", "leaf must be 64 hex digits"))?;
        let entrants = self
            .meta
            .u64("entrants")
            .filter(|_| self.meta.get("entrants_root").is_some())
            .ok_or_else(|| ApiError::new(409, "not_frozen", "the entrant set is not frozen yet"))?;
        let rows = self
            .sql
            .rows::<ChunkRow>("SELECT first, root FROM chunks ORDER BY j", &[])?;
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
            .sql
            .rows::<LeavesRow>(
                "SELECT leaves FROM chunks WHERE j = ?",
                &[SqlValue::from(j)],
            )?
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
    pub fn listing(&self, q: impl Fn(&str) -> Option<String>) -> ApiResult<Value> {
        if !self.meta.flag("listed") {
            return Err(ApiError::new(
                409,
                "not_drawn",
                "the draw is not listed yet",
            ));
        }
        let n = self.meta.u64("entrants").unwrap_or(0);
        let num = |k: &str| q(k).and_then(|v| v.parse::<u64>().ok());
        let from = num("from").filter(|f| *f >= 1).unwrap_or(1);
        let limit = num("limit").unwrap_or(LISTING_MAX).clamp(1, LISTING_MAX);
        let last = (from + limit - 1).min(n);
        let mut entries = Vec::new();
        if from <= n {
            let c = CHUNK as u64;
            let rows = self.sql.rows::<ItemsRow>(
                "SELECT j, items FROM listing WHERE j >= ? AND j <= ? ORDER BY j",
                &[
                    SqlValue::from((from - 1) / c),
                    SqlValue::from((last - 1) / c),
                ],
            )?;
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

    pub fn draw_header(&self) -> ApiResult<Value> {
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
}

/// The controller's sample from an origin summary fetched at `now`: its
/// `health` (an origin without one counts as healthy: it answered).
pub fn health_sample(v: &Value, now: u64) -> Sample {
    let h = &v["health"];
    let share = |k: &str| h[k].as_f64().filter(|x| x.is_finite()).unwrap_or(0.0);
    Sample {
        at_ms: now,
        shed_share: share("shed_share"),
        error_share: share("error_share"),
        p99_ms: share("p99_ms"),
    }
}

/// Whether a request to `path` counts as an isolate's call (what the
/// benchmark counts), not a shard's.
pub fn counts_as_isolate_call(path: &str) -> bool {
    !matches!(path, "/key" | "/drawn" | "/report")
}

/// When the alarm comes next after one that ran: at once (or after the
/// listing's gap) while the draw has more to do, else in a second until the
/// sale is closed, then never.
pub fn next_alarm_in(more: bool, step_gap_ms: u64, closed: bool) -> Option<u64> {
    if more {
        Some(step_gap_ms)
    } else if !closed {
        Some(1_000)
    } else {
        None
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use std::rc::Rc;

    use super::*;
    use crate::draw::phases::{DRAW_GRACE_MS, LISTING_DELAY_MS};
    use crate::queue::entries::{Entries, JoinBody, page_of};
    use crate::store::sqlite::MemSql;
    use token::KeyRing;

    const SALE: &str = "drop";
    const START: u64 = 1_800_000_000_000;

    /// Runs a future whose awaits are all ready (the test world answers at
    /// once).
    fn block_on<F: Future>(f: F) -> F::Output {
        let mut f = std::pin::pin!(f);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        loop {
            if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
                return v;
            }
        }
    }

    /// A sale's shards in memory, answering the coordinator's page calls.
    struct World {
        shards: Vec<Entries<MemSql>>,
        now: Cell<u64>,
        logs: RefCell<Vec<String>>,
    }

    impl Io for World {
        async fn shard_pages(&self, _: &str, calls: Vec<(u32, String)>) -> Vec<ApiResult<Value>> {
            calls
                .into_iter()
                .map(|(k, q)| {
                    let (path, query) = q.split_once('?').unwrap();
                    let param = |name: &str| {
                        query
                            .split('&')
                            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
                            .map(str::to_string)
                    };
                    let page = page_of(param("after"), param("limit"))?;
                    let shard = &self.shards[k as usize];
                    match path {
                        "/leaves" => shard.leaves(page, self.now.get()),
                        "/ranked" => shard.ranked(page),
                        _ => Err(ApiError::not_found()),
                    }
                })
                .collect()
        }

        async fn get_json(&self, _: &str) -> Option<Value> {
            None
        }

        fn parse_time(&self, text: &str) -> Option<u64> {
            text.parse().ok()
        }

        fn log(&self, line: &str) {
            self.logs.borrow_mut().push(line.to_string());
        }

        fn note(&self, line: &str) {
            self.log(line);
        }
    }

    fn keys() -> ApiResult<Rc<KeyRing>> {
        Ok(Rc::new(KeyRing::from_keys(&[("a1", &[7u8; 32])]).unwrap()))
    }

    fn summary(shards: u32, units: u64) -> Value {
        json!({
            "starts_at": START.to_string(),
            "ends_at": (START + 3_600_000).to_string(),
            "queue": {"shards": shards},
            "admission_rate": 50.0,
            "units_available": units,
            "phase": "open",
        })
    }

    /// A sale of `n` people who joined `shards` shards before the start:
    /// the coordinator, the world of shards, and every entrant's leaf.
    fn sale(n: usize, shards: u32) -> (Coordinator<MemSql>, World, Vec<String>) {
        let world = World {
            shards: (0..shards)
                .map(|_| Entries::open(MemSql::new()).unwrap())
                .collect(),
            now: Cell::new(START - 60_000),
            logs: RefCell::new(Vec::new()),
        };
        let c = Coordinator::open(MemSql::new(), Settings::default()).unwrap();
        c.set_sale(SALE).unwrap();
        c.apply_config(&summary(shards, 1_000), START - 60_000, &world)
            .unwrap();
        let mut leaves = Vec::new();
        for i in 0..n {
            let sub = format!("acct-{i}");
            let k = shards::shard_of(&sub, shards);
            let now = START - 60_000 + i as u64;
            let b = JoinBody {
                sub: sub.clone(),
                shard: k,
                shards,
                starts_at_ms: START,
                ends_at_ms: None,
                arrival_ms: Some(now),
                again_seq: None,
                bot_iat_ms: None,
            };
            let j = world.shards[k as usize].join(SALE, b, now, keys).unwrap();
            let t = keys()
                .unwrap()
                .verify_signature(j.answer["ticket"].as_str().unwrap())
                .unwrap();
            let salt = t.tkt.unwrap().salt.unwrap();
            leaves.push(hash::leaf_of_ticket(&sub, &salt).unwrap());
        }
        (c, world, leaves)
    }

    /// The coordinator's alarm after the draw at `now`: the origin answered
    /// healthy, the controller steps, the checkpoint is stored.
    fn alarm(c: &Coordinator<MemSql>, world: &World, now: u64) {
        c.set_sample(Some(health_sample(&json!({"health": {}}), now)));
        c.step_controller(now, world).unwrap();
        c.checkpoint(now, world);
    }

    /// Runs the draw as the objects' alarms would, from the freeze to the
    /// listing; answers when it was listed.
    fn draw(c: &Coordinator<MemSql>, world: &World) -> u64 {
        let mut now = START + DRAW_GRACE_MS;
        for _ in 0..10_000 {
            world.now.set(now);
            // The shards draw once the key is known, and send their index.
            if let Ok(v) = c.key() {
                let key = ::draw::from_hex(v["key"].as_str().unwrap()).unwrap();
                for s in &world.shards {
                    s.set_key(&key).unwrap();
                    while !s.draw_step(&key).unwrap() {}
                    if let Some(body) = s.index_report(0).unwrap() {
                        c.record_drawn(serde_json::from_value(body).unwrap(), now)
                            .unwrap();
                        s.index_sent().unwrap();
                    }
                }
            }
            block_on(c.draw_step(world, SALE, now)).unwrap();
            if c.draw_public()["listed"] == true {
                return now;
            }
            now += 100;
        }
        panic!("the draw never ended: {:?}", world.logs.borrow());
    }

    #[test]
    fn the_whole_draw_over_shards_is_one_uniform_sort_by_the_published_key() {
        let (c, world, leaves) = sale(1_500, 3);
        // Nothing is given away before the draw.
        let before = c.snapshot(SALE, START - 1).unwrap();
        assert_eq!((before.seed, before.key), (None, None));
        assert!(c.key().is_err());
        let listed_at = draw(&c, &world);
        let snap = c.snapshot(SALE, listed_at).unwrap();
        assert!(snap.drawn);
        assert_eq!(snap.prequeue, 1_500);
        assert_eq!(snap.placed, 1_500);
        // The seed matches the commitment published before anyone joined,
        // and the key is SHA-256(seed ‖ root of every leaf ‖ no beacon).
        let seed = hex::decode(snap.seed.unwrap()).unwrap();
        assert!(hash::seed_matches(&hex::encode(&seed), &snap.commitment));
        let key = hash::key_of(&seed, &leaves, b"");
        assert_eq!(snap.key.unwrap(), hash::to_hex_hash(&key));
        // The published listing is exactly one sort of every value.
        let order = hash::draw_order(&key, &leaves);
        let mut listed = Vec::new();
        let mut from = 1;
        loop {
            let page = c
                .listing(|k| match k {
                    "from" => Some(from.to_string()),
                    "limit" => Some("512".into()),
                    _ => None,
                })
                .unwrap();
            let entries = page["entries"].as_array().unwrap().clone();
            if entries.is_empty() {
                break;
            }
            from += entries.len() as u64;
            listed.extend(entries);
        }
        assert_eq!(listed.len(), 1_500);
        for (e, d) in listed.iter().zip(&order) {
            assert_eq!(e["place"], d.place);
            assert_eq!(e["leaf"], d.leaf.as_str());
            assert_eq!(e["value"], d.value.as_str());
        }
        // A receipt's audit path: the leaf's index among the sorted leaves.
        let mut sorted = leaves.clone();
        sorted.sort();
        let proof = c
            .proof(|k| (k == "leaf").then(|| sorted[700].clone()))
            .unwrap();
        assert_eq!(proof["leaf_index"], 700);
        assert_eq!(proof["entrants"], 1_500);
        // The index isolates place people by has every shard.
        let index = c.index().unwrap();
        let counts: u64 = index["shards"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["count"].as_u64().unwrap())
            .sum();
        assert_eq!(counts, 1_500);
        assert!(listed_at >= START + DRAW_GRACE_MS + LISTING_DELAY_MS);
    }

    #[test]
    fn snapshots_commit_nothing_and_the_frontier_moves_at_the_rate_within_the_stock() {
        let (c, world, _) = sale(300, 2);
        let listed_at = draw(&c, &world);
        let writes = c.sql.writes();
        let a = c.snapshot(SALE, listed_at).unwrap();
        let b = c.snapshot(SALE, listed_at + 2_000).unwrap();
        assert_eq!(c.sql.writes(), writes, "a snapshot writes nothing");
        assert!(b.frontier >= a.frontier);
        // The alarm's checkpoints: the controller's rate, never past the
        // people placed, and never past the sale's stock.
        let mut now = listed_at;
        let mut last = 0;
        for _ in 0..30 {
            now += 1_000;
            alarm(&c, &world, now);
            let s = c.snapshot(SALE, now).unwrap();
            assert!(s.frontier >= last, "the frontier never moves back");
            assert!(s.frontier <= s.placed);
            last = s.frontier;
        }
        assert!(last > 0, "people were admitted");
        c.apply_config(&summary(2, 3), now, &world).unwrap();
        let s = c.snapshot(SALE, now + 30_000).unwrap();
        assert!(s.frontier_cap <= s.frontier.max(3) + 3);
        // Sold out: every waiting person hears it.
        c.sold_out_hint(now).unwrap();
        assert!(c.snapshot(SALE, now + 1).unwrap().sold_out);
        assert!(!c.snapshot(SALE, now + SOLD_OUT_HINT_MS).unwrap().sold_out);
    }

    #[test]
    fn a_second_is_complete_once_every_shard_reported_it() {
        let (c, _world, _) = sale(0, 2);
        let second = START / 1000 + 5;
        let report = |shard: u32, stamps: Vec<(u64, u64)>| {
            let r: Report = serde_json::from_value(json!({
                "shard": shard, "through": second, "requests": 0,
                "seconds": [{"shard": shard, "second": second, "stamps": stamps}],
            }))
            .unwrap();
            c.record_report(r).unwrap();
        };
        let ask = || {
            c.arrivals(|k| (k == "s").then(|| second.to_string()))
                .unwrap()
        };
        report(0, vec![(second * 1000 + 10, 1)]);
        assert_eq!(ask()["arrivals"]["complete"], false);
        report(1, vec![(second * 1000 + 5, 1)]);
        let v = ask();
        assert_eq!(v["arrivals"]["complete"], true);
        assert_eq!(v["arrivals"]["arrivals"].as_array().unwrap().len(), 2);
        // A report for a shard the sale does not have is refused.
        let bad: Report = serde_json::from_value(json!({"shard": 9})).unwrap();
        assert_eq!(c.record_report(bad).unwrap_err().status, 400);
    }

    /// A sale of `people` on one shard, drawn, three seconds into
    /// admission: the object, its world, and the time now.
    fn admitting(people: usize) -> (Coordinator<MemSql>, World, u64) {
        let (c, world, _) = sale(people, 1);
        let mut now = draw(&c, &world);
        for _ in 0..3 {
            now += 1_000;
            alarm(&c, &world, now);
        }
        (c, world, now)
    }

    #[test]
    fn a_revoked_turn_is_passed_on_at_once_and_counted_once() {
        let (c, _, now) = admitting(40);
        let before = c.snapshot(SALE, now).unwrap();
        assert!(before.frontier >= 2, "two people admitted");
        assert!(before.abandoned.is_empty());
        // Place 2 was seen a moment ago: idleness alone would keep it 30 s.
        let r: Report = serde_json::from_value(json!({
            "shard": 0, "turns": [[2, now, 0]], "revoked": [2], "at_ms": now,
        }))
        .unwrap();
        c.record_report(r).unwrap();
        let s = c.snapshot(SALE, now).unwrap();
        assert_eq!(s.abandoned, vec![2], "given back at once");
        assert_eq!(c.meta.u64("revoked"), Some(1));
        assert_eq!(c.meta.u64("abandoned"), Some(1));
        // Reported again (a shard's retry): counted once.
        let again: Report =
            serde_json::from_value(json!({"shard": 0, "revoked": [2], "at_ms": now})).unwrap();
        c.record_report(again).unwrap();
        assert_eq!(c.meta.u64("revoked"), Some(1));
    }

    #[test]
    fn failed_bot_checks_are_counted_apart_shadowed_or_refused() {
        let (c, _world, now) = admitting(4);
        c.shadowed().unwrap();
        c.bot_refused().unwrap();
        c.bot_refused().unwrap();
        let f = c.figures(SALE, now).unwrap();
        assert_eq!((f.shadowed, f.bot_refused), (1, 2));
        assert_eq!(f.placed, 4, "neither takes a place");
    }

    #[test]
    fn an_admitted_person_not_seen_for_thirty_seconds_who_holds_nothing_loses_the_turn() {
        let (c, world, mut now) = admitting(40);
        let admitted = c.snapshot(SALE, now).unwrap().frontier;
        assert!(admitted >= 2, "two people admitted ({admitted})");
        // Place 1 polled once; place 2 made a reservation.
        let r: Report = serde_json::from_value(json!({
            "shard": 0, "turns": [[1, now, 0], [2, now, now + 600_000]],
        }))
        .unwrap();
        c.record_report(r).unwrap();
        for _ in 0..45 {
            now += 1_000;
            alarm(&c, &world, now);
        }
        let s = c.snapshot(SALE, now).unwrap();
        assert!(s.abandoned.contains(&1), "{:?}", s.abandoned);
        assert!(!s.abandoned.contains(&2), "a hold keeps the turn");
        let f = c.figures(SALE, now).unwrap();
        assert!(f.abandoned >= 1);
    }

    /// Issue 44 #2 (leftover): a hold kept the turn forever. Once it ended
    /// (expired, or cancelled: the shard reports the cancel's time), it
    /// frees no share of the cap, and 30 s unseen after its end the turn
    /// is given back.
    #[test]
    fn a_hold_that_ended_keeps_the_turn_no_longer() {
        let (c, world, mut now) = admitting(40);
        let report = |turns: Value| {
            let r: Report = serde_json::from_value(json!({"shard": 0, "turns": turns})).unwrap();
            c.record_report(r).unwrap();
        };
        report(json!([[2, now, now + 600_000]]));
        let cancelled = now + 2_000;
        let live = c.freed_after(0, cancelled + 1);
        assert!(live >= 1, "a live hold frees its share");
        // Cancelled 2 s later: the shard's next report lowers the end.
        report(json!([[2, now, cancelled]]));
        assert_eq!(
            c.freed_after(0, cancelled + 1),
            live - 1,
            "an ended hold frees no share"
        );
        for _ in 0..(turns::IDLE_MS / 1_000 + 1) {
            now += 1_000;
            alarm(&c, &world, now);
        }
        assert!(
            !c.snapshot(SALE, now).unwrap().abandoned.contains(&2),
            "not 30 s after the cancel yet"
        );
        for _ in 0..5 {
            now += 1_000;
            alarm(&c, &world, now);
        }
        let s = c.snapshot(SALE, now).unwrap();
        assert!(s.abandoned.contains(&2), "{:?}", s.abandoned);
    }

    /// A coordinator stored before holds had an end (a `held` flag only)
    /// opens, and such a turn is held for the longest a hold can live from
    /// its last report.
    #[test]
    fn a_turn_held_before_ends_were_recorded_is_bounded() {
        let sql = MemSql::new();
        sql.exec(
            "CREATE TABLE turns (place INTEGER PRIMARY KEY, seen_ms INTEGER NOT NULL,
                 held INTEGER NOT NULL)",
            &[],
        )
        .unwrap();
        sql.exec("INSERT INTO turns VALUES (3, 1000, 1), (4, 2000, 0)", &[])
            .unwrap();
        let c = Coordinator::open(sql, Settings::default()).unwrap();
        let rows: Vec<TurnRow> = c
            .sql
            .rows(
                "SELECT place, seen_ms, held_until_ms FROM turns ORDER BY place",
                &[],
            )
            .unwrap();
        let got: Vec<(u64, u64)> = rows
            .iter()
            .map(|r| (r.place as u64, r.held_until_ms as u64))
            .collect();
        assert_eq!(got, vec![(3, 1000 + turns::MAX_HOLD_MS), (4, 0)]);
    }

    /// Issue 44 #2: a place both abandoned and held (its /held report came
    /// after the turn was given back) freed one share of the cap, not two
    /// (the frontier let one person too many in).
    #[test]
    fn a_place_abandoned_and_held_is_freed_once() {
        let (c, world, mut now) = admitting(40);
        let report = |turns: Value| {
            let r: Report = serde_json::from_value(json!({"shard": 0, "turns": turns})).unwrap();
            c.record_report(r).unwrap();
        };
        report(json!([[1, now, 0], [2, now, now + 600_000]]));
        for _ in 0..45 {
            now += 1_000;
            alarm(&c, &world, now);
        }
        let abandoned = c.snapshot(SALE, now).unwrap().abandoned;
        assert!(abandoned.contains(&1) && !abandoned.contains(&2));
        report(json!([[1, now, now + 600_000]]));
        assert_eq!(
            c.freed_after(0, now),
            abandoned.len() as u64 + 1,
            "the abandoned places and place 2 (held), place 1 once"
        );
    }

    /// Issue 44 #6: an operator moves the sale's end; every shard is told
    /// (a `/poke` with the new end), once, whether or not a join reaches it.
    #[test]
    fn a_changed_end_is_told_to_every_shard_once() {
        let (c, world, _) = sale(0, 3);
        let now = START + 1_000;
        let ends = |v: &Vec<(u32, Value)>| {
            v.iter()
                .map(|(k, b)| (*k, b["ends_at_ms"].as_u64()))
                .collect::<Vec<_>>()
        };
        c.pokes(now);
        assert!(c.end_changes().is_empty(), "the first end is only recorded");
        let mut later = summary(3, 1_000);
        later["ends_at"] = json!((START + 7_200_000).to_string());
        c.apply_config(&later, now, &world).unwrap();
        let told = c.pokes(now);
        assert_eq!(
            ends(&told),
            (0..3)
                .map(|k| (k, Some(START + 7_200_000)))
                .collect::<Vec<_>>()
        );
        assert!(c.end_changes().is_empty(), "told once");
    }

    #[test]
    fn the_alarm_comes_at_once_while_the_draw_has_steps() {
        assert_eq!(next_alarm_in(true, 0, false), Some(0));
        assert_eq!(next_alarm_in(true, LISTING_STEP_GAP_MS, false), Some(100));
        assert_eq!(next_alarm_in(false, 0, false), Some(1_000));
        assert_eq!(next_alarm_in(false, 0, true), None);
        assert!(counts_as_isolate_call("/snapshot"));
        assert!(!counts_as_isolate_call("/report"));
    }
}
