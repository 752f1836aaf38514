//! Key rings: signing and verifying `v1` tokens and tagged texts.
//!
//! Invariants kept here (and nowhere else):
//! - a token verifies only if its signature is the HMAC of exactly the bytes
//!   that were signed, compared in constant time (`Mac::verify_slice`);
//! - claims are only looked at *after* the signature checks out, so a forged
//!   payload can never steer the verifier;
//! - the first key signs, every key verifies (rotation), and secrets are
//!   never printed.

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE_NO_PAD};
use hmac::{Hmac, KeyInit, Mac};
use serde::Deserialize;
use sha2::Sha256;

use crate::claims::{CLOCK_SKEW_SECS, Claims, TokenType, VERSION, valid_subject};
use crate::error::TokenError;
use crate::jwt;

type HmacSha256 = Hmac<Sha256>;

/// Shortest secret accepted for a key (HMAC-SHA256 wants 32; 16 is the floor).
pub const MIN_KEY_BYTES: usize = 16;

/// A key ring could not be read from configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyRingError {
    #[error("no keys given")]
    Empty,
    #[error("key entry #{index} ({entry:?}) is not `kid:base64key`")]
    NotAPair { index: usize, entry: String },
    #[error(
        "key entry #{index} has an empty or invalid kid {kid:?} (letters, digits, - and _ only)"
    )]
    BadKid { index: usize, kid: String },
    #[error("key entry #{index} (kid {kid:?}) is not valid base64")]
    BadBase64 { index: usize, kid: String },
    #[error(
        "key entry #{index} (kid {kid:?}) is {len} bytes; at least {MIN_KEY_BYTES} are required"
    )]
    TooShort {
        index: usize,
        kid: String,
        len: usize,
    },
    #[error("key id {kid:?} appears twice")]
    DuplicateKid { kid: String },
}

#[derive(Clone)]
struct Key {
    kid: String,
    secret: Vec<u8>,
}

/// Signing and verifying keys. The first key signs; every key verifies, so
/// a new key can be put first while tokens signed by the old one still pass.
#[derive(Clone)]
pub struct KeyRing {
    keys: Vec<Key>,
}

impl std::fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print secrets, only which kids are loaded.
        f.debug_struct("KeyRing")
            .field(
                "kids",
                &self.keys.iter().map(|k| &k.kid).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// What a verifier insists on besides a good signature and a valid time.
#[derive(Debug, Clone, Copy)]
pub struct Expect<'a> {
    pub typ: TokenType,
    /// `Some(sale)`: the token must name exactly this sale.
    pub sale: Option<&'a str>,
}

fn valid_kid(kid: &str) -> bool {
    !kid.is_empty()
        && kid.len() <= 64
        && kid
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

fn decode_key(text: &str) -> Option<Vec<u8>> {
    [&STANDARD, &STANDARD_NO_PAD, &URL_SAFE_NO_PAD]
        .iter()
        .find_map(|engine| engine.decode(text).ok())
}

impl KeyRing {
    /// Parses `kid:base64key[,kid:base64key…]` (standard or url-safe base64).
    pub fn parse(text: &str) -> Result<Self, KeyRingError> {
        let mut keys: Vec<Key> = Vec::new();
        for (i, entry) in text.split(',').map(str::trim).enumerate() {
            let index = i + 1;
            if entry.is_empty() {
                continue;
            }
            let Some((kid, b64)) = entry.split_once(':') else {
                return Err(KeyRingError::NotAPair {
                    index,
                    entry: redact(entry),
                });
            };
            let kid = kid.trim();
            if !valid_kid(kid) {
                return Err(KeyRingError::BadKid {
                    index,
                    kid: kid.to_string(),
                });
            }
            let secret = decode_key(b64.trim()).ok_or_else(|| KeyRingError::BadBase64 {
                index,
                kid: kid.to_string(),
            })?;
            if secret.len() < MIN_KEY_BYTES {
                return Err(KeyRingError::TooShort {
                    index,
                    kid: kid.to_string(),
                    len: secret.len(),
                });
            }
            if keys.iter().any(|k| k.kid == kid) {
                return Err(KeyRingError::DuplicateKid {
                    kid: kid.to_string(),
                });
            }
            keys.push(Key {
                kid: kid.to_string(),
                secret,
            });
        }
        if keys.is_empty() {
            return Err(KeyRingError::Empty);
        }
        Ok(KeyRing { keys })
    }

    /// A ring from raw parts (tests and generated dev keys).
    pub fn from_keys(keys: &[(&str, &[u8])]) -> Result<Self, KeyRingError> {
        let text = keys
            .iter()
            .map(|(kid, secret)| format!("{kid}:{}", STANDARD.encode(secret)))
            .collect::<Vec<_>>()
            .join(",");
        Self::parse(&text)
    }

    /// The kids of every key loaded, signing key first (for operators'
    /// reports; never the secrets).
    pub fn kids(&self) -> Vec<&str> {
        self.keys.iter().map(|k| k.kid.as_str()).collect()
    }

    /// A pair of kids (`self`, `other`) whose secrets are the same bytes.
    /// Two rings with different trust (the shop's user keys and the
    /// admission keys) must never share one: whoever holds the first could
    /// then mint tokens of the second.
    pub fn shares_secret_with<'a>(&'a self, other: &'a KeyRing) -> Option<(&'a str, &'a str)> {
        self.keys.iter().find_map(|a| {
            other
                .keys
                .iter()
                .find(|b| a.secret == b.secret)
                .map(|b| (a.kid.as_str(), b.kid.as_str()))
        })
    }

    /// The kid that signs new tokens.
    pub fn signing_kid(&self) -> &str {
        &self.keys[0].kid
    }

    fn mac(secret: &[u8], signed: &[u8]) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC accepts keys of any length");
        mac.update(signed);
        mac
    }

    /// Checks `sig_b64` against the first `signed_len` bytes of `token`
    /// with the key `kid`, in constant time: the one signature check of both
    /// formats (v1 and JWT). The decoder accepts canonical encodings only: a
    /// second spelling of the same signature bytes (non-zero trailing bits)
    /// is malformed, so tokens are not malleable.
    fn check_signature(
        &self,
        kid: &str,
        token: &str,
        signed_len: usize,
        sig_b64: &str,
    ) -> Result<(), TokenError> {
        let key = self
            .keys
            .iter()
            .find(|k| k.kid == kid)
            .ok_or(TokenError::UnknownKid)?;
        let sig = URL_SAFE_NO_PAD
            .decode(sig_b64)
            .map_err(|_| TokenError::Malformed)?;
        Self::mac(&key.secret, &token.as_bytes()[..signed_len])
            .verify_slice(&sig)
            .map_err(|_| TokenError::BadSignature)
    }

    /// Signs claims with the first key.
    pub fn sign(&self, claims: &Claims) -> String {
        let key = &self.keys[0];
        let json = serde_json::to_vec(claims).expect("claims always serialize");
        let head = format!("{VERSION}.{}.{}", key.kid, URL_SAFE_NO_PAD.encode(json));
        let sig = Self::mac(&key.secret, head.as_bytes())
            .finalize()
            .into_bytes();
        format!("{head}.{}", URL_SAFE_NO_PAD.encode(sig))
    }

    /// Signs bytes that are not a token under a purpose `tag`:
    /// `<tag>.<kid>.<base64url(payload)>.<sig>`, `sig` the HMAC of
    /// `<tag>.<kid>.<payload>` with the signing key. The tag is part of
    /// what is signed and is never [`VERSION`], so nothing signed here
    /// verifies as a token, nor a token here (the edge's PoW challenges).
    pub fn sign_tagged(&self, tag: &str, payload: &[u8]) -> String {
        assert!(
            tag != VERSION && valid_kid(tag),
            "a tag is a plain word other than {VERSION}"
        );
        let key = &self.keys[0];
        let head = format!("{tag}.{}.{}", key.kid, URL_SAFE_NO_PAD.encode(payload));
        let sig = Self::mac(&key.secret, head.as_bytes())
            .finalize()
            .into_bytes();
        format!("{head}.{}", URL_SAFE_NO_PAD.encode(sig))
    }

    /// Checks a [`KeyRing::sign_tagged`] text with `tag` (constant time,
    /// any key of the ring) and answers its payload.
    pub fn verify_tagged(&self, tag: &str, text: &str) -> Result<Vec<u8>, TokenError> {
        // A tagged text never passes as a token, nor a token as one.
        if tag == VERSION {
            return Err(TokenError::Malformed);
        }
        self.open(tag, text)
    }

    /// The payload of `head.kid.payload.sig` signed by this ring: the shape
    /// of tokens and of tagged texts alike. Work on hostile input is bounded
    /// before any decoding; the MAC is checked before the payload is read.
    fn open(&self, head: &str, text: &str) -> Result<Vec<u8>, TokenError> {
        if text.len() > 4096 || !text.is_ascii() {
            return Err(TokenError::Malformed);
        }
        let mut parts = text.split('.');
        let (Some(h), Some(kid), Some(payload), Some(sig), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(TokenError::Malformed);
        };
        if h != head || payload.is_empty() {
            return Err(TokenError::Malformed);
        }
        let signed_len = h.len() + kid.len() + payload.len() + 2;
        self.check_signature(kid, text, signed_len, sig)?;
        URL_SAFE_NO_PAD
            .decode(payload)
            .map_err(|_| TokenError::Malformed)
    }

    /// Checks the signature (constant time), then type, sale and time window.
    pub fn verify(&self, token: &str, expect: Expect<'_>, now: u64) -> Result<Claims, TokenError> {
        let claims = self.verify_signature(token)?;
        if !valid_subject(&claims.sub) {
            return Err(TokenError::BadSubject);
        }
        if claims.typ != expect.typ {
            return Err(TokenError::WrongType);
        }
        if let Some(sale) = expect.sale
            && claims.sale.as_deref() != Some(sale)
        {
            return Err(TokenError::WrongSale);
        }
        if now > claims.exp.saturating_add(CLOCK_SKEW_SECS) {
            return Err(TokenError::Expired);
        }
        if claims.iat > now.saturating_add(CLOCK_SKEW_SECS) {
            return Err(TokenError::NotYetValid);
        }
        Ok(claims)
    }

    /// Verifies a `user` token in either accepted format: the product's own
    /// `v1.` format or a JWT signed HS256 by a key of this ring (see
    /// [`jwt`]). Only for `user` tokens: [`KeyRing::verify`] (tickets,
    /// admit tokens) never accepts a JWT.
    pub fn verify_user(&self, token: &str, now: u64) -> Result<Claims, TokenError> {
        if jwt::is_v1(token) {
            self.verify(
                token,
                Expect {
                    typ: TokenType::User,
                    sale: None,
                },
                now,
            )
        } else {
            jwt::verify_user(token, now, |kid, signed_len, sig| {
                self.check_signature(kid, token, signed_len, sig)
            })
        }
    }

    /// Checks format and signature only and returns the claims.
    pub fn verify_signature(&self, token: &str) -> Result<Claims, TokenError> {
        let json = self.open(VERSION, token)?;
        serde_json::from_slice(&json).map_err(|_| TokenError::Malformed)
    }
}

/// The `typ` a token claims, read WITHOUT verifying it: only for choosing
/// which key ring and [`Expect`] to verify it with next. Never trust it alone.
pub fn peek_type(token: &str) -> Option<TokenType> {
    #[derive(Deserialize)]
    struct Typ {
        typ: TokenType,
    }
    let payload = token.split('.').nth(2)?;
    let json = URL_SAFE_NO_PAD.decode(payload).ok()?;
    serde_json::from_slice::<Typ>(&json).ok().map(|t| t.typ)
}

fn redact(entry: &str) -> String {
    // An entry without ':' may be a bare secret: show only its start.
    let shown: String = entry.chars().take(4).collect();
    format!("{shown}…")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring() -> KeyRing {
        KeyRing::from_keys(&[("k1", &[7u8; 32]), ("k0", &[9u8; 32])]).unwrap()
    }

    #[test]
    fn first_key_signs_all_verify() {
        let r = ring();
        let c = Claims::new(TokenType::User, "alice", None, 1_000, 60);
        let t = r.sign(&c);
        assert!(t.starts_with("v1.k1."));
        let old = KeyRing::from_keys(&[("k0", &[9u8; 32])]).unwrap();
        let t_old = old.sign(&c);
        let expect = Expect {
            typ: TokenType::User,
            sale: None,
        };
        assert_eq!(r.verify(&t_old, expect, 1_010).unwrap(), c);
        assert_eq!(old.verify(&t, expect, 1_010), Err(TokenError::UnknownKid));
    }

    #[test]
    fn tagged_blobs_verify_by_any_key_and_never_as_tokens() {
        let r = ring();
        let blob = r.sign_tagged("c1", b"{\"x\":1}");
        assert!(blob.starts_with("c1.k1."));
        assert_eq!(r.verify_tagged("c1", &blob).unwrap(), b"{\"x\":1}");
        let old = KeyRing::from_keys(&[("k0", &[9u8; 32])]).unwrap();
        assert_eq!(
            r.verify_tagged("c1", &old.sign_tagged("c1", b"y")).unwrap(),
            b"y"
        );
        // Another tag, an edited blob, a token: all refused.
        assert_eq!(r.verify_tagged("c2", &blob), Err(TokenError::Malformed));
        let edited = blob.replacen("c1.k1.", "c1.k1.e", 1);
        assert!(r.verify_tagged("c1", &edited).is_err());
        let token = r.sign(&Claims::new(TokenType::User, "a", None, 1_000, 60));
        assert!(r.verify_tagged("v1", &token).is_err());
        assert!(r.verify_tagged("c1", &token).is_err());
        assert!(r.verify_signature(&blob).is_err());
        // Junk never panics.
        for junk in [
            "",
            "c1",
            "c1.k1",
            "c1.k1..",
            "c1.k9.e30.AAAA",
            "c1.k1.e30.%%",
            "é",
        ] {
            assert!(r.verify_tagged("c1", junk).is_err(), "{junk:?}");
        }
    }

    #[test]
    fn shared_secrets_between_rings_are_found_by_kid() {
        let users = ring();
        let admission = KeyRing::from_keys(&[("a1", &[1u8; 32]), ("a0", &[9u8; 32])]).unwrap();
        assert_eq!(users.shares_secret_with(&admission), Some(("k0", "a0")));
        let apart = KeyRing::from_keys(&[("a1", &[1u8; 32])]).unwrap();
        assert_eq!(users.shares_secret_with(&apart), None);
        assert_eq!(users.kids(), ["k1", "k0"]);
    }

    #[test]
    fn skew_window_is_five_seconds() {
        let r = ring();
        let c = Claims::new(TokenType::Admit, "a", Some("s".into()), 1_000, 120);
        let t = r.sign(&c);
        let e = Expect {
            typ: TokenType::Admit,
            sale: Some("s"),
        };
        assert!(r.verify(&t, e, 1_125).is_ok());
        assert_eq!(r.verify(&t, e, 1_126), Err(TokenError::Expired));
        assert!(r.verify(&t, e, 995).is_ok());
        assert_eq!(r.verify(&t, e, 994), Err(TokenError::NotYetValid));
    }

    #[test]
    fn keyring_errors_name_the_entry() {
        let err =
            KeyRing::parse("k1:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=,k2:!!!").unwrap_err();
        assert_eq!(
            err,
            KeyRingError::BadBase64 {
                index: 2,
                kid: "k2".into()
            }
        );
        assert!(err.to_string().contains("#2"));
        assert!(matches!(KeyRing::parse(""), Err(KeyRingError::Empty)));
        assert!(matches!(
            KeyRing::parse("nocolon"),
            Err(KeyRingError::NotAPair { index: 1, .. })
        ));
        assert!(matches!(
            KeyRing::parse("k:AAAA"),
            Err(KeyRingError::TooShort { .. })
        ));
        assert!(matches!(
            KeyRing::parse("bad kid:AAAA"),
            Err(KeyRingError::BadKid { .. })
        ));
    }

    #[test]
    fn peek_reads_the_claimed_type_only() {
        let t = ring().sign(&Claims::new(TokenType::Ticket, "a", Some("s".into()), 1, 1));
        assert_eq!(peek_type(&t), Some(TokenType::Ticket));
        assert_eq!(peek_type("v1.k1.!!.x"), None);
        assert_eq!(peek_type("nonsense"), None);
    }

    #[test]
    fn debug_hides_secrets() {
        let s = format!("{:?}", ring());
        assert!(s.contains("k1") && !s.contains("7, 7"));
    }
}
