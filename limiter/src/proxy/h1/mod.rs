//! limiter's HTTP/1.x server: one engine for HTTP/1.0 and 1.1, cleartext
//! and TLS. Each head is parsed once ([`framing`]), becomes a [`Request`]
//! and goes through the pipeline's phases; its body is read strictly as the
//! client frames it ([`RequestBody`]), and the response goes out with
//! framing of limiter's own ([`response`]): a length, or limiter's chunks
//! (to an HTTP/1.0 client, a body of unknown length ends with the
//! connection).
//!
//! What the engine answers itself, before a head becomes a request: 400 for
//! a head it cannot read or whose framing two readers could read
//! differently (a coding that does not end in `chunked` among them), 501
//! for codings before a final `chunked` (`gzip, chunked`), 431 for a head
//! past `http.maxHeaderBytes`, 405 for `CONNECT`; nothing (a 408 in the
//! access log) for a head not whole within `http.headerReadTimeoutMs`.
//! Each of those writes an access-log line too. `Expect: 100-continue` is
//! answered by limiter when it reads the body (a request refused at its head
//! gets its 503 without it, so the client never sends the body). An
//! upgrade the upstream accepts (WebSocket) joins the two connections byte
//! for byte ([`tunnel`]). Pipelined requests are served in order; a
//! request whose body was not read ends its connection with a lingering
//! close ([`super::io`]: what still comes is read and dropped, up to 64 MiB
//! and `http.lingerMs`).

pub mod framing;
mod request_body;
mod response;
mod tunnel;

use std::{
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use bytes::{Buf as _, BytesMut};
use hyper::Method;
use tokio::{
    io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _},
    sync::watch,
};

use self::{
    framing::{self as http1, HeadError, body::Decoder},
    request_body::RequestBody,
    response::Response,
};
use super::{
    Proxy, Tuning,
    answer::Answer,
    deadline::Deadline,
    io::ClientIo,
    pipeline::{self, Admitted, Ctx, Logged, Outcome, Reply},
    request::{
        BodyLen, Request, Upstreamed,
        headers::{Client, Forwarding},
    },
    upstream::{BodySource as _, Pool},
};

/// What one connection is served with.
pub struct Session<'a> {
    pub proxy: &'a Arc<Proxy>,
    pub pool: &'a Arc<Pool>,
    pub client: Client,
    pub fwd: &'a Forwarding,
    pub shutdown: watch::Receiver<bool>,
}

/// The first read buffer of a connection (grown, up to
/// `http.maxHeaderBytes`, for a larger head).
const READ_BUF: usize = 4096;

/// How long a drain waits for the first request of a connection that has
/// sent none yet.
const FIRST_REQUEST_GRACE: Duration = Duration::from_secs(1);

/// Serves one HTTP/1.x client connection until it closes or times out.
pub async fn serve<S>(mut io: ClientIo<S>, c: Session<'_>)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut buf = BytesMut::with_capacity(READ_BUF);
    let mut served = 0u64;
    let mut head_deadline = Deadline::default();
    loop {
        let tuning = c.proxy.tuning();
        io.set_between_requests(buf.is_empty());
        let req = match read_head(&mut io, &mut buf, &c, &tuning, served == 0, &mut head_deadline).await {
            Ok(req) => req,
            Err(NoHead::Closed) => return,
            Err(NoHead::Timeout) => {
                c.proxy.counters.header_timeouts.fetch_add(1, Ordering::Relaxed);
                // A keep-alive connection idling past the timeout between
                // requests is no request refused: only a head begun and not
                // finished is (408, as nginx logs its client_header_timeout;
                // nothing is sent).
                if !buf.is_empty() {
                    let seen = http1::request_line(&buf);
                    Logged::refused(c.proxy, c.client, seen, 408, "header_timeout");
                }
                return;
            }
        };
        served += 1;
        match exchange(&mut io, &mut buf, &c, &tuning, req).await {
            Next::KeepAlive => {
                if buf.is_empty() && buf.capacity() > READ_BUF * 4 {
                    // A body was held here: an idle connection keeps no
                    // more than a head's worth.
                    buf = BytesMut::with_capacity(READ_BUF);
                }
            }
            Next::Close { between } => {
                io.set_between_requests(between && whole_requests(&buf));
                let _ = io.shutdown().await;
                return;
            }
            Next::Gone => return,
        }
    }
}

/// Whether what is left of the client's bytes is whole requests (none
/// begun and not finished): a close then has nothing to linger for.
fn whole_requests(mut buf: &[u8]) -> bool {
    loop {
        buf = &buf[http1::empty_lines(buf)..];
        if buf.is_empty() {
            return true;
        }
        let Ok(Some(head)) = http1::parse_request(buf) else { return false };
        buf = &buf[head.len..];
        let mut body = Decoder::new(head.framing);
        while !body.is_done() {
            match body.decode(buf) {
                Ok(step) if step.used > 0 => buf = &buf[step.used..],
                _ => return false,
            }
        }
    }
}

/// Why no request came.
enum NoHead {
    Closed,
    /// No whole head within `http.headerReadTimeoutMs` (the buffer holds
    /// what came of one, if anything).
    Timeout,
}

/// Reads the next request head; a head refused as it is read is answered
/// (and logged) here, and the connection closes. On a drain an idle
/// connection closes (one that has not sent its first request yet gets a
/// moment for it).
async fn read_head<S>(
    io: &mut ClientIo<S>,
    buf: &mut BytesMut,
    c: &Session<'_>,
    tuning: &Tuning,
    first: bool,
    timer: &mut Deadline,
) -> Result<Request, NoHead>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let deadline = tokio::time::Instant::now() + tuning.header_read_timeout;
    let mut shutdown = c.shutdown.clone();
    let mut draining = *shutdown.borrow_and_update();
    let mut grace = None;
    loop {
        if !buf.is_empty() {
            buf.advance(http1::empty_lines(buf));
            let parsed = match http1::parse_request(buf) {
                Ok(Some(head)) if head.len > tuning.max_header_bytes => Err(HeadError::TooLarge),
                Ok(None) if buf.len() >= tuning.max_header_bytes => Err(HeadError::TooLarge),
                other => other,
            };
            match parsed {
                Ok(Some(head)) => {
                    let bytes = buf.split_to(head.len).freeze();
                    let (method, target) = (head.method, head.target);
                    match Request::from_h1(bytes.clone(), head) {
                        Ok(req) => return Ok(req),
                        Err(refused) => {
                            let answer = Answer::refused_request(c.proxy, refused);
                            refuse(io, c, answer, (method.get(&bytes), target.get(&bytes))).await;
                            return Err(NoHead::Closed);
                        }
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    let seen = http1::request_line(buf);
                    refuse(io, c, Answer::head_error(c.proxy, e), seen).await;
                    return Err(NoHead::Closed);
                }
            }
        }
        if draining && buf.is_empty() {
            match grace {
                None if first => grace = Some(tokio::time::Instant::now() + FIRST_REQUEST_GRACE),
                None => return Err(NoHead::Closed),
                Some(_) => {}
            }
        }
        if buf.capacity() - buf.len() < 1024 {
            buf.reserve(buf.capacity().max(READ_BUF));
        }
        let until = grace.map_or(deadline, |g| g.min(deadline));
        let read = tokio::select! {
            read = timer.within(until, io.read_buf(buf)) => read,
            _ = shutdown.changed(), if !draining => {
                draining = true;
                continue;
            }
        };
        match read {
            // Closed mid-head: nothing to answer.
            Ok(Ok(0) | Err(_)) => return Err(NoHead::Closed),
            Ok(Ok(_)) => {}
            Err(_) if grace.is_some_and(|g| tokio::time::Instant::now() >= g) => return Err(NoHead::Closed),
            Err(_) => return Err(NoHead::Timeout),
        }
    }
}

/// Answers a head refused before it became a request, logs it (`method`
/// and `path` as far as they were read) and closes the connection.
async fn refuse<S>(io: &mut ClientIo<S>, c: &Session<'_>, answer: Answer, seen: (&[u8], &[u8]))
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let proxy = c.proxy;
    proxy.counters.requests_by_proto[c.client.proto.index()].fetch_add(1, Ordering::Relaxed);
    let why = answer.why.unwrap_or("-");
    tracing::debug!(peer = %c.client.addr, reason = why, "request head refused");
    let mut out = Vec::with_capacity(256);
    answer.write_h1(&mut out, false);
    let _ = io.write_all(&out).await;
    Logged::refused(proxy, c.client, seen, answer.status.as_u16(), why);
    io.set_between_requests(false);
    let _ = io.shutdown().await;
}

/// What the connection does after an exchange.
enum Next {
    KeepAlive,
    /// Close after what was written (a lingering close; `between`: the
    /// request was read whole, so nothing lingers unless more came).
    Close {
        between: bool,
    },
    /// The client is gone, or its connection failed.
    Gone,
}

/// One request and its response.
async fn exchange<S>(
    io: &mut ClientIo<S>,
    buf: &mut BytesMut,
    c: &Session<'_>,
    tuning: &Arc<Tuning>,
    req: Request,
) -> Next
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let proxy = c.proxy;
    let started = Instant::now();
    proxy.counters.requests_by_proto[c.client.proto.index()].fetch_add(1, Ordering::Relaxed);
    let id = req.id(c.client.trusted);
    let ctx = Ctx { proxy, tuning, client: c.client, started, id: &id };
    let log = Logged::start(proxy, &req, started, &id);
    let to_head = req.method == Method::HEAD;
    // A request without a body was read whole with its head.
    let no_body = req.body == BodyLen::None;
    let early = |answer, read, bytes_in| Early { answer, to_head, read, bytes_in };
    let class = match pipeline::request_filter(ctx, &req) {
        Ok(class) => class,
        Err(a) => return own(io, c, early(a, no_body, 0), log).await,
    };
    if let Err(a) = pipeline::admit_at_head(ctx, &req, class) {
        return own(io, c, early(a, no_body, 0), log).await;
    }
    let mut body = RequestBody::new(io, buf, &req);
    let received = match pipeline::receive(ctx, &req, &mut body).await {
        Ok(received) => received,
        Err(a) => {
            let early = early(a, body.read_whole(), body.received());
            return own(io, c, early, log).await;
        }
    };
    let (ticket, permit) = match pipeline::admit(ctx, &req, class).await {
        Ok(admitted) => admitted,
        Err(a) => {
            let early = early(a, body.read_whole(), body.received());
            return own(io, c, early, log).await;
        }
    };
    let upgrade = req.is_upgrade();
    let framing = pipeline::outgoing(&req, &received);
    let mut head = Vec::with_capacity(512);
    let upstreamed = Upstreamed {
        fwd: c.fwd,
        upstream: proxy.upstream(),
        body: framing,
        upgrade,
        id: &id,
        underscores: tuning.underscores_in_headers,
    };
    let dropped = req.write_upstream(&mut head, &upstreamed);
    if dropped > 0 {
        proxy.counters.underscore_fields_dropped.fetch_add(u64::from(dropped), Ordering::Relaxed);
    }
    let admitted = Admitted {
        proxy,
        tuning,
        pool: c.pool,
        peer: c.client.addr,
        head,
        method: req.method.clone(),
        upgrade,
        received,
        framing,
        ticket,
        permit,
        started,
        id: id.clone(),
    };
    let reply = pipeline::forward(admitted, &mut body).await;
    let (read_whole, bytes_in) = (body.read_whole(), body.received());
    let (next, out) = match reply {
        Reply::Own(answer) => return own(io, c, early(answer, read_whole, bytes_in), log).await,
        Reply::Upgraded { head, head_bytes, conn, slot } => {
            let (up, down) =
                tunnel::join(io, buf, &head, &head_bytes, conn, tuning.tunnel_idle_timeout).await;
            // The tunnel's place goes back as it closes.
            drop(slot);
            let out = Outcome {
                status: 101,
                reason: None,
                upstream: None,
                bytes_in: bytes_in + up,
                bytes_out: down,
            };
            (Next::Gone, out)
        }
        Reply::Upstream { head, head_bytes, body, took } => {
            let mut out = Outcome::upstream(head.status, took, bytes_in);
            let close = upgrade || !req.keep_alive || !read_whole || *c.shutdown.borrow();
            let r = Response { head: &head, bytes: &head_bytes, body, close, req: &req };
            let next = match response::send(io, proxy, r, &mut out.bytes_out).await {
                Ok(true) => Next::Close { between: read_whole },
                Ok(false) => Next::KeepAlive,
                Err(error) => {
                    proxy.counters.note(&error, c.client.addr, &id);
                    out = out.broke(error.kind());
                    Next::Gone
                }
            };
            (next, out)
        }
    };
    if let Some(log) = log {
        log.done(proxy, c.client, out);
    }
    next
}

/// An answer of limiter's own, whether the request's body was read to its
/// end, and how much of it came.
struct Early {
    answer: super::answer::Answer,
    to_head: bool,
    read: bool,
    bytes_in: u64,
}

/// Writes an answer of limiter's own and logs it; the connection closes.
async fn own<S>(io: &mut ClientIo<S>, c: &Session<'_>, early: Early, log: Option<Logged>) -> Next
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut bytes = Vec::with_capacity(512);
    let body_bytes = early.answer.write_h1(&mut bytes, early.to_head);
    early.answer.sent(c.proxy);
    let written = io.write_all(&bytes).await;
    if let Some(log) = log {
        let sent = if written.is_ok() { body_bytes } else { 0 };
        log.done(c.proxy, c.client, Outcome::own(&early.answer, early.bytes_in, sent));
    }
    match written {
        Err(_) => Next::Gone,
        // A body left unread may still be coming: the close lingers.
        Ok(()) => Next::Close { between: early.read },
    }
}
#[cfg(test)]
mod tests;
