//! Edge mode of the simulator (`loadgen sale --edge <url> --origin <url>`):
//! the same sale as direct mode, but people go through the real edge (the
//! Worker under `wrangler dev`) the way a browser does.
//!
//! Each simulated person, at their arrival time (some before the start: the
//! pre-queue), mints a `user` token (USER_TOKEN_KEYS, as the shop's login
//! would), joins the queue, and then polls their status exactly when told:
//! the next poll is sent no earlier than `poll_after_ms` after the previous
//! answer (never early; late only when the local stack is saturated, and
//! that lateness is measured). A fresh `ticket` in an answer replaces the
//! old one. When `admitted`, they reserve through the edge with the
//! `admission_token`, then pay (purchase through the edge, then the
//! provider's signed webhook straight to the origin, as a payment provider
//! does), cancel, or walk away and let the hold expire. Told `sold_out`,
//! they keep polling as told for a while (exponential patience) and leave;
//! told `closed`, they leave.
//!
//! Requests to the edge go through two bounded pools (queue calls, checkout
//! calls): the local dev stack serves a few hundred requests per second,
//! and a person whose poll is due waits for a free slot rather than
//! overrunning it. Every poll's lateness (sent − due) is recorded.
//!
//! The report adds to direct mode's: queue figures over time (the edge's
//! own summary), edge answers by status, polls per person, poll lateness,
//! and the origin's reservation request count (its `/metrics`, scraped
//! every second) against the edge's admission rate. The invariants are the
//! same checks, read back from Postgres and Redis.
//!
//! Bounded: at most `--accounts` people (≤ 100,000 in this mode), at most
//! `--max-seconds`, loopback targets only.
//!
//! `loadgen compare` (at the end) charts several edge-mode reports of one
//! sale shape side by side.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use rand::Rng;
use serde::Serialize;
use serde_json::{Value, json};
use token::{Claims, TokenType};
use tokio::sync::Semaphore;

use crate::sim::args::SaleArgs;
use crate::sim::report::{Sample, chart, summary_text};
use crate::sim::sale::{create_sim_sale, invariants};

#[derive(Default)]
struct Counters {
    arrived: AtomicU64,
    joined: AtomicU64,
    join_failed: AtomicU64,
    in_queue: AtomicI64,
    polls: AtomicU64,
    admitted_seen: AtomicU64,
    reserve_requests: AtomicU64,
    holds: AtomicI64,
    holding_units: AtomicI64,
    paid_units: AtomicI64,
    cancelled: AtomicU64,
    walked_away: AtomicU64,
    refused_sold_out_edge: AtomicU64,
    refused_sold_out_origin: AtomicU64,
    refused_limit: AtomicU64,
    retried: AtomicU64,
    errors: AtomicU64,
    left_sold_out: AtomicU64,
    left_closed: AtomicU64,
    left_other: AtomicU64,
    /// Admitted people who closed the tab (`--walk-away-admitted`).
    abandoned_turns: AtomicU64,
    /// Admitted people who wanted to reserve and whose window ended before
    /// any answer but 429/503/no answer (or whose turn was closed while
    /// they were checking out): places burned.
    windows_burned: AtomicU64,
    /// Of those, turns the edge closed while the person was polling.
    closed_while_checking_out: AtomicU64,
}

struct Stats {
    latency: BTreeMap<&'static str, Histogram<u64>>,
    http: BTreeMap<&'static str, BTreeMap<u16, u64>>,
    /// Queue status answers (joins and polls) by `status`.
    queue_status: BTreeMap<String, u64>,
    /// Poll sent minus poll due, ms.
    lateness_ms: Histogram<u64>,
    /// `poll_after_ms` as advised.
    advised_ms: Histogram<u64>,
    early_polls: u64,
    /// Requests that got no answer, by cause.
    send_errors: BTreeMap<String, u64>,
    polls_per_person: Histogram<u64>,
    polls_per_admitted: Histogram<u64>,
}

impl Stats {
    fn new() -> anyhow::Result<Self> {
        Ok(Stats {
            latency: BTreeMap::new(),
            http: BTreeMap::new(),
            queue_status: BTreeMap::new(),
            lateness_ms: Histogram::new(3)?,
            advised_ms: Histogram::new(3)?,
            early_polls: 0,
            send_errors: BTreeMap::new(),
            polls_per_person: Histogram::new(3)?,
            polls_per_admitted: Histogram::new(3)?,
        })
    }
}

struct Edge {
    args: SaleArgs,
    edge: String,
    client: reqwest::Client,
    users: token::KeyRing,
    secret: String,
    queue_slots: Semaphore,
    join_slots: Semaphore,
    checkout_slots: Semaphore,
    stop: AtomicBool,
    in_flight: AtomicI64,
    c: Counters,
    stats: Mutex<Stats>,
}

/// One answer from the edge: HTTP status (0 = no answer), Retry-After,
/// whether the edge itself refused it as sold out, and the JSON body.
struct Answer {
    status: u16,
    retry_after: Option<u64>,
    edge_sold_out: bool,
    body: Value,
}

#[derive(Serialize, serde::Deserialize, Clone)]
struct EdgeSample {
    t: f64,
    arrived: u64,
    joined: u64,
    /// People polling the queue right now (simulator side).
    in_queue: i64,
    /// From the edge's sale summary (`queue`): entries, placed, frontier.
    edge_entries: u64,
    edge_placed: u64,
    edge_admitted: u64,
    edge_waiting: u64,
    units_available: i64,
    sold_out: bool,
    holding_units: i64,
    paid_units: i64,
    polls: u64,
    edge_reserve_requests: u64,
    /// The origin's `flashsale_reservation_requests_total` since the run began.
    origin_reservation_requests: u64,
    in_flight: i64,
    /// The edge's admission rate now (the controller's; 0 while frozen is
    /// shown by `frozen`).
    #[serde(default)]
    admission_rate: f64,
    #[serde(default)]
    frozen: bool,
}

fn record_latency(s: &Edge, kind: &'static str, us: u64, status: u16) {
    let mut st = s.stats.lock().expect("stats");
    if let Some(h) = st.latency.get_mut(kind) {
        let _ = h.record(us.max(1));
    } else if let Ok(mut h) = Histogram::new(3) {
        let _ = h.record(us.max(1));
        st.latency.insert(kind, h);
    }
    *st.http.entry(kind).or_default().entry(status).or_default() += 1;
}

fn note_status(s: &Edge, status: &str) {
    let mut st = s.stats.lock().expect("stats");
    *st.queue_status.entry(status.to_string()).or_default() += 1;
}

/// Sends one request to the edge through the given pool of slots.
async fn call(
    s: &Edge,
    kind: &'static str,
    slots: Option<&Semaphore>,
    req: reqwest::RequestBuilder,
) -> Answer {
    // `None`: the caller already holds a slot.
    let _permit = match slots {
        Some(sem) => match sem.acquire().await {
            Ok(p) => Some(p),
            Err(_) => {
                return Answer {
                    status: 0,
                    retry_after: None,
                    edge_sold_out: false,
                    body: Value::Null,
                };
            }
        },
        None => None,
    };
    s.in_flight.fetch_add(1, Ordering::Relaxed);
    let t0 = Instant::now();
    let res = req.send().await;
    let out = match res {
        Ok(r) => {
            let status = r.status().as_u16();
            let retry_after = r
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok());
            let edge_sold_out = r.headers().contains_key("x-edge-sold-out");
            let body = r.json::<Value>().await.unwrap_or(Value::Null);
            Answer {
                status,
                retry_after,
                edge_sold_out,
                body,
            }
        }
        Err(e) => {
            let mut st = s.stats.lock().expect("stats");
            let mut text = if e.is_timeout() {
                "timeout".to_string()
            } else if e.is_connect() {
                "connect".to_string()
            } else {
                "send".to_string()
            };
            let mut src = std::error::Error::source(&e);
            while let Some(inner) = src {
                text = format!("{text}: {inner}");
                src = inner.source();
            }
            let kind: String = text.chars().take(200).collect();
            *st.send_errors.entry(kind).or_default() += 1;
            Answer {
                status: 0,
                retry_after: None,
                edge_sold_out: false,
                body: Value::Null,
            }
        }
    };
    s.in_flight.fetch_sub(1, Ordering::Relaxed);
    record_latency(s, kind, t0.elapsed().as_micros() as u64, out.status);
    out
}

fn exp_sample(mean: f64) -> f64 {
    -mean * (1.0 - rand::rng().random::<f64>()).ln()
}

async fn sleep_or_stop(s: &Edge, d: Duration) -> bool {
    let end = Instant::now() + d;
    while Instant::now() < end {
        if s.stop.load(Ordering::Relaxed) {
            return false;
        }
        let left = end.saturating_duration_since(Instant::now());
        tokio::time::sleep(left.min(Duration::from_millis(500))).await;
    }
    !s.stop.load(Ordering::Relaxed)
}

enum Outcome {
    /// The answer that admitted them (token, window end, poll pace).
    Admitted(Value),
    Left,
}

/// An admitted person's turn while they check out: what their status polls
/// (which keep the turn alive, as the page's do) last said.
struct Turn {
    ticket: Mutex<String>,
    /// The admit token: re-minted at each poll, following the window
    /// (extended while the frontier is frozen).
    admit: Mutex<String>,
    window_end_ms: AtomicU64,
    poll_after_ms: AtomicU64,
    closed: AtomicBool,
    done: AtomicBool,
}

impl Turn {
    fn new(ticket: &str, admitted: &Value) -> Self {
        Turn {
            ticket: Mutex::new(ticket.to_string()),
            admit: Mutex::new(
                admitted["admission_token"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            ),
            window_end_ms: AtomicU64::new(
                admitted["window_ends_at_ms"]
                    .as_u64()
                    .unwrap_or_else(|| wall_ms() + 120_000),
            ),
            poll_after_ms: AtomicU64::new(admitted["poll_after_ms"].as_u64().unwrap_or(10_000)),
            closed: AtomicBool::new(false),
            done: AtomicBool::new(false),
        }
    }

    fn admit(&self) -> String {
        self.admit.lock().expect("admit").clone()
    }

    fn window_open(&self) -> bool {
        wall_ms() < self.window_end_ms.load(Ordering::Relaxed)
    }
}

fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Polls the queue while the person checks out, as the page does (every
/// `poll_after_ms`, ≤ 10 s while admitted): the edge sees them, so the turn
/// is not closed as abandoned, and a fresh admit token and window end come
/// back. Ends when the checkout does, or when the turn is closed.
async fn keep_turn(s: &Edge, turn: &Turn) {
    let url = format!("{}/api/sales/{}/queue", s.edge, s.args.sale);
    loop {
        let wait = Instant::now()
            + Duration::from_millis(
                turn.poll_after_ms
                    .load(Ordering::Relaxed)
                    .clamp(500, 10_000),
            );
        while Instant::now() < wait {
            if turn.done.load(Ordering::Relaxed) || s.stop.load(Ordering::Relaxed) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let ticket = turn.ticket.lock().expect("ticket").clone();
        s.c.polls.fetch_add(1, Ordering::Relaxed);
        let a = call(
            s,
            "poll",
            Some(&s.queue_slots),
            s.client.get(&url).bearer_auth(&ticket),
        )
        .await;
        if a.status != 200 {
            continue;
        }
        if let Some(t) = a.body["ticket"].as_str() {
            *turn.ticket.lock().expect("ticket") = t.to_string();
        }
        if let Some(t) = a.body["admission_token"].as_str() {
            *turn.admit.lock().expect("admit") = t.to_string();
        }
        if let Some(end) = a.body["window_ends_at_ms"].as_u64() {
            turn.window_end_ms.store(end, Ordering::Relaxed);
        }
        if let Some(p) = a.body["poll_after_ms"].as_u64() {
            turn.poll_after_ms.store(p, Ordering::Relaxed);
        }
        if a.body["status"] == "closed" {
            turn.closed.store(true, Ordering::Relaxed);
            return;
        }
    }
}

/// One person: arrive, join, poll as told, and check out when admitted.
async fn person(s: Arc<Edge>, idx: usize, arrive: Instant) {
    tokio::time::sleep_until(arrive.into()).await;
    if s.stop.load(Ordering::Relaxed) {
        return;
    }
    s.c.arrived.fetch_add(1, Ordering::Relaxed);
    let account = format!("sim-{idx}");
    let user = s.users.sign(&Claims::new(
        TokenType::User,
        &account,
        None,
        origin::ops::clock::now_secs(),
        3_600,
    ));
    let queue_url = format!("{}/api/sales/{}/queue", s.edge, s.args.sale);
    // Join (idempotent per account, so retrying is safe).
    let mut body = Value::Null;
    for attempt in 0..6u32 {
        let a = call(
            &s,
            "join",
            Some(&s.join_slots),
            s.client.post(&queue_url).bearer_auth(&user),
        )
        .await;
        if a.status == 200 {
            body = a.body;
            break;
        }
        s.c.retried.fetch_add(1, Ordering::Relaxed);
        let wait = a.retry_after.map(|r| r * 1000).unwrap_or(250u64 << attempt);
        if !sleep_or_stop(&s, Duration::from_millis(wait)).await {
            return;
        }
    }
    if body.is_null() {
        s.c.join_failed.fetch_add(1, Ordering::Relaxed);
        return;
    }
    s.c.joined.fetch_add(1, Ordering::Relaxed);
    s.c.in_queue.fetch_add(1, Ordering::Relaxed);
    let mut ticket = String::new();
    let mut polls = 0u64;
    let mut patience_until: Option<Instant> = None;
    let mut last_status = String::from("prequeue");
    let outcome = loop {
        if let Some(t) = body["ticket"].as_str() {
            ticket = t.to_string();
        }
        let status = body["status"].as_str().unwrap_or(&last_status).to_string();
        note_status(&s, &status);
        match status.as_str() {
            "admitted" => match body["admission_token"].as_str() {
                Some(_) => break Outcome::Admitted(body),
                None => {
                    s.c.errors.fetch_add(1, Ordering::Relaxed);
                    s.c.left_other.fetch_add(1, Ordering::Relaxed);
                    break Outcome::Left;
                }
            },
            "closed" => {
                s.c.left_closed.fetch_add(1, Ordering::Relaxed);
                break Outcome::Left;
            }
            "sold_out" => {
                let until = *patience_until.get_or_insert_with(|| {
                    Instant::now()
                        + Duration::from_secs_f64(exp_sample(s.args.edge.sold_out_patience))
                });
                if Instant::now() >= until {
                    s.c.left_sold_out.fetch_add(1, Ordering::Relaxed);
                    break Outcome::Left;
                }
            }
            // Drawing (the pre-queue is being drawn) and paused (an
            // operator holds admission) keep the place: poll again.
            "prequeue" | "waiting" | "drawing" | "paused" => patience_until = None,
            _ => {
                s.c.errors.fetch_add(1, Ordering::Relaxed);
                s.c.left_other.fetch_add(1, Ordering::Relaxed);
                break Outcome::Left;
            }
        }
        last_status = status;
        let advised = body["poll_after_ms"].as_u64().unwrap_or(1_000);
        let due = Instant::now() + Duration::from_millis(advised);
        if !sleep_or_stop(&s, Duration::from_millis(advised)).await {
            break Outcome::Left;
        }
        tokio::time::sleep_until(due.into()).await;
        // Wait for a slot, then note how late the poll goes out.
        let Ok(permit) = s.queue_slots.acquire().await else {
            break Outcome::Left;
        };
        let sent = Instant::now();
        {
            let mut st = s.stats.lock().expect("stats");
            if sent < due {
                st.early_polls += 1;
            }
            let _ = st.advised_ms.record(advised.max(1));
            let _ = st
                .lateness_ms
                .record(sent.saturating_duration_since(due).as_millis() as u64);
        }
        polls += 1;
        s.c.polls.fetch_add(1, Ordering::Relaxed);
        let a = call(
            &s,
            "poll",
            None,
            s.client.get(&queue_url).bearer_auth(&ticket),
        )
        .await;
        drop(permit);
        match a.status {
            200 => body = a.body,
            429 | 503 | 0 => {
                // Keep the place; come back when told (or in a second).
                s.c.retried.fetch_add(1, Ordering::Relaxed);
                body = json!({
                    "status": last_status,
                    "poll_after_ms": a.retry_after.map(|r| r * 1000).unwrap_or(1_000),
                });
            }
            _ => {
                s.c.errors.fetch_add(1, Ordering::Relaxed);
                s.c.left_other.fetch_add(1, Ordering::Relaxed);
                break Outcome::Left;
            }
        }
    };
    s.c.in_queue.fetch_sub(1, Ordering::Relaxed);
    {
        let mut st = s.stats.lock().expect("stats");
        let _ = st.polls_per_person.record(polls);
        if matches!(outcome, Outcome::Admitted(_)) {
            let _ = st.polls_per_admitted.record(polls);
        }
    }
    if let Outcome::Admitted(admitted) = outcome {
        s.c.admitted_seen.fetch_add(1, Ordering::Relaxed);
        if rand::rng().random_bool(s.args.edge.walk_away_admitted.clamp(0.0, 1.0)) {
            // The tab is closed: no more polls, no reservation.
            s.c.abandoned_turns.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let turn = Turn::new(&ticket, &admitted);
        let shop = async {
            checkout(&s, &turn).await;
            turn.done.store(true, Ordering::Relaxed);
        };
        tokio::join!(shop, keep_turn(&s, &turn));
    }
}

/// Reserve with the admit token (retrying 429/503/no answer as the page
/// does — after `Retry-After`, at least 1 s — while the window is open),
/// then pay, cancel or walk away.
async fn checkout(s: &Edge, turn: &Turn) {
    let qty = if rand::rng().random_bool(s.args.multi) {
        s.args.per_user_limit
    } else {
        1
    };
    let key = uuid::Uuid::new_v4().simple().to_string();
    let url = format!("{}/api/sales/{}/reservations", s.edge, s.args.sale);
    let (id, got) = loop {
        if s.stop.load(Ordering::Relaxed) {
            return;
        }
        if turn.closed.load(Ordering::Relaxed) {
            s.c.closed_while_checking_out
                .fetch_add(1, Ordering::Relaxed);
            s.c.windows_burned.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if !turn.window_open() {
            s.c.windows_burned.fetch_add(1, Ordering::Relaxed);
            return;
        }
        s.c.reserve_requests.fetch_add(1, Ordering::Relaxed);
        let a = call(
            s,
            "reserve",
            Some(&s.checkout_slots),
            s.client
                .post(&url)
                .bearer_auth(turn.admit())
                .header("Idempotency-Key", &key)
                .json(&json!({"qty": qty})),
        )
        .await;
        match a.status {
            202 => {
                break (
                    a.body["reservation_id"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    a.body["qty"].as_i64().unwrap_or(0),
                );
            }
            410 => {
                if a.edge_sold_out {
                    s.c.refused_sold_out_edge.fetch_add(1, Ordering::Relaxed);
                } else {
                    s.c.refused_sold_out_origin.fetch_add(1, Ordering::Relaxed);
                }
                return;
            }
            409 => {
                s.c.refused_limit.fetch_add(1, Ordering::Relaxed);
                return;
            }
            429 | 503 | 0 => {
                s.c.retried.fetch_add(1, Ordering::Relaxed);
                let wait = a.retry_after.unwrap_or(0).saturating_mul(1000).max(1000);
                let jitter = rand::rng().random_range(0..=wait / 4);
                tokio::time::sleep(Duration::from_millis(wait + jitter)).await;
            }
            401 if turn.window_open() => {
                // A token that ran out while the window went on (extended
                // by a freeze): the next status poll brings a fresh one.
                s.c.retried.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(1000)).await;
            }
            401 => {
                s.c.windows_burned.fetch_add(1, Ordering::Relaxed);
                return;
            }
            _ => {
                s.c.errors.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
    };
    s.c.holds.fetch_add(1, Ordering::Relaxed);
    s.c.holding_units.fetch_add(got, Ordering::Relaxed);
    let roll: f64 = rand::rng().random();
    let think = Duration::from_millis(rand::rng().random_range(200..1500));
    tokio::time::sleep(think).await;
    if roll < s.args.pay {
        if pay(s, &id, &turn.admit()).await.unwrap_or(false) {
            s.c.holding_units.fetch_sub(got, Ordering::Relaxed);
            s.c.paid_units.fetch_add(got, Ordering::Relaxed);
        }
    } else if roll < s.args.pay + s.args.cancel {
        let a = call(
            s,
            "cancel",
            Some(&s.checkout_slots),
            s.client
                .delete(format!("{}/api/reservations/{id}", s.edge))
                .bearer_auth(turn.admit()),
        )
        .await;
        if (200..300).contains(&a.status) {
            s.c.cancelled.fetch_add(1, Ordering::Relaxed);
            s.c.holding_units.fetch_sub(got, Ordering::Relaxed);
        }
    } else {
        s.c.walked_away.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_secs(s.args.hold_seconds as u64)).await;
        s.c.holding_units.fetch_sub(got, Ordering::Relaxed);
    }
}

/// Purchase through the edge, then the provider's signed webhook straight
/// to the origin.
async fn pay(s: &Edge, id: &str, admit: &str) -> anyhow::Result<bool> {
    let a = call(
        s,
        "purchase",
        Some(&s.checkout_slots),
        s.client
            .post(format!("{}/api/reservations/{id}/purchase", s.edge))
            .bearer_auth(admit),
    )
    .await;
    if !(200..300).contains(&a.status) {
        return Ok(false);
    }
    let event = json!({
        "id": format!("evt_sim_{}", uuid::Uuid::new_v4().simple()),
        "type": "payment.succeeded",
        "data": {"payment_id": a.body["payment_id"], "amount_cents": a.body["amount_cents"]},
    });
    let t0 = Instant::now();
    let r = origin::payments::webhook::post_webhook(&s.client, &s.args.origin, &s.secret, &event)
        .await?;
    record_latency(
        s,
        "webhook (origin)",
        t0.elapsed().as_micros() as u64,
        r.status().as_u16(),
    );
    let body: Value = r.json().await.unwrap_or(Value::Null);
    Ok(body["result"] == "paid")
}

/// Sum of the origin's `flashsale_reservation_requests_total` over outcomes.
async fn origin_reservation_requests(client: &reqwest::Client, origin: &str) -> Option<u64> {
    let text = client
        .get(format!("{origin}/metrics"))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    let mut sum = 0.0;
    for line in text.lines() {
        if line.starts_with("flashsale_reservation_requests_total") {
            sum += line
                .split_whitespace()
                .last()
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0);
        }
    }
    Some(sum as u64)
}

fn quantiles_ms(h: &Histogram<u64>, scale: f64) -> Value {
    if h.is_empty() {
        return Value::Null;
    }
    json!({
        "count": h.len(),
        "p50": h.value_at_quantile(0.5) as f64 / scale,
        "p90": h.value_at_quantile(0.9) as f64 / scale,
        "p99": h.value_at_quantile(0.99) as f64 / scale,
        "max": h.max() as f64 / scale,
        "mean": (h.mean() / scale * 1000.0).round() / 1000.0,
    })
}

pub async fn run(args: SaleArgs) -> anyhow::Result<()> {
    let edge = args.edge.edge.clone().context("--edge")?;
    crate::loopback::ensure_loopback(&edge)?;
    crate::loopback::ensure_loopback(&args.origin)?;
    anyhow::ensure!(
        args.accounts <= 100_000 && args.max_seconds <= 1_800,
        "edge mode: at most 100,000 accounts and 1,800 s"
    );
    anyhow::ensure!(
        args.edge.edge_in_flight >= 1
            && args.edge.join_in_flight >= 1
            && args.edge.checkout_in_flight >= 1,
        "in-flight bounds must be at least 1"
    );
    anyhow::ensure!(
        args.edge.outage_at.is_none() || args.edge.origin_pid.is_some(),
        "--outage-at needs --origin-pid"
    );
    anyhow::ensure!(
        (0.0..=60.0).contains(&args.edge.outage_seconds),
        "--outage-seconds: 0 to 60"
    );
    // People here reserve {"qty"} only, which a sale of several SKUs
    // refuses (422 `sku_required`): SKUs are simulated in direct mode.
    anyhow::ensure!(
        args.skus == 1,
        "edge mode sells one SKU; --skus is for direct mode (without --edge)"
    );
    let state = create_sim_sale(&args, "Simulated sale through the edge").await?;
    let t_start = Instant::now() + Duration::from_secs_f64(args.prestart_seconds);
    // The outage: the origin stopped (SIGSTOP: connections are accepted
    // and never answered, the worst kind of down), then continued.
    let outage = args.edge.outage_at.zip(args.edge.origin_pid);
    let outage_task = outage.map(|(at, pid)| {
        let secs = args.edge.outage_seconds;
        tokio::spawn(async move {
            tokio::time::sleep_until((t_start + Duration::from_secs_f64(at.max(0.0))).into()).await;
            signal(pid, "STOP");
            tokio::time::sleep(Duration::from_secs_f64(secs)).await;
            signal(pid, "CONT");
        })
    });
    let secret = std::env::var("PAYMENT_WEBHOOK_SECRET").context("PAYMENT_WEBHOOK_SECRET")?;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .timeout(Duration::from_secs(30))
        .build()?;
    let metrics_before = origin_reservation_requests(&client, &args.origin)
        .await
        .context("origin /metrics")?;
    let shared = Arc::new(Edge {
        edge: edge.trim_end_matches('/').to_string(),
        client: client.clone(),
        users: state.settings.user_keys.clone(),
        secret: secret.split(',').next().unwrap_or_default().to_string(),
        queue_slots: Semaphore::new(args.edge.edge_in_flight),
        join_slots: Semaphore::new(args.edge.join_in_flight),
        checkout_slots: Semaphore::new(args.edge.checkout_in_flight),
        stop: AtomicBool::new(false),
        in_flight: AtomicI64::new(0),
        c: Counters::default(),
        stats: Mutex::new(Stats::new()?),
        args: args.clone(),
    });

    // Arrivals (seconds from the start; negative = pre-queue), as in direct
    // mode: a share uniformly over the pre-start window, the rest in an
    // exponential burst after the start.
    let mut rng = rand::rng();
    let mut arrivals: Vec<f64> = (0..args.accounts)
        .map(|_| {
            if rng.random_bool(args.prestart_share) {
                // Leave the last second for the joins to land.
                -rng.random_range(1.0..args.prestart_seconds.max(1.5))
            } else {
                -args.burst_seconds * (1.0 - rng.random::<f64>()).ln()
            }
        })
        .collect();
    arrivals.sort_by(f64::total_cmp);
    let pre = arrivals.iter().take_while(|t| **t < 0.0).count();
    let mut tasks = tokio::task::JoinSet::new();
    for (i, t) in arrivals.iter().enumerate() {
        let at = if *t >= 0.0 {
            t_start + Duration::from_secs_f64(*t)
        } else {
            t_start
                .checked_sub(Duration::from_secs_f64(-*t))
                .unwrap_or_else(Instant::now)
        };
        tasks.spawn(person(shared.clone(), i, at));
    }

    let bar = ProgressBar::new(args.units as u64);
    bar.set_style(
        ProgressStyle::with_template("{elapsed:>4} [{bar:40}] {pos}/{len} units paid · {msg}")?
            .progress_chars("=> "),
    );
    let deadline = Instant::now() + Duration::from_secs(args.max_seconds);
    let every = Duration::from_secs_f64(args.edge.sample_seconds.clamp(0.2, 10.0));
    let mut samples: Vec<EdgeSample> = Vec::new();
    let mut next_sample = Instant::now();
    let mut last_summary = Value::Null;
    let mut last_origin = metrics_before;
    let mut all_paid_at: Option<Instant> = None;
    let c = &shared.c;
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        while tasks.try_join_next().is_some() {}
        let now = Instant::now();
        if now >= next_sample {
            next_sample = now + every;
            let t = if now >= t_start {
                (now - t_start).as_secs_f64()
            } else {
                -(t_start - now).as_secs_f64()
            };
            if let Ok(r) = client
                .get(format!("{}/api/sales/{}", shared.edge, args.sale))
                .timeout(Duration::from_secs(5))
                .send()
                .await
                && let Ok(v) = r.json::<Value>().await
            {
                last_summary = v;
            }
            if let Some(n) = origin_reservation_requests(&client, &args.origin).await {
                last_origin = n;
            }
            let q = &last_summary["queue"];
            samples.push(EdgeSample {
                t: (t * 1000.0).round() / 1000.0,
                arrived: c.arrived.load(Ordering::Relaxed),
                joined: c.joined.load(Ordering::Relaxed),
                in_queue: c.in_queue.load(Ordering::Relaxed),
                edge_entries: q["entries"].as_u64().unwrap_or(0),
                edge_placed: q["placed"].as_u64().unwrap_or(0),
                edge_admitted: q["admitted"].as_u64().unwrap_or(0),
                edge_waiting: q["waiting"].as_u64().unwrap_or(0),
                units_available: last_summary["units_available"].as_i64().unwrap_or(-1),
                sold_out: last_summary["sold_out"] == true,
                holding_units: c.holding_units.load(Ordering::Relaxed),
                paid_units: c.paid_units.load(Ordering::Relaxed),
                polls: c.polls.load(Ordering::Relaxed),
                edge_reserve_requests: c.reserve_requests.load(Ordering::Relaxed),
                origin_reservation_requests: last_origin.saturating_sub(metrics_before),
                in_flight: shared.in_flight.load(Ordering::Relaxed),
                admission_rate: q["admission_rate"].as_f64().unwrap_or(0.0),
                frozen: q["frozen"] == true,
            });
        }
        let paid = c.paid_units.load(Ordering::Relaxed);
        bar.set_position(paid.max(0) as u64);
        bar.set_message(format!(
            "joined {}, in queue {}, admitted {}, polls {}",
            c.joined.load(Ordering::Relaxed),
            c.in_queue.load(Ordering::Relaxed),
            c.admitted_seen.load(Ordering::Relaxed),
            c.polls.load(Ordering::Relaxed)
        ));
        // Once every unit is paid and everyone has arrived and joined (late
        // arrivals are told `sold_out` at once), give the crowd a few
        // seconds to hear it, then end.
        let everyone_in = c.joined.load(Ordering::Relaxed) + c.join_failed.load(Ordering::Relaxed)
            >= args.accounts as u64;
        if paid >= i64::from(args.units) && everyone_in && all_paid_at.is_none() {
            all_paid_at = Some(now);
        }
        if all_paid_at.is_some_and(|at| now >= at + Duration::from_secs(5))
            || now >= deadline
            || tasks.is_empty()
        {
            break;
        }
    }
    shared.stop.store(true, Ordering::Relaxed);
    if let (Some(task), Some((_, pid))) = (outage_task, outage) {
        // Never leave the origin stopped, however the run ended.
        task.abort();
        signal(pid, "CONT");
    }
    bar.finish();
    // Let checkouts in flight finish (bounded), then stop the rest.
    let grace = Instant::now() + Duration::from_secs(15);
    while !tasks.is_empty() && Instant::now() < grace {
        while tasks.try_join_next().is_some() {}
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    let elapsed = samples.last().map(|s| s.t).unwrap_or(0.0);
    let metrics_after = origin_reservation_requests(&client, &args.origin)
        .await
        .unwrap_or(last_origin);

    // Wait for settlement to drain, then read the truth.
    let sale = state.sales.get(&args.sale).await?.context("sale")?;
    for _ in 0..200 {
        if origin::settle::settler::lag(&state.engine, &sale).await? == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let checks = invariants(&state, &sale).await?;

    // Origin reservation rate against the admission rate. The selling
    // window runs from the start to the first moment the edge reported the
    // sale sold out (as in direct mode); the edge's frontier over the same
    // window is what it actually let through.
    let selling_end = samples
        .iter()
        .find(|s| s.t >= 0.0 && s.sold_out)
        .map(|s| s.t)
        .unwrap_or(elapsed)
        .max(0.1);
    let at_end = samples.iter().rfind(|s| s.t <= selling_end).cloned();
    let origin_in_selling = at_end
        .as_ref()
        .map(|s| s.origin_reservation_requests)
        .unwrap_or(0);
    let frontier_in_selling = at_end.as_ref().map(|s| s.edge_admitted).unwrap_or(0);
    let origin_rate = origin_in_selling as f64 / selling_end;
    // The window in which the edge's frontier advanced: from the start to
    // the first sample at its final value (after that it is held by the
    // inventory cap or the sold-out flag, and the admission rate no longer
    // applies).
    let max_front = samples.iter().map(|s| s.edge_admitted).max().unwrap_or(0);
    let front_end = samples
        .iter()
        .find(|s| s.t >= 0.0 && s.edge_admitted >= max_front)
        .map(|s| s.t)
        .unwrap_or(elapsed)
        .max(0.1);
    let origin_in_front = samples
        .iter()
        .rfind(|s| s.t <= front_end)
        .map(|s| s.origin_reservation_requests)
        .unwrap_or(0);
    let front_window = json!({
        "seconds": front_end,
        "places_admitted": max_front,
        "frontier_rate": max_front as f64 / front_end,
        "origin_reservation_requests": origin_in_front,
        "origin_reservation_rate": origin_in_front as f64 / front_end,
        "origin_rate_over_admission_rate": origin_in_front as f64 / front_end / args.admission_rate,
    });
    // The busiest 5 s of origin reservation traffic (bounded origin load).
    let mut peak5 = 0.0f64;
    for (i, a) in samples.iter().enumerate() {
        if let Some(b) = samples[i..].iter().find(|b| b.t >= a.t + 5.0) {
            let r = (b.origin_reservation_requests - a.origin_reservation_requests) as f64
                / (b.t - a.t);
            peak5 = peak5.max(r);
        }
    }
    let origin_total = metrics_after.saturating_sub(metrics_before);
    // Time to sell out: the edge's summary first says sold out (every
    // unit held or paid), and every unit is paid.
    let sold_out_at = samples
        .iter()
        .find(|s| s.t >= 0.0 && s.sold_out)
        .map(|s| s.t);
    let all_paid_at = samples
        .iter()
        .find(|s| s.paid_units >= i64::from(args.units))
        .map(|s| s.t);
    let frozen_seconds = samples
        .windows(2)
        .filter(|w| w[0].frozen)
        .map(|w| w[1].t - w[0].t)
        .sum::<f64>();
    let scenario = json!({
        "admission_control": std::env::var("EDGE_ADMISSION_CONTROL").ok().filter(|v| !v.is_empty()).unwrap_or_else(|| "adaptive".into()),
        "walk_away_admitted_share": args.edge.walk_away_admitted,
        "outage": args.edge.outage_at.map(|at| json!({"at": at, "seconds": args.edge.outage_seconds})),
        "abandoned_turns": c.abandoned_turns.load(Ordering::Relaxed),
        "windows_burned": c.windows_burned.load(Ordering::Relaxed),
        "closed_while_checking_out": c.closed_while_checking_out.load(Ordering::Relaxed),
        "sold_out_at_s": sold_out_at,
        "all_paid_at_s": all_paid_at,
        "frontier_frozen_s": frozen_seconds,
    });
    let st = shared.stats.lock().expect("stats");
    let latency: BTreeMap<&str, Value> = st
        .latency
        .iter()
        .map(|(k, h)| (*k, quantiles_ms(h, 1000.0)))
        .collect();
    let reserve_lat = st
        .latency
        .get("reserve")
        .map(|h| quantiles_ms(h, 1000.0))
        .unwrap_or(Value::Null);
    let mut statuses: BTreeMap<u16, u64> = BTreeMap::new();
    if let Some(m) = st.http.get("reserve") {
        statuses = m.clone();
    }
    let report = json!({
        "sale": args.sale,
        "mode": "edge (people join, poll as told, reserve and pay through wrangler dev; webhook to the origin)",
        "edge": shared.edge,
        "accounts": args.accounts,
        "prequeue": pre,
        "units": args.units,
        "per_user_limit": args.per_user_limit,
        "shards": args.shards,
        "admission_rate": args.admission_rate,
        "admission_factor": args.admission_factor,
        "hold_seconds": args.hold_seconds,
        "prestart_seconds": args.prestart_seconds,
        "edge_in_flight": args.edge.edge_in_flight,
        "join_in_flight": args.edge.join_in_flight,
        "checkout_in_flight": args.edge.checkout_in_flight,
        "sold_out_patience_seconds": args.edge.sold_out_patience,
        "seconds": elapsed,
        "arrived": c.arrived.load(Ordering::Relaxed),
        "joined": c.joined.load(Ordering::Relaxed),
        "join_failed": c.join_failed.load(Ordering::Relaxed),
        "admitted": c.admitted_seen.load(Ordering::Relaxed),
        "holds_granted": c.holds.load(Ordering::Relaxed),
        "paid_units_seen": c.paid_units.load(Ordering::Relaxed),
        "cancelled": c.cancelled.load(Ordering::Relaxed),
        "walked_away": c.walked_away.load(Ordering::Relaxed),
        "refused_sold_out": c.refused_sold_out_edge.load(Ordering::Relaxed)
            + c.refused_sold_out_origin.load(Ordering::Relaxed),
        "refused_sold_out_at_edge": c.refused_sold_out_edge.load(Ordering::Relaxed),
        "refused_sold_out_by_origin": c.refused_sold_out_origin.load(Ordering::Relaxed),
        "refused_limit": c.refused_limit.load(Ordering::Relaxed),
        "retried_429_503": c.retried.load(Ordering::Relaxed),
        "errors": c.errors.load(Ordering::Relaxed),
        "left_after_sold_out": c.left_sold_out.load(Ordering::Relaxed),
        "left_closed": c.left_closed.load(Ordering::Relaxed),
        "left_other": c.left_other.load(Ordering::Relaxed),
        "statuses": statuses,
        "reservation_latency_ms": reserve_lat,
        "edge_latency_ms": latency,
        "edge_http_by_call": st.http,
        "edge_send_errors": st.send_errors,
        "edge_answers_by_status": st.queue_status,
        "polls": {
            "total": c.polls.load(Ordering::Relaxed),
            "per_person": quantiles_ms(&st.polls_per_person, 1.0),
            "per_admitted_person": quantiles_ms(&st.polls_per_admitted, 1.0),
            "advised_poll_after_ms": quantiles_ms(&st.advised_ms, 1.0),
            "lateness_ms": quantiles_ms(&st.lateness_ms, 1.0),
            "sent_before_advised": st.early_polls,
        },
        "invariants": checks,
    });
    let per_place = if frontier_in_selling > 0 {
        origin_in_selling as f64 / frontier_in_selling as f64
    } else {
        0.0
    };
    let rates = json!({
        "edge_reservation_requests": c.reserve_requests.load(Ordering::Relaxed),
        "origin_reservation_requests_total": origin_total,
        "selling_seconds": selling_end,
        "edge_admitted_in_selling": frontier_in_selling,
        "origin_reservation_requests_in_selling": origin_in_selling,
        "origin_reservation_rate": origin_rate,
        "origin_rate_over_admission_rate": origin_rate / args.admission_rate,
        "origin_requests_per_admitted_place": per_place,
        "while_frontier_advanced": front_window,
        "origin_peak_5s_rate": peak5,
        "origin_peak_5s_rate_over_admission_rate": peak5 / args.admission_rate,
    });
    let mut report = report;
    if let (Some(r), Value::Object(more)) = (report.as_object_mut(), rates) {
        r.extend(more);
    }
    report["scenario"] = scenario;

    drop(st);
    std::fs::create_dir_all(&args.output)?;
    let base = format!("{}/{}", args.output, args.sale);
    std::fs::write(
        format!("{base}.json"),
        serde_json::to_string_pretty(&json!({"report": report, "samples": samples}))?,
    )?;
    let chart_samples: Vec<Sample> = samples
        .iter()
        .map(|s| Sample {
            t: s.t,
            arrived: s.arrived,
            waiting: s.in_queue.max(0) as u64,
            admitted: s.edge_admitted,
            holding_units: s.holding_units,
            paid_units: s.paid_units,
            reserve_requests: s.origin_reservation_requests,
        })
        .collect();
    chart(&chart_samples, args.admission_rate, &format!("{base}.svg"))?;
    let summary = format!(
        "{}\n{}\nscenario: {}",
        summary_text(&report),
        edge_text(&report),
        report["scenario"]
    );
    std::fs::write(format!("{base}.txt"), &summary)?;
    println!("{summary}");
    println!("report: {base}.json, chart: {base}.svg");
    anyhow::ensure!(
        report["invariants"]["all_hold"] == true,
        "an invariant failed: {}",
        report["invariants"]
    );
    Ok(())
}

/// Sends a signal to a process through `kill` (no unsafe code here).
fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("loadgen: kill -{sig} {pid} failed");
    }
}

/// Arguments of `loadgen compare`.
#[derive(Args)]
pub struct CompareArgs {
    /// `label=report.json` (a `loadgen sale --edge` report), two or more.
    #[arg(long = "run", required = true)]
    runs: Vec<String>,
    /// The SVG to write.
    #[arg(long)]
    out: String,
}

/// One chart of several edge runs of the same sale shape: units paid and
/// places admitted over time, the outage shaded; and a table on stdout.
pub fn compare(a: CompareArgs) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let mut runs: Vec<(String, Value, Vec<EdgeSample>)> = Vec::new();
    for r in &a.runs {
        let (label, path) = r.split_once('=').context("--run label=path")?;
        let v: Value =
            serde_json::from_str(&std::fs::read_to_string(path).context(path.to_string())?)?;
        let samples: Vec<EdgeSample> = serde_json::from_value(v["samples"].clone())?;
        runs.push((label.to_string(), v["report"].clone(), samples));
    }
    println!(
        "| run | sold out (s) | all paid (s) | windows burned | turns abandoned | frontier frozen (s) | origin reservation requests | invariants |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (label, r, _) in &runs {
        let sc = &r["scenario"];
        println!(
            "| {label} | {} | {} | {} | {} | {:.0} | {} | {} |",
            sc["sold_out_at_s"],
            sc["all_paid_at_s"],
            sc["windows_burned"],
            sc["abandoned_turns"],
            sc["frontier_frozen_s"].as_f64().unwrap_or(0.0),
            r["origin_reservation_requests_total"],
            if r["invariants"]["all_hold"] == true {
                "hold"
            } else {
                "FAILED"
            },
        );
    }
    let t1 = runs
        .iter()
        .flat_map(|(_, _, s)| s.last().map(|x| x.t))
        .fold(1.0, f64::max);
    let ymax = runs
        .iter()
        .flat_map(|(_, _, s)| {
            s.iter()
                .map(|x| x.edge_admitted.max(x.paid_units.max(0) as u64))
        })
        .max()
        .unwrap_or(1) as f64;
    let root = SVGBackend::new(&a.out, (960, 540)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Admitted places and units paid; origin stopped in the grey band",
            ("sans-serif", 20),
        )
        .margin(16)
        .x_label_area_size(36)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..t1, 0.0..ymax * 1.1)?;
    chart
        .configure_mesh()
        .x_desc("seconds from the sale's start")
        .y_desc("places / units")
        .draw()?;
    if let Some(o) = runs
        .first()
        .map(|(_, r, _)| &r["scenario"]["outage"])
        .filter(|o| o.is_object())
    {
        let at = o["at"].as_f64().unwrap_or(0.0);
        let secs = o["seconds"].as_f64().unwrap_or(0.0);
        chart.draw_series(std::iter::once(Rectangle::new(
            [(at, 0.0), (at + secs, ymax * 1.1)],
            RGBColor(220, 220, 220).filled(),
        )))?;
    }
    let colors = [
        RGBColor(214, 39, 40),
        RGBColor(31, 119, 180),
        RGBColor(44, 160, 44),
        RGBColor(148, 103, 189),
    ];
    for (i, (label, _, samples)) in runs.iter().enumerate() {
        let color = colors[i % colors.len()];
        let pts = |f: fn(&EdgeSample) -> f64| -> Vec<(f64, f64)> {
            samples
                .iter()
                .filter(|s| s.t >= 0.0)
                .map(|s| (s.t, f(s)))
                .collect()
        };
        chart
            .draw_series(LineSeries::new(
                pts(|s| s.edge_admitted as f64),
                color.stroke_width(1),
            ))?
            .label(format!("{label}: places admitted"))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(1))
            });
        chart
            .draw_series(LineSeries::new(
                pts(|s| s.paid_units as f64),
                color.stroke_width(3),
            ))?
            .label(format!("{label}: units paid"))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(3))
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    println!("chart: {}", a.out);
    Ok(())
}

fn edge_text(r: &Value) -> String {
    let p = &r["polls"];
    let l = &r["edge_latency_ms"];
    let lat = |k: &str| {
        format!(
            "{k} p50 {} / p99 {} ms",
            l[k]["p50"].as_f64().unwrap_or(0.0),
            l[k]["p99"].as_f64().unwrap_or(0.0)
        )
    };
    format!(
        "through the edge {edge}: joined {joined} (failed {jf}); answers by status {by}\n\
         polls {polls}: per person p50 {pp50}, p90 {pp90}, max {ppmax}; advised poll_after p50 {a50} ms; \
         sent late by p50 {l50} ms, p99 {l99} ms; sent before advised: {early}\n\
         edge latency: {j}; {po}; {re}\n\
         sold-out refusals at the edge {se}, by the origin {so}; left after sold_out {ls}, closed {lc}\n\
         origin reservation requests {ot} (edge sent {et}); in the selling window ({sw:.1} s) {oi} for {fa} places admitted by the edge; \
         busiest 5 s {pk:.1}/s = {pkr:.3} × admission rate\n\
         while the frontier advanced ({fs:.1} s, {fp} places = {fr:.1}/s): origin {fo:.1} reservation requests/s = {fx:.3} × admission rate",
        edge = r["edge"].as_str().unwrap_or_default(),
        joined = r["joined"],
        jf = r["join_failed"],
        by = r["edge_answers_by_status"],
        polls = p["total"],
        pp50 = p["per_person"]["p50"],
        pp90 = p["per_person"]["p90"],
        ppmax = p["per_person"]["max"],
        a50 = p["advised_poll_after_ms"]["p50"],
        l50 = p["lateness_ms"]["p50"],
        l99 = p["lateness_ms"]["p99"],
        early = p["sent_before_advised"],
        j = lat("join"),
        po = lat("poll"),
        re = lat("reserve"),
        se = r["refused_sold_out_at_edge"],
        so = r["refused_sold_out_by_origin"],
        ls = r["left_after_sold_out"],
        lc = r["left_closed"],
        ot = r["origin_reservation_requests_total"],
        et = r["edge_reservation_requests"],
        sw = r["selling_seconds"].as_f64().unwrap_or(0.0),
        oi = r["origin_reservation_requests_in_selling"],
        fa = r["edge_admitted_in_selling"],
        pk = r["origin_peak_5s_rate"].as_f64().unwrap_or(0.0),
        pkr = r["origin_peak_5s_rate_over_admission_rate"]
            .as_f64()
            .unwrap_or(0.0),
        fs = r["while_frontier_advanced"]["seconds"]
            .as_f64()
            .unwrap_or(0.0),
        fp = r["while_frontier_advanced"]["places_admitted"],
        fr = r["while_frontier_advanced"]["frontier_rate"]
            .as_f64()
            .unwrap_or(0.0),
        fo = r["while_frontier_advanced"]["origin_reservation_rate"]
            .as_f64()
            .unwrap_or(0.0),
        fx = r["while_frontier_advanced"]["origin_rate_over_admission_rate"]
            .as_f64()
            .unwrap_or(0.0),
    )
}
