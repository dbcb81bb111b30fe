//! Header rewriting between client and upstream: hop-by-hop headers are
//! removed (RFC 9110 §7.6.1), `X-Forwarded-For`, `Forwarded` and
//! `X-Forwarded-Proto` say who the client was and how it connected.

use std::net::SocketAddr;

use super::proto::Proto;

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
/// An upgrade to `h2c` is not one the proxy passes on: HTTP/2 inside a
/// tunnel would bypass per-stream admission (and RFC 9113 retired it), so
/// the request goes upstream as plain HTTP/1.1 without its `Upgrade`.
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    let h2c = headers
        .get_all(header::UPGRADE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("h2c"));
    headers.contains_key(header::UPGRADE)
        && !h2c
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

/// Who sent a request, as the forwarding headers name it.
#[derive(Clone, Copy, Debug)]
pub struct Client {
    pub addr: SocketAddr,
    pub proto: Proto,
}

/// Appends the client to `X-Forwarded-For` and `Forwarded` (a client-sent
/// chain, on any number of lines, is kept before it) and sets
/// `X-Forwarded-Proto` to the listener's scheme, replacing a client-sent
/// one. `host` is the request's `Host`, already validated ([`super::head`]);
/// it is quoted anyway (RFC 7239 §4).
pub fn add_forwarded(headers: &mut HeaderMap, client: Client, host: Option<&HeaderValue>) {
    let ip = client.addr.ip().to_canonical();
    append(headers, "x-forwarded-for", &ip.to_string());
    // RFC 7239: IPv6 addresses are quoted and bracketed.
    let node = if ip.is_ipv6() { format!("\"[{ip}]\"") } else { ip.to_string() };
    let mut element = format!("for={node};proto={}", client.proto.scheme());
    if let Some(host) = host.and_then(|h| h.to_str().ok()).filter(|h| !h.is_empty()) {
        element.push_str(";host=");
        element.push_str(&quoted(host));
    }
    append(headers, "forwarded", &element);
    headers.insert("x-forwarded-proto", HeaderValue::from_static(client.proto.scheme()));
}

/// Sets `name` to its prior lines joined by `, `, then `value`.
fn append(headers: &mut HeaderMap, name: &'static str, value: &str) {
    let mut chain: Vec<&str> = headers.get_all(name).iter().filter_map(|v| v.to_str().ok()).collect();
    chain.push(value);
    if let Ok(v) = HeaderValue::from_str(&chain.join(", ")) {
        headers.insert(name, v);
    }
}

/// A `quoted-string` (RFC 9110 §5.6.4): `"` and `\` escaped as quoted-pairs.
fn quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
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
    fn an_upgrade_to_h2c_is_not_passed_on() {
        let mut h = map(&[
            ("connection", "Upgrade, HTTP2-Settings"),
            ("upgrade", "h2c"),
            ("http2-settings", "AAMAAABkAAQAoAAAAAIAAAAA"),
        ]);
        assert!(!is_upgrade(&h));
        strip_hop_by_hop(&mut h, false);
        assert!(h.is_empty(), "{h:?}");
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

    fn client(addr: &str) -> Client {
        Client { addr: addr.parse().unwrap(), proto: Proto::H1 }
    }

    #[test]
    fn forwarded_headers_append() {
        let mut h = map(&[("x-forwarded-for", "10.0.0.1")]);
        add_forwarded(&mut h, client("127.0.0.1:5000"), Some(&HeaderValue::from_static("app.example")));
        assert_eq!(h.get("x-forwarded-for").unwrap(), "10.0.0.1, 127.0.0.1");
        assert_eq!(h.get("forwarded").unwrap(), "for=127.0.0.1;proto=http;host=\"app.example\"");
        let mut h = HeaderMap::new();
        add_forwarded(&mut h, client("[::1]:5000"), None);
        assert_eq!(h.get("forwarded").unwrap(), "for=\"[::1]\";proto=http");
    }

    #[test]
    fn prior_chains_on_several_lines_are_kept_in_order() {
        let mut h = map(&[
            ("x-forwarded-for", "10.0.0.1"),
            ("x-forwarded-for", "10.0.0.2, 10.0.0.3"),
            ("forwarded", "for=10.0.0.1"),
            ("forwarded", "for=10.0.0.2;proto=https"),
        ]);
        add_forwarded(&mut h, client("127.0.0.1:5000"), Some(&HeaderValue::from_static("")));
        assert_eq!(h.get_all("x-forwarded-for").iter().count(), 1);
        assert_eq!(h.get("x-forwarded-for").unwrap(), "10.0.0.1, 10.0.0.2, 10.0.0.3, 127.0.0.1");
        // An empty Host (a target without authority) names no host.
        assert_eq!(
            h.get("forwarded").unwrap(),
            "for=10.0.0.1, for=10.0.0.2;proto=https, for=127.0.0.1;proto=http"
        );
    }

    #[test]
    fn the_proto_is_the_listeners_whatever_the_client_says() {
        let mut h = map(&[("x-forwarded-proto", "https"), ("x-forwarded-proto", "ftp")]);
        add_forwarded(&mut h, client("127.0.0.1:5000"), None);
        let protos: Vec<_> = h.get_all("x-forwarded-proto").iter().collect();
        assert_eq!(protos, ["http"]);
    }

    #[test]
    fn tls_requests_say_https_whatever_the_protocol() {
        for proto in [Proto::H1Tls, Proto::H2Tls] {
            let mut h = HeaderMap::new();
            add_forwarded(&mut h, Client { addr: "127.0.0.1:5000".parse().unwrap(), proto }, None);
            assert_eq!(h.get("x-forwarded-proto").unwrap(), "https");
            assert_eq!(h.get("forwarded").unwrap(), "for=127.0.0.1;proto=https");
        }
    }

    #[test]
    fn hosts_are_quoted_as_quoted_strings() {
        assert_eq!(quoted("app:8080"), "\"app:8080\"");
        assert_eq!(quoted("[::1]:80"), "\"[::1]:80\"");
        // Never a valid Host, but quoted safely all the same.
        assert_eq!(quoted("a\",for=6.6.6.6;host=\"b\\"), "\"a\\\",for=6.6.6.6;host=\\\"b\\\\\"");
    }
}
