//! Every key as a configuration has it: what `check-config` lists.

use super::{Config, KEYS, Reload, keys};

/// One key as a configuration has it, for `check-config`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Setting {
    /// The concrete key (`kernel.port.8080.perSourceMax`).
    pub key: String,
    /// As the file wrote it, or the default (`None`: unset).
    pub value: Option<String>,
    /// The line that set it; `None`: the default.
    pub line: Option<usize>,
    pub reload: Reload,
    pub doc: &'static str,
    /// What an unset value means (`(none)`, `the daemon's own`, ...).
    pub unset: &'static str,
}

impl Config {
    /// Every key of the table as this configuration has it, in the table's
    /// order (per-port keys once per port the file names).
    pub fn settings(&self) -> Vec<Setting> {
        let mut out = Vec::new();
        for key in KEYS {
            let mut push = |name: String| {
                let written = self.written.get(&name);
                out.push(Setting {
                    value: written.map(|w| w.value.clone()).or_else(|| key.default_value()),
                    line: written.map(|w| w.line),
                    key: name,
                    reload: key.reload,
                    doc: key.doc,
                    unset: match key.default {
                        keys::DefaultValue::Unset(text) => text,
                        _ => "(none)",
                    },
                });
            };
            if key.per_port() {
                for port in self.kernel.port_options.keys() {
                    let name = keys::concrete(key, Some(*port));
                    if self.written.contains_key(&name) {
                        push(name);
                    }
                }
            } else {
                push(key.name.to_owned());
            }
        }
        out
    }
}
