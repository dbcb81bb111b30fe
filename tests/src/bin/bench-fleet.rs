//! `cargo xtask bench fleet`: what fleet-wide limits cost a request.
//! Daemons (release build, logging at info) in namespaces of their own
//! before the same upstream: one without `fleet.store`, one with fleet
//! limits far above the load (a session whose requests stay on one node:
//! sticky load balancing), and three whose limits are the load's own
//! concurrency, each taking a third of it (a session spread round-robin
//! over three nodes, its shares contended); one Redis in the store's
//! namespace (see `limiter_tests::store`); wrk from the store's namespace,
//! rounds interleaved. Besides req/s, p50 and p99: the claims per request
//! (round trips on a request's path), the store's commands per request
//! (`INFO commandstats` before and after), CPU per request of the daemons
//! and of Redis, and the floor: one bare `PING` round trip over the same
//! path. Writes BENCHMARKS.md.

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    process::Command,
    time::Instant,
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

/// The daemons' own account of their claims on requests' paths: how
/// many, and their summed time.
fn claims(nodes: &[&Node]) -> (f64, f64) {
    let mut total = (0.0, 0.0);
    for node in nodes {
        let page = node.daemon.metrics();
        let get = |name: &str| limiter_tests::try_metric(&page, name).unwrap_or(0.0);
        total.0 += get("limiter_fleet_round_trip_seconds_count");
        total.1 += get("limiter_fleet_round_trip_seconds_sum");
    }
    total
}

/// Commands the daemons send; the rest of `INFO commandstats` are the
/// ones their scripts run inside the store.
const SENT: [&str; 6] = ["evalsha", "eval", "script|load", "ping", "set", "get"];

/// One case: its name, the nodes wrk loads (its connections shared among
/// them), the headers.
struct Case<'a> {
    name: &'static str,
    nodes: Vec<&'a Node>,
    headers: &'static [&'static str],
    connections: u32,
}

struct Row {
    name: String,
    connections: u32,
    runs: Vec<Run>,
    /// Commands sent and run in the store per request, claims per request,
    /// the claims' mean round trip (µs), CPU µs per request of the daemons
    /// and of the store, refusals per request.
    commands: Vec<f64>,
    run_in_store: Vec<f64>,
    daemon_cpu_us: Vec<f64>,
    store_cpu_us: Vec<f64>,
    claims: Vec<f64>,
    claim_us: Vec<f64>,
    refused: Vec<f64>,
    by_command: std::collections::BTreeMap<String, u64>,
}

/// wrk against each of `nodes` at once, `connections` shared among them:
/// their runs summed (rates and requests), latencies the worst node's.
fn wrk_all(net: &StoreNet, nodes: &[&Node], connections: u32, headers: &[&str]) -> Result<Run> {
    let each = (connections / nodes.len() as u32).max(1);
    let runs = std::thread::scope(|s| {
        let threads: Vec<_> = nodes
            .iter()
            .map(|node| {
                s.spawn(move || {
                    let mut cmd = Command::new("nsenter");
                    cmd.arg(format!("--net={}", net.sb.netns_path.display())).arg("wrk");
                    wrk(cmd, each, SECONDS, &format!("http://{}/x", node.addr), headers, None)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().expect("a wrk thread")).collect::<Result<Vec<Run>>>()
    })?;
    Ok(Run {
        rps: runs.iter().map(|r| r.rps).sum(),
        non_2xx_per_s: runs.iter().map(|r| r.non_2xx_per_s).sum(),
        p50_ms: runs.iter().map(|r| r.p50_ms).fold(0.0, f64::max),
        p99_ms: runs.iter().map(|r| r.p99_ms).fold(0.0, f64::max),
        requests: runs.iter().map(|r| r.requests).sum(),
    })
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
             fleet.maxWebConnections = 1000000"
        ),
    )?;
    // Three nodes sharing a session whose limit is the load's concurrency.
    let tight = format!(
        "{quiet}\nfleet.store = redis://{STORE_IP}:6379\nfleet.maxSessionConnections = {CONNECTIONS}\n\
         fleet.maxWebConnections = {CONNECTIONS}\nfleet.name = spread"
    );
    let spread_nodes: Vec<Node> =
        (0..3).map(|_| store::quiet_node(&net, &upstream, &tight)).collect::<Result<_>>()?;
    let both: &[&str] = &["Authorization: Bearer bench", "X-Client-Id: bench"];
    let cases: Vec<Case> = vec![
        Case {
            name: "fleet off (no fleet.store)",
            nodes: vec![&off],
            headers: both,
            connections: CONNECTIONS,
        },
        Case {
            name: "fleet on, sticky: a session and a web-client permit",
            nodes: vec![&on],
            headers: both,
            connections: CONNECTIONS,
        },
        Case {
            name: "fleet on, sticky: a session permit",
            nodes: vec![&on],
            headers: &["Authorization: Bearer bench"],
            connections: CONNECTIONS,
        },
        Case {
            name: "fleet on: a request that needs no permit",
            nodes: vec![&on],
            headers: &[],
            connections: CONNECTIONS,
        },
        Case {
            name: "fleet on, round-robin over 3 nodes, the limit at the load's concurrency: a session and a web-client permit",
            nodes: spread_nodes.iter().collect(),
            headers: both,
            connections: CONNECTIONS - CONNECTIONS % 3,
        },
        Case { name: "fleet off, one connection", nodes: vec![&off], headers: both, connections: 1 },
        Case {
            name: "fleet on, sticky, one connection: a session and a web-client permit",
            nodes: vec![&on],
            headers: both,
            connections: 1,
        },
    ];
    let mut rows: Vec<Row> = cases
        .iter()
        .map(|c| Row {
            name: c.name.to_owned(),
            connections: c.connections,
            runs: Vec::new(),
            commands: Vec::new(),
            run_in_store: Vec::new(),
            daemon_cpu_us: Vec::new(),
            store_cpu_us: Vec::new(),
            claims: Vec::new(),
            claim_us: Vec::new(),
            refused: Vec::new(),
            by_command: Default::default(),
        })
        .collect();
    let redis_pid = redis.process_id().context("redis runs")?;
    for round in 0..ROUNDS {
        for (i, case) in cases.iter().enumerate() {
            let before = commandstats(&net)?;
            let claims_before = claims(&case.nodes);
            let pids: Vec<u32> = case.nodes.iter().map(|n| n.daemon.pid().as_raw() as u32).collect();
            let cpu_before = (cpu_seconds(&pids), cpu_seconds(&[redis_pid]));
            let run = wrk_all(&net, &case.nodes, case.connections, case.headers)?;
            let cpu_after = (cpu_seconds(&pids), cpu_seconds(&[redis_pid]));
            let after = commandstats(&net)?;
            let claims_after = claims(&case.nodes);
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
            let n = claims_after.0 - claims_before.0;
            row.claims.push(n / run.requests);
            row.claim_us.push(if n > 0.0 { (claims_after.1 - claims_before.1) / n * 1e6 } else { 0.0 });
            row.refused.push(run.non_2xx_per_s / run.rps.max(1.0));
            eprintln!(
                "round {}: {}: {:.0} req/s, p50 {} ms, p99 {} ms",
                round + 1,
                case.name,
                run.rps,
                run.p50_ms,
                run.p99_ms
            );
            row.runs.push(run);
        }
    }
    let (floor_p50, floor_p99) = floor(&on)?;
    let mut report = format!(
        "Daemons (release build) in namespaces of their own before the same upstream (the tests' hyper \
         server, answering at once): one without `fleet.store`; one with fleet limits far above the load, \
         its session's requests all on it (sticky load balancing: its share covers them, no round trip); and \
         three sharing a session and the web clients' budget whose limits are the load's concurrency \
         ({CONNECTIONS}), each taking a third of the connections (round-robin: their shares contended). One \
         Redis (Debian's `redis-server`) in another namespace, reached over a veth pair and a bridge. wrk \
         ({SECONDS} s) from the store's namespace, {ROUNDS} rounds interleaved; median (min-max) of the \
         rounds. Everything, Redis included, shares the machine's two CPUs. Claims are round trips on a \
         request's path; commands sent are what the daemons send (claims' and renewals' `EVALSHA`, the probe's \
         `PING`, `ROLE` and `PTTL`, the hash key's fingerprint); run in the store adds what the script runs \
         there (`INFO`, `HMGET`, `HGETALL`, `HSET`, `HDEL`, `PEXPIRE`, `PUBLISH`); CPU is user + system time \
         per request, from `/proc`.\n\n\
         | requests | connections | req/s | p50 | p99 | refused | claims per request | claim round trip (mean) | store commands sent per request | run in the store per request | daemons' CPU per request | store CPU per request |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n"
    );
    for r in &rows {
        let f = |get: fn(&Run) -> f64| r.runs.iter().map(get).collect::<Vec<_>>();
        report.push_str(&format!(
            "| {} | {} | {} | {:.2} ms | {:.2} ms | {:.2} % | {:.4} | {} | {:.4} | {:.4} | {:.1} µs | {:.2} µs |\n",
            r.name,
            r.connections,
            spread(&f(|r| r.rps)),
            median(&f(|r| r.p50_ms)),
            median(&f(|r| r.p99_ms)),
            median(&r.refused) * 100.0,
            median(&r.claims),
            if median(&r.claims) > 0.0 { format!("{:.0} µs", median(&r.claim_us)) } else { "-".to_owned() },
            median(&r.commands),
            median(&r.run_in_store),
            median(&r.daemon_cpu_us),
            median(&r.store_cpu_us),
        ));
    }
    let rps = |i: usize| median(&rows[i].runs.iter().map(|r| r.rps).collect::<Vec<_>>());
    let cpu = |i: usize| median(&rows[i].daemon_cpu_us);
    report.push_str(&format!(
        "\nSticky, a session and a web-client permit, against fleet off: {:.2}x the throughput, {:.2}x the \
         daemon's CPU per request (targets: at least 0.85x, at most 1.15x); the store's CPU {:.2} µs per \
         request (target: at most 3.1 µs, a fifth of the 15.3 µs before shares).\n",
        rps(1) / rps(0),
        cpu(1) / cpu(0),
        median(&rows[1].store_cpu_us),
    ));
    report.push_str(&format!(
        "\nThe floor, one bare round trip to the same Redis from a daemon's namespace (`PING` after `PING` on \
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
