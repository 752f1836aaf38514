//! Direct mode of the simulator (`loadgen sale --origin <url>`): one whole
//! sale, end to end over HTTP straight at the origin, then the invariants
//! read back from Postgres and Redis (`crate::sim::sale`).
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
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use rand::Rng;
use rand::seq::SliceRandom;
use serde_json::{Value, json};
use token::{Claims, TokenType};
use tokio::sync::Mutex;

use crate::sim::args::SaleArgs;
use crate::sim::report::{Sample, chart, summary_text};
use crate::sim::sale::{create_sim_sale, invariants};

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
        origin::ops::clock::now_secs(),
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
        origin::ops::clock::now_secs(),
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
    let r = origin::payments::webhook::post_webhook(&s.client, &s.args.origin, &s.secret, &event)
        .await?;
    let body: Value = r.json().await.unwrap_or(Value::Null);
    Ok(body["result"] == "paid")
}

pub async fn run(args: SaleArgs) -> anyhow::Result<()> {
    crate::loopback::ensure_loopback(&args.origin)?;
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
