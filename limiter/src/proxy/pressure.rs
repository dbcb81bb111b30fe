//! Pressure on the pools: the normal pool (or, for a `/debug/` request,
//! the reserved slots and the normal pool) refused a request within the
//! last [`WINDOW`]. While it does, a permit that a client holds by not
//! reading its response is one another client was refused, so slow
//! readers lose theirs sooner ([`super::h2::guard`], and `h1::response` on HTTP/1): a response
//! streamed holding its permit whose client leaves a chunk untaken for
//! [`PATIENCE`] is cut.
//!
//! The refusal path pays a clock read and an atomic load, plus an atomic
//! maximum when the millisecond changed; the watchdogs are woken only when a
//! spell of pressure begins (no refusal in the [`WINDOW`] before), and
//! while it lasts they look again at their own deadlines.

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use tokio::{
    sync::{Notify, futures::Notified},
    time::Instant,
};

/// How long a refusal keeps the pools under pressure: the window in which
/// admission, too, keeps the classes' reserves.
pub const WINDOW: Duration = crate::admission::PRESSURE;

/// Under pressure, how long a client may leave bytes untaken before it is
/// cut, if its response holds a permit: on HTTP/2 the chunk its stream was
/// handed (at most [`super::h2::guard::CHUNK`], 16 KiB), on HTTP/1 each
/// write to its connection, whatever its size.
pub const PATIENCE: Duration = Duration::from_secs(1);

/// When the pools last refused a request, shared by every worker.
#[derive(Debug)]
pub struct Pressure {
    base: Instant,
    /// Milliseconds after `base` of the last refusal, plus one (0: none yet).
    last: AtomicU64,
    began: Notify,
}

impl Default for Pressure {
    fn default() -> Self {
        Self { base: Instant::now(), last: AtomicU64::new(0), began: Notify::new() }
    }
}

impl Pressure {
    fn stamp(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.base).as_millis() as u64 + 1
    }

    /// A pool refused a request now; the watchdogs are woken when that
    /// begins a spell of pressure.
    pub fn refused(&self) {
        self.refused_at(Instant::now());
    }

    fn refused_at(&self, at: Instant) {
        let now = self.stamp(at);
        if self.last.load(Ordering::Relaxed) >= now {
            // This millisecond is stamped already (or a later one, by
            // another worker).
            return;
        }
        let last = self.last.fetch_max(now, Ordering::Relaxed);
        if last == 0 || now.saturating_sub(last) > WINDOW.as_millis() as u64 {
            self.began.notify_waiters();
        }
    }

    /// Whether a pool refused a request within the [`WINDOW`] before `now`.
    pub fn on(&self, now: Instant) -> bool {
        let last = self.last.load(Ordering::Relaxed);
        last != 0 && self.stamp(now).saturating_sub(last) <= WINDOW.as_millis() as u64
    }

    /// Resolves when a spell of pressure begins (enable it before looking
    /// at [`Self::on`], so that none is missed in between).
    pub fn began(&self) -> Notified<'_> {
        self.began.notified()
    }
}

#[cfg(test)]
mod tests {
    use std::{pin::Pin, task::Context};

    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_refusal_keeps_the_pools_under_pressure_for_the_window() {
        let p = Pressure::default();
        let t = p.base + 10 * MS;
        assert!(!p.on(t), "no refusal yet");
        p.refused_at(t);
        assert!(p.on(t));
        assert!(p.on(t + WINDOW), "a second after, still");
        assert!(!p.on(t + WINDOW + 2 * MS), "then no more");
    }

    /// Whether `f` is ready now.
    fn ready(f: Pin<&mut Notified<'_>>) -> bool {
        f.poll(&mut Context::from_waker(std::task::Waker::noop())).is_ready()
    }

    #[test]
    fn the_watchdogs_are_woken_when_a_spell_begins_not_at_every_refusal() {
        let p = Pressure::default();
        let t = p.base + 10 * MS;
        let began = p.began();
        tokio::pin!(began);
        began.as_mut().enable();
        p.refused_at(t);
        assert!(ready(began.as_mut()), "the first refusal begins a spell");
        let again = p.began();
        tokio::pin!(again);
        again.as_mut().enable();
        p.refused_at(t + 500 * MS);
        assert!(!ready(again.as_mut()), "within the window: the same spell");
        p.refused_at(t + 500 * MS + WINDOW + 10 * MS);
        assert!(ready(again.as_mut()), "after a quiet window: a new spell");
    }
}
