//! Counting and uncounting one marked socket, shared by the handshake
//! callback, the start-up walk and the close callback. Both directions
//! flip `SockMark::counted` by compare-and-swap, so whichever path gets
//! there first does the work and a socket is counted and uncounted exactly
//! once.

use core::{ffi::c_void, ptr};

use aya_ebpf::{
    bindings::{BPF_NOEXIST, BPF_SK_STORAGE_GET_F_CREATE},
    helpers::generated::bpf_sk_storage_get,
};
use limiter_common::{GateConfig, Port, PortKey, SockMark, SourceKey};

use crate::{
    atomic,
    maps::{LIMITER_ACTIVE, LIMITER_CONFIG, LIMITER_LIMITS, LIMITER_SOCKS, LIMITER_STATS, counters},
    sources,
};

/// This socket's mark; with `create`, made (zeroed) when absent. `sk` must
/// be a full socket pointer the calling hook may pass to sk_storage.
#[inline(always)]
pub fn mark(sk: *mut c_void, create: bool) -> Option<*mut SockMark> {
    let mut init = SockMark::default();
    let map = ptr::from_ref(&LIMITER_SOCKS).cast_mut().cast::<c_void>();
    let (value, flags) = if create {
        (ptr::from_mut(&mut init).cast::<c_void>(), u64::from(BPF_SK_STORAGE_GET_F_CREATE))
    } else {
        (ptr::null_mut(), 0)
    };
    // SAFETY: the caller passes a socket of its hook.
    let mark = unsafe { bpf_sk_storage_get(map, sk, value, flags) }.cast::<SockMark>();
    (!mark.is_null()).then_some(mark)
}

/// `SockMark::slot` of a socket its group's table had no room for.
const UNTRACKED: u32 = u32::MAX;

/// Counts the socket behind `mark` on `port` (and its client group if the
/// port has a per-source cap) unless it is counted already. A socket already
/// counted but without a group slot gets one if the port has a cap now.
/// `handshake`: counted as admitted (not for connections older than the gate).
#[inline(always)]
pub fn count(
    mark: *mut SockMark,
    port: Port,
    group: impl FnOnce() -> SourceKey,
    config: &GateConfig,
    handshake: bool,
) {
    let Some(stats) = LIMITER_STATS.get_ptr_mut(port.index()) else {
        return;
    };
    let capped = LIMITER_LIMITS.get(port.index()).is_some_and(|l| l.per_source_max != 0);
    // SAFETY: `mark` is this socket's storage, valid while the socket lives;
    // the callers hold the socket lock, so its close cannot run meanwhile.
    unsafe {
        if ptr::addr_of!((*mark).counted).read_volatile() == 0 {
            (*mark).port = port.get();
            if !atomic::cas32(ptr::addr_of_mut!((*mark).counted), 0, 1) {
                return;
            }
            // SAFETY: array values live as long as the map; each field is
            // 8-byte aligned.
            let established = atomic::add(ptr::addr_of_mut!((*stats).established), 1) + 1;
            atomic::raise(ptr::addr_of_mut!((*stats).high_watermark), established);
            if handshake {
                if atomic::add(ptr::addr_of_mut!((*stats).admitted), 1) == 0 {
                    // Once per port ever: tell readers this port has counters.
                    let _ = LIMITER_ACTIVE.insert(PortKey::new(port.get()), 1, BPF_NOEXIST.into());
                }
            } else {
                let _ = LIMITER_ACTIVE.insert(PortKey::new(port.get()), 1, BPF_NOEXIST.into());
                if let Some(c) = counters() {
                    (*c).walked += 1;
                }
            }
        } else if (*mark).port != port.get() {
            return;
        }
        if !capped || ptr::addr_of!((*mark).slot).read_volatile() != 0 {
            return;
        }
        match sources::acquire(&group(), config.hash_seed, config.source_mask) {
            Some(idx) => ptr::addr_of_mut!((*mark).slot).write_volatile(idx + 1),
            None => {
                // Remembered, so a second walk pass does not try (and count
                // it) again.
                ptr::addr_of_mut!((*mark).slot).write_volatile(UNTRACKED);
                if let Some(c) = counters() {
                    (*c).untracked_sources += 1;
                }
            }
        }
    }
}

/// Uncounts the socket behind `mark` if it is counted.
#[inline(always)]
pub fn uncount(mark: *mut SockMark) {
    // SAFETY: `mark` is this socket's storage, valid while the socket lives.
    unsafe {
        if !atomic::cas32(ptr::addr_of_mut!((*mark).counted), 1, 0) {
            return;
        }
        let port = (*mark).port;
        let slot = ptr::addr_of!((*mark).slot).read_volatile();
        if slot != 0 {
            ptr::addr_of_mut!((*mark).slot).write_volatile(0);
        }
        if slot != 0
            && slot != UNTRACKED
            && let Some(config) = LIMITER_CONFIG.get(0)
        {
            sources::release(slot - 1, config.source_mask);
        }
        if let Some(stats) = LIMITER_STATS.get_ptr_mut(u32::from(port)) {
            atomic::sub(ptr::addr_of_mut!((*stats).established), 1);
        }
    }
}
