//! The shared test vectors, checked by the host build and (through
//! wasm-bindgen-test under Node) by the Wasm build: one file, two targets,
//! so a token minted by either side verifies on the other.

use serde::Deserialize;
use token::{Claims, Expect, KeyRing, TokenError, TokenType};

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
    claims: Claims,
    payload_json: String,
    token: String,
    now: u64,
}

#[derive(Deserialize)]
struct ExpectJson {
    typ: TokenType,
    sale: Option<String>,
}

#[derive(Deserialize)]
struct Refused {
    name: String,
    token: String,
    expect: ExpectJson,
    now: u64,
    #[serde(default)]
    error: Option<String>,
}

fn vectors() -> Vectors {
    serde_json::from_str(include_str!("vectors.json")).expect("vectors.json parses")
}

#[test]
fn valid_vectors_sign_and_verify_exactly() {
    let v = vectors();
    let ring = KeyRing::parse(&v.keys).unwrap();
    for case in &v.valid {
        assert_eq!(
            serde_json::to_string(&case.claims).unwrap(),
            case.payload_json
        );
        if case.token.split('.').nth(1) == Some(ring.signing_kid()) {
            assert_eq!(
                ring.sign(&case.claims),
                case.token,
                "signing is deterministic"
            );
        }
        let expect = Expect {
            typ: case.claims.typ,
            sale: case.claims.sale.as_deref(),
        };
        assert_eq!(
            ring.verify(&case.token, expect, case.now).unwrap(),
            case.claims
        );
    }
}

#[test]
fn refused_vectors_fail_with_their_own_error() {
    let v = vectors();
    let ring = KeyRing::parse(&v.keys).unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for case in &v.refused {
        let want = TokenError::from_code(case.error.as_deref().unwrap()).unwrap();
        let expect = Expect {
            typ: case.expect.typ,
            sale: case.expect.sale.as_deref(),
        };
        let got = ring.verify(&case.token, expect, case.now);
        assert_eq!(got, Err(want), "vector {:?}", case.name);
        seen.insert(want.code());
    }
    assert_eq!(
        seen.len(),
        8,
        "every error kind but the JWT-only alg_refused has a vector: {seen:?}"
    );
}

#[test]
fn skew_edges_are_accepted() {
    let v = vectors();
    let ring = KeyRing::parse(&v.keys).unwrap();
    for case in &v.accepted_at_edges {
        let expect = Expect {
            typ: case.expect.typ,
            sale: case.expect.sale.as_deref(),
        };
        assert!(
            ring.verify(&case.token, expect, case.now).is_ok(),
            "{}",
            case.name
        );
    }
}

#[test]
fn fresh_tokens_have_unique_jti() {
    let v = vectors();
    let ring = KeyRing::parse(&v.keys).unwrap();
    let a = Claims::new(TokenType::User, "x", None, 1, 10);
    let b = Claims::new(TokenType::User, "x", None, 1, 10);
    assert_ne!(a.jti, b.jti);
    assert_eq!(a.jti.len(), 22, "128 bits in base64url without padding");
    assert_ne!(ring.sign(&a), ring.sign(&b));
}
