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
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;

/// `union bpf_attr`, large enough for both commands (zeroed beyond them,
/// as the kernel requires).
#[repr(C, align(8))]
struct Attr([u32; 32]);

/// `bpf(cmd, attr)`.
///
/// # Safety
///
/// `attr` must be `cmd`'s member of `union bpf_attr`, zero beyond it, and
/// every pointer it carries must point at memory that lives across the
/// call and is as large as the kernel will read or write there for `cmd`
/// (what a map's key and value sizes say, for a map command).
unsafe fn bpf(cmd: libc::c_long, attr: &mut Attr) -> io::Result<libc::c_long> {
    // SAFETY: the caller's, above; `attr` itself is of the size passed.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut Attr, size_of::<Attr>()) };
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(r) }
}

/// What the kernel says of a map: its type, key and value sizes, entries
/// and flags (`BPF_OBJ_GET_INFO_BY_FD`); an error for a descriptor that is
/// not a BPF map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapShape {
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub flags: u32,
}

/// The shape of the map `map`.
pub fn map_shape(map: BorrowedFd<'_>) -> io::Result<MapShape> {
    // struct bpf_map_info { __u32 type, id, key_size, value_size,
    //                       max_entries, map_flags; char name[16]; ... }
    let mut info = [0u32; 20];
    let mut attr = Attr([0; 32]);
    // struct { __u32 bpf_fd; __u32 info_len; __aligned_u64 info; }
    attr.0[0] = map.as_raw_fd() as u32;
    attr.0[1] = size_of_val(&info) as u32;
    let ptr = info.as_mut_ptr() as u64;
    attr.0[2] = ptr as u32;
    attr.0[3] = (ptr >> 32) as u32;
    // SAFETY: `info` is `info_len` bytes, live across the call; the
    // kernel writes at most that much.
    unsafe { bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr) }?;
    Ok(MapShape {
        map_type: info[0],
        key_size: info[2],
        value_size: info[3],
        max_entries: info[4],
        flags: info[5],
    })
}

/// An error naming what a map was asked to be and is not.
fn not_shaped(what: &str, shape: MapShape) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, format!("the map is not {what}: {shape:?}"))
}

/// Opens the object pinned at `path` (`BPF_OBJ_GET`).
pub fn obj_get(path: &Path) -> io::Result<OwnedFd> {
    let path = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let mut attr = Attr([0; 32]);
    // struct { __aligned_u64 pathname; __u32 bpf_fd; __u32 file_flags; }
    let ptr = path.as_ptr() as u64;
    attr.0[0] = ptr as u32;
    attr.0[1] = (ptr >> 32) as u32;
    // SAFETY: `pathname` points at `path`'s bytes, NUL-terminated, live
    // across the call.
    let fd = unsafe { bpf(BPF_OBJ_GET, &mut attr) }?;
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
    // SAFETY: no pointer in this command's member.
    unsafe { bpf(BPF_LINK_UPDATE, &mut attr) }.map(drop)
}

/// Reads the values of up to `values.len() / value_size` elements of the
/// array map `map`, after index `after` (from the first, for `None`), in
/// one `BPF_MAP_LOOKUP_BATCH`. Returns how many were read, and the index
/// of the last one to continue after (`None`: the end of the array).
/// Fails, reading nothing, unless `map` is a plain array (not per-CPU,
/// whose values are one per CPU) of `value_size`-byte values.
pub fn array_lookup_batch(
    map: BorrowedFd<'_>,
    after: Option<u32>,
    values: &mut [u8],
    value_size: usize,
) -> io::Result<(usize, Option<u32>)> {
    let shape = map_shape(map)?;
    if shape.map_type != BPF_MAP_TYPE_ARRAY || shape.key_size != 4 || shape.value_size as usize != value_size
    {
        return Err(not_shaped(&format!("an array of {value_size}-byte values"), shape));
    }
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
    // SAFETY: the map's keys are 4 bytes and its values `value_size`
    // (checked above); `keys` and `values` hold `count` of each and live
    // across the call, as `in_batch` and `out_batch` do.
    match unsafe { bpf(BPF_MAP_LOOKUP_BATCH, &mut attr) } {
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
    // SAFETY: no pointer in this command's member (the name is inline).
    let fd = unsafe { bpf(BPF_MAP_CREATE, &mut attr) }?;
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
    // SAFETY: `pathname` points at `path`'s bytes, NUL-terminated, live
    // across the call.
    unsafe { bpf(BPF_OBJ_PIN, &mut attr) }.map(drop)
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
    /// Maps the first `bytes` (a multiple of 8) of the values of `map`,
    /// which must be a memory-mappable array map that large (else an
    /// error, nothing mapped: a file, whose length may change under the
    /// mapping, is not one).
    pub fn new(map: BorrowedFd<'_>, bytes: usize) -> io::Result<Self> {
        assert!(bytes.is_multiple_of(8) && bytes > 0, "whole words");
        let shape = map_shape(map)?;
        let size = u64::from(shape.value_size) * u64::from(shape.max_entries);
        if shape.map_type != BPF_MAP_TYPE_ARRAY || shape.flags & BPF_F_MMAPABLE == 0 || size < bytes as u64 {
            return Err(not_shaped(&format!("a memory-mappable array of {bytes} bytes"), shape));
        }
        Self::map(map, bytes)
    }

    /// [`Self::new`] over a memory file of at least `bytes` that nobody
    /// shrinks (the tests' stand-in for the map).
    #[cfg(test)]
    pub fn of_memfd(memfd: BorrowedFd<'_>, bytes: usize) -> io::Result<Self> {
        assert!(bytes.is_multiple_of(8) && bytes > 0, "whole words");
        Self::map(memfd, bytes)
    }

    /// The mapping itself, of a descriptor whose object is at least
    /// `bytes` long and stays so (checked by the callers).
    fn map(map: BorrowedFd<'_>, bytes: usize) -> io::Result<Self> {
        // SAFETY: a fresh shared mapping of an object at least `bytes`
        // long that never shrinks (a BPF array map's values, checked in
        // `new`; a test's memory file).
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

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd as _;

    use super::*;

    #[test]
    fn a_file_is_no_map_to_map_into_memory_or_to_read_in_batches() {
        let path = std::env::temp_dir().join(format!("limiter-not-a-map-{}", std::process::id()));
        std::fs::write(&path, [0u8; 4096]).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        assert!(map_shape(file.as_fd()).is_err());
        assert!(Mapping::new(file.as_fd(), 4096).is_err(), "mapped a file as a map");
        let mut values = [0u8; 64];
        assert!(array_lookup_batch(file.as_fd(), None, &mut values, 8).is_err());
        std::fs::remove_file(&path).unwrap();
    }
}
