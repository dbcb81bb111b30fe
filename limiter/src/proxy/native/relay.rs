//! Bodies across the native engine, as bytes: the request's received
//! before admission when it fits `http.requestBufferBytes` (the shield)
//! or streamed to the upstream holding the permit, within
//! `http.minDataRate` and `http.idleTimeoutMs`; the response's read ahead
//! when it fits `http.responseBufferBytes` (the permit goes back when the
//! upstream has delivered it) or streamed holding the permit, cut under
//! pressure when the client leaves it untaken for
//! [`PATIENCE`](super::super::pressure::PATIENCE).
//!
//! A chunked body is relayed as the client (or the upstream) chunked it;
//! where it ends, or where hyper would refuse it, is the framing scanner's
//! call. A response read ahead whole goes to the client with its length
//! (as hyper's server sends a body whose size it knows); a streamed one
//! keeps its length, or goes in chunks (a body that ends when the
//! upstream closes is chunked for the client, whose connection stays
//! open).

use std::{
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use bytes::{Buf as _, BytesMut};
use hyper::Response;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

use super::super::{
    Proxy, Tuning,
    body::ProxyBody,
    budget::{Budget, Reservation, take_more},
    counters::BodyTimeout,
    forward,
    framing::{BodyScan, Framing},
    io::ClientIo,
    pressure::{PATIENCE, Pressure},
    shield::rate_due,
};
use super::{
    request::{Framed, Head},
    response::{self, ToClient},
    upstream::{self, GetError, Pool},
};
use crate::{admission::Permit, breaker::ticket::Ticket};

/// Why a request body failed before it was all received.
#[derive(Debug)]
pub enum BodyError {
    BudgetSpent,
    Timeout(BodyTimeout),
    Client(&'static str),
}

/// A request body as far as it was received before admission.
pub struct Received {
    /// Its bytes in the buffer, right after the head.
    in_buf: usize,
    /// Of those, what goes to the upstream (a chunked body's trailer
    /// section does not: it ends with a CRLF of the relay's own).
    keep: usize,
    /// All of it is there.
    whole: bool,
    /// Of a streamed body: the length still to come, or the scanner of its
    /// chunks.
    rest: Rest,
    _reservation: Option<Reservation>,
    /// Bytes received in all (for the access log).
    bytes: u64,
    /// The buffer went past it already.
    consumed: bool,
    /// It came with trailer fields (dropped, but they make its length
    /// unknown to hyper's client).
    trailers: bool,
}

enum Rest {
    None,
    Length(u64),
    Chunked(Framing, Trailers),
}

impl Received {
    pub fn none() -> Self {
        Self {
            in_buf: 0,
            keep: 0,
            whole: true,
            rest: Rest::None,
            _reservation: None,
            bytes: 0,
            consumed: false,
            trailers: false,
        }
    }

    /// The body was read to its end.
    pub fn whole(&self) -> bool {
        self.whole
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn consumed(&self) -> bool {
        self.consumed
    }
}

/// Receives a request's body before admission: whole if it fits
/// `http.requestBufferBytes` and the budget (within
/// `http.requestBodyTimeoutMs` of now), otherwise what is already in the
/// buffer, the rest to stream.
pub async fn receive<S>(
    io: &mut ClientIo<S>,
    buf: &mut BytesMut,
    head: &Head,
    t: &Tuning,
    budget: &Arc<Budget>,
) -> Result<Received, BodyError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let limit = t.request_buffer_bytes;
    let deadline = tokio::time::Instant::now() + t.request_body_timeout;
    match head.body {
        Framed::None => Ok(Received::none()),
        Framed::Length(n) => {
            let there = (buf.len() - head.len) as u64;
            if limit == 0 || n > limit {
                let in_buf = there.min(n);
                return Ok(Received {
                    in_buf: in_buf as usize,
                    keep: in_buf as usize,
                    whole: in_buf == n,
                    rest: Rest::Length(n - in_buf),
                    _reservation: None,
                    bytes: in_buf,
                    consumed: false,
                    trailers: false,
                });
            }
            let reservation = budget.reserve(n, t.buffer_memory_bytes).ok_or(BodyError::BudgetSpent)?;
            let want = head.len + n as usize;
            if buf.capacity() < want {
                // Exactly what the body needs (a reserve could double it,
                // and the budget counts the body, not its slack).
                let mut exact = BytesMut::with_capacity(want);
                exact.extend_from_slice(buf);
                *buf = exact;
            }
            while buf.len() < want {
                read_before(io, buf, deadline).await?;
            }
            Ok(Received {
                in_buf: n as usize,
                keep: n as usize,
                whole: true,
                rest: Rest::None,
                _reservation: Some(reservation),
                bytes: n,
                consumed: false,
                trailers: false,
            })
        }
        Framed::Chunked => {
            let mut scan = Framing::chunked_body();
            let mut scanned = 0usize;
            let mut reservation = None;
            loop {
                let keep;
                let fresh = &mut buf[head.len + scanned..];
                let n = fresh.len();
                let (counted, ended) = match scan.body(fresh) {
                    BodyScan::Ended { used, keep: k } => {
                        keep = scanned + k;
                        scanned += used;
                        (used, true)
                    }
                    BodyScan::More { keep: k } => {
                        keep = scanned + k;
                        scanned += n;
                        (n, false)
                    }
                    BodyScan::Refused => return Err(BodyError::Client("malformed chunked body")),
                };
                if ended {
                    if !take_more(budget, &mut reservation, counted as u64, t.buffer_memory_bytes) {
                        return Err(BodyError::BudgetSpent);
                    }
                    let mut trailers = Trailers::default();
                    let section = &buf[head.len + keep..head.len + scanned];
                    if trailers.push(section).and_then(|()| trailers.check()).is_err() {
                        return Err(BodyError::Client("trailers hyper would refuse"));
                    }
                    return Ok(Received {
                        in_buf: scanned,
                        keep,
                        whole: true,
                        rest: Rest::None,
                        _reservation: reservation,
                        bytes: scanned as u64,
                        consumed: false,
                        trailers: trailers.any(),
                    });
                }
                if (scanned as u64) > limit {
                    return Ok(Received {
                        in_buf: scanned,
                        keep,
                        whole: false,
                        rest: Rest::Chunked(scan, {
                            let mut trailers = Trailers::default();
                            // What of the trailer section came already.
                            let _ = trailers.push(&buf[head.len + keep..head.len + scanned]);
                            trailers
                        }),
                        _reservation: reservation,
                        bytes: scanned as u64,
                        consumed: false,
                        trailers: false,
                    });
                }
                if !take_more(budget, &mut reservation, counted as u64, t.buffer_memory_bytes) {
                    return Err(BodyError::BudgetSpent);
                }
                read_before(io, buf, deadline).await?;
            }
        }
    }
}

/// One read from the client before `deadline`.
async fn read_before<S>(
    io: &mut ClientIo<S>,
    buf: &mut BytesMut,
    deadline: tokio::time::Instant,
) -> Result<(), BodyError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    if buf.capacity() == buf.len() {
        buf.reserve(16 * 1024);
    }
    match tokio::time::timeout_at(deadline, io.read_buf(buf)).await {
        Err(_) => Err(BodyError::Timeout(BodyTimeout::Deadline)),
        Ok(Ok(0)) => Err(BodyError::Client("the client closed before the end of its body")),
        Ok(Ok(_)) => Ok(()),
        Ok(Err(_)) => Err(BodyError::Client("reading the body failed")),
    }
}

/// Advances the buffer past a request read whole (head and body).
pub fn consume(buf: &mut BytesMut, head: &Head, received: &Received) {
    if received.whole && !received.consumed {
        buf.advance((head.len + received.in_buf).min(buf.len()));
    }
}

/// A body read ahead up to this size goes out in the same write as its
/// head (a copy is cheaper than a second system call); a larger one in a
/// write of its own.
const ONE_WRITE: usize = 16 * 1024;

/// Why one attempt at the upstream did not get the request there.
enum Attempt {
    /// A pooled connection turned out closed: once more, on another.
    Again,
    Failed(Failure),
}

/// How a request's exchange with the upstream ended.
pub enum Sent {
    /// The response went to the client; `keep_alive`: the connection may
    /// carry another request.
    Done { keep_alive: bool },
    /// Nothing reached the client yet: it gets the proxy's own answer.
    Failed(Failure),
    /// The client went away, or its connection was cut mid-response.
    Gone,
}

/// How forwarding failed before anything reached the client.
#[derive(Debug)]
pub enum Failure {
    Full,
    Connect,
    Timeout,
    /// The upstream connection failed before a whole response head.
    Upstream,
    ResponseBody,
    /// The client's streamed body failed (`Some`: too slowly, by which rule).
    ClientBody(Option<BodyTimeout>),
}

/// The proxy's own answer to `failure` (the same as on hyper's path).
pub fn fail_to_proxy(
    failure: Failure,
    ticket: Option<Ticket>,
    proxy: &Proxy,
    started: Instant,
) -> Response<ProxyBody> {
    tracing::debug!("native: forwarding failed: {failure:?}");
    match failure {
        Failure::Full => forward::upstream_full(proxy, ticket, started),
        Failure::Connect => forward::upstream_failed(proxy, ticket, true),
        Failure::Upstream => forward::upstream_failed(proxy, ticket, false),
        Failure::Timeout => forward::upstream_timeout(proxy, ticket),
        Failure::ResponseBody => forward::response_broke_off(proxy),
        Failure::ClientBody(timeout) => forward::client_body_failed(proxy, ticket, timeout),
    }
}

/// An admitted request on its way: everything its exchange holds.
pub struct Exchange<'a, S> {
    pub io: &'a mut ClientIo<S>,
    pub buf: &'a mut BytesMut,
    pub head: &'a Head,
    /// The head for the upstream ([`Head::upstream`], moved out of it).
    pub upstream: Vec<u8>,
    pub received: Received,
    pub proxy: &'a Proxy,
    pub pool: &'a Pool,
    pub tuning: &'a Tuning,
    pub ticket: Option<Ticket>,
    pub permit: Option<Permit>,
    pub started: Instant,
    /// The client's connection closes after this response.
    pub close: bool,
    /// What the client got, for the access log.
    pub status: u16,
    pub bytes_out: u64,
    pub upstream_time: Option<Duration>,
}

/// Methods hyper's client sends without a body of unknown length
/// ("GET, HEAD, and CONNECT almost never have bodies").
fn body_dropped(method: &hyper::Method) -> bool {
    *method == hyper::Method::GET || *method == hyper::Method::HEAD
}

/// A safe method: a request that can be sent again on a fresh connection
/// when a pooled one turns out closed before any of its response came.
fn retryable(method: &hyper::Method) -> bool {
    use hyper::Method;
    [Method::GET, Method::HEAD, Method::OPTIONS, Method::PUT, Method::DELETE, Method::TRACE].contains(method)
}

impl<S> Exchange<'_, S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    pub async fn run(&mut self) -> Sent {
        let t = self.tuning;
        // The head as written for the upstream, taken (not copied): the
        // body's first bytes go in the same write.
        let mut out = std::mem::take(&mut self.upstream);
        let chunked = self.head.body == Framed::Chunked;
        let mut streamed = !self.received.whole;
        if chunked && (streamed || self.received.trailers) && body_dropped(&self.head.method) {
            // As hyper's client sends a GET or HEAD whose body's length it
            // does not know: without it. What the client still sends of
            // it is not read: the connection closes after the response.
            out.extend_from_slice(b"\r\n");
            if streamed {
                self.close = true;
                streamed = false;
            }
        } else {
            if chunked {
                out.extend_from_slice(b"transfer-encoding: chunked\r\n");
            }
            out.extend_from_slice(b"\r\n");
            let body_at = self.head.len;
            out.extend_from_slice(&self.buf[body_at..body_at + self.received.keep]);
            if chunked && !streamed {
                // The trailer section, dropped, as hyper drops it.
                out.extend_from_slice(b"\r\n");
            }
        }

        let mut attempt = 0;
        let (mut conn, response) = loop {
            attempt += 1;
            // Until the response head, a client that closes its connection
            // gives its permit back (as hyper cancels the request); one that
            // streams its body is watched by that stream instead.
            let to_upstream = async {
                let mut conn = match self.pool.get(t.connect_timeout, t.idle_timeout).await {
                    Ok(conn) => conn,
                    Err(GetError::Full) => return Err(Attempt::Failed(Failure::Full)),
                    Err(GetError::Connect(_)) => return Err(Attempt::Failed(Failure::Connect)),
                };
                let may_retry = conn.reused && !streamed && attempt == 1 && retryable(&self.head.method);
                if timed(t.idle_timeout, conn.stream.write_all(&out)).await.is_err() {
                    return Err(if may_retry { Attempt::Again } else { Attempt::Failed(Failure::Upstream) });
                }
                Ok((conn, may_retry))
            };
            let sent = if streamed {
                to_upstream.await
            } else {
                tokio::select! {
                    sent = to_upstream => sent,
                    () = client_gone(self.io, self.buf) => return Sent::Gone,
                }
            };
            let (mut conn, may_retry) = match sent {
                Ok(sent) => sent,
                Err(Attempt::Again) => continue,
                Err(Attempt::Failed(failure)) => return Sent::Failed(failure),
            };
            if streamed && let Err(failure) = self.stream_request_body(&mut conn).await {
                return Sent::Failed(failure);
            }
            let sent_at = Instant::now();
            let head_request = self.head.method == hyper::Method::HEAD;
            let answer = tokio::select! {
                answer = read_response_head(&mut conn, head_request, t) => answer,
                () = client_gone(self.io, self.buf) => return Sent::Gone,
            };
            match answer {
                Ok(head) => {
                    self.upstream_time = Some(sent_at.elapsed());
                    break (conn, head);
                }
                Err(HeadError::NothingCame) if may_retry => continue,
                Err(HeadError::NothingCame | HeadError::Invalid) => return Sent::Failed(Failure::Upstream),
                Err(HeadError::Timeout) => return Sent::Failed(Failure::Timeout),
            }
        };
        // The request was read whole: the buffer keeps only what follows it.
        if self.received.whole {
            consume(self.buf, self.head, &self.received);
            self.received.consumed = true;
        }
        let took = self.upstream_time.unwrap_or_default();
        self.proxy.counters.upstream_latency.record(took);
        if let Some(permit) = &mut self.permit {
            permit.answered(took);
        }
        if let Some(ticket) = self.ticket.take() {
            ticket.record(!t.is_failure(response.status.as_u16()));
        }
        conn.buf.advance(response.len);
        self.send_response(conn, response).await
    }

    /// Streams the rest of a request body the shield did not hold, from
    /// the client to the upstream, holding the permit.
    async fn stream_request_body(&mut self, conn: &mut upstream::Conn) -> Result<(), Failure> {
        let t = self.tuning;
        // What the first write sent is behind.
        self.buf.advance(self.head.len + self.received.in_buf);
        self.received.in_buf = 0;
        self.received.keep = 0;
        self.received.consumed = true;
        let mut since = tokio::time::Instant::now();
        let mut rate_bytes = 0u64;
        loop {
            let done = matches!(self.received.rest, Rest::None | Rest::Length(0));
            if done {
                self.received.whole = true;
                self.received.rest = Rest::None;
                return Ok(());
            }
            if self.buf.is_empty() {
                let idle = tokio::time::Instant::now() + t.idle_timeout;
                let (until, rule) = if t.min_data_rate == 0 {
                    (idle, BodyTimeout::Idle)
                } else {
                    let due = rate_due(&mut since, &mut rate_bytes, t.min_data_rate);
                    if due < idle { (due, BodyTimeout::MinRate) } else { (idle, BodyTimeout::Idle) }
                };
                if self.buf.capacity() < 16 * 1024 {
                    self.buf.reserve(16 * 1024);
                }
                match tokio::time::timeout_at(until, self.io.read_buf(self.buf)).await {
                    Err(_) if rule == BodyTimeout::MinRate => {
                        // Look again: the rate may still be kept.
                        let due = rate_due(&mut since, &mut rate_bytes, t.min_data_rate);
                        if due <= tokio::time::Instant::now() {
                            return Err(Failure::ClientBody(Some(BodyTimeout::MinRate)));
                        }
                        continue;
                    }
                    Err(_) => return Err(Failure::ClientBody(Some(BodyTimeout::Idle))),
                    Ok(Ok(0)) | Ok(Err(_)) => return Err(Failure::ClientBody(None)),
                    Ok(Ok(n)) => {
                        rate_bytes += n as u64;
                        self.received.bytes += n as u64;
                    }
                }
            }
            let take = match &mut self.received.rest {
                Rest::None => (0, 0, false),
                Rest::Length(left) => {
                    let take = (*left).min(self.buf.len() as u64);
                    *left -= take;
                    (take as usize, take as usize, false)
                }
                Rest::Chunked(scan, trailers) => {
                    let (used, keep, ended) = match scan.body(&mut self.buf[..]) {
                        BodyScan::More { keep } => (self.buf.len(), keep, false),
                        BodyScan::Ended { used, keep } => (used, keep, true),
                        BodyScan::Refused => return Err(Failure::ClientBody(None)),
                    };
                    if trailers.push(&self.buf[keep..used]).is_err() || (ended && trailers.check().is_err()) {
                        return Err(Failure::ClientBody(None));
                    }
                    if ended {
                        self.received.rest = Rest::None;
                    }
                    (used, keep, ended)
                }
            };
            let (used, keep, ended) = take;
            if timed(t.idle_timeout, conn.stream.write_all(&self.buf[..keep])).await.is_err() {
                return Err(Failure::Upstream);
            }
            if ended && timed(t.idle_timeout, conn.stream.write_all(b"\r\n")).await.is_err() {
                return Err(Failure::Upstream);
            }
            self.buf.advance(used);
        }
    }

    /// The response to the client: its body read ahead (the permit goes
    /// back) or streamed.
    async fn send_response(&mut self, mut conn: upstream::Conn, head: response::Head) -> Sent {
        let t = self.tuning;
        let limit = t.response_buffer_bytes;
        let mut client_head = head.client;
        let mut reusable = !head.upstream_closes;
        self.status = head.status.as_u16();
        // Read ahead, if it fits.
        let budget = &self.proxy.budget;
        let ahead: Option<Ahead> = match head.body {
            response::Framed::None => {
                Some(Ahead { body: BytesMut::new(), chunked: false, _reservation: None })
            }
            response::Framed::Length(n) if limit > 0 && n <= limit => {
                match read_length(&mut conn, n, t, budget).await {
                    Ok(ahead) => ahead,
                    Err(()) => return Sent::Failed(Failure::ResponseBody),
                }
            }
            response::Framed::Chunked if limit > 0 => match read_chunked(&mut conn, t, budget).await {
                Ok(ahead) => ahead,
                Err(()) => return Sent::Failed(Failure::ResponseBody),
            },
            response::Framed::Close if limit > 0 => match read_to_close(&mut conn, t, budget).await {
                Ok(ahead) => {
                    if ahead.is_some() {
                        reusable = false;
                    }
                    ahead
                }
                Err(()) => return Sent::Failed(Failure::ResponseBody),
            },
            _ => None,
        };
        self.proxy.counters.status(head.status);
        if let Some(ahead) = ahead {
            // The upstream has delivered its last byte: its thread is free.
            self.permit = None;
            if reusable {
                self.pool.put(conn);
            }
            let body = &ahead.body;
            let to = if head.body == response::Framed::None {
                ToClient::Empty
            } else if ahead.chunked {
                ToClient::Chunked
            } else {
                ToClient::Length(body.len() as u64)
            };
            response::finish(&mut client_head, to, self.close);
            let mut tail: &[u8] = &[];
            if ahead.chunked {
                if !body.is_empty() {
                    client_head.extend_from_slice(format!("{:x}\r\n", body.len()).as_bytes());
                    client_head.extend_from_slice(body);
                    client_head.extend_from_slice(b"\r\n");
                }
                client_head.extend_from_slice(b"0\r\n\r\n");
            } else if body.len() <= ONE_WRITE {
                client_head.extend_from_slice(body);
            } else {
                tail = body;
            }
            self.bytes_out = body.len() as u64;
            let mut written = self.io.write_all(&client_head).await;
            if written.is_ok() && !tail.is_empty() {
                written = self.io.write_all(tail).await;
            }
            return match written {
                Ok(()) => Sent::Done { keep_alive: !self.close },
                Err(_) => Sent::Gone,
            };
        }
        // Streamed, holding the permit.
        let to = match head.body {
            response::Framed::Length(n) => ToClient::Length(n),
            _ => ToClient::Chunked,
        };
        response::finish(&mut client_head, to, self.close);
        let pressure = self.proxy.pressure.clone();
        if guarded_write(self.io, &client_head, &pressure, self.proxy).await.is_err() {
            return Sent::Gone;
        }
        let streamed = match head.body {
            response::Framed::Length(n) => self.stream_length(&mut conn, n, &pressure).await,
            response::Framed::Chunked => self.stream_chunked(&mut conn, &pressure).await,
            _ => {
                reusable = false;
                self.stream_to_close(&mut conn, &pressure).await
            }
        };
        self.permit = None;
        match streamed {
            Ok(()) => {
                if reusable {
                    self.pool.put(conn);
                }
                Sent::Done { keep_alive: !self.close }
            }
            Err(()) => Sent::Gone,
        }
    }

    async fn stream_length(
        &mut self,
        conn: &mut upstream::Conn,
        mut left: u64,
        p: &Pressure,
    ) -> Result<(), ()> {
        loop {
            let take = (conn.buf.len() as u64).min(left) as usize;
            if take > 0 {
                guarded_write(self.io, &conn.buf[..take], p, self.proxy).await?;
                self.bytes_out += take as u64;
                conn.buf.advance(take);
                left -= take as u64;
            }
            if left == 0 {
                return Ok(());
            }
            read_upstream(conn, self.tuning.idle_timeout).await?;
        }
    }

    async fn stream_chunked(&mut self, conn: &mut upstream::Conn, p: &Pressure) -> Result<(), ()> {
        let mut scan = Framing::chunked_body();
        let mut trailers = Trailers::default();
        loop {
            let (used, keep, ended) = match scan.body(&mut conn.buf[..]) {
                BodyScan::More { keep } => (conn.buf.len(), keep, false),
                BodyScan::Ended { used, keep } => (used, keep, true),
                BodyScan::Refused => return Err(()),
            };
            trailers.push(&conn.buf[keep..used])?;
            if ended {
                trailers.check()?;
            }
            if keep > 0 {
                guarded_write(self.io, &conn.buf[..keep], p, self.proxy).await?;
                self.bytes_out += keep as u64;
            }
            conn.buf.advance(used);
            if ended {
                // Without the trailer section, as hyper's server sends it.
                return guarded_write(self.io, b"\r\n", p, self.proxy).await;
            }
            read_upstream(conn, self.tuning.idle_timeout).await?;
        }
    }

    async fn stream_to_close(&mut self, conn: &mut upstream::Conn, p: &Pressure) -> Result<(), ()> {
        loop {
            if !conn.buf.is_empty() {
                let mut chunk = Vec::with_capacity(conn.buf.len() + 16);
                chunk.extend_from_slice(format!("{:x}\r\n", conn.buf.len()).as_bytes());
                chunk.extend_from_slice(&conn.buf);
                chunk.extend_from_slice(b"\r\n");
                guarded_write(self.io, &chunk, p, self.proxy).await?;
                self.bytes_out += conn.buf.len() as u64;
                conn.buf.clear();
            }
            match timed(self.tuning.idle_timeout, conn.stream.read_buf(&mut conn.buf)).await {
                Ok(0) => return guarded_write(self.io, b"0\r\n\r\n", p, self.proxy).await,
                Ok(_) => {}
                Err(()) => return Err(()),
            }
        }
    }
}

/// Why no response head came.
enum HeadError {
    /// The connection ended or failed before any byte of a response.
    NothingCame,
    /// What came is not a response hyper's client would read, or it broke
    /// off.
    Invalid,
    Timeout,
}

/// Reads the response head (interim 1xx heads skipped) within
/// `http.upstreamTimeoutMs`.
async fn read_response_head(
    conn: &mut upstream::Conn,
    head_request: bool,
    t: &Tuning,
) -> Result<response::Head, HeadError> {
    let deadline = tokio::time::Instant::now() + t.upstream_timeout;
    let mut any = false;
    loop {
        if !conn.buf.is_empty() {
            match response::parse(&conn.buf, head_request) {
                response::Parsed::Head(head) => return Ok(head),
                response::Parsed::Interim(len) => {
                    conn.buf.advance(len);
                    continue;
                }
                response::Parsed::Invalid => return Err(HeadError::Invalid),
                response::Parsed::Partial if conn.buf.len() >= response::MAX_HEAD_BYTES => {
                    return Err(HeadError::Invalid);
                }
                response::Parsed::Partial => {}
            }
        }
        if conn.buf.capacity() - conn.buf.len() < 1024 {
            conn.buf.reserve(upstream::BUF);
        }
        match tokio::time::timeout_at(deadline, conn.stream.read_buf(&mut conn.buf)).await {
            Err(_) => return Err(HeadError::Timeout),
            Ok(Ok(0)) | Ok(Err(_)) if !any => return Err(HeadError::NothingCame),
            Ok(Ok(0)) | Ok(Err(_)) => return Err(HeadError::Invalid),
            Ok(Ok(_)) => any = true,
        }
    }
}

/// One read from the upstream within `idle`; `Err` at its end or failure.
async fn read_upstream(conn: &mut upstream::Conn, idle: Duration) -> Result<(), ()> {
    if conn.buf.capacity() - conn.buf.len() < 4096 {
        conn.buf.reserve(upstream::BUF);
    }
    match timed(idle, conn.stream.read_buf(&mut conn.buf)).await {
        Ok(0) | Err(()) => Err(()),
        Ok(_) => Ok(()),
    }
}

/// `f` within `limit`; `Err` for a timeout or a failure.
async fn timed<T, E>(limit: Duration, f: impl Future<Output = Result<T, E>>) -> Result<T, ()> {
    match tokio::time::timeout(limit, f).await {
        Ok(Ok(v)) => Ok(v),
        _ => Err(()),
    }
}

/// A response body read ahead of the client, holding its share of
/// `http.bufferMemoryBytes` until it has been written.
struct Ahead {
    body: BytesMut,
    /// It had trailers: it goes in chunks (hyper's server sends a body with
    /// trailers so, even without them).
    chunked: bool,
    _reservation: Option<Reservation>,
}

/// Reads a body of length `n` ahead of the client, as the budget allows
/// (`None`: it ran out, stream it with what was read).
async fn read_length(
    conn: &mut upstream::Conn,
    n: u64,
    t: &Tuning,
    budget: &Arc<Budget>,
) -> Result<Option<Ahead>, ()> {
    let mut reservation = None;
    let n = n as usize;
    let mut counted = 0usize;
    loop {
        let there = conn.buf.len().min(n);
        if !take_more(budget, &mut reservation, (there - counted) as u64, t.buffer_memory_bytes) {
            return Ok(None);
        }
        counted = there;
        if there == n {
            break;
        }
        read_upstream(conn, t.idle_timeout).await?;
    }
    let body = conn.buf.split_to(n);
    Ok(Some(Ahead { body, chunked: false, _reservation: reservation }))
}

/// Reads a chunked body ahead of the client if it ends within `limit`
/// bytes and the budget; `None`: it does not, stream it (what was read
/// stays in the buffer).
async fn read_chunked(
    conn: &mut upstream::Conn,
    t: &Tuning,
    budget: &Arc<Budget>,
) -> Result<Option<Ahead>, ()> {
    let mut scan = Framing::chunked_body();
    let mut scanned = 0usize;
    let mut reservation = None;
    let mut trailers = Trailers::default();
    loop {
        let fresh = &mut conn.buf[scanned..];
        let n = fresh.len();
        match scan.body(fresh) {
            BodyScan::Ended { used, keep } => {
                trailers.push(&conn.buf[scanned + keep..scanned + used])?;
                trailers.check()?;
                let raw = conn.buf.split_to(scanned + used);
                return Ok(Some(Ahead {
                    body: dechunk(&raw),
                    chunked: trailers.any(),
                    _reservation: reservation,
                }));
            }
            BodyScan::Refused => return Err(()),
            BodyScan::More { keep } => {
                trailers.push(&conn.buf[scanned + keep..scanned + n])?;
                scanned += n;
            }
        }
        if scanned as u64 > t.response_buffer_bytes
            || !take_more(budget, &mut reservation, n as u64, t.buffer_memory_bytes)
        {
            return Ok(None);
        }
        read_upstream(conn, t.idle_timeout).await?;
    }
}

/// Reads a body that ends with the connection, if it does within the
/// buffer and the budget.
async fn read_to_close(
    conn: &mut upstream::Conn,
    t: &Tuning,
    budget: &Arc<Budget>,
) -> Result<Option<Ahead>, ()> {
    let mut reservation = None;
    let mut counted = 0usize;
    loop {
        if conn.buf.len() as u64 > t.response_buffer_bytes
            || !take_more(budget, &mut reservation, (conn.buf.len() - counted) as u64, t.buffer_memory_bytes)
        {
            return Ok(None);
        }
        counted = conn.buf.len();
        if conn.buf.capacity() - conn.buf.len() < 4096 {
            conn.buf.reserve(upstream::BUF);
        }
        match timed(t.idle_timeout, conn.stream.read_buf(&mut conn.buf)).await {
            Ok(0) => {
                let body = conn.buf.split();
                return Ok(Some(Ahead { body, chunked: false, _reservation: reservation }));
            }
            Ok(_) => {}
            Err(()) => return Err(()),
        }
    }
}

/// A chunked body's trailer section (its trailer lines and final CRLF), held
/// to be checked as hyper checks it when it decodes the body: at most
/// [`TRAILER_BYTES`] in all, at most [`TRAILER_LINES`] lines, each one a
/// field httparse reads (a bare LF inside a line makes two fields of one
/// line, which hyper refuses). A relay that drops the section still fails
/// the body where hyper would.
#[derive(Default)]
struct Trailers(Vec<u8>);

/// hyper's bounds on a body's trailers.
const TRAILER_BYTES: usize = 16 * 1024;
const TRAILER_LINES: usize = 100;

impl Trailers {
    fn push(&mut self, section: &[u8]) -> Result<(), ()> {
        if section.is_empty() {
            return Ok(());
        }
        self.0.extend_from_slice(section);
        // hyper counts the final CRLF only when there were trailer lines.
        if self.any() && self.0.len() >= TRAILER_BYTES { Err(()) } else { Ok(()) }
    }

    /// Trailer lines, not only the final CRLF.
    fn any(&self) -> bool {
        self.0.len() > 2
    }

    fn check(&self) -> Result<(), ()> {
        if !self.any() {
            return Ok(());
        }
        let lines = memchr::memmem::find_iter(&self.0, b"\r\n").count().saturating_sub(1);
        if lines > TRAILER_LINES {
            return Err(());
        }
        let mut fields = vec![httparse::EMPTY_HEADER; lines];
        match httparse::parse_headers(&self.0, &mut fields) {
            Ok(httparse::Status::Complete((_, fields))) => {
                let valid = fields.iter().all(|f| {
                    hyper::header::HeaderName::from_bytes(f.name.as_bytes()).is_ok()
                        && hyper::header::HeaderValue::from_bytes(f.value).is_ok()
                });
                if valid { Ok(()) } else { Err(()) }
            }
            _ => Err(()),
        }
    }
}

/// The data of a chunked body the scanner found whole (trailers dropped,
/// as hyper's server drops them from a response whose `Trailer` header
/// went with the hop-by-hop ones).
fn dechunk(mut raw: &[u8]) -> BytesMut {
    let mut out = BytesMut::with_capacity(raw.len());
    loop {
        let Some(eol) = memchr::memchr(b'\n', raw) else { return out };
        let line = &raw[..eol];
        let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
        let size = std::str::from_utf8(&line[..digits])
            .ok()
            .and_then(|d| usize::from_str_radix(d, 16).ok())
            .unwrap_or(0);
        raw = &raw[eol + 1..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&raw[..size.min(raw.len())]);
        raw = raw.get(size + 2..).unwrap_or_default();
    }
}

/// Writes to the client; under pressure, one that leaves the bytes
/// untaken for [`PATIENCE`] is cut (its permit goes back).
async fn guarded_write<S>(
    io: &mut ClientIo<S>,
    bytes: &[u8],
    pressure: &Pressure,
    proxy: &Proxy,
) -> Result<(), ()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let since = tokio::time::Instant::now();
    tokio::select! {
        written = io.write_all(bytes) => written.map_err(|_| ()),
        () = patience_lost(pressure, since) => {
            proxy.counters.slow_readers.fetch_add(1, Ordering::Relaxed);
            tracing::debug!("HTTP/1 response left untaken under pressure: its upstream response and permit dropped");
            Err(())
        }
    }
}

/// Resolves once the pools are under pressure and bytes have waited
/// since `since` for [`PATIENCE`].
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

/// Resolves if the client closes its connection (or it fails) while its
/// request waits for the upstream. Bytes it sends meanwhile (a pipelined
/// request) are kept in `buf`, up to a head's worth; then it is no longer
/// watched.
async fn client_gone<S>(io: &mut ClientIo<S>, buf: &mut BytesMut)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    loop {
        if buf.len() >= 64 * 1024 {
            return std::future::pending().await;
        }
        if buf.capacity() - buf.len() < 1024 {
            buf.reserve(4096);
        }
        match io.read_buf(buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}
