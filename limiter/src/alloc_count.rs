//! A counting global allocator for the benchmark's allocations-per-request
//! figure (the `count-allocations` feature; a normal build has none of
//! this). It counts every allocation and reallocation, then hands the call
//! to mimalloc, the daemon's allocator; `/metrics` shows the count as
//! `limiter_process_allocations_total`. (valgrind cannot count them: mimalloc
//! takes its memory from the kernel directly, bypassing malloc.)

use std::{
    alloc::{GlobalAlloc, Layout},
    sync::atomic::{AtomicU64, Ordering},
};

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

/// Allocations (and reallocations) made so far by the process.
pub fn allocations() -> u64 {
    ALLOCATIONS.load(Ordering::Relaxed)
}

/// The daemon's allocator, counted.
pub struct Counting;

// SAFETY: every call is passed through unchanged to mimalloc, which
// upholds `GlobalAlloc`'s contract; counting touches no memory it returns.
#[allow(unsafe_code, reason = "GlobalAlloc is an unsafe trait; the calls pass straight through")]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's guarantees, passed on.
        unsafe { crate::allocator::Mimalloc.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { crate::allocator::Mimalloc.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { crate::allocator::Mimalloc.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { crate::allocator::Mimalloc.realloc(ptr, layout, new_size) }
    }
}
