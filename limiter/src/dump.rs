//! `limiter dump`: reads the pinned maps itself (so it works while the
//! daemon is down) and adds what the running daemon reports on its admin
//! listener, or says "daemon not running".

use std::{
    fmt::Write as _,
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    path::Path,
    time::Duration,
};

use crate::kernel::{Gate, KernelError, Snapshot};

/// The daemon's `/status`, or why there is none.
#[derive(Debug)]
pub enum DaemonView {
    Running(serde_json::Value),
    NotRunning { admin: SocketAddr },
}

/// Asks the admin listener for `/status`, briefly (with the admin token
/// when the configuration sets one).
pub fn daemon_view(admin: SocketAddr, token: Option<&str>) -> DaemonView {
    fetch(admin, "/status", token)
        .and_then(|body| serde_json::from_str(&body).ok())
        .map_or(DaemonView::NotRunning { admin }, DaemonView::Running)
}

/// A minimal HTTP/1.0 GET: enough for the daemon's own admin listener.
pub fn fetch(addr: SocketAddr, path: &str, token: Option<&str>) -> Option<String> {
    let timeout = Duration::from_millis(500);
    let mut stream = TcpStream::connect_timeout(&addr, timeout).ok()?;
    stream.set_read_timeout(Some(timeout)).ok()?;
    stream.set_write_timeout(Some(timeout)).ok()?;
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n{auth}\r\n").ok()?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw).ok()?;
    let (head, body) = raw.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?;
    (head.starts_with("HTTP/1.") && status == "200").then(|| body.to_owned())
}

/// Reads the pins at `pin_dir`.
pub fn snapshot(pin_dir: &Path) -> Result<Snapshot, KernelError> {
    Gate::open(pin_dir)?.snapshot()
}

/// The JSON document `dump --json` prints.
pub fn json(snap: Option<&Snapshot>, daemon: &DaemonView) -> serde_json::Value {
    let daemon = match daemon {
        DaemonView::Running(status) => {
            // The kernel part is already here, read from the pins.
            let mut status = status.clone();
            if let Some(kernel) = status.get_mut("kernel").and_then(|k| k.as_object_mut()) {
                kernel.remove("gate");
            }
            serde_json::json!({ "running": true, "status": status })
        }
        DaemonView::NotRunning { admin } => serde_json::json!({ "running": false, "admin": admin }),
    };
    serde_json::json!({ "kernel": snap, "daemon": daemon })
}

/// The table `dump` prints.
pub fn table(snap: Option<&Snapshot>, daemon: &DaemonView) -> String {
    let mut out = String::new();
    let Some(snap) = snap else {
        out.push_str("no kernel gate (kernel.enabled = false, or nothing pinned at the pin path)\n");
        out.push_str(&daemon_lines(None, daemon));
        return out;
    };
    let _ = writeln!(
        out,
        "kernel gate at {} (layout {}, netns cookie {})",
        snap.pin_path.display(),
        snap.layout_version,
        snap.netns_cookie
    );
    for link in &snap.links {
        match (link.link_id, link.program_id) {
            (Some(l), Some(p)) => {
                let _ = writeln!(out, "  {:<15} link {l}, program {p}", link.pin);
            }
            _ => {
                let _ = writeln!(out, "  {:<15} NOT PINNED (not enforcing)", link.pin);
            }
        }
    }
    if snap.untracked_sockets > 0 {
        let _ = writeln!(out, "  untracked sockets: {}", snap.untracked_sockets);
    }
    if snap.untracked_sources > 0 {
        let _ = writeln!(
            out,
            "  connections not counted for their client group (table full): {}",
            snap.untracked_sources
        );
    }
    if snap.walked > 0 {
        let _ = writeln!(out, "  connections older than the gate, counted at start-up: {}", snap.walked);
    }
    if !snap.trusted.is_empty() {
        let _ = writeln!(
            out,
            "  trusted: {} (reserve {} past a full port)",
            snap.trusted.join(", "),
            snap.trusted_reserve
        );
    }
    let _ = writeln!(
        out,
        "\n{:>6} {:>8} {:>12} {:>8} {:>12} {:>10}",
        "PORT", "LIMIT", "ESTABLISHED", "PEAK", "ADMITTED", "REFUSED"
    );
    for r in &snap.ports {
        let mut limit = r.limit.map_or_else(|| "-".to_owned(), |l| l.to_string());
        if let Some(s) = r.per_source_max {
            limit.push_str(&format!(",src{s}"));
        }
        if r.dry_run {
            limit.push_str(" dry");
        }
        let refused = if r.dry_run { format!("({})", r.would_refuse) } else { r.refused.to_string() };
        let _ = writeln!(
            out,
            "{:>6} {:>8} {:>12} {:>8} {:>12} {:>10}",
            r.port, limit, r.established, r.high_watermark, r.admitted, refused
        );
    }
    if snap.ports.is_empty() {
        let _ = writeln!(out, "  (no port has completed a handshake yet, and none is enforced)");
    }
    for r in snap.ports.iter().filter(|r| r.refused > 0 || r.would_refuse > 0 || r.trusted_admitted > 0) {
        let by = if r.dry_run { &r.would_refuse_by } else { &r.refused_by };
        let _ = writeln!(
            out,
            "  port {}: {}port_full {}, source_full {}, source_table_full {}; at the driver (xdp) {}, in the stack (sk_lookup) {}; trusted admitted past a cap {}",
            r.port,
            if r.dry_run { "would refuse: " } else { "refused: " },
            by.port_full,
            by.source_full,
            by.source_table_full,
            r.refused_by.xdp,
            r.refused_by.sk_lookup,
            r.trusted_admitted
        );
    }
    if !snap.top_sources.is_empty() {
        let _ = writeln!(
            out,
            "\nclient groups ({} of {} source-table slots in use; top {}):",
            snap.source_slots_used,
            snap.source_slots,
            snap.top_sources.len()
        );
        let _ = writeln!(out, "{:>6} {:<42} {:>12}", "PORT", "GROUP", "ESTABLISHED");
        for g in &snap.top_sources {
            let _ = writeln!(out, "{:>6} {:<42} {:>12}", g.port, g.group, g.established);
        }
    }
    out.push('\n');
    out.push_str(&daemon_lines(Some(snap), daemon));
    out
}

fn daemon_lines(snap: Option<&Snapshot>, daemon: &DaemonView) -> String {
    let mut out = String::new();
    match daemon {
        DaemonView::Running(status) => {
            let _ = writeln!(
                out,
                "daemon running: pid {}, version {}",
                status["pid"],
                status["version"].as_str().unwrap_or("?")
            );
            out.push_str(&pools(&status["http"]));
        }
        DaemonView::NotRunning { admin } => {
            let enforcing = snap.is_some_and(|s| s.links.iter().all(|l| l.link_id.is_some()));
            let gate = if enforcing { "; the kernel gate above still enforces" } else { "" };
            let _ = writeln!(out, "daemon not running (nothing answers on {admin}){gate}");
        }
    }
    out
}

/// The HTTP pools line(s) of the table, from the daemon's `/status`.
fn pools(http: &serde_json::Value) -> String {
    let p = &http["pools"];
    if p.is_null() {
        return String::new();
    }
    let n = |k: &str| p[k].as_u64().unwrap_or(0);
    let limit = |k: &str| match n(k) {
        0 => "unlimited".to_owned(),
        l => l.to_string(),
    };
    let mut out = format!(
        "http pools (in use/limit): normal {}/{}, debug {}/{}, web {}/{}, sessions in flight {} (per-session limit {}){}\n",
        n("normal_in_use"),
        n("normal_limit"),
        n("debug_in_use"),
        n("debug_limit"),
        n("web_in_use"),
        limit("web_limit"),
        n("sessions"),
        limit("session_limit"),
        if p["dry_run"] == true { ", DRY RUN" } else { "" },
    );
    if let Some(upstream) = http["upstream"].as_str() {
        out.push_str(&format!("http upstream: {upstream}\n"));
    }
    let b = &http["breaker"];
    if !b.is_null() {
        let next = b["next_probe_in_ms"]
            .as_u64()
            .map(|ms| format!(", next probe in {} s", ms.div_ceil(1000)))
            .unwrap_or_default();
        out.push_str(&format!(
            "breaker: {}{}{}\n",
            breaker_summary(b),
            b["last_trip_unix"].as_u64().map(|t| format!(", last trip at unix {t}")).unwrap_or_default(),
            next,
        ));
    }
    out
}

/// The breaker in one line from `/status`: state (mode), window results,
/// error rate, trips (`dump` and `top` both show it).
pub fn breaker_summary(b: &serde_json::Value) -> String {
    format!(
        "{} ({}), window {} results, error rate {:.1} %, {} trips",
        b["state"].as_str().unwrap_or("?"),
        b["mode"].as_str().unwrap_or("?"),
        b["window_requests"],
        b["error_rate"].as_f64().unwrap_or(0.0) * 100.0,
        b["trips"],
    )
}
