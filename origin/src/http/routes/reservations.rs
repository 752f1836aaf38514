//! Reservation endpoints. Validation order: admit token (401/403; it names
//! its sale, so no config is loaded for a request without one) → sale
//! exists → Idempotency-Key → body (400 malformed; 404 `unknown_sku`, 422
//! `sku_required`, bad qty) → sale phase
//! → load shedding (429) → in-process sold-out flag → the Redis engine.
//! Every refusal before the engine changes nothing.
//!
//! The sold-out path costs one Redis read: while the flag is set (fresh, or
//! stale and confirmed by Redis, one request at a time), the request's own Idempotency-Key record
//! is read first (one GET on the account's home shard, O(1), no script).
//! Only a key with no record gets 410 `sold_out`; a key already used goes on
//! to the engine, which replays its first answer (or 422 for another qty)
//! — DESIGN.md, "Idempotency". (The speed target said "no Redis call" for
//! a sold-out answer; this read is the price of answering replays right.)
//! The edge still answers 410 for any attempt, replays included, once it
//! knows the sale is sold out (edge/README.md, "Known limits").

use std::time::Instant;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use crate::http::auth;
use crate::http::error::ApiError;
use crate::http::load::Ended;
use crate::ops::state::AppState;
use crate::reserve::ack::FactKind;
use crate::reserve::engine::{HoldRecord, Outcome, Released, ReservationId, StockState};
use crate::sales::sale::{Phase, Sale};

fn rfc3339_ms(ms: u64) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms as i64)
        .unwrap_or_default()
        .to_rfc3339()
}

/// Holds `qty` units for the admit token's account (the one way to buy).
#[utoipa::path(
    post,
    path = "/api/sales/{sale}/reservations",
    tag = "reservations",
    params(
        ("sale" = String, Path, description = "The sale id", example = "drop-1"),
        ("Idempotency-Key" = String, Header, description = "1-200 visible ASCII characters; one key is one request: a replay answers the same", pattern = "^[!-~]{1,200}$"),
    ),
    request_body(content = crate::http::bodies::ReserveBody, content_type = "application/json"),
    security(("bearer" = [])),
    responses(
        (status = 202, description = "Held (or the replay of a key's first answer, `Idempotent-Replayed: true`)", body = crate::http::api::Reservation,
            headers(("Location" = String, description = "/api/reservations/{id}"), ("x-origin-load" = String, description = "the load signal"))),
        (status = 400, description = "`malformed_json`, `idempotency_key_missing`, `idempotency_key_invalid`", body = crate::http::api::ErrorBody),
        (status = 401, description = "`token_*`: missing or bad admit token", body = crate::http::api::ErrorBody),
        (status = 403, description = "`token_wrong_sale`, `admission_revoked` (the shop ended this account's admission: no new hold)", body = crate::http::api::ErrorBody),
        (status = 404, description = "`sale_not_found`, `unknown_sku` (the sale sells no SKU of that id)", body = crate::http::api::ErrorBody),
        (status = 409, description = "`per_user_limit` (the sale-wide limit, units across all SKUs), `sku_per_user_limit` (the SKU's own limit), `sale_not_started`", body = crate::http::api::ErrorBody),
        (status = 410, description = "`sold_out` (every SKU), `sku_sold_out` (this SKU; others are left), `sale_ended`, `reservation_released`", body = crate::http::api::ErrorBody),
        (status = 422, description = "`invalid_body`, `invalid_qty`, `sku_required` (`sku` left out on a sale of several SKUs), `idempotency_key_reused` (the key was used with another qty or SKU)", body = crate::http::api::ErrorBody),
        (status = 429, description = "`overloaded`: shed, nothing changed", body = crate::http::api::ErrorBody, headers(("Retry-After" = u32, description = "seconds"))),
        (status = 503, description = "`redis_unavailable`, `sale_unavailable`, `database_unavailable`, `not_replicated` (`REDIS_ACK=wait`: no replica confirmed the hold in time; it may exist: retry with the same Idempotency-Key, which answers this same hold)", body = crate::http::api::ErrorBody, headers(("Retry-After" = u32, description = "seconds"))),
    )
)]
pub async fn create(
    State(app): State<AppState>,
    Path(sale_id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let started = Instant::now();
    let result = create_inner(&app, &sale_id, &headers, &body).await;
    let outcome = match &result {
        Ok((_, true)) => "replayed",
        Ok((_, false)) => {
            app.sales
                .granted(&sale_id)
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            "held"
        }
        Err(e) => e.code(),
    };
    metrics::counter!("flashsale_reservation_requests_total", "outcome" => outcome).increment(1);
    metrics::histogram!("flashsale_reservation_seconds").record(started.elapsed().as_secs_f64());
    let ended = match &result {
        Ok(_) => Ended::Accepted,
        Err(e) if e.status() == StatusCode::TOO_MANY_REQUESTS => Ended::Shed,
        Err(e) if e.status().is_server_error() => Ended::Failed,
        Err(_) => Ended::Other,
    };
    app.load.record(ended, started.elapsed());
    let mut res = match result {
        Ok((body, replay)) => {
            let location = format!(
                "/api/reservations/{}",
                body["reservation_id"].as_str().unwrap_or_default()
            );
            // A replay repeats the first answer exactly; the header only
            // tells clients (and tests) that nothing new happened.
            let mut res = (
                StatusCode::ACCEPTED,
                [(header::LOCATION, location)],
                Json(body),
            )
                .into_response();
            if replay {
                res.headers_mut().insert(
                    "idempotent-replayed",
                    header::HeaderValue::from_static("true"),
                );
            }
            res
        }
        Err(e) => e.into_response(),
    };
    // The load signal rides on the answer the edge forwards anyway.
    if let Ok(v) = header::HeaderValue::from_str(&app.load.header()) {
        res.headers_mut().insert(LOAD_HEADER, v);
    }
    res
}

/// The compact load signal on every reservation answer (see `crate::http::load`).
pub const LOAD_HEADER: &str = "x-origin-load";

fn idempotency_key(headers: &HeaderMap) -> Result<&str, ApiError> {
    let value = headers.get("idempotency-key").ok_or_else(|| {
        ApiError::bad_request(
            "idempotency_key_missing",
            "an Idempotency-Key header is required",
        )
    })?;
    value
        .to_str()
        .ok()
        .filter(|k| (1..=200).contains(&k.len()) && k.bytes().all(|b| b.is_ascii_graphic()))
        .ok_or_else(|| {
            ApiError::bad_request(
                "idempotency_key_invalid",
                "Idempotency-Key must be 1-200 visible ASCII characters",
            )
        })
}

async fn load_sale(app: &AppState, sale_id: &str) -> Result<std::sync::Arc<Sale>, ApiError> {
    app.sales
        .get(sale_id)
        .await?
        .ok_or_else(|| ApiError::not_found("sale_not_found", format!("no sale {sale_id:?}")))
}

async fn create_inner(
    app: &AppState,
    sale_id: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(Value, bool), ApiError> {
    // The token first: it names its sale, so a request without one, or for
    // another sale, costs no config load (issue 43 #8).
    let claims = auth::admit_for_sale(&app.admission_keys, headers, sale_id)?;
    let sale = load_sale(app, sale_id).await?;
    let cfg = &sale.config;
    let key = idempotency_key(headers)?;
    let (sku, qty) =
        crate::http::bodies::reservation_request(body, |n| sale.sku(n), cfg.per_user_limit)?;
    match cfg.phase_by_time(Utc::now()) {
        Phase::Upcoming => {
            return Err(ApiError::conflict(
                "sale_not_started",
                "the sale has not started yet",
            ));
        }
        Phase::Ended => {
            return Err(ApiError::Gone {
                code: "sale_ended",
                message: "the sale has ended".into(),
            });
        }
        Phase::Live | Phase::SoldOut => {}
    }
    // Shedding first: a request past the in-flight limit costs no Redis
    // call, not even the sold-out check below (issue 43 #7).
    let _permit = app.in_flight.try_acquire().map_err(|_| ApiError::Shed)?;
    // The flag this request goes by: the SKU's in a sale of several, the
    // sale's otherwise (its only SKU's).
    let sale_flag = app.sales.flag(&cfg.id);
    let position = sale.script_position(sku.position);
    let flag = match position {
        Some(p) => app.sales.sku_flag(&cfg.id, p),
        None => sale_flag.clone(),
    };
    if flag.is_set() {
        let sold_out = flag.is_fresh(Instant::now(), app.sales.epoch) || {
            // Stale flag: one request at a time (and so about one a second)
            // asks Redis whether units came back; the others go by the flag.
            if let Some(_check) = flag.begin_check() {
                let state = app.engine.stock_state(&sale, position).await;
                let now = Instant::now();
                match state? {
                    StockState::Empty => {
                        flag.set(true, now, app.sales.epoch);
                        true
                    }
                    StockState::Selling => {
                        if flag.set(false, now, app.sales.epoch) {
                            metrics::counter!("flashsale_sold_out_flips_total", "to" => "selling")
                                .increment(1);
                        }
                        false
                    }
                    // Not sold out, not selling: unknown until the rebuild.
                    StockState::Lost => return Err(ApiError::sale_unavailable()),
                }
            } else {
                true
            }
        };
        // Sold out, but a key already used gets its first answer (a replay)
        // or 422 (another qty) from the engine: one GET of its record.
        if sold_out && !app.engine.key_recorded(&sale, &claims.sub, key).await? {
            return Err(sold_out_answer(app, &sale, &sale_flag, position).await);
        }
    }
    match app
        .engine
        .reserve(&sale, sku.position, &claims.sub, qty, key)
        .await?
    {
        Outcome::Held(hold) => {
            // REDIS_ACK=wait: a new hold's 202 only once a replica has the
            // hold; a replay's once a replica has the key's record, which
            // is what the replay repeats (its hold may be released since).
            // Else 503, and the retry replays this same answer.
            let shard = sale.shards.get(hold.shard).ok_or_else(|| {
                ApiError::Internal(anyhow::anyhow!("hold on unknown shard {}", hold.shard))
            })?;
            if hold.replay {
                app.engine
                    .acknowledge_replay(&sale, &claims.sub, key, &hold.reservation_id)
                    .await?;
            } else {
                app.engine
                    .acknowledge(shard, &hold.reservation_id, FactKind::Held)
                    .await?;
            }
            for f in [&flag, &sale_flag] {
                if f.is_set() {
                    f.set(false, Instant::now(), app.sales.epoch);
                }
            }
            Ok((
                json!({
                    "reservation_id": hold.reservation_id,
                    "sale": hold.sale,
                    "sku": sku.id,
                    "qty": hold.qty,
                    "status": "held",
                    "expires_at": rfc3339_ms(hold.expires_ms),
                }),
                hold.replay,
            ))
        }
        Outcome::Limit { used } => Err(ApiError::conflict(
            "per_user_limit",
            format!(
                "this account already has {used} of its {} units",
                cfg.per_user_limit
            ),
        )),
        Outcome::SkuLimit { used } => Err(ApiError::conflict(
            "sku_per_user_limit",
            format!(
                "this account already has {used} of its {} units of {}",
                sku.per_user_limit.unwrap_or(cfg.per_user_limit),
                sku.id
            ),
        )),
        Outcome::Revoked => Err(ApiError::Revoked),
        Outcome::SoldOut => {
            if flag.set(true, Instant::now(), app.sales.epoch) {
                metrics::counter!("flashsale_sold_out_flips_total", "to" => "sold_out")
                    .increment(1);
            }
            Err(sold_out_answer(app, &sale, &sale_flag, position).await)
        }
        Outcome::Uninitialized => Err(ApiError::sale_unavailable()),
        Outcome::KeyReused { first_qty } => Err(ApiError::unprocessable(
            "idempotency_key_reused",
            format!(
                "this Idempotency-Key was used for a request of qty {first_qty}; one key is one request"
            ),
        )),
        Outcome::Gone { reservation_id } => Err(ApiError::Gone {
            code: "reservation_released",
            message: format!(
                "this Idempotency-Key's reservation {reservation_id} is no longer held"
            ),
        }),
    }
}

/// The 410 for a SKU with no unit left: `sold_out` when the whole sale is
/// (a one-SKU sale always), else `sku_sold_out`. Whether every SKU is empty
/// is asked of Redis by one request at a time (the sale flag's single
/// flight) and remembered in the sale's flag for a second; the others, and
/// any error of that check, answer `sku_sold_out`, which is true either way.
async fn sold_out_answer(
    app: &AppState,
    sale: &Sale,
    sale_flag: &crate::sales::sale::SoldOutFlag,
    position: Option<i32>,
) -> ApiError {
    let Some(p) = position else {
        return ApiError::SoldOut;
    };
    let whole = sale_flag.is_fresh(Instant::now(), app.sales.epoch)
        || match sale_flag.begin_check() {
            Some(_check) => {
                let empty = matches!(
                    app.engine.stock_state(sale, None).await,
                    Ok(StockState::Empty)
                );
                sale_flag.set(empty, Instant::now(), app.sales.epoch);
                empty
            }
            None => false,
        };
    if whole {
        ApiError::SoldOut
    } else {
        let id = usize::try_from(p)
            .ok()
            .and_then(|p| sale.config.skus.get(p))
            .map_or("", |s| s.id.as_str());
        ApiError::Gone {
            code: "sku_sold_out",
            message: format!("{id} is sold out; the sale's other SKUs may not be"),
        }
    }
}

/// A reservation as Postgres records it.
#[derive(sqlx::FromRow)]
pub(crate) struct Row {
    pub account: String,
    pub qty: i32,
    pub status: String,
    pub expires_at: DateTime<Utc>,
    /// The shard the hold was granted on.
    pub shard: i32,
}

/// What is known of reservation `id`, for its owner only.
pub(crate) struct Found {
    pub sale: std::sync::Arc<Sale>,
    /// The account's home shard (from the id).
    pub home: usize,
    /// The live hold in Redis: (shard, record).
    pub live: Option<(usize, HoldRecord)>,
    /// The row in Postgres (once settled).
    pub row: Option<Row>,
}

/// Looks the reservation up in Redis and Postgres and checks that the
/// caller's token is its account's (403 otherwise; 404 when unknown).
pub(crate) async fn find_owned(
    app: &AppState,
    id: &str,
    headers: &HeaderMap,
) -> Result<Found, ApiError> {
    let not_found = || ApiError::not_found("reservation_not_found", "no such reservation");
    let rid = ReservationId::parse(id).ok_or_else(not_found)?;
    // The token first (it names the sale): no config load for a request
    // without one (issue 43 #8).
    let account =
        auth::account_for_reservation(&app.admission_keys, &app.user_keys, headers, rid.sale)?;
    let sale = app.sales.get(rid.sale).await?.ok_or_else(not_found)?;
    let live = app.engine.find_hold(&sale, id, rid.home).await?;
    let row: Option<Row> = sqlx::query_as(
        "SELECT account, qty, status, expires_at, shard FROM reservations WHERE id = $1 AND sale_id = $2",
    )
    .bind(id)
    .bind(rid.sale)
    .fetch_optional(&app.pool)
    .await?;
    let owner = live
        .as_ref()
        .map(|(_, r)| r.account.as_str())
        .or(row.as_ref().map(|r| r.account.as_str()))
        .ok_or_else(not_found)?;
    if owner != account {
        return Err(ApiError::Forbidden(
            "this reservation belongs to another account",
        ));
    }
    Ok(Found {
        sale,
        home: rid.home,
        live,
        row,
    })
}

impl Found {
    /// 503 `sale_unavailable` when the hold is not found in Redis because
    /// its shard (or its home shard, which says where a spilled hold is)
    /// lost its keys: until the rebuild restores it from Postgres, "not
    /// held" would be a verdict about a hold that may well be live.
    pub(crate) async fn unless_shard_lost(&self, app: &AppState) -> Result<(), ApiError> {
        let mut shards = vec![self.home];
        shards.extend(self.row.as_ref().map(|r| r.shard as usize));
        if app.engine.any_lost(&self.sale, &shards).await? {
            return Err(ApiError::sale_unavailable());
        }
        Ok(())
    }
}

/// A reservation, for its account only.
#[utoipa::path(
    get,
    path = "/api/reservations/{id}",
    tag = "reservations",
    params(("id" = String, Path, description = "The reservation id")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The reservation (Postgres's once settled)", body = crate::http::api::Reservation),
        (status = 401, description = "`token_*`", body = crate::http::api::ErrorBody),
        (status = 403, description = "`forbidden` (another account's), `token_wrong_sale`", body = crate::http::api::ErrorBody),
        (status = 404, description = "`reservation_not_found`", body = crate::http::api::ErrorBody),
        (status = 503, description = "`redis_unavailable`, `database_unavailable`", body = crate::http::api::ErrorBody, headers(("Retry-After" = u32, description = "seconds"))),
    )
)]
pub async fn show(
    State(app): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let f = find_owned(&app, &id, &headers).await?;
    // Postgres is the truth once it has the row; before that the hold is
    // only in Redis ("held").
    let (qty, status, expires_at) = match (&f.row, &f.live) {
        (Some(r), _) => (
            i64::from(r.qty),
            r.status.clone(),
            r.expires_at.to_rfc3339(),
        ),
        (None, Some((_, h))) => (h.qty, h.status.clone(), rfc3339_ms(h.expires_ms)),
        (None, None) => unreachable!("find_owned returns 404 when neither exists"),
    };
    Ok(Json(json!({
        "reservation_id": id,
        "sale": f.sale.config.id,
        "qty": qty,
        "status": status,
        "expires_at": expires_at,
    })))
}

/// Cancels a held reservation (its units are back on sale at once).
#[utoipa::path(
    delete,
    path = "/api/reservations/{id}",
    tag = "reservations",
    params(("id" = String, Path, description = "The reservation id")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Cancelled", body = crate::http::api::Cancelled),
        (status = 409, description = "`reservation_not_held`", body = crate::http::api::ErrorBody),
        (status = 401, description = "`token_*`", body = crate::http::api::ErrorBody),
        (status = 403, description = "`forbidden` (another account's), `token_wrong_sale`", body = crate::http::api::ErrorBody),
        (status = 404, description = "`reservation_not_found`", body = crate::http::api::ErrorBody),
        (status = 503, description = "`redis_unavailable`, `database_unavailable`, `sale_unavailable` (the hold's shard lost its keys and is being restored: nothing is known about the hold until then), `not_replicated` (`REDIS_ACK=wait`: the cancel is not yet on a replica)", body = crate::http::api::ErrorBody, headers(("Retry-After" = u32, description = "seconds"))),
    )
)]
pub async fn cancel(
    State(app): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let f = find_owned(&app, &id, &headers).await?;
    let not_held = |status: &str| {
        ApiError::conflict(
            "reservation_not_held",
            format!("the reservation is {status}; only a held reservation can be cancelled"),
        )
    };
    let Some((shard, _)) = f.live else {
        f.unless_shard_lost(&app).await?;
        let status = f.row.map(|r| r.status).unwrap_or_else(|| "gone".into());
        return Err(not_held(&status));
    };
    let sale = &f.sale;
    match app
        .engine
        .release(&sale.shards[shard], shard, &id, "cancelled")
        .await?
    {
        Released::Now { qty } => {
            // REDIS_ACK=wait: "cancelled" only once a replica has it.
            app.engine
                .acknowledge(&sale.shards[shard], &id, FactKind::Gone)
                .await?;
            // Units are back: this process may sell again at once.
            app.sales.units_back(&sale.config.id, Instant::now());
            Ok(Json(
                json!({"reservation_id": id, "sale": sale.config.id, "qty": qty, "status": "cancelled"}),
            ))
        }
        Released::Paid => Err(not_held("paid")),
        Released::NotHeld => {
            f.unless_shard_lost(&app).await?;
            Err(not_held("no longer held"))
        }
    }
}
