//! `limiter dump`: what the running daemon reports on its admin listener
//! (its reading of the gate costs what changed since its last), or says
//! "daemon not running" and reads the pinned maps itself (a whole read of
//! the source table).

use std::{fmt::Write as _, path::Path, process::ExitCode};

use limiter_common::{path, reason};

use super::{Access, DaemonView, fail, out};
use crate::{
    admin::api::HttpStatus,
    kernel::{Gate, KernelError, Snapshot},
    proxy::Reason,
};

/// `limiter dump [--json]`.
pub fn main(target: &Access, json: bool) -> ExitCode {
    let daemon = DaemonView::fetch(&target.admin);
    // The daemon's reading of this gate, when it serves it.
    let theirs = match &daemon {
        DaemonView::Running(status) => {
            status.kernel.as_ref().and_then(|k| k.gate.clone()).filter(|g| g.pin_path == target.pin_path)
        }
        _ => None,
    };
    let snap = match theirs.map_or_else(|| snapshot(&target.pin_path), Ok) {
        Ok(s) => Some(s),
        // A daemon running without the gate still has pools to show.
        Err(KernelError::NotLoaded(_)) if matches!(daemon, DaemonView::Running(_)) => None,
        Err(e) => return fail(e),
    };
    let text = if json {
        format!("{:#}\n", self::json(snap.as_ref(), &daemon))
    } else {
        table(snap.as_ref(), &daemon)
    };
    out(&text)
}

/// Reads the pins at `pin_dir`.
pub fn snapshot(pin_dir: &Path) -> Result<Snapshot, KernelError> {
    Gate::open(pin_dir)?.snapshot()
}

/// The JSON document `dump --json` prints.
pub fn json(snap: Option<&Snapshot>, daemon: &DaemonView) -> serde_json::Value {
    let daemon = match daemon {
        DaemonView::Running(status) => {
            // The gate's maps are already here, read from the pins.
            let mut status = status.as_ref().clone();
            if let Some(kernel) = &mut status.kernel {
                kernel.gate = None;
            }
            serde_json::json!({ "running": true, "status": status })
        }
        DaemonView::NotRunning { admin } => serde_json::json!({ "running": false, "admin": admin }),
        DaemonView::Unreadable { admin, error } => {
            serde_json::json!({ "running": true, "admin": admin, "unreadable": error })
        }
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
        match (link.link_id, link.program_id, &link.unreadable) {
            (Some(l), Some(p), _) => {
                let _ = writeln!(out, "  {:<15} link {l}, program {p}", link.pin);
            }
            (_, _, Some(why)) => {
                let _ = writeln!(out, "  {:<15} cannot be read ({why})", link.pin);
            }
            _ => {
                let _ = writeln!(out, "  {:<15} NOT PINNED (not enforcing)", link.pin);
            }
        }
    }
    if snap.untracked_sockets > 0 {
        let _ = writeln!(
            out,
            "  connections not counted (connection table full: raise kernel.connectionTableSize): {}",
            snap.untracked_sockets
        );
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
            "  port {}: {}{}; {}; trusted admitted past a cap or shedding {}",
            r.port,
            if r.dry_run { "would refuse: " } else { "refused: " },
            by_reason(&by.by_reason),
            by_path(&r.refused_by.by_path),
            r.trusted_admitted
        );
    }
    for r in &snap.ports {
        if let Some(s) = &r.shedding {
            let state = if s.expires_in_ms == 0 {
                "lapsed (its daemon stopped renewing it): not shedding".to_owned()
            } else {
                format!(
                    "{} new connections at the SYN, lease {} ms left, one in {} admitted as a probe",
                    if s.dry_run { "would shed (dry-run)" } else { "SHEDDING" },
                    s.expires_in_ms,
                    s.probe_one_in
                )
            };
            let _ = writeln!(
                out,
                "  port {}: shedding flag {state}; shed so far {}, would shed {}, probes {}",
                r.port,
                r.refused_by.by_reason[reason::SHED],
                r.would_refuse_by.by_reason[reason::SHED],
                r.shed_probes
            );
        }
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

/// `port_full 7, source_full 1, …`: a row's counts by reason, named by
/// the table.
fn by_reason(counts: &[u64; reason::REPORTED]) -> String {
    reason::ALL.iter().zip(counts).map(|(r, n)| format!("{} {n}", r.name)).collect::<Vec<_>>().join(", ")
}

/// `in the stack (sk_lookup) 11, at the driver (xdp) 3`: a row's counts by
/// path, named by the table.
fn by_path(counts: &[u64; path::COUNT]) -> String {
    path::ALL
        .iter()
        .zip(counts)
        .map(|(p, n)| format!("{} ({}) {n}", p.doc, p.name))
        .collect::<Vec<_>>()
        .join(", ")
}

fn daemon_lines(snap: Option<&Snapshot>, daemon: &DaemonView) -> String {
    let mut out = String::new();
    match daemon {
        DaemonView::Running(status) => {
            let _ = writeln!(out, "daemon running: pid {}, version {}", status.pid, status.version);
            match &status.http {
                Some(http) => out.push_str(&pools(http)),
                None => out.push_str("no HTTP proxy (no http.upstream): the kernel gate alone\n"),
            }
        }
        DaemonView::Unreadable { admin, error } => {
            let _ =
                writeln!(out, "something answers on {admin}, but not with this version's /status ({error})");
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
fn pools(http: &HttpStatus) -> String {
    let p = &http.pools;
    let limit = |n: u32| if n == 0 { "unlimited".to_owned() } else { n.to_string() };
    let mut out = format!(
        "http pools (in use/limit): normal {}/{}, debug {}/{}, web {}/{}, sessions in flight {} (per-session limit {}){}\n",
        p.normal_in_use,
        p.normal_limit,
        p.debug_in_use,
        p.debug_limit,
        p.web_in_use,
        limit(p.web_limit),
        p.sessions,
        limit(p.session_limit),
        if p.dry_run { ", DRY RUN" } else { "" },
    );
    out.push_str(&format!(
        "http buffers: {} bytes held, {} bodies arriving without a permit, {} refused {}\n",
        http.buffered_bytes,
        http.bodies_receiving,
        http.refused_buffer_full,
        Reason::BufferFull.as_str()
    ));
    out.push_str(&format!(
        "http upstream: {} ({}/{} connections, {} refused upstream_full)\n",
        http.upstream, http.upstream_connections, http.upstream_connection_limit, http.refused_upstream_full
    ));
    if let Some(line) = p.adaptive_summary() {
        out.push_str(&format!("http {line}\n"));
    }
    if let Some(s) = &http.shedding {
        out.push_str(&format!("shedding at the SYN: {}\n", shed_summary(s)));
    }
    if let Some(f) = &http.fleet {
        for line in fleet_lines(f) {
            out.push_str(&line);
            out.push('\n');
        }
    }
    out.push_str(&format!("http requests by protocol: {}\n", http.protocols(|_, n| n.to_string())));
    let b = &http.breaker;
    let next =
        b.next_probe_in_ms.map(|ms| format!(", next probe in {} s", ms.div_ceil(1000))).unwrap_or_default();
    out.push_str(&format!(
        "breaker: {}{}{}\n",
        breaker_summary(b),
        b.last_trip_unix.map(|t| format!(", last trip at unix {t}")).unwrap_or_default(),
        next,
    ));
    out
}

/// The breaker in one line: state (mode), window results, error rate,
/// trips (`dump` and `top` both show it).
pub fn breaker_summary(b: &crate::breaker::Snapshot) -> String {
    format!(
        "{} ({}), window {} results, error rate {:.1} %, {} trips",
        b.state.as_str(),
        b.mode.as_str(),
        b.window_requests,
        b.error_rate * 100.0,
        b.trips,
    )
}

/// The fleet's limits in two lines, for `dump` and `top`: the store and
/// what this node holds, then the busiest sessions by their fleet-wide
/// count (by the start of their hashed key: no token is ever shown).
pub fn fleet_lines(f: &crate::fleet::Snapshot) -> [String; 2] {
    let limit = |n: u32| if n == 0 { "none".to_owned() } else { n.to_string() };
    let first = format!(
        "fleet {} ({}): store {}{}, onStoreDown {}; limits session {} web {}; in flight here session {} web {}; \
         shares here session {} web {}; web shares across the fleet {}; nodes {}; {} claims, {} releases, \
         {} store failures, {} admitted unpublished, {} within the safe share, {} lapsed",
        f.name,
        f.store,
        if f.up { "UP" } else { "DOWN" },
        if f.quiet_groups > 0 { format!(" (quiet: {} groups)", f.quiet_groups) } else { String::new() },
        f.on_store_down,
        limit(f.session_limit),
        limit(f.web_limit),
        f.held_session,
        f.held_web,
        f.share_session,
        f.share_web,
        f.web_fleet.map_or_else(|| "unknown".to_owned(), |n| n.to_string()),
        f.nodes.map_or_else(|| "unknown".to_owned(), |n| n.to_string()),
        f.claims,
        f.releases,
        f.store_failures,
        f.admitted_unpublished,
        f.admitted_safe,
        f.lease_lapsed,
    );
    let busiest: Vec<String> =
        f.busiest_sessions.iter().map(|s| format!("{} {}/{}/{}", s.key, s.here, s.share, s.fleet)).collect();
    let second = format!(
        "fleet sessions here: {} (busiest, hashed key in flight here/share here/fleet's shares: {})",
        f.tracked_sessions,
        if busiest.is_empty() { "none".to_owned() } else { busiest.join(", ") }
    );
    [first, second]
}

/// One line on the coupled shedding's controller, for `dump` and `top`.
pub fn shed_summary(s: &crate::admin::api::ShedStatus) -> String {
    let ports: Vec<String> = s.ports.iter().map(ToString::to_string).collect();
    let state = match (s.enabled, s.active) {
        (false, _) => "off (http.shedAtSyn = false)".to_owned(),
        (true, false) => "armed, not shedding".to_owned(),
        (true, true) => format!(
            "{} new connections to port {} since unix ms {}",
            if s.dry_run { "WOULD SHED (dry-run)" } else { "SHEDDING" },
            ports.join(", "),
            s.since_unix_ms.unwrap_or(0)
        ),
    };
    format!("{state}; started {} times, stopped {}", s.started, s.stopped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_line_names_every_reason_and_path_of_the_tables() {
        let snap = crate::kernel::every_refusal();
        let text = table(
            Some(&snap),
            &DaemonView::NotRunning { admin: "admin.socket /run/limiter/admin.sock".into() },
        );
        let row = &snap.ports[0];
        let line = text.lines().find(|l| l.starts_with("  port 8080: would refuse: ")).unwrap();
        for (r, n) in reason::ALL.iter().zip(row.would_refuse_by.by_reason) {
            let word = format!("{} {n}", r.name);
            assert!(line.contains(&format!("{word},")) || line.contains(&format!("{word};")), "{line}");
        }
        for (p, n) in path::ALL.iter().zip(row.refused_by.by_path) {
            assert!(line.contains(&format!("{} ({}) {n}", p.doc, p.name)), "{line}");
        }
    }
}
