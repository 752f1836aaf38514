//! Reservations and everything else forwarded to the origin (Wasm only).
//!
//! Invariants kept here:
//! - a reservation reaches the origin only with a valid `admit` token of
//!   its sale (minted only for admitted people, `worker::waiting`), within
//!   the account's limit (10 per 10 s, `guard::limit::Limiter`), and only
//!   while the edge does not know the sale is sold out — except the replay
//!   of a key this edge passed a `202` for (`http::sold_out`);
//! - an origin `410 sold_out` flags the sale and tells the queue, so every
//!   waiting person hears it at once; a `410 sku_sold_out` flags that SKU
//!   only (its next reservations are answered here for 3 s, the others go
//!   on); a `202` tells the person's shard the
//!   turn is used until the hold's `expires_at` (a hold that may still
//!   exist never loses its turn), and a cancel answered `2xx` tells it
//!   that hold ended (`api::reservation` reads both answers);
//! - every forwarded request carries a sane `x-request-id` and logs one
//!   access line; the origin's answer is passed on untouched.

use std::cell::RefCell;

use token::{Expect, TokenError, TokenType};
use worker::{Env, Fetch, Headers, Method, Request, RequestInit, Response, console_log, js_sys};

use crate::api::error::{ApiError, ApiResult};
use crate::api::trace;
use crate::api::{reservation, routes};
use crate::guard::limit::Limiter;
use crate::http::keys::{bearer_of, ring};
use crate::http::origin::{origin_url, send_with_timeout};
use crate::http::respond::{body_limited, error_response, internal, now_ms};
use crate::http::sold_out::{
    held_key_known, remember_held_key, set_sku_sold_out, set_sold_out, sku_sold_out_known,
    sold_out_known,
};
use crate::worker::calls::{tell_held, tell_released, tell_revoked, tell_sold_out};
use crate::worker::sale::parse_time;

const ORIGIN_TIMEOUT_MS: u32 = 5_000;

thread_local! {
    /// Reservations one account may send to the origin: 10 per 10 s.
    static RESERVE_LIMIT: RefCell<Limiter> = RefCell::new(Limiter::new(10, 10_000, 100_000));
}

/// Forwards to the origin with a request id (see [`trace::request_id`]),
/// echoes it to the caller and logs one access line (`wrangler dev` and
/// Workers logs show it).
pub(crate) async fn forward(
    env: &Env,
    mut req: Request,
    method: Method,
    path: &str,
) -> ApiResult<Response> {
    let body = if method == Method::Post {
        Some(body_limited(&mut req, crate::api::bodies::MAX_FORWARDED_BODY_LEN).await?)
    } else {
        None
    };
    forward_bytes(env, &req, method, path, body).await
}

/// [`forward`] of a request whose body was read already (`body`: sent as
/// the POST body).
async fn forward_bytes(
    env: &Env,
    req: &Request,
    method: Method,
    path: &str,
    body: Option<Vec<u8>>,
) -> ApiResult<Response> {
    let started = now_ms();
    let header = |name: &str| req.headers().get(name).ok().flatten();
    let rid = trace::request_id(
        header("x-request-id").as_deref(),
        header("cf-ray").as_deref(),
        token::random_jti,
    );
    let log = |status: u16| {
        console_log!(
            "{}",
            trace::access_line(
                method.as_ref(),
                path,
                status,
                now_ms().saturating_sub(started),
                &rid
            )
        );
    };
    let headers = Headers::new();
    for name in ["authorization", "idempotency-key", "content-type", "accept"] {
        if let Ok(Some(v)) = req.headers().get(name) {
            headers.set(name, &v).map_err(internal)?;
        }
    }
    headers.set("x-request-id", &rid).map_err(internal)?;
    let mut init = RequestInit::new();
    init.with_method(method.clone()).with_headers(headers);
    if let Some(body) = body {
        let arr = js_sys::Uint8Array::from(body.as_slice());
        init.with_body(Some(arr.into()));
    }
    let url = format!("{}{}", origin_url(env), path);
    let out = Request::new_with_init(&url, &init).map_err(internal)?;
    let Ok(mut resp) = send_with_timeout(Fetch::Request(out), ORIGIN_TIMEOUT_MS).await else {
        let e = ApiError::origin_unavailable();
        log(e.status);
        return Err(e);
    };
    let status = resp.status_code();
    log(status);
    let command = resp
        .headers()
        .get(reservation::COMMAND_HEADER)
        .ok()
        .flatten();
    let body = resp.bytes().await.unwrap_or_default();
    let h = Headers::new();
    // Kept for the caller, which obeys it and takes it off (`obey`).
    if let Some(c) = command {
        h.set(reservation::COMMAND_HEADER, &c).map_err(internal)?;
    }
    for name in [
        "content-type",
        "location",
        "retry-after",
        "idempotent-replayed",
    ] {
        if let Ok(Some(v)) = resp.headers().get(name) {
            h.set(name, &v).map_err(internal)?;
        }
    }
    h.set("cache-control", "no-store").map_err(internal)?;
    h.set("x-request-id", &rid).map_err(internal)?;
    Ok(Response::from_bytes(body)
        .map_err(internal)?
        .with_status(status)
        .with_headers(h))
}

/// `POST /api/sales/{sale}/reservations`: checked here, then forwarded.
pub(crate) async fn reserve(env: &Env, mut req: Request, sale: &str) -> ApiResult<Response> {
    let token = bearer_of(&req)?;
    let admits = ring(env, "ADMISSION_TOKEN_KEYS")?;
    let claims = admits
        .verify(
            &token,
            Expect {
                typ: TokenType::Admit,
                sale: Some(sale),
            },
            now_ms() / 1000,
        )
        .map_err(ApiError::token)?;
    let idem = req.headers().get("idempotency-key").ok().flatten();
    let held = routes::held_key_name(sale, &claims.sub, idem.as_deref());
    if sold_out_known(env, sale).await {
        let replay = match &held {
            Some(name) => held_key_known(name).await,
            None => false,
        };
        if !replay {
            let mut r = error_response(&ApiError::sold_out()).map_err(internal)?;
            let _ = r.headers_mut().set("x-edge-sold-out", "1");
            return Ok(r);
        }
    }
    // The SKU the body names (read once, forwarded as read): one the edge
    // knows is sold out is answered here, except a held key's replay.
    let body = body_limited(&mut req, crate::api::bodies::MAX_FORWARDED_BODY_LEN).await?;
    let sku = reservation::named_sku(&body);
    if let Some(id) = &sku
        && sku_sold_out_known(sale, id).await
    {
        let replay = match &held {
            Some(name) => held_key_known(name).await,
            None => false,
        };
        if !replay {
            let mut r = error_response(&ApiError::sku_sold_out(id)).map_err(internal)?;
            let _ = r.headers_mut().set("x-edge-sold-out", "1");
            return Ok(r);
        }
    }
    let key = format!("{sale}/{}", claims.sub);
    if let Err(wait_ms) = RESERVE_LIMIT.with(|l| l.borrow_mut().check(&key, now_ms())) {
        let secs = u32::try_from(wait_ms.div_ceil(1000)).unwrap_or(u32::MAX);
        return Err(ApiError::new(
            429,
            "too_many_requests",
            "too many reservation attempts from this account; retry later",
        )
        .retry_after(secs));
    }
    let mut resp = forward_bytes(
        env,
        &req,
        Method::Post,
        &format!("/api/sales/{sale}/reservations"),
        Some(body),
    )
    .await?;
    obey(env, &mut resp, Some(sale), &claims.sub).await;
    if resp.status_code() == 202 {
        // A person whose hold may still exist keeps the turn (issue 13 #4),
        // until the hold's end (issue 44 #2: not forever).
        let granted = answer_copy(&mut resp)
            .await
            .and_then(|b| reservation::granted(&b, parse_time));
        tell_held(env, sale, &claims.sub, granted.as_ref()).await;
        if let Some(name) = &held {
            remember_held_key(name).await;
        }
    }
    if resp.status_code() == 410 {
        // Read from a copy of the answer, which is passed on untouched.
        let gone = answer_copy(&mut resp).await.unwrap_or_default();
        if crate::api::error::gone_means_sold_out(&gone) {
            set_sold_out(sale).await;
            // Tell the queue so every waiting person hears it at once.
            tell_sold_out(env, sale).await;
        } else if let Some(id) = &sku
            && crate::api::error::gone_means_sku_sold_out(&gone)
        {
            // That SKU only: the queue and admission go on.
            set_sku_sold_out(sale, id).await;
        }
    }
    Ok(resp)
}

/// The body of a copy of an answer (the answer itself is passed on
/// untouched).
async fn answer_copy(resp: &mut Response) -> Option<Vec<u8>> {
    resp.cloned().ok()?.bytes().await.ok()
}

/// Obeys (and takes off) an origin answer's command header: `revoke` ends
/// `sub`'s admission to the sale the answer names (or `sale`).
async fn obey(env: &Env, resp: &mut Response, sale: Option<&str>, sub: &str) {
    let command = resp
        .headers()
        .get(reservation::COMMAND_HEADER)
        .ok()
        .flatten();
    let _ = resp.headers_mut().delete(reservation::COMMAND_HEADER);
    if !reservation::says_revoke(command.as_deref()) {
        return;
    }
    let sale = match sale {
        Some(s) => Some(s.to_string()),
        None => answer_copy(resp)
            .await
            .and_then(|b| reservation::sale_of(&b)),
    };
    if let Some(sale) = sale {
        console_log!("revoke {sale}: the origin's answer asked");
        tell_revoked(env, &sale, sub).await;
    }
}

/// Reservation calls accept an `admit` or a `user` token; the origin checks
/// the reservation belongs to that account.
pub(crate) async fn forward_reservation(
    env: &Env,
    req: Request,
    method: Method,
    path: &str,
) -> ApiResult<Response> {
    let token = bearer_of(&req)?;
    let sub = account_of(env, &token)?;
    let cancel = method == Method::Delete;
    let mut resp = forward(env, req, method, path).await?;
    obey(env, &mut resp, None, &sub).await;
    if cancel && (200..300).contains(&resp.status_code()) {
        // That hold no longer protects the turn (issue 44 #2): the answer
        // names the sale, which neither the route nor a user token does.
        if let Some(c) = answer_copy(&mut resp)
            .await
            .and_then(|b| reservation::cancelled(&b))
        {
            tell_released(env, &sub, &c).await;
        }
    }
    Ok(resp)
}

/// The account of a valid `admit` or `user` token (every refusal its code).
fn account_of(env: &Env, token: &str) -> ApiResult<String> {
    let now = now_ms() / 1000;
    if !token::is_v1(token) {
        // A JWT can only be a shop's user token.
        return ring(env, "USER_TOKEN_KEYS")?
            .verify_user(token, now)
            .map(|c| c.sub)
            .map_err(ApiError::token);
    }
    let admit = ring(env, "ADMISSION_TOKEN_KEYS")?.verify(
        token,
        Expect {
            typ: TokenType::Admit,
            sale: None,
        },
        now,
    );
    match admit {
        Ok(c) => Ok(c.sub),
        Err(admit_err) => match ring(env, "USER_TOKEN_KEYS")?.verify_user(token, now) {
            Ok(c) => Ok(c.sub),
            Err(user_err) => {
                // Report the more telling of the two refusals.
                let e = match admit_err {
                    TokenError::UnknownKid | TokenError::WrongType => user_err,
                    other => other,
                };
                let e = if e == TokenError::UnknownKid && admit_err == TokenError::WrongType {
                    admit_err
                } else {
                    e
                };
                Err(ApiError::token(e))
            }
        },
    }
}
