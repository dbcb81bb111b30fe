//! The kernel gate's live keys change what the gate does on reload (the
//! other live keys are proven in-process by `tests/tests/live_keys.rs`,
//! which lists which test proves which key).

use std::{
    io::ErrorKind,
    net::{SocketAddr, TcpStream},
    time::Duration,
};

use limiter_tests::*;

/// A connection to `port` on the sandbox's loopback from source address
/// `from` (any 127/8 address is local there).
fn connect_from(sb: &Sandbox, from: [u8; 4], port: u16) -> std::io::Result<TcpStream> {
    sb.in_netns(move || {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
        s.bind(&SocketAddr::from((from, 0)).into())?;
        let to = SocketAddr::from(([127, 0, 0, 1], port));
        s.connect_timeout(&to.into(), Duration::from_secs(3))?;
        Ok(TcpStream::from(s))
    })
}

fn refused(r: std::io::Result<TcpStream>) -> bool {
    matches!(r, Err(e) if e.kind() == ErrorKind::ConnectionRefused)
}

/// Rewrites the sandbox's file with `extra` appended to `base` and reloads.
fn reload(daemon: &Daemon, config: &std::path::Path, base: &str, extra: &str) {
    std::fs::write(config, format!("{base}{extra}")).unwrap();
    let outcome = daemon.reload();
    assert!(outcome.contains("applied"), "{outcome}");
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn per_source_max_changes_live() {
    require_kernel!();
    let p = free_port();
    let sb = Sandbox::new().unwrap();
    let config = sb.config(&format!("{p}:100"), &format!("kernel.port.{p}.perSourceMax = 1\n"));
    let base =
        std::fs::read_to_string(&config).unwrap().replace(&format!("kernel.port.{p}.perSourceMax = 1\n"), "");
    let daemon = Daemon::start(&config, &[]).unwrap();
    let listener = sb.listen(&format!("127.0.0.1:{p}"), 128);
    let a = [127, 0, 0, 2];
    let mut held = vec![connect_from(&sb, a, p).unwrap()];
    let mut servers = accept_n(&listener, 1);
    wait_established(&sb.pin_path, p, 1);
    assert!(refused(connect_from(&sb, a, p)), "a second connection from one source over a cap of 1");
    reload(&daemon, &config, &base, &format!("kernel.port.{p}.perSourceMax = 2\n"));
    held.push(connect_from(&sb, a, p).expect("a cap of 2 admits a second"));
    servers.extend(accept_n(&listener, 1));
    wait_established(&sb.pin_path, p, 2);
    assert!(refused(connect_from(&sb, a, p)), "a third over a cap of 2");
    let other = connect_from(&sb, [127, 0, 0, 3], p).expect("another source has its own cap");
    drop((held, servers, other));
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn dry_run_ports_change_live() {
    require_kernel!();
    let p = free_port();
    let sb = Sandbox::new().unwrap();
    let config = sb.config(&format!("{p}:1"), "");
    let base = std::fs::read_to_string(&config).unwrap();
    let daemon = Daemon::start(&config, &[]).unwrap();
    let listener = sb.listen(&format!("127.0.0.1:{p}"), 128);
    let first = sb.connect(&format!("127.0.0.1:{p}")).unwrap();
    let _server = accept_n(&listener, 1);
    wait_established(&sb.pin_path, p, 1);
    assert!(refused(sb.connect(&format!("127.0.0.1:{p}"))));
    reload(&daemon, &config, &base, &format!("kernel.port.{p}.dryRun = true\n"));
    let second = sb.connect(&format!("127.0.0.1:{p}")).expect("a dry-run port refuses nothing");
    let _server2 = accept_n(&listener, 1);
    wait_established(&sb.pin_path, p, 2);
    let d = dump(&sb.pin_path);
    let row = d["kernel"]["ports"].as_array().unwrap().iter().find(|r| r["port"] == p).unwrap().clone();
    assert_eq!((row["dry_run"].as_bool(), row["would_refuse"].as_u64()), (Some(true), Some(1)), "{row}");
    assert_eq!(row["refused"].as_u64(), Some(1), "the refusal before the reload, and none since");
    drop((first, second));
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn trusted_reserve_changes_live() {
    require_kernel!();
    let p = free_port();
    let sb = Sandbox::new().unwrap();
    let config = sb.config(&format!("{p}:1"), "kernel.trusted = 127.0.0.0/8\nkernel.trustedReserve = 0\n");
    let base = std::fs::read_to_string(&config).unwrap().replace("kernel.trustedReserve = 0\n", "");
    let daemon = Daemon::start(&config, &[]).unwrap();
    let listener = sb.listen(&format!("127.0.0.1:{p}"), 128);
    let addr = format!("127.0.0.1:{p}");
    let mut held = vec![sb.connect(&addr).unwrap()];
    let mut servers = accept_n(&listener, 1);
    wait_established(&sb.pin_path, p, 1);
    assert!(refused(sb.connect(&addr)), "no reserve: a trusted client is refused at a full port");
    reload(&daemon, &config, &base, "kernel.trustedReserve = 2\n");
    for n in 2..=3 {
        held.push(sb.connect(&addr).expect("the reserve admits trusted clients past the limit"));
        servers.extend(accept_n(&listener, 1));
        wait_established(&sb.pin_path, p, n);
    }
    assert!(refused(sb.connect(&addr)), "limit 1 + reserve 2 are taken");
    drop((held, servers));
}
