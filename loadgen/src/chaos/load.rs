//! The chaos load: steady reservation traffic against one origin while a
//! fault is injected from outside (`scripts/chaos`), every request recorded
//! in the history ([`super::history`]).
//!
//! Sessions start at a fixed rate (open loop, at most `--max-sessions` at
//! once), each for a random account among `--accounts`, so accounts often
//! have several sessions at once and the per-user limit is contended. A
//! session reserves (qty 1, or up to `--max-qty` with `--multi`) with an
//! Idempotency-Key, retrying the same key on 429, 503 and on no answer;
//! sometimes replays the key after a 202 (same body: must be the same
//! answer) or reuses it with another qty (must be 422); then pays (a
//! purchase, then the provider's signed webhook, `payment.failed` for
//! `--fail` of them), cancels, or walks away and lets the hold expire.
//!
//! `--webhook-chaos` plays a misbehaving provider: every event is delivered
//! two or three times, some copies at the same instant, others late and out
//! of order, a fifth of the events only after the hold expired, and some
//! payments also get a conflicting event (the opposite outcome, its own
//! event id).
//!
//! Bounded: loopback targets only, `--seconds` of new sessions (≤ 1,800),
//! then at most `--tail-seconds` for sessions under way to finish.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use rand::Rng;
use serde_json::{Value, json};
use token::{Claims, KeyRing, TokenType};
use tokio::sync::mpsc::UnboundedSender;

use crate::chaos::history::{Entry, Op, Writer};
use origin::ops::clock::now_ms;

#[derive(Args, Clone, Debug)]
pub struct RunArgs {
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub origin: String,
    #[arg(long, default_value = "chaos")]
    pub sale: String,
    /// Where the history goes (JSON lines).
    #[arg(long)]
    pub history: PathBuf,
    /// Seconds during which new sessions start.
    #[arg(long, default_value_t = 30)]
    pub seconds: u64,
    /// New sessions per second.
    #[arg(long, default_value_t = 60.0)]
    pub rate: f64,
    #[arg(long, default_value_t = 1500)]
    pub accounts: usize,
    /// The largest qty asked for (the sale's per-user limit).
    #[arg(long, default_value_t = 3)]
    pub max_qty: i64,
    /// Share of reservations asking for 2..=max-qty units instead of 1.
    #[arg(long, default_value_t = 0.3)]
    pub multi: f64,
    /// Share of holders who pay.
    #[arg(long, default_value_t = 0.35)]
    pub pay: f64,
    /// Share of holders who cancel (the rest walk away: the hold expires).
    #[arg(long, default_value_t = 0.15)]
    pub cancel: f64,
    /// Share of payments the provider reports as failed.
    #[arg(long, default_value_t = 0.1)]
    pub fail: f64,
    /// Share of 202s whose key is sent again with the same body.
    #[arg(long, default_value_t = 0.15)]
    pub replay: f64,
    /// Share of 202s whose key is sent again with another qty.
    #[arg(long, default_value_t = 0.03)]
    pub reuse: f64,
    /// The provider delivers every event 2-3 times, late, out of order,
    /// with some conflicting events.
    #[arg(long)]
    pub webhook_chaos: bool,
    /// The sale's hold time (late webhooks are spread past it).
    #[arg(long, default_value_t = 8)]
    pub hold_seconds: u64,
    /// After `--seconds`, how long sessions under way may take to finish.
    #[arg(long, default_value_t = 30)]
    pub tail_seconds: u64,
    #[arg(long, default_value_t = 800)]
    pub max_sessions: usize,
    /// The sale's SKUs, `id` or `id:limit` (its own per-account limit),
    /// comma-separated; none: a one-SKU sale, requests name no SKU. The
    /// first takes half the first wishes, the others share the rest; a
    /// session whose SKU answers `410 sku_sold_out` tries one other.
    #[arg(long, value_delimiter = ',')]
    pub skus: Vec<String>,
}

/// A SKU of `--skus`: its id and own limit.
fn sku_arg(text: &str) -> (String, Option<i64>) {
    match text.split_once(':') {
        Some((id, limit)) => (id.to_string(), limit.parse().ok()),
        None => (text.to_string(), None),
    }
}

/// The SKU a session wants first: the first SKU half the time, else one
/// of the others (`roll`, `pick` uniform in `[0, 1)`).
fn first_wish(skus: usize, roll: f64, pick: f64) -> usize {
    if skus <= 1 || roll < 0.5 {
        0
    } else {
        1 + ((pick * (skus - 1) as f64) as usize).min(skus - 2)
    }
}

/// How many times one request is tried (429, 503, no answer) before the
/// session gives up on it.
const ATTEMPTS: u32 = 8;

struct Shared {
    args: RunArgs,
    client: reqwest::Client,
    ring: KeyRing,
    secret: String,
    log: UnboundedSender<Entry>,
    /// No request is started after this.
    deadline: Instant,
}

/// One attempt's outcome: (status, JSON body, replayed header).
type Answer = (Option<u16>, Value, bool, Option<String>);

async fn send(req: reqwest::RequestBuilder) -> Answer {
    match req.send().await {
        Ok(res) => {
            let status = res.status().as_u16();
            let replayed = res
                .headers()
                .get("idempotent-replayed")
                .is_some_and(|v| v == "true");
            let body: Value = res.json().await.unwrap_or(Value::Null);
            let code = body["error"]["code"].as_str().map(str::to_string);
            (Some(status), body, replayed, code)
        }
        Err(e) => {
            let what = if e.is_timeout() {
                "timeout"
            } else if e.is_connect() {
                "connect"
            } else {
                "transport"
            };
            (None, Value::Null, false, Some(what.to_string()))
        }
    }
}

fn retryable(status: Option<u16>) -> bool {
    matches!(status, None | Some(429 | 500..=599))
}

async fn backoff(attempt: u32) {
    let base = 100u64 << attempt.min(4);
    let jitter = rand::rng().random_range(0..=base / 2);
    tokio::time::sleep(Duration::from_millis(base + jitter)).await;
}

impl Shared {
    /// Sends the request `make()` builds until it is answered with anything
    /// but 429/5xx (or attempts or time run out), recording every attempt
    /// as `template` filled with what came back; the last answer.
    async fn tried(
        &self,
        template: &Entry,
        make: impl Fn() -> reqwest::RequestBuilder,
    ) -> (Entry, Value) {
        let mut attempt = 0;
        loop {
            let mut e = template.clone();
            e.t0 = now_ms();
            let (status, body, replayed, code) = send(make()).await;
            e.t1 = now_ms();
            e.status = status;
            e.code = code;
            e.replayed = replayed;
            if e.op != Op::Webhook
                && let Some(id) = body["reservation_id"].as_str()
            {
                e.reservation = Some(id.to_string());
            }
            if status == Some(202) {
                e.granted = body["qty"].as_i64();
            }
            if let Some(p) = body["payment_id"].as_str() {
                e.payment = Some(p.to_string());
            }
            if let Some(r) = body["result"].as_str() {
                e.result = Some(r.to_string());
            }
            let _ = self.log.send(e.clone());
            attempt += 1;
            if !retryable(status) || attempt >= ATTEMPTS || Instant::now() >= self.deadline {
                return (e, body);
            }
            backoff(attempt).await;
        }
    }

    fn admit(&self, account: &str) -> String {
        self.ring.sign(&Claims::new(
            TokenType::Admit,
            account,
            Some(self.args.sale.clone()),
            origin::ops::clock::now_secs(),
            900,
        ))
    }

    async fn reserve(
        &self,
        op: Op,
        account: &str,
        token: &str,
        key: &str,
        sku: Option<&str>,
        qty: i64,
    ) -> Entry {
        let mut t = Entry::new(op, now_ms());
        t.account = account.to_string();
        t.key = Some(key.to_string());
        t.qty = Some(qty);
        let url = format!(
            "{}/api/sales/{}/reservations",
            self.args.origin, self.args.sale
        );
        let body = match sku {
            Some(id) => json!({ "sku": id, "qty": qty }),
            None => json!({ "qty": qty }),
        };
        self.tried(&t, || {
            self.client
                .post(&url)
                .bearer_auth(token)
                .header("Idempotency-Key", key)
                .json(&body)
        })
        .await
        .0
    }

    async fn cancel(&self, account: &str, token: &str, id: &str) {
        let mut t = Entry::new(Op::Cancel, now_ms());
        t.account = account.to_string();
        t.reservation = Some(id.to_string());
        let url = format!("{}/api/reservations/{id}", self.args.origin);
        self.tried(&t, || self.client.delete(&url).bearer_auth(token))
            .await;
    }

    /// Purchase; the payment (id, amount) when one is open.
    async fn purchase(&self, account: &str, token: &str, id: &str) -> Option<(String, i64)> {
        let mut t = Entry::new(Op::Purchase, now_ms());
        t.account = account.to_string();
        t.reservation = Some(id.to_string());
        let key = format!("p-{}", uuid::Uuid::new_v4().simple());
        t.key = Some(key.clone());
        let url = format!("{}/api/reservations/{id}/purchase", self.args.origin);
        let (e, body) = self
            .tried(&t, || {
                self.client
                    .post(&url)
                    .bearer_auth(token)
                    .header("Idempotency-Key", &key)
            })
            .await;
        if !e.ok() {
            return None;
        }
        Some((e.payment?, body["amount_cents"].as_i64()?))
    }

    /// One delivery of a provider event (retried like a provider does on
    /// 5xx and on no answer).
    async fn deliver(&self, reservation: &str, account: &str, event: &Value) {
        let mut t = Entry::new(Op::Webhook, now_ms());
        t.account = account.to_string();
        t.reservation = Some(reservation.to_string());
        t.payment = event["data"]["payment_id"].as_str().map(str::to_string);
        t.event = event["id"].as_str().map(str::to_string);
        t.kind = event["type"].as_str().map(str::to_string);
        let body = serde_json::to_vec(event).expect("json");
        let url = format!("{}/webhooks/payments", self.args.origin);
        self.tried(&t, || {
            let sig = origin::payments::webhook::sign_webhook(
                &self.secret,
                origin::ops::clock::now_secs(),
                &body,
            );
            self.client
                .post(&url)
                .header("content-type", "application/json")
                .header("Payment-Signature", sig)
                .body(body.clone())
        })
        .await;
    }

    /// The provider reports the payment's outcome: once (retried until
    /// answered), or, with `--webhook-chaos`, as a misbehaving provider.
    async fn report_payment(
        self: &Arc<Self>,
        reservation: &str,
        account: &str,
        payment: &str,
        amount: i64,
    ) {
        let failed = rand::rng().random_bool(self.args.fail);
        let event = |failed: bool| {
            json!({
                "id": format!("evt_chaos_{}", uuid::Uuid::new_v4().simple()),
                "type": if failed { "payment.failed" } else { "payment.succeeded" },
                "data": {"payment_id": payment, "amount_cents": amount},
            })
        };
        let main = event(failed);
        if !self.args.webhook_chaos {
            self.deliver(reservation, account, &main).await;
            return;
        }
        // (delay ms, event) for every delivery, then all of them at once.
        let late_ms = (self.args.hold_seconds + 4) * 1000;
        let mut plan: Vec<(u64, Value)> = Vec::new();
        {
            let mut rng = rand::rng();
            // A fifth of the events arrive only after the hold expired (the
            // unit is back on sale: the payment must be refunded, never sold
            // twice).
            let first = if rng.random_bool(0.2) {
                rng.random_range(self.args.hold_seconds * 1000 + 1_000..late_ms + 2_000)
            } else {
                rng.random_range(0..1_500)
            };
            plan.push((first, main.clone()));
            for _ in 0..rng.random_range(1..=2) {
                // A third of the copies arrive together with the first.
                let at = if rng.random_bool(0.33) {
                    first
                } else {
                    rng.random_range(0..late_ms)
                };
                plan.push((at, main.clone()));
            }
            if rng.random_bool(0.3) {
                plan.push((rng.random_range(0..2_000), event(!failed)));
            }
        }
        let mut tasks = tokio::task::JoinSet::new();
        for (at, ev) in plan {
            let s = self.clone();
            let (r, a) = (reservation.to_string(), account.to_string());
            tasks.spawn(async move {
                tokio::time::sleep(Duration::from_millis(at)).await;
                s.deliver(&r, &a, &ev).await;
            });
        }
        while tasks.join_next().await.is_some() {}
    }
}

/// One person: reserve (a SKU of their choice, and one other if it is sold
/// out), maybe replay or reuse the key, then pay, cancel or walk away.
async fn session(s: Arc<Shared>, account: String) {
    let skus: Vec<(String, Option<i64>)> = s.args.skus.iter().map(|t| sku_arg(t)).collect();
    let (qty, replay, reuse, think, roll, wishes) = {
        let mut rng = rand::rng();
        let qty = if s.args.max_qty > 1 && rng.random_bool(s.args.multi) {
            rng.random_range(2..=s.args.max_qty)
        } else {
            1
        };
        let first = first_wish(skus.len(), rng.random(), rng.random());
        let second = first_wish(skus.len(), 1.0, rng.random());
        (
            qty,
            rng.random_bool(s.args.replay),
            rng.random_bool(s.args.reuse),
            Duration::from_millis(rng.random_range(100..1_000)),
            rng.random::<f64>(),
            [first, if second == first { 0 } else { second }],
        )
    };
    let token = s.admit(&account);
    // One SKU (none named in a one-SKU sale), and a second choice when the
    // first answers `sku_sold_out`, each with its own key.
    let mut key = String::new();
    let mut chosen: Option<(&str, i64)> = None;
    let mut held = None;
    for (n, w) in wishes.iter().enumerate() {
        let sku = skus.get(*w);
        let q = sku.and_then(|(_, l)| *l).map_or(qty, |l| qty.min(l));
        key = format!("k-{}", uuid::Uuid::new_v4().simple());
        let id = sku.map(|(id, _)| id.as_str());
        let e = s.reserve(Op::Reserve, &account, &token, &key, id, q).await;
        let sku_gone = e.status == Some(410) && e.code.as_deref() == Some("sku_sold_out");
        chosen = Some((id.unwrap_or(""), q));
        held = e.reservation.filter(|_| e.status == Some(202));
        if !sku_gone || n > 0 || skus.len() <= 1 {
            break;
        }
    }
    let (Some(id), Some((sku, qty))) = (held, chosen) else {
        return;
    };
    let sku = (!sku.is_empty()).then_some(sku);
    if replay {
        s.reserve(Op::Replay, &account, &token, &key, sku, qty)
            .await;
    }
    if reuse {
        let other = if qty == 1 { 2 } else { 1 };
        s.reserve(Op::Reuse, &account, &token, &key, sku, other)
            .await;
    }
    tokio::time::sleep(think).await;
    if Instant::now() >= s.deadline {
        return;
    }
    if roll < s.args.pay {
        if let Some((payment, amount)) = s.purchase(&account, &token, &id).await {
            s.report_payment(&id, &account, &payment, amount).await;
        }
    } else if roll < s.args.pay + s.args.cancel {
        s.cancel(&account, &token, &id).await;
    }
}

/// Samples the origin's settlement lag (`/metrics`) twice a second.
async fn sample_lag(s: Arc<Shared>, stop: tokio_util::sync::CancellationToken) {
    let url = format!("{}/metrics", s.args.origin);
    let needle = format!("flashsale_settlement_lag{{sale=\"{}\"}}", s.args.sale);
    loop {
        let t0 = now_ms();
        let lag = match s
            .client
            .get(&url)
            .timeout(Duration::from_millis(1_000))
            .send()
            .await
        {
            Ok(r) => r.text().await.ok().and_then(|text| {
                text.lines()
                    .find_map(|l| l.strip_prefix(&needle))
                    .and_then(|v| v.trim().parse::<f64>().ok())
                    .map(|v| v as i64)
            }),
            Err(_) => None,
        };
        let mut e = Entry::new(Op::Lag, t0);
        e.t1 = now_ms();
        e.lag = lag;
        let _ = s.log.send(e);
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
}

pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    crate::loopback::ensure_loopback(&args.origin)?;
    anyhow::ensure!(
        args.seconds <= 1_800 && args.tail_seconds <= 600 && args.rate > 0.0,
        "at most 1,800 s of load and 600 s of tail, at a positive rate"
    );
    anyhow::ensure!(
        args.accounts > 0 && args.max_qty >= 1,
        "accounts and max-qty ≥ 1"
    );
    let ring = origin::ops::configuration::key_ring("ADMISSION_TOKEN_KEYS")?;
    let secret = std::env::var("PAYMENT_WEBHOOK_SECRET")
        .map_err(|_| anyhow::anyhow!("PAYMENT_WEBHOOK_SECRET is not set"))?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Entry>();
    let mut writer = Writer::create(&args.history)?;
    let written = tokio::task::spawn_blocking(move || -> anyhow::Result<u64> {
        let mut n = 0;
        while let Some(e) = rx.blocking_recv() {
            writer.write(&e)?;
            n += 1;
        }
        writer.finish()?;
        Ok(n)
    });
    let started = Instant::now();
    let load_end = started + Duration::from_secs(args.seconds);
    let shared = Arc::new(Shared {
        client: reqwest::Client::builder()
            .pool_max_idle_per_host(256)
            .connect_timeout(Duration::from_millis(1_000))
            .timeout(Duration::from_secs(5))
            .build()?,
        ring,
        secret: secret.split(',').next().unwrap_or_default().to_string(),
        log: tx,
        deadline: load_end + Duration::from_secs(args.tail_seconds),
        args: args.clone(),
    });
    let stop_sampling = tokio_util::sync::CancellationToken::new();
    let sampler = tokio::spawn(sample_lag(shared.clone(), stop_sampling.clone()));
    let active = Arc::new(AtomicUsize::new(0));
    let mut skipped = 0u64;
    let mut started_sessions = 0u64;
    let mut tasks = tokio::task::JoinSet::new();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / args.rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    while Instant::now() < load_end {
        tick.tick().await;
        while tasks.try_join_next().is_some() {}
        if active.load(Ordering::Relaxed) >= args.max_sessions {
            skipped += 1;
            continue;
        }
        let account = format!("acct-{}", rand::rng().random_range(0..args.accounts));
        let (s, a) = (shared.clone(), active.clone());
        a.fetch_add(1, Ordering::Relaxed);
        started_sessions += 1;
        tasks.spawn(async move {
            session(s, account).await;
            a.fetch_sub(1, Ordering::Relaxed);
        });
    }
    // Sessions stop starting requests at the deadline; a request under way
    // ends within the client's timeout.
    let bound = shared.deadline + Duration::from_secs(10);
    let mut cut = false;
    while !tasks.is_empty() {
        if tokio::time::timeout_at(bound.into(), tasks.join_next())
            .await
            .is_err()
        {
            // Only requests in flight now go unrecorded (module doc of
            // `history`); everything answered is written below.
            eprintln!("chaos run: sessions still running past the tail; aborted");
            tasks.abort_all();
            cut = true;
            while tasks.join_next().await.is_some() {}
        }
    }
    stop_sampling.cancel();
    sampler.await?;
    drop(shared);
    let lines = written.await??;
    println!(
        "{}",
        json!({
            "sessions": started_sessions,
            "sessions_skipped_at_max": skipped,
            "history_lines": lines,
            "seconds": started.elapsed().as_secs_f64(),
            "cut": cut,
        })
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_the_first_wishes_are_the_first_sku_the_rest_spread() {
        let mut counts = [0usize; 20];
        for i in 0..20_000 {
            let roll = (i % 2) as f64 * 0.5 + 0.25;
            let pick = ((i / 2) % 1_000) as f64 / 1_000.0;
            counts[first_wish(20, roll, pick)] += 1;
        }
        assert_eq!(counts[0], 10_000);
        assert!(
            counts[1..].iter().all(|c| (500..=560).contains(c)),
            "{counts:?}"
        );
        assert_eq!(first_wish(1, 0.9, 0.9), 0);
        assert_eq!(first_wish(2, 0.9, 0.999), 1);
    }

    #[test]
    fn a_sku_argument_is_an_id_and_maybe_a_limit() {
        assert_eq!(sku_arg("s3"), ("s3".to_string(), None));
        assert_eq!(sku_arg("s3:1"), ("s3".to_string(), Some(1)));
    }
}
