//! limiter: a node daemon that keeps servers alive under overload by
//! admitting or refusing work from one set of limits.
//!
//! Layout (callers first; the leaves, `admission`, `breaker`, `histogram`
//! and `config`, call nothing above them, and `metrics` only reads the
//! parts it renders):
//! - [`cli`]: one file per command-line verb (`main.rs` parses the command
//!   line and calls these);
//! - [`daemon`]: `limiter run`: start-up, serving, reload, drain, signals,
//!   privileges, logging;
//! - [`admin`]: the admin listener, serving a [`admin::Control`] the daemon
//!   implements; [`admin::api`] holds the typed `/status` and `/reload`
//!   bodies shared with `dump` and `top`;
//! - [`proxy`]: the HTTP/1.1 reverse proxy (server, per-request pipeline,
//!   forwarding, responses);
//! - [`admission`]: HTTP permits (pools, sessions, web clients);
//! - [`shedding`]: when coupled shedding starts and stops (the hysteresis;
//!   `daemon::shedding` samples the pools and raises the kernel flags);
//! - [`breaker`]: the circuit breaker in front of the upstream (no I/O,
//!   injected clock), its ticket and event sink;
//! - [`kernel`]: the eBPF gate (load, pin, adopt, swap, unload, maps,
//!   views), with [`kernel::env`] probing privileges, kernel, cgroup v2,
//!   bpffs;
//! - [`metrics`]: Prometheus text, one module per part's families;
//! - [`histogram`]: the latency histogram the proxy records into;
//! - [`config`]: the file's grammar, the one key table, the typed
//!   configuration everything above reads.
// Denied, not forbidden: `kernel::sys` holds the bpf(2) calls aya does not
// expose and the shared mapping, `daemon::activation` takes the descriptors
// systemd passed, `allocator` is the global allocator, and `alloc_count`
// (a benchmark build only) wraps it: each allows it where it must.
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
pub mod histogram;
pub mod kernel;
pub mod metrics;
pub mod proxy;
pub mod shedding;
pub mod tls;
pub mod utc;
