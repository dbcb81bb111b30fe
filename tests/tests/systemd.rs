//! What an init system needs of the daemon binary: exit codes that tell a
//! bad configuration (78, not worth retrying) from a failed environment
//! (1), readiness on `NOTIFY_SOCKET`, a reload verb that returns with the
//! outcome, and journald priorities.

use std::{
    os::unix::net::UnixDatagram,
    path::{Path, PathBuf},
    time::Duration,
};

use limiter_tests::{
    Daemon, client, free_port,
    process::{DEADLINE, limiter_with_deadline, terminate},
    upstream::Upstream,
};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("limiter-sd-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn code(args: &[&str]) -> (Option<i32>, String) {
    let out = limiter_with_deadline(args, DEADLINE);
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_owned()
}

#[test]
#[ignore = "black-box: the daemon binary; run by `cargo xtask test`"]
fn exit_codes_tell_a_bad_configuration_from_a_failed_environment() {
    let dir = scratch("codes");
    let admin = free_port();
    let base = format!(
        "kernel.enabled = false\nadmin.listen = 127.0.0.1:{admin}\nhttp.listen = 127.0.0.1:{}\n",
        free_port()
    );
    let grammar =
        write(&dir, "grammar.ini", &format!("{base}http.upstream = sample\nhttp.maxThreads = many\n"));
    let missing_cert = write(
        &dir,
        "cert.ini",
        &format!(
            "{base}http.upstream = sample\nhttp.tls.listen = 127.0.0.1:0\nhttp.tls.certFile = /nonexistent/c.pem\nhttp.tls.keyFile = /nonexistent/k.pem\n"
        ),
    );
    for file in [&grammar, &missing_cert] {
        let (check, err) = code(&["check-config", file]);
        assert_eq!(check, Some(78), "check-config {file}: {err}");
        let (run, err) = code(&["run", "--config", file]);
        assert_eq!(run, Some(78), "run {file}: {err}");
    }
    // The environment: admin.listen's port is taken. Worth a retry: 1.
    let taken = std::net::TcpListener::bind(("127.0.0.1", admin)).unwrap();
    let good = write(&dir, "good.ini", &format!("{base}http.upstream = sample\n"));
    assert_eq!(code(&["check-config", &good]).0, Some(0));
    let (run, err) = code(&["run", "--config", &good]);
    assert_eq!(run, Some(1), "{err}");
    assert!(err.contains("admin.listen") && err.contains("cannot listen"), "{err}");
    drop(taken);
    // Usage: clap's 2.
    assert_eq!(code(&["frobnicate"]).0, Some(2));
    assert_eq!(code(&["run"]).0, Some(2), "run without --config");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The next datagram on the notify socket (10 s at most).
fn next(socket: &UnixDatagram) -> String {
    let mut buf = [0u8; 4096];
    let n = socket.recv(&mut buf).expect("a notification within 10 s");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[test]
#[ignore = "black-box: the daemon binary, real sockets; run by `cargo xtask test`"]
fn notify_says_ready_once_serving_reloading_around_reloads_and_stopping_on_drain() {
    let up = Upstream::start();
    let dir = scratch("notify");
    let (config, proxy) = client::http_config(&dir, Some(up.addr), "http.maxThreads = 14\n");
    let path = dir.join("notify.sock");
    let socket = UnixDatagram::bind(&path).unwrap();
    socket.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut daemon = Daemon::start_with_env(&config, &[("NOTIFY_SOCKET", path.to_str().unwrap())]).unwrap();
    let ready = next(&socket);
    assert!(ready.contains("READY=1"), "{ready}");
    assert!(ready.contains(&format!("MAINPID={}", daemon.pid())), "{ready}");
    // Serving, not only bound: a request sent at once is forwarded and
    // answered (the listener is bound before READY=1, so a bare connect
    // would prove nothing).
    let before = up.hits();
    let reply = client::get(proxy, "/ready", &[]);
    assert_eq!(reply.status, 200, "the first request after READY=1: {}", reply.text());
    assert_eq!(up.hits(), before + 1, "the upstream saw the request");

    // The reload verb returns with the outcome, READY=1 after RELOADING=1.
    let conf = config.to_str().unwrap();
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, text.replace("http.maxThreads = 14", "http.maxThreads = 15")).unwrap();
    let out = limiter_with_deadline(&["reload", "--config", conf], DEADLINE);
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("reload applied") && said.contains("http.maxThreads: 14 -> 15"), "{said}");
    let (reloading, again) = (next(&socket), next(&socket));
    assert!(reloading.contains("RELOADING=1") && reloading.contains("MONOTONIC_USEC="), "{reloading}");
    assert!(again.contains("READY=1"), "{again}");

    // Valid as a file, refused by the daemon (a restart key): 78, and the
    // daemon says RELOADING=1 then READY=1 all the same.
    std::fs::write(
        &config,
        text.replace(&format!("http.listen = {proxy}"), &format!("http.listen = 127.0.0.1:{}", free_port())),
    )
    .unwrap();
    let out = limiter_with_deadline(&["reload", "--config", conf], DEADLINE);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(err.contains("http.listen") && err.contains("needs a restart"), "{err}");
    assert!(next(&socket).contains("RELOADING=1") && next(&socket).contains("READY=1"));
    // A bad file: refused before asking the daemon.
    std::fs::write(&config, "http.maxThreads = \n").unwrap();
    let out = limiter_with_deadline(&["reload", "--config", conf], DEADLINE);
    assert_eq!(out.status.code(), Some(78), "{}", String::from_utf8_lossy(&out.stderr));
    std::fs::write(&config, &text).unwrap();

    daemon.signal(nix::sys::signal::Signal::SIGTERM);
    let stopping = next(&socket);
    assert!(stopping.contains("STOPPING=1"), "{stopping}");
    assert_eq!(terminate(&mut daemon, Duration::from_secs(30)), Some(0));
    // Nobody answering: the environment, 1.
    let out = limiter_with_deadline(&["reload", "--config", conf], DEADLINE);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "black-box: the daemon binary; run by `cargo xtask test`"]
fn journald_lines_start_with_their_syslog_priority() {
    let dir = scratch("journal");
    // A pair without a TLS listener: a warning at start.
    let (cert, key) = limiter_tests::tls::self_signed(&dir, "warn");
    let extra = format!(
        "http.upstream = sample\nhttp.tls.certFile = {}\nhttp.tls.keyFile = {}\n",
        cert.display(),
        key.display()
    );
    let (config, _) = client::http_config(&dir, None, &extra);
    let mut daemon = Daemon::start_with_env(&config, &[("JOURNAL_STREAM", "8:12345")]).unwrap();
    assert_eq!(terminate(&mut daemon, Duration::from_secs(30)), Some(0));
    let log = daemon.log();
    let lines: Vec<&str> = log.lines().filter(|l| !l.is_empty()).collect();
    assert!(!lines.is_empty());
    for line in &lines {
        assert!(["<3>", "<4>", "<6>", "<7>"].iter().any(|p| line.starts_with(p)), "no priority: {line:?}");
    }
    assert!(lines.iter().any(|l| l.starts_with("<6>") && l.contains("HTTP proxy serving")), "{log}");
    assert!(
        lines.iter().any(|l| l.starts_with("<4>") && l.contains("no TLS listener")),
        "warnings are <4>: {log}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
