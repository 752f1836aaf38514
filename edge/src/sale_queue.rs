//! The `SaleQueue` Durable Object (Wasm only): one per sale, SQLite storage.
//!
//! Role: the single writer of a sale's queue. It keeps one entry per account,
//! the pre-queue and its draw, the arrival order after the start, and the
//! admission frontier; it answers the Worker with tickets and snapshots.
//!
//! Invariants kept here:
//! - one entry per account (`sub` is the primary key): a second join returns
//!   the same ticket string as long as the place it carries is unchanged;
//! - the seed is drawn from the CSPRNG and its commitment stored the first
//!   time the object runs, before anyone can join; the seed is only shown
//!   after the draw;
//! - the draw happens once, at `starts_at` (alarm) or lazily on the first
//!   request after it, before any join that arrives after the start is
//!   placed, so post-start joiners always follow every pre-queue entrant;
//! - after the start places are handed out in arrival order, one each;
//! - all state changes of a request happen in synchronous SQL between awaits,
//!   so concurrent requests never interleave inside one change;
//! - a join is placed by its arrival (stamped before any await) and before
//!   the settings refresh is awaited, so a press before the start is drawn
//!   with the pre-queue even when the origin is slow at the start;
//! - sale settings come from the origin (at most one fetch a second); when it
//!   fails the last stored settings stand.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};
use token::{Claims, TicketData, TokenType};
use worker::{
    DurableObject, Env, Fetch, Headers, Request, Response, Result, SqlStorage, SqlStorageValue,
    State, durable_object, js_sys,
};

use crate::api::{self, ApiError};
use crate::draw;
use crate::frontier::{Frontier, Inputs, Params};
use crate::glue::{now_ms, ring, send_with_timeout};
use crate::queue::{self, ADMIT_TTL_SECS, Snapshot, TICKET_TTL_SECS};

/// A stored ticket is re-used while it has at least this long to live.
const TICKET_REUSE_MIN_SECS: u64 = 3600;
const CONFIG_REFRESH_MS: u64 = 1_000;
const SOLD_OUT_HINT_MS: u64 = 3_000;
const DRAW_PAGE_MAX: u64 = 5_000;

type ApiResult<T> = std::result::Result<T, ApiError>;

#[durable_object]
pub struct SaleQueue {
    state: State,
    env: Env,
    /// Last time the origin's summary was fetched (memory only: a cache).
    fetched_ms: Cell<u64>,
    /// Write-through copy of the `meta` table. This object is the table's
    /// only writer, so the copy cannot go stale; it is rebuilt from SQL
    /// whenever the object starts.
    meta: RefCell<HashMap<String, String>>,
    /// Requests served since the object started (a statistic, memory only).
    requests: Cell<u64>,
    /// The frontier's clock in memory; stored at most once a second (after
    /// a restart it may be up to 1 s behind: at most `rate` extra places).
    frontier_clock: Cell<u64>,
}

#[derive(Deserialize)]
struct KvRow {
    k: String,
    v: String,
}

#[derive(Deserialize)]
struct EntryRow {
    seq: f64,
    place: Option<f64>,
    ticket: Option<String>,
    ticket_place: Option<f64>,
    ticket_exp: Option<f64>,
}

#[derive(Deserialize)]
struct SubRow {
    sub: String,
}

#[derive(Deserialize)]
struct DrawRow {
    place: f64,
    draw_key: String,
}

fn sql_err(e: worker::Error) -> ApiError {
    ApiError::new(500, "queue_storage", format!("queue storage error: {e}"))
}

fn opt_u64(v: Option<u64>) -> SqlStorageValue {
    match v {
        Some(n) => SqlStorageValue::from(n as f64),
        None => SqlStorageValue::Null,
    }
}

impl SaleQueue {
    fn sql(&self) -> SqlStorage {
        self.state.storage().sql()
    }

    fn exec(&self, q: &str, args: Vec<SqlStorageValue>) -> ApiResult<worker::SqlCursor> {
        self.sql().exec(q, Some(args)).map_err(sql_err)
    }

    fn init_schema(&self) -> ApiResult<()> {
        let sql = self.sql();
        for q in [
            "CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL)",
            "CREATE TABLE IF NOT EXISTS entries (
                sub TEXT PRIMARY KEY,
                seq INTEGER NOT NULL UNIQUE,
                joined_ms INTEGER NOT NULL,
                prequeue INTEGER NOT NULL,
                place INTEGER UNIQUE,
                draw_key TEXT,
                ticket TEXT,
                ticket_place INTEGER,
                ticket_exp INTEGER)",
            "CREATE INDEX IF NOT EXISTS entries_draw_key ON entries (draw_key)",
        ] {
            sql.exec(q, None).map_err(sql_err)?;
        }
        let rows = sql
            .exec("SELECT k, v FROM meta", None)
            .map_err(sql_err)?
            .to_array::<KvRow>()
            .map_err(sql_err)?;
        *self.meta.borrow_mut() = rows.into_iter().map(|r| (r.k, r.v)).collect();
        if self.meta("commitment").is_none() {
            let mut seed = [0u8; draw::SEED_BYTES];
            getrandom::fill(&mut seed)
                .map_err(|_| ApiError::new(500, "rng", "CSPRNG unavailable"))?;
            self.set_meta("seed", hex::encode(seed))?;
            self.set_meta("commitment", draw::commitment(&seed))?;
            self.set_meta("next_seq", 1)?;
            self.set_meta("next_place", 1)?;
            self.set_meta("prequeue", 0)?;
        }
        Ok(())
    }

    fn meta(&self, k: &str) -> Option<String> {
        self.meta.borrow().get(k).cloned()
    }

    fn meta_u64(&self, k: &str) -> Option<u64> {
        self.meta(k).and_then(|v| v.parse().ok())
    }

    fn meta_f64(&self, k: &str) -> Option<f64> {
        self.meta(k).and_then(|v| v.parse().ok())
    }

    fn set_meta(&self, k: &str, v: impl ToString) -> ApiResult<()> {
        let v = v.to_string();
        if self.meta.borrow().get(k) == Some(&v) {
            return Ok(());
        }
        self.exec(
            "INSERT INTO meta (k, v) VALUES (?, ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v",
            vec![k.into(), v.as_str().into()],
        )?;
        self.meta.borrow_mut().insert(k.to_string(), v);
        Ok(())
    }

    fn delete_meta(&self, k: &str) -> ApiResult<()> {
        if self.meta.borrow_mut().remove(k).is_some() {
            self.exec("DELETE FROM meta WHERE k = ?", vec![k.into()])?;
        }
        Ok(())
    }

    fn drawn(&self) -> bool {
        self.meta("drawn").as_deref() == Some("1")
    }

    /// Refreshes the sale settings from the origin at most once a second.
    async fn ensure_config(&self, sale: &str) -> ApiResult<()> {
        let now = now_ms();
        let have = self.meta("starts_at_ms").is_some();
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
            return if have {
                Ok(())
            } else {
                Err(ApiError::origin_unavailable())
            };
        };
        self.apply_config(&v, now)
    }

    async fn ensure_config_then_alarm(&self, sale: &str) -> ApiResult<()> {
        self.ensure_config(sale).await?;
        if !self.drawn()
            && let Some(starts) = self.meta_u64("starts_at_ms")
            && self.meta_u64("alarm_ms") != Some(starts)
        {
            let now = now_ms();
            if starts > now {
                let storage = self.state.storage();
                storage
                    .set_alarm(Duration::from_millis(starts - now))
                    .await
                    .map_err(sql_err)?;
            }
            self.set_meta("alarm_ms", starts)?;
        }
        Ok(())
    }

    fn apply_config(&self, v: &Value, now: u64) -> ApiResult<()> {
        let time = |k: &str| {
            v[k].as_str()
                .map(js_sys::Date::parse)
                .filter(|ms| ms.is_finite())
                .map(|ms| ms.max(0.0) as u64)
        };
        let Some(starts) = time("starts_at") else {
            return Err(ApiError::new(502, "origin_error", "sale has no starts_at"));
        };
        if !self.drawn() {
            self.set_meta("starts_at_ms", starts)?;
        }
        match time("ends_at") {
            Some(e) => self.set_meta("ends_at_ms", e)?,
            None => self.delete_meta("ends_at_ms")?,
        }
        let rate = v["admission_rate"]
            .as_f64()
            .filter(|r| r.is_finite() && *r > 0.0);
        self.set_meta("rate", rate.unwrap_or(10.0))?;
        let factor = v["admission_factor"]
            .as_f64()
            .filter(|f| f.is_finite() && *f > 0.0);
        self.set_meta("factor", factor.unwrap_or(2.0))?;
        if let Some(u) = v["units_available"].as_u64() {
            self.set_meta("units_available", u)?;
        }
        let sold_out = v["sold_out"].as_bool() == Some(true)
            || v["phase"].as_str() == Some("sold_out")
            || v["units_available"].as_u64() == Some(0);
        self.set_meta("origin_sold_out", u8::from(sold_out))?;
        let closed = v["phase"].as_str() == Some("ended");
        self.set_meta("closed", u8::from(closed))?;
        self.set_meta("config_ms", now)?;
        Ok(())
    }

    /// Draws the pre-queue order once the start has come.
    /// `now` is when what is being handled happened (a join's arrival).
    fn draw_if_due(&self, now: u64) -> ApiResult<()> {
        if !queue::draw_due(now, self.meta_u64("starts_at_ms"), self.drawn()) {
            return Ok(());
        }
        let seed = self
            .meta("seed")
            .ok_or_else(|| ApiError::new(500, "queue_storage", "seed missing"))?;
        let subs: Vec<String> = self
            .exec("SELECT sub FROM entries WHERE prequeue = 1", vec![])?
            .to_array::<SubRow>()
            .map_err(sql_err)?
            .into_iter()
            .map(|r| r.sub)
            .collect();
        let order = draw::draw_order(&seed, &subs);
        for d in &order {
            self.exec(
                "UPDATE entries SET place = ?, draw_key = ? WHERE sub = ?",
                vec![
                    (d.place as f64).into(),
                    d.key.as_str().into(),
                    d.account.as_str().into(),
                ],
            )?;
        }
        self.set_meta("next_place", order.len() as u64 + 1)?;
        self.set_meta("buckets", draw::bucket_count(order.len() as u64))?;
        self.set_meta("drawn_at_ms", now)?;
        self.set_meta("drawn", 1)?;
        Ok(())
    }

    fn sold_out(&self, now: u64) -> bool {
        self.meta("origin_sold_out").as_deref() == Some("1")
            || self.meta_u64("sold_out_until_ms").is_some_and(|u| now < u)
    }

    fn params(&self) -> Params {
        Params {
            rate: self.meta_f64("rate").unwrap_or(10.0),
            factor: self.meta_f64("factor").unwrap_or(2.0),
            window_ms: ADMIT_TTL_SECS * 1000,
        }
    }

    /// The frontier: its history (JSON, rewritten only when the frontier
    /// moves or a checkpoint is added) plus its clock, kept as its own small
    /// value because it changes on every request.
    fn frontier(&self) -> Frontier {
        let mut f: Frontier = self
            .meta("frontier")
            .and_then(|f| serde_json::from_str(&f).ok())
            .unwrap_or_default();
        if let Some(t) = self.meta_u64("frontier_last_ms") {
            f.last_ms = f.last_ms.max(t);
        }
        f.last_ms = f.last_ms.max(self.frontier_clock.get());
        f
    }

    fn advance(&self, now: u64) -> ApiResult<Frontier> {
        let mut f = self.frontier();
        let Some(starts) = self.meta_u64("starts_at_ms") else {
            return Ok(f);
        };
        let placed = if self.drawn() {
            self.meta_u64("next_place").unwrap_or(1).saturating_sub(1)
        } else {
            0
        };
        let before = f.clone();
        f.advance(
            self.params(),
            Inputs {
                now_ms: now,
                starts_at_ms: starts,
                placed,
                units_available: self.meta_u64("units_available"),
                sold_out: self.sold_out(now),
            },
        );
        if f.admitted != before.admitted || f.checkpoints != before.checkpoints {
            self.set_meta("frontier", serde_json::to_string(&f).unwrap_or_default())?;
        }
        self.frontier_clock.set(f.last_ms);
        let stored = self.meta_u64("frontier_last_ms").unwrap_or(0);
        if f.last_ms.saturating_sub(stored) >= 1_000 {
            self.set_meta("frontier_last_ms", f.last_ms)?;
        }
        Ok(f)
    }

    fn snapshot(&self, sale: &str, now: u64) -> ApiResult<Snapshot> {
        let f = self.advance(now)?;
        let p = self.params();
        let drawn = self.drawn();
        let next_seq = self.meta_u64("next_seq").unwrap_or(1);
        let next_place = self.meta_u64("next_place").unwrap_or(1);
        Ok(Snapshot {
            sale: sale.to_string(),
            now_ms: now,
            starts_at_ms: self.meta_u64("starts_at_ms").unwrap_or(0),
            ends_at_ms: self.meta_u64("ends_at_ms"),
            rate: p.rate,
            drawn,
            entries: next_seq.saturating_sub(1),
            prequeue: self.meta_u64("prequeue").unwrap_or(0),
            placed: if drawn {
                next_place.saturating_sub(1)
            } else {
                0
            },
            frontier: f.admitted_places(),
            expired: f.expired_at(now, p.window_ms).floor().max(0.0) as u64,
            sold_out: self.sold_out(now),
            closed: self.meta("closed").as_deref() == Some("1"),
            commitment: self.meta("commitment").unwrap_or_default(),
            seed: if drawn { self.meta("seed") } else { None },
            do_requests: self.requests.get(),
            buckets: if drawn {
                self.meta_u64("buckets").unwrap_or(1)
            } else {
                0
            },
            // Only checkpoints younger than a window can be the first to
            // reach a place whose window is still open.
            frontier_history: f
                .checkpoints
                .iter()
                .filter(|(t, _)| t.saturating_add(p.window_ms) > now)
                .copied()
                .collect(),
        })
    }

    fn entry(&self, sub: &str) -> ApiResult<Option<EntryRow>> {
        Ok(self
            .exec(
                "SELECT seq, place, ticket, ticket_place, ticket_exp FROM entries WHERE sub = ?",
                vec![sub.into()],
            )?
            .to_array::<EntryRow>()
            .map_err(sql_err)?
            .into_iter()
            .next())
    }

    /// Signs a fresh ticket for `sub` carrying `seq` and `place`.
    fn mint_ticket(
        &self,
        sale: &str,
        sub: &str,
        seq: u64,
        place: Option<u64>,
        now: u64,
    ) -> ApiResult<(String, u64)> {
        let ring = ring(&self.env, "ADMISSION_TOKEN_KEYS")?;
        let claims = Claims::new(
            TokenType::Ticket,
            sub,
            Some(sale.to_string()),
            now / 1000,
            TICKET_TTL_SECS,
        )
        .with_ticket(TicketData { seq, place });
        Ok((ring.sign(&claims), claims.exp))
    }

    /// The account's ticket: the stored one while it still says the right
    /// place and has long to live, else a fresh one (stored).
    fn ticket_for(&self, sale: &str, sub: &str, row: &EntryRow, now: u64) -> ApiResult<String> {
        let place = row.place.map(|p| p as u64);
        if let (Some(t), Some(exp)) = (&row.ticket, row.ticket_exp)
            && row.ticket_place.map(|p| p as u64) == place
            && (exp as u64) > now / 1000 + TICKET_REUSE_MIN_SECS
        {
            return Ok(t.clone());
        }
        let (t, exp) = self.mint_ticket(sale, sub, row.seq as u64, place, now)?;
        self.exec(
            "UPDATE entries SET ticket = ?, ticket_place = ?, ticket_exp = ? WHERE sub = ?",
            vec![
                t.as_str().into(),
                opt_u64(place),
                (exp as f64).into(),
                sub.into(),
            ],
        )?;
        Ok(t)
    }

    fn join(&self, sale: &str, sub: &str, now: u64) -> ApiResult<(String, Option<u64>)> {
        if let Some(row) = self.entry(sub)? {
            let t = self.ticket_for(sale, sub, &row, now)?;
            return Ok((t, row.place.map(|p| p as u64)));
        }
        let drawn = self.drawn();
        let seq = self.meta_u64("next_seq").unwrap_or(1);
        let place = if drawn {
            Some(self.meta_u64("next_place").unwrap_or(1))
        } else {
            None
        };
        let (ticket, exp) = self.mint_ticket(sale, sub, seq, place, now)?;
        self.exec(
            "INSERT INTO entries (sub, seq, joined_ms, prequeue, place, ticket, ticket_place, ticket_exp)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            vec![
                sub.into(),
                (seq as f64).into(),
                (now as f64).into(),
                i64::from(!drawn).into(),
                opt_u64(place),
                ticket.as_str().into(),
                opt_u64(place),
                (exp as f64).into(),
            ],
        )?;
        self.set_meta("next_seq", seq + 1)?;
        match place {
            Some(p) => self.set_meta("next_place", p + 1)?,
            None => self.set_meta("prequeue", self.meta_u64("prequeue").unwrap_or(0) + 1)?,
        }
        Ok((ticket, place))
    }

    /// One bucket of the drawn order (see `draw`): immutable once drawn.
    fn bucket(&self, url: &worker::Url) -> ApiResult<Value> {
        if !self.drawn() {
            return Err(ApiError::new(
                409,
                "not_drawn",
                "the draw has not happened yet",
            ));
        }
        let buckets = self.meta_u64("buckets").unwrap_or(1);
        let i = url
            .query_pairs()
            .find(|(k, _)| k == "i")
            .and_then(|(_, v)| v.parse::<u64>().ok())
            .filter(|i| *i < buckets)
            .ok_or_else(|| ApiError::new(400, "bad_request", "bucket index out of range"))?;
        let (lo, hi) = draw::bucket_bounds(i, buckets);
        let rows = match &hi {
            Some(hi) => self.exec(
                "SELECT place, draw_key FROM entries WHERE prequeue = 1 AND draw_key >= ? AND draw_key < ? ORDER BY draw_key",
                vec![lo.as_str().into(), hi.as_str().into()],
            )?,
            None => self.exec(
                "SELECT place, draw_key FROM entries WHERE prequeue = 1 AND draw_key >= ? ORDER BY draw_key",
                vec![lo.as_str().into()],
            )?,
        }
        .to_array::<DrawRow>()
        .map_err(sql_err)?;
        let first_place = rows.first().map(|r| r.place as u64).unwrap_or(0);
        let keys: Vec<String> = rows.into_iter().map(|r| r.draw_key).collect();
        Ok(json!({"bucket": i, "buckets": buckets, "first_place": first_place, "keys": keys}))
    }

    fn draw_page(&self, url: &worker::Url) -> ApiResult<Value> {
        let mut from = 1u64;
        let mut limit = 1_000u64;
        for (k, v) in url.query_pairs() {
            match k.as_ref() {
                "from" => from = v.parse().unwrap_or(1).max(1),
                "limit" => limit = v.parse().unwrap_or(1_000).clamp(1, DRAW_PAGE_MAX),
                _ => {}
            }
        }
        let drawn = self.drawn();
        let mut body = json!({
            "commitment": self.meta("commitment"),
            "method": draw::METHOD,
            "drawn": drawn,
            "prequeue": self.meta_u64("prequeue").unwrap_or(0),
        });
        if drawn {
            let rows = self
                .exec(
                    "SELECT place, draw_key FROM entries WHERE prequeue = 1 AND place >= ? ORDER BY place LIMIT ?",
                    vec![(from as f64).into(), (limit as f64).into()],
                )?
                .to_array::<DrawRow>()
                .map_err(sql_err)?;
            body["seed"] = json!(self.meta("seed"));
            body["drawn_at_ms"] = json!(self.meta_u64("drawn_at_ms"));
            body["from"] = json!(from);
            body["entries"] = rows
                .into_iter()
                .map(|r| json!({"place": r.place as u64, "key": r.draw_key}))
                .collect();
        }
        Ok(body)
    }

    async fn handle(&self, req: &mut Request) -> ApiResult<Value> {
        // Read before any await: a join is placed by when it came, not by
        // how long this request then waited on the origin.
        let received = now_ms();
        let sale = req
            .headers()
            .get("x-sale")
            .ok()
            .flatten()
            .filter(|s| api::valid_id(s))
            .ok_or_else(|| ApiError::new(400, "bad_request", "x-sale missing"))?;
        self.requests.set(self.requests.get() + 1);
        if self.meta("sale").is_none() {
            self.set_meta("sale", &sale)?;
        }
        let url = req.url().map_err(|_| ApiError::not_found())?;
        let method = req.method().to_string();
        let query = |k: &str| {
            url.query_pairs()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.into_owned())
        };
        if self.meta("starts_at_ms").is_none() {
            // Nobody can be placed before the start is known.
            self.ensure_config_then_alarm(&sale).await?;
        }
        // A join is placed now, synchronously, by its arrival (the Worker's
        // stamp when believable): no alarm or other request can draw in
        // between, so a press before the start is in the draw however long
        // the settings refresh below then takes.
        let joined = if method == "POST" && url.path() == "/join" {
            let sub = query("sub")
                .filter(|s| !s.is_empty() && s.len() <= 256)
                .ok_or_else(|| ApiError::new(400, "bad_request", "sub missing"))?;
            let stamped = query("arrival_ms").and_then(|v| v.parse().ok());
            let arrival = queue::arrival_ms(received, stamped);
            self.draw_if_due(arrival)?;
            Some(self.join(&sale, &sub, arrival)?)
        } else {
            None
        };
        self.ensure_config_then_alarm(&sale).await?;
        let now = now_ms();
        self.draw_if_due(now)?;
        if let Some((ticket, place)) = joined {
            return Ok(
                json!({"ticket": ticket, "place": place, "snapshot": self.snapshot(&sale, now)?}),
            );
        }
        match (method.as_str(), url.path()) {
            ("GET", "/place") => {
                let sub = url
                    .query_pairs()
                    .find(|(k, _)| k == "sub")
                    .map(|(_, v)| v.into_owned())
                    .ok_or_else(|| ApiError::new(400, "bad_request", "sub missing"))?;
                let row = self.entry(&sub)?.ok_or_else(|| {
                    ApiError::new(404, "not_in_queue", "no such entry in this queue")
                })?;
                let ticket = self.ticket_for(&sale, &sub, &row, now)?;
                let place = row.place.map(|p| p as u64);
                Ok(
                    json!({"ticket": ticket, "place": place, "snapshot": self.snapshot(&sale, now)?}),
                )
            }
            ("GET", "/snapshot") => {
                Ok(serde_json::to_value(self.snapshot(&sale, now)?).unwrap_or(Value::Null))
            }
            ("POST", "/sold_out") => {
                self.set_meta("sold_out_until_ms", now + SOLD_OUT_HINT_MS)?;
                Ok(serde_json::to_value(self.snapshot(&sale, now)?).unwrap_or(Value::Null))
            }
            ("GET", "/draw") => self.draw_page(&url),
            ("GET", "/bucket") => self.bucket(&url),
            _ => Err(ApiError::not_found()),
        }
    }
}

fn respond(status: u16, body: String) -> Result<Response> {
    let h = Headers::new();
    h.set("content-type", "application/json")?;
    Ok(Response::ok(body)?.with_status(status).with_headers(h))
}

impl DurableObject for SaleQueue {
    fn new(state: State, env: Env) -> Self {
        let q = SaleQueue {
            state,
            env,
            fetched_ms: Cell::new(0),
            meta: RefCell::new(HashMap::new()),
            requests: Cell::new(0),
            frontier_clock: Cell::new(0),
        };
        if let Err(e) = q.init_schema() {
            worker::console_error!("sale queue schema: {}", e.message);
        }
        q
    }

    async fn fetch(&self, mut req: Request) -> Result<Response> {
        match self.handle(&mut req).await {
            Ok(v) => respond(200, v.to_string()),
            Err(e) => respond(e.status, e.body()),
        }
    }

    async fn alarm(&self) -> Result<Response> {
        let now = now_ms();
        if let Err(e) = self.draw_if_due(now) {
            worker::console_error!("draw failed: {}", e.message);
        }
        if !self.drawn()
            && let Some(starts) = self.meta_u64("starts_at_ms")
        {
            // The start moved later: wake up then.
            let wait = starts.saturating_sub(now).max(100);
            self.state
                .storage()
                .set_alarm(Duration::from_millis(wait))
                .await?;
        }
        Response::ok("ok")
    }
}
