//! limiter's HTTP/1.x engine against an oracle, the parts shared by the
//! differential test (`tests/tests/h1_differential.rs`, where the rules
//! are written down) and the soak's stream scenario: hyper's HTTP/1
//! server (a test dependency only) reads a client's bytes in memory, while
//! limiter forwards the same bytes to a strict capture upstream; [`check`]
//! compares the two, and [`gen_case`] generates pipelined streams.

use std::{
    io::{ErrorKind, Read as _, Write as _},
    net::{Shutdown, SocketAddr, TcpStream},
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::BodyExt as _;
use proptest::prelude::*;

use crate::wire::{self, Capture, Message};

/// A request as a reader (hyper, or the capture) saw it, normalised.
#[derive(Clone, PartialEq, Eq)]
pub struct Seen {
    method: String,
    target: String,
    fields: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
}

impl std::fmt::Debug for Seen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.method, self.target)?;
        for (n, v) in &self.fields {
            write!(f, " | {n}: {}", String::from_utf8_lossy(v))?;
        }
        write!(f, " | body {:?}", String::from_utf8_lossy(&self.body))
    }
}

/// Fields a proxy writes itself or drops: hop-by-hop, framing, `Expect`,
/// `Host`, forwarding.
fn kept(name: &str, connection_named: &[String]) -> bool {
    // The forwarding headers are limiter's list (which ones it replaces is
    // not what this test judges); the rest, RFC 9110's hop-by-hop fields and
    // the framing.
    const PROXYS: &[&str] = &[
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "proxy-authorization",
        "content-length",
        "expect",
        "host",
    ];
    let forwarding = limiter::proxy::request::headers::forwarding_index(name.as_bytes()).is_some();
    // A name with `_` never passes (`http.underscoresInHeaders = off`).
    !forwarding
        && !name.contains('_')
        && !PROXYS.contains(&name)
        && !connection_named.iter().any(|n| n == name)
}

fn normalise(method: &str, target: &str, fields: Vec<(String, Vec<u8>)>, body: Vec<u8>) -> Seen {
    let named: Vec<String> = fields
        .iter()
        .filter(|(n, _)| n == "connection")
        .flat_map(|(_, v)| {
            String::from_utf8_lossy(v).split(',').map(|t| t.trim().to_ascii_lowercase()).collect::<Vec<_>>()
        })
        .collect();
    // Fields of one name keep their order (RFC 9110 §5.3); those of
    // different names are compared grouped by name, as hyper's map holds
    // them (their relative order is not significant).
    let mut fields: Vec<(String, Vec<u8>)> = fields.into_iter().filter(|(n, _)| kept(n, &named)).collect();
    fields.sort_by(|a, b| a.0.cmp(&b.0));
    // An absolute target goes upstream in origin form.
    let target = match target.find("://") {
        Some(i) => {
            let rest = &target[i + 3..];
            let path = &rest[rest.find(['/', '?']).unwrap_or(rest.len())..];
            if path.starts_with('/') { path.to_owned() } else { format!("/{path}") }
        }
        None => target.to_owned(),
    };
    Seen { method: method.to_owned(), target, fields, body }
}

/// What hyper's HTTP/1 server reads of `bytes` (the client half-closes
/// after them), with `half_close` so that it serves every pipelined
/// request before the end; and whether the stream ended cleanly between
/// requests.
pub fn oracle(bytes: &[u8]) -> (Vec<Seen>, bool) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let recorded = seen.clone();
        let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
            let recorded = recorded.clone();
            async move {
                let (parts, body) = req.into_parts();
                let body = body.collect().await?.to_bytes();
                let fields = parts
                    .headers
                    .iter()
                    .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
                    .collect();
                recorded.lock().unwrap().push(normalise(
                    parts.method.as_str(),
                    &parts.uri.to_string(),
                    fields,
                    body.to_vec(),
                ));
                Ok::<_, hyper::Error>(hyper::Response::new(http_body_util::Full::new(Bytes::from_static(
                    b"ok",
                ))))
            }
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .half_close(true)
            .serve_connection(hyper_util::rt::TokioIo::new(server), service);
        let feed = async {
            use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
            let _ = client.write_all(bytes).await;
            let _ = client.shutdown().await;
            let mut sink = Vec::new();
            let _ = client.read_to_end(&mut sink).await;
        };
        let ended = tokio::time::timeout(Duration::from_secs(10), async { tokio::join!(conn, feed) }).await;
        // The stream ended cleanly, between requests.
        let whole = matches!(ended, Ok((Ok(()), ())));
        (seen.lock().unwrap().clone(), whole)
    })
}

/// What limiter forwarded since the last take, read from the capture's
/// bytes.
pub fn forwarded(capture: &Capture) -> Result<Vec<Seen>, String> {
    let mut out = Vec::new();
    for new in capture.take() {
        let new = &new[..];
        if new.is_empty() {
            continue;
        }
        let (strict, lenient) = (wire::strict(new), wire::lenient(new));
        if strict.messages != lenient.messages {
            return Err(format!(
                "the strict and the lenient reader disagree on {:?}",
                String::from_utf8_lossy(new)
            ));
        }
        if let Some(why) = strict.stopped {
            return Err(format!(
                "the strict reader refused what limiter sent ({why}): {:?}",
                String::from_utf8_lossy(new)
            ));
        }
        for m in strict.messages {
            let Message { method, target, headers, body, canonical } = m;
            if !canonical {
                return Err(format!("{method} {target}: framed otherwise than limiter frames"));
            }
            out.push(normalise(&method, &target, headers, body));
        }
    }
    Ok(out)
}

/// How a case's bytes are written.
#[derive(Clone, Debug)]
pub struct Case {
    pub name: String,
    pub bytes: Vec<u8>,
    /// Where the bytes are cut into writes.
    pub cuts: Vec<usize>,
    /// Half-close after the last write.
    pub half_close: bool,
}

pub fn case(name: &str, bytes: impl AsRef<[u8]>) -> Case {
    Case { name: name.into(), bytes: bytes.as_ref().to_vec(), cuts: Vec::new(), half_close: false }
}

/// Statuses the client got, and whether the connection hung.
pub fn play(proxy: SocketAddr, c: &Case) -> (Vec<u16>, bool) {
    let mut s = TcpStream::connect(proxy).unwrap();
    s.set_nodelay(true).unwrap();
    let mut at = 0;
    for &cut in c.cuts.iter().chain(std::iter::once(&c.bytes.len())) {
        if cut > at {
            if s.write_all(&c.bytes[at..cut]).is_err() {
                break;
            }
            at = cut;
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    if c.half_close {
        let _ = s.shutdown(Shutdown::Write);
    }
    s.set_read_timeout(Some(Duration::from_millis(1500))).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 65536];
    let hung = loop {
        match s.read(&mut buf) {
            Ok(0) => break false,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => break true,
            Err(_) => break false,
        }
    };
    let statuses = got
        .windows(9)
        .enumerate()
        .filter(|(i, w)| *w == b"HTTP/1.1 " && (*i == 0 || got[i - 1] == b'\n'))
        .filter_map(|(i, _)| std::str::from_utf8(&got[i + 9..i + 12]).ok()?.parse().ok())
        .collect();
    (statuses, hung)
}

/// Checks one case; `Err` says what differs.
pub fn check(proxy: SocketAddr, capture: &Capture, c: &Case) -> Result<(), String> {
    let (expected, whole) = oracle(&c.bytes);
    // What earlier cases left (nothing, when they passed) is not this one's.
    capture.take();
    let (statuses, hung) = play(proxy, c);
    // Whatever limiter forwarded has been answered by now (its answers
    // came back through it), or was never sent.
    let got = forwarded(capture)?;
    let show = || {
        format!(
            "case {:?} {:?} cut at {:?}\nhyper read: {expected:?}\nlimiter forwarded: {got:?}\nclient got {statuses:?}",
            c.name,
            String::from_utf8_lossy(&c.bytes),
            c.cuts
        )
    };
    if got.len() > expected.len() || got[..] != expected[..got.len()] {
        return Err(format!("limiter forwarded what hyper did not read\n{}", show()));
    }
    let own = statuses.iter().filter(|&&s| (400..500).contains(&s) || s == 501 || s == 505).count();
    if got.len() < expected.len() && own == 0 {
        return Err(format!(
            "limiter dropped a request hyper read, and answered none of its own\n{}",
            show()
        ));
    }
    if hung && whole && !c.half_close {
        // Every case ends with a request that closes, or with bytes limiter
        // refuses: a connection left open after a stream hyper read to its
        // end is a request left hanging. (One that ends inside a body
        // leaves limiter waiting for the rest, as it should.)
        return Err(format!("the connection was left open\n{}", show()));
    }
    if statuses.len() < got.len() {
        return Err(format!("fewer responses than requests forwarded\n{}", show()));
    }
    Ok(())
}

#[derive(Clone, Debug)]
enum GenBody {
    None,
    Length(Vec<u8>),
    /// Chunks, an extension on each size line or not, trailer lines.
    Chunked(Vec<Vec<u8>>, bool, Vec<&'static str>),
}

#[derive(Clone, Debug)]
struct GenRequest {
    method: &'static str,
    path: String,
    http10: bool,
    headers: Vec<&'static str>,
    body: GenBody,
    /// A flaw written into its framing, if any.
    flaw: Option<&'static str>,
}

fn render(r: &GenRequest, last: bool) -> Vec<u8> {
    let version = if r.http10 { "HTTP/1.0" } else { "HTTP/1.1" };
    let mut out = format!("{} {} {version}\r\n", r.method, r.path).into_bytes();
    for h in &r.headers {
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if last {
        out.extend_from_slice(b"Connection: close\r\n");
    } else if r.http10 {
        out.extend_from_slice(b"Connection: keep-alive\r\n");
    }
    match &r.body {
        GenBody::None => out.extend_from_slice(b"\r\n"),
        GenBody::Length(body) => {
            out.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
            out.extend_from_slice(body);
        }
        GenBody::Chunked(chunks, ext, trailers) => {
            out.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
            let ext = if *ext { ";ext=\"1\"" } else { "" };
            for c in chunks.iter().filter(|c| !c.is_empty()) {
                out.extend_from_slice(format!("{:x}{ext}\r\n", c.len()).as_bytes());
                out.extend_from_slice(c);
                out.extend_from_slice(b"\r\n");
            }
            out.extend_from_slice(format!("0{ext}\r\n").as_bytes());
            for t in trailers {
                out.extend_from_slice(t.as_bytes());
                out.extend_from_slice(b"\r\n");
            }
            out.extend_from_slice(b"\r\n");
        }
    }
    if let Some(flaw) = r.flaw {
        // The flaw replaces the first CRLF after the head's end with itself.
        let head_end = out.windows(4).position(|w| w == b"\r\n\r\n").map_or(0, |i| i + 4);
        if let Some(i) = out[head_end..].windows(2).position(|w| w == b"\r\n") {
            let i = head_end + i;
            out.splice(i..i + 2, flaw.bytes());
        }
    }
    out
}

fn gen_request() -> impl Strategy<Value = GenRequest> {
    let method = prop::sample::select(
        &["GET", "GET", "HEAD", "POST", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"][..],
    );
    let path = prop::sample::select(
        &["/", "/a/b", "/debug/x", "/t/%41%20b", "/t/a;b=c", "/q?x=1&y=2", "http://app.example/abs"][..],
    )
    .prop_map(str::to_owned);
    let header = prop::sample::select(
        &[
            "Accept: */*",
            "User-Agent: gen/1.0",
            "X-A: b",
            "Authorization: Bearer T",
            "X-Client-Id: c1",
            "Cookie: k=v; k2=v2",
            "X-Forwarded-For: 10.0.0.1",
            "accept-encoding: gzip",
            "X-MiXeD-CaSe: v",
            "X-Dup: 1",
            "X-Dup: 2",
            "Connection: keep-alive",
            "Keep-Alive: timeout=5",
            "TE: trailers",
            "X-Empty:",
            "Expect: 100-continue",
            "Connection: x-drop",
            "X-Drop: gone",
        ][..],
    );
    let host = prop::sample::select(&["Host: t", "Host: app.example:8080", "host: T"][..]);
    let headers = (host, prop::collection::vec(header, 0..6), any::<prop::sample::Index>()).prop_map(
        |(host, mut h, at)| {
            h.insert(at.index(h.len() + 1), host);
            h
        },
    );
    let bytes = |max: usize| prop::collection::vec(any::<u8>(), 0..max);
    let trailer = prop::sample::select(&["X-T: 1", "X-Checksum: abc", "x-other: two words"][..]);
    let body = prop_oneof![
        4 => Just(GenBody::None),
        3 => bytes(2000).prop_map(GenBody::Length),
        1 => (70_000usize..90_000).prop_map(|n| GenBody::Length(vec![b'L'; n])),
        3 => (prop::collection::vec(bytes(600), 0..5), any::<bool>(), prop::collection::vec(trailer, 0..3))
            .prop_map(|(c, e, t)| GenBody::Chunked(c, e, t)),
    ];
    let flaw = prop::option::weighted(
        0.15,
        prop::sample::select(&["\n", "\r", " \r\n", "\r\n\r\n", "\r\n \r\n", "\0\r\n"][..]),
    );
    (method, path, prop::bool::weighted(0.1), headers, body, flaw).prop_map(
        |(method, path, http10, headers, body, flaw)| {
            let body = match body {
                GenBody::Chunked(chunks, ..) if http10 => GenBody::Length(chunks.concat()),
                b => b,
            };
            GenRequest { method, path, http10, headers, body, flaw }
        },
    )
}

pub fn gen_case() -> impl Strategy<Value = Case> {
    (prop::collection::vec(gen_request(), 1..=4), prop::collection::vec(any::<prop::sample::Index>(), 0..4))
        .prop_map(|(requests, cuts)| {
            let n = requests.len();
            let bytes: Vec<u8> =
                requests.iter().enumerate().flat_map(|(k, r)| render(r, k + 1 == n)).collect();
            let mut cuts: Vec<usize> = cuts.iter().map(|c| c.index(bytes.len() + 1)).collect();
            cuts.sort_unstable();
            Case { name: "generated".into(), bytes, cuts, half_close: false }
        })
}
