//! The black-box test binaries, side by side. Each test makes its own
//! network namespace, child cgroup, directories and ports, named by its
//! process: binaries share nothing and run in parallel, each one's tests
//! one at a time (`--test-threads=1`, see the harness's doc). A binary's
//! output goes to a log of its own, printed whole when it ends, so lanes
//! never interleave; every test keeps its deadline ([`deadline`]).
//!
//! A few binaries run alone after the rest: those whose assertions are
//! figures of load (throughput classes, shedding rates, a gate at its
//! limit under traffic) keep their margins on two CPUs only with both to
//! themselves.

use std::{
    collections::VecDeque, fs::File, io::Write as _, path::PathBuf, process::Command, sync::Mutex, thread,
    time::Instant,
};

use anyhow::{Context as _, Result, bail};

use crate::{cargo, deadline, root};

/// The binaries that take longest, longest first (measured on two cores;
/// a stale order costs minutes, never a result): started first, so the
/// lanes end together.
const LONGEST_FIRST: [&str; 10] = [
    "fleet",
    "http",
    "live_keys",
    "front_door",
    "kernel",
    "permit_contract",
    "xdp",
    "handover",
    "operations",
    "slow_readers",
];

/// Binaries run alone, after the others (see the module's doc).
const ALONE: [&str; 3] = ["adaptive", "shedding", "breaker"];

/// Binaries whose tests are split among processes of their own (each
/// test names what it makes after its process, so shards share nothing):
/// whole, the longest would outlast every lane.
const SHARDS: [(&str, usize); 1] = [("fleet", 3)];

/// One test binary of a package.
pub struct Binary {
    pub name: String,
    pub path: PathBuf,
}

/// What one process runs: a binary, or a shard of its tests.
struct Job {
    name: String,
    path: PathBuf,
    /// The tests of a shard (run with `--exact`); `None`: all of them.
    tests: Option<Vec<String>>,
}

/// A binary's tests, ignored ones included (`--list`).
fn list(path: &PathBuf) -> Result<Vec<String>> {
    let out = Command::new(path).args(["--list", "--include-ignored"]).output().context("listing tests")?;
    if !out.status.success() {
        bail!("{} --list failed ({})", path.display(), out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .map(str::to_owned)
        .collect())
}

/// The jobs of a binary: itself, or its [`SHARDS`] (not when the run is
/// filtered: the filter then chooses the tests).
fn jobs(b: Binary, filtered: bool) -> Result<Vec<Job>> {
    let shards = SHARDS.iter().find(|(n, _)| *n == b.name).map_or(1, |s| s.1);
    if shards == 1 || filtered {
        return Ok(vec![Job { name: b.name, path: b.path, tests: None }]);
    }
    let tests = list(&b.path)?;
    Ok((0..shards)
        .map(|i| Job {
            name: format!("{}.{}", b.name, i + 1),
            path: b.path.clone(),
            tests: Some(tests.iter().skip(i).step_by(shards).cloned().collect()),
        })
        .collect())
}

/// Builds `package`'s test binaries and lists them.
pub fn build(package: &str) -> Result<Vec<Binary>> {
    let out = cargo()
        .args(["test", "--package", package, "--no-run", "--message-format=json-render-diagnostics"])
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("cargo test --no-run")?;
    if !out.status.success() {
        bail!("building the tests of {package} failed ({})", out.status);
    }
    let mut found = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        if msg["reason"] != "compiler-artifact" || msg["profile"]["test"] != true {
            continue;
        }
        if let Some(path) = msg["executable"].as_str() {
            let name = msg["target"]["name"].as_str().unwrap_or("?").replace('-', "_");
            found.push(Binary { name, path: path.into() });
        }
    }
    if found.is_empty() {
        bail!("cargo built no test binary of {package}");
    }
    Ok(found)
}

/// The order binaries start in: the longest first, then the rest by
/// name; those run alone last.
fn order(mut binaries: Vec<Binary>) -> (Vec<Binary>, Vec<Binary>) {
    let rank = |b: &Binary| LONGEST_FIRST.iter().position(|n| *n == b.name).unwrap_or(LONGEST_FIRST.len());
    binaries.sort_by(|a, b| rank(a).cmp(&rank(b)).then_with(|| a.name.cmp(&b.name)));
    binaries.into_iter().partition(|b| !ALONE.contains(&b.name.as_str()))
}

/// Runs every binary with `args` and `envs`, `lanes` at a time (the
/// [`ALONE`] ones after, one at a time); fails naming every binary that
/// failed, after all have run.
pub fn run(binaries: Vec<Binary>, lanes: usize, args: &[String], envs: &[(&str, PathBuf)]) -> Result<()> {
    let (side_by_side, alone) = order(binaries);
    let expand = |bins: Vec<Binary>| -> Result<Vec<Job>> {
        let mut all = Vec::new();
        for b in bins {
            all.extend(jobs(b, !args.is_empty())?);
        }
        Ok(all)
    };
    let (side_by_side, alone) = (expand(side_by_side)?, expand(alone)?);
    let logs = root().join("target/test-logs");
    std::fs::create_dir_all(&logs)?;
    let results = Mutex::new(Vec::new());
    let one = |b: &Job| {
        let log = logs.join(format!("{}.log", b.name));
        let started = Instant::now();
        let outcome = File::create(&log).context("a test log").and_then(|file| {
            let mut cmd = Command::new(&b.path);
            cmd.args(["--test-threads=1", "--include-ignored"]).args(args).current_dir(root().join("tests"));
            if let Some(tests) = &b.tests {
                cmd.arg("--exact").args(tests);
            }
            for (k, v) in envs {
                cmd.env(k, v);
            }
            deadline::run(&b.name, &mut cmd, deadline::PER_TEST, file)
        });
        let took = started.elapsed();
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let mut stdout = std::io::stdout().lock();
        let _ = writeln!(stdout, "\n==== {} ({} s) ====\n{text}", b.name, took.as_secs());
        if let Err(e) = &outcome {
            let _ = writeln!(stdout, "==== {}: {e:#}", b.name);
        }
        results.lock().expect("results").push((b.name.clone(), took, outcome.is_ok()));
    };
    let queue = Mutex::new(VecDeque::from(side_by_side));
    thread::scope(|s| {
        for _ in 0..lanes.max(1) {
            s.spawn(|| {
                loop {
                    // Popped in a statement of its own: the queue's lock
                    // must not be held while the binary runs.
                    let next = queue.lock().expect("the queue").pop_front();
                    let Some(b) = next else { break };
                    one(&b);
                }
            });
        }
    });
    for b in &alone {
        one(b);
    }
    let results = results.into_inner().expect("results");
    let mut summary = String::from("\nblack-box test binaries (seconds):");
    for (name, took, ok) in &results {
        summary.push_str(&format!(" {name} {}{}", took.as_secs(), if *ok { "" } else { " FAILED" }));
    }
    println!("{summary}");
    let failed: Vec<_> = results.iter().filter(|r| !r.2).map(|r| r.0.as_str()).collect();
    if !failed.is_empty() {
        bail!("black-box tests failed in: {} (logs in {})", failed.join(", "), logs.display());
    }
    Ok(())
}

/// Lanes to run: `LIMITER_TEST_LANES`, or one more than the CPUs, at
/// most 4 (the tests mostly wait: on timers, on the daemons they drive).
pub fn lanes() -> usize {
    std::env::var("LIMITER_TEST_LANES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| thread::available_parallelism().map_or(1, |n| n.get() + 1).min(4))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_start_first_and_the_alone_ones_come_last() {
        let b = |n: &str| Binary { name: n.into(), path: PathBuf::new() };
        let (first, last) = order(vec![b("adaptive"), b("top"), b("http"), b("fleet"), b("dist")]);
        let names = |v: &[Binary]| v.iter().map(|b| b.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&first), ["fleet", "http", "dist", "top"]);
        assert_eq!(names(&last), ["adaptive"]);
    }
}
