//! The kernel gate's errors. Each renders as one sentence that says what
//! failed, on which program, map, interface or path, and what to do; the
//! cause is carried typed (aya's, the kernel's errno, the BTF reader's).

use std::{fmt, io, path::PathBuf};

use aya::{
    EbpfError,
    maps::MapError,
    pin::PinError,
    programs::{ProgramError, links::LinkError},
};
use limiter_common::LAYOUT_VERSION;

use super::btf::BtfError;

/// Errors of the kernel gate.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error(
        "limiter needs {missing} to load and attach its kernel programs; run it as root \
         (or with CAP_BPF, CAP_NET_ADMIN and CAP_SYS_ADMIN)"
    )]
    Privileges { missing: String },
    #[error("cannot tell the kernel version from /proc/sys/kernel/osrelease ({0:?})")]
    UnknownKernel(String),
    /// `needs` is `env::MIN_KERNEL`, carried so that this module, which
    /// `env` uses, does not use `env` in turn.
    #[error(
        "kernel {}.{} is too old: limiter needs {}.{} or newer (a TCP socket iterator that \
         locks each socket, 5.19; bpf_get_netns_cookie in sock_ops, 5.15)",
        found.0, found.1, needs.0, needs.1
    )]
    KernelTooOld { found: (u32, u32), needs: (u32, u32) },
    #[error(
        "no cgroup v2 is mounted (none in /proc/self/mounts): mount one \
         (mount -t cgroup2 none /sys/fs/cgroup/unified) or set kernel.cgroup"
    )]
    NoCgroup2,
    #[error("kernel.cgroup {0} does not exist: create the cgroup or fix the path")]
    CgroupMissing(PathBuf),
    #[error("kernel.cgroup {0} is not a cgroup v2 directory (sock_ops programs attach only to cgroup v2)")]
    NotCgroup2(PathBuf),
    #[error("kernel.netns {}: {source}", path.display())]
    NetnsOpen { path: PathBuf, source: io::Error },
    #[error(
        "kernel.netns {}: not a namespace file (expected /proc/PID/ns/net or /var/run/netns/NAME)",
        .0.display()
    )]
    NotNetns(PathBuf),
    #[error(
        "{0} exists but is not on bpffs: set kernel.pinPath to a directory under a bpffs \
         mount such as /sys/fs/bpf"
    )]
    PinDirNotBpffs(PathBuf),
    #[error(
        "kernel.pinPath {}: {untrusted}: any local user who can write it can remove the gate's pins; \
         the pin directory and every directory above it must belong to root or the --user, writable \
         by no one else (mount bpffs with mode=700)",
        pin_dir.display()
    )]
    UntrustedPinDir { pin_dir: PathBuf, untrusted: crate::dir_trust::Untrusted },
    #[error(
        "could not mount bpffs on {dir} ({}): mount it yourself with `mount -t bpf bpf {dir}`",
        source.desc(), dir = dir.display()
    )]
    MountBpffs { dir: PathBuf, source: nix::Error },
    #[error(
        "the pins in {dir} were made by an incompatible limiter ({why}); run \
         `limiter unload --pin-path {dir}` (this drops the gate's counts) and start again",
        dir = pin_dir.display()
    )]
    IncompatiblePins { pin_dir: PathBuf, why: Box<Incompatible> },
    #[error(
        "the gate pinned in {dir} has layout version {from}; this limiter (layout {LAYOUT_VERSION}) \
         migrates it in place when `limiter run` adopts it (counts kept, gate never detached); until \
         then, read it with the limiter that made it",
        dir = pin_dir.display()
    )]
    NeedsMigration { pin_dir: PathBuf, from: u32 },
    #[error(
        "the gate pinned at {dir} counts the network namespace with cookie {pinned}, but the \
         configuration targets cookie {wanted}: changing kernel.netns needs `limiter unload` first",
        dir = pin_dir.display()
    )]
    NetnsChanged { pin_dir: PathBuf, pinned: u64, wanted: u64 },
    #[error(
        "the gate pinned at {dir} counts the sockets of another cgroup than kernel.cgroup {wanted}: \
         changing kernel.cgroup needs `limiter unload` first",
        dir = pin_dir.display(), wanted = wanted.display()
    )]
    CgroupChanged { pin_dir: PathBuf, wanted: PathBuf },
    #[error(
        "the gate pinned at {dir} was created with {key} = {pinned}, and the configuration now says \
         {wanted}: this is fixed when the gate is created; run `limiter unload --pin-path {dir}` \
         (this drops the gate's counts) and start again, or put the old value back",
        dir = pin_dir.display()
    )]
    PinnedShape { pin_dir: PathBuf, key: &'static str, pinned: String, wanted: String },
    #[error("kernel.xdp.interfaces: no interface {0} in the gated network namespace")]
    NoInterface(String),
    #[error("no gate is pinned at {}: start it with `limiter run`", .0.display())]
    NotLoaded(PathBuf),
    #[error(
        "kernel.pinPath {}: another limiter process ({}) has been loading, adopting or unloading the gate          there for {} s; nothing was changed (is a load stuck? see that process's log)",
        pin_dir.display(),
        holder.map_or_else(|| "pid unknown".to_owned(), |p| format!("pid {p}")),
        waited.as_secs()
    )]
    PinDirBusy { pin_dir: PathBuf, holder: Option<u32>, waited: std::time::Duration },
    #[error("loading the kernel programs failed: {}", Chain(.0))]
    Object(#[source] Box<EbpfError>),
    #[error("loading the kernel programs failed: the embedded object has no `{0}`")]
    NotInObject(&'static str),
    #[error("loading the kernel programs failed: {0}")]
    Btf(#[from] BtfError),
    #[error("loading the kernel programs failed: reading the kernel's BTF: {}", Chain(.0))]
    KernelBtf(#[source] aya::BtfError),
    #[error("loading the kernel programs failed: {program}: {}", Chain(.source))]
    Program { program: &'static str, source: ProgramError },
    #[error("loading the kernel programs failed: attaching {program}{}: {}", to(.target), Chain(.source))]
    Attach { program: &'static str, target: Option<PathBuf>, source: ProgramError },
    #[error("loading the kernel programs failed: {program}: {}", Chain(.source))]
    Link { program: &'static str, source: LinkError },
    #[error("loading the kernel programs failed: pinning {}: {}", path.display(), Chain(.source))]
    Pin { path: PathBuf, source: PinError },
    #[error("loading the kernel programs failed: interface {interface}: {source}")]
    Interface { interface: String, source: InterfaceError },
    #[error("{what}: {source}")]
    Io { what: String, source: io::Error },
    #[error("{what}: {source}")]
    Map { what: String, source: MapError },
}

impl KernelError {
    pub(crate) fn io(what: impl Into<String>, source: io::Error) -> Self {
        Self::Io { what: what.into(), source }
    }

    pub(super) fn map(what: impl Into<String>) -> impl FnOnce(MapError) -> Self {
        let what = what.into();
        move |source| Self::Map { what, source }
    }

    pub(super) fn program(program: &'static str) -> impl FnOnce(ProgramError) -> Self {
        move |source| Self::Program { program, source }
    }

    pub(super) fn link(program: &'static str) -> impl FnOnce(LinkError) -> Self {
        move |source| Self::Link { program, source }
    }
}

impl From<EbpfError> for KernelError {
    fn from(e: EbpfError) -> Self {
        Self::Object(Box::new(e))
    }
}

/// Why pins that are ours by name cannot be adopted.
#[derive(Debug, thiserror::Error)]
pub enum Incompatible {
    #[error("map {0} is missing")]
    MissingMap(&'static str),
    #[error("map {name}: {source}")]
    Map { name: &'static str, source: MapError },
    /// Older layouts had a smaller configuration value: "incompatible",
    /// not "wrong size".
    #[error("map {name}: {source} (an older layout)")]
    OlderLayout { name: &'static str, source: MapError },
    #[error("layout version {0}, this limiter uses {LAYOUT_VERSION}")]
    LayoutVersion(u32),
    #[error("source table has {found} slots, the gate's configuration says {expected}")]
    SourceTable { found: u32, expected: u64 },
}

/// Why an interface's index or MAC could not be read.
#[derive(Debug, thiserror::Error)]
pub enum InterfaceError {
    #[error("{0}")]
    Index(#[source] nix::Error),
    #[error("listing its addresses: {0}")]
    Addresses(#[source] nix::Error),
    #[error("it has no link-layer address")]
    NoMac,
}

/// Why the XDP program did not attach to an interface. Not fatal: the
/// stack's sk_lookup still refuses there.
#[derive(Debug, thiserror::Error)]
pub enum XdpAttachError {
    #[error("generic mode: {0}")]
    Generic(#[source] XdpModeError),
    #[error("driver mode (kernel.xdp.mode = driver): {0}")]
    Driver(#[source] XdpModeError),
    #[error("driver mode: {driver}; generic mode: {generic}")]
    Neither {
        driver: Box<XdpModeError>,
        #[source]
        generic: Box<XdpModeError>,
    },
}

/// Why one attempt (one mode) to attach the XDP program failed.
#[derive(Debug, thiserror::Error)]
pub enum XdpModeError {
    /// Entering the gated network namespace, where the interface is named.
    #[error(transparent)]
    Netns(#[from] KernelError),
    #[error("{}", Chain(.0))]
    Attach(#[source] ProgramError),
    #[error("{}", Chain(.0))]
    Link(#[source] LinkError),
}

/// ` to PATH`, or nothing.
fn to(target: &Option<PathBuf>) -> String {
    target.as_ref().map(|t| format!(" to {}", t.display())).unwrap_or_default()
}

/// An error and its causes, `what: why: errno`. aya's errors often say
/// only which call failed and carry the errno as their source; a cause
/// whose text its parent already shows is not repeated.
pub(crate) struct Chain<'a>(pub &'a dyn std::error::Error);

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = self.0.to_string();
        let mut cause = self.0.source();
        while let Some(c) = cause {
            let text = c.to_string();
            if !out.contains(&text) {
                out.push_str(": ");
                out.push_str(&text);
            }
            cause = c.source();
        }
        f.write_str(&out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_shows_every_cause_once() {
        // What aya gives for a failed attach: the call, then the errno.
        let attach = ProgramError::SyscallError(aya::sys::SyscallError {
            call: "bpf_link_create",
            io_error: io::Error::from_raw_os_error(libc::EBUSY),
        });
        let e = KernelError::Attach {
            program: "limiter_count",
            target: Some("/sys/fs/cgroup/unified/app".into()),
            source: attach,
        };
        assert_eq!(
            e.to_string(),
            "loading the kernel programs failed: attaching limiter_count to /sys/fs/cgroup/unified/app: \
             `bpf_link_create` failed: Device or resource busy (os error 16)"
        );
        // A parent that already prints its cause does not get it twice.
        let load = EbpfError::MapError(MapError::KeyNotFound);
        assert_eq!(Chain(&load).to_string(), "map error: key not found");
    }

    #[test]
    fn xdp_failures_say_which_modes_were_tried() {
        let failed = || {
            XdpModeError::Attach(ProgramError::SyscallError(aya::sys::SyscallError {
                call: "bpf_link_create",
                io_error: io::Error::from_raw_os_error(libc::EOPNOTSUPP),
            }))
        };
        let both = XdpAttachError::Neither { driver: Box::new(failed()), generic: Box::new(failed()) };
        assert_eq!(
            both.to_string(),
            "driver mode: `bpf_link_create` failed: Operation not supported (os error 95); \
             generic mode: `bpf_link_create` failed: Operation not supported (os error 95)"
        );
        assert!(
            XdpAttachError::Driver(failed())
                .to_string()
                .starts_with("driver mode (kernel.xdp.mode = driver): ")
        );
    }
}
