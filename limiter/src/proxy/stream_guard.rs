//! An HTTP/2 response guarded against a client that stops taking it. On
//! HTTP/1 a client that does not read stops the socket, and
//! [`super::io::ClientIo`] cuts it; on HTTP/2 one stream can be starved
//! while the connection flows (its window held at 0): hyper then holds the
//! chunk it took last and simply stops asking the body for more, so
//! nothing on the request path would ever notice.
//!
//! So a watchdog task checks each stream's progress from outside. A chunk
//! counts as delivered only once hyper asks for the next one (it has sent
//! the previous one) or drops the body (the stream is done). A stream that
//! delivers less than `http.minDataRate` over a stretch after the grace
//! (or, with the rate off, nothing for `http.idleTimeoutMs`) is cut: its
//! upstream response and its permit are dropped at once, so the upstream's
//! thread is free, and its connection is told ([`Streams::starved`]): it
//! gets GOAWAY and is closed once its other streams are done (after
//! `http.idleTimeoutMs` at most), which frees the chunk hyper still holds
//! and its bytes of `http.bufferMemoryBytes`.

use std::{
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    task::{Context, Poll},
};

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::{Body, Frame, SizeHint};
use tokio::time::{Instant, sleep_until};

use super::{Counters, Tuning, body::BoxError, exchange::Streams, shield::rate_due};
use crate::admission::Permit;

/// The stream was starved and cut.
#[derive(Debug, thiserror::Error)]
#[error("the HTTP/2 stream took its response slower than http.minDataRate")]
pub struct Starved;

/// The upstream's body and the permit (none once a response was read
/// whole), held until the end or the cut.
type Held = Option<(UnsyncBoxBody<Bytes, BoxError>, Option<Permit>)>;

struct Shared {
    held: Mutex<Held>,
    /// Bytes delivered (hyper asked for more after them).
    delivered: AtomicU64,
    /// Bytes of the chunk hyper took last, not yet delivered.
    pending: AtomicU64,
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
}

/// Streams `body` (holding `permit`, if it still has one), with a watchdog
/// on the calling runtime that tells `conn` if it cuts the stream.
pub fn guard(
    body: UnsyncBoxBody<Bytes, BoxError>,
    permit: Option<Permit>,
    tuning: &Tuning,
    counters: Arc<Counters>,
    conn: Arc<Streams>,
) -> Guarded {
    let hint = body.size_hint();
    let shared = Arc::new(Shared {
        held: Mutex::new(Some((body, permit))),
        delivered: AtomicU64::new(0),
        pending: AtomicU64::new(0),
        done: AtomicBool::new(false),
    });
    let rules = (tuning.min_data_rate, tuning.idle_timeout);
    tokio::spawn(watch(shared.clone(), rules, counters, conn));
    Guarded { shared, hint }
}

async fn watch(
    shared: Arc<Shared>,
    (min_rate, idle): (u64, std::time::Duration),
    counters: Arc<Counters>,
    conn: Arc<Streams>,
) {
    let (mut since, mut measured) = (Instant::now(), 0u64);
    let (mut last, mut last_progress) = (0u64, Instant::now());
    loop {
        if shared.done.load(Ordering::Relaxed) {
            return;
        }
        let delivered = shared.delivered.load(Ordering::Relaxed);
        let now = Instant::now();
        if delivered != last {
            measured += delivered - last;
            (last, last_progress) = (delivered, now);
        }
        let stalled_at = last_progress + idle;
        let due = if min_rate == 0 {
            stalled_at
        } else {
            rate_due(&mut since, &mut measured, min_rate).min(stalled_at)
        };
        if due <= now {
            break;
        }
        sleep_until(due).await;
    }
    drop(shared.held().take());
    counters.slow_readers.fetch_add(1, Ordering::Relaxed);
    conn.starved.notify_one();
    tracing::debug!("HTTP/2 stream starved: its upstream response and permit dropped, its connection closes");
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
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let shared = &self.shared;
        // Asked again: the chunk taken before has gone out.
        let pending = shared.pending.swap(0, Ordering::Relaxed);
        shared.delivered.fetch_add(pending, Ordering::Relaxed);
        let mut held = shared.held();
        let Some((body, _permit)) = held.as_mut() else {
            return Poll::Ready(Some(Err(Box::new(Starved))));
        };
        let poll = Pin::new(body).poll_frame(cx);
        match &poll {
            Poll::Ready(Some(Ok(frame))) => {
                let n = frame.data_ref().map_or(0, |d| d.len() as u64);
                shared.pending.store(n, Ordering::Relaxed);
            }
            Poll::Ready(None | Some(Err(_))) => {
                // The end (or the upstream's failure): the permit goes back.
                shared.done.store(true, Ordering::Relaxed);
                *held = None;
            }
            Poll::Pending => {}
        }
        poll
    }

    fn is_end_stream(&self) -> bool {
        // The last chunk says so, so that hyper ends the stream with it.
        self.shared.held().as_ref().is_some_and(|(body, _)| body.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.hint
    }
}
