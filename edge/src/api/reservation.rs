//! What the edge reads of the origin's reservation answers (pure,
//! host-tested): which hold a `202` granted and until when, and which hold
//! a cancel gave back. The Worker passes the answers on untouched; these
//! readings only tell the person's queue shard how long their turn is
//! protected (`admission::turns`, issue 44 #2: a hold protected it
//! forever).
//!
//! Invariants kept here:
//! - an answer that cannot be read says nothing: no id, no hold;
//! - a readable `202` without a readable `expires_at` is still a hold (it
//!   exists), its end left to the reader's bound
//!   (`admission::turns::hold_end`), never "forever".

use serde::Deserialize;

/// A hold the origin granted (`202` of `POST …/reservations`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Granted {
    pub reservation_id: String,
    /// `expires_at` in unix ms, when readable.
    pub expires_at_ms: Option<u64>,
}

/// A hold the origin cancelled (`2xx` of `DELETE /api/reservations/{id}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cancelled {
    pub sale: String,
    pub reservation_id: String,
}

#[derive(Deserialize)]
struct Answer {
    reservation_id: String,
    #[serde(default)]
    sale: Option<String>,
    #[serde(default)]
    expires_at: Option<String>,
    #[serde(default)]
    status: Option<String>,
}

/// The hold a `202` answer body granted; times read by `parse_time`
/// (RFC 3339 to unix ms: `Date.parse` in the Worker).
pub fn granted(body: &[u8], parse_time: impl Fn(&str) -> Option<u64>) -> Option<Granted> {
    let a: Answer = serde_json::from_slice(body).ok()?;
    if a.reservation_id.is_empty() {
        return None;
    }
    Some(Granted {
        expires_at_ms: a.expires_at.as_deref().and_then(parse_time),
        reservation_id: a.reservation_id,
    })
}

/// The hold a cancel's answer body gave back (`status: "cancelled"`, with
/// its sale: the route names no sale, and a user token none either).
pub fn cancelled(body: &[u8]) -> Option<Cancelled> {
    let a: Answer = serde_json::from_slice(body).ok()?;
    let sale = a.sale.filter(|s| !s.is_empty())?;
    (a.status.as_deref() == Some("cancelled") && !a.reservation_id.is_empty()).then_some(
        Cancelled {
            sale,
            reservation_id: a.reservation_id,
        },
    )
}

/// The command header an origin answer may carry (a shop's own server
/// between the edge and the origin sets it, as Cloudflare's waiting room
/// reads `Cf-Waiting-Room-Command`): `revoke` ends the caller's admission.
/// Never passed on to the browser.
pub const COMMAND_HEADER: &str = "flashsale-command";

/// Whether an answer's command header asks to end the caller's admission.
pub fn says_revoke(command: Option<&str>) -> bool {
    command.is_some_and(|c| c.trim().eq_ignore_ascii_case("revoke"))
}

/// The sale a reservation answer names (`"sale"`), if any.
pub fn sale_of(body: &[u8]) -> Option<String> {
    let a: Answer = serde_json::from_slice(body).ok()?;
    a.sale.filter(|s| !s.is_empty())
}

/// The SKU a reservation request names (`{"sku": "<id>", …}`), if it names
/// one that could be a SKU id (a slug like a sale id: `[a-z0-9][a-z0-9_-]`,
/// at most 64 bytes). What the origin does with the body is the origin's
/// business; the edge reads only this, to answer a SKU it knows is sold out
/// (`http::sold_out`), and passes the body on untouched.
pub fn named_sku(body: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Ask {
        #[serde(default)]
        sku: Option<serde_json::Value>,
    }
    let id = serde_json::from_slice::<Ask>(body).ok()?.sku?;
    let id = id.as_str()?;
    let first = id.bytes().next()?;
    (id.len() <= 64
        && (first.is_ascii_lowercase() || first.is_ascii_digit())
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-'))
    .then(|| id.to_string())
}

#[cfg(test)]
mod tests {

    #[test]
    fn only_a_revoke_command_is_obeyed_and_the_answer_names_its_sale() {
        for yes in ["revoke", " Revoke ", "REVOKE"] {
            assert!(says_revoke(Some(yes)), "{yes}");
        }
        for no in [
            None,
            Some(""),
            Some("revoked"),
            Some("revoke,now"),
            Some("pause"),
        ] {
            assert!(!says_revoke(no), "{no:?}");
        }
        let body = br#"{"reservation_id": "r1", "sale": "drop-1", "status": "paid"}"#;
        assert_eq!(sale_of(body).as_deref(), Some("drop-1"));
        assert_eq!(sale_of(br#"{"reservation_id": "r1", "sale": ""}"#), None);
        assert_eq!(sale_of(b"not json"), None);
    }

    use super::*;

    fn parse(t: &str) -> Option<u64> {
        t.parse().ok()
    }

    #[test]
    fn a_grant_is_read_with_its_expiry_and_without_one() {
        let g = granted(
            br#"{"reservation_id":"s.0.u","sale":"s","qty":1,"status":"held","expires_at":"1234"}"#,
            parse,
        );
        assert_eq!(
            g,
            Some(Granted {
                reservation_id: "s.0.u".into(),
                expires_at_ms: Some(1234),
            })
        );
        let g = granted(br#"{"reservation_id":"s.0.u","expires_at":"soon"}"#, parse).unwrap();
        assert_eq!(g.expires_at_ms, None, "a hold whose end is unreadable");
        for junk in [
            &b""[..],
            b"{}",
            b"null",
            b"{\"reservation_id\":\"\"}",
            b"\xff",
        ] {
            assert_eq!(granted(junk, parse), None);
        }
    }

    #[test]
    fn a_cancel_is_read_with_its_sale() {
        let c = cancelled(br#"{"reservation_id":"s.0.u","sale":"s","qty":1,"status":"cancelled"}"#);
        assert_eq!(
            c,
            Some(Cancelled {
                sale: "s".into(),
                reservation_id: "s.0.u".into(),
            })
        );
        for other in [
            &br#"{"reservation_id":"s.0.u","sale":"s","status":"held"}"#[..],
            br#"{"reservation_id":"s.0.u","status":"cancelled"}"#,
            br#"{"reservation_id":"","sale":"s","status":"cancelled"}"#,
            b"{\"error\":{\"code\":\"x\"}}",
            b"",
        ] {
            assert_eq!(cancelled(other), None);
        }
    }

    #[test]
    fn a_request_names_its_sku_only_when_it_is_a_sku_id() {
        assert_eq!(
            named_sku(br#"{"sku":"size-42","qty":1}"#),
            Some("size-42".into())
        );
        for body in [
            &br#"{"qty":1}"#[..],
            br#"{"sku":7,"qty":1}"#,
            br#"{"sku":"Size-42"}"#,
            br#"{"sku":""}"#,
            br#"{"sku":"a/b"}"#,
            br#"not json"#,
            b"",
        ] {
            assert_eq!(named_sku(body), None, "{}", String::from_utf8_lossy(body));
        }
        let long = format!(r#"{{"sku":"{}"}}"#, "a".repeat(65));
        assert_eq!(named_sku(long.as_bytes()), None);
    }
}
