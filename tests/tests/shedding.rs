//! Coupled shedding (`http.shedAtSyn`) with a real kernel gate: while the
//! normal pool keeps refusing, new connections to the proxy's port get a
//! RST at the SYN (reason `shed`), trusted sources still get in, and it
//! stops only once the pool has refused nothing for `http.shedReleaseMs`;
//! a daemon killed while shedding leaves the port open within one lease.

use std::{
    fs::File,
    io::{ErrorKind, Read as _, Write as _},
    net::{IpAddr, SocketAddr, TcpStream},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use limiter_tests::{
    Daemon, Sandbox, dump, in_netns, port_row,
    process::{terminate, wait_for},
    require_kernel,
    upstream::Upstream,
};
use nix::sys::signal::Signal;
use serde_json::Value;

/// Normal slots of `http.maxThreads = 16` (16 - 8 system - 3 `/debug/`).
const NORMAL: usize = 5;
const AFTER_MS: u64 = 100;
/// Refusals per second over [`AFTER_MS`] that start shedding: 5 in the
/// window, what the tests' floods pass at once (the configuration warns
/// of noise below 80; these floods are no noise).
const RATE: u64 = 50;
const RELEASE_MS: u64 = 600;
/// The trusted source; the flood comes from 127.0.0.1.
const TRUSTED: &str = "127.0.0.2";

/// What one new connection met.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// RST at the SYN.
    Refused,
    /// An HTTP answer with this status.
    Status(u16),
    Other(String),
}

/// A sandbox with an upstream, a proxy in front of it with shedding on,
/// the daemon started inside; the proxy's address.
fn setup(extra: &str) -> (Sandbox, Arc<Upstream>, Daemon, SocketAddr) {
    let sb = Sandbox::new().unwrap();
    let up = Arc::new(sb.in_netns(Upstream::start));
    let config = sb.config(
        "1:1",
        &format!(
            "http.upstream = {}\nhttp.maxThreads = 16\nhttp.shedAtSyn = true\nhttp.shedAfterMs = {AFTER_MS}\n\
             http.shedRefusalRate = {RATE}\nhttp.shedReleaseMs = {RELEASE_MS}\nkernel.trusted = {TRUSTED}/32\n{extra}",
            up.addr
        ),
    );
    let text = std::fs::read_to_string(&config).unwrap();
    let proxy: SocketAddr =
        text.lines().find_map(|l| l.strip_prefix("http.listen = ")).unwrap().parse().unwrap();
    let daemon = Daemon::start_inside(&sb, &config, &[]).expect("the daemon");
    (sb, up, daemon, proxy)
}

/// A new connection from `source` and one request for `path`, in the
/// namespace `netns`.
fn attempt(netns: &File, proxy: SocketAddr, source: &str, path: &str) -> Outcome {
    let source: IpAddr = source.parse().unwrap();
    let path = path.to_owned();
    in_netns(netns, move || {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        s.bind(&SocketAddr::new(source, 0).into()).unwrap();
        match s.connect_timeout(&proxy.into(), Duration::from_secs(3)) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => return Outcome::Refused,
            Err(e) => return Outcome::Other(format!("connect: {e}")),
        }
        let mut s: TcpStream = s.into();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let req = format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
        if let Err(e) = s.write_all(req.as_bytes()) {
            return Outcome::Other(format!("write: {e}"));
        }
        let mut head = [0u8; 12];
        match s.read_exact(&mut head) {
            Ok(()) => String::from_utf8_lossy(&head[9..12])
                .parse()
                .map_or_else(|_| Outcome::Other("not HTTP".into()), Outcome::Status),
            Err(e) => Outcome::Other(format!("read: {e}")),
        }
    })
}

/// `NORMAL` requests held by the upstream: the normal pool is full.
fn fill_pool(sb: &Sandbox, up: &Arc<Upstream>, proxy: SocketAddr) -> Vec<thread::JoinHandle<Outcome>> {
    let held: Vec<_> = (0..NORMAL)
        .map(|_| {
            let netns = sb.netns_file();
            let sb_proxy = proxy;
            thread::spawn(move || {
                in_netns(&netns, move || {
                    let mut s = TcpStream::connect(sb_proxy).unwrap();
                    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                    s.write_all(b"GET /hold HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").unwrap();
                    let mut head = [0u8; 12];
                    match s.read_exact(&mut head) {
                        Ok(()) => Outcome::Status(String::from_utf8_lossy(&head[9..12]).parse().unwrap_or(0)),
                        Err(e) => Outcome::Other(e.to_string()),
                    }
                })
            })
        })
        .collect();
    up.wait_holding(NORMAL as u64);
    held
}

/// New connections from 127.0.0.1 every few milliseconds until stopped,
/// tallied by outcome: (refused at the SYN, 503, 200, other).
struct Flood {
    stop: Arc<AtomicBool>,
    tally: Arc<[AtomicU64; 4]>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Flood {
    fn start(sb: &Sandbox, proxy: SocketAddr) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let tally: Arc<[AtomicU64; 4]> = Arc::new(Default::default());
        let (s, t) = (stop.clone(), tally.clone());
        let netns = sb.netns_file();
        let thread = thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let i = match attempt(&netns, proxy, "127.0.0.1", "/") {
                    Outcome::Refused => 0,
                    Outcome::Status(503) => 1,
                    Outcome::Status(200) => 2,
                    _ => 3,
                };
                t[i].fetch_add(1, Ordering::Relaxed);
                // Pacing: the flood's rate.
                thread::sleep(Duration::from_millis(3));
            }
        });
        Self { stop, tally, thread: Some(thread) }
    }

    fn counts(&self) -> [u64; 4] {
        std::array::from_fn(|i| self.tally[i].load(Ordering::Relaxed))
    }

    fn stop(mut self) -> [u64; 4] {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        self.counts()
    }
}

fn shedding_active(daemon: &Daemon) -> bool {
    daemon.admin_get("/status").is_ok_and(|s| {
        serde_json::from_str::<Value>(&s).is_ok_and(|v| v["http"]["shedding"]["active"] == true)
    })
}

/// The controller's part of `/status` (`http.shedding`).
fn shed_status(daemon: &Daemon) -> Value {
    let status: Value = serde_json::from_str(&daemon.admin_get("/status").expect("GET /status")).unwrap();
    status["http"]["shedding"].clone()
}

#[test]
#[ignore = "black-box: the daemon binary, root, a network namespace and cgroup; run by `cargo xtask test`"]
fn a_refusing_pool_sheds_new_connections_at_the_syn_until_it_has_had_room_for_the_release_time() {
    require_kernel!();
    let (sb, up, mut daemon, proxy) = setup("");
    // Room: nothing is shed.
    assert_eq!(attempt(&sb.netns_file(), proxy, "127.0.0.1", "/"), Outcome::Status(200));
    assert!(!shedding_active(&daemon));

    let held = fill_pool(&sb, &up, proxy);
    let flood = Flood::start(&sb, proxy);
    wait_for("shedding to start", Duration::from_secs(5), || shedding_active(&daemon));
    let at_start = flood.counts();
    assert!(at_start[1] > 0, "503s came first, while the pool refused for {AFTER_MS} ms: {at_start:?}");
    wait_for("a SYN refused", Duration::from_secs(5), || flood.counts()[0] > 10);

    // A trusted source still connects, and its /debug/ request has its
    // reserved slots.
    for _ in 0..5 {
        assert_eq!(attempt(&sb.netns_file(), proxy, TRUSTED, "/debug/x"), Outcome::Status(200));
    }
    let d = dump(&sb.pin_path);
    let row = port_row(&d, proxy.port());
    assert!(row["refused_by"]["shed"].as_u64().unwrap() > 10, "{row}");
    assert!(row["shedding"]["expires_in_ms"].as_u64().unwrap() > 0, "{row}");
    assert_eq!(row["shedding"]["probe_one_in"], 16);
    // Each of the five counted once: as trusted, or (picked by the hash
    // first) as a probe.
    let probes = row["shed_probes"].as_u64().unwrap();
    assert!(row["trusted_admitted"].as_u64().unwrap() + probes >= 5, "{row}");
    let metrics = daemon.metrics();
    assert!(metrics.contains("limiter_http_shedding 1"), "{metrics}");
    assert!(
        metrics.contains(&format!(
            "limiter_kernel_refused_total{{port=\"{}\",reason=\"shed\",path=\"sk_lookup\"}}",
            proxy.port()
        )),
        "{metrics}"
    );
    assert!(metrics.contains(&format!("limiter_kernel_shedding{{port=\"{}\"}} 1", proxy.port())));
    assert!(daemon.log().contains("shedding new connections at the SYN"), "{}", daemon.log());

    // Probes: one attempt in 16 still reaches HTTP and gets its 503.
    wait_for("probes meeting the HTTP 503 while shedding", Duration::from_secs(10), || {
        flood.counts()[1] >= at_start[1] + 3
    });
    // The last refusal happens no earlier than this.
    let quiet = Instant::now();
    let during = flood.stop();
    let shed_then = during[0] - at_start[0];
    assert!(during[1] > at_start[1], "probes kept meeting the HTTP 503: {at_start:?} then {during:?}");
    assert_eq!(during[3], 0, "no attempt timed out or broke: {during:?}");
    assert!(
        during[1] - at_start[1] < shed_then,
        "most attempts were shed at the SYN: {at_start:?} then {during:?}"
    );

    // Refusing stopped: shedding holds for the release time, then stops.
    up.release();
    for h in held {
        assert_eq!(h.join().unwrap(), Outcome::Status(200));
    }
    // A timer: a third of the release, which the test measures.
    thread::sleep(Duration::from_millis(RELEASE_MS / 3).saturating_sub(quiet.elapsed()));
    assert!(
        shedding_active(&daemon),
        "still shedding {} ms into the {RELEASE_MS} ms release",
        quiet.elapsed().as_millis()
    );
    wait_for("shedding to stop", Duration::from_secs(5), || !shedding_active(&daemon));
    // The pool's last refusal was a probe's 503, up to a few probes'
    // spacing (one attempt in 16, every few ms) before `quiet`.
    assert!(
        quiet.elapsed() >= Duration::from_millis(RELEASE_MS - 200),
        "stopped after {} ms of room, before the {RELEASE_MS} ms release",
        quiet.elapsed().as_millis()
    );
    assert_eq!(attempt(&sb.netns_file(), proxy, "127.0.0.1", "/"), Outcome::Status(200));
    let row = port_row(&dump(&sb.pin_path), proxy.port());
    assert!(row["shedding"].is_null(), "the flag is lowered: {row}");
    assert!(daemon.log().contains("stopped shedding"), "{}", daemon.log());
    assert_eq!(terminate(&mut daemon, Duration::from_secs(30)), Some(0));
}

#[test]
#[ignore = "black-box: the daemon binary, root, a network namespace and cgroup; run by `cargo xtask test`"]
fn dry_run_counts_what_it_would_shed_and_refuses_no_syn() {
    require_kernel!();
    let (sb, up, mut daemon, proxy) = setup("http.dryRun = true\n");
    // Dry-run admits past a full pool, so the pool's refusals are would-be
    // ones: fill it and keep asking.
    let held = fill_pool(&sb, &up, proxy);
    let flood = Flood::start(&sb, proxy);
    wait_for("would-be shedding", Duration::from_secs(5), || shedding_active(&daemon));
    wait_for("would-be sheds counted", Duration::from_secs(5), || {
        let row = port_row(&dump(&sb.pin_path), proxy.port());
        row["would_refuse_by"]["shed"].as_u64().unwrap_or_else(|| panic!("no would_refuse_by.shed in {row}"))
            > 5
    });
    let counts = flood.stop();
    assert_eq!(counts[0], 0, "nothing refused at the SYN in dry-run: {counts:?}");
    let row = port_row(&dump(&sb.pin_path), proxy.port());
    assert_eq!(row["refused_by"]["shed"], 0, "{row}");
    assert_eq!(row["shedding"]["dry_run"], true, "{row}");
    up.release();
    for h in held {
        let _ = h.join();
    }
    assert_eq!(terminate(&mut daemon, Duration::from_secs(30)), Some(0));
}

#[test]
#[ignore = "black-box: the daemon binary, root, a network namespace and cgroup; run by `cargo xtask test`"]
fn a_daemon_killed_while_shedding_leaves_the_port_open_within_one_lease() {
    require_kernel!();
    let (sb, up, daemon, proxy) = setup("");
    let held = fill_pool(&sb, &up, proxy);
    let flood = Flood::start(&sb, proxy);
    wait_for("shedding to start", Duration::from_secs(5), || shedding_active(&daemon));
    wait_for("a SYN refused", Duration::from_secs(5), || flood.counts()[0] > 0);
    flood.stop();
    daemon.signal(Signal::SIGKILL);
    let killed = Instant::now();
    drop(daemon);
    // Something else listens on the port now; while the flag holds, its
    // SYNs are still shed, and within the lease they are not.
    let listener = sb.listen_uncounted(&proxy.to_string());
    listener.set_nonblocking(true).unwrap();
    // Open: five connections in a row (a shed port lets one in 16 through
    // as a probe).
    let (mut refused_after_kill, mut in_a_row) = (0, 0);
    let opened = loop {
        match attempt_connect(&sb, proxy) {
            Ok(()) => in_a_row += 1,
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                refused_after_kill += 1;
                in_a_row = 0;
            }
            Err(e) => panic!("connect after the kill: {e}"),
        }
        if in_a_row == 5 {
            break killed.elapsed();
        }
        assert!(
            killed.elapsed() < Duration::from_secs(5),
            "the port stayed shut {:?} after the kill",
            killed.elapsed()
        );
        // Pacing: attempts 20 ms apart, timing how long the port stays shut.
        thread::sleep(Duration::from_millis(20));
    };
    eprintln!("port open {opened:?} after the kill; {refused_after_kill} SYNs shed before");
    assert!(refused_after_kill > 0, "the flag still held right after the kill");
    assert!(opened <= Duration::from_millis(1500), "opened {opened:?} after the kill (lease 1 s)");
    let row = port_row(&dump(&sb.pin_path), proxy.port());
    assert_eq!(row["shedding"]["expires_in_ms"], 0, "the flag shows as lapsed: {row}");
    up.release();
    for h in held {
        let _ = h.join();
    }
    let _ = limiter_tests::limiter(&["unload", "--pin-path", sb.pin_path.to_str().unwrap()]);
}

/// A bare connect to `proxy` from the sandbox.
fn attempt_connect(sb: &Sandbox, proxy: SocketAddr) -> std::io::Result<()> {
    sb.connect(&proxy.to_string()).map(drop)
}

/// Rewrites `key = value` lines of the daemon's file and reloads it.
fn reload_with(daemon: &Daemon, keys: &[(&str, &str)]) {
    let mut text = std::fs::read_to_string(&daemon.config).unwrap();
    for (key, value) in keys {
        let old = text.lines().find(|l| l.starts_with(&format!("{key} = "))).unwrap().to_owned();
        text = text.replace(&old, &format!("{key} = {value}"));
    }
    std::fs::write(&daemon.config, text).unwrap();
    let outcome = daemon.reload();
    assert!(outcome.contains("applied"), "{outcome}");
}

#[test]
#[ignore = "black-box: the daemon binary, root, a network namespace and cgroup; run by `cargo xtask test`"]
fn shedding_and_its_timings_change_live() {
    require_kernel!();
    let (sb, up, mut daemon, proxy) = setup("");
    // Off, with the start delay still AFTER_MS: only `shedAtSyn = false`
    // can explain that a pool refusing for many times that sheds nothing.
    // (A release the test would not wait for.)
    reload_with(&daemon, &[("http.shedAtSyn", "false"), ("http.shedReleaseMs", "8000")]);
    let held = fill_pool(&sb, &up, proxy);
    let flood = Flood::start(&sb, proxy);
    wait_for("the pool refusing", Duration::from_secs(5), || flood.counts()[1] > 0);
    let refusing = flood.counts();
    // A timer: ten start delays of a refusing pool, ample for shedding to
    // start were it on.
    thread::sleep(Duration::from_millis(10 * AFTER_MS));
    let off = flood.counts();
    assert_eq!(off[0], 0, "switched off: no SYN refused while the pool refuses: {off:?}");
    assert!(off[1] >= refusing[1] + 20, "the pool kept refusing: {refusing:?} then {off:?}");
    assert_eq!(shed_status(&daemon)["started"], 0, "switched off: shedding never started");
    assert!(!shedding_active(&daemon));
    // On, with a rate the flood does not reach (a million refusals a
    // second): still nothing shed after the same ten windows.
    reload_with(&daemon, &[("http.shedAtSyn", "true"), ("http.shedRefusalRate", "1000000")]);
    let before = flood.counts();
    // A timer, as above.
    thread::sleep(Duration::from_millis(10 * AFTER_MS));
    let on = flood.counts();
    assert_eq!(on[0], 0, "a rate the flood does not reach: no SYN refused: {on:?}");
    assert!(on[1] >= before[1] + 20, "the pool kept refusing: {before:?} then {on:?}");
    assert_eq!(shed_status(&daemon)["started"], 0, "a rate not reached: shedding not started");
    // The reloaded rate and window: the flood passes 50 a second over 100
    // ms at once, so shedding starts.
    reload_with(&daemon, &[("http.shedRefusalRate", &RATE.to_string()), ("http.shedAfterMs", "100")]);
    wait_for("shedding at the reloaded rate and window", Duration::from_secs(3), || shedding_active(&daemon));
    // The reloaded release: refusing stops, shedding stops within it, not
    // after the 8 s it had.
    reload_with(&daemon, &[("http.shedReleaseMs", "300")]);
    flood.stop();
    wait_for("shedding to stop after the reloaded 300 ms", Duration::from_secs(3), || {
        !shedding_active(&daemon)
    });
    // Switched off while shedding: it stops at once and lowers its flags.
    let flood = Flood::start(&sb, proxy);
    wait_for("shedding again", Duration::from_secs(3), || shedding_active(&daemon));
    reload_with(&daemon, &[("http.shedAtSyn", "false")]);
    wait_for("switched off", Duration::from_secs(1), || !shedding_active(&daemon));
    assert!(daemon.log().contains("http.shedAtSyn was switched off"), "{}", daemon.log());
    assert!(port_row(&dump(&sb.pin_path), proxy.port())["shedding"].is_null(), "the flag is lowered");
    let before = flood.counts();
    // The next 50 attempts (a fifth of a second of this flood, well inside
    // the 1 s lease a flag left raised would still hold).
    let attempts = |c: [u64; 4]| c.iter().sum::<u64>();
    wait_for("50 attempts once switched off", Duration::from_secs(5), || {
        attempts(flood.counts()) >= attempts(before) + 50
    });
    let after = flood.stop();
    assert_eq!(after[0], before[0], "no SYN refused once switched off: {before:?} then {after:?}");
    up.release();
    for h in held {
        let _ = h.join();
    }
    assert_eq!(terminate(&mut daemon, Duration::from_secs(30)), Some(0));
}

#[test]
#[ignore = "black-box: the daemon binary, root, a network namespace and cgroup; run by `cargo xtask test`"]
fn an_idle_daemon_with_the_gate_shedding_and_adaptive_limits_sleeps() {
    require_kernel!();
    let (sb, _up, mut daemon, proxy) = setup("http.adaptive = on\n");
    let netns = sb.netns_file();
    for _ in 0..20 {
        assert_eq!(attempt(&netns, proxy, "127.0.0.1", "/x"), Outcome::Status(200));
    }
    // The adaptive controller closes its last bin (at most a second), then
    // every timer with nothing to do sleeps.
    thread::sleep(Duration::from_secs(3));
    let pid = daemon.pid().as_raw() as u32;
    let switches = |s: limiter_tests::sched::Sched| s.voluntary + s.involuntary;
    let before = limiter_tests::sched::Sched::of(&[pid]).unwrap();
    let window = Duration::from_secs(5);
    thread::sleep(window);
    let after = limiter_tests::sched::Sched::of(&[pid]).unwrap();
    let per_second = (switches(after) - switches(before)) / window.as_secs_f64();
    eprintln!("idle with the gate, shedding and adaptive limits: {per_second:.1} wake-ups a second");
    // What is left: the permit ledger's beat every 500 ms (each a wake-up
    // or two of tokio's timer wheel) and the gate's look every 2 s; the
    // 10 ms timers of the adaptive limit and of shedding made it 200.
    assert!(per_second < 10.0, "{per_second:.1} context switches a second while idle");
    // Woken again by the next request.
    assert_eq!(attempt(&netns, proxy, "127.0.0.1", "/x"), Outcome::Status(200));
    assert_eq!(terminate(&mut daemon, Duration::from_secs(30)), Some(0));
}
