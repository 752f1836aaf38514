//! The `QueueShard` Durable Object (Wasm only): one of a sale's
//! `queue_shards` objects, holding the entries of the accounts that map to
//! it. I/O only: it reads requests, keeps the clock, the alarm and the
//! request count, and calls the coordinator; what each request and alarm
//! does is decided by `queue::entries` over the object's SQLite storage.
//!
//! Invariants kept here:
//! - a join's arrival is the object's clock read before anything else (no
//!   await before it);
//! - the draw runs only in the alarm, one bounded step per alarm (the next
//!   at once, so requests queued meanwhile go first); the key is asked of
//!   the coordinator only once the start has come;
//! - an alarm a join asked for during the alarm's awaits is never pushed
//!   back (`entries::next_alarm`).

use std::cell::Cell;

use serde_json::{Value, json};
use worker::{DurableObject, Env, Method, Request, Response, Result, State, durable_object};

use crate::api::error::{ApiError, ApiResult};
use crate::http::keys::ring;
use crate::http::respond::{now_ms, query};
use crate::objects::call::{call_object, respond, sale_of};
use crate::objects::storage::DoSql;
use crate::queue::entries::{
    self, BulkBody, Entries, JoinBody, SeenBody, TurnBody, counts_as_isolate_call, page_of,
};

#[durable_object]
pub struct QueueShard {
    state: State,
    env: Env,
    entries: Entries<DoSql>,
    /// Requests served since the object started (reported, for the
    /// benchmark of object calls per poll).
    requests: Cell<u64>,
    /// When the next alarm is known to be due (memory only).
    alarm_at: Cell<Option<u64>>,
}

impl QueueShard {
    /// Makes sure an alarm will come by `at` (one storage write when none
    /// is known to be due by then).
    async fn alarm_by(&self, at: u64) -> ApiResult<()> {
        if self.alarm_at.get().is_some_and(|a| a <= at) {
            return Ok(());
        }
        let storage = self.state.storage();
        let current = storage.get_alarm().await.map_err(storage_err)?;
        if let Some(c) = current.filter(|c| *c >= 0).map(|c| c as u64)
            && c <= at
        {
            self.alarm_at.set(Some(c));
            return Ok(());
        }
        let now = now_ms();
        storage
            .set_alarm(at.saturating_sub(now) as i64)
            .await
            .map_err(storage_err)?;
        self.alarm_at.set(Some(at));
        Ok(())
    }

    async fn handle(&self, req: &mut Request) -> ApiResult<Value> {
        let sale = sale_of(req)?;
        let url = req.url().map_err(|_| ApiError::not_found())?;
        let bad = |_| ApiError::new(400, "bad_request", "bad body");
        if counts_as_isolate_call(url.path()) {
            self.requests.set(self.requests.get() + 1);
        }
        let e = &self.entries;
        let page = || page_of(query(&url, "after"), query(&url, "limit"));
        match (req.method(), url.path()) {
            (Method::Post, "/join") => {
                let b: JoinBody = req.json().await.map_err(bad)?;
                let j = e.join(&sale, b, now_ms(), || {
                    ring(&self.env, "ADMISSION_TOKEN_KEYS")
                })?;
                if let Some(at) = j.alarm_by {
                    self.alarm_by(at).await?;
                }
                Ok(j.answer)
            }
            (Method::Post, "/bulk") => {
                let b: BulkBody = req.json().await.map_err(bad)?;
                let (v, at) = e.bulk(&sale, b, now_ms())?;
                self.alarm_by(at).await?;
                Ok(v)
            }
            (Method::Post, "/poke") => {
                // The coordinator wakes a shard nobody joined, so it draws
                // (nothing) and reports like the others.
                let b: JoinBody = req.json().await.map_err(bad)?;
                e.configure(&sale, b.shard, b.shards, b.starts_at_ms, b.ends_at_ms)?;
                self.alarm_by(now_ms()).await?;
                Ok(json!({"ok": true}))
            }
            (Method::Post, "/seen") => {
                let b: SeenBody = req.json().await.map_err(bad)?;
                e.seen(&b, now_ms())
            }
            (Method::Post, "/held") => {
                let b: TurnBody = req.json().await.map_err(bad)?;
                e.held(&b, now_ms())
            }
            (Method::Post, "/released") => {
                let b: TurnBody = req.json().await.map_err(bad)?;
                e.released(&b, now_ms())
            }
            (Method::Post, "/revoke") => {
                let b: TurnBody = req.json().await.map_err(bad)?;
                let v = e.revoke(&b, now_ms())?;
                // Reported with the next finished second, not later.
                self.alarm_by(now_ms()).await?;
                Ok(v)
            }
            (Method::Get, "/bucket") => {
                e.bucket(query(&url, "j").and_then(|v| v.parse::<u64>().ok()))
            }
            (Method::Get, "/leaves") => e.leaves(page()?, now_ms()),
            (Method::Get, "/ranked") => e.ranked(page()?),
            (Method::Get, "/state") => Ok(e.state()),
            _ => Err(ApiError::not_found()),
        }
    }

    async fn coordinator(&self, method: Method, path: &str, body: &Value) -> ApiResult<Value> {
        let sale = self
            .entries
            .sale()
            .ok_or_else(|| ApiError::new(500, "queue_storage", "sale unknown"))?;
        // A GET carries no body (fetch refuses one).
        let body = (method != Method::Get).then_some(body);
        call_object(&self.env, "SALE_QUEUE", &sale, &sale, method, path, body).await
    }

    /// One step of the draw. Returns whether the draw is done.
    async fn draw_step(&self) -> ApiResult<bool> {
        if self.entries.drawn() {
            return Ok(true);
        }
        // Freeze the entrant set before the first await.
        self.entries.freeze()?;
        // The key needs the whole frozen set's root and the beacon: the
        // coordinator answers 409 until it has both.
        let key = match self.entries.key() {
            Some(k) => k,
            None => {
                let v = self.coordinator(Method::Get, "/key", &json!({})).await?;
                let k = v["key"]
                    .as_str()
                    .and_then(::draw::from_hex)
                    .ok_or_else(|| ApiError::new(502, "queue_error", "no key"))?;
                self.entries.set_key(&k)?;
                k
            }
        };
        self.entries.draw_step(&key)
    }

    /// Sends the shard's draw index to the coordinator (once).
    async fn send_index(&self) -> ApiResult<()> {
        let Some(body) = self.entries.index_report(self.requests.get())? else {
            return Ok(());
        };
        self.coordinator(Method::Post, "/drawn", &body).await?;
        self.entries.index_sent()
    }

    /// Reports counts (before the start) or every finished second's
    /// arrivals (after it) to the coordinator.
    async fn report(&self, now: u64) -> ApiResult<()> {
        let Some(r) = self.entries.report(now, self.requests.get())? else {
            return Ok(());
        };
        self.coordinator(Method::Post, "/report", &r.body).await?;
        self.entries.report_sent(&r)
    }
}

fn storage_err(e: worker::Error) -> ApiError {
    crate::store::sql::storage_error(e)
}

impl DurableObject for QueueShard {
    fn new(state: State, env: Env) -> Self {
        let sql = || DoSql(state.storage().sql());
        let entries = Entries::open(sql()).unwrap_or_else(|e| {
            worker::console_error!("queue shard init: {}", e.message);
            Entries::unopened(sql())
        });
        QueueShard {
            state,
            env,
            entries,
            requests: Cell::new(0),
            alarm_at: Cell::new(None),
        }
    }

    async fn fetch(&self, mut req: Request) -> Result<Response> {
        respond(self.handle(&mut req).await)
    }

    async fn alarm(&self) -> Result<Response> {
        self.alarm_at.set(None);
        let now = now_ms();
        let starts = self.entries.starts_at();
        let storage = self.state.storage();
        if entries::draw_due(now, starts) {
            match self.draw_step().await {
                Ok(false) => {
                    // Next step at once: requests queued meanwhile go first.
                    storage.set_alarm(0i64).await?;
                    self.alarm_at.set(Some(now));
                    return Response::ok("drawing");
                }
                Ok(true) => {
                    if let Err(e) = self.send_index().await {
                        worker::console_error!("shard index: {}", e.message);
                    }
                }
                // 409: the key is not known yet (freeze, beacon): next second.
                Err(e) if e.status == 409 => {}
                Err(e) => worker::console_error!("draw step: {}", e.message),
            }
        }
        let reported = self.report(now).await;
        if let Err(e) = &reported {
            worker::console_error!("shard report: {}", e.message);
        }
        // A join during this alarm's awaits may have asked for an earlier
        // alarm (its count must be reported): never push that one back.
        let next = entries::next_alarm(
            now,
            starts,
            self.entries.ends_at(),
            reported.is_ok(),
            self.alarm_at.get(),
        );
        if let Some(at) = next {
            storage.set_alarm(at.saturating_sub(now) as i64).await?;
            self.alarm_at.set(Some(at));
        }
        Response::ok("ok")
    }
}
