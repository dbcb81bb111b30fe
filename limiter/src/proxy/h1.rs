//! limiter's HTTP/1.x server: one engine for HTTP/1.0 and 1.1, cleartext
//! and TLS. Each head is parsed once ([`super::http1`]), becomes a
//! [`Request`] and goes through the pipeline's phases; its body is read
//! strictly as the client frames it ([`H1Body`]), and the response goes
//! out with framing of limiter's own: a length, or limiter's chunks (to an
//! HTTP/1.0 client, a body of unknown length ends with the connection).
//!
//! What the engine answers itself: 400 for a head it cannot read or that
//! a check refuses, 431 for one past `http.maxHeaderBytes`, 501 for a
//! transfer coding other than `chunked`, 405 for `CONNECT`, nothing (a
//! 408 in the access log) for a head not whole within
//! `http.headerReadTimeoutMs`. `Expect: 100-continue` is answered by limiter
//! when it reads the body (a request refused at its head gets its 503
//! without it, so the client never sends the body). An upgrade the
//! upstream accepts (WebSocket) joins the two connections byte for byte.
//! Pipelined requests are served in order; a request whose body was not
//! read ends its connection with a lingering close.

use std::{
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use bytes::{Buf as _, Bytes, BytesMut};
use hyper::{Method, StatusCode};
use tokio::{
    io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _},
    sync::watch,
};

use super::{
    Proxy, Tuning,
    answer::Answer,
    head::Bad,
    headers::{Client, Forwarding, Seen, connection_named, is_hop_by_hop},
    http1::{
        self, Framing, HeadError, ResponseHead,
        body::{Decoder, Encoder},
    },
    io::ClientIo,
    pipeline::{self, Admitted, Body, CLIENT_GONE, Ctx, Logged, Outcome, Reply},
    pressure::{PATIENCE, Pressure},
    request::{BodyLen, Refused, Request, Upstreamed, Version},
    upstream::{BodySource, Pool, ResponseBody},
};

/// What one connection is served with.
pub struct Conn<'a> {
    pub proxy: &'a Arc<Proxy>,
    pub pool: &'a Arc<Pool>,
    pub client: Client,
    pub fwd: &'a Forwarding,
    pub shutdown: watch::Receiver<bool>,
}

/// How a connection ended.
pub enum Ended {
    /// Closed (by either side, or after a response that closes it).
    Closed,
    /// No whole head within `http.headerReadTimeoutMs`; `mid_head`: some
    /// of one had come.
    HeadTimeout { mid_head: bool },
}

/// The first read buffer of a connection (grown, up to
/// `http.maxHeaderBytes`, for a larger head).
const READ_BUF: usize = 4096;

/// How long a drain waits for the first request of a connection that has
/// sent none yet.
const FIRST_REQUEST_GRACE: Duration = Duration::from_secs(1);

/// Serves one HTTP/1.x client connection until it closes or times out.
pub async fn serve<S>(mut io: ClientIo<S>, c: Conn<'_>) -> Ended
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut buf = BytesMut::with_capacity(READ_BUF);
    let mut served = 0u64;
    loop {
        let tuning = c.proxy.tuning();
        io.set_between_requests(buf.is_empty());
        let req = match read_head(&mut io, &mut buf, &c, &tuning, served == 0).await {
            Ok(req) => req,
            Err(NoHead::Closed) => return Ended::Closed,
            Err(NoHead::Timeout { mid_head }) => return Ended::HeadTimeout { mid_head },
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
                return Ended::Closed;
            }
            Next::Gone => return Ended::Closed,
        }
    }
}

/// Whether what is left of the client's bytes is whole requests (none
/// begun and not finished): a close then has nothing to linger for.
fn whole_requests(mut buf: &[u8]) -> bool {
    loop {
        while buf.first() == Some(&b'\n') || buf.starts_with(b"\r\n") {
            buf = &buf[if buf[0] == b'\n' { 1 } else { 2 }..];
        }
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
    Timeout { mid_head: bool },
}

/// Reads the next request head; a head refused as it is read is answered
/// here (and the connection closes). On a drain an idle connection closes
/// (one that has not sent its first request yet gets a moment for it).
async fn read_head<S>(
    io: &mut ClientIo<S>,
    buf: &mut BytesMut,
    c: &Conn<'_>,
    tuning: &Tuning,
    first: bool,
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
            // Empty lines before a request line are skipped (RFC 9112 §2.2).
            while buf.first() == Some(&b'\n') || buf.starts_with(b"\r\n") {
                buf.advance(if buf[0] == b'\n' { 1 } else { 2 });
            }
            let parsed = match http1::parse_request(buf) {
                Ok(Some(head)) if head.len > tuning.max_header_bytes => Err(HeadError::TooLarge),
                Ok(None) if buf.len() >= tuning.max_header_bytes => Err(HeadError::TooLarge),
                other => other,
            };
            match parsed {
                Ok(Some(head)) => {
                    let bytes = buf.split_to(head.len).freeze();
                    match Request::from_h1(bytes, head) {
                        Ok(req) => return Ok(req),
                        Err(refused) => {
                            refuse_request(io, c, refused).await;
                            return Err(NoHead::Closed);
                        }
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    refuse_head(io, c, e).await;
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
            read = tokio::time::timeout_at(until, io.read_buf(buf)) => read,
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
            Err(_) => return Err(NoHead::Timeout { mid_head: !buf.is_empty() }),
        }
    }
}

/// Answers a head that cannot be read as a request, and logs it (its
/// method and path are `-`).
async fn refuse_head<S>(io: &mut ClientIo<S>, c: &Conn<'_>, e: HeadError)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let proxy = c.proxy;
    let counters = &proxy.counters;
    counters.requests_by_proto[c.client.proto.index()].fetch_add(1, Ordering::Relaxed);
    let (answer, reason) = match e {
        HeadError::Malformed => {
            counters.malformed.fetch_add(1, Ordering::Relaxed);
            (
                Answer::own(proxy, StatusCode::BAD_REQUEST, "400 Bad Request: malformed request head\n"),
                "malformed",
            )
        }
        HeadError::FramingConflict => {
            counters.framing_conflicts.fetch_add(1, Ordering::Relaxed);
            let text = "400 Bad Request: the request's length is ambiguous (Content-Length with Transfer-Encoding, lengths that differ, or a coding not ending in chunked)\n";
            (Answer::own(proxy, StatusCode::BAD_REQUEST, text), "malformed")
        }
        HeadError::TooLarge => {
            counters.heads_too_large.fetch_add(1, Ordering::Relaxed);
            let text = "431 Request Header Fields Too Large\n";
            (Answer::own(proxy, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, text), "too_large")
        }
        HeadError::TransferEncoding => (Answer::bad(proxy, Bad::TransferEncoding), "malformed"),
    };
    tracing::debug!(peer = %c.client.addr, reason, "request head refused");
    let mut out = Vec::with_capacity(256);
    answer.write_h1(&mut out, false);
    let _ = io.write_all(&out).await;
    Logged::refused_head(proxy, c.client, answer.status.as_u16(), reason);
    io.set_between_requests(false);
    let _ = io.shutdown().await;
}

/// Answers a head the request checks refused as it became a request.
async fn refuse_request<S>(io: &mut ClientIo<S>, c: &Conn<'_>, refused: Refused)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let proxy = c.proxy;
    proxy.counters.requests_by_proto[c.client.proto.index()].fetch_add(1, Ordering::Relaxed);
    let answer = match refused {
        Refused::Connect => Answer::connect(proxy),
        Refused::Bad(bad) => Answer::bad(proxy, bad),
    };
    let mut out = Vec::with_capacity(256);
    answer.write_h1(&mut out, false);
    let _ = io.write_all(&out).await;
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
    c: &Conn<'_>,
    tuning: &Arc<Tuning>,
    req: Request,
) -> Next
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let proxy = c.proxy;
    let started = Instant::now();
    proxy.counters.requests_by_proto[c.client.proto.index()].fetch_add(1, Ordering::Relaxed);
    let ctx = Ctx { proxy, tuning, client: c.client, started };
    let id = req.id(c.client.trusted);
    let log = Logged::start(proxy, &req, started, &id);
    let to_head = req.method == Method::HEAD;
    // A request without a body was read whole with its head.
    let no_body = req.body == BodyLen::None;
    let early = |a| Early { answer: a, to_head, read: no_body };
    let class = match pipeline::request_filter(ctx, &req) {
        Ok(class) => class,
        Err(a) => return own(io, c, early(a), log).await,
    };
    if let Err(a) = pipeline::admit_at_head(ctx, &req, class) {
        return own(io, c, early(a), log).await;
    }
    let mut body = H1Body::new(io, buf, &req);
    let received = match pipeline::receive(ctx, &req, &mut body).await {
        Ok(received) => received,
        Err(a) => {
            let read = body.read_whole();
            return own(io, c, Early { read, ..early(a) }, log).await;
        }
    };
    let (ticket, permit) = match pipeline::admit(ctx, &req, class).await {
        Ok(admitted) => admitted,
        Err(a) => {
            let read = body.read_whole();
            return own(io, c, Early { read, ..early(a) }, log).await;
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
        head,
        method: req.method.clone(),
        upgrade,
        received,
        framing,
        ticket,
        permit,
        started,
        id,
    };
    let mut bytes_in = 0;
    let reply = pipeline::forward(admitted, &mut body, &mut bytes_in).await;
    let read_whole = body.read_whole();
    let mut out = Outcome { status: 0, reason: None, upstream: None, bytes_in, bytes_out: 0 };
    let next = match reply {
        Reply::Own(answer) => {
            let early = Early { answer, to_head, read: read_whole };
            let next = write_own(io, c, early, &mut out).await;
            if let Some(log) = log {
                log.done(proxy, c.client, out);
            }
            return next;
        }
        Reply::Upgraded { head, head_bytes, conn, slot } => {
            out.status = 101;
            let (up, down) = tunnel(io, buf, &head, &head_bytes, conn).await;
            // The tunnel's place goes back as it closes.
            drop(slot);
            out.bytes_in += up;
            out.bytes_out = down;
            Next::Gone
        }
        Reply::Upstream { head, head_bytes, body, took } => {
            out.upstream = Some(took);
            out.status = head.status;
            let close = upgrade || !req.keep_alive || !read_whole || *c.shutdown.borrow();
            let sent =
                send(io, c, Response { head: &head, bytes: &head_bytes, body, close, req: &req }, &mut out)
                    .await;
            match sent {
                Err(()) => Next::Gone,
                Ok(true) => Next::Close { between: read_whole },
                Ok(false) => Next::KeepAlive,
            }
        }
    };
    if let Some(log) = log {
        if matches!(next, Next::Gone) && out.bytes_out == 0 && out.status != 101 {
            out.status = CLIENT_GONE;
        }
        log.done(proxy, c.client, out);
    }
    next
}

/// An answer of limiter's own, and whether the request's body was read to
/// its end.
struct Early {
    answer: Answer,
    to_head: bool,
    read: bool,
}

/// Writes an answer of limiter's own and logs it; the connection closes.
async fn own<S>(io: &mut ClientIo<S>, c: &Conn<'_>, early: Early, log: Option<Logged>) -> Next
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut out = Outcome { status: 0, reason: None, upstream: None, bytes_in: 0, bytes_out: 0 };
    let next = write_own(io, c, early, &mut out).await;
    if let Some(log) = log {
        log.done(c.proxy, c.client, out);
    }
    next
}

async fn write_own<S>(io: &mut ClientIo<S>, c: &Conn<'_>, early: Early, out: &mut Outcome) -> Next
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut bytes = Vec::with_capacity(512);
    out.bytes_out = early.answer.write_h1(&mut bytes, early.to_head);
    out.status = early.answer.status.as_u16();
    out.reason = early.answer.reason();
    early.answer.sent(c.proxy);
    match io.write_all(&bytes).await {
        Err(_) => Next::Gone,
        // A body left unread may still be coming: the close lingers.
        Ok(()) => Next::Close { between: early.read },
    }
}

/// A request body as the client frames it, read from the connection: the
/// pipeline's [`BodySource`] on HTTP/1.
pub struct H1Body<'a, S> {
    io: &'a mut ClientIo<S>,
    buf: &'a mut BytesMut,
    decoder: Decoder,
    /// `100 Continue` is owed before the first read.
    expect: bool,
    done: bool,
}

impl<'a, S> H1Body<'a, S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    fn new(io: &'a mut ClientIo<S>, buf: &'a mut BytesMut, req: &Request) -> Self {
        let framing = match req.body {
            BodyLen::None => Framing::None,
            BodyLen::Length(n) => Framing::Length(n),
            BodyLen::Chunked | BodyLen::Unknown => Framing::Chunked,
        };
        let decoder = Decoder::new(framing);
        let done = decoder.is_done();
        Self { io, buf, decoder, expect: req.expect_continue && !done, done }
    }

    /// The body was read to its end.
    fn read_whole(&self) -> bool {
        self.done
    }
}

impl<S> BodySource for H1Body<'_, S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    async fn next(&mut self) -> Result<Option<Bytes>, ()> {
        loop {
            if self.done {
                return Ok(None);
            }
            if !self.buf.is_empty() {
                let step = self.decoder.decode(self.buf).map_err(|e| tracing::debug!("request body: {e}"))?;
                self.done = step.end;
                if !step.data.is_empty() {
                    self.buf.advance(step.data.start);
                    return Ok(Some(self.buf.split_to(step.data.len()).freeze()));
                }
                self.buf.advance(step.used);
                if self.done || step.used > 0 {
                    continue;
                }
            }
            if self.expect {
                self.expect = false;
                self.io.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await.map_err(drop)?;
            }
            if self.buf.capacity() - self.buf.len() < 4096 {
                self.buf.reserve(16 * 1024);
            }
            match self.io.read_buf(self.buf).await {
                Ok(0) | Err(_) => return Err(()),
                Ok(_) => {}
            }
        }
    }
}

impl<T: BodySource> BodySource for &mut T {
    async fn next(&mut self) -> Result<Option<Bytes>, ()> {
        (**self).next().await
    }
}

/// An upstream response on its way to an HTTP/1 client.
struct Response<'a> {
    head: &'a ResponseHead,
    bytes: &'a [u8],
    body: Body,
    /// The connection closes after it.
    close: bool,
    req: &'a Request,
}

/// How a body goes to the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ToClient {
    /// Nothing (a `HEAD`, a 204, a 304, an empty body): the upstream's
    /// `Content-Length`, if it gave one, says what a `GET` would have had.
    Empty,
    Length(u64),
    Chunked,
    /// Until the connection closes (an HTTP/1.0 client, a length unknown).
    Close,
}

/// A body read ahead up to this size goes out in the same write as its
/// head (a copy is cheaper than a second system call).
const ONE_WRITE: usize = 16 * 1024;

/// Sends an upstream response: `Ok(true)` if the connection closes after
/// it, `Err` if the client went away (a body still streaming is then read
/// to its end in the background, holding its permit).
async fn send<S>(io: &mut ClientIo<S>, c: &Conn<'_>, r: Response<'_>, out: &mut Outcome) -> Result<bool, ()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let http10 = r.req.version == Version::Http10;
    let (to, stream) = match r.body {
        Body::Whole(bytes) if r.head.framing == Framing::None => (ToClient::Empty, Err(bytes)),
        Body::Whole(bytes) => (ToClient::Length(bytes.len() as u64), Err(bytes)),
        Body::Stream { first, rest } => {
            let to = match rest.remaining() {
                Some(n) => ToClient::Length(first.len() as u64 + n),
                None if http10 => ToClient::Close,
                None => ToClient::Chunked,
            };
            (to, Ok((first, rest)))
        }
    };
    let close = r.close || to == ToClient::Close;
    let mut client_head = Vec::with_capacity(r.head.len + 128);
    write_head(&mut client_head, r.head, r.bytes, to, close, http10);
    let whole = match stream {
        Err(whole) => whole,
        Ok((first, rest)) => {
            stream_body(io, c, client_head, first, rest, to, out).await?;
            return Ok(close);
        }
    };
    out.bytes_out = whole.len() as u64;
    let written = if whole.len() <= ONE_WRITE {
        client_head.extend_from_slice(&whole);
        io.write_all(&client_head).await
    } else {
        io.write_all_buf(&mut bytes::Buf::chain(&client_head[..], &whole[..])).await
    };
    written.map_err(drop)?;
    Ok(close)
}

/// Streams a body, holding its permit until the upstream has delivered
/// its last byte; under pressure, a client that leaves a chunk untaken
/// for [`PATIENCE`] is cut. A client that left has the rest followed to
/// the upstream's end ([`super::upstream::abandon`]); one limiter cut has
/// its upstream connection closed with it, which ends a writing upstream's
/// work at its next write (a cut frees the pool it was cut for).
async fn stream_body<S>(
    io: &mut ClientIo<S>,
    c: &Conn<'_>,
    mut pending: Vec<u8>,
    first: Bytes,
    mut rest: Box<ResponseBody>,
    to: ToClient,
    out: &mut Outcome,
) -> Result<(), ()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let pressure = &c.proxy.pressure;
    let mut encoder = match to {
        ToClient::Chunked => Encoder::Chunked,
        ToClient::Length(n) => Encoder::Length(n),
        ToClient::Empty | ToClient::Close => Encoder::Close,
    };
    let cut = |rest: &mut ResponseBody, gone: Gone| {
        if gone == Gone::Cut {
            rest.close();
        }
    };
    let mut data = first;
    loop {
        out.bytes_out += data.len() as u64;
        // The upstream's framing said how long: a body that runs past it
        // cannot be sent as the head said.
        encoder.data(&mut pending, &data).map_err(drop)?;
        if !pending.is_empty() {
            guarded_write(io, &pending, pressure, c.proxy).await.map_err(|g| cut(&mut rest, g))?;
            pending.clear();
        }
        data = match rest.next().await {
            Ok(Some(data)) => data,
            Ok(None) => break,
            // The upstream broke it off: the client's response cannot be
            // finished, so its connection is cut.
            Err(()) => return Err(()),
        };
    }
    encoder.finish(&mut pending).map_err(drop)?;
    if !pending.is_empty() {
        guarded_write(io, &pending, pressure, c.proxy).await.map_err(|g| cut(&mut rest, g))?;
    }
    Ok(())
}

/// Writes an upstream response head for the client: the status line, the
/// upstream's fields less the hop-by-hop ones and its framing, a `date`
/// when it sent none, then limiter's framing and `connection` lines.
fn write_head(out: &mut Vec<u8>, head: &ResponseHead, bytes: &[u8], to: ToClient, close: bool, http10: bool) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(itoa::Buffer::new().format(head.status).as_bytes());
    out.push(b' ');
    let reason = head.reason.get(bytes);
    if reason.is_empty() {
        let canonical = StatusCode::from_u16(head.status).ok().and_then(|s| s.canonical_reason());
        // A status http does not know keeps an empty reason (RFC 9112 §4).
        out.extend_from_slice(canonical.unwrap_or("").as_bytes());
    } else {
        out.extend_from_slice(reason);
    }
    out.extend_from_slice(b"\r\n");
    let seen = Seen::of_names(head.fields.iter().map(|f| f.name.get(bytes)));
    let named: Vec<&[u8]> = if seen.connection() {
        connection_named(
            head.fields
                .iter()
                .filter(|f| f.name.get(bytes).eq_ignore_ascii_case(b"connection"))
                .map(|f| f.value.get(bytes)),
        )
        .collect()
    } else {
        Vec::new()
    };
    let mut dated = false;
    for f in &head.fields {
        let (name, value) = (f.name.get(bytes), f.value.get(bytes));
        if (seen.any_hop_by_hop() && is_hop_by_hop(name, &named))
            || name.eq_ignore_ascii_case(b"content-length")
        {
            continue;
        }
        dated |= name.eq_ignore_ascii_case(b"date");
        out.extend_from_slice(name);
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    if !dated {
        http1::date_line(out);
    }
    match to {
        ToClient::Empty => {
            if head.status != 204
                && let Some(n) = head.length
            {
                length_line(out, n);
            }
        }
        ToClient::Length(n) => length_line(out, n),
        ToClient::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        ToClient::Close => {}
    }
    if head.status == 101 {
        if let Some(upgrade) = head.fields.iter().find(|f| f.name.get(bytes).eq_ignore_ascii_case(b"upgrade"))
        {
            out.extend_from_slice(b"upgrade: ");
            out.extend_from_slice(upgrade.value.get(bytes));
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"connection: upgrade\r\n");
    } else if close {
        out.extend_from_slice(b"connection: close\r\n");
    } else if http10 {
        out.extend_from_slice(b"connection: keep-alive\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

fn length_line(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(b"content-length: ");
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// An upgrade the upstream accepted: its `101` goes to the client, then the
/// two connections are joined byte for byte (what either side sent past
/// the heads goes first) until one closes: nothing either side sends is
/// read as HTTP any more. The tunnel no longer counts under the upstream
/// connections' cap. Returns the bytes that went up (client to upstream)
/// and down, past the heads.
async fn tunnel<S>(
    io: &mut ClientIo<S>,
    buf: &mut BytesMut,
    head: &ResponseHead,
    bytes: &[u8],
    conn: super::upstream::Conn,
) -> (u64, u64)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut out = Vec::with_capacity(head.len + 64);
    write_head(&mut out, head, bytes, ToClient::Empty, false, false);
    let (mut upstream, early) = conn.into_tunnel();
    let (mut up, down) = (0, early.len() as u64);
    out.extend_from_slice(&early);
    if io.write_all(&out).await.is_err() {
        return (up, 0);
    }
    if !buf.is_empty() {
        if upstream.write_all(buf).await.is_err() {
            return (up, down);
        }
        up += buf.len() as u64;
    }
    buf.clear();
    let (mut client, mut upstream) = (Counted::new(io), Counted::new(&mut upstream));
    // Either side closing or failing ends the tunnel; what moved is counted
    // either way.
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
    (up + client.read, down + upstream.read)
}

/// A stream that counts the bytes read from it (a tunnel's traffic each
/// way, also when it ends in an error).
struct Counted<'a, S> {
    inner: &'a mut S,
    read: u64,
}

impl<'a, S> Counted<'a, S> {
    fn new(inner: &'a mut S) -> Self {
        Self { inner, read: 0 }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<'_, S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut *self.inner).poll_read(cx, buf);
        self.read += (buf.filled().len() - before) as u64;
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<'_, S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bytes: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut *self.inner).poll_write(cx, bytes)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut *self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut *self.inner).poll_shutdown(cx)
    }
}

/// Writes to the client; under pressure, one that leaves the bytes
/// untaken for [`PATIENCE`] is cut.
async fn guarded_write<S>(
    io: &mut ClientIo<S>,
    bytes: &[u8],
    pressure: &Pressure,
    proxy: &Proxy,
) -> Result<(), Gone>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let since = tokio::time::Instant::now();
    tokio::select! {
        written = io.write_all(bytes) => written.map_err(|e| {
            // Timed out: limiter cut a client too slow to read (its
            // minimum rate, or its idle timeout); else the client went.
            if e.kind() == std::io::ErrorKind::TimedOut { Gone::Cut } else { Gone::Left }
        }),
        () = patience_lost(pressure, since) => {
            proxy.counters.slow_readers.fetch_add(1, Ordering::Relaxed);
            tracing::debug!("HTTP/1 response left untaken under pressure: the client is cut");
            Err(Gone::Cut)
        }
    }
}

/// Why a response did not reach its client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Gone {
    /// The client went away (or its connection failed).
    Left,
    /// limiter cut a client too slow to take it.
    Cut,
}

/// Resolves once the pools are under pressure and bytes have waited since
/// `since` for [`PATIENCE`].
async fn patience_lost(pressure: &Pressure, since: tokio::time::Instant) {
    loop {
        let began = pressure.began();
        tokio::pin!(began);
        began.as_mut().enable();
        let now = tokio::time::Instant::now();
        if pressure.on(now) {
            if since + PATIENCE <= now {
                return;
            }
            tokio::time::sleep_until(since + PATIENCE).await;
        } else {
            began.await;
        }
    }
}
