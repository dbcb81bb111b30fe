//! With `http.h2c = true`, a cleartext connection is HTTP/2 if it starts
//! with the 24-byte preface. A client that sends part of it and stops must
//! cost nothing while the proxy waits for the rest (it was once peeked
//! every 2 ms: 300 such connections took 22 % of a core), and the rest,
//! when it comes, still makes the connection HTTP/2.

use std::{io::Write as _, net::TcpStream, time::Duration};

use limiter_tests::{Daemon, bench::cpu_seconds, client, h2raw, upstream::Upstream};

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("limiter-preface-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
#[ignore = "black-box: the daemon binary, real sockets; run by `cargo xtask test`"]
fn partial_h2c_prefaces_cost_no_cpu_while_they_wait() {
    limiter_tests::raise_fd_limit();
    let up = Upstream::start();
    let dir = scratch("idle");
    let (config, proxy) =
        client::http_config(&dir, Some(up.addr), "http.h2c = true\nhttp.headerReadTimeoutMs = 30000\n");
    let daemon = Daemon::start(&config, &[]).unwrap();
    let partial: Vec<TcpStream> = (0..300)
        .map(|_| {
            let mut s = client::connect(proxy);
            s.write_all(b"PRI * HTTP/2").unwrap();
            s
        })
        .collect();
    // Every connection accepted and waiting (the daemon counts them open).
    limiter_tests::process::wait_for("300 connections open", Duration::from_secs(10), || {
        daemon.metric("limiter_http_connections_open") >= 300.0
    });
    let pid = daemon.pid().as_raw() as u32;
    let before = cpu_seconds(&[pid]);
    // What is measured is a pause: nothing is sent for 2 s.
    std::thread::sleep(Duration::from_secs(2));
    let spent = cpu_seconds(&[pid]) - before;
    // A poll every 2 ms per connection spent 0.44 s of CPU in these 2 s;
    // waiting for readiness spends next to none (the bound leaves room for
    // a scrape and the daemon's own timers on a busy CI machine).
    assert!(spent < 0.1, "{spent:.3} s of CPU in 2 s with 300 partial prefaces waiting");
    // Clients that close after a partial preface are done with: nothing
    // spins on their EOF (it once did, 100 % of a worker).
    let mut partial = partial.into_iter();
    let mut s = partial.next().unwrap();
    drop(partial);
    limiter_tests::process::wait_for("299 connections closed", Duration::from_secs(10), || {
        daemon.metric("limiter_http_connections_open") <= 1.0
    });
    let before = cpu_seconds(&[pid]);
    std::thread::sleep(Duration::from_secs(1));
    let spent = cpu_seconds(&[pid]) - before;
    assert!(spent < 0.05, "{spent:.3} s of CPU in 1 s after 299 partial prefaces were closed");
    // The rest of a preface, when it comes, makes an HTTP/2 connection.
    s.write_all(b".0\r\n\r\nSM\r\n\r\n").unwrap();
    let get = h2raw::frame(
        h2raw::HEADERS,
        h2raw::END_STREAM | h2raw::END_HEADERS,
        1,
        &h2raw::get_block("/hello", &[]),
    );
    s.write_all(&[h2raw::settings(&[]), get].concat()).unwrap();
    let head = loop {
        match h2raw::read_frame(&mut s, Duration::from_secs(10)).unwrap() {
            Some(f) if f.kind == h2raw::HEADERS && f.stream == 1 => break f,
            Some(_) => {}
            None => panic!("the connection closed before the answer"),
        }
    };
    // HPACK: `:status 200` is the static table's entry 8.
    assert_eq!(head.payload.first(), Some(&0x88), "HTTP/2 200 after a preface sent in two parts");
}

#[test]
#[ignore = "black-box: the daemon binary, real sockets; run by `cargo xtask test`"]
fn a_start_that_leaves_the_preface_is_http1() {
    let up = Upstream::start();
    let dir = scratch("h1");
    let (config, proxy) = client::http_config(&dir, Some(up.addr), "http.h2c = true\n");
    let _daemon = Daemon::start(&config, &[]).unwrap();
    // `P` then `OST`: a prefix of the preface at first, then not.
    let mut s = client::connect(proxy);
    s.write_all(b"P").unwrap();
    std::thread::sleep(Duration::from_millis(50)); // two segments, so the proxy sees the prefix first
    s.write_all(b"OST /sink HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        .unwrap();
    let reply = client::read_reply(&mut s).unwrap();
    assert_eq!(reply.status, 200, "{}", reply.text());
}
