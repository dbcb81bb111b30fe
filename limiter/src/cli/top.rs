//! `limiter top`: a live view of the gate and the daemon in 80 columns,
//! refreshed in place on a terminal; plain lines, one block per refresh,
//! when the output is not a terminal (`--once`: a single block).

use std::{
    io::{IsTerminal as _, Write as _},
    path::Path,
    time::{Duration, Instant, SystemTime},
};

use limiter_common::path;

use super::{Access, AdminApi, DaemonView, dump};
use crate::kernel::{KernelError, Snapshot};

/// Everything one refresh read.
pub struct Sample {
    at: Instant,
    gate: Result<Snapshot, KernelError>,
    daemon: DaemonView,
}

/// Reads the pins and asks the daemon.
pub fn sample(pin_dir: &Path, admin: &AdminApi) -> Sample {
    Sample { at: Instant::now(), gate: dump::snapshot(pin_dir), daemon: DaemonView::fetch(admin) }
}

const WIDTH: usize = 80;

fn fit(mut line: String) -> String {
    if line.chars().count() > WIDTH {
        line = line.chars().take(WIDTH - 1).collect::<String>() + "~";
    }
    line
}

fn rate(now: u64, before: Option<u64>, seconds: f64) -> String {
    match before {
        Some(b) if seconds > 0.0 => format!("{:.1}", now.saturating_sub(b) as f64 / seconds),
        _ => "-".to_owned(),
    }
}

/// The lines of one refresh (each at most 80 columns); rates come from
/// `prev`, the refresh before.
pub fn render(cur: &Sample, prev: Option<&Sample>) -> Vec<String> {
    let secs = prev.map_or(0.0, |p| cur.at.duration_since(p.at).as_secs_f64());
    let clock = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (h, m, s) = ((clock / 3600) % 24, (clock / 60) % 60, clock % 60);
    let daemon = match &cur.daemon {
        DaemonView::Running(st) => format!("daemon pid {}", st.pid),
        DaemonView::NotRunning { .. } => "daemon not running".to_owned(),
        DaemonView::Unreadable { .. } => "daemon status unreadable (another version?)".to_owned(),
    };
    let mut out = vec![fit(format!("limiter top  {h:02}:{m:02}:{s:02} UTC  {daemon}"))];
    match &cur.gate {
        Err(e) => out.push(fit(format!("kernel gate: {e}"))),
        Ok(snap) => {
            out.push(fit(format!(
                "gate {}  trusted {}  source slots {}/{}",
                snap.pin_path.display(),
                if snap.trusted.is_empty() { "-".to_owned() } else { snap.trusted.join(",") },
                snap.source_slots_used,
                snap.source_slots
            )));
            out.push(format!(
                "{:>6} {:>8} {:>8} {:>7} {:>7} {:>10} {:>8} {:>7} {:>5}",
                "PORT", "LIMIT", "PER-SRC", "ESTAB", "PEAK", "REFUSED", "REF/s", "XDP/s", "SRC"
            ));
            let before = |port: u16| {
                prev.and_then(|p| p.gate.as_ref().ok())
                    .and_then(|s| s.ports.iter().find(|r| r.port == port))
                    .map(|r| (r.refused, r.refused_by.by_path[path::XDP]))
            };
            for r in &snap.ports {
                let b = before(r.port);
                out.push(fit(format!(
                    "{:>6} {:>8} {:>8} {:>7} {:>7} {:>10} {:>8} {:>7} {:>5}",
                    r.port,
                    r.limit.map_or("-".to_owned(), |l| if r.dry_run {
                        format!("{l}dry")
                    } else {
                        l.to_string()
                    }),
                    r.per_source_max.map_or("-".to_owned(), |l| l.to_string()),
                    r.established,
                    r.high_watermark,
                    r.refused,
                    rate(r.refused, b.map(|b| b.0), secs),
                    rate(r.refused_by.by_path[path::XDP], b.map(|b| b.1), secs),
                    r.sources,
                )));
            }
        }
    }
    if let DaemonView::Running(st) = &cur.daemon
        && let Some(http) = &st.http
    {
        let p = &http.pools;
        let before = prev.and_then(|p| match &p.daemon {
            DaemonView::Running(s) => s.http.as_ref().map(|h| h.refused_total()),
            _ => None,
        });
        out.push(fit(format!(
            "HTTP in use/limit: normal {}/{} debug {}/{} web {}/{} sessions {}  503/s {}",
            p.normal_in_use,
            p.normal_limit,
            p.debug_in_use,
            p.debug_limit,
            p.web_in_use,
            p.web_limit,
            p.sessions,
            rate(http.refused_total(), before, secs),
        )));
        if let Some(line) = p.adaptive_summary() {
            out.push(fit(format!("HTTP {line}")));
        }
        out.push(fit(format!(
            "HTTP buffered {} KiB, bodies arriving {}",
            http.buffered_bytes.div_ceil(1024),
            http.bodies_receiving
        )));
        let before_proto = |proto: &str| {
            prev.and_then(|p| match &p.daemon {
                DaemonView::Running(s) => {
                    s.http.as_ref()?.requests_by_proto.iter().find(|(q, _)| q == proto).map(|(_, n)| *n)
                }
                _ => None,
            })
        };
        out.push(fit(format!(
            "HTTP req/s by protocol: {}",
            http.protocols(|p, n| rate(n, before_proto(p), secs))
        )));
        if let Some(f) = &http.fleet {
            out.extend(dump::fleet_lines(f).into_iter().map(fit));
        }
        out.push(fit(format!("breaker {}", dump::breaker_summary(&http.breaker))));
        if let Some(s) = &http.shedding {
            out.push(fit(format!("shedding at the SYN: {}", dump::shed_summary(s))));
        }
    }
    out
}

/// `limiter top`: runs the view until interrupted (or once).
pub fn main(target: &Access, interval: Duration, once: bool) -> std::process::ExitCode {
    run(&target.pin_path, &target.admin, interval.max(Duration::from_millis(100)), once);
    std::process::ExitCode::SUCCESS
}

/// Refreshes every `interval` until interrupted (or once).
pub fn run(pin_dir: &Path, admin: &AdminApi, interval: Duration, once: bool) {
    let tty = std::io::stdout().is_terminal();
    let mut prev: Option<Sample> = None;
    loop {
        let cur = sample(pin_dir, admin);
        let lines = render(&cur, prev.as_ref());
        let mut text = String::new();
        if tty {
            // Home, then clear to the end of the screen: no flicker.
            text.push_str("\x1b[H");
            for l in &lines {
                text.push_str(l);
                text.push_str("\x1b[K\n");
            }
            text.push_str("\x1b[J");
        } else {
            for l in &lines {
                text.push_str(l);
                text.push('\n');
            }
            text.push('\n');
        }
        let mut stdout = std::io::stdout().lock();
        if stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()).is_err() || once {
            return;
        }
        drop(stdout);
        prev = Some(cur);
        std::thread::sleep(interval);
    }
}
