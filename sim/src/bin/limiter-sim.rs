//! `limiter-sim`: runs seeds of the fleet's simulation (`cargo xtask
//! simulate` calls it). `--seeds N [--from S]`, or `--seed S --trace` to
//! replay one with its whole trace; `--faults a,b` (default: all),
//! `--before` for the fleet as it was before the simulation.

use std::collections::BTreeMap;

use limiter_sim::{Options, Version, run, scenario::FAMILIES};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let seeds: u64 = value("--seeds").and_then(|v| v.parse().ok()).unwrap_or(1000);
    let from: u64 = value("--from").and_then(|v| v.parse().ok()).unwrap_or(0);
    let one: Option<u64> = value("--seed").and_then(|v| v.parse().ok());
    let faults = value("--faults").unwrap_or_else(|| "all".into());
    let families: Vec<&str> = match faults.as_str() {
        "all" => FAMILIES.to_vec(),
        "none" => Vec::new(),
        list => list.split(',').collect(),
    };
    let version = if args.iter().any(|a| a == "--before") { Version::Before } else { Version::Before };
    let stop_at_first = args.iter().any(|a| a == "--first");
    let ignore: Vec<String> =
        value("--ignore").map(|v| v.split(',').map(str::to_owned).collect()).unwrap_or_default();
    // A seed's violation is the faults' when the same seed without them
    // (the same load) has none.
    let attribute = args.iter().any(|a| a == "--attribute");
    let quiet = Options { tracing: false, ignore: ignore.clone() };
    if let Some(seed) = one {
        let (sc, out) = run(version, seed, &families, &Options { tracing: true, ignore: ignore.clone() });
        print!("{sc}");
        for line in &out.trace {
            println!("{line}");
        }
        println!("{out:?}", out = Summary(&out));
        std::process::exit(i32::from(!out.violations.is_empty()));
    }
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
            if stop_at_first {
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
    std::process::exit(i32::from(!failed.is_empty()));
}

struct Summary<'a>(&'a limiter_sim::world::Outcome);

impl std::fmt::Debug for Summary<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let o = self.0;
        write!(
            f,
            "{} requests, {} admitted, refused {:?}, {} with room; {} claims; violations: {:?}",
            o.requests, o.admitted, o.refused, o.false_refusals, o.claims, o.violations
        )
    }
}
