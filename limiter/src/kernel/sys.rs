//! The two `bpf(2)` commands aya 0.14 does not expose for the links the
//! gate uses (a cgroup `sock_ops` link and a netns `sk_lookup` link): open
//! a pinned object, and swap the program behind a link atomically
//! (`BPF_LINK_UPDATE`). The only `unsafe` in the daemon, kept to these
//! two calls.

use std::{
    ffi::CString,
    io,
    os::fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
    os::unix::ffi::OsStrExt as _,
    path::Path,
};

const BPF_OBJ_GET: libc::c_long = 7;
const BPF_LINK_UPDATE: libc::c_long = 29;

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
