//! What the benchmark programs share: medians, spreads, and writing their
//! section of BENCHMARKS.md between its markers (the hand-written notes
//! around the markers are kept).

use std::{fs, path::Path, process::Command};

use anyhow::{Context as _, Result, ensure};

pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[s.len() / 2]
}

/// "median (min-max)", rounded to whole units.
pub fn spread(v: &[f64]) -> String {
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(0.0, f64::max);
    format!("{:.0} ({min:.0}-{max:.0})", median(v))
}

/// Replaces the `<!-- bench KEY: begin/end -->` section of BENCHMARKS.md
/// (appending it if absent) with `title`, how to reproduce, the date and
/// `report`.
pub fn write_section(key: &str, title: &str, reproduce: &str, report: &str) -> Result<()> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../BENCHMARKS.md");
    let (begin, end) = (format!("<!-- bench {key}: begin -->"), format!("<!-- bench {key}: end -->"));
    let date = crate::run("date", &["-u", "+%Y-%m-%d %H:%M UTC"]).unwrap_or_default();
    let section =
        format!("{begin}\n## {title}\n\nReproduce: {reproduce}\nRun on {}.\n\n{report}{end}", date.trim());
    let text = fs::read_to_string(&path).unwrap_or_else(|_| "# Benchmarks\n\n".into());
    let text = match (text.find(&begin), text.find(&end)) {
        (Some(b), Some(e)) => format!("{}{section}{}", &text[..b], &text[e + end.len()..]),
        _ => format!("{}\n\n{section}\n", text.trim_end()),
    };
    fs::write(&path, text)?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

/// The fields of /proc/PID/stat after the command name (which is in
/// parentheses and may hold spaces): state, ppid, ...
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    Some(stat.rsplit_once(')')?.1.split_whitespace().collect())
}

/// User + system CPU seconds of `pids`, all their threads included. The
/// kernel reports them in USER_HZ ticks, which Linux fixes at 100 per
/// second for user space.
pub fn cpu_seconds(pids: &[u32]) -> f64 {
    let ticks: f64 = pids
        .iter()
        .filter_map(|pid| {
            let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let f = stat_fields(&stat)?;
            // utime and stime: fields 14 and 15 of the line, 11 and 12 here.
            Some(f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?)
        })
        .sum();
    ticks / 100.0
}

/// The processes whose parent is `parent`.
pub fn children(parent: u32) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = fs::read_to_string(e.path().join("stat")).ok()?;
            let ppid: u32 = stat_fields(&stat)?.get(1)?.parse().ok()?;
            (ppid == parent).then_some(pid)
        })
        .collect()
}

/// CPU seconds the whole machine spent in softirq (where the kernel
/// answers a SYN with a RST), from /proc/stat.
pub fn softirq_seconds() -> f64 {
    let stat = fs::read_to_string("/proc/stat").unwrap_or_default();
    // cpu user nice system idle iowait irq softirq ...
    stat.lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(7))
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0.0, |t| t / 100.0)
}

/// One wrk run's figures.
#[derive(Clone, Copy, Debug, Default)]
pub struct Run {
    pub rps: f64,
    pub non_2xx_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Requests it completed.
    pub requests: f64,
}

/// Runs `wrk` (`cmd`: `wrk` itself, or a wrapper that execs it in a
/// namespace) with two threads (one for one connection), `connections`,
/// for `seconds`, with
/// `headers` and optionally a Lua script, and reads its figures.
pub fn wrk(
    cmd: Command,
    connections: u32,
    seconds: u32,
    url: &str,
    headers: &[&str],
    script: Option<&Path>,
) -> Result<Run> {
    wrk_threads(cmd, connections.min(2), connections, seconds, url, headers, script)
}

/// [`wrk`] with `threads` threads.
pub fn wrk_threads(
    mut cmd: Command,
    threads: u32,
    connections: u32,
    seconds: u32,
    url: &str,
    headers: &[&str],
    script: Option<&Path>,
) -> Result<Run> {
    cmd.args([&format!("-t{threads}"), &format!("-c{connections}"), &format!("-d{seconds}s"), "--latency"]);
    if let Some(script) = script {
        cmd.arg("-s").arg(script);
    }
    for h in headers {
        cmd.args(["-H", h]);
    }
    let out = cmd.arg(url).output().context("run wrk")?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(out.status.success(), "wrk {url} failed: {text}{}", String::from_utf8_lossy(&out.stderr));
    let field = |prefix: &str| -> Option<&str> {
        text.lines().find_map(|l| l.trim().strip_prefix(prefix)).map(str::trim)
    };
    let ms = |v: &str| -> f64 {
        let (num, unit): (String, String) = v.chars().partition(|c| c.is_ascii_digit() || *c == '.');
        let n: f64 = num.parse().unwrap_or(f64::NAN);
        match unit.as_str() {
            "us" => n / 1000.0,
            "ms" => n,
            "s" => n * 1000.0,
            "m" => n * 60_000.0,
            _ => f64::NAN,
        }
    };
    let non_2xx: f64 = field("Non-2xx or 3xx responses:").and_then(|v| v.parse().ok()).unwrap_or(0.0);
    // "123456 requests in 5.00s, 12.34MB read"
    let requests = text
        .lines()
        .find(|l| l.contains(" requests in "))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN);
    Ok(Run {
        rps: field("Requests/sec:").and_then(|v| v.parse().ok()).context("no Requests/sec in wrk output")?,
        non_2xx_per_s: non_2xx / f64::from(seconds),
        p50_ms: field("50%").map(ms).unwrap_or(f64::NAN),
        p99_ms: field("99%").map(ms).unwrap_or(f64::NAN),
        requests,
    })
}
