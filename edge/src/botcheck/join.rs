//! What a join brings for the bot check, and how it is refused (pure,
//! host-tested): the sale's setting ([`BotCheck`]), the join body that
//! carries a solution ([`Proof`], [`parse_body`]) and the refusals, each
//! with its own code ([`Refusal`]).
//!
//! Invariants kept here: every way a solution is refused has its own code
//! (DESIGN.md "Bot check at join"); no input panics (the body is bounded
//! before it is parsed); a setting this edge does not know is `None` (the
//! Worker refuses the join rather than guess).

use serde_json::Value;

use crate::api::error::ApiError;

/// Highest difficulty a sale may ask for (2^32 hashes is hours in a page).
pub const MAX_POW_BITS: u32 = 32;
/// Longest join body read.
pub const MAX_BODY_LEN: usize = 8 * 1024;

/// What a sale asks of a join (`origin sale create … --bot-check`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BotCheck {
    /// No check (the default).
    #[default]
    None,
    /// Proof of work of this many leading zero bits.
    Pow(u32),
    /// A Cloudflare Turnstile token, verified against the siteverify URL.
    Turnstile,
}

impl BotCheck {
    /// Parses `none`, `turnstile` or `pow:<1-32>`; anything else is `None`
    /// (the caller refuses to guess).
    pub fn parse(text: &str) -> Option<BotCheck> {
        match text {
            "none" => Some(BotCheck::None),
            "turnstile" => Some(BotCheck::Turnstile),
            _ => {
                let bits = text.strip_prefix("pow:")?;
                if bits.is_empty() || bits.len() > 2 || !bits.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                let n: u32 = bits.parse().ok()?;
                (1..=MAX_POW_BITS).contains(&n).then_some(BotCheck::Pow(n))
            }
        }
    }
}
/// Why a join's bot check failed; each has its own code and status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The sale asks for a check and the join brought none.
    Required,
    /// The body is not the JSON object a join takes.
    MalformedBody,
    /// The nonce is not a decimal number of at most 20 digits.
    BadNonce,
    /// Not a challenge of this edge for this sale (garbled, forged, another
    /// sale or another difficulty).
    Invalid,
    /// The hash does not start with enough zero bits (or the Turnstile
    /// token was refused).
    Failed,
    /// The challenge expired before the join.
    Expired,
    /// Already used, or issued to another account.
    Reused,
}

impl Refusal {
    pub fn code(self) -> &'static str {
        match self {
            Refusal::Required => "bot_check_required",
            Refusal::MalformedBody => "malformed_json",
            Refusal::BadNonce => "bad_nonce",
            Refusal::Invalid => "challenge_invalid",
            Refusal::Failed => "bot_check_failed",
            Refusal::Expired => "challenge_expired",
            Refusal::Reused => "challenge_reused",
        }
    }

    pub fn status(self) -> u16 {
        match self {
            Refusal::MalformedBody | Refusal::BadNonce => 400,
            _ => 403,
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            Refusal::Required => "this sale asks for a bot check before joining: solve a challenge",
            Refusal::MalformedBody => "body must be {\"challenge\": \"…\", \"nonce\": \"…\"}",
            Refusal::BadNonce => "nonce must be a decimal number of at most 20 digits",
            Refusal::Invalid => "not a challenge of this edge for this sale",
            Refusal::Failed => "the bot check failed",
            Refusal::Expired => "the challenge has expired: get a new one",
            Refusal::Reused => "the challenge was already used or issued to another account",
        }
    }

    /// The API error the join answers with.
    pub fn error(self) -> ApiError {
        ApiError::new(self.status(), self.code(), self.message())
    }
}

/// What a join's body carries (an empty body carries nothing).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Proof {
    pub challenge: Option<String>,
    pub nonce: Option<String>,
    pub turnstile: Option<String>,
}

/// Reads a join body: empty (or only whitespace) is no proof; otherwise a
/// JSON object whose `challenge` and `turnstile` are strings and whose
/// `nonce` is a string or a non-negative integer.
pub fn parse_body(body: &[u8]) -> Result<Proof, Refusal> {
    if body.len() > MAX_BODY_LEN {
        return Err(Refusal::MalformedBody);
    }
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Proof::default());
    }
    let v: Value = serde_json::from_slice(body).map_err(|_| Refusal::MalformedBody)?;
    let obj = v.as_object().ok_or(Refusal::MalformedBody)?;
    let text = |k: &str| -> Result<Option<String>, Refusal> {
        match obj.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(Refusal::MalformedBody),
        }
    };
    let nonce = match obj.get("nonce") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Number(n)) => Some(n.as_u64().ok_or(Refusal::BadNonce)?.to_string()),
        Some(_) => return Err(Refusal::BadNonce),
    };
    Ok(Proof {
        challenge: text("challenge")?,
        nonce,
        turnstile: text("turnstile")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_and_junk_is_refused() {
        assert_eq!(BotCheck::parse("none"), Some(BotCheck::None));
        assert_eq!(BotCheck::parse("turnstile"), Some(BotCheck::Turnstile));
        assert_eq!(BotCheck::parse("pow:20"), Some(BotCheck::Pow(20)));
        assert_eq!(BotCheck::parse("pow:1"), Some(BotCheck::Pow(1)));
        assert_eq!(BotCheck::parse("pow:32"), Some(BotCheck::Pow(32)));
        for bad in [
            "",
            "pow",
            "pow:",
            "pow:0",
            "pow:33",
            "pow:-1",
            "pow:+5",
            "pow:020",
            "POW:20",
            "pow:2a",
            "turnstile ",
            "pow:99999999999999999999",
        ] {
            assert_eq!(BotCheck::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn join_bodies_parse_and_malformed_ones_are_refused() {
        assert_eq!(parse_body(b""), Ok(Proof::default()));
        assert_eq!(parse_body(b" \n"), Ok(Proof::default()));
        assert_eq!(parse_body(b"{}"), Ok(Proof::default()));
        assert_eq!(
            parse_body(br#"{"challenge":"c","nonce":"17"}"#),
            Ok(Proof {
                challenge: Some("c".into()),
                nonce: Some("17".into()),
                turnstile: None
            })
        );
        assert_eq!(
            parse_body(br#"{"challenge":"c","nonce":17}"#)
                .unwrap()
                .nonce,
            Some("17".into())
        );
        assert_eq!(
            parse_body(br#"{"turnstile":"tok"}"#).unwrap().turnstile,
            Some("tok".into())
        );
        for bad in [
            &b"{"[..],
            b"[]",
            b"\"x\"",
            b"{\"challenge\":5}",
            b"\xff\xfe",
        ] {
            assert_eq!(parse_body(bad), Err(Refusal::MalformedBody), "{bad:?}");
        }
        for bad in [
            &br#"{"nonce":-1}"#[..],
            br#"{"nonce":1.5}"#,
            br#"{"nonce":[1]}"#,
        ] {
            assert_eq!(parse_body(bad), Err(Refusal::BadNonce), "{bad:?}");
        }
        assert_eq!(
            parse_body(&vec![b' '; MAX_BODY_LEN + 1]),
            Err(Refusal::MalformedBody)
        );
    }

    #[test]
    fn every_refusal_has_its_own_code() {
        let all = [
            Refusal::Required,
            Refusal::MalformedBody,
            Refusal::BadNonce,
            Refusal::Invalid,
            Refusal::Failed,
            Refusal::Expired,
            Refusal::Reused,
        ];
        let codes: std::collections::HashSet<_> = all.iter().map(|r| r.code()).collect();
        assert_eq!(codes.len(), all.len());
        for r in all {
            assert!(r.error().body().contains(r.code()));
        }
    }
}
