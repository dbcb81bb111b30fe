//! The configuration file and what it means.
//!
//! - [`grammar`]: lines, sections, comments, no key twice;
//! - [`keys`]: the one table of the daemon's keys (name, default, live or
//!   restart, doc, parser), from which parsing, the owned-key check, the
//!   defaults, `check-config`'s description, the reload diff and the
//!   restart-only refusal all come;
//! - [`values`]: the parsers of the values;
//! - `load`: a file's text into a [`Config`] through the table, its
//!   defaults, and the checks across keys;
//! - `error`, `listing`, `diff`: a bad file's error, every key as a
//!   configuration has it (`check-config`), what a reload changes;
//! - this module: the typed [`Config`] the rest of the daemon reads (the
//!   types only: the table's setters write into them, so this module does
//!   not use the table).
//!
//! The daemon owns the keys of the table: `http.maxThreads`,
//! `http.maxSessionConnections`, `http.maxWebConnections`, `http.listen`,
//! `http.upstream`, the other `http.*` keys it lists, and every key under
//! `kernel.`, `breaker.`, `admin.` and `fleet.`. Unknown keys in those four
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
mod load;
pub mod reference;
mod store;
mod values;

use std::{collections::BTreeMap, fmt, net::SocketAddr, path::PathBuf};

pub use self::{
    error::ConfigError,
    keys::{KEYS, Key, Reload},
    listing::Setting,
    store::{FleetConfig, OnStoreDown, StoreUrl},
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
    pub fleet: FleetConfig,
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
    /// Entries in the connection table (`kernel.connectionTableSize`, a
    /// power of two): the most connections the gate counts at once.
    pub connection_table_size: u32,
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
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Prefix {
    pub addr: std::net::IpAddr,
    pub len: u8,
}

impl Prefix {
    /// Whether `ip` is in this prefix (an IPv4 address is never in an IPv6
    /// prefix, nor the reverse).
    pub fn contains(&self, ip: std::net::IpAddr) -> bool {
        self.addr.is_ipv4() == ip.is_ipv4() && mask_addr(ip, self.len) == mask_addr(self.addr, self.len)
    }
}

/// `addr` with every bit past the first `len` cleared.
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

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl KernelConfig {
    /// The client group of `ip`, as the per-source caps group sources: the
    /// address masked to `kernel.sourcePrefixV4` or `kernel.sourcePrefixV6`
    /// (an IPv4-mapped IPv6 address counts as IPv4).
    pub fn group_of(&self, ip: std::net::IpAddr) -> Prefix {
        let ip = match ip {
            std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, std::net::IpAddr::V4),
            v4 => v4,
        };
        let len = if ip.is_ipv4() { self.source_prefix_v4 } else { self.source_prefix_v6 };
        let len = u8::try_from(len).unwrap_or(128);
        Prefix { addr: mask_addr(ip, len), len }
    }

    /// Whether `ip` is in a trusted prefix (`kernel.trusted`).
    pub fn is_trusted(&self, ip: std::net::IpAddr) -> bool {
        let ip = match ip {
            std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, std::net::IpAddr::V4),
            v4 => v4,
        };
        self.trusted.iter().any(|p| p.contains(ip))
    }

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
    /// Refusals per second over `shed_after_ms` that start shedding
    /// (`http.shedRefusalRate`).
    pub shed_refusal_rate: u64,
    /// Refusing nothing this long stops it (`http.shedReleaseMs`).
    pub shed_release_ms: u64,
    /// Learn the normal pool's limit from the upstream's latency
    /// (`http.adaptive`).
    pub adaptive: bool,
    /// The learnt limit's floor (`http.adaptive.minLimit`).
    pub adaptive_min_limit: u32,
    /// Normalised path prefixes of critical requests (`http.critical`).
    pub critical: Vec<String>,
    /// Normalised path prefixes of sheddable requests (`http.sheddable`).
    pub sheddable: Vec<String>,
    /// A client must deliver a complete request head within this long of
    /// the connection being ready for one.
    pub header_read_timeout_ms: u64,
    /// A body transfer that makes no progress this long is aborted; also
    /// the idle time of pooled upstream connections.
    pub idle_timeout_ms: u64,
    pub connect_timeout_ms: u64,
    /// Upstream connections open or connecting, every worker's together
    /// (`http.maxUpstreamConnections`; 0: `http.maxThreads`).
    pub max_upstream_connections: u32,
    /// From the request sent upstream to the upstream's response head.
    pub upstream_timeout_ms: u64,
    /// After limiter gave up on an exchange (a 504, a client gone), how long
    /// its permit stays held for the upstream's answer (`http.upstreamAbandonMs`).
    pub upstream_abandon_ms: u64,
    /// Upgraded connections (WebSocket) open at once; 0 = unlimited
    /// (`http.maxTunnels`).
    pub max_tunnels: u32,
    /// Of them, from one client group (`http.maxTunnelsPerClient`).
    pub max_tunnels_per_client: u32,
    /// A tunnel with no byte either way for this long is closed
    /// (`http.tunnelIdleTimeoutMs`; 0: never).
    pub tunnel_idle_timeout_ms: u64,
    /// Fields whose name holds a `_` may reach the upstream
    /// (`http.underscoresInHeaders`).
    pub underscores_in_headers: bool,
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
    /// How long a client group whose HTTP/2 connections keep ending for
    /// stream resets is refused at accept (`http.h2.resetRefusalMs`; 0: never).
    pub h2_reset_refusal_ms: u64,
    /// Where the access log goes (`http.accessLog`).
    pub access_log: AccessLog,
    /// Clients whose forwarding headers are kept and extended
    /// (`http.trustedForwarders`); from any other, limiter writes its own.
    pub trusted_forwarders: Vec<Prefix>,
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

    /// The cap on upstream connections in force: `http.maxUpstreamConnections`,
    /// or one per upstream thread (`http.maxThreads`) when it is 0.
    pub fn upstream_connection_limit(&self) -> usize {
        match self.max_upstream_connections {
            0 => self.max_threads as usize,
            n => n as usize,
        }
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
    /// The admin socket (`admin.socket`); `None`: `off`.
    pub socket: Option<PathBuf>,
    /// The group that may use the admin socket (`admin.socketGroup`).
    pub socket_group: Option<String>,
}

#[cfg(test)]
mod tests;
