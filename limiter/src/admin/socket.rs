//! The admin socket (`admin.socket`): a Unix socket whose owner and mode
//! decide who may speak to the daemon, as containerd's, Docker's and
//! HAProxy's stats socket do. It serves every admin path without a token;
//! `limiter reload`, `dump` and `top` use it. Only root (or the group
//! `admin.socketGroup` names) can connect, and since it lies in a
//! directory only root can write, no one can put another socket in its
//! place while the daemon is down.
//!
//! The socket is bound under a temporary name, given its owner and mode,
//! then renamed over the path: a daemon taking over (a handover) replaces
//! the old one's socket atomically, and a daemon that stops removes the
//! path only while it is still its own.

use std::{
    fs,
    os::unix::fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _},
    os::unix::net::UnixListener,
    path::{Path, PathBuf},
};

use crate::dir_trust;

/// Why the admin socket could not be made or reached.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error(
        "admin.socket {}: {what}: {source} (a daemon not run as root needs admin.socket in a directory \
         of its own user's, or admin.socket = off)",
        path.display()
    )]
    Io { path: PathBuf, what: &'static str, source: std::io::Error },
    #[error(
        "admin.socket {}: {untrusted}: a local user who can write there could put another socket in \
         its place; keep the socket in a directory of root's that no one else can write",
        path.display()
    )]
    Untrusted { path: PathBuf, untrusted: dir_trust::Untrusted },
    #[error("admin.socket {}: no parent directory", .0.display())]
    NoParent(PathBuf),
    #[error("admin.socketGroup {0}: no such group")]
    NoGroup(String),
}

/// The bound socket, and how to tell it is still the one at the path.
#[derive(Debug)]
pub struct Bound {
    pub listener: UnixListener,
    pub path: PathBuf,
    ino: u64,
}

/// Checks that `path`'s directory and those above it belong to root (or
/// `owners`) and that no one else can write them (`dir_trust`).
pub fn check_dir(path: &Path, owners: &[u32]) -> Result<(), SocketError> {
    let dir = path.parent().ok_or_else(|| SocketError::NoParent(path.to_path_buf()))?;
    let steps = dir_trust::steps(dir, |d| d == dir).map_err(|source| SocketError::Io {
        path: path.to_path_buf(),
        what: "looking at its directory",
        source,
    })?;
    dir_trust::judge(&steps, owners)
        .map_err(|untrusted| SocketError::Untrusted { path: path.to_path_buf(), untrusted })
}

/// Binds the socket at `path`: the directory is made (0755) if missing
/// and checked; the socket is mode 0600, or 0660 with `group`.
pub fn bind(path: &Path, group: Option<&str>) -> Result<Bound, SocketError> {
    let io = |what| {
        let path = path.to_path_buf();
        move |source| SocketError::Io { path, what, source }
    };
    let dir = path.parent().ok_or_else(|| SocketError::NoParent(path.to_path_buf()))?;
    if !dir.exists() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .map_err(io("creating its directory"))?;
    }
    check_dir(path, &[nix::unistd::geteuid().as_raw()])?;
    let gid = match group {
        Some(name) => Some(
            nix::unistd::Group::from_name(name)
                .ok()
                .flatten()
                .ok_or_else(|| SocketError::NoGroup(name.to_owned()))?
                .gid,
        ),
        None => None,
    };
    let file_name = path.file_name().ok_or_else(|| SocketError::NoParent(path.to_path_buf()))?;
    let temporary = dir.join(format!(".{}.{}", file_name.to_string_lossy(), std::process::id()));
    let _ = fs::remove_file(&temporary);
    let listener = UnixListener::bind(&temporary).map_err(io("binding"))?;
    let placed = (|| {
        let mode = if gid.is_some() { 0o660 } else { 0o600 };
        fs::set_permissions(&temporary, fs::Permissions::from_mode(mode))?;
        if let Some(gid) = gid {
            std::os::unix::fs::chown(&temporary, None, Some(gid.as_raw()))?;
        }
        fs::rename(&temporary, path)
    })();
    if let Err(e) = placed {
        let _ = fs::remove_file(&temporary);
        return Err(io("placing it")(e));
    }
    let ino = fs::metadata(path).map_err(io("reading it back"))?.ino();
    listener.set_nonblocking(true).map_err(io("making it non-blocking"))?;
    Ok(Bound { listener, path: path.to_path_buf(), ino })
}

impl Bound {
    /// Removes the path if it is still this socket (a daemon that took
    /// over has put its own there: that one stays).
    pub fn remove_if_ours(&self) {
        if fs::symlink_metadata(&self.path).is_ok_and(|m| m.ino() == self.ino) {
            let _ = fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_socket_is_private_and_replaced_atomically_and_removed_only_while_ours() {
        let dir = std::env::temp_dir().join(format!("limiter-socket-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let path = dir.join("run").join("admin.sock");
        let first = bind(&path, None).unwrap();
        let meta = fs::metadata(&path).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o600);
        assert_eq!(fs::metadata(path.parent().unwrap()).unwrap().mode() & 0o777, 0o755);
        // A second daemon takes the path over; the first stops and leaves it.
        let second = bind(&path, None).unwrap();
        first.remove_if_ours();
        assert!(path.exists(), "the first daemon removed the second's socket");
        std::os::unix::net::UnixStream::connect(&path).expect("the second's socket answers");
        second.remove_if_ours();
        assert!(!path.exists());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_directory_others_can_write_is_refused_naming_it() {
        let dir = std::env::temp_dir().join(format!("limiter-socket-open-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        let e = bind(&dir.join("admin.sock"), None).unwrap_err().to_string();
        assert!(
            e.contains(&format!("{} (owner uid", dir.display()))
                && e.contains("mode 0777) is writable by others"),
            "{e}"
        );
        assert!(!dir.join("admin.sock").exists());
        fs::remove_dir_all(&dir).unwrap();
    }
}
