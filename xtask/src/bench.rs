//! `cargo xtask bench kernel|http`: builds the daemon in release mode and runs
//! the benchmark program (tests/src/bin/bench-*.rs), which runs its
//! peers in the same run and writes BENCHMARKS.md.

use anyhow::{Result, bail};

use crate::{build_daemon, cargo, setup, status};

pub fn main(args: &[String]) -> Result<()> {
    let which = args.first().map(String::as_str).unwrap_or("");
    let bin = match which {
        "kernel" => "bench-kernel",
        "http" => "bench-http",
        _ => bail!("usage: cargo xtask bench kernel|http"),
    };
    setup::ensure(setup::Purpose::Bench)?;
    let daemon = build_daemon(true)?;
    let mut cmd = cargo();
    cmd.args(["run", "--release", "--package", "limiter-tests", "--bin", bin]).env("LIMITER_BIN", daemon);
    status(&format!("benchmark {which}"), &mut cmd)
}
