//! The chaos checker: a run's history against what Redis and Postgres hold
//! once settlement has drained, the holds have expired and `origin
//! reconcile --once` has run (DESIGN.md invariants 1–4).
//!
//! [`observe`] reads the end state; [`check`] is a pure function of the
//! history and that state, so its tests feed it states with known defects.
//! What it counts (each figure must be 0, except acknowledged holds lost
//! where the fault is allowed to lose unsettled data — see RELIABILITY.md):
//!
//! - **acknowledged holds lost**: a reservation id answered 202 that neither
//!   Postgres nor Redis knows, that Postgres keeps unpaid while Redis no
//!   longer holds it (stranded: nobody can pay or release it), or that ended
//!   `rejected`, `cancelled` without a cancel in the history, or `expired`
//!   before its expiry; plus answers
//!   the end state contradicts: a webhook answered `paid` whose reservation
//!   is not paid, a cancel answered 2xx whose reservation is not cancelled.
//! - **units oversold**: units accounted for beyond the sale's total, in any
//!   view: Redis (stock + holds), Postgres (live reservations; the
//!   inventory's held + sold), Postgres' live units + Redis' stock (units
//!   offered again while Postgres has them taken), a negative shard stock.
//! - **units lost**: the same views falling short of the total (a unit
//!   neither sold, held nor available), and inventory counters above the
//!   live reservations behind them.
//! - **double effects**: one Idempotency-Key that produced two holds (in the
//!   answers, in Postgres, in Redis), one hold id on two shards, two
//!   successful payments or two outbox events for one payment, one provider
//!   event id applied twice, one purchase key answered with two payments,
//!   and effects the history does not explain (a reservation `paid` without
//!   a `payment.succeeded` event for it).
//! - **per-user limit breaches**: accounts holding (Postgres or Redis) more
//!   than the limit, or whose count on their home shard is below what they
//!   hold there and elsewhere (the limit could then be passed later).
//! - **replays answered otherwise** (reported, not an invariant of 1–4): a
//!   key sent again with the same body answered with anything but its first
//!   hold (DESIGN.md "Idempotency": "a replay with the same body gets the
//!   first answer"), or with another qty answered with anything but 422;
//!   answers to retry (429, 5xx, none) do not count.
//! - **time to recover**: from the end of the fault to the first new hold
//!   granted, and to the settlement lag back at its pre-fault level.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use anyhow::Context;
use clap::Args;
use origin::reserve::engine::{HoldRecord, home_shard};
use origin::sales::sale::Sale;
use redis::AsyncCommands;
use serde::Serialize;

use crate::chaos::events::EventsEnd;
use crate::chaos::history::{Entry, Op};
use crate::chaos::row::{Figures, RowArgs};

/// Statuses of a reservation whose units are taken.
const LIVE: [&str; 3] = ["settled", "pending_payment", "paid"];
/// An expiry settled this long before the hold's expiry time is early.
const CLOCK_SLACK_MS: i64 = 1_000;

/// A reservation row (Postgres).
#[derive(Debug, Clone, sqlx::FromRow, Serialize)]
pub struct PgReservation {
    pub id: String,
    pub account: String,
    pub qty: i32,
    pub status: String,
    pub idem: Option<String>,
    pub expires_ms: i64,
    pub released_ms: Option<i64>,
    /// The SKU's position (0 in a one-SKU sale).
    #[sqlx(default)]
    #[serde(default)]
    pub sku: i32,
}

/// One SKU of a sale of several (Postgres `skus`), by position.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SkuState {
    pub id: String,
    pub units: i64,
    /// Its own per-account limit, if it has one.
    pub limit: Option<i64>,
    /// Its inventory: (held, sold).
    pub inventory: (i64, i64),
}

/// A payment row (Postgres).
#[derive(Debug, Clone, sqlx::FromRow, Serialize)]
pub struct PgPayment {
    pub reservation_id: String,
    pub status: String,
    pub refund_required: bool,
}

/// One shard as Redis holds it.
#[derive(Debug, Clone, Default)]
pub struct RedisShard {
    /// `None`: the shard's keys are gone.
    pub stock: Option<i64>,
    pub holds: Vec<(String, HoldRecord)>,
    /// Per-user counts of accounts whose home this shard is (in a sale of
    /// several SKUs also each SKU's, under `account\n<position>`).
    pub users: HashMap<String, i64>,
    /// Settlement entries not yet settled.
    pub stream: i64,
    /// In a sale of several SKUs: the stock keys of the other SKUs placed
    /// on this shard (position → stock; `None`: the key is gone). `stock`
    /// is position 0's.
    pub sku_stock: BTreeMap<i32, Option<i64>>,
}

/// The end state of one sale, from both stores.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    pub units: i64,
    pub per_user_limit: i64,
    /// The inventory row: (held, sold).
    pub inventory: (i64, i64),
    pub reservations: Vec<PgReservation>,
    pub payments: Vec<PgPayment>,
    /// The payment id of each outbox event about this sale's payments.
    pub outbox_payments: Vec<String>,
    pub shards: Vec<RedisShard>,
    /// The SKUs of a sale of several, by position (empty for one SKU: the
    /// sale-wide figures are the SKU's).
    pub skus: Vec<SkuState>,
    /// What left as events (`None`: not read).
    pub events: Option<EventsEnd>,
}

impl Observed {
    /// The sale-wide view: each shard's stock is every SKU's stock there,
    /// and the counts are the sale-wide ones (per-SKU fields left out).
    fn sale_wide(&self) -> Observed {
        let mut v = self.clone();
        for s in &mut v.shards {
            s.stock = s
                .stock
                .map(|st| st + s.sku_stock.values().map(|v| v.unwrap_or(0)).sum::<i64>());
            s.users.retain(|a, _| !a.contains('\n'));
            s.sku_stock.clear();
        }
        v.skus.clear();
        v
    }

    /// The view of the SKU at `position`, as if it were a sale of its own:
    /// its units and limit (the SKU's or the sale's), its inventory row,
    /// its reservations, its stock and holds on each shard, and its
    /// per-account counts.
    fn sku_view(&self, position: i32) -> Option<Observed> {
        let sku = self.skus.get(usize::try_from(position).ok()?)?;
        let suffix = format!("\n{position}");
        let shards = self
            .shards
            .iter()
            .map(|s| RedisShard {
                stock: match (position, s.stock) {
                    (_, None) => None,
                    (0, st) => st,
                    (p, Some(_)) => Some(s.sku_stock.get(&p).copied().flatten().unwrap_or(0)),
                },
                holds: s
                    .holds
                    .iter()
                    .filter(|(_, h)| h.position.unwrap_or(0) == i64::from(position))
                    .cloned()
                    .collect(),
                users: s
                    .users
                    .iter()
                    .filter_map(|(a, n)| Some((a.strip_suffix(&suffix)?.to_string(), *n)))
                    .collect(),
                stream: s.stream,
                sku_stock: BTreeMap::new(),
            })
            .collect();
        Some(Observed {
            units: sku.units,
            per_user_limit: sku.limit.unwrap_or(self.per_user_limit),
            inventory: sku.inventory,
            reservations: self
                .reservations
                .iter()
                .filter(|r| r.sku == position)
                .cloned()
                .collect(),
            payments: Vec::new(),
            outbox_payments: Vec::new(),
            shards,
            skus: Vec::new(),
            events: None,
        })
    }

    /// The end state as JSON, kept beside the row for a post-mortem.
    pub fn dump(&self) -> serde_json::Value {
        let shards: Vec<serde_json::Value> = self
            .shards
            .iter()
            .map(|s| {
                let holds: BTreeMap<&str, serde_json::Value> = s
                    .holds
                    .iter()
                    .map(|(id, h)| {
                        let v = serde_json::json!({"a": h.account, "q": h.qty, "s": h.status,
                                                   "k": h.idem, "h": h.home, "e": h.expires_ms});
                        (id.as_str(), v)
                    })
                    .collect();
                serde_json::json!({"stock": s.stock, "holds": holds, "users": s.users, "stream": s.stream})
            })
            .collect();
        serde_json::json!({
            "units": self.units,
            "per_user_limit": self.per_user_limit,
            "inventory": {"held": self.inventory.0, "sold": self.inventory.1},
            "reservations": self.reservations,
            "payments": self.payments,
            "outbox_payments": self.outbox_payments,
            "shards": shards,
            "events": self.events,
        })
    }
}

/// Reads the end state of `sale`.
pub async fn observe(
    pool: &sqlx::PgPool,
    conn: &mut origin::reserve::store::RedisConn,
    sale: &Sale,
) -> anyhow::Result<Observed> {
    let id = &sale.config.id;
    let (held, sold): (i32, i32) =
        sqlx::query_as("SELECT held, sold FROM inventory WHERE sale_id = $1")
            .bind(id)
            .fetch_one(pool)
            .await
            .context("the sale's inventory row")?;
    let reservations: Vec<PgReservation> = sqlx::query_as(
        "SELECT id, account, qty, status, idem,
                (extract(epoch FROM expires_at) * 1000)::bigint AS expires_ms,
                (extract(epoch FROM released_at) * 1000)::bigint AS released_ms, sku
         FROM reservations WHERE sale_id = $1",
    )
    .bind(id)
    .fetch_all(pool)
    .await?;
    let payments: Vec<PgPayment> = sqlx::query_as(
        "SELECT reservation_id, status, refund_required FROM payments WHERE sale_id = $1",
    )
    .bind(id)
    .fetch_all(pool)
    .await?;
    let outbox_payments: Vec<String> = sqlx::query_scalar(
        "SELECT payload->>'payment_id' FROM outbox
         WHERE payload->>'sale' = $1 AND payload->>'payment_id' IS NOT NULL",
    )
    .bind(id)
    .fetch_all(pool)
    .await?;
    let skus: Vec<SkuState> = if sale.multi_sku() {
        let rows: Vec<(String, i32, Option<i32>, i32, i32)> = sqlx::query_as(
            "SELECT id, units_total, per_user_limit, held, sold FROM skus
             WHERE sale_id = $1 ORDER BY position",
        )
        .bind(id)
        .fetch_all(pool)
        .await?;
        rows.into_iter()
            .map(|(id, units, limit, held, sold)| SkuState {
                id,
                units: i64::from(units),
                limit: limit.map(i64::from),
                inventory: (i64::from(held), i64::from(sold)),
            })
            .collect()
    } else {
        Vec::new()
    };
    let mut shards = Vec::new();
    for (i, k) in sale.shards.iter().enumerate() {
        let mut sku_stock = BTreeMap::new();
        for p in 1..skus.len() as i32 {
            if sale.placement(p).holds(i) {
                sku_stock.insert(p, conn.get(k.stock_of(p)).await?);
            }
        }
        let stock: Option<i64> = conn.get(&k.stock).await?;
        let raw: HashMap<String, String> = conn.hgetall(&k.holds).await?;
        let mut holds: Vec<(String, HoldRecord)> = raw
            .into_iter()
            .map(|(id, r)| {
                let h = HoldRecord::parse(&r).with_context(|| format!("hold {id}: {r}"))?;
                Ok((id, h))
            })
            .collect::<anyhow::Result<_>>()?;
        holds.sort_by(|a, b| a.0.cmp(&b.0));
        shards.push(RedisShard {
            stock,
            holds,
            users: conn.hgetall(&k.users).await?,
            stream: conn.xlen(&k.stream).await?,
            sku_stock,
        });
    }
    Ok(Observed {
        units: i64::from(sale.config.units_total),
        per_user_limit: i64::from(sale.config.per_user_limit),
        inventory: (i64::from(held), i64::from(sold)),
        reservations,
        payments,
        outbox_payments,
        shards,
        skus,
        events: None,
    })
}

/// An answer that asks for a retry (429, 5xx) or no answer at all.
fn retryable_answer(e: &Entry) -> bool {
    e.status.is_none_or(|s| s == 429 || s >= 500)
}

/// When the fault was injected (ms since the Unix epoch).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct FaultWindow {
    pub start_ms: u64,
    pub end_ms: u64,
}

/// The figures of one run: `history` against `end`.
pub fn check(history: &[Entry], end: &Observed, fault: Option<FaultWindow>) -> Figures {
    let mut f = Figures::default();
    let requests: Vec<&Entry> = history.iter().filter(|e| e.is_request()).collect();
    f.requests = requests.len() as i64;
    f.failed_requests = requests
        .iter()
        .filter(|e| e.status.is_none_or(|s| s >= 500))
        .count() as i64;
    let reserve_ops = [Op::Reserve, Op::Replay, Op::Reuse];
    let accepted: Vec<&Entry> = requests
        .iter()
        .copied()
        .filter(|e| reserve_ops.contains(&e.op) && e.status == Some(202))
        .collect();
    f.accepted = accepted.len() as i64;

    let rows: HashMap<&str, &PgReservation> = end
        .reservations
        .iter()
        .map(|r| (r.id.as_str(), r))
        .collect();
    let mut redis_holds: HashMap<&str, Vec<(usize, &HoldRecord)>> = HashMap::new();
    for (i, s) in end.shards.iter().enumerate() {
        for (id, h) in &s.holds {
            redis_holds.entry(id.as_str()).or_default().push((i, h));
        }
    }
    let exists = |id: &str| rows.contains_key(id) || redis_holds.contains_key(id);
    let asked = |op: Op, id: &str| {
        requests
            .iter()
            .any(|e| e.op == op && e.reservation.as_deref() == Some(id))
    };
    let succeeded_event_for = |id: &str| {
        requests.iter().any(|e| {
            e.op == Op::Webhook
                && e.reservation.as_deref() == Some(id)
                && e.kind.as_deref() == Some("payment.succeeded")
        })
    };

    // Acknowledged holds and what became of them.
    let acked: BTreeSet<&str> = accepted
        .iter()
        .filter_map(|e| e.reservation.as_deref())
        .collect();
    f.acknowledged = acked.len() as i64;
    for &id in &acked {
        match rows.get(id) {
            None if !redis_holds.contains_key(id) => {
                f.acks_lost
                    .add(1, || format!("{id}: known to neither store"));
            }
            None => {}
            Some(r) => match r.status.as_str() {
                "rejected" => f
                    .acks_lost
                    .add(1, || format!("{id}: rejected by Postgres after a 202")),
                "settled" | "pending_payment" if !redis_holds.contains_key(id) => {
                    f.acks_lost.add(1, || {
                        format!(
                            "{id}: {} in Postgres, gone from Redis: nobody can pay or release it",
                            r.status
                        )
                    })
                }
                "cancelled" if !asked(Op::Cancel, id) => f
                    .acks_lost
                    .add(1, || format!("{id}: cancelled, but nobody asked")),
                "expired" if r.released_ms.unwrap_or(i64::MAX) < r.expires_ms - CLOCK_SLACK_MS => {
                    f.acks_lost.add(1, || {
                        format!(
                            "{id}: expired {} ms before its expiry",
                            r.expires_ms - r.released_ms.unwrap_or_default()
                        )
                    })
                }
                "paid" if !succeeded_event_for(id) => f.double_effects.add(1, || {
                    format!("{id}: paid without a payment.succeeded event")
                }),
                _ => {}
            },
        }
    }
    // Answers the end state must keep.
    let mut kept: BTreeSet<(&str, &str)> = BTreeSet::new();
    for e in &requests {
        let Some(id) = e.reservation.as_deref() else {
            continue;
        };
        let status = rows.get(id).map(|r| r.status.as_str());
        if e.op == Op::Webhook && e.ok() && e.result.as_deref() == Some("paid") {
            if status != Some("paid") && kept.insert(("paid", id)) {
                f.acks_lost.add(1, || {
                    format!("{id}: webhook answered paid, reservation is {status:?}")
                });
            }
        } else if e.op == Op::Cancel
            && e.ok()
            && status != Some("cancelled")
            && kept.insert(("cancelled", id))
        {
            f.acks_lost.add(1, || {
                format!(
                    "{id}: cancel answered {:?}, reservation is {status:?}",
                    e.status
                )
            });
        }
    }

    // Replays: the first answer again; reuses: 422.
    let first_hold: HashMap<(&str, &str), &str> = accepted
        .iter()
        .filter(|e| e.op == Op::Reserve)
        .filter_map(|e| {
            Some((
                (e.account.as_str(), e.key.as_deref()?),
                e.reservation.as_deref()?,
            ))
        })
        .collect();
    for e in requests.iter().filter(|e| !retryable_answer(e)) {
        let Some(key) = e.key.as_deref() else {
            continue;
        };
        let first = first_hold.get(&(e.account.as_str(), key)).copied();
        let same = e.status == Some(202) && e.reservation.as_deref() == first;
        let odd = match e.op {
            Op::Replay => !same,
            Op::Reuse => e.status != Some(422),
            _ => false,
        };
        if odd {
            f.replays_answered_otherwise.add(1, || {
                format!(
                    "{} of {:?} (first hold {first:?}) answered {:?} {}",
                    if e.op == Op::Replay {
                        "replay"
                    } else {
                        "reuse with another qty"
                    },
                    e.key.as_deref().unwrap_or_default(),
                    e.status,
                    e.code
                        .as_deref()
                        .or(e.reservation.as_deref())
                        .unwrap_or_default()
                )
            });
        }
    }

    // Double effects.
    let mut by_key: BTreeMap<(&str, &str), BTreeSet<&str>> = BTreeMap::new();
    for e in &accepted {
        if let (Some(k), Some(id)) = (e.key.as_deref(), e.reservation.as_deref()) {
            by_key
                .entry((e.account.as_str(), k))
                .or_default()
                .insert(id);
        }
    }
    for ((account, key), ids) in &by_key {
        let real = ids.iter().filter(|id| exists(id)).count() as i64;
        f.double_effects.add(real - 1, || {
            format!(
                "{account} key {key}: answered with {} holds: {ids:?}",
                ids.len()
            )
        });
    }
    let mut pg_by_idem: BTreeMap<(&str, &str), Vec<&str>> = BTreeMap::new();
    for r in &end.reservations {
        if let Some(k) = r.idem.as_deref() {
            pg_by_idem
                .entry((r.account.as_str(), k))
                .or_default()
                .push(r.id.as_str());
        }
    }
    for ((account, _), ids) in &pg_by_idem {
        f.double_effects.add(ids.len() as i64 - 1, || {
            format!(
                "{account}: one key, {} reservations in Postgres: {ids:?}",
                ids.len()
            )
        });
    }
    let mut redis_by_idem: BTreeMap<(&str, &str), BTreeSet<&str>> = BTreeMap::new();
    for (id, places) in &redis_holds {
        f.double_effects.add(places.len() as i64 - 1, || {
            format!("{id}: held on {} shards", places.len())
        });
        let h = places[0].1;
        if let Some(k) = h.idem.as_deref() {
            redis_by_idem
                .entry((h.account.as_str(), k))
                .or_default()
                .insert(id);
        }
    }
    for ((account, _), ids) in &redis_by_idem {
        f.double_effects.add(ids.len() as i64 - 1, || {
            format!("{account}: one key, {} holds in Redis: {ids:?}", ids.len())
        });
    }
    let mut sold_per_reservation: BTreeMap<&str, i64> = BTreeMap::new();
    for p in &end.payments {
        if p.status == "succeeded" && !p.refund_required {
            *sold_per_reservation
                .entry(p.reservation_id.as_str())
                .or_default() += 1;
        }
        if p.refund_required {
            f.refunds += 1;
        }
    }
    for (id, n) in &sold_per_reservation {
        f.double_effects
            .add(n - 1, || format!("{id}: {n} successful payments"));
    }
    let mut outbox: BTreeMap<&str, i64> = BTreeMap::new();
    for p in &end.outbox_payments {
        *outbox.entry(p.as_str()).or_default() += 1;
    }
    for (p, n) in &outbox {
        f.double_effects
            .add(n - 1, || format!("{p}: {n} outbox events"));
    }
    let mut applied: BTreeMap<&str, i64> = BTreeMap::new();
    for e in requests.iter().filter(|e| e.op == Op::Webhook && e.ok()) {
        if matches!(
            e.result.as_deref(),
            Some("paid" | "refund_required" | "failed")
        ) && let Some(ev) = e.event.as_deref()
        {
            *applied.entry(ev).or_default() += 1;
        }
    }
    for (ev, n) in &applied {
        f.double_effects
            .add(n - 1, || format!("event {ev} applied {n} times"));
    }
    let mut purchase_keys: BTreeMap<(&str, &str), BTreeSet<&str>> = BTreeMap::new();
    for e in requests.iter().filter(|e| e.op == Op::Purchase && e.ok()) {
        if let (Some(k), Some(p)) = (e.key.as_deref(), e.payment.as_deref()) {
            purchase_keys
                .entry((e.account.as_str(), k))
                .or_default()
                .insert(p);
        }
    }
    for ((account, key), ps) in &purchase_keys {
        f.double_effects.add(ps.len() as i64 - 1, || {
            format!("{account} purchase key {key}: payments {ps:?}")
        });
    }

    // Units and limits: sale-wide, and in a sale of several SKUs each SKU
    // as a sale of its own (DESIGN.md: invariants 1-3 hold per SKU and
    // sale-wide).
    let wide = end.sale_wide();
    let (sold, available, still_held) = check_units(&wide, &mut f, "");
    (f.sold, f.available, f.still_held) = (sold, available, still_held);
    for (p, sku) in end.skus.iter().enumerate() {
        if let Some(view) = end.sku_view(p as i32) {
            check_units(&view, &mut f, &format!("SKU {}: ", sku.id));
        }
    }

    // Time to recover.
    if let Some(w) = fault {
        f.faulted = true;
        f.overlapping = requests
            .iter()
            .filter(|e| e.t0 <= w.end_ms && e.t1 >= w.start_ms)
            .count() as i64;
        f.recover_202_ms = accepted
            .iter()
            .filter(|e| e.op == Op::Reserve && !e.replayed && e.t1 >= w.end_ms)
            .map(|e| e.t1 - w.end_ms)
            .min();
        let samples: Vec<&Entry> = history.iter().filter(|e| e.op == Op::Lag).collect();
        let baseline = samples
            .iter()
            .filter(|e| e.t0 < w.start_ms)
            .filter_map(|e| e.lag)
            .max()
            .unwrap_or(0);
        f.recover_lag_ms = samples
            .iter()
            .filter(|e| e.t0 >= w.end_ms && e.lag.is_some_and(|l| l <= baseline))
            .map(|e| e.t0 - w.end_ms)
            .min();
    }
    f.max_lag = history.iter().filter_map(|e| e.lag).max().unwrap_or(0);
    if let Some(ev) = &end.events {
        crate::chaos::events::check(ev, &mut f);
    }
    f
}

/// The unit and limit figures of one view (the sale's, or one SKU's as a
/// sale of its own; `label` starts each example): every view must account
/// for exactly its units, no account above its limit. Returns (sold,
/// available, still held) of the view.
fn check_units(end: &Observed, f: &mut Figures, label: &str) -> (i64, i64, i64) {
    // Units: every view must account for exactly the sale's total.
    let units = end.units;
    let stock: i64 = end.shards.iter().map(|s| s.stock.unwrap_or(0)).sum();
    let hold_units: i64 = end
        .shards
        .iter()
        .flat_map(|s| &s.holds)
        .map(|(_, h)| h.qty)
        .sum();
    let live_rows: i64 = end
        .reservations
        .iter()
        .filter(|r| LIVE.contains(&r.status.as_str()))
        .map(|r| i64::from(r.qty))
        .sum();
    let paid_rows: i64 = end
        .reservations
        .iter()
        .filter(|r| r.status == "paid")
        .map(|r| i64::from(r.qty))
        .sum();
    let (inv_held, inv_sold) = end.inventory;
    let views = [
        (
            format!("Redis stock {stock} + holds {hold_units}"),
            stock + hold_units,
            "Redis has more units than the sale",
        ),
        (
            format!("Postgres live reservations {live_rows} + Redis stock {stock}"),
            live_rows + stock,
            "Redis offers units Postgres has taken",
        ),
    ];
    for (view, n, over) in views {
        f.oversold.add(n - units, || {
            format!("{label}{view} = {n} > {units} units: {over}")
        });
        f.lost_units
            .add(units - n, || format!("{label}{view} = {n} < {units} units"));
    }
    let over = [
        ("Postgres live reservations", live_rows),
        ("Postgres inventory held + sold", inv_held + inv_sold),
        ("Redis holds", hold_units),
    ];
    for (view, n) in over {
        f.oversold
            .add(n - units, || format!("{label}{view} = {n} > {units} units"));
    }
    f.oversold.add(live_rows - (inv_held + inv_sold), || {
        format!(
            "{label}Postgres inventory held + sold = {} below its live reservations {live_rows}",
            inv_held + inv_sold
        )
    });
    f.lost_units.add(inv_held + inv_sold - live_rows, || {
        format!(
            "{label}Postgres inventory held + sold = {} above its live reservations {live_rows}",
            inv_held + inv_sold
        )
    });
    f.lost_units.add(inv_sold - paid_rows, || {
        format!("{label}inventory sold {inv_sold} > paid reservations {paid_rows}")
    });
    f.oversold.add(paid_rows - inv_sold, || {
        format!("{label}paid reservations {paid_rows} > inventory sold {inv_sold}")
    });
    for (i, s) in end.shards.iter().enumerate() {
        if let Some(st) = s.stock {
            f.oversold
                .add(-st, || format!("{label}shard {i}: stock {st} below zero"));
        }
    }

    // Per-user limit.
    let limit = end.per_user_limit;
    let mut breached: BTreeSet<String> = BTreeSet::new();
    let mut pg_units: BTreeMap<&str, i64> = BTreeMap::new();
    for r in end
        .reservations
        .iter()
        .filter(|r| LIVE.contains(&r.status.as_str()))
    {
        *pg_units.entry(r.account.as_str()).or_default() += i64::from(r.qty);
    }
    let mut redis_units: BTreeMap<&str, i64> = BTreeMap::new();
    for (_, h) in end.shards.iter().flat_map(|s| &s.holds) {
        *redis_units.entry(h.account.as_str()).or_default() += h.qty;
    }
    for (store, per) in [("Postgres", &pg_units), ("Redis", &redis_units)] {
        for (a, n) in per {
            if *n > limit && breached.insert(a.to_string()) {
                f.limit_breaches.add(1, || {
                    format!("{label}{a}: {n} units in {store}, limit {limit}")
                });
            }
        }
    }
    let n_shards = end.shards.len();
    for (a, n) in &redis_units {
        let home = &end.shards[home_shard(a, n_shards)];
        if home.stock.is_none() {
            continue;
        }
        let count = home.users.get(*a).copied().unwrap_or(0);
        if count < *n && breached.insert(a.to_string()) {
            f.limit_breaches.add(1, || {
                format!("{label}{a}: holds {n} units, its home shard counts {count}")
            });
        }
    }
    (inv_sold, stock, live_rows - paid_rows)
}

#[derive(Args, Clone, Debug)]
pub struct CheckArgs {
    #[arg(long, default_value = "chaos")]
    pub sale: String,
    #[arg(long)]
    pub history: std::path::PathBuf,
    /// The fault's start and end (ms since the Unix epoch), for the time to
    /// recover.
    #[arg(long, requires = "fault_end_ms")]
    pub fault_start_ms: Option<u64>,
    #[arg(long, requires = "fault_start_ms")]
    pub fault_end_ms: Option<u64>,
    /// The webhook receiver's log (one JSON line per delivery it
    /// verified): every event must have reached it, one reservation's
    /// events in order.
    #[arg(long)]
    pub webhook_log: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub row: RowArgs,
}

/// Connects like `origin serve` (environment), reads the end state, checks,
/// writes the row.
pub async fn run(args: CheckArgs) -> anyhow::Result<()> {
    let state =
        origin::ops::state::AppState::connect(origin::ops::configuration::Settings::from_env()?)
            .await?;
    let sale = state
        .sales
        .get(&args.sale)
        .await?
        .with_context(|| format!("no sale {}", args.sale))?;
    let history = crate::chaos::history::read(&args.history)?;
    let mut conn = state.engine.conn.clone();
    let mut end = observe(&state.pool, &mut conn, &sale).await?;
    end.events = Some(
        crate::chaos::events::observe(&state, args.webhook_log.as_deref())
            .await
            .context("the events")?,
    );
    let fault = args
        .fault_start_ms
        .zip(args.fault_end_ms)
        .map(|(start_ms, end_ms)| FaultWindow { start_ms, end_ms });
    std::fs::write(
        args.row.out.with_extension("state.json"),
        serde_json::to_string(&end.dump())?,
    )?;
    args.row.write(Some(check(&history, &end, fault)), None)
}

/// Waits until the sale is quiet: settlement drained and no unpaid hold
/// left (each expired and swept), in both stores; bounded. Unpaid
/// reservations Postgres keeps while Redis holds nothing and has nothing to
/// settle will never be released by either store: once they have stood
/// still for [`STRANDED_AFTER`], waiting longer changes nothing.
pub async fn wait_quiet(sale_id: &str, max: std::time::Duration) -> anyhow::Result<()> {
    use std::time::Instant;
    let state =
        origin::ops::state::AppState::connect(origin::ops::configuration::Settings::from_env()?)
            .await?;
    let deadline = Instant::now() + max;
    // (Postgres' unpaid reservations while Redis is quiet, since when)
    let mut stranded: Option<(Vec<String>, Instant)> = None;
    loop {
        let quiet = async {
            let sale = state.sales.get(sale_id).await?.context("no such sale")?;
            let mut conn = state.engine.conn.clone();
            let end = observe(&state.pool, &mut conn, &sale).await?;
            let stream: i64 = end.shards.iter().map(|s| s.stream).sum();
            let redis_held = end
                .shards
                .iter()
                .flat_map(|s| &s.holds)
                .filter(|(_, h)| h.status != "paid")
                .count();
            let pg_held: Vec<String> = end
                .reservations
                .iter()
                .filter(|r| matches!(r.status.as_str(), "settled" | "pending_payment"))
                .map(|r| r.id.clone())
                .collect();
            anyhow::Ok((stream == 0 && redis_held == 0, pg_held, stream, redis_held))
        }
        .await;
        let last = match quiet {
            Ok((true, pg, ..)) if pg.is_empty() => return Ok(()),
            Ok((true, pg, ..)) => {
                let n = pg.len();
                match &stranded {
                    Some((ids, since)) if *ids == pg => {
                        if since.elapsed() >= STRANDED_AFTER {
                            eprintln!(
                                "chaos wait: {n} unpaid reservations in Postgres that Redis does not hold \
                                 stood still for {STRANDED_AFTER:?}; checking"
                            );
                            return Ok(());
                        }
                    }
                    _ => stranded = Some((pg, Instant::now())),
                }
                format!("Redis quiet, {n} unpaid reservations in Postgres")
            }
            Ok((false, pg, stream, redis_held)) => {
                stranded = None;
                format!(
                    "lag {stream}, unpaid holds: Redis {redis_held}, Postgres {}",
                    pg.len()
                )
            }
            Err(e) => format!("{e:#}"),
        };
        if Instant::now() >= deadline {
            eprintln!("chaos wait: not quiet after {max:?} ({last}); checking anyway");
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

/// How long unpaid Postgres reservations that Redis does not hold must
/// stand still before [`wait_quiet`] stops waiting for them.
const STRANDED_AFTER: std::time::Duration = std::time::Duration::from_secs(20);

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(account: &str, qty: i64, idem: &str, status: &str) -> HoldRecord {
        serde_json::from_value(serde_json::json!({
            "a": account, "q": qty, "e": 0, "h": 0, "c": 0, "s": status, "k": idem,
        }))
        .unwrap()
    }

    fn row(id: &str, account: &str, qty: i32, status: &str, idem: &str) -> PgReservation {
        PgReservation {
            id: id.into(),
            account: account.into(),
            qty,
            status: status.into(),
            idem: Some(idem.into()),
            expires_ms: 10_000,
            released_ms: Some(20_000),
            sku: 0,
        }
    }

    fn reserve(account: &str, key: &str, id: &str, t: u64) -> Entry {
        let mut e = Entry::new(Op::Reserve, t);
        e.t1 = t + 5;
        e.account = account.into();
        e.key = Some(key.into());
        e.qty = Some(1);
        e.status = Some(202);
        e.reservation = Some(id.into());
        e.granted = Some(1);
        e
    }

    /// A clean end state: 10 units on one shard; `a` bought 1 (r1), `b`'s
    /// hold r2 expired; 9 units available.
    fn clean() -> (Vec<Entry>, Observed) {
        let mut history = vec![
            reserve("a", "k1", "s.0.1", 1_000),
            reserve("b", "k2", "s.0.2", 1_100),
        ];
        let mut pay = Entry::new(Op::Webhook, 2_000);
        pay.account = "a".into();
        pay.reservation = Some("s.0.1".into());
        pay.event = Some("evt1".into());
        pay.kind = Some("payment.succeeded".into());
        pay.payment = Some("pay1".into());
        pay.status = Some(200);
        pay.result = Some("paid".into());
        history.push(pay.clone());
        let mut dup = pay;
        dup.result = Some("duplicate".into());
        history.push(dup);
        let end = Observed {
            units: 10,
            per_user_limit: 2,
            inventory: (0, 1),
            reservations: vec![
                row("s.0.1", "a", 1, "paid", "h1"),
                row("s.0.2", "b", 1, "expired", "h2"),
            ],
            payments: vec![PgPayment {
                reservation_id: "s.0.1".into(),
                status: "succeeded".into(),
                refund_required: false,
            }],
            outbox_payments: vec!["pay1".into()],
            shards: vec![RedisShard {
                stock: Some(9),
                holds: vec![("s.0.1".into(), hold("a", 1, "h1", "paid"))],
                users: [("a".to_string(), 1)].into(),
                stream: 0,
                sku_stock: BTreeMap::new(),
            }],
            skus: Vec::new(),
            events: None,
        };
        (history, end)
    }

    #[test]
    fn a_clean_run_has_nothing_to_report() {
        let (history, end) = clean();
        let f = check(&history, &end, None);
        assert_eq!(f.requests, 4);
        assert_eq!(f.accepted, 2);
        assert_eq!(f.acknowledged, 2);
        for finding in [
            &f.acks_lost,
            &f.oversold,
            &f.lost_units,
            &f.double_effects,
            &f.limit_breaches,
        ] {
            assert_eq!(finding.count, 0, "{f:#?}");
        }
        assert!(!f.broken());
        assert_eq!((f.sold, f.available), (1, 9));
    }

    #[test]
    fn a_lost_acknowledged_hold_is_counted() {
        let (mut history, end) = clean();
        // A 202 for a hold neither store knows.
        history.push(reserve("c", "k3", "s.0.3", 1_200));
        let f = check(&history, &end, None);
        assert_eq!(f.acks_lost.count, 1, "{f:#?}");
        assert!(f.acks_lost.examples[0].contains("s.0.3"));
        assert!(!f.broken(), "a lost ack alone loses no unit");

        // A webhook answered paid whose reservation ended otherwise.
        let (history, mut end) = clean();
        end.reservations[0].status = "expired".into();
        end.inventory = (0, 0);
        end.shards[0].holds.clear();
        end.shards[0].users.clear();
        end.shards[0].stock = Some(10);
        let f = check(&history, &end, None);
        assert_eq!(f.acks_lost.count, 1, "{f:#?}");
        assert_eq!(f.lost_units.count, 0, "{f:#?}");
    }

    #[test]
    fn a_hold_stranded_in_postgres_is_a_lost_ack() {
        // Settled, then gone from Redis (a failover lost it): Postgres keeps
        // its unit taken, Redis offers it again.
        let (mut history, mut end) = clean();
        history.push(reserve("c", "k3", "s.0.3", 1_200));
        end.reservations.push(row("s.0.3", "c", 1, "settled", "h3"));
        end.inventory = (1, 1);
        let f = check(&history, &end, None);
        assert_eq!(f.acks_lost.count, 1, "{f:#?}");
        assert!(
            f.acks_lost.examples[0].contains("gone from Redis"),
            "{f:#?}"
        );
        assert_eq!(f.oversold.count, 1, "Redis offers the unit again: {f:#?}");
    }

    #[test]
    fn an_oversell_is_counted() {
        let (history, mut end) = clean();
        // Redis offers 10 units while a paid hold has one of them.
        end.shards[0].stock = Some(10);
        let f = check(&history, &end, None);
        assert_eq!(f.oversold.count, 2, "Redis and cross view: {f:#?}");
        assert!(f.broken());
    }

    #[test]
    fn lost_units_are_counted() {
        let (history, mut end) = clean();
        end.shards[0].stock = Some(7);
        let f = check(&history, &end, None);
        assert_eq!(f.lost_units.count, 4, "2 in each view: {f:#?}");
        assert!(f.broken());
    }

    #[test]
    fn double_effects_are_counted() {
        // One key answered with two holds that both exist.
        let (mut history, mut end) = clean();
        history.push(reserve("b", "k2", "s.0.4", 1_300));
        end.reservations.push(row("s.0.4", "b", 1, "expired", "h2"));
        // One webhook event applied twice, and two outbox events.
        let mut again = history[2].clone();
        again.result = Some("paid".into());
        history.push(again);
        end.outbox_payments.push("pay1".into());
        let f = check(&history, &end, None);
        // key in answers + key in Postgres + event twice + outbox twice
        assert_eq!(f.double_effects.count, 4, "{f:#?}");
        assert!(f.broken());
    }

    #[test]
    fn an_unexplained_payment_is_a_double_effect() {
        let (mut history, end) = clean();
        history.retain(|e| e.op != Op::Webhook);
        let f = check(&history, &end, None);
        assert_eq!(f.double_effects.count, 1, "{f:#?}");
    }

    #[test]
    fn limit_breaches_are_counted() {
        let (history, mut end) = clean();
        end.shards[0]
            .holds
            .push(("s.0.5".into(), hold("a", 2, "h5", "held")));
        end.shards[0].stock = Some(7);
        end.reservations.push(row("s.0.5", "a", 2, "settled", "h5"));
        end.inventory = (2, 1);
        let f = check(&history, &end, None);
        assert_eq!(f.limit_breaches.count, 1, "{f:#?}");
        assert_eq!(f.lost_units.count + f.oversold.count, 0, "{f:#?}");
    }

    #[test]
    fn replays_answered_otherwise_are_counted() {
        let (mut history, end) = clean();
        let mut replay = reserve("a", "k1", "s.0.1", 1_010);
        replay.op = Op::Replay;
        history.push(replay.clone());
        replay.status = Some(410);
        replay.reservation = None;
        replay.code = Some("sold_out".into());
        history.push(replay.clone());
        replay.status = Some(503);
        history.push(replay);
        let mut reuse = reserve("a", "k1", "s.0.1", 1_020);
        reuse.op = Op::Reuse;
        reuse.qty = Some(2);
        history.push(reuse.clone());
        reuse.status = Some(422);
        reuse.reservation = None;
        history.push(reuse);
        let f = check(&history, &end, None);
        // The 410 replay and the 202 reuse; not the 503, not the right ones.
        assert_eq!(f.replays_answered_otherwise.count, 2, "{f:#?}");
        assert!(!f.broken());
    }

    #[test]
    fn recovery_is_measured_from_the_fault_end() {
        let (mut history, end) = clean();
        let lag = |t: u64, n: Option<i64>| {
            let mut e = Entry::new(Op::Lag, t);
            e.lag = n;
            e
        };
        history.extend([
            lag(500, Some(3)),
            lag(5_000, None),
            lag(7_000, Some(40)),
            lag(8_000, Some(2)),
        ]);
        history.push(reserve("c", "k9", "s.0.9", 6_500));
        let f = check(
            &history,
            &end,
            Some(FaultWindow {
                start_ms: 4_000,
                end_ms: 6_000,
            }),
        );
        assert_eq!(f.recover_202_ms, Some(505));
        assert_eq!(f.recover_lag_ms, Some(2_000));
        assert_eq!(f.max_lag, 40);
    }

    /// A sale of two SKUs whose totals add up while one SKU is oversold
    /// and the other short: only the per-SKU views see it.
    #[test]
    fn a_sku_oversold_is_counted_though_the_sale_adds_up() {
        let mut holds = Vec::new();
        let mut users = HashMap::new();
        let mut reservations = Vec::new();
        for i in 0..6 {
            let (id, a) = (format!("s.0.{i}"), format!("x{i}"));
            let mut h = hold(&a, 1, &format!("k{i}"), "held");
            h.position = Some(0);
            holds.push((id.clone(), h));
            users.insert(a.clone(), 1);
            users.insert(format!("{a}\n0"), 1);
            let mut r = row(&id, &a, 1, "settled", &format!("k{i}"));
            r.expires_ms = i64::MAX;
            reservations.push(r);
        }
        let end = Observed {
            units: 10,
            per_user_limit: 2,
            inventory: (6, 0),
            reservations,
            payments: Vec::new(),
            outbox_payments: Vec::new(),
            shards: vec![RedisShard {
                stock: Some(0),
                holds,
                users,
                stream: 0,
                sku_stock: [(1, Some(4))].into(),
            }],
            skus: vec![
                SkuState {
                    id: "a".into(),
                    units: 5,
                    limit: None,
                    inventory: (6, 0),
                },
                SkuState {
                    id: "b".into(),
                    units: 5,
                    limit: None,
                    inventory: (0, 0),
                },
            ],
            events: None,
        };
        let wide = check(
            &[],
            &Observed {
                skus: Vec::new(),
                ..end.clone()
            }
            .sale_wide(),
            None,
        );
        assert_eq!(
            (wide.oversold.count, wide.lost_units.count),
            (0, 0),
            "sale-wide it adds up: {wide:#?}"
        );
        let f = check(&[], &end, None);
        assert!(f.oversold.count > 0, "{f:#?}");
        assert!(
            f.oversold.examples.iter().all(|e| e.starts_with("SKU a: ")),
            "{f:#?}"
        );
        assert!(f.lost_units.count > 0, "{f:#?}");
        assert!(
            f.lost_units
                .examples
                .iter()
                .all(|e| e.starts_with("SKU b: ")),
            "{f:#?}"
        );
        assert_eq!(f.limit_breaches.count, 0, "{f:#?}");
        assert_eq!((f.sold, f.available, f.still_held), (0, 4, 6));
    }
}
