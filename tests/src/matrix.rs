//! The load shapes of `cargo xtask bench http`'s matrix: wrk with 1 and 2
//! threads × 10, 50 and 200 connections × with and without an
//! `Authorization` header (every server with its per-session limit on) ×
//! keep-alive and a new connection per request, and HTTP/1.1 over TLS
//! (keep-alive, 50 connections, 1 and 2 threads); every server in every
//! shape in the same interleaved rounds, with what the scheduler saw of it
//! and its system calls per request, so a gap comes with its cause.

use std::{
    fmt::Write as _,
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, Result, ensure};

use crate::{
    bench::{Run, median, spread},
    sched::{PerRequest, Sched},
};

/// One load shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub threads: u32,
    pub connections: u32,
    pub auth: bool,
    /// A new connection per request (`Connection: close`).
    pub fresh: bool,
    pub tls: bool,
}

impl Shape {
    pub fn label(&self) -> String {
        format!(
            "{}-t{} -c{}{}{}",
            if self.tls { "TLS " } else { "" },
            self.threads,
            self.connections,
            if self.auth { " auth" } else { "" },
            if self.fresh { " new conn" } else { "" },
        )
    }
}

/// The matrix, plain shapes first, then TLS.
pub fn shapes() -> Vec<Shape> {
    let mut all = Vec::new();
    for fresh in [false, true] {
        for auth in [false, true] {
            for threads in [1, 2] {
                for connections in [10, 50, 200] {
                    all.push(Shape { threads, connections, auth, fresh, tls: false });
                }
            }
        }
    }
    for threads in [1, 2] {
        all.push(Shape { threads, connections: 50, auth: false, fresh: false, tls: true });
    }
    all
}

/// One server of the matrix: its plain and TLS addresses, and its
/// processes (every thread of theirs is read).
pub struct Server {
    pub name: String,
    pub http: String,
    pub https: Option<String>,
    pub pids: Vec<u32>,
}

/// One server's figures in one shape.
#[derive(Clone, Debug, Default)]
pub struct Figures {
    pub runs: Vec<Run>,
    pub sched: Sched,
    pub requests: f64,
    /// System calls per request, from a separate run under `strace -c -f`.
    pub syscalls: f64,
    /// CPU seconds wrk itself spent (user and system): what the server's
    /// way of answering costs the client, which shares the CPUs.
    pub client_cpu_s: f64,
}

impl Figures {
    fn median(&self, f: fn(&Run) -> f64) -> f64 {
        median(&self.runs.iter().map(f).collect::<Vec<_>>())
    }
}

/// CPU seconds (user and system) of this process's waited-for children.
fn children_cpu_seconds() -> f64 {
    use nix::sys::resource::{UsageWho, getrusage};
    getrusage(UsageWho::RUSAGE_CHILDREN).map_or(f64::NAN, |u| {
        let secs = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
        secs(u.user_time()) + secs(u.system_time())
    })
}

/// What the matrix is run with: `BENCH_MATRIX_ROUNDS` (3),
/// `BENCH_MATRIX_SECONDS` (5) and `BENCH_MATRIX_ONLY` (a substring of the
/// shapes' labels, to run some of them).
pub struct Settings {
    pub rounds: usize,
    pub seconds: u32,
    pub only: Option<String>,
}

impl Settings {
    pub fn from_env() -> Self {
        let num = |k: &str, d: u64| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
        Self {
            rounds: num("BENCH_MATRIX_ROUNDS", 3) as usize,
            seconds: num("BENCH_MATRIX_SECONDS", 5) as u32,
            only: std::env::var("BENCH_MATRIX_ONLY").ok().filter(|s| !s.is_empty()),
        }
    }
}

/// Fails naming the server when one of its processes is gone.
fn alive(server: &Server, when: &str) -> Result<()> {
    let gone: Vec<&u32> =
        server.pids.iter().filter(|p| !std::path::Path::new(&format!("/proc/{p}")).exists()).collect();
    ensure!(gone.is_empty(), "{} is gone ({when}): its processes {gone:?} ended", server.name);
    Ok(())
}

/// wrk in `shape` against `url` for `seconds`.
fn wrk(shape: &Shape, seconds: u32, url: &str, auth: &str) -> Result<Run> {
    let mut headers = Vec::new();
    if shape.auth {
        headers.push(auth);
    }
    if shape.fresh {
        headers.push("Connection: close");
    }
    crate::bench::wrk_threads(
        Command::new("wrk"),
        shape.threads,
        shape.connections,
        seconds,
        url,
        &headers,
        None,
    )
}

/// Runs every shape against every server; the figures by shape, then by
/// server.
pub fn run(servers: &[Server], settings: &Settings, auth: &str) -> Result<Vec<(Shape, Vec<Figures>)>> {
    let mut out = Vec::new();
    let shapes: Vec<Shape> = shapes()
        .into_iter()
        .filter(|s| settings.only.as_ref().is_none_or(|o| s.label().contains(o.as_str())))
        .collect();
    for (n, shape) in shapes.iter().enumerate() {
        let urls: Vec<&str> = servers
            .iter()
            .map(|s| {
                if shape.tls {
                    s.https.as_deref().context("a server without TLS in a TLS shape")
                } else {
                    Ok(s.http.as_str())
                }
            })
            .collect::<Result<_>>()?;
        for (server, url) in servers.iter().zip(&urls) {
            alive(server, &format!("before {}", shape.label()))?;
            // Warm-up, and a check that every server answers 200.
            let r =
                wrk(shape, 1, url, auth).with_context(|| format!("{} in {}", server.name, shape.label()))?;
            ensure!(r.non_2xx_per_s == 0.0, "{} answered non-2xx in {}", server.name, shape.label());
        }
        let mut figures = vec![Figures::default(); servers.len()];
        for round in 0..settings.rounds {
            for k in 0..servers.len() {
                let i = (round + k) % servers.len();
                let before = Sched::of(&servers[i].pids)?;
                let client_before = children_cpu_seconds();
                let r = wrk(shape, settings.seconds, urls[i], auth).with_context(|| {
                    format!("{} in {}, round {}", servers[i].name, shape.label(), round + 1)
                })?;
                figures[i].client_cpu_s += children_cpu_seconds() - client_before;
                let seen = Sched::of(&servers[i].pids)?.since(before);
                ensure!(r.non_2xx_per_s == 0.0, "{}: non-2xx in {}", servers[i].name, shape.label());
                figures[i].sched = figures[i].sched.plus(seen);
                figures[i].requests += r.requests;
                figures[i].runs.push(r);
            }
        }
        for (i, server) in servers.iter().enumerate() {
            figures[i].syscalls = syscalls_per_request(server, shape, urls[i], auth)
                .with_context(|| format!("{}'s system calls in {}", server.name, shape.label()))?;
            alive(server, &format!("after strace in {}", shape.label()))?;
        }
        eprintln!("matrix: {} ({}/{})", shape.label(), n + 1, shapes.len());
        for (server, f) in servers.iter().zip(&figures) {
            eprintln!(
                "  {}: {:.0} req/s, p99 {:.2} ms",
                server.name,
                f.median(|r| r.rps),
                f.median(|r| r.p99_ms)
            );
        }
        out.push((*shape, figures));
    }
    Ok(out)
}

/// System calls per request of `server` in `shape`: `strace -c -f`
/// attached to its processes (every thread) for a 2 s run of the shape.
fn syscalls_per_request(server: &Server, shape: &Shape, url: &str, auth: &str) -> Result<f64> {
    let mut strace = Command::new("strace");
    strace
        .args(["-c", "-f", "-o"])
        .arg(std::env::temp_dir().join(format!("matrix-strace-{}", std::process::id())));
    for pid in &server.pids {
        strace.args(["-p", &pid.to_string()]);
    }
    let mut child: Child =
        strace.stdout(Stdio::null()).stderr(Stdio::null()).spawn().context("start strace")?;
    std::thread::sleep(Duration::from_millis(500));
    let r = wrk(shape, 2, url, auth);
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
    let _ = child.wait();
    let r = r?;
    let path = std::env::temp_dir().join(format!("matrix-strace-{}", std::process::id()));
    let text = std::fs::read_to_string(&path).context("strace's summary")?;
    let _ = std::fs::remove_file(&path);
    // "100.00    0.123456           1    123456      1234 total"
    let calls: f64 = text
        .lines()
        .find(|l| l.trim_end().ends_with("total"))
        .and_then(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // percent, seconds, usecs/call, calls[, errors], "total"
            f.get(3)?.parse().ok()
        })
        .with_context(|| format!("no total in strace's summary: {text}"))?;
    Ok(calls / r.requests.max(1.0))
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "**missed**" }
}

/// The matrix as Markdown: throughput and p99 per shape and server, the
/// verdict against the faster peer; then, per shape and server, CPU,
/// wake-ups, switches, run-queue wait and system calls per request.
pub fn report(servers: &[Server], cells: &[(Shape, Vec<Figures>)], settings: &Settings) -> String {
    let mut out = format!(
        "\n(8) The matrix of load shapes: wrk, {} interleaved rounds of {} s each, medians; every server has the same \
         limits (a per-session limit keyed on `Authorization`, the pool of limiter's normal slots), the nginx upstream \
         of (1). Target: throughput at least the faster peer's, p99 no worse than that peer's.\n\n",
        settings.rounds, settings.seconds
    );
    out.push_str("| shape |");
    for s in servers {
        let _ = write!(out, " {} req/s |", s.name);
    }
    for s in servers {
        let _ = write!(out, " {} p99 ms |", s.name);
    }
    out.push_str(" limiter / faster peer | verdict |\n|---|");
    out.push_str(&"---|".repeat(servers.len() * 2 + 2));
    out.push('\n');
    let mut missed = 0;
    for (shape, figures) in cells {
        let _ = write!(out, "| {} |", shape.label());
        for f in figures {
            let _ = write!(out, " {} |", spread(&f.runs.iter().map(|r| r.rps).collect::<Vec<_>>()));
        }
        for f in figures {
            let _ = write!(out, " {:.2} |", f.median(|r| r.p99_ms));
        }
        let limiter = &figures[0];
        let faster = figures[1..]
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.median(|r| r.rps).total_cmp(&b.1.median(|r| r.rps)))
            .map(|(i, _)| i + 1)
            .unwrap_or(1);
        let (l_rps, p_rps) = (limiter.median(|r| r.rps), figures[faster].median(|r| r.rps));
        let (l_p99, p_p99) = (limiter.median(|r| r.p99_ms), figures[faster].median(|r| r.p99_ms));
        let met = l_rps >= p_rps && l_p99 <= p_p99;
        missed += usize::from(!met);
        let _ = writeln!(
            out,
            " {:.2}x ({}), p99 {} | {} |",
            l_rps / p_rps,
            servers[faster].name,
            if l_p99 <= p_p99 { "no worse" } else { "worse" },
            verdict(met)
        );
    }
    let _ = writeln!(out, "\nCells missed: {missed} of {}.\n", cells.len());
    out.push_str("What the scheduler saw of each server (all its threads, all rounds), its system calls, and the CPU wrk itself spent, per request:\n\n");
    out.push_str("| shape / server | CPU µs | user µs | kernel µs | runqueue wait µs | wake-ups (voluntary switches) | involuntary switches | migrations | system calls | wrk's CPU µs |\n|---|---|---|---|---|---|---|---|---|---|\n");
    for (shape, figures) in cells {
        for (s, f) in servers.iter().zip(figures) {
            let p: PerRequest = f.sched.per_request(f.requests);
            let _ = writeln!(
                out,
                "| {} / {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.3} | {:.4} | {:.4} | {:.2} | {:.2} |",
                shape.label(),
                s.name,
                p.cpu_us,
                p.user_us,
                p.kernel_us,
                p.wait_us,
                p.voluntary,
                p.involuntary,
                p.migrations,
                f.syscalls,
                f.client_cpu_s * 1e6 / f.requests
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_matrix_has_every_plain_shape_once_and_two_tls_shapes() {
        let shapes = super::shapes();
        assert_eq!(shapes.len(), 2 * 3 * 2 * 2 + 2);
        let labels: std::collections::BTreeSet<String> = shapes.iter().map(super::Shape::label).collect();
        assert_eq!(labels.len(), shapes.len());
        assert!(labels.contains("-t1 -c50"));
        assert!(labels.contains("-t2 -c200 auth new conn"));
        assert!(labels.contains("TLS -t1 -c50"));
    }
}
