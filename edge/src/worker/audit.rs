//! The draw's audit, a holder's receipt and the admission metrics (Wasm
//! only): published pieces, immutable once listed and so cached for good.
//!
//! Invariants kept here: unknown sales are refused before an object is
//! created for them (the origin's summary first); the metrics answer only
//! an admin key (`guard::admin`), checked before any call; nothing here
//! writes.

use serde_json::{Value, json};
use worker::{Cache, Env, Method, Request, Response, console_log};

use crate::api::error::{ApiError, ApiResult};
use crate::draw::freeze::LISTING_MAX;
use crate::draw::hash;
use crate::guard::admin;
use crate::http::cache::{cache_key, cache_put_json};
use crate::http::keys::{admin_keys, bearer_of, ring, ticket_claims};
use crate::http::origin::origin_summary;
use crate::http::respond::{internal, json_response, query};
use crate::queue::poll::{aligned_pages, listing_page, listing_slice};
use crate::queue::shards;
use crate::worker::calls::{call_coordinator, call_shard};
use crate::worker::pieces::{fresh_for, immutable, prequeue_place};
use crate::worker::sale::sale_cfg;
use crate::worker::snapshot::snapshot;

/// `GET /api/sales/{sale}/draw`: the draw as published (commitment, and
/// each part once known); `?from=&limit=` lists places `from ..
/// from + limit` (limit ≤ 512) as `{"entries": [{place, leaf, value}]}` —
/// immutable once listed, so cached for good and asked of the coordinator
/// once per page and location.
pub(crate) async fn draw_audit(env: &Env, req: &Request, sale: &str) -> ApiResult<Response> {
    let url = req.url().map_err(internal)?;
    // Unknown sales are refused before an object is created for them.
    origin_summary(env, sale).await?;
    let (from, limit) = (query(&url, "from"), query(&url, "limit"));
    if from.is_none() && limit.is_none() {
        let snap = snapshot(env, sale).await?;
        // The overview is immutable once listed (the Cache API keeps it for
        // good), and before that at most a second old: anyone may ask, and
        // the coordinator hears about once a second per location.
        if snap.listed() {
            let id = format!("{sale}/{}/draw", snap.commitment);
            let v = immutable(&id, call_coordinator(env, sale, Method::Get, "/draw", None))
                .await
                .ok_or_else(|| {
                    ApiError::new(503, "queue_unavailable", "try again").retry_after(1)
                })?;
            return json_response(200, &v, "public, max-age=3600").map_err(internal);
        }
        let ck = cache_key("draw", sale);
        if let Ok(Some(mut r)) = Cache::default().get(ck.as_str(), false).await
            && let Ok(t) = r.text().await
            && let Ok(v) = serde_json::from_str::<Value>(&t)
        {
            return json_response(200, &v, "public, max-age=1").map_err(internal);
        }
        let v = call_coordinator(env, sale, Method::Get, "/draw", None).await?;
        cache_put_json(&ck, 200, &v.to_string(), 1).await;
        return json_response(200, &v, "public, max-age=1").map_err(internal);
    }
    let (from, limit) = listing_page(from, limit)?;
    let snap = snapshot(env, sale).await?;
    if !snap.listed() {
        return Err(ApiError::new(
            409,
            "not_drawn",
            "the draw has not happened yet (or its listing is being written)",
        )
        .retry_after(1));
    }
    let mut pages = Vec::new();
    for start in aligned_pages(from, limit) {
        let id = format!("{sale}/{}/page/{start}", snap.commitment);
        let path = format!("/listing?from={start}&limit={LISTING_MAX}");
        let page = immutable(&id, call_coordinator(env, sale, Method::Get, &path, None))
            .await
            .ok_or_else(|| ApiError::new(503, "queue_unavailable", "try again").retry_after(1))?;
        pages.push(page);
    }
    let v = listing_slice(&pages, from, limit);
    json_response(200, &v, "public, max-age=86400, immutable").map_err(internal)
}

/// `GET /api/sales/{sale}/queue/receipt` (ticket auth): the holder's entry
/// in the draw, `{account, leaf, salt, leaf_index, audit_path, place}`, so
/// they can check it themselves (the page does, with WebCrypto): their leaf
/// from their account and salt, its audit path to the published
/// `entrants_root`, and the listing at their place.
pub(crate) async fn receipt(env: &Env, req: &Request, sale: &str) -> ApiResult<Response> {
    let ticket = bearer_of(req)?;
    let claims = ticket_claims(&*ring(env, "ADMISSION_TOKEN_KEYS")?, sale, &ticket)?;
    let tkt = claims.tkt.clone().unwrap_or_default();
    if tkt.t_ms.is_some() {
        return Err(not_in_draw());
    }
    let snap = snapshot(env, sale).await?;
    if !snap.listed() {
        return Err(ApiError::new(
            409,
            "not_drawn",
            "the draw has not happened yet: a receipt exists once it is listed",
        )
        .retry_after(1));
    }
    let salt = tkt.salt.as_deref().ok_or_else(not_in_draw)?;
    let leaf = hash::leaf_of_ticket(&claims.sub, salt).ok_or_else(not_in_draw)?;
    let shard = tkt
        .shard
        .unwrap_or_else(|| shards::shard_of(&claims.sub, snap.shards));
    let unavailable = || ApiError::new(503, "queue_unavailable", "try again").retry_after(1);
    let place = prequeue_place(env, sale, &claims.sub, salt, shard, &snap)
        .await
        .ok_or_else(not_in_draw)?;
    let proof = call_coordinator(env, sale, Method::Get, &format!("/proof?leaf={leaf}"), None)
        .await
        .map_err(|e| if e.status == 404 { not_in_draw() } else { e })?;
    if proof["leaf_index"].as_u64().is_none() {
        return Err(unavailable());
    }
    let body = json!({
        "account": claims.sub,
        "leaf": leaf,
        "salt": salt,
        "leaf_index": proof["leaf_index"],
        "audit_path": proof["audit_path"],
        "entrants": proof["entrants"],
        "place": place,
    });
    json_response(200, &body, "private, no-store").map_err(internal)
}

fn not_in_draw() -> ApiError {
    ApiError::new(
        409,
        "not_in_draw",
        "this ticket's holder was not in the draw: they joined after the start, and places after it follow arrival",
    )
}

/// `GET /api/sales/{sale}/metrics` (admin key): the coordinator's
/// admission figures as Prometheus text (`metrics::render`), for a
/// scraper, or as JSON with `?format=json` (the origin's admin API); at
/// most a second old (not cached downstream).
pub(crate) async fn metrics(env: &Env, req: &Request, sale: &str) -> ApiResult<Response> {
    // Operators only (issue 44 #3), checked before anything is asked of
    // the origin or the coordinator: a refused scrape costs them nothing.
    let auth = req.headers().get("authorization").ok().flatten();
    let keys = admin_keys(env)?;
    let id = admin::check(&keys, auth.as_deref(), admin::Scope::Read)?.to_string();
    console_log!("metrics {sale}: admin key {id}");
    // Unknown sales are refused before an object is created for them.
    origin_summary(env, sale).await?;
    // At most one coordinator call per second per location however many
    // ask (issue 44 #3: each scrape ran a full snapshot in the sale's one
    // coordinator, which anonymous callers could flood).
    let id = format!("{sale}/metrics");
    let v = fresh_for(
        &id,
        1_000,
        call_coordinator(env, sale, Method::Get, "/metrics", None),
    )
    .await?;
    let f: crate::api::metrics::AdmissionFigures = serde_json::from_value(v)
        .map_err(|_| ApiError::new(502, "queue_error", "bad admission figures"))?;
    // The origin's admin API (its live view of the sale) reads the
    // figures as JSON.
    let url = req.url().map_err(internal)?;
    if query(&url, "format").as_deref() == Some("json") {
        let body = serde_json::to_value(&f)
            .map_err(|_| ApiError::new(500, "internal", "figures not serializable"))?;
        return json_response(200, &body, "no-store").map_err(internal);
    }
    let headers = worker::Headers::new();
    headers
        .set("content-type", "text/plain; version=0.0.4; charset=utf-8")
        .map_err(internal)?;
    headers.set("cache-control", "no-store").map_err(internal)?;
    Ok(Response::ok(crate::api::metrics::render(sale, &f))
        .map_err(internal)?
        .with_headers(headers))
}

/// `POST /api/sales/{sale}/revoke` `{"account": …}` (admin key of scope
/// `write`; the origin's admin API and its purchase path call it): ends
/// the account's admission; its shard reports the turn revoked and the
/// coordinator passes it on at once (`queue::entries::Entries::revoke`).
pub(crate) async fn revoke(env: &Env, mut req: Request, sale: &str) -> ApiResult<Response> {
    let auth = req.headers().get("authorization").ok().flatten();
    let keys = admin_keys(env)?;
    let id = admin::check(&keys, auth.as_deref(), admin::Scope::Write)?.to_string();
    let body: Value = req
        .json()
        .await
        .map_err(|_| ApiError::new(400, "malformed_json", "the body must be {\"account\": …}"))?;
    let account = body["account"]
        .as_str()
        .filter(|a| token::valid_subject(a))
        .ok_or_else(|| {
            ApiError::new(
                422,
                "invalid_body",
                "account must be a valid account (a token subject)",
            )
        })?
        .to_string();
    let cfg = sale_cfg(env, sale).await?;
    let k = shards::shard_of(&account, cfg.shards);
    let v = call_shard(
        env,
        sale,
        k,
        Method::Post,
        "/revoke",
        Some(&serde_json::json!({"sub": account})),
    )
    .await?;
    console_log!("revoke {sale}: admin key {id}, shard {k}");
    json_response(
        200,
        &serde_json::json!({"sale": sale, "account": account, "shard": k,
                            "revoked": true, "place": v["place"]}),
        "no-store",
    )
    .map_err(internal)
}
