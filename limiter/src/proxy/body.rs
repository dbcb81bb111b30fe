//! Body wrappers: the response body every exchange sends (a response
//! streamed holding its permit carries it in [`super::stream_guard`]'s
//! body, given back when the upstream's body ends, when hyper drops it
//! because the client went away, or when the client is cut), and a stall
//! timeout for the upstream's and the client's bodies. Bodies are streamed frame by frame, never buffered whole.

use std::{
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, combinators::UnsyncBoxBody};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use tokio::time::{Instant, Sleep, sleep};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Times out a body that, while polled, produces no frame for `idle`. The
/// countdown starts when the body has to wait, not when the last frame
/// came: a body nobody polls for a while (its reader is busy writing the
/// previous frame) is not stalled. The timer is only allocated the first
/// time the body waits, so a small body that is ready at once costs none.
pub struct Stall<B> {
    inner: B,
    idle: Duration,
    timer: Option<Pin<Box<Sleep>>>,
    armed: bool,
    progress: Option<Arc<Progress>>,
}

impl<B: Body> Stall<B> {
    pub fn new(inner: B, idle: Duration) -> Self {
        Self { inner, idle, timer: None, armed: false, progress: None }
    }

    /// Also reports to `progress` when the body has been read to its end.
    pub fn with_progress(inner: B, idle: Duration, progress: Arc<Progress>) -> Self {
        if inner.is_end_stream() {
            progress.finish();
        }
        Self { inner, idle, timer: None, armed: false, progress: Some(progress) }
    }
}

/// When a request body finished streaming upstream, so that the upstream
/// timeout counts from the request fully sent, not from its first byte.
#[derive(Debug)]
pub struct Progress {
    base: Instant,
    /// Milliseconds after `base`; `u64::MAX` while still streaming.
    done_at_ms: AtomicU64,
}

impl Default for Progress {
    fn default() -> Self {
        Self { base: Instant::now(), done_at_ms: AtomicU64::new(u64::MAX) }
    }
}

impl Progress {
    /// The body has been read to its end (or was in memory all along).
    pub fn finish(&self) {
        let ms = self.base.elapsed().as_millis() as u64;
        let _ = self.done_at_ms.compare_exchange(u64::MAX, ms, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// When the request was fully sent, if it was.
    pub fn done_at(&self) -> Option<Instant> {
        match self.done_at_ms.load(Ordering::Relaxed) {
            u64::MAX => None,
            ms => Some(self.base + Duration::from_millis(ms)),
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("body stalled for longer than http.idleTimeoutMs")]
pub struct Stalled;

impl<B> Body for Stall<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                self.armed = false;
                if let Some(p) = &self.progress
                    && (frame.is_none() || self.inner.is_end_stream())
                {
                    p.finish();
                }
                Poll::Ready(frame.map(|r| r.map_err(Into::into)))
            }
            Poll::Pending => {
                let idle = self.idle;
                let this = &mut *self;
                let timer = this.timer.get_or_insert_with(|| Box::pin(sleep(idle)));
                if !this.armed {
                    timer.as_mut().reset(Instant::now() + idle);
                    this.armed = true;
                }
                if timer.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Some(Err(Box::new(Stalled))));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The client's request body, its data bytes counted when the access log
/// wants them (`bytes_in`).
pub struct ClientBody {
    inner: Incoming,
    counted: Option<Arc<AtomicU64>>,
}

impl ClientBody {
    pub fn new(inner: Incoming, counted: Option<Arc<AtomicU64>>) -> Self {
        Self { inner, counted }
    }
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let poll = Pin::new(&mut self.inner).poll_frame(cx);
        if let (Some(counted), Poll::Ready(Some(Ok(frame)))) = (&self.counted, &poll)
            && let Some(data) = frame.data_ref()
        {
            counted.fetch_add(data.len() as u64, Ordering::Relaxed);
        }
        poll
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Called once when a response body ends (all frames handed to hyper).
pub type OnEnd = Box<dyn FnOnce() + Send>;

/// Called once with the body bytes handed to hyper, when the response body
/// ends or is dropped (the client went away).
pub type OnDone = Box<dyn FnOnce(u64) + Send>;

/// What the exchange learns of a response it did not build: why the proxy
/// refused it, and how long the upstream took to answer.
#[derive(Clone, Copy, Debug, Default)]
pub struct Meta {
    pub refused: Option<&'static str>,
    pub upstream: Option<Duration>,
}

/// The body of every response the proxy sends.
pub struct ProxyBody {
    inner: UnsyncBoxBody<Bytes, BoxError>,
    on_end: Option<OnEnd>,
    pub meta: Meta,
    /// Bytes handed to hyper, counted while `on_done` waits for them.
    sent: u64,
    on_done: Option<OnDone>,
    /// Whatever must live as long as the body (an HTTP/2 stream's place
    /// in its connection's count of open streams).
    kept: Option<Box<dyn Send>>,
}

impl ProxyBody {
    /// A small body the proxy writes itself.
    pub fn full(text: impl Into<Bytes>) -> Self {
        Self::boxed(Full::new(text.into()).map_err(|never| match never {}).boxed_unsync())
    }

    pub fn empty() -> Self {
        Self::full(Bytes::new())
    }

    pub fn boxed(inner: UnsyncBoxBody<Bytes, BoxError>) -> Self {
        Self { inner, on_end: None, meta: Meta::default(), sent: 0, on_done: None, kept: None }
    }

    /// Keeps `thing` alive until this body is dropped.
    pub fn keep(mut self, thing: Box<dyn Send>) -> Self {
        self.kept = Some(thing);
        self
    }

    /// Calls `f` with the bytes sent once the body ends or is dropped.
    pub fn on_done(mut self, f: OnDone) -> Self {
        self.on_done = Some(f);
        self
    }

    pub fn on_end(mut self, f: OnEnd) -> Self {
        self.on_end = Some(f);
        self
    }

    fn finish(&mut self) {
        if let Some(f) = self.on_end.take() {
            f();
        }
        if let Some(f) = self.on_done.take() {
            f(self.sent);
        }
    }
}

impl Drop for ProxyBody {
    fn drop(&mut self) {
        if let Some(f) = self.on_done.take() {
            f(self.sent);
        }
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let poll = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &poll
            && self.on_done.is_some()
        {
            self.sent += frame.data_ref().map_or(0, |d| d.len() as u64);
        }
        match &poll {
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => self.finish(),
            Poll::Ready(Some(Ok(_))) if self.inner.is_end_stream() => self.finish(),
            _ => {}
        }
        poll
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
