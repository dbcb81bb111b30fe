//! An HTTP/2 response guarded against a client that stops taking it. On
//! HTTP/1 a client that does not read stops the socket, and
//! [`super::io::ClientIo`] cuts it; on HTTP/2 one stream can be starved
//! while the connection flows (its window held at 0): hyper then holds the
//! chunk it took last and simply stops asking the body for more, so
//! nothing on the request path would ever notice.
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
    time::{Instant, sleep},
};

use super::{Counters, Tuning, body::BoxError, shield::GRACE};
use crate::admission::Permit;

/// The most a stream hands hyper at once: the unit of progress.
pub const CHUNK: usize = 16 * 1024;

/// The stream was starved and cut.
#[derive(Debug, thiserror::Error)]
#[error("the HTTP/2 stream took its response slower than http.minDataRate")]
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
}

impl Shared {
    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
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

/// Streams `body` (holding `permit`, if it still has one), watched by its
/// connection's `list`.
pub fn guard(body: UnsyncBoxBody<Bytes, BoxError>, permit: Option<Permit>, list: &Watchlist) -> Guarded {
    let hint = body.size_hint();
    let shared = Arc::new(Shared {
        held: Mutex::new(Some((body, permit))),
        pending: AtomicU64::new(0),
        pending_since_ms: AtomicU64::new(0),
        start: Instant::now(),
        done: AtomicBool::new(false),
    });
    let mut streams = list.streams.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    streams.push(Arc::downgrade(&shared));
    if streams.len() == 1 {
        list.added.notify_one();
    }
    drop(streams);
    Guarded { shared, hint, rest: None, ended: false }
}

/// How long a chunk of `bytes` may take to go out.
fn allowed(bytes: u64, min_rate: u64, idle: Duration) -> Duration {
    if min_rate == 0 { idle } else { GRACE + Duration::from_secs_f64(bytes as f64 / min_rate as f64) }
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
    /// Resolves once a stream of this connection was starved (and cut):
    /// looks at the streams every 3 s (or `http.idleTimeoutMs`, if
    /// shorter) while there are any.
    pub async fn starved(&self, tuning: &Tuning, counters: &Counters) {
        let (min_rate, idle) = (tuning.min_data_rate, tuning.idle_timeout);
        loop {
            let added = self.added.notified();
            tokio::pin!(added);
            added.as_mut().enable();
            let watching = {
                let mut streams = self.streams.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                streams.retain(|w| w.upgrade().is_some_and(|s| !s.done.load(Ordering::Relaxed)));
                let now = Instant::now();
                let mut cut = 0u64;
                for shared in streams.iter().filter_map(Weak::upgrade) {
                    let pending = shared.pending.load(Ordering::Relaxed);
                    let since =
                        shared.start + Duration::from_millis(shared.pending_since_ms.load(Ordering::Relaxed));
                    if pending > 0 && since + allowed(pending, min_rate, idle) <= now {
                        shared.done.store(true, Ordering::Relaxed);
                        drop(shared.held().take());
                        cut += 1;
                    }
                }
                if cut > 0 {
                    counters.slow_readers.fetch_add(cut, Ordering::Relaxed);
                    tracing::debug!(
                        cut,
                        "HTTP/2 streams starved: their upstream responses and permits dropped"
                    );
                    return;
                }
                !streams.is_empty()
            };
            if watching {
                sleep(GRACE.min(idle)).await;
            } else {
                added.await;
            }
        }
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
    use super::*;

    #[test]
    fn a_chunk_may_take_the_grace_plus_its_size_at_the_minimum_rate() {
        let idle = Duration::from_secs(60);
        assert_eq!(allowed(16 * 1024, 1024, idle), GRACE + Duration::from_secs(16));
        assert_eq!(allowed(1, 0, idle), idle, "the rate off: the idle timeout");
    }
}
