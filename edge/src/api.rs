//! The edge's public API surface, without the runtime: routing and errors.
//!
//! Role: turn a method and a path into a [`Route`] and every failure into
//! the documented body `{"error":{"code","message"}}` with its status.
//!
//! Invariants kept here:
//! - routing never panics, whatever the path (ids are checked, bounded and
//!   restricted to `[A-Za-z0-9_-]`, so they can be put in a URL or a Durable
//!   Object name as they are);
//! - every error body has the same shape, and token errors keep the distinct
//!   code of `token::TokenError::code()`.

use serde_json::json;

/// Longest sale or reservation id accepted.
pub const MAX_ID_LEN: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    Health,
    /// Plain-text baseline for benchmarks.
    Ping,
    Summary(String),
    Join(String),
    Status(String),
    /// A proof-of-work challenge for a join (`GET …/challenge`).
    Challenge(String),
    Draw(String),
    /// The holder's draw receipt (`GET …/queue/receipt`, ticket auth).
    Receipt(String),
    /// Admission figures of a sale as Prometheus text (for a scraper).
    Metrics(String),
    Reserve(String),
    ReservationGet(String),
    ReservationCancel(String),
    ReservationPurchase(String),
    /// The queue page for a sale (HTML from the static assets).
    Page(String),
    /// Dev mode only: mint a `user` token for a typed name.
    DevToken,
    /// Dev mode only: complete a payment with the origin's dev provider.
    DevPayment(String),
    /// Dev mode only: bulk-load synthetic pre-queue entrants into a sale.
    DevBulk(String),
    /// Dev mode only: forget the isolate's memory caches (a test plays a
    /// fresh isolate to see what the Cache API shares between isolates).
    DevForget,
    MethodNotAllowed,
    NotFound,
}

/// A valid id: 1-64 of `[A-Za-z0-9_-]`.
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Longest reservation id accepted (`<sale>.<shard>.<uuid>` at the origin).
pub const MAX_RESERVATION_ID_LEN: usize = 160;

/// A valid reservation id: `[A-Za-z0-9_.-]`, not starting with a dot and
/// without `..`, so it stays one path segment when forwarded.
pub fn valid_reservation_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_RESERVATION_ID_LEN
        && !id.starts_with('.')
        && !id.contains("..")
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

/// Routes a request. `path` is the URL path (no query).
pub fn route(method: &str, path: &str) -> Route {
    let segs: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
    let id = |s: &str, r: fn(String) -> Route| {
        if valid_id(s) {
            r(s.to_string())
        } else {
            Route::NotFound
        }
    };
    let rid = |s: &str, r: fn(String) -> Route| {
        if valid_reservation_id(s) {
            r(s.to_string())
        } else {
            Route::NotFound
        }
    };
    let want = |m: &str, r: Route| {
        if r == Route::NotFound || method == m || (m == "GET" && method == "HEAD") {
            r
        } else {
            Route::MethodNotAllowed
        }
    };
    match segs.as_slice() {
        ["api", "health"] => want("GET", Route::Health),
        ["api", "ping"] => want("GET", Route::Ping),
        ["api", "sales", s] => want("GET", id(s, Route::Summary)),
        ["api", "sales", s, "queue"] => match method {
            "POST" => id(s, Route::Join),
            "GET" | "HEAD" => id(s, Route::Status),
            _ => Route::MethodNotAllowed,
        },
        ["api", "sales", s, "draw"] => want("GET", id(s, Route::Draw)),
        ["api", "sales", s, "queue", "receipt"] => want("GET", id(s, Route::Receipt)),
        ["api", "sales", s, "metrics"] => want("GET", id(s, Route::Metrics)),
        ["api", "sales", s, "challenge"] => want("GET", id(s, Route::Challenge)),
        ["api", "sales", s, "reservations"] => want("POST", id(s, Route::Reserve)),
        ["api", "reservations", r] => match method {
            "GET" | "HEAD" => rid(r, Route::ReservationGet),
            "DELETE" => rid(r, Route::ReservationCancel),
            _ => Route::MethodNotAllowed,
        },
        ["api", "reservations", r, "purchase"] => want("POST", rid(r, Route::ReservationPurchase)),
        ["sales", s] => want("GET", id(s, Route::Page)),
        ["api", "dev", "token"] => want("POST", Route::DevToken),
        ["api", "dev", "payments", p, "complete"] => want("POST", rid(p, Route::DevPayment)),
        ["api", "dev", "sales", s, "bulk"] => want("POST", id(s, Route::DevBulk)),
        ["api", "dev", "isolate", "forget"] => want("POST", Route::DevForget),
        _ => Route::NotFound,
    }
}

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

    pub fn sold_out() -> Self {
        Self::new(410, "sold_out", "the sale is sold out")
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

/// The name under which the edge remembers that `account` was granted a
/// hold of `sale` for Idempotency-Key `key` (an origin `202` it passed on).
///
/// Once the edge knows a sale is sold out it answers reservations itself
/// (DESIGN invariant 7), but a replayed key is not a new attempt: it must get
/// its first answer (DESIGN, Idempotency). A buyer whose `202` was lost on
/// the way retries with the same key, and a `410` would send them away from
/// a unit they hold. A remembered key therefore still reaches the origin,
/// which answers the replay. `None` without a key (the origin refuses such a
/// request anyway). The name is a hash: the key is the client's text, and
/// the name goes into a cache URL; the parts are length-prefixed so no two
/// (sale, account, key) triples share a name.
pub fn held_key_name(sale: &str, account: &str, key: Option<&str>) -> Option<String> {
    use sha2::{Digest, Sha256};
    let key = key.filter(|k| !k.is_empty())?;
    let mut h = Sha256::new();
    for part in [sale, account, key] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    Some(hex::encode(h.finalize()))
}

/// The bearer token of an `Authorization` header value, if any.
pub fn bearer(header: Option<&str>) -> Option<&str> {
    let h = header?.trim();
    let (scheme, rest) = h.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let t = rest.trim();
    (!t.is_empty()).then_some(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(route("GET", "/api/health"), Route::Health);
        assert_eq!(
            route("GET", "/api/sales/drop-1"),
            Route::Summary("drop-1".into())
        );
        assert_eq!(
            route("POST", "/api/sales/drop-1/queue"),
            Route::Join("drop-1".into())
        );
        assert_eq!(
            route("GET", "/api/sales/drop-1/queue"),
            Route::Status("drop-1".into())
        );
        assert_eq!(
            route("GET", "/api/sales/drop-1/queue/receipt"),
            Route::Receipt("drop-1".into())
        );
        assert_eq!(
            route("POST", "/api/sales/drop-1/queue/receipt"),
            Route::MethodNotAllowed
        );
        assert_eq!(
            route("POST", "/api/sales/d/reservations"),
            Route::Reserve("d".into())
        );
        assert_eq!(
            route("DELETE", "/api/reservations/r1"),
            Route::ReservationCancel("r1".into())
        );
        assert_eq!(
            route("POST", "/api/reservations/r1/purchase"),
            Route::ReservationPurchase("r1".into())
        );
        assert_eq!(route("GET", "/sales/drop-1"), Route::Page("drop-1".into()));
        assert_eq!(
            route("GET", "/api/sales/drop-1/challenge"),
            Route::Challenge("drop-1".into())
        );
        assert_eq!(
            route("POST", "/api/sales/drop-1/challenge"),
            Route::MethodNotAllowed
        );
        assert_eq!(route("GET", "/api/sales/a.b/challenge"), Route::NotFound);
        let id = "drop-1.0.0190f0a1b2c34d5e6f708192a3b4c5d6";
        assert_eq!(
            route("GET", &format!("/api/reservations/{id}")),
            Route::ReservationGet(id.into())
        );
        assert_eq!(route("POST", "/api/dev/token"), Route::DevToken);
        assert_eq!(
            route("POST", "/api/dev/sales/d-1/bulk"),
            Route::DevBulk("d-1".into())
        );
        assert_eq!(route("POST", "/api/dev/sales/a.b/bulk"), Route::NotFound);
        assert_eq!(route("POST", "/api/dev/isolate/forget"), Route::DevForget);
        assert_eq!(
            route("GET", "/api/dev/isolate/forget"),
            Route::MethodNotAllowed
        );
        assert_eq!(
            route("POST", &format!("/api/dev/payments/{id}/complete")),
            Route::DevPayment(id.into())
        );
        assert_eq!(
            route("GET", "/api/sales/d-1/metrics"),
            Route::Metrics("d-1".into())
        );
        assert_eq!(
            route("POST", "/api/sales/d-1/metrics"),
            Route::MethodNotAllowed
        );
        assert_eq!(route("GET", "/api/sales/a.b/metrics"), Route::NotFound);
        assert_eq!(route("PUT", "/api/sales/d/queue"), Route::MethodNotAllowed);
        assert_eq!(
            route("GET", "/api/sales/d/reservations"),
            Route::MethodNotAllowed
        );
    }

    #[test]
    fn hostile_paths_are_not_found() {
        for p in [
            "",
            "/",
            "/api",
            "/api/sales/",
            "/api/sales/a%2Fb",
            "/api/sales/../x",
            "/api/sales/ä",
            "/api/sales/a b/queue",
            &format!("/api/sales/{}", "x".repeat(65)),
            "//////",
            "/api/reservations//purchase",
            "/api/reservations/..",
            "/api/reservations/.hidden",
            "/api/reservations/a..b/purchase",
        ] {
            assert_eq!(route("GET", p), Route::NotFound, "{p:?}");
        }
    }

    #[test]
    fn bearer_parsing() {
        assert_eq!(bearer(Some("Bearer abc")), Some("abc"));
        assert_eq!(bearer(Some("bearer   abc ")), Some("abc"));
        assert_eq!(bearer(Some("Basic abc")), None);
        assert_eq!(bearer(Some("Bearer ")), None);
        assert_eq!(bearer(None), None);
    }

    #[test]
    fn a_held_key_is_named_by_sale_account_and_key_alone() {
        let n = held_key_name("s", "acct", Some("k1")).unwrap();
        assert_eq!(n.len(), 64);
        assert!(n.bytes().all(|b| b.is_ascii_hexdigit()), "URL-safe: {n}");
        assert_eq!(held_key_name("s", "acct", Some("k1")).as_ref(), Some(&n));
        // Another sale, account or key is another name; so is a shift of
        // text between the parts.
        for other in [
            held_key_name("t", "acct", Some("k1")),
            held_key_name("s", "acct2", Some("k1")),
            held_key_name("s", "acct", Some("k2")),
            held_key_name("sa", "cct", Some("k1")),
            held_key_name("s", "acctk", Some("1")),
        ] {
            assert_ne!(other.as_ref(), Some(&n));
        }
        assert_eq!(held_key_name("s", "acct", None), None);
        assert_eq!(held_key_name("s", "acct", Some("")), None);
    }

    #[test]
    fn only_a_sold_out_410_means_sold_out() {
        let body = |code: &str| json!({"error": {"code": code, "message": "m"}}).to_string();
        assert!(gone_means_sold_out(body("sold_out").as_bytes()));
        for code in ["sale_ended", "reservation_released", "SOLD_OUT", ""] {
            assert!(!gone_means_sold_out(body(code).as_bytes()), "{code}");
        }
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
