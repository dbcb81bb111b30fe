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
/// header names. (Names, not strings: a lookup by string parses it first.
/// Their lengths, 2, 7, 10, 16, 17 and 19, are checked in
/// [`Seen::scan`].)
static HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
];

/// Places in [`HOP_BY_HOP`] that [`Seen`] reports on.
const CONNECTION_AT: usize = 0;
const TRANSFER_ENCODING_AT: usize = 5;
const UPGRADE_AT: usize = 6;

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
/// Names a web client (the web-client limit).
static X_CLIENT_ID: HeaderName = HeaderName::from_static("x-client-id");

/// Which of the headers the proxy interprets or rewrites a request has,
/// found in one pass over its names (no hashing), so that the head's
/// checks, admission and forwarding look up only what is there. (Of a
/// response, only its hop-by-hop headers are used.)
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    /// Lines of `Host`, `Authorization` and `Transfer-Encoding` (up to 255).
    pub hosts: u8,
    pub authorizations: u8,
    pub codings: u8,
    /// `X-Client-Id` is there.
    pub client_id: bool,
    /// `X-Forwarded-For` or `Forwarded` is there: a client-sent chain.
    pub chained: bool,
    /// A bit for each member of [`HOP_BY_HOP`] present.
    hop_by_hop: u8,
}

impl Seen {
    pub fn scan(headers: &HeaderMap) -> Self {
        let mut seen = Self::default();
        for (name, _) in headers {
            // Lengths first: most names are none of these.
            match name.as_str().len() {
                4 if name == header::HOST => seen.hosts = seen.hosts.saturating_add(1),
                13 if name == header::AUTHORIZATION => {
                    seen.authorizations = seen.authorizations.saturating_add(1);
                }
                11 if name == X_CLIENT_ID => seen.client_id = true,
                9 if name == header::FORWARDED => seen.chained = true,
                15 if name == X_FORWARDED_FOR => seen.chained = true,
                2 | 7 | 10 | 16 | 17 | 19 => {
                    if let Some(i) = HOP_BY_HOP.iter().position(|h| h == name) {
                        seen.hop_by_hop |= 1 << i;
                        if i == TRANSFER_ENCODING_AT {
                            seen.codings = seen.codings.saturating_add(1);
                        }
                    }
                }
                _ => {}
            }
        }
        seen
    }

    /// An `Upgrade` header is there (an upgrade request, or one refused).
    pub fn upgrade(&self) -> bool {
        self.hop_by_hop & (1 << UPGRADE_AT) != 0
    }
}

/// Whether a request asks to switch protocols (WebSocket and the like).
/// An upgrade to `h2c` is not one the proxy passes on: HTTP/2 inside a
/// tunnel would bypass per-stream admission (and RFC 9113 retired it), so
/// the request goes upstream as plain HTTP/1.1 without its `Upgrade`.
pub fn is_upgrade(headers: &HeaderMap, seen: &Seen) -> bool {
    if !seen.upgrade() {
        return false;
    }
    let h2c = headers
        .get_all(header::UPGRADE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("h2c"));
    !h2c && headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// Removes hop-by-hop headers. With `keep_upgrade`, `Upgrade` and
/// `Connection: upgrade` stay, so the upstream sees the upgrade request.
/// Returns whether headers that `Connection` named went too (then `seen`
/// may be out of date).
pub fn strip_hop_by_hop(headers: &mut HeaderMap, seen: &Seen, keep_upgrade: bool) -> bool {
    // Usually none in a request, `Connection` alone in a response.
    if seen.hop_by_hop == 0 {
        return false;
    }
    let present = |i: usize| seen.hop_by_hop & (1 << i) != 0;
    // Other headers `Connection` names (its usual `keep-alive` is one of
    // the fixed names: no lookup).
    let named: Vec<HeaderName> = if present(CONNECTION_AT) {
        headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|t| !HOP_BY_HOP.iter().any(|h| t.eq_ignore_ascii_case(h.as_str())))
            .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok())
            .collect()
    } else {
        Vec::new()
    };
    let upgrade = if keep_upgrade { headers.get(header::UPGRADE).cloned() } else { None };
    for name in &named {
        headers.remove(name);
    }
    for (_, name) in HOP_BY_HOP.iter().enumerate().filter(|(i, _)| present(*i)) {
        headers.remove(name);
    }
    if let Some(upgrade) = upgrade {
        headers.insert(header::UPGRADE, upgrade);
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
    !named.is_empty()
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
/// it is quoted anyway (RFC 7239 §4). Each value is written once into the
/// buffer that becomes it (no formatting machinery: this runs on every
/// request).
pub fn add_forwarded(headers: &mut HeaderMap, client: Client, host: Option<&HeaderValue>) {
    let (xff, element) = forwarded_values(client, host);
    append(headers, &X_FORWARDED_FOR, xff);
    append(headers, &header::FORWARDED, element);
    headers.insert(X_FORWARDED_PROTO.clone(), HeaderValue::from_static(client.proto.scheme()));
}

/// This client's own `X-Forwarded-For` entry and `Forwarded` element.
fn forwarded_values(client: Client, host: Option<&HeaderValue>) -> (Vec<u8>, Vec<u8>) {
    let ip = client.addr.ip().to_canonical();
    let mut xff = Vec::with_capacity(40);
    push_ip(&mut xff, ip);
    let mut element = Vec::with_capacity(64);
    element.extend_from_slice(b"for=");
    if ip.is_ipv6() {
        // RFC 7239: IPv6 addresses are quoted and bracketed.
        element.extend_from_slice(b"\"[");
        element.extend_from_slice(&xff);
        element.extend_from_slice(b"]\"");
    } else {
        element.extend_from_slice(&xff);
    }
    element.extend_from_slice(b";proto=");
    element.extend_from_slice(client.proto.scheme().as_bytes());
    if let Some(host) = host.map(HeaderValue::as_bytes).filter(|h| !h.is_empty()) {
        element.extend_from_slice(b";host=");
        push_quoted(&mut element, host);
    }
    (xff, element)
}

/// The forwarding headers of one client connection, written once, for its
/// first forwarded request (a connection refused at its first request
/// never needs them): its address and scheme are the same for every
/// request on it, and so, usually, is its `Host`. `X-Forwarded-For` and
/// `Forwarded` without a client-sent chain are then a reference count
/// each, not a buffer.
pub struct Forwarding {
    client: Client,
    /// `X-Forwarded-For`, and `Forwarded` for a request without a `Host`.
    written: std::sync::OnceLock<(Option<HeaderValue>, Option<HeaderValue>)>,
    /// The last `Host` seen and its `Forwarded` element.
    with_host: std::sync::Mutex<Option<(HeaderValue, HeaderValue)>>,
}

impl Forwarding {
    pub fn new(client: Client) -> Self {
        Self { client, written: std::sync::OnceLock::new(), with_host: std::sync::Mutex::new(None) }
    }

    /// [`add_forwarded`] for this connection's client, from what was
    /// written before when it can be. `chained`: the request has
    /// `X-Forwarded-For` or `Forwarded` (as [`Seen`] found).
    pub fn apply(&self, headers: &mut HeaderMap, host: Option<&HeaderValue>, chained: bool) {
        let (xff, without_host) = self.written.get_or_init(|| {
            let (xff, element) = forwarded_values(self.client, None);
            (
                HeaderValue::from_maybe_shared(bytes::Bytes::from(xff)).ok(),
                HeaderValue::from_maybe_shared(bytes::Bytes::from(element)).ok(),
            )
        });
        let host = host.filter(|h| !h.is_empty());
        let element = match host {
            None => without_host.clone(),
            Some(h) => {
                let mut last = self.with_host.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                match &*last {
                    Some((seen, element)) if seen == h => Some(element.clone()),
                    _ => {
                        let (_, element) = forwarded_values(self.client, Some(h));
                        let element = HeaderValue::from_maybe_shared(bytes::Bytes::from(element)).ok();
                        *last = element.clone().map(|e| (h.clone(), e));
                        element
                    }
                }
            }
        };
        match (chained, xff, element) {
            (false, Some(xff), Some(element)) => {
                headers.insert(X_FORWARDED_FOR.clone(), xff.clone());
                headers.insert(header::FORWARDED, element);
                headers
                    .insert(X_FORWARDED_PROTO.clone(), HeaderValue::from_static(self.client.proto.scheme()));
            }
            // A client-sent chain to extend (or a value that would not do).
            _ => add_forwarded(headers, self.client, host),
        }
    }
}

/// Sets `name` to its prior lines joined by `, `, then `value`.
fn append(headers: &mut HeaderMap, name: &HeaderName, value: Vec<u8>) {
    let mut prior = headers.get_all(name).iter().peekable();
    let value = if prior.peek().is_none() {
        value
    } else {
        let mut chain: Vec<u8> = Vec::with_capacity(value.len() + 64);
        for line in prior {
            chain.extend_from_slice(line.as_bytes());
            chain.extend_from_slice(b", ");
        }
        chain.extend_from_slice(&value);
        chain
    };
    if let Ok(v) = HeaderValue::from_maybe_shared(bytes::Bytes::from(value)) {
        headers.insert(name.clone(), v);
    }
}

/// An address as text, IPv4 without the formatting machinery.
fn push_ip(out: &mut Vec<u8>, ip: std::net::IpAddr) {
    match ip {
        std::net::IpAddr::V4(v4) => {
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push(b'.');
                }
                if octet >= 100 {
                    out.push(b'0' + octet / 100);
                }
                if octet >= 10 {
                    out.push(b'0' + octet / 10 % 10);
                }
                out.push(b'0' + octet % 10);
            }
        }
        std::net::IpAddr::V6(v6) => {
            use std::io::Write as _;
            let _ = write!(out, "{v6}");
        }
    }
}

/// A `quoted-string` (RFC 9110 §5.6.4): `"` and `\` escaped as quoted-pairs.
fn push_quoted(out: &mut Vec<u8>, text: &[u8]) {
    out.push(b'"');
    for &c in text {
        if c == b'"' || c == b'\\' {
            out.push(b'\\');
        }
        out.push(c);
    }
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strip(h: &mut HeaderMap, keep_upgrade: bool) {
        let seen = Seen::scan(h);
        strip_hop_by_hop(h, &seen, keep_upgrade);
    }

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
        strip(&mut h, false);
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
        assert!(!is_upgrade(&h, &Seen::scan(&h)));
        strip(&mut h, false);
        assert!(h.is_empty(), "{h:?}");
    }

    #[test]
    fn upgrades_keep_their_two_headers() {
        let mut h = map(&[("connection", "Upgrade"), ("upgrade", "websocket"), ("keep-alive", "1")]);
        assert!(is_upgrade(&h, &Seen::scan(&h)));
        strip(&mut h, true);
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
    fn a_connections_cached_values_are_what_add_forwarded_writes() {
        let c = client("127.0.0.1:5000");
        let fwd = Forwarding::new(c);
        type Case<'a> = (&'a [(&'a str, &'a str)], Option<&'a str>);
        let cases: [Case; 5] = [
            (&[], None),
            (&[], Some("app.example")),
            (&[], Some("app.example")),
            (&[], Some("other:8080")),
            (&[("x-forwarded-for", "10.0.0.1"), ("forwarded", "for=10.0.0.1")], Some("other:8080")),
        ];
        for (prior, host) in cases {
            let host = host.map(HeaderValue::from_static);
            let (mut cached, mut fresh) = (map(prior), map(prior));
            let chained = Seen::scan(&cached).chained;
            fwd.apply(&mut cached, host.as_ref(), chained);
            add_forwarded(&mut fresh, c, host.as_ref());
            assert_eq!(cached, fresh, "{prior:?} {host:?}");
        }
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

    fn quoted(text: &str) -> String {
        let mut out = Vec::new();
        push_quoted(&mut out, text.as_bytes());
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn hosts_are_quoted_as_quoted_strings() {
        assert_eq!(quoted("app:8080"), "\"app:8080\"");
        assert_eq!(quoted("[::1]:80"), "\"[::1]:80\"");
        // Never a valid Host, but quoted safely all the same.
        assert_eq!(quoted("a\",for=6.6.6.6;host=\"b\\"), "\"a\\\",for=6.6.6.6;host=\\\"b\\\\\"");
    }

    #[test]
    fn the_length_filter_knows_every_hop_by_hop_length() {
        for name in &HOP_BY_HOP {
            assert!(matches!(name.as_str().len(), 2 | 7 | 10 | 16 | 17 | 19), "{name}");
        }
        assert_eq!(HOP_BY_HOP[CONNECTION_AT], header::CONNECTION);
        assert_eq!(HOP_BY_HOP[TRANSFER_ENCODING_AT], header::TRANSFER_ENCODING);
        assert_eq!(HOP_BY_HOP[UPGRADE_AT], header::UPGRADE);
    }

    #[test]
    fn one_pass_finds_what_the_lookups_would() {
        let h = map(&[
            ("host", "a"),
            ("Host", "b"),
            ("authorization", "x"),
            ("x-client-id", "w"),
            ("transfer-encoding", "chunked"),
            ("transfer-encoding", "gzip"),
            ("upgrade", "websocket"),
            ("accept", "*/*"),
        ]);
        let seen = Seen::scan(&h);
        assert_eq!((seen.hosts, seen.authorizations, seen.codings), (2, 1, 2));
        assert!(seen.client_id && seen.upgrade() && !seen.chained);
        for chain in ["x-forwarded-for", "forwarded"] {
            assert!(Seen::scan(&map(&[(chain, "for=1.2.3.4")])).chained, "{chain}");
        }
        let none =
            Seen::scan(&map(&[("accept", "*/*"), ("x-forwarded-proto", "https"), ("user-agent", "u")]));
        assert_eq!(none, Seen::default());
    }

    #[test]
    fn a_header_that_connection_names_is_reported_gone() {
        let mut h = map(&[("connection", "x-forwarded-for"), ("x-forwarded-for", "10.0.0.1")]);
        let seen = Seen::scan(&h);
        assert!(strip_hop_by_hop(&mut h, &seen, false));
        assert!(h.is_empty());
        let mut h = map(&[("connection", "keep-alive"), ("host", "a")]);
        let seen = Seen::scan(&h);
        assert!(!strip_hop_by_hop(&mut h, &seen, false));
    }

    #[test]
    fn addresses_are_written_as_the_standard_library_writes_them() {
        for ip in [
            "0.0.0.0",
            "1.2.3.4",
            "10.99.100.255",
            "127.0.0.1",
            "255.255.255.255",
            "::1",
            "2001:db8::8a2e:370:7334",
        ] {
            let ip: std::net::IpAddr = ip.parse().unwrap();
            let mut out = Vec::new();
            push_ip(&mut out, ip);
            assert_eq!(String::from_utf8(out).unwrap(), ip.to_string());
        }
    }

    #[test]
    fn only_the_hop_by_hop_headers_present_are_looked_up_and_a_response_keeps_the_rest() {
        let mut h = map(&[("connection", "keep-alive"), ("content-length", "3"), ("x-upstream", "a")]);
        strip(&mut h, false);
        let mut names: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        names.sort();
        assert_eq!(names, ["content-length", "x-upstream"]);
        let mut none = map(&[("host", "a"), ("accept", "*/*")]);
        strip(&mut none, false);
        assert_eq!(none.len(), 2);
    }
}
