//! Types shared by limiter's kernel programs (`limiter-ebpf`) and its daemon.
//!
//! Every map key and value is `#[repr(C)]`, padded explicitly (a hole the
//! compiler invents would be uninitialised bytes in a map key, which can miss
//! lookups or fail verification) and checked by size asserts below. The
//! `bytemuck` derives refuse to compile if a hidden padding byte appears.
//!
//! Byte order: every port stored in a map is in **host order**. The kernel
//! programs convert at the boundary; nothing else ever sees a network-order
//! port.

#![no_std]
#![deny(missing_docs)]

use bytemuck::{Pod, Zeroable};

/// Version of the pinned layout (map set, key and value shapes). A daemon
/// refuses to adopt pins whose [`Settings::layout_version`] differs.
pub const LAYOUT_VERSION: u32 = 1;

/// Names of the maps, as the kernel and the pin directory show them
/// (at most 15 bytes: `BPF_OBJ_NAME_LEN`).
pub mod map_names {
    /// Array indexed by port → [`super::PortLimit`]: what the kernel reads
    /// on every SYN (`max_established == 0`: not enforced).
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
    /// `u32` index 0 → [`super::Settings`].
    pub const SETTINGS: &str = "LIMITER_CONFIG";
    /// Socket-local storage → [`super::SockMark`]: which sockets were counted.
    pub const SOCKS: &str = "LIMITER_SOCKS";
    /// Every map the daemon pins, in the order it pins them.
    pub const ALL: [&str; 7] = [SETTINGS, LIMITS, LISTED, STATS, ACTIVE, REFUSED, SOCKS];
}

/// Names of the programs (the function names in `limiter-ebpf`).
pub mod program_names {
    /// The `sock_ops` program that counts established connections.
    pub const COUNT: &str = "limiter_count";
    /// The `sk_lookup` program that refuses connections to a full port.
    pub const REFUSE: &str = "limiter_refuse";
}

/// Number of ports: the arrays are indexed by port, so lookups on the SYN
/// path are a bounds check and an offset (inlined by the verifier), not a
/// hash.
pub const MAX_PORTS: u32 = 65_536;

/// `PortLimit::flags` bit: count would-be refusals, refuse nothing.
pub const LIMIT_FLAG_DRY_RUN: u32 = 1;

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

/// The limit of one port.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct PortLimit {
    /// At most this many established server-side connections; 0: the port
    /// is not enforced (counted only).
    pub max_established: u32,
    /// `LIMIT_FLAG_*` bits.
    pub flags: u32,
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
    /// Connection attempts refused because the port was full.
    pub refused: u64,
    /// Attempts that would have been refused in dry-run mode.
    pub would_refuse: u64,
}

/// Gate-wide settings, written by the daemon before it attaches anything.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Settings {
    /// [`LAYOUT_VERSION`] of the daemon that created the pins.
    pub layout_version: u32,
    /// Reserved; zero.
    pub flags: u32,
    /// Cookie of the network namespace whose sockets are counted
    /// (`SO_NETNS_COOKIE`); sockets of other namespaces are ignored.
    pub netns_cookie: u64,
    /// Sockets that could not be tracked (storage allocation failed), so
    /// were neither counted nor will be decremented.
    pub untracked: u64,
    /// Inode of the cgroup v2 directory `limiter_count` is attached to, so
    /// a restart can tell that the configuration now names another one.
    pub cgroup_id: u64,
}

/// Socket-local mark of a counted socket, so that only sockets this gate
/// counted are ever decremented (not those another program flagged, nor
/// those that predate the gate).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct SockMark {
    /// The local port the socket was counted under (host order).
    pub port: u16,
    /// Explicit padding; always zero.
    pub _pad: u16,
    /// 1 while counted, 0 once decremented.
    pub counted: u32,
}

const _: () = {
    assert!(size_of::<PortKey>() == 4);
    assert!(size_of::<PortLimit>() == 8);
    assert!(size_of::<PortStats>() == 24);
    assert!(size_of::<Refusals>() == 16);
    assert!(size_of::<Settings>() == 32);
    assert!(size_of::<SockMark>() == 8);
    assert!(align_of::<PortStats>() == 8);
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
    unsafe impl aya::Pod for Settings {}
    // SAFETY: as above.
    unsafe impl aya::Pod for SockMark {}
}
