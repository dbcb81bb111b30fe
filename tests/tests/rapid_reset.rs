//! Rapid reset across reconnecting connections (CVE-2023-44487 played as
//! the issue saw it): clients that open an HTTP/2 connection, send
//! HEADERS + RST_STREAM pairs until the server's GOAWAY, and reconnect,
//! for a few seconds, against an upstream that accepts slowly. The
//! upstream must see no flood of connects: the connections it is asked
//! for stay within `http.maxUpstreamConnections`, none is left that never
//! carried a byte beyond the pool, ordinary requests meanwhile get 200 (or
//! limiter's own 503, never a 502), the breaker stays closed, and the log
//! stays within its bounds.
//!
//! The daemon is the real binary at its configured log level (`info`, as
//! in production), without the kernel gate.

use std::{
    io::{self, Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use limiter_tests::{Daemon, client, h2raw, in_process::InProcess, metric, upstream::Upstream};

/// An upstream that accepts one connection every `every` (its backlog
/// holds the others), answers `200 ok` to every request head on a
/// keep-alive connection, and tells how many of its connections closed
/// without carrying a byte.
struct SlowUpstream {
    addr: SocketAddr,
    listener: Arc<TcpListener>,
    stop: Arc<AtomicBool>,
    accepted: Arc<AtomicU64>,
    /// Connections the peer closed before sending a byte.
    empty: Arc<AtomicU64>,
    /// Requests answered.
    served: Arc<AtomicU64>,
    acceptor: Option<thread::JoinHandle<()>>,
}

impl SlowUpstream {
    fn start(every: Duration, backlog: i32) -> Self {
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        socket.set_reuse_address(true).unwrap();
        socket.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into()).unwrap();
        socket.listen(backlog).unwrap();
        let listener = Arc::new(TcpListener::from(socket));
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let (accepted, empty, served) = Default::default();
        let mut up = Self { addr, listener, stop, accepted, empty, served, acceptor: None };
        let (l, stop, accepted, empty, served) =
            (up.listener.clone(), up.stop.clone(), up.accepted.clone(), up.empty.clone(), up.served.clone());
        l.set_nonblocking(true).unwrap();
        up.acceptor = Some(thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                thread::sleep(every);
                if let Ok((s, _)) = l.accept() {
                    accepted.fetch_add(1, Ordering::Relaxed);
                    let (empty, served) = (empty.clone(), served.clone());
                    thread::spawn(move || serve(s, &empty, &served));
                }
            }
        }));
        up
    }

    /// Stops accepting slowly, then takes what is still in the backlog:
    /// `(accepted in all, closed without a byte, open without a byte)`
    /// (the last: idle connections of limiter's pool).
    fn drain(mut self) -> (u64, u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.acceptor.take() {
            t.join().unwrap();
        }
        let mut waiting = Vec::new();
        while let Ok((s, _)) = self.listener.accept() {
            self.accepted.fetch_add(1, Ordering::Relaxed);
            waiting.push(s);
        }
        let mut idle = 0;
        for mut s in waiting {
            s.set_nonblocking(false).unwrap();
            s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
            match s.read(&mut [0u8; 1]) {
                Ok(0) => {
                    self.empty.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    idle += 1
                }
                _ => {}
            }
        }
        // The connections being served: give their threads a moment to
        // see what closed.
        thread::sleep(Duration::from_millis(200));
        (self.accepted.load(Ordering::Relaxed), self.empty.load(Ordering::Relaxed), idle)
    }
}

/// Serves one upstream connection: `200 ok` per request head, until EOF.
fn serve(mut s: TcpStream, empty: &AtomicU64, served: &AtomicU64) {
    s.set_nonblocking(false).unwrap();
    let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
    let (mut carried, mut buf, mut pending) = (0usize, [0u8; 4096], Vec::new());
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                carried += n;
                pending.extend_from_slice(&buf[..n]);
                while let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                    pending.drain(..end + 4);
                    served.fetch_add(1, Ordering::Relaxed);
                    if s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nok\n").is_err() {
                        return;
                    }
                }
            }
        }
    }
    if carried == 0 {
        empty.fetch_add(1, Ordering::Relaxed);
    }
}

/// Sockets in TIME-WAIT to or from the upstream, `127.0.0.1:port`
/// (`/proc/net/tcp`), by their two ends. The whole address, not the port
/// alone: an attacker's socket bound to 127.0.0.2 may get the same port
/// number. And by their ends, so that the caller can leave out those that
/// were there before the upstream bound: an earlier test's listener on
/// the same port number leaves its connections in TIME-WAIT for a minute.
fn time_wait(port: u16) -> std::collections::BTreeSet<(String, String)> {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    assert!(table.lines().next().is_some_and(|l| l.contains("local_address")), "/proc/net/tcp: {table}");
    let hex = format!("0100007F:{port:04X}");
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 3 && f[3] == "06" && (f[1] == hex || f[2] == hex))
                .then(|| (f[1].to_owned(), f[2].to_owned()))
        })
        .collect()
}

/// How an attacker cancels its streams.
#[derive(Clone, Copy, Debug)]
enum Reset {
    /// HEADERS + RST_STREAM pairs written together, 100 at a time, until
    /// the server's GOAWAY (h2 allows 20 streams reset before accept).
    Rapid,
    /// Each RST_STREAM written this long after its HEADERS, so that the
    /// request has reached admission and the upstream pool when it is
    /// cancelled; 30 streams a connection, then a new connection.
    After(Duration),
}

/// The address attackers connect from: loopback, but another client group
/// than the ordinary clients' (127.0.0.1).
const ATTACKER: &str = "127.0.0.2";

/// A connection to `to` from `from` (port chosen by the kernel).
fn connect_from(from: &str, to: SocketAddr) -> io::Result<TcpStream> {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    s.bind(&format!("{from}:0").parse::<SocketAddr>().unwrap().into())?;
    s.connect_timeout(&to.into(), Duration::from_secs(2))?;
    Ok(s.into())
}

/// One attacker: connections from [`ATTACKER`], each sent streams it
/// cancels, then a new one, until `until`. Returns `(connections, ended
/// with GOAWAY)`.
fn attack(proxy: SocketAddr, until: Instant, reset: Reset) -> (u64, u64) {
    let (mut connections, mut goaways) = (0, 0);
    let block = h2raw::get_block("/reset", &[]);
    let headers = |id| h2raw::frame(h2raw::HEADERS, h2raw::END_HEADERS | h2raw::END_STREAM, id, &block);
    let rst = |id| h2raw::frame(h2raw::RST_STREAM, 0, id, &8u32.to_be_bytes());
    let mut pairs = Vec::new();
    for i in 0..100u32 {
        pairs.extend(headers(2 * i + 1));
        pairs.extend(rst(2 * i + 1));
    }
    while Instant::now() < until {
        let Ok(mut s) = connect_from(ATTACKER, proxy) else { continue };
        connections += 1;
        let _ = s.set_nodelay(true);
        let _ = s.write_all(&[h2raw::PREFACE, &h2raw::settings(&[])].concat());
        match reset {
            Reset::Rapid => {
                let _ = s.write_all(&pairs);
                if let h2raw::End::GoAway(_) = h2raw::ending(&mut s, Duration::from_secs(1)) {
                    goaways += 1;
                }
            }
            Reset::After(gap) => {
                for i in 0..30u32 {
                    if s.write_all(&headers(2 * i + 1)).is_err() {
                        break;
                    }
                    thread::sleep(gap);
                    if s.write_all(&rst(2 * i + 1)).is_err() {
                        break;
                    }
                }
                if let h2raw::End::GoAway(_) = h2raw::ending(&mut s, Duration::from_millis(20)) {
                    goaways += 1;
                }
            }
        }
    }
    (connections, goaways)
}

/// Ordinary HTTP/1.1 requests, one connection each, until `until`: their
/// statuses (with `X-Limiter-Refused` for limiter's own 503s).
fn ordinary(proxy: SocketAddr, until: Instant, statuses: &Mutex<Vec<String>>) {
    while Instant::now() < until {
        let status =
            match client::send(proxy, b"GET /ordinary HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n") {
                Ok(r) => match r.header("x-limiter-refused") {
                    Some(reason) => format!("{} {reason}", r.status),
                    None => r.status.to_string(),
                },
                Err(e) => format!("error {e}"),
            };
        statuses.lock().unwrap().push(status);
        thread::sleep(Duration::from_millis(50));
    }
}

/// The cap the daemon is given, and what the attack may add to it: the
/// test's ordinary requests need none beyond the pool.
const CAP: u64 = 16;
const ATTACK: Duration = Duration::from_secs(4);

/// What one attack left, as the upstream, the clients and the daemon saw it.
#[derive(Debug)]
struct Figures {
    elapsed: Duration,
    /// Attack connections, and those the server ended with GOAWAY.
    connections: u64,
    goaways: u64,
    /// Upstream connections opened, closed without a byte, open without a
    /// byte at the end (idle in limiter's pool), in TIME-WAIT.
    opened: u64,
    empty: u64,
    idle: u64,
    time_wait: usize,
    /// Requests the upstream answered.
    served: u64,
    /// Ordinary requests: every status (`503 <reason>` for limiter's own).
    statuses: Vec<String>,
    connect_errors: f64,
    /// Requests that took an idle connection of the other worker's pool
    /// at the cap.
    borrowed: f64,
    /// Connections the daemon counted as ended for resets (h2's GOAWAY,
    /// the flood meter's cut).
    reset_ends: f64,
    breaker: String,
    /// Log lines written during the attack, and those of h2's own.
    log_lines: usize,
    h2_lines: usize,
}

impl Figures {
    fn ok(&self) -> usize {
        self.statuses.iter().filter(|s| *s == "200").count()
    }

    fn limiter_503(&self) -> usize {
        self.statuses.iter().filter(|s| s.starts_with("503 ")).count()
    }

    fn others(&self) -> Vec<&String> {
        self.statuses.iter().filter(|s| *s != "200" && !s.starts_with("503 ")).collect()
    }
}

/// Two attackers and two ordinary clients for [`ATTACK`] against a daemon
/// with `http.maxUpstreamConnections = CAP` in front of an upstream that
/// accepts one connection every 10 ms (`http.h2.resetRefusalMs` is off:
/// the refusal of the attackers' group has a test of its own).
fn run(reset: Reset) -> Figures {
    let up = SlowUpstream::start(Duration::from_millis(10), 256);
    let time_wait_before = time_wait(up.addr.port());
    let dir = std::env::temp_dir().join(format!("limiter-rapid-reset-{}-{reset:?}", std::process::id()));
    let (config, proxy) = client::http_config(
        &dir,
        Some(up.addr),
        &format!(
            "http.h2c = true\nhttp.workers = 2\nhttp.maxThreads = 48\nhttp.maxUpstreamConnections = {CAP}\n"
        ),
    );
    let d = Daemon::start_with_config_log_level(&config).expect("the daemon starts");
    let log_before = d.log().lines().count();
    let started = Instant::now();
    let until = started + ATTACK;
    let statuses = Arc::new(Mutex::new(Vec::new()));
    let attackers: Vec<_> = (0..2).map(|_| thread::spawn(move || attack(proxy, until, reset))).collect();
    let clients: Vec<_> = (0..2)
        .map(|_| {
            let statuses = statuses.clone();
            thread::spawn(move || ordinary(proxy, until + Duration::from_secs(1), &statuses))
        })
        .collect();
    let (mut connections, mut goaways) = (0, 0);
    for a in attackers {
        let (c, g) = a.join().unwrap();
        connections += c;
        goaways += g;
    }
    clients.into_iter().for_each(|c| c.join().unwrap());
    let elapsed = started.elapsed();
    thread::sleep(Duration::from_millis(500));

    let page = d.metrics();
    let breaker = d.admin_get("/breaker").expect("the breaker's state");
    let connect_errors = metric(&page, "limiter_http_upstream_errors_total{kind=\"connect\"}");
    let borrowed = metric(&page, "limiter_http_upstream_borrowed_total");
    let reset_ends = metric(&page, "limiter_http2_reset_goaways_total")
        + metric(&page, "limiter_http2_floods_total{frame=\"rst_stream\"}");
    let log = d.log();
    let lines: Vec<&str> = log.lines().skip(log_before).collect();
    let h2_lines = lines.iter().filter(|l| l.contains(" h2::")).count();
    for l in lines.iter().take(3) {
        eprintln!("  log: {l}");
    }
    let time_wait = time_wait(up.addr.port()).difference(&time_wait_before).count();
    let served = up.served.load(Ordering::Relaxed);
    let (opened, empty, idle) = up.drain();
    let statuses = statuses.lock().unwrap().clone();
    let f = Figures {
        elapsed,
        connections,
        goaways,
        opened,
        empty,
        idle,
        time_wait,
        served,
        statuses: statuses.clone(),
        connect_errors,
        borrowed,
        reset_ends,
        breaker,
        log_lines: lines.len(),
        h2_lines,
    };
    eprintln!(
        "{reset:?} for {:?}: {} attack connections ({} ended by GOAWAY); upstream: {} connections opened, \
         {} closed without a byte, {} idle open without a byte, {} in TIME-WAIT, {} requests served; \
         ordinary requests: {} sent, {} got 200, {} limiter's 503, others {:?}; connect errors {}; \
         {} borrowed; breaker {}; {} log lines ({} from h2)",
        f.elapsed,
        f.connections,
        f.goaways,
        f.opened,
        f.empty,
        f.idle,
        f.time_wait,
        f.served,
        f.statuses.len(),
        f.ok(),
        f.limiter_503(),
        f.others(),
        f.connect_errors,
        f.borrowed,
        f.breaker,
        f.log_lines,
        f.h2_lines,
    );
    f
}

/// What every attack must leave: the upstream's connections within the
/// cap and none wasted, ordinary requests served or refused by limiter
/// itself, the breaker closed, the log within its bounds.
fn holds(f: &Figures) {
    assert!(f.connections > 20, "the attack reconnected: {} connections", f.connections);
    assert!(f.opened <= CAP, "upstream connections opened: {}, cap {CAP}", f.opened);
    assert_eq!(f.time_wait, 0, "no upstream connection was closed");
    assert_eq!(f.empty, 0, "connections closed without carrying a byte");
    assert!(f.idle <= CAP, "open without a byte: {}, beyond the pool's cap {CAP}", f.idle);
    assert!(f.others().is_empty(), "ordinary requests got 200 or limiter's 503 only: {:?}", f.others());
    assert!(
        f.ok() * 2 >= f.statuses.len(),
        "most ordinary requests got 200: {} of {}",
        f.ok(),
        f.statuses.len()
    );
    assert_eq!(f.connect_errors, 0.0, "no connect error reached the breaker");
    assert!(f.breaker.contains("\"state\":\"closed\""), "the breaker stayed closed: {}", f.breaker);
    assert_eq!(f.h2_lines, 0, "h2's own lines are folded");
    let secs = f.elapsed.as_secs_f64().ceil() as usize + 1;
    assert!(
        f.log_lines <= 11 * secs + 5,
        "{} log lines in {secs} s: 10 refusal lines and 1 reset line a second at most",
        f.log_lines
    );
}

#[test]
#[ignore = "a few seconds of load against the real daemon: run with --include-ignored"]
fn rapid_reset_across_reconnecting_connections_leaves_no_work_at_the_upstream() {
    let f = run(Reset::Rapid);
    assert!(f.goaways > 20, "h2 ended the attack's connections with GOAWAY: {}", f.goaways);
    assert!(
        f.reset_ends >= f.goaways as f64,
        "every connection ended for resets is counted: {} of {}",
        f.reset_ends,
        f.goaways
    );
    holds(&f);
}

#[test]
#[ignore = "a few seconds of load against the real daemon: run with --include-ignored"]
fn streams_cancelled_after_reaching_the_pool_leave_their_connections_to_it() {
    let f = run(Reset::After(Duration::from_millis(2)));
    holds(&f);
}

#[test]
fn a_request_that_finds_every_upstream_connection_busy_gets_limiters_503_not_a_breaker_failure() {
    let up = Upstream::start();
    // One failure would trip this breaker: the cap's refusal must not be one.
    let d = InProcess::start(
        up.addr,
        "http.maxUpstreamConnections = 2\nhttp.connectTimeoutMs = 300\nbreaker.minRequests = 1\n",
    );
    let proxy = d.proxy;
    let held: Vec<_> = (0..2).map(|_| thread::spawn(move || client::get(proxy, "/hold", &[]))).collect();
    up.wait_holding(2);
    assert_eq!(d.metric("limiter_http_upstream_connections{state=\"established\"}"), 2.0);
    assert_eq!(d.metric("limiter_http_upstream_connection_limit"), 2.0);
    let asked = Instant::now();
    let refused = d.get("/x", &[]);
    let waited = asked.elapsed();
    assert_eq!((refused.status, refused.header("x-limiter-refused")), (503, Some("upstream_full")));
    assert!(refused.header("retry-after").is_some(), "an admission 503 says when to come back");
    assert!(
        waited >= Duration::from_millis(300),
        "it waited http.connectTimeoutMs for a connection: {waited:?}"
    );
    assert_eq!(d.metric("limiter_http_refused_total{reason=\"upstream_full\"}"), 1.0);
    assert_eq!(d.metric("limiter_http_upstream_errors_total{kind=\"connect\"}"), 0.0);
    assert_eq!(d.breaker_state(), "closed", "limiter's own cap is not an upstream failure");

    // A request waiting when a connection comes free gets it.
    let waiting = thread::spawn(move || client::get(proxy, "/x", &[]));
    thread::sleep(Duration::from_millis(50));
    up.release();
    for h in held {
        assert_eq!(h.join().unwrap().status, 200);
    }
    assert_eq!(waiting.join().unwrap().status, 200, "the waiting request got a pooled connection");
    assert_eq!(d.get("/x", &[]).status, 200);
    assert_eq!(
        d.metric("limiter_http_upstream_connects_total{result=\"ok\"}"),
        2.0,
        "every request after the first two went on their pooled connections"
    );
}

#[test]
fn a_group_whose_connections_keep_ending_for_resets_is_refused_at_accept() {
    let up = Upstream::start();
    let d = InProcess::start(up.addr, "http.h2c = true\nhttp.h2.resetRefusalMs = 30000\n");
    let block = h2raw::get_block("/x", &[]);
    let mut pairs = Vec::new();
    for i in 0..100u32 {
        let id = 2 * i + 1;
        pairs.extend(h2raw::frame(h2raw::HEADERS, h2raw::END_HEADERS | h2raw::END_STREAM, id, &block));
        pairs.extend(h2raw::frame(h2raw::RST_STREAM, 0, id, &8u32.to_be_bytes()));
    }
    let (mut goaways, mut cut) = (0, 0);
    for _ in 0..40 {
        let Ok(mut s) = connect_from(ATTACKER, d.proxy) else {
            cut += 1;
            continue;
        };
        let _ = s.write_all(&[h2raw::PREFACE, &h2raw::settings(&[])].concat());
        let _ = s.write_all(&pairs);
        match h2raw::ending(&mut s, Duration::from_secs(2)) {
            h2raw::End::GoAway(_) => goaways += 1,
            h2raw::End::Closed => cut += 1,
            h2raw::End::Open => panic!("a connection sending 100 resets stayed open"),
        }
    }
    let refused = d.metric("limiter_http_connections_refused_for_resets_total");
    eprintln!(
        "40 rapid-reset connections: {goaways} ended by GOAWAY, {cut} cut; {refused} refused at accept"
    );
    // The 10th connection's end is counted once the server is done with it,
    // so the client may have reconnected once or twice before.
    assert!((10..=12).contains(&goaways), "h2's GOAWAY for the first 10 connections or so: {goaways}");
    assert_eq!(refused, f64::from(40 - goaways), "every later connection was refused at accept");
    assert_eq!(d.metric("limiter_http2_reset_goaways_total"), f64::from(goaways));
    assert_eq!(d.metric("limiter_http2_reset_groups_refused"), 1.0);
    assert_eq!(d.metric("limiter_http2_reset_group_refusals_total"), 1.0);
    // The group is refused on every protocol; other groups are served.
    let from_group = connect_from(ATTACKER, d.proxy).and_then(|mut s| {
        s.write_all(b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n")?;
        client::read_reply(&mut s)
    });
    assert!(from_group.is_err(), "the refused group gets no answer: {from_group:?}");
    assert_eq!(d.get("/x", &[]).status, 200, "another group is served");
    assert_eq!(up.hits(), 1, "no stream of the attack reached the upstream");
}
