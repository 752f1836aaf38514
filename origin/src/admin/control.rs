//! The admin API's writes: pause, resume, the admission rate, the end, the
//! message to waiting pages, and edits of a sale before it starts; each
//! applied with its audit entry, or refused with one.
//!
//! Invariants kept here:
//! - a write is applied and its audit entry written in one transaction
//!   (`sales::spec::change_sale_in`, then `audit::append`): both or
//!   neither; a refused write changes nothing and leaves an entry with its
//!   error code;
//! - after the start only pause, resume, the rate, the message and the end
//!   may change (an edit is `before_start_only`, checked under the sale's
//!   row lock); units, SKUs, shards, limits and the hold time never change
//!   (`sales::spec`);
//! - once committed, this process answers with the change at once
//!   (`SaleRegistry::changed`, the summary cache dropped): the edge reads
//!   the summary at most 1 s old and its coordinator once a second, which
//!   is what bounds how soon every queue shard acts on it.

use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::admin::audit::{self, Write};
use crate::admin::error::AdminError;
use crate::ops::state::AppState;
use crate::sales::revoke;
use crate::sales::sale::SaleConfig;
use crate::sales::spec::{MessageError, SaleChange, change_sale_in, valid_message};

/// `POST sales/{sale}/rate`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RateBody {
    /// The admission ceiling, people per second (0 < rate ≤ 1,000,000).
    #[schema(exclusive_minimum = 0, maximum = 1_000_000)]
    pub rate: f64,
}

/// `POST sales/{sale}/message`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MessageBody {
    /// Plain text of at most 280 characters (no control character but
    /// line breaks), shown on every waiting page as text (markup is shown
    /// as typed); empty takes the message down.
    #[schema(max_length = 280, pattern = r"^[^\x00-\x09\x0b-\x1f\x7f-\x9f]*$")]
    pub text: String,
}

/// `PATCH sales/{sale}`: what may change before the sale starts.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EditBody {
    #[schema(value_type = Option<String>, format = DateTime)]
    pub starts_at: Option<DateTime<Utc>>,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub ends_at: Option<DateTime<Utc>>,
    #[schema(exclusive_minimum = 0, maximum = 1_000_000)]
    pub admission_rate: Option<f64>,
    #[schema(exclusive_minimum = 0, maximum = 100)]
    pub admission_factor: Option<f64>,
    #[schema(exclusive_minimum = 0, maximum = 60_000)]
    pub admission_p99_ms: Option<f64>,
}

/// `POST sales/{sale}/revoke`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RevokeBody {
    /// The account (a token subject) whose admission ends.
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1f\x7f-\x9f]+$"
    )]
    pub account: String,
}

/// Ends `account`'s admission to `sale` (`sales::revoke`): recorded with
/// its audit entry in one transaction, then marked in Redis, then told to
/// the edge.
async fn revoke(app: &AppState, w: &Write<'_>, account: &str) -> Result<Value, AdminError> {
    let sale = w.sale.unwrap_or_default();
    if !token::valid_subject(account) {
        return Err(AdminError::Invalid(
            "account must be a valid account id (a token subject)".into(),
        ));
    }
    let s = app
        .sales
        .get(sale)
        .await?
        .ok_or_else(|| AdminError::SaleNotFound(sale.to_string()))?;
    let mut tx = app.pool.begin().await?;
    let new = revoke::record(&mut tx, sale, account).await?;
    audit::append(
        &mut tx,
        w,
        &json!({"account": account, "revoked": !new}),
        &json!({"account": account, "revoked": true}),
    )
    .await?;
    tx.commit().await?;
    revoke::mark(&app.engine.conn, &s, account).await?;
    let admin = &app.settings.admin;
    let edge = admin.edge_url.as_deref().zip(admin.edge_secret.as_ref());
    let told = revoke::tell_edge(edge, sale, account).await;
    tracing::info!(sale, key_id = w.key_id, ?told, "admission revoked");
    Ok(json!({"account": account, "revoked": true, "new": new, "edge": told}))
}

/// `POST sales`: the flags of `origin sale create` as a JSON object
/// (`{"sale": "drop-2", "name": "…", "units": 100, "starts_at": "…",
/// "sku": ["s42:10:12900", …], "bot_shadow": true}`): one parser and one
/// set of defaults and checks for both.
pub fn create_flags(body: &Value) -> Result<Vec<String>, AdminError> {
    let Some(obj) = body.as_object() else {
        return Err(AdminError::Invalid(
            "the body must be an object of sale create's flags".into(),
        ));
    };
    let mut flags = Vec::new();
    for (k, v) in obj {
        if k == "skus" {
            return Err(AdminError::Invalid(
                "list the SKUs in \"sku\" (an array of id:units:price_cents[:limit]); no file is read here".into(),
            ));
        }
        if !k.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') || k.is_empty() {
            return Err(AdminError::Invalid(format!("unknown field {k:?}")));
        }
        let flag = format!("--{}", k.replace('_', "-"));
        let text = |v: &Value| match v {
            Value::String(s) => Ok(s.clone()),
            Value::Number(n) => Ok(n.to_string()),
            _ => Err(AdminError::Invalid(format!("{k}: a string or a number"))),
        };
        match v {
            Value::Bool(true) => flags.push(flag),
            Value::Bool(false) | Value::Null => {}
            Value::Array(items) => {
                for item in items {
                    flags.push(flag.clone());
                    flags.push(text(item)?);
                }
            }
            other => {
                flags.push(flag);
                flags.push(text(other)?);
            }
        }
    }
    Ok(flags)
}

/// Creates a sale (`sales::spec::create_sale`: Postgres and Redis stock),
/// then its audit entry; a refusal gets an entry.
pub async fn create(app: &AppState, key_id: &str, request: &Value) -> Result<Value, AdminError> {
    let sale = request["sale"].as_str().map(str::to_string);
    let w = Write {
        key_id: Some(key_id),
        action: "create",
        sale: sale.as_deref(),
        request,
    };
    let done = async {
        let flags = create_flags(request)?;
        let args = crate::sales::create::parse_flags(&flags).map_err(AdminError::Invalid)?;
        let skus = args.sku.clone();
        let spec = args.spec(skus);
        let mut conn = app.engine.conn.clone();
        let cfg =
            crate::sales::spec::create_sale(&app.pool, &mut conn, &app.settings.key_prefix, &spec)
                .await
                .map_err(|e| {
                    use crate::sales::spec::CreateError as C;
                    match e {
                        C::Invalid(m) => AdminError::Invalid(m),
                        C::Exists(_) | C::RedisKeysExist(_) => {
                            AdminError::SaleExists(e.to_string())
                        }
                        C::Db(d) => d.into(),
                        C::Redis(r) => r.into(),
                    }
                })?;
        let mut tx = app.pool.begin().await?;
        let view = audit_view(&cfg);
        audit::append(&mut tx, &w, &Value::Null, &view).await?;
        tx.commit().await?;
        serde_json::to_value(&cfg).map_err(|e| AdminError::Internal(e.into()))
    };
    match done.await {
        Ok(v) => Ok(v),
        Err(e) => {
            refuse(app, &w, &e).await;
            Err(e)
        }
    }
}

/// What an admin write asks.
#[derive(Debug)]
pub enum Action {
    Pause,
    Resume,
    Rate(f64),
    End,
    Message(Option<String>),
    Edit(EditBody),
    /// End this account's admission.
    Revoke(String),
}

impl Action {
    /// The audit log's name of the action.
    pub fn name(&self) -> &'static str {
        match self {
            Action::Pause => "pause",
            Action::Resume => "resume",
            Action::Rate(_) => "rate",
            Action::End => "end",
            Action::Message(_) => "message",
            Action::Edit(_) => "edit",
            Action::Revoke(_) => "revoke",
        }
    }

    /// The change it makes, or why it cannot be made.
    fn change(&self, now: DateTime<Utc>) -> Result<SaleChange, AdminError> {
        Ok(match self {
            Action::Pause => SaleChange {
                paused: Some(true),
                ..Default::default()
            },
            Action::Resume => SaleChange {
                paused: Some(false),
                ..Default::default()
            },
            Action::Rate(r) => SaleChange {
                admission_rate: Some(*r),
                ..Default::default()
            },
            Action::End => SaleChange {
                ends_at: Some(now),
                ..Default::default()
            },
            Action::Message(text) => {
                let stored = match text.as_deref().map(valid_message) {
                    None => None,
                    Some(Ok(m)) => m,
                    Some(Err(MessageError::TooLong(n))) => {
                        return Err(AdminError::MessageTooLong(n));
                    }
                    Some(Err(MessageError::ControlCharacter)) => {
                        return Err(AdminError::Invalid(
                            "the message may not hold control characters (line breaks may)".into(),
                        ));
                    }
                };
                SaleChange {
                    message: Some(stored),
                    ..Default::default()
                }
            }
            Action::Revoke(_) => {
                return Err(AdminError::Invalid(
                    "a revoke changes no sale setting".into(),
                ));
            }
            Action::Edit(e) => SaleChange {
                starts_at: e.starts_at,
                ends_at: e.ends_at,
                admission_rate: e.admission_rate,
                admission_factor: e.admission_factor,
                admission_p99_ms: e.admission_p99_ms,
                before_start_only: true,
                ..Default::default()
            },
        })
    }
}

/// What the audit log keeps of a sale: what an admin write may change.
pub fn audit_view(c: &SaleConfig) -> Value {
    json!({
        "paused": c.paused,
        "admission_rate": c.admission_rate,
        "admission_factor": c.admission_factor,
        "admission_p99_ms": c.admission_p99_ms,
        "starts_at": c.starts_at,
        "ends_at": c.ends_at,
        "message": c.message,
    })
}

/// Applies `action` to `sale` for the key `key_id`, with its audit entry;
/// a refusal gets an entry too. Returns the sale's audit view after.
pub async fn apply(
    app: &AppState,
    key_id: &str,
    sale: &str,
    action: Action,
    request: &Value,
) -> Result<Value, AdminError> {
    let w = Write {
        key_id: Some(key_id),
        action: action.name(),
        sale: Some(sale),
        request,
    };
    let done = match &action {
        Action::Revoke(account) => revoke(app, &w, account).await,
        _ => applied(app, &w, &action).await,
    };
    match done {
        Ok(after) => Ok(after),
        Err(e) => {
            refuse(app, &w, &e).await;
            Err(e)
        }
    }
}

async fn applied(app: &AppState, w: &Write<'_>, action: &Action) -> Result<Value, AdminError> {
    let sale = w.sale.unwrap_or_default();
    let change = action.change(Utc::now())?;
    let mut tx = app.pool.begin().await?;
    let (before, after) = change_sale_in(&mut tx, sale, &change).await?;
    let view = audit_view(&after);
    audit::append(&mut tx, w, &audit_view(&before), &view).await?;
    tx.commit().await?;
    tracing::info!(
        sale,
        key_id = w.key_id,
        action = w.action,
        "admin write applied"
    );
    app.sales.changed(after).await;
    app.summaries.invalidate(sale).await;
    Ok(view)
}

/// Records a refused write (best effort: the refusal is answered whether
/// or not Postgres takes the entry, and a failure is logged).
pub async fn refuse(app: &AppState, w: &Write<'_>, e: &AdminError) {
    tracing::info!(
        sale = w.sale,
        key_id = w.key_id,
        action = w.action,
        code = e.code(),
        "admin write refused"
    );
    if let Err(db) = audit::refused(&app.pool, w, e.code()).await {
        tracing::warn!(error = %db, action = w.action, "cannot write the audit entry of a refused write");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_over_280_characters_or_with_control_characters_is_refused() {
        let now = Utc::now();
        let long = "é".repeat(281);
        let e = Action::Message(Some(long)).change(now).unwrap_err();
        assert_eq!(e.code(), "message_too_long");
        let ok = "ü".repeat(280);
        let c = Action::Message(Some(ok.clone())).change(now).unwrap();
        assert_eq!(c.message, Some(Some(ok)), "280 characters (not bytes)");
        let c = Action::Message(Some("  hi \n".into())).change(now).unwrap();
        assert_eq!(c.message, Some(Some("hi".into())), "trimmed");
        let e = Action::Message(Some("a\u{7}b".into()))
            .change(now)
            .unwrap_err();
        assert_eq!(e.code(), "invalid_change");
        let c = Action::Message(Some("<b>size 42</b>\nsold out".into()))
            .change(now)
            .unwrap();
        assert_eq!(
            c.message,
            Some(Some("<b>size 42</b>\nsold out".into())),
            "markup kept as typed"
        );
        for blank in [Some("   ".to_string()), None] {
            let c = Action::Message(blank).change(now).unwrap();
            assert_eq!(c.message, Some(None), "taken down");
        }
    }

    #[test]
    fn only_edits_are_limited_to_before_the_start() {
        let now = Utc::now();
        for a in [
            Action::Pause,
            Action::Resume,
            Action::Rate(5.0),
            Action::End,
            Action::Message(Some("x".into())),
        ] {
            assert!(!a.change(now).unwrap().before_start_only, "{}", a.name());
        }
        assert!(
            Action::Edit(EditBody::default())
                .change(now)
                .unwrap()
                .before_start_only
        );
    }
}
