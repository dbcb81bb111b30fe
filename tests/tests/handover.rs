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
    time::Duration,
};

use limiter_tests::{
    Daemon, Sandbox, client, in_netns,
    process::{terminate, wait_for},
    require_kernel, run,
    upstream::Upstream,
};

#[test]
#[ignore = "black-box: the daemon binary, root, a network namespace and cgroup; run by `cargo xtask test`"]
fn a_second_run_beside_the_first_then_sigterm_to_the_first_refuses_no_connection() {
    require_kernel!();
    let sb = Sandbox::new().unwrap();
    // Queued connections of a closing listener move to the other daemon's.
    run("ip", &["netns", "exec", &sb.name, "sysctl", "-qw", "net.ipv4.tcp_migrate_req=1"]).unwrap();
    let up = sb.in_netns(Upstream::start);
    let config = sb.config("1:1", "");
    let text = std::fs::read_to_string(&config).unwrap();
    let proxy: SocketAddr =
        text.lines().find_map(|l| l.strip_prefix("http.listen = ")).unwrap().parse().unwrap();
    let text = text.replace("kernel.ports = 1:1", &format!("kernel.ports = {}:1000", proxy.port()));
    std::fs::write(&config, format!("{text}http.upstream = {}\nhttp.maxThreads = 40\n", up.addr)).unwrap();
    let mut first = Daemon::start_inside(&sb, &config, &[]).expect("the first daemon");

    let (stop, ok) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let (stop, ok, errors, netns) = (stop.clone(), ok.clone(), errors.clone(), sb.netns_file());
            thread::spawn(move || {
                in_netns(&netns, move || {
                    while !stop.load(Ordering::Relaxed) {
                        match client::send(proxy, b"GET /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
                        {
                            Ok(r) if r.status == 200 => _ = ok.fetch_add(1, Ordering::Relaxed),
                            Ok(r) => errors.lock().unwrap().push(format!("status {}", r.status)),
                            Err(e) => errors.lock().unwrap().push(e.to_string()),
                        }
                    }
                })
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(300));
    let mut second = Daemon::start_inside(&sb, &config, &[]).expect("the second daemon, beside the first");
    wait_for("the second daemon serving", Duration::from_secs(10), || {
        second.log().contains("HTTP proxy serving")
    });
    assert!(second.log().contains("kernel gate adopted"), "{}", second.log());
    thread::sleep(Duration::from_millis(300));
    let before = ok.load(Ordering::Relaxed);
    assert_eq!(terminate(&mut first, Duration::from_secs(30)), Some(0));
    thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    clients.into_iter().for_each(|c| c.join().unwrap());
    let (ok, errors) = (ok.load(Ordering::Relaxed), errors.lock().unwrap().clone());
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
