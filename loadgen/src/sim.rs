//! The flash-sale simulator: one whole sale, end to end over HTTP, then the
//! invariants read back from Postgres and Redis.
//!
//! Direct mode (`--origin`) isolates the origin: the simulator plays the
//! edge's part itself — a pre-queue drawn uniformly at random at the start,
//! FIFO after it, a frontier advancing at the sale's admission rate, stopped
//! while the sale is known to be sold out and capped at k × units still
//! available for people admitted but not yet holding — and mints the admit
//! tokens (ADMISSION_TOKEN_KEYS). Admitted people reserve, then pay (the
//! provider's signed webhook), cancel, or walk away and let the hold expire.
//!
//! Bounded: at most `--accounts` people (≤ 1,000,000), at most
//! `--max-seconds`, loopback targets only.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use origin::ops::configuration::Settings;
use origin::sales::spec::SaleSpec;
use origin::ops::state::AppState;
use rand::Rng;
use rand::seq::SliceRandom;
use redis::AsyncCommands;
use serde::Serialize;
use serde_json::{Value, json};
use token::{Claims, TokenType};
use tokio::sync::Mutex;

#[derive(Args, Clone)]
pub struct SaleArgs {
    /// The origin to load (direct mode).
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub(crate) origin: String,
    #[arg(long, default_value = "sim")]
    pub(crate) sale: String,
    #[arg(long, default_value_t = 200_000)]
    pub(crate) accounts: usize,
    #[arg(long, default_value_t = 1_000)]
    pub(crate) units: i32,
    #[arg(long, default_value_t = 2)]
    pub(crate) per_user_limit: i32,
    #[arg(long, default_value_t = 4)]
    pub(crate) shards: i32,
    /// People admitted per second.
    #[arg(long, default_value_t = 200.0)]
    pub(crate) admission_rate: f64,
    #[arg(long, default_value_t = 2.0)]
    pub(crate) admission_factor: f64,
    #[arg(long, default_value_t = 8)]
    pub(crate) hold_seconds: i32,
    /// Seconds between the simulator's start and the sale's start
    /// (people arriving in that window form the pre-queue).
    #[arg(long, default_value_t = 3.0)]
    pub(crate) prestart_seconds: f64,
    /// Share of people who arrive before the start.
    #[arg(long, default_value_t = 0.2)]
    pub(crate) prestart_share: f64,
    /// Mean arrival delay after the start, seconds (exponential burst).
    #[arg(long, default_value_t = 2.0)]
    pub(crate) burst_seconds: f64,
    /// Probability that a person holding units pays.
    #[arg(long, default_value_t = 0.75)]
    pub(crate) pay: f64,
    /// Probability that a holder cancels (the rest walk away: the hold expires).
    #[arg(long, default_value_t = 0.10)]
    pub(crate) cancel: f64,
    /// Probability of asking for the full per-user limit instead of 1 unit.
    #[arg(long, default_value_t = 0.2)]
    pub(crate) multi: f64,
    #[arg(long, default_value_t = 120)]
    pub(crate) max_seconds: u64,
    /// Where the report (JSON, summary, SVG) goes.
    #[arg(long, default_value = "sim-output")]
    pub(crate) output: String,
    /// Edge mode (`--edge <url>`): see `edge_sim`.
    #[command(flatten)]
    pub(crate) edge: crate::edge_sim::EdgeArgs,
}

#[derive(Default)]
struct Counters {
    admitted: AtomicU64,
    /// Admitted people whose reservation attempt has been answered.
    answered: AtomicU64,
    reserve_requests: AtomicU64,
    holds: AtomicI64,
    holding_units: AtomicI64,
    paid_units: AtomicI64,
    refused_sold_out: AtomicU64,
    refused_limit: AtomicU64,
    retried: AtomicU64,
    errors: AtomicU64,
    cancelled: AtomicU64,
    walked_away: AtomicU64,
}

#[derive(Serialize, Clone)]
pub(crate) struct Sample {
    pub(crate) t: f64,
    pub(crate) arrived: u64,
    pub(crate) waiting: u64,
    pub(crate) admitted: u64,
    pub(crate) holding_units: i64,
    pub(crate) paid_units: i64,
    pub(crate) reserve_requests: u64,
}

struct Shared {
    args: SaleArgs,
    client: reqwest::Client,
    ring: token::KeyRing,
    secret: String,
    c: Counters,
    sold_out: AtomicBool,
    latency: Mutex<Histogram<u64>>,
    statuses: Mutex<BTreeMap<u16, u64>>,
}

async fn reserve(s: &Shared, account: &str, qty: i32) -> anyhow::Result<Option<(String, i64)>> {
    let token = s.ring.sign(&Claims::new(
        TokenType::Admit,
        account,
        Some(s.args.sale.clone()),
        origin::http::auth::now_secs(),
        120,
    ));
    let key = uuid::Uuid::new_v4().simple().to_string();
    for attempt in 0..4 {
        s.c.reserve_requests.fetch_add(1, Ordering::Relaxed);
        let t0 = Instant::now();
        let res = s
            .client
            .post(format!(
                "{}/api/sales/{}/reservations",
                s.args.origin, s.args.sale
            ))
            .bearer_auth(&token)
            .header("Idempotency-Key", &key)
            .json(&json!({"qty": qty}))
            .send()
            .await;
        let us = t0.elapsed().as_micros() as u64;
        s.latency.lock().await.record(us.max(1))?;
        let res = match res {
            Ok(r) => r,
            Err(_) => {
                s.c.errors.fetch_add(1, Ordering::Relaxed);
                continue;
            }
        };
        let status = res.status().as_u16();
        *s.statuses.lock().await.entry(status).or_default() += 1;
        let body: Value = res.json().await.unwrap_or(Value::Null);
        match status {
            202 => {
                return Ok(Some((
                    body["reservation_id"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    body["qty"].as_i64().unwrap_or(0),
                )));
            }
            410 => {
                s.sold_out.store(true, Ordering::Release);
                s.c.refused_sold_out.fetch_add(1, Ordering::Relaxed);
                return Ok(None);
            }
            409 => {
                s.c.refused_limit.fetch_add(1, Ordering::Relaxed);
                return Ok(None);
            }
            429 | 503 => {
                s.c.retried.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
            }
            _ => {
                s.c.errors.fetch_add(1, Ordering::Relaxed);
                return Ok(None);
            }
        }
    }
    Ok(None)
}

/// One admitted person: reserve, then pay, cancel or walk away.
async fn person(s: Arc<Shared>, account: String) {
    let qty = if rand::rng().random_bool(s.args.multi) {
        s.args.per_user_limit
    } else {
        1
    };
    let outcome = reserve(&s, &account, qty).await;
    s.c.answered.fetch_add(1, Ordering::Relaxed);
    let Ok(Some((id, got))) = outcome else {
        return;
    };
    s.c.holds.fetch_add(1, Ordering::Relaxed);
    s.c.holding_units.fetch_add(got, Ordering::Relaxed);
    let roll: f64 = rand::rng().random();
    let think = Duration::from_millis(rand::rng().random_range(200..1500));
    tokio::time::sleep(think).await;
    let user = token::KeyRing::clone(&s.ring);
    let token = user.sign(&Claims::new(
        TokenType::Admit,
        &account,
        Some(s.args.sale.clone()),
        origin::http::auth::now_secs(),
        300,
    ));
    if roll < s.args.pay {
        if pay(&s, &id, &token).await.unwrap_or(false) {
            s.c.holding_units.fetch_sub(got, Ordering::Relaxed);
            s.c.paid_units.fetch_add(got, Ordering::Relaxed);
        }
    } else if roll < s.args.pay + s.args.cancel {
        let ok = s
            .client
            .delete(format!("{}/api/reservations/{id}", s.args.origin))
            .bearer_auth(&token)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if ok {
            s.c.cancelled.fetch_add(1, Ordering::Relaxed);
            s.c.holding_units.fetch_sub(got, Ordering::Relaxed);
        }
    } else {
        s.c.walked_away.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_secs(s.args.hold_seconds as u64)).await;
        s.c.holding_units.fetch_sub(got, Ordering::Relaxed);
    }
}

async fn pay(s: &Shared, id: &str, token: &str) -> anyhow::Result<bool> {
    let res = s
        .client
        .post(format!("{}/api/reservations/{id}/purchase", s.args.origin))
        .bearer_auth(token)
        .send()
        .await?;
    if !res.status().is_success() {
        return Ok(false);
    }
    let p: Value = res.json().await?;
    let event = json!({
        "id": format!("evt_sim_{}", uuid::Uuid::new_v4().simple()),
        "type": "payment.succeeded",
        "data": {"payment_id": p["payment_id"], "amount_cents": p["amount_cents"]},
    });
    let r = origin::payments::webhook::post_webhook(&s.client, &s.args.origin, &s.secret, &event).await?;
    let body: Value = r.json().await.unwrap_or(Value::Null);
    Ok(body["result"] == "paid")
}

/// Connects like `origin serve` (environment) and creates the simulated
/// sale, starting `--prestart-seconds` from now.
pub(crate) async fn create_sim_sale(args: &SaleArgs, label: &str) -> anyhow::Result<AppState> {
    let state = AppState::connect(Settings::from_env()?).await?;
    let starts_at = chrono::Utc::now()
        + chrono::Duration::milliseconds((args.prestart_seconds * 1000.0) as i64);
    let spec = SaleSpec {
        id: args.sale.clone(),
        name: format!("{label} ({} units)", args.units),
        units: args.units,
        per_user_limit: args.per_user_limit,
        shards: args.shards,
        starts_at,
        ends_at: None,
        hold_seconds: args.hold_seconds,
        admission_rate: args.admission_rate,
        admission_factor: args.admission_factor,
        price_cents: 9_900,
        queue_shards: 1,
        admission_p99_ms: 50.0,
        bot_check: "none".into(),
        // Every simulated person joins from this one loopback address.
        join_limit: 0,
        currency: origin::sales::spec::DEFAULT_CURRENCY.into(),
        draw_beacon: None,
    };
    let mut conn = state.engine.conn.clone();
    origin::sales::spec::create_sale(&state.pool, &mut conn, &state.settings.key_prefix, &spec)
        .await
        .context("creating the simulated sale")?;
    Ok(state)
}

pub async fn run(args: SaleArgs) -> anyhow::Result<()> {
    if args.edge.edge.is_some() {
        return crate::edge_sim::run(args).await;
    }
    crate::ensure_loopback(&args.origin)?;
    anyhow::ensure!(
        args.accounts <= 1_000_000 && args.max_seconds <= 1_800,
        "at most 1,000,000 accounts and 1,800 s"
    );
    let state = create_sim_sale(&args, "Simulated sale").await?;
    let secret = std::env::var("PAYMENT_WEBHOOK_SECRET").context("PAYMENT_WEBHOOK_SECRET")?;
    let shared = Arc::new(Shared {
        client: reqwest::Client::builder()
            .pool_max_idle_per_host(256)
            .timeout(Duration::from_secs(10))
            .build()?,
        ring: state.settings.admission_keys.clone(),
        secret: secret.split(',').next().unwrap_or_default().to_string(),
        c: Counters::default(),
        sold_out: AtomicBool::new(false),
        latency: Mutex::new(Histogram::new(3)?),
        statuses: Mutex::new(BTreeMap::new()),
        args: args.clone(),
    });

    // Arrivals (seconds from the sale's start; negative = pre-queue).
    let mut rng = rand::rng();
    let mut arrivals: Vec<(f64, usize)> = (0..args.accounts)
        .map(|i| {
            let t = if rng.random_bool(args.prestart_share) {
                -rng.random_range(0.0..args.prestart_seconds)
            } else {
                -args.burst_seconds * (1.0 - rng.random::<f64>()).ln()
            };
            (t, i)
        })
        .collect();
    arrivals.sort_by(|a, b| a.0.total_cmp(&b.0));
    // The queue: the pre-queue drawn uniformly at random, then FIFO.
    let pre = arrivals.iter().take_while(|(t, _)| *t < 0.0).count();
    let mut queue: Vec<(f64, usize)> = arrivals.clone();
    queue[..pre].shuffle(&mut rng);
    let arrival_times: Vec<f64> = arrivals.iter().map(|(t, _)| *t).collect();

    let bar = ProgressBar::new(args.units as u64);
    bar.set_style(
        ProgressStyle::with_template("{elapsed:>4} [{bar:40}] {pos}/{len} units paid · {msg}")?
            .progress_chars("=> "),
    );
    let t_start = Instant::now() + Duration::from_secs_f64(args.prestart_seconds);
    let deadline = Instant::now() + Duration::from_secs(args.max_seconds);
    let mut samples = Vec::new();
    let mut frontier = 0.0f64;
    let mut next = 0usize;
    let mut last_tick = Instant::now();
    let mut last_summary = Instant::now();
    let mut available = i64::from(args.units);
    let mut selling_until: Option<f64> = None;
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let now = Instant::now();
        let t = if now >= t_start {
            (now - t_start).as_secs_f64()
        } else {
            -(t_start - now).as_secs_f64()
        };
        let dt = (now - last_tick).as_secs_f64();
        last_tick = now;
        if last_summary.elapsed() >= Duration::from_secs(1) {
            last_summary = now;
            if std::env::var("SIM_DEBUG").is_ok() {
                eprintln!(
                    "t={t:.1} sold_out={} frontier={frontier:.0} next={next} available={available} admitted={} answered={}",
                    shared.sold_out.load(Ordering::Relaxed),
                    shared.c.admitted.load(Ordering::Relaxed),
                    shared.c.answered.load(Ordering::Relaxed)
                );
            }
            if let Ok(r) = shared
                .client
                .get(format!("{}/api/sales/{}", args.origin, args.sale))
                .send()
                .await
                && let Ok(v) = r.json::<Value>().await
            {
                available = v["units_available"].as_i64().unwrap_or(available);
                if v["sold_out"] == false {
                    shared.sold_out.store(false, Ordering::Release);
                }
            }
        }
        let sold_out = shared.sold_out.load(Ordering::Acquire);
        if t >= 0.0 && !sold_out {
            frontier += args.admission_rate * dt;
        }
        if sold_out && selling_until.is_none() {
            selling_until = Some(t);
        }
        // Admit whoever the frontier reached, has arrived, and fits the cap.
        // People admitted whose reservation attempt is still unanswered.
        let admitted_waiting = shared.c.admitted.load(Ordering::Relaxed) as i64
            - shared.c.answered.load(Ordering::Relaxed) as i64;
        let cap = (args.admission_factor * available.max(0) as f64) as i64;
        let mut room = (cap - admitted_waiting).max(0);
        while next < queue.len()
            && (next as f64) < frontier.floor()
            && queue[next].0 <= t
            && room > 0
        {
            let account = format!("sim-{}", queue[next].1);
            shared.c.admitted.fetch_add(1, Ordering::Relaxed);
            tasks.spawn(person(shared.clone(), account));
            next += 1;
            room -= 1;
        }
        let arrived = arrival_times.partition_point(|a| *a <= t) as u64;
        let paid = shared.c.paid_units.load(Ordering::Relaxed);
        samples.push(Sample {
            t,
            arrived,
            waiting: arrived.saturating_sub(next as u64),
            admitted: next as u64,
            holding_units: shared.c.holding_units.load(Ordering::Relaxed),
            paid_units: paid,
            reserve_requests: shared.c.reserve_requests.load(Ordering::Relaxed),
        });
        bar.set_position(paid.max(0) as u64);
        bar.set_message(format!(
            "admitted {next}, waiting {}",
            arrived.saturating_sub(next as u64)
        ));
        while tasks.try_join_next().is_some() {}
        if paid >= i64::from(args.units)
            || now >= deadline
            || (next == queue.len() && tasks.is_empty())
        {
            break;
        }
    }
    bar.finish();
    tasks.abort_all();
    let elapsed = samples.last().map(|s| s.t).unwrap_or(0.0);

    // Wait for settlement to drain, then read the truth.
    let sale = state.sales.get(&args.sale).await?.context("sale")?;
    for _ in 0..200 {
        if origin::settle::settler::lag(&state.engine, &sale).await? == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let checks = invariants(&state, &sale).await?;
    let selling_end = selling_until.unwrap_or(elapsed).max(0.1);
    let req_in_selling = samples
        .iter()
        .filter(|s| s.t >= 0.0 && s.t <= selling_end)
        .map(|s| s.reserve_requests)
        .max()
        .unwrap_or(0);
    let origin_rate = req_in_selling as f64 / selling_end;
    let lat = shared.latency.lock().await;
    let c = &shared.c;
    let report = json!({
        "sale": args.sale,
        "mode": "origin (direct, simulator admits at the admission rate)",
        "accounts": args.accounts,
        "prequeue": pre,
        "units": args.units,
        "per_user_limit": args.per_user_limit,
        "shards": args.shards,
        "admission_rate": args.admission_rate,
        "seconds": elapsed,
        "admitted": c.admitted.load(Ordering::Relaxed),
        "holds_granted": c.holds.load(Ordering::Relaxed),
        "paid_units_seen": c.paid_units.load(Ordering::Relaxed),
        "cancelled": c.cancelled.load(Ordering::Relaxed),
        "walked_away": c.walked_away.load(Ordering::Relaxed),
        "refused_sold_out": c.refused_sold_out.load(Ordering::Relaxed),
        "refused_limit": c.refused_limit.load(Ordering::Relaxed),
        "retried_429_503": c.retried.load(Ordering::Relaxed),
        "errors": c.errors.load(Ordering::Relaxed),
        "statuses": *shared.statuses.lock().await,
        "reservation_latency_ms": {
            "p50": lat.value_at_quantile(0.5) as f64 / 1000.0,
            "p90": lat.value_at_quantile(0.9) as f64 / 1000.0,
            "p99": lat.value_at_quantile(0.99) as f64 / 1000.0,
            "max": lat.max() as f64 / 1000.0,
        },
        "selling_seconds": selling_end,
        "origin_reservation_rate": origin_rate,
        "origin_rate_over_admission_rate": origin_rate / args.admission_rate,
        "invariants": checks,
    });
    drop(lat);
    std::fs::create_dir_all(&args.output)?;
    let base = format!("{}/{}", args.output, args.sale);
    std::fs::write(
        format!("{base}.json"),
        serde_json::to_string_pretty(&json!({"report": report, "samples": samples}))?,
    )?;
    chart(&samples, args.admission_rate, &format!("{base}.svg"))?;
    let summary = summary_text(&report);
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

pub(crate) async fn invariants(
    state: &AppState,
    sale: &origin::sales::sale::Sale,
) -> anyhow::Result<Value> {
    let id = &sale.config.id;
    let limit = sale.config.per_user_limit;
    let (total, held, sold): (i32, i32, i32) =
        sqlx::query_as("SELECT total, held, sold FROM inventory WHERE sale_id = $1")
            .bind(id)
            .fetch_one(&state.pool)
            .await?;
    let over_limit: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT account FROM reservations WHERE sale_id = $1
         AND status IN ('settled','pending_payment','paid') GROUP BY account HAVING sum(qty) > $2) x",
    )
    .bind(id)
    .bind(limit)
    .fetch_one(&state.pool)
    .await?;
    let dup_payments: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT reservation_id FROM payments WHERE sale_id = $1 AND status = 'succeeded'
         AND NOT refund_required GROUP BY reservation_id HAVING count(*) > 1) x",
    )
    .bind(id)
    .fetch_one(&state.pool)
    .await?;
    let paid_rows: i64 = sqlx::query_scalar("SELECT COALESCE(sum(qty), 0)::bigint FROM reservations WHERE sale_id = $1 AND status = 'paid'")
        .bind(id)
        .fetch_one(&state.pool)
        .await?;
    let mut conn = state.engine.conn.clone();
    let (mut stock, mut redis_held, mut redis_paid) = (0i64, 0i64, 0i64);
    for k in &sale.shards {
        let s: i64 = conn.get(&k.stock).await?;
        stock += s;
        let holds: std::collections::HashMap<String, String> = conn.hgetall(&k.holds).await?;
        for raw in holds.values() {
            let h: Value = serde_json::from_str(raw)?;
            if h["s"] == "paid" {
                redis_paid += h["q"].as_i64().unwrap_or(0);
            } else {
                redis_held += h["q"].as_i64().unwrap_or(0);
            }
        }
    }
    let total = i64::from(total);
    let checks = json!({
        "sold_le_units": i64::from(sold) <= total,
        "postgres_sold": sold,
        "postgres_held": held,
        "per_user_limit_kept": over_limit == 0,
        "accounts_over_limit": over_limit,
        "no_duplicate_payments": dup_payments == 0,
        "paid_rows_match_sold": paid_rows == i64::from(sold),
        "redis_available": stock,
        "redis_held": redis_held,
        "redis_paid": redis_paid,
        "redis_holds_plus_available_plus_sold_eq_units": stock + redis_held + redis_paid == total,
        "postgres_held_plus_sold_plus_redis_available_eq_units": i64::from(held) + i64::from(sold) + stock == total,
    });
    let all = [
        "sold_le_units",
        "per_user_limit_kept",
        "no_duplicate_payments",
        "paid_rows_match_sold",
        "redis_holds_plus_available_plus_sold_eq_units",
        "postgres_held_plus_sold_plus_redis_available_eq_units",
    ]
    .iter()
    .all(|k| checks[k] == true);
    let mut checks = checks;
    checks["all_hold"] = json!(all);
    Ok(checks)
}

pub(crate) fn summary_text(r: &Value) -> String {
    let inv = &r["invariants"];
    format!(
        "Simulated sale {sale}: {accounts} accounts ({pre} in the pre-queue), {units} units, limit {limit}, {shards} shards\n\
         admitted {admitted} at {rate}/s over {secs:.1} s; holds granted {holds}; paid {paid} units (Postgres sold {sold}, held {held})\n\
         cancelled {cancelled}, walked away {walked}; refused: sold out {so}, limit {lim}; retried 429/503 {retried}; errors {errors}\n\
         reservation latency p50 {p50} ms, p90 {p90} ms, p99 {p99} ms, max {max} ms\n\
         origin reservation rate while selling {orate:.1}/s = {ratio:.3} × admission rate\n\
         invariants: sold ≤ units {a}; per-user limit {b}; no duplicate payments {c}; Redis holds + available + sold = units {d}; Postgres held + sold + available = units {e}",
        sale = r["sale"].as_str().unwrap_or_default(),
        accounts = r["accounts"],
        pre = r["prequeue"],
        units = r["units"],
        limit = r["per_user_limit"],
        shards = r["shards"],
        admitted = r["admitted"],
        rate = r["admission_rate"],
        secs = r["seconds"].as_f64().unwrap_or(0.0),
        holds = r["holds_granted"],
        paid = r["paid_units_seen"],
        sold = inv["postgres_sold"],
        held = inv["postgres_held"],
        cancelled = r["cancelled"],
        walked = r["walked_away"],
        so = r["refused_sold_out"],
        lim = r["refused_limit"],
        retried = r["retried_429_503"],
        errors = r["errors"],
        p50 = r["reservation_latency_ms"]["p50"],
        p90 = r["reservation_latency_ms"]["p90"],
        p99 = r["reservation_latency_ms"]["p99"],
        max = r["reservation_latency_ms"]["max"],
        orate = r["origin_reservation_rate"].as_f64().unwrap_or(0.0),
        ratio = r["origin_rate_over_admission_rate"].as_f64().unwrap_or(0.0),
        a = inv["sold_le_units"],
        b = inv["per_user_limit_kept"],
        c = inv["no_duplicate_payments"],
        d = inv["redis_holds_plus_available_plus_sold_eq_units"],
        e = inv["postgres_held_plus_sold_plus_redis_available_eq_units"],
    )
}

pub(crate) fn chart(samples: &[Sample], rate: f64, path: &str) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (960, 540)).into_drawing_area();
    root.fill(&WHITE)?;
    let t0 = samples.first().map(|s| s.t).unwrap_or(0.0);
    let t1 = samples.last().map(|s| s.t).unwrap_or(1.0).max(t0 + 1.0);
    let ymax = samples
        .iter()
        .map(|s| s.waiting.max(s.admitted) as f64)
        .fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Flash sale: people over time (log scale)",
            ("sans-serif", 22),
        )
        .margin(16)
        .x_label_area_size(36)
        .y_label_area_size(60)
        .build_cartesian_2d(t0..t1, (1.0..ymax * 1.2).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("seconds from the sale's start")
        .y_desc("people / units")
        .draw()?;
    type Line = (&'static str, RGBColor, fn(&Sample) -> f64);
    let series: [Line; 5] = [
        ("waiting", RGBColor(120, 120, 120), |s| s.waiting as f64),
        ("admitted", RGBColor(31, 119, 180), |s| s.admitted as f64),
        ("holding (units)", RGBColor(255, 127, 14), |s| {
            s.holding_units as f64
        }),
        ("paid (units)", RGBColor(44, 160, 44), |s| {
            s.paid_units as f64
        }),
        (
            "reservation requests (cumulative)",
            RGBColor(214, 39, 40),
            |s| s.reserve_requests as f64,
        ),
    ];
    for (name, color, f) in series {
        chart
            .draw_series(LineSeries::new(
                samples.iter().map(|s| (s.t, f(s).max(1.0))),
                color.stroke_width(2),
            ))?
            .label(name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
    }
    chart
        .draw_series(LineSeries::new(
            samples
                .iter()
                .filter(|s| s.t >= 0.0)
                .map(|s| (s.t, (s.t * rate).max(1.0))),
            RGBColor(0, 0, 0).stroke_width(1),
        ))?
        .label("admission rate × t")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLACK));
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(())
}
