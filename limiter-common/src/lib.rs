//! Types shared by limiter's kernel programs (`limiter-ebpf`) and its daemon.
//!
//! Every map key and value is `#[repr(C)]`, padded explicitly (a hole the
//! compiler invents would be uninitialised bytes in a map key, which can miss
//! lookups or fail verification) and checked by size asserts below. The
//! `bytemuck` derives refuse to compile if a hidden padding byte appears.
//!
//! Byte order: every port stored in a map is in **host order**. The kernel
//! programs convert each port once, where they read it, into a [`Port`];
//! nothing past that boundary ever sees a network-order port.

#![no_std]
#![deny(missing_docs)]

use bytemuck::{Pod, Zeroable};

/// Version of the pinned layout (map set, key and value shapes). A daemon
/// refuses to adopt pins whose [`GateConfig::layout_version`] differs.
///
/// 1: port counts and refusals. 2: per-source caps, trusted prefixes,
/// refusals by reason and path, XDP, pre-existing connections. 3: the
/// source table's change index ([`map_names::SRCVER`]) and the HTTP permit
/// ledger ([`map_names::PERMITS`]); a layout-2 gate is migrated in place.
/// 4: coupled shedding ([`map_names::SHED`], [`map_names::SHED_COUNTS`]).
/// 5: counted sockets kept by cookie in [`map_names::CONNS`], a table
/// preallocated with the gate, instead of a mark allocated per socket ([`map_names::SOCKS`] stays for
/// the sockets an older gate marked).
pub const LAYOUT_VERSION: u32 = 5;

/// Older layouts a daemon migrates in place when it adopts them (the maps
/// they lack are created, the programs swapped, the version rewritten).
pub const MIGRATES_FROM: [u32; 3] = [2, 3, 4];

/// Names of the maps, as the kernel and the pin directory show them
/// (at most 15 bytes: `BPF_OBJ_NAME_LEN`).
pub mod map_names {
    /// Array indexed by port → [`super::PortLimit`]: what the kernel reads
    /// on every SYN (an all-zero limit: not enforced).
    pub const LIMITS: &str = "LIMITER_LIMITS";
    /// Hash [`super::PortKey`] → [`super::PortLimit`]: the enforced ports
    /// only, a copy the daemon keeps for readers (`dump`, `bpftool`).
    pub const LISTED: &str = "LIMITER_LISTED";
    /// Array indexed by port → [`super::PortStats`]: counters of every port.
    pub const STATS: &str = "LIMITER_STATS";
    /// Hash [`super::PortKey`] → `u32`: ports that ever completed a
    /// handshake, so readers need not scan all 65,536 counters.
    pub const ACTIVE: &str = "LIMITER_ACTIVE";
    /// Per-CPU hash [`super::PortKey`] → [`super::Refusals`].
    pub const REFUSED: &str = "LIMITER_REFUSED";
    /// `u32` index 0 → [`super::GateConfig`].
    pub const CONFIG: &str = "LIMITER_CONFIG";
    /// Socket-local storage → [`super::SockMark`]: the sockets a gate of
    /// layout 2 to 4 counted, which a migrated gate still uncounts at
    /// their close; nothing marks a socket since layout 5.
    pub const SOCKS: &str = "LIMITER_SOCKS";
    /// Array of [`super::ConnBucket`]: the sockets counted, each once, by
    /// cookie (see [`super::conns`]; the daemon sizes it from
    /// `kernel.connectionTableSize`).
    pub const CONNS: &str = "LIMITER_CONNS";
    /// Array of [`super::SourceSlot`]: established connections per client
    /// group and port (an open-addressing table, see [`super::source`]).
    pub const SOURCES: &str = "LIMITER_SOURCES";
    /// LPM trie [`super::TrustedKey`] → `u32`: trusted client prefixes.
    pub const TRUSTED: &str = "LIMITER_TRUSTED";
    /// Per-CPU array, index 0 → [`super::GateCounters`].
    pub const COUNTERS: &str = "LIMITER_COUNTS";
    /// Array indexed by port → `u32`: scratch of the start-up walk (1: a
    /// listener was seen on the port).
    pub const WALK: &str = "LIMITER_WALK";
    /// Hash ifindex → [`super::IfMac`]: the MAC of each XDP interface, so
    /// XDP answers only frames addressed to this host.
    pub const IFMAC: &str = "LIMITER_IFMAC";
    /// Array of `u64` change counters over the source table: one per block
    /// of [`super::source::BLOCK_SLOTS`] slots, then one per super-block of
    /// [`super::source::SUPER_BLOCKS`] blocks, bumped after every change of
    /// a count (see [`super::source::index_len`]), so a reader rereads only
    /// what changed since its last read.
    pub const SRCVER: &str = "LIMITER_SRCVER";
    /// Array indexed by port → [`super::ShedPort`]: whether new
    /// connections to the port are shed at the SYN (coupled shedding: the
    /// HTTP pools are saturated), until when, and how.
    pub const SHED: &str = "LIMITER_SHED";
    /// Per-CPU hash [`super::PortKey`] → [`super::ShedCounts`].
    pub const SHED_COUNTS: &str = "LIMITER_SHEDCNT";
    /// Every map of the kernel object, in the order a new gate pins them.
    pub const ALL: [&str; 16] = [
        CONFIG,
        LIMITS,
        LISTED,
        STATS,
        ACTIVE,
        REFUSED,
        SOCKS,
        SOURCES,
        TRUSTED,
        COUNTERS,
        WALK,
        IFMAC,
        SRCVER,
        SHED,
        SHED_COUNTS,
        CONNS,
    ];
    /// The HTTP permit ledger: a memory-mapped array the daemons serving
    /// one gate share (no kernel program reads it), created by the daemon.
    pub const PERMITS: &str = "LIMITER_PERMITS";
}

/// Names of the programs (the function names in `limiter-ebpf`).
pub mod program_names {
    /// The `sock_ops` program that counts established connections.
    pub const COUNT: &str = "limiter_count";
    /// The `sk_lookup` program that refuses connections to a full port.
    pub const REFUSE: &str = "limiter_refuse";
    /// The XDP program that answers a SYN to a full port with a RST.
    pub const XDP: &str = "limiter_xdp";
    /// The `iter/tcp` program that counts connections older than the gate.
    pub const WALK: &str = "limiter_walk";
}

/// `AF_INET` (`sa_family_t`), as sockets and the kernel's contexts give it.
pub const AF_INET: u16 = 2;
/// `AF_INET6` (`sa_family_t`).
pub const AF_INET6: u16 = 10;
/// `IPPROTO_TCP`, as `bpf_sk_lookup.protocol` and the IP headers give it.
pub const IPPROTO_TCP: u8 = 6;

/// A TCP port in host byte order: the only form a port takes past the
/// point where a kernel program reads it (maps, the admission decision,
/// the daemon).
///
/// The kernel hands a program its ports in three byte orders, and each
/// hook converts once, where it reads the port, with the constructor for
/// its case:
///
/// | where the port comes from | byte order | constructor |
/// |---|---|---|
/// | `bpf_sock_ops.local_port`, `bpf_sk_lookup.local_port` (`u32`); `skc_num` | host order, low 16 bits | [`Port::from_host`] |
/// | `bpf_sock_ops.remote_port` (`u32`) | network order in the upper 16 bits (little-endian hosts) | [`Port::from_sock_ops_remote`] |
/// | `bpf_sk_lookup.remote_port` (`__be16`); a TCP header's ports, read as a `u16` from the packet | network order | [`Port::from_be`] |
///
/// Map keys and values store [`Port::get`]; [`Port::to_be`] gives the
/// network-order value back for a packet or a helper's parameters.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Port(u16);

impl Port {
    /// A port the kernel gives in host order in (the low half of) a `u32`.
    #[inline(always)]
    pub const fn from_host(field: u32) -> Self {
        Self(field as u16)
    }

    /// `bpf_sock_ops.remote_port`: the network-order port in the upper
    /// half of a `u32` (so `u32::from_be` of the whole field is the port).
    #[inline(always)]
    pub const fn from_sock_ops_remote(field: u32) -> Self {
        Self(u32::from_be(field) as u16)
    }

    /// A network-order (`__be16`) port, as it lies in memory.
    #[inline(always)]
    pub const fn from_be(raw: u16) -> Self {
        Self(u16::from_be(raw))
    }

    /// The port number (host order).
    #[inline(always)]
    pub const fn get(self) -> u16 {
        self.0
    }

    /// The port as an index into the arrays indexed by port.
    #[inline(always)]
    pub const fn index(self) -> u32 {
        self.0 as u32
    }

    /// The port in network order, as a packet or `bpf_fib_lookup` holds it.
    #[inline(always)]
    pub const fn to_be(self) -> u16 {
        self.0.to_be()
    }
}

/// Number of ports: the arrays are indexed by port, so lookups on the SYN
/// path are a bounds check and an offset (inlined by the verifier), not a
/// hash.
pub const MAX_PORTS: u32 = 65_536;

/// `PortLimit::flags` bit: count would-be refusals, refuse nothing.
pub const LIMIT_FLAG_DRY_RUN: u32 = 1;

/// A counter's name and what it counts, as the daemon's readers show
/// them: a row of [`reason::ALL`] or [`path::ALL`], the tables from which
/// the metrics' labels and help, the `/status` and `dump --json` refusal
/// rows and `dump`'s lines all come.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Named {
    /// The label value, the JSON key, the word `dump` prints.
    pub name: &'static str,
    /// What it means, in a few words.
    pub doc: &'static str,
}

/// Refusal reasons: index into [`Refusals`] arrays (the limits' reasons),
/// then the coupled shedding's, counted in [`ShedCounts`].
pub mod reason {
    use super::Named;

    /// The port has `max_established` connections.
    pub const PORT: usize = 0;
    /// The client's group has `per_source_max` connections to the port.
    pub const SOURCE: usize = 1;
    /// The client's group is new and the source table has no slot for it.
    pub const TABLE: usize = 2;
    /// Number of the limits' reasons (the shape of [`super::Refusals`]).
    pub const COUNT: usize = 3;
    /// The HTTP pools are saturated and the daemon sheds new connections
    /// to its listening ports ([`super::ShedPort`]).
    pub const SHED: usize = 3;
    /// Number of reasons readers show.
    pub const REPORTED: usize = 4;
    /// Every reported reason, at its index: the one place its name is
    /// written.
    pub const ALL: [Named; REPORTED] = [
        Named { name: "port_full", doc: "the port was at its limit" },
        Named { name: "source_full", doc: "the client's group was at its per-source cap" },
        Named { name: "source_table_full", doc: "the source table had no slot for a new client group" },
        Named { name: "shed", doc: "the HTTP pools were saturated (coupled shedding)" },
    ];
}

/// `ShedPort::flags` bit: count would-be shedding, refuse nothing.
pub const SHED_FLAG_DRY_RUN: u32 = 1;

/// Coupled shedding of one port, written only by the daemon. The programs
/// shed a new connection to the port while `bpf_ktime_get_boot_ns()` is
/// below `until_boot_ns`: a deadline the daemon keeps renewing while it
/// sheds, so a daemon that dies leaves the port open again within one
/// lease, never shedding for ever.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct ShedPort {
    /// `CLOCK_BOOTTIME` nanoseconds; 0: not shedding.
    pub until_boot_ns: u64,
    /// `SHED_FLAG_*` bits.
    pub flags: u32,
    /// One connection attempt in this many is admitted as a probe (chosen
    /// by a keyed hash of the client's address and port, so XDP and
    /// `sk_lookup` agree on it); 0: none.
    pub probe_one_in: u32,
}

/// What the coupled shedding did on one port, kept per CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct ShedCounts {
    /// Connection attempts shed, by path ([`path`]).
    pub refused: [u64; path::COUNT],
    /// Attempts that would have been shed (dry-run).
    pub would_refuse: u64,
    /// Attempts admitted as probes while shedding.
    pub probes: u64,
    /// Attempts from trusted prefixes admitted while shedding.
    pub trusted_admitted: u64,
}

impl ShedCounts {
    /// Adds `other` field by field (summing the CPUs).
    pub fn add(&mut self, other: &Self) {
        for (a, b) in self.refused.iter_mut().zip(other.refused) {
            *a += b;
        }
        self.would_refuse += other.would_refuse;
        self.probes += other.probes;
        self.trusted_admitted += other.trusted_admitted;
    }
}

/// Where a refusal happened: index into [`Refusals::refused`].
pub mod path {
    use super::Named;

    /// The `sk_lookup` program (the kernel answered the SYN with a RST).
    pub const SK_LOOKUP: usize = 0;
    /// The XDP program (a RST built at the driver).
    pub const XDP: usize = 1;
    /// Number of paths.
    pub const COUNT: usize = 2;
    /// Every path, at its index: the one place its name is written.
    pub const ALL: [Named; COUNT] =
        [Named { name: "sk_lookup", doc: "in the stack" }, Named { name: "xdp", doc: "at the driver" }];
}

/// A local TCP port in host byte order, as a map key.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Pod, Zeroable)]
pub struct PortKey {
    /// The port, host byte order.
    pub port: u16,
    /// Explicit padding; always zero.
    pub _pad: u16,
}

impl PortKey {
    /// The key for `port` (host byte order).
    pub const fn new(port: u16) -> Self {
        Self { port, _pad: 0 }
    }
}

/// The limits of one port.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct PortLimit {
    /// At most this many established server-side connections; 0: no cap
    /// on the port as a whole.
    pub max_established: u32,
    /// `LIMIT_FLAG_*` bits.
    pub flags: u32,
    /// At most this many from one client group ([`GateConfig::prefix_v4`],
    /// [`GateConfig::prefix_v6`]); 0: no per-source cap.
    pub per_source_max: u32,
    /// Explicit padding; always zero.
    pub _pad: u32,
}

impl PortLimit {
    /// Whether any cap applies to the port.
    #[inline(always)]
    pub const fn enforced(&self) -> bool {
        self.max_established != 0 || self.per_source_max != 0
    }
}

/// Counters of one local port. `established` is a gauge; the rest only grow.
/// Updated with atomic adds from every CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct PortStats {
    /// Established server-side connections now.
    pub established: u64,
    /// The highest `established` ever seen.
    pub high_watermark: u64,
    /// Handshakes completed (connections counted) since the gate was loaded.
    pub admitted: u64,
}

/// Refusals of one port, kept per CPU: under a flood every CPU refuses at
/// once, and a shared counter would bounce its cache line between them on
/// every SYN. Readers sum the CPUs.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Refusals {
    /// Connection attempts refused, by `path * reason::COUNT + reason`.
    pub refused: [u64; path::COUNT * reason::COUNT],
    /// Attempts that would have been refused in dry-run mode, by reason.
    pub would_refuse: [u64; reason::COUNT],
    /// Attempts from a trusted prefix admitted past a cap.
    pub trusted_admitted: u64,
}

impl Refusals {
    /// Refusals for one reason, over both paths.
    pub fn by_reason(&self, reason: usize) -> u64 {
        (0..path::COUNT).map(|p| self.refused[p * reason::COUNT + reason]).sum()
    }

    /// Refusals on one path, over every reason.
    pub fn by_path(&self, path: usize) -> u64 {
        self.refused[path * reason::COUNT..(path + 1) * reason::COUNT].iter().sum()
    }

    /// Adds `other` field by field (summing the CPUs).
    pub fn add(&mut self, other: &Self) {
        for (a, b) in self.refused.iter_mut().zip(other.refused) {
            *a += b;
        }
        for (a, b) in self.would_refuse.iter_mut().zip(other.would_refuse) {
            *a += b;
        }
        self.trusted_admitted += other.trusted_admitted;
    }
}

/// The gate's own configuration (the [`map_names::CONFIG`] map): what it
/// was created with and what a reload changes. Written only by the daemon
/// (the kernel programs count into [`GateCounters`]), so a reload can
/// rewrite the whole value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct GateConfig {
    /// [`LAYOUT_VERSION`] of the daemon that created the pins.
    pub layout_version: u32,
    /// Reserved; zero.
    pub flags: u32,
    /// Cookie of the network namespace whose sockets are counted
    /// (`SO_NETNS_COOKIE`); sockets of other namespaces are ignored.
    pub netns_cookie: u64,
    /// Inode of the cgroup v2 directory `limiter_count` is attached to, so
    /// a restart can tell that the configuration now names another one.
    pub cgroup_id: u64,
    /// Seed of the source table's hash, random per gate.
    pub hash_seed: u32,
    /// Slots in the source table minus one (the table size is a power of two).
    pub source_mask: u32,
    /// IPv4 client addresses are grouped by this many leading bits (1-32).
    pub prefix_v4: u32,
    /// IPv6 client addresses are grouped by this many leading bits (1-128).
    pub prefix_v6: u32,
    /// Connections from trusted prefixes admitted past a full port.
    pub trusted_reserve: u32,
    /// Prefixes in the trusted trie; 0 spares the refusal path the lookup.
    pub trusted_count: u32,
}

/// Gate-wide counters, per CPU (index 0 of a per-CPU array).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct GateCounters {
    /// Sockets that could not be counted (the connection table was full,
    /// or their state callbacks could not be asked for), so were neither
    /// counted nor will be decremented.
    pub untracked_sockets: u64,
    /// Connections counted on their port but not for their client group:
    /// the source table had no slot left when the handshake completed.
    pub untracked_sources: u64,
    /// Connections older than the gate, counted by the start-up walk.
    pub walked: u64,
}

/// One counted socket in the connection table ([`map_names::CONNS`]):
/// present from its count to its uncount, so a socket is counted and
/// decremented once each, and only by the gate whose table holds it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct ConnSlot {
    /// The socket's cookie (`SO_COOKIE`, never 0); 0: the entry is free.
    pub cookie: u64,
    /// The local port the socket was counted under (host order).
    pub port: u16,
    /// Explicit padding; always zero.
    pub _pad: u16,
    /// Source-table slot counted for this socket, plus one; 0: none;
    /// `u32::MAX`: its group's table had no room.
    pub slot: u32,
}

/// A bucket of the connection table: one 64-byte cache line of entries.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct ConnBucket {
    /// Its entries, the first free one taken.
    pub slots: [ConnSlot; conns::BUCKET_SLOTS as usize],
}

/// The connection table's shape: an array of [`ConnBucket`]s, each socket
/// in the first free entry of one of two buckets (lookups read both, two
/// cache lines; a freed entry is simply zeroed, nothing probes past a
/// bucket). No lock and no allocation: an entry is claimed by
/// compare-and-swap on its cookie.
///
/// The first bucket follows the cookie's sequence: the kernel hands
/// cookies out in per-CPU batches, so sockets counted one after another on
/// a CPU share a cache line that CPU just wrote, and the CPUs do not share
/// lines (hashing every cookie to a random line of a table of megabytes
/// made most counts a cache miss: twice the program's cost). The second
/// bucket, for when a long-lived connection holds a slot the sequence
/// comes back to, is a mix of the cookie.
pub mod conns {
    /// Entries per bucket.
    pub const BUCKET_SLOTS: u32 = 4;

    /// Buckets of a table of `entries` (`kernel.connectionTableSize`).
    pub const fn buckets(entries: u32) -> u32 {
        entries / BUCKET_SLOTS
    }

    /// The two buckets the socket with `cookie` may sit in, given the
    /// bucket count minus one. Cookies come from a kernel counter, not
    /// from a client, so nothing needs a seed.
    #[inline(always)]
    pub const fn buckets_of(cookie: u64, mask: u32) -> [u32; 2] {
        // The splitmix64 finalizer.
        let mut h = cookie;
        h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        h ^= h >> 31;
        [(cookie / BUCKET_SLOTS as u64) as u32 & mask, (h >> 32) as u32 & mask]
    }
}

/// Socket-local mark of a socket counted by a gate of layout 2 to 4 (see
/// [`map_names::SOCKS`]), so that only sockets that gate counted are ever
/// decremented, exactly once.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct SockMark {
    /// The local port the socket was counted under (host order).
    pub port: u16,
    /// Explicit padding; always zero.
    pub _pad: u16,
    /// 1 while counted, 0 before and after: set and cleared by
    /// compare-and-swap, so counting and uncounting happen once each.
    pub counted: u32,
    /// Source-table slot counted for this socket, plus one; 0: none.
    pub slot: u32,
    /// Explicit padding; always zero.
    pub _pad2: u32,
}

/// A client group for per-source caps: the client address masked to the
/// configured prefix, and the local port.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct SourceKey {
    /// Address words in host order, masked; IPv4 uses word 0 only.
    pub addr: [u32; 4],
    /// Local port, host order.
    pub port: u16,
    /// 4 or 6; an IPv4-mapped IPv6 address is stored as 4.
    pub family: u8,
    /// Explicit padding; always zero.
    pub _pad: u8,
}

/// One slot of the source table.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct SourceSlot {
    /// State, generation and count in one word, changed only by
    /// compare-and-swap or atomic add (see [`source`]).
    pub word: u64,
    /// The group this slot counts; written only while the slot is
    /// [`source::CLAIMING`].
    pub key: SourceKey,
    /// Explicit padding; always zero.
    pub _pad: u32,
}

/// The MAC address of an interface XDP is attached to.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct IfMac {
    /// The address.
    pub mac: [u8; 6],
    /// Explicit padding; always zero.
    pub _pad: [u8; 2],
}

/// Key of the trusted-prefix LPM trie: IPv4 prefixes are stored as
/// IPv4-mapped IPv6 (`::ffff:a.b.c.d`, prefix length + 96).
#[repr(C, packed)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct TrustedKey {
    /// Significant leading bits of `addr`.
    pub prefix_len: u32,
    /// The address, network byte order.
    pub addr: [u8; 16],
}

/// Byte offsets of kernel struct fields in the running kernel, read from
/// its BTF by the daemon and given to the start-up walk.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct SockOffsets {
    /// `skc_daddr` (`__be32`).
    pub daddr: u32,
    /// `skc_v6_daddr` (`struct in6_addr`).
    pub v6_daddr: u32,
    /// `skc_num` (local port, host order `u16`).
    pub num: u32,
    /// `skc_family` (`u16`).
    pub family: u32,
    /// `skc_state` (`u8`).
    pub state: u32,
    /// `sk_cgrp_data.cgroup` in `struct sock` (`struct cgroup *`).
    pub sk_cgroup: u32,
    /// `kn` in `struct cgroup` (`struct kernfs_node *`).
    pub cgroup_kn: u32,
    /// `id` in `struct kernfs_node` (`u64`: the cgroup directory's inode).
    pub kn_id: u32,
    /// `self` in `struct cgroup` (its `struct cgroup_subsys_state`).
    pub cgroup_self: u32,
    /// `parent` in `struct cgroup_subsys_state`.
    pub css_parent: u32,
}

/// The source table: open addressing over an array, so no entry is ever
/// freed under a reader (a hash map's deleted element can be reused for
/// another key while a program still points at it).
///
/// A slot's `word` holds `count` (bits 0-31), `state` (bits 32-33) and a
/// generation (bits 34-63). A group is looked up in
/// [`PROBES`](source::PROBES) slots from its hash. A slot is reclaimed for
/// another group only when its count is 0, by a compare-and-swap that bumps
/// the generation and moves it to [`CLAIMING`](source::CLAIMING); the key
/// is written, then the slot becomes [`LIVE`](source::LIVE) with count 1.
/// Incrementing is a compare-and-swap on the word a reader saw, so it fails
/// if the slot was reclaimed meanwhile; decrementing is an atomic subtract
/// on the slot the socket remembers. Two racing first connections
/// of one group may claim two slots: readers sum every live slot of a group,
/// so the count stays exact.
pub mod source {
    use super::{Port, SourceKey};

    /// Slots probed per group.
    pub const PROBES: u32 = 8;
    /// Slots per block of the change index ([`super::map_names::SRCVER`]).
    pub const BLOCK_SLOTS: u32 = 16;
    /// Blocks per super-block of the change index (1,024 slots).
    pub const SUPER_BLOCKS: u32 = 64;

    /// Blocks of a table of `slots` slots.
    #[inline(always)]
    pub const fn blocks(slots: u32) -> u32 {
        slots.div_ceil(BLOCK_SLOTS)
    }

    /// Entries of the change index: the blocks, then the super-blocks.
    pub const fn index_len(slots: u32) -> u32 {
        blocks(slots) + blocks(slots).div_ceil(SUPER_BLOCKS)
    }

    /// The index entries a change of slot `slot` bumps, block first.
    #[inline(always)]
    pub const fn index_entries(slot: u32, slots: u32) -> [u32; 2] {
        let block = slot / BLOCK_SLOTS;
        [block, blocks(slots) + block / SUPER_BLOCKS]
    }
    /// Never used since the table was created.
    pub const FREE: u64 = 0;
    /// Being given to a group; its key is not readable.
    pub const CLAIMING: u64 = 1;
    /// Counting a group (count may be 0: reclaimable).
    pub const LIVE: u64 = 2;

    const STATE_SHIFT: u32 = 32;
    const GEN_SHIFT: u32 = 34;

    /// The count in a slot word.
    #[inline(always)]
    pub const fn count(word: u64) -> u32 {
        word as u32
    }

    /// The state in a slot word.
    #[inline(always)]
    pub const fn state(word: u64) -> u64 {
        (word >> STATE_SHIFT) & 3
    }

    /// The word of the next generation in `state` with `count`.
    #[inline(always)]
    pub const fn next(word: u64, state: u64, count: u32) -> u64 {
        let generation = (word >> GEN_SHIFT).wrapping_add(1);
        (generation << GEN_SHIFT) | (state << STATE_SHIFT) | count as u64
    }

    /// The same generation and state with `count`.
    #[inline(always)]
    pub const fn with_count(word: u64, count: u32) -> u64 {
        (word & !0xffff_ffff) | count as u64
    }

    /// A claimed slot made live with its first connection (same generation).
    #[inline(always)]
    pub const fn live(claiming: u64) -> u64 {
        (claiming & !((3 << STATE_SHIFT) | 0xffff_ffff)) | (LIVE << STATE_SHIFT) | 1
    }

    /// Whether a slot can be given to a new group.
    #[inline(always)]
    pub const fn claimable(word: u64) -> bool {
        state(word) == FREE || (state(word) == LIVE && count(word) == 0)
    }

    /// The group of a client. `v4` is the IPv4 address as read from the
    /// packet or socket (network byte order in memory); `v6` likewise.
    /// IPv4-mapped IPv6 addresses become IPv4, so a dual-stack listener and
    /// the refusal paths agree.
    #[inline(always)]
    pub fn key_v4(v4_be: u32, port: Port, prefix: u32) -> SourceKey {
        let addr = u32::from_be(v4_be) & mask(prefix);
        SourceKey { addr: [addr, 0, 0, 0], port: port.get(), family: 4, _pad: 0 }
    }

    /// See [`key_v4`].
    #[inline(always)]
    pub fn key_v6(v6_be: [u32; 4], port: Port, prefix_v4: u32, prefix_v6: u32) -> SourceKey {
        let w =
            [u32::from_be(v6_be[0]), u32::from_be(v6_be[1]), u32::from_be(v6_be[2]), u32::from_be(v6_be[3])];
        if w[0] == 0 && w[1] == 0 && w[2] == 0xffff {
            return key_v4(v6_be[3], port, prefix_v4);
        }
        let p = prefix_v6;
        let addr = [
            w[0] & mask(p),
            w[1] & mask(p.saturating_sub(32)),
            w[2] & mask(p.saturating_sub(64)),
            w[3] & mask(p.saturating_sub(96)),
        ];
        SourceKey { addr, port: port.get(), family: 6, _pad: 0 }
    }

    /// A mask of the leading `bits` bits of a word (all of them from 32).
    #[inline(always)]
    pub const fn mask(bits: u32) -> u32 {
        if bits == 0 {
            0
        } else if bits >= 32 {
            u32::MAX
        } else {
            u32::MAX << (32 - bits)
        }
    }

    /// Where a group's probe sequence starts (seeded, so a client cannot
    /// aim at other groups' slots without knowing the seed).
    #[inline(always)]
    pub fn hash(key: &SourceKey, seed: u32) -> u32 {
        let mut h = seed ^ 0x9e37_79b9;
        let words = [
            key.addr[0],
            key.addr[1],
            key.addr[2],
            key.addr[3],
            u32::from(key.port) | (u32::from(key.family) << 16),
        ];
        let mut i = 0;
        while i < 5 {
            h ^= words[i];
            h = h.wrapping_mul(0x85eb_ca6b);
            h ^= h >> 13;
            h = h.wrapping_mul(0xc2b2_ae35);
            h ^= h >> 16;
            i += 1;
        }
        h
    }
}

const _: () = {
    assert!(size_of::<PortKey>() == 4);
    assert!(size_of::<PortLimit>() == 16);
    assert!(size_of::<PortStats>() == 24);
    assert!(size_of::<Refusals>() == 80);
    assert!(size_of::<GateConfig>() == 48);
    assert!(size_of::<GateCounters>() == 24);
    assert!(size_of::<SockMark>() == 16);
    assert!(size_of::<ConnSlot>() == 16);
    assert!(size_of::<ConnBucket>() == 64);
    assert!(size_of::<SourceKey>() == 20);
    assert!(size_of::<SourceSlot>() == 32);
    assert!(size_of::<TrustedKey>() == 20);
    assert!(size_of::<SockOffsets>() == 40);
    assert!(size_of::<IfMac>() == 8);
    assert!(size_of::<ShedPort>() == 16);
    assert!(size_of::<ShedCounts>() == 40);
    assert!(align_of::<PortStats>() == 8);
    assert!(align_of::<SourceSlot>() == 8);
};

#[cfg(feature = "user")]
mod user {
    //! `aya::Pod` for the daemon; the bytemuck derives above already proved
    //! there is no padding, which is what `aya::Pod` asks the implementor to
    //! guarantee.
    use super::*;

    // SAFETY: plain `#[repr(C)]` integers with explicit padding, checked by
    // the `bytemuck::Pod` derive: every bit pattern is valid.
    unsafe impl aya::Pod for PortKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for PortLimit {}
    // SAFETY: as above.
    unsafe impl aya::Pod for PortStats {}
    // SAFETY: as above.
    unsafe impl aya::Pod for Refusals {}
    // SAFETY: as above.
    unsafe impl aya::Pod for GateConfig {}
    // SAFETY: as above.
    unsafe impl aya::Pod for SockMark {}
    // SAFETY: as above.
    unsafe impl aya::Pod for ConnBucket {}
    // SAFETY: as above.
    unsafe impl aya::Pod for GateCounters {}
    // SAFETY: as above.
    unsafe impl aya::Pod for SourceKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for SourceSlot {}
    // SAFETY: as above.
    unsafe impl aya::Pod for TrustedKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for SockOffsets {}
    // SAFETY: as above.
    unsafe impl aya::Pod for IfMac {}
    // SAFETY: as above.
    unsafe impl aya::Pod for ShedPort {}
    // SAFETY: as above.
    unsafe impl aya::Pod for ShedCounts {}
}

#[cfg(test)]
mod tests {
    use super::{Port, source::*};

    const P80: Port = Port::from_host(80);
    const P443: Port = Port::from_host(443);

    #[test]
    fn each_byte_order_converts_to_the_same_host_order_port() {
        // 8080 = 0x1f90; on the wire (network order) the bytes 0x1f 0x90.
        let wire = [0x1f, 0x90];
        assert_eq!(Port::from_be(u16::from_ne_bytes(wire)).get(), 8080, "__be16 / TCP header");
        // sock_ops remote_port: the __be16 shifted into the upper half.
        let remote = u32::from(u16::from_ne_bytes(wire)) << 16;
        assert_eq!(Port::from_sock_ops_remote(remote).get(), 8080, "bpf_sock_ops.remote_port");
        // local_port fields: host order, only the low 16 bits count.
        assert_eq!(Port::from_host(8080).get(), 8080);
        assert_eq!(Port::from_host(0x0001_1f90).get(), 8080);
        // And back: what a packet or bpf_fib_lookup holds, and the array index.
        assert_eq!(Port::from_host(8080).to_be().to_ne_bytes(), wire);
        assert_eq!(Port::from_host(65_535).index(), 65_535);
    }

    #[test]
    fn client_groups_mask_and_normalise() {
        let v4 = u32::from_ne_bytes([192, 0, 2, 77]);
        assert_eq!(key_v4(v4, P80, 24).addr, [0xc000_0200, 0, 0, 0]);
        assert_eq!(key_v4(v4, P80, 32).addr, [0xc000_024d, 0, 0, 0]);
        // ::ffff:192.0.2.77 is the IPv4 client, grouped by the IPv4 prefix.
        let mapped = [0, 0, u32::from_ne_bytes([0, 0, 0xff, 0xff]), v4];
        assert_eq!(key_v6(mapped, P80, 24, 64), key_v4(v4, P80, 24));
        let v6 = [
            u32::from_ne_bytes([0x20, 0x01, 0x0d, 0xb8]),
            u32::from_ne_bytes([0, 1, 0, 2]),
            u32::from_ne_bytes([0, 3, 0, 4]),
            u32::from_ne_bytes([0, 5, 0, 6]),
        ];
        let k = key_v6(v6, P443, 32, 56);
        assert_eq!((k.family, k.port), (6, 443));
        assert_eq!(k.addr, [0x2001_0db8, 0x0001_0000, 0, 0]);
        assert_eq!(key_v6(v6, P443, 32, 128).addr, [0x2001_0db8, 0x0001_0002, 0x0003_0004, 0x0005_0006]);
        assert_eq!((mask(0), mask(1), mask(32), mask(200)), (0, 0x8000_0000, u32::MAX, u32::MAX));
    }

    #[test]
    fn slot_words_keep_state_generation_and_count_apart() {
        let w = next(FREE, CLAIMING, 0);
        assert_eq!((state(w), count(w)), (CLAIMING, 0));
        let live = live(w);
        assert_eq!((state(live), count(live)), (LIVE, 1));
        assert_eq!(live >> 34, w >> 34, "same generation");
        let two = with_count(live, 2);
        assert_eq!((state(two), count(two)), (LIVE, 2));
        assert!(!claimable(two) && claimable(with_count(live, 0)) && claimable(FREE));
        let again = next(with_count(live, 0), CLAIMING, 0);
        assert_ne!(again >> 34, live >> 34, "a reclaim moves the generation on");
        // Decrementing a count is a plain subtract of the word.
        assert_eq!(two - 1, with_count(live, 1));
        // The hash depends on the seed.
        let k = key_v4(1, P80, 32);
        assert_ne!(hash(&k, 1), hash(&k, 2));
    }
}
