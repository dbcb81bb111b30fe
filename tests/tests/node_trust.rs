//! Who can do what on a node (docs/trust.md, "Who can do what on a node"), tried
//! by a second, unprivileged user that the test creates and removes:
//!
//! - through the TCP admin listener, which every local user can reach, it
//!   can read `/metrics` and `/healthz` and steer nothing: no breaker
//!   override, no reload, no `/status`;
//! - it cannot connect to the admin socket (root's, mode 0600), unless
//!   `admin.socketGroup` names a group of its own;
//! - squatting the admin address while the daemon is down gets it no
//!   token: `limiter reload` refuses to send it to a listener root did not
//!   open, and with the admin socket nothing is sent over TCP at all;
//! - owning the access log's directory gets it nothing: a link there to a
//!   file only root may write is not followed.

use std::{
    io::{BufRead as _, BufReader, Read as _},
    process::Stdio,
};

use limiter_tests::{Daemon, client, free_port, limiter, unix_request, upstream::Upstream, user::TempUser};

/// A child of the test's, ended by its pid when dropped.
struct Ended(std::process::Child);

impl Drop for Ended {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn curl(user: &TempUser, args: &[&str]) -> String {
    let out = user
        .run("curl", &[&["-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "5"], args].concat());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
#[ignore = "black-box: the daemon binary, root, a second user; run by `cargo xtask test`"]
fn another_local_user_reads_metrics_and_steers_nothing() {
    let user = TempUser::create().unwrap();
    let up = Upstream::start();
    let dir = std::env::temp_dir().join(format!("limiter-node-trust-{}", std::process::id()));
    let (config, proxy) = client::http_config(&dir, Some(up.addr), "");
    let daemon = Daemon::start(&config, &[]).unwrap();
    let admin = daemon.admin;
    let url = |path: &str| format!("http://{admin}{path}");
    assert_eq!(curl(&user, &["-X", "POST", &url("/breaker/open")]), "403", "the breaker override");
    assert_eq!(curl(&user, &["-X", "POST", &url("/breaker/close")]), "403");
    assert_eq!(curl(&user, &["-X", "POST", &url("/reload")]), "403", "a reload");
    assert_eq!(curl(&user, &[&url("/status")]), "403", "the status");
    assert_eq!(curl(&user, &[&url("/metrics")]), "200", "the metrics");
    assert_eq!(curl(&user, &[&url("/healthz")]), "200", "the health");
    assert_eq!(client::get(proxy, "/x", &[]).status, 200, "the breaker stayed closed");
    // The admin socket is root's: the user cannot connect at all.
    let socket = daemon.socket.clone().unwrap();
    let sock = socket.to_str().unwrap();
    assert_eq!(curl(&user, &["--unix-socket", sock, "http://localhost/status"]), "000", "connect refused");
    // Root, and `limiter dump` and `reload`, use it.
    assert_eq!(unix_request(&socket, "GET", "/status").unwrap().0, 200);
    let out = limiter(&["reload", "--config", config.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = limiter(&["dump", "--json", "--config", config.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["daemon"]["running"], true, "{v}");
    let mut daemon = daemon;
    daemon.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(daemon.wait(), Some(0));
    assert!(!socket.exists(), "the daemon removed its socket on the way out");
    // admin.socketGroup lets a group in (0660).
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("{text}admin.socketGroup = {}\n", user.name)).unwrap();
    let daemon = Daemon::start(&config, &[]).unwrap();
    let user_in_group = user.run(
        "curl",
        &["-s", "-o", "/dev/null", "-w", "%{http_code}", "--unix-socket", sock, "http://localhost/status"],
    );
    // setpriv clears the supplementary groups, but the user's own group is
    // its primary one.
    assert_eq!(String::from_utf8_lossy(&user_in_group.stdout), "200");
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "black-box: the daemon binary, root, a second user; run by `cargo xtask test`"]
fn a_user_squatting_the_admin_address_gets_no_token() {
    let user = TempUser::create().unwrap();
    let dir = std::env::temp_dir().join(format!("limiter-squat-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let token = "squat-test-token-0123456789abcdef";
    let token_file = dir.join("token");
    limiter_tests::write_secret(&token_file, &format!("{token}\n"));
    let port = free_port();
    let config = dir.join("limiter.ini");
    let socket = dir.join("run").join("admin.sock");
    let write = |socket_line: &str| {
        std::fs::write(
            &config,
            format!(
                "kernel.enabled = false\nhttp.upstream = sample\nadmin.listen = 127.0.0.1:{port}\nadmin.tokenFile = {}\n{socket_line}",
                token_file.display()
            ),
        )
        .unwrap();
    };
    // The daemon is down; the user binds its address and answers every
    // request as a daemon would, printing what it was sent.
    let script = format!(
        "import socket,sys\n\
         s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
         s.bind(('127.0.0.1',{port})); s.listen(8); s.settimeout(20)\n\
         print('ready', flush=True)\n\
         while True:\n\
         \x20   try: c,_=s.accept()\n\
         \x20   except OSError: break\n\
         \x20   c.settimeout(2)\n\
         \x20   try: data=c.recv(65536)\n\
         \x20   except OSError: data=b''\n\
         \x20   print(repr(data), flush=True)\n\
         \x20   c.sendall(b'HTTP/1.0 200 OK\\r\\n\\r\\n{{\"applied\":true,\"changes\":[]}}'); c.close()\n"
    );
    // Ended on drop, so a failed assertion leaves no process of the user's
    // (which would keep `userdel` from removing the user).
    let mut squatter =
        Ended(user.command("/usr/bin/python3", &["-c", &script]).stdout(Stdio::piped()).spawn().unwrap());
    let mut said = BufReader::new(squatter.0.stdout.take().unwrap());
    let mut line = String::new();
    said.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");

    // Over TCP (the socket off): the CLI sees a listener of another uid
    // and sends nothing of the token.
    write("admin.socket = off\n");
    let out = limiter(&["reload", "--config", config.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("held by uid {}", user.uid)) && err.contains("not sending the admin token"),
        "{err}"
    );
    // With the admin socket (the default): nothing there, nothing sent.
    write(&format!("admin.socket = {}\n", socket.display()));
    let out = limiter(&["reload", "--config", config.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("no daemon answered on admin.socket"), "{err}");
    // And the user cannot put a socket of its own where the CLI looks.
    std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
    let planted = user.run(
        "/usr/bin/python3",
        &["-c", &format!("import socket; socket.socket(socket.AF_UNIX).bind('{}')", socket.display())],
    );
    assert!(!planted.status.success(), "the user planted a socket in root's directory");
    assert!(
        String::from_utf8_lossy(&planted.stderr).contains("PermissionError"),
        "refused for another reason than the directory's mode: {planted:?}"
    );
    // The daemon cannot start on the taken address: it says whose it is,
    // and leaves no socket behind.
    let out = limiter(&["run", "--config", config.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("admin.listen 127.0.0.1:{port}: cannot listen"))
            && err.contains(&format!("(held by uid {})", user.uid)),
        "{err}"
    );
    assert!(!socket.exists(), "a daemon that could not start left its socket");

    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(squatter.0.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = squatter.0.wait();
    let mut heard = String::new();
    said.read_to_string(&mut heard).unwrap();
    assert!(!heard.contains(token), "the squatter was sent the token: {heard}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "black-box: the daemon binary, root, a second user; run by `cargo xtask test`"]
fn a_user_who_owns_the_log_directory_cannot_make_root_write_elsewhere() {
    let user = TempUser::create().unwrap();
    let up = Upstream::start();
    let dir = std::env::temp_dir().join(format!("limiter-log-link-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let logs = dir.join("log");
    std::fs::create_dir_all(&logs).unwrap();
    std::os::unix::fs::chown(&logs, Some(user.uid), Some(user.gid)).unwrap();
    let target = dir.join("root-only");
    limiter_tests::write_secret(&target, "root's own\n");
    let log = logs.join("access.log");
    let linked = user.run("ln", &["-s", target.to_str().unwrap(), log.to_str().unwrap()]);
    assert!(linked.status.success(), "{linked:?}");
    let (config, proxy) =
        client::http_config(&dir, Some(up.addr), &format!("http.accessLog = {}\n", log.display()));
    let daemon = Daemon::start(&config, &[]).unwrap();
    for _ in 0..3 {
        assert_eq!(client::get(proxy, "/x", &[]).status, 200);
    }
    // A reload (and SIGUSR1) opens the log again: still not through the link.
    daemon.admin_post("/reload").unwrap();
    assert_eq!(client::get(proxy, "/x", &[]).status, 200);
    assert_eq!(
        std::fs::read_to_string(&target).unwrap(),
        "root's own\n",
        "root wrote through the user's link"
    );
    let said = format!("the path is a symbolic link (owner uid {}, mode 0777): not followed", user.uid);
    // The access log's own thread opens the file and says so: its line
    // may come a moment after the responses.
    limiter_tests::process::wait_for(
        &format!("the log says `{said}`"),
        std::time::Duration::from_secs(5),
        || daemon.log().contains(&said),
    );
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);
}
