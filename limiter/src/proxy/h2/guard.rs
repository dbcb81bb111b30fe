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
//! upstream response dropped at once, and its connection gets GOAWAY and is closed once its other streams are done (after
//! `http.idleTimeoutMs` at most), which frees the chunk hyper still holds
//! and its bytes of `http.bufferMemoryBytes`.
//!
//! Under pressure ([`super::pressure`]: a pool refused a request within
//! the last second) a stream that holds a permit is cut sooner: once its
//! chunk has waited [`PATIENCE`] untaken (HTTP/1 applies the same patience
//! to each of its writes, in `h1::response`).
//!
//! A cut drops the upstream's body, and says so first (the flag given to
//! [`guard`]): one still streaming has its upstream connection closed,
//! which ends a writing upstream's work at its next write, and the permit
//! goes back then (see [`super::upstream`]).

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

use crate::proxy::{
    Counters, Tuning,
    pressure::{PATIENCE, Pressure},
    rate::GRACE,
};

/// The error of a boxed body.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The most a stream hands hyper at once: the unit of progress.
pub const CHUNK: usize = 16 * 1024;

/// The stream was starved and cut.
#[derive(Debug, thiserror::Error)]
#[error("the client took its response slower than http.minDataRate, or than a chunk a second under pressure")]
pub struct Starved;

/// The upstream's body (holding its permit while it streams), until the
/// end or the cut.
type Upstream = Option<UnsyncBoxBody<Bytes, BoxError>>;

struct Shared {
    held: Mutex<Upstream>,
    /// Bytes of the chunk hyper took last, not yet delivered (0: none).
    pending: AtomicU64,
    /// When hyper took it, in milliseconds since `start`.
    pending_since_ms: AtomicU64,
    start: Instant,
    done: AtomicBool,
    /// The body streams from the upstream, holding its permit (not read
    /// ahead whole).
    streaming: bool,
    /// Set before a cut drops the body.
    cut: Arc<AtomicBool>,
}

impl Shared {
    fn held(&self) -> std::sync::MutexGuard<'_, Upstream> {
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
        self.streaming && self.held().is_some()
    }

    /// Drops the upstream's body: the next time hyper asks, the body fails.
    fn cut(&self) {
        self.done.store(true, Ordering::Relaxed);
        self.cut.store(true, Ordering::Relaxed);
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

/// Streams `body` (`streaming`: from the upstream, holding its permit),
/// watched by its HTTP/2 connection's `list`; a cut sets `cut` first.
pub fn guard(
    body: UnsyncBoxBody<Bytes, BoxError>,
    streaming: bool,
    list: &Watchlist,
    cut: Arc<AtomicBool>,
) -> Guarded {
    let hint = body.size_hint();
    let shared = Arc::new(Shared {
        held: Mutex::new(Some(body)),
        pending: AtomicU64::new(0),
        pending_since_ms: AtomicU64::new(0),
        start: Instant::now(),
        done: AtomicBool::new(false),
        streaming,
        cut,
    });
    let guarded = Guarded { shared, hint, rest: None, ended: false };
    let mut streams = list.streams.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    streams.push(Arc::downgrade(&guarded.shared));
    if streams.len() == 1 {
        list.added.notify_one();
    }
    drop(streams);
    guarded
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
                let Some(body) = held.as_mut() else {
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

    /// An upstream body that never ends: a chunk whenever asked (holding a
    /// permit, as one streamed from the upstream does).
    struct Endless(#[expect(dead_code, reason = "held, not read")] Option<crate::admission::Permit>);

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
            tunnels: 0,
            tunnels_per_client: 0,
        });
        let permit = admission.admit(Ask::default()).unwrap();
        let (list, idle) = (Watchlist::default(), Duration::from_secs(60));
        let mut body = guard(Endless(Some(permit)).boxed_unsync(), true, &list, Arc::default());
        assert!(matches!(poll(&mut body), Poll::Ready(Some(Ok(_)))), "hyper takes a chunk");
        let taken = Instant::now();
        let second = taken + PATIENCE + Duration::from_millis(50);
        assert_eq!(list.look(second, false, 1024, idle).0, 0, "no pressure: the minimum rate alone");
        assert_eq!(list.look(taken, true, 1024, idle).0, 0, "under pressure, not at once");
        assert_eq!(admission.snapshot().normal_in_use, 1);
        let (cut, next) = list.look(second, true, 1024, idle);
        assert_eq!(cut, 1, "under pressure, a second later");
        assert!(next.is_some_and(|n| n > second));
        assert_eq!(admission.snapshot().normal_in_use, 0, "the body is dropped (here, its permit with it)");
        assert!(matches!(poll(&mut body), Poll::Ready(Some(Err(_)))), "hyper is told");
        assert_eq!(list.look(second, true, 1024, idle), (0, None), "and the stream is no longer watched");
    }

    #[test]
    fn a_stream_read_whole_is_not_cut_under_pressure() {
        let (list, idle) = (Watchlist::default(), Duration::from_secs(60));
        let mut body = guard(Endless(None).boxed_unsync(), false, &list, Arc::default());
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
