//! `cargo xtask bench fleet`: what fleet-wide limits cost a request. Two
//! daemons (release build, logging at info) in namespaces of their own
//! before the same upstream, one without `fleet.store`, one with fleet
//! limits far above the load (so every request takes and gives back its
//! permits), and one Redis in the store's namespace (see
//! `limiter_tests::store`); wrk from the store's namespace, the same
//! requests to each, rounds interleaved. Besides req/s, p50 and p99: the
//! store's commands per request (`INFO commandstats` before and after),
//! the asks' round trip as the daemon measured it, and the floor: one bare
//! `PING` round trip over the same path. Writes BENCHMARKS.md.

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, ensure};
use limiter_tests::{
    bench::{Run, cpu_seconds, median, spread, wrk},
    store::{self, Node, STORE_IP, StoreNet},
    upstream::Upstream,
};

const ROUNDS: usize = 3;
const SECONDS: u32 = 5;
const CONNECTIONS: u32 = 32;
const PINGS: usize = 20_000;

/// The store's command counts (`INFO commandstats`), by command.
fn commandstats(net: &StoreNet) -> Result<std::collections::BTreeMap<String, u64>> {
    let text = net.cli(6379, &["info", "commandstats"])?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.trim().strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest.split(',').find_map(|f| f.strip_prefix("calls="))?.parse().ok()?;
            Some((name.to_owned(), calls))
        })
        .collect())
}

/// One bare round trip to the store, from `node`'s namespace: `PING`
/// after `PING` on one connection; median and 99th percentile in µs.
fn floor(node: &Node) -> Result<(f64, f64)> {
    node.sb.in_netns(|| -> Result<(f64, f64)> {
        let mut s = TcpStream::connect((STORE_IP, 6379)).context("connect to redis")?;
        s.set_nodelay(true)?;
        let mut buf = [0u8; 64];
        let mut took = Vec::with_capacity(PINGS);
        for _ in 0..PINGS {
            let t = Instant::now();
            s.write_all(b"*1\r\n$4\r\nPING\r\n")?;
            let n = s.read(&mut buf)?;
            ensure!(&buf[..n] == b"+PONG\r\n", "PING answered {:?}", String::from_utf8_lossy(&buf[..n]));
            took.push(t.elapsed().as_secs_f64() * 1e6);
        }
        took.sort_by(f64::total_cmp);
        Ok((took[PINGS / 2], took[PINGS * 99 / 100]))
    })
}

/// The daemon's own account of its asks: how many, and their summed time.
fn asks(node: &Node) -> (f64, f64) {
    let page = node.daemon.metrics();
    let get = |name: &str| limiter_tests::try_metric(&page, name).unwrap_or(0.0);
    (get("limiter_fleet_round_trip_seconds_count"), get("limiter_fleet_round_trip_seconds_sum"))
}

/// Commands the daemon sends; the rest of `INFO commandstats` are the
/// ones its scripts run inside the store.
const SENT: [&str; 5] = ["evalsha", "eval", "zrem", "script|load", "ping"];

struct Row {
    name: String,
    connections: u32,
    runs: Vec<Run>,
    /// Commands sent and run in the store per request, asks per request,
    /// the asks' mean round trip (µs), CPU µs per request of the daemon
    /// and of the store.
    commands: Vec<f64>,
    run_in_store: Vec<f64>,
    daemon_cpu_us: Vec<f64>,
    store_cpu_us: Vec<f64>,
    asks: Vec<f64>,
    ask_us: Vec<f64>,
    by_command: std::collections::BTreeMap<String, u64>,
}

fn main() -> Result<()> {
    if let Some(why) = limiter_tests::kernel_tests_blocked() {
        anyhow::bail!("bench fleet needs network namespaces: {why}");
    }
    limiter_tests::raise_fd_limit();
    let net = StoreNet::new()?;
    let redis = net.redis(6379, &[])?;
    let upstream = Upstream::start();
    let quiet = "admin.logLevel = info";
    let off = store::quiet_node(&net, &upstream, quiet)?;
    let on = store::quiet_node(
        &net,
        &upstream,
        &format!(
            "{quiet}\nfleet.store = redis://{STORE_IP}:6379\nfleet.maxSessionConnections = 1000000\n\
             fleet.maxWebConnections = 1000000\nfleet.timeoutMs = 200"
        ),
    )?;
    let both: &[&str] = &["Authorization: Bearer bench", "X-Client-Id: bench"];
    let cases: [(&str, &Node, &[&str], u32); 6] = [
        ("fleet off (no fleet.store)", &off, both, CONNECTIONS),
        ("fleet on: a session and a web-client permit", &on, both, CONNECTIONS),
        ("fleet on: a session permit", &on, &["Authorization: Bearer bench"], CONNECTIONS),
        ("fleet on: a request that needs no permit", &on, &[], CONNECTIONS),
        ("fleet off, one connection", &off, both, 1),
        ("fleet on, one connection: a session and a web-client permit", &on, both, 1),
    ];
    let mut rows: Vec<Row> = cases
        .iter()
        .map(|(name, _, _, connections)| Row {
            name: (*name).to_owned(),
            connections: *connections,
            runs: Vec::new(),
            commands: Vec::new(),
            run_in_store: Vec::new(),
            daemon_cpu_us: Vec::new(),
            store_cpu_us: Vec::new(),
            asks: Vec::new(),
            ask_us: Vec::new(),
            by_command: Default::default(),
        })
        .collect();
    let redis_pid = redis.process_id().context("redis runs")?;
    for round in 0..ROUNDS {
        for (i, (name, node, headers, connections)) in cases.iter().enumerate() {
            let before = commandstats(&net)?;
            let asks_before = asks(node);
            let daemon_pid = node.daemon.pid().as_raw() as u32;
            let cpu_before = (cpu_seconds(&[daemon_pid]), cpu_seconds(&[redis_pid]));
            let mut cmd = Command::new("nsenter");
            cmd.arg(format!("--net={}", net.sb.netns_path.display())).arg("wrk");
            let url = format!("http://{}/x", node.addr);
            let run = wrk(cmd, *connections, SECONDS, &url, headers, None)?;
            ensure!(run.non_2xx_per_s == 0.0, "{name}: {run:?}");
            // Releases are sent just after the answers: let them land.
            std::thread::sleep(Duration::from_millis(300));
            let cpu_after = (cpu_seconds(&[daemon_pid]), cpu_seconds(&[redis_pid]));
            let after = commandstats(&net)?;
            let asks_after = asks(node);
            let row = &mut rows[i];
            let (mut sent, mut inside) = (0, 0);
            for (command, n) in &after {
                // Our own INFO calls are not the daemon's.
                if command == "info" {
                    continue;
                }
                let d = n - before.get(command).copied().unwrap_or(0);
                if SENT.contains(&command.as_str()) {
                    sent += d
                } else {
                    inside += d
                }
                *row.by_command.entry(command.clone()).or_insert(0) += d;
            }
            row.commands.push(sent as f64 / run.requests);
            row.run_in_store.push(inside as f64 / run.requests);
            row.daemon_cpu_us.push((cpu_after.0 - cpu_before.0) / run.requests * 1e6);
            row.store_cpu_us.push((cpu_after.1 - cpu_before.1) / run.requests * 1e6);
            let n = asks_after.0 - asks_before.0;
            row.asks.push(n / run.requests);
            row.ask_us.push(if n > 0.0 { (asks_after.1 - asks_before.1) / n * 1e6 } else { 0.0 });
            eprintln!(
                "round {}: {name}: {:.0} req/s, p50 {} ms, p99 {} ms",
                round + 1,
                run.rps,
                run.p50_ms,
                run.p99_ms
            );
            row.runs.push(run);
        }
    }
    let (floor_p50, floor_p99) = floor(&on)?;
    let mut report = format!(
        "Two daemons (release build) in namespaces of their own before the same upstream (the tests' hyper \
         server, answering at once), one without `fleet.store`, one with fleet limits far above the load, \
         so that every request with the headers takes its permits and gives them back; one Redis \
         (Debian's `redis-server`) in a third namespace, reached over a veth pair and a bridge. wrk \
         (`-t2`, {SECONDS} s) from the store's namespace, {ROUNDS} rounds interleaved; median (min-max) of \
         the rounds. Everything, Redis included, shares the machine's two CPUs. Commands sent are what the \
         daemon sends (`EVALSHA`, the batched `ZREM`s, renewals' `EVALSHA`); run in the store adds the \
         commands its scripts run there (`TIME`, `ZREMRANGEBYSCORE`, `ZCARD`, `ZADD`, `PTTL`); CPU is user + \
         system time per request, from `/proc`.\n\n\
         | requests | connections | req/s | p50 | p99 | asks per request | ask round trip (mean, as the daemon measured it) | store commands sent per request | run in the store per request | daemon CPU per request | store CPU per request |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n"
    );
    for r in &rows {
        let f = |get: fn(&Run) -> f64| r.runs.iter().map(get).collect::<Vec<_>>();
        report.push_str(&format!(
            "| {} | {} | {} | {:.2} ms | {:.2} ms | {:.2} | {} | {:.2} | {:.2} | {:.1} µs | {:.1} µs |\n",
            r.name,
            r.connections,
            spread(&f(|r| r.rps)),
            median(&f(|r| r.p50_ms)),
            median(&f(|r| r.p99_ms)),
            median(&r.asks),
            if median(&r.asks) > 0.0 { format!("{:.0} µs", median(&r.ask_us)) } else { "-".to_owned() },
            median(&r.commands),
            median(&r.run_in_store),
            median(&r.daemon_cpu_us),
            median(&r.store_cpu_us),
        ));
    }
    report.push_str(&format!(
        "\nThe floor, one bare round trip to the same Redis from the daemon's namespace (`PING` after `PING` on \
         one connection, {PINGS} of them): median {floor_p50:.0} µs, p99 {floor_p99:.0} µs.\n\n\
         Store commands by kind, all rounds together:\n\n"
    ));
    for r in rows.iter().filter(|r| r.by_command.values().any(|&n| n > 0)) {
        let kinds: Vec<String> =
            r.by_command.iter().filter(|(_, n)| **n > 0).map(|(c, n)| format!("`{c}` {n}")).collect();
        report.push_str(&format!("- {}: {}\n", r.name, kinds.join(", ")));
    }
    report.push('\n');
    print!("{report}");
    limiter_tests::bench::write_section(
        "fleet",
        "Fleet-wide limits",
        "`cargo xtask bench fleet` (as root: network namespaces; starts its own redis-server).",
        &report,
    )
}
