//! limiter: a node daemon that keeps servers alive under overload by
//! admitting or refusing work from one set of limits.
//!
//! Layout:
//! - [`config`]: the configuration file (grammar, keys, defaults, errors);
//! - [`kernel`]: the eBPF gate (load, pin, adopt, unload, read the maps),
//!   with [`kernel::env`] probing privileges, kernel, cgroup v2, bpffs;
//! - [`daemon`]: `limiter run` (signals, reload, lifecycle);
//! - [`admin`]: the admin listener (`/metrics`, `/status`);
//! - [`admission`]: HTTP permits (pools, sessions, web clients);
//! - [`breaker`]: the circuit breaker in front of the upstream (no I/O,
//!   injected clock);
//! - [`proxy`]: the HTTP/1.1 reverse proxy that applies them;
//! - [`metrics`], [`histogram`]: Prometheus text exposition;
//! - [`dump`]: `limiter dump`, from the pins and the admin listener.
//!
//! `main.rs` only parses the command line and calls into these.
// Denied, not forbidden: `kernel::sys` holds the two bpf(2) calls aya does
// not expose, and is the only module allowed to use it.
#![deny(unsafe_code)]

pub mod admin;
pub mod admission;
pub mod breaker;
pub mod config;
pub mod daemon;
pub mod dump;
pub mod histogram;
pub mod kernel;
pub mod logging;
pub mod metrics;
pub mod privileges;
pub mod proxy;
pub mod top;
