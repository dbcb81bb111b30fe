//! A pinned layout change: the gate pinned and enforcing by the last
//! limiter of layout 2 (built from its commit by `cargo xtask test`, its
//! path in `LIMITER_LAYOUT2_BIN`), with connections held, is adopted by
//! this binary beside the running old daemon and migrated in place: the
//! same links, new programs, the counts exact, every attempt on the full
//! port refused throughout, and the old connections uncounted correctly by
//! the new programs.

use std::{
    io::ErrorKind,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use limiter_tests::{
    Daemon, Sandbox, accept_n, dump, free_port,
    peer::connect_from,
    port,
    process::{terminate, wait_for},
    require_kernel, wait_established,
};
use serde_json::Value;

/// The layout-2 daemon; failing (not skipping) without it.
fn layout2_binary() -> PathBuf {
    let path = std::env::var_os("LIMITER_LAYOUT2_BIN").map(PathBuf::from).expect(
        "LIMITER_LAYOUT2_BIN is not set: `cargo xtask test` builds the last layout-2 limiter and sets it",
    );
    assert!(path.is_file(), "LIMITER_LAYOUT2_BIN={} is not a file", path.display());
    path
}

fn groups(d: &Value) -> Vec<(String, u64)> {
    let mut g: Vec<(String, u64)> = d["kernel"]["top_sources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["group"].as_str().unwrap().to_owned(), r["established"].as_u64().unwrap()))
        .collect();
    g.sort();
    g
}

#[test]
#[ignore = "black-box: the daemon binary and a layout-2 build of it, root, a network namespace and cgroup; run by `cargo xtask test`"]
fn a_layout_2_gate_with_connections_held_is_migrated_in_place_by_a_second_run() {
    require_kernel!();
    let old_bin = layout2_binary();
    let sb = Sandbox::new().unwrap();
    let p = free_port();
    let config = sb.config(&format!("{p}:4"), &format!("kernel.port.{p}.perSourceMax = 3\n"));
    // The layout-2 limiter predates `admin.socket`: the file leaves it at
    // its default, which the new daemon then serves.
    let text = std::fs::read_to_string(&config).unwrap();
    let text: String =
        text.lines().filter(|l| !l.starts_with("admin.socket")).map(|l| format!("{l}\n")).collect();
    std::fs::write(&config, text).unwrap();
    let mut old = Daemon::start_binary(&old_bin, &config, &[]).expect("the layout-2 daemon");
    let l = sb.listen(&format!("0.0.0.0:{p}"), 128);
    let dst = SocketAddr::from((Ipv4Addr::LOCALHOST, p));
    let from = |last: u8| {
        let src = IpAddr::V4(Ipv4Addr::new(127, 0, 0, last));
        sb.in_netns(move || connect_from(dst, Some(src)))
    };
    let mut held: Vec<_> = (0..3).map(|_| from(1).unwrap()).collect();
    held.push(from(2).unwrap());
    let mut accepted = accept_n(&l, 4);
    // Read with the old binary: this one does not read layout 2.
    let read_old = || limiter_tests::dump_with(&old_bin, &sb.pin_path);
    wait_for("4 connections counted by the layout-2 gate", Duration::from_secs(5), || {
        port(&read_old(), p).established == 4
    });
    let old_dump = read_old();
    assert_eq!(groups(&old_dump), [("127.0.0.1/32".to_owned(), 3), ("127.0.0.2/32".to_owned(), 1)]);
    assert_eq!(old_dump["kernel"]["layout_version"], 2, "the old daemon made a layout-2 gate");
    let before = limiter_tests::links(&old_dump);
    // This binary cannot read layout 2 without migrating it, and says so.
    let refused = limiter_tests::limiter(&["dump", "--pin-path", sb.pin_path.to_str().unwrap()]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("migrates it in place"), "{refused:?}");

    // Every attempt on the full port, refused before, during and after.
    let (stop, attempts) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)));
    let prober = {
        let (stop, attempts) = (stop.clone(), attempts.clone());
        let netns = sb.netns_file();
        std::thread::spawn(move || {
            limiter_tests::in_netns(&netns, move || {
                let mut outcomes = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    outcomes.push(
                        connect_from(dst, Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3))))
                            .map(drop)
                            .map_err(|e| e.kind()),
                    );
                    attempts.fetch_add(1, Ordering::Relaxed);
                    // Pacing: the prober's rate, not synchronisation.
                    std::thread::sleep(Duration::from_millis(2));
                }
                outcomes
            })
        })
    };
    let more = |phase: &str| {
        let at = attempts.load(Ordering::Relaxed);
        wait_for(&format!("the prober's attempts {phase}"), Duration::from_secs(10), || {
            attempts.load(Ordering::Relaxed) >= at + 20
        });
    };
    more("before the migration");
    let mut new = Daemon::start(&config, &[]).expect("this binary, beside the layout-2 daemon");
    // (Its start-up waits for the admin address, which the old one answers too.)
    wait_for("the migration", Duration::from_secs(10), || new.log().contains("kernel gate enforcing"));
    assert!(new.log().contains("pinned gate migrated"), "{}", new.log());
    more("with both daemons running");
    assert_eq!(terminate(&mut old, Duration::from_secs(30)), Some(0));
    more("after the old daemon stopped");
    stop.store(true, Ordering::Relaxed);
    let outcomes = prober.join().unwrap();
    assert!(outcomes.len() >= 60, "the prober ran ({} attempts)", outcomes.len());
    let not_refused: Vec<_> = outcomes.iter().filter(|o| **o != Err(ErrorKind::ConnectionRefused)).collect();
    assert!(not_refused.is_empty(), "attempts on the full port not refused: {not_refused:?}");

    let d = dump(&sb.pin_path);
    assert_eq!(d["kernel"]["layout_version"], limiter_common::LAYOUT_VERSION);
    let after = limiter_tests::links(&d);
    assert_eq!(before.keys().collect::<Vec<_>>(), after.keys().collect::<Vec<_>>());
    for (pin, (link, program)) in &before {
        let (link2, program2) = after[pin];
        assert_eq!(*link, link2, "{pin}: the same link, never detached");
        assert_ne!(*program, program2, "{pin}: this binary's program runs in it");
    }
    assert_eq!(port(&d, p).established, 4, "the port's count is exact across the migration");
    assert_eq!(groups(&d), [("127.0.0.1/32".to_owned(), 3), ("127.0.0.2/32".to_owned(), 1)], "{d}");
    let status: Value = serde_json::from_str(&new.admin_get("/status").unwrap()).unwrap();
    assert_eq!(status["kernel"]["origin"], "migrated", "{status}");

    // The connections the old programs counted are uncounted by the new
    // ones, down to zero (no wrap-around).
    held.truncate(1);
    accepted.truncate(1);
    wait_established(&sb.pin_path, p, 1);
    drop((held, accepted));
    wait_established(&sb.pin_path, p, 0);
    let d = dump(&sb.pin_path);
    assert_eq!(d["kernel"]["source_slots_used"], 0, "{d}");
    // And new ones are counted by them, per source too.
    let fresh: Vec<_> = (0..3).map(|_| from(1).unwrap()).collect();
    assert_eq!(from(1).unwrap_err().kind(), ErrorKind::ConnectionRefused, "the per-source cap still holds");
    let fresh_accepted = accept_n(&l, 3);
    wait_established(&sb.pin_path, p, 3);
    assert_eq!(groups(&dump(&sb.pin_path)), [("127.0.0.1/32".to_owned(), 3)]);
    drop((fresh, fresh_accepted));
    wait_established(&sb.pin_path, p, 0);
    assert_eq!(terminate(&mut new, Duration::from_secs(30)), Some(0));
    let _ = limiter_tests::limiter(&["unload", "--pin-path", sb.pin_path.to_str().unwrap()]);
}
