//! `cargo xtask bench kernel`: the kernel gate against no gate, against
//! iptables `connlimit`, and against a port with no listener, in one run,
//! interleaved and repeated. Prints the figures and writes them into
//! BENCHMARKS.md. Every configuration gets its own throwaway network
//! namespace, so conntrack loaded for iptables cannot slow the others.
//!
//! (a) accepted connections per second: no gate / gate with a limit far
//!     above the load / iptables connlimit with the same limit;
//! (b) refused attempts per second against a full port: gate / iptables
//!     connlimit REJECT with tcp-reset / a port with no listener (the floor
//!     cost of any RST);
//! (c) each program's own cost per run from `kernel.bpf_stats_enabled`.

use std::{
    fs,
    io::ErrorKind,
    net::{SocketAddr, TcpListener},
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
    run,
};

const PORT: u16 = 7200;
const ROUNDS: usize = 7;
const SECONDS: f64 = 2.0;
const CLIENT_THREADS: usize = 2;
const HIGH_LIMIT: u32 = 1_000_000;

fn main() -> Result<()> {
    ensure!(limiter_tests::kernel_tests_allowed(), "the benchmark needs root");
    let addr: SocketAddr = format!("127.0.0.1:{PORT}").parse()?;

    let plain = Sandbox::new()?;
    let gated = Sandbox::new()?;
    let iptables = Sandbox::new()?;
    let floor = Sandbox::new()?;
    let gate_config = gated.config(&format!("{PORT}:{HIGH_LIMIT}"), "");
    let daemon = Daemon::start(&gate_config, &[])?;
    connlimit(&iptables, HIGH_LIMIT)?;

    // (a) accept rate, limit far above the load.
    let rounds = std::env::var("BENCH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(ROUNDS);
    let mut accept: [Vec<f64>; 3] = Default::default();
    for round in 0..rounds {
        // Rotate the order so no configuration always runs first.
        for k in 0..3 {
            let which = (round + k) % 3;
            let sb = [&plain, &gated, &iptables][which];
            accept[which].push(accept_rate(sb, addr)?);
        }
        eprintln!("accept round {}/{ROUNDS} done", round + 1);
    }

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
    let s0 = snapshot()?;
    accept_rate(&gated, addr)?;
    let s1 = snapshot()?;
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
        })
        .collect();
    drop(daemon);

    let report = report(&accept, &refuse, &leaked, &cost);
    print!("{report}");
    limiter_tests::bench::write_section(
        "kernel",
        "Kernel gate",
        "`cargo xtask bench kernel` (as root; installs iptables itself).",
        &report,
    )?;
    Ok(())
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

/// Clients connect and reset as fast as they can while one thread accepts
/// and closes; returns accepted connections per second.
fn accept_rate(sb: &Sandbox, addr: SocketAddr) -> Result<f64> {
    let listener = sb.listen(&addr.to_string(), 4096);
    let stop = Arc::new(AtomicBool::new(false));
    let accepted = Arc::new(AtomicU64::new(0));
    let server = {
        let (stop, accepted) = (stop.clone(), accepted.clone());
        listener.set_nonblocking(true)?;
        thread::spawn(move || accept_loop(&listener, &stop, &accepted))
    };
    let started = Instant::now();
    let clients = spawn_clients(sb, addr, stop.clone(), |s| {
        // A reset on close: no TIME_WAIT, so ephemeral ports never run out.
        let _ = s.set_linger(Some(Duration::ZERO));
    });
    thread::sleep(Duration::from_secs_f64(SECONDS));
    stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    let (ok, _) = join(clients);
    server.join().expect("server thread");
    ensure!(ok > 0, "no connection succeeded");
    Ok(accepted.load(Ordering::Relaxed) as f64 / elapsed)
}

fn accept_loop(listener: &TcpListener, stop: &AtomicBool, accepted: &AtomicU64) {
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((s, _)) => {
                drop(s);
                accepted.fetch_add(1, Ordering::Relaxed);
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
    (0..CLIENT_THREADS)
        .map(|_| {
            let stop = stop.clone();
            let netns = sb.netns_file();
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
    let client = sb.connect(&addr.to_string())?;
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
            let name = if l["pin"] == "link_sock_ops" { "sock_ops (count)" } else { "sk_lookup (refuse)" };
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

fn report(accept: &[Vec<f64>; 3], refuse: &[Vec<f64>; 3], leaked: &[u64; 3], cost: &[Cost]) -> String {
    let (gate_r, ipt_r) = (paired(&accept[1], &accept[0]), paired(&accept[2], &accept[0]));
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
    out.push_str(&format!("Target: gate >= 0.97 of no gate: {} ({gate:.3}).\n\n", verdict(gate >= 0.97)));
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
    out.push_str("(c) cost per program run, from kernel.bpf_stats_enabled (run_time_ns / run_cnt)\n\n");
    out.push_str("| program | under the accept load: ns per run (runs) | under the refuse load: ns per run (runs) |\n|---|---|---|\n");
    for c in cost {
        out.push_str(&format!(
            "| {} | {:.0} ({}) | {:.0} ({}) |\n",
            c.name, c.accept.0, c.accept.1, c.refuse.0, c.refuse.1
        ));
    }
    let worst =
        cost.iter().flat_map(|c| [c.accept, c.refuse]).filter(|x| x.1 > 0).map(|x| x.0).fold(0.0, f64::max);
    out.push_str(&format!(
        "\nTarget: under 100 ns per run: {} (worst {worst:.0} ns).\n",
        verdict(worst < 100.0)
    ));
    out
}
