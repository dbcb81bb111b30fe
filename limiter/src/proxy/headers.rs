//! Header rewriting between client and upstream: hop-by-hop headers are
//! removed (RFC 9110 §7.6.1), and the forwarding headers say who the
//! client was and how it connected. Those are the proxy's word: from a
//! client outside `http.trustedForwarders`, every forwarding header it
//! sent ([`FORWARDING`]) is removed and limiter writes its own
//! (`X-Forwarded-For`, `-Proto`, `-Host`, `-Port` and one `Forwarded`
//! element); from a trusted forwarder, the chains are extended and its
//! `X-Forwarded-Proto`, `-Host` and `-Port` kept. `X-Original-URL` and
//! `X-Rewrite-URL`, path overrides that some frameworks honour past their
//! access rules, never pass.

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

/// The headers a client may send to pass as the proxy's word: who the
/// client is, how it connected, which URL it asked for. The first five
/// are limiter's own, in the order of the constants below, then the two
/// path overrides; the rest only ever come from clients (or forwarders in
/// front).
const FORWARDING_NAMES: [&str; 19] = [
    "x-forwarded-for",
    "forwarded",
    "x-forwarded-proto",
    "x-forwarded-host",
    "x-forwarded-port",
    "x-original-url",
    "x-rewrite-url",
    "x-forwarded-server",
    "x-forwarded-prefix",
    "x-forwarded-ssl",
    "x-forwarded-scheme",
    "x-real-ip",
    "client-ip",
    "true-client-ip",
    "x-client-ip",
    "x-cluster-client-ip",
    "x-original-host",
    "x-url-scheme",
    "front-end-https",
];

const fn forwarding(i: usize) -> HeaderName {
    HeaderName::from_static(FORWARDING_NAMES[i])
}

/// [`FORWARDING_NAMES`] as names.
pub static FORWARDING: [HeaderName; 19] = [
    forwarding(0),
    forwarding(1),
    forwarding(2),
    forwarding(3),
    forwarding(4),
    forwarding(5),
    forwarding(6),
    forwarding(7),
    forwarding(8),
    forwarding(9),
    forwarding(10),
    forwarding(11),
    forwarding(12),
    forwarding(13),
    forwarding(14),
    forwarding(15),
    forwarding(16),
    forwarding(17),
    forwarding(18),
];
const XFF_AT: usize = 0;
const FORWARDED_AT: usize = 1;
const PROTO_AT: usize = 2;
const HOST_AT: usize = 3;
const PORT_AT: usize = 4;
/// `X-Original-URL` and `X-Rewrite-URL`: never passed, from anyone.
const OVERRIDES: u32 = 1 << 5 | 1 << 6;

/// The lengths of the [`FORWARDING`] names, as bits (a name of another
/// length is none of them: one test per header).
const FORWARDING_LENGTHS: u32 = {
    let mut bits = 0u32;
    let mut i = 0;
    while i < FORWARDING_NAMES.len() {
        bits |= 1 << FORWARDING_NAMES[i].len();
        i += 1;
    }
    bits
};

/// Which member of [`FORWARDING`] `name` is (in any case), if any.
pub fn forwarding_index(name: &[u8]) -> Option<usize> {
    let len = name.len();
    if len >= 32 || FORWARDING_LENGTHS & (1 << len) == 0 {
        return None;
    }
    FORWARDING.iter().position(|h| name.eq_ignore_ascii_case(h.as_str().as_bytes()))
}

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
    /// A bit for each member of [`FORWARDING`] present.
    pub forwarding: u32,
    /// A bit for each member of [`HOP_BY_HOP`] present.
    hop_by_hop: u8,
}

impl Seen {
    pub fn scan(headers: &HeaderMap) -> Self {
        Self::of_names(headers.iter().map(|(name, _)| name.as_str().as_bytes()))
    }

    /// The same over the names of a head's lines, as the client wrote them
    /// (any case): one line, one name.
    pub fn of_names<'a>(names: impl Iterator<Item = &'a [u8]>) -> Self {
        let mut seen = Self::default();
        for name in names {
            let is = |known: &HeaderName| name.eq_ignore_ascii_case(known.as_str().as_bytes());
            // Lengths first: most names are none of these.
            match name.len() {
                4 if is(&header::HOST) => seen.hosts = seen.hosts.saturating_add(1),
                13 if is(&header::AUTHORIZATION) => {
                    seen.authorizations = seen.authorizations.saturating_add(1);
                }
                11 if is(&X_CLIENT_ID) => seen.client_id = true,
                2 | 7 | 10 | 16 | 17 | 19 => {
                    if let Some(i) = HOP_BY_HOP.iter().position(is) {
                        seen.hop_by_hop |= 1 << i;
                        if i == TRANSFER_ENCODING_AT {
                            seen.codings = seen.codings.saturating_add(1);
                        }
                    }
                }
                _ => {}
            }
            if let Some(i) = forwarding_index(name) {
                seen.forwarding |= 1 << i;
            }
        }
        seen
    }

    /// Whether a hop-by-hop header is there (then [`is_hop_by_hop`] must
    /// be asked of each line).
    pub fn any_hop_by_hop(&self) -> bool {
        self.hop_by_hop != 0
    }

    /// `X-Forwarded-For` or `Forwarded` is there: a client-sent chain.
    pub fn chained(&self) -> bool {
        self.forwarding & (1 << XFF_AT | 1 << FORWARDED_AT) != 0
    }

    /// A `Connection` header is there.
    pub fn connection(&self) -> bool {
        self.hop_by_hop & (1 << CONNECTION_AT) != 0
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
        connection_named(headers.get_all(header::CONNECTION).iter().map(HeaderValue::as_bytes))
            .filter_map(|t| HeaderName::from_bytes(t).ok())
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

/// The headers `Connection` lines name besides the fixed hop-by-hop ones
/// (its usual `keep-alive` is one of those): the tokens of the lines that
/// are text, trimmed.
pub fn connection_named<'a>(values: impl Iterator<Item = &'a [u8]>) -> impl Iterator<Item = &'a [u8]> {
    values
        .filter(|v| v.iter().all(|&b| b == b'\t' || (0x20..0x7f).contains(&b)))
        .flat_map(|v| v.split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|t| {
            !t.is_empty() && !HOP_BY_HOP.iter().any(|h| t.eq_ignore_ascii_case(h.as_str().as_bytes()))
        })
}

/// Whether a line named `name` goes as hop-by-hop: one of the fixed names,
/// or one of `named` (what [`connection_named`] found).
pub fn is_hop_by_hop(name: &[u8], named: &[&[u8]]) -> bool {
    HOP_BY_HOP.iter().any(|h| name.eq_ignore_ascii_case(h.as_str().as_bytes()))
        || named.iter().any(|n| name.eq_ignore_ascii_case(n))
}

/// Who sent a request, as the forwarding headers name it.
#[derive(Clone, Copy, Debug)]
pub struct Client {
    pub addr: SocketAddr,
    pub proto: Proto,
    /// The port of the listener it reached (`X-Forwarded-Port`).
    pub port: u16,
    /// It is in `http.trustedForwarders` (when its connection was accepted).
    pub trusted: bool,
}

/// A head being made fit for the upstream, as the forwarding rules
/// change it: a [`HeaderMap`] (hyper's engine), or the native engine's
/// head written in one pass. Headers are named by their place in
/// [`FORWARDING`].
pub trait Rewrite {
    /// The client's lines of this header go.
    fn remove(&mut self, at: usize);
    /// The header is `value`, whatever the client sent.
    fn set(&mut self, at: usize, value: &HeaderValue);
    /// The header is the client's lines joined by `, `, then `value`.
    fn extend(&mut self, at: usize, value: Vec<u8>);
}

impl Rewrite for HeaderMap {
    fn remove(&mut self, at: usize) {
        HeaderMap::remove(self, &FORWARDING[at]);
    }

    fn set(&mut self, at: usize, value: &HeaderValue) {
        self.insert(FORWARDING[at].clone(), value.clone());
    }

    fn extend(&mut self, at: usize, value: Vec<u8>) {
        append(self, &FORWARDING[at], value);
    }
}

/// Removes what `seen` found of the client's forwarding headers: all of
/// them from an untrusted client, the path overrides from any.
fn remove_client_forwarding(headers: &mut impl Rewrite, seen: &Seen, trusted: bool) {
    let remove = if trusted { seen.forwarding & OVERRIDES } else { seen.forwarding };
    if remove == 0 {
        return;
    }
    for i in 0..FORWARDING.len() {
        if remove & (1 << i) != 0 {
            headers.remove(i);
        }
    }
}

/// This client's own `X-Forwarded-For` entry and `Forwarded` element.
fn forwarded_values(client: Client, host: Option<&[u8]>) -> (Vec<u8>, Vec<u8>) {
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
    if let Some(host) = host.filter(|h| !h.is_empty()) {
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
    /// `X-Forwarded-For`, `Forwarded` for a request without a `Host`, and
    /// `X-Forwarded-Port`.
    written: std::sync::OnceLock<(Option<HeaderValue>, Option<HeaderValue>, HeaderValue)>,
    /// The last `Host` seen and its `Forwarded` element.
    with_host: std::sync::Mutex<Option<(HeaderValue, HeaderValue)>>,
}

impl Forwarding {
    pub fn new(client: Client) -> Self {
        Self { client, written: std::sync::OnceLock::new(), with_host: std::sync::Mutex::new(None) }
    }

    /// Writes the forwarding headers for this connection's client, from
    /// what was written before when it can be (see the module's rules);
    /// `seen` is what [`Seen::scan`] found of the client's own.
    pub fn apply(&self, headers: &mut impl Rewrite, host: Option<&[u8]>, seen: &Seen) {
        let trusted = self.client.trusted;
        remove_client_forwarding(headers, seen, trusted);
        let (xff, without_host, port) = self.written.get_or_init(|| {
            let (xff, element) = forwarded_values(self.client, None);
            (
                HeaderValue::from_maybe_shared(bytes::Bytes::from(xff)).ok(),
                HeaderValue::from_maybe_shared(bytes::Bytes::from(element)).ok(),
                HeaderValue::from(self.client.port),
            )
        });
        let host = host.filter(|h| !h.is_empty());
        let hosted = host.and_then(|h| self.host_values(h));
        // A trusted forwarder's own say on how its client connected stays.
        let kept = |at: usize| trusted && seen.forwarding & (1 << at) != 0;
        if !kept(PROTO_AT) {
            headers.set(PROTO_AT, &HeaderValue::from_static(self.client.proto.scheme()));
        }
        if !kept(PORT_AT) {
            headers.set(PORT_AT, port);
        }
        if !kept(HOST_AT)
            && let Some((h, _)) = &hosted
        {
            headers.set(HOST_AT, h);
        }
        if trusted && seen.chained() {
            // A chain to extend.
            let (xff, element) = forwarded_values(self.client, host);
            headers.extend(XFF_AT, xff);
            headers.extend(FORWARDED_AT, element);
            return;
        }
        let element = match (host, hosted) {
            (None, _) => without_host.clone(),
            (Some(_), hosted) => hosted.map(|(_, element)| element),
        };
        match (xff, element) {
            (Some(xff), Some(element)) => {
                headers.set(XFF_AT, xff);
                headers.set(FORWARDED_AT, &element);
            }
            // A value that would not do as a header (it always does).
            _ => {
                let (xff, element) = forwarded_values(self.client, host);
                headers.extend(XFF_AT, xff);
                headers.extend(FORWARDED_AT, element);
            }
        }
    }

    /// A `Host` as a value and its `Forwarded` element: the last host's,
    /// kept, when it is the same (it usually is, on one connection).
    fn host_values(&self, host: &[u8]) -> Option<(HeaderValue, HeaderValue)> {
        let mut last = self.with_host.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((value, element)) = &*last
            && value.as_bytes() == host
        {
            return Some((value.clone(), element.clone()));
        }
        let value = HeaderValue::from_bytes(host).ok()?;
        let (_, element) = forwarded_values(self.client, Some(host));
        let element = HeaderValue::from_maybe_shared(bytes::Bytes::from(element)).ok()?;
        *last = Some((value.clone(), element.clone()));
        Some((value, element))
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

    fn client(addr: &str, trusted: bool) -> Client {
        Client { addr: addr.parse().unwrap(), proto: Proto::H1, port: 8080, trusted }
    }

    /// What a connection of `c` writes for a request with `prior` headers
    /// and `host`.
    fn forwarded(c: Client, prior: &[(&str, &str)], host: Option<&'static str>) -> HeaderMap {
        let mut h = map(prior);
        let seen = Seen::scan(&h);
        Forwarding::new(c).apply(&mut h, host.map(str::as_bytes), &seen);
        h
    }

    fn one<'a>(h: &'a HeaderMap, name: &str) -> Vec<&'a str> {
        h.get_all(name).iter().map(|v| v.to_str().unwrap()).collect()
    }

    #[test]
    fn an_untrusted_clients_forwarding_headers_are_replaced_by_the_proxys() {
        let prior: Vec<(&str, &str)> = FORWARDING_NAMES.iter().map(|n| (*n, "6.6.6.6")).collect();
        let mut prior = prior;
        prior.push(("forwarded", "for=6.6.6.6;proto=https"));
        prior.push(("accept", "*/*"));
        let h = forwarded(client("127.0.0.1:5000", false), &prior, Some("app.example"));
        assert_eq!(one(&h, "x-forwarded-for"), ["127.0.0.1"]);
        assert_eq!(one(&h, "forwarded"), ["for=127.0.0.1;proto=http;host=\"app.example\""]);
        assert_eq!(one(&h, "x-forwarded-proto"), ["http"]);
        assert_eq!(one(&h, "x-forwarded-host"), ["app.example"]);
        assert_eq!(one(&h, "x-forwarded-port"), ["8080"]);
        for name in &FORWARDING_NAMES[5..] {
            assert!(h.get(*name).is_none(), "{name} passed");
        }
        assert_eq!(one(&h, "accept"), ["*/*"]);
        // Without a Host: no X-Forwarded-Host, no host= (and none passes).
        let h = forwarded(client("[::1]:5000", false), &[("x-forwarded-host", "evil")], None);
        assert!(h.get("x-forwarded-host").is_none());
        assert_eq!(one(&h, "forwarded"), ["for=\"[::1]\";proto=http"]);
    }

    #[test]
    fn a_trusted_forwarders_chains_are_extended_and_its_view_kept() {
        let prior = [
            ("x-forwarded-for", "10.0.0.1"),
            ("x-forwarded-for", "10.0.0.2, 10.0.0.3"),
            ("forwarded", "for=10.0.0.1"),
            ("forwarded", "for=10.0.0.2;proto=https"),
            ("x-forwarded-proto", "https"),
            ("x-forwarded-host", "app.example"),
            ("x-forwarded-port", "443"),
            ("x-real-ip", "10.0.0.1"),
            ("x-original-url", "/admin"),
            ("x-rewrite-url", "/admin"),
        ];
        let h = forwarded(client("127.0.0.1:5000", true), &prior, Some("app.internal"));
        assert_eq!(one(&h, "x-forwarded-for"), ["10.0.0.1, 10.0.0.2, 10.0.0.3, 127.0.0.1"]);
        assert_eq!(
            one(&h, "forwarded"),
            ["for=10.0.0.1, for=10.0.0.2;proto=https, for=127.0.0.1;proto=http;host=\"app.internal\""]
        );
        assert_eq!(one(&h, "x-forwarded-proto"), ["https"]);
        assert_eq!(one(&h, "x-forwarded-host"), ["app.example"]);
        assert_eq!(one(&h, "x-forwarded-port"), ["443"]);
        assert_eq!(one(&h, "x-real-ip"), ["10.0.0.1"]);
        assert!(h.get("x-original-url").is_none() && h.get("x-rewrite-url").is_none(), "never passed");
        // A trusted forwarder that sent nothing: the proxy's own view.
        let h = forwarded(client("127.0.0.1:5000", true), &[], Some("app"));
        assert_eq!(one(&h, "x-forwarded-for"), ["127.0.0.1"]);
        assert_eq!(one(&h, "x-forwarded-proto"), ["http"]);
        assert_eq!(one(&h, "x-forwarded-port"), ["8080"]);
    }

    #[test]
    fn a_connections_cached_values_are_what_a_fresh_connection_writes() {
        for trusted in [false, true] {
            let c = client("127.0.0.1:5000", trusted);
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
                let mut cached = map(prior);
                let seen = Seen::scan(&cached);
                fwd.apply(&mut cached, host.map(str::as_bytes), &seen);
                assert_eq!(cached, forwarded(c, prior, host), "{prior:?} {host:?} trusted: {trusted}");
            }
        }
    }

    #[test]
    fn tls_requests_say_https_whatever_the_protocol() {
        for proto in [Proto::H1Tls, Proto::H2Tls] {
            let c = Client { proto, ..client("127.0.0.1:5000", false) };
            let h = forwarded(c, &[("x-forwarded-proto", "http")], None);
            assert_eq!(one(&h, "x-forwarded-proto"), ["https"]);
            assert_eq!(one(&h, "forwarded"), ["for=127.0.0.1;proto=https"]);
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
        assert!(seen.client_id && seen.upgrade() && !seen.chained());
        for chain in ["x-forwarded-for", "forwarded"] {
            assert!(Seen::scan(&map(&[(chain, "for=1.2.3.4")])).chained(), "{chain}");
        }
        let none = Seen::scan(&map(&[("accept", "*/*"), ("user-agent", "u"), ("x-forwarded", "x")]));
        assert_eq!(none, Seen::default());
        // Every forwarding name, and only those, found (in any case).
        for (i, name) in FORWARDING_NAMES.iter().enumerate() {
            let seen = Seen::scan(&map(&[(&name.to_uppercase(), "x"), ("accept", "*/*")]));
            assert_eq!(seen.forwarding, 1 << i, "{name}");
        }
        assert_eq!(FORWARDING.iter().map(HeaderName::as_str).collect::<Vec<_>>(), FORWARDING_NAMES);
        assert_eq!(OVERRIDES, 1 << 5 | 1 << 6);
        assert_eq!((FORWARDING_NAMES[5], FORWARDING_NAMES[6]), ("x-original-url", "x-rewrite-url"));
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
