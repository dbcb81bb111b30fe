//! The two HTTP/1.1 engines side by side (`http.h1Engine = native` and
//! `= hyper`): two daemons run in this process ([`InProcess`]: the proxy
//! alone, no privileges) in front of one recording upstream
//! ([`Recorder`]), and every case's bytes go, on a fresh connection each,
//! to both. The native engine must behave as hyper does: what the client
//! receives and what the upstream receives must be the same.
//!
//! For each case, and each daemon, the test compares:
//! - **the client's side**: the bytes it received, parsed into a sequence
//!   of responses (status line, header fields in order, body decoded,
//!   trailers), whatever could not be parsed as a response (raw), and how
//!   the connection ended: closed by the proxy (FIN), reset, or still open
//!   after [`QUIET`] without a byte;
//! - **the upstream's side**: the requests the recorder received for that
//!   case from that daemon, in order (method, target, version, header
//!   fields in order, body decoded, trailers, whether the body arrived
//!   whole, and the head's raw bytes when httparse refused it).
//!
//! Each case is sent from a loopback address of its own (`127.x.y.z`), so
//! the upstream's requests are told apart by case through the proxy's
//! `X-Forwarded-For`, and by daemon through its `X-Forwarded-Port` (each
//! daemon's listener port): cases run in parallel. A request the recorder
//! cannot attribute (no such address and port, or arriving after its case
//! was over) fails the test, shown. The two daemons' upstream connections
//! are pooled across cases, so an engine that leaves one mid-request (a
//! body left unfinished, bytes relayed past a request's end) shows as the
//! wrong answer in a later case and as requests no case accounts for.
//!
//! **Normalisations**, the only ones: what HTTP lets an intermediary
//! change, and what legitimately differs between the two daemons.
//! - Header names are compared lowercased, on both sides (RFC 9110 §5.1:
//!   field names are case-insensitive; hyper writes them lowercase).
//! - Chunk boundaries and chunk extensions are not compared: bodies are
//!   compared decoded (RFC 9112 §7.1: an intermediary may re-chunk; hyper
//!   does). Trailers are compared (name lowercased, value), and whether
//!   there were any: a chunked body without trailer fields shows as an
//!   empty trailer list, a body of any other framing as none.
//! - How a **request body is framed** towards the upstream is not
//!   compared: its `content-length` and `transfer-encoding` fields are
//!   dropped, and a chunked body without trailer fields counts as having
//!   none. The native engine forwards a chunked body with the client's own
//!   chunks (as bytes, never re-serialised), where hyper sends one it read
//!   whole with a `content-length` (RFC 9112 §7.1.3 lets a recipient
//!   re-frame). The body's decoded bytes, its trailers and whether it
//!   arrived whole are still compared, so a body framed wrong shows.
//! - The `date` response header is dropped (the clock).
//! - In the upstream's `x-forwarded-port` and `forwarded` values, the
//!   daemon's own listener port is replaced by `<port>`: the two daemons
//!   listen on different ports, and say so.
//! - Requests sent whole, then a half-close (the cases marked
//!   [`Case::races`]): hyper takes the EOF for the client gone and drops
//!   the request in flight, unless its response was already written: so
//!   whether the client gets its responses, and whether the upstream got
//!   the requests, is a race inside hyper (both seen with hyper on both
//!   sides). There the connection must end the same way and one side's
//!   responses must be the first of the other's; the upstream's side is
//!   not compared.
//! - Header **order**: the fields of one name keep their order (RFC 9110
//!   §5.3: it is significant, `x-dup: 1` then `x-dup: 2` is not `2, 1`),
//!   but fields of different names are compared grouped by name (a
//!   stable sort by name), since their relative order is not significant
//!   (§5.3 again) and the engines do differ there: hyper's `HeaderMap`
//!   groups the lines of one name where the first was (the upstream gets
//!   `x-dup: 1, x-dup: 2, accept: a, accept: b` for a client's
//!   `X-Dup: 1, Accept: a, X-Dup: 2, Accept: b`) and writes
//!   `connection: close` before `content-length`, while an engine that
//!   rewrites heads in place keeps the wire order.
//!   `H1_ENGINES_STRICT_ORDER=1` compares the order as sent.
//!
//! Cases: [`FRAMING_CORPUS`] (the framing watch's corpus,
//! `limiter/src/proxy/framing/corpus.rs`, which its own differential test
//! reads too, as they are and with a
//! `Host` added to each HTTP/1.1 head so that they reach the upstream),
//! [`http_rs_cases`] (the raw requests of `tests/tests/http.rs`'s
//! refusal, smuggling, hop-by-hop and forwarding tests), [`crafted`] (a
//! table of methods, versions, framings, targets, headers and malformed
//! heads, with byte-by-byte and half-closed writes), and generated
//! pipelined streams ([`generated_streams_agree`], `PROPTEST_CASES`,
//! default [`GENERATED`]). A mismatch prints the case as a byte string
//! (paste it into [`crafted`]) and a line diff of the two sides.
//!
//! `H1_ENGINES_SELF_CHECK=1` runs hyper on both sides: the harness's own
//! determinism, with no native engine involved.
//!
//! `H1_ENGINES_TABLE=1` prints, for every case of the fixed groups, what
//! hyper answered (status lines, header names, how the connection ended);
//! `H1_ENGINES_SHOW=text` prints all of hyper's side (both sides, as
//! sent) for the cases whose name contains `text`.

use std::{
    fmt::Write as _,
    io::{ErrorKind, Read as _, Write as _},
    net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpStream},
    sync::{
        Mutex,
        atomic::{AtomicU32, AtomicUsize, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use limiter_tests::{
    in_process::InProcess,
    recorder::{BodyShown, Chunked, Escaped, Field, Recorded, Recorder, request_methods, trim},
};
use proptest::{
    prelude::*,
    test_runner::{Config, TestCaseError, TestRunner},
};

/// How long a connection must stay silent (after the last byte written
/// and the last byte received) to count as left open by the proxy.
const QUIET: Duration = Duration::from_millis(1000);

/// The longest a case may take on one connection.
const CASE_LIMIT: Duration = Duration::from_secs(30);

/// Cases in flight at once (each holds a connection to both daemons).
const PARALLEL: usize = 8;

/// Generated streams per run unless `PROPTEST_CASES` says otherwise.
const GENERATED: u32 = 1000;

/// Keys both daemons share beyond the engine: no access log, and a
/// breaker that never opens (the cases answer 500s and 503s on purpose,
/// and an open breaker would answer for the upstream, differently for
/// each daemon depending on timing).
const COMMON_KEYS: &str = "http.accessLog = off\nbreaker.minRequests = 1000000000\n";

// ---- The daemons ----

struct Pair {
    recorder: Recorder,
    native: InProcess,
    hyper: InProcess,
}

impl Pair {
    fn start() -> Self {
        // Keys the harness puts first in every file must not repeat the
        // ones set here (a key given twice is refused): this test chooses
        // each daemon's engine itself.
        let harness = std::env::var("LIMITER_TEST_KEYS").unwrap_or_default();
        for key in ["http.h1Engine", "http.accessLog", "breaker.minRequests"] {
            assert!(!harness.contains(key), "LIMITER_TEST_KEYS sets {key}, which this test sets itself");
        }
        let recorder = Recorder::start();
        // The harness checking itself: both sides hyper, so any difference
        // is the test's own noise.
        let first = if std::env::var_os("H1_ENGINES_SELF_CHECK").is_some() { "hyper" } else { "native" };
        let native = InProcess::start(recorder.addr, &format!("http.h1Engine = {first}\n{COMMON_KEYS}"));
        let hyper = InProcess::start(recorder.addr, &format!("http.h1Engine = hyper\n{COMMON_KEYS}"));
        assert_ne!(native.proxy.port(), hyper.proxy.port());
        Self { recorder, native, hyper }
    }

    fn target(&self) -> Target<'_> {
        Target { recorder: &self.recorder, native: self.native.proxy, hyper: self.hyper.proxy }
    }
}

/// What a case needs of a [`Pair`] (shared by the threads that run cases).
#[derive(Clone, Copy)]
struct Target<'a> {
    recorder: &'a Recorder,
    native: SocketAddr,
    hyper: SocketAddr,
}

// ---- Cases ----

/// How a case's bytes are written.
#[derive(Clone, Debug)]
enum Writes {
    /// One `write_all`.
    Whole,
    /// One write per byte (`TCP_NODELAY`).
    Bytewise,
    /// Cut at these sorted offsets.
    Pieces(Vec<usize>),
}

#[derive(Clone, Debug)]
struct Case {
    name: String,
    bytes: Vec<u8>,
    writes: Writes,
    /// Shut the write side down after the last byte.
    half_close: bool,
    /// Whole requests then a half-close, which hyper answers or drops by
    /// a race of its own: see the top of the file for what is compared.
    races: bool,
}

fn case(name: impl Into<String>, bytes: impl AsRef<[u8]>) -> Case {
    Case {
        name: name.into(),
        bytes: bytes.as_ref().to_vec(),
        writes: Writes::Whole,
        half_close: false,
        races: false,
    }
}

impl Case {
    fn half_close(mut self) -> Self {
        self.half_close = true;
        self
    }

    /// Half-closed after whole requests: see [`Case::races`].
    fn half_close_racy(mut self) -> Self {
        self.half_close = true;
        self.races = true;
        self
    }

    fn bytewise(mut self) -> Self {
        self.writes = Writes::Bytewise;
        self
    }

    fn pieces(mut self, cuts: &[usize]) -> Self {
        self.writes = Writes::Pieces(cuts.to_vec());
        self
    }

    /// The case for a failure message: its bytes as a byte string (the
    /// middle of one over 16 KiB elided, its length and name still say
    /// which it is).
    fn shown(&self) -> String {
        const SHOWN: usize = 16 * 1024;
        let bytes = if self.bytes.len() <= SHOWN {
            format!("b\"{}\"", Escaped(&self.bytes))
        } else {
            let (head, tail) = (&self.bytes[..SHOWN - 1024], &self.bytes[self.bytes.len() - 1024..]);
            let elided = self.bytes.len() - head.len() - tail.len();
            format!("b\"{}\" ({elided} bytes elided) b\"{}\"", Escaped(head), Escaped(tail))
        };
        let writes = match &self.writes {
            Writes::Pieces(cuts) => format!("cut at {cuts:?}"),
            w => format!("{w:?}"),
        };
        format!(
            "case `{}` ({} bytes, writes {writes}, half-close {}):\n{bytes}",
            self.name,
            self.bytes.len(),
            self.half_close,
        )
    }
}

/// The framing watch's corpus (`limiter/src/proxy/framing/corpus.rs`),
/// the one list both differential tests read.
mod framing_corpus {
    include!("../../limiter/src/proxy/framing/corpus.rs");
}
use framing_corpus::CORPUS as FRAMING_CORPUS;

/// `bytes` with `Host: t` after each HTTP/1.1 request line (ended by CRLF
/// or by a bare LF), so that the proxy forwards what it accepts.
fn with_host(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len() + 64);
    let mut at = 0;
    while at < bytes.len() {
        let rest = &bytes[at..];
        if let Some(eol) = [&b" HTTP/1.1\r\n"[..], b" HTTP/1.1\n"].into_iter().find(|p| rest.starts_with(p)) {
            out.extend_from_slice(eol);
            out.extend_from_slice(b"Host: t");
            out.extend_from_slice(&eol[9..]);
            at += eol.len();
        } else {
            out.push(bytes[at]);
            at += 1;
        }
    }
    out
}

fn framing_corpus() -> Vec<Case> {
    let mut cases = Vec::new();
    for (k, bytes) in FRAMING_CORPUS.iter().enumerate() {
        cases.push(case(format!("framing corpus {k}"), bytes));
        cases.push(case(format!("framing corpus {k}, with Host"), with_host(bytes)));
    }
    cases
}

/// Every forwarding header a client can send to pass as the proxy's word
/// (`tests/tests/http.rs`'s `SPOOFED`).
const SPOOFED: &[u8] = b"X-Forwarded-Proto: https\r\nForwarded: for=10.0.0.9;proto=https\r\n\
    Forwarded: for=10.0.0.8\r\nX-Forwarded-For: 10.0.0.9\r\nX-Forwarded-For: 10.0.0.8\r\n\
    X-Forwarded-Host: evil.example\r\nX-Forwarded-Port: 443\r\nX-Real-IP: 10.0.0.9\r\n\
    Client-IP: 10.0.0.9\r\nTrue-Client-IP: 10.0.0.9\r\nX-Original-URL: /admin\r\nX-Rewrite-URL: /admin\r\n";

/// The raw requests of `tests/tests/http.rs`'s refusal, smuggling,
/// hop-by-hop and forwarding tests.
fn http_rs_cases() -> Vec<Case> {
    let smuggled =
        "POST /smuggled HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n";
    let bare_lf = |trailers: &str| {
        format!(
            "POST /sink HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n{trailers}\
             GET / HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n{smuggled}0\r\n\r\n",
            smuggled.len()
        )
    };
    let mut cases = vec![
        case("bad header name", b"GET / HTTP/1.1\r\nHost: t\r\nBad Header Name: x\r\n\r\n"),
        case("TLS garbage", b"\x16\x03\x01 not http at all\r\n\r\n"),
        case("20 KB header", format!("GET / HTTP/1.1\r\nHost: t\r\nX-Big: {}\r\n\r\n", "b".repeat(20_000))),
        case(
            "CL then TE",
            b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        ),
        case(
            "TE then CL",
            b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
        ),
        case(
            "CL+TE behind an honest request",
            b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\n\r\nabcdPOST /b HTTP/1.1\r\nHost: t\r\n\
              Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        ),
        case(
            "CL+TE behind an Upgrade",
            b"GET /up HTTP/1.1\r\nHost: t\r\nUpgrade: x\r\n\r\nPOST /b HTTP/1.1\r\nHost: t\r\n\
              Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        ),
        case("bare LF after the last chunk", bare_lf("0\r\n\n")),
        case("bare LF ending a trailer", bare_lf("0\r\nX-T: 1\n\r\n")),
        case(
            "hop-by-hop request headers",
            b"GET /headers?q=1 HTTP/1.1\r\nHost: test\r\nConnection: keep-alive, X-Private\r\n\
              X-Private: secret\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\n\
              Proxy-Authorization: Basic abc\r\n\
              X-Forwarded-For: 10.1.2.3\r\nAuthorization: Bearer kept\r\n\r\n",
        ),
    ];
    let hosts: &[&[u8]] = &[
        b"GET /headers HTTP/1.1\r\nHost: app\",for=6.6.6.6;host=\"app\r\n\r\n",
        b"GET /headers HTTP/1.1\r\nHost: app\r\nHost: app\r\n\r\n",
        b"GET /headers HTTP/1.1\r\nHost: app\r\nX-A: 1\r\nHost: other\r\n\r\n",
        b"GET /headers HTTP/1.1\r\nHost: app example\r\n\r\n",
        b"GET /headers HTTP/1.1\r\nHost: app,for=6.6.6.6\r\n\r\n",
        b"GET /headers HTTP/1.1\r\nHost: [::1\r\n\r\n",
        b"GET /headers HTTP/1.1\r\nHost: app:99999\r\n\r\n",
        b"GET /headers HTTP/1.1\r\nAccept: */*\r\n\r\n",
        b"GET http://user:pw@app/headers HTTP/1.1\r\nHost: app\r\n\r\n",
        b"GET app:80 HTTP/1.1\r\nHost: app\r\n\r\n",
        b"GET * HTTP/1.1\r\nHost: app\r\n\r\n",
    ];
    cases.extend(hosts.iter().enumerate().map(|(k, raw)| case(format!("forged host or target {k}"), raw)));
    cases.extend([
        case(
            "spoofed forwarding headers",
            [&b"GET /headers HTTP/1.1\r\nHost: app.example:8080\r\n"[..], SPOOFED, b"\r\n"].concat(),
        ),
        case("absolute target", b"GET http://app.example/headers HTTP/1.1\r\nHost: other\r\n\r\n"),
        case("fragment", b"GET /headers?q=1#frag HTTP/1.1\r\nHost: app\r\n\r\n"),
        case("IPv6 host", b"GET /headers HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n"),
    ]);
    for path in ["/x", "/debug/x"] {
        cases.push(case(
            format!("two Authorization lines {path}"),
            format!(
                "GET {path} HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer A\r\nAuthorization: Bearer B\r\n\r\n"
            ),
        ));
    }
    for te in [
        "Transfer-Encoding: gzip, chunked",
        "Transfer-Encoding: chunked, chunked",
        "Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked",
        "Transfer-Encoding: Chunked",
    ] {
        cases.push(case(
            te.replace("\r\n", " / "),
            format!("POST /sink HTTP/1.1\r\nHost: t\r\n{te}\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
        ));
    }
    cases.extend([
        case("TE gzip alone", b"POST /sink HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip\r\n\r\nhello"),
        case(
            "upgrade refused by the upstream",
            b"GET /upgrade HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\nhello",
        ),
    ]);
    cases
}

/// `n` header lines `X-Hnnn: v`.
fn many_headers(n: usize) -> String {
    (0..n).map(|k| format!("X-H{k:03}: v\r\n")).collect()
}

/// A `GET` whose head is exactly `len` bytes (one long header value).
fn head_of(len: usize) -> Vec<u8> {
    let start = "GET /long HTTP/1.1\r\nHost: t\r\nX-Long: ";
    let end = "\r\n\r\n";
    let pad = len - start.len() - end.len();
    format!("{start}{}{end}", "v".repeat(pad)).into_bytes()
}

fn chunked(chunks: &[&[u8]], ext: &str, trailers: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for c in chunks {
        out.extend_from_slice(format!("{:x}{ext}\r\n", c.len()).as_bytes());
        out.extend_from_slice(c);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(format!("0{ext}\r\n{trailers}\r\n").as_bytes());
    out
}

fn post(path: &str, extra: &str, body: &[u8]) -> Vec<u8> {
    let mut out = format!("POST {path} HTTP/1.1\r\nHost: t\r\n{extra}Content-Length: {}\r\n\r\n", body.len())
        .into_bytes();
    out.extend_from_slice(body);
    out
}

/// The crafted requests: one per behaviour worth pinning down.
fn crafted() -> Vec<Case> {
    let close = "Connection: close\r\n";
    let get = |path: &str, extra: &str| format!("GET {path} HTTP/1.1\r\nHost: t\r\n{extra}\r\n");
    let head = |path: &str| format!("HEAD {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    let kib = |n: usize| -> Vec<u8> {
        (0..n * 1024).map(|i| b"abcdefghijklmnopqrstuvwxyz0123456789"[i % 36]).collect()
    };
    let mut cases = vec![
        // Methods.
        case("GET", get("/m/get", close)),
        case("GET keep-alive", get("/m/get", "")),
        case("HEAD", head("/m/head")),
        case("POST", post("/m/post", close, b"posted")),
        case("PUT", format!("PUT /m/put HTTP/1.1\r\nHost: t\r\n{close}Content-Length: 3\r\n\r\nput")),
        case("DELETE", format!("DELETE /m/delete HTTP/1.1\r\nHost: t\r\n{close}\r\n")),
        case("OPTIONS", format!("OPTIONS /m/options HTTP/1.1\r\nHost: t\r\n{close}\r\n")),
        case("OPTIONS *", format!("OPTIONS * HTTP/1.1\r\nHost: t\r\n{close}\r\n")),
        case("PATCH", format!("PATCH /m/patch HTTP/1.1\r\nHost: t\r\n{close}Content-Length: 1\r\n\r\np")),
        case("TRACE", format!("TRACE /m/trace HTTP/1.1\r\nHost: t\r\n{close}\r\n")),
        case("an extension method", format!("PURGE /m/purge HTTP/1.1\r\nHost: t\r\n{close}\r\n")),
        case("CONNECT", b"CONNECT app.example:443 HTTP/1.1\r\nHost: app.example:443\r\n\r\n"),
        case(
            "CONNECT with bytes after",
            b"CONNECT app.example:443 HTTP/1.1\r\nHost: app.example:443\r\n\r\n\
            \x16\x03\x01hello",
        ),
        case("lowercase method", b"get /m/lower HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"),
        // The upstream's answers.
        case("GET /r/chunked", get("/r/chunked", close)),
        case("GET /r/chunked?trailers", get("/r/chunked?trailers", close)),
        case(
            "GET /r/chunked?trailers, TE: trailers",
            get(
                "/r/chunked?trailers",
                "TE: trailers\r\n\
            Connection: close, TE\r\n",
            ),
        ),
        case("GET /r/close", get("/r/close", close)),
        case("GET /r/close keep-alive", get("/r/close", "")),
        case("GET /r/close then GET", [get("/r/close", ""), get("/after-close", close)].concat()),
        case("GET /r/204", get("/r/204", close)),
        case("GET /r/304", get("/r/304", "If-None-Match: \"v1\"\r\nConnection: close\r\n")),
        case("GET /r/big", get("/r/big", close)),
        case("GET /r/hop", get("/r/hop", close)),
        case("GET /r/status/404", get("/r/status/404", close)),
        case("GET /r/status/500", get("/r/status/500", close)),
        case("GET /r/status/503", get("/r/status/503", close)),
        case("HEAD /r/chunked", head("/r/chunked")),
        case("HEAD /r/close", head("/r/close")),
        case("HEAD /r/204", head("/r/204")),
        case("HEAD /r/304", head("/r/304")),
        case("HEAD /r/big", head("/r/big")),
        case("HEAD /r/hop", head("/r/hop")),
        case("HEAD /r/status/404", head("/r/status/404")),
        case(
            "pipelined HEAD then GET",
            [
                "HEAD /r/big HTTP/1.1\r\nHost: t\r\n\
            \r\n"
                    .to_owned(),
                get("/r/chunked", close),
            ]
            .concat(),
        ),
        // Versions and persistence.
        case("HTTP/1.0 without Host", b"GET /v/10 HTTP/1.0\r\n\r\n"),
        case("HTTP/1.0", b"GET /v/10 HTTP/1.0\r\nHost: t\r\n\r\n"),
        case("HTTP/1.0 keep-alive", b"GET /v/10 HTTP/1.0\r\nHost: t\r\nConnection: keep-alive\r\n\r\n"),
        case(
            "HTTP/1.0 keep-alive, pipelined",
            b"GET /v/10a HTTP/1.0\r\nHost: t\r\nConnection: keep-alive\r\n\r\nGET /v/10b HTTP/1.0\r\n\
                Host: t\r\n\r\n",
        ),
        case("HTTP/1.0 /r/chunked", b"GET /r/chunked?trailers HTTP/1.0\r\nHost: t\r\n\r\n"),
        case(
            "HTTP/1.0 keep-alive /r/chunked",
            b"GET /r/chunked HTTP/1.0\r\nHost: t\r\n\
            Connection: keep-alive\r\n\r\n",
        ),
        case("HTTP/1.0 /r/close", b"GET /r/close HTTP/1.0\r\nHost: t\r\n\r\n"),
        case("HTTP/1.0 POST", b"POST /v/10 HTTP/1.0\r\nHost: t\r\nContent-Length: 4\r\n\r\nbody"),
        case(
            "HTTP/1.0 chunked POST",
            b"POST /v/10 HTTP/1.0\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n\
            4\r\nbody\r\n0\r\n\r\n",
        ),
        case("HTTP/1.1 Connection: close", get("/v/close", close)),
        case("Connection: CLOSE, odd case", get("/v/close", "connection: Keep-Alive, CLOSE\r\n")),
        case("HTTP/1.2", b"GET /v/12 HTTP/1.2\r\nHost: t\r\n\r\n"),
        case("HTTP/2.0 request line", b"GET /v/20 HTTP/2.0\r\nHost: t\r\n\r\n"),
        case("lowercase version", b"GET /v/lower http/1.1\r\nHost: t\r\n\r\n"),
        case("HTTP/0.9 request line", b"GET /v/09\r\n\r\n"),
        case("the HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
        case(
            "pipelined keep-alive, three in one write",
            [get("/p/1", ""), get("/p/2", ""), get("/p/3", "")].concat(),
        ),
        case(
            "pipelined, the last one closes",
            [get("/p/1", "").into_bytes(), post("/p/2", "", b"two"), get("/p/3", close).into_bytes()]
                .concat(),
        ),
        case("pipelined past a Connection: close", [get("/p/1", close), get("/p/never", close)].concat()),
        // Bodies.
        case("CL 0", post("/b/0", close, b"")),
        case("CL 1", post("/b/1", close, b"x")),
        case("CL 10 KiB", post("/b/10k", close, &kib(10))),
        case("CL 100 KiB", post("/b/100k", close, &kib(100))),
        case(
            "CL 100 KiB, keep-alive, then GET",
            [post("/b/100k", "", &kib(100)), get("/b/after", close).into_bytes()].concat(),
        ),
        case(
            "GET with a body",
            format!(
                "GET /b/get HTTP/1.1\r\nHost: t\r\n{close}Content-Length: 4\r\n\r\n\
            body"
            ),
        ),
        case("CL shorter than sent", b"POST /b/short HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabcdef"),
        case("CL longer than sent", b"POST /b/long HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nabc"),
        case(
            "CL longer than sent, half-closed",
            b"POST /b/long HTTP/1.1\r\nHost: t\r\n\
            Content-Length: 10\r\n\r\nabc",
        )
        .half_close(),
        case("CL +5", b"POST /b/plus HTTP/1.1\r\nHost: t\r\nContent-Length: +5\r\n\r\nhello"),
        case("CL -1", b"POST /b/neg HTTP/1.1\r\nHost: t\r\nContent-Length: -1\r\n\r\n"),
        case("CL abc", b"POST /b/abc HTTP/1.1\r\nHost: t\r\nContent-Length: abc\r\n\r\n"),
        case("CL empty", b"POST /b/empty HTTP/1.1\r\nHost: t\r\nContent-Length:\r\n\r\n"),
        case(
            "CL twice, the same",
            b"POST /b/twice HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\
            Content-Length: 5\r\nConnection: close\r\n\r\nhello",
        ),
        case("CL 5, 5", b"POST /b/list HTTP/1.1\r\nHost: t\r\nContent-Length: 5, 5\r\n\r\nhello"),
        case(
            "chunked",
            [
                format!(
                    "POST /b/chunked HTTP/1.1\r\nHost: t\r\n{close}Transfer-Encoding: chunked\r\n\
                    \r\n"
                )
                .into_bytes(),
                chunked(&[b"hello", b" ", b"world"], "", ""),
            ]
            .concat(),
        ),
        case(
            "chunked with extensions and trailers",
            [
                format!(
                    "POST /b/chunked HTTP/1.1\r\nHost: t\r\n{close}Transfer-Encoding: chunked\r\n\
                    \r\n"
                )
                .into_bytes(),
                chunked(&[b"hello", b"world!"], ";name=\"va lue\";x", "X-Sum: 1\r\nX-Other: two\r\n"),
            ]
            .concat(),
        ),
        case(
            "chunked, trailers naming framing headers",
            [
                format!(
                    "POST /b/chunked HTTP/1.1\r\nHost: t\r\n{close}Transfer-Encoding: chunked\r\n\
                    \r\n"
                )
                .into_bytes(),
                chunked(&[b"abc"], "", "Content-Length: 9\r\nHost: evil\r\n"),
            ]
            .concat(),
        ),
        case(
            "chunked 70 KiB in 1 KiB chunks",
            [
                format!(
                    "POST /b/chunked HTTP/1.1\r\nHost: t\r\n{close}Transfer-Encoding: chunked\r\n\
                    \r\n"
                )
                .into_bytes(),
                chunked(&kib(70).chunks(1024).collect::<Vec<_>>(), "", "X-T: 1\r\n"),
            ]
            .concat(),
        ),
        case(
            "chunked, upper-case hex and zero padding",
            format!(
                "POST /b/chunked HTTP/1.1\r\nHost: t\r\n{close}Transfer-Encoding: chunked\r\n\r\n\
                000A\r\n0123456789\r\n0000\r\n\r\n"
            ),
        ),
        case(
            "chunked, then pipelined GET",
            [
                b"POST /b/chunked HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec(),
                chunked(&[b"abc"], "", ""),
                get("/b/after", close).into_bytes(),
            ]
            .concat(),
        ),
        case(
            "chunked, unterminated",
            b"POST /b/chunked HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel",
        ),
        case(
            "chunked, bad size",
            b"POST /b/chunked HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\
            \r\nzz\r\nhello\r\n0\r\n\r\n",
        ),
        case(
            "Expect: 100-continue, body sent at once",
            post("/b/expect", "Expect: 100-continue\r\nConnection: close\r\n", b"continued"),
        ),
        case(
            "Expect: 100-continue, no body yet",
            b"POST /b/expect HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 9\r\n\r\n",
        ),
        case(
            "Expect: 100-continue, 100 KiB",
            post("/b/expect", "Expect: 100-continue\r\nConnection: close\r\n", &kib(100)),
        ),
        case(
            "Expect: something else",
            post(
                "/b/expect",
                "Expect: the-unexpected\r\n\
            Connection: close\r\n",
                b"x",
            ),
        ),
        // Upgrades.
        case(
            "Upgrade: websocket",
            b"GET /ws HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
              Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        ),
        case(
            "Upgrade: h2c",
            b"GET /h2c HTTP/1.1\r\nHost: t\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n\
              HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n",
        ),
        case("Upgrade without Connection: upgrade", get("/up/bare", "Upgrade: websocket\r\n")),
        case("Connection: upgrade without Upgrade", get("/up/none", "Connection: upgrade\r\n")),
        // Targets.
        case(
            "absolute form",
            get("http://app.example/t/abs?q=1", close).replace("Host: t", "Host: app.example"),
        ),
        case("absolute form, Host differs", get("http://app.example:8080/t/abs", close)),
        case("absolute form, https", get("https://app.example/t/abs", close)),
        case("absolute form, no path", get("http://app.example", close)),
        case("query string", get("/t/q?a=1&b=two&c=&d", close)),
        case("percent escapes", get("/t/%41%2f%2F%20x?q=%26%3d", close)),
        case("sub-delims and friends", get("/t/!$&'()*+,;=:@~-._/x?/?:@", close)),
        case("UTF-8 in the target", get("/t/caf\u{e9}", close)),
        case("a 0x7f in the target", b"GET /t/\x7f HTTP/1.1\r\nHost: t\r\n\r\n"),
        case("a NUL in the target", b"GET /t/\0 HTTP/1.1\r\nHost: t\r\n\r\n"),
        case("a space too many", b"GET  /t/space HTTP/1.1\r\nHost: t\r\n\r\n"),
        case("a tab in the request line", b"GET\t/t/tab HTTP/1.1\r\nHost: t\r\n\r\n"),
        case("a relative target", b"GET t/relative HTTP/1.1\r\nHost: t\r\n\r\n"),
        case("an empty target", b"GET  HTTP/1.1\r\nHost: t\r\n\r\n"),
        case("a 15,000-byte target", get(&format!("/t/{}", "p".repeat(15_000)), close)),
        case("/debug/ path", get("/debug/x", close)),
        case("/debug/..;/api", get("/debug/..;/api", close)),
        case("/api/..;/debug/x", get("/api/..;/debug/x", close)),
        case("/debug/%2e%2e/api", get("/debug/%2e%2e/api", close)),
        case("//double/slash", get("//double//slash", close)),
        // Headers.
        case(
            "duplicate headers",
            get(
                "/h/dup",
                "X-Dup: 1\r\nAccept: a\r\nX-Dup: 2\r\nAccept: b\r\n\
            Connection: close\r\n",
            ),
        ),
        case(
            "Authorization and X-Client-Id",
            get(
                "/h/auth",
                "Authorization: Bearer T\r\n\
            X-Client-Id: web-1\r\nConnection: close\r\n",
            ),
        ),
        case(
            "client forwarding headers",
            get(
                "/h/fwd",
                "X-Forwarded-For: 10.0.0.1\r\nForwarded: for=10.0.0.2\r\nX-Real-IP: 10.0.0.3\r\n\
                 X-Forwarded-Proto: https\r\nX-Forwarded-Host: evil\r\nX-Forwarded-Port: 1\r\n\
                 Connection: close\r\n",
            ),
        ),
        case(
            "odd-case names",
            b"gEt /h/case HTTP/1.1\r\nhOsT: t\r\nCONTENT-LENGTH: 0\r\n\
            x-MiXeD-cAsE: Value\r\nconnection: CLOSE\r\n\r\n",
        ),
        case("empty Host", b"GET /h/empty-host HTTP/1.1\r\nHost:\r\nConnection: close\r\n\r\n"),
        case(
            "Host with port",
            b"GET /h/port HTTP/1.1\r\nHost: app.example:8080\r\nConnection: close\r\n\
            \r\n",
        ),
        case(
            "header value with tabs and obs-text",
            b"GET /h/obs HTTP/1.1\r\nHost: t\r\n\
            X-Obs: a\tb \xe9\xff\r\nConnection: close\r\n\r\n",
        ),
        case(
            "empty header value",
            b"GET /h/empty HTTP/1.1\r\nHost: t\r\nX-Empty:\r\nX-Spaces:   \r\n\
            Connection: close\r\n\r\n",
        ),
        case(
            "hop-by-hop request headers named by Connection",
            get(
                "/h/hop",
                "Connection: X-A, close\r\nX-A: 1\r\nX-B: 2\r\nProxy-Connection: keep-alive\r\n\
                 Keep-Alive: 5\r\nTE: trailers\r\nTrailer: X-T\r\n",
            ),
        ),
        case(
            "Via and Max-Forwards",
            get(
                "/h/via",
                "Via: 1.1 elsewhere\r\nMax-Forwards: 3\r\n\
            Connection: close\r\n",
            ),
        ),
        case("100 headers", get("/h/100", &format!("{}{close}", many_headers(98)))),
        case("101 headers", get("/h/101", &format!("{}{close}", many_headers(99)))),
        case("200 headers", get("/h/200", &format!("{}{close}", many_headers(198)))),
        case("a value of 16,000 bytes", get("/h/long", &format!("X-Long: {}\r\n", "v".repeat(16_000)))),
        case("a head of 16,383 bytes", head_of(16_383)),
        case("a head of 16,384 bytes", head_of(16_384)),
        case("a head of 16,385 bytes", head_of(16_385)),
        case("a head of 40,000 bytes", head_of(40_000)),
        case("a head of 16,385 bytes, in 40 pieces", head_of(16_385))
            .pieces(&(1..40).map(|k| k * 420).collect::<Vec<_>>()),
        // Malformed heads.
        case("bare LF line ends", b"GET /x/lf HTTP/1.1\nHost: t\nConnection: close\n\n"),
        case("bare LF, then CRLF", b"GET /x/lf HTTP/1.1\nHost: t\r\nConnection: close\n\r\n"),
        case("bare CR", b"GET /x/cr HTTP/1.1\r\nHost: t\r\nX-A: a\rb\r\n\r\n"),
        case("obs-fold", b"GET /x/fold HTTP/1.1\r\nHost: t\r\nX-A: a\r\n b\r\n\r\n"),
        case("obs-fold first", b"GET /x/fold HTTP/1.1\r\n X-A: b\r\nHost: t\r\n\r\n"),
        case("a space before the colon", b"GET /x/space HTTP/1.1\r\nHost : t\r\n\r\n"),
        case("a NUL in a value", b"GET /x/nul HTTP/1.1\r\nHost: t\r\nX-A: a\0b\r\n\r\n"),
        case("a NUL in a name", b"GET /x/nul HTTP/1.1\r\nHost: t\r\nX-\0A: b\r\n\r\n"),
        case("a NUL first", b"\0GET /x/nul HTTP/1.1\r\nHost: t\r\n\r\n"),
        case("no colon", b"GET /x/colon HTTP/1.1\r\nHost: t\r\nno colon here\r\n\r\n"),
        case("an empty name", b"GET /x/name HTTP/1.1\r\nHost: t\r\n: value\r\n\r\n"),
        case("a DEL in a value", b"GET /x/del HTTP/1.1\r\nHost: t\r\nX-A: a\x7fb\r\n\r\n"),
        case(
            "a header line without a value",
            b"GET /x/novalue HTTP/1.1\r\nHost: t\r\nX-A:\r\n\
            Connection: close\r\n\r\n",
        ),
        case(
            "leading empty lines",
            b"\r\n\r\n\nGET /x/leading HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\
            \r\n",
        ),
        case("only empty lines", b"\r\n\r\n\r\n"),
        case("nothing, half-closed", b"").half_close(),
        case("an unfinished head", b"GET /x/unfinished HTTP/1.1\r\nHost: t\r\n"),
        case("an unfinished head, half-closed", b"GET /x/unfinished HTTP/1.1\r\nHost: t\r\n").half_close(),
        case("garbage", b"this is not HTTP\r\n\r\n"),
        case("a response instead of a request", b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"),
        // Writes.
        case(
            "chunked POST byte by byte",
            [
                b"POST /w/bytes HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec(),
                chunked(&[b"hello", b"bytes"], ";e=1", "X-T: 1\r\n"),
                get("/w/after", close).into_bytes(),
            ]
            .concat(),
        )
        .bytewise(),
        case("GET byte by byte", get("/w/bytes", close)).bytewise(),
        case("in seven pieces", post("/w/pieces", close, b"0123456789")).pieces(&[1, 5, 17, 18, 30, 45, 60]),
        case("GET, half-closed", get("/w/half", "")).half_close_racy(),
        case("GET Connection: close, half-closed", get("/w/half", close)).half_close_racy(),
        case("POST, half-closed", post("/w/half", "", b"0123456789")).half_close_racy(),
        case("two pipelined, half-closed", [get("/w/h1", ""), get("/w/h2", "")].concat()).half_close_racy(),
    ];
    // Every name once, so a failure names one case.
    let mut names: Vec<&str> = cases.iter().map(|c| c.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), cases.len(), "two crafted cases share a name");
    cases.shrink_to_fit();
    cases
}

// ---- Playing a case ----

/// A distinct loopback address for each case of the run.
fn next_client() -> Ipv4Addr {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let k = NEXT.fetch_add(1, Ordering::Relaxed);
    let [_, a, b, c] = (k % 250 + 1 + (k / 250 % 250 + 1) * 256 + (k / 62_500 + 1) * 65_536).to_be_bytes();
    Ipv4Addr::new(127, a, b, c)
}

/// How the proxy left the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    /// EOF: the proxy closed it.
    Closed,
    /// The proxy reset it.
    Reset,
    /// Nothing for [`QUIET`] after everything was sent.
    Open,
    /// Still sending after [`CASE_LIMIT`].
    TooLong,
}

/// What a client received on one connection, and the connection (kept
/// open until the upstream's side is taken: a close would change what
/// the upstream is still receiving).
struct Received {
    bytes: Vec<u8>,
    end: End,
    _stream: TcpStream,
}

/// Sends `case` to `proxy` from `client`; reads until the proxy closes,
/// resets, or stays quiet.
fn play(proxy: SocketAddr, client: Ipv4Addr, case: &Case) -> Received {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("a socket");
    socket.bind(&SocketAddr::new(IpAddr::V4(client), 0).into()).expect("bind a loopback address");
    socket.connect_timeout(&proxy.into(), Duration::from_secs(5)).expect("connect to the proxy");
    let stream: TcpStream = socket.into();
    stream.set_nodelay(true).expect("nodelay");
    let started = Instant::now();
    let written = Mutex::new(None::<Instant>);
    let mut bytes = Vec::new();
    let end = thread::scope(|scope| {
        let mut writer = stream.try_clone().expect("a second handle");
        let written = &written;
        scope.spawn(move || {
            let pieces: Vec<&[u8]> = match &case.writes {
                Writes::Whole => vec![&case.bytes[..]],
                Writes::Bytewise => case.bytes.chunks(1).collect(),
                Writes::Pieces(cuts) => {
                    let mut at = 0;
                    let mut pieces: Vec<&[u8]> = Vec::new();
                    for &cut in cuts.iter().chain([case.bytes.len()].iter()) {
                        let cut = cut.clamp(at, case.bytes.len());
                        pieces.push(&case.bytes[at..cut]);
                        at = cut;
                    }
                    pieces
                }
            };
            for piece in pieces {
                // The proxy may close before it read everything.
                if writer.write_all(piece).is_err() {
                    break;
                }
            }
            if case.half_close {
                let _ = writer.shutdown(Shutdown::Write);
            }
            *written.lock().expect("not poisoned") = Some(Instant::now());
        });
        let mut reader = &stream;
        reader.set_read_timeout(Some(Duration::from_millis(50))).expect("a read timeout");
        let mut last = started;
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            match reader.read(&mut chunk) {
                Ok(0) => break End::Closed,
                Ok(n) => {
                    bytes.extend_from_slice(&chunk[..n]);
                    last = Instant::now();
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == ErrorKind::ConnectionReset => break End::Reset,
                Err(e) => panic!("reading from the proxy: {e}"),
            }
            if let Some(done) = *written.lock().expect("not poisoned")
                && last.max(done).elapsed() >= QUIET
            {
                break End::Open;
            }
            if started.elapsed() > CASE_LIMIT {
                // Unblocks a writer the proxy stopped reading from.
                let _ = stream.shutdown(Shutdown::Both);
                break End::TooLong;
            }
        }
    });
    Received { bytes, end, _stream: stream }
}

// ---- What a client received, parsed ----

#[derive(Clone, Debug, PartialEq, Eq)]
struct Response {
    status_line: Vec<u8>,
    headers: Vec<Field>,
    body: Vec<u8>,
    /// `Some` for a chunked body (its trailer fields).
    trailers: Option<Vec<Field>>,
    /// The body (or the chunked framing) stopped short.
    cut: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct ClientSide {
    responses: Vec<Response>,
    /// What followed the last response that parses, raw (with why).
    rest: Option<(String, Vec<u8>)>,
    end: End,
}

/// Parses a byte stream of responses to requests whose methods are
/// `methods` (a `HEAD`'s answer has no body).
fn parse_responses(bytes: &[u8], methods: &[String], end: End) -> ClientSide {
    let mut responses = Vec::new();
    let mut at = 0;
    let mut finals = 0;
    let rest = loop {
        if at == bytes.len() {
            break None;
        }
        let mut headers = vec![httparse::EMPTY_HEADER; 256];
        let mut parsed = httparse::Response::new(&mut headers);
        let len = match parsed.parse(&bytes[at..]) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) => {
                break Some(("an unfinished head".to_owned(), bytes[at..].to_vec()));
            }
            Err(e) => break Some((format!("not a response head: {e}"), bytes[at..].to_vec())),
        };
        let status = parsed.code.unwrap_or_default();
        let line_end = bytes[at..].iter().position(|&b| b == b'\n').unwrap_or(0);
        let status_line = trim(&bytes[at..at + line_end]).to_vec();
        let fields: Vec<Field> = parsed
            .headers
            .iter()
            .map(|h| (h.name.to_ascii_lowercase(), h.value.to_vec()))
            .filter(|(name, _)| name != "date")
            .collect();
        at += len;
        let mut response =
            Response { status_line, headers: fields, body: Vec::new(), trailers: None, cut: None };
        let value =
            |name: &str| response.headers.iter().rev().find(|(n, _)| n == name).map(|(_, v)| v.clone());
        let informational = (100..200).contains(&status);
        let head_only = !informational && methods.get(finals).is_some_and(|m| m == "HEAD");
        if !informational {
            finals += 1;
        }
        if status == 101 {
            responses.push(response);
            break (at < bytes.len()).then(|| ("after 101".to_owned(), bytes[at..].to_vec()));
        }
        if informational || head_only || status == 204 || status == 304 {
            responses.push(response);
            continue;
        }
        if value("transfer-encoding").is_some_and(|v| trim(&v).eq_ignore_ascii_case(b"chunked")) {
            let mut decoder = Chunked::default();
            match decoder.feed(&bytes[at..]) {
                Ok(n) => {
                    at += n;
                    if !decoder.done() {
                        response.cut = Some("the chunked body stops short".into());
                    }
                }
                Err(e) => {
                    response.cut = Some(format!("bad chunked framing: {e}"));
                    at = bytes.len();
                }
            }
            response.body = std::mem::take(&mut decoder.body);
            response.trailers = Some(std::mem::take(&mut decoder.trailers));
        } else if let Some(length) = value("content-length") {
            let n =
                std::str::from_utf8(trim(&length)).ok().and_then(|s| s.parse::<usize>().ok()).unwrap_or(0);
            let n = if bytes.len() - at < n {
                response.cut = Some(format!("{} of {n} bytes", bytes.len() - at));
                bytes.len() - at
            } else {
                n
            };
            response.body = bytes[at..at + n].to_vec();
            at += n;
        } else {
            response.body = bytes[at..].to_vec();
            at = bytes.len();
        }
        responses.push(response);
    };
    ClientSide { responses, rest, end }
}

// ---- The comparison ----

/// Everything compared for one daemon.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
    client: ClientSide,
    upstream: Vec<Recorded>,
}

/// The upstream's requests with the daemon's own port replaced, and the
/// attribution fields (the port and client) cleared.
fn normalise_upstream(records: Vec<Recorded>, port: u16) -> Vec<Recorded> {
    let port = port.to_string();
    records
        .into_iter()
        .map(|mut r| {
            r.port = None;
            r.client = None;
            // How a request body is framed is the engine's to choose (see
            // the top of the file): its decoded bytes and trailers say
            // whether it arrived.
            r.headers.retain(|(name, _)| name != "content-length" && name != "transfer-encoding");
            if r.trailers.as_ref().is_some_and(Vec::is_empty) {
                r.trailers = None;
            }
            for (name, value) in &mut r.headers {
                if name == "x-forwarded-port" || name == "forwarded" {
                    *value = replace(value, port.as_bytes(), b"<port>");
                }
            }
            r
        })
        .collect()
}

/// `value` with every `from` that is a whole number (not part of a longer
/// one) replaced by `to`.
fn replace(value: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(value.len());
    let mut at = 0;
    while at < value.len() {
        let before_ok = at == 0 || !value[at - 1].is_ascii_digit();
        let after = at + from.len();
        if before_ok && value[at..].starts_with(from) && value.get(after).is_none_or(|b| !b.is_ascii_digit())
        {
            out.extend_from_slice(to);
            at = after;
        } else {
            out.push(value[at]);
            at += 1;
        }
    }
    out
}

fn render(seen: &Seen) -> Vec<String> {
    let mut lines = Vec::new();
    for (k, r) in seen.client.responses.iter().enumerate() {
        lines.push(format!("response {k}: {}", Escaped(&r.status_line)));
        for (name, value) in &r.headers {
            lines.push(format!("  {name}: {}", Escaped(value)));
        }
        lines.push(format!("  body: {}", BodyShown(&r.body)));
        if let Some(trailers) = &r.trailers {
            lines.push(format!("  chunked, {} trailer fields", trailers.len()));
            for (name, value) in trailers {
                lines.push(format!("  trailer {name}: {}", Escaped(value)));
            }
        }
        if let Some(cut) = &r.cut {
            lines.push(format!("  cut: {cut}"));
        }
    }
    if let Some((why, rest)) = &seen.client.rest {
        lines.push(format!("then {why}: {}", BodyShown(rest)));
    }
    lines.push(format!("connection: {:?}", seen.client.end));
    for (k, r) in seen.upstream.iter().enumerate() {
        lines.push(format!("upstream request {k}:"));
        lines.extend(format!("{r:?}").lines().map(|l| format!("  {l}")));
    }
    if seen.upstream.is_empty() {
        lines.push("upstream: nothing".into());
    }
    lines
}

/// A line diff (longest common subsequence): `-` native, `+` hyper.
fn diff(native: &[String], hyper: &[String]) -> String {
    let (n, m) = (native.len(), hyper.len());
    let mut lcs = vec![vec![0u32; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] =
                if native[i] == hyper[j] { lcs[i + 1][j + 1] + 1 } else { lcs[i + 1][j].max(lcs[i][j + 1]) };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, String::new());
    while i < n || j < m {
        if i < n && j < m && native[i] == hyper[j] {
            let _ = writeln!(out, "  {}", native[i]);
            (i, j) = (i + 1, j + 1);
        } else if j < m && (i == n || lcs[i][j + 1] >= lcs[i + 1][j]) {
            let _ = writeln!(out, "+ {}", hyper[j]);
            j += 1;
        } else {
            let _ = writeln!(out, "- {}", native[i]);
            i += 1;
        }
    }
    out
}

/// Runs `case` against both daemons at once: what hyper did (headers in
/// its order), and what differed (`Err`).
fn check(target: Target<'_>, case: &Case) -> (Seen, Result<(), String>) {
    let client = next_client();
    let (native, hyper) = thread::scope(|scope| {
        let native = scope.spawn(|| play(target.native, client, case));
        let hyper = play(target.hyper, client, case);
        (native.join().expect("the native side's thread"), hyper)
    });
    // The upstream may still be reading what a proxy forwarded while it
    // answered the client (a body, a request of a client now gone).
    thread::sleep(Duration::from_millis(50));
    let methods = request_methods(&case.bytes);
    let seen = |received: Received, port: u16| Seen {
        client: parse_responses(&received.bytes, &methods, received.end),
        upstream: normalise_upstream(target.recorder.take(port, IpAddr::V4(client)), port),
    };
    let (mut native, mut hyper) = (seen(native, target.native.port()), seen(hyper, target.hyper.port()));
    let strict = std::env::var_os("H1_ENGINES_STRICT_ORDER").is_some();
    let as_sent = hyper.clone();
    if !strict {
        group_by_name(&mut native);
        group_by_name(&mut hyper);
    }
    if native == hyper || (case.races && within_the_race(&native.client, &hyper.client)) {
        return (as_sent, Ok(()));
    }
    let shown = format!(
        "the engines differ on {}\n--- native, +++ hyper{}:\n{}",
        case.shown(),
        if strict { "" } else { " (header fields grouped by name)" },
        diff(&render(&native), &render(&hyper))
    );
    (as_sent, Err(shown))
}

/// Every header and trailer list sorted by field name, stably: the order
/// of the values of one name is kept (see the top of the file).
fn group_by_name(seen: &mut Seen) {
    let sort = |fields: &mut Vec<Field>| fields.sort_by(|a, b| a.0.cmp(&b.0));
    for r in &mut seen.client.responses {
        sort(&mut r.headers);
        r.trailers.as_mut().map(sort);
    }
    for r in &mut seen.upstream {
        sort(&mut r.headers);
        r.trailers.as_mut().map(sort);
    }
}

/// For a case hyper races on: the connection ended the same way, and
/// one side's responses are the first of the other's.
fn within_the_race(a: &ClientSide, b: &ClientSide) -> bool {
    let n = a.responses.len().min(b.responses.len());
    a.end == b.end && a.rest == b.rest && a.responses[..n] == b.responses[..n]
}

/// Runs `cases` [`PARALLEL`] at a time; fails the test with every case
/// that differed.
fn run_all(group: &str, cases: &[Case]) {
    let started = Instant::now();
    let pair = Pair::start();
    let target = pair.target();
    let next = AtomicUsize::new(0);
    let failures = Mutex::new(Vec::new());
    let table = Mutex::new(vec![String::new(); cases.len()]);
    thread::scope(|scope| {
        for _ in 0..PARALLEL {
            scope.spawn(|| {
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    let Some(case) = cases.get(k) else { break };
                    let (hyper, agreed) = check(target, case);
                    if let Ok(part) = std::env::var("H1_ENGINES_SHOW")
                        && case.name.contains(&part)
                    {
                        println!("{}\nhyper:\n{}\n", case.shown(), render(&hyper).join("\n"));
                    }
                    table.lock().expect("not poisoned")[k] = summary(case, &hyper);
                    if let Err(e) = agreed {
                        failures.lock().expect("not poisoned").push(e);
                    }
                }
            });
        }
    });
    if std::env::var_os("H1_ENGINES_TABLE").is_some() {
        let table = table.into_inner().expect("not poisoned");
        println!("{group}: what hyper answered\n{}", table.join("\n"));
    }
    let failures = failures.into_inner().expect("not poisoned");
    eprintln!("{group}: {} cases in {:.1} s", cases.len(), started.elapsed().as_secs_f64());
    let stray = strays(&pair.recorder);
    assert!(
        failures.is_empty() && stray.is_empty(),
        "{} of {} {group} cases differ:\n\n{}{stray}",
        failures.len(),
        cases.len(),
        failures.join("\n\n")
    );
}

/// The requests the upstream received that no case took (none came
/// with a case's client address and a daemon's port, or came after the
/// case was over), shown; empty when there are none.
fn strays(recorder: &Recorder) -> String {
    let stray = recorder.remaining();
    if stray.is_empty() {
        return String::new();
    }
    let mut shown = format!("\n\nthe upstream received {} requests no case accounts for:", stray.len());
    for r in &stray {
        let _ = write!(shown, "\nfrom port {:?}, client {:?}:\n{r:?}", r.port, r.client);
    }
    shown
}

/// One line of the table: the case, hyper's status lines and header
/// names, what the upstream got, how the connection ended.
fn summary(case: &Case, seen: &Seen) -> String {
    let responses: Vec<String> = seen
        .client
        .responses
        .iter()
        .map(|r| {
            let names: Vec<&str> = r.headers.iter().map(|(n, _)| n.as_str()).collect();
            format!(
                "{} [{}]{}",
                String::from_utf8_lossy(&r.status_line),
                names.join(","),
                match &r.body {
                    b if b.len() <= 80 && !b.is_empty() => format!(" b\"{}\"", Escaped(b)),
                    b if b.is_empty() => String::new(),
                    b => format!(" ({} bytes)", b.len()),
                }
            )
        })
        .collect();
    let rest = match &seen.client.rest {
        Some((why, rest)) => format!(" ; then {why}: {}", BodyShown(rest)),
        None => String::new(),
    };
    format!(
        "| {} | {}{rest} | {} | {:?} |",
        case.name,
        if responses.is_empty() { "(nothing)".to_owned() } else { responses.join(" ; ") },
        seen.upstream.len(),
        seen.client.end
    )
}

// ---- The tests ----

#[test]
fn the_framing_corpus_agrees() {
    run_all("framing corpus", &framing_corpus());
}

#[test]
fn the_http_tests_requests_agree() {
    run_all("tests/http.rs", &http_rs_cases());
}

#[test]
fn the_crafted_requests_agree() {
    run_all("crafted", &crafted());
}

// ---- Generated streams ----

#[derive(Clone, Debug)]
enum GenBody {
    None,
    Length(Vec<u8>),
    /// Chunks (empty ones dropped when written), with an extension on
    /// each size line or not, and trailer lines.
    Chunked(Vec<Vec<u8>>, bool, Vec<&'static str>),
}

#[derive(Clone, Debug)]
struct GenRequest {
    method: &'static str,
    path: String,
    http10: bool,
    /// Header lines, the `Host` among them.
    headers: Vec<&'static str>,
    body: GenBody,
}

fn render_request(r: &GenRequest, last: bool) -> Vec<u8> {
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
            let chunks: Vec<&[u8]> = chunks.iter().filter(|c| !c.is_empty()).map(Vec::as_slice).collect();
            out.extend_from_slice(&chunked(
                &chunks,
                ext,
                &trailers.iter().map(|t| format!("{t}\r\n")).collect::<String>(),
            ));
        }
    }
    out
}

fn gen_request() -> impl Strategy<Value = GenRequest> {
    let method = prop::sample::select(
        &["GET", "GET", "HEAD", "POST", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"][..],
    );
    let path = (
        prop::sample::select(
            &[
                "/",
                "/a/b",
                "/r/chunked",
                "/r/chunked?trailers",
                "/r/close",
                "/r/204",
                "/r/304",
                "/r/big",
                "/r/hop",
                "/r/status/404",
                "/r/status/500",
                "/r/status/503",
                "/debug/x",
                "/t/%41%20b",
                "/t/a;b=c",
                "http://app.example/abs",
            ][..],
        ),
        prop::option::weighted(0.3, 0u32..1000),
    )
        .prop_map(|(p, q)| match q {
            Some(q) if p.contains('?') => format!("{p}&q={q}"),
            Some(q) => format!("{p}?q={q}"),
            None => p.to_owned(),
        });
    let header = prop::sample::select(
        &[
            "Accept: */*",
            "User-Agent: gen/1.0",
            "X-A: b",
            "Authorization: Bearer T",
            "X-Client-Id: c1",
            "Cookie: k=v; k2=v2",
            "X-Forwarded-For: 10.0.0.1",
            "X-Real-IP: 10.0.0.2",
            "Forwarded: for=10.0.0.3",
            "accept-encoding: gzip",
            "X-MiXeD-CaSe: v",
            "X-Dup: 1",
            "X-Dup: 2",
            "Connection: keep-alive",
            "Cache-Control: no-cache",
            "If-None-Match: \"v1\"",
            "Range: bytes=0-10",
            "Keep-Alive: timeout=5",
            "TE: trailers",
            "Via: 1.0 elsewhere",
            "X-Empty:",
            "Expect: 100-continue",
        ][..],
    );
    let host = prop::sample::select(&["Host: t", "Host: app.example:8080", "host: T"][..]);
    let headers = (host, prop::collection::vec(header, 0..6), any::<prop::sample::Index>()).prop_map(
        |(host, mut headers, at)| {
            headers.insert(at.index(headers.len() + 1), host);
            headers
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
    (method, path, prop::bool::weighted(0.1), headers, body).prop_map(
        |(method, path, http10, headers, body)| {
            // HTTP/1.0 has no chunked transfer coding.
            let body = match body {
                GenBody::Chunked(chunks, ..) if http10 => GenBody::Length(chunks.concat()),
                b => b,
            };
            GenRequest { method, path, http10, headers, body }
        },
    )
}

/// A generated case: up to four pipelined requests, the last one with
/// `Connection: close` (so the proxy ends the case), cut into pieces.
fn gen_case() -> impl Strategy<Value = Case> {
    (prop::collection::vec(gen_request(), 1..=4), prop::collection::vec(any::<prop::sample::Index>(), 0..4))
        .prop_map(|(requests, cuts)| {
            let n = requests.len();
            let bytes: Vec<u8> =
                requests.iter().enumerate().flat_map(|(k, r)| render_request(r, k + 1 == n)).collect();
            let mut cuts: Vec<usize> = cuts.iter().map(|c| c.index(bytes.len() + 1)).collect();
            cuts.sort_unstable();
            Case {
                name: "generated".into(),
                bytes,
                writes: Writes::Pieces(cuts),
                half_close: false,
                races: false,
            }
        })
}

fn generated_cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(GENERATED)
}

#[test]
fn generated_streams_agree() {
    let started = Instant::now();
    let pair = Pair::start();
    let target = pair.target();
    let total = generated_cases();
    let runners = PARALLEL as u32;
    // Each runner shrinks its own failure; the same minimal stream found
    // by several is shown once.
    let failures = Mutex::new(Vec::<String>::new());
    thread::scope(|scope| {
        for k in 0..runners {
            let cases = total / runners + u32::from(k < total % runners);
            let failures = &failures;
            scope.spawn(move || {
                if cases == 0 {
                    return;
                }
                // Each shrinking step is a round trip through both daemons.
                let config =
                    Config { cases, failure_persistence: None, max_shrink_time: 20_000, ..Config::default() };
                let mut runner = TestRunner::new(config);
                let outcome =
                    runner.run(&gen_case(), |case| check(target, &case).1.map_err(TestCaseError::fail));
                if let Err(e) = outcome {
                    let mut failures = failures.lock().expect("not poisoned");
                    let e = e.to_string();
                    if !failures.contains(&e) {
                        failures.push(e);
                    }
                }
            });
        }
    });
    let failures = failures.into_inner().expect("not poisoned");
    eprintln!("generated: {total} streams in {:.1} s", started.elapsed().as_secs_f64());
    let stray = strays(&pair.recorder);
    assert!(
        failures.is_empty() && stray.is_empty(),
        "generated streams differ (each shrunk; add it to `crafted`):\n\n{}{stray}",
        failures.join("\n\n")
    );
}
