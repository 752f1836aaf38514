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
//! A sale of several SKUs (`--skus N`, issue 45): each admitted person
//! reserves their first wish (`crate::sim::demand`: `--hot-share` on SKU 0,
//! the rest uniform); a 410 `sku_sold_out` sends them, with probability
//! `--second-choice`, to one other SKU not known to be sold out, else away.
//! The frontier stops only on the sale's `sold_out` (every SKU gone), as
//! the edge's does. Per SKU the report counts wishes, second tries, 202s
//! and 410s beside what Postgres and Redis hold of it.
//!
//! Each person's first wish is drawn before the sale, so that once a second
//! (as the Worker reads its summary) the simulator can tell a sample of the
//! people waiting what the queue page would tell them about that SKU ("At
//! your turn", `edge::queue::outlook`), and the report can say per band how
//! often the SKU was there at their turn (`crate::sim::outlook`).
//!
//! Bounded: at most `--accounts` people (≤ 1,000,000), at most
//! `--max-seconds`, loopback targets only.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, AtomicU64, Ordering};
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
use crate::sim::demand::{Demand, second_choice, sku_id};
use crate::sim::outlook::{Told, Turn, broken_promise, sample, tally};
use crate::sim::report::{Sample, chart, sku_chart, summary_text};
use crate::sim::sale::{create_sim_sale, invariants};

/// Waiting people told their "At your turn" band per summary read (once a
/// second): enough to count every band, bounded whatever the crowd.
const OUTLOOK_SAMPLE: usize = 200;

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
    refused_sku_sold_out: AtomicU64,
    /// 202s naming a SKU other than the one asked for.
    wrong_sku: AtomicU64,
    refused_limit: AtomicU64,
    retried: AtomicU64,
    errors: AtomicU64,
    cancelled: AtomicU64,
    walked_away: AtomicU64,
}

/// What the simulator saw of one SKU.
#[derive(Default)]
struct SkuCounters {
    /// Admitted people whose first wish it was.
    wishes: AtomicU64,
    /// People who came to it as their second choice.
    second_choice: AtomicU64,
    /// 202s (holds granted) for it, first or second choice.
    accepted: AtomicU64,
    /// 410 `sku_sold_out` answers for it.
    sku_sold_out: AtomicU64,
    /// 410 `sold_out` (the whole sale) answers to a request for it.
    sale_sold_out: AtomicU64,
    /// 409s to a request for it.
    refused_limit: AtomicU64,
    /// People whose wish it was, answered `sku_sold_out`, who tried no other.
    gave_up: AtomicU64,
    /// Of those, the ones for whom no other SKU was left to try (every
    /// other one known sold out).
    nothing_open: AtomicU64,
    /// Units held (granted), and of those paid, as the simulator saw them.
    units_held: AtomicI64,
    units_paid: AtomicI64,
}

struct Shared {
    args: SaleArgs,
    /// By place in the queue: the position of the SKU the person wants
    /// first (`Demand::wish`), drawn before the sale so that what the page
    /// tells them while they wait is about the SKU they will ask for.
    wishes: Vec<usize>,
    /// By place in the queue: what their turn showed of their wish
    /// (`Turn::code`), for the "At your turn" check.
    turns: Vec<AtomicU8>,
    /// By position. A sale of one SKU is reserved without naming it.
    sku_ids: Vec<String>,
    skus: Vec<SkuCounters>,
    /// By position: sold out as far as a buyer knows (the summary's flag,
    /// or a 410 seen since).
    known_sold_out: Vec<AtomicBool>,
    /// By position: seconds from the start when the SKU was first seen
    /// sold out (a 410 for it, or the summary's flag).
    first_sold_out: std::sync::Mutex<Vec<Option<f64>>>,
    t_start: Instant,
    client: reqwest::Client,
    ring: token::KeyRing,
    secret: String,
    c: Counters,
    sold_out: AtomicBool,
    latency: Mutex<Histogram<u64>>,
    statuses: Mutex<BTreeMap<u16, u64>>,
}

/// How one reservation request ended.
enum Answer {
    Held {
        id: String,
        qty: i64,
    },
    /// 410 `sku_sold_out`: this SKU is gone, others may be left.
    SkuSoldOut,
    /// 410 `sold_out`: the whole sale is.
    SoldOut,
    /// Anything else: the sale sold out, a limit, an error.
    Refused,
}

impl Shared {
    /// Seconds from the sale's start (negative before it).
    fn now_t(&self) -> f64 {
        let now = Instant::now();
        if now >= self.t_start {
            (now - self.t_start).as_secs_f64()
        } else {
            -(self.t_start - now).as_secs_f64()
        }
    }

    fn saw_sold_out(&self, position: usize, t: f64) {
        self.known_sold_out[position].store(true, Ordering::Release);
        if let Ok(mut first) = self.first_sold_out.lock() {
            first[position].get_or_insert(t);
        }
    }

    fn known_sold_out(&self) -> Vec<bool> {
        self.known_sold_out
            .iter()
            .map(|k| k.load(Ordering::Acquire))
            .collect()
    }
}

async fn reserve(s: &Shared, account: &str, qty: i32, position: usize) -> anyhow::Result<Answer> {
    let sku = &s.skus[position];
    let multi = s.sku_ids.len() > 1;
    let request = if multi {
        json!({"sku": s.sku_ids[position], "qty": qty})
    } else {
        json!({"qty": qty})
    };
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
            .json(&request)
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
                if multi && body["sku"] != *s.sku_ids[position] {
                    // The 202 names the SKU held: never another one.
                    s.c.wrong_sku.fetch_add(1, Ordering::Relaxed);
                }
                let got = body["qty"].as_i64().unwrap_or(0);
                sku.accepted.fetch_add(1, Ordering::Relaxed);
                sku.units_held.fetch_add(got, Ordering::Relaxed);
                return Ok(Answer::Held {
                    id: body["reservation_id"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    qty: got,
                });
            }
            410 if body["error"]["code"] == "sku_sold_out" => {
                s.saw_sold_out(position, s.now_t());
                sku.sku_sold_out.fetch_add(1, Ordering::Relaxed);
                s.c.refused_sku_sold_out.fetch_add(1, Ordering::Relaxed);
                return Ok(Answer::SkuSoldOut);
            }
            410 => {
                s.sold_out.store(true, Ordering::Release);
                s.saw_sold_out(position, s.now_t());
                sku.sale_sold_out.fetch_add(1, Ordering::Relaxed);
                s.c.refused_sold_out.fetch_add(1, Ordering::Relaxed);
                return Ok(Answer::SoldOut);
            }
            409 => {
                sku.refused_limit.fetch_add(1, Ordering::Relaxed);
                s.c.refused_limit.fetch_add(1, Ordering::Relaxed);
                return Ok(Answer::Refused);
            }
            429 | 503 => {
                s.c.retried.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
            }
            _ => {
                s.c.errors.fetch_add(1, Ordering::Relaxed);
                return Ok(Answer::Refused);
            }
        }
    }
    Ok(Answer::Refused)
}

/// One admitted person (`place` in the queue): reserve their wish (and
/// maybe a second choice), then pay, cancel or walk away.
async fn person(s: Arc<Shared>, place: usize) {
    let account = format!("sim-{place}");
    let qty = if rand::rng().random_bool(s.args.multi) {
        s.args.per_user_limit
    } else {
        1
    };
    let wish = s.wishes[place];
    s.skus[wish].wishes.fetch_add(1, Ordering::Relaxed);
    let mut position = wish;
    let mut outcome = reserve(&s, &account, qty, wish).await;
    let turn = match outcome {
        Ok(Answer::Held { .. }) => Turn::There,
        Ok(Answer::SkuSoldOut | Answer::SoldOut) => Turn::Gone,
        _ => Turn::Unknown,
    };
    s.turns[place].store(turn.code(), Ordering::Release);
    if let Ok(Answer::SkuSoldOut) = outcome {
        let known = s.known_sold_out();
        let other = second_choice(wish, &known, s.args.second_choice, &mut rand::rng());
        match other {
            Some(other) => {
                s.skus[other].second_choice.fetch_add(1, Ordering::Relaxed);
                position = other;
                outcome = reserve(&s, &account, qty, other).await;
            }
            None => {
                s.skus[wish].gave_up.fetch_add(1, Ordering::Relaxed);
                if !known.iter().enumerate().any(|(p, k)| p != wish && !k) {
                    s.skus[wish].nothing_open.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
    s.c.answered.fetch_add(1, Ordering::Relaxed);
    let Ok(Answer::Held { id, qty: got }) = outcome else {
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
            s.skus[position]
                .units_paid
                .fetch_add(got, Ordering::Relaxed);
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
    anyhow::ensure!(
        args.hot_share.is_none_or(|h| (0.0..=1.0).contains(&h))
            && (0.0..=1.0).contains(&args.second_choice),
        "--hot-share and --second-choice are probabilities (0 to 1)"
    );
    let state = create_sim_sale(&args, "Simulated sale").await?;
    let n = usize::from(args.skus);
    let sku_ids: Vec<String> = if n == 1 {
        vec![args.sale.clone()]
    } else {
        (0..n).map(|p| sku_id(p, n)).collect()
    };
    let t_start = Instant::now() + Duration::from_secs_f64(args.prestart_seconds);
    // Arrivals (seconds from the sale's start; negative = pre-queue).
    let mut rng = rand::rng();
    // Accounts are named by their place in the queue (`person`), so an
    // arrival is only its time.
    let mut arrival_times: Vec<f64> = (0..args.accounts)
        .map(|_| {
            if rng.random_bool(args.prestart_share) {
                -rng.random_range(0.0..args.prestart_seconds)
            } else {
                -args.burst_seconds * (1.0 - rng.random::<f64>()).ln()
            }
        })
        .collect();
    arrival_times.sort_by(f64::total_cmp);
    // The queue: the pre-queue drawn uniformly at random, then FIFO.
    let pre = arrival_times.iter().take_while(|t| **t < 0.0).count();
    let mut queue: Vec<f64> = arrival_times.clone();
    queue[..pre].shuffle(&mut rng);
    let demand = Demand::new(n, args.hot_share);
    let wishes: Vec<usize> = (0..queue.len()).map(|_| demand.wish(&mut rng)).collect();
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
        turns: (0..wishes.len()).map(|_| AtomicU8::new(0)).collect(),
        wishes,
        skus: (0..n).map(|_| SkuCounters::default()).collect(),
        known_sold_out: (0..n).map(|_| AtomicBool::new(false)).collect(),
        first_sold_out: std::sync::Mutex::new(vec![None; n]),
        sku_ids,
        t_start,
        args: args.clone(),
    });

    let bar = ProgressBar::new(args.units as u64);
    bar.set_style(
        ProgressStyle::with_template("{elapsed:>4} [{bar:40}] {pos}/{len} units paid · {msg}")?
            .progress_chars("=> "),
    );
    let deadline = Instant::now() + Duration::from_secs(args.max_seconds);
    let mut samples = Vec::new();
    let mut frontier = 0.0f64;
    let mut next = 0usize;
    let mut last_tick = Instant::now();
    let mut last_summary = Instant::now();
    let mut available = i64::from(args.units);
    let mut selling_until: Option<f64> = None;
    let mut tasks = tokio::task::JoinSet::new();
    let mut told: Vec<Told> = Vec::new();
    let ended = loop {
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
                // What the page would show: each SKU's sold-out flag (a SKU
                // comes back while expired holds would give it units).
                for k in v["skus"].as_array().into_iter().flatten() {
                    let Some(p) = shared.sku_ids.iter().position(|id| k["id"] == **id) else {
                        continue;
                    };
                    if k["sold_out"] == true {
                        shared.saw_sold_out(p, t);
                    } else if k["sold_out"] == false {
                        shared.known_sold_out[p].store(false, Ordering::Release);
                    }
                }
                // What the page would tell a sample of the people waiting
                // about the SKU each wants, from this summary, as the
                // Worker does. After the start every pre-queued person has
                // arrived, so the people waiting are places next..arrived.
                if t >= 0.0 {
                    let figures = edge::queue::outlook::figures(&v);
                    let arrived = arrival_times.partition_point(|a| *a <= t);
                    for place in sample(next, arrived, OUTLOOK_SAMPLE) {
                        let sku = shared.wishes[place];
                        let Some(f) = figures.iter().find(|f| *f.id == shared.sku_ids[sku]) else {
                            continue;
                        };
                        let band =
                            edge::queue::outlook::band(f, (place - next) as u64, next as u64);
                        told.push(Told {
                            person: place,
                            sku,
                            band,
                        });
                    }
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
        while next < queue.len() && (next as f64) < frontier.floor() && queue[next] <= t && room > 0
        {
            shared.c.admitted.fetch_add(1, Ordering::Relaxed);
            tasks.spawn(person(shared.clone(), next));
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
        if paid >= i64::from(args.units) {
            break "every unit paid";
        }
        if now >= deadline {
            break "--max-seconds reached";
        }
        if next == queue.len() && tasks.is_empty() {
            break "every person came and went";
        }
    };
    bar.finish();
    tasks.abort_all();
    // Whoever never had a turn because the sale sold out first: their SKU
    // was gone. Cut short by --max-seconds, their turn is unknown.
    if ended == "every unit paid" || shared.sold_out.load(Ordering::Acquire) {
        for turn in &shared.turns[next..] {
            let _ = turn.compare_exchange(
                Turn::Unknown.code(),
                Turn::Gone.code(),
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
    }
    let outlook_check = tally(
        &told,
        |place| Turn::from_code(shared.turns[place].load(Ordering::Acquire)),
        (n > 1).then_some(0),
    );
    let elapsed = samples.last().map(|s| s.t).unwrap_or(0.0);

    // Wait for settlement to drain, then read the truth.
    let sale = state.sales.get(&args.sale).await?.context("sale")?;
    for _ in 0..200 {
        if origin::settle::settler::lag(&state.engine, &sale).await? == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut checks = invariants(&state, &sale).await?;
    let sku_truth = checks
        .as_object_mut()
        .and_then(|o| o.remove("skus"))
        .unwrap_or_default();
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
    let first_sold_out = shared
        .first_sold_out
        .lock()
        .map(|f| f.clone())
        .unwrap_or_default();
    // Per SKU: what the simulator saw beside what Postgres and Redis hold.
    let skus: Vec<Value> = shared
        .skus
        .iter()
        .enumerate()
        .map(|(p, k)| {
            let mut row = sku_truth[p].clone();
            row["wishes"] = json!(k.wishes.load(Ordering::Relaxed));
            row["second_choice_attempts"] = json!(k.second_choice.load(Ordering::Relaxed));
            row["accepted_202"] = json!(k.accepted.load(Ordering::Relaxed));
            row["refused_sku_sold_out"] = json!(k.sku_sold_out.load(Ordering::Relaxed));
            row["refused_sold_out"] = json!(k.sale_sold_out.load(Ordering::Relaxed));
            row["refused_limit"] = json!(k.refused_limit.load(Ordering::Relaxed));
            row["gave_up"] = json!(k.gave_up.load(Ordering::Relaxed));
            row["gave_up_nothing_open"] = json!(k.nothing_open.load(Ordering::Relaxed));
            row["units_held_seen"] = json!(k.units_held.load(Ordering::Relaxed));
            row["units_paid_seen"] = json!(k.units_paid.load(Ordering::Relaxed));
            row["first_seen_sold_out_s"] = json!(first_sold_out.get(p).copied().flatten());
            row
        })
        .collect();
    let report = json!({
        "sale": args.sale,
        "mode": "origin (direct, simulator admits at the admission rate)",
        "accounts": args.accounts,
        "prequeue": pre,
        "units": args.units,
        "per_user_limit": args.per_user_limit,
        "shards": args.shards,
        "admission_rate": args.admission_rate,
        "sku_count": n,
        "hot_share": demand.hot_share,
        "second_choice": args.second_choice,
        "seconds": elapsed,
        "ended": ended,
        "admitted": c.admitted.load(Ordering::Relaxed),
        "holds_granted": c.holds.load(Ordering::Relaxed),
        "paid_units_seen": c.paid_units.load(Ordering::Relaxed),
        "cancelled": c.cancelled.load(Ordering::Relaxed),
        "walked_away": c.walked_away.load(Ordering::Relaxed),
        "refused_sold_out": c.refused_sold_out.load(Ordering::Relaxed),
        "refused_sku_sold_out": c.refused_sku_sold_out.load(Ordering::Relaxed),
        "accepted_naming_another_sku": c.wrong_sku.load(Ordering::Relaxed),
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
        "skus": skus,
        "outlook_check": outlook_check,
    });
    drop(lat);
    std::fs::create_dir_all(&args.output)?;
    let base = format!("{}/{}", args.output, args.sale);
    std::fs::write(
        format!("{base}.json"),
        serde_json::to_string_pretty(&json!({"report": report, "samples": samples}))?,
    )?;
    chart(&samples, args.admission_rate, &format!("{base}.svg"))?;
    if n > 1 {
        sku_chart(&report, &format!("{base}-skus.svg"))?;
    }
    let summary = summary_text(&report);
    std::fs::write(format!("{base}.txt"), &summary)?;
    println!("{summary}");
    if n > 1 {
        println!("report: {base}.json, charts: {base}.svg, {base}-skus.svg");
    } else {
        println!("report: {base}.json, chart: {base}.svg");
    }
    anyhow::ensure!(
        report["invariants"]["all_hold"] == true,
        "an invariant failed: {}",
        report["invariants"]
    );
    if let Some(broken) = broken_promise(&report["outlook_check"]) {
        anyhow::bail!("the \"At your turn\" bands broke their promise: {broken}");
    }
    anyhow::ensure!(
        report["accepted_naming_another_sku"] == 0,
        "{} reservations answered 202 naming another SKU than the one asked for",
        report["accepted_naming_another_sku"]
    );
    Ok(())
}
