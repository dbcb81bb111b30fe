//! Least privilege. Everything that needs privileges happens in
//! [`super::prepare`], before any other thread exists; then the
//! daemon keeps only what it still uses:
//!
//! - with the kernel gate: `CAP_BPF` alone (in the effective, permitted
//!   and bounding sets): every later map read and write goes through
//!   `bpf(2)`, which a kernel with `kernel.unprivileged_bpf_disabled` set
//!   refuses without it; no other capability is needed, since the maps and
//!   links were opened, and the listeners bound, already;
//! - without it (`kernel.enabled = false`): nothing.
//!
//! The inheritable and ambient sets are emptied and `no_new_privs` is set,
//! so nothing the daemon could execute gains privileges. With `--user`,
//! the daemon also becomes that user (its primary group, no supplementary
//! groups) after giving it the pin directory, whose pins stay mode 0600.

use std::path::Path;

use caps::{CapSet, Capability, CapsHashSet};
use nix::unistd::{Gid, Uid, User};

/// What failed while dropping privileges: the step, and the system's
/// answer.
#[derive(Debug, thiserror::Error)]
pub enum PrivilegeError {
    #[error("--user {user}: {source}")]
    LookUp { user: String, source: nix::Error },
    #[error("--user {0}: no such user")]
    NoSuchUser(String),
    #[error("{step}: {source}")]
    Call { step: String, source: nix::Error },
    #[error("{step}: {source}")]
    Caps { step: String, source: caps::errors::CapsError },
    #[error("{step}: {source}")]
    Io { step: String, source: std::io::Error },
}

fn call(step: impl Into<String>) -> impl FnOnce(nix::Error) -> PrivilegeError {
    let step = step.into();
    move |source| PrivilegeError::Call { step, source }
}

fn caps_step(step: impl Into<String>) -> impl FnOnce(caps::errors::CapsError) -> PrivilegeError {
    let step = step.into();
    move |source| PrivilegeError::Caps { step, source }
}

fn io_step(step: impl Into<String>) -> impl FnOnce(std::io::Error) -> PrivilegeError {
    let step = step.into();
    move |source| PrivilegeError::Io { step, source }
}

/// The uid of the user `--user` names.
pub fn uid_of(spec: &str) -> Result<u32, PrivilegeError> {
    Ok(user(spec)?.uid.as_raw())
}

/// Who `--user` names: a user name (its uid and primary group), or
/// `UID[:GID]` in numbers (a dedicated uid in a container image that has
/// no passwd entry for it; the group is the uid's number unless given).
struct Target {
    uid: Uid,
    gid: Gid,
}

fn user(spec: &str) -> Result<Target, PrivilegeError> {
    let (uid, gid) = spec.split_once(':').unwrap_or((spec, spec));
    if let (Ok(uid), Ok(gid)) = (uid.parse::<u32>(), gid.parse::<u32>()) {
        return Ok(Target { uid: Uid::from_raw(uid), gid: Gid::from_raw(gid) });
    }
    let found = User::from_name(spec)
        .map_err(|source| PrivilegeError::LookUp { user: spec.to_owned(), source })?
        .ok_or_else(|| PrivilegeError::NoSuchUser(spec.to_owned()))?;
    Ok(Target { uid: found.uid, gid: found.gid })
}

/// The capabilities kept after start-up.
pub fn kept(kernel: bool) -> CapsHashSet {
    let mut set = CapsHashSet::new();
    if kernel {
        set.insert(Capability::CAP_BPF);
    }
    set
}

/// Drops to [`kept`] capabilities and, with `user`, to that user. Call on
/// the only thread of the process.
pub fn drop_to(user: Option<&str>, pin_dir: Option<&Path>) -> Result<(), PrivilegeError> {
    let keep = kept(pin_dir.is_some());
    let target = user.map(self::user).transpose()?;
    // While CAP_SETPCAP is still effective: nothing outside `keep` can be
    // regained, by this process or anything it runs.
    // (Without CAP_SETPCAP, e.g. started as an ordinary user for the proxy
    // alone, nothing can be taken out of the bounding set, and nothing in it
    // can be used either.)
    if caps::has_cap(None, CapSet::Effective, Capability::CAP_SETPCAP).unwrap_or(false) {
        for cap in caps::all() {
            if !keep.contains(&cap) && caps::has_cap(None, CapSet::Bounding, cap).unwrap_or(false) {
                caps::drop(None, CapSet::Bounding, cap)
                    .map_err(caps_step(format!("dropping {cap} from the bounding set")))?;
            }
        }
    }
    if let Some(user) = &target {
        if let Some(dir) = pin_dir {
            give(dir, user.uid, user.gid)?;
        }
        nix::sys::prctl::set_keepcaps(true).map_err(call("PR_SET_KEEPCAPS"))?;
        nix::unistd::setgroups(&[user.gid]).map_err(call("setgroups"))?;
        nix::unistd::setresgid(user.gid, user.gid, user.gid).map_err(call("setresgid"))?;
        nix::unistd::setresuid(user.uid, user.uid, user.uid).map_err(call("setresuid"))?;
        nix::sys::prctl::set_keepcaps(false).map_err(call("PR_SET_KEEPCAPS"))?;
    }
    // Effective first: it must stay within the permitted set at every step.
    caps::set(None, CapSet::Effective, &keep).map_err(caps_step("setting the effective set"))?;
    caps::set(None, CapSet::Permitted, &keep).map_err(caps_step("setting the permitted set"))?;
    caps::clear(None, CapSet::Inheritable).map_err(caps_step("clearing the inheritable set"))?;
    caps::clear(None, CapSet::Ambient).map_err(caps_step("clearing the ambient set"))?;
    nix::sys::prctl::set_no_new_privs().map_err(call("PR_SET_NO_NEW_PRIVS"))?;
    let names: Vec<String> = keep.iter().map(ToString::to_string).collect();
    tracing::info!(
        capabilities = %if names.is_empty() { "none".to_owned() } else { names.join(",") },
        user = user.unwrap_or("(unchanged)"),
        "privileges dropped"
    );
    Ok(())
}

/// Gives the pin directory and the daemon's own pins to `uid:gid`, so the
/// daemon can still open them (they stay mode 0600).
fn give(dir: &Path, uid: Uid, gid: Gid) -> Result<(), PrivilegeError> {
    let own = |path: &Path| {
        std::os::unix::fs::chown(path, Some(uid.as_raw()), Some(gid.as_raw()))
            .map_err(io_step(format!("giving {} to the --user", path.display())))
    };
    own(dir)?;
    let entries = std::fs::read_dir(dir).map_err(io_step(format!("reading {}", dir.display())))?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if crate::kernel::OWN_PINS.contains(&name.as_ref())
            || name.starts_with(crate::kernel::LINK_XDP_PREFIX)
        {
            own(&entry.path())?;
        }
    }
    Ok(())
}
