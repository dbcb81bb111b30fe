//! Least privilege: after start-up the daemon keeps CAP_BPF alone (nothing
//! without the kernel gate), in every thread, and can run as another user;
//! its pins are private to it. Run one at a time.

use std::{io::ErrorKind, os::unix::fs::MetadataExt as _, path::Path};

use limiter_tests::*;

const CAP_BPF: u64 = 1 << 39;

/// `field` of /proc/PID/status (or of one task's status file).
fn status_field(status: &str, field: &str) -> String {
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in\n{status}"))
        .trim()
        .to_owned()
}

fn caps_of(status: &str, set: &str) -> u64 {
    u64::from_str_radix(&status_field(status, set), 16).unwrap()
}

/// Every thread's status file.
fn threads(pid: i32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .map(|t| std::fs::read_to_string(t.path().join("status")).unwrap())
        .collect()
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn the_gate_daemon_keeps_cap_bpf_alone_in_every_thread_and_runs_as_the_user() {
    require_kernel!();
    let p = free_port();
    let sb = Sandbox::new().unwrap();
    let config = sb.config(&format!("{p}:2"), "");
    let daemon = Daemon::start(&config, &["--user", "nobody"]).unwrap();
    let pid = daemon.pid().as_raw();
    let tasks = threads(pid);
    assert!(tasks.len() > 2, "the runtime's threads exist by now");
    for status in &tasks {
        assert_eq!(caps_of(status, "CapEff"), CAP_BPF, "{status}");
        assert_eq!(caps_of(status, "CapPrm"), CAP_BPF);
        assert_eq!(caps_of(status, "CapBnd"), CAP_BPF);
        assert_eq!(caps_of(status, "CapInh"), 0);
        assert_eq!(caps_of(status, "CapAmb"), 0);
        assert_eq!(status_field(status, "NoNewPrivs"), "1");
        assert_eq!(status_field(status, "Uid"), "65534\t65534\t65534\t65534");
        assert_eq!(status_field(status, "Groups"), "65534");
    }
    assert!(
        daemon.log().contains("privileges dropped capabilities=CAP_BPF user=\"nobody\""),
        "{}",
        daemon.log()
    );

    // Private pins, now the user's.
    let dir = std::fs::metadata(&sb.pin_path).unwrap();
    assert_eq!((dir.mode() & 0o777, dir.uid()), (0o700, 65534));
    for entry in std::fs::read_dir(&sb.pin_path).unwrap().flatten() {
        let m = entry.metadata().unwrap();
        assert_eq!(m.mode() & 0o777, 0o600, "{}", entry.path().display());
        assert_eq!(m.uid(), 65534, "{}", entry.path().display());
    }

    // It still does its work with what it kept: counts, refuses, reloads
    // (map writes) and reports (map reads).
    let l = sb.listen(&format!("127.0.0.1:{p}"), 128);
    let held: Vec<_> = (0..2).map(|_| sb.connect(&format!("127.0.0.1:{p}")).unwrap()).collect();
    wait_established(&sb.pin_path, p, 2);
    assert_eq!(sb.connect(&format!("127.0.0.1:{p}")).unwrap_err().kind(), ErrorKind::ConnectionRefused);
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, text.replace(&format!("{p}:2"), &format!("{p}:3"))).unwrap();
    assert!(daemon.reload().contains("applied"), "{}", daemon.log());
    let _third = sb.connect(&format!("127.0.0.1:{p}")).unwrap();
    wait_established(&sb.pin_path, p, 3);
    assert!(daemon.metrics().contains(&format!("limiter_kernel_limit{{port=\"{p}\"}} 3")));
    drop((held, l));
    drop(daemon);
    assert!(Path::new(&sb.pin_path).exists(), "the gate outlives the daemon");
    // A restart adopts the pins the user now owns, and gives them back.
    let again = Daemon::start(&config, &["--user", "nobody"]).unwrap();
    assert!(again.log().contains("kernel gate adopted"), "{}", again.log());
    assert!(again.metrics().contains(&format!("limiter_kernel_limit{{port=\"{p}\"}} 3")));
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn without_the_gate_the_daemon_keeps_no_capability() {
    let dir = std::env::temp_dir().join(format!("lp-{}", std::process::id()));
    let (config, proxy) = client::http_config(&dir, None, "http.upstream = sample\n");
    let daemon = Daemon::start(&config, &[]).unwrap();
    for status in threads(daemon.pid().as_raw()) {
        assert_eq!(caps_of(&status, "CapEff"), 0, "{status}");
        assert_eq!(caps_of(&status, "CapPrm"), 0);
        assert_eq!(caps_of(&status, "CapBnd"), 0);
    }
    assert_eq!(client::get(proxy, "/hello", &[]).status, 200);
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);
}
