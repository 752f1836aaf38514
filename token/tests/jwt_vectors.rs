//! JWT `user` tokens minted by PyJWT (`jwt_vectors.json`, made by
//! `make_jwt_vectors.py`), checked by the host build and, through
//! wasm-bindgen-test under Node, by the Wasm build: a shop's standard JWT
//! library and our verifier agree on both targets.

use serde::Deserialize;
use token::{Expect, KeyRing, TokenError, TokenType};

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

#[derive(Deserialize)]
struct Vectors {
    keys: String,
    valid: Vec<Valid>,
    refused: Vec<Refused>,
    accepted_at_edges: Vec<Refused>,
}

#[derive(Deserialize)]
struct Valid {
    name: String,
    token: String,
    now: u64,
    sub: String,
    iat: u64,
    exp: u64,
    #[serde(default)]
    jti: Option<String>,
}

#[derive(Deserialize)]
struct Refused {
    name: String,
    token: String,
    now: u64,
    #[serde(default)]
    error: Option<String>,
}

fn vectors() -> Vectors {
    serde_json::from_str(include_str!("jwt_vectors.json")).expect("jwt_vectors.json parses")
}

#[test]
fn library_minted_jwts_verify_as_user_tokens() {
    let v = vectors();
    let ring = KeyRing::parse(&v.keys).unwrap();
    for case in &v.valid {
        let claims = ring
            .verify_user(&case.token, case.now)
            .unwrap_or_else(|e| panic!("{}: {e:?}", case.name));
        assert_eq!(claims.typ, TokenType::User, "{}", case.name);
        assert_eq!(claims.sub, case.sub, "{}", case.name);
        assert_eq!(
            (claims.iat, claims.exp),
            (case.iat, case.exp),
            "{}",
            case.name
        );
        assert_eq!(claims.sale, None, "{}", case.name);
        assert_eq!(
            claims.jti,
            case.jti.clone().unwrap_or_default(),
            "{}",
            case.name
        );
    }
}

#[test]
fn refused_jwts_fail_with_their_own_error() {
    let v = vectors();
    let ring = KeyRing::parse(&v.keys).unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for case in &v.refused {
        let want = TokenError::from_code(case.error.as_deref().unwrap()).unwrap();
        assert_eq!(
            ring.verify_user(&case.token, case.now),
            Err(want),
            "vector {:?}",
            case.name
        );
        seen.insert(want.code());
    }
    for code in [
        "token_alg_refused",
        "token_unknown_kid",
        "token_bad_signature",
        "token_expired",
        "token_not_yet_valid",
        "token_malformed",
        "token_bad_subject",
    ] {
        assert!(seen.contains(code), "no refused vector for {code}");
    }
}

#[test]
fn jwt_skew_edges_are_accepted() {
    let v = vectors();
    let ring = KeyRing::parse(&v.keys).unwrap();
    for case in &v.accepted_at_edges {
        assert!(
            ring.verify_user(&case.token, case.now).is_ok(),
            "{}",
            case.name
        );
    }
}

#[test]
fn a_jwt_is_never_a_ticket_or_an_admit_token() {
    let v = vectors();
    let ring = KeyRing::parse(&v.keys).unwrap();
    for case in &v.valid {
        for typ in [TokenType::Admit, TokenType::Ticket, TokenType::User] {
            let expect = Expect {
                typ,
                sale: Some("drop-1").filter(|_| typ != TokenType::User),
            };
            assert_eq!(
                ring.verify(&case.token, expect, case.now),
                Err(TokenError::Malformed),
                "{} as {typ:?}",
                case.name
            );
        }
    }
}

#[test]
fn v1_user_tokens_still_verify_and_other_v1_types_do_not() {
    #[derive(Deserialize)]
    struct V1 {
        keys: String,
        valid: Vec<V1Valid>,
    }
    #[derive(Deserialize)]
    struct V1Valid {
        claims: token::Claims,
        token: String,
        now: u64,
    }
    let v: V1 = serde_json::from_str(include_str!("vectors.json")).unwrap();
    let ring = KeyRing::parse(&v.keys).unwrap();
    let mut users = 0;
    for case in &v.valid {
        let got = ring.verify_user(&case.token, case.now);
        if case.claims.typ == TokenType::User {
            assert_eq!(got.as_ref(), Ok(&case.claims));
            users += 1;
        } else {
            assert_eq!(got, Err(TokenError::WrongType));
        }
    }
    assert!(users > 0, "vectors.json has a v1 user token");
}
