//! limiter's HTTP/1.x engine against an oracle: hyper's HTTP/1 server
//! (a test dependency only; limiter has no hyper HTTP/1 of its own), fed
//! the same client bytes in memory. Every case's bytes go to limiter (in
//! this process, [`InProcess`]) in front of a *strict* capture upstream
//! ([`Capture::reading`] with the strict reader: it refuses, and so shows,
//! any byte limiter forwards that a strict server would not read), and to
//! hyper. Then:
//!
//! - what limiter forwarded, read from the capture's bytes, must be the
//!   requests hyper read, in order, the same method, target, fields and
//!   body, after the normalisations a proxy makes (hop-by-hop and framing
//!   fields, `Expect`, `Host` and the forwarding headers are limiter's;
//!   an absolute target goes in origin form) — or a prefix of them, when
//!   limiter refused a request hyper read (limiter is stricter: a bare LF
//!   or a control byte in the chunked framing, spaces after a chunk size
//!   without an extension), and then limiter answered it 4xx and closed;
//!   never a request hyper did not read;
//! - every byte limiter forwarded reads the same under the strict and the
//!   lenient reader ([`wire`]), the strict capture refused nothing, and
//!   every forwarded message is framed as limiter frames (one decimal
//!   length, or chunks in plain hex without extensions or trailers);
//! - the client got one response per request limiter served, plus its own
//!   answer to the one it refused, and the connection did not hang.
//!
//! Cases: a fixed table (the smuggling bytes of issue 33, the classic
//! ambiguities, HTTP/1.0, absolute targets, `Expect`, half-closed
//! connections, every stream the generator or the fuzzer ever found), and
//! generated pipelined streams ([`generated_streams_agree`], 1,000 a run
//! unless `PROPTEST_CASES` raises it), each cut into pieces at random.

use std::{
    io::{ErrorKind, Read as _, Write as _},
    net::{Shutdown, SocketAddr, TcpStream},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use bytes::Bytes;
use http_body_util::BodyExt as _;
use limiter_tests::{
    in_process::InProcess,
    wire::{self, Capture, Message},
};
use proptest::{
    prelude::*,
    test_runner::{Config, TestCaseError, TestRunner},
};

/// A request as a reader (hyper, or the capture) saw it, normalised.
#[derive(Clone, PartialEq, Eq)]
struct Seen {
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
    !PROXYS.contains(&name) && !connection_named.iter().any(|n| n == name)
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
/// request before the end.
fn oracle(bytes: &[u8]) -> Vec<Seen> {
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
        let _ = tokio::time::timeout(Duration::from_secs(10), async { tokio::join!(conn, feed) }).await;
        seen.lock().unwrap().clone()
    })
}

/// What limiter forwarded, read from the capture's bytes since `from`
/// (each connection's length before the case).
fn forwarded(capture: &Capture, from: &[usize]) -> Result<Vec<Seen>, String> {
    let mut out = Vec::new();
    for (i, stream) in capture.streams().iter().enumerate() {
        let new = &stream[from.get(i).copied().unwrap_or(0)..];
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
struct Case {
    name: String,
    bytes: Vec<u8>,
    /// Where the bytes are cut into writes.
    cuts: Vec<usize>,
    /// Half-close after the last write.
    half_close: bool,
}

fn case(name: &str, bytes: impl AsRef<[u8]>) -> Case {
    Case { name: name.into(), bytes: bytes.as_ref().to_vec(), cuts: Vec::new(), half_close: false }
}

/// Statuses the client got, and whether the connection hung.
fn play(proxy: SocketAddr, c: &Case) -> (Vec<u16>, bool) {
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
fn check(proxy: SocketAddr, capture: &Capture, c: &Case) -> Result<(), String> {
    let expected = oracle(&c.bytes);
    let from: Vec<usize> = capture.streams().iter().map(Vec::len).collect();
    let (statuses, hung) = play(proxy, c);
    // Whatever limiter forwarded has been answered by now (its answers
    // came back through it), or was never sent.
    let got = forwarded(capture, &from)?;
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
    if hung && !c.half_close {
        // Every case ends with a request that closes, or with bytes limiter
        // refuses: a connection left open is a request left hanging.
        return Err(format!("the connection was left open\n{}", show()));
    }
    if statuses.len() < got.len() {
        return Err(format!("fewer responses than requests forwarded\n{}", show()));
    }
    Ok(())
}

struct Target {
    capture: Capture,
    proxy: InProcess,
}

fn target() -> Target {
    let capture = Capture::reading(wire::strict);
    // A breaker that never opens (cases answer 400s from the capture on
    // purpose), no access log.
    let proxy = InProcess::start(capture.addr, "breaker.minRequests = 1000000000\nhttp.maxThreads = 64\n");
    Target { capture, proxy }
}

fn run(cases: &[Case]) {
    let t = target();
    let failures: Vec<String> =
        cases.iter().filter_map(|c| check(t.proxy.proxy, &t.capture, c).err()).collect();
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n\n")
    );
}

fn chunked(chunks: &[&str], ext: &str, trailers: &str) -> String {
    let mut out = String::new();
    for c in chunks {
        out.push_str(&format!("{:x}{ext}\r\n{c}\r\n", c.len()));
    }
    out.push_str(&format!("0{ext}\r\n{trailers}\r\n"));
    out
}

const LAST: &str = "GET /last HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";

fn fixed() -> Vec<Case> {
    let post = |extra: &str, body: &str| format!("POST /p HTTP/1.1\r\nHost: t\r\n{extra}\r\n{body}{LAST}");
    let te = "Transfer-Encoding: chunked\r\n";
    let hidden = "GET /smuggled HTTP/1.1\r\nHost: t\r\n\r\n";
    let mut cases = vec![
        case(
            "plain GET",
            format!(
                "GET /a?b=c HTTP/1.1\r\nHost: t\r\nAccept: */*\r\nX-Dup: 1\r\nAccept: x\r\nX-Dup: 2\r\n\r\n{LAST}"
            ),
        ),
        case("a length", post("Content-Length: 5\r\n", "hello")),
        case(
            "chunks with extensions and trailers",
            post(te, &chunked(&["hello", " world"], ";a=\"b c\"", "X-T: 1\r\n")),
        ),
        case("HTTP/1.0, keep-alive", format!("GET /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\n{LAST}")),
        case("HTTP/1.0 closes", "POST /a HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc"),
        case(
            "an absolute target",
            format!("GET http://app.example/abs?q=1 HTTP/1.1\r\nHost: other\r\n\r\n{LAST}"),
        ),
        case(
            "an absolute target without a path",
            format!("GET http://app.example HTTP/1.1\r\nHost: app.example\r\n\r\n{LAST}"),
        ),
        case("OPTIONS *", format!("OPTIONS * HTTP/1.1\r\nHost: t\r\n\r\n{LAST}")),
        case("Expect: 100-continue", post("Expect: 100-continue\r\nContent-Length: 5\r\n", "hello")),
        case("bare LF line ends in a head", format!("GET /a HTTP/1.1\nHost: t\nX-A: b\n\n{LAST}")),
        case("empty lines before a request", format!("\r\n\r\nGET /a HTTP/1.1\r\nHost: t\r\n\r\n{LAST}")),
        case(
            "a Connection-named field",
            format!("GET /a HTTP/1.1\r\nHost: t\r\nConnection: x-secret\r\nX-Secret: 1\r\n\r\n{LAST}"),
        ),
        case(
            "forwarding fields from a client",
            format!(
                "GET /a HTTP/1.1\r\nHost: t\r\nX-Forwarded-For: 6.6.6.6\r\nX-Real-IP: 6.6.6.6\r\n\r\n{LAST}"
            ),
        ),
        // Issue 33's bytes.
        case(
            "connection content-length",
            post(&format!("Content-Length: {}\r\nConnection: Content-Length\r\n", hidden.len()), hidden),
        ),
        case("connection host", post("Content-Length: 0\r\nConnection: Host\r\n", "")),
        case("a bare LF after the last chunk", post(te, &format!("0\r\n\n{hidden}\r\n"))),
        case("a bare LF in the trailers", post(te, &format!("0\r\nX-T: 1\n{hidden}\r\n\r\n"))),
        case("trailers split", post(te, "5\r\nhello\r\n0\r\nX-T: 1\r\nX-Checksum: abc\r\n\r\n")),
        case("spaces after a chunk size", post(te, "3 \r\nabc\r\n0\r\n\r\n")),
        case("a tab after a chunk size", post(te, "3\t\r\nabc\r\n0\r\n\r\n")),
        case("a NUL extension", post(te, "3;\0\r\nabc\r\n0\r\n\r\n")),
        case("CL.TE", post(&format!("Content-Length: 4\r\n{te}"), "0\r\n\r\n")),
        case("TE.CL", post(&format!("{te}Content-Length: 4\r\n"), "0\r\n\r\n")),
        case("two lengths", post("Content-Length: 3\r\nContent-Length: 4\r\n", "abcd")),
        case("obs-fold", post("X-A: 1\r\n 2\r\nContent-Length: 0\r\n", "")),
        case("a bare CR", post("X-A: 1\rX: 2\r\nContent-Length: 0\r\n", "")),
        case("gzip, chunked", post("Transfer-Encoding: gzip, chunked\r\n", "0\r\n\r\n")),
        case("chunk data too long", post(te, "3\r\nabcdef\r\n0\r\n\r\n")),
        // Found by the generator (a mutant that read a bare LF as a chunk
        // size's line end).
        case(
            "a bare LF ending the last chunk's size",
            "GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n0\n\r\n",
        ),
        case(
            "a GET with a body",
            format!("GET /g HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n{hidden}{LAST}", hidden.len()),
        ),
        case("a HEAD", format!("HEAD /h HTTP/1.1\r\nHost: t\r\n\r\n{LAST}")),
    ];
    // Half-closed after whole requests: every one is answered.
    let mut half =
        case("half-closed after two", "GET /a HTTP/1.1\r\nHost: t\r\n\r\nGET /b HTTP/1.1\r\nHost: t\r\n\r\n");
    half.half_close = true;
    cases.push(half);
    let mut half =
        case("half-closed mid-body", "POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nabc");
    half.half_close = true;
    cases.push(half);
    // Each fixed case also written a byte at a time.
    let bytewise: Vec<Case> = cases
        .iter()
        .filter(|c| !c.half_close && c.bytes.len() < 400)
        .map(|c| Case {
            name: format!("{}, a byte a time", c.name),
            cuts: (1..c.bytes.len()).collect(),
            ..c.clone()
        })
        .collect();
    cases.extend(bytewise);
    cases
}

#[test]
fn the_fixed_cases_agree() {
    run(&fixed());
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

fn gen_case() -> impl Strategy<Value = Case> {
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

/// Generated streams per run unless `PROPTEST_CASES` raises it (it never
/// lowers it).
const GENERATED: u32 = 1000;

#[test]
fn generated_streams_agree() {
    let started = Instant::now();
    let t = target();
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(0).max(GENERATED);
    let config = Config { cases, failure_persistence: None, max_shrink_time: 60_000, ..Config::default() };
    let mut runner = TestRunner::new(config);
    let outcome =
        runner.run(&gen_case(), |c| check(t.proxy.proxy, &t.capture, &c).map_err(TestCaseError::fail));
    eprintln!("generated: {cases} streams in {:.1} s", started.elapsed().as_secs_f64());
    if let Err(e) = outcome {
        panic!("a generated stream differs (shrunk; add it to `fixed`):\n{e}");
    }
}
