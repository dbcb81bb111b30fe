//! A response guarded against a client that stops taking it. On HTTP/1 a
//! client that does not read stops the socket, and [`super::io::ClientIo`]
//! cuts it; on HTTP/2 one stream can be starved while the connection
//! flows (its window held at 0): hyper then holds the chunk it took last
//! and simply stops asking the body for more, so nothing on the request
//! path would ever notice.
//!
//! So each HTTP/2 connection's task watches its streams' progress from
//! outside ([`Watchlist::starved`], polled beside the connection). The body
//! hands hyper chunks of at most [`CHUNK`] bytes, and a chunk counts as
//! delivered once hyper asks for the next one (it has sent the previous
//! one) or drops the body (the stream is done). A chunk not delivered
//! within the grace plus its size at `http.minDataRate` (with the rate
//! off, within `http.idleTimeoutMs`) means the client does not take the
//! stream: it is cut. (Waiting on the upstream is not the client's fault:
//! the upstream body's own stall timeout covers that.) A cut stream has its
//! upstream response and its permit dropped at once, so the upstream's
//! thread is free, and its connection gets GOAWAY and is closed once its other streams are done (after
//! `http.idleTimeoutMs` at most), which frees the chunk hyper still holds
//! and its bytes of `http.bufferMemoryBytes`.
//!
//! Under pressure ([`super::pressure`]: a pool refused a request within
//! the last second) a stream that holds a permit is cut sooner: once its
//! chunk has waited [`PATIENCE`] untaken. The same rule guards an HTTP/1
//! response streamed holding its permit ([`guard_h1`], one small watchdog
//! task per such response): hyper takes its next chunk once the previous
//! one is in the socket, so a chunk untaken for that long means the
//! client's socket is full and the client reads less than a chunk a
//! second; its permit returns at once, and the connection ends when hyper
//! next asks the body (or `ClientIo` cuts it).

use std::{
    pin::Pin,
    sync::{
        Arc, Mutex, Weak,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::{Body, Frame, SizeHint};
use tokio::{
    sync::Notify,
    time::{Instant, sleep_until},
};

use super::{
    Counters, Tuning,
    body::BoxError,
    pressure::{PATIENCE, Pressure},
    shield::GRACE,
};
use crate::admission::Permit;

/// The most a stream hands hyper at once: the unit of progress.
pub const CHUNK: usize = 16 * 1024;

/// The stream was starved and cut.
#[derive(Debug, thiserror::Error)]
#[error("the client took its response slower than http.minDataRate, or than a chunk a second under pressure")]
pub struct Starved;

/// The upstream's body and the permit (none once a response was read
/// whole), held until the end or the cut.
type Held = Option<(UnsyncBoxBody<Bytes, BoxError>, Option<Permit>)>;

struct Shared {
    held: Mutex<Held>,
    /// Bytes of the chunk hyper took last, not yet delivered (0: none).
    pending: AtomicU64,
    /// When hyper took it, in milliseconds since `start`.
    pending_since_ms: AtomicU64,
    start: Instant,
    done: AtomicBool,
    /// Told when the body is dropped (an HTTP/1 response's watchdog ends).
    dropped: Notify,
}

impl Shared {
    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The chunk waiting to be taken, and since when.
    fn pending(&self) -> Option<(u64, Instant)> {
        let pending = self.pending.load(Ordering::Relaxed);
        let since = self.start + Duration::from_millis(self.pending_since_ms.load(Ordering::Relaxed));
        (pending > 0).then_some((pending, since))
    }

    /// Whether the stream still holds its permit (it streams, and the
    /// upstream has not delivered its last byte).
    fn holds_permit(&self) -> bool {
        matches!(&*self.held(), Some((_, Some(_))))
    }

    /// Drops the upstream's body and the permit: the next time hyper asks,
    /// the body fails.
    fn cut(&self) {
        self.done.store(true, Ordering::Relaxed);
        drop(self.held().take());
    }
}

/// The body hyper streams; the watchdog holds the other reference.
pub struct Guarded {
    shared: Arc<Shared>,
    hint: SizeHint,
    /// What is left of a frame larger than [`CHUNK`].
    rest: Option<Bytes>,
    /// The upstream's body has ended (`rest` may still hold its last bytes).
    ended: bool,
}

fn guarded(body: UnsyncBoxBody<Bytes, BoxError>, permit: Option<Permit>) -> Guarded {
    let hint = body.size_hint();
    let shared = Arc::new(Shared {
        held: Mutex::new(Some((body, permit))),
        pending: AtomicU64::new(0),
        pending_since_ms: AtomicU64::new(0),
        start: Instant::now(),
        done: AtomicBool::new(false),
        dropped: Notify::new(),
    });
    Guarded { shared, hint, rest: None, ended: false }
}

/// Streams `body` (holding `permit`, if it still has one), watched by its
/// HTTP/2 connection's `list`.
pub fn guard(body: UnsyncBoxBody<Bytes, BoxError>, permit: Option<Permit>, list: &Watchlist) -> Guarded {
    let guarded = guarded(body, permit);
    let mut streams = list.streams.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    streams.push(Arc::downgrade(&guarded.shared));
    if streams.len() == 1 {
        list.added.notify_one();
    }
    drop(streams);
    guarded
}

/// Streams an HTTP/1 response `body` holding `permit`, cut under pressure
/// if its client leaves a chunk untaken for [`PATIENCE`] (the minimum
/// rate is [`super::io::ClientIo`]'s on HTTP/1). Spawns its watchdog on
/// the calling runtime.
pub fn guard_h1(
    body: UnsyncBoxBody<Bytes, BoxError>,
    permit: Permit,
    pressure: Arc<Pressure>,
    counters: Arc<Counters>,
) -> Guarded {
    let guarded = guarded(body, Some(permit));
    tokio::spawn(watch_h1(Arc::downgrade(&guarded.shared), pressure, counters));
    guarded
}

/// The watchdog of one HTTP/1 response: ends with the body, or once it
/// cut it.
async fn watch_h1(weak: Weak<Shared>, pressure: Arc<Pressure>, counters: Arc<Counters>) {
    loop {
        let began = pressure.began();
        tokio::pin!(began);
        began.as_mut().enable();
        let Some(shared) = weak.upgrade() else { return };
        let dropped = shared.dropped.notified();
        tokio::pin!(dropped);
        dropped.as_mut().enable();
        if shared.done.load(Ordering::Relaxed) || !shared.holds_permit() {
            // Done, or read to its end: nothing is left to guard.
            return;
        }
        let now = Instant::now();
        let waiting = shared.pending();
        if pressure.on(now) {
            if let Some((_, since)) = waiting
                && since + PATIENCE <= now
            {
                shared.cut();
                counters.slow_readers.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(
                    "HTTP/1 response left untaken under pressure: its upstream response and permit dropped"
                );
                return;
            }
            // Nothing waits on the client yet: look again within the patience.
            let next = waiting.map_or(now + PATIENCE, |(_, since)| since + PATIENCE);
            tokio::select! {
                () = sleep_until(next) => {}
                () = dropped => return,
            }
        } else {
            tokio::select! {
                () = began => {}
                () = dropped => return,
            }
        }
    }
}

/// How long a chunk of `bytes` may take to go out.
fn allowed(bytes: u64, min_rate: u64, idle: Duration) -> Duration {
    if min_rate == 0 { idle } else { GRACE + Duration::from_secs_f64(bytes as f64 / min_rate as f64) }
}

/// When a chunk of `bytes` waiting `since` is due: within [`allowed`],
/// and under pressure, for a stream holding a permit, within [`PATIENCE`].
fn due(since: Instant, bytes: u64, pressed: bool, min_rate: u64, idle: Duration) -> Instant {
    let due = since + allowed(bytes, min_rate, idle);
    if pressed { due.min(since + PATIENCE) } else { due }
}

/// The guarded streams of one HTTP/2 connection.
#[derive(Default)]
pub struct Watchlist {
    streams: Mutex<Vec<Weak<Shared>>>,
    added: Notify,
}

impl std::fmt::Debug for Watchlist {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watchlist").finish_non_exhaustive()
    }
}

impl Watchlist {
    /// Resolves once a stream of this connection was starved (and cut).
    /// While there are streams it looks at them by their deadlines, at
    /// least every 3 s (or `http.idleTimeoutMs`, if shorter), every
    /// [`PATIENCE`] under pressure, and at once when pressure begins.
    pub async fn starved(&self, tuning: &Tuning, counters: &Counters, pressure: &Pressure) {
        let (min_rate, idle) = (tuning.min_data_rate, tuning.idle_timeout);
        loop {
            let added = self.added.notified();
            tokio::pin!(added);
            added.as_mut().enable();
            let began = pressure.began();
            tokio::pin!(began);
            began.as_mut().enable();
            let now = Instant::now();
            let pressed = pressure.on(now);
            let (cut, next) = self.look(now, pressed, min_rate, idle);
            if cut > 0 {
                counters.slow_readers.fetch_add(cut, Ordering::Relaxed);
                tracing::debug!(
                    cut,
                    pressed,
                    "HTTP/2 streams starved: their upstream responses and permits dropped"
                );
                return;
            }
            match next {
                Some(next) => tokio::select! {
                    () = sleep_until(next) => {}
                    () = began => {}
                },
                None => added.await,
            }
        }
    }

    /// Cuts the streams past their deadlines: how many, and when to look
    /// next (`None`: no stream to watch).
    fn look(&self, now: Instant, pressed: bool, min_rate: u64, idle: Duration) -> (u64, Option<Instant>) {
        let mut streams = self.streams.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        streams.retain(|w| w.upgrade().is_some_and(|s| !s.done.load(Ordering::Relaxed)));
        if streams.is_empty() {
            return (0, None);
        }
        let mut next = now + if pressed { PATIENCE } else { GRACE.min(idle) };
        let mut cut = 0u64;
        for shared in streams.iter().filter_map(Weak::upgrade) {
            let Some((pending, since)) = shared.pending() else { continue };
            let due = due(since, pending, pressed && shared.holds_permit(), min_rate, idle);
            if due <= now {
                shared.cut();
                cut += 1;
            } else {
                next = next.min(due);
            }
        }
        (cut, Some(next))
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        self.shared.done.store(true, Ordering::Relaxed);
        self.shared.held().take();
        self.shared.dropped.notify_one();
    }
}

impl Body for Guarded {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        // Asked again: the chunk taken before has gone out.
        self.shared.pending.store(0, Ordering::Relaxed);
        let this = &mut *self;
        let frame = match this.rest.take() {
            Some(rest) => Frame::data(rest),
            None => {
                let mut held = this.shared.held();
                let Some((body, _permit)) = held.as_mut() else {
                    if this.ended {
                        return Poll::Ready(None);
                    }
                    return Poll::Ready(Some(Err(Box::new(Starved))));
                };
                match Pin::new(&mut *body).poll_frame(cx) {
                    Poll::Ready(Some(Ok(frame))) => {
                        if body.is_end_stream() {
                            // The permit goes back with the upstream's last byte.
                            this.ended = true;
                            *held = None;
                        }
                        frame
                    }
                    Poll::Ready(end) => {
                        // The end (or the upstream's failure).
                        this.ended = end.is_none();
                        *held = None;
                        return Poll::Ready(end);
                    }
                    Poll::Pending => return Poll::Pending,
                }
            }
        };
        let frame = match frame.into_data() {
            Ok(mut data) => {
                if data.len() > CHUNK {
                    this.rest = Some(data.split_off(CHUNK));
                }
                let since = this.shared.start.elapsed().as_millis() as u64;
                this.shared.pending_since_ms.store(since, Ordering::Relaxed);
                this.shared.pending.store(data.len() as u64, Ordering::Relaxed);
                Frame::data(data)
            }
            Err(other) => other,
        };
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        // The last chunk says so, so that hyper ends the stream with it.
        self.ended && self.rest.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        self.hint
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt as _;

    use super::*;
    use crate::admission::{Admission, Ask, Limits};

    /// An upstream body that never ends: a chunk whenever asked.
    struct Endless;

    impl Body for Endless {
        type Data = Bytes;
        type Error = BoxError;

        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
            Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(&[b'x'; CHUNK])))))
        }
    }

    fn poll(body: &mut Guarded) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Pin::new(body).poll_frame(&mut Context::from_waker(std::task::Waker::noop()))
    }

    #[test]
    fn under_pressure_a_chunk_left_a_second_costs_the_stream_its_permit() {
        let admission = Admission::new(Limits {
            normal: 1,
            debug_reserved: 0,
            per_session: 0,
            web: 0,
            dry_run: false,
            adaptive_min: None,
            critical_reserve: false,
        });
        let permit = admission.admit(Ask::default()).unwrap();
        let (list, idle) = (Watchlist::default(), Duration::from_secs(60));
        let mut body = guard(Endless.boxed_unsync(), Some(permit), &list);
        assert!(matches!(poll(&mut body), Poll::Ready(Some(Ok(_)))), "hyper takes a chunk");
        let taken = Instant::now();
        let second = taken + PATIENCE + Duration::from_millis(50);
        assert_eq!(list.look(second, false, 1024, idle).0, 0, "no pressure: the minimum rate alone");
        assert_eq!(list.look(taken, true, 1024, idle).0, 0, "under pressure, not at once");
        assert_eq!(admission.snapshot().normal_in_use, 1);
        let (cut, next) = list.look(second, true, 1024, idle);
        assert_eq!(cut, 1, "under pressure, a second later");
        assert!(next.is_some_and(|n| n > second));
        assert_eq!(admission.snapshot().normal_in_use, 0, "the permit is back");
        assert!(matches!(poll(&mut body), Poll::Ready(Some(Err(_)))), "hyper is told");
        assert_eq!(list.look(second, true, 1024, idle), (0, None), "and the stream is no longer watched");
    }

    #[test]
    fn a_stream_read_whole_is_not_cut_under_pressure() {
        let (list, idle) = (Watchlist::default(), Duration::from_secs(60));
        let mut body = guard(Endless.boxed_unsync(), None, &list);
        assert!(matches!(poll(&mut body), Poll::Ready(Some(Ok(_)))));
        let later = Instant::now() + PATIENCE + Duration::from_millis(50);
        assert_eq!(list.look(later, true, 1024, idle).0, 0, "it holds no permit: only the minimum rate");
        let starved = Instant::now() + GRACE + Duration::from_secs(17);
        assert_eq!(list.look(starved, false, 1024, idle).0, 1, "which still applies");
    }

    #[test]
    fn a_chunk_may_take_the_grace_plus_its_size_at_the_minimum_rate() {
        let idle = Duration::from_secs(60);
        assert_eq!(allowed(16 * 1024, 1024, idle), GRACE + Duration::from_secs(16));
        assert_eq!(allowed(1, 0, idle), idle, "the rate off: the idle timeout");
    }

    #[test]
    fn under_pressure_a_chunk_holding_a_permit_may_wait_a_second() {
        let (since, idle) = (Instant::now(), Duration::from_secs(60));
        let chunk = CHUNK as u64;
        assert_eq!(due(since, chunk, false, 1024, idle), since + GRACE + Duration::from_secs(16));
        assert_eq!(due(since, chunk, true, 1024, idle), since + PATIENCE);
        assert_eq!(due(since, chunk, true, 0, idle), since + PATIENCE, "the rate off too");
        let tiny = Duration::from_millis(500);
        assert_eq!(due(since, chunk, true, 0, tiny), since + tiny, "the sooner of the two");
    }
}
