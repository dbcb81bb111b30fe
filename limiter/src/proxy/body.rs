//! Body wrappers: the response body carries the request's permit (given
//! back when the body ends or hyper drops it because the client went away)
//! and a stall timeout; a request body streamed upstream gets the same
//! stall timeout. Bodies are streamed frame by frame, never buffered whole.

use std::{
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, combinators::UnsyncBoxBody};
use hyper::body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep, sleep};

use crate::admission::Permit;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Times out a body that produces no frame for `idle`. The timer is only
/// armed the first time the body has to wait, so the common small body
/// that is ready at once costs no timer at all.
pub struct Stall<B> {
    inner: B,
    idle: Duration,
    timer: Option<Pin<Box<Sleep>>>,
}

impl<B> Stall<B> {
    pub fn new(inner: B, idle: Duration) -> Self {
        Self { inner, idle, timer: None }
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
                let idle = self.idle;
                if let Some(timer) = self.timer.as_mut() {
                    timer.as_mut().reset(Instant::now() + idle);
                }
                Poll::Ready(frame.map(|r| r.map_err(Into::into)))
            }
            Poll::Pending => {
                let idle = self.idle;
                let timer = self.timer.get_or_insert_with(|| Box::pin(sleep(idle)));
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

/// Called once when a response body ends (all frames handed to hyper).
pub type OnEnd = Box<dyn FnOnce() + Send>;

/// The body of every response the proxy sends.
pub struct ProxyBody {
    inner: UnsyncBoxBody<Bytes, BoxError>,
    permit: Option<Permit>,
    on_end: Option<OnEnd>,
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
        Self { inner, permit: None, on_end: None }
    }

    /// Holds `permit` until this body ends or is dropped.
    pub fn with_permit(mut self, permit: Permit) -> Self {
        self.permit = Some(permit);
        self
    }

    pub fn on_end(mut self, f: OnEnd) -> Self {
        self.on_end = Some(f);
        self
    }

    fn finish(&mut self) {
        self.permit = None;
        if let Some(f) = self.on_end.take() {
            f();
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
