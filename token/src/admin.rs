//! Operator keys (`ADMIN_KEYS`), one format for the edge and the origin:
//! who may call operator-only routes (the edge's sale metrics, the origin's
//! admin API and console) and whether they may change anything.
//!
//! `ADMIN_KEYS` is `kid:scope:secret[,…]` with scope `read` or `write`
//! (DESIGN.md's admin interface); `kid:secret` (the edge's older form) is a
//! `read` key. The id names the key in logs and the audit log, never the
//! secret; several keys at once allow rotation.
//!
//! Invariants kept here:
//! - a key is an id of 1-64 of `[A-Za-z0-9_-]`, unique in the list, and a
//!   secret of at least [`MIN_ADMIN_SECRET_LEN`] visible ASCII characters
//!   (no comma, no space): a short or malformed list is refused whole,
//!   naming the id or position, never a secret;
//! - a check compares SHA-256 digests of the presented and every stored
//!   secret in constant time (`subtle`), against every key, without
//!   stopping at a match: its time says nothing about which byte, which
//!   key, or how long a secret is;
//! - no configured key lets nobody in;
//! - only a `write` key may write ([`Scope::allows`]).

use sha2::{Digest, Sha256};
use subtle::{Choice, ConstantTimeEq};

/// The shortest secret accepted: 16 bytes as base64.
pub const MIN_ADMIN_SECRET_LEN: usize = 22;

/// What a key may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    /// Read figures, sales and the audit log.
    Read,
    /// Everything `Read` may, and change sales.
    Write,
}

impl Scope {
    /// Whether a key of this scope may do what `needed` asks.
    pub fn allows(self, needed: Scope) -> bool {
        self >= needed
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Write => "write",
        }
    }
}

/// The parsed `ADMIN_KEYS`: ids, scopes and the digests of their secrets.
#[derive(Clone, Default)]
pub struct AdminKeys {
    keys: Vec<(String, Scope, [u8; 32])>,
}

impl std::fmt::Debug for AdminKeys {
    /// Ids and scopes only: a secret's digest is no business of a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(
                self.keys
                    .iter()
                    .map(|(id, s, _)| format!("{id}:{}", s.as_str())),
            )
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
    /// Reads an `ADMIN_KEYS` value (`None` or blank: no key).
    pub fn parse(raw: Option<&str>) -> Result<AdminKeys, String> {
        let raw = raw.unwrap_or("").trim();
        let mut keys: Vec<(String, Scope, [u8; 32])> = Vec::new();
        if raw.is_empty() {
            return Ok(AdminKeys { keys });
        }
        for (i, entry) in raw.split(',').enumerate() {
            let entry = entry.trim();
            let Some((id, rest)) = entry.split_once(':') else {
                return Err(format!(
                    "ADMIN_KEYS entry {} is not kid:scope:secret",
                    i + 1
                ));
            };
            if !valid_id(id) {
                return Err(format!(
                    "ADMIN_KEYS entry {}: the id must be 1-64 of A-Z a-z 0-9 _ -",
                    i + 1
                ));
            }
            let (scope, secret) = match rest.split_once(':') {
                Some(("read", s)) => (Scope::Read, s),
                Some(("write", s)) => (Scope::Write, s),
                // What stands there is not shown: it may be part of a secret.
                Some(_) => {
                    return Err(format!(
                        "ADMIN_KEYS key {id:?}: the scope must be read or write"
                    ));
                }
                None => (Scope::Read, rest),
            };
            if secret.len() < MIN_ADMIN_SECRET_LEN || !secret.bytes().all(|b| b.is_ascii_graphic())
            {
                return Err(format!(
                    "ADMIN_KEYS key {id:?}: the secret must be at least {MIN_ADMIN_SECRET_LEN} \
                     visible ASCII characters"
                ));
            }
            if keys.iter().any(|(k, _, _)| k == id) {
                return Err(format!("ADMIN_KEYS names key {id:?} twice"));
            }
            keys.push((id.to_string(), scope, digest(secret.as_bytes())));
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

    /// The secret-free description of each key (`id`, scope).
    pub fn ids(&self) -> impl Iterator<Item = (&str, Scope)> {
        self.keys.iter().map(|(id, s, _)| (id.as_str(), *s))
    }

    /// The id and scope of the key whose secret is `presented` (a bearer
    /// token, already taken out of its header), or `None`.
    pub fn check(&self, presented: &str) -> Option<(&str, Scope)> {
        let d = digest(presented.as_bytes());
        // Every key is compared, whatever matched before.
        let mut found: Option<(&str, Scope)> = None;
        for (id, scope, stored) in &self.keys {
            let hit: Choice = stored[..].ct_eq(&d[..]);
            if bool::from(hit) && found.is_none() {
                found = Some((id.as_str(), *scope));
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "A1b2C3d4E5f6G7h8I9j0KLmn";
    const B: &str = "zYxWvUtSrQpOnMlKjIhGfEdC==";

    #[test]
    fn several_keys_each_let_in_with_their_id_and_scope() {
        let k = AdminKeys::parse(Some(&format!("ops:read:{A}, root:write:{B}"))).unwrap();
        assert_eq!(k.len(), 2);
        assert_eq!(k.check(A), Some(("ops", Scope::Read)));
        assert_eq!(k.check(B), Some(("root", Scope::Write)));
        assert_eq!(
            format!("{k:?}"),
            r#"["ops:read", "root:write"]"#,
            "no secret"
        );
        // The edge's older unscoped form is a read key.
        let k = AdminKeys::parse(Some(&format!("old:{A}"))).unwrap();
        assert_eq!(k.check(A), Some(("old", Scope::Read)));
    }

    #[test]
    fn only_write_allows_writing() {
        assert!(Scope::Write.allows(Scope::Read));
        assert!(Scope::Write.allows(Scope::Write));
        assert!(Scope::Read.allows(Scope::Read));
        assert!(!Scope::Read.allows(Scope::Write));
    }

    #[test]
    fn a_wrong_or_near_secret_is_no_key() {
        let k = AdminKeys::parse(Some(&format!("ops:write:{A}"))).unwrap();
        let near = format!("{}x", &A[..A.len() - 1]);
        for p in [
            "",
            near.as_str(),
            &format!("{A}{A}"),
            &format!("ops:{A}"),
            &format!("write:{A}"),
        ] {
            assert_eq!(k.check(p), None, "{p:?}");
        }
    }

    #[test]
    fn without_keys_nobody_is_let_in() {
        for raw in [None, Some(""), Some("  ")] {
            let k = AdminKeys::parse(raw).unwrap();
            assert!(k.is_empty());
            assert_eq!(k.check(A), None);
            assert_eq!(k.check(""), None);
        }
    }

    #[test]
    fn malformed_lists_are_refused_without_showing_a_secret() {
        for raw in [
            "nocolon".to_string(),
            format!(":{A}"),
            format!("bad id:{A}"),
            "short:abc".to_string(),
            "short:write:abc".to_string(),
            format!("ops:admin:{A}"),
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
