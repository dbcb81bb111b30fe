//! `cargo xtask bench shared`: what limiter's workers share per request,
//! measured alone and with every core of this machine contending
//! (`limiter/benches/shared.rs`), and the model those figures give of its
//! throughput against cores, for nodes with more of them than this one.
//!
//! The model: an operation on state every worker writes (a lock, a shared
//! counter) holds that state's cache line for as long as it takes, moves
//! included, and no other core can do the same meanwhile. With every core
//! contending, the wall time per operation over all of them is that hold
//! time when the operation got no faster than one thread alone; one that
//! did (it shares little) is charged only what it lost against perfect
//! scaling. A request needs the sum `S` of the hold times of the shared
//! operations on its path, so however many cores serve, the node serves at
//! most `1 / S` requests per second; below that, each core serves `1 / c`,
//! `c` being its CPU time per request (`bench http`'s scheduler figures).
//! Throughput is `min(N / c, 1 / S)`; the lock's utilisation `N S / c`
//! adds a wait per request, read here as an M/D/1 queue's,
//! `S u / (2 (1 - u))`.

use std::fs;

use anyhow::{Context as _, Result};

use crate::bench::{criterion, estimate, write_section};

/// The benchmark's cases: (criterion name, what it stands for, how many
/// times a request does it).
const CASES: [(&str, &str, &str); 5] = [
    ("admission", "admission pool: lock, decide, permit (Arc) and its return", "1 per request"),
    (
        "admission_ledger",
        "the same with the handover ledger (what a daemon with a kernel gate runs)",
        "1 per request",
    ),
    ("breaker", "breaker, closed: admit + record", "1 per request"),
    ("shared_word", "one shared word, add + subtract (the kernel's port count)", "1 per connection"),
    ("per_thread", "a per-thread counter (`shard`), for contrast", "about 6 per request"),
];

/// Cores of the nodes limiter runs on, for the model's table.
const CORES: [u32; 7] = [2, 8, 16, 32, 48, 64, 96];

/// A line transfer between two sockets of a large node, against one
/// between the two cores here (the usual ratio of cross-socket to
/// same-socket cache-to-cache latency): the model's pessimistic column.
const CROSS_SOCKET: f64 = 3.0;

pub fn main() -> Result<()> {
    criterion("shared")?;
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mut report = format!(
        "criterion; per operation: one thread alone, and the wall time over all operations with {cores} threads \
         contending (an operation that scales shows its cost over {cores}; one on shared state shows how long it \
         holds that state).\n\n| operation | on the path | one thread ns | {cores} threads, ns per operation |\n\
         |---|---|---|---|\n"
    );
    // (name, ns the operation holds shared state)
    let mut held = Vec::new();
    for (name, what, how_often) in CASES {
        let one = estimate(&format!("{name}_one_thread"))?;
        let all = estimate(&format!("{name}_all_cores"))?;
        report.push_str(&format!("| {what} | {how_often} | {one:.1} | {all:.1} |\n"));
        let hold = if all >= one { all } else { (all - one / cores as f64).max(0.0) };
        held.push((name, hold));
    }
    let hold = |name: &str| held.iter().find(|(n, _)| *n == name).map_or(0.0, |(_, ns)| *ns);
    // Per keep-alive request: the admission with its ledger and the
    // breaker; the port count is per connection and the per-thread
    // counters are not shared.
    let s = hold("admission_ledger") + hold("breaker");
    let (c, source) = cpu_per_request()?;
    report.push_str(&format!(
        "\nModel (see `xtask/src/scaling.rs`): a keep-alive request holds shared state for S = {s:.0} ns (admission \
         with the ledger {:.0} ns, the breaker {:.0} ns: an operation no faster on {cores} threads than on one holds \
         for its whole contended time, one that got faster only for what it lost against perfect scaling), and costs a core c = {c:.2} µs of CPU ({source}). Throughput is \
         min(N / c, 1 / S); the admission lock's utilisation u = N S / c adds an M/D/1 wait of S u / (2 (1 - u)) \
         per request. The right-hand columns take S three times longer, for line transfers between the sockets \
         of a two-socket node.\n\n\
         | cores | requests/s | lock utilisation | added wait per request | requests/s, S x{CROSS_SOCKET} | utilisation, S x{CROSS_SOCKET} |\n\
         |---|---|---|---|---|---|\n",
        hold("admission_ledger"),
        hold("breaker"),
    ));
    for n in CORES {
        let row = |s_ns: f64| {
            let rate = (f64::from(n) / (c * 1e-6)).min(1e9 / s_ns);
            let u = rate * s_ns * 1e-9;
            let wait =
                if u < 1.0 { format!("{:.0} ns", s_ns * u / (2.0 * (1.0 - u))) } else { "unbounded".into() };
            (rate, u, wait)
        };
        let (rate, u, wait) = row(s);
        let (rate3, u3, _) = row(s * CROSS_SOCKET);
        report.push_str(&format!(
            "| {n} | {:.2} M | {:.0} % | {wait} | {:.2} M | {:.0} % |\n",
            rate / 1e6,
            u * 100.0,
            rate3 / 1e6,
            u3 * 100.0
        ));
    }
    let knee = c * 1e3 / s;
    report.push_str(&format!(
        "\nWhere it stops scaling: at c / S = {knee:.0} cores the admission lock is always held ({:.0} with S x{CROSS_SOCKET}); \
         past half of that, the wait it adds grows faster than the cores help.\n",
        knee / CROSS_SOCKET
    ));
    report.push_str(&format!(
        "What S is made of: the pool's own lock and permit hold {:.0} ns without the ledger and {:.0} ns with it; \
         the breaker {:.0} ns; the kernel's port count, per connection, {:.0} ns.\n",
        hold("admission"),
        hold("admission_ledger"),
        hold("breaker"),
        hold("shared_word"),
    ));
    print!("{report}");
    write_section("shared", "Scaling past two CPUs", &report)
}

/// limiter's CPU time per keep-alive request, as the last `bench http`
/// wrote it into BENCHMARKS.md (its scheduler table, row `limiter ->
/// upstream`), and where it was read.
fn cpu_per_request() -> Result<(f64, String)> {
    let text = fs::read_to_string(crate::root().join("BENCHMARKS.md"))?;
    let table = text
        .split("what the scheduler saw of the server in front")
        .nth(1)
        .context("BENCHMARKS.md has no scheduler table: run `cargo xtask bench http` first")?;
    let row = table
        .lines()
        .find(|l| l.starts_with("| limiter -> upstream |"))
        .context("no `limiter -> upstream` row in the scheduler table")?;
    let c: f64 =
        row.split('|').nth(2).context("a short row")?.trim().parse().context("CPU µs per request")?;
    Ok((c, "the last `cargo xtask bench http`, keep-alive, from its scheduler table".into()))
}
