//! A page of Prometheus text exposition (format 0.0.4), written by hand:
//! a few families, no registry needed.

use std::fmt::Write as _;

use crate::histogram::Histogram;

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

    /// A histogram family: `_bucket{le}` (cumulative), `_sum`, `_count`.
    pub fn histogram(&mut self, name: &str, help: &str, h: &Histogram) -> &mut Self {
        self.family(name, "histogram", help);
        let bucket = format!("{name}_bucket");
        let mut count = 0;
        for (bound, cumulative) in h.cumulative() {
            let le = bound.map_or("+Inf".to_owned(), |b| b.to_string());
            self.sample(&bucket, &[("le", &le)], cumulative);
            count = cumulative;
        }
        self.sample(&format!("{name}_sum"), &[], h.sum_seconds());
        self.sample(&format!("{name}_count"), &[], count)
    }

    pub fn finish(self) -> String {
        self.out
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// The values `label` takes in `family`'s samples of a rendered page, in
/// page order (for the tests that hold labels to their tables).
#[cfg(test)]
pub(super) fn label_values(page: &str, family: &str, label: &str) -> Vec<String> {
    let key = format!("{label}=\"");
    page.lines()
        .filter(|l| l.starts_with(&format!("{family}{{")))
        .filter_map(|l| Some(l.split(&key).nth(1)?.split('"').next()?.to_owned()))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn histograms_are_written_cumulative_with_sum_and_count() {
        let h = Histogram::default();
        for us in [10, 40, 40, 900, 3000] {
            h.record(Duration::from_micros(us));
        }
        let mut page = Page::default();
        page.histogram("t_seconds", "T.", &h);
        let text = page.finish();
        assert!(text.starts_with("# HELP t_seconds T.\n# TYPE t_seconds histogram\n"), "{text}");
        assert!(text.contains("t_seconds_bucket{le=\"0.000025\"} 1\n"), "{text}");
        assert!(text.contains("t_seconds_bucket{le=\"0.00005\"} 3\n"), "{text}");
        assert!(text.contains("t_seconds_bucket{le=\"0.001\"} 4\n"), "{text}");
        assert!(text.contains("t_seconds_bucket{le=\"+Inf\"} 5\n"), "{text}");
        assert!(text.contains("t_seconds_sum 0.00399\n"), "{text}");
        assert!(text.contains("t_seconds_count 5\n"), "{text}");
    }

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
