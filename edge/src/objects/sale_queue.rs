//! The `SaleQueue` Durable Object (Wasm only): a sale's queue coordinator,
//! one per sale. I/O only: it reads requests, fetches the origin's summary
//! (at most once a second), keeps the clock and the alarm, and calls its
//! shards; what each request and alarm does is decided by
//! `queue::coordinator` over the object's SQLite storage.
//!
//! Invariants kept here:
//! - sale settings come from the origin at most once a second; when the
//!   origin fails the last stored settings stand, and a 404 refuses the
//!   request (no object state for an unknown sale);
//! - the alarm chain runs from the first request that knows the start
//!   until the sale is closed: at the start, then once a second (at once
//!   while the draw has a step to do); it refreshes the settings, steps
//!   the draw and the admission controller and stores the frontier;
//! - no draw step runs in a request.

use std::cell::Cell;

use serde_json::Value;
use worker::{
    DurableObject, Env, Fetch, Method, Request, Response, Result, State, durable_object, js_sys,
};

use crate::admission::control::Mode;
use crate::api::error::{ApiError, ApiResult};
use crate::draw::hash;
use crate::http::origin::{origin_url, send_with_timeout};
use crate::http::respond::{now_ms, query};
use crate::objects::call::{call_object, respond, sale_of};
use crate::objects::storage::DoSql;
use crate::queue::coordinator::{self, Coordinator, Drawn, Io, Report, Settings};
use crate::queue::shards;
use crate::store::sql::storage_error;

/// The origin's summary is fetched at most this often.
const CONFIG_REFRESH_MS: u64 = 1_000;

#[durable_object]
pub struct SaleQueue {
    state: State,
    env: Env,
    coordinator: Coordinator<DoSql>,
    /// Last time the origin's summary was fetched (memory only: a cache).
    fetched_ms: Cell<u64>,
    /// Whether an alarm is known to be set (memory only).
    alarm_known: Cell<bool>,
}

/// The coordinator's world: its shards (Durable Object calls), `fetch`,
/// `Date.parse` and the console.
struct World<'a>(&'a Env);

impl Io for World<'_> {
    async fn shard_pages(&self, sale: &str, calls: Vec<(u32, String)>) -> Vec<ApiResult<Value>> {
        let env = self.0;
        let calls = calls.into_iter().map(|(k, q)| {
            let name = shards::object_name(sale, k);
            async move { call_object(env, "QUEUE_SHARD", &name, sale, Method::Get, &q, None).await }
        });
        futures::future::join_all(calls).await
    }

    async fn get_json(&self, url: &str) -> Option<Value> {
        let u = worker::Url::parse(url).ok()?;
        let mut r = send_with_timeout(Fetch::Url(u), 2_000).await.ok()?;
        if r.status_code() != 200 {
            return None;
        }
        serde_json::from_str(&r.text().await.ok()?).ok()
    }

    fn parse_time(&self, text: &str) -> Option<u64> {
        let ms = js_sys::Date::parse(text);
        ms.is_finite().then(|| ms.max(0.0) as u64)
    }

    fn log(&self, line: &str) {
        worker::console_error!("{}", line);
    }

    fn note(&self, line: &str) {
        worker::console_log!("{}", line);
    }
}

impl SaleQueue {
    /// Refreshes the sale settings from the origin at most once a second.
    async fn ensure_config(&self, sale: &str) -> ApiResult<()> {
        let now = now_ms();
        let have = self.coordinator.starts_at().is_some();
        if have && now.saturating_sub(self.fetched_ms.get()) < CONFIG_REFRESH_MS {
            return Ok(());
        }
        self.fetched_ms.set(now);
        let url = format!("{}/api/sales/{}", origin_url(&self.env), sale);
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
            self.coordinator.set_sample(None);
            return if have {
                Ok(())
            } else {
                Err(ApiError::origin_unavailable())
            };
        };
        self.coordinator
            .set_sample(Some(coordinator::health_sample(&v, now)));
        self.coordinator
            .apply_config(&v, now_ms(), &World(&self.env))
    }

    /// Makes sure the alarm chain runs (a write only when it does not).
    async fn ensure_alarm(&self) -> ApiResult<()> {
        let Some(starts) = self.coordinator.starts_at() else {
            return Ok(());
        };
        if self.alarm_known.get() {
            return Ok(());
        }
        let storage = self.state.storage();
        if storage.get_alarm().await.map_err(storage_error)?.is_none() && !self.coordinator.closed()
        {
            let wait = starts.saturating_sub(now_ms());
            storage
                .set_alarm(wait as i64)
                .await
                .map_err(storage_error)?;
        }
        self.alarm_known.set(true);
        Ok(())
    }

    async fn handle(&self, req: &mut Request) -> ApiResult<Value> {
        let sale = sale_of(req)?;
        let c = &self.coordinator;
        c.set_sale(&sale)?;
        let url = req.url().map_err(|_| ApiError::not_found())?;
        c.count_request(url.path());
        self.ensure_config(&sale).await?;
        self.ensure_alarm().await?;
        let now = now_ms();
        let bad = |_| ApiError::new(400, "bad_request", "bad body");
        let q = |k: &str| query(&url, k);
        let json = |v| serde_json::to_value(v).unwrap_or(Value::Null);
        match (req.method(), url.path()) {
            (Method::Get, "/snapshot") => Ok(json(c.snapshot(&sale, now)?)),
            (Method::Post, "/sold_out") => {
                c.sold_out_hint(now)?;
                Ok(json(c.snapshot(&sale, now)?))
            }
            (Method::Get, "/key") => c.key(),
            (Method::Get, "/proof") => c.proof(q),
            (Method::Get, "/listing") => c.listing(q),
            (Method::Post, "/drawn") => {
                let d: Drawn = req.json().await.map_err(bad)?;
                c.record_drawn(d, now)
            }
            (Method::Post, "/report") => {
                let r: Report = req.json().await.map_err(bad)?;
                c.record_report(r)
            }
            (Method::Get, "/index") => c.index(),
            (Method::Get, "/arrivals") => c.arrivals(q),
            (Method::Get, "/draw") => c.draw_header(),
            (Method::Post, "/shadowed") => c.shadowed(),
            (Method::Post, "/bot-refused") => c.bot_refused(),
            (Method::Get, "/metrics") => {
                let f = c.figures(&sale, now)?;
                Ok(serde_json::to_value(f).unwrap_or(Value::Null))
            }
            _ => Err(ApiError::not_found()),
        }
    }
}

impl DurableObject for SaleQueue {
    fn new(state: State, env: Env) -> Self {
        let setting = |name: &str| env.var(name).ok().map(|v| v.to_string());
        let settings = Settings {
            mode: Mode::from_setting(setting("ADMISSION_CONTROL").as_deref()).unwrap_or_default(),
            beacon_wait_ms: hash::beacon_wait_ms(setting("DRAW_BEACON_WAIT_SECS").as_deref()),
        };
        let sql = || DoSql(state.storage().sql());
        let coordinator = Coordinator::open(sql(), settings).unwrap_or_else(|e| {
            worker::console_error!("sale queue init: {}", e.message);
            Coordinator::unopened(sql(), settings)
        });
        SaleQueue {
            state,
            env,
            coordinator,
            fetched_ms: Cell::new(0),
            alarm_known: Cell::new(false),
        }
    }

    async fn fetch(&self, mut req: Request) -> Result<Response> {
        respond(self.handle(&mut req).await)
    }

    /// Once a second from the start: refresh settings, step the draw and
    /// the controller, store the frontier checkpoint, wake shards that
    /// have not drawn.
    async fn alarm(&self) -> Result<Response> {
        let c = &self.coordinator;
        let Some(sale) = c.sale() else {
            return Response::ok("no sale");
        };
        if let Err(e) = self.ensure_config(&sale).await {
            worker::console_error!("coordinator config: {}", e.message);
        }
        let now = now_ms();
        let starts = c.starts_at().unwrap_or(u64::MAX);
        let storage = self.state.storage();
        if now < starts {
            storage.set_alarm(starts.saturating_sub(now) as i64).await?;
            return Response::ok("waiting");
        }
        for (k, body) in c.pokes(now) {
            let name = shards::object_name(&sale, k);
            let _ = call_object(
                &self.env,
                "QUEUE_SHARD",
                &name,
                &sale,
                Method::Post,
                "/poke",
                Some(&body),
            )
            .await;
        }
        let world = World(&self.env);
        let more = match c.draw_step(&world, &sale, now).await {
            Ok(m) => m,
            Err(e) => {
                worker::console_error!("draw step: {}", e.message);
                false
            }
        };
        if let Err(e) = c.step_controller(now, &world) {
            worker::console_error!("admission controller: {}", e.message);
        }
        c.checkpoint(now, &world);
        match coordinator::next_alarm_in(more, c.take_step_gap(), c.closed()) {
            // The next draw step at once (the listing's after a short
            // gap): requests queued meanwhile go first.
            Some(ms) => storage.set_alarm(ms as i64).await?,
            None => self.alarm_known.set(false),
        }
        Response::ok("ok")
    }
}
