//! Who may call the admin API: the admin key of a request and the rate
//! limit of its address.
//!
//! Invariants kept here:
//! - every admin route but the console's static page asks [`Gate::admit`]
//!   first: no key or an unknown one is 401 `admin_key_required`, a `read`
//!   key asking to write is 403 `admin_scope` (keys compared in constant
//!   time by `token::AdminKeys`);
//! - every request, let in or not, counts against its client address's
//!   rate (`ADMIN_RATE_PER_S`, bursts of twice that), so guessing keys is
//!   as slow as that rate; over it: 429 `rate_limited` with `Retry-After`.

use std::net::IpAddr;
use std::num::NonZeroU32;

use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use token::{AdminKeys, Scope};

use crate::admin::error::AdminError;

/// The caller of an admin route, once let in.
#[derive(Debug, Clone)]
pub struct Admin {
    /// The key's id (never its secret): what the audit log records.
    pub key_id: String,
    pub scope: Scope,
}

/// The admin keys and the per-address rate limit.
pub struct Gate {
    keys: AdminKeys,
    limit: DefaultKeyedRateLimiter<IpAddr>,
}

impl Gate {
    pub fn new(keys: AdminKeys, rate_per_s: u32) -> Gate {
        let rate = NonZeroU32::new(rate_per_s.max(1)).unwrap_or(NonZeroU32::MIN);
        let burst = rate.saturating_mul(NonZeroU32::new(2).unwrap_or(NonZeroU32::MIN));
        Gate {
            keys,
            limit: RateLimiter::keyed(Quota::per_second(rate).allow_burst(burst)),
        }
    }

    /// Counts the request against `peer`'s rate, then checks its key.
    pub fn admit(
        &self,
        peer: IpAddr,
        headers: &HeaderMap,
        needed: Scope,
    ) -> Result<Admin, AdminError> {
        self.rate(peer)?;
        let presented = bearer(headers).ok_or(AdminError::KeyRequired)?;
        let (id, scope) = self.keys.check(presented).ok_or(AdminError::KeyRequired)?;
        if !scope.allows(needed) {
            return Err(AdminError::Scope(id.to_string()));
        }
        Ok(Admin {
            key_id: id.to_string(),
            scope,
        })
    }

    /// The id of the key a request carries, if any is known (for the audit
    /// entry of a refused write), without counting it again.
    pub fn key_id(&self, headers: &HeaderMap) -> Option<String> {
        bearer(headers)
            .and_then(|p| self.keys.check(p))
            .map(|(id, _)| id.to_string())
    }

    /// Counts one request of `peer`; 429 when over its rate.
    pub fn rate(&self, peer: IpAddr) -> Result<(), AdminError> {
        self.limit.check_key(&peer).map_err(|not_until| {
            let wait = not_until.wait_time_from(governor::clock::Clock::now(
                &governor::clock::DefaultClock::default(),
            ));
            AdminError::RateLimited(wait.as_secs().max(1))
        })?;
        // Addresses that stopped calling are forgotten now and then.
        if self.limit.len() > 10_000 {
            self.limit.retain_recent();
        }
        Ok(())
    }

    /// The first `read` key's id, and whether any key is configured.
    pub fn keys(&self) -> &AdminKeys {
        &self.keys
    }
}

/// The secret of `Authorization: Bearer <secret>`, if the header is one.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, rest) = value.split_once(' ')?;
    let t = rest.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !t.is_empty()).then_some(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    const R: &str = "read-secret-0123456789abcdef";
    const W: &str = "write-secret-0123456789abcdef";

    fn gate(rate: u32) -> Gate {
        Gate::new(
            AdminKeys::parse(Some(&format!("ro:read:{R},rw:write:{W}"))).unwrap(),
            rate,
        )
    }

    fn auth(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(AUTHORIZATION, v.parse().unwrap());
        h
    }

    #[test]
    fn keys_are_let_in_by_scope() {
        let g = gate(1_000);
        let ip: IpAddr = [127, 0, 0, 1].into();
        let a = g
            .admit(ip, &auth(&format!("Bearer {W}")), Scope::Write)
            .unwrap();
        assert_eq!((a.key_id.as_str(), a.scope), ("rw", Scope::Write));
        assert_eq!(
            g.admit(ip, &auth(&format!("bearer {R}")), Scope::Read)
                .unwrap()
                .key_id,
            "ro"
        );
        let e = g
            .admit(ip, &auth(&format!("Bearer {R}")), Scope::Write)
            .unwrap_err();
        assert_eq!(e.code(), "admin_scope");
        for h in [
            HeaderMap::new(),
            auth("Bearer nope-nope-nope-nope-nope"),
            auth(R),
        ] {
            assert_eq!(
                g.admit(ip, &h, Scope::Read).unwrap_err().code(),
                "admin_key_required"
            );
        }
        assert_eq!(
            g.key_id(&auth(&format!("Bearer {R}"))).as_deref(),
            Some("ro")
        );
        assert_eq!(g.key_id(&auth("Bearer x")), None);
    }

    #[test]
    fn an_address_over_its_rate_is_told_to_wait_and_others_are_not() {
        let g = gate(2);
        let a: IpAddr = [10, 0, 0, 1].into();
        let b: IpAddr = [10, 0, 0, 2].into();
        // A burst of twice the rate passes, wrong keys included.
        for _ in 0..4 {
            assert_eq!(
                g.admit(a, &HeaderMap::new(), Scope::Read)
                    .unwrap_err()
                    .code(),
                "admin_key_required"
            );
        }
        let e = g
            .admit(a, &auth(&format!("Bearer {R}")), Scope::Read)
            .unwrap_err();
        assert!(matches!(e, AdminError::RateLimited(s) if s >= 1), "{e:?}");
        assert!(
            g.admit(b, &auth(&format!("Bearer {R}")), Scope::Read)
                .is_ok()
        );
    }
}
