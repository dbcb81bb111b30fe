//! The admin listener against a hostile local client: heads too large,
//! heads that never end, connections piled up; and `/healthz` and
//! `/reload` answering during concurrent scrapes of a large gate (the
//! kernel reads run off the runtime).

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    thread,
    time::{Duration, Instant},
};

use limiter::admin::{HEADER_TIMEOUT, MAX_CONNECTIONS};
use limiter_tests::{in_process::InProcess, process::wait_for, upstream::Upstream};

/// How long the server keeps `s` open, reading what it sends.
fn open_for(mut s: TcpStream, limit: Duration) -> Duration {
    s.set_read_timeout(Some(limit)).unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return started.elapsed(),
            Ok(_) => {}
        }
    }
}

#[test]
fn large_and_endless_heads_are_cut_and_piled_up_connections_cannot_keep_a_probe_out() {
    let up = Upstream::start();
    let d = InProcess::start(up.addr, "");
    // 20 heads of 400 KB: each answered 431 (or cut) at once, not kept.
    for _ in 0..20 {
        let mut s = TcpStream::connect(d.admin).unwrap();
        let _ = s.write_all(
            format!("GET /metrics HTTP/1.1\r\nHost: {}\r\nX-Big: {}", d.admin, "a".repeat(400_000))
                .as_bytes(),
        );
        assert!(open_for(s, Duration::from_secs(3)) < Duration::from_secs(2));
    }
    // A head that never ends is cut at the header timeout.
    let mut s = TcpStream::connect(d.admin).unwrap();
    s.write_all(format!("GET /status HTTP/1.1\r\nHost: {}\r\n", d.admin).as_bytes()).unwrap();
    let took = open_for(s, HEADER_TIMEOUT * 3);
    assert!(took >= HEADER_TIMEOUT - Duration::from_millis(200) && took < HEADER_TIMEOUT * 2, "{took:?}");
    // Piled-up idle connections: all the slots taken by connections that
    // each had one request answered (so each surely holds its slot) and
    // then sit idle, as a local process could keep them.
    let healthz = format!("GET /healthz HTTP/1.1\r\nHost: {}\r\n\r\n", d.admin);
    let mut held: Vec<TcpStream> =
        (0..MAX_CONNECTIONS).map(|_| limiter_tests::client::connect(d.admin)).collect();
    for s in &mut held {
        s.write_all(healthz.as_bytes()).unwrap();
    }
    for (i, s) in held.iter_mut().enumerate() {
        let reply =
            limiter_tests::client::read_reply(s).unwrap_or_else(|e| panic!("held connection {i}: {e}"));
        assert_eq!(reply.status, 200, "held connection {i}");
    }
    // A probe past the cap is answered: it takes the slot of the oldest
    // idle connection, which is closed.
    // (Each probe's connection is kept, so the next one finds no slot free.)
    let mut probes = Vec::new();
    for (probe, oldest) in held.iter_mut().take(3).enumerate() {
        let mut s = limiter_tests::client::connect(d.admin);
        s.write_all(healthz.as_bytes()).unwrap();
        let reply = limiter_tests::client::read_reply(&mut s).expect("the probe's answer");
        probes.push(s);
        assert_eq!(reply.status, 200, "probe {probe} past {MAX_CONNECTIONS} idle connections");
        assert!(
            limiter_tests::client::closed_by_server(oldest),
            "the oldest idle connection ({probe}) gave its slot"
        );
    }
    assert!(!limiter_tests::client::closed_by_server(&mut held[3]), "the next oldest kept its own");
}

/// One request to the admin listener: its status, and how long it took.
fn timed(admin: std::net::SocketAddr, method: &str, path: &str) -> (u16, Duration) {
    let started = Instant::now();
    let raw = format!(
        "{method} {path} HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    );
    let status = limiter_tests::client::send(admin, raw.as_bytes()).map_or(0, |r| r.status);
    (status, started.elapsed())
}

#[test]
#[ignore = "black-box: the daemon binary, root, a network namespace and cgroup; run by `cargo xtask test`"]
fn healthz_and_reload_answer_during_fifty_concurrent_scrapes_of_a_large_gate() {
    limiter_tests::require_kernel!();
    // 1,048,576 source slots: a full read takes about 140 ms in a release
    // build (the first scrape of a process does one; later ones read what
    // changed); on the runtime's two threads, fifty full reads at once
    // would hold /healthz for seconds.
    let sb = limiter_tests::Sandbox::new().unwrap();
    let config = sb.config("8080:100", "kernel.sourceTableSize = 1048576\n");
    let daemon = limiter_tests::Daemon::start(&config, &[]).expect("the daemon starts");
    let admin = daemon.admin;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let pages = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let scrapers: Vec<_> = (0..50)
        .map(|_| {
            let (stop, pages) = (stop.clone(), pages.clone());
            thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    assert_eq!(timed(admin, "GET", "/metrics").0, 200);
                    pages.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            })
        })
        .collect();
    let pages_now = || pages.load(std::sync::atomic::Ordering::Relaxed);
    // The scrapes are under way: the process's first (whole) read is done
    // and 50 pages have been served.
    wait_for("50 pages scraped", Duration::from_secs(30), || pages_now() >= 50);
    let before = pages_now();
    let (mut healthz, mut reload) = (Duration::ZERO, Duration::ZERO);
    for i in 0..20 {
        let (path, worst) = if i % 5 == 4 { ("/reload", &mut reload) } else { ("/healthz", &mut healthz) };
        // /reload on the admin socket (admin.listen without a token serves
        // /metrics and /healthz only).
        let (status, took) = if path == "/reload" {
            let started = Instant::now();
            let socket = daemon.socket.as_ref().expect("an admin socket");
            (limiter_tests::unix_request(socket, "POST", path).map_or(0, |r| r.0), started.elapsed())
        } else {
            timed(admin, "GET", path)
        };
        assert_eq!(status, 200, "{path}");
        *worst = (*worst).max(took);
        // Pacing: the probes spread over the scrapes, not synchronisation.
        thread::sleep(Duration::from_millis(20));
    }
    let during = pages_now() - before;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    scrapers.into_iter().for_each(|s| s.join().unwrap());
    eprintln!(
        "during 50 concurrent scrapes ({during} pages while probing): /healthz worst {healthz:?}, /reload worst {reload:?}"
    );
    assert!(during >= 50, "the scrapes ran while /healthz and /reload were asked: {during} pages");
    assert!(healthz < Duration::from_secs(1), "/healthz: {healthz:?}");
    // A reload writes the maps alone, so it waits for the scrapes reading
    // now: each reads only what changed, so not for long (it waited
    // 5.3 s here when every scrape read the whole table).
    assert!(reload < Duration::from_secs(2), "/reload: {reload:?}");
    drop(daemon);
    let _ = limiter_tests::limiter(&["unload", "--pin-path", sb.pin_path.to_str().unwrap()]);
}

#[test]
fn the_metrics_listener_serves_metrics_and_healthz_only_without_the_token() {
    let up = Upstream::start();
    let dir = std::env::temp_dir().join(format!("limiter-metrics-listen-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let token = dir.join("token");
    limiter_tests::write_secret(&token, "0123456789abcdef0123\n");
    let d = InProcess::start(
        up.addr,
        &format!("admin.tokenFile = {}\nadmin.metricsListen = 127.0.0.1:0\n", token.display()),
    );
    let metrics = d.metrics.expect("a metrics listener");
    let ask = |method: &str, path: &str| {
        let raw =
            format!("{method} {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\nContent-Length: 0\r\n\r\n");
        limiter_tests::client::send(metrics, raw.as_bytes()).unwrap()
    };
    let page = ask("GET", "/metrics");
    assert_eq!(page.status, 200, "no token needed");
    assert!(page.text().contains("limiter_http_in_flight"));
    assert_eq!(ask("GET", "/healthz").status, 200);
    for path in ["/status", "/breaker", "/reload"] {
        assert_eq!(ask("GET", path).status, 404, "{path}");
    }
    assert_eq!(ask("POST", "/reload").status, 404, "no reload there");
    assert_eq!(ask("POST", "/metrics").status, 405);
    // Any Host (Prometheus may scrape it by name; `Host: a` above), but
    // no page of another site.
    let cross = format!(
        "GET /metrics HTTP/1.1\r\nHost: {metrics}\r\nOrigin: https://evil.example\r\nConnection: close\r\n\r\n"
    );
    assert_eq!(limiter_tests::client::send(metrics, cross.as_bytes()).unwrap().status, 403);
    assert_eq!(d.admin("GET", "/status", &[]).status, 401, "admin.listen still wants the token");
    // The scheme is case-insensitive (RFC 9110 §11.1).
    for auth in ["Bearer 0123456789abcdef0123", "bearer 0123456789abcdef0123", "BEARER 0123456789abcdef0123"]
    {
        assert_eq!(d.admin("GET", "/status", &[&format!("Authorization: {auth}")]).status, 200, "{auth}");
    }
    assert_eq!(d.admin("GET", "/status", &["Authorization: Basic 0123456789abcdef0123"]).status, 401);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[ignore = "black-box: the daemon binary, root, a network namespace and cgroup; run by `cargo xtask test`"]
fn scrapes_of_a_large_source_table_read_what_changed_not_the_table() {
    limiter_tests::require_kernel!();
    let sb = limiter_tests::Sandbox::new().unwrap();
    let p = limiter_tests::free_port();
    let config = sb.config(
        &format!("{p}:1000"),
        &format!("kernel.sourceTableSize = 1048576\nkernel.port.{p}.perSourceMax = 100\n"),
    );
    let daemon = limiter_tests::Daemon::start(&config, &[]).expect("the daemon starts");
    let status =
        || -> serde_json::Value { serde_json::from_str(&daemon.admin_get("/status").unwrap()).unwrap() };
    let gate = |s: &serde_json::Value| s["kernel"]["gate"].clone();
    let calls = |s: &serde_json::Value| gate(s)["source_read_calls"].as_u64().unwrap();
    let first = status();
    // The first read of the process reads the whole table: 1,048,576 slots
    // and 66,560 counters, 8,192 a call.
    assert!(calls(&first) >= 128 + 8, "{}", calls(&first));
    let quiet = status();
    assert_eq!(calls(&quiet), 1, "nothing changed: one read of the super-block counters");

    // Connections from 20 groups, then a few closed: the daemon's cached
    // view must equal a full read (`dump`, a new process), and cost only
    // the blocks that changed.
    let l = sb.listen(&format!("0.0.0.0:{p}"), 512);
    let dst = std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, p));
    let mut held = Vec::new();
    for g in 1..=20u8 {
        for _ in 0..u32::from(g % 3 + 1) {
            let src = std::net::IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 1, g));
            held.push(sb.in_netns(move || limiter_tests::peer::connect_from(dst, Some(src))).unwrap());
        }
    }
    let total = held.len();
    let mut accepted = limiter_tests::accept_n(&l, total);
    limiter_tests::wait_established(&sb.pin_path, p, total as u64);
    let compare = |what: &str| {
        let cached = status();
        let full = limiter_tests::dump(&sb.pin_path);
        assert_eq!(gate(&cached)["top_sources"], full["kernel"]["top_sources"], "{what}");
        assert_eq!(gate(&cached)["source_slots_used"], full["kernel"]["source_slots_used"], "{what}");
        calls(&cached)
    };
    let after_connects = compare("after 20 groups connected");
    // At most: the super-blocks, and per changed block its super-block's
    // block counters and its 16 slots.
    assert!(after_connects <= 1 + 2 * 20, "{after_connects} reads for 20 changed groups");
    held.truncate(total - 7);
    accepted.truncate(total - 7);
    limiter_tests::wait_established(&sb.pin_path, p, total as u64 - 7);
    compare("after 7 connections closed");
    drop((held, accepted));
    limiter_tests::wait_established(&sb.pin_path, p, 0);
    compare("after every connection closed");
    assert_eq!(compare("again"), 1, "nothing changed since");
    assert_eq!(gate(&status())["source_slots_used"], 0);
    eprintln!(
        "1,048,576 slots: first read {} calls, unchanged 1, after 20 groups connected {after_connects}",
        calls(&first)
    );
    drop(daemon);
    let _ = limiter_tests::limiter(&["unload", "--pin-path", sb.pin_path.to_str().unwrap()]);
}

/// The exact request a web page anywhere can make a browser send: a
/// simple cross-site POST (no preflight), and a DNS-rebinding read under
/// the attacker's own name.
#[test]
fn a_web_page_can_neither_drive_nor_read_the_admin_listener() {
    let up = Upstream::start();
    let d = InProcess::start(up.addr, "");
    let port = d.admin.port();
    let send = |raw: String| limiter_tests::client::send(d.admin, raw.as_bytes()).unwrap();
    let cross_site = send(format!(
        "POST /breaker/open HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nOrigin: https://evil.example\r\n\
         Content-Type: text/plain\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    ));
    assert_eq!(cross_site.status, 403, "{}", cross_site.text());
    assert_eq!(d.breaker_state(), "closed", "the breaker did not open");
    for origin in ["null", "http://evil.example", &format!("http://127.0.0.1:{}", port + 1)] {
        let r = send(format!(
            "POST /reload HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nOrigin: {origin}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        ));
        assert_eq!(r.status, 403, "Origin: {origin}");
    }
    let rebound =
        send(format!("GET /status HTTP/1.1\r\nHost: evil.example:{port}\r\nConnection: close\r\n\r\n"));
    assert_eq!(rebound.status, 403, "a rebound name: {}", rebound.text());
    assert!(!rebound.text().contains("pid"), "nothing of /status in the refusal");
    // The listener's own names, and its own origin, are served.
    for host in [format!("127.0.0.1:{port}"), format!("localhost:{port}"), "localhost".into()] {
        let r = send(format!("GET /metrics HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"));
        assert_eq!(r.status, 200, "Host: {host}");
    }
    let same_origin = send(format!(
        "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nOrigin: http://127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    ));
    assert_eq!(same_origin.status, 200);
    // HTTP/1.0 without a Host (an old script) names no other site.
    assert_eq!(send("GET /healthz HTTP/1.0\r\n\r\n".into()).status, 200);
}
