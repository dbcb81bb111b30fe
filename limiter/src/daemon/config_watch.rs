//! `admin.watchConfig = true`: the file is looked at every second (off,
//! nothing wakes for it) and a change reloads it, with the same all-or-nothing validation as SIGHUP.
//! A change is any difference in what the path resolves to (device,
//! inode, size, modification time), so an edit in place, a rename over
//! the file and Kubernetes' ConfigMap update (the `..data` symlink swapped
//! to a new directory) all count. A file that fails to validate is
//! reported once and applied nothing; the next change is tried again.

use std::{
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use tokio::sync::mpsc;

use super::Daemon;

/// How often the file is looked at.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// What the path resolves to now (`None`: it cannot be read).
fn stamp(path: &Path) -> Option<(u64, u64, u64, i64, i64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
}

/// Sends a `()` on `changes` whenever the file changed while watching is
/// on; ends when the daemon stops listening.
pub async fn run(path: PathBuf, daemon: Arc<Daemon>, changes: mpsc::UnboundedSender<()>) {
    let mut last = stamp(&path);
    let mut tick = tokio::time::interval(INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // Off, nothing is looked at until a reload (SIGHUP, POST /reload)
        // turns it on; the file as it is then is the one in force.
        while !daemon.watches_config() {
            let reloaded = daemon.reloaded.notified();
            tokio::pin!(reloaded);
            reloaded.as_mut().enable();
            if daemon.watches_config() {
                break;
            }
            reloaded.await;
            last = stamp(&path);
            tick.reset();
        }
        tick.tick().await;
        let now = stamp(&path);
        if now == last {
            continue;
        }
        last = now;
        if daemon.watches_config() {
            tracing::info!(file = %path.display(), "admin.watchConfig: the file changed; reloading");
            if changes.send(()).is_err() {
                return;
            }
        }
    }
}
