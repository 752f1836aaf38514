//! The bot check at join (pure, host-tested): the sale's setting, the
//! proof-of-work challenge (issue, verify) and the join body that carries a
//! solution. The Worker (`waiting`) reads the setting from the origin's
//! summary, issues challenges on `GET /api/sales/{sale}/challenge` and
//! verifies a join's solution here before it calls any object.
//!
//! A challenge is `c1.<kid>.<payload>.<sig>`: the payload (base64url JSON
//! of [`Challenge`]) names the account, the sale, the difficulty and the
//! issue and expiry times, and is HMAC-signed with the edge's admission
//! keys (`KeyRing::sign_tagged`, tag `c1`, so a challenge never verifies
//! as a token nor a token as a challenge). A solution is a decimal `nonce`
//! such that `SHA-256(challenge ‖ ":" ‖ nonce)` starts with `bits` zero
//! bits.
//!
//! Invariants kept here:
//! - verifying costs one HMAC and one SHA-256 over a few hundred bytes, no
//!   I/O: the edge refuses a bad solution before any object call;
//! - every way a solution is refused has its own code (DESIGN.md "Bot check
//!   at join"), and no input panics (lengths are bounded before decoding);
//! - a challenge is usable by the account it was issued to only (another
//!   account presenting it is `challenge_reused`); that it is used once is
//!   kept by the account's queue shard (see [`Challenge::iat_ms`] and
//!   edge/README.md "Bot check at join").

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use token::KeyRing;

use crate::api::ApiError;

/// The tag that keeps challenges apart from tokens signed by the same keys.
pub const CHALLENGE_TAG: &str = "c1";
/// How long a challenge may be solved and used.
pub const CHALLENGE_TTL_MS: u64 = 300_000;
/// Highest difficulty a sale may ask for (2^32 hashes is hours in a page).
pub const MAX_POW_BITS: u32 = 32;
/// Longest challenge accepted (ours are about 250 bytes).
pub const MAX_CHALLENGE_LEN: usize = 1024;
/// Longest nonce accepted: any `u64` in decimal.
pub const MAX_NONCE_LEN: usize = 20;
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

/// The signed content of a challenge. Field names are short: the challenge
/// is hashed once per try by the solver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Challenge {
    /// Account it was issued to.
    pub sub: String,
    pub sale: String,
    /// Difficulty: leading zero bits of the solution's hash.
    pub bits: u32,
    /// Issued at, unix ms. The account's queue shard keeps the newest
    /// `iat_ms` it accepted and refuses any challenge not newer: one
    /// number per account remembers every used challenge.
    pub iat_ms: u64,
    /// Expires at, unix ms.
    pub exp_ms: u64,
    /// 128 random bits: no two challenges are alike.
    pub n: String,
}

/// Issues a challenge for `sub` in `sale` valid for `ttl_ms` from `now_ms`;
/// answers the opaque string and its content.
pub fn issue(
    ring: &KeyRing,
    sub: &str,
    sale: &str,
    bits: u32,
    now_ms: u64,
    ttl_ms: u64,
    random: String,
) -> (String, Challenge) {
    let c = Challenge {
        sub: sub.to_string(),
        sale: sale.to_string(),
        bits,
        iat_ms: now_ms,
        exp_ms: now_ms.saturating_add(ttl_ms),
        n: random,
    };
    let json = serde_json::to_vec(&c).expect("challenge always serializes");
    (ring.sign_tagged(CHALLENGE_TAG, &json), c)
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

/// `SHA-256(challenge ‖ ":" ‖ nonce)`.
pub fn pow_hash(challenge: &str, nonce: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(challenge.as_bytes());
    h.update(b":");
    h.update(nonce.as_bytes());
    h.finalize().into()
}

/// Leading zero bits of a hash.
pub fn leading_zero_bits(hash: &[u8]) -> u32 {
    let mut n = 0;
    for b in hash {
        if *b == 0 {
            n += 8;
        } else {
            return n + b.leading_zeros();
        }
    }
    n
}

fn valid_nonce(nonce: &str) -> bool {
    !nonce.is_empty() && nonce.len() <= MAX_NONCE_LEN && nonce.bytes().all(|b| b.is_ascii_digit())
}

/// Checks a solution for a join of `sub` in `sale`, which asks for
/// `required_bits`, at `now_ms`. Answers the challenge's content; the
/// caller still has the account's shard refuse a challenge already used
/// (see [`Challenge::iat_ms`]).
pub fn verify(
    ring: &KeyRing,
    proof: &Proof,
    sub: &str,
    sale: &str,
    required_bits: u32,
    now_ms: u64,
) -> Result<Challenge, Refusal> {
    let (Some(challenge), Some(nonce)) = (&proof.challenge, &proof.nonce) else {
        return Err(Refusal::Required);
    };
    if !valid_nonce(nonce) {
        return Err(Refusal::BadNonce);
    }
    if challenge.len() > MAX_CHALLENGE_LEN {
        return Err(Refusal::Invalid);
    }
    let json = ring
        .verify_tagged(CHALLENGE_TAG, challenge)
        .map_err(|_| Refusal::Invalid)?;
    let c: Challenge = serde_json::from_slice(&json).map_err(|_| Refusal::Invalid)?;
    if c.sale != sale || c.bits < required_bits {
        return Err(Refusal::Invalid);
    }
    if c.sub != sub {
        return Err(Refusal::Reused);
    }
    if now_ms >= c.exp_ms {
        return Err(Refusal::Expired);
    }
    if leading_zero_bits(&pow_hash(challenge, nonce)) < c.bits {
        return Err(Refusal::Failed);
    }
    Ok(c)
}

/// The first nonce from `from` (at most `tries` of them) that solves
/// `challenge` at `bits`: what the page's Web Worker does, for tests and
/// benchmarks (a bot farm's cost per account).
pub fn solve(challenge: &str, bits: u32, from: u64, tries: u64) -> Option<u64> {
    (from..from.saturating_add(tries))
        .find(|n| leading_zero_bits(&pow_hash(challenge, &n.to_string())) >= bits)
}

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

    fn ring() -> KeyRing {
        KeyRing::from_keys(&[("a1", &[7u8; 32]), ("a0", &[9u8; 32])]).unwrap()
    }

    fn proof(challenge: &str, nonce: u64) -> Proof {
        Proof {
            challenge: Some(challenge.to_string()),
            nonce: Some(nonce.to_string()),
            turnstile: None,
        }
    }

    const NOW: u64 = 1_800_000_000_000;

    fn issued(bits: u32) -> (String, Challenge) {
        issue(
            &ring(),
            "alice",
            "drop",
            bits,
            NOW,
            CHALLENGE_TTL_MS,
            "r".repeat(22),
        )
    }

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
    fn leading_zero_bits_counts_across_bytes() {
        assert_eq!(leading_zero_bits(&[0x80]), 0);
        assert_eq!(leading_zero_bits(&[0x01]), 7);
        assert_eq!(leading_zero_bits(&[0, 0, 0x10]), 19);
        assert_eq!(leading_zero_bits(&[0; 32]), 256);
    }

    #[test]
    fn a_solved_challenge_verifies() {
        let (c, content) = issued(12);
        let n = solve(&c, 12, 0, 1 << 24).expect("12 bits within 2^24 tries");
        let got = verify(&ring(), &proof(&c, n), "alice", "drop", 12, NOW + 1_000).unwrap();
        assert_eq!(got, content);
        assert!(leading_zero_bits(&pow_hash(&c, &n.to_string())) >= 12);
    }

    #[test]
    fn the_hash_is_sha256_of_challenge_colon_nonce() {
        // Pinned by an independent implementation:
        // `printf 'abc:42' | sha256sum`.
        assert_eq!(
            hex::encode(pow_hash("abc", "42")),
            "77fed3f4d816b7f45026b803d1110fd9e8495ff5884d55c08c605d1b68057163"
        );
    }

    #[test]
    fn a_wrong_nonce_fails() {
        let (c, _) = issued(16);
        let mut n = 0;
        // A nonce whose hash has fewer than 16 zero bits.
        while leading_zero_bits(&pow_hash(&c, &n.to_string())) >= 16 {
            n += 1;
        }
        assert_eq!(
            verify(&ring(), &proof(&c, n), "alice", "drop", 16, NOW),
            Err(Refusal::Failed)
        );
    }

    #[test]
    fn expired_other_account_other_sale_and_forgeries_have_their_codes() {
        let (c, _) = issued(4);
        let n = solve(&c, 4, 0, 1 << 16).unwrap();
        let p = proof(&c, n);
        let r = ring();
        assert_eq!(
            verify(&r, &p, "alice", "drop", 4, NOW + CHALLENGE_TTL_MS),
            Err(Refusal::Expired)
        );
        assert_eq!(
            verify(&r, &p, "mallory", "drop", 4, NOW),
            Err(Refusal::Reused)
        );
        assert_eq!(
            verify(&r, &p, "alice", "other", 4, NOW),
            Err(Refusal::Invalid)
        );
        // The sale asks for more than the challenge was issued with.
        assert_eq!(
            verify(&r, &p, "alice", "drop", 5, NOW),
            Err(Refusal::Invalid)
        );
        // Signed by keys the edge does not hold.
        let other = KeyRing::from_keys(&[("a1", &[8u8; 32])]).unwrap();
        assert_eq!(
            verify(&other, &p, "alice", "drop", 4, NOW),
            Err(Refusal::Invalid)
        );
        // A challenge with its payload edited (lower difficulty, longer life).
        let parts: Vec<&str> = c.split('.').collect();
        let mut content: Challenge = serde_json::from_slice(
            &base64::Engine::decode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, parts[2])
                .unwrap(),
        )
        .unwrap();
        content.exp_ms += 1_000_000;
        let forged_payload = base64::Engine::encode(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD,
            serde_json::to_vec(&content).unwrap(),
        );
        let forged = format!("{}.{}.{}.{}", parts[0], parts[1], forged_payload, parts[3]);
        let fp = proof(&forged, n);
        assert_eq!(
            verify(&r, &fp, "alice", "drop", 4, NOW),
            Err(Refusal::Invalid)
        );
        // A token signed by the same keys is not a challenge.
        let tok = r.sign(&token::Claims::new(
            token::TokenType::Ticket,
            "alice",
            Some("drop".into()),
            NOW / 1000,
            60,
        ));
        assert_eq!(
            verify(&r, &proof(&tok, 1), "alice", "drop", 4, NOW),
            Err(Refusal::Invalid)
        );
    }

    #[test]
    fn a_challenge_is_never_a_token() {
        let (c, _) = issued(4);
        assert!(ring().verify_signature(&c).is_err());
    }

    #[test]
    fn malformed_input_gets_its_own_code_and_never_panics() {
        let r = ring();
        let (c, _) = issued(4);
        let missing = Proof::default();
        assert_eq!(
            verify(&r, &missing, "alice", "drop", 4, NOW),
            Err(Refusal::Required)
        );
        let only_challenge = Proof {
            challenge: Some(c.clone()),
            ..Proof::default()
        };
        assert_eq!(
            verify(&r, &only_challenge, "alice", "drop", 4, NOW),
            Err(Refusal::Required)
        );
        for nonce in ["", "-1", "1.5", "1e3", " 1", "123456789012345678901", "١٢"] {
            let p = Proof {
                challenge: Some(c.clone()),
                nonce: Some(nonce.to_string()),
                turnstile: None,
            };
            assert_eq!(
                verify(&r, &p, "alice", "drop", 4, NOW),
                Err(Refusal::BadNonce),
                "{nonce:?}"
            );
        }
        for junk in [
            String::new(),
            "c1".into(),
            "c1...".into(),
            "c1.a1.!!!.???".into(),
            "c1.a1.e30.e30".into(),
            "v1.a1.e30.e30".into(),
            "c1.a1.".repeat(500),
            "é.ü.ß.ø".into(),
            "c1.a1.e30.e30.e30".into(),
        ] {
            assert_eq!(
                verify(&r, &proof(&junk, 1), "alice", "drop", 4, NOW),
                Err(Refusal::Invalid),
                "{junk:?}"
            );
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
