//! A binary upgrade, or a DaemonSet surge: a second `run` on the same
//! configuration starts while the first serves, adopts the pinned gate
//! and binds beside it (`SO_REUSEPORT`); SIGTERM to the first drains it.
//! A client looping new connections through it all sees no error.

use std::{net::SocketAddr, thread, time::Duration};

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
