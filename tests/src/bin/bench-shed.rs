//! `cargo xtask bench shed`: coupled shedding against the same
//! limiter without it and against nginx `limit_conn`, in one run, over a
//! veth: keep-alive clients ask for requests the upstream holds
//! `HOLD_MS`, a flood of new connections comes from 64 untrusted source
//! addresses, and a trusted source asks for `/debug/` on a new connection
//! every 20 ms (`limiter_tests::shed_load`). Reports goodput (200s per
//! second against the normal pool's capacity, slots / hold time) and its
//! p99, what the flood met (RST at the SYN, 503, 200, timeout), the
//! proxy's CPU per refused attempt, and `/debug/` availability; writes
//! BENCHMARKS.md. `BENCH_ROUNDS` overrides the rounds.

use std::{fs, net::SocketAddr, time::Duration};

use anyhow::{Result, ensure};
use limiter_tests::{
    Daemon, Sandbox,
    bench::{cpu_seconds, median, softirq_seconds, spread},
    nginx::Nginx,
    peer::sa,
    process::terminate,
    shed_load::{self, Outcome, Plan},
    upstream::Upstream,
};

const ROUNDS: usize = 3;
const SECONDS: u64 = 5;
const MAX_THREADS: u32 = 40;
/// `http.maxThreads` less the 8 system threads and 3 `/debug/` slots.
const NORMAL: u32 = MAX_THREADS - 11;
const HOLD_MS: u64 = 50;
const FLOOD_THREADS: usize = 8;
const FLOOD_SOURCES: u8 = 64;

const NAMES: [&str; 3] = ["limiter, http.shedAtSyn = true", "limiter, no coupling", "nginx limit_conn"];

/// One server's figures over the rounds.
#[derive(Default)]
struct Figures {
    goodput: Vec<f64>,
    p99_ms: Vec<f64>,
    /// Flood: resets, 503s, 200s, timeouts, other, summed over the rounds.
    flood: [u64; 5],
    flood_rate: Vec<f64>,
    /// Keep-alive clients: the same.
    clients: [u64; 5],
    debug: Vec<f64>,
    /// Proxy process CPU µs per refused attempt (RST or 503).
    cpu_per_refusal_us: Vec<f64>,
    /// Proxy process CPU, cores.
    cores: Vec<f64>,
    /// Softirq CPU, cores (the kernel's RSTs are there).
    softirq: Vec<f64>,
}

fn main() -> Result<()> {
    if let Some(why) = limiter_tests::kernel_tests_blocked() {
        anyhow::bail!("the benchmark: {why}");
    }
    limiter_tests::raise_fd_limit();
    let sb = Sandbox::new()?;
    let peer = sb.peer()?;
    let n = peer.n;
    for i in 0..FLOOD_SOURCES {
        peer.add_client_addr(&format!("10.77.{n}.{}/24", 10 + i))?;
    }
    let trusted = format!("10.77.{n}.200");
    peer.add_client_addr(&format!("{trusted}/24"))?;
    let upstream = sb.in_netns(Upstream::start);
    let config = |shed: bool| -> Result<(std::path::PathBuf, u16)> {
        let path = sb.config(
            "1:1",
            &format!(
                "http.upstream = {}\nhttp.maxThreads = {MAX_THREADS}\nhttp.shedAtSyn = {shed}\n\
                 kernel.trusted = {trusted}/32\nadmin.logLevel = info\n",
                upstream.addr
            ),
        );
        let text = fs::read_to_string(&path)?.replace("http.listen = 127.0.0.1:", "http.listen = 0.0.0.0:");
        let port = text
            .lines()
            .find_map(|l| l.strip_prefix("http.listen = 0.0.0.0:"))
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("no http.listen"))?;
        let path = path.with_file_name(format!("limiter-shed-{shed}.ini"));
        fs::write(&path, text)?;
        Ok((path, port))
    };
    let nginx_port = limiter_tests::free_port();
    let plan = |port: u16| Plan {
        target: sa(peer.server_v4, port),
        hold_ms: HOLD_MS,
        clients: NORMAL as usize + 6,
        client: peer.client_v4.into(),
        flood_threads: FLOOD_THREADS,
        flood_sources: (0..FLOOD_SOURCES).map(|i| format!("10.77.{n}.{}", 10 + i).parse().unwrap()).collect(),
        trusted: trusted.parse().unwrap(),
        duration: Duration::from_secs(SECONDS),
    };
    let rounds = std::env::var("BENCH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(ROUNDS);
    let mut figures: [Figures; 3] = Default::default();
    for round in 0..rounds {
        for k in 0..3 {
            let which = (round + k) % 3;
            let (outcome, cpu, softirq) = match which {
                0 | 1 => {
                    let (path, port) = config(which == 0)?;
                    let mut daemon = Daemon::start_inside_at_config_log_level(&sb, &path)?;
                    let pid = daemon.pid().as_raw() as u32;
                    let out = measure(&peer.netns_file(), &plan(port), &[pid]);
                    // Drained, so its shedding flags are lowered.
                    ensure!(terminate(&mut daemon, Duration::from_secs(30)) == Some(0), "limiter's exit");
                    out
                }
                _ => {
                    let prefix = sb.dir.join("nginx");
                    let nginx = Nginx::start(
                        &prefix,
                        "worker_processes 2;",
                        &nginx_server(nginx_port, upstream.addr),
                        Some(&sb.netns_path),
                    )?;
                    let pids = nginx.workers();
                    measure(&peer.netns_file(), &plan(nginx_port), &pids)
                }
            };
            record(&mut figures[which], &outcome, cpu, softirq);
            eprintln!("round {}/{rounds}: {} done", round + 1, NAMES[which]);
        }
    }
    let _ = limiter_tests::limiter(&["unload", "--pin-path", sb.pin_path.to_str().unwrap_or_default()]);
    ensure!(figures.iter().all(|f| !f.goodput.is_empty()), "a configuration did not run");
    let report = report(&figures);
    print!("{report}");
    limiter_tests::bench::write_section(
        "shed",
        "Coupled shedding",
        "`cargo xtask bench shed` (as root; installs nginx itself).",
        &report,
    )
}

/// One run of the load against a server whose processes are `pids`: the
/// outcome, their CPU seconds, the machine's softirq seconds.
fn measure(netns: &fs::File, plan: &Plan, pids: &[u32]) -> (Outcome, f64, f64) {
    // Let the server settle, and every keep-alive client connect.
    std::thread::sleep(Duration::from_millis(300));
    let (cpu0, soft0) = (cpu_seconds(pids), softirq_seconds());
    let outcome = shed_load::run(netns, plan);
    (outcome, cpu_seconds(pids) - cpu0, softirq_seconds() - soft0)
}

fn record(f: &mut Figures, o: &Outcome, cpu: f64, softirq: f64) {
    let secs = o.elapsed.as_secs_f64();
    f.goodput.push(o.goodput());
    f.p99_ms.push(o.latency_ms(0.99));
    let (flood, clients) = (o.flood.get(), o.clients.get());
    for i in 0..5 {
        f.flood[i] += flood[i];
        f.clients[i] += clients[i];
    }
    f.flood_rate.push(flood.iter().sum::<u64>() as f64 / secs);
    f.debug.push(o.debug_availability());
    f.cpu_per_refusal_us.push(cpu * 1e6 / o.refused().max(1) as f64);
    f.cores.push(cpu / secs);
    f.softirq.push(softirq / secs);
}

/// nginx `limit_conn` with the same normal slots for everything but
/// `/debug/`, which has no cap (the closest nginx has to reserved slots).
fn nginx_server(listen: u16, upstream: SocketAddr) -> String {
    format!(
        "  upstream up {{ server {upstream}; keepalive 64; }}\n\
           limit_conn_zone $server_name zone=pool:1m;\n\
           server {{\n    listen 0.0.0.0:{listen};\n    server_name shed;\n\
             location / {{\n      limit_conn pool {NORMAL};\n      limit_conn_status 503;\n\
             proxy_pass http://up;\n      proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n    }}\n\
             location /debug/ {{\n      proxy_pass http://up;\n      proxy_http_version 1.1;\n\
             proxy_set_header Connection \"\";\n    }}\n  }}"
    )
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "MISSED" }
}

fn report(figures: &[Figures; 3]) -> String {
    let capacity = f64::from(NORMAL) * 1000.0 / HOLD_MS as f64;
    let mut out = format!(
        "Over a veth (clients in another namespace, the same 2 CPUs): {} keep-alive clients asking for requests \
         the upstream holds {HOLD_MS} ms, a flood of new connections from {FLOOD_THREADS} threads over \
         {FLOOD_SOURCES} untrusted source addresses, and a trusted source asking for `/debug/` on a new \
         connection every 20 ms. {} interleaved rounds of {SECONDS} s; median (min-max) of the rounds, medians \
         where one figure is shown, flood and client outcomes summed. The normal pool's capacity: \
         {NORMAL} slots / {HOLD_MS} ms = {capacity:.0} requests/s. A 2 s wait for a connection or an answer \
         counts as a timeout.\n\n\
         | server | goodput 200/s (share of capacity) | p99 of the 200s, ms | flood attempts/s | flood: RST / 503 / 200 / timeout / other | clients: RST / 503 / 200 / timeout / other | `/debug/` answered | proxy CPU per refused attempt, µs | proxy CPU, cores | softirq, cores |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
        NORMAL + 6,
        figures[0].goodput.len(),
    );
    let slash = |v: &[u64; 5]| v.map(|n| n.to_string()).join(" / ");
    for (name, f) in NAMES.iter().zip(figures) {
        let g = median(&f.goodput);
        out.push_str(&format!(
            "| {name} | {} ({:.0} %) | {} | {} | {} | {} | {:.1} % | {:.1} | {:.2} | {:.2} |\n",
            spread(&f.goodput),
            100.0 * g / capacity,
            spread(&f.p99_ms),
            spread(&f.flood_rate),
            slash(&f.flood),
            slash(&f.clients),
            100.0 * median(&f.debug),
            median(&f.cpu_per_refusal_us),
            median(&f.cores),
            median(&f.softirq),
        ));
    }
    let c = &figures[0];
    let (g, p99, debug) = (median(&c.goodput), median(&c.p99_ms), median(&c.debug));
    let timeouts = c.flood[3] + c.clients[3];
    let loses = |f: &Figures| median(&f.goodput) < g || median(&f.p99_ms) > p99 || median(&f.debug) < debug;
    out.push_str(&format!(
        "\nTargets, with coupling: goodput >= 90 % of capacity: {} ({:.0} %); p99 within 2x the hold ({} ms): {} \
         ({p99:.1} ms); `/debug/` 100 % available: {} ({:.1} %); the flood sees RSTs or 503s, never timeouts: {} \
         ({timeouts} timeouts); without coupling and nginx lose more (goodput, p99 or `/debug/`): {}.\n",
        verdict(g >= 0.9 * capacity),
        100.0 * g / capacity,
        2 * HOLD_MS,
        verdict(p99 <= 2.0 * HOLD_MS as f64),
        verdict(debug >= 1.0),
        100.0 * debug,
        verdict(timeouts == 0),
        verdict(loses(&figures[1]) && loses(&figures[2])),
    ));
    let uncoupled = median(&figures[1].cores) + median(&figures[1].softirq);
    out.push_str(&format!(
        "Without coupling the proxy and the kernel's softirq used {uncoupled:.2} of 2 cores: {}\n",
        if uncoupled < 1.8 {
            "two CPUs that also generate the flood did not drive the 503 path past its capacity, so compare the \
             CPU per refused attempt"
        } else {
            "the flood took the 503 path to the machine's capacity"
        }
    ));
    out
}
