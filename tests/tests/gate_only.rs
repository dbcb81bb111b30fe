//! Without `http.upstream` the daemon runs the kernel gate and the admin
//! listener only (the mode of a `connlimit` replacement): no proxy
//! listens, nothing answers as a fake service, and it says so.

use std::io::ErrorKind;

use limiter_tests::*;

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn without_an_upstream_only_the_gate_and_the_admin_listener_run() {
    require_kernel!();
    let p = free_port();
    let sb = Sandbox::new().unwrap();
    let config = sb.config(&format!("{p}:1"), "");
    let text = std::fs::read_to_string(&config).unwrap();
    let http: std::net::SocketAddr =
        text.lines().find_map(|l| l.strip_prefix("http.listen = ")).unwrap().parse().unwrap();
    let daemon = Daemon::start(&config, &[]).unwrap();
    assert!(
        daemon.log().contains("no http.upstream: the kernel gate and the admin listener only"),
        "{}",
        daemon.log()
    );

    // No proxy: its address is not listened on.
    let err = std::net::TcpStream::connect(http).expect_err("nothing listens on http.listen");
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused);
    // The gate enforces.
    let listener = sb.listen(&format!("127.0.0.1:{p}"), 16);
    let held = sb.connect(&format!("127.0.0.1:{p}")).unwrap();
    let _server = accept_n(&listener, 1);
    wait_established(&sb.pin_path, p, 1);
    assert_eq!(sb.connect(&format!("127.0.0.1:{p}")).unwrap_err().kind(), ErrorKind::ConnectionRefused);

    // The admin listener says there is no proxy, and no breaker.
    let status: serde_json::Value = serde_json::from_str(&daemon.admin_get("/status").unwrap()).unwrap();
    assert!(status["http"].is_null() && status["kernel"]["gate"].is_object(), "{status}");
    assert!(daemon.admin_get("/breaker").is_err(), "no breaker without a proxy");
    assert!(!daemon.metrics().contains("limiter_http_"), "no HTTP families without a proxy");
    let out = limiter(&["dump", "--config", config.to_str().unwrap()]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && table.contains("no HTTP proxy (no http.upstream)"), "{table}");
    drop(held);
}
