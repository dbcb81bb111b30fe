//! The maps, BTF-typed so `bpftool map dump` prints named fields.
//! Keys and values come from `limiter-common`; names are fixed there too.

use aya_ebpf::{
    btf_maps::{Array, HashMap, SkStorage},
    macros::btf_map,
};
use limiter_common::{MAX_PORTS, PortKey, PortLimit, PortStats, Settings, SockMark};

/// Enforced ports and their limits; written only by the daemon.
#[btf_map]
pub static LIMITER_LIMITS: HashMap<PortKey, PortLimit, { MAX_PORTS as usize }> = HashMap::new();

/// Counters of every local port that ever completed a handshake. Entries
/// are never removed by the kernel, so a pointer to one stays valid.
#[btf_map]
pub static LIMITER_STATS: HashMap<PortKey, PortStats, { MAX_PORTS as usize }> = HashMap::new();

/// Index 0: gate-wide settings.
#[btf_map]
pub static LIMITER_CONFIG: Array<Settings, 1> = Array::new();

/// Per-socket mark: set when a socket is counted, cleared when it is
/// decremented. Freed by the kernel with the socket.
#[btf_map]
pub static LIMITER_SOCKS: SkStorage<SockMark> = SkStorage::new();
