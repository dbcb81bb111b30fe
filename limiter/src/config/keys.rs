//! The one table of the daemon's keys: name, default, whether a reload
//! applies it (live) or it needs a restart, a one-line doc, and the parser
//! that stores it in [`Config`].
//!
//! Everything about a key comes from here: parsing and the owned-key check
//! ([`lookup`]), the defaults ([`Config::default`] is the empty file), the
//! description `check-config` prints, the reload diff and the restart-only
//! refusal, and the manual's key reference (`docs/configuration.md`,
//! rendered by [`super::reference`]).

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
    /// No value; the text says what that means (the key reference shows it).
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
    /// One line: what the key does (`check-config` prints it).
    pub doc: &'static str,
    /// What the key does in full, as the manual's key reference writes it
    /// (Markdown, one paragraph).
    pub manual: &'static str,
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
        manual: "`false` runs the HTTP proxy alone, without the kernel gate (and without eBPF privileges)",
        set: plain!(|c, v| c.kernel.enabled = boolean(v)?),
    },
    Key {
        name: "kernel.ports",
        default: DefaultValue::Unset("(none)"),
        reload: Reload::Live,
        doc: "port:max, ...: most established server-side TCP connections per local port",
        manual: "`port:max, ...`: at most `max` established server-side TCP connections on local `port` (1-65535, max ≥ 1). Every port is *counted*; only listed ports are *enforced*.",
        set: plain!(|c, v| c.kernel.ports = parse_ports(v)?),
    },
    Key {
        name: "kernel.pinPath",
        default: DefaultValue::Value("/sys/fs/bpf/limiter"),
        reload: Reload::Restart,
        doc: "bpffs directory of the gate's maps and links",
        manual: "bpffs directory for the gate's maps and links. If its parent is not on bpffs, bpffs is mounted there.",
        set: plain!(|c, v| c.kernel.pin_path = absolute_path(v)?),
    },
    Key {
        name: "kernel.cgroup",
        default: DefaultValue::Unset("root of the cgroup v2 mount (found in `/proc/self/mounts`)"),
        reload: Reload::Restart,
        doc: "cgroup v2 directory whose sockets are counted",
        manual: "cgroup whose sockets are counted (servers must live in it or below)",
        set: plain!(|c, v| c.kernel.cgroup = Some(absolute_path(v)?)),
    },
    Key {
        name: "kernel.netns",
        default: DefaultValue::Unset("the daemon's own"),
        reload: Reload::Restart,
        doc: "network namespace to gate (/proc/PID/ns/net or /var/run/netns/NAME)",
        manual: "network namespace to gate: `/proc/PID/ns/net` or `/var/run/netns/NAME`",
        set: plain!(|c, v| c.kernel.netns = Some(absolute_path(v)?)),
    },
    Key {
        name: "kernel.port.<port>.perSourceMax",
        default: DefaultValue::Unset("(none)"),
        reload: Reload::Live,
        doc: "most established connections to the port from one client group",
        manual: "at most this many established connections to `port` from one client group (≥ 1); a port may have this without a `kernel.ports` entry",
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
        manual: "the port's caps count what they would refuse (`limiter_kernel_would_refuse_total`) and refuse nothing",
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
        manual: "connections the gate can count at once, on every port together (a power of two, 4096 to 16777216; 16 bytes each, allocated with the gate: 4 MiB by default). Size it at twice the most connections the gated cgroup holds; a connection past it is neither counted nor refused later (`limiter_kernel_untracked_sockets_total`)",
        set: plain!(|c, v| c.kernel.connection_table_size = power_of_two_in(v, 4096, 1 << 24)?),
    },
    Key {
        name: "kernel.sourcePrefixV4",
        default: DefaultValue::Value("32"),
        reload: Reload::Restart,
        doc: "client groups of per-source caps: IPv4 addresses masked to this many bits",
        manual: "client groups for per-source caps: IPv4 addresses masked to this many bits (1-32), as connlimit's `--connlimit-mask`",
        set: plain!(|c, v| c.kernel.source_prefix_v4 = int_in(v, 1, 32)?),
    },
    Key {
        name: "kernel.sourcePrefixV6",
        default: DefaultValue::Value("64"),
        reload: Reload::Restart,
        doc: "client groups of per-source caps: IPv6 addresses masked to this many bits",
        manual: "the same for IPv6 (1-128); IPv4-mapped IPv6 clients of a dual-stack listener count as IPv4",
        set: plain!(|c, v| c.kernel.source_prefix_v6 = int_in(v, 1, 128)?),
    },
    Key {
        name: "kernel.sourceTableSize",
        default: DefaultValue::Value("65536"),
        reload: Reload::Restart,
        doc: "slots of the per-source table (a power of two, 1024 to 1048576)",
        manual: "slots of the per-source table (a power of two, 1024 to 1048576; 32 bytes each)",
        set: plain!(|c, v| c.kernel.source_table_size = power_of_two_in(v, 1024, 1 << 20)?),
    },
    Key {
        name: "kernel.trusted",
        default: DefaultValue::Unset("(none)"),
        reload: Reload::Live,
        doc: "prefixes that pass per-source caps and get a reserve past a full port",
        manual: "prefixes (`10.0.0.0/8, fd00::/8, 192.0.2.7`) whose connections pass per-source caps and get `kernel.trustedReserve` extra past a full port",
        set: plain!(|c, v| c.kernel.trusted = prefixes(v)?),
    },
    Key {
        name: "kernel.trustedReserve",
        default: DefaultValue::Value("3"),
        reload: Reload::Live,
        doc: "connections from trusted prefixes admitted past a full port's limit",
        manual: "connections from trusted prefixes admitted past a full port's limit",
        set: plain!(|c, v| c.kernel.trusted_reserve = int_at_least(v, 0)?),
    },
    Key {
        name: "kernel.xdp.interfaces",
        default: DefaultValue::Unset("(none)"),
        reload: Reload::Restart,
        doc: "interfaces whose ingress refuses SYNs with XDP",
        manual: "interfaces (names in `kernel.netns`) whose ingress refuses SYNs with XDP",
        set: plain!(|c, v| c.kernel.xdp_interfaces = interfaces(v)?),
    },
    Key {
        name: "kernel.xdp.mode",
        default: DefaultValue::Value("auto"),
        reload: Reload::Restart,
        doc: "auto (generic on a veth, else driver mode, else generic), driver or generic",
        manual: "`auto`: generic mode on a veth, driver mode elsewhere (generic where the driver has no XDP); `driver`; `generic` (see \"XDP on veth\")",
        set: plain!(|c, v| c.kernel.xdp_mode = xdp_mode(v)?),
    },
    // The admin listener.
    Key {
        name: "admin.listen",
        default: DefaultValue::Value("127.0.0.1:9901"),
        reload: Reload::Restart,
        doc: "admin listener (TCP): GET /metrics and /healthz; with admin.tokenFile, every admin path behind the token",
        manual: "the TCP admin listener, which every local user can reach: `GET /metrics` and `GET /healthz` only (403 for every other path), unless `admin.tokenFile` is set; then every admin path, each but `/healthz` behind the token (see \"Who can do what on a node\")",
        set: plain!(|c, v| c.admin.listen = Addr(socket_addr(v)?)),
    },
    Key {
        name: "admin.socket",
        default: DefaultValue::Value("/run/limiter/admin.sock"),
        reload: Reload::Restart,
        doc: "the admin socket: every admin path, no token; who may connect is its mode (0600, root) and admin.socketGroup; `off` for none",
        manual: "the admin socket: every admin path (`/status`, `POST /reload`, the breaker override…), no token; who may connect is its owner and mode: root's, `0600` (`0660` with `admin.socketGroup`), in a directory of root's no one else may write (checked; made `0755` if missing). `limiter reload`, `dump` and `top` use it. `off`: no socket (then they use `admin.listen`, with the token)",
        set: plain!(|c, v| c.admin.socket = if v == "off" { None } else { Some(absolute_path(v)?) }),
    },
    Key {
        name: "admin.socketGroup",
        default: DefaultValue::Unset("(none: root only)"),
        reload: Reload::Restart,
        doc: "a group whose members may use the admin socket too (mode 0660)",
        manual: "a group whose members may use the admin socket too (mode `0660`)",
        set: plain!(|c, v| c.admin.socket_group = Some(v.to_owned())),
    },
    Key {
        name: "admin.tokenFile",
        default: DefaultValue::Unset("(none)"),
        reload: Reload::Live,
        doc: "file holding the bearer token that opens every admin path but /healthz on admin.listen",
        manual: "a file whose first line (at least 16 characters, no spaces) is the bearer token that opens every admin path on `admin.listen` (`Authorization: Bearer …`, the scheme in any case; 401 otherwise; `/healthz` needs none); re-read on reload. A file other users may read (any of mode `0007`) is refused, naming it, its owner and its mode: make it `0600`, or `0640` with the daemon's own group; no symbolic link of a user other than root is followed to it. `limiter dump`, `top` and `reload` send it only where `admin.socket` is `off`, and only to a listener root opened",
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
        manual: "log filter: `error`, `warn`, `info`, `debug`, `trace`, or a tracing directive such as `info,limiter::proxy=debug`; changes on reload (`LIMITER_LOG`, when set, overrides it and pins it). h2's own events stay at `error` unless the filter names `h2`",
        set: plain!(|c, v| c.admin.log_level = log_level(v)?),
    },
    Key {
        name: "admin.metricsListen",
        default: DefaultValue::Unset("(none)"),
        reload: Reload::Restart,
        doc: "a metrics-only listener: GET /metrics and /healthz, read-only, no token (for Prometheus)",
        manual: "a second listener that serves `GET /metrics` and `GET /healthz` only (404 for every other path, 405 for other methods), read-only and without the token: what Prometheus scrapes (for example `0.0.0.0:9902` on a node while `admin.listen` stays on loopback)",
        set: plain!(|c, v| c.admin.metrics_listen = Some(Addr(socket_addr(v)?))),
    },
    Key {
        name: "admin.watchConfig",
        default: DefaultValue::Value("false"),
        reload: Reload::Live,
        doc: "reload when the file changes (checked every second; Kubernetes' ConfigMap swap included)",
        manual: "reload when the file changes: what its path resolves to is looked at every second (an edit in place, a rename over it and Kubernetes' ConfigMap `..data` swap all count), with the same all-or-nothing validation as SIGHUP; a bad file is reported once and the next change is tried again",
        set: plain!(|c, v| c.admin.watch_config = boolean(v)?),
    },
    // The HTTP proxy.
    Key {
        name: "http.drainTimeoutMs",
        default: DefaultValue::Value("30000"),
        reload: Reload::Live,
        doc: "on SIGTERM, how long requests in flight may take to finish",
        manual: "on SIGTERM, how long requests in flight may take to finish before their connections are cut",
        set: plain!(|c, v| c.http.drain_timeout_ms = ms(v, 0)?),
    },
    Key {
        name: "http.maxThreads",
        default: DefaultValue::Value("208"),
        reload: Reload::Live,
        doc: "the runtime's thread count: normal pool = maxThreads - 8 - 3",
        manual: "the runtime's thread count; at least 12 (normal pool = maxThreads − 8 − 3)",
        set: plain!(|c, v| c.http.max_threads = int_at_least(v, MIN_MAX_THREADS)?),
    },
    Key {
        name: "http.maxSessionConnections",
        default: DefaultValue::Value("0"),
        reload: Reload::Live,
        doc: "in-flight requests per Authorization value (0: unlimited)",
        manual: "in-flight requests per `Authorization` value (0: unlimited)",
        set: plain!(|c, v| c.http.max_session_connections = int_at_least(v, 0)?),
    },
    Key {
        name: "http.maxWebConnections",
        default: DefaultValue::Value("0"),
        reload: Reload::Live,
        doc: "in-flight requests carrying X-Client-Id (0: unlimited)",
        manual: "in-flight requests carrying `X-Client-Id` (0: unlimited)",
        set: plain!(|c, v| c.http.max_web_connections = int_at_least(v, 0)?),
    },
    Key {
        name: "http.listen",
        default: DefaultValue::Value("127.0.0.1:8080"),
        reload: Reload::Restart,
        doc: "the proxy's address",
        manual: "the proxy's address",
        set: plain!(|c, v| c.http.listen = Addr(socket_addr(v)?)),
    },
    Key {
        name: "http.upstream",
        default: DefaultValue::Unset("(none: the kernel gate alone, no proxy)"),
        reload: Reload::Restart,
        doc: "host:port of the business application, or `sample` for the built-in demo upstream",
        manual: "`host:port` (or `http://host:port`) of the business application; `sample` starts the built-in sample upstream (for demos: `GET /slow?ms=N` answers after N ms). Without it the daemon runs the kernel gate and the admin listener only (gate-only mode, as a replacement for iptables `connlimit`) and says so at start",
        set: plain!(|c, v| c.http.upstream = Some(upstream(v)?)),
    },
    Key {
        name: "http.dryRun",
        default: DefaultValue::Value("false"),
        reload: Reload::Live,
        doc: "count would-be refusals, refuse nothing",
        manual: "count would-be refusals (`limiter_http_would_refuse_total`), refuse nothing; with `http.shedAtSyn`, also count what would be shed at the SYN and shed nothing",
        set: plain!(|c, v| c.http.dry_run = boolean(v)?),
    },
    Key {
        name: "http.shedAtSyn",
        default: DefaultValue::Value("false"),
        reload: Reload::Live,
        doc: "while the normal pool keeps refusing, the kernel gate refuses new connections to the proxy's ports at the SYN (needs kernel.enabled)",
        manual: "coupled shedding: while the normal pool keeps refusing (or the breaker is open), the kernel gate refuses new connections to the proxy's listening ports at the SYN with a RST (reason `shed`); needs `kernel.enabled` (see \"How the two depths work together\")",
        set: plain!(|c, v| c.http.shed_at_syn = boolean(v)?),
    },
    Key {
        name: "http.shedAfterMs",
        default: DefaultValue::Value("200"),
        reload: Reload::Live,
        doc: "the window over which the normal pool's refusal rate is measured: shedding starts once the refusals in the last shedAfterMs reach http.shedRefusalRate × shedAfterMs (an open breaker counts as refusing at that rate)",
        manual: "the window over which the normal pool's refusal rate is measured (at least 10): shedding starts once the refusals in the last `http.shedAfterMs` reach `http.shedRefusalRate` × `http.shedAfterMs` (an open breaker counts as refusing at that rate)",
        set: plain!(|c, v| c.http.shed_after_ms = ms(v, 10)?),
    },
    Key {
        name: "http.shedRefusalRate",
        default: DefaultValue::Value("500"),
        reload: Reload::Live,
        doc: "refusals per second of the normal pool, over http.shedAfterMs, that start shedding",
        manual: "refusals per second of the normal pool, over `http.shedAfterMs`, that start shedding (at least 1); below about 80 refusals in the window the configuration warns (see \"How the two depths work together\")",
        set: plain!(|c, v| c.http.shed_refusal_rate = u64::from(int_at_least(v, 1)?)),
    },
    Key {
        name: "http.shedReleaseMs",
        default: DefaultValue::Value("1000"),
        reload: Reload::Live,
        doc: "how long the normal pool must have refused nothing before shedding stops",
        manual: "how long the normal pool must have refused nothing before shedding stops (at least 10)",
        set: plain!(|c, v| c.http.shed_release_ms = ms(v, 10)?),
    },
    Key {
        name: "http.adaptive",
        default: DefaultValue::Value("off"),
        reload: Reload::Live,
        doc: "on: the normal pool's limit is learnt from the upstream's latency, between http.adaptive.minLimit and http.maxThreads - 11; off: it is http.maxThreads - 11",
        manual: "`on`: the normal pool's limit is learnt from the upstream's latency (time to the response head), between `http.adaptive.minLimit` and `http.maxThreads − 11`, which stays the ceiling; `off`: the static pool (see \"Adaptive limits and criticality\")",
        set: plain!(|c, v| c.http.adaptive = on_off(v)?),
    },
    Key {
        name: "http.adaptive.minLimit",
        default: DefaultValue::Value("4"),
        reload: Reload::Live,
        doc: "the learnt limit never goes below this (nor above http.maxThreads - 11)",
        manual: "the learnt limit never goes below this (at least 1; a value above the static pool is the static pool)",
        set: plain!(|c, v| c.http.adaptive_min_limit = int_at_least(v, 1)?),
    },
    Key {
        name: "http.critical",
        default: DefaultValue::Unset("(none)"),
        reload: Reload::Live,
        doc: "path prefixes of critical requests, on the normalised path: refused last when the normal pool is at its limit",
        manual: "comma-separated path prefixes of critical requests, matched on the normalised path exactly as `/debug/` is (`/api/pay/` matches `/api/pay/x` and `/api/x/../pay/x`; write the trailing `/` to match whole segments): under pressure the last sixteenth of the normal pool is theirs, and they are refused last",
        set: plain!(|c, v| c.http.critical = path_prefixes(v)?),
    },
    Key {
        name: "http.sheddable",
        default: DefaultValue::Unset("(none)"),
        reload: Reload::Live,
        doc: "path prefixes of sheddable requests, on the normalised path: refused first when the normal pool is at its limit",
        manual: "path prefixes of sheddable requests, matched the same way (a path matching both is critical): under pressure they may use three quarters of the normal pool, so they are refused first",
        set: plain!(|c, v| c.http.sheddable = path_prefixes(v)?),
    },
    Key {
        name: "http.headerReadTimeoutMs",
        default: DefaultValue::Value("10000"),
        reload: Reload::Live,
        doc: "a client must send a complete request head within this long",
        manual: "a client must send a complete request head within this long of the connection being ready for one (after accept, or after the previous response on a keep-alive connection: so it also closes idle keep-alive connections). Slow clients are cut off; they never held a permit.",
        set: plain!(|c, v| c.http.header_read_timeout_ms = ms(v, 100)?),
    },
    Key {
        name: "http.idleTimeoutMs",
        default: DefaultValue::Value("60000"),
        reload: Reload::Live,
        doc: "a body that makes no progress this long is aborted; idle pooled upstream connections close",
        manual: "a request or response body that makes no progress this long is aborted and its permit returned; a client that stops reading is cut off after it; pooled upstream connections idle this long are closed",
        set: plain!(|c, v| c.http.idle_timeout_ms = ms(v, 100)?),
    },
    Key {
        name: "http.connectTimeoutMs",
        default: DefaultValue::Value("2000"),
        reload: Reload::Live,
        doc: "connecting to the upstream (then 502)",
        manual: "connecting to the upstream (then 502)",
        set: plain!(|c, v| c.http.connect_timeout_ms = ms(v, 1)?),
    },
    Key {
        name: "http.maxUpstreamConnections",
        default: DefaultValue::Value("0"),
        reload: Reload::Restart,
        doc: "upstream connections open or connecting, on every worker together (0: http.maxThreads); a request that finds them all busy for http.connectTimeoutMs gets 503 upstream_full",
        manual: "upstream connections open or connecting, every worker's together (0: one per upstream thread, `http.maxThreads`, following its reloads); a request that finds them all busy waits for one to come free for at most `http.connectTimeoutMs`, then gets 503 `upstream_full` (limiter's own cap: never a breaker failure). See \"Upstream connections\"",
        set: plain!(|c, v| c.http.max_upstream_connections = int_at_least(v, 0)?),
    },
    Key {
        name: "http.upstreamTimeoutMs",
        default: DefaultValue::Value("30000"),
        reload: Reload::Live,
        doc: "from the request sent upstream to the upstream's response head (then 504)",
        manual: "from the request fully sent upstream (body included) to the upstream's response head (then 504); while a body is still uploading, `http.idleTimeoutMs` guards it instead",
        set: plain!(|c, v| c.http.upstream_timeout_ms = ms(v, 1)?),
    },
    Key {
        name: "http.upstreamAbandonMs",
        default: DefaultValue::Value("60000"),
        reload: Reload::Live,
        doc: "after limiter gave up on a request the upstream still works on (a 504, a client gone mid-response, a body that failed mid-upload), how long its permits stay held waiting for the upstream's answer (0: given back at once)",
        manual: "after limiter gave up on a request the upstream still works on (a 504, a client gone before the response was delivered, a request body that failed half-way upstream), how long its permits stay held while limiter reads the upstream's answer to its end; past it the upstream connection is closed and the permits return (0: at once). See \"When an exchange ends early\"",
        set: plain!(|c, v| c.http.upstream_abandon_ms = ms(v, 0)?),
    },
    Key {
        name: "http.maxTunnels",
        default: DefaultValue::Value("1024"),
        reload: Reload::Live,
        doc: "upgraded connections (WebSocket tunnels) open at once; an upgrade request past it gets 503 tunnels (0: unlimited)",
        manual: "upgraded connections (WebSocket tunnels) open at once, with upgrade requests waiting for the upstream's answer; one more gets 503 `tunnels` (0: unlimited). Counted per daemon, `/debug/` upgrades included",
        set: plain!(|c, v| c.http.max_tunnels = int_at_least(v, 0)?),
    },
    Key {
        name: "http.maxTunnelsPerClient",
        default: DefaultValue::Value("64"),
        reload: Reload::Live,
        doc: "upgraded connections open at once from one client group (kernel.sourcePrefixV4/V6); one more gets 503 tunnels_per_client (0: unlimited)",
        manual: "upgraded connections open at once from one client group (the client's address masked to `kernel.sourcePrefixV4` or `kernel.sourcePrefixV6`, as the per-source caps group them), upgrade requests waiting for the upstream's answer included; one more gets 503 `tunnels_per_client`, so one client cannot take every `http.maxTunnels` place (0: unlimited). Sources in `kernel.trusted` and connections from `http.trustedForwarders` count under `http.maxTunnels` alone",
        set: plain!(|c, v| c.http.max_tunnels_per_client = int_at_least(v, 0)?),
    },
    Key {
        name: "http.tunnelIdleTimeoutMs",
        default: DefaultValue::Value("300000"),
        reload: Reload::Live,
        doc: "an upgraded connection with no byte either way for this long is closed and its place freed (0: never)",
        manual: "an upgraded connection (a WebSocket) that carried no byte either way for this long is closed, both sides, and its `http.maxTunnels` place freed (0: never; HAProxy's `timeout tunnel`). A tunnel whose client has gone (its side closed or failed) gets 1 s for the upstream to close too, then is closed whatever the upstream does. Applies to tunnels opened after a reload",
        set: plain!(|c, v| c.http.tunnel_idle_timeout_ms = ms(v, 0)?),
    },
    Key {
        name: "http.underscoresInHeaders",
        default: DefaultValue::Value("off"),
        reload: Reload::Live,
        doc: "on: request fields whose name holds a `_` reach the upstream, unless the name stands for a forwarding header or one limiter interprets; off: they are dropped (nginx's underscores_in_headers)",
        manual: "`off`: request fields whose name holds a `_` never reach the upstream (nginx's `underscores_in_headers off`: CGI-style upstreams read `X_Forwarded_For` as `X-Forwarded-For`); `on`: they pass, unless the name with `-` for `_` is a forwarding header or one limiter interprets (`Host`, `Content-Length`, `Authorization`, `X-Client-Id`, the hop-by-hop ones)",
        set: plain!(|c, v| c.http.underscores_in_headers = on_off(v)?),
    },
    Key {
        name: "http.maxHeaderBytes",
        default: DefaultValue::Value("16384"),
        reload: Reload::Live,
        doc: "request heads larger than this get 431",
        manual: "request heads larger than this get 431 (at least 8192)",
        set: plain!(|c, v| c.http.max_header_bytes = int_at_least(v, 8192)?),
    },
    Key {
        name: "http.lingerMs",
        default: DefaultValue::Value("2000"),
        reload: Reload::Live,
        doc: "after a Connection: close response, how long to drain what the client may still send",
        manual: "after a `Connection: close` response while the client may still be sending (a request body not read, bytes waiting), how long the connection keeps reading and discarding what the client still sends (at most 64 MiB), so the response is not destroyed by a RST; with nothing unread the socket closes at once",
        set: plain!(|c, v| c.http.linger_ms = ms(v, 0)?),
    },
    Key {
        name: "http.retryAfterMs",
        default: DefaultValue::Value("1000"),
        reload: Reload::Live,
        doc: "the Retry-After of admission 503s, rounded up to whole seconds",
        manual: "the `Retry-After` of admission 503s, rounded up to whole seconds",
        set: plain!(|c, v| c.http.retry_after_ms = ms(v, 0)?),
    },
    Key {
        name: "http.requestBufferBytes",
        default: DefaultValue::Value("65536"),
        reload: Reload::Live,
        doc: "request bodies up to this size are read whole before the permits are taken (0: off)",
        manual: "a request body of known length up to this many bytes, or a chunked one that ends within it, is read whole **before** the permits are taken, so a client that sends slowly holds none of the upstream's threads (0: off, every body streams holding its permit)",
        set: plain!(|c, v| c.http.request_buffer_bytes = int_at_least(v, 0)?),
    },
    Key {
        name: "http.requestBodyTimeoutMs",
        default: DefaultValue::Value("30000"),
        reload: Reload::Live,
        doc: "a body read whole must arrive within this long (then 408)",
        manual: "a body read whole must have arrived within this long of its head (then 408 and close)",
        set: plain!(|c, v| c.http.request_body_timeout_ms = ms(v, 1)?),
    },
    Key {
        name: "http.bufferMemoryBytes",
        default: DefaultValue::Value("67108864"),
        reload: Reload::Live,
        doc: "all buffered request bodies and response read-ahead together (then 503 buffer_full)",
        manual: "all buffered request bodies and response read-ahead together; a body that finds the budget spent is refused with 503 `buffer_full` (never silently streamed), and responses fall back to streaming",
        set: plain!(|c, v| c.http.buffer_memory_bytes = u64::from(int_at_least(v, 0)?)),
    },
    Key {
        name: "http.responseBufferBytes",
        default: DefaultValue::Value("65536"),
        reload: Reload::Live,
        doc: "response bodies up to this size are read ahead of the client, so the permit returns at once",
        manual: "a response body up to this many bytes is read from the upstream ahead of the client, so the permit returns when the upstream has delivered its last byte, however slowly the client reads (0: off)",
        set: plain!(|c, v| c.http.response_buffer_bytes = int_at_least(v, 0)?),
    },
    Key {
        name: "http.minDataRate",
        default: DefaultValue::Value("1024"),
        reload: Reload::Live,
        doc: "bytes per second a streamed request body must bring (else 408) and a client read a streamed response (else cut), after a 3 s grace (0: off)",
        manual: "bytes per second, over every stretch after a 3 s grace, that a request body streamed while holding a permit (one larger than `http.requestBufferBytes`) must bring, else 408, its upstream request aborted and the permit returned; and that a client must read of a response streamed holding a permit (one larger than `http.responseBufferBytes`), else its connection is cut and the permit returned (0: off)",
        set: plain!(|c, v| c.http.min_data_rate = int_at_least(v, 0)?),
    },
    Key {
        name: "http.tls.listen",
        default: DefaultValue::Unset("(none: no TLS listener)"),
        reload: Reload::Restart,
        doc: "the proxy's TLS address (TLS 1.2 and 1.3, ALPN h2 and http/1.1)",
        manual: "the proxy's TLS address, beside `http.listen` (either or both may serve): TLS 1.3 and 1.2 only, ALPN `h2` then `http/1.1`; needs `http.tls.certFile` and `http.tls.keyFile`",
        set: plain!(|c, v| c.http.tls_listen = Some(Addr(socket_addr(v)?))),
    },
    Key {
        name: "http.tls.certFile",
        default: DefaultValue::Unset("(none)"),
        reload: Reload::Live,
        doc: "PEM certificate chain, leaf first; a reload re-reads it for new handshakes",
        manual: "PEM certificate chain, leaf first. Read and checked at start, by `check-config` and at every reload (a reload re-reads it even when the path is the same: rotation); an unreadable file, no `CERTIFICATE` block, or a key that does not match is an error naming the file, and a reload with one changes nothing; an expired certificate is a warning",
        set: plain!(|c, v| c.http.tls_cert_file = Some(absolute_path(v)?)),
    },
    Key {
        name: "http.tls.keyFile",
        default: DefaultValue::Unset("(none)"),
        reload: Reload::Live,
        doc: "PEM private key of the certificate (PKCS#8, RSA or EC); a reload re-reads it",
        manual: "PEM private key of the certificate (`PRIVATE KEY`, `RSA PRIVATE KEY` or `EC PRIVATE KEY`), re-read with it",
        set: plain!(|c, v| c.http.tls_key_file = Some(absolute_path(v)?)),
    },
    Key {
        name: "http.tls.handshakeTimeoutMs",
        default: DefaultValue::Value("10000"),
        reload: Reload::Live,
        doc: "a TLS handshake not done this long after the connection was accepted is cut",
        manual: "a TLS handshake not finished this long after the connection was accepted is cut (`limiter_tls_handshakes_total{result=\"timeout\"}`); handshakes hold no permit",
        set: plain!(|c, v| c.http.tls_handshake_timeout_ms = ms(v, 1)?),
    },
    Key {
        name: "http.trustedForwarders",
        default: DefaultValue::Unset("(none)"),
        reload: Reload::Live,
        doc: "prefixes of proxies in front whose forwarding headers are kept and extended; from any other client they are replaced",
        manual: "prefixes (`10.0.0.0/8, 192.0.2.7`) of the proxies in front whose forwarding headers are kept and extended; from any other client limiter removes every forwarding header and writes its own (see \"Forwarding headers\"); applies to connections accepted after a reload",
        set: plain!(|c, v| c.http.trusted_forwarders = prefixes(v)?),
    },
    Key {
        name: "http.h2c",
        default: DefaultValue::Value("false"),
        reload: Reload::Restart,
        doc: "http.listen also accepts prior-knowledge cleartext HTTP/2",
        manual: "`http.listen` also accepts prior-knowledge cleartext HTTP/2 (a client that starts with the HTTP/2 preface); HTTP/1.1 there is unchanged",
        set: plain!(|c, v| c.http.h2c = boolean(v)?),
    },
    Key {
        name: "http.h2.maxConcurrentStreams",
        default: DefaultValue::Value("100"),
        reload: Reload::Live,
        doc: "streams one HTTP/2 connection may have open (for connections opened after a reload)",
        manual: "streams one HTTP/2 connection may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS), for connections opened after a reload",
        set: plain!(|c, v| c.http.h2_max_concurrent_streams = int_at_least(v, 1)?),
    },
    Key {
        name: "http.h2.resetRefusalMs",
        default: DefaultValue::Value("0"),
        reload: Reload::Restart,
        doc: "a client group with 10 HTTP/2 connections ended for stream resets within 10 s is refused at accept this long (0: never)",
        manual: "a client group (`kernel.sourcePrefixV4`/`V6`) with 10 HTTP/2 connections ended for stream resets within 10 s is refused at accept this long: its new connections get a RST before anything is read; trusted prefixes never (0: never; see \"What limiter trusts\")",
        set: plain!(|c, v| c.http.h2_reset_refusal_ms = ms(v, 0)?),
    },
    Key {
        name: "http.accessLog",
        default: DefaultValue::Value("off"),
        reload: Reload::Live,
        doc: "off, stderr or a file: one JSON line per request; SIGUSR1 reopens the file",
        manual: "`off`, `stderr`, or an absolute path (appended to; its directory must exist): one JSON line per request, written off the request path (see \"Access log\")",
        set: plain!(|c, v| c.http.access_log = access_log(v)?),
    },
    Key {
        name: "http.workers",
        default: DefaultValue::Computed("number of CPUs", cpus),
        reload: Reload::Restart,
        doc: "proxy worker threads, each with its own event loop, listener and upstream pool",
        manual: "proxy worker threads, each with its own event loop, listener (`SO_REUSEPORT`) and upstream pool",
        set: plain!(|c, v| c.http.workers = int_at_least(v, 1)? as usize),
    },
    // The circuit breaker.
    Key {
        name: "breaker.threshold",
        default: DefaultValue::Value("0.5"),
        reload: Reload::Live,
        doc: "error rate above which the breaker opens",
        manual: "error rate above which the breaker opens (0 < x < 1)",
        set: plain!(|c, v| c.breaker.threshold = ratio(v)?),
    },
    Key {
        name: "breaker.minRequests",
        default: DefaultValue::Value("10"),
        reload: Reload::Live,
        doc: "results the window must hold before it may open",
        manual: "results the window must hold before it may open",
        set: plain!(|c, v| c.breaker.min_requests = int_at_least(v, 1)?),
    },
    Key {
        name: "breaker.sleepWindowMs",
        default: DefaultValue::Value("30000"),
        reload: Reload::Live,
        doc: "time open before a probe",
        manual: "time open before a probe",
        set: plain!(|c, v| c.breaker.sleep_window_ms = ms(v, 1)?),
    },
    Key {
        name: "breaker.windowMs",
        default: DefaultValue::Value("30000"),
        reload: Reload::Restart,
        doc: "the rolling window (a whole number of buckets)",
        manual: "the rolling window: a whole number of buckets, at most 3600 of them",
        set: plain!(|c, v| c.breaker.window_ms = ms(v, 1)?),
    },
    Key {
        name: "breaker.bucketMs",
        default: DefaultValue::Value("1000"),
        reload: Reload::Restart,
        doc: "the window's buckets (at most 3600 of them)",
        manual: "the window's buckets",
        set: plain!(|c, v| c.breaker.bucket_ms = ms(v, 1)?),
    },
    Key {
        name: "breaker.halfOpenMaxProbes",
        default: DefaultValue::Value("1"),
        reload: Reload::Live,
        doc: "concurrent probes while half-open",
        manual: "concurrent probes while half-open",
        set: plain!(|c, v| c.breaker.half_open_max_probes = int_at_least(v, 1)?),
    },
    Key {
        name: "breaker.halfOpenSuccesses",
        default: DefaultValue::Value("1"),
        reload: Reload::Live,
        doc: "consecutive successes that close it",
        manual: "consecutive successes that close it",
        set: plain!(|c, v| c.breaker.half_open_successes = int_at_least(v, 1)?),
    },
    Key {
        name: "breaker.failureStatuses",
        default: DefaultValue::Value("500-599"),
        reload: Reload::Live,
        doc: "upstream statuses and ranges that count as failures",
        manual: "statuses and ranges that count as failures (the list replaces the default)",
        set: plain!(|c, v| c.breaker.failure_statuses = statuses(v)?),
    },
    Key {
        name: "breaker.bypassDebug",
        default: DefaultValue::Value("true"),
        reload: Reload::Live,
        doc: "/debug/ requests pass an open breaker and are not recorded",
        manual: "`/debug/` requests pass an open breaker and are not recorded",
        set: plain!(|c, v| c.breaker.bypass_debug = boolean(v)?),
    },
    // Fleet-wide limits (crate::fleet).
    Key {
        name: "fleet.store",
        default: DefaultValue::Unset("(none: no fleet limits)"),
        reload: Reload::Restart,
        doc: "where the fleet's counts live: redis://[user@]host[:port][/db], rediss://… (TLS), redis+cluster://host:port,… (a Redis Cluster's seeds) or redis+sentinel://host:port,…/<master> (Sentinels)",
        manual: "where the fleet's counts live: `redis://[user@]host[:port][/db]` (port 6379 by default; a primary: a replica or a Sentinel named there is refused at start, exit 78), `rediss://…` (TLS with rustls; the system's roots, or `SSL_CERT_FILE`), `redis+cluster://host:port,host:port,…` (seed nodes of a Redis Cluster; `rediss+cluster://` over TLS), or `redis+sentinel://host:port,host:port,…/<master>[/db]` (Sentinels, port 26379 by default, asked without a password for `<master>`'s primary, found again after a failover; `rediss+sentinel://` reaches the primary over TLS). No password in the address: a `user:password@` is refused, naming `fleet.passwordFile`. Needs `http.upstream` (see \"Fleet-wide limits\")",
        set: plain!(|c, v| c.fleet.store = Some(StoreUrl::parse(v)?)),
    },
    Key {
        name: "fleet.passwordFile",
        default: DefaultValue::Unset("(none: no AUTH)"),
        reload: Reload::Restart,
        doc: "file whose first line is the store's password (checked as admin.tokenFile is)",
        manual: "a file whose first line is the store's password (for the user of `fleet.store`, or `default`), checked as `admin.tokenFile` is (mode, links); changed contents need a restart too",
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
        manual: "a file every node of the fleet shares whose first line (at least 16 characters, no spaces) keys the hash that names a session in the store, checked as `admin.tokenFile` is; needed by `fleet.maxSessionConnections`",
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
        manual: "in-flight requests per `Authorization` value (the scheme normalised, as `http.maxSessionConnections` keys it) across every daemon naming the same store and `fleet.name` (0: no fleet limit); the local limits still apply on each node",
        set: plain!(|c, v| c.fleet.max_session_connections = int_at_least(v, 0)?),
    },
    Key {
        name: "fleet.maxWebConnections",
        default: DefaultValue::Value("0"),
        reload: Reload::Live,
        doc: "in-flight requests carrying X-Client-Id across every daemon of the fleet (0: no fleet limit)",
        manual: "in-flight requests carrying `X-Client-Id` across every daemon of the fleet (0: no fleet limit)",
        set: plain!(|c, v| c.fleet.max_web_connections = int_at_least(v, 0)?),
    },
    Key {
        name: "fleet.name",
        default: DefaultValue::Value("default"),
        reload: Reload::Restart,
        doc: "daemons with the same store and name share their budgets (A-Z a-z 0-9 . _ -)",
        manual: "daemons with the same store and name share their budgets; two fleets can share one Redis (`A-Z a-z 0-9 . _ -`, at most 64)",
        set: plain!(|c, v| c.fleet.name = fleet_name(v)?),
    },
    Key {
        name: "fleet.leaseMs",
        default: DefaultValue::Value("3000"),
        reload: Reload::Restart,
        doc: "how long a node's share outlives it when it stops renewing it (renewed every third of it); a share covers requests shorter than a third of it",
        manual: "how long a node's share outlives it when it stops renewing it (it renews every third of this), by the nodes' own clocks; at least 300. A share admits only requests it covers, those shorter than a third of this, whatever fails (`check-config` warns when `http.upstreamTimeoutMs` + `http.upstreamAbandonMs` is longer); a store that lost the fleet's data (and one the fleet first starts on) lets no share grow for one of it",
        set: plain!(|c, v| c.fleet.lease_ms = ms(v, 300)?),
    },
    Key {
        name: "fleet.timeoutMs",
        default: DefaultValue::Value("20"),
        reload: Reload::Live,
        doc: "a store that has not answered a request's ask within this long is down until it answers again",
        manual: "the longest a request waits for a claim's answer (then 503 `fleet_down`); three late or failed claims in a row (or half of a second's) mark the store down until a probe finds it answering; at most a third of `fleet.leaseMs`",
        set: plain!(|c, v| c.fleet.timeout_ms = ms(v, 1)?),
    },
    Key {
        name: "fleet.onStoreDown",
        default: DefaultValue::Value("share"),
        reload: Reload::Live,
        doc: "while the store is down: share (within the share each node holds while it admits, then the safe share floor(limit / nodes) once the store has refused connections for a lease; else 503 fleet_down), refuse (503 fleet_down) or local (the node's own limits alone: the fleet's limit is lifted)",
        manual: "while the store is down: `share` (each node admits within the share it holds while that admits; once the store has refused connections for a lease (its Redis gone for every node, not only out of this one's reach), up to the safe share `floor(limit / N)` of a budget it holds none of, N the live nodes it saw; else 503 `fleet_down`: the limit holds), `refuse` (503 `fleet_down` to every request a fleet limit applies to) or `local` (each node's own limits alone: the fleet's limit is lifted)",
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
            "unknown key under `{namespace}.` (keys there are the daemon's; see `limiter check-config` or the manual's key reference)"
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
