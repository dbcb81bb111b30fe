//! What the scheduler saw of a server while it served a load, every thread
//! of its processes together, from `/proc`: CPU time (user and kernel),
//! time spent runnable but waiting for a CPU, context switches (voluntary:
//! the thread slept, to be woken again; involuntary: it was preempted) and
//! migrations between CPUs. Read before and after a run, per request:
//! figures that instruction counts do not show (wake-ups, preemption,
//! moving between CPUs), for the benchmarks' side-by-side rows.
//!
//! A value the kernel does not report fails the reading (no figure is
//! made up from a missing one). Threads that end between two readings take
//! their counts with them; the servers measured here keep theirs.

use std::fs;

use anyhow::{Context as _, Result};

/// Counters of a set of processes, all their threads summed.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sched {
    /// On a CPU, in nanoseconds (`se.sum_exec_runtime`).
    pub run_ns: f64,
    /// Runnable, waiting for a CPU (`schedstat`'s second field).
    pub wait_ns: f64,
    /// User and kernel time, in USER_HZ ticks (100 a second).
    pub user_ticks: f64,
    pub system_ticks: f64,
    pub voluntary: f64,
    pub involuntary: f64,
    pub migrations: f64,
}

/// A `name : value` line of `/proc/PID/task/TID/sched`.
fn sched_field(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == name).then(|| v.trim().parse().ok()).flatten()
    })
}

impl Sched {
    /// Now, for `pids` and every thread of theirs.
    pub fn of(pids: &[u32]) -> Result<Self> {
        let mut total = Self::default();
        for pid in pids {
            let tasks =
                fs::read_dir(format!("/proc/{pid}/task")).with_context(|| format!("the threads of {pid}"))?;
            for task in tasks {
                let dir = task?.path();
                // A thread that ended after the listing took its counts.
                let Ok(sched) = fs::read_to_string(dir.join("sched")) else { continue };
                let schedstat = fs::read_to_string(dir.join("schedstat")).context("schedstat")?;
                let stat = fs::read_to_string(dir.join("stat")).context("stat")?;
                let field = |name: &str| {
                    sched_field(&sched, name)
                        .with_context(|| format!("{name} in {}", dir.join("sched").display()))
                };
                // sum_exec_runtime is in milliseconds, with a fraction.
                total.run_ns += field("se.sum_exec_runtime")? * 1e6;
                total.migrations += field("se.nr_migrations")?;
                total.voluntary += field("nr_voluntary_switches")?;
                total.involuntary += field("nr_involuntary_switches")?;
                let wait: f64 = schedstat
                    .split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse().ok())
                    .with_context(|| format!("the wait time in {}", dir.join("schedstat").display()))?;
                total.wait_ns += wait;
                let f: Vec<&str> =
                    stat.rsplit_once(')').context("a stat line")?.1.split_whitespace().collect();
                // utime and stime: fields 14 and 15 of the line, 11 and 12 here.
                let ticks = |i: usize| -> Result<f64> {
                    f.get(i)
                        .and_then(|v| v.parse().ok())
                        .with_context(|| format!("field {i} of {}", dir.display()))
                };
                total.user_ticks += ticks(11)?;
                total.system_ticks += ticks(12)?;
            }
        }
        Ok(total)
    }

    /// What happened between `before` and this reading.
    pub fn since(self, before: Self) -> Self {
        Self {
            run_ns: self.run_ns - before.run_ns,
            wait_ns: self.wait_ns - before.wait_ns,
            user_ticks: self.user_ticks - before.user_ticks,
            system_ticks: self.system_ticks - before.system_ticks,
            voluntary: self.voluntary - before.voluntary,
            involuntary: self.involuntary - before.involuntary,
            migrations: self.migrations - before.migrations,
        }
    }

    /// Adds another run's counts.
    pub fn plus(self, other: Self) -> Self {
        Self {
            run_ns: self.run_ns + other.run_ns,
            wait_ns: self.wait_ns + other.wait_ns,
            user_ticks: self.user_ticks + other.user_ticks,
            system_ticks: self.system_ticks + other.system_ticks,
            voluntary: self.voluntary + other.voluntary,
            involuntary: self.involuntary + other.involuntary,
            migrations: self.migrations + other.migrations,
        }
    }

    /// The figures of `requests` requests, per request: CPU µs (user,
    /// kernel), runqueue wait µs, voluntary and involuntary switches,
    /// migrations.
    pub fn per_request(self, requests: f64) -> PerRequest {
        let user_share = self.user_ticks / (self.user_ticks + self.system_ticks).max(1.0);
        let cpu_us = self.run_ns / 1e3 / requests;
        PerRequest {
            cpu_us,
            user_us: cpu_us * user_share,
            kernel_us: cpu_us * (1.0 - user_share),
            wait_us: self.wait_ns / 1e3 / requests,
            voluntary: self.voluntary / requests,
            involuntary: self.involuntary / requests,
            migrations: self.migrations / requests,
        }
    }
}

/// Scheduler figures per request.
#[derive(Clone, Copy, Debug, Default)]
pub struct PerRequest {
    pub cpu_us: f64,
    pub user_us: f64,
    pub kernel_us: f64,
    pub wait_us: f64,
    pub voluntary: f64,
    pub involuntary: f64,
    pub migrations: f64,
}

impl PerRequest {
    /// The header of a table of them.
    pub const HEADER: &'static str = "| server | CPU µs / request | user µs | kernel µs | runqueue wait µs | voluntary switches (wake-ups) | involuntary switches | migrations |\n|---|---|---|---|---|---|---|---|\n";

    /// One row of that table.
    pub fn row(&self, name: &str) -> String {
        format!(
            "| {name} | {:.2} | {:.2} | {:.2} | {:.2} | {:.3} | {:.4} | {:.4} |\n",
            self.cpu_us,
            self.user_us,
            self.kernel_us,
            self.wait_us,
            self.voluntary,
            self.involuntary,
            self.migrations
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_read_and_a_spin_shows_as_cpu_time() {
        let me = std::process::id();
        let before = Sched::of(&[me]).unwrap();
        // Spin for 50 ms of this thread's own CPU time, not of the wall
        // clock: on a loaded machine a wall-clock spin may run for less.
        let cpu = nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID;
        let ns = |t: nix::sys::time::TimeSpec| t.tv_sec() as f64 * 1e9 + t.tv_nsec() as f64;
        let started = ns(cpu.now().unwrap());
        let mut x = 0u64;
        while ns(cpu.now().unwrap()) - started < 50e6 {
            x = x.wrapping_mul(31).wrapping_add(7);
        }
        std::hint::black_box(x);
        let d = Sched::of(&[me]).unwrap().since(before);
        // The kernel's two clocks of one thread agree to well under 5 ms.
        assert!(d.run_ns >= 45e6, "50 ms of this thread's CPU time shows: {d:?}");
        let per = d.per_request(10.0);
        assert!((per.user_us + per.kernel_us - per.cpu_us).abs() < 1e-6);
    }
}
