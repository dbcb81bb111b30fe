//! The circuit breaker through real sockets: a flapping upstream written
//! for the test, the real daemon in front of it.

use std::time::Duration;

use limiter_tests::{Daemon, client, process::wait_for, upstream::Upstream};

fn status(proxy: std::net::SocketAddr, path: &str) -> client::Reply {
    client::get(proxy, path, &[])
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn the_upstream_sees_nothing_while_open_exactly_the_probes_half_open_and_traffic_after_recovery() {
    let upstream = Upstream::start();
    let dir = std::env::temp_dir().join(format!("lb-{}", std::process::id()));
    let (config, proxy) = client::http_config(
        &dir,
        Some(upstream.addr),
        "[breaker]\nminRequests = 5\nthreshold = 0.5\nsleepWindowMs = 2000\nwindowMs = 10000\nbucketMs = 1000\n\
         halfOpenMaxProbes = 1\nhalfOpenSuccesses = 2\n",
    );
    let daemon = Daemon::start(&config, &[]).unwrap();
    let metric = |name: &str| -> String {
        let text = daemon.metrics();
        text.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("{name} missing")).to_owned()
    };

    // Healthy: five successes.
    for _ in 0..5 {
        assert_eq!(status(proxy, "/flap").status, 200);
    }
    // Failing: 500s pass through until failures are more than half of the
    // window (6 of 11), then the breaker opens.
    upstream.set_failing(true);
    for i in 0..6 {
        assert_eq!(status(proxy, "/flap").status, 500, "failure {i}");
    }
    assert_eq!(upstream.flap_hits(), 11);
    assert_eq!(metric("limiter_breaker_state{state=\"open\"}"), "limiter_breaker_state{state=\"open\"} 1");
    assert!(daemon.log().contains("circuit breaker closed -> open"), "{}", daemon.log());

    // Open: refused at once, the upstream sees nothing.
    for _ in 0..20 {
        let r = status(proxy, "/flap");
        assert_eq!(r.status, 503);
        assert_eq!(r.header("x-limiter-refused"), Some("breaker"));
        let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
        // At most the 2 s sleep window, plus up to a second of jitter.
        assert!((1..=3).contains(&retry), "retry-after {retry}");
    }
    assert_eq!(upstream.flap_hits(), 11, "the upstream was called while open");
    // Diagnostics still get through, and are not results.
    assert_eq!(status(proxy, "/debug/flap").status, 200);
    assert_eq!(
        metric("limiter_http_refused_total{reason=\"breaker\"}"),
        "limiter_http_refused_total{reason=\"breaker\"} 20"
    );

    // The sleep window over (the breaker turns half-open at the next
    // request once `/breaker` says a probe is due).
    let probe_due = || {
        let b: serde_json::Value =
            serde_json::from_str(&daemon.admin_get("/breaker").unwrap()).expect("/breaker is JSON");
        b["next_probe_in_ms"] == 0
    };

    // Half-open while still failing: exactly one probe, it fails, open again.
    wait_for("the 2 s sleep window over", Duration::from_secs(5), probe_due);
    assert_eq!(status(proxy, "/flap").status, 500, "the probe");
    assert_eq!(upstream.flap_hits(), 12);
    assert_eq!(status(proxy, "/flap").status, 503);
    assert_eq!(upstream.flap_hits(), 12);

    // Recovered upstream: probes, capped at one in flight, then two
    // consecutive successes close it.
    upstream.set_failing(false);
    wait_for("the 2 s sleep window over again", Duration::from_secs(5), probe_due);
    let hold = std::thread::spawn(move || client::get(proxy, "/hold", &[]));
    upstream.wait_holding(1);
    // One probe is out: everything else is refused, nothing reaches upstream.
    let before = upstream.hits();
    for _ in 0..5 {
        assert_eq!(status(proxy, "/flap").status, 503);
    }
    assert_eq!(upstream.hits(), before);
    upstream.release();
    assert_eq!(hold.join().unwrap().status, 200);
    assert_eq!(status(proxy, "/flap").status, 200, "second probe");
    assert_eq!(
        metric("limiter_breaker_state{state=\"closed\"}"),
        "limiter_breaker_state{state=\"closed\"} 1"
    );
    for _ in 0..10 {
        assert_eq!(status(proxy, "/flap").status, 200);
    }
    assert_eq!(metric("limiter_breaker_trips_total"), "limiter_breaker_trips_total 2");
    assert_eq!(
        metric("limiter_breaker_transitions_total{to=\"half_open\"}"),
        "limiter_breaker_transitions_total{to=\"half_open\"} 2"
    );

    // An operator forces it open, closed, and back to automatic.
    let forced = daemon.admin_post("/breaker/open").unwrap();
    assert!(forced.contains("\"mode\":\"forced_open\""), "{forced}");
    let before = upstream.hits();
    assert_eq!(status(proxy, "/flap").status, 503);
    assert_eq!(upstream.hits(), before);
    assert_eq!(
        metric("limiter_breaker_mode{mode=\"forced_open\"}"),
        "limiter_breaker_mode{mode=\"forced_open\"} 1"
    );
    let dump = limiter_tests::limiter(&["dump", "--config", config.to_str().unwrap()]);
    let dump = String::from_utf8_lossy(&dump.stdout).into_owned();
    assert!(dump.contains("breaker: open (forced_open)"), "{dump}");
    upstream.set_failing(true);
    daemon.admin_post("/breaker/close").unwrap();
    for _ in 0..20 {
        assert_eq!(status(proxy, "/flap").status, 500, "forced closed never trips");
    }
    let auto = daemon.admin_post("/breaker/auto").unwrap();
    assert!(auto.contains("\"mode\":\"auto\"") && auto.contains("\"state\":\"closed\""), "{auto}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn bypass_debug_off_subjects_diagnostics_to_the_open_breaker() {
    let upstream = Upstream::start();
    let dir = std::env::temp_dir().join(format!("lb2-{}", std::process::id()));
    let (config, proxy) = client::http_config(
        &dir,
        Some(upstream.addr),
        "breaker.minRequests = 2\nbreaker.bypassDebug = false\nbreaker.failureStatuses = 500-504, 429\n",
    );
    let _daemon = Daemon::start(&config, &[]).unwrap();
    upstream.set_failing(true);
    for _ in 0..2 {
        assert_eq!(status(proxy, "/flap").status, 500);
    }
    assert_eq!(status(proxy, "/flap").status, 503);
    let r = status(proxy, "/debug/x");
    assert_eq!((r.status, r.header("x-limiter-refused")), (503, Some("breaker")));
    let _ = std::fs::remove_dir_all(dir);
}
