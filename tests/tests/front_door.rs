//! The front door with real clients: TLS (curl, `openssl s_client`),
//! HTTP/2 (nghttp, h2load, curl), every limit applied per stream, the
//! certificate's rotation, the access log; and HTTP/2 attacks written
//! frame by frame (`limiter_tests::h2raw`).
//!
//! The daemon runs in this process (`InProcess`); the clients are the
//! Debian packages `cargo xtask setup` installs (curl, openssl,
//! nghttp2-client). A missing client fails the test with its name.

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    os::unix::fs::OpenOptionsExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use limiter::config::Config;
use limiter_tests::{
    h2raw::{self, End},
    in_process::InProcess,
    process::{run_with_deadline, wait_for},
    tls::self_signed,
    upstream::Upstream,
};

const WAIT: Duration = Duration::from_secs(10);

/// The TLS keys for a pair, for the daemon's file.
fn tls_keys(cert: &Path, key: &Path) -> String {
    format!(
        "http.tls.listen = 127.0.0.1:0\nhttp.tls.certFile = {}\nhttp.tls.keyFile = {}\n",
        cert.display(),
        key.display()
    )
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("limiter-front-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A daemon with TLS in front of `up`; its scratch directory holds the pair.
fn with_tls(up: &Upstream, name: &str, extra: &str) -> (InProcess, PathBuf) {
    let dir = scratch(name);
    let (cert, key) = self_signed(&dir, "first");
    let d = InProcess::start(up.addr, &format!("{}{extra}", tls_keys(&cert, &key)));
    assert!(d.tls.is_some(), "a TLS listener");
    (d, dir)
}

fn tool(name: &str) -> Command {
    let found = Command::new("sh").args(["-c", &format!("command -v {name}")]).output();
    assert!(
        found.is_ok_and(|o| o.status.success()),
        "{name} is not installed: `cargo xtask setup` installs it (Debian package curl, openssl or nghttp2-client)"
    );
    Command::new(name)
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn curl(args: &[&str], url: &str) -> String {
    let out = run_with_deadline(
        tool("curl").args(["-sS", "-k", "-i", "--max-time", "10"]).args(args).arg(url),
        WAIT,
    );
    text(&out)
}

/// The status lines of every response in nghttp's verbose output.
fn statuses(verbose: &str) -> Vec<u16> {
    verbose
        .lines()
        .filter_map(|l| l.split_once("recv (stream_id=").and_then(|(_, rest)| rest.split_once(") :status: ")))
        .filter_map(|(_, status)| status.trim().parse().ok())
        .collect()
}

/// RST_STREAM frames nghttp received with an error code other than NO_ERROR.
fn error_resets(verbose: &str) -> Vec<String> {
    let lines: Vec<&str> = verbose.lines().collect();
    lines
        .windows(2)
        .filter(|w| w[0].contains("recv RST_STREAM"))
        .filter(|w| !w[1].contains("NO_ERROR"))
        .map(|w| format!("{} {}", w[0].trim(), w[1].trim()))
        .collect()
}

/// nghttp on its way: `-m n` requests of `url` as concurrent streams of
/// one connection.
fn nghttp(url: &str, n: usize, headers: &[&str]) -> Child {
    let mut cmd = tool("nghttp");
    cmd.args(["-nv", "-m", &n.to_string(), "-t", "20"]);
    for h in headers {
        cmd.args(["-H", h]);
    }
    cmd.arg(url).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("nghttp")
}

fn finish(child: Child) -> String {
    let out = child.wait_with_output().expect("nghttp ran");
    text(&out)
}

#[test]
fn ten_streams_on_one_connection_against_three_slots_give_three_200_and_seven_503() {
    let up = Upstream::start();
    let (d, dir) = with_tls(&up, "ten", "http.maxThreads = 14\n");
    let url = format!("https://127.0.0.1:{}/hold", d.tls.unwrap().port());
    let child = nghttp(&url, 10, &[]);
    up.wait_holding(3);
    wait_for("seven streams refused", WAIT, || d.metric("limiter_http2_streams_refused_total") == 7.0);
    up.release();
    let out = finish(child);
    let mut got = statuses(&out);
    got.sort_unstable();
    assert_eq!(got, [200, 200, 200, 503, 503, 503, 503, 503, 503, 503], "{out}");
    assert_eq!(error_resets(&out), Vec::<String>::new(), "no stream reset with an error code");
    assert!(out.matches("x-limiter-refused: normal").count() == 7, "{out}");
    assert!(out.matches("retry-after: 1").count() == 7, "{out}");
    assert!(!out.contains("connection: close"), "no HTTP/1 connection header on HTTP/2: {out}");
    assert_eq!(d.metric("limiter_http_protocol_connections_total{proto=\"h2+tls\"}"), 1.0, "one connection");
    assert_eq!(d.metric("limiter_http_requests_total{proto=\"h2+tls\"}"), 10.0);
    assert_eq!(d.metric("limiter_http_refused_total{reason=\"normal\"}"), 7.0);
    wait_for("the pool back to 0", WAIT, || d.metric("limiter_http_in_flight{pool=\"normal\"}") == 0.0);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn debug_over_h2_is_served_while_the_normal_pool_is_full() {
    let up = Upstream::start();
    let (d, dir) = with_tls(&up, "debug", "http.maxThreads = 12\n");
    let port = d.tls.unwrap().port();
    let held = nghttp(&format!("https://127.0.0.1:{port}/hold"), 1, &[]);
    up.wait_holding(1);
    let normal = curl(&["--http2"], &format!("https://127.0.0.1:{port}/x"));
    assert!(normal.starts_with("HTTP/2 503"), "{normal}");
    let debug = curl(&["--http2"], &format!("https://127.0.0.1:{port}/debug/threads"));
    assert!(debug.starts_with("HTTP/2 200"), "{debug}");
    up.release();
    assert_eq!(statuses(&finish(held)), [200]);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn an_http1_over_tls_refusal_still_carries_connection_close_and_https_is_forwarded() {
    let up = Upstream::start();
    let (d, dir) = with_tls(&up, "h1tls", "http.maxThreads = 12\n");
    let port = d.tls.unwrap().port();
    let headers = curl(&["--http1.1"], &format!("https://127.0.0.1:{port}/headers"));
    assert!(headers.starts_with("HTTP/1.1 200"), "{headers}");
    let lower = headers.to_ascii_lowercase();
    assert!(lower.contains("x-forwarded-proto: https"), "{headers}");
    assert!(lower.contains("proto=https"), "Forwarded says https: {headers}");
    let h2 = curl(&["--http2"], &format!("https://127.0.0.1:{port}/headers")).to_ascii_lowercase();
    assert!(h2.contains("x-forwarded-proto: https") && h2.contains("host: 127.0.0.1"), "{h2}");
    let held = nghttp(&format!("https://127.0.0.1:{port}/hold"), 1, &[]);
    up.wait_holding(1);
    let refused = curl(&["--http1.1"], &format!("https://127.0.0.1:{port}/x")).to_ascii_lowercase();
    assert!(refused.starts_with("http/1.1 503"), "{refused}");
    assert!(refused.contains("connection: close") && refused.contains("retry-after: 1"), "{refused}");
    up.release();
    finish(held);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn the_session_limit_applies_across_streams_and_across_connections() {
    let up = Upstream::start();
    let (d, dir) = with_tls(&up, "session", "http.maxSessionConnections = 1\n");
    let port = d.tls.unwrap().port();
    let url = format!("https://127.0.0.1:{port}/hold");
    let child = nghttp(&url, 3, &["authorization: Bearer alice"]);
    up.wait_holding(1);
    wait_for("two streams refused", WAIT, || d.metric("limiter_http2_streams_refused_total") == 2.0);
    // Another connection, HTTP/1.1 over TLS and cleartext h1: the same session.
    let other =
        curl(&["--http1.1", "-H", "Authorization: Bearer alice"], &format!("https://127.0.0.1:{port}/x"));
    assert!(other.to_ascii_lowercase().contains("x-limiter-refused: session"), "{other}");
    let plain = d.get("/x", &["Authorization: Bearer alice"]);
    assert_eq!(plain.header("x-limiter-refused"), Some("session"));
    assert_eq!(d.get("/x", &["Authorization: Bearer bob"]).status, 200, "another session passes");
    up.release();
    let out = finish(child);
    let mut got = statuses(&out);
    got.sort_unstable();
    assert_eq!(got, [200, 503, 503], "{out}");
    assert_eq!(out.matches("x-limiter-refused: session").count(), 2, "{out}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// The subject of the certificate a new handshake presents, with the
/// protocol ALPN chose.
fn served(tls: SocketAddr, alpn: &str) -> (String, String) {
    let mut child = tool("openssl")
        .args(["s_client", "-connect", &tls.to_string(), "-alpn", alpn, "-servername", "localhost"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("openssl s_client");
    drop(child.stdin.take());
    let out = text(&child.wait_with_output().unwrap());
    let subject = out.lines().find(|l| l.starts_with("subject=")).unwrap_or("no subject").trim().to_owned();
    let alpn = out.lines().find(|l| l.starts_with("ALPN protocol:")).unwrap_or("no ALPN").trim().to_owned();
    (subject, alpn)
}

#[test]
fn rotation_changes_the_certificate_new_handshakes_present_and_a_bad_pair_changes_nothing() {
    let up = Upstream::start();
    let (d, dir) = with_tls(&up, "rotate", "");
    let tls = d.tls.unwrap();
    let (subject, alpn) = served(tls, "h2");
    assert!(subject.contains("CN = first"), "{subject}");
    assert_eq!(alpn, "ALPN protocol: h2");
    assert_eq!(served(tls, "http/1.1").1, "ALPN protocol: http/1.1");
    // An established connection keeps its pair across the rotation.
    let held = nghttp(&format!("https://127.0.0.1:{}/hold", tls.port()), 1, &[]);
    up.wait_holding(1);

    // Rotation: new contents at the same paths, then a reload.
    let (cert, key) = (dir.join("first.crt"), dir.join("first.key"));
    let (new_cert, new_key) = self_signed(&dir, "second");
    std::fs::copy(&new_cert, &cert).unwrap();
    std::fs::copy(&new_key, &key).unwrap();
    let (status, text) = d.try_reload(&tls_keys(&cert, &key));
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("contents changed"), "the reload names the rotation: {text}");
    assert!(served(tls, "h2").0.contains("CN = second"), "new handshakes present the new certificate");
    up.release();
    assert_eq!(statuses(&finish(held)), [200], "the established connection finished on its pair");

    // A key that does not match: refused, nothing changes.
    let (_, stray_key) = self_signed(&dir, "stray");
    let (status, text) = d.try_reload(&tls_keys(&cert, &stray_key));
    assert_eq!(status, 422, "{text}");
    assert!(text.contains("does not match the certificate"), "{text}");
    assert!(text.contains("http.tls.keyFile"), "names the key: {text}");
    assert!(served(tls, "h2").0.contains("CN = second"), "the bad pair changed nothing");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn bad_pem_files_are_refused_with_the_file_the_line_and_what_is_wrong() {
    let dir = scratch("pem");
    let (cert, key) = self_signed(&dir, "good");
    let (_, other_key) = self_signed(&dir, "other");
    let garbage = dir.join("garbage.pem");
    std::fs::write(&garbage, "not a pem file\n").unwrap();
    let load = |cert: &Path, key: &Path| {
        let text = format!(
            "[kernel]\nenabled = false\n[http]\nupstream = 127.0.0.1:1\ntls.listen = 127.0.0.1:0\ntls.certFile = {}\ntls.keyFile = {}\n",
            cert.display(),
            key.display()
        );
        Config::parse(&text, "limiter.ini").map_err(|e| e.to_string())
    };
    assert!(load(&cert, &key).is_ok_and(|c| c.warnings.is_empty()));
    let mismatch = load(&cert, &other_key).unwrap_err();
    assert!(mismatch.starts_with("limiter.ini:7: http.tls.keyFile = "), "{mismatch}");
    assert!(mismatch.contains("the key does not match the certificate"), "{mismatch}");
    let no_key = load(&cert, &cert).unwrap_err();
    assert!(no_key.contains("limiter.ini:7") && no_key.contains("no private key"), "{no_key}");
    let no_cert = load(&garbage, &key).unwrap_err();
    assert!(no_cert.contains("limiter.ini:6") && no_cert.contains("no CERTIFICATE block"), "{no_cert}");
    let missing = load(&dir.join("nope.pem"), &key).unwrap_err();
    assert!(missing.contains("limiter.ini:6") && missing.contains("cannot read"), "{missing}");

    // Expired: a warning, not an error (issued with `openssl ca` for 2020).
    let ca = dir.join("ca");
    std::fs::create_dir_all(&ca).unwrap();
    std::fs::write(ca.join("index.txt"), "").unwrap();
    std::fs::write(ca.join("serial"), "01\n").unwrap();
    std::fs::write(
        ca.join("ca.cnf"),
        "[ca]\ndefault_ca=d\n[d]\ndatabase=index.txt\nserial=serial\nnew_certs_dir=.\ndefault_md=sha256\npolicy=p\n\
         x509_extensions=ext\n[p]\ncommonName=supplied\n[ext]\nbasicConstraints=CA:FALSE\nsubjectAltName=DNS:localhost\n",
    )
    .unwrap();
    let csr = run_with_deadline(
        tool("openssl")
            .current_dir(&ca)
            .args(["req", "-new", "-subj", "/CN=old", "-out", "req.csr", "-key"])
            .arg(&key),
        WAIT,
    );
    assert!(csr.status.success(), "{}", text(&csr));
    let signed = run_with_deadline(
        tool("openssl")
            .current_dir(&ca)
            .args(["ca", "-batch", "-config", "ca.cnf", "-selfsign", "-in", "req.csr", "-out", "old.pem"])
            .args(["-startdate", "20200101000000Z", "-enddate", "20200102000000Z", "-keyfile"])
            .arg(&key),
        WAIT,
    );
    assert!(signed.status.success(), "{}", text(&signed));
    let expired = load(&ca.join("old.pem"), &key).expect("an expired certificate loads");
    assert_eq!(expired.warnings.len(), 1, "{:?}", expired.warnings);
    assert!(expired.warnings[0].contains("expired at 2020-01-02T00:00:00.000Z"), "{:?}", expired.warnings);
    std::fs::remove_dir_all(dir).unwrap();
}

/// How long the server keeps a TCP connection to the TLS port that sends
/// nothing.
fn silent_lifetime(tls: SocketAddr) -> Duration {
    let mut s = TcpStream::connect(tls).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 64];
    let _ = s.read(&mut buf);
    started.elapsed()
}

#[test]
fn handshake_timeout_cuts_silent_connections_and_changes_live() {
    let up = Upstream::start();
    let (d, dir) = with_tls(&up, "handshake", "http.tls.handshakeTimeoutMs = 300\n");
    let tls = d.tls.unwrap();
    let short = silent_lifetime(tls);
    assert!((Duration::from_millis(250)..Duration::from_millis(2000)).contains(&short), "{short:?}");
    assert_eq!(d.metric("limiter_tls_handshakes_total{result=\"timeout\"}"), 1.0);
    let (cert, key) = (dir.join("first.crt"), dir.join("first.key"));
    d.reload(&format!("{}http.tls.handshakeTimeoutMs = 1500\n", tls_keys(&cert, &key)));
    let long = silent_lifetime(tls);
    assert!((Duration::from_millis(1400)..Duration::from_millis(4000)).contains(&long), "{long:?}");
    // Not TLS at all: a protocol failure, and no permit was ever taken.
    let mut s = TcpStream::connect(tls).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
    let _ = s.read(&mut [0u8; 64]);
    wait_for("a protocol failure", WAIT, || {
        d.metric("limiter_tls_handshakes_total{result=\"protocol\"}") == 1.0
    });
    assert_eq!(d.metric("limiter_http_admitted_total{pool=\"normal\"}"), 0.0);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn max_concurrent_streams_changes_for_new_connections() {
    let up = Upstream::start();
    let (d, dir) = with_tls(&up, "streams", "http.h2.maxConcurrentStreams = 7\n");
    let url = format!("https://127.0.0.1:{}/", d.tls.unwrap().port());
    let advertised = |out: &str| out.contains("SETTINGS_MAX_CONCURRENT_STREAMS(0x03):");
    let out = finish(nghttp(&url, 1, &[]));
    assert!(advertised(&out) && out.contains("(0x03):7"), "{out}");
    let (cert, key) = (dir.join("first.crt"), dir.join("first.key"));
    d.reload(&format!("{}http.h2.maxConcurrentStreams = 3\n", tls_keys(&cert, &key)));
    let out = finish(nghttp(&url, 1, &[]));
    assert!(out.contains("(0x03):3"), "{out}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// Every line of the access log, parsed, once it holds `n` lines.
fn log_lines(path: &Path, n: usize) -> Vec<serde_json::Value> {
    wait_for(&format!("{n} access log lines"), WAIT, || {
        std::fs::read_to_string(path).map_or(0, |t| t.lines().count()) >= n
    });
    let text = std::fs::read_to_string(path).unwrap();
    text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect()
}

#[test]
fn the_access_log_lines_add_up_to_the_requests_sent_and_a_reload_reopens_it() {
    let up = Upstream::start();
    let dir = scratch("access");
    let (cert, key) = self_signed(&dir, "first");
    let log = dir.join("access.log");
    let keys = format!(
        "{}http.h2c = true\nhttp.maxThreads = 12\nhttp.maxSessionConnections = 5\nhttp.accessLog = {}\n",
        tls_keys(&cert, &key),
        log.display()
    );
    let d = InProcess::start(up.addr, &keys);
    let (tls, plain) = (d.tls.unwrap().port(), d.proxy.port());
    // One held request, and a refusal on each protocol behind it.
    let held = nghttp(&format!("https://127.0.0.1:{tls}/hold"), 1, &["authorization: Bearer secret-token"]);
    up.wait_holding(1);
    assert!(curl(&["--http2"], &format!("https://127.0.0.1:{tls}/a?x=1")).starts_with("HTTP/2 503"));
    assert!(curl(&["--http1.1"], &format!("https://127.0.0.1:{tls}/b")).starts_with("HTTP/1.1 503"));
    assert!(
        curl(&["--http2-prior-knowledge"], &format!("http://127.0.0.1:{plain}/c")).starts_with("HTTP/2 503")
    );
    assert_eq!(d.get("/d", &[]).status, 503);
    up.release();
    finish(held);
    let posted = curl(&["--http2", "--data-binary", "0123456789"], &format!("https://127.0.0.1:{tls}/sink"));
    assert!(posted.starts_with("HTTP/2 200"), "{posted}");
    let lines = log_lines(&log, 6);
    assert_eq!(lines.len(), 6, "{lines:?}");
    let protos: Vec<&str> = lines.iter().map(|l| l["proto"].as_str().unwrap()).collect();
    for p in ["h2+tls", "h1+tls", "h2c", "h1"] {
        assert!(protos.contains(&p), "{protos:?}");
    }
    let find =
        |path: &str| lines.iter().find(|l| l["path"] == path).unwrap_or_else(|| panic!("{path}: {lines:?}"));
    let refused = find("/a?x=1");
    assert_eq!((refused["status"].as_u64(), refused["reason"].as_str()), (Some(503), Some("normal")));
    assert!(refused["upstream_ms"].is_null());
    let hold = find("/hold");
    assert_eq!(hold["status"], 200);
    assert!(hold["upstream_ms"].as_f64().is_some_and(|ms| ms > 0.0) && hold.get("reason").is_none());
    let session = hold["session"].as_str().unwrap();
    assert!(session.len() == 8 && session.chars().all(|c| c.is_ascii_hexdigit()), "{session}");
    assert!(
        !std::fs::read_to_string(&log).unwrap().contains("secret-token"),
        "never the Authorization value"
    );
    let sink = find("/sink");
    assert_eq!((sink["bytes_in"].as_u64(), sink["method"].as_str()), (Some(10), Some("POST")));
    assert!(sink["bytes_out"].as_u64().is_some_and(|n| n > 0));
    assert!(sink["ts"].as_str().is_some_and(|t| t.len() == 24 && t.ends_with('Z')), "{sink}");
    assert_eq!(d.metric("limiter_access_log_lines_total"), 6.0);
    assert_eq!(d.metric("limiter_access_log_dropped_total"), 0.0);

    // Rotation the logrotate way: move the file, then reload (SIGUSR1 does
    // the same for the binary; see the black-box test).
    std::fs::rename(&log, dir.join("access.log.1")).unwrap();
    d.reload(&keys);
    assert_eq!(d.get("/e", &[]).status, 200);
    let fresh = log_lines(&log, 1);
    assert_eq!(fresh[0]["path"], "/e");
    // Off, live; then on again: the next line after /e is /g. The writer
    // takes lines in order from one queue, so a line for /f, had one been
    // queued, would have come before it.
    d.reload(&keys.replace(&format!("http.accessLog = {}", log.display()), "http.accessLog = off"));
    assert_eq!(d.get("/f", &[]).status, 200);
    d.reload(&keys);
    assert_eq!(d.get("/g", &[]).status, 200);
    let paths: Vec<_> = log_lines(&log, 2).iter().map(|l| l["path"].as_str().unwrap().to_owned()).collect();
    assert_eq!(paths, ["/e", "/g"], "nothing logged while off");
    assert_eq!(d.metric("limiter_access_log_lines_total"), 8.0);
    assert_eq!(d.metric("limiter_access_log_dropped_total"), 0.0, "nor queued while off");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn heads_hyper_refuses_are_logged_with_their_status_and_reason() {
    let up = Upstream::start();
    let dir = scratch("refused-heads");
    let log = dir.join("access.log");
    let d = InProcess::start(
        up.addr,
        &format!(
            "http.accessLog = {}\nhttp.headerReadTimeoutMs = 300\nhttp.maxHeaderBytes = 8192\n",
            log.display()
        ),
    );
    // Malformed, too large, and a head that never ends.
    let malformed = limiter_tests::client::send(d.proxy, b"GET / HTTP/1.1\r\nHost a\r\n\r\n").unwrap();
    assert_eq!(malformed.status, 400);
    let big = format!("GET / HTTP/1.1\r\nHost: a\r\nX-Big: {}\r\n\r\n", "b".repeat(20_000));
    assert_eq!(limiter_tests::client::send(d.proxy, big.as_bytes()).unwrap().status, 431);
    let mut slow = limiter_tests::client::connect(d.proxy);
    slow.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n").unwrap();
    assert!(limiter_tests::client::closed_by_server(&mut slow), "cut at the header timeout");
    // An idle keep-alive connection that closes is no refusal.
    let mut idle = limiter_tests::client::connect(d.proxy);
    idle.write_all(b"GET /ok HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
    assert_eq!(limiter_tests::client::read_reply(&mut idle).unwrap().status, 200);
    std::thread::sleep(Duration::from_millis(600)); // past the header timeout, idle
    drop(idle);
    assert_eq!(d.get("/last", &[]).status, 200);
    let lines = log_lines(&log, 5);
    let seen: Vec<(u64, Option<&str>, &str)> = lines
        .iter()
        .map(|l| (l["status"].as_u64().unwrap(), l["reason"].as_str(), l["path"].as_str().unwrap()))
        .collect();
    // The three refusals, then the two requests: a head begun and cut at
    // the header timeout is logged 408 (as nginx logs it); a keep-alive
    // connection idling past the same timeout between requests, which
    // hyper reports alike, is not.
    assert_eq!(
        seen,
        [
            (400, Some("malformed"), "/"),
            (431, Some("too_large"), "/"),
            (408, Some("header_timeout"), "/"),
            (200, None, "/ok"),
            (200, None, "/last")
        ]
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_blocked_access_log_neither_stalls_requests_nor_loses_the_count_of_dropped_lines() {
    let up = Upstream::start();
    let dir = scratch("fifo");
    let fifo = dir.join("access.fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    // A reader that holds the pipe open and reads nothing until the end.
    let mut reader =
        std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(&fifo).unwrap();
    let d = InProcess::start(up.addr, &format!("http.h2c = true\nhttp.accessLog = {}\n", fifo.display()));
    let requests = 20_000;
    let started = Instant::now();
    let out = run_with_deadline(
        tool("h2load")
            .args(["-n", &requests.to_string(), "-c", "4", "-m", "10"])
            .arg(format!("http://127.0.0.1:{}/", d.proxy.port())),
        Duration::from_secs(60),
    );
    let took = started.elapsed();
    let report = text(&out);
    assert!(report.contains(&format!("{requests} succeeded")), "{report}");
    let dropped = d.metric("limiter_access_log_dropped_total");
    assert!(dropped > 0.0, "the pipe and the queue cannot hold {requests} lines: {report}");
    // Now drain the pipe: what was not dropped arrives, line for line,
    // until every request is a line read or a line counted as dropped.
    let mut text_read = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    let lines_read = |text: &[u8]| text.iter().filter(|&&b| b == b'\n').count() as f64;
    wait_for("every request a line read or a line dropped", Duration::from_secs(20), || {
        while let Ok(n @ 1..) = reader.read(&mut buf) {
            text_read.extend_from_slice(&buf[..n]);
        }
        lines_read(&text_read) + d.metric("limiter_access_log_dropped_total") >= f64::from(requests)
    });
    let lines = lines_read(&text_read);
    let written = d.metric("limiter_access_log_lines_total");
    assert_eq!(lines, written, "every line written arrived");
    assert_eq!(
        lines + d.metric("limiter_access_log_dropped_total"),
        f64::from(requests),
        "none lost uncounted"
    );
    eprintln!(
        "{requests} requests in {took:?} with the log blocked: {lines} lines, {dropped} dropped while blocked"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

// HTTP/2 attacks, frame by frame, on h2c.

fn h2c(up: &Upstream, extra: &str) -> InProcess {
    InProcess::start(up.addr, &format!("http.h2c = true\n{extra}"))
}

#[test]
fn rapid_reset_is_cut_and_holds_nothing() {
    let up = Upstream::start();
    let d = h2c(&up, "http.maxThreads = 14\n");
    let mut s = h2raw::connect(d.proxy, &[]);
    let mut burst = Vec::new();
    for i in 0..5_000u32 {
        let id = 2 * i + 1;
        burst.extend(h2raw::frame(
            h2raw::HEADERS,
            h2raw::END_HEADERS | h2raw::END_STREAM,
            id,
            &h2raw::get_block("/hold", &[]),
        ));
        burst.extend(h2raw::frame(h2raw::RST_STREAM, 0, id, &8u32.to_be_bytes()));
    }
    let _ = s.write_all(&burst);
    let end = h2raw::ending(&mut s, WAIT);
    assert_ne!(end, End::Open, "the connection must not survive 5,000 resets");
    let cut = d.metric("limiter_http2_floods_total{frame=\"rst_stream\"}");
    eprintln!(
        "rapid reset: {end:?}, limiter's meter cut {cut} connection(s), upstream saw {} requests",
        up.hits()
    );
    assert!(up.hits() <= 250, "at most the burst reached the upstream, not 5,000: {}", up.hits());
    up.release();
    wait_for("the pools back to 0", WAIT, || d.metric("limiter_http_in_flight{pool=\"normal\"}") == 0.0);
    assert_eq!(d.get("/x", &[]).status, 200, "the proxy still serves");
}

#[test]
fn a_continuation_flood_is_refused_by_the_codec() {
    let up = Upstream::start();
    let d = h2c(&up, "");
    // A header block split the honest way is served: the frames are right.
    let mut s = h2raw::connect(d.proxy, &[]);
    let block = h2raw::get_block("/", &[("x-a", "1")]);
    let (first, rest) = block.split_at(block.len() / 2);
    s.write_all(&h2raw::frame(h2raw::HEADERS, h2raw::END_STREAM, 1, first)).unwrap();
    s.write_all(&h2raw::frame(h2raw::CONTINUATION, h2raw::END_HEADERS, 1, rest)).unwrap();
    let answered = std::iter::from_fn(|| h2raw::read_frame(&mut s, WAIT).ok().flatten())
        .find(|f| f.kind == h2raw::HEADERS && f.stream == 1);
    assert!(answered.is_some(), "a split header block is answered");
    assert_eq!(up.hits(), 1);

    let mut s = h2raw::connect(d.proxy, &[]);
    let _ = s.write_all(&h2raw::frame(h2raw::HEADERS, h2raw::END_STREAM, 1, &h2raw::get_block("/", &[])));
    let filler = vec![0u8; 16_000];
    let mut sent = 0usize;
    let started = Instant::now();
    // Endless CONTINUATION frames that never end the header block.
    while started.elapsed() < WAIT {
        let mut block = Vec::new();
        block.extend([0x00, 0x05]);
        block.extend(b"x-pad");
        block.extend([0x7f, 0x81, 0x7c]); // a 16,000-byte value, length in HPACK's integer form
        block.extend(&filler);
        if s.write_all(&h2raw::frame(h2raw::CONTINUATION, 0, 1, &block)).is_err() {
            break;
        }
        sent += 1;
        if sent > 10_000 {
            break;
        }
    }
    let end = h2raw::ending(&mut s, WAIT);
    // h2 answers GOAWAY after a few frames; the lingering close then reads
    // and discards what is still coming (at most 64 MiB, http.lingerMs).
    eprintln!("CONTINUATION flood: {sent} frames written before the end ({end:?})");
    assert!(matches!(end, End::GoAway(_)), "{end:?}");
    assert!(sent * 16_000 < 80 << 20, "bounded by the linger's 64 MiB: {sent} frames");
    assert_eq!(up.hits(), 1, "nothing more reached the upstream");
    assert_eq!(d.get("/x", &[]).status, 200);
}

#[test]
fn settings_and_ping_floods_are_cut_by_the_meter() {
    let up = Upstream::start();
    let d = h2c(&up, "");
    for (name, frame) in
        [("settings", h2raw::settings(&[(0x3, 100)])), ("ping", h2raw::frame(h2raw::PING, 0, 0, &[7; 8]))]
    {
        let mut s = h2raw::connect(d.proxy, &[]);
        let flood = frame.repeat(2_000);
        let _ = s.write_all(&flood);
        let end = h2raw::ending(&mut s, WAIT);
        assert_ne!(end, End::Open, "{name}");
        assert_eq!(d.metric(&format!("limiter_http2_floods_total{{frame=\"{name}\"}}")), 1.0, "{name}");
    }
    // A client that pings a little is fine.
    let mut s = h2raw::connect(d.proxy, &[]);
    s.write_all(&h2raw::frame(h2raw::PING, 0, 0, &[1; 8]).repeat(10)).unwrap();
    assert_eq!(h2raw::ending(&mut s, Duration::from_millis(500)), End::Open);
    assert_eq!(d.get("/x", &[]).status, 200);
}

#[test]
fn a_stream_whose_window_is_held_at_zero_gives_its_permit_back() {
    let up = Upstream::start();
    // 8 KiB/s: a 16 KiB chunk may take the 3 s grace + 2 s.
    let d = h2c(&up, "http.maxThreads = 12\nhttp.minDataRate = 8192\n");
    // Initial window 0: the server may send no DATA on any stream.
    let mut s = h2raw::connect(d.proxy, &[(h2raw::INITIAL_WINDOW_SIZE, 0)]);
    let block = h2raw::get_block("/big?bytes=4000000", &[]);
    s.write_all(&h2raw::frame(h2raw::HEADERS, h2raw::END_HEADERS | h2raw::END_STREAM, 1, &block)).unwrap();
    wait_for("the big response admitted", WAIT, || {
        d.metric("limiter_http_admitted_total{pool=\"normal\"}") == 1.0
    });
    assert_eq!(
        d.metric("limiter_http_in_flight{pool=\"normal\"}"),
        1.0,
        "the permit is held while streaming"
    );
    // The grace (3 s) passes without a byte: the stream is cut.
    wait_for("the permit back", Duration::from_secs(8), || {
        d.metric("limiter_http_in_flight{pool=\"normal\"}") == 0.0
    });
    assert_eq!(d.metric("limiter_http_slow_readers_total"), 1.0);
    assert_eq!(d.get("/x", &[]).status, 200, "the slot serves another request");
    // The connection itself is not punished for it: it still answers PING.
    s.write_all(&h2raw::frame(h2raw::PING, 0, 0, &[9; 8])).unwrap();
    let deadline = Instant::now() + WAIT;
    loop {
        let f = h2raw::read_frame(&mut s, WAIT).unwrap().expect("the connection is still open");
        if f.kind == h2raw::PING && f.flags & h2raw::ACK != 0 {
            break;
        }
        assert!(Instant::now() < deadline);
    }
}

#[test]
fn a_small_response_starved_at_window_zero_gives_its_buffer_back_with_the_idle_connection() {
    let up = Upstream::start();
    let d = h2c(&up, "http.idleTimeoutMs = 1000\nhttp.minDataRate = 8192\n");
    let mut s = h2raw::connect(d.proxy, &[(h2raw::INITIAL_WINDOW_SIZE, 0)]);
    let block = h2raw::get_block("/big?bytes=20000", &[]);
    s.write_all(&h2raw::frame(h2raw::HEADERS, h2raw::END_HEADERS | h2raw::END_STREAM, 1, &block)).unwrap();
    wait_for("the response buffered", WAIT, || d.metric("limiter_http_buffered_bytes") >= 20_000.0);
    // Read whole, it gives its permit back at once: well before the 3 s
    // grace could have cut it.
    wait_for("read whole: no permit held", Duration::from_secs(2), || {
        d.metric("limiter_http_in_flight{pool=\"normal\"}") == 0.0
    });
    assert_eq!(d.metric("limiter_http_slow_readers_total"), 0.0, "not cut as a slow reader yet");
    // Read ahead whole, its first chunk sits in hyper's send buffer: after
    // the chunk's allowance (3 s + 2 s) the stream is starved, its
    // connection gets GOAWAY, is cut 1 s later, and the bytes go back.
    let started = Instant::now();
    assert!(matches!(h2raw::ending(&mut s, Duration::from_secs(15)), End::GoAway(0) | End::Closed));
    assert!(started.elapsed() < Duration::from_secs(9), "{:?}", started.elapsed());
    assert_eq!(d.metric("limiter_http_slow_readers_total"), 1.0);
    wait_for("the budget back", WAIT, || d.metric("limiter_http_buffered_bytes") == 0.0);
}

#[test]
fn a_long_h2_download_is_not_taken_for_an_idle_connection() {
    let up = Upstream::start();
    let d = h2c(&up, "http.idleTimeoutMs = 500\nhttp.minDataRate = 1024\n");
    let mut s = h2raw::connect(d.proxy, &[]);
    let block = h2raw::get_block("/big?bytes=600000", &[]);
    s.write_all(&h2raw::frame(h2raw::HEADERS, h2raw::END_HEADERS | h2raw::END_STREAM, 1, &block)).unwrap();
    // The client opens its window 64 KiB at a time, every 250 ms: about
    // 2.3 s of download against a 500 ms idle timeout.
    let started = Instant::now();
    let (mut got, mut goaway, mut ended) = (0usize, false, false);
    while !ended && started.elapsed() < WAIT {
        let mut credit = 0usize;
        let round = Instant::now();
        while round.elapsed() < Duration::from_millis(250) {
            match h2raw::read_frame(&mut s, Duration::from_millis(50)) {
                Ok(Some(f)) if f.kind == h2raw::DATA => {
                    (got, credit) = (got + f.payload.len(), credit + f.payload.len());
                    ended |= f.flags & h2raw::END_STREAM != 0;
                }
                Ok(Some(f)) => goaway |= f.kind == h2raw::GOAWAY,
                Ok(None) => panic!("closed after {got} bytes"),
                Err(_) => {}
            }
        }
        if credit > 0 {
            let grant = (credit as u32).to_be_bytes();
            s.write_all(
                &[
                    h2raw::frame(h2raw::WINDOW_UPDATE, 0, 0, &grant),
                    h2raw::frame(h2raw::WINDOW_UPDATE, 0, 1, &grant),
                ]
                .concat(),
            )
            .unwrap();
        }
    }
    assert!(ended && got == 600_000, "{got} bytes, ended {ended}");
    assert!(started.elapsed() > Duration::from_millis(1500), "{:?}", started.elapsed());
    assert!(!goaway, "no GOAWAY while a stream was downloading");
    assert_eq!(d.metric("limiter_http2_idle_closed_total"), 0.0);
    assert_eq!(d.metric("limiter_http_slow_readers_total"), 0.0);
}

#[test]
fn an_idle_h2_connection_is_closed_with_goaway() {
    let up = Upstream::start();
    let d = h2c(&up, "http.idleTimeoutMs = 500\n");
    let mut s = h2raw::connect(d.proxy, &[]);
    let started = Instant::now();
    let end = h2raw::ending(&mut s, WAIT);
    assert_eq!(end, End::GoAway(0), "GOAWAY NO_ERROR, then the close");
    assert!(started.elapsed() >= Duration::from_millis(450), "{:?}", started.elapsed());
    assert_eq!(d.metric("limiter_http2_idle_closed_total"), 1.0);
}

/// Python's `ssl` for the TLS cases no ordinary client makes.
fn python(script: &str) -> String {
    let out = run_with_deadline(tool("python3").args(["-c", script]), WAIT);
    let all = text(&out);
    assert!(out.status.success(), "python: {all}");
    all
}

#[test]
fn crafted_tls_clients_old_versions_no_alpn_and_frames_over_tls() {
    let up = Upstream::start();
    let (d, dir) = with_tls(&up, "python", "http.maxThreads = 14\n");
    let port = d.tls.unwrap().port();
    let out = python(&format!(
        r#"
import socket, ssl, struct
def ctx(**kw):
    c = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    c.check_hostname = False
    c.verify_mode = ssl.CERT_NONE
    for k, v in kw.items():
        setattr(c, k, v)
    return c
def tls(c, alpn=None):
    if alpn: c.set_alpn_protocols(alpn)
    return c.wrap_socket(socket.create_connection(("127.0.0.1", {port})), server_hostname="localhost")
# TLS 1.1 only: refused by the server.
old = ctx(minimum_version=ssl.TLSVersion.TLSv1_1, maximum_version=ssl.TLSVersion.TLSv1_1)
old.set_ciphers("DEFAULT:@SECLEVEL=0")
try:
    tls(old); print("tls1.1 accepted")
except ssl.SSLError as e:
    print("tls1.1 refused", e.reason)
# TLS 1.2 with ALPN h2, and no ALPN at all.
s = tls(ctx(maximum_version=ssl.TLSVersion.TLSv1_2), ["h2", "http/1.1"])
print("tls1.2", s.version(), s.selected_alpn_protocol())
s.close()
s = tls(ctx())
print("no-alpn", s.version(), s.selected_alpn_protocol())
s.sendall(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
print("no-alpn answer", s.recv(12))
s.close()
# Rapid reset over TLS, frames written by hand.
s = tls(ctx(), ["h2"])
def frame(kind, flags, sid, payload):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", sid) + payload
burst = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0, b"")
block = bytes([0x82, 0x87, 0x04, 5]) + b"/hold" + bytes([0x01, 1]) + b"a"
for i in range(3000):
    burst += frame(1, 5, 2 * i + 1, block) + frame(3, 0, 2 * i + 1, struct.pack(">I", 8))
try:
    s.sendall(burst)
except OSError:
    pass
s.settimeout(10)
ended = "open"
try:
    while True:
        data = s.recv(65536)
        if not data:
            ended = "closed"; break
except socket.timeout:
    ended = "open"
except (ssl.SSLError, OSError):
    ended = "closed"
print("rapid reset over tls", ended)
"#
    ));
    assert!(out.contains("tls1.1 refused"), "{out}");
    assert!(out.contains("tls1.2 TLSv1.2 h2"), "{out}");
    assert!(out.contains("no-alpn TLSv1.3 None") && out.contains("no-alpn answer b'HTTP/1.1 200'"), "{out}");
    assert!(out.contains("rapid reset over tls closed"), "{out}");
    assert_eq!(d.metric("limiter_tls_handshakes_total{result=\"protocol\"}"), 1.0, "{out}");
    up.release();
    wait_for("the pools back to 0", WAIT, || d.metric("limiter_http_in_flight{pool=\"normal\"}") == 0.0);
    std::fs::remove_dir_all(dir).unwrap();
}
