//! One process at a time changes a pin directory: loading a gate,
//! adopting one (swapping programs into its links, migrating its layout)
//! and `limiter unload` each hold an exclusive `flock(2)` on the pin
//! directory itself for as long as they change it.
//!
//! Without it, a second `run` started while the first is still loading
//! finds the first's half-made pins, removes them as a load that never
//! completed, and the first serves with no gate; or the second fails to
//! pin what the first just pinned. With it, the second waits for the
//! first's load to end, then adopts the gate it made.
//!
//! The lock is on the directory's inode, which every process that sees
//! the same bpffs sees (a lock file is not possible: bpffs holds only
//! pins and directories). `unload` may remove the directory it emptied
//! while a waiter holds it open: a lock taken on a directory no longer at
//! the path is dropped and taken again on the one there now.

use std::{
    fs::File,
    io,
    os::unix::fs::{MetadataExt as _, OpenOptionsExt as _},
    path::Path,
    time::{Duration, Instant},
};

use super::KernelError;

/// How long a start or an unload waits for another process's load: a
/// load that walks a million connections takes seconds, not this.
pub const WAIT: Duration = Duration::from_secs(60);
/// How often a waiter tries again.
const POLL: Duration = Duration::from_millis(10);

/// The exclusive hold on a pin directory; released on drop (the
/// descriptor's close releases the lock, also when the process dies).
#[derive(Debug)]
pub struct PinLock {
    _dir: File,
}

impl PinLock {
    /// Holds `pin_dir` (which must exist), waiting up to `wait` for a
    /// process that holds it; `made` makes the directory again when an
    /// unload removed it meanwhile.
    pub fn acquire(
        pin_dir: &Path,
        wait: Duration,
        made: impl Fn() -> Result<(), KernelError>,
    ) -> Result<Self, KernelError> {
        let deadline = Instant::now() + wait;
        let mut told = false;
        loop {
            let dir = match open_dir(pin_dir) {
                Ok(dir) => dir,
                // Removed by an unload since the caller made it.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    made()?;
                    continue;
                }
                Err(e) => return Err(KernelError::io(format!("opening {}", pin_dir.display()), e)),
            };
            // std's file lock is flock(2) on Linux.
            match dir.try_lock() {
                Ok(()) if same_inode(&dir, pin_dir) => return Ok(Self { _dir: dir }),
                Ok(()) => {
                    // Removed (and maybe made again) while this process waited.
                    drop(dir);
                    made()?;
                    continue;
                }
                Err(std::fs::TryLockError::WouldBlock) => {}
                Err(std::fs::TryLockError::Error(e)) => {
                    return Err(KernelError::io(format!("locking {}", pin_dir.display()), e));
                }
            }
            let holder = holder(&dir);
            if Instant::now() >= deadline {
                return Err(KernelError::PinDirBusy { pin_dir: pin_dir.to_path_buf(), holder, waited: wait });
            }
            if !told {
                told = true;
                tracing::info!(
                    pin_dir = %pin_dir.display(),
                    holder = holder.map_or_else(|| "unknown".to_owned(), |p| p.to_string()),
                    "another limiter process is loading, adopting or unloading the gate here; waiting for it"
                );
            }
            std::thread::sleep(POLL);
        }
    }
}

fn open_dir(pin_dir: &Path) -> io::Result<File> {
    std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC).open(pin_dir)
}

/// Whether `dir` is still the directory at `path`.
fn same_inode(dir: &File, path: &Path) -> bool {
    match (dir.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// The process holding the lock on `dir`, from `/proc/locks` (for the
/// message; `None` when it cannot be told, e.g. from another pid
/// namespace).
fn holder(dir: &File) -> Option<u32> {
    let meta = dir.metadata().ok()?;
    let text = std::fs::read_to_string("/proc/locks").ok()?;
    holder_in(&text, meta.dev(), meta.ino())
}

/// The pid of the `FLOCK` line of `/proc/locks` on device `dev`, inode
/// `ino`. A line: `1: FLOCK  ADVISORY  WRITE 1234 00:2a:5678 0 EOF`, the
/// device as major:minor in hex.
fn holder_in(locks: &str, dev: u64, ino: u64) -> Option<u32> {
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    locks.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        // A waiter's line starts with "->"; only the holder's counts.
        if f.len() < 6 || f[1] != "FLOCK" || f[0] == "->" {
            return None;
        }
        let mut id = f[5].split(':');
        let (ma, mi, i) = (id.next()?, id.next()?, id.next()?);
        let matches = u32::from_str_radix(ma, 16).ok()? == major
            && u32::from_str_radix(mi, 16).ok()? == minor
            && i.parse::<u64>().ok()? == ino;
        matches.then(|| f[4].parse().ok()).flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_holder_is_read_from_proc_locks() {
        let locks = "1: FLOCK  ADVISORY  WRITE 4242 00:2a:77 0 EOF\n\
                     1: -> FLOCK  ADVISORY  WRITE 4343 00:2a:77 0 EOF\n\
                     2: POSIX  ADVISORY  WRITE 99 00:2a:78 0 EOF\n";
        let dev = libc::makedev(0, 0x2a);
        assert_eq!(holder_in(locks, dev, 77), Some(4242));
        assert_eq!(holder_in(locks, dev, 78), None, "a POSIX lock is not ours");
        assert_eq!(holder_in(locks, dev, 79), None);
        assert_eq!(holder_in(locks, libc::makedev(0, 0x2b), 77), None);
    }

    #[test]
    fn a_second_holder_waits_for_the_first_and_gives_up_with_its_pid() {
        let dir = std::env::temp_dir().join(format!("limiter-pin-lock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let first = PinLock::acquire(&dir, Duration::ZERO, || Ok(())).unwrap();
        // flock is per open file: a second open in this process conflicts
        // as another process would.
        let err = PinLock::acquire(&dir, Duration::from_millis(30), || Ok(())).unwrap_err();
        assert!(matches!(&err, KernelError::PinDirBusy { pin_dir, .. } if *pin_dir == dir), "{err}");
        assert!(err.to_string().contains(&std::process::id().to_string()), "{err}");
        let waiter = {
            let dir = dir.clone();
            std::thread::spawn(move || PinLock::acquire(&dir, Duration::from_secs(10), || Ok(())).is_ok())
        };
        std::thread::sleep(Duration::from_millis(50));
        drop(first);
        assert!(waiter.join().unwrap(), "the waiter holds it once the first let go");
        std::fs::remove_dir(&dir).unwrap();
    }

    #[test]
    fn a_directory_removed_while_waiting_is_locked_again_where_it_is_now() {
        let dir = std::env::temp_dir().join(format!("limiter-pin-lock-moved-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let first = PinLock::acquire(&dir, Duration::ZERO, || Ok(())).unwrap();
        let waiter = {
            let dir = dir.clone();
            std::thread::spawn(move || {
                let remake =
                    || std::fs::create_dir_all(&dir).map_err(|e| KernelError::io("making".to_owned(), e));
                let held = PinLock::acquire(&dir, Duration::from_secs(10), remake).unwrap();
                same_inode(&held._dir, &dir)
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        // What an unload that emptied it does, lock held.
        std::fs::remove_dir(&dir).unwrap();
        drop(first);
        assert!(waiter.join().unwrap(), "the lock is on the directory at the path");
        std::fs::remove_dir(&dir).unwrap();
    }
}
