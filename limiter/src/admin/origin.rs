//! Which requests are addressed to the admin listener itself. A web page
//! anywhere can make a browser send a simple cross-site `POST` to
//! `127.0.0.1:9901` (no preflight), and DNS rebinding lets a page read
//! answers under a name of its own that resolves to loopback. Both show in
//! the request: the first carries the page's `Origin`, the second a `Host`
//! that names the attacker's domain. So the listener answers only requests
//! whose `Host` is its own address (as the connection reached it, or as
//! configured) or `localhost`, and whose `Origin`, when there is one, is
//! `http://` one of those.
//!
//! `limiter reload`, `dump` and `top` send `Host: <admin.listen>` and no
//! `Origin`; curl and the kubelet's probes send the address they connected
//! to. `admin.metricsListen` (read-only) checks the `Origin` alone, since
//! Prometheus may scrape it by a DNS name.

use std::net::SocketAddr;

use hyper::{HeaderMap, header};

/// Why a request is not the listener's own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Foreign {
    /// `Host` names something else (DNS rebinding), or is unreadable.
    Host,
    /// `Origin` is another site's (a cross-site request from a page).
    Origin,
}

impl Foreign {
    pub fn explain(self) -> &'static str {
        match self {
            Self::Host => {
                "the Host header is not this listener's address or localhost: the admin listener answers only requests addressed to itself\n"
            }
            Self::Origin => {
                "the Origin header is another site's: the admin listener answers no cross-site requests\n"
            }
        }
    }
}

/// Checks `headers` against the addresses the listener answers to: the
/// connection's local address and the configured one (`configured` may be
/// `0.0.0.0:9901`, while a client reached `127.0.0.1:9901`).
pub fn check(headers: &HeaderMap, local: SocketAddr, configured: SocketAddr) -> Result<(), Foreign> {
    // HTTP/1.0 clients may send no Host; such a request names no other
    // site either.
    if let Some(host) = headers.get(header::HOST) {
        let host = host.to_str().map_err(|_| Foreign::Host)?;
        if !own_authority(host, local, configured) {
            return Err(Foreign::Host);
        }
    }
    check_origin(headers, local, configured)
}

/// The `Origin` half of [`check`] alone.
pub fn check_origin(headers: &HeaderMap, local: SocketAddr, configured: SocketAddr) -> Result<(), Foreign> {
    for origin in headers.get_all(header::ORIGIN) {
        let origin = origin.to_str().map_err(|_| Foreign::Origin)?;
        let authority = origin.strip_prefix("http://").ok_or(Foreign::Origin)?;
        if !own_authority(authority, local, configured) {
            return Err(Foreign::Origin);
        }
    }
    Ok(())
}

/// Whether `authority` (`host[:port]`) is the listener: its IP address
/// literal or `localhost`, with the listener's port or none.
fn own_authority(authority: &str, local: SocketAddr, configured: SocketAddr) -> bool {
    let (host, port) = split(authority);
    if port.is_some_and(|p| p != local.port() && p != configured.port()) {
        return false;
    }
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    let Ok(ip) = host.trim_start_matches('[').trim_end_matches(']').parse::<std::net::IpAddr>() else {
        return false;
    };
    // A v4 client on a dual-stack socket reaches `::ffff:a.b.c.d`. The
    // configured address counts even when it is `0.0.0.0` (the CLI sends
    // it as it is configured): an address literal is no page's own name,
    // and a page's request carries its Origin, checked apart.
    let canonical = |ip: std::net::IpAddr| ip.to_canonical();
    canonical(ip) == canonical(local.ip()) || canonical(ip) == canonical(configured.ip())
}

/// `host` and `port` of an authority; IPv6 literals keep their brackets.
fn split(authority: &str) -> (&str, Option<u16>) {
    let colon = if authority.starts_with('[') {
        authority.find(']').and_then(|end| authority[end..].find(':').map(|c| end + c))
    } else {
        authority.rfind(':')
    };
    match colon {
        Some(at) => match authority[at + 1..].parse() {
            Ok(port) => (&authority[..at], Some(port)),
            // A port that is no number: no address of ours.
            Err(_) => ("", None),
        },
        None => (authority, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(header::HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        h
    }

    fn at(addr: &str) -> SocketAddr {
        addr.parse().unwrap()
    }

    #[test]
    fn the_listeners_own_names_pass() {
        let local = at("127.0.0.1:9901");
        for host in ["127.0.0.1:9901", "127.0.0.1", "localhost:9901", "LOCALHOST", "localhost"] {
            assert_eq!(check(&headers(&[("host", host)]), local, local), Ok(()), "{host}");
        }
        assert_eq!(check(&HeaderMap::new(), local, local), Ok(()), "HTTP/1.0 without Host");
        let v6 = at("[::1]:9901");
        assert_eq!(check(&headers(&[("host", "[::1]:9901")]), v6, v6), Ok(()));
        // Bound to every address, reached on one of them.
        let any = at("0.0.0.0:9901");
        assert_eq!(check(&headers(&[("host", "10.1.2.3:9901")]), at("10.1.2.3:9901"), any), Ok(()));
        assert_eq!(
            check(&headers(&[("host", "0.0.0.0:9901")]), at("127.0.0.1:9901"), any),
            Ok(()),
            "the CLI"
        );
        assert_eq!(
            check(&headers(&[("host", "127.0.0.1:9901"), ("origin", "http://127.0.0.1:9901")]), local, local),
            Ok(())
        );
    }

    #[test]
    fn other_names_and_other_sites_are_refused() {
        let local = at("127.0.0.1:9901");
        for host in [
            "evil.example:9901",
            "evil.example",
            "127.0.0.2:9901",
            "127.0.0.1:9902",
            "127.0.0.1:x",
            "localhost.evil.example",
            "[::1]:9901",
            "",
        ] {
            assert_eq!(check(&headers(&[("host", host)]), local, local), Err(Foreign::Host), "{host}");
        }
        for origin in [
            "https://evil.example",
            "http://evil.example:9901",
            "null",
            "https://127.0.0.1:9901",
            "http://127.0.0.1:9902",
        ] {
            assert_eq!(
                check(&headers(&[("host", "127.0.0.1:9901"), ("origin", origin)]), local, local),
                Err(Foreign::Origin),
                "{origin}"
            );
        }
    }
}
