//! The kernel gate's families, from a snapshot of its maps.

use super::Page;
use crate::kernel::{PortRow, Snapshot};

/// Writes the kernel gate's families.
pub fn write(page: &mut Page, snap: &Snapshot) {
    let ports: Vec<(String, &PortRow)> = snap.ports.iter().map(|r| (r.port.to_string(), r)).collect();
    page.family("limiter_kernel_limit", "gauge", "Most established connections allowed on an enforced port.");
    for (port, r) in &ports {
        if let Some(limit) = r.limit {
            page.sample("limiter_kernel_limit", &[("port", port)], limit);
        }
    }
    page.family(
        "limiter_kernel_per_source_limit",
        "gauge",
        "Most established connections from one client group on a port with a per-source cap.",
    );
    for (port, r) in &ports {
        if let Some(limit) = r.per_source_max {
            page.sample("limiter_kernel_per_source_limit", &[("port", port)], limit);
        }
    }
    type Field = fn(&PortRow) -> u64;
    let families: [(&str, &str, &str, Field); 5] = [
        (
            "limiter_kernel_established",
            "gauge",
            "Established server-side TCP connections on a local port.",
            |r| r.established,
        ),
        (
            "limiter_kernel_high_watermark",
            "gauge",
            "Highest established count seen on a local port since the gate was loaded.",
            |r| r.high_watermark,
        ),
        (
            "limiter_kernel_admitted_total",
            "counter",
            "Connections established (handshakes completed) on a local port.",
            |r| r.admitted,
        ),
        (
            "limiter_kernel_trusted_admitted_total",
            "counter",
            "Attempts from trusted prefixes admitted past a full port or a per-source cap.",
            |r| r.trusted_admitted,
        ),
        (
            "limiter_kernel_sources",
            "gauge",
            "Client groups with established connections on a port with a per-source cap.",
            |r| r.sources,
        ),
    ];
    for (name, kind, help, field) in families {
        page.family(name, kind, help);
        for (port, r) in &ports {
            page.sample(name, &[("port", port)], field(r));
        }
    }
    page.family(
        "limiter_kernel_refused_total",
        "counter",
        "Connection attempts refused with a RST, by reason (port_full, source_full, \
         source_table_full; shed: the HTTP pools were saturated) and path (xdp: at the driver; \
         sk_lookup: in the stack).",
    );
    for (port, r) in &ports {
        for (p, path) in limiter_common::path::NAMES.iter().enumerate() {
            for (q, reason) in limiter_common::reason::NAMES.iter().enumerate() {
                let n = r.refused_matrix[p][q];
                // Zero series only for the classic reason, so a scrape of
                // an idle port still shows the family.
                if n > 0 || q == limiter_common::reason::PORT {
                    page.sample(
                        "limiter_kernel_refused_total",
                        &[("port", port), ("reason", reason), ("path", path)],
                        n,
                    );
                }
            }
        }
    }
    page.family(
        "limiter_kernel_would_refuse_total",
        "counter",
        "Attempts a dry-run port (or dry-run shedding) would have refused, by reason.",
    );
    for (port, r) in &ports {
        if r.dry_run {
            for (reason, n) in [
                ("port_full", r.would_refuse_by.port_full),
                ("source_full", r.would_refuse_by.source_full),
                ("source_table_full", r.would_refuse_by.source_table_full),
            ] {
                page.sample("limiter_kernel_would_refuse_total", &[("port", port), ("reason", reason)], n);
            }
        }
        if r.would_refuse_by.shed > 0 || r.shedding.as_ref().is_some_and(|s| s.dry_run) {
            page.sample(
                "limiter_kernel_would_refuse_total",
                &[("port", port), ("reason", "shed")],
                r.would_refuse_by.shed,
            );
        }
    }
    page.family(
        "limiter_kernel_shedding",
        "gauge",
        "1 while the port's shedding flag is raised and within its lease (new connections shed at the SYN).",
    );
    for (port, r) in &ports {
        if let Some(s) = &r.shedding {
            page.sample("limiter_kernel_shedding", &[("port", port)], u8::from(s.expires_in_ms > 0));
        }
    }
    page.family(
        "limiter_kernel_shed_probes_total",
        "counter",
        "Connection attempts admitted as probes while their port was shedding.",
    );
    for (port, r) in &ports {
        if r.shed_probes > 0 || r.shedding.is_some() {
            page.sample("limiter_kernel_shed_probes_total", &[("port", port)], r.shed_probes);
        }
    }
    let fixed = ["link_sock_ops", "link_sk_lookup"];
    let attached = snap.links.iter().filter(|l| fixed.contains(&l.pin.as_str())).all(|l| l.link_id.is_some());
    page.family(
        "limiter_kernel_gate_attached",
        "gauge",
        "1 while the counting and refusing programs are pinned and attached; 0 after `limiter unload`.",
    )
    .sample("limiter_kernel_gate_attached", &[], u8::from(attached));
    page.family(
        "limiter_kernel_xdp_attached",
        "gauge",
        "1 for each interface whose XDP refusal is pinned and attached.",
    );
    for link in &snap.links {
        if let Some(interface) = link.pin.strip_prefix(crate::kernel::LINK_XDP_PREFIX) {
            page.sample(
                "limiter_kernel_xdp_attached",
                &[("interface", interface)],
                u8::from(link.link_id.is_some()),
            );
        }
    }
    page.family(
        "limiter_kernel_untracked_sockets_total",
        "counter",
        "Established sockets the gate could not mark, so did not count.",
    )
    .sample("limiter_kernel_untracked_sockets_total", &[], snap.untracked_sockets);
    page.family(
        "limiter_kernel_untracked_sources_total",
        "counter",
        "Connections counted on their port but not for their client group: the source table had no slot left.",
    )
    .sample("limiter_kernel_untracked_sources_total", &[], snap.untracked_sources);
    page.family(
        "limiter_kernel_preexisting_counted_total",
        "counter",
        "Connections older than the gate, counted by the start-up walk.",
    )
    .sample("limiter_kernel_preexisting_counted_total", &[], snap.walked);
    page.family(
        "limiter_kernel_source_slots",
        "gauge",
        "Slots in the source table (kernel.sourceTableSize).",
    )
    .sample("limiter_kernel_source_slots", &[], snap.source_slots);
    page.family(
        "limiter_kernel_source_slots_used",
        "gauge",
        "Source-table slots counting a client group now.",
    )
    .sample("limiter_kernel_source_slots_used", &[], snap.source_slots_used);
}
