//! A binary upgrade, or a DaemonSet surge: a second `run` on the same
//! configuration starts while the first serves, adopts the pinned gate
//! and binds beside it (`SO_REUSEPORT`); SIGTERM to the first drains it.
//! A client looping new connections through it all sees no error.

use std::{
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use limiter_tests::{
    Daemon, Sandbox, client, in_netns,
    process::{terminate, wait_for},
    require_kernel, run,
    upstream::Upstream,
};

/// A sandbox whose namespace migrates queued connections, an upstream in
/// it, and a configuration proxying to it (`http.maxThreads = max_threads`)
/// with the gate on the proxy's port; the proxy's address.
fn setup(max_threads: u32) -> (Sandbox, Upstream, std::path::PathBuf, SocketAddr) {
    let sb = Sandbox::new().unwrap();
    // Queued connections of a closing listener move to the other daemon's.
    run("ip", &["netns", "exec", &sb.name, "sysctl", "-qw", "net.ipv4.tcp_migrate_req=1"]).unwrap();
    let up = sb.in_netns(Upstream::start);
    let config = sb.config("1:1", "");
    let text = std::fs::read_to_string(&config).unwrap();
    let proxy: SocketAddr =
        text.lines().find_map(|l| l.strip_prefix("http.listen = ")).unwrap().parse().unwrap();
    let text = text.replace("kernel.ports = 1:1", &format!("kernel.ports = {}:1000", proxy.port()));
    std::fs::write(&config, format!("{text}http.upstream = {}\nhttp.maxThreads = {max_threads}\n", up.addr))
        .unwrap();
    (sb, up, config, proxy)
}

#[test]
#[ignore = "black-box: the daemon binary, root, a network namespace and cgroup; run by `cargo xtask test`"]
fn a_second_run_beside_the_first_then_sigterm_to_the_first_refuses_no_connection() {
    require_kernel!();
    let (sb, _up, config, proxy) = setup(40);
    let mut first = Daemon::start_inside(&sb, &config, &[]).expect("the first daemon");

    let clients = client::Looping::start(&sb.netns_file(), proxy, 4);
    // Requests flow through each phase: the first alone, both, the second
    // alone.
    let flowed = |phase: &str| {
        let from = clients.ok();
        wait_for(&format!("20 requests answered {phase}"), Duration::from_secs(10), || {
            clients.ok() >= from + 20
        });
    };
    flowed("by the first alone");
    let mut second = Daemon::start_inside(&sb, &config, &[]).expect("the second daemon, beside the first");
    wait_for("the second daemon serving", Duration::from_secs(10), || {
        second.log().contains("HTTP proxy serving")
    });
    assert!(second.log().contains("kernel gate adopted"), "{}", second.log());
    assert!(listens(&sb, proxy, &first) && listens(&sb, proxy, &second), "both listen on the proxy's port");
    flowed("with both daemons serving");
    let before = clients.ok();
    assert_eq!(terminate(&mut first, Duration::from_secs(30)), Some(0));
    flowed("by the second alone");
    let (ok, errors) = clients.stop();
    eprintln!("handover: {ok} requests answered 200 ({before} before the SIGTERM), {} errors", errors.len());
    assert!(
        errors.is_empty(),
        "{} errors across the handover: {:?}",
        errors.len(),
        &errors[..errors.len().min(10)]
    );
    assert!(ok > before && before > 0, "requests flowed before and after: {before} then {ok}");
    assert!(second.metrics().contains("limiter_kernel_gate_attached 1"), "the gate stayed attached");
    assert_eq!(terminate(&mut second, Duration::from_secs(30)), Some(0));
    let _ = limiter_tests::limiter(&["unload", "--pin-path", sb.pin_path.to_str().unwrap()]);
}

/// `/healthz` asked every 20 ms on the admin port (which every daemon of
/// the handover listens on) from the sandbox's namespace: every answer
/// that is neither 200 nor a draining daemon's 503 is kept.
struct HealthWatch {
    stop: Arc<AtomicBool>,
    asked: Arc<AtomicU64>,
    bad: Arc<Mutex<Vec<String>>>,
    thread: thread::JoinHandle<()>,
}

impl HealthWatch {
    fn start(sb: &Sandbox, admin: SocketAddr) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let asked: Arc<AtomicU64> = Arc::default();
        let bad: Arc<Mutex<Vec<String>>> = Arc::default();
        let (s, a, b) = (Arc::clone(&stop), Arc::clone(&asked), Arc::clone(&bad));
        let netns = sb.netns_file();
        let ask = format!("GET /healthz HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\n\r\n");
        let thread = thread::spawn(move || {
            in_netns(&netns, move || {
                while !s.load(Ordering::Relaxed) {
                    let got = client::send(admin, ask.as_bytes());
                    a.fetch_add(1, Ordering::Relaxed);
                    match got {
                        Ok(r) if r.status == 200 => {}
                        Ok(r) if r.status == 503 && r.body.starts_with(b"draining") => {}
                        Ok(r) => b.lock().unwrap().push(format!(
                            "{} {}",
                            r.status,
                            String::from_utf8_lossy(&r.body)
                        )),
                        Err(e) => b.lock().unwrap().push(e.to_string()),
                    }
                    thread::sleep(Duration::from_millis(20));
                }
            })
        });
        Self { stop, asked, bad, thread }
    }

    /// Answers asked, and the bad ones.
    fn stop(self) -> (u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap();
        (self.asked.load(Ordering::Relaxed), self.bad.lock().unwrap().clone())
    }
}

/// The admin listener's address in `config`.
fn admin_of(config: &std::path::Path) -> SocketAddr {
    let text = std::fs::read_to_string(config).unwrap();
    text.lines().find_map(|l| l.strip_prefix("admin.listen = ")).unwrap().parse().unwrap()
}

/// Waits until `daemon` listens on the proxy's port, failing if it exits.
fn wait_listening(sb: &Sandbox, proxy: SocketAddr, daemon: &mut Daemon, which: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !listens(sb, proxy, daemon) {
        if let Some(status) = daemon.exited() {
            panic!("{which} exited before it listened ({status}):\n{}", daemon.log());
        }
        assert!(Instant::now() < deadline, "{which} did not listen within 30 s:\n{}", daemon.log());
        thread::sleep(Duration::from_millis(5));
    }
}

/// Waits until `daemon` serves (its log says so), failing if it exits.
fn wait_serving(daemon: &mut Daemon, which: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !daemon.log().contains("HTTP proxy serving") {
        if let Some(status) = daemon.exited() {
            panic!("{which} exited before it served ({status}):\n{}", daemon.log());
        }
        assert!(Instant::now() < deadline, "{which} did not serve within 60 s:\n{}", daemon.log());
        thread::sleep(Duration::from_millis(10));
    }
}

/// What a daemon's log must never say during a handover.
fn no_lost_gate(daemon: &Daemon, which: &str) {
    let log = daemon.log();
    for bad in ["detached under the running daemon", "whose load never completed", "ERROR"] {
        assert!(!log.contains(bad), "{which} logged {bad:?}:\n{log}");
    }
}

#[test]
#[ignore = "black-box: the daemon binary, root, a network namespace and cgroup; run by `cargo xtask test`"]
fn two_instances_started_at_the_same_instant_on_no_gate_both_serve_one_gate() {
    require_kernel!();
    for round in 0..5 {
        let (sb, _up, config, proxy) = setup(40);
        // At the same instant: neither waits for the other's port.
        let mut a = Daemon::launch_inside(&sb, &config).unwrap();
        let mut b = Daemon::launch_inside(&sb, &config).unwrap();
        wait_serving(&mut a, "the first");
        // From the moment one serves: the other may still be loading.
        let health = HealthWatch::start(&sb, admin_of(&config));
        wait_serving(&mut b, "the second");
        let clients = client::Looping::start(&sb.netns_file(), proxy, 4);
        let from = clients.ok();
        wait_for("requests answered by the two", Duration::from_secs(10), || clients.ok() >= from + 50);
        let (loaded, adopted) =
            (a.log().contains("kernel gate loaded"), b.log().contains("kernel gate loaded"));
        assert!(
            loaded != adopted,
            "round {round}: exactly one loaded the gate, the other adopted it:\n{}\n---\n{}",
            a.log(),
            b.log()
        );
        let waited = a.log().contains("waiting for it") || b.log().contains("waiting for it");
        let (ok, errors) = clients.stop();
        let (asked, bad) = health.stop();
        for (d, which) in [(&a, "the first"), (&b, "the second")] {
            no_lost_gate(d, which);
            assert!(d.metrics().contains("limiter_kernel_gate_attached 1"), "{which}: the gate attached");
        }
        assert!(
            errors.is_empty(),
            "round {round}: {} errors: {:?}",
            errors.len(),
            &errors[..errors.len().min(10)]
        );
        assert!(bad.is_empty(), "round {round}: /healthz answered {bad:?} ({asked} asked)");
        eprintln!(
            "round {round}: {ok} requests, {asked} /healthz, one waited for the other's load: {waited}"
        );
        assert_eq!(terminate(&mut a, Duration::from_secs(30)), Some(0));
        assert_eq!(terminate(&mut b, Duration::from_secs(30)), Some(0));
        let _ = limiter_tests::limiter(&["unload", "--pin-path", sb.pin_path.to_str().unwrap()]);
    }
}

#[test]
#[ignore = "black-box: the daemon binary, root, a network namespace and cgroup; run by `cargo xtask test`"]
fn a_hundred_handovers_each_started_as_soon_as_the_last_port_accepts_lose_nothing() {
    require_kernel!();
    const HANDOVERS: usize = 100;
    let (sb, _up, config, proxy) = setup(40);
    let mut previous = Daemon::start_inside(&sb, &config, &[]).expect("the first daemon");
    let health = HealthWatch::start(&sb, admin_of(&config));
    let clients = client::Looping::start(&sb.netns_file(), proxy, 4);
    // Each daemon is started as soon as the one before it listens (so
    // while that one may still be adopting the gate); the one before that
    // is stopped once the newest listens and it serves.
    let mut current = Daemon::launch_inside(&sb, &config).unwrap();
    wait_listening(&sb, proxy, &mut current, "daemon 1");
    let started = Instant::now();
    let mut waits = 0;
    for i in 2..=HANDOVERS + 1 {
        let mut next = Daemon::launch_inside(&sb, &config).unwrap();
        wait_listening(&sb, proxy, &mut next, &format!("daemon {i}"));
        wait_serving(&mut current, &format!("daemon {}", i - 1));
        no_lost_gate(&previous, &format!("daemon {}", i - 2));
        assert_eq!(terminate(&mut previous, Duration::from_secs(30)), Some(0), "daemon {}", i - 2);
        waits += usize::from(previous.log().contains("waiting for it"));
        previous = std::mem::replace(&mut current, next);
    }
    wait_serving(&mut current, "the last daemon");
    let took = started.elapsed();
    let (ok, errors) = clients.stop();
    let (asked, bad) = health.stop();
    for (d, which) in [(&previous, "the last but one"), (&current, "the last")] {
        no_lost_gate(d, which);
    }
    assert!(current.metrics().contains("limiter_kernel_gate_attached 1"), "the gate stayed attached");
    eprintln!(
        "{HANDOVERS} handovers in {:.1} s: {ok} requests answered 200, {} errors; {asked} /healthz, {} bad; \
         {waits} daemons waited for another's adoption",
        took.as_secs_f64(),
        errors.len(),
        bad.len()
    );
    assert!(errors.is_empty(), "{} errors: {:?}", errors.len(), &errors[..errors.len().min(10)]);
    assert!(bad.is_empty(), "/healthz answered {bad:?} ({asked} asked)");
    assert_eq!(terminate(&mut previous, Duration::from_secs(30)), Some(0));
    assert_eq!(terminate(&mut current, Duration::from_secs(30)), Some(0));
    let _ = limiter_tests::limiter(&["unload", "--pin-path", sb.pin_path.to_str().unwrap()]);
}

/// Sends `n` requests for `path` at once, each on its own connection;
/// returns the statuses (0: a connection error).
fn burst(netns: &std::fs::File, proxy: SocketAddr, path: &str, n: usize) -> Vec<u16> {
    let raw = format!("GET {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
    let threads: Vec<_> = (0..n)
        .map(|_| {
            let (netns, raw) = (netns.try_clone().unwrap(), raw.clone());
            thread::spawn(move || {
                in_netns(&netns, move || client::send(proxy, raw.as_bytes()).map_or(0, |r| r.status))
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

/// Whether `daemon` has a socket listening on the proxy's port (each of
/// its workers has one), as `ss` sees the sandbox.
fn listens(sb: &Sandbox, proxy: SocketAddr, daemon: &Daemon) -> bool {
    let filter = format!("sport = :{}", proxy.port());
    let owner = format!("pid={},", daemon.pid());
    run("ip", &["netns", "exec", &sb.name, "ss", "-Hltnp", &filter])
        .unwrap()
        .lines()
        .any(|l| l.contains(&owner))
}

fn tally(statuses: &[u16]) -> (usize, usize, usize) {
    let count = |s: u16| statuses.iter().filter(|&&x| x == s).count();
    (count(200), count(503), statuses.len() - count(200) - count(503))
}

#[test]
#[ignore = "black-box: the daemon binary, root, a network namespace and cgroup; run by `cargo xtask test`"]
fn during_a_handover_the_two_daemons_together_admit_no_more_than_the_limits() {
    require_kernel!();
    // 16 threads: 5 normal slots.
    let (sb, up, config, proxy) = setup(16);
    let mut first = Daemon::start_inside(&sb, &config, &[]).expect("the first daemon");
    let mut second = Daemon::start_inside(&sb, &config, &[]).expect("the second daemon");
    wait_for("the second daemon serving", Duration::from_secs(10), || {
        second.log().contains("HTTP proxy serving")
    });
    let netns = sb.netns_file();

    // 30 slow requests at once, spread over both daemons by the kernel.
    let statuses = burst(&netns, proxy, "/slowhead?ms=1500", 30);
    let (ok, refused, errors) = tally(&statuses);
    eprintln!(
        "30 at once across two daemons: {ok} admitted, {refused} refused, {errors} errors; upstream peak {}",
        up.slow_peak()
    );
    assert_eq!((ok, refused, errors), (5, 25, 0), "5 normal slots across both daemons: {statuses:?}");
    assert!(up.slow_peak() <= 5, "the upstream saw {} at once", up.slow_peak());
    let served = |d: &Daemon| d.log().lines().filter(|l| l.contains("HTTP proxy serving")).count();
    assert_eq!((served(&first), served(&second)), (1, 1));
    // Each sees the other (whichever answers the shared admin address).
    let m = second.metrics();
    assert!(m.contains("limiter_http_handover_peer 1"), "{m}");

    // The first drains with requests in flight: the second counts them
    // until they finish, then has the slots to itself.
    let in_flight = {
        let (netns, proxy) = (netns.try_clone().unwrap(), proxy);
        thread::spawn(move || burst(&netns, proxy, "/hold", 5))
    };
    up.wait_holding(5);
    first.signal(nix::sys::signal::Signal::SIGTERM);
    // The first has closed its listeners: what comes now meets the second.
    wait_for("the first's listeners closed", Duration::from_secs(10), || !listens(&sb, proxy, &first));
    assert!(listens(&sb, proxy, &second), "the second still listens");
    assert!(first.log().contains("draining"), "{}", first.log());
    let during = burst(&netns, proxy, "/x", 10);
    assert_eq!(
        tally(&during),
        (0, 10, 0),
        "every slot is held by the draining one or the second: {during:?}"
    );
    assert_eq!(up.holding(), 5, "the draining one's requests were still in flight");
    up.release();
    assert_eq!(tally(&in_flight.join().unwrap()), (5, 0, 0));
    assert!(limiter_tests::process::exited_within(first.pid(), Duration::from_secs(30)));
    let _ = first.wait();
    wait_for("the second to see the first gone", Duration::from_secs(5), || {
        second.metrics().contains("limiter_http_handover_peer 0")
    });
    let after = burst(&netns, proxy, "/slowhead?ms=500", 8);
    assert_eq!(tally(&after), (5, 3, 0), "the second alone: its 5 slots: {after:?}");
    assert!(up.slow_peak() <= 5, "the upstream saw {} at once", up.slow_peak());
    assert_eq!(terminate(&mut second, Duration::from_secs(30)), Some(0));
    let _ = limiter_tests::limiter(&["unload", "--pin-path", sb.pin_path.to_str().unwrap()]);
}

#[test]
#[ignore = "black-box: the daemon binary, root, a network namespace and cgroup; run by `cargo xtask test`"]
fn the_new_daemon_starts_from_the_adaptive_limit_the_old_one_learnt() {
    require_kernel!();
    let (sb, _up, config, proxy) = setup(208);
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("{text}http.adaptive = on\nhttp.adaptive.minLimit = 2\n")).unwrap();
    let mut first = Daemon::start_inside(&sb, &config, &[]).expect("the first daemon");
    let limit = |d: &Daemon| d.metric("limiter_http_limit{pool=\"normal\"}");
    // 40 clients before an upstream that serves 4 at once (`/work`).
    let load = in_netns(&sb.netns_file(), move || {
        limiter_tests::closed_loop::ClosedLoop::start(proxy, 40, &["/work?ms=20"], Duration::from_millis(20))
    });
    wait_for("the first daemon's limit learnt", Duration::from_secs(10), || limit(&first) <= 12.0);
    let learnt = limit(&first);
    let mut second = Daemon::start_inside(&sb, &config, &[]).expect("the second daemon");
    wait_for("the second daemon serving", Duration::from_secs(10), || {
        second.log().contains("starting from the limit the other daemon serving the gate learnt")
    });
    let started_at = limit(&second);
    assert!(
        started_at <= 2.0 * learnt.max(6.0),
        "the second starts at {started_at}, the first learnt {learnt}"
    );
    assert_eq!(terminate(&mut first, Duration::from_secs(30)), Some(0));
    thread::sleep(Duration::from_secs(1));
    assert!(limit(&second) < 40.0, "the second keeps a learnt limit: {}", limit(&second));
    let answers = load.stop();
    // A keep-alive connection the draining daemon closes while its client
    // is sending the next request fails that request (as with any HTTP/1.1
    // server closing an idle connection; clients retry it): at most one
    // per client.
    let failed = answers.iter().filter(|a| a.status != 200 && a.status != 503).count();
    assert!(failed <= 40, "{failed} requests failed across the handover");
    assert_eq!(terminate(&mut second, Duration::from_secs(30)), Some(0));
    let _ = limiter_tests::limiter(&["unload", "--pin-path", sb.pin_path.to_str().unwrap()]);
}
