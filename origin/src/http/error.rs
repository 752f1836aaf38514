//! The HTTP API's one error type and its one `IntoResponse`.
//!
//! Every error answers `{"error": {"code", "message"}}` with its status;
//! 5xx bodies never carry internals (those are logged instead), and 429/503
//! always carry `Retry-After`. Every `code` the origin answers is in
//! [`ERROR_CODES`], which the OpenAPI document publishes as an enum (a debug
//! build checks each answer against it, so a new code cannot be missed).

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use token::TokenError;

/// Every error `code` the origin's API can answer, for the OpenAPI document
/// (`crate::http::openapi`). The token codes are `token::TokenError::code()`'s,
/// the signature codes `crate::payments::webhook::SignatureError::code()`'s.
pub const ERROR_CODES: &[&str] = &[
    "admission_revoked",
    "amount_mismatch",
    "body_too_large",
    "database_unavailable",
    "forbidden",
    "idempotency_key_invalid",
    "idempotency_key_missing",
    "idempotency_key_reused",
    "internal",
    "invalid_body",
    "invalid_outcome",
    "invalid_qty",
    "malformed_body",
    "malformed_event",
    "malformed_json",
    "not_found",
    "not_ready",
    "not_replicated",
    "overloaded",
    "payment_not_found",
    "per_user_limit",
    "redis_unavailable",
    "reservation_expired",
    "reservation_not_found",
    "reservation_not_held",
    "reservation_not_payable",
    "reservation_released",
    "reservation_settling",
    "sale_ended",
    "sale_not_found",
    "sale_not_started",
    "sale_unavailable",
    "signature_malformed",
    "signature_mismatch",
    "signature_missing",
    "signature_stale",
    "sku_per_user_limit",
    "sku_required",
    "sku_sold_out",
    "sold_out",
    "summary_unavailable",
    "token_alg_refused",
    "token_bad_signature",
    "token_bad_subject",
    "token_expired",
    "token_malformed",
    "token_missing",
    "token_not_yet_valid",
    "token_unknown_kid",
    "token_wrong_sale",
    "token_wrong_type",
    "unknown_event_type",
    "unknown_payment",
    "unknown_sku",
    "webhook_not_configured",
];

/// How many times this process answered each code of [`ERROR_CODES`]
/// (same index), for the admin API's live view.
static ANSWERED: [std::sync::atomic::AtomicU64; ERROR_CODES.len()] =
    [const { std::sync::atomic::AtomicU64::new(0) }; ERROR_CODES.len()];

/// Every error code this process has answered, with how many times (codes
/// never answered are left out).
pub fn answered() -> Vec<(&'static str, u64)> {
    ERROR_CODES
        .iter()
        .zip(ANSWERED.iter())
        .map(|(c, n)| (*c, n.load(std::sync::atomic::Ordering::Relaxed)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// An error answer of the API: its status, `code` and message.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("an Authorization: Bearer token is required")]
    TokenMissing,
    #[error("{0}")]
    Token(TokenError),
    #[error("{message}")]
    Unauthorized { code: &'static str, message: String },
    #[error("{0}")]
    Forbidden(&'static str),
    #[error("this account's admission to the sale was ended by the shop; no new hold")]
    Revoked,
    #[error("{message}")]
    NotFound { code: &'static str, message: String },
    #[error("{message}")]
    BadRequest { code: &'static str, message: String },
    #[error("{message}")]
    Unprocessable { code: &'static str, message: String },
    #[error("{message}")]
    Conflict { code: &'static str, message: String },
    #[error("the sale is sold out")]
    SoldOut,
    #[error("{message}")]
    Gone { code: &'static str, message: String },
    #[error("the request body is over {limit} bytes")]
    BodyTooLarge { limit: usize },
    #[error("too many requests; retry shortly")]
    Shed,
    #[error("{message}")]
    Unavailable {
        code: &'static str,
        message: String,
        retry_after: u32,
    },
    #[error("internal error")]
    Internal(#[from] anyhow::Error),
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::TokenMissing => StatusCode::UNAUTHORIZED,
            ApiError::Token(TokenError::WrongSale) => StatusCode::FORBIDDEN,
            ApiError::Token(_) | ApiError::Unauthorized { .. } => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) | ApiError::Revoked => StatusCode::FORBIDDEN,
            ApiError::NotFound { .. } => StatusCode::NOT_FOUND,
            ApiError::BadRequest { .. } => StatusCode::BAD_REQUEST,
            ApiError::Unprocessable { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::Conflict { .. } => StatusCode::CONFLICT,
            ApiError::SoldOut | ApiError::Gone { .. } => StatusCode::GONE,
            ApiError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Shed => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            ApiError::TokenMissing => "token_missing",
            ApiError::Token(e) => e.code(),
            ApiError::Forbidden(_) => "forbidden",
            ApiError::Revoked => "admission_revoked",
            ApiError::Unauthorized { code, .. }
            | ApiError::NotFound { code, .. }
            | ApiError::BadRequest { code, .. }
            | ApiError::Unprocessable { code, .. }
            | ApiError::Conflict { code, .. }
            | ApiError::Gone { code, .. }
            | ApiError::Unavailable { code, .. } => code,
            ApiError::SoldOut => "sold_out",
            ApiError::BodyTooLarge { .. } => "body_too_large",
            ApiError::Shed => "overloaded",
            ApiError::Internal(_) => "internal",
        }
    }

    pub fn not_found(code: &'static str, message: impl Into<String>) -> Self {
        ApiError::NotFound {
            code,
            message: message.into(),
        }
    }
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        ApiError::BadRequest {
            code,
            message: message.into(),
        }
    }
    pub fn unprocessable(code: &'static str, message: impl Into<String>) -> Self {
        ApiError::Unprocessable {
            code,
            message: message.into(),
        }
    }
    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        ApiError::Conflict {
            code,
            message: message.into(),
        }
    }
    /// 503 `sale_unavailable`: a shard's keys are gone (Redis lost data)
    /// until the reconciler rebuilds it; nothing can be said about its
    /// holds or stock meanwhile.
    pub fn sale_unavailable() -> Self {
        ApiError::Unavailable {
            code: "sale_unavailable",
            message: "the sale's stock is being restored; retry shortly".into(),
            retry_after: 5,
        }
    }
    pub fn unavailable(code: &'static str, message: impl Into<String>) -> Self {
        ApiError::Unavailable {
            code,
            message: message.into(),
            retry_after: 1,
        }
    }
}

impl From<TokenError> for ApiError {
    fn from(e: TokenError) -> Self {
        ApiError::Token(e)
    }
}

impl From<redis::RedisError> for ApiError {
    fn from(e: redis::RedisError) -> Self {
        tracing::warn!(error = %e, "redis call failed");
        ApiError::unavailable(
            "redis_unavailable",
            "the reservation service is briefly unavailable",
        )
    }
}

impl From<crate::reserve::ack::AckError> for ApiError {
    fn from(e: crate::reserve::ack::AckError) -> Self {
        tracing::warn!(error = %e, "write not acknowledged (REDIS_ACK=wait)");
        ApiError::unavailable(
            "not_replicated",
            "the change is not yet safe on a replica; retry (with the same Idempotency-Key)",
        )
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> Self {
        match e {
            sqlx::Error::PoolTimedOut | sqlx::Error::Io(_) | sqlx::Error::PoolClosed => {
                tracing::warn!(error = %e, "postgres unavailable");
                ApiError::unavailable("database_unavailable", "the service is briefly unavailable")
            }
            other => ApiError::Internal(other.into()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        debug_assert!(
            ERROR_CODES.contains(&self.code()),
            "error code {:?} is missing from ERROR_CODES (and so from the OpenAPI document)",
            self.code()
        );
        if let Ok(i) = ERROR_CODES.binary_search(&self.code()) {
            ANSWERED[i].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let message = match &self {
            ApiError::Internal(e) => {
                tracing::error!(error = ?e, "internal error");
                "internal error".to_string()
            }
            other => other.to_string(),
        };
        let body = json!({"error": {"code": self.code(), "message": message}});
        let mut res = (status, Json(body)).into_response();
        let retry = match &self {
            ApiError::Shed => Some(1),
            ApiError::Unavailable { retry_after, .. } => Some(*retry_after),
            _ => None,
        };
        if let Some(secs) = retry {
            res.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        res
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_token_and_signature_code_is_listed() {
        use crate::payments::webhook::SignatureError as S;
        use token::TokenError as T;
        let token = [
            T::Malformed,
            T::UnknownKid,
            T::BadSignature,
            T::WrongType,
            T::WrongSale,
            T::Expired,
            T::NotYetValid,
            T::AlgRefused,
            T::BadSubject,
        ];
        let signature = [S::Missing, S::Malformed, S::Stale, S::Mismatch];
        for code in token
            .iter()
            .map(|t| t.code())
            .chain(signature.iter().map(|s| s.code()))
        {
            assert!(ERROR_CODES.contains(&code), "{code}");
        }
        assert!(
            ERROR_CODES.is_sorted(),
            "kept sorted, so a reader finds a code"
        );
    }
}
