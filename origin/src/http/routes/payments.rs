//! Purchase, the payment provider's webhook, and the dev provider's
//! "complete this payment" endpoint (dev mode only).

use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, FailedToBufferBody};
use axum::extract::{FromRequest, Path, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use secrecy::ExposeSecret;
use serde_json::{Value, json};

use crate::http::error::ApiError;
use crate::http::routes::reservations::find_owned;
use crate::ops::state::AppState;
use crate::payments::provider::{DevProvider, PaymentProvider};
use crate::payments::saga::{Applied, ApplyError, apply_event};
use crate::payments::webhook::{Event, post_webhook, verify_webhook};

#[derive(sqlx::FromRow)]
struct Payment {
    id: String,
    amount_cents: i64,
    status: String,
}

fn payment_body(p: &Payment, provider: &dyn PaymentProvider) -> Value {
    json!({
        "payment_id": p.id,
        "amount_cents": p.amount_cents,
        "status": p.status,
        "provider": provider.name(),
        "checkout_url": provider.checkout_url(&p.id),
    })
}

/// Starts the payment of a settled reservation (a repeat answers the same
/// payment).
#[utoipa::path(
    post,
    path = "/api/reservations/{id}/purchase",
    tag = "reservations",
    params(
        ("id" = String, Path, description = "The reservation id"),
        ("Idempotency-Key" = Option<String>, Header, description = "optional; 1-200 visible ASCII characters", pattern = "^[!-~]{1,200}$"),
    ),
    security(("bearer" = [])),
    responses(
        (status = 201, description = "Payment started", body = crate::http::api::Payment),
        (status = 200, description = "The payment already under way (a repeat)", body = crate::http::api::Payment),
        (status = 400, description = "`idempotency_key_invalid`", body = crate::http::api::ErrorBody),
        (status = 409, description = "`reservation_not_payable`", body = crate::http::api::ErrorBody),
        (status = 410, description = "`reservation_expired`", body = crate::http::api::ErrorBody),
        (status = 422, description = "`idempotency_key_reused`", body = crate::http::api::ErrorBody),
        (status = 401, description = "`token_*`", body = crate::http::api::ErrorBody),
        (status = 403, description = "`forbidden` (another account's), `token_wrong_sale`", body = crate::http::api::ErrorBody),
        (status = 404, description = "`reservation_not_found`", body = crate::http::api::ErrorBody),
        (status = 503, description = "`reservation_settling`, `redis_unavailable`, `database_unavailable`, `sale_unavailable` (the hold's shard lost its keys and is being restored)", body = crate::http::api::ErrorBody, headers(("Retry-After" = u32, description = "seconds"))),
    )
)]
pub async fn purchase(
    State(app): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let mut f = find_owned(&app, &id, &headers).await?;
    let key = headers
        .get("idempotency-key")
        .map(|v| {
            v.to_str()
                .ok()
                .filter(|k| (1..=200).contains(&k.len()) && k.bytes().all(|b| b.is_ascii_graphic()))
                .map(str::to_string)
                .ok_or_else(|| {
                    ApiError::bad_request(
                        "idempotency_key_invalid",
                        "Idempotency-Key must be 1-200 visible ASCII characters",
                    )
                })
        })
        .transpose()?;
    // A hold that is not yet in Postgres settles within milliseconds.
    for _ in 0..40 {
        if f.row.is_some() || f.live.is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        f = find_owned(&app, &id, &headers).await?;
    }
    let row = f.row.as_ref().ok_or_else(|| ApiError::Unavailable {
        code: "reservation_settling",
        message: "the reservation is being recorded; retry shortly".into(),
        retry_after: 1,
    })?;
    let provider = DevProvider;
    let mut tx = app.pool.begin().await?;
    // The row lock makes concurrent purchases of one reservation take turns,
    // so a key's first use on this reservation is decided once.
    let (status, expires_at, qty, sku): (String, DateTime<Utc>, i32, i32) = sqlx::query_as(
        "SELECT status, expires_at, qty, sku FROM reservations WHERE id = $1 FOR UPDATE",
    )
    .bind(&id)
    .fetch_one(&mut *tx)
    .await?;
    if let Some(k) = &key
        && let Some(answer) = key_replay(&mut tx, &row.account, k, &id, &provider).await?
    {
        return Ok(answer);
    }
    if !matches!(status.as_str(), "settled" | "pending_payment" | "paid") {
        return Err(ApiError::conflict(
            "reservation_not_payable",
            format!("the reservation is {status}"),
        ));
    }
    // A purchase already under way (or done) is the answer to a repeat; a
    // capture recorded for refund sold nothing and is not one (the
    // predicate of payments_one_open_per_reservation).
    let open: Option<Payment> = sqlx::query_as(
        "SELECT id, amount_cents, status FROM payments WHERE reservation_id = $1
           AND (status = 'pending' OR (status = 'succeeded' AND NOT refund_required))",
    )
    .bind(&id)
    .fetch_optional(&mut *tx)
    .await?;
    if let Some(p) = open {
        return Ok((StatusCode::OK, Json(payment_body(&p, &provider))).into_response());
    }
    if expires_at > Utc::now() && f.live.is_none() {
        f.unless_shard_lost(&app).await?;
    }
    if expires_at <= Utc::now() || f.live.is_none() {
        return Err(ApiError::Gone {
            code: "reservation_expired",
            message: "the hold has expired; the unit is back on sale".into(),
        });
    }
    // The held SKU's price (issue 45): skus are listed by position.
    let price_cents = f
        .sale
        .config
        .skus
        .iter()
        .find(|s| s.position == sku)
        .map(|s| s.price_cents)
        .ok_or_else(|| {
            ApiError::Internal(anyhow::anyhow!(
                "reservation {id} holds SKU {sku}, which sale {} does not list",
                f.sale.config.id
            ))
        })?;
    let payment = Payment {
        id: format!("pay_{}", uuid::Uuid::now_v7().simple()),
        // Bounded by the sale's checks (price and limit); checked all the same.
        amount_cents: i64::from(qty)
            .checked_mul(price_cents)
            .ok_or_else(|| ApiError::Internal(anyhow::anyhow!("price × qty overflows")))?,
        status: "pending".into(),
    };
    let inserted = sqlx::query(
        "INSERT INTO payments (id, reservation_id, sale_id, account, amount_cents, status, idempotency_key)
         VALUES ($1, $2, $3, $4, $5, 'pending', $6)",
    )
    .bind(&payment.id)
    .bind(&id)
    .bind(&f.sale.config.id)
    .bind(&row.account)
    .bind(payment.amount_cents)
    .bind(&key)
    .execute(&mut *tx)
    .await;
    match (inserted, &key) {
        (Err(e), Some(k)) if is_unique_violation(&e, "payments_idempotency") => {
            // A concurrent purchase of another reservation used this key
            // first (the unique index made this insert wait for its commit):
            // its record is the answer.
            tx.rollback().await?;
            let mut conn = app.pool.acquire().await?;
            return match key_replay(&mut conn, &row.account, k, &id, &provider).await? {
                Some(answer) => Ok(answer),
                None => Err(e.into()),
            };
        }
        (inserted, _) => {
            inserted?;
        }
    }
    sqlx::query("UPDATE reservations SET status = 'pending_payment' WHERE id = $1 AND status IN ('settled', 'pending_payment')")
        .bind(&id)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok((StatusCode::CREATED, Json(payment_body(&payment, &provider))).into_response())
}

/// The answer to a purchase whose Idempotency-Key was used before: the same
/// reservation gets its first payment back (200); another reservation gets
/// `422 idempotency_key_reused` (one key is one request). `None`: first use.
async fn key_replay(
    tx: &mut sqlx::PgConnection,
    account: &str,
    key: &str,
    reservation: &str,
    provider: &dyn PaymentProvider,
) -> Result<Option<Response>, ApiError> {
    let existing: Option<(String, Payment)> = sqlx::query_as::<_, (String, String, i64, String)>(
        "SELECT reservation_id, id, amount_cents, status FROM payments
         WHERE account = $1 AND idempotency_key = $2",
    )
    .bind(account)
    .bind(key)
    .fetch_optional(&mut *tx)
    .await?
    .map(|(r, id, amount_cents, status)| {
        (
            r,
            Payment {
                id,
                amount_cents,
                status,
            },
        )
    });
    match existing {
        None => Ok(None),
        Some((r, p)) if r == reservation => Ok(Some(
            (StatusCode::OK, Json(payment_body(&p, provider))).into_response(),
        )),
        Some(_) => Err(ApiError::unprocessable(
            "idempotency_key_reused",
            "this Idempotency-Key was used for another reservation",
        )),
    }
}

fn is_unique_violation(e: &sqlx::Error, constraint: &str) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.is_unique_violation() && d.constraint() == Some(constraint))
}

fn secrets(app: &AppState) -> Vec<String> {
    app.settings
        .payment_webhook_secrets
        .iter()
        .map(|s| s.expose_secret().to_string())
        .collect()
}

/// The largest webhook body read (64 KiB): a provider event is a few hundred
/// bytes, and every byte accepted is hashed once per secret.
pub const WEBHOOK_BODY_LIMIT: usize = 64 * 1024;

/// The payment provider's event (signed; applied once per event id).
#[utoipa::path(
    post,
    path = "/webhooks/payments",
    tag = "payments",
    request_body(content = Event, content_type = "application/json"),
    security(("payment_signature" = [])),
    responses(
        (status = 200, description = "Received (a duplicate changes nothing)", body = crate::http::api::WebhookAnswer),
        (status = 400, description = "`malformed_event`, `malformed_body`", body = crate::http::api::ErrorBody),
        (status = 401, description = "`signature_missing`, `signature_malformed`, `signature_stale`, `signature_mismatch`", body = crate::http::api::ErrorBody),
        (status = 413, description = "`body_too_large` (over 64 KiB)", body = crate::http::api::ErrorBody),
        (status = 422, description = "`unknown_event_type`, `unknown_payment`, `amount_mismatch`", body = crate::http::api::ErrorBody),
        (status = 503, description = "`webhook_not_configured`, `redis_unavailable`, `database_unavailable`, `sale_unavailable` (the hold's shard lost its keys and is being restored; nothing was recorded, the provider retries), `not_replicated` (`REDIS_ACK=wait`: the confirm is not yet on a replica; nothing was recorded, the provider retries)", body = crate::http::api::ErrorBody, headers(("Retry-After" = u32, description = "seconds"))),
    )
)]
pub async fn webhook(
    State(app): State<AppState>,
    request: Request,
) -> Result<Json<Value>, ApiError> {
    let too_large = ApiError::BodyTooLarge {
        limit: WEBHOOK_BODY_LIMIT,
    };
    // A declared length over the limit is refused before a byte of the body
    // is read; an undeclared (chunked) one stops at the limit.
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > WEBHOOK_BODY_LIMIT as u64) {
        return Err(too_large);
    }
    let headers = request.headers().clone();
    let body = Bytes::from_request(request, &())
        .await
        .map_err(|e| match e {
            BytesRejection::FailedToBufferBody(FailedToBufferBody::LengthLimitError(_)) => {
                too_large
            }
            other => ApiError::bad_request("malformed_body", other.body_text()),
        })?;
    let secrets = secrets(&app);
    if secrets.is_empty() {
        return Err(ApiError::unavailable(
            "webhook_not_configured",
            "PAYMENT_WEBHOOK_SECRET is not set",
        ));
    }
    let header = headers
        .get("payment-signature")
        .and_then(|v| v.to_str().ok());
    verify_webhook(&secrets, header, &body, crate::ops::clock::now_secs()).map_err(|e| {
        ApiError::Unauthorized {
            code: e.code(),
            message: e.to_string(),
        }
    })?;
    let event = crate::http::bodies::payment_event(&body)?;
    let sales = app.sales.clone();
    let applied = apply_event(
        &app.pool,
        &app.engine,
        async move |id: &str| sales.get(id).await,
        &event,
    )
    .await
    .map_err(|e| match e {
        ApplyError::UnknownType(_) => ApiError::unprocessable("unknown_event_type", e.to_string()),
        ApplyError::UnknownPayment(_) => ApiError::unprocessable("unknown_payment", e.to_string()),
        ApplyError::AmountMismatch { .. } => {
            ApiError::unprocessable("amount_mismatch", e.to_string())
        }
        ApplyError::Db(d) => d.into(),
        ApplyError::Redis(r) => r.into(),
        ApplyError::NotReplicated(a) => a.into(),
        ApplyError::ShardLost => ApiError::sale_unavailable(),
    })?;
    if applied == Applied::Paid || applied == Applied::RefundRequired {
        app.summaries.invalidate_all();
    }
    if applied == Applied::Paid
        && let Err(e) = pass_on_when_done(&app, &event.data.payment_id).await
    {
        // The purchase stands; the turn then ends with its window.
        tracing::warn!(payment = %event.data.payment_id, error = %e,
            "cannot end the admission of a buyer who is done");
    }
    Ok(Json(json!({"received": true, "result": applied})))
}

/// Dev provider: completes a payment by posting a signed webhook to this
/// origin over HTTP, as a real provider would. Exists only in dev mode.
/// Dev mode only (`ORIGIN_DEV_MODE=1`; else 404): the dev provider
/// completes a payment by posting a signed webhook to this origin.
#[utoipa::path(
    post,
    path = "/api/dev/payments/{id}/complete",
    tag = "payments",
    params(("id" = String, Path, description = "The payment id")),
    request_body(content = Option<crate::http::bodies::DevComplete>, content_type = "application/json", description = "optional: no body is `succeeded`"),
    responses(
        (status = 200, description = "What the webhook answered", body = crate::http::api::DevCompleteAnswer),
        (status = 400, description = "`malformed_json`", body = crate::http::api::ErrorBody),
        (status = 404, description = "`not_found` (not dev mode), `payment_not_found`", body = crate::http::api::ErrorBody),
        (status = 422, description = "`invalid_body`, `invalid_outcome`", body = crate::http::api::ErrorBody),
        (status = 503, description = "`webhook_not_configured`, `database_unavailable`", body = crate::http::api::ErrorBody, headers(("Retry-After" = u32, description = "seconds"))),
    )
)]
pub async fn dev_complete(
    State(app): State<AppState>,
    Path(payment_id): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    if !app.settings.dev_mode {
        return Err(ApiError::not_found("not_found", "no such endpoint"));
    }
    let outcome = crate::http::bodies::dev_outcome(&body)?;
    let amount: i64 = sqlx::query_scalar("SELECT amount_cents FROM payments WHERE id = $1")
        .bind(&payment_id)
        .fetch_optional(&app.pool)
        .await?
        .ok_or_else(|| ApiError::not_found("payment_not_found", "no such payment"))?;
    let secret = secrets(&app).into_iter().next().ok_or_else(|| {
        ApiError::unavailable(
            "webhook_not_configured",
            "PAYMENT_WEBHOOK_SECRET is not set",
        )
    })?;
    let event = json!({
        "id": format!("evt_dev_{}", uuid::Uuid::new_v4().simple()),
        "type": format!("payment.{}", outcome.as_str()),
        "data": {"payment_id": payment_id, "amount_cents": amount},
    });
    let origin = format!("http://127.0.0.1:{}", app.port());
    let res = post_webhook(&reqwest::Client::new(), &origin, &secret, &event)
        .await
        .map_err(|e| ApiError::Internal(e.into()))?;
    let status = res.status().as_u16();
    let answer: Value = res.json().await.unwrap_or(Value::Null);
    Ok(Json(
        json!({"webhook_status": status, "webhook_answer": answer}),
    ))
}

/// After a paid purchase: an account that has bought all its sale lets
/// (its per-user limit) can buy nothing more, so its admission ends
/// (`sales::revoke`: no new hold, the turn passed on at the edge) instead
/// of its turn counting again once its paid hold's time is over (issue
/// 47, "the shop's hand at the end of checkout"). An account that may buy
/// more keeps its turn.
async fn pass_on_when_done(app: &AppState, payment: &str) -> anyhow::Result<()> {
    let row: Option<(String, String, i64, i32)> = sqlx::query_as(
        "SELECT p.sale_id, p.account,
                (SELECT coalesce(sum(r.qty), 0) FROM reservations r
                  WHERE r.sale_id = p.sale_id AND r.account = p.account AND r.status = 'paid'),
                s.per_user_limit
           FROM payments p JOIN sales s ON s.id = p.sale_id WHERE p.id = $1",
    )
    .bind(payment)
    .fetch_optional(&app.pool)
    .await?;
    let Some((sale_id, account, bought, limit)) = row else {
        return Ok(());
    };
    if bought < i64::from(limit) {
        return Ok(());
    }
    let Some(sale) = app.sales.get(&sale_id).await? else {
        return Ok(());
    };
    let mut tx = app.pool.begin().await?;
    crate::sales::revoke::record(&mut tx, &sale_id, &account).await?;
    tx.commit().await?;
    crate::sales::revoke::mark(&app.engine.conn, &sale, &account).await?;
    metrics::counter!("flashsale_admissions_ended_after_purchase_total").increment(1);
    // Recorded and marked before the provider is answered; the edge is
    // told off that path (it may take its timeout).
    let settings = app.settings.admin.clone();
    tokio::spawn(async move {
        let edge = settings
            .edge_url
            .as_deref()
            .zip(settings.edge_secret.as_ref());
        let told = crate::sales::revoke::tell_edge(edge, &sale_id, &account).await;
        tracing::info!(sale = %sale_id, ?told, "a buyer at its limit: admission ended, turn passed on");
    });
    Ok(())
}
