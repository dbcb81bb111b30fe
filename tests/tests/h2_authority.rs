//! HTTP/2 requests name their host in `:authority` (RFC 9113 §8.3.1):
//! the upstream gets it as `Host` (it once got its own address for every
//! HTTP/2 request, so virtual hosts broke and redirects leaked it), and
//! what the RFC refuses is refused, before admission. Raw frames, since
//! client libraries refuse to send most of these.

use std::time::Duration;

use limiter_tests::{
    h2raw::{self, DATA, END_HEADERS, END_STREAM, HEADERS},
    in_process::InProcess,
    upstream::Upstream,
};

/// A header block of literals (no Huffman, nothing indexed): `:method`,
/// `:scheme http`, then `pseudo` and `headers` as given.
fn block(method: &str, pseudo: &[(&str, &str)], headers: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut literal = |name: &str, value: &str| {
        assert!(name.len() < 127 && value.len() < 127);
        out.push(0x00);
        out.push(name.len() as u8);
        out.extend(name.as_bytes());
        out.push(value.len() as u8);
        out.extend(value.as_bytes());
    };
    literal(":method", method);
    literal(":scheme", "http");
    for (n, v) in pseudo.iter().chain(headers) {
        literal(n, v);
    }
    out
}

/// Sends one request on a new h2c connection: the response's `:status`
/// (from the static table's indexed entries hyper writes) and its body.
fn request(d: &InProcess, header_block: &[u8]) -> (u16, String) {
    let mut s = h2raw::connect(d.proxy, &[]);
    let headers = h2raw::frame(HEADERS, END_STREAM | END_HEADERS, 1, header_block);
    std::io::Write::write_all(&mut s, &headers).unwrap();
    let mut status = None;
    let mut body = Vec::new();
    loop {
        let frame = h2raw::read_frame(&mut s, Duration::from_secs(10)).unwrap().expect("an answer");
        if frame.stream != 1 {
            continue;
        }
        if frame.kind == HEADERS && status.is_none() {
            status = Some(match frame.payload.first() {
                Some(0x88) => 200,
                Some(0x8c) => 400,
                Some(0x8d) => 404,
                Some(0x8e) => 500,
                other => panic!("a :status not in the static table: {other:?} {:?}", frame.payload),
            });
        } else if frame.kind == DATA {
            body.extend(&frame.payload);
        }
        if frame.flags & END_STREAM != 0 {
            break;
        }
    }
    (status.expect("a :status"), String::from_utf8_lossy(&body).into_owned())
}

fn h2c() -> (Upstream, InProcess) {
    let up = Upstream::start();
    let d = InProcess::start(up.addr, "http.h2c = true\n");
    (up, d)
}

#[test]
fn the_upstream_gets_the_authority_as_host() {
    let (up, d) = h2c();
    let (status, seen) =
        request(&d, &block("GET", &[(":authority", "app.example:8443"), (":path", "/headers")], &[]));
    assert_eq!(status, 200, "{seen}");
    let lines: Vec<&str> = seen.lines().collect();
    assert!(lines.contains(&"host: app.example:8443"), "{seen}");
    assert!(lines.contains(&"x-forwarded-host: app.example:8443"), "{seen}");
    assert!(!seen.contains(&up.addr.to_string()), "the upstream's own address leaked: {seen}");
    // A `host` that agrees (in any case) is fine; sent once.
    let (status, seen) = request(
        &d,
        &block("GET", &[(":authority", "app.example"), (":path", "/headers")], &[("host", "APP.example")]),
    );
    assert_eq!(status, 200, "{seen}");
    assert_eq!(seen.lines().filter(|l| l.starts_with("host:")).count(), 1, "{seen}");
    // Without `:authority`, `host` names it.
    let (status, seen) = request(&d, &block("GET", &[(":path", "/headers")], &[("host", "other.example")]));
    assert_eq!(status, 200, "{seen}");
    assert!(seen.lines().any(|l| l == "host: other.example"), "{seen}");
}

#[test]
fn what_rfc_9113_refuses_is_refused_before_admission() {
    let (up, d) = h2c();
    let before = up.hits();
    for (what, header_block) in [
        (
            ":authority and host differ",
            block(
                "GET",
                &[(":authority", "app.example"), (":path", "/headers")],
                &[("host", "evil.example")],
            ),
        ),
        ("userinfo in :authority", block("GET", &[(":authority", "user@app.example"), (":path", "/")], &[])),
        ("`*` on a GET", block("GET", &[(":authority", "app.example"), (":path", "*")], &[])),
        ("no authority at all", block("GET", &[(":path", "/")], &[])),
    ] {
        let (status, body) = request(&d, &header_block);
        assert_eq!(status, 400, "{what}: {body}");
    }
    assert_eq!(up.hits(), before, "none reached the upstream");
    assert_eq!(d.metric("limiter_http_bad_requests_total{kind=\"host\"}"), 3.0);
    assert_eq!(d.metric("limiter_http_bad_requests_total{kind=\"target\"}"), 1.0);
    assert_eq!(d.metric("limiter_http_admitted_total{pool=\"normal\"}"), 0.0, "no permit taken");
}

/// An upstream that takes one connection, keeps every byte it is sent
/// until the request (trailers included) has ended or 3 s pass, and
/// answers 200.
fn capturing_upstream() -> (std::net::SocketAddr, std::thread::JoinHandle<Vec<u8>>) {
    use std::io::{Read as _, Write as _};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        let ended = |b: &[u8]| {
            let text = String::from_utf8_lossy(b);
            let Some((head, body)) = text.split_once("\r\n\r\n") else { return false };
            let length = head.lines().find_map(|l| {
                l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_owned())
            });
            match length.and_then(|v| v.parse::<usize>().ok()) {
                Some(n) => body.len() >= n,
                None => body.ends_with("\r\n\r\n") && body.contains("0\r\n"),
            }
        };
        while !ended(&got) {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend(&buf[..n]),
            }
        }
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
        got
    });
    (addr, t)
}

/// RFC 9113 §8.1: pseudo-header fields must not appear in trailers. One
/// that tries to name another path there (`:path: /admin`, after a body)
/// reaches the upstream as nothing: h2 keeps a trailer section's regular
/// fields only, and what the upstream is sent is the request the head
/// named.
#[test]
fn a_path_in_trailers_reaches_the_upstream_as_nothing() {
    let (addr, upstream) = capturing_upstream();
    let d = InProcess::start(addr, "http.h2c = true\n");
    let mut s = h2raw::connect(d.proxy, &[]);
    let head =
        block("POST", &[(":authority", "app.example"), (":path", "/upload")], &[("content-length", "5")]);
    let trailers = {
        let mut out = Vec::new();
        for (name, value) in [(":path", "/admin"), ("x-trailer", "t")] {
            out.push(0x00);
            out.push(name.len() as u8);
            out.extend(name.as_bytes());
            out.push(value.len() as u8);
            out.extend(value.as_bytes());
        }
        out
    };
    let frames = [
        h2raw::frame(HEADERS, END_HEADERS, 1, &head),
        h2raw::frame(DATA, 0, 1, b"hello"),
        h2raw::frame(HEADERS, END_HEADERS | END_STREAM, 1, &trailers),
    ]
    .concat();
    std::io::Write::write_all(&mut s, &frames).unwrap();
    // Whatever the client is answered, read until its stream ends.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        match h2raw::read_frame(&mut s, Duration::from_secs(5)) {
            Ok(Some(f)) if f.stream == 1 && (f.flags & END_STREAM != 0 || f.kind == h2raw::RST_STREAM) => {
                break;
            }
            Ok(Some(_)) => {}
            _ => break,
        }
    }
    let seen = String::from_utf8_lossy(&upstream.join().unwrap()).into_owned();
    assert!(seen.starts_with("POST /upload HTTP/1.1\r\n"), "{seen}");
    assert!(
        !seen.contains("/admin") && !seen.contains(":path"),
        "the trailer's path reached the upstream: {seen}"
    );
}
