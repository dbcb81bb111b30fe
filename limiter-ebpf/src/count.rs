//! Counting and uncounting one socket, shared by the handshake callback,
//! the start-up walk and the close callback.
//!
//! A socket is counted while its cookie is in the connection table
//! ([`LIMITER_CONNS`], shaped as [`limiter_common::conns`] says): counting
//! claims a free entry for it (only if it holds none), uncounting frees
//! that entry, and whichever path gets there first does the work, so a
//! socket is counted and uncounted exactly once. All three paths run with
//! the socket locked, so nothing else looks for the same cookie meanwhile;
//! other sockets race only for free entries, settled by compare-and-swap.
//!
//! The table is this gate's own: the state-callback flag a socket carries
//! may have been set by another sock_ops program, or by a gate unloaded
//! since, and neither makes a socket count as ours. Its entries exist as
//! long as the map, so counting a socket allocates nothing and takes no
//! lock (layouts 2 to 4 allocated a socket-local mark per socket, most of
//! the program's cost; [`legacy`] still uncounts the sockets they marked).

use core::ptr;

use limiter_common::{ConnSlot, GateConfig, Port, PortKey, SourceKey, conns};

use aya_ebpf::bindings::BPF_NOEXIST;

use crate::{
    atomic,
    maps::{LIMITER_ACTIVE, LIMITER_CONFIG, LIMITER_CONNS, LIMITER_LIMITS, LIMITER_STATS, counters},
    sources,
};

/// The connection table's bucket count minus one, set by the daemon at
/// load time from `kernel.connectionTableSize` (`EbpfLoader::set_global`).
#[unsafe(no_mangle)]
static LIMITER_CONN_MASK: u32 = 0;

/// `ConnSlot::slot` of a socket its group's table had no room for.
const UNTRACKED: u32 = u32::MAX;

/// The two buckets `cookie` may sit in.
#[inline(always)]
fn buckets(cookie: u64) -> [u32; 2] {
    // SAFETY: a static of this object; volatile so the value the daemon
    // set is read, not the zero it was compiled with.
    let mask = unsafe { ptr::addr_of!(LIMITER_CONN_MASK).read_volatile() };
    conns::buckets_of(cookie, mask)
}

/// The first of the entries `cookie` may sit in for which `pick` holds.
#[inline(always)]
fn first(cookie: u64, mut pick: impl FnMut(*mut u64) -> bool) -> Option<*mut ConnSlot> {
    for b in buckets(cookie) {
        let Some(bucket) = LIMITER_CONNS.get_ptr_mut(b) else {
            continue;
        };
        for i in 0..conns::BUCKET_SLOTS as usize {
            // SAFETY: an array value, live as long as the map.
            let slot = unsafe { &raw mut (*bucket).slots[i] };
            // SAFETY: as above.
            if pick(unsafe { &raw mut (*slot).cookie }) {
                return Some(slot);
            }
        }
    }
    None
}

/// The entry holding `cookie`, if this gate counted that socket.
#[inline(always)]
fn find(cookie: u64) -> Option<*mut ConnSlot> {
    // SAFETY: an entry's cookie field; an aligned 8-byte load cannot tear.
    first(cookie, |field| unsafe { field.read_volatile() } == cookie)
}

/// Claims a free entry for `cookie`; `None` if both its buckets are full.
#[inline(always)]
fn claim(cookie: u64) -> Option<*mut ConnSlot> {
    // SAFETY: as in `find`; the compare-and-swap settles a race with
    // another socket for the same free entry.
    first(cookie, |field| unsafe { field.read_volatile() == 0 && atomic::cas(field, 0, cookie).is_ok() })
}

/// Whether the socket with this cookie is counted.
#[inline(always)]
pub fn counted(cookie: u64) -> bool {
    find(cookie).is_some()
}

/// Counts the socket with this cookie on `port` (and its client group if
/// the port has a per-source cap) unless it is counted already. A socket
/// already counted but without a group slot gets one if the port has a cap
/// now. `handshake`: counted as admitted (not for connections older than
/// the gate). The caller holds the socket locked and has asked for its
/// state callbacks, so its close will be seen.
#[inline(always)]
pub fn count(
    cookie: u64,
    port: Port,
    group: impl FnOnce() -> SourceKey,
    config: &GateConfig,
    handshake: bool,
) {
    let Some(stats) = LIMITER_STATS.get_ptr_mut(port.index()) else {
        return;
    };
    let capped = LIMITER_LIMITS.get(port.index()).is_some_and(|l| l.per_source_max != 0);
    // Only the walk can find a socket counted already (by its handshake,
    // or by the walk's first pass). The handshake callback never can: the
    // walk counts a socket only once it is established, and the kernel
    // runs that callback before the state change, both under the socket's
    // lock (a fast-open child, whose callback runs at its creation, is
    // not established yet either). So the handshake spares the look.
    if !handshake && let Some(entry) = find(cookie) {
        // Counted already: by the handshake, or by the walk's first pass.
        // SAFETY: this socket's entry, which only its own (locked) paths
        // write.
        unsafe {
            if (*entry).port == port.get() && capped && (*entry).slot == 0 {
                (*entry).slot = slot(&group(), config);
            }
        }
        return;
    }
    let Some(entry) = claim(cookie) else {
        // The table has no room: neither counted nor, at its close,
        // decremented.
        untracked();
        return;
    };
    let slot = if capped { slot(&group(), config) } else { 0 };
    // SAFETY: the entry just claimed for this socket.
    unsafe {
        (*entry).port = port.get();
        (*entry).slot = slot;
    }
    // SAFETY: array values live as long as the map; each field is 8-byte
    // aligned.
    unsafe {
        let established = atomic::add(&raw mut (*stats).established, 1) + 1;
        atomic::raise(&raw mut (*stats).high_watermark, established);
        if handshake {
            if atomic::add(&raw mut (*stats).admitted, 1) == 0 {
                // Once per port ever: tell readers this port has counters.
                let _ = LIMITER_ACTIVE.insert(PortKey::new(port.get()), 1, BPF_NOEXIST.into());
            }
        } else {
            let _ = LIMITER_ACTIVE.insert(PortKey::new(port.get()), 1, BPF_NOEXIST.into());
            if let Some(c) = counters() {
                (*c).walked += 1;
            }
        }
    }
}

/// A source-table slot for `group` (plus one), or [`UNTRACKED`].
#[inline(always)]
fn slot(group: &SourceKey, config: &GateConfig) -> u32 {
    match sources::acquire(group, config.hash_seed, config.source_mask) {
        Some(idx) => idx + 1,
        None => {
            if let Some(c) = counters() {
                // SAFETY: this CPU's own per-CPU value.
                unsafe { (*c).untracked_sources += 1 };
            }
            UNTRACKED
        }
    }
}

/// Gives back what [`slot`] took.
#[inline(always)]
pub fn release(slot: u32, config: &GateConfig) {
    if slot != 0 && slot != UNTRACKED {
        sources::release(slot - 1, config.source_mask);
    }
}

/// Uncounts the socket with this cookie if this gate counted it; false if
/// it did not.
#[inline(always)]
pub fn uncount(cookie: u64) -> bool {
    let Some(entry) = find(cookie) else {
        return false;
    };
    // SAFETY: this socket's entry; read before it is freed, after which
    // another socket may claim it.
    let (port, slot) = unsafe {
        let taken = ((*entry).port, (*entry).slot);
        (&raw mut (*entry).cookie).write_volatile(0);
        taken
    };
    if slot != 0
        && let Some(config) = LIMITER_CONFIG.get(0)
    {
        release(slot, config);
    }
    if let Some(stats) = LIMITER_STATS.get_ptr_mut(u32::from(port)) {
        // SAFETY: an array value, 8-byte aligned.
        unsafe { atomic::sub(&raw mut (*stats).established, 1) };
    }
    true
}

/// Counts a socket the gate could not track.
#[inline(always)]
pub fn untracked() {
    if let Some(c) = counters() {
        // SAFETY: this CPU's own per-CPU value.
        unsafe { (*c).untracked_sockets += 1 };
    }
}

/// The sockets a gate of layout 2 to 4 counted: each carries a
/// socket-local mark ([`LIMITER_SOCKS`](crate::maps::LIMITER_SOCKS)) that
/// a migration kept. Only their close is left to see.
pub mod legacy {
    use core::{ffi::c_void, ptr};

    use aya_ebpf::helpers::generated::bpf_sk_storage_get;
    use limiter_common::SockMark;

    use super::release;
    use crate::{
        atomic,
        maps::{LIMITER_CONFIG, LIMITER_SOCKS, LIMITER_STATS},
    };

    /// Uncounts the socket `sk` if an older gate marked it counted. `sk`
    /// must be a full socket the calling hook may pass to sk_storage.
    #[inline(always)]
    pub fn uncount(sk: *mut c_void) {
        let map = ptr::from_ref(&LIMITER_SOCKS).cast_mut().cast::<c_void>();
        // SAFETY: the caller passes a socket of its hook; without the
        // create flag nothing is allocated.
        let mark = unsafe { bpf_sk_storage_get(map, sk, ptr::null_mut(), 0) }.cast::<SockMark>();
        if mark.is_null() {
            return;
        }
        // SAFETY: this socket's storage, valid while the socket lives.
        unsafe {
            if !atomic::cas32(&raw mut (*mark).counted, 1, 0) {
                return;
            }
            let slot = (&raw const (*mark).slot).read_volatile();
            if slot != 0 {
                (&raw mut (*mark).slot).write_volatile(0);
                if let Some(config) = LIMITER_CONFIG.get(0) {
                    release(slot, config);
                }
            }
            if let Some(stats) = LIMITER_STATS.get_ptr_mut(u32::from((*mark).port)) {
                atomic::sub(&raw mut (*stats).established, 1);
            }
        }
    }
}
