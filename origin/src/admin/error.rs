//! The admin API's one error type and its one `IntoResponse`.
//!
//! Every error answers `{"error": {"code", "message"}}` with its status, as
//! the public API does; 5xx bodies never carry internals (logged instead);
//! 401 carries `WWW-Authenticate: Bearer`, 429 and 503 `Retry-After`. Every
//! code is in [`ADMIN_ERROR_CODES`], which the admin OpenAPI document
//! publishes (a debug build checks each answer against it).

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// Every error `code` the admin API can answer, sorted.
pub const ADMIN_ERROR_CODES: &[&str] = &[
    "admin_key_required",
    "admin_scope",
    "database_unavailable",
    "edge_unavailable",
    "internal",
    "invalid_change",
    "malformed_json",
    "message_too_long",
    "not_found",
    "rate_limited",
    "redis_unavailable",
    "sale_exists",
    "sale_not_found",
    "sale_not_live",
    "sale_started",
];

/// An error answer of the admin API.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("an admin key is required: Authorization: Bearer <secret of ADMIN_KEYS>")]
    KeyRequired,
    #[error("admin key {0:?} may only read")]
    Scope(String),
    #[error("too many admin requests from this address; retry in {0} s")]
    RateLimited(u64),
    #[error("no sale {0:?}")]
    SaleNotFound(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    SaleStarted(String),
    #[error("{0}")]
    SaleExists(String),
    #[error("{0}")]
    SaleNotLive(String),
    #[error("{0}")]
    Invalid(String),
    #[error("the message has {0} characters; at most 280")]
    MessageTooLong(usize),
    #[error("{0}")]
    MalformedJson(String),
    #[error("{0}")]
    EdgeUnavailable(String),
    #[error("{message}")]
    Unavailable { code: &'static str, message: String },
    #[error("internal error")]
    Internal(#[from] anyhow::Error),
}

impl AdminError {
    pub fn status(&self) -> StatusCode {
        match self {
            AdminError::KeyRequired => StatusCode::UNAUTHORIZED,
            AdminError::Scope(_) => StatusCode::FORBIDDEN,
            AdminError::RateLimited(_) => StatusCode::TOO_MANY_REQUESTS,
            AdminError::SaleNotFound(_) | AdminError::NotFound(_) => StatusCode::NOT_FOUND,
            AdminError::SaleStarted(_) | AdminError::SaleNotLive(_) | AdminError::SaleExists(_) => {
                StatusCode::CONFLICT
            }
            AdminError::Invalid(_)
            | AdminError::MessageTooLong(_)
            | AdminError::MalformedJson(_) => StatusCode::BAD_REQUEST,
            AdminError::EdgeUnavailable(_) => StatusCode::BAD_GATEWAY,
            AdminError::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            AdminError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            AdminError::KeyRequired => "admin_key_required",
            AdminError::Scope(_) => "admin_scope",
            AdminError::RateLimited(_) => "rate_limited",
            AdminError::SaleNotFound(_) => "sale_not_found",
            AdminError::NotFound(_) => "not_found",
            AdminError::SaleStarted(_) => "sale_started",
            AdminError::SaleExists(_) => "sale_exists",
            AdminError::SaleNotLive(_) => "sale_not_live",
            AdminError::Invalid(_) => "invalid_change",
            AdminError::MessageTooLong(_) => "message_too_long",
            AdminError::MalformedJson(_) => "malformed_json",
            AdminError::EdgeUnavailable(_) => "edge_unavailable",
            AdminError::Unavailable { code, .. } => code,
            AdminError::Internal(_) => "internal",
        }
    }
}

impl From<sqlx::Error> for AdminError {
    fn from(e: sqlx::Error) -> Self {
        match e {
            sqlx::Error::PoolTimedOut | sqlx::Error::Io(_) | sqlx::Error::PoolClosed => {
                tracing::warn!(error = %e, "postgres unavailable");
                AdminError::Unavailable {
                    code: "database_unavailable",
                    message: "Postgres is briefly unavailable; nothing was changed".into(),
                }
            }
            other => AdminError::Internal(other.into()),
        }
    }
}

impl From<redis::RedisError> for AdminError {
    fn from(e: redis::RedisError) -> Self {
        tracing::warn!(error = %e, "redis call failed");
        AdminError::Unavailable {
            code: "redis_unavailable",
            message: "Redis is briefly unavailable".into(),
        }
    }
}

impl From<crate::sales::spec::ChangeError> for AdminError {
    fn from(e: crate::sales::spec::ChangeError) -> Self {
        use crate::sales::spec::ChangeError as C;
        match e {
            C::NotFound(id) => AdminError::SaleNotFound(id),
            e @ C::Started(_) => AdminError::SaleStarted(e.to_string()),
            C::Invalid(m) => AdminError::Invalid(m),
            C::Db(e) => e.into(),
        }
    }
}

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        debug_assert!(
            ADMIN_ERROR_CODES.contains(&self.code()),
            "admin error code {:?} is missing from ADMIN_ERROR_CODES",
            self.code()
        );
        let message = match &self {
            AdminError::Internal(e) => {
                tracing::error!(error = ?e, "admin API: internal error");
                "internal error".to_string()
            }
            other => other.to_string(),
        };
        let body = json!({"error": {"code": self.code(), "message": message}});
        let mut res = (self.status(), Json(body)).into_response();
        let h = res.headers_mut();
        match &self {
            AdminError::KeyRequired => {
                h.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            AdminError::RateLimited(secs) => {
                h.insert(header::RETRY_AFTER, HeaderValue::from(*secs));
            }
            AdminError::Unavailable { .. } => {
                h.insert(header::RETRY_AFTER, HeaderValue::from(1));
            }
            _ => {}
        }
        res
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_codes_are_sorted_and_each_variant_is_listed() {
        assert!(ADMIN_ERROR_CODES.is_sorted());
        for e in [
            AdminError::KeyRequired,
            AdminError::Scope("k".into()),
            AdminError::RateLimited(1),
            AdminError::SaleNotFound("s".into()),
            AdminError::NotFound("x".into()),
            AdminError::SaleStarted("x".into()),
            AdminError::SaleExists("x".into()),
            AdminError::SaleNotLive("x".into()),
            AdminError::Invalid("x".into()),
            AdminError::MessageTooLong(300),
            AdminError::MalformedJson("x".into()),
            AdminError::EdgeUnavailable("x".into()),
            AdminError::Internal(anyhow::anyhow!("x")),
        ] {
            assert!(ADMIN_ERROR_CODES.contains(&e.code()), "{}", e.code());
        }
    }
}
