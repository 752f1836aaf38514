//! Signing outgoing webhooks the way Standard Webhooks specifies
//! (<https://www.standardwebhooks.com>), so a shop verifies them with the
//! libraries that exist for that spec (docs/webhooks.md has a receiver).
//!
//! Pure. Invariants kept here: the signature covers exactly
//! `{webhook-id}.{webhook-timestamp}.{body}` with the bytes that are sent;
//! a secret is `whsec_` + base64 of 24 random bytes, and only its decoded
//! bytes key the HMAC.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// How Standard Webhooks writes a secret.
pub const SECRET_PREFIX: &str = "whsec_";

/// A fresh endpoint secret: `whsec_` + base64 of 24 random bytes.
pub fn new_secret() -> String {
    let bytes: [u8; 24] = rand::random();
    format!("{SECRET_PREFIX}{}", STANDARD.encode(bytes))
}

/// The key bytes of a `whsec_…` secret; `None` when it is not one.
pub fn secret_key(secret: &str) -> Option<Vec<u8>> {
    let b64 = secret.strip_prefix(SECRET_PREFIX)?;
    STANDARD.decode(b64).ok().filter(|k| !k.is_empty())
}

/// `v1,<base64 HMAC-SHA256 of id.timestamp.body>` under `key`.
pub fn signature(key: &[u8], id: &str, timestamp: i64, body: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body.as_bytes());
    format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
}

/// The `webhook-signature` header: one signature per key, space-separated
/// (during a rotation the old secret signs too, so a receiver that still
/// has it keeps verifying).
pub fn signature_header(keys: &[Vec<u8>], id: &str, timestamp: i64, body: &str) -> String {
    keys.iter()
        .map(|k| signature(k, id, timestamp, body))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Standard Webhooks test vector (the spec's reference libraries
    /// all check this one).
    #[test]
    fn the_spec_test_vector() {
        let key = secret_key("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        assert_eq!(
            signature(
                &key,
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                1_614_265_330,
                r#"{"test": 2432232314}"#
            ),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn a_new_secret_is_24_random_bytes_in_the_spec_format() {
        let (a, b) = (new_secret(), new_secret());
        assert!(a.starts_with("whsec_"));
        assert_eq!(secret_key(&a).unwrap().len(), 24);
        assert_ne!(a, b);
    }

    #[test]
    fn a_secret_not_in_the_format_has_no_key() {
        for bad in [
            "",
            "whsec_",
            "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "whsec_!!!",
        ] {
            assert_eq!(secret_key(bad), None, "{bad}");
        }
    }

    #[test]
    fn each_key_signs_and_the_signatures_are_space_separated() {
        let (k1, k2) = (vec![1u8; 24], vec![2u8; 24]);
        let h = signature_header(&[k1.clone(), k2.clone()], "evt_1", 5, "{}");
        assert_eq!(
            h,
            format!(
                "{} {}",
                signature(&k1, "evt_1", 5, "{}"),
                signature(&k2, "evt_1", 5, "{}")
            )
        );
        assert_ne!(
            signature(&k1, "evt_1", 5, "{}"),
            signature(&k1, "evt_1", 6, "{}")
        );
    }
}
