//! Atomic updates of map values shared by every CPU. The bpf target has
//! no `AtomicU64` methods (it declares no compare-and-swap), so these use
//! the intrinsics LLVM lowers to BPF atomic instructions.

use core::intrinsics::{
    AtomicOrdering::{Relaxed, SeqCst},
    atomic_cxchg, atomic_xadd, atomic_xsub,
};

/// Adds `value` and returns the previous value.
///
/// Sequentially consistent on purpose: with a relaxed ordering, LLVM 22's
/// BPF backend at CPU v3 emits the non-fetching `lock +=` even though the
/// result is used, and the "previous value" silently becomes garbage (seen
/// in this crate's disassembly). The fetching form costs the same.
///
/// # Safety
/// `dst` must point to a live, 8-byte-aligned map value field.
#[inline(always)]
pub unsafe fn add(dst: *mut u64, value: u64) -> u64 {
    // SAFETY: forwarded to the caller.
    unsafe { atomic_xadd::<u64, u64, { SeqCst }>(dst, value) }
}

/// Subtracts `value`.
///
/// # Safety
/// As [`add`].
#[inline(always)]
pub unsafe fn sub(dst: *mut u64, value: u64) {
    // SAFETY: forwarded to the caller.
    unsafe { atomic_xsub::<u64, u64, { Relaxed }>(dst, value) };
}

/// Raises `*dst` to `value` unless it is already at least that: a bounded
/// compare-and-swap loop, so a racing lower value never overwrites a higher.
///
/// # Safety
/// As [`add`].
#[inline(always)]
pub unsafe fn raise(dst: *mut u64, value: u64) {
    // A plain (volatile) load: BPF has no relaxed atomic load instruction
    // before v4, and an aligned 8-byte load cannot tear.
    // SAFETY: forwarded to the caller.
    let mut seen = unsafe { dst.read_volatile() };
    for _ in 0..8 {
        if seen >= value {
            return;
        }
        // SAFETY: forwarded to the caller.
        let (now, swapped) = unsafe { atomic_cxchg::<u64, { Relaxed }, { Relaxed }>(dst, seen, value) };
        if swapped {
            return;
        }
        seen = now;
    }
}

/// Compare-and-swap: `Ok(())` if `*dst` was `old` and is now `new`,
/// `Err(seen)` otherwise.
///
/// # Safety
/// As [`add`].
#[inline(always)]
pub unsafe fn cas(dst: *mut u64, old: u64, new: u64) -> Result<(), u64> {
    // SAFETY: forwarded to the caller.
    let (seen, swapped) = unsafe { atomic_cxchg::<u64, { SeqCst }, { SeqCst }>(dst, old, new) };
    if swapped { Ok(()) } else { Err(seen) }
}

/// 32-bit compare-and-swap; `true` if `*dst` was `old` and is now `new`.
///
/// # Safety
/// `dst` must point to a live, 4-byte-aligned map value field.
#[inline(always)]
pub unsafe fn cas32(dst: *mut u32, old: u32, new: u32) -> bool {
    // SAFETY: forwarded to the caller.
    unsafe { atomic_cxchg::<u32, { SeqCst }, { SeqCst }>(dst, old, new) }.1
}
