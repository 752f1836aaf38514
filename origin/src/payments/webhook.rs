//! The payment provider's webhook, as far as it is about trust: the
//! `Payment-Signature` header signed and verified, the event it carries,
//! and posting one as a provider would (the dev provider, `origin pay
//! simulate`, the simulators).
//!
//! Invariants kept here:
//! - the header is bounded before it is authenticated: at most
//!   [`MAX_SIGNATURES`] `v1` candidates of exactly 64 hex, else refused
//!   before any MAC is computed;
//! - a signature is HMAC-SHA256 over `"<t>.<body>"`, one MAC per secret
//!   compared in constant time with each candidate, within a 5-minute
//!   tolerance; several secrets verify at once (rotation).

use hmac::digest::{CtOutput, Output};
use hmac::{Hmac, KeyInit, Mac};
use serde::Deserialize;
use sha2::Sha256;

/// Webhook timestamps older or newer than this are refused.
pub const WEBHOOK_TOLERANCE_SECS: u64 = 300;

/// Why a webhook signature was refused; each has its own error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("the Payment-Signature header is missing")]
    Missing,
    #[error("the Payment-Signature header is malformed")]
    Malformed,
    #[error("the signature timestamp is outside the 5-minute tolerance")]
    Stale,
    #[error("no signature matches")]
    Mismatch,
}

impl SignatureError {
    pub fn code(self) -> &'static str {
        match self {
            SignatureError::Missing => "signature_missing",
            SignatureError::Malformed => "signature_malformed",
            SignatureError::Stale => "signature_stale",
            SignatureError::Mismatch => "signature_mismatch",
        }
    }
}

fn mac(secret: &str, t: u64, body: &[u8]) -> Hmac<Sha256> {
    let mut m = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("any key length");
    m.update(t.to_string().as_bytes());
    m.update(b".");
    m.update(body);
    m
}

/// `t=<t>,v1=<hex>`: what a provider sends (and our dev provider does).
pub fn sign_webhook(secret: &str, t: u64, body: &[u8]) -> String {
    format!(
        "t={t},v1={}",
        hex::encode(mac(secret, t, body).finalize().into_bytes())
    )
}

/// At most this many `v1` candidates in one header: a provider sends one
/// per secret it signs with (two while it rotates); more is refused before
/// any MAC is computed, so a header cannot buy unbounded work.
pub const MAX_SIGNATURES: usize = 5;

/// Verifies a `Payment-Signature` header against any of `secrets`.
///
/// The header is parsed fully (and cheaply) before any MAC: at most
/// [`MAX_SIGNATURES`] candidates, each exactly 64 hex digits (an HMAC-SHA256),
/// else `Malformed`. Then one MAC per secret over the body, compared in
/// constant time with every candidate: the work is bounded by
/// `secrets × body`, whatever the header says.
pub fn verify_webhook(
    secrets: &[String],
    header: Option<&str>,
    body: &[u8],
    now: u64,
) -> Result<(), SignatureError> {
    let header = header.ok_or(SignatureError::Missing)?;
    let mut t = None;
    let mut sigs: Vec<[u8; 32]> = Vec::new();
    for part in header.split(',') {
        let (k, v) = part
            .trim()
            .split_once('=')
            .ok_or(SignatureError::Malformed)?;
        match k {
            "t" => t = Some(v.parse::<u64>().map_err(|_| SignatureError::Malformed)?),
            "v1" => {
                if sigs.len() == MAX_SIGNATURES || v.len() != 64 {
                    return Err(SignatureError::Malformed);
                }
                let mut sig = [0u8; 32];
                hex::decode_to_slice(v, &mut sig).map_err(|_| SignatureError::Malformed)?;
                sigs.push(sig);
            }
            _ => {} // other schemes are ignored, as providers add them
        }
    }
    let t = t.ok_or(SignatureError::Malformed)?;
    if sigs.is_empty() {
        return Err(SignatureError::Malformed);
    }
    if now.abs_diff(t) > WEBHOOK_TOLERANCE_SECS {
        return Err(SignatureError::Stale);
    }
    // Every secret and every candidate is compared (no early exit), so the
    // time taken says nothing about which comparison matched.
    let mut ok = false;
    for s in secrets {
        let tag = mac(s, t, body).finalize();
        for sig in &sigs {
            ok |= tag == CtOutput::new(Output::<Hmac<Sha256>>::from(*sig));
        }
    }
    if ok {
        Ok(())
    } else {
        Err(SignatureError::Mismatch)
    }
}

/// Builds and signs a webhook body as the provider would, and posts it.
pub async fn post_webhook(
    client: &reqwest::Client,
    origin: &str,
    secret: &str,
    event: &serde_json::Value,
) -> reqwest::Result<reqwest::Response> {
    let body = serde_json::to_vec(event).expect("json");
    let sig = sign_webhook(secret, crate::ops::clock::now_secs(), &body);
    client
        .post(format!("{origin}/webhooks/payments"))
        .header("content-type", "application/json")
        .header("Payment-Signature", sig)
        .body(body)
        .send()
        .await
}

/// A provider event, as the webhook carries it.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct Event {
    /// The provider's event id (applied once).
    pub id: String,
    /// `payment.succeeded` or `payment.failed` (else `unknown_event_type`).
    #[serde(rename = "type")]
    pub kind: String,
    pub data: EventData,
}

/// The payment an event is about.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct EventData {
    pub payment_id: String,
    pub amount_cents: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000;

    fn secrets(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn hex_of(secret: &str, body: &[u8]) -> String {
        sign_webhook(secret, NOW, body)
            .rsplit_once("v1=")
            .unwrap()
            .1
            .to_string()
    }

    #[test]
    fn any_secret_and_any_candidate_within_the_limit_verifies() {
        let body = b"{}";
        let good = hex_of("new", body);
        let other = hex_of("old", body);
        let header = format!("t={NOW},v1={other},v1={good}");
        assert_eq!(
            verify_webhook(&secrets(&["new"]), Some(&header), body, NOW),
            Ok(())
        );
        assert_eq!(
            verify_webhook(&secrets(&["x", "old"]), Some(&header), body, NOW),
            Ok(())
        );
        let mut header = format!("t={NOW}");
        for _ in 1..MAX_SIGNATURES {
            header.push_str(&format!(",v1={}", "0".repeat(64)));
        }
        header.push_str(&format!(",v1={good}"));
        assert_eq!(
            verify_webhook(&secrets(&["new"]), Some(&header), body, NOW),
            Ok(())
        );
    }

    #[test]
    fn more_candidates_than_the_limit_or_a_wrong_length_is_malformed() {
        let body = b"{}";
        let good = hex_of("s", body);
        let mut too_many = format!("t={NOW}");
        for _ in 0..MAX_SIGNATURES {
            too_many.push_str(&format!(",v1={}", "0".repeat(64)));
        }
        too_many.push_str(&format!(",v1={good}"));
        for header in [
            too_many,
            format!("t={NOW},v1={}", &good[..63]),
            format!("t={NOW},v1={good}0"),
            format!("t={NOW},v1={}g", &good[..63]),
            format!("t={NOW},v1=é{}", &good[..62]),
            format!("t={NOW}"),
            format!("v1={good}"),
        ] {
            assert_eq!(
                verify_webhook(&secrets(&["s"]), Some(&header), body, NOW),
                Err(SignatureError::Malformed),
                "{header}"
            );
        }
    }

    #[test]
    fn wrong_secret_body_or_time_is_refused_with_its_reason() {
        let body = b"{}";
        let header = sign_webhook("s", NOW, body);
        let s = secrets(&["s"]);
        assert_eq!(
            verify_webhook(&secrets(&["t"]), Some(&header), body, NOW),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify_webhook(&s, Some(&header), b"{ }", NOW),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify_webhook(&s, Some(&header), body, NOW + WEBHOOK_TOLERANCE_SECS + 1),
            Err(SignatureError::Stale)
        );
        assert_eq!(
            verify_webhook(&s, None, body, NOW),
            Err(SignatureError::Missing)
        );
    }
}
