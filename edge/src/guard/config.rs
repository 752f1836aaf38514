//! Checks of the edge's configuration (pure, host-tested): whether dev mode
//! may be on, and whether the two key rings are kept apart.
//!
//! Role: the decisions behind "the edge refuses to run misconfigured"; the
//! Worker (`worker::entry`) reads the environment and turns a refusal into an answer.
//!
//! Invariants kept here:
//! - dev mode (which mints `user` tokens for any typed name) is allowed only
//!   when the origin is on this machine: `ORIGIN_URL` is `http(s)` to a
//!   loopback address. Anything the check cannot read with certainty (odd
//!   characters, userinfo, numeric forms other than dotted quads) counts as
//!   not loopback, so a doubtful URL refuses dev mode rather than allows it;
//! - the user ring and the admission ring share no secret: whoever holds the
//!   shop's user key could otherwise mint tickets and `admit` tokens.

use std::net::{Ipv4Addr, Ipv6Addr};

use token::KeyRing;

/// Whether `url` is an `http`/`https` URL whose host is a loopback address
/// (`localhost`, `127.0.0.0/8`, `[::1]`).
pub fn is_loopback_url(url: &str) -> bool {
    let url = url.trim();
    let rest = match url.split_once("://") {
        Some((scheme, rest))
            if scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https") =>
        {
            rest
        }
        _ => return false,
    };
    // The authority ends at the first of these (a URL parser also ends it at
    // a backslash for http, so one inside would hide the real host).
    let end = rest.find(['/', '?', '#', '\\']).unwrap_or(rest.len());
    let authority = &rest[..end];
    if authority.is_empty()
        || !authority
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-.:[]".contains(&b))
    {
        // Userinfo (`@`), percent-escapes and the like: not read, refused.
        return false;
    }
    let host = if let Some(v6) = authority.strip_prefix('[') {
        let Some((inner, after)) = v6.split_once(']') else {
            return false;
        };
        if !(after.is_empty() || valid_port(after)) {
            return false;
        }
        return inner.parse::<Ipv6Addr>().is_ok_and(|ip| ip.is_loopback());
    } else {
        match authority.split_once(':') {
            Some((h, port)) if valid_port(&format!(":{port}")) => h,
            Some(_) => return false,
            None => authority,
        }
    };
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<Ipv4Addr>().is_ok_and(|ip| ip.is_loopback())
}

fn valid_port(s: &str) -> bool {
    s.strip_prefix(':')
        .is_some_and(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()))
}

/// Why dev mode, though asked for, stays off (None: allowed or not asked).
pub fn dev_mode_refusal(requested: bool, origin_url: &str) -> Option<String> {
    (requested && !is_loopback_url(origin_url)).then(|| {
        format!(
            "DEV_MODE is ignored: ORIGIN_URL {origin_url:?} is not a loopback address \
             (dev mode mints user tokens for anyone, so it only runs against a local origin)"
        )
    })
}

/// Refuses two rings that share a secret, naming the key ids (never the
/// secrets).
pub fn rings_apart(users: &KeyRing, admission: &KeyRing) -> Result<(), String> {
    match users.shares_secret_with(admission) {
        None => Ok(()),
        Some((user_kid, admission_kid)) => Err(format!(
            "USER_TOKEN_KEYS key {user_kid:?} and ADMISSION_TOKEN_KEYS key {admission_kid:?} \
             share a secret; the edge refuses to run until the rings are apart"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_urls_are_recognised() {
        for u in [
            "http://127.0.0.1:8080",
            "http://127.0.0.1",
            "https://127.1.2.3:443/",
            "http://localhost:8080/api",
            "HTTP://LOCALHOST",
            "http://[::1]:8080",
            "http://[::1]",
            " http://127.0.0.1:1/ ",
        ] {
            assert!(is_loopback_url(u), "{u:?}");
        }
    }

    #[test]
    fn other_or_doubtful_urls_are_not_loopback() {
        for u in [
            "",
            "127.0.0.1:8080",
            "ftp://127.0.0.1",
            "http://",
            "http://10.0.0.5:8080",
            "http://192.0.2.1",
            "https://shop.example.com",
            "http://localhost.example.com",
            "http://127.0.0.1.nip.io",
            "http://127.0.0.1@evil.example",
            "http://evil.example\\@127.0.0.1/",
            "http://evil.example#@127.0.0.1",
            "http://user:pw@127.0.0.1",
            "http://2130706433",
            "http://0x7f.0.0.1",
            "http://127.0.0.1:99999999",
            "http://127.0.0.1:",
            "http://127.0.0.1:80:80",
            "http://[::1",
            "http://[::ffff:10.0.0.1]",
            "http://[::1]x",
            "http://%31%32%37.0.0.1",
        ] {
            assert!(!is_loopback_url(u), "{u:?}");
        }
    }

    #[test]
    fn dev_mode_is_refused_unless_the_origin_is_local() {
        assert_eq!(dev_mode_refusal(false, "https://shop.example.com"), None);
        assert_eq!(dev_mode_refusal(true, "http://127.0.0.1:8080"), None);
        let why = dev_mode_refusal(true, "https://shop.example.com").unwrap();
        assert!(why.contains("not a loopback address"), "{why}");
    }

    #[test]
    fn rings_sharing_a_secret_are_refused_by_kid() {
        let a = "QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUE=";
        let b = "QkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkI=";
        let c = "Q0NDQ0NDQ0NDQ0NDQ0NDQ0NDQ0NDQ0NDQ0NDQ0NDQ0M=";
        let users = KeyRing::parse(&format!("u1:{a}")).unwrap();
        let apart = KeyRing::parse(&format!("a1:{b},a2:{c}")).unwrap();
        let shared = KeyRing::parse(&format!("a1:{b},a2:{a}")).unwrap();
        assert_eq!(rings_apart(&users, &apart), Ok(()));
        let e = rings_apart(&users, &shared).unwrap_err();
        assert!(e.contains("\"u1\"") && e.contains("\"a2\""), "{e}");
        assert!(!e.contains(a), "the secret is never printed");
    }
}
