//! The admin key of the edge's operator-only routes (pure, host-tested):
//! `GET /api/sales/{sale}/metrics` (issue 44 #3, whose scrapes anyone could
//! send to the sale's one coordinator) and the origin admin API's calls to
//! the edge.
//!
//! Role: check a request's `Authorization: Bearer <secret>` against the
//! worker secret `ADMIN_KEYS`, parsed by `token::AdminKeys` (one format for
//! the edge and the origin: `kid:scope:secret`, or `kid:secret` for a read
//! key). The Worker (`worker::audit`) reads the secret and the header and
//! turns a refusal into an answer.
//!
//! Invariants kept here: no configured key (unset or empty) lets nobody
//! in; a missing key and a wrong key get the same 401
//! `admin_key_required`; a route that changes something needs a `write`
//! key (403 `admin_scope`). The comparison itself is constant-time
//! (`token::admin`).

pub use token::{AdminKeys, Scope};

use crate::api::error::ApiError;
use crate::api::routes;

/// The id of the key the request's `Authorization` header carries if it
/// may do what `needed` asks; 401 `admin_key_required` (no header, not a
/// bearer, no such key) or 403 `admin_scope` (a read key asked to write).
pub fn check<'k>(
    keys: &'k AdminKeys,
    authorization: Option<&str>,
    needed: Scope,
) -> Result<&'k str, ApiError> {
    let presented = routes::bearer(authorization).ok_or_else(ApiError::admin_key_required)?;
    let (id, scope) = keys
        .check(presented)
        .ok_or_else(ApiError::admin_key_required)?;
    if !scope.allows(needed) {
        return Err(ApiError::new(
            403,
            "admin_scope",
            format!("admin key {id:?} may only read"),
        ));
    }
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "A1b2C3d4E5f6G7h8I9j0KLmn";
    const B: &str = "zYxWvUtSrQpOnMlKjIhGfEdC==";

    #[test]
    fn a_bearer_of_a_known_key_is_let_in_by_its_id() {
        let k = AdminKeys::parse(Some(&format!("old:{A}, root:write:{B}"))).unwrap();
        assert_eq!(
            check(&k, Some(&format!("Bearer {A}")), Scope::Read),
            Ok("old")
        );
        assert_eq!(
            check(&k, Some(&format!("bearer  {B} ")), Scope::Write),
            Ok("root")
        );
        let e = check(&k, Some(&format!("Bearer {A}")), Scope::Write).unwrap_err();
        assert_eq!((e.status, e.code.as_str()), (403, "admin_scope"));
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
            Some(&*format!("Bearer ops:{A}")),
        ] {
            let e = check(&k, h, Scope::Read).unwrap_err();
            assert_eq!(
                (e.status, e.code.as_str()),
                (401, "admin_key_required"),
                "{h:?}"
            );
        }
        let none = AdminKeys::parse(None).unwrap();
        let e = check(&none, Some(&format!("Bearer {A}")), Scope::Read).unwrap_err();
        assert_eq!(e.status, 401);
    }
}
