//! Routing: a method and a path to a [`Route`], and the small parsing
//! helpers of requests (ids, bearer tokens, held Idempotency-Key names).
//!
//! Invariants kept here:
//! - routing never panics, whatever the path (ids are checked, bounded and
//!   restricted to `[A-Za-z0-9_-]`, so they can be put in a URL or a Durable
//!   Object name as they are);
//! - a held key's name depends on (sale, account, key) alone and no two
//!   triples share one.

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
    /// `POST /api/sales/{sale}/revoke` (admin write key): end a person's admission.
    Revoke(String),
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
        ["api", "sales", s, "revoke"] => want("POST", id(s, Route::Revoke)),
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
        assert_eq!(
            route("POST", "/api/sales/d-1/revoke"),
            Route::Revoke("d-1".into())
        );
        assert_eq!(
            route("GET", "/api/sales/d-1/revoke"),
            Route::MethodNotAllowed
        );
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
}
