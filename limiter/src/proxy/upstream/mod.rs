//! The one upstream client, for requests of every downstream protocol:
//! the head limiter wrote and the body framed by limiter go out on a
//! pooled connection ([`pool`]), the response head comes back read by the
//! framing module, and the response body is read strictly as it comes
//! ([`ResponseBody`]).
//!
//! **Retries** ([`may_send_again`], the one rule): a request is sent
//! again, once and on another connection, only when the upstream cannot
//! have seen any of it: the connection it went on failed before it took a
//! byte of the request (a pooled one the upstream closed while it sat
//! idle), its method is idempotent and its body was in memory
//! (`limiter_http_upstream_retries_total`). A request any byte of which
//! the upstream took is never sent again, whatever its method: the
//! upstream may be running it (a PUT whose body it is reading, stalled).
//!
//! **A stalled write**: an upstream that takes no byte of the request for
//! `http.idleTimeoutMs` is alive, not failing: the client gets 502, the
//! connection is half-closed (the upstream's read of the body ends) and
//! followed to its end holding the permit, as after a 504.
//!
//! **The permit contract**: a response body streamed holding its permit
//! gives the permit back when the upstream has delivered its last byte.
//! An exchange limiter gives up on before that (a 504, a client gone, a
//! request body that failed half-way) is followed to the upstream's end,
//! holding the permit, within `http.upstreamAbandonMs` ([`abandon`]).
//!
//! **An early answer**: an upstream may answer before it has read the
//! request body (a 413, a 401) and close. While a body streams upstream
//! the connection is watched for that answer: once a final head has come,
//! nothing more of the body is sent, and the answer is the client's (the
//! connection then carries no other request).

pub mod abandon;
pub mod pool;

use std::{
    pin::Pin,
    sync::{Arc, atomic::Ordering},
    task::{Context, Poll},
    time::{Duration, Instant},
};

use bytes::{Buf as _, Bytes};
use tokio::{
    io::AsyncWriteExt as _,
    time::{Sleep, sleep},
};

pub use self::{
    abandon::{Abandon, Cause, End},
    pool::{GetError, Pool, UpstreamConn, Upstreams},
};
use super::{
    budget::{Budget, Collect},
    error::{BodyTimeout, Error, Kind},
    h1::framing::{
        self as http1, Framing, ResponseHead,
        body::{Decoder, Encoder},
    },
    rate::{Broke, Pace},
    request::Outgoing,
};
use crate::admission::Permit;

/// The rest of a request body as its client sends it (HTTP/1: from the
/// connection; HTTP/2: from the stream), decoded.
pub trait BodySource {
    /// The next piece of its data; `Ok(None)` at its end, `Err` if the
    /// client broke it off or framed it wrongly. Cancel-safe.
    fn next(&mut self) -> impl Future<Output = Result<Option<Bytes>, Error>>;

    /// The body's data bytes read from the client so far (the access
    /// log's `bytes_in`, the same on every protocol).
    fn received(&self) -> u64;
}

/// A request body as it goes upstream.
pub enum Outbound<'b, B> {
    /// In memory (or none): sent with its length, in the head's write.
    Whole(Bytes),
    /// What came, then the rest streamed from the client, framed as said.
    Stream { first: Bytes, rest: &'b mut B, framing: Outgoing },
}

/// Why a request got no response head.
pub enum Failed {
    /// Every connection the cap allows stayed busy: limiter's own cap
    /// (503 `upstream_full`), not an error of the upstream's.
    Full,
    /// The exchange failed; `busy`: the connection the upstream may still
    /// be working on the request on (after a timeout, a client body that
    /// failed half-way, or an upload it took nothing of for
    /// `http.idleTimeoutMs`), to follow to its end ([`Busy`]).
    Error { error: Error, busy: Option<Busy> },
}

/// A connection the upstream may still be working on a request on: with
/// when the request went and why limiter gave up on it, to follow to its
/// end ([`follow_pending`]).
pub struct Busy {
    pub conn: UpstreamConn,
    pub sent: Instant,
    pub cause: Cause,
}

impl From<Error> for Failed {
    fn from(error: Error) -> Self {
        Self::Error { error, busy: None }
    }
}

/// A response head and the connection its body comes on.
pub struct Answered {
    pub conn: UpstreamConn,
    pub head: ResponseHead,
    /// The head's bytes (its spans point here).
    pub head_bytes: Bytes,
    /// From the request fully sent to the response head.
    pub took: Duration,
}

/// What a request needs of its connection and of the rules in force.
pub struct Send<'a> {
    pub pool: &'a Pool,
    pub connect_timeout: Duration,
    pub idle_timeout: Duration,
    pub upstream_timeout: Duration,
    /// How far ahead the answer's timer is armed at most: the shortest
    /// timeout of a client's (`http.headerReadTimeoutMs`), so that no
    /// client's timer is the earliest of the worker's timers (see
    /// [`crate::proxy::deadline`]).
    pub arm_within: Duration,
    pub min_rate: u64,
    /// The method may be sent twice (see the module's doc).
    pub idempotent: bool,
    pub to_head: bool,
    pub upgrade: bool,
}

/// Sends `head` and `body` and waits for the response head.
pub async fn send<B: BodySource>(
    s: &Send<'_>,
    head: &[u8],
    body: Outbound<'_, B>,
) -> Result<Answered, Failed> {
    let may_retry = s.idempotent && matches!(body, Outbound::Whole(_));
    let mut body = body;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let mut conn = match s.pool.get(s.connect_timeout, s.idle_timeout).await {
            Ok(conn) => conn,
            Err(GetError::Full) => return Err(Failed::Full),
            Err(GetError::Connect(e)) => return Err(Error::io(Kind::UpstreamConnect, e).into()),
        };
        let reused = conn.reused;
        // Set once the upstream took a byte of this request.
        let mut reached = false;
        let sent = match &mut body {
            Outbound::Whole(bytes) => write_whole(&mut conn, head, bytes, s.idle_timeout, &mut reached).await,
            Outbound::Stream { first, rest, framing } => {
                match stream(s, &mut conn, head, first, &mut **rest, *framing, &mut reached).await {
                    Ok(sent) => sent,
                    Err(error) => {
                        // Part of the request is upstream: the upstream may
                        // be working on it. Nothing more is coming.
                        let _ = conn.stream.shutdown().await;
                        let busy = Busy { conn, sent: Instant::now(), cause: Cause::ClientBody };
                        return Err(Failed::Error { error, busy: Some(busy) });
                    }
                }
            }
        };
        let early = match sent {
            Sent::Whole => false,
            Sent::Answered => true,
            // The upstream closed or stalled: an answer it sent first is
            // still the client's.
            Sent::Failed(_) if answer_came(&mut conn, s.to_head).await => true,
            Sent::Failed(_) if may_send_again(may_retry, reused, attempt, reached, &conn) => {
                s.pool.shared().retries.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            // Alive, not reading yet: followed as after a 504.
            Sent::Failed(error) if matches!(error.cause(), super::error::Cause::Rule(STALLED_WRITE)) => {
                let _ = tokio::time::timeout(s.idle_timeout, conn.stream.shutdown()).await;
                let busy = Busy { conn, sent: Instant::now(), cause: Cause::Stalled };
                return Err(Failed::Error { error, busy: Some(busy) });
            }
            Sent::Failed(error) => return Err(error.into()),
        };
        let sent = Instant::now();
        let deadline = tokio::time::Instant::now() + s.upstream_timeout;
        match read_head_until(&mut conn, (s.to_head, s.upgrade), deadline, Some(s.arm_within)).await {
            Ok(mut head) => {
                // Its body was not all sent: the connection carries no more.
                head.closes |= early;
                let head_bytes = conn.buf.split_to(head.len).freeze();
                return Ok(Answered { conn, head, head_bytes, took: sent.elapsed() });
            }
            Err(NoResponse { error, .. }) if error.kind() == Kind::UpstreamTimeout => {
                return Err(Failed::Error { error, busy: Some(Busy { conn, sent, cause: Cause::Timeout }) });
            }
            Err(NoResponse { error, .. }) => return Err(error.into()),
        }
    }
}

/// Whether a request whose connection failed goes again on another: only
/// when the upstream cannot have seen any of it (see the module's doc).
/// `may_retry`: an idempotent method and a body in memory; `reused`: the
/// connection came from the pool; `reached`: the upstream took a byte of
/// the request.
fn may_send_again(may_retry: bool, reused: bool, attempt: u32, reached: bool, conn: &UpstreamConn) -> bool {
    may_retry && reused && attempt == 1 && !reached && conn.buf.is_empty()
}

/// How a request went upstream.
enum Sent {
    /// All of it.
    Whole,
    /// Not all of it: the upstream's final answer came first.
    Answered,
    /// The connection failed (or stalled past `http.idleTimeoutMs`).
    Failed(Error),
}

/// A body in memory goes in the head's write (copied when small, else
/// beside it in one vectored write).
async fn write_whole(
    conn: &mut UpstreamConn,
    head: &[u8],
    body: &Bytes,
    idle: Duration,
    reached: &mut bool,
) -> Sent {
    if body.len() <= 16 * 1024 {
        let mut out = Vec::with_capacity(head.len() + body.len());
        out.extend_from_slice(head);
        out.extend_from_slice(body);
        write_watching(conn, &mut &out[..], idle, reached).await
    } else {
        let mut both = bytes::Buf::chain(head, &body[..]);
        write_watching(conn, &mut both, idle, reached).await
    }
}

/// Writes `bytes` upstream, watching the connection for a final answer
/// meanwhile (an upstream may answer before it reads a body); gives up
/// after `idle` without progress. `reached` is set once a write took a
/// byte.
async fn write_watching(
    conn: &mut UpstreamConn,
    bytes: &mut impl bytes::Buf,
    idle: Duration,
    reached: &mut bool,
) -> Sent {
    while bytes.has_remaining() {
        let progress = {
            let (reader, mut writer) = conn.stream.split();
            tokio::select! {
                biased;
                written = tokio::time::timeout(idle, writer.write_buf(bytes)) => match written {
                    Ok(Ok(n)) if n > 0 => {
                        *reached = true;
                        None
                    }
                    Ok(Ok(_)) => return Sent::Failed(Error::closed(Kind::UpstreamClosed)),
                    Ok(Err(e)) => return Sent::Failed(Error::io(Kind::UpstreamClosed, e)),
                    Err(_) => return Sent::Failed(Error::rule(Kind::UpstreamClosed, STALLED_WRITE)),
                },
                readable = reader.as_ref().readable() => Some(readable),
            }
        };
        if let Some(readable) = progress {
            if let Err(e) = readable {
                return Sent::Failed(Error::io(Kind::UpstreamClosed, e));
            }
            match answer_read(conn, false) {
                Watched::Answer => return Sent::Answered,
                Watched::Nothing => {}
                Watched::Broken(error) => return Sent::Failed(error),
            }
        }
    }
    Sent::Whole
}

/// The upstream took no byte of the request for the idle timeout.
const STALLED_WRITE: &str = "it took none of the request for http.idleTimeoutMs";

/// What a look at the upstream's side of a connection found.
enum Watched {
    Nothing,
    /// A final response head is in the buffer.
    Answer,
    /// The upstream closed it, or it failed.
    Broken(Error),
}

/// Reads what the upstream sent, without waiting: whether a final answer
/// has come (interim ones are left for [`read_head_until`] to skip).
fn answer_read(conn: &mut UpstreamConn, to_head: bool) -> Watched {
    if conn.buf.capacity() - conn.buf.len() < 1024 {
        conn.buf.reserve(pool::BUF);
    }
    let broken = match conn.stream.try_read_buf(&mut conn.buf) {
        Ok(0) => Some(Error::closed(Kind::UpstreamClosed)),
        Ok(_) => None,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
        Err(e) => Some(Error::io(Kind::UpstreamClosed, e)),
    };
    match broken {
        _ if final_head(&conn.buf, to_head) => Watched::Answer,
        Some(error) => Watched::Broken(error),
        None => Watched::Nothing,
    }
}

/// Whether `buf` holds a final response head, after any interim ones.
fn final_head(mut buf: &[u8], to_head: bool) -> bool {
    loop {
        match http1::parse_response(buf, to_head) {
            http1::Response::Head(_) => return true,
            http1::Response::Interim { len, .. } => buf = &buf[len..],
            http1::Response::Partial | http1::Response::Invalid(_) => return false,
        }
    }
}

/// After a write failed: whether the upstream's final answer had come (it
/// answered, then closed without reading the rest).
async fn answer_came(conn: &mut UpstreamConn, to_head: bool) -> bool {
    loop {
        match answer_read(conn, to_head) {
            Watched::Answer => return true,
            Watched::Broken(_) => return false,
            // Nothing yet: the readiness says whether more may come.
            Watched::Nothing => {
                let ready = tokio::time::timeout(Duration::from_millis(10), conn.stream.readable()).await;
                if !matches!(ready, Ok(Ok(()))) {
                    return false;
                }
            }
        }
    }
}

/// Streams a body from its client, framed by limiter, within the minimum
/// rate and the idle timeout, watching for an early answer; `Err` if the
/// client's side failed.
async fn stream<B: BodySource>(
    s: &Send<'_>,
    conn: &mut UpstreamConn,
    head: &[u8],
    first: &Bytes,
    rest: &mut B,
    framing: Outgoing,
    reached: &mut bool,
) -> Result<Sent, Error> {
    let mut out = Vec::with_capacity(head.len() + first.len() + 16);
    out.extend_from_slice(head);
    let mut encoder = match framing {
        Outgoing::Length(n) => Encoder::Length(n),
        _ => Encoder::Chunked,
    };
    // The client's framing said how long: never past it.
    let too_long = |_| Error::rule(Kind::ClientBody, "more body than its Content-Length");
    encoder.data(&mut out, first).map_err(too_long)?;
    let idle = s.idle_timeout;
    let mut pace = Pace::new(s.min_rate, idle);
    loop {
        match write_watching(conn, &mut &out[..], idle, reached).await {
            Sent::Whole => {}
            other => return Ok(other),
        }
        out.clear();
        let (due, rule) = pace.due();
        let next = tokio::select! {
            next = tokio::time::timeout_at(due, rest.next()) => Some(next),
            readable = conn.stream.readable() => {
                if let Err(e) = readable {
                    return Ok(Sent::Failed(Error::io(Kind::UpstreamClosed, e)));
                }
                None
            }
        };
        let Some(next) = next else {
            match answer_read(conn, s.to_head) {
                Watched::Answer => return Ok(Sent::Answered),
                Watched::Nothing => continue,
                Watched::Broken(error) => return Ok(Sent::Failed(error)),
            }
        };
        let data = match next {
            Err(_) if pace.broke(rule) => {
                return Err(match rule {
                    Broke::MinRate => {
                        Error::rule(Kind::ClientSlowBody(BodyTimeout::MinRate), "http.minDataRate")
                    }
                    Broke::Idle => Error::rule(Kind::ClientSlowBody(BodyTimeout::Idle), "http.idleTimeoutMs"),
                });
            }
            Err(_) => continue,
            Ok(Err(error)) => return Err(error),
            Ok(Ok(None)) => break,
            Ok(Ok(Some(data))) => data,
        };
        pace.add(data.len());
        encoder.data(&mut out, &data).map_err(too_long)?;
    }
    encoder
        .finish(&mut out)
        .map_err(|_| Error::rule(Kind::ClientBody, "less body than its Content-Length"))?;
    Ok(write_watching(conn, &mut &out[..], idle, reached).await)
}

/// Why no response head came.
pub(crate) struct NoResponse {
    pub error: Error,
}

/// Reads the response head (interim 1xx heads skipped; `101` only to an
/// upgrade) until `deadline`, its timer armed no later than `arm_within`
/// ahead ([`crate::proxy::deadline`]).
pub(crate) async fn read_head_until(
    conn: &mut UpstreamConn,
    (to_head, upgrade): (bool, bool),
    deadline: tokio::time::Instant,
    arm_within: Option<Duration>,
) -> Result<ResponseHead, NoResponse> {
    let invalid = |rule| NoResponse { error: Error::rule(Kind::UpstreamInvalid, rule) };
    loop {
        if !conn.buf.is_empty() {
            match http1::parse_response(&conn.buf, to_head) {
                http1::Response::Head(head) if head.status == 101 && !upgrade => {
                    return Err(invalid("a 101 to a request that asked for no upgrade"));
                }
                http1::Response::Head(head) => return Ok(head),
                http1::Response::Interim { len, .. } => {
                    conn.buf.advance(len);
                    continue;
                }
                http1::Response::Invalid(why) => return Err(invalid(why)),
                http1::Response::Partial => {}
            }
        }
        if conn.buf.capacity() - conn.buf.len() < 1024 {
            conn.buf.reserve(pool::BUF);
        }
        let read = tokio::io::AsyncReadExt::read_buf(&mut conn.stream, &mut conn.buf);
        let read = conn.deadline.within_armed(deadline, arm_within, read).await;
        let error = match read {
            Ok(Ok(n)) if n > 0 => continue,
            // Not an end: the upstream may be working on the request still,
            // which must never be sent twice.
            Err(_) => Error::rule(Kind::UpstreamTimeout, "http.upstreamTimeoutMs"),
            Ok(Ok(_)) => Error::closed(Kind::UpstreamClosed),
            Ok(Err(e)) => Error::io(Kind::UpstreamClosed, e),
        };
        return Err(NoResponse { error });
    }
}

/// A response body as the upstream sends it, decoded strictly. It holds
/// the request's permit while it streams (see the module's doc).
pub struct ResponseBody {
    conn: Option<UpstreamConn>,
    decoder: Decoder,
    pub(super) pool: Arc<Pool>,
    /// The connection cannot carry another request.
    closes: bool,
    idle: Duration,
    timer: Option<Pin<Box<Sleep>>>,
    armed: bool,
    permit: Option<Permit>,
    done: bool,
    /// Dropped before its end: followed to the upstream's end in the
    /// background, holding the permit ([`abandon`]); `None`: it closes.
    abandon: Option<Abandon>,
    /// Why, when it is dropped before its end: the client went (or was
    /// cut, [`Self::cut`]).
    gone: Cause,
}

impl ResponseBody {
    /// The body of `head` on `conn` (its head already taken off the
    /// buffer); `abandon` says how it is followed if dropped before its end.
    pub fn new(
        conn: UpstreamConn,
        head: &ResponseHead,
        pool: Arc<Pool>,
        idle: Duration,
        permit: Permit,
        abandon: Option<Abandon>,
    ) -> Self {
        let mut body = Self {
            conn: Some(conn),
            decoder: Decoder::new(head.framing),
            pool,
            closes: head.closes,
            idle,
            timer: None,
            armed: false,
            permit: Some(permit),
            done: false,
            abandon,
            gone: Cause::ClientGone,
        };
        if head.framing == Framing::None {
            body.finish();
        }
        body
    }

    /// The data bytes still to come, when the upstream said.
    pub fn remaining(&self) -> Option<u64> {
        if self.done { Some(0) } else { self.decoder.remaining() }
    }

    pub fn is_done(&self) -> bool {
        self.done
    }

    /// The end: the connection goes back to the pool if it can carry
    /// another request, and the permit goes back.
    fn finish(&mut self) {
        self.done = true;
        if let Some(conn) = self.conn.take()
            && !self.closes
        {
            self.pool.put(conn);
        }
        self.permit = None;
    }

    /// The body failed: its connection closes, its permit goes back.
    fn fail(&mut self, error: Error) -> Poll<Result<Option<Bytes>, Error>> {
        self.done = true;
        self.conn = None;
        self.permit = None;
        Poll::Ready(Err(error))
    }

    /// The next piece of data; `None` at the end; `Err` if the upstream
    /// broke it off, framed it wrongly or stalled past the idle timeout.
    pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, Error>> {
        loop {
            if self.done {
                return Poll::Ready(Ok(None));
            }
            let Some(conn) = self.conn.as_mut() else {
                return Poll::Ready(Err(Error::closed(Kind::UpstreamBody)));
            };
            if !conn.buf.is_empty() {
                let step = match self.decoder.decode(&conn.buf) {
                    Ok(step) => step,
                    Err(e) => return self.fail(Error::rule(Kind::UpstreamBody, e.rule())),
                };
                let data = if step.data.is_empty() {
                    conn.buf.advance(step.used);
                    None
                } else {
                    conn.buf.advance(step.data.start);
                    Some(conn.buf.split_to(step.data.len()).freeze())
                };
                if step.end {
                    // Bytes past the end are no response of ours: the
                    // connection cannot be reused.
                    self.closes |= !conn.buf.is_empty();
                    self.finish();
                    return Poll::Ready(Ok(data));
                }
                if let Some(data) = data {
                    self.armed = false;
                    return Poll::Ready(Ok(Some(data)));
                }
                if step.used > 0 {
                    continue;
                }
            }
            if conn.buf.capacity() - conn.buf.len() < 4096 {
                conn.buf.reserve(pool::BUF);
            }
            match conn.stream.poll_read_ready(cx) {
                Poll::Ready(Ok(())) => match conn.stream.try_read_buf(&mut conn.buf) {
                    Ok(0) => {
                        if let Err(e) = self.decoder.eof() {
                            return self.fail(Error::rule(Kind::UpstreamBody, e.rule()));
                        }
                        self.closes = true;
                        self.finish();
                        return Poll::Ready(Ok(None));
                    }
                    Ok(_) => self.armed = false,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => return self.fail(Error::io(Kind::UpstreamBody, e)),
                },
                Poll::Ready(Err(e)) => return self.fail(Error::io(Kind::UpstreamBody, e)),
                Poll::Pending => {
                    let idle = self.idle;
                    let timer = self.timer.get_or_insert_with(|| Box::pin(sleep(idle)));
                    if !self.armed {
                        timer.as_mut().reset(tokio::time::Instant::now() + idle);
                        self.armed = true;
                    }
                    if timer.as_mut().poll(cx).is_ready() {
                        return self
                            .fail(Error::rule(Kind::UpstreamBody, "it stalled past http.idleTimeoutMs"));
                    }
                    return Poll::Pending;
                }
            }
        }
    }

    pub async fn next(&mut self) -> Result<Option<Bytes>, Error> {
        std::future::poll_fn(|cx| self.poll_next(cx)).await
    }

    /// Reads the body ahead of the client if it ends within `limit` bytes
    /// and the budget (`Ahead::Whole`: the permit is back); otherwise what
    /// was read, to send before the rest.
    pub async fn read_ahead(
        &mut self,
        limit: u64,
        budget: &Arc<Budget>,
        memory: u64,
    ) -> Result<Ahead, Error> {
        let mut collect = match self.remaining() {
            _ if limit == 0 => return Ok(Ahead::Streaming(Bytes::new())),
            Some(n) if n > limit => return Ok(Ahead::Streaming(Bytes::new())),
            Some(n) => Collect::sized(n),
            None => Collect::growing(),
        };
        while let Some(data) = self.next().await? {
            // Too large, or the budget is spent: the rest streams.
            if let Err(data) = collect.push(data, limit, budget, memory) {
                return Ok(Ahead::Streaming(collect.finish(Some(data))));
            }
        }
        Ok(Ahead::Whole(collect.finish(None)))
    }
}

impl ResponseBody {
    /// The client was cut (too slow to take its response): dropped before
    /// its end, the rest is followed to the upstream's end holding the
    /// permit as for a client gone, counted as `client_slow`.
    pub fn cut(&mut self) {
        self.gone = Cause::ClientSlow;
    }
}

/// A response body read ahead of the client.
pub enum Ahead {
    /// All of it: the upstream is done, the permit is back.
    Whole(Bytes),
    /// Too large (or the budget is spent): what was read, then the rest.
    Streaming(Bytes),
}

impl Drop for ResponseBody {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let (Some(abandon), Some(conn)) = (self.abandon.take(), self.conn.take()) else { return };
        let rest = Self {
            conn: Some(conn),
            decoder: self.decoder.clone(),
            pool: self.pool.clone(),
            closes: self.closes,
            idle: self.idle,
            timer: None,
            armed: false,
            permit: self.permit.take(),
            done: false,
            abandon: None,
            gone: self.gone,
        };
        follow_body(rest, abandon);
    }
}

/// Follows a request whose response head has not come (after a 504, or a
/// client body that failed half-way) to the upstream's end, holding its
/// permit; `sent` is when the request went upstream (the adaptive limit
/// learns the answer's latency if it comes).
pub fn follow_pending(busy: Busy, pool: Arc<Pool>, permit: Permit, to_head: bool, abandon: Abandon) {
    let Busy { mut conn, sent, cause } = busy;
    let gave_up = tokio::time::Instant::now();
    let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
    let shared = pool.shared_arc();
    shared.abandoned.now.fetch_add(1, Ordering::Relaxed);
    runtime.spawn(async move {
        let deadline = gave_up + abandon.bound;
        let mut permit = permit;
        let end = match read_head_until(&mut conn, (to_head, false), deadline, None).await {
            Ok(head) => {
                permit.answered(sent.elapsed());
                conn.buf.advance(head.len);
                let mut body = ResponseBody::new(conn, &head, pool, abandon.idle, permit, None);
                drain(&mut body, deadline).await
            }
            Err(NoResponse { error, .. }) if error.kind() == Kind::UpstreamTimeout => End::Bound,
            Err(_) => End::Closed,
        };
        shared.abandoned.now.fetch_sub(1, Ordering::Relaxed);
        shared.abandoned.ended(&abandon.id, cause, end, gave_up.elapsed());
    });
}

/// Follows a response body its client is no longer there for, holding its
/// permit (called when the body is dropped before its end).
fn follow_body(mut body: ResponseBody, abandon: Abandon) {
    let cause = body.gone;
    let gave_up = tokio::time::Instant::now();
    let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
    let shared = body.pool.shared_arc();
    shared.abandoned.now.fetch_add(1, Ordering::Relaxed);
    runtime.spawn(async move {
        let end = drain(&mut body, gave_up + abandon.bound).await;
        drop(body);
        shared.abandoned.now.fetch_sub(1, Ordering::Relaxed);
        shared.abandoned.ended(&abandon.id, cause, end, gave_up.elapsed());
    });
}

/// Reads a body to its end (the permit returns then, the connection to the
/// pool if it can be reused), or until `deadline` (the connection closes
/// with the body, then the permit returns).
async fn drain(body: &mut ResponseBody, deadline: tokio::time::Instant) -> End {
    let read = async {
        loop {
            match body.next().await {
                Ok(Some(_)) => {}
                Ok(None) => return End::Answered,
                Err(_) => return End::Closed,
            }
        }
    };
    tokio::time::timeout_at(deadline, read).await.unwrap_or(End::Bound)
}
