//! The pin directory as the daemon reaches it once it has dropped its
//! privileges: through a descriptor opened before the drop, not by its
//! path.
//!
//! A bpffs root mounted `mode=700` (systemd's and `limiter-bpffs.service`'s
//! mount) lets no one but root walk to the pin directory, though the pin
//! directory itself is given to the `--user`. The descriptor (`O_PATH`)
//! names the directory itself, and a path through `/proc/self/fd/N` starts
//! there: only the pin directory's own mode is checked, which is the
//! user's. So the link pins stay readable (is the gate attached?) and the
//! maps openable after the drop, while every other user still cannot walk
//! to them.

use std::{
    fs::File,
    io,
    os::fd::{AsRawFd as _, OwnedFd},
    os::unix::fs::OpenOptionsExt as _,
    path::{Path, PathBuf},
};

/// A descriptor on the pin directory and the path that reaches it.
#[derive(Debug)]
pub struct PinReach {
    _dir: OwnedFd,
    path: PathBuf,
}

impl PinReach {
    /// Holds `dir` open. Without a `/proc` to reach it through (no such
    /// host runs the daemon, but a test might), `dir` itself is the path.
    pub fn open(dir: &Path) -> io::Result<Self> {
        let file = File::options()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(dir)?;
        let fd = OwnedFd::from(file);
        let through_proc = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        let path = if through_proc.is_dir() { through_proc } else { dir.to_path_buf() };
        Ok(Self { _dir: fd, path })
    }

    /// The directory, reached through the descriptor: join a pin's name
    /// to it.
    pub fn path(&self) -> &Path {
        &self.path
    }
}
