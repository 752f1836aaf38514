//! Regenerates `tests/vectors.json`: `cargo run -p token --example make_vectors > token/tests/vectors.json`.
//!
//! The vectors pin the wire format; regenerate only on a deliberate format
//! change (and then bump `VERSION`).

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use hmac::{Hmac, KeyInit, Mac};
use serde_json::json;
use sha2::Sha256;
use token::{Claims, KeyRing, TicketData, TokenType};

fn raw_sign(secret: &[u8], kid: &str, payload_b64: &str) -> String {
    let head = format!("v1.{kid}.{payload_b64}");
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).unwrap();
    mac.update(head.as_bytes());
    format!(
        "{head}.{}",
        URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
    )
}

fn main() {
    let k_new: Vec<u8> = (0u8..32).collect();
    let k_old: Vec<u8> = (100u8..132).collect();
    let k_stranger: Vec<u8> = vec![0x42; 32];
    let keys = format!(
        "k2025b:{},k2025a:{}",
        STANDARD.encode(&k_new),
        STANDARD.encode(&k_old)
    );
    let ring = KeyRing::parse(&keys).unwrap();
    let old_ring = KeyRing::parse(&format!("k2025a:{}", STANDARD.encode(&k_old))).unwrap();
    let now = 1_767_000_000u64;
    let jti = "AAECAwQFBgcICQoLDA0ODw".to_string();
    let user = Claims {
        typ: TokenType::User,
        sub: "acct-42".into(),
        sale: None,
        iat: now,
        exp: now + 3600,
        jti: jti.clone(),
        tkt: None,
    };
    let admit = Claims {
        typ: TokenType::Admit,
        sub: "acct-42".into(),
        sale: Some("drop-1".into()),
        iat: now,
        exp: now + 120,
        jti: jti.clone(),
        tkt: None,
    };
    let ticket = Claims {
        typ: TokenType::Ticket,
        sub: "acct-42".into(),
        sale: Some("drop-1".into()),
        iat: now,
        exp: now + 7200,
        jti: jti.clone(),
        tkt: Some(TicketData {
            seq: 17,
            place: Some(3),
            ..Default::default()
        }),
    };
    let pre = Claims {
        tkt: Some(TicketData {
            seq: 5,
            place: None,
            ..Default::default()
        }),
        ..ticket.clone()
    };
    let mut valid = vec![];
    for (c, r) in [
        (&user, &ring),
        (&admit, &ring),
        (&ticket, &ring),
        (&pre, &ring),
        (&admit, &old_ring),
    ] {
        let payload = serde_json::to_string(c).unwrap();
        valid.push(
            json!({"claims": c, "payload_json": payload, "token": r.sign(c), "now": now + 1}),
        );
    }
    let admit_tok = ring.sign(&admit);
    let payload_b64 = admit_tok.split('.').nth(2).unwrap().to_string();
    // Flip the first signature character: the last one also carries padding
    // bits, whose change the decoder refuses as malformed instead.
    let sig_at = admit_tok.rfind('.').unwrap() + 1;
    let first = &admit_tok[sig_at..sig_at + 1];
    let flipped_sig = format!(
        "{}{}{}",
        &admit_tok[..sig_at],
        if first == "A" { "B" } else { "A" },
        &admit_tok[sig_at + 1..]
    );
    let altered_payload = {
        let mut c = admit.clone();
        c.sub = "acct-43".into();
        let p = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&c).unwrap());
        let sig = admit_tok.split('.').nth(3).unwrap();
        format!("v1.k2025b.{p}.{sig}")
    };
    let not_json = raw_sign(&k_new, "k2025b", &URL_SAFE_NO_PAD.encode(b"{not json"));
    let missing_claim = raw_sign(
        &k_new,
        "k2025b",
        &URL_SAFE_NO_PAD.encode(br#"{"typ":"admit","sub":"a"}"#),
    );
    let bad_typ = raw_sign(
        &k_new,
        "k2025b",
        &URL_SAFE_NO_PAD.encode(br#"{"typ":"root","sub":"a","iat":1,"exp":2,"jti":"x"}"#),
    );
    let stranger = raw_sign(&k_stranger, "k9", &payload_b64);
    let wrong_key_same_kid = raw_sign(&k_stranger, "k2025b", &payload_b64);
    let e_admit = json!({"typ": "admit", "sale": "drop-1"});
    let with_sub = |sub: &str| {
        ring.sign(&Claims {
            sub: sub.into(),
            ..admit.clone()
        })
    };
    let refused = vec![
        json!({"name": "empty", "token": "", "expect": e_admit, "now": now, "error": "token_malformed"}),
        json!({"name": "garbage", "token": "hello", "expect": e_admit, "now": now, "error": "token_malformed"}),
        json!({"name": "wrong version", "token": admit_tok.replacen("v1.", "v2.", 1), "expect": e_admit, "now": now, "error": "token_malformed"}),
        json!({"name": "extra part", "token": format!("{admit_tok}.x"), "expect": e_admit, "now": now, "error": "token_malformed"}),
        json!({"name": "payload not json", "token": not_json, "expect": e_admit, "now": now, "error": "token_malformed"}),
        json!({"name": "claim missing", "token": missing_claim, "expect": e_admit, "now": now, "error": "token_malformed"}),
        json!({"name": "unknown typ", "token": bad_typ, "expect": e_admit, "now": now, "error": "token_malformed"}),
        json!({"name": "unknown kid", "token": stranger, "expect": e_admit, "now": now, "error": "token_unknown_kid"}),
        json!({"name": "signature flipped", "token": flipped_sig, "expect": e_admit, "now": now, "error": "token_bad_signature"}),
        json!({"name": "payload altered", "token": altered_payload, "expect": e_admit, "now": now, "error": "token_bad_signature"}),
        json!({"name": "forged with another key", "token": wrong_key_same_kid, "expect": e_admit, "now": now, "error": "token_bad_signature"}),
        json!({"name": "user token as admit", "token": ring.sign(&user), "expect": e_admit, "now": now, "error": "token_wrong_type"}),
        json!({"name": "admit token for another sale", "token": admit_tok, "expect": {"typ": "admit", "sale": "drop-2"}, "now": now, "error": "token_wrong_sale"}),
        json!({"name": "expired beyond skew", "token": admit_tok, "expect": e_admit, "now": now + 126, "error": "token_expired"}),
        json!({"name": "issued in the future beyond skew", "token": admit_tok, "expect": e_admit, "now": now - 6, "error": "token_not_yet_valid"}),
        json!({"name": "account id with U+0000", "token": with_sub("acct\u{0}42"), "expect": e_admit, "now": now, "error": "token_bad_subject"}),
        json!({"name": "account id with a line feed", "token": with_sub("acct\n42"), "expect": e_admit, "now": now, "error": "token_bad_subject"}),
        json!({"name": "account id with U+0085 (a C1 control)", "token": with_sub("acct\u{85}42"), "expect": e_admit, "now": now, "error": "token_bad_subject"}),
        json!({"name": "account id empty", "token": with_sub(""), "expect": e_admit, "now": now, "error": "token_bad_subject"}),
        json!({"name": "account id of 257 bytes", "token": with_sub(&"a".repeat(257)), "expect": e_admit, "now": now, "error": "token_bad_subject"}),
    ];
    let accepted_edges = vec![
        json!({"name": "expired within skew", "token": admit_tok, "expect": e_admit, "now": now + 125}),
        json!({"name": "future within skew", "token": admit_tok, "expect": e_admit, "now": now - 5}),
        json!({"name": "account id of 256 bytes, non-ASCII", "token": with_sub(&"é".repeat(128)), "expect": e_admit, "now": now}),
    ];
    let out = json!({
        "comment": "Shared test vectors for the v1 token format. Checked by the host build (cargo test -p token) and the Wasm build (wasm-bindgen-test). Regenerate: cargo run -p token --example make_vectors.",
        "keys": keys,
        "valid": valid,
        "refused": refused,
        "accepted_at_edges": accepted_edges,
    });
    println!("{}", serde_json::to_string_pretty(&out).unwrap());
}
