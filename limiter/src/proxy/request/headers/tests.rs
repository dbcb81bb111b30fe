//! The header rules as the upstream sees them: each case is a request head
//! read by the engine ([`Request::from_h1`]) and written for the upstream
//! ([`Request::write_upstream`]), the code every request goes through.

use bytes::Bytes;

use super::*;
use crate::proxy::{
    h1::framing as http1,
    request::{Outgoing, Request, Upstreamed},
};
use crate::request_id::RequestId;

fn client(addr: &str, trusted: bool) -> Client {
    Client { addr: addr.parse().unwrap(), proto: Proto::H1, port: 8080, trusted }
}

fn request(lines: &[(&str, &str)]) -> Request {
    let mut head = String::from("GET / HTTP/1.1\r\n");
    for (name, value) in lines {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let bytes = Bytes::from(head);
    let parsed = http1::parse_request(&bytes).unwrap().unwrap();
    Request::from_h1(bytes, parsed).unwrap()
}

const ID: RequestId = RequestId::Own(*b"0123456789abcdef");

/// The fields the upstream gets for a request of `lines` on a connection
/// of `fwd` (names lower-cased), and how many went for a `_`.
fn sent_on(
    fwd: &Forwarding,
    lines: &[(&str, &str)],
    upgrade: bool,
    underscores: bool,
) -> (Vec<(String, String)>, u32) {
    let req = request(lines);
    let mut out = Vec::new();
    let u = Upstreamed { fwd, upstream: "upstream:80", body: Outgoing::None, upgrade, id: &ID, underscores };
    let dropped = req.write_upstream(&mut out, &u);
    let text = String::from_utf8(out).unwrap();
    let fields = text
        .split("\r\n")
        .skip(1)
        .take_while(|l| !l.is_empty())
        .map(|l| {
            let (name, value) = l.split_once(": ").unwrap();
            (name.to_ascii_lowercase(), value.to_owned())
        })
        .collect();
    (fields, dropped)
}

fn sent(c: Client, lines: &[(&str, &str)]) -> Vec<(String, String)> {
    sent_on(&Forwarding::new(c), lines, false, false).0
}

fn one<'a>(fields: &'a [(String, String)], name: &str) -> Vec<&'a str> {
    fields.iter().filter(|(n, _)| n == name).map(|(_, v)| v.as_str()).collect()
}

fn names(fields: &[(String, String)]) -> Vec<&str> {
    let mut names: Vec<&str> = fields.iter().map(|(n, _)| n.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    names
}

/// limiter's own fields, on every request.
const OWN_FIELDS: [&str; 6] = [
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-port",
    "x-forwarded-proto",
    "x-request-id",
];

#[test]
fn hop_by_hop_and_connection_named_headers_go() {
    let fields = sent(
        client("127.0.0.1:5000", false),
        &[
            ("Host", "a"),
            ("connection", "keep-alive, x-secret"),
            ("keep-alive", "timeout=5"),
            ("x-secret", "1"),
            ("te", "trailers"),
            ("proxy-authorization", "Basic x"),
            ("authorization", "Bearer kept"),
            ("x-other", "kept"),
        ],
    );
    let mut want = vec!["authorization", "host", "x-other"];
    want.extend(OWN_FIELDS);
    want.sort_unstable();
    assert_eq!(names(&fields), want);
}

#[test]
fn an_upgrade_to_h2c_is_not_passed_on() {
    let lines = [
        ("Host", "a"),
        ("connection", "Upgrade, HTTP2-Settings"),
        ("upgrade", "h2c"),
        ("http2-settings", "AAMAAABkAAQAoAAAAAIAAAAA"),
    ];
    assert!(!request(&lines).is_upgrade());
    let fields = sent(client("127.0.0.1:5000", false), &lines);
    for gone in ["connection", "upgrade", "http2-settings"] {
        assert!(one(&fields, gone).is_empty(), "{gone} passed: {fields:?}");
    }
}

#[test]
fn upgrades_keep_their_two_headers() {
    let lines = [("Host", "a"), ("connection", "Upgrade"), ("upgrade", "websocket"), ("keep-alive", "1")];
    assert!(request(&lines).is_upgrade());
    let (fields, _) = sent_on(&Forwarding::new(client("127.0.0.1:5000", false)), &lines, true, false);
    assert_eq!(one(&fields, "upgrade"), ["websocket"]);
    assert_eq!(one(&fields, "connection"), ["upgrade"]);
    assert!(one(&fields, "keep-alive").is_empty());
}

#[test]
fn every_header_a_consumer_reads_is_a_forwarding_header_in_any_spelling() {
    for consumer in CONSUMERS {
        for name in consumer.reads {
            let dashes = name.replace('_', "-");
            let underscores = name.replace('-', "_");
            for spelling in [name.to_string(), dashes.to_uppercase(), underscores.to_lowercase()] {
                assert!(
                    forwarding_index(spelling.as_bytes()).is_some(),
                    "{} {} reads {name}: {spelling} is not a forwarding header",
                    consumer.name,
                    consumer.component
                );
            }
        }
    }
    // limiter's own come first, in their places, then the path overrides.
    let list: Vec<&str> = FORWARDING.iter().collect();
    assert_eq!(list[..OWN.len()], OWN);
    assert_eq!(list[OWN.len()..OWN.len() + 2], OVERRIDES);
    assert_eq!(OVERRIDE_BITS, 1 << 6 | 1 << 7);
    let unique: std::collections::BTreeSet<&str> = list.iter().copied().collect();
    assert_eq!(unique.len(), list.len(), "each once");
    assert!(forwarding_index(b"x-forwarded").is_none() && forwarding_index(b"accept").is_none());
}

#[test]
fn an_untrusted_clients_forwarding_headers_are_replaced_by_the_proxys_in_every_spelling() {
    let mut lines: Vec<(String, String)> = Vec::new();
    for name in FORWARDING.iter() {
        lines.push((name.to_owned(), "6.6.6.6".into()));
        lines.push((name.to_uppercase(), "6.6.6.6".into()));
        lines.push((name.replace('-', "_"), "6.6.6.6".into()));
    }
    lines.push(("Host".into(), "app.example".into()));
    lines.push(("accept".into(), "*/*".into()));
    let lines: Vec<(&str, &str)> = lines.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
    // Underscore names pass nowhere, whether or not others may.
    for underscores in [false, true] {
        let fwd = Forwarding::new(client("127.0.0.1:5000", false));
        let (fields, _) = sent_on(&fwd, &lines, false, underscores);
        assert_eq!(one(&fields, "x-forwarded-for"), ["127.0.0.1"]);
        assert_eq!(one(&fields, "forwarded"), ["for=127.0.0.1;proto=http;host=\"app.example\""]);
        assert_eq!(one(&fields, "x-forwarded-proto"), ["http"]);
        assert_eq!(one(&fields, "x-forwarded-host"), ["app.example"]);
        assert_eq!(one(&fields, "x-forwarded-port"), ["8080"]);
        assert_eq!(one(&fields, "x-request-id"), ["0123456789abcdef"]);
        let mut want = vec!["accept", "host"];
        want.extend(OWN_FIELDS);
        want.sort_unstable();
        assert_eq!(names(&fields), want, "underscoresInHeaders {underscores}");
        assert!(fields.iter().all(|(_, v)| v != "6.6.6.6"), "{fields:?}");
    }
    // Without a Host: no X-Forwarded-Host, no host= (and none passes).
    let fields = sent(client("[::1]:5000", false), &[("x-forwarded-host", "evil")]);
    assert!(one(&fields, "x-forwarded-host").is_empty());
    assert_eq!(one(&fields, "forwarded"), ["for=\"[::1]\";proto=http"]);
}

#[test]
fn names_with_an_underscore_are_dropped_unless_allowed_and_never_stand_for_a_known_one() {
    let lines = [
        ("Host", "a"),
        ("X_Custom", "1"),
        ("Content_Length", "5"),
        ("Transfer_Encoding", "chunked"),
        ("Proxy_Connection", "x"),
        ("X_Client_Id", "w"),
        ("Proxy_ssl_id", "FORGED"),
        ("SSL_CLIENT_CERT", "FORGED"),
        ("x-ok", "1"),
    ];
    let fwd = Forwarding::new(client("127.0.0.1:5000", false));
    let (fields, dropped) = sent_on(&fwd, &lines, false, false);
    assert!(fields.iter().all(|(n, _)| !n.contains('_')), "{fields:?}");
    assert_eq!(dropped, 7);
    let (fields, dropped) = sent_on(&fwd, &lines, false, true);
    let passed: Vec<&str> = fields.iter().filter(|(n, _)| n.contains('_')).map(|(n, _)| n.as_str()).collect();
    assert_eq!(passed, ["x_custom"]);
    assert_eq!(dropped, 6);
    assert_eq!(one(&fields, "x-ok"), ["1"]);
}

#[test]
fn a_name_connection_gives_stops_at_this_hop_even_with_an_underscore() {
    let lines = [("Host", "a"), ("Connection", "x_tok"), ("x_tok", "secret"), ("x_other", "1")];
    let fwd = Forwarding::new(client("127.0.0.1:5000", false));
    let (fields, _) = sent_on(&fwd, &lines, false, true);
    assert!(one(&fields, "x_tok").is_empty(), "{fields:?}");
    assert_eq!(one(&fields, "x_other"), ["1"]);
}

#[test]
fn a_trusted_forwarders_chains_are_extended_and_its_view_kept() {
    let prior = [
        ("Host", "app.internal"),
        ("x-forwarded-for", "10.0.0.1"),
        ("x-forwarded-for", "10.0.0.2, 10.0.0.3"),
        ("forwarded", "for=10.0.0.1"),
        ("forwarded", "for=10.0.0.2;proto=https"),
        ("x-forwarded-proto", "https"),
        ("x-forwarded-host", "app.example"),
        ("x-forwarded-port", "443"),
        ("x-real-ip", "10.0.0.1"),
        ("x-proxied-https", "on"),
        ("x-request-id", "edge-1"),
        ("x-original-url", "/admin"),
        ("x-rewrite-url", "/admin"),
    ];
    let req = request(&prior);
    let id = req.id(true);
    let mut out = Vec::new();
    let fwd = Forwarding::new(client("127.0.0.1:5000", true));
    let u = Upstreamed {
        fwd: &fwd,
        upstream: "u",
        body: Outgoing::None,
        upgrade: false,
        id: &id,
        underscores: false,
    };
    req.write_upstream(&mut out, &u);
    let text = String::from_utf8(out).unwrap();
    let fields: Vec<(String, String)> = text
        .split("\r\n")
        .skip(1)
        .take_while(|l| !l.is_empty())
        .map(|l| l.split_once(": ").map(|(n, v)| (n.to_ascii_lowercase(), v.to_owned())).unwrap())
        .collect();
    assert_eq!(one(&fields, "x-forwarded-for"), ["10.0.0.1, 10.0.0.2, 10.0.0.3, 127.0.0.1"]);
    assert_eq!(
        one(&fields, "forwarded"),
        ["for=10.0.0.1, for=10.0.0.2;proto=https, for=127.0.0.1;proto=http;host=\"app.internal\""]
    );
    assert_eq!(one(&fields, "x-forwarded-proto"), ["https"]);
    assert_eq!(one(&fields, "x-forwarded-host"), ["app.example"]);
    assert_eq!(one(&fields, "x-forwarded-port"), ["443"]);
    assert_eq!(one(&fields, "x-real-ip"), ["10.0.0.1"]);
    assert_eq!(one(&fields, "x-proxied-https"), ["on"]);
    assert_eq!(one(&fields, "x-request-id"), ["edge-1"]);
    assert!(
        one(&fields, "x-original-url").is_empty() && one(&fields, "x-rewrite-url").is_empty(),
        "never passed"
    );
    // A trusted forwarder that sent nothing: the proxy's own view.
    let fields = sent(client("127.0.0.1:5000", true), &[("Host", "app")]);
    assert_eq!(one(&fields, "x-forwarded-for"), ["127.0.0.1"]);
    assert_eq!(one(&fields, "x-forwarded-proto"), ["http"]);
    assert_eq!(one(&fields, "x-forwarded-port"), ["8080"]);
}

#[test]
fn a_connections_cached_values_are_what_a_fresh_connection_writes() {
    for trusted in [false, true] {
        let c = client("127.0.0.1:5000", trusted);
        let fwd = Forwarding::new(c);
        type Case<'a> = &'a [(&'a str, &'a str)];
        let cases: [Case; 5] = [
            &[],
            &[("Host", "app.example")],
            &[("Host", "app.example")],
            &[("Host", "other:8080")],
            &[("Host", "other:8080"), ("x-forwarded-for", "10.0.0.1"), ("forwarded", "for=10.0.0.1")],
        ];
        for lines in cases {
            let cached = sent_on(&fwd, lines, false, false);
            assert_eq!(
                cached,
                sent_on(&Forwarding::new(c), lines, false, false),
                "{lines:?} trusted: {trusted}"
            );
        }
    }
}

#[test]
fn tls_requests_say_https_whatever_the_protocol() {
    for proto in [Proto::H1Tls, Proto::H2Tls] {
        let c = Client { proto, ..client("127.0.0.1:5000", false) };
        let fields = sent(c, &[("x-forwarded-proto", "http")]);
        assert_eq!(one(&fields, "x-forwarded-proto"), ["https"]);
        assert_eq!(one(&fields, "forwarded"), ["for=127.0.0.1;proto=https"]);
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
    assert_eq!(HOP_BY_HOP[UPGRADE_AT], header::UPGRADE);
}

fn seen(names: &[&str]) -> Seen {
    Seen::of_names(names.iter().map(|n| n.as_bytes()))
}

#[test]
fn one_pass_finds_what_the_lookups_would() {
    let s = seen(&[
        "host",
        "Host",
        "authorization",
        "x-client-id",
        "transfer-encoding",
        "transfer-encoding",
        "upgrade",
        "accept",
    ]);
    assert_eq!((s.hosts, s.authorizations), (2, 1));
    assert!(s.client_id && s.upgrade() && !s.chained() && !s.underscores);
    for chain in ["x-forwarded-for", "forwarded"] {
        assert!(seen(&[chain]).chained(), "{chain}");
    }
    assert_eq!(seen(&["accept", "user-agent", "x-forwarded"]), Seen::default());
    // Every forwarding name, and only those, found (in any case).
    for (i, name) in FORWARDING.iter().enumerate() {
        assert_eq!(seen(&[&name.to_uppercase(), "accept"]).forwarding, 1 << i, "{name}");
    }
    // A name with `_` is only that.
    let s = seen(&["X_Forwarded_For", "Ho_st"]);
    assert!(s.underscores && s.forwarding == 0 && s.hosts == 0);
}

#[test]
fn a_header_that_connection_names_is_not_passed_and_the_proxys_own_goes_once() {
    let fields = sent(
        client("127.0.0.1:5000", false),
        &[("connection", "x-forwarded-for"), ("x-forwarded-for", "10.0.0.1")],
    );
    assert_eq!(one(&fields, "x-forwarded-for"), ["127.0.0.1"]);
    assert!(one(&fields, "connection").is_empty());
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
fn only_a_trusted_forwarder_names_the_id() {
    let req = request(&[("Host", "a"), ("X-Request-Id", "edge-42")]);
    assert_eq!(req.id(true).as_str(), "edge-42");
    assert!(matches!(req.id(false), RequestId::Own(_)));
    let long = "x".repeat(129);
    assert!(matches!(request(&[("Host", "a"), ("X-Request-Id", &long)]).id(true), RequestId::Own(_)));
    assert!(matches!(request(&[("Host", "a"), ("X-Request-Id", "a b")]).id(true), RequestId::Own(_)));
    assert!(matches!(request(&[("Host", "a")]).id(true), RequestId::Own(_)));
}

/// The manual's table of consumers (docs/http-admission.md), as
/// [`CONSUMERS`] writes it.
fn consumers_table() -> String {
    CONSUMERS
        .iter()
        .map(|c| {
            let reads: Vec<String> = c.reads.iter().map(|h| format!("`{h}`")).collect();
            format!("| {} | {} | {} |\n", c.name, c.component, reads.join(", "))
        })
        .collect()
}

#[test]
fn the_manual_lists_the_consumers_of_the_table() {
    let readme = include_str!("../../../../../docs/http-admission.md");
    let header = "| consumer | component | reads |\n|---|---|---|\n";
    let start = readme.find(header).expect("docs/http-admission.md's table of forwarding headers' consumers")
        + header.len();
    let rows: String =
        readme[start..].lines().take_while(|l| l.starts_with('|')).map(|l| format!("{l}\n")).collect();
    assert_eq!(
        rows,
        consumers_table(),
        "docs/http-admission.md's table differs from CONSUMERS; it should read:\n{}",
        consumers_table()
    );
}
