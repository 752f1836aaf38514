//! The admin key (pure, host-tested): who may read operator-only routes of
//! the edge (`GET /api/sales/{sale}/metrics`: issue 44 #3, whose scrapes
//! anyone could send to the sale's one coordinator).
//!
//! Role: parse the worker secret `ADMIN_KEYS` and check a request's
//! `Authorization: Bearer <secret>` against it. The Worker
//! (`worker::audit`) reads the secret and the header and turns a refusal
//! into an answer.
//!
//! `ADMIN_KEYS` is `id:secret[,id:secret…]`, the shape of the token key
//! rings: the id names the key in logs (never the secret), and several keys
//! at once allow rotation (add the new one, move the scrapers, remove the
//! old one). `id:read:secret` and `id:write:secret` (the origin admin API's
//! `kid:scope:secret` of DESIGN.md) are read too, so one value can serve
//! both; any scope may read metrics.
//!
//! Invariants kept here:
//! - a key is an id of 1-64 of `[A-Za-z0-9_-]`, unique in the list, and a
//!   secret of at least [`MIN_SECRET_LEN`] visible ASCII characters (no
//!   comma, no space): a short or malformed list is refused whole, naming
//!   the id or position, never a secret;
//! - the check compares SHA-256 digests of the presented and every stored
//!   secret in constant time (`subtle`), against every key, without
//!   stopping at a match: how long it takes says nothing about which byte,
//!   which key, or how long a secret is;
//! - no configured key (unset or empty) lets nobody in: a missing key and a
//!   wrong key get the same 401 `admin_key_required`.

use sha2::{Digest, Sha256};
use subtle::{Choice, ConstantTimeEq};

use crate::api::error::ApiError;
use crate::api::routes;

/// The shortest secret accepted: 16 bytes as base64 (what `scripts/dev-vars`
/// and the token rings ask for).
pub const MIN_SECRET_LEN: usize = 22;

/// The parsed `ADMIN_KEYS`: ids and the digests of their secrets.
#[derive(Clone, Default)]
pub struct AdminKeys {
    keys: Vec<(String, [u8; 32])>,
}

impl std::fmt::Debug for AdminKeys {
    /// Ids only: a secret's digest is no business of a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.keys.iter().map(|(id, _)| id))
            .finish()
    }
}

fn digest(secret: &[u8]) -> [u8; 32] {
    Sha256::digest(secret).into()
}

fn valid_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl AdminKeys {
    /// Reads `ADMIN_KEYS` (`None` or blank: no key).
    pub fn parse(raw: Option<&str>) -> Result<AdminKeys, String> {
        let raw = raw.unwrap_or("").trim();
        let mut keys: Vec<(String, [u8; 32])> = Vec::new();
        if raw.is_empty() {
            return Ok(AdminKeys { keys });
        }
        for (i, entry) in raw.split(',').enumerate() {
            let entry = entry.trim();
            let Some((id, rest)) = entry.split_once(':') else {
                return Err(format!("ADMIN_KEYS entry {} is not id:secret", i + 1));
            };
            if !valid_id(id) {
                return Err(format!(
                    "ADMIN_KEYS entry {}: the id must be 1-64 of A-Z a-z 0-9 _ -",
                    i + 1
                ));
            }
            let secret = match rest.split_once(':') {
                Some(("read" | "write", s)) => s,
                _ => rest,
            };
            if secret.len() < MIN_SECRET_LEN || !secret.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(format!(
                    "ADMIN_KEYS key {id:?}: the secret must be at least {MIN_SECRET_LEN} visible \
                     ASCII characters"
                ));
            }
            if keys.iter().any(|(k, _)| k == id) {
                return Err(format!("ADMIN_KEYS names key {id:?} twice"));
            }
            keys.push((id.to_string(), digest(secret.as_bytes())));
        }
        Ok(AdminKeys { keys })
    }

    /// How many keys are configured.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The id of the key the request's `Authorization` header carries, or
    /// 401 `admin_key_required` (no header, not a bearer, no such key).
    pub fn check(&self, authorization: Option<&str>) -> Result<&str, ApiError> {
        let presented = routes::bearer(authorization).ok_or_else(ApiError::admin_key_required)?;
        let d = digest(presented.as_bytes());
        // Every key is compared, whatever matched before.
        let mut found: Option<&str> = None;
        for (id, stored) in &self.keys {
            let hit: Choice = stored[..].ct_eq(&d[..]);
            if bool::from(hit) && found.is_none() {
                found = Some(id.as_str());
            }
        }
        found.ok_or_else(ApiError::admin_key_required)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "A1b2C3d4E5f6G7h8I9j0KLmn";
    const B: &str = "zYxWvUtSrQpOnMlKjIhGfEdC==";

    #[test]
    fn several_keys_each_let_in_and_name_their_id() {
        let k = AdminKeys::parse(Some(&format!("old:{A}, new:{B}"))).unwrap();
        assert_eq!(k.len(), 2);
        assert_eq!(k.check(Some(&format!("Bearer {A}"))), Ok("old"));
        assert_eq!(k.check(Some(&format!("Bearer {B}"))), Ok("new"));
        // The origin admin API's scoped form is read too.
        let k = AdminKeys::parse(Some(&format!("ops:read:{A},root:write:{B}"))).unwrap();
        assert_eq!(k.check(Some(&format!("Bearer {A}"))), Ok("ops"));
        assert_eq!(k.check(Some(&format!("Bearer {B}"))), Ok("root"));
        assert_eq!(format!("{k:?}"), r#"["ops", "root"]"#, "ids only");
    }

    #[test]
    fn no_key_or_a_wrong_key_is_admin_key_required() {
        let k = AdminKeys::parse(Some(&format!("ops:{A}"))).unwrap();
        let near = format!("{}x", &A[..A.len() - 1]);
        for h in [
            None,
            Some(""),
            Some("Bearer "),
            Some(A),
            Some("Basic b3BzOnNlY3JldA=="),
            Some(&*format!("Bearer {near}")),
            Some(&*format!("Bearer {A}{A}")),
            Some(&*format!("Bearer ops:{A}")),
        ] {
            let e = k.check(h).unwrap_err();
            assert_eq!(
                (e.status, e.code.as_str()),
                (401, "admin_key_required"),
                "{h:?}"
            );
        }
    }

    #[test]
    fn without_keys_nobody_is_let_in() {
        for raw in [None, Some(""), Some("  ")] {
            let k = AdminKeys::parse(raw).unwrap();
            assert!(k.is_empty());
            assert_eq!(
                k.check(Some(&format!("Bearer {A}"))).unwrap_err().code,
                "admin_key_required"
            );
            assert_eq!(k.check(Some("Bearer ")).unwrap_err().status, 401);
        }
    }

    #[test]
    fn malformed_lists_are_refused_without_showing_a_secret() {
        for raw in [
            "nocolon".to_string(),
            format!(":{A}"),
            format!("bad id:{A}"),
            "short:abc".to_string(),
            format!("ops:{A} x"),
            format!("ops:{A},ops:{B}"),
            format!("ops:{A},"),
            format!("{}:{A}", "i".repeat(65)),
        ] {
            let e = AdminKeys::parse(Some(&raw)).unwrap_err();
            assert!(!e.contains(A) && !e.contains(B), "{e}");
        }
    }
}
