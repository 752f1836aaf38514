//! The proof-of-work bot check (pure, host-tested): the challenge the
//! Worker issues (`GET /api/sales/{sale}/challenge`) and its verification
//! at join, before any object call.
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
use sha2::{Digest, Sha256};
use token::KeyRing;

use crate::botcheck::join::{Proof, Refusal};

/// The tag that keeps challenges apart from tokens signed by the same keys.
pub const CHALLENGE_TAG: &str = "c1";
/// How long a challenge may be solved and used.
pub const CHALLENGE_TTL_MS: u64 = 300_000;
/// Longest challenge accepted (ours are about 250 bytes).
pub const MAX_CHALLENGE_LEN: usize = 1024;
/// Longest nonce accepted: any `u64` in decimal.
pub const MAX_NONCE_LEN: usize = 20;

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
}
