//! Request smuggling, played against limiter in front of two upstreams: a
//! capture upstream that reads what limiter forwards leniently (as many
//! servers do: LF line ends, obs-fold, anything after a chunk size) and
//! records its bytes, and a real Jetty 9.4. Each case is a classic family
//! (CL.TE, TE.CL, TE.TE obfuscations, `Connection`-named framing, bare LF
//! and CR in the framing, obs-fold, chunk-size and extension tricks,
//! trailers), sent in one write and, where its framing is the point,
//! split into two writes at every byte of the body's framing.
//!
//! What is judged is what the upstream served, not what limiter says:
//! every request the upstream served must be one that limiter's access
//! log shows it forwarded (so none was hidden inside another, and none
//! took no permit), no request may reach the upstream with a forwarding
//! header the client forged, and on the capture upstream a strict and a
//! lenient reader must find the same requests in every byte limiter sent.
//! A case also says what the client must get: its requests served (200),
//! or refused (400 or 501, and the connection closed), never left hanging.
//!
//! Every case's requests carry a tag of their own in their targets, so the
//! records of the upstream and of the access log are matched case by case.
//! Before anything is compared, a last request is sent and waited for in
//! both records: whatever a case made the upstream serve was served before
//! it.

use std::{
    collections::BTreeMap,
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    time::Duration,
};

use limiter_tests::{client::read_reply, in_process::InProcess, jetty::Jetty, process::wait_for, wire};

/// What the client must get.
#[derive(Clone, Copy, Debug)]
enum Want {
    /// This many responses, all 200.
    Served(usize),
    /// A 400 or 501, then the connection closes.
    Refused,
    /// Either of the above (a form the RFC lets a proxy refuse or
    /// normalise); at most this many responses.
    Either(usize),
}

struct Case {
    name: &'static str,
    /// The bytes, `{T}` standing for the case's tag.
    bytes: Vec<u8>,
    want: Want,
    /// Also sent in two writes split at every byte after the first head.
    split_body: bool,
}

/// The request hidden inside the others: it must never be served.
const HIDDEN: &str = "GET {T}/smuggled HTTP/1.1\r\nHost: app\r\nX-Forwarded-For: 6.6.6.6\r\n\r\n";

fn case(name: &'static str, bytes: impl Into<Vec<u8>>, want: Want, split_body: bool) -> Case {
    Case { name, bytes: bytes.into(), want, split_body }
}

fn post(headers: &str, body: &str) -> String {
    format!("POST {{T}}/carrier HTTP/1.1\r\nHost: app\r\n{headers}\r\n{body}")
}

fn cases() -> Vec<Case> {
    let hidden_len = HIDDEN.len();
    let big_padding = "x".repeat(70 * 1024);
    let next = "GET {T}/next HTTP/1.1\r\nHost: app\r\n\r\n";
    vec![
        // `Connection` naming the framing or the authority.
        case(
            "connection content-length",
            post(&format!("Content-Length: {hidden_len}\r\nConnection: Content-Length\r\n"), HIDDEN),
            Want::Refused,
            false,
        ),
        case(
            "connection keep-alive, content-length",
            post(
                &format!("Content-Length: {hidden_len}\r\nConnection: keep-alive, Content-Length\r\n"),
                HIDDEN,
            ),
            Want::Refused,
            false,
        ),
        case(
            "a second connection line",
            post(
                &format!(
                    "Content-Length: {hidden_len}\r\nConnection: keep-alive\r\nConnection: content-length\r\n"
                ),
                HIDDEN,
            ),
            Want::Refused,
            false,
        ),
        case(
            "connection content-length on a GET",
            format!(
                "GET {{T}}/carrier HTTP/1.1\r\nHost: app\r\nContent-Length: {hidden_len}\r\nConnection: Content-Length\r\n\r\n{HIDDEN}"
            ),
            Want::Refused,
            false,
        ),
        case(
            "connection content-length, body over 64 KiB",
            post(
                &format!(
                    "Content-Length: {}\r\nConnection: Content-Length\r\n",
                    hidden_len + big_padding.len()
                ),
                &format!("{HIDDEN}{big_padding}"),
            ),
            Want::Refused,
            false,
        ),
        case("connection host", post("Content-Length: 0\r\nConnection: Host\r\n", ""), Want::Refused, false),
        case(
            "connection transfer-encoding",
            post(
                "Transfer-Encoding: chunked\r\nConnection: Transfer-Encoding\r\n",
                &format!("{:x}\r\n{HIDDEN}\r\n0\r\n\r\n", hidden_len),
            ),
            Want::Refused,
            false,
        ),
        // A body of known length that is itself a request: forwarded as a body.
        case(
            "a GET whose body is a request",
            format!(
                "GET {{T}}/carrier HTTP/1.1\r\nHost: app\r\nContent-Length: {hidden_len}\r\n\r\n{HIDDEN}"
            ),
            Want::Served(1),
            false,
        ),
        // CL.TE and TE.CL.
        case(
            "content-length and chunked",
            post("Content-Length: 4\r\nTransfer-Encoding: chunked\r\n", &format!("0\r\n\r\n{HIDDEN}")),
            Want::Refused,
            false,
        ),
        case(
            "chunked and content-length",
            post(
                &format!("Transfer-Encoding: chunked\r\nContent-Length: {}\r\n", 5),
                &format!("{:x}\r\n{HIDDEN}\r\n0\r\n\r\n", hidden_len),
            ),
            Want::Refused,
            false,
        ),
        // TE.TE obfuscations.
        case(
            "transfer-encoding xchunked",
            post("Transfer-Encoding: xchunked\r\nContent-Length: 5\r\n", "0\r\n\r\n"),
            Want::Refused,
            false,
        ),
        case(
            "transfer-encoding with a space before the colon",
            post("Transfer-Encoding : chunked\r\nContent-Length: 5\r\n", "0\r\n\r\n"),
            Want::Refused,
            false,
        ),
        case(
            "transfer-encoding twice",
            post(
                "Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n",
                &format!("0\r\n\r\n{HIDDEN}"),
            ),
            Want::Refused,
            false,
        ),
        case(
            "transfer-encoding chunked, identity",
            post("Transfer-Encoding: chunked, identity\r\n", &format!("0\r\n\r\n{HIDDEN}")),
            Want::Refused,
            false,
        ),
        case(
            "transfer-encoding folded",
            post("Transfer-Encoding:\r\n chunked\r\nContent-Length: 5\r\n", "0\r\n\r\n"),
            Want::Refused,
            false,
        ),
        case(
            "transfer-encoding behind a tab",
            post("Transfer-Encoding:\tchunked\r\n", &format!("{:x}\r\n{HIDDEN}\r\n0\r\n\r\n", hidden_len)),
            Want::Either(1),
            false,
        ),
        case(
            "transfer-encoding with a vertical tab",
            post("Transfer-Encoding: \x0bchunked\r\nContent-Length: 5\r\n", "0\r\n\r\n"),
            Want::Refused,
            false,
        ),
        // Content-Length tricks.
        case(
            "two different lengths",
            post("Content-Length: 5\r\nContent-Length: 0\r\n", "0\r\n\r\n"),
            Want::Refused,
            false,
        ),
        case("a length list", post("Content-Length: 5, 0\r\n", "0\r\n\r\n"), Want::Refused, false),
        case("a signed length", post("Content-Length: +5\r\n", "0\r\n\r\n"), Want::Refused, false),
        case("a hex length", post("Content-Length: 0x5\r\n", "0\r\n\r\n"), Want::Refused, false),
        // Bare LF and bare CR in the framing.
        case(
            "a bare LF after the last chunk",
            post("Transfer-Encoding: chunked\r\n", &format!("0\r\n\n{HIDDEN}\r\n")),
            Want::Either(1),
            true,
        ),
        case(
            "a bare LF inside the trailer section",
            post("Transfer-Encoding: chunked\r\n", &format!("0\r\nX-T: 1\n{HIDDEN}\r\n\r\n")),
            Want::Either(1),
            true,
        ),
        case(
            "a bare LF ending a chunk size",
            post("Transfer-Encoding: chunked\r\n", &format!("{:x}\n{HIDDEN}\r\n0\r\n\r\n", hidden_len)),
            Want::Refused,
            true,
        ),
        case(
            "a bare LF ending chunk data",
            post("Transfer-Encoding: chunked\r\n", "3\r\nabc\n0\r\n\r\n"),
            Want::Refused,
            true,
        ),
        case(
            "a bare CR in a chunk size",
            post("Transfer-Encoding: chunked\r\n", "3\rX\r\nabc\r\n0\r\n\r\n"),
            Want::Refused,
            true,
        ),
        case(
            "a bare CR in a header",
            format!(
                "POST {{T}}/carrier HTTP/1.1\r\nHost: app\r\nX-A: 1\rContent-Length: 0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n{HIDDEN}"
            ),
            Want::Refused,
            false,
        ),
        case(
            "bare LF line ends in the head",
            format!("POST {{T}}/carrier HTTP/1.1\nHost: app\nContent-Length: 3\n\nabc{next}"),
            Want::Either(2),
            false,
        ),
        // obs-fold.
        case("a folded header", post("X-A: 1\r\n 2\r\nContent-Length: 0\r\n", ""), Want::Refused, false),
        case("a folded content-length", post("Content-Length: 0\r\n 5\r\n", "abcde"), Want::Refused, false),
        // Chunk sizes and extensions.
        case(
            "a chunk size with a trailing space",
            post("Transfer-Encoding: chunked\r\n", &format!("3 \r\nabc\r\n0\r\n\r\n{next}")),
            Want::Either(2),
            true,
        ),
        case(
            "a chunk size with a trailing tab",
            post("Transfer-Encoding: chunked\r\n", &format!("3\t\r\nabc\r\n0\r\n\r\n{next}")),
            Want::Either(2),
            true,
        ),
        case(
            "a chunk extension with a NUL",
            post("Transfer-Encoding: chunked\r\n", &format!("3;\0\r\nabc\r\n0\r\n\r\n{next}")),
            Want::Either(2),
            true,
        ),
        case(
            "a chunk extension",
            post("Transfer-Encoding: chunked\r\n", &format!("3;a=b\r\nabc\r\n0;x\r\n\r\n{next}")),
            Want::Served(2),
            true,
        ),
        case(
            "a chunk extension hiding a request",
            post(
                "Transfer-Encoding: chunked\r\n",
                &format!("3;{}\r\nabc\r\n0\r\n\r\n", HIDDEN.replace("\r\n", " ")),
            ),
            Want::Either(1),
            true,
        ),
        case(
            "a long chunk extension",
            post("Transfer-Encoding: chunked\r\n", &format!("3;{}\r\nabc\r\n0\r\n\r\n", "e".repeat(20_000))),
            Want::Refused,
            false,
        ),
        case(
            "an overflowing chunk size",
            post("Transfer-Encoding: chunked\r\n", "1000000000000000000000003\r\nabc\r\n0\r\n\r\n"),
            Want::Refused,
            false,
        ),
        case(
            "a 0x chunk size",
            post("Transfer-Encoding: chunked\r\n", "0x3\r\nabc\r\n0\r\n\r\n"),
            Want::Refused,
            false,
        ),
        case(
            "a negative chunk size",
            post("Transfer-Encoding: chunked\r\n", "-3\r\nabc\r\n0\r\n\r\n"),
            Want::Refused,
            false,
        ),
        case(
            "chunk data longer than its size",
            post("Transfer-Encoding: chunked\r\n", &format!("3\r\nabcdef\r\n0\r\n\r\n{HIDDEN}")),
            Want::Refused,
            true,
        ),
        // Trailers.
        case(
            "trailers, pipelined",
            post(
                "Transfer-Encoding: chunked\r\n",
                &format!("5\r\nhello\r\n0\r\nX-T: 1\r\nX-Checksum: abc\r\n\r\n{next}"),
            ),
            Want::Served(2),
            true,
        ),
        case(
            "a trailer with a NUL",
            post("Transfer-Encoding: chunked\r\n", "5\r\nhello\r\n0\r\nX-T: a\0b\r\n\r\n"),
            Want::Refused,
            true,
        ),
        case(
            "a folded trailer",
            post("Transfer-Encoding: chunked\r\n", "5\r\nhello\r\n0\r\nX-T: a\r\n b\r\n\r\n"),
            Want::Refused,
            true,
        ),
        case(
            "a content-length trailer",
            post(
                "Transfer-Encoding: chunked\r\n",
                &format!("5\r\nhello\r\n0\r\nContent-Length: 70\r\n\r\n{next}"),
            ),
            Want::Either(2),
            true,
        ),
        // Pipelining behind an ordinary body.
        case(
            "pipelined after a length",
            format!("{}{next}", post("Content-Length: 5\r\n", "hello")),
            Want::Served(2),
            true,
        ),
        // HTTP/1.0 with chunked framing (RFC 9112 §6.1: faulty framing).
        case(
            "HTTP/1.0 with chunked",
            format!(
                "POST {{T}}/carrier HTTP/1.0\r\nHost: app\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n{HIDDEN}"
            ),
            Want::Either(1),
            false,
        ),
    ]
}

/// One way of sending a case: its bytes (tagged) and where they are split.
struct Run {
    case: usize,
    tag: String,
    writes: Vec<Vec<u8>>,
}

fn runs(cases: &[Case]) -> Vec<Run> {
    let mut runs = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let mut n = 0;
        let mut tagged = || {
            n += 1;
            let tag = format!("/c{i}v{n}");
            let bytes = String::from_utf8_lossy(&c.bytes).replace("{T}", &tag).into_bytes();
            (tag, bytes)
        };
        let (tag, bytes) = tagged();
        runs.push(Run { case: i, tag, writes: vec![bytes] });
        if c.split_body {
            let (_, probe) = tagged();
            let head_end = probe.windows(4).position(|w| w == b"\r\n\r\n").expect("a head") + 4;
            for at in head_end + 1..probe.len() {
                let (tag, bytes) = tagged();
                let shift = bytes.len() - probe.len();
                let at = at + shift;
                runs.push(Run { case: i, tag, writes: vec![bytes[..at].to_vec(), bytes[at..].to_vec()] });
            }
        }
    }
    runs
}

/// Plays one run: how many responses the client got, or `Err` saying what
/// it got that it should not have.
fn play(proxy: SocketAddr, run: &Run, want: Want) -> Result<usize, String> {
    let mut s = TcpStream::connect(proxy).map_err(|e| format!("connect: {e}"))?;
    s.set_nodelay(true).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(3))).map_err(|e| e.to_string())?;
    for (i, w) in run.writes.iter().enumerate() {
        if i > 0 {
            // A read of its own on the proxy's side.
            std::thread::sleep(Duration::from_millis(3));
        }
        if s.write_all(w).is_err() {
            break;
        }
    }
    let most = match want {
        Want::Served(n) | Want::Either(n) => n,
        Want::Refused => 1,
    };
    let mut statuses = Vec::new();
    while statuses.len() < most {
        match read_reply(&mut s) {
            Ok(reply) => statuses.push(reply.status),
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                return Err(format!("left hanging after {statuses:?}"));
            }
            Err(_) => break,
        }
    }
    let refused = |st: &[u16]| st.len() == 1 && (st[0] == 400 || st[0] == 501);
    let mut closed = || {
        let mut byte = [0u8; 1];
        match s.read(&mut byte) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
        }
    };
    match want {
        Want::Served(n) if statuses == vec![200; n] => Ok(n),
        Want::Refused if refused(&statuses) && closed() => Ok(1),
        Want::Either(n) if statuses == vec![200; n] => Ok(n),
        Want::Either(_) if statuses.last().is_some_and(|&s| s == 400 || s == 501) && closed() => {
            Ok(statuses.len())
        }
        _ => Err(format!("answered {statuses:?}, wanted {want:?}")),
    }
}

/// What limiter's access log says it forwarded, by tag: (method, path).
fn forwarded(log: &str) -> Vec<(String, String)> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| !v["upstream_ms"].is_null())
        .map(|v| (v["method"].as_str().unwrap_or("").to_owned(), v["path"].as_str().unwrap_or("").to_owned()))
        .collect()
}

fn tag_of(target: &str) -> &str {
    let rest = target.strip_prefix('/').unwrap_or(target);
    let end = rest.find('/').map_or(target.len(), |i| i + 1);
    &target[..end]
}

/// Plays every case through `proxy` in front of an upstream whose served
/// requests `served` lists; fails with every case that went wrong.
fn judge(proxy: &InProcess, log: &std::path::Path, served: &dyn Fn() -> Vec<(String, String, String)>) {
    let cases = cases();
    let runs = runs(&cases);
    let mut failures = Vec::new();
    let mut answered = 0;
    for run in &runs {
        match play(proxy.proxy, run, cases[run.case].want) {
            Ok(n) => answered += n,
            Err(e) => failures.push(format!(
                "{} ({}, {} writes): {e}",
                cases[run.case].name,
                run.tag,
                run.writes.len()
            )),
        }
    }
    // The last request: once the upstream served it and the log shows it,
    // whatever the cases made either do has been done.
    let last = proxy.get("/last/request", &[]);
    assert_eq!(last.status, 200, "the last request: {}", last.text());
    wait_for("the upstream to serve the last request", Duration::from_secs(10), || {
        served().iter().any(|(_, t, _)| t == "/last/request")
    });
    wait_for("the access log to show the last request", Duration::from_secs(10), || {
        std::fs::read_to_string(log).is_ok_and(|l| l.contains("/last/request"))
    });
    let mut upstream: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for (method, target, xff) in served() {
        if xff.contains("6.6.6.6") {
            failures.push(format!(
                "{method} {target} reached the upstream with a forged X-Forwarded-For ({xff})"
            ));
        }
        upstream.entry(tag_of(&target).to_owned()).or_default().push((method, target));
    }
    let mut logged: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for (method, path) in forwarded(&std::fs::read_to_string(log).expect("the access log")) {
        logged.entry(tag_of(&path).to_owned()).or_default().push((method, path));
    }
    for run in &runs {
        let mut got = upstream.remove(&run.tag).unwrap_or_default();
        let mut said = logged.remove(&run.tag).unwrap_or_default();
        got.sort();
        said.sort();
        if got != said {
            failures.push(format!(
                "{} ({}, {} writes): the upstream served {got:?}, limiter's access log shows {said:?}",
                cases[run.case].name,
                run.tag,
                run.writes.len()
            ));
        }
    }
    upstream.remove("/last");
    // Every answer a client got, refusals as the head was read included,
    // has its line (and no request has two).
    let lines = std::fs::read_to_string(log).expect("the access log").lines().count() - 1;
    assert_eq!(lines, answered, "the access log's lines against the answers the clients got");
    assert!(upstream.is_empty(), "the upstream served requests of no case: {upstream:?}");
    assert!(
        failures.is_empty(),
        "{} of {} runs went wrong:\n{}",
        failures.len(),
        runs.len(),
        failures.join("\n")
    );
}

fn daemon(upstream: SocketAddr, log: &std::path::Path) -> InProcess {
    InProcess::start(upstream, &format!("http.accessLog = {}\nhttp.maxThreads = 40\n", log.display()))
}

#[test]
fn nothing_smuggled_reaches_a_lenient_upstream_and_every_forwarded_byte_reads_one_way() {
    let capture = wire::Capture::start();
    let dir = std::env::temp_dir().join(format!("limiter-smuggling-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("capture.log");
    let proxy = daemon(capture.addr, &log);
    let served = || {
        capture
            .served()
            .into_iter()
            .map(|m| {
                let xff = String::from_utf8_lossy(m.header("x-forwarded-for").unwrap_or(b"-")).into_owned();
                (m.method, m.target, xff)
            })
            .collect()
    };
    judge(&proxy, &log, &served);
    // Every byte limiter sent reads the same under both readers.
    for (i, stream) in capture.streams().iter().enumerate() {
        let (strict, lenient) = (wire::strict(stream), wire::lenient(stream));
        assert_eq!(
            strict.messages, lenient.messages,
            "upstream connection {i}: the strict and the lenient reader disagree on what limiter sent"
        );
        assert!(
            strict.stopped.is_none() || strict.stopped.as_deref() == Some("incomplete"),
            "upstream connection {i}: the strict reader refused what limiter sent: {:?}",
            strict.stopped
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "needs Debian's jetty9 and a JDK (set-up installs them): run by cargo xtask test"]
fn nothing_smuggled_reaches_jetty() {
    let jetty = Jetty::start(40);
    let dir = std::env::temp_dir().join(format!("limiter-smuggling-jetty-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("jetty.log");
    let proxy = daemon(jetty.addr, &log);
    let served = || jetty.served().into_iter().map(|s| (s.method, s.target, s.forwarded_for)).collect();
    judge(&proxy, &log, &served);
    let _ = std::fs::remove_dir_all(&dir);
}
