//! Whether a directory limiter keeps something in can be trusted: whoever
//! can write it, or a directory above it, can replace what is there. In
//! the pin directory that is the gate's link pins (remove them and the
//! gate is gone) and the permit ledger (move it aside and a handover no
//! longer shares permits); in the admin socket's directory, the socket
//! (put another in its place and the CLI talks to it). So such a
//! directory and every one above it must belong to root or to the
//! daemon's own user (`--user`), and no one else may write them:
//!
//! - where it is strict (the pin directory up to its bpffs mount's root,
//!   the socket's own directory): no write bit for others, and a group
//!   write bit only for root's group; a bpffs mounted without `mode=` is
//!   `1777`, and is refused;
//! - above that (`/sys/fs`, `/run`): the same, except that a sticky
//!   directory writable by all (`/tmp`) is accepted, since no one but its
//!   owner can rename or remove the entry below it.
//!
//! Files limiter reads as root (the admin token, the certificates) are
//! opened through [`open_trusted`]: no symbolic link of another user's is
//! followed on the way.

use std::{
    fs,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

/// One directory on the way from the pin directory to `/`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub dir: PathBuf,
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
    /// No sticky exception here (see the module doc).
    pub strict: bool,
}

/// A directory that fails the rule: which, whose, what mode, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{} (owner uid {uid}, group {gid}, mode {mode:04o}) {why}", dir.display())]
pub struct Untrusted {
    pub dir: PathBuf,
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
    pub why: &'static str,
}

/// Judges the steps, the pin directory's first; `owners` are the uids
/// besides root's that may own them (the daemon's own, the `--user`'s).
pub fn judge(steps: &[Step], owners: &[u32]) -> Result<(), Untrusted> {
    for s in steps {
        let fail =
            |why| Err(Untrusted { dir: s.dir.clone(), uid: s.uid, gid: s.gid, mode: s.mode & 0o7777, why });
        if s.uid != 0 && !owners.contains(&s.uid) {
            return fail("is owned by another user");
        }
        let sticky = s.mode & 0o1000 != 0;
        if s.mode & 0o002 != 0 && (s.strict || !sticky) {
            return fail("is writable by others");
        }
        if s.mode & 0o020 != 0 && s.gid != 0 && (s.strict || !sticky) {
            return fail("is writable by its group");
        }
    }
    Ok(())
}

/// The existing directories from `pin_dir` (or its nearest existing
/// ancestor) up to `/`, as they are now; `strict` says where the sticky
/// exception does not apply.
pub fn steps(dir: &Path, strict: impl Fn(&Path) -> bool) -> std::io::Result<Vec<Step>> {
    let mut out = Vec::new();
    for dir in dir.ancestors().filter(|d| !d.as_os_str().is_empty()) {
        let meta = match std::fs::metadata(dir) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        out.push(Step {
            dir: dir.to_path_buf(),
            uid: meta.uid(),
            gid: meta.gid(),
            mode: meta.mode(),
            strict: strict(dir),
        });
    }
    Ok(out)
}

/// Opens `path` for reading, refusing it when any symbolic link on the
/// way belongs to a user other than root or this process's: whoever can
/// write a directory limiter reads from could otherwise point a link at a
/// file only root may read. Links made by root (Kubernetes' `..data` swap
/// of a mounted Secret or ConfigMap) are followed.
pub fn open_trusted(path: &Path) -> Result<fs::File, String> {
    let me = nix::unistd::geteuid().as_raw();
    let mut walked = std::path::PathBuf::new();
    for part in path.components() {
        walked.push(part);
        if let Ok(meta) = fs::symlink_metadata(&walked)
            && meta.file_type().is_symlink()
            && meta.uid() != 0
            && meta.uid() != me
        {
            return Err(format!(
                "{}: {} is a symbolic link of uid {} (mode {:04o}): not followed; only root's links are",
                path.display(),
                walked.display(),
                meta.uid(),
                meta.mode() & 0o7777
            ));
        }
    }
    fs::File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(dir: &str, uid: u32, gid: u32, mode: u32, strict: bool) -> Step {
        Step { dir: dir.into(), uid, gid, mode: 0o040000 | mode, strict }
    }

    fn chain(bpffs_root_mode: u32) -> Vec<Step> {
        vec![
            step("/sys/fs/bpf/limiter", 0, 0, 0o700, true),
            step("/sys/fs/bpf", 0, 0, bpffs_root_mode, true),
            step("/sys/fs", 0, 0, 0o755, false),
            step("/sys", 0, 0, 0o555, false),
            step("/", 0, 0, 0o755, false),
        ]
    }

    #[test]
    fn a_link_of_another_user_is_not_followed_and_roots_are() {
        let dir = std::env::temp_dir().join(format!("limiter-links-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let secret = dir.join("secret");
        fs::write(&secret, "only root may read this").unwrap();
        let link = dir.join("token");
        std::os::unix::fs::symlink(&secret, &link).unwrap();
        assert!(open_trusted(&link).is_ok(), "this process's own link is followed");
        if nix::unistd::geteuid().is_root() {
            std::os::unix::fs::lchown(&link, Some(4242), None).unwrap();
            let e = open_trusted(&link).unwrap_err();
            assert!(e.contains("is a symbolic link of uid 4242") && e.contains("not followed"), "{e}");
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_bpffs_mounted_mode_700_is_trusted() {
        assert_eq!(judge(&chain(0o700), &[]), Ok(()));
    }

    #[test]
    fn a_bpffs_mounted_without_mode_is_refused_naming_it() {
        let e = judge(&chain(0o1777), &[]).unwrap_err();
        assert_eq!(
            (e.dir.as_path(), e.mode, e.why),
            (Path::new("/sys/fs/bpf"), 0o1777, "is writable by others")
        );
        let text = e.to_string();
        assert!(
            text.starts_with("/sys/fs/bpf (owner uid 0, group 0, mode 1777) is writable by others"),
            "{text}"
        );
    }

    #[test]
    fn the_pin_directory_may_be_the_users_but_no_one_elses() {
        let mut steps = chain(0o700);
        steps[0].uid = 999;
        assert_eq!(judge(&steps, &[999]), Ok(()));
        let e = judge(&steps, &[998]).unwrap_err();
        assert_eq!(
            (e.dir.as_path(), e.uid, e.why),
            (Path::new("/sys/fs/bpf/limiter"), 999, "is owned by another user")
        );
    }

    #[test]
    fn group_write_is_refused_unless_the_group_is_roots() {
        let mut steps = chain(0o700);
        steps[0].mode = 0o040770;
        assert_eq!(judge(&steps, &[]), Ok(()));
        steps[0].gid = 100;
        assert_eq!(judge(&steps, &[]).unwrap_err().why, "is writable by its group");
    }

    #[test]
    fn a_sticky_directory_above_the_mount_is_accepted_but_not_on_bpffs() {
        let mut steps = chain(0o700);
        steps[2] = step("/tmp", 0, 0, 0o1777, false);
        assert_eq!(judge(&steps, &[]), Ok(()));
        steps[2].mode = 0o040777;
        assert_eq!(judge(&steps, &[]).unwrap_err().why, "is writable by others");
    }
}
