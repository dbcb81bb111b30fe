//! A page of Prometheus text exposition (format 0.0.4), written by hand:
//! a few families, no registry needed.

use std::fmt::Write as _;

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
