//! The upstream's threads shielded from slow clients: a request body up to
//! `http.requestBufferBytes` is read whole *before* the permits are taken
//! (with a total deadline and within the memory budget), and a response
//! body up to `http.responseBufferBytes` is read ahead of the client, so a
//! permit is held only while the upstream works. A larger request body
//! streams while holding its permit, but must average `http.minDataRate`.

use std::{
    collections::VecDeque,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
    time::Duration,
};

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt as _;
use hyper::body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep, sleep_until, timeout, timeout_at};

use super::{
    Tuning,
    body::{BoxError, ClientBody},
    budget::{Budget, Reservation, take_more},
};

/// How long a streamed body may take before its average rate counts.
pub const GRACE: Duration = Duration::from_secs(3);

/// Frames already in memory, then (maybe) the rest of the body to stream,
/// boxed: most bodies are whole, and a request moves through several
/// futures and channels on its way upstream, so its body is kept small.
/// (The memory reservation of buffered bytes lives in the bytes themselves,
/// see [`Held`]: it is given back when the last copy is written out.)
pub struct Prefixed<B> {
    frames: VecDeque<Frame<Bytes>>,
    rest: Option<Box<B>>,
}

impl<B> Prefixed<B> {
    /// A body entirely in memory.
    pub fn whole(frames: VecDeque<Frame<Bytes>>) -> Self {
        Self { frames, rest: None }
    }

    /// `frames`, then whatever `rest` produces.
    pub fn streaming(frames: VecDeque<Frame<Bytes>>, rest: B) -> Self {
        Self { frames, rest: Some(Box::new(rest)) }
    }

    fn buffered_bytes(&self) -> u64 {
        self.frames.iter().filter_map(|f| f.data_ref()).map(|d| d.len() as u64).sum()
    }
}

impl<B> Body for Prefixed<B>
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
        if let Some(frame) = self.frames.pop_front() {
            return Poll::Ready(Some(Ok(frame)));
        }
        match &mut self.rest {
            Some(rest) => Pin::new(&mut **rest).poll_frame(cx).map(|f| f.map(|r| r.map_err(Into::into))),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty() && self.rest.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        let buffered = self.buffered_bytes();
        match &self.rest {
            // Trailers cannot follow a Content-Length: leave the length open.
            None if self.frames.iter().any(Frame::is_trailers) => SizeHint::default(),
            None => SizeHint::with_exact(buffered),
            Some(rest) => {
                let inner = rest.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(inner.lower() + buffered);
                if let Some(upper) = inner.upper() {
                    hint.set_upper(upper + buffered);
                }
                hint
            }
        }
    }
}

/// A streamed body too slow for `http.minDataRate`.
#[derive(Debug, thiserror::Error)]
#[error("the body averaged less than http.minDataRate")]
pub struct TooSlow;

/// Fails a body that, after [`GRACE`], brings less than `rate` bytes per
/// second (0: never; see [`rate_due`] for how the rate is measured).
pub struct MinRate<B> {
    inner: B,
    rate: u64,
    start: Instant,
    bytes: u64,
    timer: Option<Pin<Box<Sleep>>>,
}

impl<B> MinRate<B> {
    pub fn new(inner: B, rate: u64) -> Self {
        Self { inner, rate, start: Instant::now(), bytes: 0, timer: None }
    }
}

/// When to look again at a transfer of `bytes` since `since` that must
/// bring `rate` bytes per second: a time already past means it did not.
/// A transfer that has kept the rate for at least
/// [`GRACE`] is measured afresh from now, so the rate holds over every
/// stretch of the transfer, not only on average since its start (a fast
/// start cannot pay for a trickle after it).
pub fn rate_due(since: &mut Instant, bytes: &mut u64, rate: u64) -> Instant {
    let now = Instant::now();
    let elapsed = now.saturating_duration_since(*since);
    if elapsed >= GRACE && *bytes as f64 >= rate as f64 * elapsed.as_secs_f64() {
        *since = now;
        *bytes = 0;
    }
    // Within the grace: look again when it ends. After it (and not reset):
    // the rate is not kept, the time is up.
    let grace_end = *since + GRACE;
    if now < grace_end { grace_end } else { *since + Duration::from_secs_f64(*bytes as f64 / rate as f64) }
}

impl<B> Body for MinRate<B>
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
                if let Some(Ok(f)) = &frame {
                    self.bytes += f.data_ref().map_or(0, |d| d.len() as u64);
                }
                Poll::Ready(frame.map(|r| r.map_err(Into::into)))
            }
            Poll::Pending if self.rate == 0 => Poll::Pending,
            Poll::Pending => {
                let this = &mut *self;
                let due = rate_due(&mut this.start, &mut this.bytes, this.rate);
                let timer = this.timer.get_or_insert_with(|| Box::pin(sleep_until(due)));
                timer.as_mut().reset(due);
                ready!(timer.as_mut().poll(cx));
                Poll::Ready(Some(Err(Box::new(TooSlow))))
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

/// A request body as received before admission.
pub enum Receipt {
    /// Entirely in memory (or empty): forwarded without the client.
    Whole(VecDeque<Frame<Bytes>>),
    /// Larger than the buffer: what arrived, and the rest to stream while
    /// holding the permit.
    Streaming(VecDeque<Frame<Bytes>>, ClientBody),
}

/// Why a body could not be read before admission.
#[derive(Debug, thiserror::Error)]
pub enum ReceiveError {
    #[error("the body did not arrive within http.requestBodyTimeoutMs")]
    Deadline,
    #[error("http.bufferMemoryBytes is spent")]
    BudgetSpent,
    #[error("the client's body failed: {0}")]
    Client(hyper::Error),
}

/// Reads `body` whole if it fits `http.requestBufferBytes`; otherwise
/// returns at once (or as soon as a chunked body outgrows the buffer) with
/// what it read and the rest.
pub async fn receive(
    mut body: ClientBody,
    t: &Tuning,
    budget: &Arc<Budget>,
) -> Result<Receipt, ReceiveError> {
    if body.is_end_stream() {
        return Ok(Receipt::Whole(VecDeque::new()));
    }
    let limit = t.request_buffer_bytes;
    let exact = body.size_hint().exact();
    if limit == 0 || exact.is_some_and(|n| n > limit) {
        return Ok(Receipt::Streaming(VecDeque::new(), body));
    }
    let mut reservation = match exact {
        Some(n) => Some(budget.reserve(n, t.buffer_memory_bytes).ok_or(ReceiveError::BudgetSpent)?),
        None => None,
    };
    let deadline = Instant::now() + t.request_body_timeout;
    let mut held = Held::with_capacity(exact.unwrap_or(0));
    loop {
        let frame = match timeout_at(deadline, body.frame()).await {
            Err(_) => return Err(ReceiveError::Deadline),
            Ok(None) => return Ok(Receipt::Whole(held.frames(reservation))),
            Ok(Some(Err(e))) => return Err(ReceiveError::Client(e)),
            Ok(Some(Ok(frame))) => frame,
        };
        let n = frame.data_ref().map_or(0, |d| d.len() as u64);
        if exact.is_none() {
            if held.len() + n > limit {
                held.push(frame);
                return Ok(Receipt::Streaming(held.frames(reservation), body));
            }
            if !take_more(budget, &mut reservation, n, t.buffer_memory_bytes) {
                return Err(ReceiveError::BudgetSpent);
            }
        }
        held.push(frame);
        if body.is_end_stream() {
            return Ok(Receipt::Whole(held.frames(reservation)));
        }
    }
}

/// A body's bytes copied into one buffer as they arrive: the frames hyper
/// hands over are slices of its larger read buffers, and holding them
/// would hold those (twice the budget in memory, measured); this holds
/// what was reserved.
struct Held {
    data: BytesMut,
    trailers: Option<Frame<Bytes>>,
}

impl Held {
    fn with_capacity(bytes: u64) -> Self {
        Self { data: BytesMut::with_capacity(usize::try_from(bytes).unwrap_or(0)), trailers: None }
    }

    fn len(&self) -> u64 {
        self.data.len() as u64
    }

    fn push(&mut self, frame: Frame<Bytes>) {
        match frame.into_data() {
            Ok(data) => self.data.extend_from_slice(&data),
            Err(other) => self.trailers = Some(other),
        }
    }

    /// The frames to send: the bytes own `reservation`, so the budget gets
    /// them back only when the last copy is gone (written to the socket),
    /// not when the body hands its frame over.
    fn frames(self, reservation: Option<Reservation>) -> VecDeque<Frame<Bytes>> {
        let mut out = VecDeque::with_capacity(2);
        if !self.data.is_empty() {
            out.push_back(Frame::data(Bytes::from_owner(Reserved {
                data: self.data,
                _reservation: reservation,
            })));
        }
        out.extend(self.trailers);
        out
    }
}

/// Bytes that keep their share of the budget while they live.
struct Reserved {
    data: BytesMut,
    _reservation: Option<Reservation>,
}

impl AsRef<[u8]> for Reserved {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

/// A response body as read ahead of the client.
pub enum ReadAhead<B> {
    /// All of it, in memory: the permit can go back.
    Whole(VecDeque<Frame<Bytes>>),
    /// Larger than the buffer (or the budget is spent): what was read, and
    /// the rest to stream while holding the permit.
    Streaming(VecDeque<Frame<Bytes>>, B),
}

/// Reads up to `http.responseBufferBytes` of `body` before the client gets
/// anything (each frame within `idle`); `Err` if the upstream failed or
/// stalled before its body ended.
pub async fn read_ahead<B>(mut body: B, t: &Tuning, budget: &Arc<Budget>) -> Result<ReadAhead<B>, BoxError>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    if body.is_end_stream() {
        return Ok(ReadAhead::Whole(VecDeque::new()));
    }
    let limit = t.response_buffer_bytes;
    let exact = body.size_hint().exact();
    if limit == 0 || exact.is_some_and(|n| n > limit) {
        return Ok(ReadAhead::Streaming(VecDeque::new(), body));
    }
    let mut reservation: Option<Reservation> = None;
    let mut held = Held::with_capacity(exact.unwrap_or(0));
    loop {
        let frame = match timeout(t.idle_timeout, body.frame()).await {
            Err(_) => return Err(Box::new(super::body::Stalled)),
            Ok(None) => return Ok(ReadAhead::Whole(held.frames(reservation))),
            Ok(Some(Err(e))) => return Err(e.into()),
            Ok(Some(Ok(frame))) => frame,
        };
        let n = frame.data_ref().map_or(0, |d| d.len() as u64);
        let reserved =
            held.len() + n <= limit && take_more(budget, &mut reservation, n, t.buffer_memory_bytes);
        if !reserved {
            // Too large, or the budget is spent: stream this frame and the rest.
            let mut frames = held.frames(reservation);
            frames.push_back(frame);
            return Ok(ReadAhead::Streaming(frames, body));
        }
        held.push(frame);
        if body.is_end_stream() {
            return Ok(ReadAhead::Whole(held.frames(reservation)));
        }
    }
}
