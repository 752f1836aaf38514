//! Property tests: sign→verify round-trips for arbitrary claims, any single
//! byte changed is refused, and random input never panics the verifier.
#![cfg(not(target_arch = "wasm32"))]

use proptest::prelude::*;
use token::{Claims, Expect, KeyRing, TicketData, TokenType};

fn ring() -> KeyRing {
    KeyRing::from_keys(&[("a", &[1u8; 32]), ("b", &[2u8; 32])]).unwrap()
}

fn typ() -> impl Strategy<Value = TokenType> {
    prop_oneof![
        Just(TokenType::User),
        Just(TokenType::Ticket),
        Just(TokenType::Admit)
    ]
}

fn claims() -> impl Strategy<Value = Claims> {
    (
        typ(),
        "\\PC{1,40}",
        proptest::option::of("[a-z0-9-]{1,20}"),
        0u64..4_000_000_000,
        0u64..100_000,
        proptest::option::of((1u64..1 << 40, proptest::option::of(1u64..1 << 40))),
    )
        .prop_map(|(typ, sub, sale, iat, ttl, tkt)| {
            let mut c = Claims::new(typ, sub, sale, iat, ttl);
            c.tkt = tkt.map(|(seq, place)| TicketData {
                seq,
                place,
                ..Default::default()
            });
            c
        })
}

proptest! {
    #[test]
    fn sign_then_verify_round_trips(c in claims()) {
        let r = ring();
        let t = r.sign(&c);
        let got = r.verify(&t, Expect { typ: c.typ, sale: c.sale.as_deref() }, c.iat).unwrap();
        prop_assert_eq!(got, c);
    }

    #[test]
    fn any_single_byte_change_is_refused(c in claims(), pos in any::<prop::sample::Index>(), byte in any::<u8>()) {
        let r = ring();
        let t = r.sign(&c);
        let mut bytes = t.clone().into_bytes();
        let i = pos.index(bytes.len());
        prop_assume!(bytes[i] != byte);
        bytes[i] = byte;
        let changed = String::from_utf8_lossy(&bytes).into_owned();
        prop_assert!(r.verify_signature(&changed).is_err(), "accepted {changed}");
    }

    #[test]
    fn random_strings_never_panic(s in "\\PC{0,300}") {
        let _ = ring().verify(&s, Expect { typ: TokenType::Admit, sale: Some("x") }, 0);
    }

    #[test]
    fn random_dotted_strings_never_panic(parts in proptest::collection::vec("[A-Za-z0-9_-]{0,60}", 0..6)) {
        let s = parts.join(".");
        let _ = ring().verify(&s, Expect { typ: TokenType::User, sale: None }, 0);
        let with_v1 = format!("v1.a.{s}");
        let _ = ring().verify(&with_v1, Expect { typ: TokenType::User, sale: None }, 0);
    }

    #[test]
    fn random_strings_never_panic_as_user_tokens(s in "\\PC{0,300}") {
        prop_assert!(ring().verify_user(&s, 0).is_err());
    }

    #[test]
    fn jwt_shaped_strings_never_panic(
        header in prop::collection::btree_map("[a-z]{1,5}", any::<i64>().prop_map(serde_json::Value::from), 0..4),
        alg in prop::option::of("(HS256|none|RS256|hs256)"),
        payload in "\\PC{0,80}",
        sig in "[A-Za-z0-9_-]{0,50}",
    ) {
        use base64::Engine;
        let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        let mut h = serde_json::Map::from_iter(header);
        if let Some(alg) = alg {
            h.insert("alg".into(), alg.into());
        }
        h.insert("kid".into(), "k1".into());
        let t = format!("{}.{}.{sig}", b64(serde_json::to_string(&h).unwrap().as_bytes()), b64(payload.as_bytes()));
        // Without the key nothing verifies, whatever the header says.
        prop_assert!(ring().verify_user(&t, 0).is_err());
    }
}
