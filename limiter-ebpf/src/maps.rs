//! The maps, BTF-typed so `bpftool map dump` prints named fields.
//! Keys and values come from `limiter-common`; names are fixed there too.
//! The SYN path reads only arrays indexed by port (inlined lookups), the
//! source table (an array) and the trusted trie; the hashes are indexes for
//! readers.

use aya_ebpf::{
    btf_maps::{Array, HashMap, LpmTrie, PerCpuArray, PerCpuHashMap, SkStorage},
    macros::btf_map,
};
use limiter_common::{
    ConnBucket, GateConfig, GateCounters, IfMac, MAX_PORTS, PortKey, PortLimit, PortStats, Refusals,
    ShedCounts, ShedPort, SockMark, SourceSlot, source,
};

/// Limit of every port, indexed by port; written only by the daemon.
#[btf_map]
pub static LIMITER_LIMITS: Array<PortLimit, { MAX_PORTS as usize }> = Array::new();

/// The enforced ports only; the daemon keeps it next to `LIMITER_LIMITS`
/// for readers. The programs never read it.
#[btf_map]
pub static LIMITER_LISTED: HashMap<PortKey, PortLimit, { MAX_PORTS as usize }> = HashMap::new();

/// Counters of every local port, indexed by port.
#[btf_map]
pub static LIMITER_STATS: Array<PortStats, { MAX_PORTS as usize }> = Array::new();

/// Ports that ever completed a handshake (value unused: 1).
#[btf_map]
pub static LIMITER_ACTIVE: HashMap<PortKey, u32, { MAX_PORTS as usize }> = HashMap::new();

/// Refusals per port, per CPU (see [`Refusals`]).
#[btf_map]
pub static LIMITER_REFUSED: PerCpuHashMap<PortKey, Refusals, { MAX_PORTS as usize }> = PerCpuHashMap::new();

/// Coupled shedding of every port, indexed by port; written only by the
/// daemon (an all-zero value: not shedding).
#[btf_map]
pub static LIMITER_SHED: Array<ShedPort, { MAX_PORTS as usize }> = Array::new();

/// What the shedding did per port, per CPU (only the proxy's listening
/// ports are ever shed).
#[btf_map]
pub static LIMITER_SHEDCNT: PerCpuHashMap<PortKey, ShedCounts, 1024> = PerCpuHashMap::new();

/// Index 0: the gate's configuration.
#[btf_map]
pub static LIMITER_CONFIG: Array<GateConfig, 1> = Array::new();

/// The counted sockets, by cookie (see `limiter_common::conns`): an entry
/// claimed when a socket is counted, freed when it is decremented. Its
/// buckets exist as long as the map, so counting a socket allocates
/// nothing; the daemon sets the size (`kernel.connectionTableSize`) at
/// load time.
#[btf_map]
pub static LIMITER_CONNS: Array<ConnBucket, 65_536> = Array::new();

/// Per-socket marks of a gate of layout 2 to 4 that this one migrated:
/// read (never created) at a socket's close. Freed by the kernel with the
/// socket.
#[btf_map]
pub static LIMITER_SOCKS: SkStorage<SockMark> = SkStorage::new();

/// The source table (`limiter_common::source`). The daemon sets the real
/// size (`kernel.sourceTableSize`) at load time.
#[btf_map]
pub static LIMITER_SOURCES: Array<SourceSlot, 65_536> = Array::new();

/// Change counters of the source table (`limiter_common::map_names::SRCVER`);
/// the daemon sets the real size (`source::index_len`) at load time.
#[btf_map]
pub static LIMITER_SRCVER: Array<u64, { source::index_len(65_536) as usize }> = Array::new();

/// Trusted prefixes, keyed as IPv4-mapped IPv6 (`limiter_common::TrustedKey`).
#[btf_map]
pub static LIMITER_TRUSTED: LpmTrie<[u8; 16], u32, 1024> = LpmTrie::new();

/// Index 0: gate-wide counters, per CPU.
#[btf_map]
pub static LIMITER_COUNTS: PerCpuArray<GateCounters, 1> = PerCpuArray::new();

/// Scratch of the start-up walk: 1 for ports with a listener.
#[btf_map]
pub static LIMITER_WALK: Array<u32, { MAX_PORTS as usize }> = Array::new();

/// ifindex → MAC of each XDP interface (written by the daemon).
#[btf_map]
pub static LIMITER_IFMAC: HashMap<u32, IfMac, 256> = HashMap::new();

/// This CPU's gate counters.
#[inline(always)]
pub fn counters() -> Option<*mut GateCounters> {
    LIMITER_COUNTS.get_ptr_mut(0)
}
