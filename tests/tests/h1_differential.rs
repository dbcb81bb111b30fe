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

use std::time::Instant;

use limiter_tests::{
    differential::{Case, case, check, gen_case},
    in_process::InProcess,
    wire::{self, Capture},
};
use proptest::test_runner::{Config, TestCaseError, TestRunner};

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
