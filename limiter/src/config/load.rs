//! A file into a [`Config`]: the grammar's entries through the key table,
//! the table's defaults for what the file left out, the checks that
//! involve more than one key, and the TLS pair the keys name. (Here, not
//! in `mod.rs`: the key table's setters write into the types `mod.rs`
//! defines, so `mod.rs` does not use the table in turn.)

use std::{collections::BTreeMap, fs, path::Path};

use super::{
    AdminConfig, BreakerConfig, Config, ConfigError, DEBUG_SLOTS, FleetConfig, HttpConfig, KEYS,
    KernelConfig, Upstream, Written, grammar,
    keys::{self, Lookup, Set},
};

impl Default for Config {
    /// The empty file: every key at its table default.
    fn default() -> Self {
        Self::parse("", "<defaults>").expect("the key table's defaults are valid")
    }
}

impl Config {
    /// Reads and validates `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let name = path.display().to_string();
        let text = fs::read_to_string(path)
            .map_err(|e| ConfigError::at(&name, 0, None, None, format!("cannot read the file: {e}")))?;
        let mut config = Self::parse(&text, &name)?;
        config.source = Some(path.to_path_buf());
        Ok(config)
    }

    /// Parses and validates the text of a file called `name`.
    pub fn parse(text: &str, name: &str) -> Result<Self, ConfigError> {
        let mut config = Self {
            source: None,
            kernel: KernelConfig::default(),
            http: HttpConfig::default(),
            breaker: BreakerConfig::default(),
            admin: AdminConfig::default(),
            fleet: FleetConfig::default(),
            ignored: Vec::new(),
            warnings: Vec::new(),
            written: BTreeMap::new(),
        };
        let mut lines: BTreeMap<String, usize> = BTreeMap::new();
        for entry in grammar::entries(text, name)? {
            let err =
                |message| ConfigError::at(name, entry.line, Some(&entry.key), Some(entry.value), message);
            match keys::lookup(&entry.key).map_err(err)? {
                Lookup::Runtime => match keys::retired(&entry.key) {
                    Some(why) => config
                        .warnings
                        .push(format!("{name}:{}: {} is ignored: {why}", entry.line, entry.key)),
                    None => config.ignored.push(entry.key),
                },
                Lookup::Daemon(key, port) => {
                    match (key.set, port) {
                        (Set::Plain(set), _) => set(&mut config, entry.value),
                        (Set::PerPort(set), Some(port)) => set(&mut config, port, entry.value),
                        (Set::PerPort(_), None) => unreachable!("lookup gives per-port keys their port"),
                    }
                    .map_err(err)?;
                    lines.insert(key.name.to_owned(), entry.line);
                    config
                        .written
                        .insert(entry.key, Written { line: entry.line, value: entry.value.to_owned() });
                }
            }
        }
        // What the file left out takes the table's default.
        for key in KEYS.iter().filter(|k| !k.per_port() && !lines.contains_key(k.name)) {
            if let (Some(value), Set::Plain(set)) = (key.default_value(), key.set) {
                set(&mut config, &value).map_err(|message| {
                    ConfigError::at(name, 0, Some(key.name), Some(&value), format!("the default: {message}"))
                })?;
            }
        }
        let blame = |config: &Self, (key, message): (String, String), with_value: bool| {
            let written = config.written.get(&key);
            let value = written.filter(|_| with_value).map(|w| w.value.clone());
            ConfigError::at(name, written.map_or(0, |w| w.line), Some(&key), value.as_deref(), message)
        };
        config.check().map_err(|e| blame(&config, e, false))?;
        config.warn_of_noisy_shedding();
        config.warn_of_a_floor_above_the_ceiling();
        config.warn_of_a_lease_shorter_than_a_request();
        // A file's error names the file and what is wrong with it; the key
        // and its value say where the configuration named it.
        config.load_tls().map_err(|e| blame(&config, e, true))?;
        Ok(config)
    }

    /// Every listener on its own port: every listener binds with
    /// `SO_REUSEPORT` (for the handover), so two of them on one port would
    /// both bind and share its connections at random.
    fn check_listeners_apart(&self) -> Result<(), (String, String)> {
        let listeners = [
            ("http.listen", self.http.upstream.as_ref().map(|_| self.http.listen)),
            ("http.tls.listen", self.http.tls_listen),
            ("admin.listen", Some(self.admin.listen)),
            ("admin.metricsListen", self.admin.metrics_listen),
        ];
        let bound: Vec<(&str, std::net::SocketAddr)> = listeners
            .iter()
            .filter_map(|(k, a)| a.map(|a| (*k, a.0)))
            .filter(|(_, a)| a.port() != 0)
            .collect();
        for (i, (key, a)) in bound.iter().enumerate() {
            for (other, b) in &bound[..i] {
                let overlap = a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified();
                if a.port() == b.port() && overlap {
                    return Err((
                        (*key).into(),
                        format!("{a} takes the port of {other} ({b}); give each listener its own port"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The proxy's own connections to a loopback `http.upstream` all come
    /// from one address: a per-source cap on that port below the proxy's
    /// slots would refuse them at the SYN (502s for everyone, and a
    /// tripped breaker), unless the address is trusted.
    fn check_own_connections(&self) -> Result<(), (String, String)> {
        let Some(Upstream::At(addr)) = &self.http.upstream else { return Ok(()) };
        let Some((host, port)) = addr.rsplit_once(':') else { return Ok(()) };
        let Ok(port) = port.parse::<u16>() else { return Ok(()) };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let ip: std::net::IpAddr = match host {
            "localhost" => std::net::Ipv4Addr::LOCALHOST.into(),
            _ => match host.parse::<std::net::IpAddr>() {
                Ok(ip) if ip.is_loopback() => ip,
                _ => return Ok(()),
            },
        };
        let options = self.kernel.port_options.get(&port).copied().unwrap_or_default();
        let slots = self.http.normal_limit() + DEBUG_SLOTS;
        let (cap, trusted) = (options.per_source_max, self.kernel.trusted.iter().any(|p| p.contains(ip)));
        if !self.kernel.enabled || cap == 0 || cap >= slots || trusted || options.dry_run {
            return Ok(());
        }
        Err((
            format!("kernel.port.{port}.perSourceMax"),
            format!(
                "{cap} is below the proxy's {slots} slots, and every connection the proxy opens to \
                 http.upstream {addr} comes from {ip}: past {cap} in flight the gate would refuse the \
                 proxy's own connections (502s). Add {ip} to kernel.trusted (trusted sources pass \
                 per-source caps), or raise the cap to at least {slots}"
            ),
        ))
    }

    /// Reads and checks the certificate pair the TLS keys name, so that a
    /// bad pair is refused by `check-config`, at start and at reload
    /// alike, and changes nothing.
    fn load_tls(&mut self) -> Result<(), (String, String)> {
        let http = &mut self.http;
        let (cert, key) = match (&http.tls_cert_file, &http.tls_key_file) {
            (Some(cert), Some(key)) => (cert.clone(), key.clone()),
            (None, None) if http.tls_listen.is_some() => {
                return Err((
                    "http.tls.listen".into(),
                    "needs http.tls.certFile and http.tls.keyFile".into(),
                ));
            }
            (None, None) => return Ok(()),
            (Some(_), None) => {
                return Err(("http.tls.certFile".into(), "needs http.tls.keyFile beside it".into()));
            }
            (None, Some(_)) => {
                return Err(("http.tls.keyFile".into(), "needs http.tls.certFile beside it".into()));
            }
        };
        let pair = crate::tls::Pair::load(&cert, &key).map_err(|(blame, message)| {
            let key = match blame {
                crate::tls::Blame::Cert => "http.tls.certFile",
                crate::tls::Blame::Key => "http.tls.keyFile",
            };
            (key.to_owned(), message)
        })?;
        if let Some(warning) = pair.warning(&cert) {
            self.warnings.push(warning);
        }
        if http.tls_listen.is_none() {
            self.warnings.push(
                "http.tls.certFile and http.tls.keyFile are set but http.tls.listen is not: no TLS listener"
                    .into(),
            );
        }
        http.tls = Some(pair);
        Ok(())
    }

    /// Fewer than 80 refusals in the shedding window: a Poisson stream of
    /// refusals at half the rate reaches that many now and then
    /// (`crate::shedding`).
    fn warn_of_noisy_shedding(&mut self) {
        let in_window = self.http.shed_refusal_rate.saturating_mul(self.http.shed_after_ms) / 1000;
        if self.http.shed_at_syn && in_window < 80 {
            self.warnings.push(format!(
                "http.shedRefusalRate × http.shedAfterMs is {in_window} refusals: below about 80, refusals \
                 arriving at random at half the rate will start shedding now and then; raise either"
            ));
        }
    }

    /// An adaptive floor above the static pool: the limit is the pool.
    fn warn_of_a_floor_above_the_ceiling(&mut self) {
        let ceiling = self.http.normal_limit();
        if self.http.adaptive && self.http.adaptive_min_limit > ceiling {
            self.warnings.push(format!(
                "http.adaptive.minLimit = {} is above the static pool (http.maxThreads - 11 = {ceiling}): the \
                 adaptive limit stays at {ceiling}",
                self.http.adaptive_min_limit
            ));
        }
    }

    /// A fleet lease that does not cover every request that may run: a
    /// share admits only requests shorter than a third of the lease
    /// within its trust, so a node cut off from the store (a partition, a
    /// pause) may still have longer ones in flight once the others are
    /// granted its units.
    fn warn_of_a_lease_shorter_than_a_request(&mut self) {
        let (f, http) = (&self.fleet, &self.http);
        let longest = http.upstream_timeout_ms.saturating_add(http.upstream_abandon_ms);
        let covered = crate::lease::covers(std::time::Duration::from_millis(f.lease_ms)).as_millis() as u64;
        if f.store.is_some()
            && (f.max_session_connections > 0 || f.max_web_connections > 0)
            && covered < longest
        {
            self.warnings.push(format!(
                "fleet.leaseMs = {} covers requests shorter than {covered} ms (a third of it), and a request \
                 may run {longest} ms (http.upstreamTimeoutMs {} + http.upstreamAbandonMs {}): a node cut off \
                 from the store may still have longer ones in flight when the others are granted its units, \
                 and the fleet may then hold more than its limit until they end (see \"Why the limit holds\")",
                f.lease_ms, http.upstream_timeout_ms, http.upstream_abandon_ms
            ));
        }
    }

    /// The fleet's limits need a store, a session limit the shared hash
    /// key, and the store's timeout fits well inside a lease.
    fn check_fleet(&self) -> Result<(), (String, String)> {
        let f = &self.fleet;
        for (key, limit) in [
            ("fleet.maxSessionConnections", f.max_session_connections),
            ("fleet.maxWebConnections", f.max_web_connections),
        ] {
            if limit > 0 && f.store.is_none() {
                return Err((key.into(), "needs fleet.store (where the fleet's counts live)".into()));
            }
        }
        if f.max_session_connections > 0 && f.hash_key.is_none() {
            return Err((
                "fleet.maxSessionConnections".into(),
                "needs fleet.hashKeyFile: the store keys sessions by a hash every node must compute alike \
                 (a file of at least 16 random characters, the same on every node)"
                    .into(),
            ));
        }
        if f.timeout_ms * 3 > f.lease_ms {
            return Err((
                "fleet.timeoutMs".into(),
                format!("{} ms is more than a third of fleet.leaseMs ({} ms)", f.timeout_ms, f.lease_ms),
            ));
        }
        if f.store.is_some() && self.http.upstream.is_none() {
            return Err(("fleet.store".into(), "needs http.upstream (fleet limits are the proxy's)".into()));
        }
        Ok(())
    }

    /// Checks that involve more than one key; names the key to blame.
    fn check(&self) -> Result<(), (String, String)> {
        for (port, options) in &self.kernel.port_options {
            if options.dry_run && options.per_source_max == 0 && !self.kernel.ports.contains_key(port) {
                return Err((
                    format!("kernel.port.{port}.dryRun"),
                    format!(
                        "port {port} has no limit to dry-run (set it in kernel.ports or kernel.port.{port}.perSourceMax)"
                    ),
                ));
            }
        }
        let b = &self.breaker;
        if b.bucket_ms > b.window_ms {
            return Err((
                "breaker.bucketMs".into(),
                format!("{} ms buckets do not fit in a {} ms window", b.bucket_ms, b.window_ms),
            ));
        }
        if !b.window_ms.is_multiple_of(b.bucket_ms) {
            return Err((
                "breaker.windowMs".into(),
                format!("{} ms is not a whole number of {} ms buckets", b.window_ms, b.bucket_ms),
            ));
        }
        if b.window_ms / b.bucket_ms > 3600 {
            return Err(("breaker.windowMs".into(), "more than 3600 buckets; use larger buckets".into()));
        }
        self.check_listeners_apart()?;
        if self.http.tls_listen.is_some() && self.http.upstream.is_none() {
            return Err((
                "http.tls.listen".into(),
                "needs http.upstream (without it there is no proxy)".into(),
            ));
        }
        if self.http.shed_at_syn && self.http.upstream.is_none() {
            return Err((
                "http.shedAtSyn".into(),
                "needs http.upstream (without it there is no proxy to shed for)".into(),
            ));
        }
        if self.http.shed_at_syn && !self.kernel.enabled {
            return Err((
                "http.shedAtSyn".into(),
                "needs kernel.enabled = true (the kernel gate refuses the SYNs)".into(),
            ));
        }
        self.check_own_connections()?;
        self.check_fleet()?;
        let admin = self.admin.listen.0.ip();
        if !admin.is_loopback() && self.admin.token_file.is_none() {
            return Err((
                "admin.listen".into(),
                format!(
                    "{} is reachable beyond this host and admin.tokenFile is not set: anyone who reaches it \
                     could reload, open the breaker or read /status; set admin.tokenFile, or listen on loopback",
                    self.admin.listen
                ),
            ));
        }
        if !self.kernel.enabled && self.http.upstream.is_none() {
            return Err((
                "kernel.enabled".into(),
                "false, and no http.upstream: nothing to run (set http.upstream, or enable the kernel gate)"
                    .into(),
            ));
        }
        Ok(())
    }
}
