//! `limiter check-config FILE`: validate a file and say what it means: a
//! summary of the limits it sets, then every key of the table with its
//! value, where the value came from, and whether a reload applies it.

use std::{path::Path, process::ExitCode};

use super::{fail_config, out};
use crate::config::{Config, DEBUG_SLOTS, Upstream};

/// Validates `file`; exit status 78 with the error, or the description.
pub fn main(file: &Path) -> ExitCode {
    match Config::load(file) {
        Ok(c) => {
            let mut text = describe(&c);
            text.push_str(&store(&c));
            out(&text)
        }
        Err(e) => fail_config(e),
    }
}

/// What the fleet's store says of itself, when `fleet.store` is set and
/// reachable (a primary? could it evict the fleet's keys?).
fn store(c: &Config) -> String {
    if c.fleet.store.is_none() {
        return String::new();
    }
    let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
        return String::new();
    };
    let lines = rt.block_on(crate::fleet::inspect(&c.fleet));
    lines.iter().map(|l| format!("  STORE              {l}\n")).collect()
}

/// The description `check-config` prints.
pub fn describe(c: &Config) -> String {
    let mut text =
        format!("{}: OK\n", c.source.as_ref().map_or("<config>".into(), |p| p.display().to_string()));
    text.push_str(&summary(c));
    text.push_str(
        "\n  key                                 value                      from       reload   meaning\n",
    );
    for s in c.settings() {
        let from = s.line.map_or_else(|| "default".to_owned(), |l| format!("line {l}"));
        let value = s.value.unwrap_or_else(|| s.unset.to_owned());
        text.push_str(&format!(
            "  {:<35} {:<26} {:<10} {:<8} {}\n",
            s.key,
            value,
            from,
            s.reload.as_str(),
            s.doc
        ));
    }
    text.push_str(&format!("\n  ignored keys       {} (the business runtime's)\n", c.ignored.len()));
    for warning in &c.warnings {
        text.push_str(&format!("  WARNING            {warning}\n"));
    }
    text
}

/// What the limits amount to, part by part.
fn summary(c: &Config) -> String {
    let unlimited = |n: u32| if n == 0 { "unlimited".to_owned() } else { n.to_string() };
    let kernel = if c.kernel.enabled {
        let k = &c.kernel;
        let ports: Vec<String> = k.ports.iter().map(|(p, m)| format!("{p}:{m}")).collect();
        let options: Vec<String> = k
            .port_options
            .iter()
            .map(|(p, o)| {
                let mut parts = Vec::new();
                if o.per_source_max != 0 {
                    parts.push(format!("perSourceMax {}", o.per_source_max));
                }
                if o.dry_run {
                    parts.push("DRY RUN".to_owned());
                }
                format!("{p}: {}", parts.join(", "))
            })
            .collect();
        let trusted: Vec<String> = k.trusted.iter().map(ToString::to_string).collect();
        format!(
            "  kernel.ports       {}\n  kernel.port.*      {}\n  client groups      IPv4 /{}, IPv6 /{}, {} table slots\n  \
             kernel.trusted     {} (reserve {})\n  kernel.xdp         {}\n",
            if ports.is_empty() { "(none: count only)".into() } else { ports.join(", ") },
            if options.is_empty() { "(none)".into() } else { options.join("; ") },
            k.source_prefix_v4,
            k.source_prefix_v6,
            k.source_table_size,
            if trusted.is_empty() { "(none)".into() } else { trusted.join(", ") },
            k.trusted_reserve,
            if k.xdp_interfaces.is_empty() {
                "(no interface: sk_lookup only)".into()
            } else {
                format!("{} ({:?} mode)", k.xdp_interfaces.join(", "), k.xdp_mode)
            },
        )
    } else {
        "  kernel             disabled (kernel.enabled = false)\n".to_owned()
    };
    let http = match &c.http.upstream {
        None => {
            "  http               no proxy (no http.upstream): the kernel gate and the admin listener only\n"
                .to_owned()
        }
        Some(upstream) => format!(
            "  http               listen {}{}{}, upstream {}, {} workers\n  \
             http limits        maxThreads {} -> normal pool {}, /debug/ slots {}; per session {}; web clients {}{}\n  \
             breaker            opens above {} errors over {} ms (at least {} results), probes after {} ms\n",
            c.http.listen,
            if c.http.h2c { " (HTTP/1.1 and h2c)" } else { "" },
            c.http.tls_listen.map_or_else(String::new, |a| format!(", TLS {a} (h2, http/1.1)")),
            match upstream {
                Upstream::At(addr) => addr.as_str(),
                Upstream::Sample => "sample (the built-in demo upstream)",
            },
            c.http.workers,
            c.http.max_threads,
            c.http.normal_limit(),
            DEBUG_SLOTS,
            unlimited(c.http.max_session_connections),
            unlimited(c.http.max_web_connections),
            if c.http.dry_run { " (DRY RUN: counts, refuses nothing)" } else { "" },
            c.breaker.threshold,
            c.breaker.window_ms,
            c.breaker.min_requests,
            c.breaker.sleep_window_ms,
        ),
    };
    format!("{kernel}{http}  admin.listen       {}\n", c.admin.listen)
}
