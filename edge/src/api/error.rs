//! Errors as the API answers them: a status, a stable code and a message,
//! in the documented body `{"error":{"code","message"}}`.
//!
//! Invariants kept here: every error body has the same shape, and token
//! errors keep the distinct code of `token::TokenError::code()`.

use serde_json::json;

/// What every fallible edge operation returns: an answer or the API error
/// it turns into.
pub type ApiResult<T> = std::result::Result<T, ApiError>;

/// An API error: HTTP status, stable code, human message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: u16,
    pub code: String,
    pub message: String,
    /// Seconds, for 429/503.
    pub retry_after: Option<u32>,
}

impl ApiError {
    pub fn new(status: u16, code: &str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code: code.to_string(),
            message: message.into(),
            retry_after: None,
        }
    }

    pub fn retry_after(mut self, secs: u32) -> Self {
        self.retry_after = Some(secs);
        self
    }

    pub fn body(&self) -> String {
        json!({"error": {"code": self.code, "message": self.message}}).to_string()
    }

    pub fn not_found() -> Self {
        Self::new(404, "not_found", "no such route")
    }

    pub fn method_not_allowed() -> Self {
        Self::new(
            405,
            "method_not_allowed",
            "method not allowed on this route",
        )
    }

    pub fn sale_not_found(sale: &str) -> Self {
        Self::new(
            404,
            "sale_not_found",
            format!("sale {sale:?} does not exist"),
        )
    }

    pub fn token_missing() -> Self {
        Self::new(
            401,
            "token_missing",
            "an Authorization: Bearer token is required",
        )
    }

    /// An operator route (the sale's metrics) without a configured admin
    /// key: missing, not a bearer, or no such key — one answer for all, so
    /// a caller learns nothing about which.
    pub fn admin_key_required() -> Self {
        Self::new(
            401,
            "admin_key_required",
            "an Authorization: Bearer <admin key> (ADMIN_KEYS) is required",
        )
    }

    pub fn sold_out() -> Self {
        Self::new(410, "sold_out", "the sale is sold out")
    }

    /// One SKU of a sale of several is sold out (the edge's own answer
    /// after the origin said so: `http::sold_out`).
    pub fn sku_sold_out(sku: &str) -> Self {
        Self::new(
            410,
            "sku_sold_out",
            format!("{sku} is sold out; the sale's other SKUs may not be"),
        )
    }

    pub fn origin_unavailable() -> Self {
        Self::new(
            503,
            "origin_unavailable",
            "the shop is busy, try again shortly",
        )
        .retry_after(2)
    }

    /// A refused token: 403 for a token of another sale, 401 otherwise.
    pub fn token(e: token::TokenError) -> Self {
        let status = if e == token::TokenError::WrongSale {
            403
        } else {
            401
        };
        Self::new(status, e.code(), e.to_string())
    }
}

/// Whether an origin `410` answer (its JSON body) says the sale is sold out.
/// Only `sold_out` may set the edge's sold-out flag: the origin also answers
/// 410 for `sale_ended` and `reservation_released` (a replayed key whose hold
/// is gone), and neither says anything about the stock; an unreadable body
/// says nothing either.
pub fn gone_means_sold_out(body: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .is_some_and(|v| v["error"]["code"].as_str() == Some("sold_out"))
}

/// Whether an origin `410`'s body is `sku_sold_out`: that SKU only, the
/// sale goes on (never the sale's flag).
pub fn gone_means_sku_sold_out(body: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .is_some_and(|v| v["error"]["code"].as_str() == Some("sku_sold_out"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_sold_out_410_means_sold_out() {
        let body = |code: &str| json!({"error": {"code": code, "message": "m"}}).to_string();
        assert!(gone_means_sold_out(body("sold_out").as_bytes()));
        for code in [
            "sale_ended",
            "reservation_released",
            "SOLD_OUT",
            "",
            "sku_sold_out",
        ] {
            assert!(!gone_means_sold_out(body(code).as_bytes()), "{code}");
        }
        // A SKU's sell-out is that SKU's only.
        assert!(gone_means_sku_sold_out(body("sku_sold_out").as_bytes()));
        assert!(!gone_means_sku_sold_out(body("sold_out").as_bytes()));
        assert!(!gone_means_sku_sold_out(b"sku_sold_out"));
        for junk in [
            &b""[..],
            b"sold_out",
            b"{\"code\":\"sold_out\"}",
            b"\xff\xfe",
            b"null",
        ] {
            assert!(!gone_means_sold_out(junk));
        }
    }

    #[test]
    fn error_bodies_have_one_shape() {
        let e = ApiError::token(token::TokenError::WrongSale);
        assert_eq!(e.status, 403);
        let v: serde_json::Value = serde_json::from_str(&e.body()).unwrap();
        assert_eq!(v["error"]["code"], "token_wrong_sale");
        assert!(v["error"]["message"].is_string());
        assert_eq!(ApiError::token(token::TokenError::Expired).status, 401);
    }
}
