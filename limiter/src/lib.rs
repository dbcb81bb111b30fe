//! limiter: a node daemon that keeps servers alive under overload by
//! admitting or refusing work from one set of limits.
//!
//! Layout, callers first: a module imports only modules listed below it,
//! and a leaf imports none of the crate's others (both checked against
//! the source by `import_graph`'s tests; no module imports itself through
//! others either):
//! - [`cli`]: one file per command-line verb (`main.rs` parses the command
//!   line and calls these);
//! - [`daemon`]: `limiter run`: start-up, serving, reload, drain, signals,
//!   privileges, logging, the coupled shedding's controller;
//! - [`metrics`]: Prometheus text, one module per part's families (it
//!   reads the parts it renders);
//! - [`admin`]: the admin listener, serving a [`admin::Control`] the daemon
//!   implements; [`admin::api`] holds the typed `/status` and `/reload`
//!   bodies shared with `dump` and `top`;
//! - [`sample_upstream`]: the built-in demo upstream
//!   (`http.upstream = sample`), served by [`plain_http`];
//! - [`plain_http`]: a plain HTTP/1.1 server for limiter's own endpoints
//!   (the admin API, the sample upstream), on the proxy's framing module;
//! - [`proxy`]: the HTTP reverse proxy (HTTP/1.1 and HTTP/2 from clients,
//!   in cleartext and over TLS; HTTP/1.1 over a keep-alive pool to the
//!   upstream): server, per-request pipeline, forwarding, responses;
//! - [`access_log`]: the access log, one JSON line per request, written
//!   by a thread of its own;
//! - [`fleet`]: fleet-wide limits (sessions, web clients) counted across
//!   daemons in Redis, with leases that end with a node that dies;
//! - [`admission`]: HTTP permits (pools, sessions, web clients), counted
//!   with the other daemon's during a handover through a ledger in the
//!   kernel gate's shared memory (so it imports `kernel`);
//! - [`kernel`]: the eBPF gate (load, pin, adopt, swap, unload, maps,
//!   views), with [`kernel::env`] probing privileges, kernel, cgroup v2,
//!   bpffs;
//! - [`breaker`]: the circuit breaker in front of the upstream (no I/O,
//!   injected clock), its ticket and event sink;
//! - [`shedding`] (leaf): when coupled shedding starts and stops (the
//!   hysteresis; `daemon::shedding` samples the pools and raises the
//!   kernel flags);
//! - [`histogram`]: the latency histogram the proxy records into;
//! - [`shard`] (leaf): counters kept one copy per thread, so that workers
//!   bumping them on every request do not share a cache line;
//! - [`config`]: the file's grammar, the one key table, the typed
//!   configuration everything above reads (with the TLS pair it names);
//! - [`lease`] (leaf): a fleet share's lease: its trust, what it covers,
//!   how long it admits (the fleet decides by it, `config` warns by it);
//! - [`tls`]: the TLS certificate pair and the rustls configuration;
//! - [`request_id`] (leaf): a request's id, for the upstream and the logs;
//! - [`utc`] (leaf): UTC dates for the access log and certificates;
//! - [`dir_trust`] (leaf): who may own and write the directories limiter
//!   keeps its pins and its admin socket in, and the links it follows to
//!   the files it reads as root;
//! - `alloc_count`: the counting allocator of the `count-allocations`
//!   benchmark build;
//! - [`allocator`] (leaf): the global allocator (mimalloc).
// Denied, not forbidden: `kernel::sys` holds the bpf(2) calls aya does not
// expose and the shared mapping, `daemon::activation` takes the descriptors
// systemd passed, `allocator` is the global allocator, `alloc_count`
// (a benchmark build only) wraps it, `proxy::server` hands its listener's
// descriptor to the event loop and `proxy::speculative` reads into a
// buffer's uninitialised room: each allows it where it must.
#![deny(unsafe_code)]

pub mod access_log;
pub mod admin;
pub mod admission;
#[cfg(feature = "count-allocations")]
pub mod alloc_count;
pub mod allocator;
pub mod breaker;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod dir_trust;
pub mod fleet;
pub mod histogram;
#[cfg(test)]
mod import_graph;
pub mod kernel;
pub mod lease;
pub mod metrics;
pub mod plain_http;
pub mod proxy;
pub mod request_id;
pub mod sample_upstream;
pub mod shard;
pub mod shedding;
pub mod tls;
pub mod utc;
