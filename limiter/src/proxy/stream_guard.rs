//! An HTTP/2 response streamed while holding its permit, guarded against a
//! client that stops taking it. On HTTP/1 a client that does not read
//! stops the socket, and [`super::io::ClientIo`] cuts it; on HTTP/2 one
//! stream can be starved while the connection flows (its window held at
//! 0), and hyper then simply stops asking the body for data: nothing on
//! the request path would ever notice. So a watchdog task checks the
//! stream's progress from outside: a stream that brings less than
//! `http.minDataRate` over a stretch after the grace (or, with the rate
//! off, nothing for `http.idleTimeoutMs`) has its upstream response and
//! its permit dropped at once; the stream then ends with an error, and
//! the upstream's thread is free.

use std::{
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::{Body, Frame, SizeHint};
use tokio::time::{Instant, sleep_until};

use super::{Counters, body::BoxError, shield::rate_due};
use crate::admission::Permit;

/// The stream was starved and cut.
#[derive(Debug, thiserror::Error)]
#[error("the HTTP/2 stream took its response slower than http.minDataRate")]
pub struct Starved;

struct Shared {
    /// The upstream's body and the permit, until the end or the cut.
    held: Mutex<Option<(UnsyncBoxBody<Bytes, BoxError>, Permit)>>,
    /// Bytes handed to hyper so far.
    sent: AtomicU64,
    done: AtomicBool,
}

/// The body hyper streams; the watchdog holds the other reference.
pub struct Guarded {
    shared: Arc<Shared>,
    hint: SizeHint,
}

/// Streams `body` holding `permit`, with a watchdog on the calling runtime.
pub fn guard(
    body: UnsyncBoxBody<Bytes, BoxError>,
    permit: Permit,
    min_rate: u64,
    idle: Duration,
    counters: Arc<Counters>,
) -> Guarded {
    let hint = body.size_hint();
    let shared = Arc::new(Shared {
        held: Mutex::new(Some((body, permit))),
        sent: AtomicU64::new(0),
        done: AtomicBool::new(false),
    });
    tokio::spawn(watch(shared.clone(), min_rate, idle, counters));
    Guarded { shared, hint }
}

async fn watch(shared: Arc<Shared>, min_rate: u64, idle: Duration, counters: Arc<Counters>) {
    let (mut since, mut measured) = (Instant::now(), 0u64);
    let (mut last_sent, mut last_progress) = (0u64, Instant::now());
    loop {
        let sent = shared.sent.load(Ordering::Relaxed);
        let now = Instant::now();
        if sent != last_sent {
            measured += sent - last_sent;
            (last_sent, last_progress) = (sent, now);
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
        if shared.done.load(Ordering::Relaxed) {
            return;
        }
    }
    let cut = shared.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
    if cut.is_some() {
        counters.slow_readers.fetch_add(1, Ordering::Relaxed);
        tracing::debug!("HTTP/2 stream starved: its upstream response and permit are dropped");
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        self.shared.done.store(true, Ordering::Relaxed);
        self.shared.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
    }
}

impl Body for Guarded {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut held = self.shared.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some((body, _permit)) = held.as_mut() else {
            if self.shared.done.load(Ordering::Relaxed) {
                return Poll::Ready(None);
            }
            return Poll::Ready(Some(Err(Box::new(Starved))));
        };
        let poll = Pin::new(body).poll_frame(cx);
        match &poll {
            Poll::Ready(Some(Ok(frame))) => {
                let n = frame.data_ref().map_or(0, |d| d.len() as u64);
                self.shared.sent.fetch_add(n, Ordering::Relaxed);
            }
            Poll::Ready(None | Some(Err(_))) => {
                // The end (or the upstream's failure): the permit goes back.
                self.shared.done.store(true, Ordering::Relaxed);
                *held = None;
            }
            Poll::Pending => {}
        }
        poll
    }

    fn is_end_stream(&self) -> bool {
        false
    }

    fn size_hint(&self) -> SizeHint {
        self.hint
    }
}
