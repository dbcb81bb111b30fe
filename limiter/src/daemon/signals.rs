//! The daemon's signals: SIGHUP reloads, SIGTERM and SIGINT drain and
//! stop, SIGUSR1 reopens the access log's file.
//!
//! `limiter run` blocks them first ([`block`]), so a signal during
//! start-up waits for the handlers instead of killing the daemon; then
//! [`install`] takes them over and unblocks them.

use std::future::Future;

use nix::sys::signal::{SigSet, Signal};
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::mpsc,
};

fn set() -> SigSet {
    let mut set = SigSet::empty();
    for s in [Signal::SIGHUP, Signal::SIGTERM, Signal::SIGINT, Signal::SIGUSR1] {
        set.add(s);
    }
    set
}

/// Holds SIGHUP, SIGTERM, SIGINT and SIGUSR1 pending on this thread (and the threads
/// it starts) until [`install`].
pub fn block() {
    // Before logging is set up: said on stderr.
    if let Err(e) = set().thread_block() {
        eprintln!(
            "limiter: holding signals until their handlers are installed failed ({e}): one that comes first ends the daemon"
        );
    }
}

/// Installs the handlers (inside a tokio runtime) and unblocks the signals.
/// Returns a channel that yields one `()` per SIGHUP, and a future that
/// resolves at the first SIGTERM or SIGINT: the two inputs of
/// [`super::run`].
pub fn install() -> std::io::Result<(mpsc::UnboundedReceiver<()>, impl Future<Output = ()> + Send)> {
    let mut hup = signal(SignalKind::hangup())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut usr1 = signal(SignalKind::user_defined1())?;
    set().thread_unblock().map_err(std::io::Error::from)?;
    tokio::spawn(async move {
        while usr1.recv().await.is_some() {
            tracing::info!("SIGUSR1: reopening the access log");
            crate::access_log::reopen_all();
        }
    });
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            if tx.send(()).is_err() {
                return;
            }
        }
    });
    let stop = async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: stopping"),
            _ = int.recv() => tracing::info!("SIGINT: stopping"),
        }
    };
    Ok((rx, stop))
}
