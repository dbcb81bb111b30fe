//! The one upstream client, for requests of every downstream protocol:
//! the head limiter wrote and the body framed by limiter go out on a
//! pooled connection ([`pool`]), the response head comes back read by the
//! framing module, and the response body is read strictly as it comes
//! ([`ResponseBody`]).
//!
//! **Retries**: a request is sent again, once and on another connection,
//! only when its method is idempotent, its body was in memory (never
//! streamed), the connection it went on was a pooled one (one the upstream
//! may have closed while it sat idle), and no byte of a response came back
//! (`limiter_http_upstream_retries_total`).
//!
//! **The permit contract**: a response body streamed holding its permit
//! gives the permit back when the upstream has delivered its last byte.
//! Dropped before that (its client went away, reset its stream, read too
//! slowly or was cut), the body is read to its end in the background,
//! still holding the permit, up to [`ORPHAN_BODY_BYTES`] within
//! `http.idleTimeoutMs` a read; past that limiter closes the connection,
//! which ends the upstream's work on it, and only then is the permit
//! returned. The connection of a body read to its end goes back to the
//! pool.

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

pub use self::pool::{Conn, GetError, Pool, Upstreams};
use super::{
    budget::{Budget, Collect},
    counters::BodyTimeout,
    http1::{
        self, Framing, ResponseHead,
        body::{Decoder, Encoder},
    },
    rate::{Broke, Pace},
    request::Outgoing,
};
use crate::admission::Permit;

/// The most of a response body read (and dropped) in the background for a
/// client that went away; a larger body closes its connection.
pub const ORPHAN_BODY_BYTES: u64 = 64 * 1024;

/// The rest of a request body as its client sends it (HTTP/1: from the
/// connection; HTTP/2: from the stream), decoded.
pub trait BodySource {
    /// The next piece of its data; `Ok(None)` at its end, `Err` if the
    /// client broke it off or framed it wrongly. Cancel-safe.
    fn next(&mut self) -> impl Future<Output = Result<Option<Bytes>, ()>>;
}

/// A request body as it goes upstream.
pub enum Outbound<B> {
    /// In memory (or none): sent with its length, in the head's write.
    Whole(Bytes),
    /// What came, then the rest streamed from the client, framed as said.
    Stream { first: Bytes, rest: B, framing: Outgoing },
}

/// Why a request got no response head.
#[derive(Debug)]
pub enum Failure {
    /// Every connection the cap allows stayed busy.
    Full,
    Connect,
    /// No response head within `http.upstreamTimeoutMs`.
    Timeout,
    /// The connection failed (or the upstream answered what limiter cannot
    /// read) before a whole response head.
    Upstream,
    /// The client's streamed body failed (`Some`: too slowly, by which rule).
    ClientBody(Option<BodyTimeout>),
}

/// A response head and the connection its body comes on.
pub struct Answered {
    pub conn: Conn,
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
    pub min_rate: u64,
    /// The method may be sent twice (see the module's doc).
    pub idempotent: bool,
    pub to_head: bool,
    pub upgrade: bool,
}

/// Sends `head` and `body` and waits for the response head. `streamed`
/// counts the body bytes that came from the client while sending.
pub async fn send<B: BodySource>(
    s: &Send<'_>,
    head: &[u8],
    body: Outbound<B>,
    streamed: &mut u64,
) -> Result<Answered, Failure> {
    let may_retry = s.idempotent && matches!(body, Outbound::Whole(_));
    let mut body = body;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let mut conn = match s.pool.get(s.connect_timeout, s.idle_timeout).await {
            Ok(conn) => conn,
            Err(GetError::Full) => return Err(Failure::Full),
            Err(GetError::Connect(_)) => return Err(Failure::Connect),
        };
        let retry = may_retry && conn.reused && attempt == 1;
        let written = match &mut body {
            Outbound::Whole(bytes) => write_whole(&mut conn, head, bytes, s.idle_timeout).await,
            Outbound::Stream { first, rest, framing } => {
                stream(s, &mut conn, head, first, rest, *framing, streamed).await?
            }
        };
        if written.is_err() {
            if retry {
                s.pool.shared().retries.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            return Err(Failure::Upstream);
        }
        let sent = Instant::now();
        match read_head(&mut conn, s).await {
            Ok(head) => {
                let head_bytes = conn.buf.split_to(head.len).freeze();
                return Ok(Answered { conn, head, head_bytes, took: sent.elapsed() });
            }
            Err(HeadError::NothingCame) if retry => {
                s.pool.shared().retries.fetch_add(1, Ordering::Relaxed);
            }
            Err(HeadError::NothingCame | HeadError::Invalid) => return Err(Failure::Upstream),
            Err(HeadError::Timeout) => return Err(Failure::Timeout),
        }
    }
}

/// A body in memory goes in the head's write (copied when small, else
/// beside it in one vectored write).
async fn write_whole(conn: &mut Conn, head: &[u8], body: &Bytes, idle: Duration) -> Result<(), ()> {
    let write = async {
        if body.is_empty() {
            conn.stream.write_all(head).await
        } else if body.len() <= 16 * 1024 {
            let mut out = Vec::with_capacity(head.len() + body.len());
            out.extend_from_slice(head);
            out.extend_from_slice(body);
            conn.stream.write_all(&out).await
        } else {
            conn.stream.write_all_buf(&mut bytes::Buf::chain(head, &body[..])).await
        }
    };
    match tokio::time::timeout(idle, write).await {
        Ok(Ok(())) => Ok(()),
        _ => Err(()),
    }
}

/// Streams a body from its client, framed by limiter, within the minimum
/// rate and the idle timeout; `Ok(Err(()))` if the upstream's side failed.
async fn stream<B: BodySource>(
    s: &Send<'_>,
    conn: &mut Conn,
    head: &[u8],
    first: &Bytes,
    rest: &mut B,
    framing: Outgoing,
    streamed: &mut u64,
) -> Result<Result<(), ()>, Failure> {
    let mut out = Vec::with_capacity(head.len() + first.len() + 16);
    out.extend_from_slice(head);
    let mut encoder = match framing {
        Outgoing::Length(n) => Encoder::Length(n),
        _ => Encoder::Chunked,
    };
    // The client's framing said how long: never past it.
    let too_long = |_| Failure::ClientBody(None);
    encoder.data(&mut out, first).map_err(too_long)?;
    let idle = s.idle_timeout;
    let mut pace = Pace::new(s.min_rate, idle);
    loop {
        if timed(idle, conn.stream.write_all(&out)).await.is_err() {
            return Ok(Err(()));
        }
        out.clear();
        let (due, rule) = pace.due();
        let data = match tokio::time::timeout_at(due, rest.next()).await {
            Err(_) if pace.broke(rule) => {
                return Err(Failure::ClientBody(Some(match rule {
                    Broke::MinRate => BodyTimeout::MinRate,
                    Broke::Idle => BodyTimeout::Idle,
                })));
            }
            Err(_) => continue,
            Ok(Err(())) => return Err(Failure::ClientBody(None)),
            Ok(Ok(None)) => break,
            Ok(Ok(Some(data))) => data,
        };
        pace.add(data.len());
        *streamed += data.len() as u64;
        encoder.data(&mut out, &data).map_err(too_long)?;
    }
    encoder.finish(&mut out).map_err(too_long)?;
    Ok(timed(idle, conn.stream.write_all(&out)).await)
}

async fn timed<T, E>(limit: Duration, f: impl Future<Output = Result<T, E>>) -> Result<T, ()> {
    match tokio::time::timeout(limit, f).await {
        Ok(Ok(v)) => Ok(v),
        _ => Err(()),
    }
}

/// Why no response head came.
enum HeadError {
    /// The connection ended or failed before any byte of a response.
    NothingCame,
    /// What came is not a response limiter forwards, or it broke off.
    Invalid,
    Timeout,
}

/// Reads the response head (interim 1xx heads skipped; `101` only to an
/// upgrade) within `http.upstreamTimeoutMs`.
async fn read_head(conn: &mut Conn, s: &Send<'_>) -> Result<ResponseHead, HeadError> {
    let deadline = tokio::time::Instant::now() + s.upstream_timeout;
    let mut any = false;
    loop {
        if !conn.buf.is_empty() {
            any = true;
            match http1::parse_response(&conn.buf, s.to_head) {
                http1::Response::Head(head) if head.status == 101 && !s.upgrade => {
                    return Err(HeadError::Invalid);
                }
                http1::Response::Head(head) => return Ok(head),
                http1::Response::Interim { len, .. } => {
                    conn.buf.advance(len);
                    continue;
                }
                http1::Response::Invalid => return Err(HeadError::Invalid),
                http1::Response::Partial => {}
            }
        }
        if conn.buf.capacity() - conn.buf.len() < 1024 {
            conn.buf.reserve(pool::BUF);
        }
        match tokio::time::timeout_at(
            deadline,
            tokio::io::AsyncReadExt::read_buf(&mut conn.stream, &mut conn.buf),
        )
        .await
        {
            Err(_) => return Err(HeadError::Timeout),
            Ok(Ok(0) | Err(_)) if !any => return Err(HeadError::NothingCame),
            Ok(Ok(0) | Err(_)) => return Err(HeadError::Invalid),
            Ok(Ok(_)) => {}
        }
    }
}

/// A response body as the upstream sends it, decoded strictly. It holds
/// the request's permit while it streams (see the module's doc).
pub struct ResponseBody {
    conn: Option<Conn>,
    decoder: Decoder,
    pool: Arc<Pool>,
    /// The connection cannot carry another request.
    closes: bool,
    idle: Duration,
    timer: Option<Pin<Box<Sleep>>>,
    armed: bool,
    permit: Option<Permit>,
    done: bool,
    /// Dropped before its end: read it to its end in the background.
    drain: bool,
}

impl ResponseBody {
    /// The body of `head` on `conn` (its head already taken off the buffer).
    pub fn new(conn: Conn, head: &ResponseHead, pool: Arc<Pool>, idle: Duration, permit: Permit) -> Self {
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
            drain: true,
        };
        if head.framing == Framing::None {
            body.finish();
        }
        body
    }

    /// Whether it still holds its permit (the upstream has not delivered
    /// its last byte).
    pub fn holds_permit(&self) -> bool {
        self.permit.is_some()
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
    fn fail(&mut self) {
        self.done = true;
        self.conn = None;
        self.permit = None;
    }

    /// The next piece of data; `None` at the end; `Err` if the upstream
    /// broke it off, framed it wrongly or stalled past the idle timeout.
    pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, ()>> {
        loop {
            if self.done {
                return Poll::Ready(Ok(None));
            }
            let Some(conn) = self.conn.as_mut() else { return Poll::Ready(Err(())) };
            if !conn.buf.is_empty() {
                let Ok(step) = self.decoder.decode(&conn.buf) else {
                    self.fail();
                    return Poll::Ready(Err(()));
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
                        if self.decoder.eof().is_ok() {
                            self.closes = true;
                            self.finish();
                            return Poll::Ready(Ok(None));
                        }
                        self.fail();
                        return Poll::Ready(Err(()));
                    }
                    Ok(_) => self.armed = false,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(_) => {
                        self.fail();
                        return Poll::Ready(Err(()));
                    }
                },
                Poll::Ready(Err(_)) => {
                    self.fail();
                    return Poll::Ready(Err(()));
                }
                Poll::Pending => {
                    let idle = self.idle;
                    let timer = self.timer.get_or_insert_with(|| Box::pin(sleep(idle)));
                    if !self.armed {
                        timer.as_mut().reset(tokio::time::Instant::now() + idle);
                        self.armed = true;
                    }
                    if timer.as_mut().poll(cx).is_ready() {
                        self.fail();
                        return Poll::Ready(Err(()));
                    }
                    return Poll::Pending;
                }
            }
        }
    }

    pub async fn next(&mut self) -> Result<Option<Bytes>, ()> {
        std::future::poll_fn(|cx| self.poll_next(cx)).await
    }

    /// Reads the body ahead of the client if it ends within `limit` bytes
    /// and the budget (`Ahead::Whole`: the permit is back); otherwise what
    /// was read, to send before the rest.
    pub async fn read_ahead(&mut self, limit: u64, budget: &Arc<Budget>, memory: u64) -> Result<Ahead, ()> {
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

    /// Stops the background read for a body the client is done with
    /// because it failed: its connection closes with it.
    pub fn close(mut self) {
        self.drain = false;
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
        if self.done || !self.drain {
            return;
        }
        let Some(conn) = self.conn.take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let mut rest = Self {
            conn: Some(conn),
            decoder: self.decoder.clone(),
            pool: self.pool.clone(),
            closes: self.closes,
            idle: self.idle,
            timer: None,
            armed: false,
            permit: self.permit.take(),
            done: false,
            drain: false,
        };
        runtime.spawn(async move {
            let mut read = 0u64;
            while let Ok(Some(data)) = rest.next().await {
                read += data.len() as u64;
                if read > ORPHAN_BODY_BYTES {
                    // Too much to read for nothing: the connection closes,
                    // which ends the upstream's work on it.
                    break;
                }
            }
            rest.pool.shared().orphans_finished.fetch_add(1, Ordering::Relaxed);
        });
    }
}
