//! Request tracing at the edge: which `x-request-id` a forwarded request
//! carries to the origin (and back to the browser), and the one console line
//! logged per forwarded request.
//!
//! Invariants: the id is always sane (1-128 characters of `A-Z a-z 0-9 - _ .
//! :`), so a hostile header can neither forge log lines nor bloat them; an
//! incoming id is kept when sane, else Cloudflare's `cf-ray`, else a fresh
//! one, so edge and origin logs of one request join on one id.

/// Longest request id passed on (the origin logs at most this many too).
pub const MAX_REQUEST_ID: usize = 128;

/// Whether a caller's request id can be passed on as it is.
pub fn sane_request_id(id: &str) -> bool {
    (1..=MAX_REQUEST_ID).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
}

/// The request id of a forwarded request: the incoming `x-request-id` if
/// sane, else `cf-ray` if sane, else `fresh()`.
pub fn request_id(
    incoming: Option<&str>,
    cf_ray: Option<&str>,
    fresh: impl FnOnce() -> String,
) -> String {
    [incoming, cf_ray]
        .into_iter()
        .flatten()
        .find(|id| sane_request_id(id))
        .map_or_else(fresh, str::to_string)
}

/// The console line of one forwarded request.
pub fn access_line(method: &str, path: &str, status: u16, latency_ms: u64, id: &str) -> String {
    format!("edge {method} {path} {status} {latency_ms}ms request_id={id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh() -> String {
        "made-here".to_string()
    }

    #[test]
    fn a_sane_incoming_id_is_kept() {
        assert_eq!(request_id(Some("abc-123"), Some("ray-1"), fresh), "abc-123");
        let uuid = "3f1c2a3b-4c5d-4e7f-8a9b-0c1d2e3f4a5b";
        assert_eq!(request_id(Some(uuid), None, fresh), uuid);
    }

    #[test]
    fn cf_ray_stands_in_for_a_missing_or_insane_id() {
        let ray = "8f1c2a3b4c5d6e7f-FRA";
        assert_eq!(request_id(None, Some(ray), fresh), ray);
        assert_eq!(request_id(Some(""), Some(ray), fresh), ray);
        assert_eq!(request_id(Some("a b"), Some(ray), fresh), ray);
        assert_eq!(request_id(Some("x\nINFO forged"), Some(ray), fresh), ray);
    }

    #[test]
    fn an_id_is_made_when_nothing_sane_came() {
        assert_eq!(request_id(None, None, fresh), "made-here");
        let long = "a".repeat(MAX_REQUEST_ID + 1);
        assert_eq!(request_id(Some(&long), Some("ray\"x"), fresh), "made-here");
        assert!(sane_request_id(&"a".repeat(MAX_REQUEST_ID)));
        assert!(!sane_request_id("é"));
    }

    #[test]
    fn the_access_line_names_method_path_status_latency_and_id() {
        assert_eq!(
            access_line("POST", "/api/sales/s1/reservations", 202, 7, "rid-1"),
            "edge POST /api/sales/s1/reservations 202 7ms request_id=rid-1"
        );
    }
}
