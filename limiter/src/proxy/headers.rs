//! Header rewriting between client and upstream: hop-by-hop headers are
//! removed (RFC 9110 §7.6.1), `X-Forwarded-For` and `Forwarded` say who
//! the client was.

use std::net::SocketAddr;

use hyper::{
    HeaderMap,
    header::{self, HeaderName, HeaderValue},
};

/// Hop-by-hop headers, always removed; plus any header the `Connection`
/// header names.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "proxy-authorization",
];

/// Whether a request asks to switch protocols (WebSocket and the like).
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// Removes hop-by-hop headers. With `keep_upgrade`, `Upgrade` and
/// `Connection: upgrade` stay, so the upstream sees the upgrade request.
pub fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    if !headers.contains_key(header::CONNECTION) && !keep_upgrade {
        // The usual case: only the fixed list to remove.
        for name in HOP_BY_HOP {
            headers.remove(name);
        }
        return;
    }
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .filter(|n| !(keep_upgrade && n == header::UPGRADE))
        .collect();
    let upgrade = headers.get(header::UPGRADE).cloned();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    if keep_upgrade && let Some(upgrade) = upgrade {
        headers.insert(header::UPGRADE, upgrade);
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
}

/// Appends the client to `X-Forwarded-For` and `Forwarded`.
pub fn add_forwarded(headers: &mut HeaderMap, client: SocketAddr, host: Option<&HeaderValue>) {
    let ip = client.ip().to_canonical();
    let xff = match headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
        Some(prior) => format!("{prior}, {ip}"),
        None => ip.to_string(),
    };
    if let Ok(v) = HeaderValue::from_str(&xff) {
        headers.insert("x-forwarded-for", v);
    }
    // RFC 7239: IPv6 addresses are quoted and bracketed.
    let node = if ip.is_ipv6() { format!("\"[{ip}]\"") } else { ip.to_string() };
    let mut element = format!("for={node};proto=http");
    if let Some(host) = host.and_then(|h| h.to_str().ok()).filter(|h| h.bytes().all(|b| b.is_ascii_graphic()))
    {
        element.push_str(&format!(";host=\"{host}\""));
    }
    let forwarded = match headers.get(header::FORWARDED).and_then(|v| v.to_str().ok()) {
        Some(prior) => format!("{prior}, {element}"),
        None => element,
    };
    if let Ok(v) = HeaderValue::from_str(&forwarded) {
        headers.insert(header::FORWARDED, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
        }
        m
    }

    #[test]
    fn hop_by_hop_and_connection_named_headers_go() {
        let mut h = map(&[
            ("connection", "keep-alive, x-secret"),
            ("keep-alive", "timeout=5"),
            ("x-secret", "1"),
            ("te", "trailers"),
            ("transfer-encoding", "chunked"),
            ("proxy-authorization", "Basic x"),
            ("authorization", "Bearer kept"),
            ("x-other", "kept"),
        ]);
        strip_hop_by_hop(&mut h, false);
        let mut names: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        names.sort();
        assert_eq!(names, vec!["authorization", "x-other"]);
    }

    #[test]
    fn upgrades_keep_their_two_headers() {
        let mut h = map(&[("connection", "Upgrade"), ("upgrade", "websocket"), ("keep-alive", "1")]);
        assert!(is_upgrade(&h));
        strip_hop_by_hop(&mut h, true);
        assert_eq!(h.get("upgrade").unwrap(), "websocket");
        assert_eq!(h.get("connection").unwrap(), "upgrade");
        assert!(h.get("keep-alive").is_none());
    }

    #[test]
    fn forwarded_headers_append() {
        let mut h = map(&[("x-forwarded-for", "10.0.0.1")]);
        add_forwarded(
            &mut h,
            "127.0.0.1:5000".parse().unwrap(),
            Some(&HeaderValue::from_static("app.example")),
        );
        assert_eq!(h.get("x-forwarded-for").unwrap(), "10.0.0.1, 127.0.0.1");
        assert_eq!(h.get("forwarded").unwrap(), "for=127.0.0.1;proto=http;host=\"app.example\"");
        let mut h = HeaderMap::new();
        add_forwarded(&mut h, "[::1]:5000".parse().unwrap(), None);
        assert_eq!(h.get("forwarded").unwrap(), "for=\"[::1]\";proto=http");
    }
}
