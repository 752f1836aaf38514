//! Hostile input at scale (issue 17): 10^5 cases a property. Every way a
//! token can be wrong is built on purpose and must be refused with its own
//! code, in both formats (v1 and JWT user tokens); arbitrary and
//! near-valid strings must never panic and never pass.
#![cfg(not(target_arch = "wasm32"))]

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use proptest::prelude::*;
use sha2::Sha256;
use token::{Claims, Expect, KeyRing, TokenError, TokenType};

const CASES: u32 = 100_000;
const NOW: u64 = 1_900_000_000;
const SECRET_A: [u8; 32] = [1; 32];

fn ring() -> KeyRing {
    KeyRing::from_keys(&[("a", &SECRET_A), ("b", &[2u8; 32])]).unwrap()
}

fn b64(b: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(b)
}

fn hmac(secret: &[u8], signed: &str) -> String {
    let mut m = Hmac::<Sha256>::new_from_slice(secret).unwrap();
    m.update(signed.as_bytes());
    b64(&m.finalize().into_bytes())
}

/// A v1 text with any payload bytes, signed by key `a` (so only the
/// payload can be what is wrong).
fn v1_signed(payload: &[u8]) -> String {
    let head = format!("v1.a.{}", b64(payload));
    let sig = hmac(&SECRET_A, &head);
    format!("{head}.{sig}")
}

/// A JWT with any header and claims, signed HS256 by key `a`.
fn jwt_signed(header: &serde_json::Value, claims: &serde_json::Value) -> String {
    let head = format!(
        "{}.{}",
        b64(header.to_string().as_bytes()),
        b64(claims.to_string().as_bytes())
    );
    let sig = hmac(&SECRET_A, &head);
    format!("{head}.{sig}")
}

/// One thing wrong with a v1 token (or nothing).
#[derive(Debug, Clone, Copy)]
enum Fault {
    None,
    UnknownKid,
    OtherSecret,
    WrongType,
    WrongSale,
    Expired,
    NotYetValid,
    GarbagePayload,
    ExtraPart,
}

fn fault() -> impl Strategy<Value = Fault> {
    prop_oneof![
        Just(Fault::None),
        Just(Fault::UnknownKid),
        Just(Fault::OtherSecret),
        Just(Fault::WrongType),
        Just(Fault::WrongSale),
        Just(Fault::Expired),
        Just(Fault::NotYetValid),
        Just(Fault::GarbagePayload),
        Just(Fault::ExtraPart),
    ]
}

fn typ() -> impl Strategy<Value = TokenType> {
    prop_oneof![
        Just(TokenType::User),
        Just(TokenType::Ticket),
        Just(TokenType::Admit)
    ]
}

fn other(t: TokenType) -> TokenType {
    match t {
        TokenType::User => TokenType::Admit,
        TokenType::Ticket => TokenType::User,
        TokenType::Admit => TokenType::Ticket,
    }
}

/// A string near `valid`: one char replaced, inserted or removed.
fn mutate(valid: &str, i: prop::sample::Index, c: char, how: u8) -> String {
    let mut chars: Vec<char> = valid.chars().collect();
    let i = i.index(chars.len());
    match how {
        0 => chars[i] = c,
        1 => chars.insert(i, c),
        _ => {
            chars.remove(i);
        }
    }
    chars.into_iter().collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn each_v1_fault_has_its_own_code(
        f in fault(),
        t in typ(),
        sub in "[A-Za-z0-9_-]{1,20}",
        sale in "[a-z0-9-]{1,12}",
        ttl in 1u64..100_000,
        age in 0u64..1_000,
        junk in prop::collection::vec(any::<u8>(), 1..40),
    ) {
        let r = ring();
        let iat = NOW - age.min(ttl);
        let mut c = Claims::new(t, sub, Some(sale.clone()), iat, ttl);
        let mut expect_sale = sale.clone();
        let mut expect_typ = t;
        let mut verify_with = r.clone();
        let want = match f {
            Fault::None => None,
            Fault::UnknownKid => {
                verify_with = KeyRing::from_keys(&[("b", &[2u8; 32])]).unwrap();
                Some(TokenError::UnknownKid)
            }
            Fault::OtherSecret => {
                verify_with = KeyRing::from_keys(&[("a", &[9u8; 32])]).unwrap();
                Some(TokenError::BadSignature)
            }
            Fault::WrongType => {
                expect_typ = other(t);
                Some(TokenError::WrongType)
            }
            Fault::WrongSale => {
                expect_sale.push('x');
                Some(TokenError::WrongSale)
            }
            Fault::Expired => {
                c.iat = NOW - ttl - 6 - age;
                c.exp = NOW - 6 - age;
                Some(TokenError::Expired)
            }
            Fault::NotYetValid => {
                c.iat = NOW + 6 + age;
                c.exp = c.iat + ttl;
                Some(TokenError::NotYetValid)
            }
            Fault::GarbagePayload | Fault::ExtraPart => Some(TokenError::Malformed),
        };
        let mut text = match f {
            Fault::GarbagePayload => v1_signed(&junk),
            _ => r.sign(&c),
        };
        if let Fault::ExtraPart = f {
            text.push_str(".x");
        }
        let expect = Expect { typ: expect_typ, sale: Some(&expect_sale) };
        let got = verify_with.verify(&text, expect, NOW);
        match want {
            None => prop_assert_eq!(got, Ok(c)),
            Some(e) => prop_assert_eq!(got, Err(e)),
        }
    }

    #[test]
    fn each_jwt_fault_has_its_own_code(
        alg in prop_oneof![Just("HS256".to_string()), Just("none".to_string()), Just("HS384".to_string()), Just("RS256".to_string()), Just("hs256".to_string()), "[A-Za-z0-9]{0,6}"],
        kid in prop_oneof![Just(Some("a")), Just(Some("zz")), Just(None)],
        crit in any::<bool>(),
        sub in prop_oneof![Just(serde_json::json!("")), Just(serde_json::json!(7)), "[a-z0-9]{1,12}".prop_map(serde_json::Value::from)],
        exp_in in -100i64..100_000,
        iat_ago in -100i64..100_000,
    ) {
        let mut header = serde_json::json!({"alg": alg, "typ": "JWT"});
        if let Some(k) = kid {
            header["kid"] = k.into();
        }
        if crit {
            header["crit"] = serde_json::json!(["exp"]);
        }
        let exp = NOW as i64 + exp_in;
        let iat = NOW as i64 - iat_ago;
        let claims = serde_json::json!({"sub": sub, "exp": exp, "iat": iat});
        let text = jwt_signed(&header, &claims);
        let got = ring().verify_user(&text, NOW);
        let skew = token::CLOCK_SKEW_SECS as i64;
        // The order of the checks is the order of the refusals.
        let want = if alg != "HS256" {
            Err(TokenError::AlgRefused)
        } else if crit {
            Err(TokenError::Malformed)
        } else if kid != Some("a") {
            Err(TokenError::UnknownKid)
        } else if sub.as_str().is_none_or(|s| s.is_empty()) {
            Err(TokenError::Malformed)
        } else if NOW as i64 > exp + skew {
            Err(TokenError::Expired)
        } else if iat > NOW as i64 + skew {
            Err(TokenError::NotYetValid)
        } else {
            Ok(sub.as_str().unwrap().to_string())
        };
        prop_assert_eq!(got.map(|c| c.sub), want);
        // A JWT is never a ticket or an admit token.
        let as_v1 = Expect { typ: TokenType::User, sale: None };
        prop_assert_eq!(ring().verify(&text, as_v1, NOW).err(), Some(TokenError::Malformed));
    }

    #[test]
    fn a_near_valid_token_is_refused_with_a_code(
        t in typ(),
        i in any::<prop::sample::Index>(),
        c in any::<char>(),
        how in 0u8..3,
    ) {
        let r = ring();
        let claims = Claims::new(t, "acct", Some("s1".into()), NOW, 120);
        let valid = r.sign(&claims);
        let text = mutate(&valid, i, c, how);
        prop_assume!(text != valid);
        let expect = Expect { typ: t, sale: Some("s1") };
        let e = r.verify(&text, expect, NOW).unwrap_err();
        // A changed token is refused before its claims are read: only the
        // format, the key id or the signature can be what is wrong.
        prop_assert!(matches!(e, TokenError::Malformed | TokenError::UnknownKid | TokenError::BadSignature), "{e:?}");
    }

    #[test]
    fn arbitrary_text_never_panics_and_never_passes(
        s in prop_oneof![
            any::<String>(),
            "[A-Za-z0-9_.-]{0,200}",
            "v1\\.[ab]\\.[A-Za-z0-9_-]{0,80}\\.[A-Za-z0-9_-]{0,50}",
            "eyJ[A-Za-z0-9_-]{0,60}\\.[A-Za-z0-9_-]{0,60}\\.[A-Za-z0-9_-]{0,50}",
        ],
    ) {
        let r = ring();
        for t in [TokenType::User, TokenType::Ticket, TokenType::Admit] {
            let expect = Expect { typ: t, sale: Some("s1") };
            prop_assert!(r.verify(&s, expect, NOW).is_err());
        }
        prop_assert!(r.verify_user(&s, NOW).is_err());
        prop_assert!(r.verify_tagged("pow", &s).is_err());
        let _ = token::peek_type(&s);
    }

    #[test]
    fn signed_garbage_payloads_are_malformed(payload in prop::collection::vec(any::<u8>(), 1..120)) {
        // The signature holds; whatever the payload is, it is not claims
        // (valid claims JSON is vanishingly rare in random bytes).
        let text = v1_signed(&payload);
        prop_assume!(serde_json::from_slice::<Claims>(&payload).is_err());
        prop_assert_eq!(ring().verify_signature(&text).err(), Some(TokenError::Malformed));
    }
}
