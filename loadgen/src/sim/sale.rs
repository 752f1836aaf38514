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
use origin::sales::spec::SaleSpec;
use redis::AsyncCommands;
use serde_json::{Value, json};

use crate::sim::args::SaleArgs;

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
        skus: Vec::new(),
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
