//! The admin listener's routes (`ADMIN_ADDR`): the admin API under
//! `/admin/api/`, the console at `/admin/`, and, when the listener is
//! shared with `ORIGIN_METRICS_ADDR`, `/metrics` and `/healthz`.
//!
//! Invariants kept here: every `/admin/api/` route asks the gate first
//! (rate, key, scope) and nothing else is read or changed for a request it
//! refuses; every write, applied or refused (a bad key, a read key, a bad
//! body, a started sale, an unknown sale), leaves an audit entry, except
//! one refused for its address's rate (whose entries would be the flood);
//! bodies are read whole only up to [`BODY_LIMIT`].

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Path, Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};
use token::Scope;
use tokio_util::sync::CancellationToken;

use crate::admin::audit::{self, Write};
use crate::admin::auth::{Admin, Gate};
use crate::admin::control::{self, Action, EditBody, MessageBody, RateBody, RevokeBody};
use crate::admin::error::AdminError;
use crate::admin::live::Hub;
use crate::ops::state::AppState;
use crate::sales::sale::valid_sale_id;

/// The largest admin request body.
pub const BODY_LIMIT: usize = 16 * 1024;

/// What the admin routes share.
#[derive(Clone)]
pub struct AdminState(Arc<Inner>);

/// The admin listener's state.
pub struct Inner {
    pub app: AppState,
    pub gate: Gate,
    pub hub: Hub,
    /// Cancelled when the origin stops: event streams end.
    pub stop: CancellationToken,
}

type St = State<AdminState>;
type Peer = ConnectInfo<SocketAddr>;

/// The admin listener's router. `shared`: it also serves `/metrics` and
/// `/healthz` (`ADMIN_ADDR` is `ORIGIN_METRICS_ADDR`).
pub fn router(app: AppState, shared: bool, stop: CancellationToken) -> Router {
    let admin = &app.settings.admin;
    let state = AdminState(Arc::new(Inner {
        gate: Gate::new(admin.keys.clone(), admin.rate_per_s),
        hub: Hub::default(),
        stop,
        app: app.clone(),
    }));
    let mut r = Router::new()
        .route("/admin", get(crate::admin::console::redirect))
        .route("/admin/", get(crate::admin::console::page))
        .route("/admin/assets/{file}", get(crate::admin::console::asset))
        .route("/admin/api/sales", get(list_sales).post(create_sale))
        .route("/admin/api/sales/{sale}", get(show_sale).patch(edit_sale))
        .route("/admin/api/sales/{sale}/live", get(live))
        .route("/admin/api/sales/{sale}/live/stream", get(live_stream))
        .route("/admin/api/sales/{sale}/pause", post(pause))
        .route("/admin/api/sales/{sale}/resume", post(resume))
        .route("/admin/api/sales/{sale}/rate", post(rate))
        .route("/admin/api/sales/{sale}/end", post(end))
        .route("/admin/api/sales/{sale}/message", post(message))
        .route("/admin/api/sales/{sale}/revoke", post(revoke))
        .route("/admin/api/audit", get(audit_log))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(state);
    if shared {
        r = r.merge(crate::http::router::metrics_routes());
    }
    crate::ops::telemetry::access_log(r)
}

async fn not_found() -> AdminError {
    AdminError::NotFound("no such admin route".into())
}

fn sale_id(sale: &str) -> Result<(), AdminError> {
    if valid_sale_id(sale) {
        Ok(())
    } else {
        Err(AdminError::SaleNotFound(sale.chars().take(64).collect()))
    }
}

/// Lets a reader in.
fn read(s: &AdminState, peer: &Peer, headers: &HeaderMap) -> Result<Admin, AdminError> {
    s.0.gate.admit(peer.0.ip(), headers, Scope::Read)
}

/// Lets a writer in, or records the refusal (but for the rate's).
async fn write(
    s: &AdminState,
    peer: &Peer,
    headers: &HeaderMap,
    action: &str,
    sale: &str,
    request: &Value,
) -> Result<Admin, AdminError> {
    match s.0.gate.admit(peer.0.ip(), headers, Scope::Write) {
        Ok(a) => Ok(a),
        Err(e @ AdminError::RateLimited(_)) => Err(e),
        Err(e) => {
            let key = s.0.gate.key_id(headers);
            let w = Write {
                key_id: key.as_deref(),
                action,
                sale: Some(sale),
                request,
            };
            control::refuse(&s.0.app, &w, &e).await;
            Err(e)
        }
    }
}

/// The request body as JSON (`{}` when empty).
fn body_json(body: &Bytes) -> Result<Value, AdminError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(json!({}));
    }
    serde_json::from_slice(body).map_err(|e| AdminError::MalformedJson(format!("not JSON: {e}")))
}

/// One write route: gate, body, action, apply; every refusal audited.
async fn run_write<B: serde::de::DeserializeOwned>(
    s: &AdminState,
    peer: &Peer,
    headers: &HeaderMap,
    name: &'static str,
    sale: &str,
    body: &Bytes,
    make: impl FnOnce(B) -> Action,
) -> Result<Response, AdminError> {
    // What was sent, for the audit log (the raw text when not JSON).
    let parsed = body_json(body);
    let request = match &parsed {
        Ok(v) => v.clone(),
        Err(_) => json!({"unparsed": String::from_utf8_lossy(&body[..body.len().min(1024)])}),
    };
    let admin = write(s, peer, headers, name, sale, &request).await?;
    let refused = |e: AdminError| async {
        let w = Write {
            key_id: Some(&admin.key_id),
            action: name,
            sale: Some(sale),
            request: &request,
        };
        control::refuse(&s.0.app, &w, &e).await;
        e
    };
    if let Err(e) = sale_id(sale) {
        return Err(refused(e).await);
    }
    let typed: B = match parsed.and_then(|v| {
        serde_json::from_value(v).map_err(|e| AdminError::Invalid(format!("body: {e}")))
    }) {
        Ok(b) => b,
        Err(e) => return Err(refused(e).await),
    };
    let after = control::apply(&s.0.app, &admin.key_id, sale, make(typed), &request).await?;
    Ok(Json(json!({"sale": sale, "action": name, "after": after})).into_response())
}

/// An empty body (`{}`), for the actions that take none.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NoBody {}

macro_rules! write_route {
    ($fn:ident, $name:literal, $body:ty, $make:expr, $doc:literal) => {
        #[doc = $doc]
        pub async fn $fn(
            State(s): St,
            peer: Peer,
            Path(sale): Path<String>,
            headers: HeaderMap,
            body: Bytes,
        ) -> Result<Response, AdminError> {
            run_write::<$body>(&s, &peer, &headers, $name, &sale, &body, $make).await
        }
    };
}

write_route!(
    pause,
    "pause",
    NoBody,
    |_| Action::Pause,
    "`POST sales/{sale}/pause`: the edge admits nobody new (places are kept)."
);
write_route!(
    resume,
    "resume",
    NoBody,
    |_| Action::Resume,
    "`POST sales/{sale}/resume`: admission goes on."
);
write_route!(
    rate,
    "rate",
    RateBody,
    |b: RateBody| Action::Rate(b.rate),
    "`POST sales/{sale}/rate` `{\"rate\": people/s}`: the admission ceiling."
);
write_route!(
    end,
    "end",
    NoBody,
    |_| Action::End,
    "`POST sales/{sale}/end`: the sale ends now (holds granted stay payable until they expire)."
);
write_route!(
    message,
    "message",
    MessageBody,
    |b: MessageBody| Action::Message(Some(b.text)),
    "`POST sales/{sale}/message` `{\"text\": …}`: the message every waiting page shows (empty: none)."
);
write_route!(
    edit_sale,
    "edit",
    EditBody,
    Action::Edit,
    "`PATCH sales/{sale}`: the start, end and admission settings, before the sale starts."
);
write_route!(
    revoke,
    "revoke",
    RevokeBody,
    |b: RevokeBody| Action::Revoke(b.account),
    "`POST sales/{sale}/revoke` `{\"account\": …}`: the account's admission ends; its turn passes on at once at the edge."
);

/// `POST sales`: a new sale, from `origin sale create`'s flags as JSON.
pub async fn create_sale(
    State(s): St,
    peer: Peer,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, AdminError> {
    let parsed = body_json(&body);
    let request = match &parsed {
        Ok(v) => v.clone(),
        Err(_) => json!({"unparsed": String::from_utf8_lossy(&body[..body.len().min(1024)])}),
    };
    let sale = request["sale"].as_str().unwrap_or_default().to_string();
    let admin = write(&s, &peer, &headers, "create", &sale, &request).await?;
    if let Err(e) = parsed {
        let w = Write {
            key_id: Some(&admin.key_id),
            action: "create",
            sale: Some(&sale),
            request: &request,
        };
        control::refuse(&s.0.app, &w, &e).await;
        return Err(e);
    }
    let cfg = control::create(&s.0.app, &admin.key_id, &request).await?;
    Ok((axum::http::StatusCode::CREATED, Json(cfg)).into_response())
}

/// `GET sales`: every sale, newest start first.
pub async fn list_sales(
    State(s): St,
    peer: Peer,
    headers: HeaderMap,
) -> Result<Json<Value>, AdminError> {
    read(&s, &peer, &headers)?;
    // One JSON object per sale, built by Postgres.
    let sales: Vec<Value> = sqlx::query_scalar(
        "SELECT json_build_object('sale', s.id, 'name', s.name, 'starts_at', s.starts_at,
                    'ends_at', s.ends_at, 'paused', s.paused, 'units_total', s.units_total,
                    'skus', (SELECT count(*) FROM skus k WHERE k.sale_id = s.id))::jsonb
           FROM sales s ORDER BY s.starts_at DESC, s.id LIMIT 1000",
    )
    .fetch_all(&s.0.app.pool)
    .await?;
    Ok(Json(json!({ "sales": sales })))
}

/// `GET sales/{sale}`: the sale's configuration and SKUs.
pub async fn show_sale(
    State(s): St,
    peer: Peer,
    Path(sale): Path<String>,
    headers: HeaderMap,
) -> Result<Json<Value>, AdminError> {
    read(&s, &peer, &headers)?;
    sale_id(&sale)?;
    let cfg = crate::sales::sale::load_sale(&s.0.app.pool, &sale)
        .await?
        .ok_or_else(|| AdminError::SaleNotFound(sale.clone()))?;
    let mut v = serde_json::to_value(&cfg).map_err(|e| AdminError::Internal(e.into()))?;
    v["phase"] = json!(cfg.phase_by_time(chrono::Utc::now()));
    Ok(Json(v))
}

async fn known(s: &AdminState, sale: &str) -> Result<(), AdminError> {
    sale_id(sale)?;
    match s.0.app.sales.get(sale).await? {
        Some(_) => Ok(()),
        None => Err(AdminError::SaleNotFound(sale.to_string())),
    }
}

/// `GET sales/{sale}/live`: the sale's latest frame (at most ~1 s old).
pub async fn live(
    State(s): St,
    peer: Peer,
    Path(sale): Path<String>,
    headers: HeaderMap,
) -> Result<Response, AdminError> {
    read(&s, &peer, &headers)?;
    known(&s, &sale).await?;
    let f =
        s.0.hub
            .latest(&s.0.app, &sale)
            .await
            .ok_or_else(|| AdminError::Unavailable {
                code: "database_unavailable",
                message: "no figures yet; retry".into(),
            })?;
    let mut res = Json(&*f).into_response();
    res.headers_mut().insert(
        axum::http::header::CACHE_CONTROL,
        axum::http::HeaderValue::from_static("no-store"),
    );
    Ok(res)
}

/// `GET sales/{sale}/live/stream`: the frames as Server-Sent Events
/// (`event: frame`, one a second), until the client leaves or the origin
/// stops.
pub async fn live_stream(
    State(s): St,
    peer: Peer,
    Path(sale): Path<String>,
    headers: HeaderMap,
) -> Result<Response, AdminError> {
    read(&s, &peer, &headers)?;
    known(&s, &sale).await?;
    let rx = s.0.hub.watch(&s.0.app, &sale);
    let stop = s.0.stop.clone();
    let stream = futures::stream::unfold((rx, stop), |(mut rx, stop)| async move {
        tokio::select! {
            changed = rx.changed() => changed.ok()?,
            _ = stop.cancelled() => return None,
        }
        let f = rx.borrow_and_update().clone()?;
        let ev = Event::default()
            .event("frame")
            .json_data(&*f)
            .unwrap_or_else(|_| Event::default().comment("unserializable frame"));
        Some((Ok::<_, std::convert::Infallible>(ev), (rx, stop)))
    });
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// `GET audit?sale=&before=&limit=`.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    /// Only this sale's entries.
    pub sale: Option<String>,
    /// Entries older than this id (the next page).
    pub before: Option<i64>,
    /// At most this many (default 100).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<i64>,
}

/// `GET audit`: entries newest first.
pub async fn audit_log(
    State(s): St,
    peer: Peer,
    headers: HeaderMap,
    q: Result<Query<AuditQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, AdminError> {
    read(&s, &peer, &headers)?;
    let Query(q) = q.map_err(|e| AdminError::Invalid(e.body_text()))?;
    if let Some(l) = q.limit
        && !(1..=audit::MAX_PAGE).contains(&l)
    {
        return Err(AdminError::Invalid(format!(
            "limit must be 1-{}",
            audit::MAX_PAGE
        )));
    }
    let entries = audit::list(
        &s.0.app.pool,
        q.sale.as_deref(),
        q.before,
        q.limit.unwrap_or(100),
    )
    .await?;
    let next = (entries.len() as i64 == q.limit.unwrap_or(100))
        .then(|| entries.last().map(|e| e.id))
        .flatten();
    Ok(Json(json!({"entries": entries, "next_before": next})))
}
