//! The HTTP admission proxy, end to end: the real daemon (without its
//! kernel gate), an upstream written for the tests, raw client sockets.

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use limiter_tests::{
    Daemon,
    client::{self, Reply, closed_by_server, connect, get, read_reply, send},
    process::wait_for,
    upstream::Upstream,
};

struct Setup {
    daemon: Daemon,
    proxy: SocketAddr,
    upstream: Upstream,
    _dir: TempDir,
}

struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

fn setup(extra: &str) -> Setup {
    let upstream = Upstream::start();
    let dir = std::env::temp_dir().join(format!(
        "lh-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let (config, proxy) = client::http_config(&dir, Some(upstream.addr), extra);
    let daemon = Daemon::start(&config, &[]).expect("daemon starts");
    Setup { daemon, proxy, upstream, _dir: TempDir(dir) }
}

impl Setup {
    /// A metric's value (first sample whose line starts with `prefix`).
    fn metric(&self, sample: &str) -> f64 {
        self.daemon.metric(sample)
    }

    /// Waits until every pool is back to zero (permits are returned when
    /// the response body ends, just after the client has read it).
    fn assert_pools_empty(&self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let (n, d, w, s) = (
                self.metric("limiter_http_in_flight{pool=\"normal\"}"),
                self.metric("limiter_http_in_flight{pool=\"debug\"}"),
                self.metric("limiter_http_in_flight{pool=\"web\"}"),
                self.metric("limiter_http_sessions "),
            );
            if (n, d, w, s) == (0.0, 0.0, 0.0, 0.0) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "pools not empty: normal {n}, debug {d}, web {w}, sessions {s}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Lets every held request answer (each with 200), then waits for
    /// the pools to empty.
    fn release_all(&self, held: impl IntoIterator<Item = JoinHandle<Reply>>) {
        self.upstream.release();
        for h in held {
            assert_eq!(h.join().unwrap().status, 200);
        }
        self.assert_pools_empty();
    }

    fn spawn_get(&self, path: &str, headers: &[&str]) -> JoinHandle<Reply> {
        let (addr, path) = (self.proxy, path.to_owned());
        let headers: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
        std::thread::spawn(move || {
            let refs: Vec<&str> = headers.iter().map(String::as_str).collect();
            get(addr, &path, &refs)
        })
    }
}

fn assert_503(reply: &Reply, reason: &str) {
    assert_eq!(reply.status, 503, "{reply:?}");
    assert_eq!(reply.header("connection"), Some("close"), "{reply:?}");
    assert!(reply.header("retry-after").is_some_and(|v| v.parse::<u64>().is_ok()), "{reply:?}");
    assert_eq!(reply.header("x-limiter-refused"), Some(reason), "{reply:?}");
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn a_full_pool_answers_503_at_once_without_reaching_the_upstream() {
    let s = setup("http.maxThreads = 20\n");
    let held: Vec<_> = (0..9).map(|_| s.spawn_get("/hold", &[])).collect();
    s.upstream.wait_holding(9);
    let started = Instant::now();
    let reply = get(s.proxy, "/other", &[]);
    let elapsed = started.elapsed();
    assert_503(&reply, "normal");
    assert!(elapsed < Duration::from_millis(500), "503 took {elapsed:?}");
    assert_eq!(s.upstream.hits(), 9, "the refused request reached the upstream");
    assert_eq!(s.metric("limiter_http_refused_total{reason=\"normal\"}"), 1.0);
    assert_eq!(s.metric("limiter_http_pool_limit{pool=\"normal\"}"), 9.0);
    s.upstream.release();
    for h in held {
        assert_eq!(h.join().unwrap().status, 200);
    }
    s.assert_pools_empty();
    // Time-to-503 is in the daemon's own histogram.
    assert_eq!(s.metric("limiter_http_time_to_503_seconds_count"), 1.0);
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn debug_requests_use_reserved_slots_then_free_normal_ones() {
    let s = setup("http.maxThreads = 13\nhttp.maxSessionConnections = 1\n");
    // Fill the normal pool (2).
    let normal: Vec<_> = (0..2).map(|_| s.spawn_get("/hold", &[])).collect();
    s.upstream.wait_holding(2);
    assert_503(&get(s.proxy, "/x", &[]), "normal");
    // Three /debug/ requests still get through, one of them from a session
    // at its limit... (the session holds one normal slot below)
    let debug: Vec<_> = (0..3).map(|_| s.spawn_get("/debug/hold", &["Authorization: Bearer busy"])).collect();
    s.upstream.wait_holding(5);
    // ...a fourth finds neither a reserved nor a normal slot.
    assert_503(&get(s.proxy, "/debug/x", &[]), "debug");
    // Free every normal slot: the fourth /debug/ takes a normal one.
    s.upstream.release();
    for h in normal.into_iter().chain(debug) {
        assert_eq!(h.join().unwrap().status, 200);
    }
    s.assert_pools_empty();
    let d4 = s.spawn_get("/debug/hold", &[]);
    let more: Vec<_> = (0..3).map(|_| s.spawn_get("/debug/hold", &[])).collect();
    s.upstream.wait_holding(4);
    assert_eq!(s.metric("limiter_http_in_flight{pool=\"debug\"}"), 3.0);
    assert_eq!(s.metric("limiter_http_in_flight{pool=\"normal\"}"), 1.0);
    s.upstream.release();
    for h in more.into_iter().chain([d4]) {
        assert_eq!(h.join().unwrap().status, 200);
    }
    // A session at its limit still reaches /debug/.
    let busy = s.spawn_get("/hold", &["Authorization: Bearer busy"]);
    s.upstream.wait_holding(1);
    assert_503(&get(s.proxy, "/x", &["Authorization: Bearer busy"]), "session");
    assert_eq!(get(s.proxy, "/debug/status", &["Authorization: Bearer busy"]).status, 200);
    s.upstream.release();
    assert_eq!(busy.join().unwrap().status, 200);
    s.assert_pools_empty();
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn session_and_web_limits_count_exactly_and_name_the_first_failing_check() {
    let s = setup("http.maxSessionConnections = 2\nhttp.maxWebConnections = 3\n");
    let a: Vec<_> = (0..2).map(|_| s.spawn_get("/hold", &["Authorization: Bearer alice"])).collect();
    s.upstream.wait_holding(2);
    assert_503(&get(s.proxy, "/x", &["Authorization: Bearer alice"]), "session");
    // Another session is independent.
    let b = s.spawn_get("/hold", &["Authorization: Bearer bob"]);
    s.upstream.wait_holding(3);
    // Web clients: three in flight, the fourth refused.
    let w: Vec<_> = (0..3).map(|i| s.spawn_get("/hold", &[&format!("X-Client-Id: vue-{i}")])).collect();
    s.upstream.wait_holding(6);
    assert_503(&get(s.proxy, "/x", &["X-Client-Id: vue-9"]), "web");
    // Both limits fail: the web check comes first.
    assert_503(&get(s.proxy, "/x", &["X-Client-Id: vue-9", "Authorization: Bearer alice"]), "web");
    assert_eq!(s.metric("limiter_http_sessions "), 2.0);
    assert_eq!(s.metric("limiter_http_refused_total{reason=\"web\"}"), 2.0);
    assert_eq!(s.metric("limiter_http_refused_total{reason=\"session\"}"), 1.0);
    assert_eq!(s.upstream.hits(), 6);
    s.upstream.release();
    for h in a.into_iter().chain([b]).chain(w) {
        assert_eq!(h.join().unwrap().status, 200);
    }
    s.assert_pools_empty();
}

/// Waits until the proxy has closed its socket for good: a write from the
/// client draws a RST, so a later one fails. `within` is well inside the
/// default `http.lingerMs` (2 s), so a lingering socket fails the test.
fn wait_fully_closed(stream: &mut std::net::TcpStream, within: Duration, what: &str) {
    limiter_tests::process::wait_for(what, within, || stream.write_all(b"x").is_err());
}

/// Whether the proxy still reads what the client sends: a write, then,
/// after the time a RST would take to come back, another one succeeds.
fn still_reading(stream: &mut std::net::TcpStream) -> bool {
    let first = stream.write_all(b"x");
    // The window for a RST to come back over loopback: what is asked is
    // whether one comes.
    std::thread::sleep(Duration::from_millis(100));
    first.is_ok() && stream.write_all(b"x").is_ok()
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn a_503_to_requests_read_whole_closes_at_once_and_arrives_intact() {
    // No lingering when nothing of the client's is unread (nginx's
    // `lingering_close on`); the 503 still arrives whole, even with a
    // second request pipelined behind the refused one.
    let s = setup("http.maxThreads = 12\n");
    let held = s.spawn_get("/hold", &[]);
    s.upstream.wait_holding(1);
    for requests in [
        &b"GET /a HTTP/1.1\r\nHost: t\r\n\r\n"[..],
        b"GET /a HTTP/1.1\r\nHost: t\r\n\r\nGET /b HTTP/1.1\r\nHost: t\r\n\r\n",
    ] {
        let mut stream = connect(s.proxy);
        stream.write_all(requests).unwrap();
        let reply = read_reply(&mut stream).expect("the 503 is readable, not reset");
        assert_503(&reply, "normal");
        assert!(closed_by_server(&mut stream), "the connection stays open after a 503");
        wait_fully_closed(
            &mut stream,
            Duration::from_millis(500),
            "the socket closed for good after a 503 with nothing unread, not lingering",
        );
    }
    // A body it did not read: the proxy lingers, reading what still comes.
    let mut stream = connect(s.proxy);
    stream.write_all(b"POST /u HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\n").unwrap();
    assert_503(&read_reply(&mut stream).expect("a 503"), "normal");
    // Pacing: asked 300 ms into the 2 s linger, not at its start.
    std::thread::sleep(Duration::from_millis(300));
    assert!(still_reading(&mut stream), "the proxy did not linger behind an unread body");
    assert_eq!(s.upstream.hits(), 1);
    s.upstream.release();
    assert_eq!(held.join().unwrap().status, 200);
    s.assert_pools_empty();
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn the_503_arrives_intact_after_an_unread_1mb_post() {
    let s = setup("http.maxThreads = 12\n");
    let held = s.spawn_get("/hold", &[]);
    s.upstream.wait_holding(1);
    let mut stream = connect(s.proxy);
    let body = vec![b'a'; 1 << 20];
    let head = format!("POST /upload HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n", body.len());
    let mut writer = stream.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        let _ = writer.write_all(head.as_bytes());
        let _ = writer.write_all(&body);
    });
    let reply = read_reply(&mut stream).expect("the 503 is readable, not reset");
    assert_503(&reply, "normal");
    assert_eq!(reply.text(), "503 Service Unavailable: the server is at its request limit\n");
    assert!(closed_by_server(&mut stream), "the connection stays open after a 503");
    sender.join().unwrap();
    assert_eq!(s.upstream.hits(), 1);
    s.upstream.release();
    held.join().unwrap();
    s.assert_pools_empty();
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn client_aborts_keep_their_permits_until_the_upstream_is_done() {
    let s = setup("http.maxThreads = 15\n");
    // Gone while the upstream has not answered yet: the upstream still
    // works on it, so its permit stays taken.
    let mut waiting = connect(s.proxy);
    waiting.write_all(b"GET /hold HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    s.upstream.wait_holding(1);
    drop(waiting);
    // Gone in the middle of a 100 MB response: the rest is read in the
    // background to its end (the upstream is done then), and the permit
    // goes back.
    let mut reading = connect(s.proxy);
    reading.write_all(b"GET /big?bytes=104857600 HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    let mut some = [0u8; 65536];
    reading.read_exact(&mut some).unwrap();
    socket2::SockRef::from(&reading).set_linger(Some(Duration::ZERO)).unwrap();
    drop(reading);
    // Gone in the middle of the request body: the upstream connection is
    // half-closed under the upload (the upstream's read ends), the upstream
    // answers or closes, and the permit goes back.
    let mut uploading = connect(s.proxy);
    uploading.write_all(b"POST /sink HTTP/1.1\r\nHost: t\r\nContent-Length: 1000000\r\n\r\n").unwrap();
    uploading.write_all(&[b'x'; 1000]).unwrap();
    wait_for("the upload reaching the upstream", Duration::from_secs(5), || s.upstream.hits() >= 3);
    socket2::SockRef::from(&uploading).set_linger(Some(Duration::ZERO)).unwrap();
    drop(uploading);
    // The download's and the upload's permits come back; the held
    // request's does not while the upstream holds it.
    wait_for("the download's and the upload's permits back", Duration::from_secs(5), || {
        s.metric("limiter_http_in_flight{pool=\"normal\"}") == 1.0
    });
    wait_for("the upload counted as a client body error", Duration::from_secs(5), || {
        s.metric("limiter_http_bad_requests_total{kind=\"body\"}") >= 1.0
    });
    assert_eq!(
        s.metric("limiter_http_in_flight{pool=\"normal\"}"),
        1.0,
        "the held request's permit went back early"
    );
    s.upstream.release();
    s.assert_pools_empty();
    // None of these was the upstream's fault: no breaker result, no reset.
    assert_eq!(s.metric("limiter_breaker_window_error_ratio"), 0.0);
    assert_eq!(s.metric("limiter_http_upstream_errors_total{kind=\"reset\"}"), 0.0);
    // The pool is whole again: all four slots fit.
    let held: Vec<_> = (0..4).map(|_| s.spawn_get("/hold", &[])).collect();
    s.upstream.wait_holding(4);
    s.upstream.release();
    for h in held {
        assert_eq!(h.join().unwrap().status, 200);
    }
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn ten_thousand_sessions_leave_no_entries_and_tokens_never_show() {
    let s = setup("http.maxSessionConnections = 1\n");
    let mut stream = connect(s.proxy);
    for i in 0..10_000 {
        let req = format!("GET / HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer secret-token-{i:05}\r\n\r\n");
        stream.write_all(req.as_bytes()).unwrap();
        assert_eq!(read_reply(&mut stream).unwrap().status, 200);
    }
    s.assert_pools_empty();
    assert_eq!(s.metric("limiter_http_admitted_total{pool=\"normal\"}"), 10_000.0);
    // Respelled tokens and a repeated Authorization (refused, and logged at
    // debug level) do not show either.
    for auth in ["bearer  secret-token-00001", "BEARER secret-token-00002 "] {
        assert_eq!(get(s.proxy, "/", &[&format!("Authorization: {auth}")]).status, 200);
    }
    assert_refused_head(
        &s,
        b"GET / HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer secret-token-a\r\nAuthorization: Bearer secret-token-b\r\n\r\n",
        400,
        "400 Bad Request: more than one Authorization header\n",
    );
    assert_eq!(s.metric("limiter_http_bad_requests_total{kind=\"authorization\"}"), 1.0);
    let metrics = s.daemon.metrics();
    let status = s.daemon.admin_get("/status").unwrap();
    let dump = limiter_tests::limiter(&["dump", "--json", "--config", s.daemon.config.to_str().unwrap()]);
    let dump = String::from_utf8_lossy(&dump.stdout).into_owned();
    assert!(dump.contains("\"running\": true"), "{dump}");
    for (what, text) in
        [("metrics", &metrics), ("status", &status), ("dump", &dump), ("log", &s.daemon.log())]
    {
        assert!(!text.contains("secret-token"), "a session token appears in the {what}");
    }
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn streaming_256_mb_each_way_keeps_the_daemon_small() {
    let s = setup("");
    const SIZE: u64 = 256 << 20;
    // Upload.
    let mut up = connect(s.proxy);
    up.write_all(format!("POST /sink HTTP/1.1\r\nHost: t\r\nContent-Length: {SIZE}\r\n\r\n").as_bytes())
        .unwrap();
    let chunk = vec![b'u'; 1 << 20];
    for _ in 0..(SIZE >> 20) {
        up.write_all(&chunk).unwrap();
    }
    let reply = read_reply(&mut up).unwrap();
    assert_eq!((reply.status, reply.text()), (200, format!("{SIZE}\n")));
    // Download, counted without keeping it.
    let mut down = connect(s.proxy);
    down.write_all(format!("GET /big?bytes={SIZE} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes()).unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        down.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    let mut got = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    while got < SIZE {
        let n = down.read(&mut buf).unwrap();
        assert!(n > 0, "download ended at {got} bytes");
        got += n as u64;
    }
    assert_eq!(got, SIZE);
    let status = std::fs::read_to_string(format!("/proc/{}/status", s.daemon.pid())).unwrap();
    let peak_kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    eprintln!("daemon peak RSS after 256 MB up and 256 MB down: {} MB", peak_kb / 1024);
    assert!(peak_kb < 64 * 1024, "peak RSS {peak_kb} kB");
    s.assert_pools_empty();
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn slow_headers_are_cut_off_and_take_no_permit() {
    let s = setup("http.headerReadTimeoutMs = 500\nhttp.maxThreads = 12\n");
    let mut slow = connect(s.proxy);
    slow.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nX-Slow:").unwrap();
    // While it dawdles, the one normal slot is free for others.
    assert_eq!(get(s.proxy, "/", &[]).status, 200);
    let started = Instant::now();
    let mut rest = Vec::new();
    let _ = slow.read_to_end(&mut rest);
    let waited = started.elapsed();
    assert!(waited < Duration::from_secs(3), "the slow client was held {waited:?}");
    // Counted as its connection's task ends, just after the close.
    limiter_tests::process::wait_for("the header timeout counted", Duration::from_secs(2), || {
        s.metric("limiter_http_bad_requests_total{kind=\"header_timeout\"}") >= 1.0
    });
    assert_eq!(s.metric("limiter_http_bad_requests_total{kind=\"header_timeout\"}"), 1.0);
    assert_eq!(s.upstream.hits(), 1);
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn upstream_failures_are_502_and_504() {
    // Timeout: the upstream's head comes too late.
    let s = setup("http.upstreamTimeoutMs = 300\n");
    let reply = get(s.proxy, "/slowhead?ms=3000", &[]);
    assert_eq!(reply.status, 504, "{reply:?}");
    assert_eq!(s.metric("limiter_http_upstream_errors_total{kind=\"timeout\"}"), 1.0);
    s.assert_pools_empty();

    // Connect failure: nothing listens on the upstream port.
    let dead = TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_addr = dead.local_addr().unwrap();
    drop(dead);
    let dir = std::env::temp_dir().join(format!("lh-dead-{}", std::process::id()));
    let (config, proxy) = client::http_config(&dir, Some(dead_addr), "");
    let d = Daemon::start(&config, &[]).unwrap();
    assert_eq!(get(proxy, "/", &[]).status, 502);
    assert!(d.metrics().contains("limiter_http_upstream_errors_total{kind=\"connect\"} 1"));

    // Reset: an upstream that reads the request and resets the connection.
    let rst = TcpListener::bind("127.0.0.1:0").unwrap();
    let rst_addr = rst.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in rst.incoming().flatten() {
            let mut conn = conn;
            let mut buf = [0u8; 1024];
            let _ = conn.read(&mut buf);
            socket2::SockRef::from(&conn).set_linger(Some(Duration::ZERO)).unwrap();
        }
    });
    let (config, proxy) = client::http_config(&dir.join("rst"), Some(rst_addr), "");
    let d = Daemon::start(&config, &[]).unwrap();
    assert_eq!(get(proxy, "/", &[]).status, 502);
    assert!(d.metrics().contains("limiter_http_upstream_errors_total{kind=\"reset\"} 1"));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn malformed_oversized_and_smuggling_requests_are_refused_before_admission() {
    let s = setup("http.maxHeaderBytes = 8192\n");
    let bad = send(s.proxy, b"GET / HTTP/1.1\r\nHost: t\r\nBad Header Name: x\r\n\r\n").unwrap();
    assert_eq!(bad.status, 400);
    let garbage = send(s.proxy, b"\x16\x03\x01 not http at all\r\n\r\n").unwrap();
    assert_eq!(garbage.status, 400);
    let big = format!("GET / HTTP/1.1\r\nHost: t\r\nX-Big: {}\r\n\r\n", "b".repeat(20_000));
    let mut stream = connect(s.proxy);
    let _ = stream.write_all(big.as_bytes());
    assert_eq!(read_reply(&mut stream).unwrap().status, 431);
    for smuggle in [
        &b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"[..],
        &b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n"[..],
    ] {
        assert_eq!(send(s.proxy, smuggle).unwrap().status, 400);
    }
    // A conflicting request hidden behind an honest one on the same connection.
    let pipelined = b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\n\r\nabcdPOST /b HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
    let mut stream = connect(s.proxy);
    stream.write_all(pipelined).unwrap();
    assert_eq!(read_reply(&mut stream).unwrap().status, 200);
    assert_eq!(read_reply(&mut stream).unwrap().status, 400);
    // An Upgrade header that asks for no upgrade (no `Connection: upgrade`)
    // changes nothing: the next head is read, and refused.
    let mut stream = connect(s.proxy);
    stream.write_all(b"GET /up HTTP/1.1\r\nHost: t\r\nUpgrade: x\r\n\r\nPOST /b HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n").unwrap();
    assert_eq!(read_reply(&mut stream).unwrap().status, 200);
    assert_eq!(read_reply(&mut stream).unwrap().status, 400);
    assert!(closed_by_server(&mut stream), "the connection stayed open after a refused head");
    assert_eq!(s.upstream.hits(), 2, "only the honest requests may reach the upstream");
    assert_eq!(s.metric("limiter_http_bad_requests_total{kind=\"framing_conflict\"}"), 4.0);
    assert_eq!(s.metric("limiter_http_admitted_total{pool=\"normal\"}"), 2.0);
    s.assert_pools_empty();
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn a_bare_lf_in_the_chunked_framing_fails_the_body_and_nothing_goes_on() {
    let s = setup("");
    // A bare LF after the last chunk, or ending a trailer line: read one
    // way by a lenient upstream (the trailers end there, the next head
    // starts) and another by a strict one. limiter reads neither way: the
    // body fails, 400, the connection closes, nothing is forwarded.
    let smuggled =
        "POST /smuggled HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n";
    for trailers in ["0\r\n\n", "0\r\nX-T: 1\n\r\n"] {
        let raw = format!(
            "POST /sink HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n{trailers}\
             GET / HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n{smuggled}0\r\n\r\n",
            smuggled.len()
        );
        let mut stream = connect(s.proxy);
        stream.write_all(raw.as_bytes()).unwrap();
        assert_eq!(read_reply(&mut stream).unwrap().status, 400, "{raw:?}");
        assert!(closed_by_server(&mut stream), "{raw:?}: the connection stayed open");
    }
    assert_eq!(s.upstream.hits(), 0, "a request reached the upstream");
    assert_eq!(s.metric("limiter_http_bad_requests_total{kind=\"body\"}"), 2.0);
    s.assert_pools_empty();
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn hop_by_hop_headers_go_and_forwarding_headers_come() {
    let s = setup("");
    let reply = get(
        s.proxy,
        "/headers?q=1",
        &[
            "Connection: keep-alive, X-Private",
            "X-Private: secret",
            "Keep-Alive: timeout=5",
            "TE: trailers",
            "Proxy-Authorization: Basic abc",
            "X-Forwarded-For: 10.1.2.3",
            "Authorization: Bearer kept",
        ],
    );
    assert_eq!(reply.status, 200);
    let seen = reply.text().to_ascii_lowercase();
    assert!(seen.starts_with("get /headers?q=1 http/1.1"), "{seen}");
    for gone in ["x-private", "keep-alive", "\nte:", "proxy-authorization", "connection: keep-alive"] {
        assert!(!seen.contains(gone), "`{gone}` reached the upstream:\n{seen}");
    }
    // The client is not a trusted forwarder: its chain is replaced.
    assert!(seen.contains("x-forwarded-for: 127.0.0.1\n") && !seen.contains("10.1.2.3"), "{seen}");
    assert!(seen.contains("forwarded: for=127.0.0.1;proto=http;host=\"test\""), "{seen}");
    assert!(seen.contains("host: test"), "{seen}");
    assert!(seen.contains("authorization: bearer kept"), "{seen}");
}

/// Sends `raw` on a new connection: the one response, and whether the
/// proxy closed the connection after it.
fn send_and_close(s: &Setup, raw: &[u8]) -> (Reply, bool) {
    let mut stream = connect(s.proxy);
    stream.write_all(raw).unwrap();
    let reply = read_reply(&mut stream).expect("a response");
    (reply, closed_by_server(&mut stream))
}

/// A daemon whose one normal slot is held: a refusal other than a 503
/// then shows that a check came before admission and cost no slot.
fn setup_with_the_pool_full() -> (Setup, JoinHandle<Reply>) {
    let s = setup("http.maxThreads = 12\n");
    let held = s.spawn_get("/hold", &[]);
    s.upstream.wait_holding(1);
    (s, held)
}

/// Sends `raw` and asserts the proxy's own refusal of its head: `status`
/// with `text`, `Connection: close`, and the connection closed after it.
fn assert_refused_head(s: &Setup, raw: &[u8], status: u16, text: &str) {
    let shown = String::from_utf8_lossy(raw);
    let (reply, closed) = send_and_close(s, raw);
    assert_eq!((reply.status, reply.text().as_str()), (status, text), "{shown}: {reply:?}");
    assert_eq!(reply.header("connection"), Some("close"), "{shown}");
    assert!(closed, "{shown}: the connection stayed open");
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn a_debug_path_the_upstream_resolves_elsewhere_is_a_normal_request() {
    let s = setup("http.maxThreads = 13\nhttp.maxSessionConnections = 1\n");
    // Forwarded byte for byte, whatever the classification.
    for path in ["/debug/..;/api", "/debug/..;v=1/api", "/debug/%2e%2e/api", "/debug/x%2fy", "/debug/%zz"] {
        let seen = get(s.proxy, &format!("{path}/headers"), &[]).text();
        assert!(seen.starts_with(&format!("GET {path}/headers HTTP/1.1")), "not forwarded as sent:\n{seen}");
    }
    // Jetty, Tomcat and Spring serve this as /api: the session limit
    // applies to it, as to any normal request...
    let session = s.spawn_get("/hold", &["Authorization: Bearer busy"]);
    s.upstream.wait_holding(1);
    assert_503(&get(s.proxy, "/debug/..;/api", &["Authorization: Bearer busy"]), "session");
    // ...and with the normal pool full it is refused, never given a
    // reserved slot, while a real /debug/ request still gets one.
    let normal = s.spawn_get("/hold", &[]);
    s.upstream.wait_holding(2);
    for path in ["/debug/..;/api", "/debug/..;v=1/api", "/debug/%2e%2e/api", "/debug/..;/debug/../api"] {
        assert_503(&get(s.proxy, path, &[]), "normal");
    }
    assert_eq!(get(s.proxy, "/debug/x", &[]).status, 200);
    assert_eq!(s.metric("limiter_http_admitted_total{pool=\"debug\"}"), 1.0);
    assert_eq!(s.metric("limiter_http_refused_total{reason=\"normal\"}"), 4.0);
    s.release_all([session, normal]);
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn a_path_the_upstream_resolves_under_debug_takes_a_reserved_slot() {
    let (s, normal) = setup_with_the_pool_full();
    assert_503(&get(s.proxy, "/x", &[]), "normal");
    // The normal pool is full; these are /debug/x to the upstream.
    let debug: Vec<_> =
        ["/debug;v=1/hold", "/api/..;/debug/hold"].iter().map(|p| s.spawn_get(p, &[])).collect();
    s.upstream.wait_holding(3);
    assert_eq!(s.metric("limiter_http_in_flight{pool=\"debug\"}"), 2.0);
    assert_eq!(s.metric("limiter_http_in_flight{pool=\"normal\"}"), 1.0);
    // Forwarded byte for byte, parameters and dot-segments included.
    for path in ["/debug;v=1/headers", "/api/..;/debug/headers", "/debug/./x/headers"] {
        let reply = get(s.proxy, path, &[]);
        assert_eq!(reply.status, 200, "{path}: {reply:?}");
        assert!(reply.text().starts_with(&format!("GET {path} HTTP/1.1")), "{}", reply.text());
    }
    assert_eq!(s.metric("limiter_http_admitted_total{pool=\"debug\"}"), 5.0);
    s.release_all(debug.into_iter().chain([normal]));
}

/// [`limiter`]'s answer to a request whose authority is missing, invalid,
/// repeated or contradicted.
const BAD_AUTHORITY: &str = "400 Bad Request: the request's authority (Host, or the target's) is missing, invalid, repeated or contradicted\n";

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn a_forged_or_repeated_host_is_refused_before_admission() {
    let (s, held) = setup_with_the_pool_full();
    for raw in [
        &b"GET /headers HTTP/1.1\r\nHost: app\",for=6.6.6.6;host=\"app\r\n\r\n"[..],
        b"GET /headers HTTP/1.1\r\nHost: app\r\nHost: app\r\n\r\n",
        b"GET /headers HTTP/1.1\r\nHost: app\r\nX-A: 1\r\nHost: other\r\n\r\n",
        b"GET /headers HTTP/1.1\r\nHost: app example\r\n\r\n",
        b"GET /headers HTTP/1.1\r\nHost: app,for=6.6.6.6\r\n\r\n",
        b"GET /headers HTTP/1.1\r\nHost: [::1\r\n\r\n",
        b"GET /headers HTTP/1.1\r\nHost: app:99999\r\n\r\n",
        // HTTP/1.1 without Host (RFC 9112 §3.2), and a target whose
        // authority has userinfo.
        b"GET /headers HTTP/1.1\r\nAccept: */*\r\n\r\n",
        b"GET http://user:pw@app/headers HTTP/1.1\r\nHost: app\r\n\r\n",
    ] {
        assert_refused_head(&s, raw, 400, BAD_AUTHORITY);
    }
    // Targets the method cannot have: the authority form outside CONNECT,
    // `*` outside OPTIONS.
    for raw in [&b"GET app:80 HTTP/1.1\r\nHost: app\r\n\r\n"[..], b"GET * HTTP/1.1\r\nHost: app\r\n\r\n"] {
        assert_refused_head(&s, raw, 400, "400 Bad Request: this method cannot have this request target\n");
    }
    assert_eq!(s.upstream.hits(), 1, "a bad Host reached the upstream");
    assert_eq!(s.metric("limiter_http_bad_requests_total{kind=\"host\"}"), 9.0);
    assert_eq!(s.metric("limiter_http_bad_requests_total{kind=\"target\"}"), 2.0);
    assert_eq!(s.metric("limiter_http_refused_total{reason=\"normal\"}"), 0.0);
    assert_eq!(s.metric("limiter_http_responses_total{class=\"4xx\"}"), 11.0);
    s.release_all([held]);
}

/// Every forwarding header a client can send to pass as the proxy's word.
const SPOOFED: &[u8] = b"X-Forwarded-Proto: https\r\nForwarded: for=10.0.0.9;proto=https\r\n\
    Forwarded: for=10.0.0.8\r\nX-Forwarded-For: 10.0.0.9\r\nX-Forwarded-For: 10.0.0.8\r\n\
    X-Forwarded-Host: evil.example\r\nX-Forwarded-Port: 443\r\nX-Real-IP: 10.0.0.9\r\n\
    Client-IP: 10.0.0.9\r\nTrue-Client-IP: 10.0.0.9\r\nX-Original-URL: /admin\r\nX-Rewrite-URL: /admin\r\n";

/// The upstream's view of `GET /headers` with `Host: app.example:8080`
/// and [`SPOOFED`], as lines.
fn spoofed_request_seen(s: &Setup) -> String {
    let raw = [&b"GET /headers HTTP/1.1\r\nHost: app.example:8080\r\n"[..], SPOOFED, b"\r\n"].concat();
    let reply = send(s.proxy, &raw).unwrap();
    assert_eq!(reply.status, 200, "{reply:?}");
    reply.text()
}

fn assert_lines(seen: &str, want: &[String], gone: &[&str]) {
    let lines: Vec<&str> = seen.lines().collect();
    for want in want {
        assert!(lines.contains(&want.as_str()), "no `{want}` in\n{seen}");
        let name = want.split(':').next().unwrap();
        let count = lines.iter().filter(|l| l.split(':').next() == Some(name)).count();
        assert_eq!(count, 1, "`{name}` more than once:\n{seen}");
    }
    for gone in gone {
        assert!(
            !lines.iter().any(|l| l.starts_with(&format!("{gone}:"))),
            "`{gone}` reached the upstream:\n{seen}"
        );
    }
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn forwarding_headers_from_a_client_are_replaced_by_the_proxys_own() {
    let s = setup("");
    let port = s.proxy.port();
    assert_lines(
        &spoofed_request_seen(&s),
        &[
            "host: app.example:8080".into(),
            "x-forwarded-for: 127.0.0.1".into(),
            "forwarded: for=127.0.0.1;proto=http;host=\"app.example:8080\"".into(),
            "x-forwarded-proto: http".into(),
            "x-forwarded-host: app.example:8080".into(),
            format!("x-forwarded-port: {port}"),
        ],
        &["x-real-ip", "client-ip", "true-client-ip", "x-original-url", "x-rewrite-url"],
    );
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn a_trusted_forwarders_chain_is_extended_and_its_view_kept() {
    let s = setup("http.trustedForwarders = 127.0.0.0/8\n");
    assert_lines(
        &spoofed_request_seen(&s),
        &[
            "host: app.example:8080".into(),
            "x-forwarded-for: 10.0.0.9, 10.0.0.8, 127.0.0.1".into(),
            "forwarded: for=10.0.0.9;proto=https, for=10.0.0.8, for=127.0.0.1;proto=http;host=\"app.example:8080\""
                .into(),
            "x-forwarded-proto: https".into(),
            "x-forwarded-host: evil.example".into(),
            "x-forwarded-port: 443".into(),
            "x-real-ip: 10.0.0.9".into(),
        ],
        // Path overrides pass from no one.
        &["x-original-url", "x-rewrite-url"],
    );
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn an_absolute_target_names_the_host() {
    let s = setup("");
    // RFC 9112 §3.2.2: the target's authority wins over Host.
    let reply = send(s.proxy, b"GET http://app.example/headers HTTP/1.1\r\nHost: other\r\n\r\n").unwrap();
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_lines(&reply.text(), &["host: app.example".into(), "x-forwarded-host: app.example".into()], &[]);
    assert!(reply.text().starts_with("GET /headers HTTP/1.1"), "origin form upstream: {}", reply.text());
    // A fragment is no part of a target (RFC 9112 §3.2): it is dropped.
    let reply = send(s.proxy, b"GET /headers?q=1#frag HTTP/1.1\r\nHost: app\r\n\r\n").unwrap();
    assert!(reply.text().starts_with("GET /headers?q=1 HTTP/1.1\n"), "{}", reply.text());
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn forwarding_headers_quote_the_host() {
    let s = setup("");
    // An IPv6 literal is a valid Host, quoted whole.
    let reply = send(s.proxy, b"GET /headers HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n").unwrap();
    assert!(
        reply.text().contains("forwarded: for=127.0.0.1;proto=http;host=\"[::1]:8080\"\n"),
        "{}",
        reply.text()
    );
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn one_credential_is_one_session_however_its_scheme_is_spelled() {
    let s = setup("http.maxSessionConnections = 1\n");
    let held = s.spawn_get("/hold", &["Authorization: Bearer T"]);
    s.upstream.wait_holding(1);
    for same in ["bearer T", "BEARER T", "Bearer  T", "Bearer \t T", "Bearer T "] {
        assert_503(&get(s.proxy, "/x", &[&format!("Authorization: {same}")]), "session");
    }
    // Other credentials, another scheme: other sessions.
    for other in ["Bearer t", "Bearer T2", "Basic T"] {
        assert_eq!(get(s.proxy, "/x", &[&format!("Authorization: {other}")]).status, 200, "{other}");
    }
    // Two Authorization lines: refused before admission, /debug/ too.
    for path in ["/x", "/debug/x"] {
        let raw = format!(
            "GET {path} HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer A\r\nAuthorization: Bearer B\r\n\r\n"
        );
        assert_refused_head(&s, raw.as_bytes(), 400, "400 Bad Request: more than one Authorization header\n");
    }
    assert_eq!(s.metric("limiter_http_bad_requests_total{kind=\"authorization\"}"), 2.0);
    assert_eq!(s.metric("limiter_http_refused_total{reason=\"session\"}"), 5.0);
    assert_eq!(s.upstream.hits(), 4);
    s.release_all([held]);
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn a_transfer_coding_other_than_chunked_is_refused_with_501() {
    let (s, held) = setup_with_the_pool_full();
    for te in [
        "Transfer-Encoding: gzip, chunked",
        "Transfer-Encoding: chunked, chunked",
        "Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked",
    ] {
        let raw = format!("POST /sink HTTP/1.1\r\nHost: t\r\n{te}\r\n\r\n5\r\nhello\r\n0\r\n\r\n");
        let text = "501 Not Implemented: only the chunked transfer coding is supported\n";
        assert_refused_head(&s, raw.as_bytes(), 501, text);
    }
    // A last coding other than chunked leaves no way to find the body's
    // end: hyper refuses it (400) before the proxy sees it.
    let (reply, closed) =
        send_and_close(&s, b"POST /sink HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip\r\n\r\nhello");
    assert_eq!((reply.status, closed), (400, true), "{reply:?}");
    assert_eq!(s.upstream.hits(), 1, "a refused coding reached the upstream");
    assert_eq!(s.metric("limiter_http_bad_requests_total{kind=\"transfer_encoding\"}"), 3.0);
    assert_eq!(s.metric("limiter_http_refused_total{reason=\"normal\"}"), 0.0);
    s.release_all([held]);
    // chunked alone, in any case, is forwarded.
    let reply = send(
        s.proxy,
        b"POST /sink HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: Chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    )
    .unwrap();
    assert_eq!((reply.status, reply.text()), (200, "5\n".to_owned()));
    s.assert_pools_empty();
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn upgrades_pass_through_and_give_their_permit_back() {
    let s = setup("http.maxThreads = 12\n");
    let mut stream = connect(s.proxy);
    stream
        .write_all(b"GET /upgrade HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
        .unwrap();
    let reply = read_reply(&mut stream).unwrap();
    assert_eq!(reply.status, 101, "{reply:?}");
    assert_eq!(reply.header("upgrade"), Some("echo"));
    stream.write_all(b"hello through the tunnel").unwrap();
    let mut echo = [0u8; 24];
    stream.read_exact(&mut echo).unwrap();
    assert_eq!(&echo, b"hello through the tunnel");
    // The tunnel is open, the permit is back: the single slot is free.
    s.assert_pools_empty();
    assert_eq!(get(s.proxy, "/", &[]).status, 200);
    assert_eq!(s.metric("limiter_http_upgrades_total"), 1.0);
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn dry_run_counts_and_refuses_nothing() {
    let s = setup("http.maxThreads = 12\nhttp.dryRun = true\n");
    let held: Vec<_> = (0..3).map(|_| s.spawn_get("/hold", &[])).collect();
    s.upstream.wait_holding(3);
    s.upstream.release();
    for h in held {
        assert_eq!(h.join().unwrap().status, 200);
    }
    assert_eq!(s.metric("limiter_http_would_refuse_total{reason=\"normal\"}"), 2.0);
    assert_eq!(s.metric("limiter_http_refused_total{reason=\"normal\"}"), 0.0);
    s.assert_pools_empty();
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn dump_shows_the_pools_and_reload_changes_them_live() {
    let s = setup("http.maxThreads = 20\n");
    let held: Vec<_> = (0..2).map(|_| s.spawn_get("/hold", &[])).collect();
    s.upstream.wait_holding(2);
    let table = limiter_tests::limiter(&["dump", "--config", s.daemon.config.to_str().unwrap()]);
    let table = String::from_utf8_lossy(&table.stdout).into_owned();
    assert!(table.contains("normal 2/9, debug 0/3"), "{table}");
    // Lower the pool to 1 under 2 in flight: nothing new until under it.
    let text = std::fs::read_to_string(&s.daemon.config).unwrap();
    std::fs::write(&s.daemon.config, text.replace("http.maxThreads = 20", "http.maxThreads = 12")).unwrap();
    assert!(s.daemon.reload().contains("applied"));
    assert_503(&get(s.proxy, "/", &[]), "normal");
    s.upstream.release();
    for h in held {
        assert_eq!(h.join().unwrap().status, 200);
    }
    s.assert_pools_empty();
    assert_eq!(get(s.proxy, "/", &[]).status, 200);
    assert_eq!(s.metric("limiter_http_pool_limit{pool=\"normal\"}"), 1.0);
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn the_example_configuration_is_valid() {
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/limiter.ini");
    let out = limiter_tests::limiter(&["check-config", example.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("normal pool 3"), "{text}");
    assert!(text.contains("8080:200"), "{text}");
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn twenty_trickling_uploads_hold_no_permit_and_ordinary_requests_keep_their_200s() {
    // The attack of issue 12: 3 normal slots, 20 clients each announcing a
    // 2,000-byte body and sending a byte every 0.5 s, against an upstream
    // that reads bodies whole (as a servlet does).
    let s = setup("http.maxThreads = 14\n");
    let tricklers: Vec<TcpStream> = (0..20)
        .map(|_| {
            let mut t = connect(s.proxy);
            t.write_all(b"POST /sink HTTP/1.1\r\nHost: t\r\nContent-Length: 2000\r\n\r\nx").unwrap();
            t
        })
        .collect();
    wait_for("the 20 uploads started", Duration::from_secs(5), || {
        s.metric("limiter_http_bodies_receiving ") >= 20.0
    });
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let feeding = {
        let (stop, mut tricklers) = (stop.clone(), tricklers);
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for t in &mut tricklers {
                    let _ = t.write_all(b"x");
                }
                // Pacing: the attack's byte every 0.5 s.
                std::thread::sleep(Duration::from_millis(500));
            }
            tricklers
        })
    };
    for _ in 0..20 {
        assert_eq!(get(s.proxy, "/x", &[]).status, 200, "an ordinary request was refused");
    }
    assert_eq!(s.metric("limiter_http_in_flight{pool=\"normal\"}"), 0.0, "a trickling upload holds a permit");
    assert_eq!(s.metric("limiter_http_bodies_receiving "), 20.0);
    assert_eq!(s.metric("limiter_http_refused_total{reason=\"normal\"}"), 0.0);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    drop(feeding.join().unwrap());
    wait_for("the vanished uploads no longer counted", Duration::from_secs(5), || {
        s.metric("limiter_http_bodies_receiving ") == 0.0
    });
    s.assert_pools_empty();
}
