//! `cargo xtask bench kernel|http|scrape|shed|adaptive|fleet`: builds the daemon in release mode and runs
//! the benchmark program (tests/src/bin/bench-*.rs), which runs its
//! peers in the same run and writes BENCHMARKS.md.

use std::fs;

use anyhow::{Context as _, Result, bail};

use crate::{build_daemon, build_revision, cargo, setup, status};

pub fn main(args: &[String]) -> Result<()> {
    let which = args.first().map(String::as_str).unwrap_or("");
    let bin = match which {
        "kernel" => "bench-kernel",
        "http" => "bench-http",
        "scrape" => "bench-scrape",
        "shed" => "bench-shed",
        "adaptive" => "bench-adaptive",
        "fleet" => "bench-fleet",
        "breaker" => return breaker(),
        "shared" => return crate::scaling::main(),
        _ => bail!(
            "usage: cargo xtask bench kernel|http [--before REV]|scrape|shed|adaptive|fleet|breaker|shared"
        ),
    };
    setup::ensure(setup::Purpose::Test)?;
    let daemon = build_daemon(true)?;
    let mut cmd = cargo();
    cmd.args(["run", "--release", "--package", "limiter-tests", "--bin", bin]).env("LIMITER_BIN", daemon);
    if which == "http" {
        // The counted rows' peer, and limiter's allocation-counting build
        // (its own target directory, so the timed binary stays as it is).
        status(
            "building the hyper floor",
            cargo().args(["build", "--release", "--package", "limiter-tests", "--bin", "hyper-floor"]),
        )?;
        let target = crate::root().join("target/count-allocations");
        status(
            "building limiter with count-allocations",
            cargo()
                .args([
                    "build",
                    "--release",
                    "--package",
                    "limiter",
                    "--bin",
                    "limiter",
                    "--features",
                    "count-allocations",
                ])
                .env("CARGO_TARGET_DIR", &target),
        )?;
        cmd.env("LIMITER_BIN_COUNTING", target.join("release/limiter"));
    }
    if which == "adaptive" {
        // The peers running Netflix's algorithms (peers/acc-proxy).
        status(
            "building the tower-acc proxy",
            cargo().args(["build", "--release", "--package", "acc-proxy"]),
        )?;
        cmd.env("ACC_PROXY_BIN", crate::root().join("target/release/acc-proxy"));
    }
    if which == "scrape" {
        // Against the last build of pinned layout 2 (every slot read on
        // every scrape).
        cmd.env("LIMITER_BIN_BEFORE", build_revision(crate::LAYOUT2_REV, "layout2-release", true)?)
            .env("LIMITER_BEFORE_REV", crate::LAYOUT2_REV);
    }
    if let Some(i) = args.iter().position(|a| a == "--before") {
        let rev = args.get(i + 1).context("--before needs a git revision")?;
        cmd.env("LIMITER_BIN_BEFORE", build_revision(rev, "before", true)?).env("LIMITER_BEFORE_REV", rev);
    }
    status(&format!("benchmark {which}"), &mut cmd)
}

/// Runs the criterion benchmark `bench` of the limiter crate.
pub(crate) fn criterion(bench: &str) -> Result<()> {
    setup::ensure(setup::Purpose::Build)?;
    let mut cmd = cargo();
    cmd.args(["bench", "--package", "limiter", "--bench", bench]);
    status(&format!("benchmark {bench}"), &mut cmd)
}

/// criterion's headline figure of the benchmark `name` (ns): the slope
/// when it fitted one, else the mean.
pub(crate) fn estimate(name: &str) -> Result<f64> {
    let path = crate::root().join("target/criterion").join(name).join("new/estimates.json");
    let v: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?)?;
    v["slope"]["point_estimate"].as_f64().or(v["mean"]["point_estimate"].as_f64()).context("no estimate")
}

/// Replaces the section `key` of BENCHMARKS.md (between its markers) with
/// `title` and `report`, or appends it.
pub(crate) fn write_section(key: &str, title: &str, report: &str) -> Result<()> {
    let path = crate::root().join("BENCHMARKS.md");
    let (begin, end) = (format!("<!-- bench {key}: begin -->"), format!("<!-- bench {key}: end -->"));
    let section = format!("{begin}\n## {title}\n\nReproduce: `cargo xtask bench {key}`.\n\n{report}{end}");
    let text = fs::read_to_string(&path).unwrap_or_else(|_| "# Benchmarks\n\n".into());
    let text = match (text.find(&begin), text.find(&end)) {
        (Some(b), Some(e)) => format!("{}{section}{}", &text[..b], &text[e + end.len()..]),
        _ => format!("{}\n\n{section}\n", text.trim_end()),
    };
    fs::write(&path, text)?;
    Ok(())
}

/// The breaker's criterion benchmark; its estimates go into BENCHMARKS.md.
fn breaker() -> Result<()> {
    criterion("breaker")?;
    let single = estimate("single_thread_success")?;
    let mixed = estimate("single_thread_5pct_failures")?;
    let contended = estimate("all_cores_contending_success")?;
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    let report = format!(
        "criterion, `admit()` + `record()` on a closed breaker (the path of every request to a healthy upstream), {cores} CPUs.\n\n\
         | case | ns per request | requests/s |\n|---|---|---|\n\
         | one thread, all successes | {single:.1} | {:.1} M |\n\
         | one thread, 5 % failures (each failure sums the window) | {mixed:.1} | {:.1} M |\n\
         | {cores} threads contending, all successes (aggregate) | {contended:.1} | {:.1} M |\n\n\
         Targets: under 100 ns single-threaded: {} ({single:.1} ns); aggregate rate with all cores contending at least \
         the single-threaded rate: {} ({:.2}x).\n",
        1e3 / single,
        1e3 / mixed,
        1e3 / contended,
        verdict(single < 100.0),
        verdict(contended <= single),
        single / contended,
    );
    print!("{report}");
    write_section("breaker", "Circuit breaker", &report)
}
