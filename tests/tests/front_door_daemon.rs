//! The front door through the daemon binary: what needs the process
//! itself (SIGUSR1, `dump`, `check-config`'s exit status).

use std::{process::Command, time::Duration};

use limiter_tests::{Daemon, client, limiter, process::wait_for, upstream::Upstream};
use nix::sys::signal::Signal;

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("limiter-fdd-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn lines(path: &std::path::Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |t| t.lines().count())
}

#[test]
#[ignore = "black-box: the daemon binary, real sockets, curl; run by `cargo xtask test`"]
fn sigusr1_reopens_the_access_log_and_dump_counts_requests_by_protocol() {
    let up = Upstream::start();
    let dir = scratch("usr1");
    let log = dir.join("access.log");
    let (config, proxy) = client::http_config(
        &dir,
        Some(up.addr),
        &format!("http.h2c = true\nhttp.accessLog = {}\n", log.display()),
    );
    let mut daemon = Daemon::start(&config, &[]).expect("daemon starts");
    assert_eq!(client::get(proxy, "/one", &[]).status, 200);
    let h2c = Command::new("curl")
        .args(["-sS", "-o", "/dev/null", "-w", "%{http_version} %{http_code}", "--http2-prior-knowledge"])
        .arg(format!("http://{proxy}/two"))
        .output()
        .expect("curl (cargo xtask setup installs it)");
    assert_eq!(String::from_utf8_lossy(&h2c.stdout), "2 200");
    wait_for("two lines", Duration::from_secs(10), || lines(&log) == 2);
    // logrotate: move the file, then `kill -USR1`.
    std::fs::rename(&log, dir.join("access.log.1")).unwrap();
    daemon.signal(Signal::SIGUSR1);
    wait_for("the reopen logged", Duration::from_secs(10), || {
        daemon.log().contains("SIGUSR1: reopening the access log")
    });
    assert_eq!(client::get(proxy, "/three", &[]).status, 200);
    wait_for("a fresh file with the next line", Duration::from_secs(10), || lines(&log) == 1);
    assert!(std::fs::read_to_string(&log).unwrap().contains("\"path\":\"/three\""));
    assert_eq!(lines(&dir.join("access.log.1")), 2, "the rotated file kept its lines");

    let dump = limiter(&["dump", "--config", config.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&dump.stdout);
    assert!(text.contains("http requests by protocol: h1 2, h1+tls 0, h2+tls 0, h2c 1"), "{text}");
    assert!(daemon.metrics().contains("limiter_http_requests_total{proto=\"h2c\"} 1"));
    assert_eq!(limiter_tests::process::terminate(&mut daemon, Duration::from_secs(30)), Some(0));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "black-box: the daemon binary, openssl; run by `cargo xtask test`"]
fn check_config_and_run_refuse_a_key_that_does_not_match_its_certificate() {
    let dir = scratch("pair");
    let make = |cn: &str| limiter_tests::tls::self_signed(&dir, cn);
    let (cert, _) = make("a");
    let (_, wrong) = make("b");
    let (config, _) = client::http_config(
        &dir,
        Some("127.0.0.1:9".parse().unwrap()),
        &format!(
            "http.tls.listen = 127.0.0.1:0\nhttp.tls.certFile = {}\nhttp.tls.keyFile = {}\n",
            cert.display(),
            wrong.display()
        ),
    );
    for verb in ["check-config", "run"] {
        let args: Vec<&str> = if verb == "run" {
            vec!["run", "--config", config.to_str().unwrap()]
        } else {
            vec![verb, config.to_str().unwrap()]
        };
        let out = limiter_tests::process::limiter_with_deadline(&args, limiter_tests::process::DEADLINE);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{verb} must refuse it");
        assert!(
            err.contains("http.tls.keyFile") && err.contains("b.key"),
            "{verb} names the key and file: {err}"
        );
        assert!(err.contains("does not match the certificate"), "{verb}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
