//! The typed bodies of the admin listener, shared by the daemon (which
//! serves them) and by `dump`/`top` (which read them): a renamed field
//! fails to compile on one side, or fails to parse on the other, instead
//! of silently showing 0.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::{admission, breaker, kernel};

/// `GET /status`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Status {
    pub version: String,
    pub pid: u32,
    pub started_unix: u64,
    /// The configuration file the daemon reads on reload.
    pub config: Option<PathBuf>,
    /// `None`: `kernel.enabled = false`.
    pub kernel: Option<KernelStatus>,
    /// `None`: no `http.upstream`, the kernel gate alone.
    pub http: Option<HttpStatus>,
}

/// How the daemon found the kernel gate at start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GateOrigin {
    /// Loaded and attached by this daemon.
    Loaded,
    /// Already pinned and enforcing; adopted.
    Adopted,
    /// Pinned by a limiter of an older layout; adopted and migrated in place.
    Migrated,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct KernelStatus {
    pub origin: GateOrigin,
    pub target: kernel::Target,
    /// What the maps say now (`dump`, which reads the maps itself, leaves
    /// it out of what it prints).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<kernel::Snapshot>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HttpStatus {
    pub upstream: String,
    pub pools: admission::Snapshot,
    /// Requests refused because the breaker was open (the pools count
    /// their own refusals in `pools`).
    pub refused_breaker: u64,
    /// Requests refused because the buffer budget was spent.
    pub refused_buffer_full: u64,
    /// Requests refused because every upstream connection the cap allows
    /// stayed busy.
    #[serde(default)]
    pub refused_upstream_full: u64,
    /// Upstream connections open or connecting, and their cap
    /// (`http.maxUpstreamConnections`).
    #[serde(default)]
    pub upstream_connections: u64,
    #[serde(default)]
    pub upstream_connection_limit: u64,
    /// Bytes of bodies buffered now (`http.bufferMemoryBytes` bounds it).
    pub buffered_bytes: u64,
    /// Requests receiving their body before admission now.
    pub bodies_receiving: u64,
    pub breaker: breaker::Snapshot,
    /// Upper bound of the bucket holding the 99th percentile of the time to
    /// an admission 503 (`None`: no 503 yet).
    pub time_to_503_p99_bound_seconds: Option<f64>,
    /// Requests (HTTP/2: streams) received so far, by protocol (`h1`,
    /// `h1+tls`, `h2+tls`, `h2c`), in that order.
    #[serde(default)]
    pub requests_by_proto: Vec<(String, u64)>,
    /// Coupled shedding (`http.shedAtSyn`); `None`: no kernel gate.
    #[serde(default)]
    pub shedding: Option<ShedStatus>,
    /// The fleet-wide limits (`fleet.store`); `None`: none.
    #[serde(default)]
    pub fleet: Option<crate::fleet::Snapshot>,
}

/// The coupled shedding's controller, as `/status` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShedStatus {
    /// `http.shedAtSyn` in force.
    pub enabled: bool,
    /// Shedding new connections at the SYN now.
    pub active: bool,
    /// Counting what it would shed, shedding nothing.
    pub dry_run: bool,
    /// The proxy's listening ports, the ones shed.
    pub ports: Vec<u16>,
    /// When the shedding now in force started.
    pub since_unix_ms: Option<u64>,
    /// One new connection in this many is admitted while shedding.
    pub probe_one_in: u32,
    /// Times shedding started and stopped since the daemon started.
    pub started: u64,
    pub stopped: u64,
}

impl HttpStatus {
    /// Requests by protocol, as `dump` and `top` print them.
    pub fn protocols(&self, value: impl Fn(&str, u64) -> String) -> String {
        self.requests_by_proto
            .iter()
            .map(|(p, n)| format!("{p} {}", value(p, *n)))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Every 503 refusal so far, whatever the reason.
    pub fn refused_total(&self) -> u64 {
        self.pools.refused.iter().sum::<u64>()
            + self.refused_breaker
            + self.refused_buffer_full
            + self.refused_upstream_full
    }
}

/// `POST /reload`: `200` with `applied: true` and the changes, or `422`
/// with `applied: false` and why nothing changed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReloadOutcome {
    pub applied: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}
