//! The simulated sale itself, the same in both modes: created like `origin
//! sale create` would, and its invariants read back from Postgres and Redis
//! at the end.
//!
//! Invariant: the checks are the product's invariants (DESIGN.md 1-4),
//! judged on what Postgres and Redis hold, never on what the simulator
//! counted.

use anyhow::Context;
use origin::ops::configuration::Settings;
use origin::ops::state::AppState;
use origin::sales::sku::SkuSpec;
use origin::sales::spec::SaleSpec;
use redis::AsyncCommands;
use serde_json::{Value, json};

use crate::sim::args::SaleArgs;
use crate::sim::demand::{sku_id, split_units};

/// Connects like `origin serve` (environment) and creates the simulated
/// sale, starting `--prestart-seconds` from now: with `--skus N` above 1,
/// N SKUs sharing `--units` ([`split_units`]).
pub(crate) async fn create_sim_sale(args: &SaleArgs, label: &str) -> anyhow::Result<AppState> {
    let n = usize::from(args.skus);
    anyhow::ensure!(
        n >= 1 && i64::from(args.units) >= n as i64,
        "--units ({}) must be at least --skus ({n}): every SKU needs a unit",
        args.units
    );
    let state = AppState::connect(Settings::from_env()?).await?;
    let starts_at = chrono::Utc::now()
        + chrono::Duration::milliseconds((args.prestart_seconds * 1000.0) as i64);
    // One SKU: the sale made the old way (`--units`, `--price-cents`).
    let skus: Vec<SkuSpec> = if n == 1 {
        Vec::new()
    } else {
        split_units(args.units, n)
            .into_iter()
            .enumerate()
            .map(|(p, units)| SkuSpec {
                id: sku_id(p, n),
                name: None,
                units,
                price_cents: 9_900,
                per_user_limit: None,
            })
            .collect()
    };
    let spec = SaleSpec {
        id: args.sale.clone(),
        name: if n == 1 {
            format!("{label} ({} units)", args.units)
        } else {
            format!("{label} ({} units, {n} SKUs)", args.units)
        },
        units: if n == 1 { args.units } else { 0 },
        per_user_limit: args.per_user_limit,
        shards: args.shards,
        starts_at,
        ends_at: None,
        hold_seconds: args.hold_seconds,
        admission_rate: args.admission_rate,
        admission_factor: args.admission_factor,
        price_cents: if n == 1 { 9_900 } else { 0 },
        queue_shards: 1,
        admission_p99_ms: 50.0,
        bot_check: "none".into(),
        bot_shadow: false,
        // Every simulated person joins from this one loopback address.
        join_limit: 0,
        currency: origin::sales::spec::DEFAULT_CURRENCY.into(),
        draw_beacon: None,
        skus,
    };
    let mut conn = state.engine.conn.clone();
    origin::sales::spec::create_sale(&state.pool, &mut conn, &state.settings.key_prefix, &spec)
        .await
        .context("creating the simulated sale")?;
    Ok(state)
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
    // Per SKU (by position): Postgres's row, the paid reservations, and
    // Redis's stock keys and holds.
    let sku_rows: Vec<(i32, String, i32, i32, i32)> = sqlx::query_as(
        "SELECT position, id, units_total, held, sold FROM skus WHERE sale_id = $1 ORDER BY position",
    )
    .bind(id)
    .fetch_all(&state.pool)
    .await?;
    let paid_by_sku: Vec<(i32, i64)> = sqlx::query_as(
        "SELECT sku, COALESCE(sum(qty), 0)::bigint FROM reservations WHERE sale_id = $1 AND status = 'paid' GROUP BY sku",
    )
    .bind(id)
    .fetch_all(&state.pool)
    .await?;
    let n = sku_rows.len().max(1);
    let mut sku_stock = vec![0i64; n];
    let mut sku_held = vec![0i64; n];
    let mut sku_paid = vec![0i64; n];
    let mut conn = state.engine.conn.clone();
    for (i, k) in sale.shards.iter().enumerate() {
        // Position 0's key on every shard (0 where it is not placed), the
        // others where they are placed (`origin/src/sales/placement.rs`).
        let here: Vec<usize> = (1..n)
            .filter(|&p| sale.placements.get(p).is_some_and(|pl| pl.holds(i)))
            .collect();
        let mut mget = redis::cmd("MGET");
        mget.arg(&k.stock);
        for &p in &here {
            mget.arg(k.stock_of(p as i32));
        }
        let stocks: Vec<Option<i64>> = mget.query_async(&mut conn).await?;
        for (p, v) in std::iter::once(0).chain(here.iter().copied()).zip(stocks) {
            sku_stock[p] += v.unwrap_or(0);
        }
        let holds: std::collections::HashMap<String, String> = conn.hgetall(&k.holds).await?;
        for raw in holds.values() {
            let h: Value = serde_json::from_str(raw)?;
            // A one-SKU sale's holds carry no position.
            let p = h["p"].as_u64().unwrap_or(0) as usize;
            anyhow::ensure!(p < n, "hold of unknown SKU position {p}: {raw}");
            if h["s"] == "paid" {
                sku_paid[p] += h["q"].as_i64().unwrap_or(0);
            } else {
                sku_held[p] += h["q"].as_i64().unwrap_or(0);
            }
        }
    }
    let stock: i64 = sku_stock.iter().sum();
    let redis_held: i64 = sku_held.iter().sum();
    let redis_paid: i64 = sku_paid.iter().sum();
    let skus: Vec<Value> = sku_rows
        .iter()
        .map(|(p, sku, units, held, sold)| {
            let p = *p as usize;
            let units = i64::from(*units);
            let paid = paid_by_sku
                .iter()
                .find(|(s, _)| *s as usize == p)
                .map_or(0, |(_, q)| *q);
            // `skus.sold` cannot pass its units (a CHECK); the paid rows can.
            let sold_seen = i64::from(*sold).max(paid);
            json!({
                "position": p,
                "id": sku,
                "units": units,
                "postgres_sold": sold,
                "postgres_held": held,
                "paid_rows": paid,
                "redis_available": sku_stock[p],
                "redis_held": sku_held[p],
                "redis_paid": sku_paid[p],
                "oversold": sold_seen > units,
                "sold_out_exactly": sold_seen == units,
                "paid_rows_match_sold": paid == i64::from(*sold),
                "redis_adds_up": sku_stock[p] + sku_held[p] + sku_paid[p] == units,
                "postgres_adds_up": i64::from(*held) + i64::from(*sold) + sku_stock[p] == units,
            })
        })
        .collect();
    let every = |k: &str| skus.iter().all(|s| s[k] == true);
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
        // Per SKU (DESIGN.md: invariants 1-3 hold per SKU and sale-wide).
        "no_sku_oversold": !skus.iter().any(|s| s["oversold"] == true),
        "sku_paid_rows_match_sold": every("paid_rows_match_sold"),
        "sku_redis_adds_up": every("redis_adds_up"),
        "sku_postgres_adds_up": every("postgres_adds_up"),
        // Not an invariant: it holds only when demand was sufficient.
        "every_sku_sold_out": every("sold_out_exactly"),
        "skus": skus,
    });
    let all = [
        "sold_le_units",
        "per_user_limit_kept",
        "no_duplicate_payments",
        "paid_rows_match_sold",
        "redis_holds_plus_available_plus_sold_eq_units",
        "postgres_held_plus_sold_plus_redis_available_eq_units",
        "no_sku_oversold",
        "sku_paid_rows_match_sold",
        "sku_redis_adds_up",
        "sku_postgres_adds_up",
    ]
    .iter()
    .all(|k| checks[k] == true);
    let mut checks = checks;
    checks["all_hold"] = json!(all);
    Ok(checks)
}
