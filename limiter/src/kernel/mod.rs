//! The kernel gate: loading, pinning, adopting and unloading the eBPF
//! programs and maps, and reading and writing the maps.
//!
//! - [`env`](mod@env): what is probed before touching the kernel (privileges,
//!   kernel version, cgroup v2, bpffs, the target namespace);
//! - `load`: [`Gate::start`], adopting a pinned gate or loading a new one,
//!   one sequence for both;
//! - `pins`: the pin directory (which pins are ours, rollback, [`unload`]);
//! - `pin_lock`: one process at a time loads, adopts or unloads a pin
//!   directory (an `flock` on it);
//! - `reach`: the pin directory held open, so the daemon still reaches
//!   it after dropping privileges;
//! - `maps`: [`Gate`], the map handles and every read and write;
//! - `source_index`: reading the source table by what changed;
//! - `migrate`: pinned layouts older than this binary's, migrated in place;
//! - [`shed`]: the coupled shedding's per-port flags (raised by the
//!   daemon while its HTTP pools are saturated) and their lease;
//! - [`shared_memory`]: memory the daemons serving one gate share (the
//!   HTTP permit ledger of `admission::ledger`);
//! - `view`: the read-only [`Snapshot`] that `dump`, `top` and `/metrics` show;
//! - `error`: [`KernelError`] and the typed causes it carries;
//! - [`btf`]: the struct offsets the start-up walk needs, from the kernel's
//!   BTF; `sys`: the `bpf(2)` calls aya does not expose, and the shared
//!   mapping of [`shared_memory`].
//!
//! Layout of the pin directory (`kernel.pinPath`):
//!
//! | pin | what |
//! |---|---|
//! | `LIMITER_CONFIG` | array, index 0: [`GateConfig`](limiter_common::GateConfig) (layout version, netns cookie) |
//! | `LIMITER_LIMITS` | array, index port → [`PortLimit`](limiter_common::PortLimit): read on every SYN |
//! | `LIMITER_LISTED` | hash [`PortKey`](limiter_common::PortKey) → `PortLimit`: the enforced ports (readers' index) |
//! | `LIMITER_STATS` | array, index port → [`PortStats`](limiter_common::PortStats): counters of every local port |
//! | `LIMITER_ACTIVE` | hash `PortKey` → `u32`: ports with counters (readers' index) |
//! | `LIMITER_REFUSED` | per-CPU hash `PortKey` → [`Refusals`](limiter_common::Refusals): refusals per port |
//! | `LIMITER_CONNS` | array of buckets: the counted sockets by cookie (`limiter_common::conns`) |
//! | `LIMITER_SOCKS` | sk_storage: marks of sockets a gate of layout 2 to 4 counted |
//! | `LIMITER_SOURCES` | array of [`SourceSlot`](limiter_common::SourceSlot): connections per client group |
//! | `LIMITER_IFMAC` | hash ifindex → [`IfMac`](limiter_common::IfMac): MACs of the XDP interfaces |
//! | `LIMITER_TRUSTED` | LPM trie [`TrustedKey`](limiter_common::TrustedKey) → `u32`: trusted prefixes |
//! | `LIMITER_COUNTS` | per-CPU array, index 0: [`GateCounters`](limiter_common::GateCounters) |
//! | `LIMITER_WALK` | array, index port → `u32`: scratch of the start-up walk |
//! | `LIMITER_SRCVER` | array of `u64`: change counters over the source table (`source_index`) |
//! | `LIMITER_SHED` | array, index port → [`ShedPort`](limiter_common::ShedPort): coupled shedding's flag (a deadline), read on every SYN |
//! | `LIMITER_SHEDCNT` | per-CPU hash `PortKey` → [`ShedCounts`](limiter_common::ShedCounts): what the shedding did |
//! | `LIMITER_PERMITS` | memory-mapped array, index 0: the HTTP permit ledger of the daemons serving the gate (`admission::ledger`) |
//! | `link_sock_ops` | bpf link: `limiter_count` on the cgroup |
//! | `link_sk_lookup` | bpf link: `limiter_refuse` on the network namespace |
//! | `link_xdp_<interface>` | bpf link: `limiter_xdp` on one interface |
//!
//! The gate outlives the daemon: the daemon holds no link, so only removing
//! the link pins (`limiter unload`) detaches the programs.
//!
//! Minimum kernel: 5.19 (see [`env::MIN_KERNEL`]).

pub mod btf;
pub mod env;
mod error;
mod link_kind;
mod load;
mod maps;
mod migrate;
mod pin_lock;
mod pins;
mod reach;
pub mod shared_memory;
pub mod shed;
mod source_index;
#[allow(unsafe_code, reason = "the bpf(2) calls aya does not expose and mmap; see sys.rs")]
mod sys;
mod view;

pub use error::{Incompatible, InterfaceError, KernelError, XdpAttachError, XdpModeError};
pub use load::{Origin, Started, Target, XdpAttachment};
pub use maps::{Gate, LimitChange};
pub use pins::{LINK_COUNT, LINK_REFUSE, LINK_XDP_PREFIX, OWN_PINS, Unloaded, unload};
#[cfg(test)]
pub(crate) use view::every_refusal;
pub use view::{Attachment, LinkRow, PortRow, RefusalRow, Snapshot, SourceRow, TOP_SOURCES};
