//! The bodies of an HTTP/2 stream: its request's, as the pipeline reads it
//! ([`RequestBody`]), and its response's, as hyper sends it
//! ([`ResponseBody`]: one of limiter's own in memory, or the upstream's
//! under the stream guard, streamed by [`StreamBody`]).

use std::{
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll},
};

use bytes::Bytes;
use http_body_util::BodyExt as _;
use hyper::body::{Body, Frame, Incoming, SizeHint};

use super::{
    guard::{BoxError, Guarded, Starved},
    streams::Open,
};
use crate::{
    proxy::{
        Counters,
        error::{Error, Kind},
        upstream::{self, BodySource},
    },
    request_id::RequestId,
};

/// A stream's request body, as hyper hands it over.
pub struct RequestBody {
    body: Incoming,
    received: u64,
}

impl RequestBody {
    pub fn new(body: Incoming) -> Self {
        Self { body, received: 0 }
    }
}

impl BodySource for RequestBody {
    async fn next(&mut self) -> Result<Option<Bytes>, Error> {
        loop {
            match self.body.frame().await {
                None => return Ok(None),
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) if data.is_empty() => {}
                    Ok(data) => {
                        self.received += data.len() as u64;
                        return Ok(Some(data));
                    }
                    // Trailers are dropped.
                    Err(_) => {}
                },
                Some(Err(e)) => return Err(Error::other(Kind::ClientBody, e)),
            }
        }
    }

    fn received(&self) -> u64 {
        self.received
    }
}

/// A stream's response body: in memory, or under the stream guard.
pub enum ResponseBody {
    Full(Option<Bytes>, Done),
    Guarded(Guarded, Done),
}

/// Called with the bytes sent and why the body did not end, if it did not.
type OnDone = Box<dyn FnOnce(u64, Option<Kind>) + Send>;

/// What a response body does when it is done, or dropped before its end:
/// the access log's line with the bytes sent and, if it did not end, why
/// (the client reset the stream or was cut, or the upstream broke it off);
/// and its place among the open streams.
pub struct Done {
    sent: u64,
    on_done: Option<OnDone>,
    _open: Option<Open>,
    /// Nothing is left to send (a body of none).
    empty: bool,
    /// Set when the stream guard cut the body.
    cut: Option<Arc<AtomicBool>>,
}

impl Done {
    fn new(empty: bool, cut: Option<Arc<AtomicBool>>) -> Self {
        Self { sent: 0, on_done: None, _open: None, empty, cut }
    }

    fn fire(&mut self, broke: Option<Kind>) {
        if let Some(f) = self.on_done.take() {
            f(self.sent, broke);
        }
    }
}

impl Drop for Done {
    fn drop(&mut self) {
        // Dropped before its end: the guard cut it, or the stream is gone.
        let broke = match &self.cut {
            _ if self.empty => None,
            Some(cut) if cut.load(Ordering::Relaxed) => Some(Kind::ClientCut),
            _ => Some(Kind::ClientGone),
        };
        self.fire(broke);
    }
}

impl ResponseBody {
    pub fn empty() -> Self {
        Self::Full(None, Done::new(true, None))
    }

    /// A body under the stream guard, which sets `cut` when it cuts it.
    pub fn guarded(body: Guarded, cut: Arc<AtomicBool>) -> Self {
        Self::Guarded(body, Done::new(false, Some(cut)))
    }

    /// Calls `f` with the bytes sent, and why the body did not end if it did
    /// not, once it is done or dropped; holds the stream open until then.
    pub fn finally(mut self, open: Open, f: impl FnOnce(u64, Option<Kind>) + Send + 'static) -> Self {
        let (Self::Full(_, done) | Self::Guarded(_, done)) = &mut self;
        done.on_done = Some(Box::new(f));
        done._open = Some(open);
        self
    }
}

impl From<Bytes> for ResponseBody {
    fn from(bytes: Bytes) -> Self {
        let empty = bytes.is_empty();
        Self::Full((!empty).then_some(bytes), Done::new(empty, None))
    }
}

/// Why a guarded body failed: the guard's cut, or the upstream's error.
fn broke(e: &BoxError) -> Kind {
    if e.is::<Starved>() {
        Kind::ClientCut
    } else {
        e.downcast_ref::<Error>().map_or(Kind::UpstreamBody, Error::kind)
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            Self::Full(bytes, done) => match bytes.take() {
                Some(b) => {
                    done.sent += b.len() as u64;
                    done.fire(None);
                    Poll::Ready(Some(Ok(Frame::data(b))))
                }
                None => {
                    done.fire(None);
                    Poll::Ready(None)
                }
            },
            Self::Guarded(body, done) => {
                let poll = Pin::new(&mut *body).poll_frame(cx);
                match &poll {
                    Poll::Ready(Some(Ok(frame))) => {
                        done.sent += frame.data_ref().map_or(0, |d| d.len() as u64);
                        if body.is_end_stream() {
                            done.fire(None);
                        }
                    }
                    Poll::Ready(Some(Err(e))) => done.fire(Some(broke(e))),
                    Poll::Ready(None) => done.fire(None),
                    Poll::Pending => {}
                }
                poll
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Full(bytes, _) => bytes.is_none(),
            Self::Guarded(body, _) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Full(bytes, _) => SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64)),
            Self::Guarded(body, _) => body.size_hint(),
        }
    }
}

/// A response body streamed from the upstream: what was read ahead, then
/// the rest as it comes (its permit held until the upstream's last byte).
/// Dropped before its end, the rest is followed to the upstream's end
/// ([`upstream::abandon`]), also when the stream guard cut it (`cut`:
/// counted `client_slow`). An error of the upstream's is counted and
/// logged here, with its cause (`noted`: where).
pub struct StreamBody {
    first: Option<Bytes>,
    rest: Box<upstream::ResponseBody>,
    cut: Arc<AtomicBool>,
    noted: (Arc<Counters>, SocketAddr, RequestId),
}

impl StreamBody {
    pub fn new(
        first: Bytes,
        rest: Box<upstream::ResponseBody>,
        cut: Arc<AtomicBool>,
        noted: (Arc<Counters>, SocketAddr, RequestId),
    ) -> Self {
        Self { first: (!first.is_empty()).then_some(first), rest, cut, noted }
    }
}

impl Drop for StreamBody {
    fn drop(&mut self) {
        if self.cut.load(Ordering::Relaxed) {
            self.rest.cut();
        }
    }
}

impl Body for StreamBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(first) = this.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        match this.rest.poll_next(cx) {
            Poll::Ready(Ok(Some(data))) => Poll::Ready(Some(Ok(Frame::data(data)))),
            Poll::Ready(Ok(None)) => Poll::Ready(None),
            Poll::Ready(Err(error)) => {
                let (counters, peer, id) = &this.noted;
                counters.note(&error, *peer, id);
                Poll::Ready(Some(Err(Box::new(error))))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.rest.is_done()
    }

    fn size_hint(&self) -> SizeHint {
        let first = self.first.as_ref().map_or(0, |f| f.len() as u64);
        match self.rest.remaining() {
            Some(n) => SizeHint::with_exact(first + n),
            None => {
                let mut hint = SizeHint::new();
                hint.set_lower(first);
                hint
            }
        }
    }
}
