//! The configuration file: `key = value` lines, flat dotted keys, `[section]`
//! headers that prefix the keys under them, `#`/`;` comments.
//!
//! The daemon owns `http.maxThreads`, `http.maxSessionConnections`,
//! `http.maxWebConnections`, `http.listen`, `http.upstream` and every key
//! under `kernel.`, `breaker.` and `admin.`. Unknown keys in those three
//! namespaces are errors (a typo must not silently disable a limit); other
//! `http.*` keys and other sections belong to the business runtime and are
//! ignored, so the runtime's own `config.ini` works unchanged.
//!
//! Parsing is all-or-nothing: a bad file yields one error naming the file,
//! line and key, and no partial configuration.

use std::{
    collections::{BTreeMap, HashMap},
    fmt, fs,
    net::SocketAddr,
    path::{Path, PathBuf},
};

/// Defaults, also listed in the README's key table.
pub mod defaults {
    /// `http.maxThreads` of the business runtime.
    pub const MAX_THREADS: u32 = 208;
    /// Threads the runtime keeps for its acceptor/selector/housekeeping.
    pub const SYSTEM_THREADS: u32 = 8;
    /// Slots reserved for `/debug/` requests.
    pub const DEBUG_SLOTS: u32 = 3;
    /// `kernel.pinPath`.
    pub const PIN_PATH: &str = "/sys/fs/bpf/limiter";
    /// `kernel.sourcePrefixV4`: each IPv4 address is its own group.
    pub const SOURCE_PREFIX_V4: u32 = 32;
    /// `kernel.sourcePrefixV6`: a /64 is one client (one subnet).
    pub const SOURCE_PREFIX_V6: u32 = 64;
    /// `kernel.sourceTableSize`: 2 MiB of slots.
    pub const SOURCE_TABLE_SIZE: u32 = 65_536;
    /// `kernel.trustedReserve`, like the HTTP `/debug/` slots.
    pub const TRUSTED_RESERVE: u32 = 3;
    /// `admin.listen`.
    pub const ADMIN_LISTEN: &str = "127.0.0.1:9901";
    /// `http.listen`.
    pub const HTTP_LISTEN: &str = "127.0.0.1:8080";
    /// `http.headerReadTimeoutMs`.
    pub const HEADER_READ_TIMEOUT_MS: u64 = 10_000;
    /// `http.idleTimeoutMs`.
    pub const IDLE_TIMEOUT_MS: u64 = 60_000;
    /// `http.connectTimeoutMs`.
    pub const CONNECT_TIMEOUT_MS: u64 = 2_000;
    /// `http.upstreamTimeoutMs`.
    pub const UPSTREAM_TIMEOUT_MS: u64 = 30_000;
    /// `http.maxHeaderBytes`.
    pub const MAX_HEADER_BYTES: u32 = 16_384;
    /// `http.lingerMs`.
    pub const LINGER_MS: u64 = 2_000;
    /// `http.retryAfterMs`.
    pub const RETRY_AFTER_MS: u64 = 1_000;
    /// `http.drainTimeoutMs`: how long SIGTERM lets requests in flight finish.
    pub const DRAIN_TIMEOUT_MS: u64 = 30_000;
    /// `admin.logLevel`.
    pub const LOG_LEVEL: &str = "info";
    /// `breaker.threshold`.
    pub const BREAKER_THRESHOLD: f64 = 0.5;
    /// `breaker.minRequests`.
    pub const BREAKER_MIN_REQUESTS: u32 = 10;
    /// `breaker.sleepWindowMs`.
    pub const BREAKER_SLEEP_WINDOW_MS: u64 = 30_000;
    /// `breaker.windowMs`.
    pub const BREAKER_WINDOW_MS: u64 = 30_000;
    /// `breaker.bucketMs`.
    pub const BREAKER_BUCKET_MS: u64 = 1_000;
    /// `breaker.halfOpenMaxProbes`.
    pub const BREAKER_HALF_OPEN_MAX_PROBES: u32 = 1;
    /// `breaker.halfOpenSuccesses`.
    pub const BREAKER_HALF_OPEN_SUCCESSES: u32 = 1;
}

/// The smallest `http.maxThreads` that leaves one normal slot.
pub const MIN_MAX_THREADS: u32 = defaults::SYSTEM_THREADS + defaults::DEBUG_SLOTS + 1;

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
    /// The daemon's keys as the file wrote them (reloads report what
    /// changed from these).
    pub written: BTreeMap<String, String>,
}

/// `kernel.*`: the eBPF gate.
#[derive(Clone, Debug, PartialEq, Eq)]
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
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpConfig {
    pub max_threads: u32,
    /// 0 = unlimited.
    pub max_session_connections: u32,
    /// 0 = unlimited.
    pub max_web_connections: u32,
    pub listen: SocketAddr,
    /// `host:port` of the business application; `None`: the built-in
    /// sample upstream.
    pub upstream: Option<String>,
    /// Count would-be refusals, refuse nothing (`http.dryRun`).
    pub dry_run: bool,
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
}

impl HttpConfig {
    /// Requests that are not `/debug/` may use this many slots.
    pub fn normal_limit(&self) -> u32 {
        self.max_threads - defaults::SYSTEM_THREADS - defaults::DEBUG_SLOTS
    }
}

/// `breaker.*`: the circuit breaker in front of the upstream.
#[derive(Clone, Debug, PartialEq)]
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
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdminConfig {
    pub listen: SocketAddr,
    /// A file holding the bearer token the admin listener requires
    /// (`admin.tokenFile`); `None`: no token.
    pub token_file: Option<PathBuf>,
    /// The token read from `token_file` when the configuration was loaded.
    pub token: Option<Secret>,
    /// Log filter (`admin.logLevel`): `error`, `warn`, `info`, `debug`,
    /// `trace`, or a tracing filter such as `info,limiter::proxy=debug`.
    pub log_level: String,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            source: None,
            kernel: KernelConfig {
                enabled: true,
                ports: BTreeMap::new(),
                pin_path: PathBuf::from(defaults::PIN_PATH),
                cgroup: None,
                netns: None,
                port_options: BTreeMap::new(),
                source_prefix_v4: defaults::SOURCE_PREFIX_V4,
                source_prefix_v6: defaults::SOURCE_PREFIX_V6,
                source_table_size: defaults::SOURCE_TABLE_SIZE,
                trusted: Vec::new(),
                trusted_reserve: defaults::TRUSTED_RESERVE,
                xdp_interfaces: Vec::new(),
                xdp_mode: XdpModeChoice::Auto,
            },
            http: HttpConfig {
                max_threads: defaults::MAX_THREADS,
                max_session_connections: 0,
                max_web_connections: 0,
                listen: defaults::HTTP_LISTEN.parse().expect("valid default"),
                upstream: None,
                dry_run: false,
                header_read_timeout_ms: defaults::HEADER_READ_TIMEOUT_MS,
                idle_timeout_ms: defaults::IDLE_TIMEOUT_MS,
                connect_timeout_ms: defaults::CONNECT_TIMEOUT_MS,
                upstream_timeout_ms: defaults::UPSTREAM_TIMEOUT_MS,
                max_header_bytes: defaults::MAX_HEADER_BYTES,
                linger_ms: defaults::LINGER_MS,
                retry_after_ms: defaults::RETRY_AFTER_MS,
                workers: std::thread::available_parallelism().map_or(2, |n| n.get()),
                drain_timeout_ms: defaults::DRAIN_TIMEOUT_MS,
            },
            breaker: BreakerConfig {
                threshold: defaults::BREAKER_THRESHOLD,
                min_requests: defaults::BREAKER_MIN_REQUESTS,
                sleep_window_ms: defaults::BREAKER_SLEEP_WINDOW_MS,
                window_ms: defaults::BREAKER_WINDOW_MS,
                bucket_ms: defaults::BREAKER_BUCKET_MS,
                half_open_max_probes: defaults::BREAKER_HALF_OPEN_MAX_PROBES,
                half_open_successes: defaults::BREAKER_HALF_OPEN_SUCCESSES,
                failure_statuses: vec![(500, 599)],
                bypass_debug: true,
            },
            admin: AdminConfig {
                listen: defaults::ADMIN_LISTEN.parse().expect("valid default"),
                token_file: None,
                token: None,
                log_level: defaults::LOG_LEVEL.to_owned(),
            },
            ignored: Vec::new(),
            written: BTreeMap::new(),
        }
    }
}

/// A configuration error: where, which key, what was wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// The file (or `<config>` for text without a file).
    pub file: String,
    /// 1-based line; 0 when the error is about the file as a whole.
    pub line: usize,
    /// The full dotted key, when the error is about one.
    pub key: Option<String>,
    /// The value as written, when the error is about one.
    pub value: Option<String>,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if self.line > 0 {
            write!(f, ":{}", self.line)?;
        }
        match (&self.key, &self.value) {
            (Some(k), Some(v)) => write!(f, ": {k} = {v}")?,
            (Some(k), None) => write!(f, ": {k}")?,
            _ => {}
        }
        write!(f, ": {}", self.message)
    }
}

/// Which kind of owner a key has.
enum Owner {
    Daemon,
    Runtime,
}

fn owner(key: &str) -> Owner {
    const OWNED_HTTP: [&str; 15] = [
        "http.maxThreads",
        "http.maxSessionConnections",
        "http.maxWebConnections",
        "http.listen",
        "http.upstream",
        "http.dryRun",
        "http.headerReadTimeoutMs",
        "http.idleTimeoutMs",
        "http.connectTimeoutMs",
        "http.upstreamTimeoutMs",
        "http.maxHeaderBytes",
        "http.lingerMs",
        "http.retryAfterMs",
        "http.workers",
        "http.drainTimeoutMs",
    ];
    let namespace = key.split('.').next().unwrap_or("");
    if matches!(namespace, "kernel" | "breaker" | "admin") || OWNED_HTTP.contains(&key) {
        Owner::Daemon
    } else {
        Owner::Runtime
    }
}

impl Config {
    /// Reads and validates `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let name = path.display().to_string();
        let text = fs::read_to_string(path).map_err(|e| ConfigError {
            file: name.clone(),
            line: 0,
            key: None,
            value: None,
            message: format!("cannot read the file: {e}"),
        })?;
        let mut config = Self::parse(&text, &name)?;
        config.source = Some(path.to_path_buf());
        Ok(config)
    }

    /// Parses and validates the text of a file called `name`.
    pub fn parse(text: &str, name: &str) -> Result<Self, ConfigError> {
        let mut config = Self::default();
        let mut seen: HashMap<String, usize> = HashMap::new();
        let mut section = String::new();
        for (index, raw) in text.lines().enumerate() {
            let line = index + 1;
            let err = |key: Option<&str>, value: Option<&str>, message: String| ConfigError {
                file: name.to_owned(),
                line,
                key: key.map(str::to_owned),
                value: value.map(str::to_owned),
                message,
            };
            let content = strip_comment(raw).trim();
            if content.is_empty() {
                continue;
            }
            if let Some(header) = content.strip_prefix('[') {
                let Some(inner) = header.strip_suffix(']') else {
                    return Err(err(None, None, format!("malformed section header `{content}`")));
                };
                let inner = inner.trim();
                if inner.is_empty() || inner.contains(char::is_whitespace) {
                    return Err(err(None, None, format!("malformed section header `{content}`")));
                }
                section = inner.to_owned();
                continue;
            }
            let Some((key, value)) = content.split_once('=') else {
                return Err(err(None, None, format!("expected `key = value`, found `{content}`")));
            };
            let (key, value) = (key.trim(), value.trim());
            if key.is_empty() || key.contains(char::is_whitespace) {
                return Err(err(None, None, format!("malformed key in `{content}`")));
            }
            let key = if section.is_empty() { key.to_owned() } else { format!("{section}.{key}") };
            if let Some(first) = seen.insert(key.clone(), line) {
                return Err(err(Some(&key), None, format!("given twice (first at line {first})")));
            }
            match owner(&key) {
                Owner::Runtime => config.ignored.push(key),
                Owner::Daemon => {
                    config.set(&key, value).map_err(|message| err(Some(&key), Some(value), message))?;
                    config.written.insert(key, value.to_owned());
                }
            }
        }
        config.check().map_err(|(key, message)| ConfigError {
            file: name.to_owned(),
            line: seen.get(&key).copied().unwrap_or(0),
            key: Some(key),
            value: None,
            message,
        })?;
        Ok(config)
    }

    /// Sets one key the daemon owns.
    fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        match key {
            "kernel.enabled" => self.kernel.enabled = boolean(value)?,
            "kernel.ports" => self.kernel.ports = parse_ports(value)?,
            "kernel.pinPath" => self.kernel.pin_path = absolute_path(value)?,
            "kernel.cgroup" => self.kernel.cgroup = Some(absolute_path(value)?),
            "kernel.netns" => self.kernel.netns = Some(absolute_path(value)?),
            "kernel.sourcePrefixV4" => self.kernel.source_prefix_v4 = int_in(value, 1, 32)?,
            "kernel.sourcePrefixV6" => self.kernel.source_prefix_v6 = int_in(value, 1, 128)?,
            "kernel.sourceTableSize" => self.kernel.source_table_size = table_size(value)?,
            "kernel.trusted" => self.kernel.trusted = prefixes(value)?,
            "kernel.trustedReserve" => self.kernel.trusted_reserve = int_at_least(value, 0)?,
            "kernel.xdp.interfaces" => self.kernel.xdp_interfaces = interfaces(value)?,
            "kernel.xdp.mode" => {
                self.kernel.xdp_mode = match value {
                    "auto" => XdpModeChoice::Auto,
                    "driver" => XdpModeChoice::Driver,
                    "generic" => XdpModeChoice::Generic,
                    _ => return Err("expected auto, driver or generic".into()),
                }
            }
            _ if key.starts_with("kernel.port.") => self.set_port_option(key, value)?,
            "http.maxThreads" => self.http.max_threads = int_at_least(value, MIN_MAX_THREADS)?,
            "http.maxSessionConnections" => self.http.max_session_connections = int_at_least(value, 0)?,
            "http.maxWebConnections" => self.http.max_web_connections = int_at_least(value, 0)?,
            "http.listen" => self.http.listen = socket_addr(value)?,
            "http.upstream" => self.http.upstream = Some(upstream(value)?),
            "http.dryRun" => self.http.dry_run = boolean(value)?,
            "http.headerReadTimeoutMs" => self.http.header_read_timeout_ms = ms(value, 100)?,
            "http.idleTimeoutMs" => self.http.idle_timeout_ms = ms(value, 100)?,
            "http.connectTimeoutMs" => self.http.connect_timeout_ms = ms(value, 1)?,
            "http.upstreamTimeoutMs" => self.http.upstream_timeout_ms = ms(value, 1)?,
            "http.maxHeaderBytes" => self.http.max_header_bytes = int_at_least(value, 8192)?,
            "http.lingerMs" => self.http.linger_ms = ms(value, 0)?,
            "http.retryAfterMs" => self.http.retry_after_ms = ms(value, 0)?,
            "http.workers" => self.http.workers = int_at_least(value, 1)? as usize,
            "http.drainTimeoutMs" => self.http.drain_timeout_ms = ms(value, 0)?,
            "breaker.threshold" => self.breaker.threshold = ratio(value)?,
            "breaker.minRequests" => self.breaker.min_requests = int_at_least(value, 1)?,
            "breaker.sleepWindowMs" => self.breaker.sleep_window_ms = ms(value, 1)?,
            "breaker.windowMs" => self.breaker.window_ms = ms(value, 1)?,
            "breaker.bucketMs" => self.breaker.bucket_ms = ms(value, 1)?,
            "breaker.halfOpenMaxProbes" => self.breaker.half_open_max_probes = int_at_least(value, 1)?,
            "breaker.halfOpenSuccesses" => self.breaker.half_open_successes = int_at_least(value, 1)?,
            "breaker.failureStatuses" => self.breaker.failure_statuses = statuses(value)?,
            "breaker.bypassDebug" => self.breaker.bypass_debug = boolean(value)?,
            "admin.listen" => self.admin.listen = socket_addr(value)?,
            "admin.tokenFile" => {
                let path = absolute_path(value)?;
                self.admin.token = Some(Secret(read_token(&path)?));
                self.admin.token_file = Some(path);
            }
            "admin.logLevel" => self.admin.log_level = log_level(value)?,
            _ => {
                let namespace = key.split('.').next().unwrap_or(key);
                return Err(format!(
                    "unknown key under `{namespace}.` (keys there are the daemon's; see the README's key table)"
                ));
            }
        }
        Ok(())
    }

    /// `kernel.port.<port>.perSourceMax` and `kernel.port.<port>.dryRun`.
    fn set_port_option(&mut self, key: &str, value: &str) -> Result<(), String> {
        let rest = &key["kernel.port.".len()..];
        let Some((port, option)) = rest.split_once('.') else {
            return Err("expected kernel.port.<port>.perSourceMax or kernel.port.<port>.dryRun".into());
        };
        let port: u16 = match port.parse() {
            Ok(p) if p >= 1 => p,
            _ => return Err(format!("`{port}` is not a port (1-65535)")),
        };
        let options = self.kernel.port_options.entry(port).or_default();
        match option {
            "perSourceMax" => options.per_source_max = int_at_least(value, 1)?,
            "dryRun" => options.dry_run = boolean(value)?,
            _ => {
                return Err(format!(
                    "unknown option `{option}` (kernel.port.<port> has perSourceMax and dryRun)"
                ));
            }
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
        Ok(())
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
            if a != b {
                let show = |v: Option<&String>| v.map_or_else(|| "(default)".to_owned(), Clone::clone);
                out.push(format!("{key}: {} -> {}", show(a), show(b)));
            }
        }
        if self.admin.token_file == new.admin.token_file && self.admin.token != new.admin.token {
            out.push("admin.tokenFile: (contents changed)".into());
        }
        out
    }

    /// Keys whose change needs a restart, with their values here.
    pub fn restart_only(&self) -> Vec<(&'static str, String)> {
        vec![
            ("kernel.enabled", self.kernel.enabled.to_string()),
            ("kernel.pinPath", self.kernel.pin_path.display().to_string()),
            ("kernel.cgroup", format!("{:?}", self.kernel.cgroup)),
            ("kernel.netns", format!("{:?}", self.kernel.netns)),
            ("kernel.xdp.interfaces", self.kernel.xdp_interfaces.join(", ")),
            ("kernel.xdp.mode", format!("{:?}", self.kernel.xdp_mode)),
            ("kernel.sourceTableSize", self.kernel.source_table_size.to_string()),
            ("kernel.sourcePrefixV4", self.kernel.source_prefix_v4.to_string()),
            ("kernel.sourcePrefixV6", self.kernel.source_prefix_v6.to_string()),
            ("admin.listen", self.admin.listen.to_string()),
            ("http.listen", self.http.listen.to_string()),
            ("http.workers", self.http.workers.to_string()),
        ]
    }
}

/// Drops a `#` or `;` comment: at the start of the line, or after blank space.
fn strip_comment(line: &str) -> &str {
    let bytes = line.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        if (b == b'#' || b == b';') && (i == 0 || bytes[i - 1].is_ascii_whitespace()) {
            return &line[..i];
        }
    }
    line
}

fn int_at_least(value: &str, min: u32) -> Result<u32, String> {
    let n: i64 = value.parse().map_err(|_| format!("not a whole number (expected at least {min})"))?;
    if n < i64::from(min) {
        return Err(format!("must be at least {min}"));
    }
    u32::try_from(n).map_err(|_| format!("must be at most {}", u32::MAX))
}

fn ms(value: &str, min: u32) -> Result<u64, String> {
    int_at_least(value, min).map(u64::from)
}

fn ratio(value: &str) -> Result<f64, String> {
    let x: f64 = value.parse().map_err(|_| "not a number (expected a ratio such as 0.5)".to_owned())?;
    if !(x > 0.0 && x < 1.0) {
        return Err("must be above 0 and below 1".into());
    }
    Ok(x)
}

fn boolean(value: &str) -> Result<bool, String> {
    match value {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err("expected `true` or `false`".into()),
    }
}

fn absolute_path(value: &str) -> Result<PathBuf, String> {
    let path = PathBuf::from(value);
    if value.is_empty() || !path.is_absolute() {
        return Err("must be an absolute path".into());
    }
    Ok(path)
}

fn socket_addr(value: &str) -> Result<SocketAddr, String> {
    value.parse().map_err(|_| "expected an address and port such as 127.0.0.1:9901 or [::1]:9901".into())
}

fn upstream(value: &str) -> Result<String, String> {
    let rest = value.strip_prefix("http://").unwrap_or(value);
    let rest = rest.trim_end_matches('/');
    if rest.starts_with("https://") || value.starts_with("https://") {
        return Err("TLS to the upstream is not supported; give host:port of a plain HTTP upstream".into());
    }
    let Some((host, port)) = rest.rsplit_once(':') else {
        return Err("expected host:port (or http://host:port)".into());
    };
    if host.is_empty() || host.contains('/') || port.parse::<u16>().map_or(true, |p| p == 0) {
        return Err("expected host:port (or http://host:port)".into());
    }
    Ok(rest.to_owned())
}

/// The first line of a token file: at least 16 characters, no spaces.
fn read_token(path: &Path) -> Result<String, String> {
    let text = fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let token = text.lines().next().unwrap_or("").trim();
    if token.len() < 16 || token.contains(char::is_whitespace) {
        return Err(format!(
            "{}: the token must be one line of at least 16 characters without spaces",
            path.display()
        ));
    }
    Ok(token.to_owned())
}

/// A tracing filter directive, checked the way the logger will parse it.
fn log_level(value: &str) -> Result<String, String> {
    tracing_subscriber::EnvFilter::builder()
        .parse(value)
        .map(|_| value.to_owned())
        .map_err(|e| format!("not a log filter ({e}); try error, warn, info, debug or trace"))
}

fn int_in(value: &str, min: u32, max: u32) -> Result<u32, String> {
    match value.parse::<i64>() {
        Ok(n) if (i64::from(min)..=i64::from(max)).contains(&n) => Ok(n as u32),
        Ok(_) => Err(format!("must be between {min} and {max}")),
        Err(_) => Err("not a whole number".into()),
    }
}

fn table_size(value: &str) -> Result<u32, String> {
    let n = int_in(value, 1024, 1 << 20)?;
    if !n.is_power_of_two() {
        return Err(format!("{n} is not a power of two (such as 65536)"));
    }
    Ok(n)
}

/// `10.0.0.0/8, fd00::/8, 192.0.2.7` (no length: the whole address).
fn prefixes(value: &str) -> Result<Vec<Prefix>, String> {
    let mut out = Vec::new();
    for item in value.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (addr, len) = item.split_once('/').unwrap_or((item, ""));
        let addr: std::net::IpAddr =
            addr.trim().parse().map_err(|_| format!("`{item}`: `{addr}` is not an IPv4 or IPv6 address"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len = if len.is_empty() {
            max
        } else {
            match len.trim().parse::<u8>() {
                Ok(l) if l <= max => l,
                _ => return Err(format!("`{item}`: prefix length must be 0-{max}")),
            }
        };
        let prefix = Prefix { addr: mask_addr(addr, len), len };
        if prefix.addr != addr {
            return Err(format!("`{item}` has host bits set; did you mean {prefix}?"));
        }
        // ::ffff:a.b.c.d/len is the IPv4 prefix a.b.c.d/(len-96): one form.
        let prefix = match prefix.addr {
            std::net::IpAddr::V6(v6) if len >= 96 => match v6.to_ipv4_mapped() {
                Some(v4) => Prefix { addr: v4.into(), len: len - 96 },
                None => prefix,
            },
            _ => prefix,
        };
        if out.contains(&prefix) {
            return Err(format!("{prefix} is listed twice"));
        }
        out.push(prefix);
    }
    Ok(out)
}

fn mask_addr(addr: std::net::IpAddr, len: u8) -> std::net::IpAddr {
    match addr {
        std::net::IpAddr::V4(a) => {
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - u32::from(len)) };
            std::net::IpAddr::V4((u32::from(a) & mask).into())
        }
        std::net::IpAddr::V6(a) => {
            let mask = if len == 0 { 0 } else { u128::MAX << (128 - u32::from(len)) };
            std::net::IpAddr::V6((u128::from(a) & mask).into())
        }
    }
}

/// `eth0, eth1`
fn interfaces(value: &str) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    for item in value.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        if item.len() > 15 || item.contains(['/', ' ']) || item == "." || item == ".." {
            return Err(format!("`{item}` is not an interface name (at most 15 characters, no `/`)"));
        }
        if out.iter().any(|i| i == item) {
            return Err(format!("interface {item} is listed twice"));
        }
        out.push(item.to_owned());
    }
    Ok(out)
}

/// `8080:400, 8443:200`
fn parse_ports(value: &str) -> Result<BTreeMap<u16, u32>, String> {
    let mut ports = BTreeMap::new();
    for item in value.split(',').map(str::trim) {
        if item.is_empty() {
            if value.trim().is_empty() {
                break;
            }
            return Err("empty item in the list (expected port:max, port:max, ...)".into());
        }
        let Some((port, max)) = item.split_once(':') else {
            return Err(format!("`{item}`: expected port:max, such as 8080:400"));
        };
        let port: i64 = port.trim().parse().map_err(|_| format!("`{item}`: the port is not a number"))?;
        if !(1..=65535).contains(&port) {
            return Err(format!("`{item}`: port {port} is outside 1-65535"));
        }
        let max: i64 =
            max.trim().parse().map_err(|_| format!("`{item}`: the limit is not a whole number"))?;
        if max < 1 {
            return Err(format!("`{item}`: the limit must be at least 1"));
        }
        let max = u32::try_from(max).map_err(|_| format!("`{item}`: the limit is too large"))?;
        let port = port as u16;
        if ports.insert(port, max).is_some() {
            return Err(format!("port {port} is listed twice"));
        }
    }
    Ok(ports)
}

/// `500-599, 429`
fn statuses(value: &str) -> Result<Vec<(u16, u16)>, String> {
    let mut out = Vec::new();
    for item in value.split(',').map(str::trim) {
        let (lo, hi) = item.split_once('-').unwrap_or((item, item));
        let parse = |s: &str| -> Result<u16, String> {
            let n: u16 = s.trim().parse().map_err(|_| format!("`{item}`: not a status code"))?;
            if !(100..=599).contains(&n) {
                return Err(format!("`{item}`: statuses are 100-599"));
            }
            Ok(n)
        };
        let (lo, hi) = (parse(lo)?, parse(hi)?);
        if lo > hi {
            return Err(format!("`{item}`: the range is backwards"));
        }
        out.push((lo, hi));
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
