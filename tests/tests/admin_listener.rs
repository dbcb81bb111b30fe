//! The admin listener against a hostile local client: heads too large,
//! heads that never end, connections piled up; and `/healthz` answering
//! during concurrent scrapes (the kernel reads and reloads run off the
//! runtime).

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    thread,
    time::{Duration, Instant},
};

use limiter::admin::{HEADER_TIMEOUT, MAX_CONNECTIONS};
use limiter_tests::{in_process::InProcess, upstream::Upstream};

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
fn large_and_endless_heads_are_cut_and_piled_up_connections_are_refused() {
    let up = Upstream::start();
    let d = InProcess::start(up.addr, "");
    // 20 heads of 400 KB: each answered 431 (or cut) at once, not kept.
    for _ in 0..20 {
        let mut s = TcpStream::connect(d.admin).unwrap();
        let _ = s.write_all(
            format!("GET /metrics HTTP/1.1\r\nHost: a\r\nX-Big: {}", "a".repeat(400_000)).as_bytes(),
        );
        assert!(open_for(s, Duration::from_secs(3)) < Duration::from_secs(2));
    }
    // A head that never ends is cut at the header timeout.
    let mut s = TcpStream::connect(d.admin).unwrap();
    s.write_all(b"GET /status HTTP/1.1\r\nHost: a\r\n").unwrap();
    let took = open_for(s, HEADER_TIMEOUT * 3);
    assert!(took >= HEADER_TIMEOUT - Duration::from_millis(200) && took < HEADER_TIMEOUT * 2, "{took:?}");
    // Piled-up idle connections: past the cap, closed at once.
    let held: Vec<TcpStream> = (0..MAX_CONNECTIONS).map(|_| TcpStream::connect(d.admin).unwrap()).collect();
    thread::sleep(Duration::from_millis(200));
    let extra = TcpStream::connect(d.admin).unwrap();
    assert!(
        open_for(extra, Duration::from_secs(3)) < Duration::from_secs(1),
        "the connection past the cap is closed"
    );
    drop(held);
    thread::sleep(Duration::from_millis(200));
    assert_eq!(d.admin("GET", "/healthz", &[]).status, 200);
}

#[test]
fn healthz_answers_during_fifty_concurrent_scrapes() {
    let up = Upstream::start();
    let d = InProcess::start(up.addr, "");
    let admin = d.admin;
    let scrapers: Vec<_> = (0..50)
        .map(|_| {
            thread::spawn(move || {
                for _ in 0..20 {
                    let mut s = TcpStream::connect(admin).unwrap();
                    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").unwrap();
                    let mut page = String::new();
                    let _ = s.read_to_string(&mut page);
                    assert!(page.starts_with("HTTP/1.1 200"), "{}", &page[..page.len().min(200)]);
                }
            })
        })
        .collect();
    let mut worst = Duration::ZERO;
    for _ in 0..20 {
        let started = Instant::now();
        assert_eq!(d.admin("GET", "/healthz", &[]).status, 200);
        worst = worst.max(started.elapsed());
        thread::sleep(Duration::from_millis(10));
    }
    scrapers.into_iter().for_each(|s| s.join().unwrap());
    eprintln!("/healthz during 50 concurrent scrapes: worst {worst:?}");
    assert!(worst < Duration::from_secs(1), "{worst:?}");
}

#[test]
fn the_metrics_listener_serves_metrics_and_healthz_only_without_the_token() {
    let up = Upstream::start();
    let dir = std::env::temp_dir().join(format!("limiter-metrics-listen-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let token = dir.join("token");
    std::fs::write(&token, "0123456789abcdef0123\n").unwrap();
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
    assert_eq!(d.admin("GET", "/status", &[]).status, 401, "admin.listen still wants the token");
    std::fs::remove_dir_all(&dir).unwrap();
}
