//! `limiter-sim`: runs seeds of the fleet's simulation (`cargo xtask
//! simulate` builds and calls it).
//!
//! ```text
//! limiter-sim --suite N [--from S]    N seeds over every fault family in turn,
//!                                     then the planted holes and the fleet
//!                                     before the simulation, each of which must
//!                                     be found (the test suite's run)
//! limiter-sim --seeds N [--from S] [--faults F] [--before] [--first]
//!             [--ignore KIND,…] [--attribute]
//! limiter-sim --seed S [--faults F] [--before]   one seed, its whole trace
//! limiter-sim --moving [--seeds N]    the false-refusal measure (docs/fleet.md)
//! ```
//!
//! `--faults`: `all` (the default), `none`, or families from
//! `cancel,partition,pause,kill,restart,flush,failover,clock,identity,freeze`.
//! `--before`: the fleet as it was before the simulation. A failing seed
//! prints the command that replays it.

use std::{collections::BTreeMap, process::ExitCode, time::Instant};

use limiter_sim::{
    Options, PLANTS, Version, faults_name, first_failure, first_failure_in_rotation, rotation, run,
    scenario::FAMILIES, suite,
};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let flag = |name: &str| args.iter().any(|a| a == name);
    let number = |name: &str, default: u64| value(name).and_then(|v| v.parse().ok()).unwrap_or(default);
    let faults = value("--faults").unwrap_or_else(|| "all".into());
    let families: Vec<&str> = match faults.as_str() {
        "all" => FAMILIES.to_vec(),
        "none" => Vec::new(),
        list => list.split(',').collect(),
    };
    if let Some(bad) = families.iter().find(|f| !FAMILIES.contains(f)) {
        eprintln!("limiter-sim: no fault family `{bad}` (families: {})", FAMILIES.join(", "));
        return ExitCode::from(2);
    }
    let version = if flag("--before") { Version::Before } else { Version::Now };
    let ignore: Vec<String> =
        value("--ignore").map(|v| v.split(',').map(str::to_owned).collect()).unwrap_or_default();
    if let Some(n) = value("--suite").and_then(|v| v.parse().ok()) {
        return run_suite(n, number("--from", 0));
    }
    if flag("--moving") {
        return run_moving(version, number("--seeds", 20));
    }
    if let Some(seed) = value("--seed").and_then(|v| v.parse().ok()) {
        let (sc, out) = run(version, seed, &families, &Options { tracing: true, ignore });
        print!("{sc}");
        for line in &out.trace {
            println!("{line}");
        }
        println!(
            "{} requests, {} admitted, refused {:?}, {} with room; {} claims; violations: {:?}",
            out.requests, out.admitted, out.refused, out.false_refusals, out.claims, out.violations
        );
        return if out.violations.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE };
    }
    let (seeds, from) = (number("--seeds", 1000), number("--from", 0));
    // A seed's violation is the faults' when the same seed without them
    // (the same load) has none.
    let attribute = flag("--attribute");
    let quiet = Options { tracing: false, ignore };
    let mut failed = BTreeMap::<&str, Vec<u64>>::new();
    let (mut admitted, mut requests, mut false_refusals) = (0, 0, 0);
    for seed in from..from + seeds {
        let (_, out) = run(version, seed, &families, &quiet);
        admitted += out.admitted;
        requests += out.requests;
        false_refusals += out.false_refusals;
        if let Some(v) = out.violations.first() {
            if attribute && !run(version, seed, &[], &quiet).1.violations.is_empty() {
                continue;
            }
            println!("seed {seed}: {v}");
            failed.entry(v.kind()).or_default().push(seed);
            if flag("--first") {
                break;
            }
        }
    }
    println!(
        "{seeds} seeds from {from}, faults {faults}: {requests} requests, {admitted} admitted, {false_refusals} refused with room"
    );
    for (kind, seeds) in &failed {
        println!("  {kind}: {} seeds, first {:?}", seeds.len(), &seeds[..seeds.len().min(10)]);
    }
    if failed.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

/// The false-refusal measure: load moving between two nodes, the store
/// local and 10 ms away (the daemon's black-box test measures the same on
/// real processes).
fn run_moving(version: Version, seeds: u64) -> ExitCode {
    let mut ok = true;
    for (store, one_way) in [("local", 50), ("10 ms away", 5_000)] {
        for (load, period) in [("every 2 s", Some(std::time::Duration::from_secs(2))), ("each request", None)]
        {
            let (fraction, requests, violations) = limiter_sim::moving(version, one_way, period, seeds);
            println!(
                "store {store}, load moving {load}: {:.1} % of {requests} requests refused with room ({seeds} seeds){}",
                fraction * 100.0,
                if violations.is_empty() { String::new() } else { format!("; VIOLATIONS {violations:?}") }
            );
            ok &= violations.is_empty() && fraction <= 0.10;
        }
    }
    if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

/// The test suite's run: `n` seeds of today's fleet over every family in
/// turn (none may fail), then every planted hole and the fleet before the
/// simulation (each must be found).
fn run_suite(n: u64, from: u64) -> ExitCode {
    let started = Instant::now();
    let t = suite(Version::Now, from, n);
    let mut ok = t.failures.is_empty();
    println!(
        "today's fleet: {} seeds from {from} over {} fault sets, {} requests, {} admitted, {} refused with room: {} failed ({:.1} s)",
        t.seeds,
        rotation().len(),
        t.requests,
        t.admitted,
        t.false_refusals,
        t.failures.len(),
        started.elapsed().as_secs_f64()
    );
    for f in &t.failures {
        println!(
            "  FAILED seed {} ({}): {}\n    replay: cargo xtask simulate --seed {} --faults {}",
            f.seed, f.faults, f.violation, f.seed, f.faults
        );
    }
    // The checker must see a hole: those planted by hand, and those of
    // the fleet before the simulation.
    for (i, (what, _, _)) in PLANTS.iter().enumerate() {
        let found = first_failure_in_rotation(Version::Planted(i), 400);
        match found {
            Some((seed, faults, v)) => {
                println!("planted hole {i} ({what}): found at seed {seed}, faults {faults} ({})", v.kind())
            }
            None => {
                println!("planted hole {i} ({what}): NOT FOUND in 400 seeds");
                ok = false;
            }
        }
    }
    for families in rotation() {
        let name = faults_name(&families);
        match first_failure(Version::Before, &families, 300) {
            Some((seed, v)) => println!("before, faults {name}: found at seed {seed}: {v}"),
            None => {
                println!("before, faults {name}: NOT FOUND in 300 seeds");
                ok = false;
            }
        }
    }
    println!("({:.1} s in all)", started.elapsed().as_secs_f64());
    if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
