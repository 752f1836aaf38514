//! Standard `user` tokens: JWS compact JWTs signed HS256 with a key of the
//! user ring, so a shop mints them with any JWT library (header `kid`,
//! claims `sub`, `iat`, `exp`, optional `nbf`).
//!
//! Invariants:
//! - only `alg: "HS256"` is accepted; any other (`none`, HS384, RS256…) is
//!   [`TokenError::AlgRefused`] before a key is looked up, so the header
//!   never chooses how the token is checked;
//! - the signature is checked in constant time (`Mac::verify_slice`) over the
//!   exact `header.payload` bytes received, and claims are read only after
//!   it checks out;
//! - the same 5 s clock skew as `v1` tokens applies to `exp`, `iat`, `nbf`;
//! - a JWT is only ever a `user` token: [`crate::KeyRing::verify`] (tickets
//!   and admit tokens) never reaches this module.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Deserialize;
use serde_json::Value;

use crate::claims::{CLOCK_SKEW_SECS, Claims, TokenType, valid_subject};
use crate::error::TokenError;

/// Header fields we read; others (`typ`, `cty`…) are ignored.
#[derive(Deserialize)]
struct Header {
    alg: String,
    #[serde(default)]
    kid: Option<String>,
    /// RFC 7515 4.1.11: extensions the token says must be understood. We
    /// understand none, so any `crit` refuses the token.
    #[serde(default)]
    crit: Option<Value>,
}

/// A NumericDate (RFC 7519: seconds, possibly fractional) as whole seconds.
fn numeric_date(v: Option<&Value>) -> Result<Option<u64>, TokenError> {
    match v {
        None => Ok(None),
        Some(v) => {
            if let Some(n) = v.as_u64() {
                return Ok(Some(n));
            }
            match v.as_f64() {
                // Saturating cast: a far-future date stays far in the future.
                Some(f) if f.is_finite() && f >= 0.0 => Ok(Some(f.floor() as u64)),
                _ => Err(TokenError::Malformed),
            }
        }
    }
}

/// Verifies a JWT `user` token (see the module doc) and returns its claims
/// in the product's shape (`typ = user`, no sale, `jti` if the shop sent one).
/// `check_signature(kid, signed_len, sig)` is the key ring's one signature
/// check over the first `signed_len` bytes of `token`: passed in, so this
/// module parses and the ring alone holds keys.
pub(crate) fn verify_user(
    token: &str,
    now: u64,
    check_signature: impl FnOnce(&str, usize, &str) -> Result<(), TokenError>,
) -> Result<Claims, TokenError> {
    // Same bound on hostile input as the v1 format, before any decoding.
    if token.len() > 4096 || !token.is_ascii() {
        return Err(TokenError::Malformed);
    }
    let mut parts = token.split('.');
    let (Some(header_b64), Some(payload), Some(sig), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(TokenError::Malformed);
    };
    let header: Header = URL_SAFE_NO_PAD
        .decode(header_b64)
        .ok()
        .and_then(|json| serde_json::from_slice(&json).ok())
        .ok_or(TokenError::Malformed)?;
    if header.alg != "HS256" {
        return Err(TokenError::AlgRefused);
    }
    if header.crit.is_some() {
        return Err(TokenError::Malformed);
    }
    // A missing kid names no key we hold.
    let kid = header.kid.ok_or(TokenError::UnknownKid)?;
    let signed_len = header_b64.len() + 1 + payload.len();
    check_signature(&kid, signed_len, sig)?;
    let claims: serde_json::Map<String, Value> = URL_SAFE_NO_PAD
        .decode(payload)
        .ok()
        .and_then(|json| serde_json::from_slice(&json).ok())
        .ok_or(TokenError::Malformed)?;
    let sub = match claims.get("sub") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        _ => return Err(TokenError::Malformed),
    };
    if !valid_subject(&sub) {
        return Err(TokenError::BadSubject);
    }
    let exp = numeric_date(claims.get("exp"))?.ok_or(TokenError::Malformed)?;
    let iat = numeric_date(claims.get("iat"))?.ok_or(TokenError::Malformed)?;
    let nbf = numeric_date(claims.get("nbf"))?;
    if now > exp.saturating_add(CLOCK_SKEW_SECS) {
        return Err(TokenError::Expired);
    }
    let not_before = nbf.map_or(iat, |nbf| nbf.max(iat));
    if not_before > now.saturating_add(CLOCK_SKEW_SECS) {
        return Err(TokenError::NotYetValid);
    }
    let jti = match claims.get("jti") {
        Some(Value::String(s)) => s.clone(),
        _ => String::new(),
    };
    Ok(Claims {
        typ: TokenType::User,
        sub,
        sale: None,
        iat,
        exp,
        jti,
        tkt: None,
    })
}

/// Whether a credential is in the product's own `v1.` format (as opposed to
/// a JWT): lets a caller that accepts `admit or user` send a JWT straight
/// to the user check.
pub fn is_v1(token: &str) -> bool {
    token.starts_with("v1.")
}
