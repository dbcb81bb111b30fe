//! The adaptive limit (`http.adaptive`) and criticality (`http.critical`,
//! `http.sheddable`), end to end: the real daemon (without its kernel
//! gate) before the test upstream's `/work`, which serves a few requests
//! at once and queues the rest, as servlets wait for a database pool;
//! closed-loop clients at many times its capacity.

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use limiter_tests::{
    Daemon,
    client::http_config,
    closed_loop::{Answer, ClosedLoop, window},
    upstream::{Upstream, WORKERS},
};

/// The upstream's service time (ms): `/work?ms=40`.
const S: u64 = 40;
const CLIENTS: usize = 60;
const BACKOFF: Duration = Duration::from_millis(20);

struct Setup {
    daemon: Daemon,
    proxy: SocketAddr,
    upstream: Upstream,
    dir: std::path::PathBuf,
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn setup(name: &str, extra: &str) -> Setup {
    let upstream = Upstream::start();
    let dir = std::env::temp_dir().join(format!("la-{name}-{}", std::process::id()));
    let (config, proxy) = http_config(&dir, Some(upstream.addr), extra);
    let daemon = Daemon::start(&config, &[]).expect("daemon starts");
    Setup { daemon, proxy, upstream, dir }
}

impl Setup {
    fn reload_with(&self, key: &str, value: &str) {
        let mut text = std::fs::read_to_string(&self.daemon.config).unwrap();
        text = match text.lines().find(|l| l.starts_with(&format!("{key} = "))) {
            Some(old) => text.replace(old, &format!("{key} = {value}")),
            None => format!("{text}{key} = {value}\n"),
        };
        std::fs::write(&self.daemon.config, text).unwrap();
        let outcome = self.daemon.reload();
        assert!(outcome.contains("applied"), "{outcome}");
    }

    fn limit(&self) -> f64 {
        self.daemon.metric("limiter_http_limit{pool=\"normal\"}")
    }

    /// Polls the normal pool's limit in force until `ok` holds of it, for
    /// at most `within`; the time it took.
    fn limit_until(&self, within: Duration, ok: impl Fn(f64) -> bool) -> Duration {
        let start = Instant::now();
        loop {
            let l = self.limit();
            if ok(l) {
                return start.elapsed();
            }
            assert!(start.elapsed() < within, "limit {l} after {within:?}:\n{}", self.daemon.metrics());
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn describe(answers: &[Answer], from: u64, to: u64) -> String {
    format!("{:?}", window(answers, secs(from), secs(to), None))
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn a_learnt_limit_keeps_admitted_latency_near_the_service_time_and_follows_a_step_of_capacity() {
    let s = setup("learn", "http.maxThreads = 208\nhttp.adaptive.minLimit = 2\n");
    let path = format!("/work?ms={S}");
    let load = ClosedLoop::start(s.proxy, CLIENTS, &[&path], BACKOFF);

    // The static pool (197) admits all 60: they queue in the upstream.
    std::thread::sleep(secs(3));
    assert_eq!(s.limit(), 197.0);
    // Switched on live, in the middle of it.
    s.reload_with("http.adaptive", "on");
    let on = load.started.elapsed();
    let took = s.limit_until(secs(5), |l| l <= f64::from(WORKERS) * 2.0);
    let settled = (on + took).as_secs() + 2;
    std::thread::sleep(secs(settled + 3).saturating_sub(load.started.elapsed()));

    // Capacity doubled: followed within 5 s.
    s.upstream.set_capacity(WORKERS * 2);
    let stepped = load.started.elapsed().as_secs() + 1;
    let up = s.limit_until(secs(5), |l| l >= f64::from(WORKERS * 2) - 1.0);
    std::thread::sleep(secs(3));
    let end = load.started.elapsed().as_secs();
    let answers = load.stop();

    let static_pool = window(&answers, secs(1), secs(3), None);
    let learnt = window(&answers, secs(settled), secs(settled + 3), None);
    let doubled = window(&answers, secs(stepped + up.as_secs() + 1), secs(end), None);
    let all = describe(&answers, 0, end);
    // The static pool: nothing refused, every request waits behind the
    // queue (60 clients, 4 at once, 40 ms each: about 600 ms).
    assert_eq!(static_pool.refused, 0, "{static_pool:?}");
    assert!(static_pool.p99 >= Duration::from_millis(6 * S), "{static_pool:?}");
    // Learnt: admitted requests within four service times, goodput near
    // the upstream's 100 a second, 503s at once: under one service time,
    // which a request that waited for the upstream cannot be (a few ms
    // here; 16 at p99 with 60 client threads on two busy CPUs).
    assert!(learnt.p99 <= Duration::from_millis(4 * S), "learnt {learnt:?}; all {all}");
    assert!(learnt.goodput >= 0.8 * 1000.0 / S as f64 * f64::from(WORKERS), "learnt {learnt:?}");
    assert!(learnt.refused > 0 && learnt.refused_p99 < Duration::from_millis(S), "learnt {learnt:?}");
    assert_eq!(learnt.failed, 0);
    assert!(doubled.goodput >= 0.8 * 2000.0 / S as f64 * f64::from(WORKERS), "doubled {doubled:?}");
    assert!(doubled.p99 <= Duration::from_millis(4 * S), "doubled {doubled:?}");
    eprintln!(
        "static {static_pool:?}\nlearnt in {took:?}: {learnt:?}\ndoubled, followed in {up:?}: {doubled:?}"
    );

    // What an operator sees.
    let m = s.daemon.metrics();
    for family in [
        "limiter_http_adaptive_base_latency_seconds ",
        "limiter_http_adaptive_capacity ",
        "limiter_http_adaptive_descents_total{found=\"queue\"}",
        "limiter_http_pool_limit{pool=\"normal\"} 197",
    ] {
        assert!(m.contains(family), "{family} missing:\n{m}");
    }
    let base = s.daemon.metric("limiter_http_adaptive_base_latency_seconds");
    assert!((0.9 * S as f64 / 1e3..2.0 * S as f64 / 1e3).contains(&base), "base latency {base}");
    let status = s.daemon.admin_get("/status").unwrap();
    assert!(status.contains("\"adaptive\":{"), "{status}");
    assert!(s.daemon.log().contains("adaptive limit of the normal pool changed by more than a fifth"));
    let dump = limiter_tests::limiter(&["dump", "--config", s.daemon.config.to_str().unwrap()]);
    let dump = String::from_utf8_lossy(&dump.stdout);
    assert!(dump.contains("http adaptive limit ") && dump.contains(" of 197 (base latency "), "{dump}");

    // Off again: the static pool, at once.
    s.reload_with("http.adaptive", "off");
    assert_eq!(s.limit(), 197.0);
    assert!(!s.daemon.metrics().contains("limiter_http_adaptive_capacity"));
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn under_pressure_sheddable_requests_are_refused_first_and_critical_ones_last() {
    // A pool of 9 (20 - 11) before an upstream that queues nothing: the
    // pool is the only limit. 10 clients of each class.
    let s = setup("classes", "http.maxThreads = 20\nhttp.critical = /pay/\nhttp.sheddable = /search/\n");
    s.upstream.set_capacity(100);
    let paths = [
        format!("/search/work?ms={S}"),
        format!("/other/work?ms={S}"),
        format!("/api/x/../../pay/work?ms={S}"),
    ];
    let paths: Vec<&str> = paths.iter().map(String::as_str).collect();
    let load = ClosedLoop::start(s.proxy, 30, &paths, BACKOFF);
    std::thread::sleep(secs(4));
    let answers = load.stop();
    let by = |p: usize| window(&answers, secs(1), secs(4), Some(p));
    let (sheddable, normal, critical) = (by(0), by(1), by(2));
    let text = format!("sheddable {sheddable:?}\nnormal {normal:?}\ncritical {critical:?}");
    // Under pressure a sheddable request may use 7 of the 9 slots, a
    // normal one 8 (one is kept for critical paths), a critical one all 9:
    // the order at each count is admission's unit test
    // (`under_pressure_sheddable_requests_go_first_and_critical_ones_last`).
    // Here, that the daemon classes each path (a critical one behind `..`
    // too) and applies it: with critical clients enough to fill the pool,
    // they take nearly all of it, by a margin no noise of two shared CPUs
    // crosses (normal and sheddable requests get a few a second; comparing
    // those two near-zero figures would test the noise).
    let others = normal.goodput + sheddable.goodput;
    assert!(critical.goodput > 3.0 * others, "{text}");
    assert!(critical.refused < sheddable.refused + normal.refused, "{text}");
    let reasons = |p: usize| {
        let mut r: Vec<String> = answers
            .iter()
            .filter(|a| a.path == p && a.status == 503)
            .filter_map(|a| a.reason.clone())
            .collect();
        r.sort();
        r.dedup();
        r
    };
    assert_eq!(reasons(0), ["sheddable"], "{text}");
    assert_eq!(reasons(1), ["normal"], "{text}");
    assert_eq!(reasons(2), ["critical"], "{text}");
    let m = s.daemon.metrics();
    assert!(s.daemon.metric("limiter_http_refused_total{reason=\"sheddable\"}") > 0.0, "{m}");
    eprintln!("{text}");
}

/// The reasons of the 503s a closed-loop load gets for `path` in `for_`.
fn reasons_for(s: &Setup, path: &str, for_: Duration) -> Vec<String> {
    let load = ClosedLoop::start(s.proxy, 20, &[path], BACKOFF);
    std::thread::sleep(for_);
    let mut r: Vec<String> = load.stop().into_iter().filter_map(|a| a.reason).collect();
    r.sort();
    r.dedup();
    r
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn the_floor_and_the_classes_change_live() {
    let s = setup("live", "http.maxThreads = 20\nhttp.adaptive = on\nhttp.adaptive.minLimit = 1\n");
    // The upstream serves one at a time: the learnt limit goes down to 1 or 2.
    s.upstream.set_capacity(1);
    let load = ClosedLoop::start(s.proxy, 20, &[&format!("/work?ms={S}")], BACKOFF);
    s.limit_until(secs(10), |l| l <= 2.0);
    // A floor above it applies at once.
    s.reload_with("http.adaptive.minLimit", "6");
    assert!(s.limit() >= 6.0, "limit {} under a floor of 6", s.limit());
    drop(load.stop());

    // The classes: the same path refused as normal, then as sheddable, then
    // as critical.
    s.reload_with("http.adaptive", "off");
    s.upstream.set_capacity(100);
    let path = format!("/search/work?ms={S}");
    assert_eq!(reasons_for(&s, &path, secs(1)), ["normal"]);
    s.reload_with("http.sheddable", "/search/");
    assert_eq!(reasons_for(&s, &path, secs(1)), ["sheddable"]);
    s.reload_with("http.critical", "/search/");
    assert_eq!(reasons_for(&s, &path, secs(1)), ["critical"], "a path matching both is critical");
}
