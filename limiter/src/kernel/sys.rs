//! The `bpf(2)` commands aya 0.14 does not expose: open a pinned object,
//! swap the program behind a link atomically (`BPF_LINK_UPDATE`, for the
//! cgroup `sock_ops` and netns `sk_lookup` links), and read many elements
//! of an array map in one call (`BPF_MAP_LOOKUP_BATCH`, so a scrape of the
//! source table is a few calls, not one per slot), and create, pin and
//! map into memory an array shared by processes (`BPF_MAP_CREATE` with
//! `BPF_F_MMAPABLE`, `BPF_OBJ_PIN`, `mmap`). The kernel's only `unsafe`,
//! kept to these calls (docs/architecture.md's "Where `unsafe` lives" lists the
//! daemon's others).

use std::{
    ffi::CString,
    io,
    os::fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
    os::unix::ffi::OsStrExt as _,
    path::Path,
};

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_OBJ_PIN: libc::c_long = 6;
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_MAP_TYPE_ARRAY: u32 = 2;
const BPF_F_MMAPABLE: u32 = 1 << 10;
const BPF_LINK_UPDATE: libc::c_long = 29;
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;

/// `union bpf_attr`, large enough for both commands (zeroed beyond them,
/// as the kernel requires).
#[repr(C, align(8))]
struct Attr([u32; 32]);

fn bpf(cmd: libc::c_long, attr: &mut Attr) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a zero-initialised `union bpf_attr` of the size
    // passed; the pointers it carries point at live values.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut Attr, size_of::<Attr>()) };
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(r) }
}

/// Opens the object pinned at `path` (`BPF_OBJ_GET`).
pub fn obj_get(path: &Path) -> io::Result<OwnedFd> {
    let path = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let mut attr = Attr([0; 32]);
    // struct { __aligned_u64 pathname; __u32 bpf_fd; __u32 file_flags; }
    let ptr = path.as_ptr() as u64;
    attr.0[0] = ptr as u32;
    attr.0[1] = (ptr >> 32) as u32;
    let fd = bpf(BPF_OBJ_GET, &mut attr)?;
    // SAFETY: a new file descriptor the kernel just returned, owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Makes `link` run `program` from now on, atomically (`BPF_LINK_UPDATE`):
/// no packet or socket sees neither program.
pub fn link_update(link: BorrowedFd<'_>, program: BorrowedFd<'_>) -> io::Result<()> {
    let mut attr = Attr([0; 32]);
    // struct { __u32 link_fd; __u32 new_prog_fd; __u32 flags; __u32 old_prog_fd; }
    attr.0[0] = link.as_raw_fd() as u32;
    attr.0[1] = program.as_raw_fd() as u32;
    bpf(BPF_LINK_UPDATE, &mut attr).map(drop)
}

/// Reads the values of up to `values.len() / value_size` elements of the
/// array map `map`, after index `after` (from the first, for `None`), in
/// one `BPF_MAP_LOOKUP_BATCH`. Returns how many were read, and the index
/// of the last one to continue after (`None`: the end of the array).
pub fn array_lookup_batch(
    map: BorrowedFd<'_>,
    after: Option<u32>,
    values: &mut [u8],
    value_size: usize,
) -> io::Result<(usize, Option<u32>)> {
    let count = values.len() / value_size;
    let mut keys = vec![0u32; count];
    let (mut in_batch, mut out_batch) = (after.unwrap_or(0), 0u32);
    let mut attr = Attr([0; 32]);
    // struct { __aligned_u64 in_batch, out_batch, keys, values;
    //          __u32 count, map_fd; __u64 elem_flags, flags; }
    let put = |attr: &mut Attr, at: usize, v: u64| {
        attr.0[at] = v as u32;
        attr.0[at + 1] = (v >> 32) as u32;
    };
    // The first batch starts from the beginning (a null in_batch).
    put(&mut attr, 0, if after.is_none() { 0 } else { &raw mut in_batch as u64 });
    put(&mut attr, 2, &raw mut out_batch as u64);
    put(&mut attr, 4, keys.as_mut_ptr() as u64);
    put(&mut attr, 6, values.as_mut_ptr() as u64);
    attr.0[8] = count as u32;
    attr.0[9] = map.as_raw_fd() as u32;
    // SAFETY (of the call in `bpf`): `keys` and `values` hold `count`
    // elements of the map's key and value sizes, and live across the call.
    match bpf(BPF_MAP_LOOKUP_BATCH, &mut attr) {
        Ok(_) => Ok((attr.0[8] as usize, Some(out_batch))),
        // The last batch: ENOENT, with the count of what it did fill.
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok((attr.0[8] as usize, None)),
        Err(e) => Err(e),
    }
}

/// Creates an array map of one `value_size`-byte element that processes can
/// map into memory (`BPF_F_MMAPABLE`), named `name` (at most 15 bytes).
pub fn create_mmapable(name: &str, value_size: u32) -> io::Result<OwnedFd> {
    let mut attr = Attr([0; 32]);
    // struct { __u32 map_type, key_size, value_size, max_entries, map_flags,
    //          inner_map_fd, numa_node; char map_name[16]; ... }
    attr.0[0] = BPF_MAP_TYPE_ARRAY;
    attr.0[1] = 4;
    attr.0[2] = value_size;
    attr.0[3] = 1;
    attr.0[4] = BPF_F_MMAPABLE;
    let mut map_name = [0u8; 16];
    let n = name.len().min(15);
    map_name[..n].copy_from_slice(&name.as_bytes()[..n]);
    for (i, word) in map_name.chunks_exact(4).enumerate() {
        attr.0[7 + i] = u32::from_ne_bytes(word.try_into().expect("4 bytes"));
    }
    let fd = bpf(BPF_MAP_CREATE, &mut attr)?;
    // SAFETY: a new file descriptor the kernel just returned, owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Pins the object `fd` at `path` (`BPF_OBJ_PIN`; fails with `EEXIST` if
/// something is pinned there).
pub fn obj_pin(fd: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
    let path = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let mut attr = Attr([0; 32]);
    // struct { __aligned_u64 pathname; __u32 bpf_fd; __u32 file_flags; }
    let ptr = path.as_ptr() as u64;
    attr.0[0] = ptr as u32;
    attr.0[1] = (ptr >> 32) as u32;
    attr.0[2] = fd.as_raw_fd() as u32;
    bpf(BPF_OBJ_PIN, &mut attr).map(drop)
}

/// A shared, writable mapping of a memory-mappable map's values, as words
/// that processes change only with atomic operations. Unmapped on drop.
pub struct Mapping {
    ptr: std::ptr::NonNull<std::sync::atomic::AtomicU64>,
    words: usize,
}

// SAFETY: the mapping is plain shared memory accessed only through atomics.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps the first `bytes` (a multiple of 8) of the values of `map`.
    pub fn new(map: BorrowedFd<'_>, bytes: usize) -> io::Result<Self> {
        assert!(bytes.is_multiple_of(8) && bytes > 0, "whole words");
        // SAFETY: a fresh shared mapping of a map file descriptor; the
        // kernel checks the length against the map and the flags.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                map.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = std::ptr::NonNull::new(ptr.cast()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Self { ptr, words: bytes / 8 })
    }

    /// The mapped words.
    pub fn words(&self) -> &[std::sync::atomic::AtomicU64] {
        // SAFETY: `words` 8-byte-aligned (page-aligned) words mapped for
        // as long as `self` lives; `AtomicU64` has the layout of `u64`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.words) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, no longer borrowed (`words`
        // borrows `self`).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.words * 8) };
    }
}
