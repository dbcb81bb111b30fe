//! The `bpf(2)` commands aya 0.14 does not expose: open a pinned object,
//! swap the program behind a link atomically (`BPF_LINK_UPDATE`, for the
//! cgroup `sock_ops` and netns `sk_lookup` links), and read many elements
//! of an array map in one call (`BPF_MAP_LOOKUP_BATCH`, so a scrape of the
//! source table is a few calls, not one per slot). The only `unsafe` in
//! the daemon, kept to these three calls.

use std::{
    ffi::CString,
    io,
    os::fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
    os::unix::ffi::OsStrExt as _,
    path::Path,
};

const BPF_OBJ_GET: libc::c_long = 7;
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
