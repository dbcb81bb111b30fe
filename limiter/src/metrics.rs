//! Prometheus text exposition (format 0.0.4), written by hand: a few
//! families, no registry needed.

use std::fmt::Write as _;

use crate::kernel::Snapshot;

/// A page of metric families being written.
#[derive(Default)]
pub struct Page {
    out: String,
}

impl Page {
    /// Starts a family: `# HELP` and `# TYPE` lines.
    pub fn family(&mut self, name: &str, kind: &str, help: &str) -> &mut Self {
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
        self
    }

    /// One sample; `labels` are `(name, value)` pairs, values escaped here.
    pub fn sample(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        value: impl std::fmt::Display,
    ) -> &mut Self {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
        self
    }

    pub fn finish(self) -> String {
        self.out
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// The kernel gate's families.
pub fn kernel(page: &mut Page, snap: &Snapshot) {
    let ports: Vec<(String, &crate::kernel::PortRow)> =
        snap.ports.iter().map(|r| (r.port.to_string(), r)).collect();
    page.family("limiter_kernel_limit", "gauge", "Most established connections allowed on an enforced port.");
    for (port, r) in &ports {
        if let Some(limit) = r.limit {
            page.sample("limiter_kernel_limit", &[("port", port)], limit);
        }
    }
    type Field = fn(&crate::kernel::PortRow) -> u64;
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
            "limiter_kernel_refused_total",
            "counter",
            "Connection attempts refused with a RST because the port was full.",
            |r| r.refused,
        ),
        (
            "limiter_kernel_would_refuse_total",
            "counter",
            "Attempts a dry-run port would have refused.",
            |r| r.would_refuse,
        ),
    ];
    for (name, kind, help, field) in families {
        page.family(name, kind, help);
        for (port, r) in &ports {
            page.sample(name, &[("port", port)], field(r));
        }
    }
    let attached = snap.links.iter().all(|l| l.link_id.is_some());
    page.family(
        "limiter_kernel_gate_attached",
        "gauge",
        "1 while both kernel programs are pinned and attached; 0 after `limiter unload`.",
    )
    .sample("limiter_kernel_gate_attached", &[], u8::from(attached));
    page.family(
        "limiter_kernel_untracked_sockets_total",
        "counter",
        "Established sockets the gate could not mark, so did not count.",
    )
    .sample("limiter_kernel_untracked_sockets_total", &[], snap.untracked_sockets);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_escaped_and_lines_well_formed() {
        let mut page = Page::default();
        page.family("x_total", "counter", "Things.").sample("x_total", &[("a", "q\"b\\"), ("c", "d")], 3);
        assert_eq!(
            page.finish(),
            "# HELP x_total Things.\n# TYPE x_total counter\nx_total{a=\"q\\\"b\\\\\",c=\"d\"} 3\n"
        );
    }
}
