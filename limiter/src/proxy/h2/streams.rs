//! The open streams of one HTTP/2 connection, shared by the connection
//! (which closes when it has had none for `http.idleTimeoutMs`) and its
//! exchanges (each holds an [`Open`] until its response body is done).

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::sync::Notify;

use super::guard::Watchlist;

/// The open streams of one HTTP/2 connection, so that it can close when
/// it has had none for `http.idleTimeoutMs`.
#[derive(Debug, Default)]
pub struct Streams {
    open: AtomicU32,
    changed: Notify,
    /// Its streams' responses, watched for starvation ([`super::guard`]).
    pub watchlist: Watchlist,
    /// Frames the client sent (PINGs aside), as the flood meter counts
    /// them: a client granting window to a download is not idle.
    pub activity: Arc<AtomicU64>,
    /// The flood meter cut the connection for a flood of `RST_STREAM`.
    pub reset_flood: Arc<AtomicBool>,
}

/// One open stream; dropped with its response body (or when its handler
/// is cancelled).
pub struct Open(Arc<Streams>);

impl Drop for Open {
    fn drop(&mut self) {
        if self.0.open.fetch_sub(1, Ordering::Relaxed) == 1 {
            self.0.changed.notify_waiters();
        }
    }
}

impl Streams {
    pub(super) fn open(self: &Arc<Self>) -> Open {
        if self.open.fetch_add(1, Ordering::Relaxed) == 0 {
            self.changed.notify_waiters();
        }
        Open(self.clone())
    }

    /// Resolves once no stream has been open, and the client has sent
    /// nothing but PINGs, for `idle`.
    pub async fn idle_for(&self, idle: Duration) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.open.load(Ordering::Relaxed) == 0 {
                let seen = self.activity.load(Ordering::Relaxed);
                tokio::select! {
                    () = tokio::time::sleep(idle) => {
                        if self.open.load(Ordering::Relaxed) == 0 && self.activity.load(Ordering::Relaxed) == seen {
                            return;
                        }
                    }
                    () = &mut changed => {}
                }
            } else {
                changed.await;
            }
        }
    }
}
