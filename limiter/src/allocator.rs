//! The daemon's allocator: mimalloc, whose per-thread free lists suit the
//! one-thread-per-worker proxy better than glibc's arenas. The `mimalloc`
//! crate sends every allocation to mimalloc's *aligned* entry points, and
//! those take a slower, over-allocating path for anything above 1 KiB
//! (hyper's 8 KiB read buffers, twice per request); an alignment of a word
//! or less is what plain `mi_malloc` always gives, so such requests (all of
//! the proxy's) go there, and only larger alignments to the aligned calls.

use std::{
    alloc::{GlobalAlloc, Layout},
    ffi::c_void,
};

use libmimalloc_sys as mi;

/// What `mi_malloc` aligns every block to (a word: its smallest size class).
const PLAIN_ALIGN: usize = std::mem::size_of::<usize>();

/// mimalloc, through its plain entry points where they suffice.
pub struct Mimalloc;

// SAFETY: each call goes to mimalloc with the layout's size, and its
// alignment is either one `mi_malloc` guarantees (a word or less) or
// passed to the aligned call; freeing and reallocating take what mimalloc
// returned, as `GlobalAlloc` requires.
#[allow(unsafe_code, reason = "GlobalAlloc is an unsafe trait; the calls go straight to mimalloc")]
unsafe impl GlobalAlloc for Mimalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: see the impl.
        unsafe {
            if layout.align() <= PLAIN_ALIGN {
                mi::mi_malloc(layout.size()).cast()
            } else {
                mi::mi_malloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: see the impl.
        unsafe {
            if layout.align() <= PLAIN_ALIGN {
                mi::mi_zalloc(layout.size()).cast()
            } else {
                mi::mi_zalloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: see the impl.
        unsafe { mi::mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: see the impl.
        unsafe {
            if layout.align() <= PLAIN_ALIGN {
                mi::mi_realloc(ptr.cast::<c_void>(), new_size).cast()
            } else {
                mi::mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()).cast()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_block_is_aligned_as_asked_and_keeps_its_bytes() {
        let a = Mimalloc;
        for size in [1, 7, 8, 24, 1000, 1025, 8192, 70_000] {
            for align in [1, 2, 4, 8, 16, 64, 4096] {
                let layout = Layout::from_size_align(size, align).unwrap();
                // SAFETY: a non-zero size; each block freed once, with its layout.
                #[allow(unsafe_code, reason = "exercising the allocator itself")]
                unsafe {
                    let p = a.alloc(layout);
                    assert!(!p.is_null() && (p as usize).is_multiple_of(align), "{size} bytes at {align}");
                    p.write_bytes(0xa5, size);
                    let q = a.realloc(p, layout, size * 2);
                    assert!(
                        !q.is_null() && (q as usize).is_multiple_of(align),
                        "{size} bytes at {align}, grown"
                    );
                    assert!((0..size).all(|i| *q.add(i) == 0xa5), "{size} bytes at {align} kept");
                    a.dealloc(q, Layout::from_size_align(size * 2, align).unwrap());
                    let z = a.alloc_zeroed(layout);
                    assert!(
                        !z.is_null()
                            && (z as usize).is_multiple_of(align)
                            && (0..size).all(|i| *z.add(i) == 0)
                    );
                    a.dealloc(z, layout);
                }
            }
        }
    }
}
