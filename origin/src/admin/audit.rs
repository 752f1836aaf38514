//! The audit log of the admin API (`audit_log`, migration 0019): every
//! write, applied or refused, with who by key id, what, when, the request,
//! and the sale before and after.
//!
//! Invariants kept here: an applied write's entry is written in the
//! transaction that applies it ([`append`] takes that transaction), so no
//! change is ever without its entry and no entry names a change that did
//! not happen; a refused write gets an entry of its own with the error code
//! it was refused with. Nothing here updates or deletes an entry, and the
//! table's triggers refuse anyone who tries.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::{PgConnection, PgPool};

/// One entry, as `GET /admin/api/audit` lists it.
#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Entry {
    pub id: i64,
    #[schema(value_type = String, format = DateTime)]
    pub at: DateTime<Utc>,
    /// The admin key's id; null when no known key was sent.
    pub key_id: Option<String>,
    /// `pause`, `resume`, `rate`, `end`, `message`, `edit`, `revoke`.
    pub action: String,
    pub sale: Option<String>,
    /// Whether the write was refused (then `error` says why).
    #[sqlx(skip)]
    pub refused: bool,
    /// The error code a refused write got.
    #[sqlx(rename = "refused")]
    pub error: Option<String>,
    /// The request's body as sent (any JSON; `{"unparsed": …}` when it
    /// was not JSON).
    #[schema(value_type = Option<Value>)]
    pub request: Option<Value>,
    /// What the write touched before and after (null when refused).
    #[schema(value_type = Option<Value>)]
    pub before: Option<Value>,
    #[schema(value_type = Option<Value>)]
    pub after: Option<Value>,
}

/// What one write was.
pub struct Write<'a> {
    pub key_id: Option<&'a str>,
    pub action: &'a str,
    pub sale: Option<&'a str>,
    pub request: &'a Value,
}

/// Appends the entry of an applied write, inside the transaction that
/// applies it.
pub async fn append(
    tx: &mut PgConnection,
    w: &Write<'_>,
    before: &Value,
    after: &Value,
) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "INSERT INTO audit_log (key_id, action, sale, request, before, after)
         VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
    )
    .bind(w.key_id)
    .bind(w.action)
    .bind(w.sale)
    .bind(w.request)
    .bind(before)
    .bind(after)
    .fetch_one(tx)
    .await
}

/// Appends the entry of a refused write (nothing else was changed).
pub async fn refused(pool: &PgPool, w: &Write<'_>, code: &str) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "INSERT INTO audit_log (key_id, action, sale, request, refused)
         VALUES ($1, $2, $3, $4, $5) RETURNING id",
    )
    .bind(w.key_id)
    .bind(w.action)
    .bind(w.sale)
    .bind(w.request)
    .bind(code)
    .fetch_one(pool)
    .await
}

/// At most this many entries per page.
pub const MAX_PAGE: i64 = 500;

/// Entries newest first: of one sale or all, older than entry `before`
/// when given (the next page), at most `limit`.
pub async fn list(
    pool: &PgPool,
    sale: Option<&str>,
    before: Option<i64>,
    limit: i64,
) -> Result<Vec<Entry>, sqlx::Error> {
    let mut rows: Vec<Entry> = sqlx::query_as(
        "SELECT id, at, key_id, action, sale, refused, request, before, after
           FROM audit_log
          WHERE ($1::text IS NULL OR sale = $1) AND ($2::bigint IS NULL OR id < $2)
          ORDER BY id DESC LIMIT $3",
    )
    .bind(sale)
    .bind(before)
    .bind(limit.clamp(1, MAX_PAGE))
    .fetch_all(pool)
    .await?;
    for r in &mut rows {
        r.refused = r.error.is_some();
    }
    Ok(rows)
}
