//! Least privilege: after start-up the daemon keeps CAP_BPF alone (nothing
//! without the kernel gate), in every thread, and can run as another user;
//! its pins are private to it. As that user, under a bpffs root only root
//! may walk (`mode=700`, as systemd and `limiter-bpffs.service` mount it),
//! it still sees its gate attached. A pin directory that other users can
//! write, or that lies under one, is refused. Run one at a time.

use std::{
    io::ErrorKind,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    time::Duration,
};

use limiter_tests::{user::TempUser, *};

/// A bpffs instance of its own, mounted with `mode` on `dir`, unmounted
/// (which drops its pins) on drop.
struct Bpffs {
    dir: PathBuf,
}

impl Bpffs {
    fn mount(dir: &Path, mode: &str) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        run("mount", &["-t", "bpf", "-o", &format!("mode={mode}"), "bpf", dir.to_str().unwrap()]).unwrap();
        Self { dir: dir.to_path_buf() }
    }
}

impl Drop for Bpffs {
    fn drop(&mut self) {
        let _ = run("umount", &[self.dir.to_str().unwrap()]);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

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

#[test]
#[ignore = "black-box: the daemon binary, root, a second user, real sockets; run by `cargo xtask test`"]
fn as_the_user_under_a_bpffs_root_only_root_may_walk_the_gate_is_reported_attached() {
    require_kernel!();
    let user = TempUser::create().unwrap();
    let mut sb = Sandbox::new().unwrap();
    let bpffs = Bpffs::mount(&sb.dir.join("bpf"), "700");
    sb.pin_path = bpffs.dir.join("limiter");
    let p = free_port();
    let config = sb.config(&format!("{p}:2"), "http.upstream = sample\nhttp.shedAtSyn = true\n");
    let daemon = Daemon::start(&config, &["--user", &user.name]).unwrap();
    // The user cannot walk to its own pins by their path.
    let root = std::fs::metadata(&bpffs.dir).unwrap();
    assert_eq!((root.mode() & 0o777, root.uid()), (0o700, 0));
    let walk = user.run("test", &["-r", sb.pin_path.join("link_sock_ops").to_str().unwrap()]);
    // test(1) answers 1 for "not readable" (anything else: it did not run).
    assert_eq!(walk.status.code(), Some(1), "the user could reach the pins by path: the test proves nothing");
    // The detach check runs every 2 s: let it run twice.
    std::thread::sleep(Duration::from_millis(4500));
    daemon.admin_get("/healthz").expect("/healthz answers 200");
    assert_eq!(daemon.metric("limiter_kernel_gate_attached"), 1.0, "{}", daemon.log());
    let log = daemon.log();
    for wrong in ["detached", "cannot look", "coupled shedding unavailable", "CAP_BPF"] {
        let bad: Vec<&str> =
            log.lines().filter(|l| l.contains(wrong) && !l.contains("privileges dropped")).collect();
        assert!(bad.is_empty(), "{wrong:?} in the log: {bad:#?}");
    }
    // What dump shows, read by root through the path.
    let links = links(&dump(&sb.pin_path));
    assert!(links.contains_key("link_sock_ops") && links.contains_key("link_sk_lookup"), "{links:?}");
    // `limiter unload --force` under it is still seen as a detach.
    let out = limiter(&["unload", "--force", "--pin-path", sb.pin_path.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    wait_for_metric(&daemon, "limiter_kernel_gate_attached", 0.0);
    // The detach check's next run (every 2 s) turns /healthz to 503.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while daemon.admin_get("/healthz").is_ok() {
        assert!(std::time::Instant::now() < deadline, "/healthz still 200 with the gate gone");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(daemon.log().contains("the kernel gate was detached"), "{}", daemon.log());
    drop(daemon);
    drop(bpffs);
}

#[test]
#[ignore = "black-box: the daemon binary, root, a second user, real sockets; run by `cargo xtask test`"]
fn a_pin_directory_that_other_users_can_write_is_refused_naming_it_its_owner_and_mode() {
    require_kernel!();
    let user = TempUser::create().unwrap();
    let mut sb = Sandbox::new().unwrap();
    // bpffs mounted without mode= is 1777, as the DaemonSet's init
    // container used to mount it.
    let bpffs = Bpffs::mount(&sb.dir.join("bpf"), "1777");
    sb.pin_path = bpffs.dir.join("limiter");
    let config = sb.config(&format!("{}:2", free_port()), "");
    let refused = |what: &str| {
        let out = limiter(&["run", "--config", config.to_str().unwrap()]);
        let text = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(1), "{what}: {text}");
        assert!(!sb.pin_path.join("link_sock_ops").exists(), "{what}: nothing attached");
        text
    };
    let text = refused("a 1777 bpffs root");
    let want = format!("{} (owner uid 0, group 0, mode 1777) is writable by others", bpffs.dir.display());
    assert!(text.contains(&want), "{text}");
    // A pin directory another user made (so could empty) on a 0700 root.
    drop(bpffs);
    let bpffs = Bpffs::mount(&sb.dir.join("bpf"), "700");
    std::fs::create_dir(&sb.pin_path).unwrap();
    std::os::unix::fs::chown(&sb.pin_path, Some(user.uid), Some(user.gid)).unwrap();
    let text = refused("a pin directory of another user");
    let mode = std::fs::metadata(&sb.pin_path).unwrap().mode() & 0o7777;
    let want = format!(
        "{} (owner uid {}, group {}, mode {mode:04o}) is owned by another user",
        sb.pin_path.display(),
        user.uid,
        user.gid
    );
    assert!(text.contains(&want), "{text}");
    // The same directory is the daemon's own with --user naming that user.
    let daemon = Daemon::start(&config, &["--user", &user.name]).unwrap();
    assert_eq!(daemon.metric("limiter_kernel_gate_attached"), 1.0);
    drop(daemon);
    drop(bpffs);
}

/// Waits (5 s at most) until `sample` reads `want`.
fn wait_for_metric(daemon: &Daemon, sample: &str, want: f64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while try_metric(&daemon.metrics(), sample) != Some(want) {
        assert!(std::time::Instant::now() < deadline, "{sample} never read {want}:\n{}", daemon.log());
        std::thread::sleep(Duration::from_millis(50));
    }
}
