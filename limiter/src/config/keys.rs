//! The one table of the daemon's keys: name, default, whether a reload
//! applies it (live) or it needs a restart, a one-line doc, and the parser
//! that stores it in [`Config`].
//!
//! Everything about a key comes from here: parsing and the owned-key check
//! ([`lookup`]), the defaults ([`Config::default`] is the empty file), the
//! description `check-config` prints, the reload diff and the restart-only
//! refusal, and the README's key table (checked against this one by a
//! unit test).

use super::{
    Addr, Config, MIN_MAX_THREADS,
    store::{OnStoreDown, StoreUrl, fleet_name},
    values::{
        absolute_path, access_log, boolean, int_at_least, int_in, interfaces, log_level, ms, on_off,
        parse_ports, path_prefixes, power_of_two_in, prefixes, ratio, secret_file, socket_addr, statuses,
        upstream, xdp_mode,
    },
};

/// Whether a reload applies a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reload {
    /// A reload applies it to what comes next (new connections, requests,
    /// SYNs); what is in flight keeps what it started with.
    Live,
    /// A reload that changes it applies nothing and names it.
    Restart,
}

impl Reload {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Live => "live",
            Self::Restart => "restart",
        }
    }
}

/// A key's value when the file does not set it.
#[derive(Clone, Copy, Debug)]
pub enum DefaultValue {
    /// This text, parsed like a value from the file.
    Value(&'static str),
    /// No value; the text says what that means (as the README writes it).
    Unset(&'static str),
    /// Computed on the machine at load; the text says how.
    Computed(&'static str, fn() -> String),
}

/// How a key's value is stored.
#[derive(Clone, Copy)]
pub(super) enum Set {
    /// A key of its own.
    Plain(fn(&mut Config, &str) -> Result<(), String>),
    /// `kernel.port.<port>.NAME`: one key per port.
    PerPort(fn(&mut Config, u16, &str) -> Result<(), String>),
}

/// One key of the daemon's.
#[derive(Clone, Copy)]
pub struct Key {
    /// The dotted name; per-port keys say `<port>` where the port goes.
    pub name: &'static str,
    pub default: DefaultValue,
    pub reload: Reload,
    /// One line: what the key does.
    pub doc: &'static str,
    pub(super) set: Set,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Key").field("name", &self.name).finish_non_exhaustive()
    }
}

impl Key {
    /// The default as a file would write it (`None` when unset).
    pub fn default_value(&self) -> Option<String> {
        match self.default {
            DefaultValue::Value(v) => Some(v.to_owned()),
            DefaultValue::Unset(_) => None,
            DefaultValue::Computed(_, f) => Some(f()),
        }
    }

    /// Whether this is a `kernel.port.<port>.*` key.
    pub fn per_port(&self) -> bool {
        matches!(self.set, Set::PerPort(_))
    }
}

/// A key without a port parameter.
macro_rules! plain {
    (|$c:ident, $v:ident| $($body:tt)*) => {
        Set::Plain(|$c, $v| {
            $($body)*;
            Ok(())
        })
    };
}

/// Namespaces where every key is the daemon's: an unknown key there is an
/// error (a typo must not silently disable a limit).
pub const OWNED_NAMESPACES: [&str; 4] = ["kernel", "breaker", "admin", "fleet"];

/// The daemon's keys, in the order `check-config` lists them.
pub static KEYS: &[Key] = &[
    // The kernel gate.
    Key {
        name: "kernel.enabled",
        default: DefaultValue::Value("true"),
        reload: Reload::Restart,
        doc: "load the kernel gate; false runs the HTTP proxy alone, without eBPF privileges",
        set: plain!(|c, v| c.kernel.enabled = boolean(v)?),
    },
    Key {
        name: "kernel.ports",
        default: DefaultValue::Unset("(none)"),
        reload: Reload::Live,
        doc: "port:max, ...: most established server-side TCP connections per local port",
        set: plain!(|c, v| c.kernel.ports = parse_ports(v)?),
    },
    Key {
        name: "kernel.pinPath",
        default: DefaultValue::Value("/sys/fs/bpf/limiter"),
        reload: Reload::Restart,
        doc: "bpffs directory of the gate's maps and links",
        set: plain!(|c, v| c.kernel.pin_path = absolute_path(v)?),
    },
    Key {
        name: "kernel.cgroup",
        default: DefaultValue::Unset("root of the cgroup v2 mount (found in `/proc/self/mounts`)"),
        reload: Reload::Restart,
        doc: "cgroup v2 directory whose sockets are counted",
        set: plain!(|c, v| c.kernel.cgroup = Some(absolute_path(v)?)),
    },
    Key {
        name: "kernel.netns",
        default: DefaultValue::Unset("the daemon's own"),
        reload: Reload::Restart,
        doc: "network namespace to gate (/proc/PID/ns/net or /var/run/netns/NAME)",
        set: plain!(|c, v| c.kernel.netns = Some(absolute_path(v)?)),
    },
    Key {
        name: "kernel.port.<port>.perSourceMax",
        default: DefaultValue::Unset("(none)"),
        reload: Reload::Live,
        doc: "most established connections to the port from one client group",
        set: Set::PerPort(|c, port, v| {
            c.kernel.port_options.entry(port).or_default().per_source_max = int_at_least(v, 1)?;
            Ok(())
        }),
    },
    Key {
        name: "kernel.port.<port>.dryRun",
        default: DefaultValue::Value("false"),
        reload: Reload::Live,
        doc: "the port's caps count what they would refuse and refuse nothing",
        set: Set::PerPort(|c, port, v| {
            c.kernel.port_options.entry(port).or_default().dry_run = boolean(v)?;
            Ok(())
        }),
    },
    Key {
        name: "kernel.connectionTableSize",
        default: DefaultValue::Value("262144"),
        reload: Reload::Restart,
        doc: "connections the gate can count at once (a power of two, 4096 to 16777216; 16 bytes each)",
        set: plain!(|c, v| c.kernel.connection_table_size = power_of_two_in(v, 4096, 1 << 24)?),
    },
    Key {
        name: "kernel.sourcePrefixV4",
        default: DefaultValue::Value("32"),
        reload: Reload::Restart,
        doc: "client groups of per-source caps: IPv4 addresses masked to this many bits",
        set: plain!(|c, v| c.kernel.source_prefix_v4 = int_in(v, 1, 32)?),
    },
    Key {
        name: "kernel.sourcePrefixV6",
        default: DefaultValue::Value("64"),
        reload: Reload::Restart,
        doc: "client groups of per-source caps: IPv6 addresses masked to this many bits",
        set: plain!(|c, v| c.kernel.source_prefix_v6 = int_in(v, 1, 128)?),
    },
    Key {
        name: "kernel.sourceTableSize",
        default: DefaultValue::Value("65536"),
        reload: Reload::Restart,
        doc: "slots of the per-source table (a power of two, 1024 to 1048576)",
        set: plain!(|c, v| c.kernel.source_table_size = power_of_two_in(v, 1024, 1 << 20)?),
    },
    Key {
        name: "kernel.trusted",
        default: DefaultValue::Unset("(none)"),
        reload: Reload::Live,
        doc: "prefixes that pass per-source caps and get a reserve past a full port",
        set: plain!(|c, v| c.kernel.trusted = prefixes(v)?),
    },
    Key {
        name: "kernel.trustedReserve",
        default: DefaultValue::Value("3"),
        reload: Reload::Live,
        doc: "connections from trusted prefixes admitted past a full port's limit",
        set: plain!(|c, v| c.kernel.trusted_reserve = int_at_least(v, 0)?),
    },
    Key {
        name: "kernel.xdp.interfaces",
        default: DefaultValue::Unset("(none)"),
        reload: Reload::Restart,
        doc: "interfaces whose ingress refuses SYNs with XDP",
        set: plain!(|c, v| c.kernel.xdp_interfaces = interfaces(v)?),
    },
    Key {
        name: "kernel.xdp.mode",
        default: DefaultValue::Value("auto"),
        reload: Reload::Restart,
        doc: "auto (generic on a veth, else driver mode, else generic), driver or generic",
        set: plain!(|c, v| c.kernel.xdp_mode = xdp_mode(v)?),
    },
    // The admin listener.
    Key {
        name: "admin.listen",
        default: DefaultValue::Value("127.0.0.1:9901"),
        reload: Reload::Restart,
        doc: "admin listener (TCP): GET /metrics and /healthz; with admin.tokenFile, every admin path behind the token",
        set: plain!(|c, v| c.admin.listen = Addr(socket_addr(v)?)),
    },
    Key {
        name: "admin.socket",
        default: DefaultValue::Value("/run/limiter/admin.sock"),
        reload: Reload::Restart,
        doc: "the admin socket: every admin path, no token; who may connect is its mode (0600, root) and admin.socketGroup; `off` for none",
        set: plain!(|c, v| c.admin.socket = if v == "off" { None } else { Some(absolute_path(v)?) }),
    },
    Key {
        name: "admin.socketGroup",
        default: DefaultValue::Unset("(none: root only)"),
        reload: Reload::Restart,
        doc: "a group whose members may use the admin socket too (mode 0660)",
        set: plain!(|c, v| c.admin.socket_group = Some(v.to_owned())),
    },
    Key {
        name: "admin.tokenFile",
        default: DefaultValue::Unset("(none)"),
        reload: Reload::Live,
        doc: "file holding the bearer token that opens every admin path but /healthz on admin.listen",
        set: plain!(|c, v| {
            let (path, token) = secret_file(v, 16, "the token")?;
            (c.admin.token, c.admin.token_file) = (Some(token), Some(path));
        }),
    },
    Key {
        name: "admin.logLevel",
        default: DefaultValue::Value("info"),
        reload: Reload::Live,
        doc: "log filter: error, warn, info, debug, trace, or a tracing directive",
        set: plain!(|c, v| c.admin.log_level = log_level(v)?),
    },
    Key {
        name: "admin.metricsListen",
        default: DefaultValue::Unset("(none)"),
        reload: Reload::Restart,
        doc: "a metrics-only listener: GET /metrics and /healthz, read-only, no token (for Prometheus)",
        set: plain!(|c, v| c.admin.metrics_listen = Some(Addr(socket_addr(v)?))),
    },
    Key {
        name: "admin.watchConfig",
        default: DefaultValue::Value("false"),
        reload: Reload::Live,
        doc: "reload when the file changes (checked every second; Kubernetes' ConfigMap swap included)",
        set: plain!(|c, v| c.admin.watch_config = boolean(v)?),
    },
    // The HTTP proxy.
    Key {
        name: "http.drainTimeoutMs",
        default: DefaultValue::Value("30000"),
        reload: Reload::Live,
        doc: "on SIGTERM, how long requests in flight may take to finish",
        set: plain!(|c, v| c.http.drain_timeout_ms = ms(v, 0)?),
    },
    Key {
        name: "http.maxThreads",
        default: DefaultValue::Value("208"),
        reload: Reload::Live,
        doc: "the runtime's thread count: normal pool = maxThreads - 8 - 3",
        set: plain!(|c, v| c.http.max_threads = int_at_least(v, MIN_MAX_THREADS)?),
    },
    Key {
        name: "http.maxSessionConnections",
        default: DefaultValue::Value("0"),
        reload: Reload::Live,
        doc: "in-flight requests per Authorization value (0: unlimited)",
        set: plain!(|c, v| c.http.max_session_connections = int_at_least(v, 0)?),
    },
    Key {
        name: "http.maxWebConnections",
        default: DefaultValue::Value("0"),
        reload: Reload::Live,
        doc: "in-flight requests carrying X-Client-Id (0: unlimited)",
        set: plain!(|c, v| c.http.max_web_connections = int_at_least(v, 0)?),
    },
    Key {
        name: "http.listen",
        default: DefaultValue::Value("127.0.0.1:8080"),
        reload: Reload::Restart,
        doc: "the proxy's address",
        set: plain!(|c, v| c.http.listen = Addr(socket_addr(v)?)),
    },
    Key {
        name: "http.upstream",
        default: DefaultValue::Unset("(none: the kernel gate alone, no proxy)"),
        reload: Reload::Restart,
        doc: "host:port of the business application, or `sample` for the built-in demo upstream",
        set: plain!(|c, v| c.http.upstream = Some(upstream(v)?)),
    },
    Key {
        name: "http.dryRun",
        default: DefaultValue::Value("false"),
        reload: Reload::Live,
        doc: "count would-be refusals, refuse nothing",
        set: plain!(|c, v| c.http.dry_run = boolean(v)?),
    },
    Key {
        name: "http.shedAtSyn",
        default: DefaultValue::Value("false"),
        reload: Reload::Live,
        doc: "while the normal pool keeps refusing, the kernel gate refuses new connections to the proxy's ports at the SYN (needs kernel.enabled)",
        set: plain!(|c, v| c.http.shed_at_syn = boolean(v)?),
    },
    Key {
        name: "http.shedAfterMs",
        default: DefaultValue::Value("200"),
        reload: Reload::Live,
        doc: "the window over which the normal pool's refusal rate is measured: shedding starts once the refusals in the last shedAfterMs reach http.shedRefusalRate × shedAfterMs (an open breaker counts as refusing at that rate)",
        set: plain!(|c, v| c.http.shed_after_ms = ms(v, 10)?),
    },
    Key {
        name: "http.shedRefusalRate",
        default: DefaultValue::Value("500"),
        reload: Reload::Live,
        doc: "refusals per second of the normal pool, over http.shedAfterMs, that start shedding",
        set: plain!(|c, v| c.http.shed_refusal_rate = u64::from(int_at_least(v, 1)?)),
    },
    Key {
        name: "http.shedReleaseMs",
        default: DefaultValue::Value("1000"),
        reload: Reload::Live,
        doc: "how long the normal pool must have refused nothing before shedding stops",
        set: plain!(|c, v| c.http.shed_release_ms = ms(v, 10)?),
    },
    Key {
        name: "http.adaptive",
        default: DefaultValue::Value("off"),
        reload: Reload::Live,
        doc: "on: the normal pool's limit is learnt from the upstream's latency, between http.adaptive.minLimit and http.maxThreads - 11; off: it is http.maxThreads - 11",
        set: plain!(|c, v| c.http.adaptive = on_off(v)?),
    },
    Key {
        name: "http.adaptive.minLimit",
        default: DefaultValue::Value("4"),
        reload: Reload::Live,
        doc: "the learnt limit never goes below this (nor above http.maxThreads - 11)",
        set: plain!(|c, v| c.http.adaptive_min_limit = int_at_least(v, 1)?),
    },
    Key {
        name: "http.critical",
        default: DefaultValue::Unset("(none)"),
        reload: Reload::Live,
        doc: "path prefixes of critical requests, on the normalised path: refused last when the normal pool is at its limit",
        set: plain!(|c, v| c.http.critical = path_prefixes(v)?),
    },
    Key {
        name: "http.sheddable",
        default: DefaultValue::Unset("(none)"),
        reload: Reload::Live,
        doc: "path prefixes of sheddable requests, on the normalised path: refused first when the normal pool is at its limit",
        set: plain!(|c, v| c.http.sheddable = path_prefixes(v)?),
    },
    Key {
        name: "http.headerReadTimeoutMs",
        default: DefaultValue::Value("10000"),
        reload: Reload::Live,
        doc: "a client must send a complete request head within this long",
        set: plain!(|c, v| c.http.header_read_timeout_ms = ms(v, 100)?),
    },
    Key {
        name: "http.idleTimeoutMs",
        default: DefaultValue::Value("60000"),
        reload: Reload::Live,
        doc: "a body that makes no progress this long is aborted; idle pooled upstream connections close",
        set: plain!(|c, v| c.http.idle_timeout_ms = ms(v, 100)?),
    },
    Key {
        name: "http.connectTimeoutMs",
        default: DefaultValue::Value("2000"),
        reload: Reload::Live,
        doc: "connecting to the upstream (then 502)",
        set: plain!(|c, v| c.http.connect_timeout_ms = ms(v, 1)?),
    },
    Key {
        name: "http.maxUpstreamConnections",
        default: DefaultValue::Value("0"),
        reload: Reload::Restart,
        doc: "upstream connections open or connecting, on every worker together (0: http.maxThreads); a request that finds them all busy for http.connectTimeoutMs gets 503 upstream_full",
        set: plain!(|c, v| c.http.max_upstream_connections = int_at_least(v, 0)?),
    },
    Key {
        name: "http.upstreamTimeoutMs",
        default: DefaultValue::Value("30000"),
        reload: Reload::Live,
        doc: "from the request sent upstream to the upstream's response head (then 504)",
        set: plain!(|c, v| c.http.upstream_timeout_ms = ms(v, 1)?),
    },
    Key {
        name: "http.upstreamAbandonMs",
        default: DefaultValue::Value("60000"),
        reload: Reload::Live,
        doc: "after limiter gave up on a request the upstream still works on (a 504, a client gone mid-response, a body that failed mid-upload), how long its permits stay held waiting for the upstream's answer (0: given back at once)",
        set: plain!(|c, v| c.http.upstream_abandon_ms = ms(v, 0)?),
    },
    Key {
        name: "http.maxTunnels",
        default: DefaultValue::Value("1024"),
        reload: Reload::Live,
        doc: "upgraded connections (WebSocket tunnels) open at once; an upgrade request past it gets 503 tunnels (0: unlimited)",
        set: plain!(|c, v| c.http.max_tunnels = int_at_least(v, 0)?),
    },
    Key {
        name: "http.underscoresInHeaders",
        default: DefaultValue::Value("off"),
        reload: Reload::Live,
        doc: "on: request fields whose name holds a `_` reach the upstream, unless the name stands for a forwarding header or one limiter interprets; off: they are dropped (nginx's underscores_in_headers)",
        set: plain!(|c, v| c.http.underscores_in_headers = on_off(v)?),
    },
    Key {
        name: "http.maxHeaderBytes",
        default: DefaultValue::Value("16384"),
        reload: Reload::Live,
        doc: "request heads larger than this get 431",
        set: plain!(|c, v| c.http.max_header_bytes = int_at_least(v, 8192)?),
    },
    Key {
        name: "http.lingerMs",
        default: DefaultValue::Value("2000"),
        reload: Reload::Live,
        doc: "after a Connection: close response, how long to drain what the client may still send",
        set: plain!(|c, v| c.http.linger_ms = ms(v, 0)?),
    },
    Key {
        name: "http.retryAfterMs",
        default: DefaultValue::Value("1000"),
        reload: Reload::Live,
        doc: "the Retry-After of admission 503s, rounded up to whole seconds",
        set: plain!(|c, v| c.http.retry_after_ms = ms(v, 0)?),
    },
    Key {
        name: "http.requestBufferBytes",
        default: DefaultValue::Value("65536"),
        reload: Reload::Live,
        doc: "request bodies up to this size are read whole before the permits are taken (0: off)",
        set: plain!(|c, v| c.http.request_buffer_bytes = int_at_least(v, 0)?),
    },
    Key {
        name: "http.requestBodyTimeoutMs",
        default: DefaultValue::Value("30000"),
        reload: Reload::Live,
        doc: "a body read whole must arrive within this long (then 408)",
        set: plain!(|c, v| c.http.request_body_timeout_ms = ms(v, 1)?),
    },
    Key {
        name: "http.bufferMemoryBytes",
        default: DefaultValue::Value("67108864"),
        reload: Reload::Live,
        doc: "all buffered request bodies and response read-ahead together (then 503 buffer_full)",
        set: plain!(|c, v| c.http.buffer_memory_bytes = u64::from(int_at_least(v, 0)?)),
    },
    Key {
        name: "http.responseBufferBytes",
        default: DefaultValue::Value("65536"),
        reload: Reload::Live,
        doc: "response bodies up to this size are read ahead of the client, so the permit returns at once",
        set: plain!(|c, v| c.http.response_buffer_bytes = int_at_least(v, 0)?),
    },
    Key {
        name: "http.minDataRate",
        default: DefaultValue::Value("1024"),
        reload: Reload::Live,
        doc: "bytes per second a streamed request body must bring (else 408) and a client read a streamed response (else cut), after a 3 s grace (0: off)",
        set: plain!(|c, v| c.http.min_data_rate = int_at_least(v, 0)?),
    },
    Key {
        name: "http.tls.listen",
        default: DefaultValue::Unset("(none: no TLS listener)"),
        reload: Reload::Restart,
        doc: "the proxy's TLS address (TLS 1.2 and 1.3, ALPN h2 and http/1.1)",
        set: plain!(|c, v| c.http.tls_listen = Some(Addr(socket_addr(v)?))),
    },
    Key {
        name: "http.tls.certFile",
        default: DefaultValue::Unset("(none)"),
        reload: Reload::Live,
        doc: "PEM certificate chain, leaf first; a reload re-reads it for new handshakes",
        set: plain!(|c, v| c.http.tls_cert_file = Some(absolute_path(v)?)),
    },
    Key {
        name: "http.tls.keyFile",
        default: DefaultValue::Unset("(none)"),
        reload: Reload::Live,
        doc: "PEM private key of the certificate (PKCS#8, RSA or EC); a reload re-reads it",
        set: plain!(|c, v| c.http.tls_key_file = Some(absolute_path(v)?)),
    },
    Key {
        name: "http.tls.handshakeTimeoutMs",
        default: DefaultValue::Value("10000"),
        reload: Reload::Live,
        doc: "a TLS handshake not done this long after the connection was accepted is cut",
        set: plain!(|c, v| c.http.tls_handshake_timeout_ms = ms(v, 1)?),
    },
    Key {
        name: "http.trustedForwarders",
        default: DefaultValue::Unset("(none)"),
        reload: Reload::Live,
        doc: "prefixes of proxies in front whose forwarding headers are kept and extended; from any other client they are replaced",
        set: plain!(|c, v| c.http.trusted_forwarders = prefixes(v)?),
    },
    Key {
        name: "http.h2c",
        default: DefaultValue::Value("false"),
        reload: Reload::Restart,
        doc: "http.listen also accepts prior-knowledge cleartext HTTP/2",
        set: plain!(|c, v| c.http.h2c = boolean(v)?),
    },
    Key {
        name: "http.h2.maxConcurrentStreams",
        default: DefaultValue::Value("100"),
        reload: Reload::Live,
        doc: "streams one HTTP/2 connection may have open (for connections opened after a reload)",
        set: plain!(|c, v| c.http.h2_max_concurrent_streams = int_at_least(v, 1)?),
    },
    Key {
        name: "http.h2.resetRefusalMs",
        default: DefaultValue::Value("0"),
        reload: Reload::Restart,
        doc: "a client group with 10 HTTP/2 connections ended for stream resets within 10 s is refused at accept this long (0: never)",
        set: plain!(|c, v| c.http.h2_reset_refusal_ms = ms(v, 0)?),
    },
    Key {
        name: "http.accessLog",
        default: DefaultValue::Value("off"),
        reload: Reload::Live,
        doc: "off, stderr or a file: one JSON line per request; SIGUSR1 reopens the file",
        set: plain!(|c, v| c.http.access_log = access_log(v)?),
    },
    Key {
        name: "http.workers",
        default: DefaultValue::Computed("number of CPUs", cpus),
        reload: Reload::Restart,
        doc: "proxy worker threads, each with its own event loop, listener and upstream pool",
        set: plain!(|c, v| c.http.workers = int_at_least(v, 1)? as usize),
    },
    // The circuit breaker.
    Key {
        name: "breaker.threshold",
        default: DefaultValue::Value("0.5"),
        reload: Reload::Live,
        doc: "error rate above which the breaker opens",
        set: plain!(|c, v| c.breaker.threshold = ratio(v)?),
    },
    Key {
        name: "breaker.minRequests",
        default: DefaultValue::Value("10"),
        reload: Reload::Live,
        doc: "results the window must hold before it may open",
        set: plain!(|c, v| c.breaker.min_requests = int_at_least(v, 1)?),
    },
    Key {
        name: "breaker.sleepWindowMs",
        default: DefaultValue::Value("30000"),
        reload: Reload::Live,
        doc: "time open before a probe",
        set: plain!(|c, v| c.breaker.sleep_window_ms = ms(v, 1)?),
    },
    Key {
        name: "breaker.windowMs",
        default: DefaultValue::Value("30000"),
        reload: Reload::Restart,
        doc: "the rolling window (a whole number of buckets)",
        set: plain!(|c, v| c.breaker.window_ms = ms(v, 1)?),
    },
    Key {
        name: "breaker.bucketMs",
        default: DefaultValue::Value("1000"),
        reload: Reload::Restart,
        doc: "the window's buckets (at most 3600 of them)",
        set: plain!(|c, v| c.breaker.bucket_ms = ms(v, 1)?),
    },
    Key {
        name: "breaker.halfOpenMaxProbes",
        default: DefaultValue::Value("1"),
        reload: Reload::Live,
        doc: "concurrent probes while half-open",
        set: plain!(|c, v| c.breaker.half_open_max_probes = int_at_least(v, 1)?),
    },
    Key {
        name: "breaker.halfOpenSuccesses",
        default: DefaultValue::Value("1"),
        reload: Reload::Live,
        doc: "consecutive successes that close it",
        set: plain!(|c, v| c.breaker.half_open_successes = int_at_least(v, 1)?),
    },
    Key {
        name: "breaker.failureStatuses",
        default: DefaultValue::Value("500-599"),
        reload: Reload::Live,
        doc: "upstream statuses and ranges that count as failures",
        set: plain!(|c, v| c.breaker.failure_statuses = statuses(v)?),
    },
    Key {
        name: "breaker.bypassDebug",
        default: DefaultValue::Value("true"),
        reload: Reload::Live,
        doc: "/debug/ requests pass an open breaker and are not recorded",
        set: plain!(|c, v| c.breaker.bypass_debug = boolean(v)?),
    },
    // Fleet-wide limits (crate::fleet).
    Key {
        name: "fleet.store",
        default: DefaultValue::Unset("(none: no fleet limits)"),
        reload: Reload::Restart,
        doc: "where the fleet's counts live: redis://[user@]host[:port][/db], rediss://… (TLS) or redis+cluster://host:port,… (a Redis Cluster's seeds)",
        set: plain!(|c, v| c.fleet.store = Some(StoreUrl::parse(v)?)),
    },
    Key {
        name: "fleet.passwordFile",
        default: DefaultValue::Unset("(none: no AUTH)"),
        reload: Reload::Restart,
        doc: "file whose first line is the store's password (checked as admin.tokenFile is)",
        set: plain!(|c, v| {
            let (path, password) = secret_file(v, 1, "the password")?;
            (c.fleet.password, c.fleet.password_file) = (Some(password), Some(path));
        }),
    },
    Key {
        name: "fleet.hashKeyFile",
        default: DefaultValue::Unset("(none)"),
        reload: Reload::Restart,
        doc: "file every node of the fleet shares whose first line (at least 16 characters) keys the hash of a session in the store; needed by fleet.maxSessionConnections",
        set: plain!(|c, v| {
            let (path, key) = secret_file(v, 16, "the hash key")?;
            (c.fleet.hash_key, c.fleet.hash_key_file) = (Some(key), Some(path));
        }),
    },
    Key {
        name: "fleet.maxSessionConnections",
        default: DefaultValue::Value("0"),
        reload: Reload::Live,
        doc: "in-flight requests per Authorization value across every daemon of the fleet (0: no fleet limit)",
        set: plain!(|c, v| c.fleet.max_session_connections = int_at_least(v, 0)?),
    },
    Key {
        name: "fleet.maxWebConnections",
        default: DefaultValue::Value("0"),
        reload: Reload::Live,
        doc: "in-flight requests carrying X-Client-Id across every daemon of the fleet (0: no fleet limit)",
        set: plain!(|c, v| c.fleet.max_web_connections = int_at_least(v, 0)?),
    },
    Key {
        name: "fleet.name",
        default: DefaultValue::Value("default"),
        reload: Reload::Restart,
        doc: "daemons with the same store and name share their budgets (A-Z a-z 0-9 . _ -)",
        set: plain!(|c, v| c.fleet.name = fleet_name(v)?),
    },
    Key {
        name: "fleet.leaseMs",
        default: DefaultValue::Value("3000"),
        reload: Reload::Restart,
        doc: "how long a node's permits outlive it when it stops renewing them (renewed every third of it)",
        set: plain!(|c, v| c.fleet.lease_ms = ms(v, 300)?),
    },
    Key {
        name: "fleet.timeoutMs",
        default: DefaultValue::Value("20"),
        reload: Reload::Live,
        doc: "a store that has not answered a request's ask within this long is down until it answers again",
        set: plain!(|c, v| c.fleet.timeout_ms = ms(v, 1)?),
    },
    Key {
        name: "fleet.onStoreDown",
        default: DefaultValue::Value("share"),
        reload: Reload::Live,
        doc: "while the store is down: share (within the share each node holds, until its lease would end; then 503 fleet_down), refuse (503 fleet_down) or local (the node's own limits alone: the fleet's limit is lifted)",
        set: plain!(|c, v| c.fleet.on_store_down = OnStoreDown::parse(v)?),
    },
];

fn cpus() -> String {
    std::thread::available_parallelism().map_or(2, std::num::NonZero::get).to_string()
}

/// Who a key in a file belongs to.
pub(super) enum Lookup {
    /// One of the daemon's; the port for a per-port key.
    Daemon(&'static Key, Option<u16>),
    /// The business runtime's (ignored).
    Runtime,
}

/// Keys the daemon no longer has, and why: a file that still sets one is
/// not refused (it worked with the release before), but warned about,
/// naming the key. Each is removed a release after it retired.
pub const RETIRED: &[(&str, &str)] = &[(
    "http.h1Engine",
    "limiter has one HTTP/1.x engine (its own; hyper's HTTP/1 server is gone), so there is nothing to choose: remove the key",
)];

/// Why `name` is a retired key, if it is one.
pub fn retired(name: &str) -> Option<&'static str> {
    RETIRED.iter().find(|(k, _)| *k == name).map(|(_, why)| *why)
}

/// Finds `name` in the table. `Err` says why a name in the daemon's
/// namespaces is not a key.
pub(super) fn lookup(name: &str) -> Result<Lookup, String> {
    if let Some(rest) = name.strip_prefix("kernel.port.") {
        return per_port(rest);
    }
    if let Some(key) = KEYS.iter().find(|k| !k.per_port() && k.name == name) {
        return Ok(Lookup::Daemon(key, None));
    }
    let namespace = name.split('.').next().unwrap_or(name);
    if OWNED_NAMESPACES.contains(&namespace) {
        return Err(format!(
            "unknown key under `{namespace}.` (keys there are the daemon's; see the README's key table)"
        ));
    }
    Ok(Lookup::Runtime)
}

/// `<port>.<option>` after `kernel.port.`.
fn per_port(rest: &str) -> Result<Lookup, String> {
    let options: Vec<&str> =
        KEYS.iter().filter(|k| k.per_port()).filter_map(|k| k.name.rsplit('.').next()).collect();
    let Some((port, option)) = rest.split_once('.') else {
        let expected: Vec<String> = options.iter().map(|o| format!("kernel.port.<port>.{o}")).collect();
        return Err(format!("expected {}", expected.join(" or ")));
    };
    let port: u16 = match port.parse() {
        Ok(p) if p >= 1 => p,
        _ => return Err(format!("`{port}` is not a port (1-65535)")),
    };
    KEYS.iter()
        .find(|k| k.per_port() && k.name.rsplit('.').next() == Some(option))
        .map(|k| Lookup::Daemon(k, Some(port)))
        .ok_or_else(|| {
            format!("unknown option `{option}` (kernel.port.<port> has {})", options.join(" and "))
        })
}

/// The concrete key a per-port table key takes for `port`.
pub(super) fn concrete(key: &Key, port: Option<u16>) -> String {
    match port {
        Some(p) => key.name.replace("<port>", &p.to_string()),
        None => key.name.to_owned(),
    }
}
