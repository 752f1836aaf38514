//! The address guard: the webhook worker must never become a way into the
//! shop's own network (SSRF). An endpoint is refused when its URL is not
//! https or when its host is, or resolves to, a loopback, private,
//! link-local, shared, multicast or reserved address, unless the operator
//! allows it (`WEBHOOK_ALLOW_PRIVATE=1`, dev and tests only).
//!
//! Invariants kept here: the check runs when an endpoint is added AND on
//! every connection (the client resolves names through [`GuardedResolver`],
//! so a name that later resolves inside, DNS rebinding, is refused too);
//! redirects are never followed (`deliver` builds its client so): a 3xx is
//! a failed delivery, not a way around the check.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use url::{Host, Url};

/// Why an endpoint URL is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UrlRefused {
    #[error("not a URL: {0}")]
    Unparseable(String),
    #[error("scheme {0} refused: endpoints are https (http only with WEBHOOK_ALLOW_PRIVATE=1)")]
    Scheme(String),
    #[error("the URL has no host")]
    NoHost,
    #[error(
        "{0} is a loopback, private, link-local or reserved address (allowed only with WEBHOOK_ALLOW_PRIVATE=1)"
    )]
    Inside(IpAddr),
    #[error("{0} does not resolve")]
    Unresolvable(String),
}

/// Whether `ip` lies inside a network a webhook must not reach.
pub fn inside(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => inside_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return inside_v4(v4);
            }
            let s = v6.segments();
            v6.is_unspecified()
                || v6.is_loopback()
                || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00 // unique local fc00::/7
                || (s[0] & 0xffc0) == 0xfe80 // link-local fe80::/10
                || (s[0] & 0xffc0) == 0xfec0 // site-local (deprecated) fec0::/10
                // NAT64 64:ff9b::/96 reaches the IPv4 address it embeds.
                || (s[..6] == [0x64, 0xff9b, 0, 0, 0, 0]
                    && inside_v4(Ipv4Addr::from(((s[6] as u32) << 16) | s[7] as u32)))
                // IPv4-compatible ::a.b.c.d (deprecated) likewise.
                || (s[..6] == [0; 6] && inside_v4(Ipv4Addr::from(((s[6] as u32) << 16) | s[7] as u32)))
        }
    }
}

fn inside_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    ip.is_unspecified()
        || a == 0 // "this network" 0.0.0.0/8
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || (a == 100 && (b & 0xc0) == 64) // shared (CGNAT) 100.64.0.0/10
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments 192.0.0.0/24
        || (a == 198 && (b & 0xfe) == 18) // benchmarking 198.18.0.0/15
        || ip.is_multicast()
        || a >= 240 // reserved and broadcast
}

/// Checks an endpoint URL as written (scheme, host, a literal address);
/// names are checked when they resolve ([`check_resolved`]).
pub fn check_url(text: &str, allow_private: bool) -> Result<Url, UrlRefused> {
    let url = Url::parse(text.trim()).map_err(|e| UrlRefused::Unparseable(e.to_string()))?;
    match url.scheme() {
        "https" => {}
        "http" if allow_private => {}
        other => return Err(UrlRefused::Scheme(other.to_string())),
    }
    let ip = match url.host() {
        None => return Err(UrlRefused::NoHost),
        Some(Host::Domain(_)) => None,
        Some(Host::Ipv4(v4)) => Some(IpAddr::V4(v4)),
        Some(Host::Ipv6(v6)) => Some(IpAddr::V6(v6)),
    };
    if let Some(ip) = ip
        && !allow_private
        && inside(ip)
    {
        return Err(UrlRefused::Inside(ip));
    }
    Ok(url)
}

/// The addresses a name resolved to, refused when any is inside (one
/// inside address is enough for an attacker's name to reach in).
pub fn check_resolved(
    addrs: Vec<SocketAddr>,
    host: &str,
    allow_private: bool,
) -> Result<Vec<SocketAddr>, UrlRefused> {
    if addrs.is_empty() {
        return Err(UrlRefused::Unresolvable(host.to_string()));
    }
    if !allow_private && let Some(a) = addrs.iter().find(|a| inside(a.ip())) {
        return Err(UrlRefused::Inside(a.ip()));
    }
    Ok(addrs)
}

/// Resolves `url`'s host (as the worker will) and applies the guard: what
/// `origin webhook add` runs before it stores an endpoint.
pub async fn check_endpoint(text: &str, allow_private: bool) -> Result<Url, UrlRefused> {
    let url = check_url(text, allow_private)?;
    if let Some(Host::Domain(name)) = url.host() {
        let port = url.port_or_known_default().unwrap_or(443);
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host((name, port))
            .await
            .map_err(|_| UrlRefused::Unresolvable(name.to_string()))?
            .collect();
        check_resolved(addrs, name, allow_private)?;
    }
    Ok(url)
}

/// The HTTP client's resolver: every connection's name goes through the
/// guard, so what was checked is what is reached.
#[derive(Debug, Clone, Copy)]
pub struct GuardedResolver {
    pub allow_private: bool,
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let allow_private = self.allow_private;
        Box::pin(async move {
            let host = name.as_str().to_string();
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let addrs = check_resolved(addrs, &host, allow_private)?;
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inside_addresses_are_refused_and_public_ones_pass() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "0.1.2.3",
            "224.0.0.1",
            "255.255.255.255",
            "198.18.0.1",
            "192.0.0.8",
            "::1",
            "::",
            "fd00::1",
            "fe80::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "64:ff9b::a9fe:a9fe",
        ] {
            assert!(inside(ip.parse().unwrap()), "{ip} must be refused");
        }
        for ip in [
            "1.1.1.1",
            "8.8.8.8",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
        ] {
            assert!(!inside(ip.parse().unwrap()), "{ip} must pass");
        }
    }

    #[test]
    fn urls_are_https_with_a_host_and_no_inside_literal() {
        assert!(check_url("https://shop.example/hooks", false).is_ok());
        assert_eq!(
            check_url("http://shop.example/hooks", false),
            Err(UrlRefused::Scheme("http".into()))
        );
        assert!(check_url("http://shop.example/hooks", true).is_ok());
        assert_eq!(
            check_url("ftp://shop.example/", true),
            Err(UrlRefused::Scheme("ftp".into()))
        );
        assert!(matches!(
            check_url("not a url", false),
            Err(UrlRefused::Unparseable(_))
        ));
        assert_eq!(
            check_url("https://127.0.0.1:8443/x", false),
            Err(UrlRefused::Inside("127.0.0.1".parse().unwrap()))
        );
        assert_eq!(
            check_url("https://[::1]/x", false),
            Err(UrlRefused::Inside("::1".parse().unwrap()))
        );
        assert!(check_url("http://127.0.0.1:8080/x", true).is_ok());
    }

    #[test]
    fn a_name_with_one_inside_address_is_refused() {
        let public: SocketAddr = "1.1.1.1:443".parse().unwrap();
        let private: SocketAddr = "10.0.0.1:443".parse().unwrap();
        assert!(check_resolved(vec![public], "a", false).is_ok());
        assert_eq!(
            check_resolved(vec![public, private], "a", false),
            Err(UrlRefused::Inside(private.ip()))
        );
        assert!(check_resolved(vec![public, private], "a", true).is_ok());
        assert_eq!(
            check_resolved(vec![], "a", true),
            Err(UrlRefused::Unresolvable("a".into()))
        );
    }
}
