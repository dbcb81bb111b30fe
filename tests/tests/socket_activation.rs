//! A systemd restart with socket activation: the listening sockets belong
//! to `systemd-socket-activate` (standing in for PID 1 and
//! `limiter.socket`), so they outlive each daemon; a client looping new
//! connections through two restarts sees no error, only a wait.

use std::{
    net::SocketAddr,
    process::{Command, Stdio},
    time::Duration,
};

use limiter_tests::{Sandbox, client, limiter_bin, process::wait_for, require_kernel, upstream::Upstream};
use nix::{sys::signal::Signal, unistd::Pid};

/// The pid of the daemon serving the admin socket now.
fn daemon_pid(sb: &Sandbox) -> Option<i32> {
    let (code, body) = limiter_tests::unix_request(&sb.dir.join("admin.sock"), "GET", "/status").ok()?;
    let status: serde_json::Value = serde_json::from_str(&body).ok().filter(|_| code == 200)?;
    status["pid"].as_i64().map(|p| p as i32)
}

#[test]
#[ignore = "black-box: the daemon binary, systemd-socket-activate, root, a network namespace and cgroup; run by `cargo xtask test`"]
fn restarts_under_socket_activation_queue_connections_instead_of_refusing_them() {
    require_kernel!();
    let sb = Sandbox::new().unwrap();
    let up = sb.in_netns(Upstream::start);
    let config = sb.config("1:1", "");
    let text = std::fs::read_to_string(&config).unwrap();
    let addr = |key: &str| -> SocketAddr {
        text.lines().find_map(|l| l.strip_prefix(&format!("{key} = "))).unwrap().parse().unwrap()
    };
    let (proxy, admin) = (addr("http.listen"), addr("admin.listen"));
    let text = text.replace("kernel.ports = 1:1", &format!("kernel.ports = {}:1000", proxy.port()));
    std::fs::write(&config, format!("{text}http.upstream = {}\n", up.addr)).unwrap();
    let log = sb.dir.join("daemons.log");
    let stop = sb.dir.join("stop");
    // systemd-socket-activate holds both sockets and, at the first
    // connection, executes a shell that runs the daemon again each time it
    // exits (as Restart= would), each run told that the sockets are its
    // own (LISTEN_PID).
    let restart_loop = format!(
        r#"while [ ! -e {stop} ]; do sh -c 'export LISTEN_PID=$$; exec {bin} run --config {config}' >> {log} 2>&1; done"#,
        stop = stop.display(),
        bin = limiter_bin().display(),
        config = config.display(),
        log = log.display()
    );
    let mut holder = Command::new("sh")
        .arg("-c")
        .arg(r#"echo $$ > "$1/cgroup.procs" && shift && exec nsenter --net="$@""#)
        .arg("sh")
        .arg(&sb.cgroup)
        .arg(&sb.netns_path)
        .args(["systemd-socket-activate", "-l", &proxy.to_string(), "-l", &admin.to_string()])
        .args(["-E", "LIMITER_LOG=debug", "sh", "-c", &restart_loop])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("systemd-socket-activate");
    // Its sockets are listening before anything runs: the first connection
    // starts the daemon, and waits for it.
    wait_for("systemd-socket-activate listening", Duration::from_secs(10), || {
        sb.in_netns(move || std::net::TcpStream::connect(admin).is_ok())
    });

    let clients = client::Looping::start(&sb.netns_file(), proxy, 4);
    let mut pids = Vec::new();
    for restart in 0..3 {
        wait_for("a daemon serving", Duration::from_secs(20), || {
            daemon_pid(&sb).is_some_and(|p| !pids.contains(&p))
        });
        let pid = daemon_pid(&sb).unwrap();
        pids.push(pid);
        let before = clients.ok();
        wait_for("requests through it", Duration::from_secs(10), || clients.ok() > before + 50);
        if restart < 2 {
            nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGTERM).unwrap();
        }
    }
    let (ok, errors) = clients.stop();
    std::fs::write(&stop, "").unwrap();
    nix::sys::signal::kill(Pid::from_raw(*pids.last().unwrap()), Signal::SIGTERM).unwrap();
    let exited =
        limiter_tests::process::exited_within(Pid::from_raw(holder.id() as i32), Duration::from_secs(30));
    if !exited {
        let _ = holder.kill();
    }
    let _ = holder.wait();
    let daemons = std::fs::read_to_string(&log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
    eprintln!(
        "socket activation: {ok} requests answered 200 across 2 restarts ({pids:?}), {} errors",
        errors.len()
    );
    assert!(exited, "the restart loop ended");
    assert_eq!(pids.len(), 3, "three daemons in turn: {pids:?}");
    assert_eq!(
        daemons.matches("listening on the socket systemd passed").count(),
        6,
        "each of the 3 runs took both sockets:\n{daemons}"
    );
    assert!(
        errors.is_empty(),
        "{} errors across the restarts: {:?}",
        errors.len(),
        &errors[..errors.len().min(10)]
    );
    let _ = limiter_tests::limiter(&["unload", "--pin-path", sb.pin_path.to_str().unwrap()]);
}

#[test]
#[ignore = "black-box: the daemon binary, root; run by `cargo xtask test`"]
fn a_passed_socket_no_listener_names_is_a_configuration_error() {
    let sb = Sandbox::new().unwrap();
    let config = sb.config("1:1", "kernel.enabled = false\nhttp.upstream = sample\n");
    let stray = format!("127.0.0.1:{}", limiter_tests::free_port());
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(r#"exec systemd-socket-activate -l "$1" sh -c 'export LISTEN_PID=$$; exec "$0" run --config "$1"' "$2" "$3""#)
        .arg("sh")
        .arg(&stray)
        .arg(limiter_bin())
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let child = cmd.spawn().unwrap();
    // The first connection makes systemd-socket-activate start the daemon.
    let addr: SocketAddr = stray.parse().unwrap();
    wait_for("the socket", Duration::from_secs(10), || std::net::TcpStream::connect(addr).is_ok());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    assert!(stderr.contains(&format!("passed a socket on {stray} that no listener key names")), "{stderr}");
}
