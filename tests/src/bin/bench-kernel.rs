//! `cargo xtask bench kernel`: the kernel gate against no gate, against
//! iptables `connlimit`, and against a port with no listener, in one run,
//! interleaved and repeated. Prints the figures and writes them into
//! BENCHMARKS.md. Every configuration gets its own throwaway network
//! namespace, so conntrack loaded for iptables cannot slow the others.
//!
//! (a) accepted connections per second: no gate / gate with a limit far
//!     above the load / iptables connlimit with the same limit;
//! (a2) the same three with one HTTP request per connection: requests per
//!     second a minimal HTTP/1.1 server answers (it reads the request head,
//!     writes a fixed 200 with `Connection: close` and closes), so the
//!     gate's share is shown as a server sees it;
//! (b) refused attempts per second against a full port: gate / iptables
//!     connlimit REJECT with tcp-reset / a port with no listener (the floor
//!     cost of any RST);
//! (c) each program's own cost per run from `kernel.bpf_stats_enabled`;
//! (d) refused attempts per second across a veth pair (client and server
//!     in two namespaces): the gate refusing at the driver with XDP / the
//!     gate refusing in the stack with sk_lookup / iptables connlimit / no
//!     listener;
//! (e) the XDP program's cost per frame from `BPF_PROG_TEST_RUN` with a
//!     repeat count: the SYN decision (refusal with its RST, per-source
//!     check), and frames it passes.

use std::{
    fs,
    io::{self, ErrorKind, Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, ensure};
use limiter_tests::{
    Daemon, Sandbox,
    bench::{median, spread},
    bpf,
    packet::{self, ACK, SYN, Segment},
    peer::Peer,
    run,
};

const PORT: u16 = 7200;
const ROUNDS: usize = 7;
const SECONDS: f64 = 2.0;
const CLIENT_THREADS: usize = 2;
const HIGH_LIMIT: u32 = 1_000_000;

fn main() -> Result<()> {
    if let Some(why) = limiter_tests::kernel_tests_blocked() {
        anyhow::bail!("the benchmark: {why}");
    }
    if std::env::var_os("BENCH_XDP_ONLY").is_some() {
        // Part (e) alone, printed, BENCHMARKS.md untouched: for quick A/B
        // runs of the XDP program.
        let frames = xdp_cost()?;
        print!("{}", xdp_report(&frames));
        return Ok(());
    }
    let addr: SocketAddr = format!("127.0.0.1:{PORT}").parse()?;
    if std::env::var_os("BENCH_GATE_COST_ONLY").is_some() {
        // sock_ops per counted connection alone, printed, BENCHMARKS.md
        // untouched: for quick A/B runs of the counting program.
        return gate_cost_only(addr);
    }

    let plain = Sandbox::new()?;
    let gated = Sandbox::new()?;
    let iptables = Sandbox::new()?;
    let floor = Sandbox::new()?;
    let gate_config = gated.config(&format!("{PORT}:{HIGH_LIMIT}"), "");
    let daemon = Daemon::start(&gate_config, &[])?;
    connlimit(&iptables, HIGH_LIMIT)?;

    // (a) accept rate, limit far above the load.
    let rounds = std::env::var("BENCH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(ROUNDS);
    let accept = interleaved(rounds, "accept", [&plain, &gated, &iptables], addr, accept_rate)?;

    // (a2) request rate, one HTTP request per connection, in sandboxes of
    // its own.
    let requests = http_rates(rounds, addr)?;

    // (b) refusal rate against a full port (limit 1, one connection held).
    fs::write(
        &gate_config,
        fs::read_to_string(&gate_config)?.replace(&format!("{PORT}:{HIGH_LIMIT}"), &format!("{PORT}:1")),
    )?;
    let outcome = daemon.reload();
    ensure!(outcome.contains("applied"), "reload: {outcome}");
    run("ip", &["netns", "exec", &iptables.name, "iptables", "-F", "INPUT"])?;
    connlimit(&iptables, 1)?;
    let held_gate = hold_one(&gated, addr)?;
    let held_ipt = hold_one(&iptables, addr)?;
    let mut refuse: [Vec<f64>; 3] = Default::default();
    let mut leaked = [0u64; 3];
    for round in 0..rounds {
        for k in 0..3 {
            let which = (round + k) % 3;
            let sb = [&gated, &iptables, &floor][which];
            let (rate, through) = refuse_rate(sb, addr)?;
            refuse[which].push(rate);
            leaked[which] += through;
        }
        eprintln!("refuse round {}/{ROUNDS} done", round + 1);
    }
    drop((held_gate, held_ipt));

    // (c) per-program cost under load, from the kernel's own statistics.
    fs::write(
        &gate_config,
        fs::read_to_string(&gate_config)?.replace(&format!("{PORT}:1"), &format!("{PORT}:{HIGH_LIMIT}")),
    )?;
    daemon.reload();
    let programs = program_ids(&gated)?;
    let previous = fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled")?;
    fs::write("/proc/sys/kernel/bpf_stats_enabled", "1")?;
    let snapshot = || -> Result<Vec<(u64, u64)>> { programs.iter().map(|(_, id)| prog_stats(*id)).collect() };
    let ids: Vec<u32> = programs.iter().map(|(_, id)| *id).collect();
    let load = accept_beside_floor(&gated, addr, &ids)?;
    let (s0, s1, floor_cost) = (load.before, load.after, load.floor);
    let counted = floor_cost.counted;
    fs::write(
        &gate_config,
        fs::read_to_string(&gate_config)?.replace(&format!("{PORT}:{HIGH_LIMIT}"), &format!("{PORT}:1")),
    )?;
    daemon.reload();
    let held = hold_one(&gated, addr)?;
    let s2 = snapshot()?;
    let (_, through) = refuse_rate(&gated, addr)?;
    let s3 = snapshot()?;
    leaked[0] += through;
    drop(held);
    fs::write("/proc/sys/kernel/bpf_stats_enabled", previous.trim())?;
    let per_run = |b: &[(u64, u64)], a: &[(u64, u64)], i: usize| {
        let runs = a[i].1 - b[i].1;
        ((a[i].0 - b[i].0) as f64 / runs.max(1) as f64, runs)
    };
    let cost: Vec<Cost> = programs
        .iter()
        .enumerate()
        .map(|(i, (name, _))| Cost {
            name: name.clone(),
            accept: per_run(&s0, &s1, i),
            refuse: per_run(&s2, &s3, i),
            per_connection: (s1[i].0 - s0[i].0) as f64 / counted.max(1) as f64,
        })
        .collect();
    drop(daemon);

    let (veth, veth_leaked) = across_veth(rounds)?;
    let frames = xdp_cost()?;

    let mut report = report(&accept, &requests, &refuse, &leaked, &cost, &floor_cost);
    report.push_str(&veth_report(&veth, &veth_leaked, &frames));
    print!("{report}");
    limiter_tests::bench::write_section(
        "kernel",
        "Kernel gate",
        "`cargo xtask bench kernel` (as root; installs iptables itself).",
        &report,
    )?;
    Ok(())
}

/// `BENCH_GATE_COST_ONLY`: a gate far above the load and the floor
/// program beside it, under three accept loads; the sock_ops figures of
/// each.
fn gate_cost_only(addr: SocketAddr) -> Result<()> {
    let gated = Sandbox::new()?;
    let _daemon = Daemon::start(&gated.config(&format!("{PORT}:{HIGH_LIMIT}"), ""), &[])?;
    let (_, id) =
        program_ids(&gated)?.into_iter().find(|(n, _)| n.starts_with("sock_ops")).context("sock_ops")?;
    let _stats = bpf::enable_stats()?;
    for _ in 0..3 {
        let AcceptLoad { rate, before, after, floor } = accept_beside_floor(&gated, addr, &[id])?;
        let (ns, runs) = (after[0].0 - before[0].0, after[0].1 - before[0].1);
        let gross = ns as f64 / floor.counted.max(1) as f64;
        println!(
            "accepted/s {rate:.0}; sock_ops {:.0} ns/run, {gross:.0} ns per counted connection, {:.0} net of the floor \
             ({:.0} ns/run, {:.1} runs per connection)",
            ns as f64 / runs.max(1) as f64,
            gross - floor.per_connection(),
            floor.per_run(),
            floor.runs_per_connection()
        );
    }
    Ok(())
}

/// One accept load on the gated sandbox with run-time statistics on.
struct AcceptLoad {
    /// Accepted connections per second.
    rate: f64,
    /// (run_time_ns, run_cnt) of each program asked for, before and after.
    before: Vec<(u64, u64)>,
    after: Vec<(u64, u64)>,
    floor: Floor,
}

/// An accept load with the floor program attached beside the gate's: a
/// sock_ops program that returns at once, on the same cgroup, runs on the
/// same callbacks, so its cost is what the hook and the statistics' own
/// clock reads cost before any program does anything.
fn accept_beside_floor(gated: &Sandbox, addr: SocketAddr, programs: &[u32]) -> Result<AcceptLoad> {
    let snapshot = || -> Result<Vec<(u64, u64)>> { programs.iter().map(|id| prog_stats(*id)).collect() };
    let admitted = || limiter_tests::port(&limiter_tests::dump(&gated.pin_path), PORT).admitted;
    let floor_prog = bpf::FloorSockOps::attach(&fs::File::open(&gated.cgroup)?)
        .context("attaching the floor sock_ops program")?;
    let (before, a0, f0) = (snapshot()?, admitted(), floor_prog.stats()?);
    let rate = accept_rate(gated, addr)?;
    let (after, a1, f1) = (snapshot()?, admitted(), floor_prog.stats()?);
    let floor = Floor { ns: f1.0 - f0.0, runs: f1.1 - f0.1, counted: a1.saturating_sub(a0) };
    Ok(AcceptLoad { rate, before, after, floor })
}

/// `connlimit` in the sandbox: above `limit` connections to PORT, SYNs get
/// a RST (the peer a user would otherwise deploy).
fn connlimit(sb: &Sandbox, limit: u32) -> Result<()> {
    run(
        "ip",
        &[
            "netns",
            "exec",
            &sb.name,
            "iptables",
            "-A",
            "INPUT",
            "-p",
            "tcp",
            "--syn",
            "--dport",
            &PORT.to_string(),
            "-m",
            "connlimit",
            "--connlimit-above",
            &limit.to_string(),
            "--connlimit-mask",
            "0",
            "-j",
            "REJECT",
            "--reject-with",
            "tcp-reset",
        ],
    )?;
    Ok(())
}

/// `measure` in each of three sandboxes (in this order in the returned
/// vectors), `rounds` times, the order rotated each round so no
/// configuration always runs first.
fn interleaved(
    rounds: usize,
    what: &str,
    boxes: [&Sandbox; 3],
    addr: SocketAddr,
    measure: fn(&Sandbox, SocketAddr) -> Result<f64>,
) -> Result<[Vec<f64>; 3]> {
    let mut rates: [Vec<f64>; 3] = Default::default();
    for round in 0..rounds {
        for k in 0..3 {
            let which = (round + k) % 3;
            rates[which].push(measure(boxes[which], addr)?);
        }
        eprintln!("{what} round {}/{rounds} done", round + 1);
    }
    Ok(rates)
}

/// Clients connect and reset as fast as they can while one thread accepts
/// and closes; returns accepted connections per second.
fn accept_rate(sb: &Sandbox, addr: SocketAddr) -> Result<f64> {
    serve_rate(sb, addr, |_| Ok(()), reset_on_close)
}

/// A reset on close: no TIME_WAIT, so ephemeral ports never run out.
fn reset_on_close(s: &socket2::Socket) {
    let _ = s.set_linger(Some(Duration::ZERO));
}

/// (a2): no gate, the gate with a limit far above the load, and iptables
/// connlimit with the same limit, each in a fresh sandbox: the server
/// closes first, and the TIME_WAIT sockets that leaves behind (for a
/// minute) must not reach the sandboxes the other parts measure.
fn http_rates(rounds: usize, addr: SocketAddr) -> Result<[Vec<f64>; 3]> {
    let boxes = [Sandbox::new()?, Sandbox::new()?, Sandbox::new()?];
    let _gate = Daemon::start(&boxes[1].config(&format!("{PORT}:{HIGH_LIMIT}"), ""), &[])?;
    connlimit(&boxes[2], HIGH_LIMIT)?;
    interleaved(rounds, "request", [&boxes[0], &boxes[1], &boxes[2]], addr, request_rate)
}

/// Clients send one HTTP request per connection as fast as they can while
/// one thread accepts and answers each; returns requests answered per
/// second.
fn request_rate(sb: &Sandbox, addr: SocketAddr) -> Result<f64> {
    serve_rate(sb, addr, answer, one_request)
}

/// (a2)'s request, and the fixed response the server gives every one.
const REQUEST: &[u8] = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
const RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok";

/// The server's side of one (a2) connection: reads the request head, writes
/// the response; the caller's drop then closes, server first.
fn answer(mut s: TcpStream) -> io::Result<()> {
    // Accepted sockets are blocking (O_NONBLOCK is not inherited); the
    // timeout only guards against a client that never sends.
    s.set_read_timeout(Some(Duration::from_secs(1)))?;
    let mut head = [0u8; 1024];
    let mut len = 0;
    while !head[..len].windows(4).any(|w| w == b"\r\n\r\n") {
        if len == head.len() {
            return Err(io::Error::new(ErrorKind::InvalidData, "request head too long"));
        }
        match s.read(&mut head[len..])? {
            0 => return Err(ErrorKind::UnexpectedEof.into()),
            n => len += n,
        }
    }
    s.write_all(RESPONSE)
}

/// The client's side of one (a2) connection: sends the request and reads
/// the whole response, to the server's close. It polls for the response
/// instead of sleeping in `read`: a sleeping client leaves a CPU idle, and
/// how soon it is woken then sets the rate (the rounds scattered by half
/// and more on this machine); polling keeps the run CPU-bound, as (a) is.
fn one_request(s: &socket2::Socket) {
    let mut s = s;
    if s.set_nonblocking(true).is_err() || s.write_all(REQUEST).is_err() {
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(1);
    let mut buf = [0u8; 256];
    loop {
        match s.read(&mut buf) {
            Ok(n) if n > 0 => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock && Instant::now() < deadline => thread::yield_now(),
            _ => return,
        }
    }
}

/// Clients connect (and do `on_connect` with each connection) as fast as
/// they can while one thread accepts and `serve`s each; returns the
/// connections served per second.
fn serve_rate(
    sb: &Sandbox,
    addr: SocketAddr,
    serve: fn(TcpStream) -> io::Result<()>,
    on_connect: fn(&socket2::Socket),
) -> Result<f64> {
    let listener = sb.listen(&addr.to_string(), 4096);
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicU64::new(0));
    let server = {
        let (stop, served) = (stop.clone(), served.clone());
        listener.set_nonblocking(true)?;
        thread::spawn(move || accept_loop(&listener, &stop, &served, serve))
    };
    let started = Instant::now();
    let clients = spawn_clients(sb, addr, stop.clone(), on_connect);
    thread::sleep(Duration::from_secs_f64(SECONDS));
    stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    let (ok, _) = join(clients);
    server.join().expect("server thread");
    ensure!(ok > 0, "no connection succeeded");
    Ok(served.load(Ordering::Relaxed) as f64 / elapsed)
}

/// Accepts and `serve`s connections one after another until `stop`,
/// counting those served without error. (Its thread owns the listener, so
/// a client still waiting in its queue then gets a reset, not a hang.)
fn accept_loop(
    listener: &TcpListener,
    stop: &AtomicBool,
    served: &AtomicU64,
    serve: fn(TcpStream) -> io::Result<()>,
) {
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((s, _)) => {
                if serve(s).is_ok() {
                    served.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => thread::yield_now(),
            Err(_) => {}
        }
    }
}

/// Clients connect to a full port (or one with no listener) as fast as
/// they can; returns refused attempts per second and how many got through
/// (they should not; a peer that lets some through is reported so).
fn refuse_rate(sb: &Sandbox, addr: SocketAddr) -> Result<(f64, u64)> {
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let clients = spawn_clients(sb, addr, stop.clone(), |_| {});
    thread::sleep(Duration::from_secs_f64(SECONDS));
    stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    let (ok, refused) = join(clients);
    Ok((refused as f64 / elapsed, ok))
}

type Client = thread::JoinHandle<(u64, u64)>;

fn spawn_clients(
    sb: &Sandbox,
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    on_connect: fn(&socket2::Socket),
) -> Vec<Client> {
    spawn_clients_in(&sb.netns_file(), addr, stop, on_connect)
}

fn spawn_clients_in(
    netns: &fs::File,
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    on_connect: fn(&socket2::Socket),
) -> Vec<Client> {
    (0..CLIENT_THREADS)
        .map(|_| {
            let stop = stop.clone();
            let netns = netns.try_clone().expect("dup netns fd");
            thread::spawn(move || {
                nix::sched::setns(std::os::fd::AsFd::as_fd(&netns), nix::sched::CloneFlags::CLONE_NEWNET)
                    .expect("setns");
                let (mut ok, mut refused) = (0, 0);
                while !stop.load(Ordering::Relaxed) {
                    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
                        .expect("socket");
                    match s.connect(&addr.into()) {
                        Ok(()) => {
                            ok += 1;
                            on_connect(&s);
                        }
                        Err(e) if e.kind() == ErrorKind::ConnectionRefused => refused += 1,
                        Err(_) => {}
                    }
                }
                (ok, refused)
            })
        })
        .collect()
}

fn join(clients: Vec<Client>) -> (u64, u64) {
    clients.into_iter().map(|c| c.join().expect("client thread")).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
}

/// One established connection that fills a limit-1 port.
fn hold_one(
    sb: &Sandbox,
    addr: SocketAddr,
) -> Result<(TcpListener, std::net::TcpStream, std::net::TcpStream)> {
    let listener = sb.listen(&addr.to_string(), 128);
    let client = match sb.connect(&addr.to_string()) {
        Ok(c) => c,
        Err(e) => {
            thread::sleep(Duration::from_secs(3));
            let d = limiter_tests::dump(&sb.pin_path);
            let ss = run("ip", &["netns", "exec", &sb.name, "ss", "-tanoe"]).unwrap_or_default();
            anyhow::bail!(
                "holding one connection on {addr}: {e}; 3 s later the gate says {}\n{ss}",
                d["kernel"]["ports"]
            );
        }
    };
    let (server, _) = listener.accept()?;
    thread::sleep(Duration::from_millis(50));
    Ok((listener, client, server))
}

/// The gate's programs: (name, id), from its pinned links.
fn program_ids(sb: &Sandbox) -> Result<Vec<(String, u32)>> {
    let dump = limiter_tests::dump(&sb.pin_path);
    let links = dump["kernel"]["links"].as_array().context("links")?;
    links
        .iter()
        .map(|l| {
            let name = match l["pin"].as_str().unwrap_or("") {
                "link_sock_ops" => "sock_ops (count)",
                "link_sk_lookup" => "sk_lookup (refuse)",
                _ => "xdp (refuse at the driver)",
            };
            Ok((name.to_owned(), l["program_id"].as_u64().context("program id")? as u32))
        })
        .collect()
}

/// (run_time_ns, run_cnt) of a program, as the kernel keeps them.
fn prog_stats(id: u32) -> Result<(u64, u64)> {
    let out = run("bpftool", &["prog", "show", "id", &id.to_string(), "--json"])?;
    let v: serde_json::Value = serde_json::from_str(&out)?;
    Ok((v["run_time_ns"].as_u64().unwrap_or(0), v["run_cnt"].as_u64().unwrap_or(0)))
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "MISSED" }
}

/// A program's cost: (ns per run, runs) under the accept load and under the
/// refuse load.
struct Cost {
    name: String,
    accept: (f64, u64),
    refuse: (f64, u64),
    /// Under the accept load: the program's whole time over the
    /// connections the gate counted.
    per_connection: f64,
}

/// Under the accept load, the floor sock_ops program beside the gate's:
/// its whole run time, its runs, and the connections the gate counted.
struct Floor {
    ns: u64,
    runs: u64,
    counted: u64,
}

impl Floor {
    fn per_run(&self) -> f64 {
        self.ns as f64 / self.runs.max(1) as f64
    }

    fn runs_per_connection(&self) -> f64 {
        self.runs as f64 / self.counted.max(1) as f64
    }

    /// The floor's time per counted connection: what `runs_per_connection`
    /// calls of any sock_ops program cost, statistics included.
    fn per_connection(&self) -> f64 {
        self.ns as f64 / self.counted.max(1) as f64
    }
}

/// Per-round ratios `a[i] / b[i]`: both ran in the same round, seconds
/// apart, so machine-wide drift cancels out of each ratio.
fn paired(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).map(|(x, y)| x / y).collect()
}

fn ratio(v: &[f64]) -> String {
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(0.0, f64::max);
    format!("{:.3} ({min:.3}-{max:.3})", median(v))
}

fn report(
    accept: &[Vec<f64>; 3],
    requests: &[Vec<f64>; 3],
    refuse: &[Vec<f64>; 3],
    leaked: &[u64; 3],
    cost: &[Cost],
    floor: &Floor,
) -> String {
    let (gate_r, ipt_r) = (paired(&accept[1], &accept[0]), paired(&accept[2], &accept[0]));
    let (http_gate_r, http_ipt_r) = (paired(&requests[1], &requests[0]), paired(&requests[2], &requests[0]));
    let (rgate_r, ript_r) = (paired(&refuse[0], &refuse[2]), paired(&refuse[1], &refuse[2]));
    let gate_vs_ipt = paired(&refuse[0], &refuse[1]);
    let gate = median(&gate_r);
    let rgate = median(&rgate_r);
    let mut out = String::new();
    out.push_str(&format!(
        "Kernel gate, loopback, {ROUNDS} interleaved rounds of {SECONDS} s, {CLIENT_THREADS} client threads, {} CPUs, kernel {}.\n\
         Figures: median (min-max) per second; ratios are taken round by round (both sides measured seconds apart), \
         then their median (min-max).\n\n",
        thread::available_parallelism().map_or(0, |n| n.get()),
        fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim()
    ));
    out.push_str("(a) accepted connections/s, limit far above the load\n\n");
    out.push_str("| configuration | accepted/s | ratio to no gate |\n|---|---|---|\n");
    out.push_str(&format!("| no gate | {} | 1.00 |\n", spread(&accept[0])));
    out.push_str(&format!("| limiter gate | {} | {} |\n", spread(&accept[1]), ratio(&gate_r)));
    out.push_str(&format!("| iptables connlimit | {} | {} |\n\n", spread(&accept[2]), ratio(&ipt_r)));
    out.push_str(&format!(
        "Targets: gate >= 0.97 of no gate: {}; >= 0.95: {} ({gate:.3}).\n\n",
        verdict(gate >= 0.97),
        verdict(gate >= 0.95)
    ));
    out.push_str(
        "(a2) HTTP requests/s, one request per connection, limit far above the load (the accepting side \
         a minimal HTTP/1.1 server: it reads the request head, writes a fixed 200 with Content-Length and \
         Connection: close, and closes)\n\n",
    );
    out.push_str("| configuration | requests/s | ratio to no gate |\n|---|---|---|\n");
    out.push_str(&format!("| no gate | {} | 1.00 |\n", spread(&requests[0])));
    out.push_str(&format!("| limiter gate | {} | {} |\n", spread(&requests[1]), ratio(&http_gate_r)));
    out.push_str(&format!("| iptables connlimit | {} | {} |\n\n", spread(&requests[2]), ratio(&http_ipt_r)));
    out.push_str(&format!(
        "What it shows: the gate's share of a connection's cost as a server sees it, once the connection \
         carries a request and its response: the gate keeps {:.3} of no gate's request rate here, against \
         {gate:.3} of the bare accept rate in (a). A server doing real work per request would dilute it \
         further.\n\n",
        median(&http_gate_r)
    ));
    out.push_str(&format!(
        "Target: gate >= 0.98 of no gate: {} ({:.3}).\n\n",
        verdict(median(&http_gate_r) >= 0.98),
        median(&http_gate_r)
    ));
    out.push_str("(b) refused attempts/s against a full port\n\n");
    out.push_str(
        "| configuration | refused/s | ratio to floor | let through past the limit |\n|---|---|---|---|\n",
    );
    out.push_str(&format!(
        "| limiter gate (sk_lookup RST) | {} | {} | {} |\n",
        spread(&refuse[0]),
        ratio(&rgate_r),
        leaked[0]
    ));
    out.push_str(&format!(
        "| iptables connlimit REJECT tcp-reset | {} | {} | {} |\n",
        spread(&refuse[1]),
        ratio(&ript_r),
        leaked[1]
    ));
    out.push_str(&format!("| no listener (floor) | {} | 1.00 | - |\n\n", spread(&refuse[2])));
    out.push_str(&format!(
        "Targets: gate >= connlimit: {} ({:.3}x); gate >= 0.95 of floor: {} ({rgate:.3}).\n\n",
        verdict(median(&gate_vs_ipt) >= 1.0),
        median(&gate_vs_ipt),
        verdict(rgate >= 0.95),
    ));
    out.push_str("(c) cost per program run, from kernel.bpf_stats_enabled (run_time_ns / run_cnt), and per connection the gate counted under the accept load (run_time_ns / connections admitted)\n\n");
    out.push_str("| program | under the accept load: ns per run (runs) | ns per counted connection | under the refuse load: ns per run (runs) |\n|---|---|---|---|\n");
    for c in cost {
        out.push_str(&format!(
            "| {} | {:.0} ({}) | {:.0} | {:.0} ({}) |\n",
            c.name, c.accept.0, c.accept.1, c.per_connection, c.refuse.0, c.refuse.1
        ));
    }
    let worst =
        cost.iter().flat_map(|c| [c.accept, c.refuse]).filter(|x| x.1 > 0).map(|x| x.0).fold(0.0, f64::max);
    out.push_str(&format!(
        "\nTargets: under 100 ns per run: {} (worst {worst:.0} ns)",
        verdict(worst < 100.0)
    ));
    match cost.iter().find(|c| c.name.starts_with("sock_ops")) {
        Some(c) => {
            let net = c.per_connection - floor.per_connection();
            out.push_str(&format!(
                "; sock_ops at most 400 ns per counted connection, net of the floor below: {} ({net:.0} ns; \
                 {:.0} ns with the floor's).\n\n",
                verdict(net <= 400.0),
                c.per_connection
            ));
        }
        None => out.push_str("; sock_ops per counted connection: MISSED (no sock_ops program found).\n\n"),
    }
    out.push_str(&format!(
        "Floor: a sock_ops program of two instructions (`r0 = 1; exit`) attached beside the gate's to the same \
         cgroup during the accept load ran {:.1} times per counted connection (the handshake, and the state \
         changes the gate's callback flag asks for) at {:.0} ns per run: {:.0} ns per counted connection that \
         any sock_ops program pays here, most of it the two clock reads the statistics wrap each run in.\n",
        floor.runs_per_connection(),
        floor.per_run(),
        floor.per_connection()
    ));
    out
}

/// The four configurations of (d), in their order.
const VETH: [&str; 4] = [
    "limiter gate, XDP (RST built at the driver)",
    "limiter gate, sk_lookup (kernel RST)",
    "iptables connlimit REJECT tcp-reset",
    "no listener (floor)",
];

/// (d): a limit-1 port with one connection held, clients in the peer
/// namespace connecting across the veth as fast as they can.
fn across_veth(rounds: usize) -> Result<([Vec<f64>; 4], [u64; 4])> {
    let boxes: Vec<Sandbox> = (0..4).map(|_| Sandbox::new()).collect::<Result<_>>()?;
    let peers: Vec<Peer> = boxes.iter().map(Sandbox::peer).collect::<Result<_>>()?;
    let xdp_config =
        // Driver mode, as on a real NIC (auto would choose generic on a veth).
        boxes[0].config(
            &format!("{PORT}:1"),
            &format!("kernel.xdp.interfaces = {}\nkernel.xdp.mode = driver\n", peers[0].server_if),
        );
    let sk_config = boxes[1].config(&format!("{PORT}:1"), "");
    let _xdp_gate = Daemon::start(&xdp_config, &[])?;
    let _sk_gate = Daemon::start(&sk_config, &[])?;
    connlimit(&boxes[2], 1)?;
    // Every client end runs the same pass-everything-it-sees XDP program, so
    // the XDP_TX frames wake it (see Peer::wake_on_xdp_tx) and the four
    // configurations pay the same on the client side.
    let xdp_id = limiter_tests::link_program(
        &limiter_tests::dump(&boxes[0].pin_path),
        &format!("link_xdp_{}", peers[0].server_if),
    );
    for p in &peers {
        p.wake_on_xdp_tx(xdp_id)?;
    }
    let mut held = Vec::new();
    for (sb, peer) in boxes.iter().zip(&peers).take(3) {
        let listener = sb.listen(&format!("0.0.0.0:{PORT}"), 128);
        let client = peer.connect(SocketAddr::new(peer.server_v4.into(), PORT), None)?;
        let (server, _) = listener.accept()?;
        held.push((listener, client, server));
    }
    thread::sleep(Duration::from_millis(100));
    let mut rates: [Vec<f64>; 4] = Default::default();
    let mut leaked = [0u64; 4];
    for round in 0..rounds {
        for k in 0..4 {
            let which = (round + k) % 4;
            let peer = &peers[which];
            let addr = SocketAddr::new(peer.server_v4.into(), PORT);
            let stop = Arc::new(AtomicBool::new(false));
            let started = Instant::now();
            let clients = spawn_clients_in(&peer.netns_file(), addr, stop.clone(), |_| {});
            thread::sleep(Duration::from_secs_f64(SECONDS));
            stop.store(true, Ordering::Relaxed);
            let elapsed = started.elapsed().as_secs_f64();
            let (ok, refused) = join(clients);
            rates[which].push(refused as f64 / elapsed);
            leaked[which] += ok;
        }
        eprintln!("veth refuse round {}/{rounds} done", round + 1);
    }
    let d = limiter_tests::dump(&boxes[0].pin_path);
    let xdp_refusals =
        d["kernel"]["ports"].as_array().and_then(|r| r.iter().find(|r| r["port"] == PORT)).map(|r| {
            (r["refused_by"]["xdp"].as_u64().unwrap_or(0), r["refused_by"]["sk_lookup"].as_u64().unwrap_or(0))
        });
    eprintln!("XDP configuration: (xdp, sk_lookup) refusals = {xdp_refusals:?}");
    drop(held);
    Ok((rates, leaked))
}

/// One frame kind of (e) and its measured cost.
struct FrameCost {
    what: &'static str,
    verdict: u32,
    /// Medians of 1,000 single runs (`repeat = 1`), one per round.
    single: Vec<f64>,
    /// Averages over 1,000,000 repeats, one per round; only for frames the
    /// program leaves unchanged (a refused SYN becomes a RST on its first
    /// run, and the repeats would then measure passing that RST).
    repeated: Option<Vec<f64>>,
    /// Averages over [`LIVE_FRAMES`] live frames (each a fresh copy, its
    /// RST transmitted), one per round; only for the refusals.
    live: Vec<f64>,
}

/// (e): `BPF_PROG_TEST_RUN` of the loaded XDP program.
/// Live frames per round for each refusal row of (e).
const LIVE_FRAMES: u32 = 200_000;

fn xdp_cost() -> Result<Vec<FrameCost>> {
    let sb = Sandbox::new()?;
    let peer = sb.peer()?;
    let capped = PORT + 1;
    let config = sb.config(
        &format!("{PORT}:1"),
        &format!("kernel.xdp.interfaces = {}\nkernel.port.{capped}.perSourceMax = 1\n", peer.server_if),
    );
    let _gate = Daemon::start(&config, &[])?;
    let id = limiter_tests::link_program(
        &limiter_tests::dump(&sb.pin_path),
        &format!("link_xdp_{}", peer.server_if),
    );
    peer.wake_on_xdp_tx(id)?;
    let prog = bpf::prog_fd(id)?;
    // Fill both ports: one connection each (the capped port's from the
    // client address the SYN frames carry).
    let mut held = Vec::new();
    for port in [PORT, capped] {
        let listener = sb.listen(&format!("0.0.0.0:{port}"), 128);
        let client = peer.connect(SocketAddr::new(peer.server_v4.into(), port), None)?;
        let (server, _) = listener.accept()?;
        held.push((listener, client, server));
    }
    thread::sleep(Duration::from_millis(100));
    let (c, s) = (std::net::IpAddr::from(peer.client_v4), std::net::IpAddr::from(peer.server_v4));
    let mss = [2, 4, 0x05, 0xb4, 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0, 1, 3, 3, 7];
    let seg =
        |flags, dport| Segment { sport: 40_000, dport, seq: 1, ack: 0, flags, options: &mss, payload: b"" };
    let mut arp = packet::frame(c, s, &seg(SYN, PORT));
    arp[12..14].copy_from_slice(&[0x08, 0x06]);
    let kinds: [(&'static str, Vec<u8>, bool); 6] = [
        ("SYN to the full port: refused, RST built", packet::frame(c, s, &seg(SYN, PORT)), false),
        (
            "SYN from a client at its per-source cap: refused, RST built",
            packet::frame(c, s, &seg(SYN, capped)),
            false,
        ),
        (
            "IPv6 SYN to the full port: refused, RST built",
            packet::frame(peer.client_v6.into(), peer.server_v6.into(), &seg(SYN, PORT)),
            false,
        ),
        ("SYN to a port without limits: passed", packet::frame(c, s, &seg(SYN, PORT + 2)), true),
        ("ACK of an established flow: passed", packet::frame(c, s, &seg(ACK, PORT)), true),
        ("not IP (the floor: the run itself and its timer)", arp, true),
    ];
    // Frames arrive on the server's veth end, addressed to its MAC, as the
    // program requires before it answers; the runs happen in its namespace.
    let (ifindex, mac) = peer.server_link(&sb)?;
    let kinds: Vec<(&'static str, Vec<u8>, bool)> = kinds
        .into_iter()
        .map(|(what, mut frame, same)| {
            frame[..6].copy_from_slice(&mac);
            (what, frame, same)
        })
        .collect();
    let out = sb.in_netns(move || -> Result<Vec<FrameCost>> {
        let mut out: Vec<FrameCost> = kinds
            .iter()
            .map(|(what, _, same)| FrameCost {
                what,
                verdict: 0,
                single: Vec::new(),
                repeated: same.then(Vec::new),
                live: Vec::new(),
            })
            .collect();
        for _round in 0..ROUNDS {
            for (i, (_, frame, same)) in kinds.iter().enumerate() {
                let mut runs = Vec::with_capacity(1000);
                for _ in 0..1000 {
                    let r = bpf::test_run_on(&prog, frame, 1, Some(ifindex))?;
                    out[i].verdict = r.retval;
                    runs.push(f64::from(r.duration_ns));
                }
                out[i].single.push(median(&runs));
                if *same {
                    let r = bpf::test_run_on(&prog, frame, 1_000_000, Some(ifindex))?;
                    if let Some(v) = out[i].repeated.as_mut() {
                        v.push(f64::from(r.duration_ns));
                    }
                } else {
                    // A refusal rewrites its frame, so repeats need fresh
                    // ones: live frames, the RST really sent on the veth.
                    out[i].live.push(f64::from(bpf::test_run_live(&prog, frame, LIVE_FRAMES, ifindex)?));
                }
            }
        }
        Ok(out)
    })?;
    drop(held);
    Ok(out)
}

fn veth_report(rates: &[Vec<f64>; 4], leaked: &[u64; 4], frames: &[FrameCost]) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "\n(d) refused attempts/s across a veth pair (clients in another namespace, {CLIENT_THREADS} threads, \
         limit 1 with one connection held), {ROUNDS} interleaved rounds of {SECONDS} s\n\n"
    ));
    out.push_str("| configuration | refused/s | ratio to floor | ratio to connlimit | let through |\n|---|---|---|---|---|\n");
    for (i, name) in VETH.iter().enumerate() {
        out.push_str(&format!(
            "| {name} | {} | {} | {} | {} |\n",
            spread(&rates[i]),
            ratio(&paired(&rates[i], &rates[3])),
            ratio(&paired(&rates[i], &rates[2])),
            if i == 3 { "-".to_owned() } else { leaked[i].to_string() },
        ));
    }
    let xdp_vs_sk = median(&paired(&rates[0], &rates[1]));
    let xdp_vs_ipt = median(&paired(&rates[0], &rates[2]));
    out.push_str(&format!(
        "\nXDP vs sk_lookup: {xdp_vs_sk:.3}x; XDP vs connlimit: {xdp_vs_ipt:.3}x (target: XDP >= both: {}).\n",
        verdict(xdp_vs_sk >= 1.0 && xdp_vs_ipt >= 1.0)
    ));
    out.push_str(&xdp_report(frames));
    out
}

fn xdp_report(frames: &[FrameCost]) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "\n(e) XDP program cost per frame, BPF_PROG_TEST_RUN: the median of 1,000 single runs (the kernel times \
         each run, its timer included), {ROUNDS} rounds; for frames the program leaves unchanged, the average \
         over 1,000,000 repeats; for refusals, the average over {LIVE_FRAMES} live frames \
         (`BPF_F_TEST_XDP_LIVE_FRAMES`: a fresh frame each repeat, its RST really transmitted on the veth). \
         Median (min-max) of the rounds, ns.\n\n\
         | frame | verdict | single runs | 1,000,000 repeats | live frames, RST sent |\n|---|---|---|---|---|\n",
    ));
    let floor = frames.last().map_or(0.0, |f| median(&f.single));
    let repeat_floor = frames.last().and_then(|f| f.repeated.as_deref()).map_or(0.0, median);
    let mut worst_syn: f64 = 0.0;
    let mut worst_live: f64 = 0.0;
    for f in frames {
        let verdict_name = match f.verdict {
            2 => "XDP_PASS",
            3 => "XDP_TX",
            _ => "other",
        };
        if f.what.contains("SYN") {
            worst_syn = worst_syn.max(median(&f.single));
        }
        if !f.live.is_empty() {
            worst_live = worst_live.max(median(&f.live));
        }
        let repeated = f.repeated.as_ref().map_or_else(|| "-".to_owned(), |v| spread(v));
        let live = if f.live.is_empty() { "-".to_owned() } else { spread(&f.live) };
        out.push_str(&format!(
            "| {} | {verdict_name} | {} | {repeated} | {live} |\n",
            f.what,
            spread(&f.single)
        ));
    }
    out.push_str(&format!(
        "\nTarget: under 100 ns per SYN decision. As measured (the test run's own cost included): {} (worst \
         median {worst_syn:.0} ns). Net of that cost, i.e. above the not-IP floor of {floor:.0} ns, which the \
         program leaves at its first check: {} ({:.0} ns). Live frames, the transmit included, above the \
         repeated not-IP floor of {repeat_floor:.0} ns: {} ({:.0} ns).\n",
        verdict(worst_syn < 100.0),
        verdict(worst_syn - floor < 100.0),
        worst_syn - floor,
        verdict(worst_live - repeat_floor < 100.0),
        worst_live - repeat_floor,
    ));
    out
}
