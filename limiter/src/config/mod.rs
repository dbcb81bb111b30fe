//! The configuration file and what it means.
//!
//! - [`grammar`]: lines, sections, comments, no key twice;
//! - [`keys`]: the one table of the daemon's keys (name, default, live or
//!   restart, doc, parser), from which parsing, the owned-key check, the
//!   defaults, `check-config`'s description, the reload diff and the
//!   restart-only refusal all come;
//! - [`values`]: the parsers of the values;
//! - `error`, `listing`, `diff`: a bad file's error, every key as a
//!   configuration has it (`check-config`), what a reload changes;
//! - this module: the typed [`Config`] the rest of the daemon reads.
//!
//! The daemon owns the keys of the table: `http.maxThreads`,
//! `http.maxSessionConnections`, `http.maxWebConnections`, `http.listen`,
//! `http.upstream`, the other `http.*` keys it lists, and every key under
//! `kernel.`, `breaker.` and `admin.`. Unknown keys in those three
//! namespaces are errors (a typo must not silently disable a limit); other
//! `http.*` keys and other sections belong to the business runtime and are
//! ignored, so the runtime's own `config.ini` works unchanged.
//!
//! Parsing is all-or-nothing: a bad file yields one error naming the file,
//! line and key, and no partial configuration.

mod diff;
mod error;
mod grammar;
pub mod keys;
mod listing;
mod values;

use std::{
    collections::BTreeMap,
    fmt, fs,
    net::SocketAddr,
    path::{Path, PathBuf},
};

use self::keys::{Lookup, Set};
pub use self::{
    error::ConfigError,
    keys::{KEYS, Key, Reload},
    listing::Setting,
};

/// Threads the runtime keeps for its acceptor/selector/housekeeping.
pub const SYSTEM_THREADS: u32 = 8;
/// Slots reserved for `/debug/` requests.
pub const DEBUG_SLOTS: u32 = 3;
/// The smallest `http.maxThreads` that leaves one normal slot.
pub const MIN_MAX_THREADS: u32 = SYSTEM_THREADS + DEBUG_SLOTS + 1;

/// A listening address (a newtype so that the configuration can have a
/// `Default` before the key table fills it in).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Addr(pub SocketAddr);

impl Default for Addr {
    fn default() -> Self {
        Self(SocketAddr::from(([127, 0, 0, 1], 0)))
    }
}

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Where the proxy sends requests (`http.upstream`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Upstream {
    /// `host:port` of the business application.
    At(String),
    /// `sample`: the built-in demo upstream (`GET /slow?ms=N`).
    Sample,
}

/// A key as the file wrote it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Written {
    pub line: usize,
    pub value: String,
}

/// Everything the daemon reads from its file.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// The file this came from (for messages), if any.
    pub source: Option<PathBuf>,
    pub kernel: KernelConfig,
    pub http: HttpConfig,
    pub breaker: BreakerConfig,
    pub admin: AdminConfig,
    /// Keys the file had that belong to the business runtime.
    pub ignored: Vec<String>,
    /// What loads but an operator should know (an expired certificate).
    pub warnings: Vec<String>,
    /// The daemon's keys as the file wrote them, with their lines
    /// (reloads report what changed from these).
    pub written: BTreeMap<String, Written>,
}

/// `kernel.*`: the eBPF gate.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelConfig {
    /// Load the kernel gate (`kernel.enabled`); `false` runs the HTTP
    /// proxy alone, without privileges for eBPF.
    pub enabled: bool,
    /// Enforced ports → most established connections (`kernel.ports`).
    pub ports: BTreeMap<u16, u32>,
    /// Directory on bpffs holding the gate's maps and links (`kernel.pinPath`).
    pub pin_path: PathBuf,
    /// cgroup v2 directory whose sockets are counted (`kernel.cgroup`);
    /// `None`: the root of the cgroup v2 mount.
    pub cgroup: Option<PathBuf>,
    /// Network namespace to gate (`kernel.netns`); `None`: the daemon's own.
    pub netns: Option<PathBuf>,
    /// Per-port options (`kernel.port.<port>.perSourceMax`, `.dryRun`).
    pub port_options: BTreeMap<u16, PortOptions>,
    /// Client groups for per-source caps: IPv4 prefix length
    /// (`kernel.sourcePrefixV4`, 1-32).
    pub source_prefix_v4: u32,
    /// IPv6 prefix length (`kernel.sourcePrefixV6`, 1-128).
    pub source_prefix_v6: u32,
    /// Slots in the source table (`kernel.sourceTableSize`, a power of two).
    pub source_table_size: u32,
    /// Trusted client prefixes (`kernel.trusted`).
    pub trusted: Vec<Prefix>,
    /// Connections from trusted prefixes admitted past a full port
    /// (`kernel.trustedReserve`).
    pub trusted_reserve: u32,
    /// Interfaces whose ingress refuses SYNs with XDP (`kernel.xdp.interfaces`).
    pub xdp_interfaces: Vec<String>,
    /// `kernel.xdp.mode`: `auto` (driver, else generic), `driver`, `generic`.
    pub xdp_mode: XdpModeChoice,
}

/// `kernel.xdp.mode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum XdpModeChoice {
    /// Driver mode where the driver supports it, generic otherwise.
    #[default]
    Auto,
    /// Driver mode or fail.
    Driver,
    /// Generic (skb) mode.
    Generic,
}

/// A value that never appears in logs or debug output.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// `kernel.port.<port>.*`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortOptions {
    /// Most established connections from one client group; 0: no cap.
    pub per_source_max: u32,
    /// Count would-be refusals, refuse nothing.
    pub dry_run: bool,
}

/// An address prefix such as `10.0.0.0/8` or `fd00::/8`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Prefix {
    pub addr: std::net::IpAddr,
    pub len: u8,
}

impl Prefix {
    /// Whether `ip` is in this prefix (an IPv4 address is never in an IPv6
    /// prefix, nor the reverse).
    pub fn contains(&self, ip: std::net::IpAddr) -> bool {
        self.addr.is_ipv4() == ip.is_ipv4()
            && values::mask_addr(ip, self.len) == values::mask_addr(self.addr, self.len)
    }
}

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl KernelConfig {
    /// What the kernel's limits array should hold: every port with a cap.
    pub fn port_limits(&self) -> BTreeMap<u16, limiter_common::PortLimit> {
        let mut out = BTreeMap::new();
        let ports = self.ports.keys().chain(self.port_options.keys());
        for &port in ports {
            let options = self.port_options.get(&port).copied().unwrap_or_default();
            out.insert(
                port,
                limiter_common::PortLimit {
                    max_established: self.ports.get(&port).copied().unwrap_or(0),
                    flags: if options.dry_run { limiter_common::LIMIT_FLAG_DRY_RUN } else { 0 },
                    per_source_max: options.per_source_max,
                    _pad: 0,
                },
            );
        }
        out
    }
}

/// `http.*` keys the daemon owns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HttpConfig {
    pub max_threads: u32,
    /// 0 = unlimited.
    pub max_session_connections: u32,
    /// 0 = unlimited.
    pub max_web_connections: u32,
    pub listen: Addr,
    /// Where requests go; `None`: no proxy (the kernel gate alone).
    pub upstream: Option<Upstream>,
    /// Count would-be refusals, refuse nothing (`http.dryRun`).
    pub dry_run: bool,
    /// Coupled shedding (`http.shedAtSyn`): while the normal pool keeps
    /// refusing, the kernel gate sheds new connections to the proxy's
    /// listening ports at the SYN.
    pub shed_at_syn: bool,
    /// Refusing this long starts the shedding (`http.shedAfterMs`).
    pub shed_after_ms: u64,
    /// Refusing nothing this long stops it (`http.shedReleaseMs`).
    pub shed_release_ms: u64,
    /// A client must deliver a complete request head within this long of
    /// the connection being ready for one.
    pub header_read_timeout_ms: u64,
    /// A body transfer that makes no progress this long is aborted; also
    /// the idle time of pooled upstream connections.
    pub idle_timeout_ms: u64,
    pub connect_timeout_ms: u64,
    /// From the request sent upstream to the upstream's response head.
    pub upstream_timeout_ms: u64,
    /// Request heads larger than this get 431.
    pub max_header_bytes: u32,
    /// How long a connection closed after a 503 keeps draining what the
    /// client still sends, so the 503 is not destroyed by a RST.
    pub linger_ms: u64,
    /// The `Retry-After` of admission 503s (rounded up to seconds).
    pub retry_after_ms: u64,
    /// Proxy worker threads, each with its own event loop (`http.workers`).
    pub workers: usize,
    /// On SIGTERM, how long requests in flight may take to finish
    /// (`http.drainTimeoutMs`).
    pub drain_timeout_ms: u64,
    /// Request bodies up to this size are read whole before the permits
    /// are taken (`http.requestBufferBytes`; 0: off).
    pub request_buffer_bytes: u32,
    /// The deadline of a body read whole (`http.requestBodyTimeoutMs`).
    pub request_body_timeout_ms: u64,
    /// All buffered bodies and read-ahead together (`http.bufferMemoryBytes`).
    pub buffer_memory_bytes: u64,
    /// Response bodies up to this size are read ahead of the client
    /// (`http.responseBufferBytes`; 0: off).
    pub response_buffer_bytes: u32,
    /// Bytes per second a streamed request body must average
    /// (`http.minDataRate`; 0: off).
    pub min_data_rate: u32,
    /// The TLS listener (`http.tls.listen`); `None`: cleartext only.
    pub tls_listen: Option<Addr>,
    /// `http.tls.certFile`: the PEM certificate chain.
    pub tls_cert_file: Option<PathBuf>,
    /// `http.tls.keyFile`: the PEM private key.
    pub tls_key_file: Option<PathBuf>,
    /// The pair both files hold, read and checked when the configuration
    /// was loaded (so a reload that rewrote the files is a change).
    pub tls: Option<crate::tls::Pair>,
    /// A TLS handshake not finished this long after the connection was
    /// accepted is cut (`http.tls.handshakeTimeoutMs`).
    pub tls_handshake_timeout_ms: u64,
    /// Prior-knowledge HTTP/2 on `http.listen` (`http.h2c`).
    pub h2c: bool,
    /// Streams one HTTP/2 connection may have open (`http.h2.maxConcurrentStreams`).
    pub h2_max_concurrent_streams: u32,
    /// Where the access log goes (`http.accessLog`).
    pub access_log: AccessLog,
}

/// `http.accessLog`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum AccessLog {
    #[default]
    Off,
    Stderr,
    /// Appended to; reopened on SIGUSR1 and on every successful reload.
    File(PathBuf),
}

impl HttpConfig {
    /// Requests that are not `/debug/` may use this many slots.
    pub fn normal_limit(&self) -> u32 {
        self.max_threads - SYSTEM_THREADS - DEBUG_SLOTS
    }
}

/// `breaker.*`: the circuit breaker in front of the upstream.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BreakerConfig {
    pub threshold: f64,
    pub min_requests: u32,
    pub sleep_window_ms: u64,
    pub window_ms: u64,
    pub bucket_ms: u64,
    pub half_open_max_probes: u32,
    pub half_open_successes: u32,
    /// Inclusive ranges of upstream statuses that count as failures.
    pub failure_statuses: Vec<(u16, u16)>,
    pub bypass_debug: bool,
}

/// `admin.*`: the admin listener (metrics, status).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AdminConfig {
    pub listen: Addr,
    /// A file holding the bearer token the admin listener requires
    /// (`admin.tokenFile`); `None`: no token.
    pub token_file: Option<PathBuf>,
    /// The token read from `token_file` when the configuration was loaded.
    pub token: Option<Secret>,
    /// Log filter (`admin.logLevel`): `error`, `warn`, `info`, `debug`,
    /// `trace`, or a tracing filter such as `info,limiter::proxy=debug`.
    pub log_level: String,
    /// Reload when the file changes (`admin.watchConfig`).
    pub watch_config: bool,
    /// The metrics-only listener (`admin.metricsListen`).
    pub metrics_listen: Option<Addr>,
}

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
            ignored: Vec::new(),
            warnings: Vec::new(),
            written: BTreeMap::new(),
        };
        let mut lines: BTreeMap<String, usize> = BTreeMap::new();
        for entry in grammar::entries(text, name)? {
            let err =
                |message| ConfigError::at(name, entry.line, Some(&entry.key), Some(entry.value), message);
            match keys::lookup(&entry.key).map_err(err)? {
                Lookup::Runtime => config.ignored.push(entry.key),
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

#[cfg(test)]
mod tests;
