//! The kernel gate's families, from a snapshot of its maps.

use limiter_common::{Named, path, reason};

use super::Page;
use crate::kernel::{Attachment, PortRow, Snapshot};

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
    page.family("limiter_kernel_refused_total", "counter", &refused_help());
    for (port, r) in &ports {
        for (p, path) in path::ALL.iter().enumerate() {
            for (q, reason) in reason::ALL.iter().enumerate() {
                let n = r.refused_matrix[p][q];
                // Zero series only for the classic reason, so a scrape of
                // an idle port still shows the family.
                if n > 0 || q == reason::PORT {
                    page.sample(
                        "limiter_kernel_refused_total",
                        &[("port", port), ("reason", reason.name), ("path", path.name)],
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
        let by = &r.would_refuse_by.by_reason;
        // The limits' reasons on a dry-run port, shedding's where it
        // would shed (or has).
        for (q, reason) in reason::ALL.iter().enumerate() {
            let shown = if q < reason::COUNT {
                r.dry_run
            } else {
                by[q] > 0 || r.shedding.as_ref().is_some_and(|s| s.dry_run)
            };
            if shown {
                page.sample(
                    "limiter_kernel_would_refuse_total",
                    &[("port", port), ("reason", reason.name)],
                    by[q],
                );
            }
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
    page.family(
        "limiter_kernel_gate_attached",
        "gauge",
        "1 while the counting and refusing programs are pinned and attached; 0 after `limiter unload`; no sample while a pin cannot be read.",
    );
    match Attachment::of(&snap.links) {
        Attachment::Attached => {
            page.sample("limiter_kernel_gate_attached", &[], 1u8);
        }
        Attachment::Detached => {
            page.sample("limiter_kernel_gate_attached", &[], 0u8);
        }
        Attachment::Unknown(_) => {}
    }
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
        "Established sockets the gate could not count (its connection table had no room, or their state \
         callbacks could not be asked for): neither counted nor, at their close, decremented.",
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
        "limiter_kernel_connection_slots",
        "gauge",
        "Entries of the connection table: the most connections the gate counts at once \
         (kernel.connectionTableSize).",
    )
    .sample("limiter_kernel_connection_slots", &[], snap.connection_slots);
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

/// `limiter_kernel_refused_total`'s help: its labels' values and what
/// each means, from the tables.
fn refused_help() -> String {
    let list = |table: &[Named]| {
        table.iter().map(|n| format!("{}: {}", n.name, n.doc)).collect::<Vec<_>>().join("; ")
    };
    format!(
        "Connection attempts refused with a RST, by reason ({}) and path ({}).",
        list(&reason::ALL),
        list(&path::ALL)
    )
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// The values `label` takes in `family`'s samples.
    fn values(page: &str, family: &str, label: &str) -> BTreeSet<String> {
        super::super::page::label_values(page, family, label).into_iter().collect()
    }

    #[test]
    fn the_refusal_families_label_and_explain_every_name_of_the_tables() {
        let mut page = Page::default();
        write(&mut page, &crate::kernel::every_refusal());
        let page = page.finish();
        let names = |table: &[Named]| table.iter().map(|n| n.name.to_owned()).collect::<BTreeSet<_>>();
        assert_eq!(values(&page, "limiter_kernel_refused_total", "reason"), names(&reason::ALL));
        assert_eq!(values(&page, "limiter_kernel_refused_total", "path"), names(&path::ALL));
        assert_eq!(values(&page, "limiter_kernel_would_refuse_total", "reason"), names(&reason::ALL));
        let help = page.lines().find(|l| l.starts_with("# HELP limiter_kernel_refused_total ")).unwrap();
        for n in reason::ALL.iter().chain(&path::ALL) {
            assert!(help.contains(&format!("{}: {}", n.name, n.doc)), "{help}");
        }
    }
}
