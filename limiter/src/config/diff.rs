//! What a reload changes: the keys as the files wrote them, and the
//! restart keys whose value differs.

use std::collections::BTreeMap;

use super::{Config, KEYS, Key, Reload, Written, keys};

impl Config {
    /// The value of a plain key here: as written, else its default
    /// (`None`: unset).
    fn value_of(&self, key: &Key) -> Option<String> {
        self.written.get(key.name).map(|w| w.value.clone()).or_else(|| key.default_value())
    }

    /// What changed from `self` to `new`, key by key as the files wrote
    /// them (`key: old -> new`; a key left out means its default). A token
    /// file whose contents changed is named, its contents never shown.
    pub fn changes_to(&self, new: &Config) -> Vec<String> {
        let mut out = Vec::new();
        let keys: std::collections::BTreeSet<&String> =
            self.written.keys().chain(new.written.keys()).collect();
        for key in keys {
            let (a, b) = (self.written.get(key), new.written.get(key));
            if a.map(|w| &w.value) != b.map(|w| &w.value) {
                let show =
                    |v: Option<&Written>| v.map_or_else(|| "(default)".to_owned(), |w| w.value.clone());
                out.push(format!("{key}: {} -> {}", show(a), show(b)));
            }
        }
        if self.admin.token_file == new.admin.token_file && self.admin.token != new.admin.token {
            out.push("admin.tokenFile: (contents changed)".into());
        }
        out.extend(self.secret_changes(new).map(|key| format!("{key}: (contents changed)")));
        let (a, b) = (&self.http, &new.http);
        if (&a.tls_cert_file, &a.tls_key_file) == (&b.tls_cert_file, &b.tls_key_file) && a.tls != b.tls {
            out.push("http.tls.certFile/keyFile: (contents changed: new handshakes use the new pair)".into());
        }
        out
    }

    /// The restart-only keys whose value differs in `new` (a reload that
    /// finds any applies nothing).
    pub fn restart_changes(&self, new: &Config) -> Vec<&'static str> {
        KEYS.iter()
            .filter(|k| k.reload == Reload::Restart)
            .filter(|k| {
                if k.per_port() {
                    // Every port's value as written (an unwritten one is
                    // the default on both sides).
                    self.per_port_values(k) != new.per_port_values(k)
                } else {
                    self.value_of(k) != new.value_of(k)
                }
            })
            .map(|k| k.name)
            .chain(self.secret_changes(new))
            .collect()
    }

    /// Restart-only secret files whose contents changed under the same
    /// path (the fleet's: its connection and its hash were made with them).
    fn secret_changes(&self, new: &Config) -> impl Iterator<Item = &'static str> {
        let (a, b) = (&self.fleet, &new.fleet);
        let password = a.password_file == b.password_file && a.password != b.password;
        let hash_key = a.hash_key_file == b.hash_key_file && a.hash_key != b.hash_key;
        [password.then_some("fleet.passwordFile"), hash_key.then_some("fleet.hashKeyFile")]
            .into_iter()
            .flatten()
    }

    /// The written values of a per-port key, by concrete key.
    fn per_port_values(&self, key: &Key) -> BTreeMap<String, String> {
        self.kernel
            .port_options
            .keys()
            .map(|p| keys::concrete(key, Some(*p)))
            .filter_map(|name| self.written.get(&name).map(|w| (name, w.value.clone())))
            .collect()
    }
}
