//! The source table (layout and protocol: `limiter_common::source`).

use core::ptr;

use limiter_common::{
    SourceKey, SourceSlot,
    source::{self, CLAIMING, LIVE, PROBES},
};

use crate::{
    atomic,
    maps::{LIMITER_SOURCES, LIMITER_SRCVER},
};

/// What the SYN path needs to know about a group.
pub struct Usage {
    /// Established connections of the group, summed over its live slots.
    pub count: u32,
    /// Whether a slot is free for the group if it has none.
    pub room: bool,
}

#[inline(always)]
fn slot(key: &SourceKey, seed: u32, mask: u32, i: u32) -> Option<*mut SourceSlot> {
    let index = source::hash(key, seed).wrapping_add(i) & mask;
    LIMITER_SOURCES.get_ptr_mut(index)
}

#[inline(always)]
fn index(key: &SourceKey, seed: u32, mask: u32, i: u32) -> u32 {
    source::hash(key, seed).wrapping_add(i) & mask
}

/// Whether the slot's key is `key`. Only meaningful for a word read as
/// [`LIVE`] before the call and unchanged after it.
#[inline(always)]
fn holds(s: *const SourceSlot, key: &SourceKey) -> bool {
    // SAFETY: array values live as long as the map; volatile so each field
    // is read where it stands, after the word.
    unsafe {
        let k = ptr::addr_of!((*s).key);
        ptr::addr_of!((*k).addr[0]).read_volatile() == key.addr[0]
            && ptr::addr_of!((*k).addr[1]).read_volatile() == key.addr[1]
            && ptr::addr_of!((*k).addr[2]).read_volatile() == key.addr[2]
            && ptr::addr_of!((*k).addr[3]).read_volatile() == key.addr[3]
            && ptr::addr_of!((*k).port).read_volatile() == key.port
            && ptr::addr_of!((*k).family).read_volatile() == key.family
    }
}

#[inline(always)]
fn word(s: *const SourceSlot) -> u64 {
    // SAFETY: as in `holds`; an aligned 8-byte load cannot tear.
    unsafe { ptr::addr_of!((*s).word).read_volatile() }
}

/// The group's current usage (a read: racing changes may be missed, as with
/// the port count).
#[inline(always)]
pub fn usage(key: &SourceKey, seed: u32, mask: u32) -> Usage {
    let mut usage = Usage { count: 0, room: false };
    for i in 0..PROBES {
        let Some(s) = slot(key, seed, mask, i) else { continue };
        let w = word(s);
        if source::claimable(w) {
            usage.room = true;
        }
        if source::state(w) == LIVE && source::count(w) != 0 && holds(s, key) && word(s) == w {
            usage.count += source::count(w);
        }
    }
    usage
}

/// Counts one connection of the group; returns the slot index, or `None`
/// when none of the group's slots is free.
#[inline(always)]
pub fn acquire(key: &SourceKey, seed: u32, mask: u32) -> Option<u32> {
    for _attempt in 0..3 {
        let mut candidate: Option<(u32, u64)> = None;
        let mut contended = false;
        for i in 0..PROBES {
            let idx = index(key, seed, mask, i);
            let Some(s) = LIMITER_SOURCES.get_ptr_mut(idx) else { continue };
            let w = word(s);
            if source::state(w) == LIVE && holds(s, key) {
                match bump(s, w, key) {
                    Bump::Counted => {
                        touch(idx, mask);
                        return Some(idx);
                    }
                    // The slot was reclaimed for another group meanwhile
                    // (a unit may have come and gone: readers reread it).
                    Bump::Gone => {
                        touch(idx, mask);
                        contended = true;
                        break;
                    }
                }
            }
            if candidate.is_none() && source::claimable(w) {
                candidate = Some((idx, w));
            }
        }
        if contended {
            continue;
        }
        let (idx, w) = candidate?;
        let s = LIMITER_SOURCES.get_ptr_mut(idx)?;
        let claiming = source::next(w, CLAIMING, 0);
        // SAFETY: array value field, 8-byte aligned.
        if unsafe { atomic::cas(ptr::addr_of_mut!((*s).word), w, claiming) }.is_err() {
            continue;
        }
        // SAFETY: this CPU owns the slot while it is CLAIMING.
        unsafe {
            ptr::addr_of_mut!((*s).key).write_volatile(*key);
            // Cannot fail: nobody else changes a CLAIMING word.
            let _ = atomic::cas(ptr::addr_of_mut!((*s).word), claiming, source::live(claiming));
        }
        touch(idx, mask);
        return Some(idx);
    }
    None
}

enum Bump {
    Counted,
    Gone,
}

/// Adds one to a slot seen LIVE with `key` in word `w`. A failed
/// compare-and-swap in the same generation only means another CPU changed
/// the count: retry on what it saw (bounded), so contention from one
/// group's own connections never loses a count. After counting, the key is
/// read again: the slot cannot be reclaimed while it holds this unit, and a
/// key read before the word on a weakly ordered CPU could have been the
/// previous group's; if it is not ours, the unit is given back.
#[inline(always)]
fn bump(s: *mut SourceSlot, mut w: u64, key: &SourceKey) -> Bump {
    for _ in 0..16 {
        let bumped = source::with_count(w, source::count(w).wrapping_add(1));
        // SAFETY: array value field, 8-byte aligned.
        match unsafe { atomic::cas(ptr::addr_of_mut!((*s).word), w, bumped) } {
            Ok(()) => {
                if holds(s, key) {
                    return Bump::Counted;
                }
                // SAFETY: as above; this CPU holds the unit it subtracts.
                unsafe { atomic::sub(ptr::addr_of_mut!((*s).word), 1) };
                return Bump::Gone;
            }
            Err(seen) if seen >> 32 == w >> 32 => w = seen,
            Err(_) => return Bump::Gone,
        }
    }
    Bump::Gone
}

/// Uncounts one connection counted in slot `idx` of a table of `mask + 1`
/// slots.
#[inline(always)]
pub fn release(idx: u32, mask: u32) {
    if let Some(s) = LIMITER_SOURCES.get_ptr_mut(idx) {
        // The count is in the low bits and at least 1 (this connection's),
        // so subtracting cannot borrow into the state or generation.
        // SAFETY: array value field, 8-byte aligned.
        unsafe { atomic::sub(ptr::addr_of_mut!((*s).word), 1) };
        touch(idx, mask);
    }
}

/// Tells readers slot `idx` changed: bumps its block's change counter,
/// then its super-block's, after the change itself (a reader reads the
/// counters first, so it either sees the change or a newer counter).
#[inline(always)]
fn touch(idx: u32, mask: u32) {
    for entry in source::index_entries(idx, mask.wrapping_add(1)) {
        if let Some(v) = LIMITER_SRCVER.get_ptr_mut(entry) {
            // SAFETY: array value, 8-byte aligned.
            unsafe { atomic::add(v, 1) };
        }
    }
}
