//! What the daemon probes before it touches the kernel: privileges, kernel
//! version, the cgroup v2 mount, bpffs, the target network namespace. Each
//! failure is one sentence that says what to do, never a raw errno.

use std::{
    fs::{self, File},
    os::fd::AsFd as _,
    os::unix::fs::{DirBuilderExt as _, MetadataExt as _},
    path::{Path, PathBuf},
};

use nix::{
    mount::{MsFlags, mount},
    sched::{CloneFlags, setns},
    sys::{
        socket::{AddressFamily, SockFlag, SockType, getsockopt, socket},
        statfs::statfs,
    },
};

use super::{InterfaceError, KernelError};

/// The oldest kernel the gate runs on: the TCP socket iterator locks each
/// socket it visits since 5.19 (the start-up walk relies on it);
/// `bpf_get_netns_cookie` in sock_ops arrived in 5.15, sk_storage in
/// tracing programs in 5.11, sk_lookup and XDP links in 5.9.
pub const MIN_KERNEL: (u32, u32) = (5, 19);

const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
const NSFS_MAGIC: i64 = 0x6e73_6673;

const CAP_NET_ADMIN: u32 = 12;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_BPF: u32 = 39;

use nix::{getsockopt_impl, sockopt_impl};

sockopt_impl!(
    /// `SO_NETNS_COOKIE`: the cookie of the socket's network namespace.
    NetnsCookie,
    GetOnly,
    libc::SOL_SOCKET,
    libc::SO_NETNS_COOKIE,
    u64
);

/// The running kernel's `major.minor`, from `/proc/sys/kernel/osrelease`.
pub fn kernel_version() -> Result<(u32, u32), KernelError> {
    let release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    parse_release(release.trim()).ok_or(KernelError::UnknownKernel(release.trim().to_owned()))
}

/// `6.18.44-fc-v657` → (6, 18).
pub fn parse_release(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// Fails unless `version` is at least [`MIN_KERNEL`].
pub fn check_kernel(version: (u32, u32)) -> Result<(), KernelError> {
    if version < MIN_KERNEL {
        return Err(KernelError::KernelTooOld { found: version, needs: MIN_KERNEL });
    }
    Ok(())
}

/// The effective capability set, from `/proc/self/status`.
fn effective_caps() -> u64 {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .unwrap_or(0)
}

/// Fails unless the process may load and attach the gate's programs.
pub fn check_privileges() -> Result<(), KernelError> {
    let caps = effective_caps();
    let has = |cap: u32| caps & (1 << cap) != 0;
    let mut missing = Vec::new();
    if !has(CAP_BPF) && !has(CAP_SYS_ADMIN) {
        missing.push("CAP_BPF");
    }
    if !has(CAP_NET_ADMIN) {
        missing.push("CAP_NET_ADMIN");
    }
    if !missing.is_empty() {
        return Err(KernelError::Privileges { missing: missing.join(" and ") });
    }
    Ok(())
}

fn fs_type(path: &Path) -> Option<i64> {
    statfs(path).ok().map(|s| s.filesystem_type().0)
}

/// The first cgroup v2 mount in `/proc/self/mounts` (here
/// `/sys/fs/cgroup/unified`, on others `/sys/fs/cgroup`).
pub fn cgroup2_mount() -> Result<PathBuf, KernelError> {
    cgroup2_in(&fs::read_to_string("/proc/self/mounts").unwrap_or_default())
}

/// The first cgroup v2 mount point in a mount table (`/proc/self/mounts`).
fn cgroup2_in(mounts: &str) -> Result<PathBuf, KernelError> {
    mounts
        .lines()
        .find_map(|line| {
            let mut fields = line.split_whitespace();
            let (_src, point, kind) = (fields.next()?, fields.next()?, fields.next()?);
            (kind == "cgroup2").then(|| PathBuf::from(unescape_mount(point)))
        })
        .ok_or(KernelError::NoCgroup2)
}

/// `/proc/self/mounts` writes space, tab, newline and backslash as `\ooo`.
fn unescape_mount(field: &str) -> String {
    let mut out = String::new();
    let mut chars = field.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' {
            let digits: String = chars.clone().take(3).collect();
            if let Ok(code) = u8::from_str_radix(&digits, 8) {
                out.push(code as char);
                chars.nth(2);
                continue;
            }
        }
        out.push(c);
    }
    out
}

/// Opens the cgroup to attach to, checking it is a cgroup v2 directory.
pub fn open_cgroup(path: &Path) -> Result<File, KernelError> {
    if !path.is_dir() {
        return Err(KernelError::CgroupMissing(path.to_path_buf()));
    }
    if fs_type(path) != Some(CGROUP2_SUPER_MAGIC) {
        return Err(KernelError::NotCgroup2(path.to_path_buf()));
    }
    File::open(path).map_err(|e| KernelError::io(format!("opening cgroup {}", path.display()), e))
}

/// Opens a network namespace file (`/proc/self/ns/net`, `/var/run/netns/NAME`).
pub fn open_netns(path: &Path) -> Result<File, KernelError> {
    let file =
        File::open(path).map_err(|source| KernelError::NetnsOpen { path: path.to_path_buf(), source })?;
    // A wrong path (a plain file) would only fail later inside setns; say
    // it now. The namespace type is checked by setns(CLONE_NEWNET).
    if fs_type(path) != Some(NSFS_MAGIC) {
        return Err(KernelError::NotNetns(path.to_path_buf()));
    }
    Ok(file)
}

/// The inode that identifies a network namespace (as `ip netns`, `lsns`
/// and `bpftool link` show it).
pub fn netns_inode(netns: &File) -> u64 {
    netns.metadata().map(|m| m.ino()).unwrap_or(0)
}

/// The cookie of `netns`, as `bpf_get_netns_cookie` returns it inside it.
/// A socket must be created inside the namespace to ask; a namespace
/// switch is per thread, so a short-lived thread does it.
pub fn netns_cookie(netns: &File) -> Result<u64, KernelError> {
    let netns = netns.try_clone().map_err(|e| KernelError::io("duplicating the netns fd", e))?;
    std::thread::spawn(move || -> Result<u64, KernelError> {
        setns(netns.as_fd(), CloneFlags::CLONE_NEWNET)
            .map_err(|e| KernelError::io("entering the target network namespace", e.into()))?;
        let sock = socket(AddressFamily::Inet, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)
            .map_err(|e| KernelError::io("creating a socket in the target network namespace", e.into()))?;
        getsockopt(&sock, NetnsCookie)
            .map_err(|e| KernelError::io("reading SO_NETNS_COOKIE (kernel >= 5.14)", e.into()))
    })
    .join()
    .unwrap_or_else(|_| Err(KernelError::io("netns cookie thread", std::io::Error::other("panicked"))))
}

/// Runs `f` on this thread inside `netns`, then returns the thread to the
/// namespace it was in (a namespace switch is per thread). Used for what
/// resolves names or picks its namespace from the caller: interface names
/// (XDP attachment, MACs) and the socket iterator. Failing to enter the
/// namespace is an error of `f`'s type, so the caller decides whether it
/// is fatal.
pub fn in_netns<T, E: From<KernelError>>(netns: &File, f: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
    let home = File::open("/proc/thread-self/ns/net")
        .map_err(|e| KernelError::io("opening this thread's network namespace", e))?;
    setns(netns.as_fd(), CloneFlags::CLONE_NEWNET)
        .map_err(|e| KernelError::io("entering the target network namespace", e.into()))?;
    let out = f();
    if let Err(e) = setns(home.as_fd(), CloneFlags::CLONE_NEWNET) {
        // Staying in the target namespace would bind the daemon's later
        // sockets there; better to stop.
        panic!("could not return to the daemon's network namespace: {e}");
    }
    out
}

/// Whether the gated namespace has an interface called `name`.
pub fn has_interface(netns: &File, name: &str) -> Result<bool, KernelError> {
    in_netns(netns, || Ok::<_, KernelError>(nix::net::if_::if_nametoindex(name).is_ok()))
}

/// The ifindex and MAC of `interface`, as the gated namespace sees them.
pub fn interface_mac(netns: &File, interface: &str) -> Result<(u32, [u8; 6]), KernelError> {
    let fail = |source| KernelError::Interface { interface: interface.to_owned(), source };
    in_netns(netns, || {
        let index = nix::net::if_::if_nametoindex(interface).map_err(|e| fail(InterfaceError::Index(e)))?;
        let mac = nix::ifaddrs::getifaddrs()
            .map_err(|e| fail(InterfaceError::Addresses(e)))?
            .filter(|a| a.interface_name == interface)
            .find_map(|a| a.address.as_ref().and_then(|s| s.as_link_addr()).and_then(|l| l.addr()))
            .ok_or_else(|| fail(InterfaceError::NoMac))?;
        Ok((index, mac))
    })
}

/// Makes `pin_dir` an existing directory on bpffs (mode 0700), mounting
/// bpffs at its parent when the parent is not on bpffs yet. Returns whether
/// a mount was made.
pub fn ensure_bpffs(pin_dir: &Path) -> Result<bool, KernelError> {
    if pin_dir.is_dir() {
        return if fs_type(pin_dir) == Some(BPF_FS_MAGIC) {
            Ok(false)
        } else {
            Err(KernelError::PinDirNotBpffs(pin_dir.to_path_buf()))
        };
    }
    let parent = pin_dir.parent().ok_or_else(|| KernelError::PinDirNotBpffs(pin_dir.to_path_buf()))?;
    // The nearest existing ancestor tells whether bpffs is already there.
    let ancestor = parent.ancestors().find(|p| p.exists()).unwrap_or(Path::new("/"));
    let mut mounted = false;
    if fs_type(ancestor) != Some(BPF_FS_MAGIC) {
        mounted = mount_bpffs(parent)?;
    }
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(pin_dir)
        .map_err(|e| KernelError::io(format!("creating the pin directory {}", pin_dir.display()), e))?;
    Ok(mounted)
}

/// Mounts bpffs (mode 0700, `nosuid,nodev,noexec`) at `dir`, made if
/// missing, unless `dir` is on bpffs already. Returns whether a mount was
/// made.
pub fn mount_bpffs(dir: &Path) -> Result<bool, KernelError> {
    if fs_type(dir) == Some(BPF_FS_MAGIC) {
        return Ok(false);
    }
    fs::create_dir_all(dir)
        .map_err(|e| KernelError::io(format!("creating {} to mount bpffs on", dir.display()), e))?;
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount(Some("bpf"), dir, Some("bpf"), flags, Some("mode=0700"))
        .map_err(|source| KernelError::MountBpffs { dir: dir.to_path_buf(), source })?;
    Ok(true)
}

/// Refuses a pin directory that someone besides root and `owners` could
/// write, or that lies under one (`crate::dir_trust`).
pub fn check_pin_trust(pin_dir: &Path, owners: &[u32]) -> Result<(), KernelError> {
    let mut owners = owners.to_vec();
    owners.push(nix::unistd::geteuid().as_raw());
    let steps = crate::dir_trust::steps(pin_dir, |d| fs_type(d) == Some(BPF_FS_MAGIC))
        .map_err(|e| KernelError::io(format!("looking at the owners of {}", pin_dir.display()), e))?;
    crate::dir_trust::judge(&steps, &owners)
        .map_err(|untrusted| KernelError::UntrustedPinDir { pin_dir: pin_dir.to_path_buf(), untrusted })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_parse() {
        assert_eq!(parse_release("6.18.44-fc-v657"), Some((6, 18)));
        assert_eq!(parse_release("5.15.0-91-generic"), Some((5, 15)));
        assert_eq!(parse_release("4.19"), Some((4, 19)));
        assert_eq!(parse_release("6.1"), Some((6, 1)));
        assert_eq!(parse_release("6"), None);
        assert_eq!(parse_release("6.x"), None);
        assert_eq!(parse_release(""), None);
        assert_eq!(parse_release("garbage"), None);
    }

    #[test]
    fn old_kernels_are_refused_with_the_reason() {
        assert!(check_kernel((6, 18)).is_ok());
        assert!(check_kernel((5, 19)).is_ok());
        let e = check_kernel((5, 15)).unwrap_err().to_string();
        assert_eq!(
            e,
            "kernel 5.15 is too old: limiter needs 5.19 or newer (a TCP socket iterator that \
             locks each socket, 5.19; bpf_get_netns_cookie in sock_ops, 5.15)"
        );
        assert!(check_kernel((4, 19)).is_err());
    }

    #[test]
    fn mount_points_unescape() {
        assert_eq!(unescape_mount("/sys/fs/cgroup/unified"), "/sys/fs/cgroup/unified");
        assert_eq!(unescape_mount("/mnt/a\\040b"), "/mnt/a b");
        // Tab, newline and the backslash itself, as the kernel writes them.
        assert_eq!(unescape_mount("/mnt/t\\011n\\012b\\134x"), "/mnt/t\tn\nb\\x");
        // Not an octal escape: left as it is.
        assert_eq!(unescape_mount("/mnt/a\\9zz"), "/mnt/a\\9zz");
    }

    #[test]
    fn the_first_cgroup2_mount_is_the_one_used() {
        let mounts = "sysfs /sys sysfs rw 0 0\n\
                      cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n\
                      none /sys/fs/cgroup/my\\040unified cgroup2 rw 0 0\n\
                      none /other cgroup2 rw 0 0\n";
        assert_eq!(cgroup2_in(mounts).unwrap(), PathBuf::from("/sys/fs/cgroup/my unified"));
        let e = cgroup2_in("sysfs /sys sysfs rw 0 0\n").unwrap_err();
        assert!(e.to_string().starts_with("no cgroup v2 is mounted"), "{e}");
    }
}
