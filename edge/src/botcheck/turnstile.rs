//! Cloudflare Turnstile as a join's bot check (pure, host-tested): the
//! siteverify request the Worker sends, how its answer is read, and the
//! page's CSP for a Turnstile sale.
//!
//! Invariants kept here: a token already used or expired at Cloudflare is
//! `challenge_reused`; a siteverify that cannot be read says nothing (the
//! Worker answers 503, never lets the join through); the CSP adds the
//! widget's origin to `script-src` and `frame-src` only.

use serde_json::Value;

use crate::botcheck::join::{Proof, Refusal};

/// Cloudflare's Turnstile verification endpoint (production's
/// `TURNSTILE_SITEVERIFY_URL`; tests point it at a local stand-in).
pub const TURNSTILE_SITEVERIFY: &str = "https://challenges.cloudflare.com/turnstile/v0/siteverify";
/// Longest Turnstile token sent on (Cloudflare's are up to 2,048 chars).
pub const MAX_TURNSTILE_LEN: usize = 2048;

/// Where Cloudflare serves the Turnstile widget (script and frame).
pub const TURNSTILE_ORIGIN: &str = "https://challenges.cloudflare.com";

/// The page's CSP for a Turnstile sale: the strict one with the widget's
/// origin added to `script-src` and `frame-src` (and nothing else).
pub fn turnstile_csp(csp: &str) -> String {
    let mut parts: Vec<String> = csp
        .split(';')
        .map(|d| d.trim().to_string())
        .filter(|d| !d.is_empty())
        .collect();
    for name in ["script-src", "frame-src"] {
        match parts
            .iter_mut()
            .find(|d| d.split_whitespace().next() == Some(name))
        {
            Some(d) => {
                d.push(' ');
                d.push_str(TURNSTILE_ORIGIN);
            }
            None => parts.push(format!("{name} {TURNSTILE_ORIGIN}")),
        }
    }
    parts.join("; ")
}

fn form_encode(out: &mut String, text: &str) {
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
}

/// The siteverify request body (`application/x-www-form-urlencoded`) for a
/// join's Turnstile token, or the refusal when it brought none usable.
pub fn siteverify_form(secret: &str, proof: &Proof, addr: Option<&str>) -> Result<String, Refusal> {
    let token = proof
        .turnstile
        .as_deref()
        .filter(|t| !t.is_empty())
        .ok_or(Refusal::Required)?;
    if token.len() > MAX_TURNSTILE_LEN {
        return Err(Refusal::Failed);
    }
    let mut out = String::from("secret=");
    form_encode(&mut out, secret);
    out.push_str("&response=");
    form_encode(&mut out, token);
    if let Some(ip) = addr.filter(|a| !a.is_empty()) {
        out.push_str("&remoteip=");
        form_encode(&mut out, ip);
    }
    Ok(out)
}

/// Reads siteverify's answer: `Ok(())` on `"success": true`; a token
/// already used or expired (`timeout-or-duplicate`) is `challenge_reused`,
/// anything else `bot_check_failed`; `Err(None)` when the answer is not
/// siteverify's JSON (the caller answers 503).
pub fn read_siteverify(body: &[u8]) -> Result<(), Option<Refusal>> {
    let v: Value = serde_json::from_slice(body).map_err(|_| None)?;
    match v.get("success").and_then(Value::as_bool) {
        Some(true) => Ok(()),
        Some(false) => {
            let dup = v
                .get("error-codes")
                .and_then(Value::as_array)
                .is_some_and(|c| c.iter().any(|x| x.as_str() == Some("timeout-or-duplicate")));
            Err(Some(if dup {
                Refusal::Reused
            } else {
                Refusal::Failed
            }))
        }
        None => Err(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turnstile_forms_are_encoded_and_answers_read() {
        let p = Proof {
            turnstile: Some("0.a+b/c=&x".into()),
            ..Proof::default()
        };
        assert_eq!(
            siteverify_form("s3cr&t", &p, Some("2001:db8::1")).unwrap(),
            "secret=s3cr%26t&response=0.a%2Bb%2Fc%3D%26x&remoteip=2001%3Adb8%3A%3A1"
        );
        assert_eq!(
            siteverify_form("s", &p, None).unwrap(),
            "secret=s&response=0.a%2Bb%2Fc%3D%26x"
        );
        assert_eq!(
            siteverify_form("s", &Proof::default(), None),
            Err(Refusal::Required)
        );
        let empty = Proof {
            turnstile: Some(String::new()),
            ..Proof::default()
        };
        assert_eq!(siteverify_form("s", &empty, None), Err(Refusal::Required));
        let long = Proof {
            turnstile: Some("x".repeat(MAX_TURNSTILE_LEN + 1)),
            ..Proof::default()
        };
        assert_eq!(siteverify_form("s", &long, None), Err(Refusal::Failed));
        assert_eq!(
            read_siteverify(br#"{"success":true,"error-codes":[]}"#),
            Ok(())
        );
        assert_eq!(
            read_siteverify(br#"{"success":false,"error-codes":["invalid-input-response"]}"#),
            Err(Some(Refusal::Failed))
        );
        assert_eq!(
            read_siteverify(br#"{"success":false,"error-codes":["timeout-or-duplicate"]}"#),
            Err(Some(Refusal::Reused))
        );
        for junk in [&b""[..], b"<html>", b"{}", b"{\"success\":\"yes\"}", b"[]"] {
            assert_eq!(read_siteverify(junk), Err(None), "{junk:?}");
        }
    }

    #[test]
    fn a_turnstile_csp_adds_the_widget_origin_only() {
        let strict =
            "default-src 'none'; script-src 'self'; worker-src 'self'; frame-ancestors 'none'";
        assert_eq!(
            turnstile_csp(strict),
            "default-src 'none'; script-src 'self' https://challenges.cloudflare.com; \
             worker-src 'self'; frame-ancestors 'none'; frame-src https://challenges.cloudflare.com"
        );
    }
}
