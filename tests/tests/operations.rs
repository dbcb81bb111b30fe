//! Operating the daemon: drain on SIGTERM, reload through the admin
//! listener under load, the admin token, rate-limited refusal logs. The
//! real daemon (HTTP side; no kernel gate needed), real sockets.

use std::{
    net::{SocketAddr, TcpStream},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use limiter_tests::{
    Daemon,
    client::{self, get},
    process::wait_for,
    upstream::Upstream,
};
use nix::sys::signal::Signal;

struct Setup {
    daemon: Daemon,
    proxy: SocketAddr,
    upstream: Upstream,
    dir: std::path::PathBuf,
    config: std::path::PathBuf,
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

static SEQ: AtomicU64 = AtomicU64::new(0);

fn setup(extra: &str) -> Setup {
    let upstream = Upstream::start();
    let dir = std::env::temp_dir().join(format!(
        "lo-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let (config, proxy) = client::http_config(&dir, Some(upstream.addr), extra);
    let daemon = Daemon::start(&config, &[]).expect("daemon starts");
    Setup { daemon, proxy, upstream, dir, config }
}

/// A raw admin request; returns (status, body).
fn admin(addr: SocketAddr, method: &str, path: &str, token: Option<&str>) -> (u16, String) {
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let raw = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: 0\r\n{auth}\r\n"
    );
    let reply = client::send(addr, raw.as_bytes()).expect("admin reply");
    (reply.status, reply.text())
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn sigterm_drains_requests_in_flight_then_exits_and_new_connections_are_refused() {
    let mut s = setup("http.drainTimeoutMs = 10000\n");
    let proxy = s.proxy;
    let held: Vec<_> = (0..5).map(|_| std::thread::spawn(move || get(proxy, "/hold", &[]))).collect();
    s.upstream.wait_holding(5);
    // An idle keep-alive connection, too: it is closed at once.
    let mut idle = client::connect(proxy);
    std::io::Write::write_all(&mut idle, b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    assert_eq!(client::read_reply(&mut idle).unwrap().status, 200);

    s.daemon.signal(Signal::SIGTERM);
    wait_for("/healthz to say draining", Duration::from_secs(5), || {
        admin(s.daemon.admin, "GET", "/healthz", None).0 == 503
    });
    assert!(client::closed_by_server(&mut idle), "an idle connection closes when the drain starts");
    wait_for("the listener to close", Duration::from_secs(5), || TcpStream::connect(proxy).is_err());
    s.upstream.release();
    for h in held {
        let reply = h.join().unwrap();
        assert_eq!(reply.status, 200, "a request in flight at SIGTERM completes");
    }
    let started = Instant::now();
    assert_eq!(s.daemon.wait(), Some(0));
    assert!(started.elapsed() < Duration::from_secs(5));
    let log = s.daemon.log();
    assert!(log.contains("draining") && log.contains("connections_cut=0"), "{log}");
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn a_drain_that_outlives_its_timeout_cuts_what_is_left_and_says_so() {
    let mut s = setup("http.drainTimeoutMs = 300\n");
    let proxy = s.proxy;
    let held = std::thread::spawn(move || client::send(proxy, b"GET /hold HTTP/1.1\r\nHost: t\r\n\r\n"));
    s.upstream.wait_holding(1);
    let started = Instant::now();
    s.daemon.signal(Signal::SIGTERM);
    assert_eq!(s.daemon.wait(), Some(0));
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(300) && took < Duration::from_secs(3), "{took:?}");
    assert!(held.join().unwrap().is_err(), "the cut request gets no response");
    let log = s.daemon.log();
    assert!(log.contains("drain timeout: cutting") && log.contains("connections_cut=1"), "{log}");
    s.upstream.release();
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn reload_through_the_admin_listener_under_load_is_atomic_and_names_what_blocks_it() {
    let s = setup("http.maxThreads = 14\n");
    let text = std::fs::read_to_string(&s.config).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicU64::new(0));
    let proxy = s.proxy;
    let load: Vec<_> = (0..3)
        .map(|_| {
            let (stop, answered) = (stop.clone(), answered.clone());
            std::thread::spawn(move || {
                let (mut ok, mut refused, mut other) = (0u64, 0u64, Vec::new());
                while !stop.load(Ordering::Relaxed) {
                    match client::send(proxy, b"GET /slowhead?ms=5 HTTP/1.1\r\nHost: t\r\n\r\n") {
                        Ok(r) if r.status == 200 => ok += 1,
                        Ok(r) if r.status == 503 => refused += 1,
                        Ok(r) => other.push(format!("status {}", r.status)),
                        Err(e) => other.push(e.to_string()),
                    }
                    answered.fetch_add(1, Ordering::Relaxed);
                }
                (ok, refused, other)
            })
        })
        .collect();
    // The load runs through each step: some requests answered after it.
    let load_runs = |step: &str| {
        let from = answered.load(Ordering::Relaxed);
        wait_for(&format!("30 requests answered {step}"), Duration::from_secs(10), || {
            answered.load(Ordering::Relaxed) >= from + 30
        });
    };
    load_runs("before the first reload");
    let limit = |d: &Daemon| {
        d.metrics()
            .lines()
            .find(|l| l.starts_with("limiter_http_pool_limit{pool=\"normal\"}"))
            .unwrap()
            .to_owned()
    };
    assert!(limit(&s.daemon).ends_with(" 3"));

    // A good change: applied, and the answer says what changed.
    std::fs::write(
        &s.config,
        text.replace("http.maxThreads = 14", "http.maxThreads = 20\nadmin.logLevel = warn"),
    )
    .unwrap();
    let (status, body) =
        limiter_tests::unix_request(s.daemon.socket.as_ref().unwrap(), "POST", "/reload").unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("http.maxThreads: 14 -> 20") && body.contains("admin.logLevel: (default) -> warn"),
        "{body}"
    );
    assert!(limit(&s.daemon).ends_with(" 9"));
    load_runs("after the good reload");

    // A bad file: nothing changes, the answer names file, line and key.
    std::fs::write(&s.config, text.replace("http.maxThreads = 14", "http.maxThreads = -3")).unwrap();
    let (status, body) =
        limiter_tests::unix_request(s.daemon.socket.as_ref().unwrap(), "POST", "/reload").unwrap();
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("http.maxThreads = -3") && body.contains("\"applied\":false"), "{body}");
    assert!(limit(&s.daemon).ends_with(" 9"), "a bad reload changed the limit");

    // A restart-only key: nothing changes, the answer names the key.
    std::fs::write(&s.config, text.replace("http.maxThreads = 14", "http.maxThreads = 30\nhttp.workers = 7"))
        .unwrap();
    let (status, body) =
        limiter_tests::unix_request(s.daemon.socket.as_ref().unwrap(), "POST", "/reload").unwrap();
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("http.workers changed, which needs a restart"), "{body}");
    assert!(limit(&s.daemon).ends_with(" 9"));
    load_runs("after the refused reloads");

    stop.store(true, Ordering::Relaxed);
    let (mut ok, mut refused) = (0, 0);
    for h in load {
        let (o, r, other) = h.join().unwrap();
        assert!(other.is_empty(), "only 200s and deliberate 503s under reloads: {other:?}");
        ok += o;
        refused += r;
    }
    // Three steps of at least 30 answers each (`load_runs`), most of them 200s.
    assert!(ok + refused >= 3 * 30 && ok > refused, "the load ran ({ok} ok, {refused} refused)");
    assert!(s.daemon.metrics().contains("limiter_config_reloads_total{result=\"rejected\"} 2"));
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn the_admin_token_guards_everything_but_healthz_and_no_credential_is_logged() {
    let dir = std::env::temp_dir().join(format!("lo-token-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let token = "t0ken-for-the-admin-listener-5f3a";
    let token_file = dir.join("token");
    limiter_tests::write_secret(&token_file, &format!("{token}\n"));
    let session = "Bearer session-secret-value-9c1d77";
    let s = setup(&format!("admin.tokenFile = {}\nhttp.maxSessionConnections = 2\n", token_file.display()));
    let a = s.daemon.admin;
    for path in ["/metrics", "/status", "/breaker"] {
        assert_eq!(admin(a, "GET", path, None).0, 401, "{path} without a token");
        assert_eq!(
            admin(a, "GET", path, Some("wrong-token-of-the-same-len-xxxx")).0,
            401,
            "{path}, wrong token"
        );
        assert_eq!(admin(a, "GET", path, Some(token)).0, 200, "{path} with the token");
    }
    assert_eq!(admin(a, "POST", "/reload", None).0, 401);
    assert_eq!(admin(a, "POST", "/breaker/open", None).0, 401);
    assert_eq!(admin(a, "GET", "/healthz", None).0, 200, "probes need no token");
    // `limiter dump --config` reads the token from the configuration.
    let out = limiter_tests::limiter(&["dump", "--json", "--config", s.config.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["daemon"]["running"], true, "{v}");

    for _ in 0..3 {
        let r = get(s.proxy, "/headers", &[&format!("Authorization: {session}")]);
        assert_eq!(r.status, 200);
    }
    let metrics = admin(a, "GET", "/metrics", Some(token)).1;
    let status = admin(a, "GET", "/status", Some(token)).1;
    let log = s.daemon.log();
    for (what, text) in [("log (debug level)", &log), ("metrics", &metrics), ("status", &status)] {
        assert!(!text.contains("session-secret-value"), "the session credential leaked into the {what}");
        assert!(!text.contains(token), "the admin token leaked into the {what}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn refusal_logs_are_rate_limited_and_account_for_every_refusal() {
    // The upstream may take as long as the refusals do (a 504 would free the
    // slot and turn refusals into 200s): an hour.
    let s = setup("http.maxThreads = 12\nhttp.upstreamTimeoutMs = 3600000\n");
    let proxy = s.proxy;
    // The one normal slot is taken (by a client that waits as long as it
    // takes): every other request is refused.
    let mut held = TcpStream::connect(proxy).unwrap();
    std::io::Write::write_all(&mut held, b"GET /hold HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    s.upstream.wait_holding(1);
    const REFUSALS: u64 = 100_000;
    let started = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let next = next.clone();
            std::thread::spawn(move || {
                while next.fetch_add(1, Ordering::Relaxed) < REFUSALS {
                    let r = client::send(proxy, b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n").expect("a reply");
                    assert_eq!(r.status, 503);
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    let elapsed = started.elapsed();
    let refusal_lines = || s.daemon.log().lines().filter(|l| l.contains("refused with 503")).count();
    // One more refusal after a quiet second carries the count the last
    // lines left out. (A timer: the log's one-second window has to pass.)
    std::thread::sleep(Duration::from_millis(1100));
    let logged = refusal_lines();
    assert_eq!(get(proxy, "/x", &[]).status, 503);
    wait_for("the line of the refusal after the quiet second", Duration::from_secs(5), || {
        refusal_lines() > logged
    });
    s.upstream.release();
    held.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(client::read_reply(&mut held).unwrap().status, 200);

    let log = s.daemon.log();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("refused with 503")).collect();
    let unlogged: u64 = lines
        .iter()
        .filter_map(|l| l.split("unlogged_since_last_line=").nth(1))
        .filter_map(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    let seconds = elapsed.as_secs() + 3;
    eprintln!("{} refusals in {elapsed:?}: {} log lines", REFUSALS + 1, lines.len());
    assert!(lines.len() as u64 <= 10 * seconds, "{} lines for {seconds} s", lines.len());
    assert_eq!(
        lines.len() as u64 + unlogged,
        REFUSALS + 1,
        "every refusal is either a line or counted in one"
    );
}
