//! The Worker's entry (Wasm only): the `fetch` event, the configuration
//! check, and the router that hands each route to its handler.
//!
//! Invariants kept here:
//! - misconfigured (key rings missing, malformed or sharing a secret, an
//!   unknown `ADMISSION_CONTROL`) the edge answers every request with a 500
//!   `config_error`; `DEV_MODE` is ignored unless `ORIGIN_URL` is a
//!   loopback address (`guard::config`);
//! - every answer is JSON with the documented error shape; no input panics.

use std::cell::RefCell;
use std::rc::Rc;

use serde_json::json;
use token::{Claims, KeyRing, TokenType};
use worker::{Context, Env, Headers, Method, Request, Response, Result, event};

use crate::api::error::{ApiError, ApiResult};
use crate::api::routes::{self, Route};
use crate::botcheck::turnstile;
use crate::guard::config;
use crate::http::keys::ring;
use crate::http::origin::{origin_summary, origin_url, recent_summary};
use crate::http::respond::{body_limited, error_response, internal, json_response, now_ms};
use crate::worker::reserve::{forward, forward_reservation, reserve};
use crate::worker::summary::summary;
use crate::worker::{audit, join, memory, pieces, snapshot, status};

thread_local! {
    /// The (user, admission) rings last found apart, so the check is one
    /// pointer comparison per request until a secret changes.
    static RINGS_APART: RefCell<Option<(Rc<KeyRing>, Rc<KeyRing>)>> = const { RefCell::new(None) };
}

/// The edge refuses to run misconfigured, like the origin refuses to start:
/// key rings that are missing, malformed or share a secret, or an unknown
/// `ADMISSION_CONTROL`, get a 500 `config_error` on every request (the
/// parses are cached per isolate, so this costs a pointer comparison once
/// the rings were found apart).
fn check_config(env: &Env) -> ApiResult<()> {
    let control = env.var("ADMISSION_CONTROL").ok().map(|v| v.to_string());
    crate::admission::control::Mode::from_setting(control.as_deref())
        .map_err(|m| ApiError::new(500, "config_error", m))?;
    let users = ring(env, "USER_TOKEN_KEYS")?;
    let admission = ring(env, "ADMISSION_TOKEN_KEYS")?;
    let known = RINGS_APART.with(|c| {
        c.borrow()
            .as_ref()
            .is_some_and(|(u, a)| Rc::ptr_eq(u, &users) && Rc::ptr_eq(a, &admission))
    });
    if !known {
        config::rings_apart(&users, &admission)
            .map_err(|m| ApiError::new(500, "config_error", m))?;
        RINGS_APART.with(|c| *c.borrow_mut() = Some((users, admission)));
    }
    Ok(())
}

fn health(env: &Env) -> ApiResult<Response> {
    let mut body =
        json!({"ok": true, "service": "edge", "time_ms": now_ms(), "dev_mode": dev_mode(env)});
    if let Some(why) = config::dev_mode_refusal(dev_mode_requested(env), &origin_url(env)) {
        body["dev_mode_refused"] = json!(why);
    }
    json_response(200, &body, "no-store").map_err(internal)
}

#[event(fetch)]
async fn fetch(req: Request, env: Env, ctx: Context) -> Result<Response> {
    if let Err(e) = check_config(&env) {
        return error_response(&e);
    }
    let method = req.method().to_string();
    let path = req.path();
    let out = match routes::route(&method, &path) {
        Route::Health => health(&env),
        Route::Ping => Response::ok("pong").map_err(internal),
        Route::Summary(sale) => summary(&env, &sale).await,
        Route::Join(sale) => join::join(&env, req, &sale).await,
        Route::Challenge(sale) => join::challenge(&env, &req, &sale, dev_mode(&env)).await,
        Route::Status(sale) => status::status(&env, &req, &sale).await,
        Route::Draw(sale) => audit::draw_audit(&env, &req, &sale).await,
        Route::Receipt(sale) => audit::receipt(&env, &req, &sale).await,
        Route::Metrics(sale) => audit::metrics(&env, &req, &sale).await,
        Route::Revoke(sale) => audit::revoke(&env, req, &sale).await,
        Route::Reserve(sale) => reserve(&env, req, &sale).await,
        Route::ReservationGet(id) => {
            forward_reservation(&env, req, Method::Get, &format!("/api/reservations/{id}")).await
        }
        Route::ReservationCancel(id) => {
            forward_reservation(
                &env,
                req,
                Method::Delete,
                &format!("/api/reservations/{id}"),
            )
            .await
        }
        Route::ReservationPurchase(id) => {
            forward_reservation(
                &env,
                req,
                Method::Post,
                &format!("/api/reservations/{id}/purchase"),
            )
            .await
        }
        Route::Page(sale) => page(&env, &sale).await,
        Route::DevToken if dev_mode(&env) => dev_token(&env, req).await,
        Route::DevPayment(id) if dev_mode(&env) => {
            forward(
                &env,
                req,
                Method::Post,
                &format!("/api/dev/payments/{id}/complete"),
            )
            .await
            .map(|mut r| {
                // No account here to obey it for: never shown either.
                let _ = r
                    .headers_mut()
                    .delete(crate::api::reservation::COMMAND_HEADER);
                r
            })
        }
        Route::DevBulk(sale) if dev_mode(&env) => join::bulk(&env, req, &sale).await,
        Route::DevForget if dev_mode(&env) => {
            crate::http::sold_out::forget_memory();
            crate::http::origin::forget_memory();
            memory::forget_memory();
            snapshot::forget_memory();
            pieces::forget_memory();
            status::forget_memory();
            json_response(200, &json!({"forgotten": true}), "no-store").map_err(internal)
        }
        Route::DevToken | Route::DevPayment(_) | Route::DevBulk(_) | Route::DevForget => {
            Err(ApiError::not_found())
        }
        Route::MethodNotAllowed => Err(ApiError::method_not_allowed()),
        Route::NotFound => Err(ApiError::not_found()),
    };
    // Seen reports this request (or an earlier one) batched are sent after
    // the answer, whatever request comes next to this isolate.
    if let Some(flush) = status::scheduled_flush(&env) {
        ctx.wait_until(flush);
    }
    match out {
        Ok(r) => Ok(r),
        Err(e) => error_response(&e),
    }
}

/// `DEV_MODE=1` (local runs only): the page may mint user tokens and
/// complete payments with the origin's dev provider. Honoured only with a
/// loopback `ORIGIN_URL` (see [`config::dev_mode_refusal`]): anywhere else
/// it would mint user tokens for anyone.
fn dev_mode(env: &Env) -> bool {
    dev_mode_requested(env) && config::dev_mode_refusal(true, &origin_url(env)).is_none()
}

fn dev_mode_requested(env: &Env) -> bool {
    env.var("DEV_MODE")
        .map(|v| v.to_string())
        .or_else(|_| env.secret("DEV_MODE").map(|v| v.to_string()))
        .is_ok_and(|v| v == "1" || v == "true")
}

/// The queue page (one HTML file for every sale; the script reads the sale
/// from the path). HTML is short-cached, its hashed assets long-cached.
async fn page(env: &Env, sale: &str) -> ApiResult<Response> {
    let assets = env.assets("ASSETS").map_err(internal)?;
    let mut r = assets
        .fetch("https://assets.local/sale", None)
        .await
        .map_err(internal)?;
    let status = r.status_code();
    let body = r.bytes().await.map_err(internal)?;
    let h = Headers::new();
    h.set("content-type", "text/html; charset=utf-8")
        .map_err(internal)?;
    h.set("cache-control", "public, max-age=30")
        .map_err(internal)?;
    // The security headers come from edge/public/_headers (one source, built
    // by edge/page/build.mjs), as for the page's assets.
    for name in [
        "content-security-policy",
        "referrer-policy",
        "x-content-type-options",
    ] {
        if let Ok(Some(v)) = r.headers().get(name) {
            let v = if name == "content-security-policy" && turnstile_sale(env, sale).await {
                turnstile::turnstile_csp(&v)
            } else {
                v
            };
            h.set(name, &v).map_err(internal)?;
        }
    }
    Ok(Response::from_bytes(body)
        .map_err(internal)?
        .with_status(status)
        .with_headers(h))
}

/// Whether `sale` asks for Turnstile (its page then loads Cloudflare's
/// widget, which the CSP must allow). An unknown or unreachable sale keeps
/// the strict CSP.
async fn turnstile_sale(env: &Env, sale: &str) -> bool {
    let v = match recent_summary(sale, 60_000) {
        Some(v) => v,
        None => match origin_summary(env, sale).await {
            Ok((v, _)) => v,
            Err(_) => return false,
        },
    };
    v["bot_check"].as_str() == Some("turnstile")
}

/// Dev mode only: a `user` token for a typed name (the shop's login in
/// production).
async fn dev_token(env: &Env, mut req: Request) -> ApiResult<Response> {
    let body = body_limited(&mut req, crate::api::bodies::MAX_DEV_BODY_LEN).await?;
    let name = crate::api::bodies::dev_token_name(&body)?;
    let name = name.as_str();
    let ring = ring(env, "USER_TOKEN_KEYS")?;
    let claims = Claims::new(TokenType::User, name, None, now_ms() / 1000, 12 * 3600);
    json_response(
        200,
        &json!({"user_token": ring.sign(&claims), "sub": name, "exp": claims.exp}),
        "no-store",
    )
    .map_err(internal)
}
