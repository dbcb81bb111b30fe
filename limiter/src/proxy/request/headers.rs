//! Header rewriting between client and upstream: hop-by-hop headers are
//! removed (RFC 9110 §7.6.1), and the forwarding headers say who the
//! client was and how it connected. Those are the proxy's word: from a
//! client outside `http.trustedForwarders`, every forwarding header it
//! sent is removed — every header an upstream component of
//! [`CONSUMERS`] reads as a proxy's word ([`FORWARDING`]), in any case
//! and with `_` for `-` — and limiter writes its own (`X-Forwarded-For`,
//! `-Proto`, `-Host`, `-Port`, one `Forwarded` element and
//! `X-Request-Id`); from a trusted forwarder, the chains are extended and
//! its `X-Forwarded-Proto`, `-Host`, `-Port` and `X-Request-Id` kept.
//! `X-Original-URL` and `X-Rewrite-URL`, path overrides that some
//! frameworks honour past their access rules, never pass. A field whose
//! name holds a `_` is dropped unless `http.underscoresInHeaders = on`
//! ([`underscore_passes`]).

use std::net::SocketAddr;

use crate::proxy::{h1::framing::ResponseHead, proto::Proto};

use hyper::header::{self, HeaderName};

/// Hop-by-hop headers, always removed; plus any header the `Connection`
/// header names. (Names, not strings: a lookup by string parses it first.
/// Their lengths, 2, 7, 10, 16, 17 and 19, are checked in
/// [`Seen::of_names`].)
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
const UPGRADE_AT: usize = 6;

/// An upstream component that takes some request headers as the word of
/// a proxy in front: who the client was, how it connected, which URL it
/// asked for. Every header any of them reads is a forwarding header
/// ([`FORWARDING`]).
#[derive(Clone, Copy, Debug)]
pub struct Consumer {
    pub name: &'static str,
    pub component: &'static str,
    /// The headers it reads, as it names them (its spelling: `_` or `-`).
    pub reads: &'static [&'static str],
}

/// Who reads which forwarding header, from their documentation and
/// defaults. The manual's table of forwarding headers (docs/http-admission.md) is this one.
pub const CONSUMERS: &[Consumer] = &[
    Consumer {
        name: "Jetty",
        component: "ForwardedRequestCustomizer",
        reads: &[
            "Forwarded",
            "X-Forwarded-Host",
            "X-Forwarded-Server",
            "X-Forwarded-Proto",
            "X-Forwarded-For",
            "X-Forwarded-Port",
            "X-Proxied-Https",
            "Proxy-ssl-id",
            "Proxy-auth-cert",
        ],
    },
    Consumer {
        name: "Tomcat",
        component: "RemoteIpValve, RemoteIpFilter",
        reads: &[
            "X-Forwarded-For",
            "X-Forwarded-By",
            "X-Forwarded-Proto",
            "X-Forwarded-Host",
            "X-Forwarded-Port",
        ],
    },
    Consumer {
        name: "Tomcat",
        component: "SSLValve",
        reads: &[
            "ssl_client_cert",
            "ssl_client_escaped_cert",
            "ssl_cipher",
            "ssl_session_id",
            "ssl_cipher_usekeysize",
        ],
    },
    Consumer {
        name: "Spring",
        component: "ForwardedHeaderFilter",
        reads: &[
            "Forwarded",
            "X-Forwarded-Host",
            "X-Forwarded-Port",
            "X-Forwarded-Proto",
            "X-Forwarded-Ssl",
            "X-Forwarded-Prefix",
            "X-Forwarded-For",
        ],
    },
    Consumer {
        name: "Undertow",
        component: "ProxyPeerAddressHandler, ForwardedHandler",
        reads: &["X-Forwarded-For", "X-Forwarded-Proto", "X-Forwarded-Host", "X-Forwarded-Port", "Forwarded"],
    },
    Consumer {
        name: "Undertow",
        component: "SSLHeaderHandler",
        reads: &["SSL_CLIENT_CERT", "SSL_CIPHER", "SSL_SESSION_ID", "SSL_CIPHER_USEKEYSIZE"],
    },
    Consumer {
        name: "Rack",
        component: "Rack::Request",
        reads: &[
            "Forwarded",
            "X-Forwarded-For",
            "X-Forwarded-Host",
            "X-Forwarded-Port",
            "X-Forwarded-Proto",
            "X-Forwarded-Scheme",
            "X-Forwarded-Ssl",
        ],
    },
    Consumer {
        name: "Rails",
        component: "ActionDispatch::RemoteIp",
        reads: &["Client-Ip", "X-Forwarded-For"],
    },
    Consumer {
        name: "Django",
        component: "HttpRequest (USE_X_FORWARDED_HOST, USE_X_FORWARDED_PORT, SECURE_PROXY_SSL_HEADER)",
        reads: &["X-Forwarded-Host", "X-Forwarded-Port", "X-Forwarded-Proto", "X-Forwarded-For"],
    },
    Consumer {
        name: "Express",
        component: "trust proxy",
        reads: &["X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"],
    },
    Consumer {
        name: "Werkzeug (Flask)",
        component: "ProxyFix",
        reads: &[
            "X-Forwarded-For",
            "X-Forwarded-Proto",
            "X-Forwarded-Host",
            "X-Forwarded-Port",
            "X-Forwarded-Prefix",
        ],
    },
    Consumer { name: "nginx", component: "ngx_http_realip_module", reads: &["X-Real-IP", "X-Forwarded-For"] },
    Consumer {
        name: "ASP.NET Core, IIS",
        component: "ForwardedHeadersMiddleware, URL Rewrite",
        reads: &[
            "X-Forwarded-For",
            "X-Forwarded-Proto",
            "X-Forwarded-Host",
            "X-Forwarded-Prefix",
            "X-Original-Host",
            "X-Original-URL",
            "X-Rewrite-URL",
            "Front-End-Https",
        ],
    },
    Consumer {
        name: "CDNs and load balancers",
        component: "Akamai, Cloudflare, F5, Citrix conventions",
        reads: &["True-Client-IP", "CF-Connecting-IP", "X-Client-IP", "X-Cluster-Client-IP", "X-Url-Scheme"],
    },
];

/// The headers limiter writes itself on every request it forwards, in
/// their places in [`FORWARDING`]: the forwarding headers (from a trusted
/// forwarder, the chains extended and its `-Proto`, `-Host` and `-Port`
/// kept) and the request's id (a trusted forwarder's kept).
const OWN: [&str; 6] = [
    "x-forwarded-for",
    "forwarded",
    "x-forwarded-proto",
    "x-forwarded-host",
    "x-forwarded-port",
    "x-request-id",
];
const XFF_AT: usize = 0;
const FORWARDED_AT: usize = 1;
const PROTO_AT: usize = 2;
const HOST_AT: usize = 3;
const PORT_AT: usize = 4;
const ID_AT: usize = 5;
/// Path overrides some frameworks honour past their access rules: never
/// passed, from anyone. Their places follow [`OWN`]'s.
const OVERRIDES: [&str; 2] = ["x-original-url", "x-rewrite-url"];
const OVERRIDE_BITS: u64 = 1 << OWN.len() | 1 << (OWN.len() + 1);

/// Every forwarding header: limiter's own, the path overrides, then what
/// [`CONSUMERS`] read, once each, lower-case with `-` (a name matches in
/// any case and with `_` for `-`: a CGI-style upstream reads
/// `X_Forwarded_For` as `X-Forwarded-For`).
pub static FORWARDING: std::sync::LazyLock<Names> = std::sync::LazyLock::new(|| {
    let mut list: Vec<String> = OWN.iter().chain(&OVERRIDES).map(|n| (*n).to_owned()).collect();
    for name in CONSUMERS.iter().flat_map(|c| c.reads) {
        let name = canonical(name);
        if !list.contains(&name) {
            list.push(name);
        }
    }
    assert!(list.len() <= 64, "the forwarding headers fit a u64 of bits");
    let lengths = list.iter().fold(0u64, |bits, n| bits | 1 << n.len().min(63));
    Names { list, lengths }
});

/// A header name as [`FORWARDING`] holds it: lower case, `-` for `_`.
fn canonical(name: &str) -> String {
    name.bytes().map(|b| if b == b'_' { '-' } else { char::from(b.to_ascii_lowercase()) }).collect()
}

/// Whether `name` (any case, `_` or `-`) is `canonical`.
fn same_name(name: &[u8], canonical: &[u8]) -> bool {
    name.len() == canonical.len()
        && name.iter().zip(canonical).all(|(&a, &c)| {
            let a = a.to_ascii_lowercase();
            a == c || (a == b'_' && c == b'-')
        })
}

/// The forwarding headers, and their lengths as bits (a name of another
/// length is none of them: one test per header).
#[derive(Debug)]
pub struct Names {
    list: Vec<String>,
    lengths: u64,
}

impl Names {
    /// Which member `name` is (in any case, `_` for `-`), if any.
    pub fn index(&self, name: &[u8]) -> Option<usize> {
        let len = name.len();
        if len >= 64 || self.lengths & (1 << len) == 0 {
            return None;
        }
        self.list.iter().position(|h| same_name(name, h.as_bytes()))
    }

    /// The member at `at`, as limiter writes it.
    pub fn name(&self, at: usize) -> &str {
        &self.list[at]
    }

    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.list.iter().map(String::as_str)
    }
}

/// Which member of [`FORWARDING`] `name` is, if any.
pub fn forwarding_index(name: &[u8]) -> Option<usize> {
    FORWARDING.index(name)
}

/// Names limiter interprets or writes itself besides the forwarding
/// headers: with `http.underscoresInHeaders = on`, a field whose name is
/// one of these (or a forwarding header) with `_` for `-` still never
/// reaches the upstream.
const INTERPRETED: [&str; 13] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
    "proxy-authorization",
    "expect",
    "authorization",
    "x-client-id",
];

/// Whether a field named `name`, which holds a `_`, reaches the upstream:
/// never by default (`http.underscoresInHeaders = off`, as nginx's
/// `underscores_in_headers off`); with `on`, unless it stands for a name
/// limiter interprets or a forwarding header.
pub fn underscore_passes(name: &[u8], underscores_on: bool) -> bool {
    underscores_on
        && forwarding_index(name).is_none()
        && !INTERPRETED.iter().any(|n| same_name(name, n.as_bytes()))
}

/// Names a web client (the web-client limit).
static X_CLIENT_ID: HeaderName = HeaderName::from_static("x-client-id");

/// Which of the headers the proxy interprets or rewrites a request has,
/// found in one pass over its names (no hashing), so that the head's
/// checks, admission and forwarding look up only what is there. (Of a
/// response, only its hop-by-hop headers are used.)
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    /// Lines of `Host` and `Authorization` (up to 255).
    pub hosts: u8,
    pub authorizations: u8,
    /// `X-Client-Id` is there.
    pub client_id: bool,
    /// A bit for each member of [`FORWARDING`] present.
    pub forwarding: u64,
    /// A name holds a `_` (it is none of the above: see
    /// [`underscore_passes`]).
    pub underscores: bool,
    /// A bit for each member of [`HOP_BY_HOP`] present.
    hop_by_hop: u8,
}

impl Seen {
    /// What the names of a head's lines show, as the client wrote them
    /// (any case): one line, one name.
    pub fn of_names<'a>(names: impl Iterator<Item = &'a [u8]>) -> Self {
        let mut seen = Self::default();
        let forwarding = &*FORWARDING;
        for name in names {
            if name.contains(&b'_') {
                seen.underscores = true;
                continue;
            }
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
                    }
                }
                _ => {}
            }
            if let Some(i) = forwarding.index(name) {
                seen.forwarding |= 1 << i;
            }
        }
        seen
    }

    /// Whether a hop-by-hop header is there (then [`HopByHop::drops`] must
    /// be asked of each line).
    pub fn any_hop_by_hop(&self) -> bool {
        self.hop_by_hop != 0
    }

    /// `X-Forwarded-For` or `Forwarded` is there: a client-sent chain.
    pub fn chained(&self) -> bool {
        self.forwarding & (1 << XFF_AT | 1 << FORWARDED_AT) != 0
    }

    /// `X-Request-Id` is there.
    pub fn request_id(&self) -> bool {
        self.forwarding & (1 << ID_AT) != 0
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

/// The headers `Connection` lines name besides the fixed hop-by-hop ones
/// (its usual `keep-alive` is one of those): the tokens of the lines that
/// are text, trimmed.
fn connection_named<'a>(values: impl Iterator<Item = &'a [u8]>) -> impl Iterator<Item = &'a [u8]> {
    values
        .filter(|v| v.iter().all(|&b| b == b'\t' || (0x20..0x7f).contains(&b)))
        .flat_map(|v| v.split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|t| {
            !t.is_empty() && !HOP_BY_HOP.iter().any(|h| t.eq_ignore_ascii_case(h.as_str().as_bytes()))
        })
}

/// A head's hop-by-hop lines (RFC 9110 §7.6.1): the fixed names, and the
/// names its `Connection` lines give. One rule for the request limiter
/// forwards and for the response it relays, on either protocol.
pub struct HopByHop<'a> {
    named: Vec<&'a [u8]>,
    any: bool,
}

impl<'a> HopByHop<'a> {
    /// The rule for a head whose names `seen` found, and its `Connection`
    /// values.
    pub fn of(seen: &Seen, connection: impl Iterator<Item = &'a [u8]>) -> Self {
        let named = if seen.connection() { connection_named(connection).collect() } else { Vec::new() };
        Self { named, any: seen.any_hop_by_hop() }
    }

    /// Whether a line named `name` stops at this hop.
    pub fn drops(&self, name: &[u8]) -> bool {
        self.any
            && (HOP_BY_HOP.iter().any(|h| name.eq_ignore_ascii_case(h.as_str().as_bytes()))
                || self.named.iter().any(|n| name.eq_ignore_ascii_case(n)))
    }
}

/// The lines of an upstream response that go on to its client, on either
/// protocol, in their order: all but the hop-by-hop ones and
/// `Content-Length` (the client's framing is limiter's, from
/// [`crate::proxy::pipeline::Body::length`]).
pub fn response_lines<'h>(
    head: &'h ResponseHead,
    bytes: &'h [u8],
) -> impl Iterator<Item = (&'h [u8], &'h [u8])> {
    let lines = head.fields.iter().map(move |f| (f.name.get(bytes), f.value.get(bytes)));
    let seen = Seen::of_names(lines.clone().map(|(name, _)| name));
    let connection = lines.clone().filter(|(name, _)| name.eq_ignore_ascii_case(b"connection"));
    let hop = HopByHop::of(&seen, connection.map(|(_, value)| value));
    lines.filter(move |(name, _)| !hop.drops(name) && !name.eq_ignore_ascii_case(b"content-length"))
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

/// A head being made fit for the upstream, as the forwarding rules change
/// it. Headers are named by their place in [`FORWARDING`].
pub trait Rewrite {
    /// The client's lines of this header go.
    fn remove(&mut self, at: usize);
    /// The header is `value`, whatever the client sent.
    fn set(&mut self, at: usize, value: &[u8]);
    /// The header is the client's lines joined by `, `, then `value`.
    fn extend(&mut self, at: usize, value: Vec<u8>);
}

/// Removes what `seen` found of the client's forwarding headers: all of
/// them from an untrusted client, the path overrides from any.
fn remove_client_forwarding(headers: &mut impl Rewrite, seen: &Seen, trusted: bool) {
    let mut remove = if trusted { seen.forwarding & OVERRIDE_BITS } else { seen.forwarding };
    while remove != 0 {
        let i = remove.trailing_zeros() as usize;
        headers.remove(i);
        remove &= remove - 1;
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
/// request on it, and so, usually, is its `Host`.
pub struct Forwarding {
    client: Client,
    /// `X-Forwarded-For`, `Forwarded` for a request without a `Host`, and
    /// `X-Forwarded-Port`.
    written: std::sync::OnceLock<(Vec<u8>, Vec<u8>, Vec<u8>)>,
    /// The last `Host` seen and its `Forwarded` element.
    with_host: std::sync::Mutex<Option<(Vec<u8>, Vec<u8>)>>,
}

impl Forwarding {
    pub fn new(client: Client) -> Self {
        Self { client, written: std::sync::OnceLock::new(), with_host: std::sync::Mutex::new(None) }
    }

    /// Writes the forwarding headers for this connection's client, from
    /// what was written before when it can be (see the module's rules);
    /// `seen` is what [`Seen::of_names`] found of the client's own, `id`
    /// the request's id.
    pub fn apply(&self, headers: &mut impl Rewrite, host: Option<&[u8]>, seen: &Seen, id: &[u8]) {
        let trusted = self.client.trusted;
        remove_client_forwarding(headers, seen, trusted);
        let (xff, without_host, port) = self.written.get_or_init(|| {
            let (xff, element) = forwarded_values(self.client, None);
            (xff, element, itoa::Buffer::new().format(self.client.port).as_bytes().to_vec())
        });
        // A trusted forwarder's own say on how its client connected stays.
        let kept = |at: usize| trusted && seen.forwarding & (1 << at) != 0;
        if !kept(PROTO_AT) {
            headers.set(PROTO_AT, self.client.proto.scheme().as_bytes());
        }
        if !kept(PORT_AT) {
            headers.set(PORT_AT, port);
        }
        headers.set(ID_AT, id);
        let host = host.filter(|h| !h.is_empty());
        let mut last = self.with_host.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let hosted = host.map(|h| self.host_element(&mut last, h));
        if !kept(HOST_AT)
            && let Some(h) = host
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
        headers.set(XFF_AT, xff);
        headers.set(FORWARDED_AT, hosted.unwrap_or(without_host));
    }

    /// The `Forwarded` element of a request to `host`: the last host's,
    /// kept, when it is the same (it usually is, on one connection).
    fn host_element<'l>(&self, last: &'l mut Option<(Vec<u8>, Vec<u8>)>, host: &[u8]) -> &'l [u8] {
        if last.as_ref().is_none_or(|(h, _)| h != host) {
            let (_, element) = forwarded_values(self.client, Some(host));
            *last = Some((host.to_vec(), element));
        }
        &last.as_ref().expect("just set").1
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
mod tests;
