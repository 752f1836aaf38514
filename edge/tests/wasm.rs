//! Wasm-only checks of the edge's pure logic, run by wasm-bindgen-test under
//! Node (scripts/test-wasm): the draw gives the same order in Wasm as on the
//! host, and a timing of token verification (printed, never asserted: a
//! benchmark is not a test).
#![cfg(target_arch = "wasm32")]

use edge::draw::hash as draw;
use token::{Claims, Expect, KeyRing, TokenType};
use wasm_bindgen_test::{console_log, wasm_bindgen_test};

#[wasm_bindgen_test]
fn draw_matches_the_host_vector() {
    // Same vector as the host test `draw_vector_is_stable` in edge/src/draw/hash.rs.
    assert_eq!(
        draw::commitment(&[0u8; 32]),
        "66687aadf862bd776c8fc18b8e9f8e20089714856ee233b3902a591d0d5f2925"
    );
    let leaves: Vec<String> = (1..=6)
        .map(|i| draw::leaf_hex(&format!("acct-{i}"), &[0u8; 16]))
        .collect();
    let key = draw::key_of(&[0u8; 32], &leaves, b"");
    let order: Vec<usize> = draw::draw_order(&key, &leaves)
        .iter()
        .map(|d| leaves.iter().position(|l| *l == d.leaf).unwrap() + 1)
        .collect();
    assert_eq!(order, [6, 5, 1, 4, 3, 2]);
}

#[wasm_bindgen_test]
fn bench_token_verify_in_wasm() {
    let ring = KeyRing::from_keys(&[("k1", &[7u8; 32]), ("k0", &[9u8; 32])]).unwrap();
    let now = 1_767_000_000;
    let claims = Claims::new(TokenType::Admit, "acct-42", Some("drop-1".into()), now, 120);
    let t = ring.sign(&claims);
    let expect = Expect {
        typ: TokenType::Admit,
        sale: Some("drop-1"),
    };
    let n = 20_000u32;
    // Warm up.
    for _ in 0..1_000 {
        assert!(ring.verify(&t, expect, now).is_ok());
    }
    let t0 = js_sys::Date::now();
    let mut ok = 0u32;
    for _ in 0..n {
        ok += u32::from(ring.verify(&t, expect, now).is_ok());
    }
    let ms = js_sys::Date::now() - t0;
    assert_eq!(ok, n);
    let t1 = js_sys::Date::now();
    for _ in 0..n {
        let _ = ring.sign(&claims);
    }
    let sign_ms = js_sys::Date::now() - t1;
    console_log!(
        "BENCH token_verify_us={:.2} token_sign_us={:.2} (n={n}, wasm32 under Node)",
        ms * 1000.0 / f64::from(n),
        sign_ms * 1000.0 / f64::from(n)
    );
}

#[wasm_bindgen_test]
fn bench_pow_verify_in_wasm() {
    use edge::botcheck::join::Proof;
    use edge::botcheck::pow::{self as botcheck, CHALLENGE_TTL_MS};
    let ring = KeyRing::from_keys(&[("k1", &[7u8; 32]), ("k0", &[9u8; 32])]).unwrap();
    let now = 1_767_000_000_000u64;
    // The difficulty does not change the verify cost (one hash either way).
    let (c, _) = botcheck::issue(
        &ring,
        "acct-42",
        "drop-1",
        8,
        now,
        CHALLENGE_TTL_MS,
        token::random_jti(),
    );
    let nonce = botcheck::solve(&c, 8, 0, 1 << 20).unwrap();
    let proof = Proof {
        challenge: Some(c.clone()),
        nonce: Some(nonce.to_string()),
        turnstile: None,
    };
    let n = 20_000u32;
    for _ in 0..1_000 {
        assert!(botcheck::verify(&ring, &proof, "acct-42", "drop-1", 8, now).is_ok());
    }
    let t0 = js_sys::Date::now();
    let mut ok = 0u32;
    for _ in 0..n {
        ok += u32::from(botcheck::verify(&ring, &proof, "acct-42", "drop-1", 8, now).is_ok());
    }
    let ms = js_sys::Date::now() - t0;
    assert_eq!(ok, n);
    console_log!(
        "BENCH pow_verify_us={:.2} (n={n}, {}-byte challenge, wasm32 under Node)",
        ms * 1000.0 / f64::from(n),
        c.len()
    );
}
