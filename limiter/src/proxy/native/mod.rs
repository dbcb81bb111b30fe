//! The native HTTP/1.1 engine (`http.h1Engine = native`): a proxy's own
//! HTTP/1.1 path, as nginx and pingora have, in place of hyper's server
//! and client. Each request head is parsed once (httparse, which hyper
//! uses too) and written for the upstream in one pass ([`request`]);
//! bodies go across as the bytes they came as, framed by the same
//! scanner that follows hyper's rules ([`super::framing`]); the upstream
//! connection is a plain socket kept alive in the worker's list
//! ([`upstream`]); the response head is rewritten in one pass
//! ([`response`]) and its body read ahead or streamed ([`relay`]).
//!
//! Every limit, the shield, the breaker, the access log and the metrics
//! are the ones hyper's path uses, called in the same order
//! ([`super::pipeline`] is the reference): the head's checks, the breaker
//! and the limits checked at the head, a body up to
//! `http.requestBufferBytes` received holding no permit, then the breaker
//! and the limits taken, the upstream, the response read ahead when it
//! fits `http.responseBufferBytes` (the permit goes back), or streamed
//! holding it.
//!
//! What the engine does not serve itself, it hands over with the bytes
//! read so far to hyper, which serves the rest of the connection exactly
//! as on hyper's path (see [`request`] for the list): heads httparse
//! refuses, HTTP/1.0, upgrades, `Expect`, targets other than the origin
//! form and framing other than one length or `chunked`.

pub mod relay;
pub mod request;
pub mod response;
pub mod upstream;

use std::{
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant, SystemTime},
};

use bytes::BytesMut;
use hyper::StatusCode;
use tokio::{
    io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _},
    sync::watch,
};

use self::{
    relay::{BodyError, Sent},
    request::{Framed, Head, Parsed},
    upstream::Pool,
};
use super::{
    Proxy, Tuning,
    headers::{Client, Forwarding},
    io::ClientIo,
    pipeline::breaker_at_head,
    reason::Reason,
    respond,
};
use crate::{
    admission::Ask,
    breaker::{Decision, ticket::Ticket},
};

/// How a connection served by the native engine ended.
pub enum Ended<S> {
    /// Closed (by either side, or after a response that closes it).
    Closed,
    /// No whole head within `http.headerReadTimeoutMs`; `mid_head`: some
    /// of one had come.
    HeadTimeout { mid_head: bool },
    /// hyper serves the rest (boxed: the connection's future holds this).
    HandOver(Box<ClientIo<S>>, BytesMut),
}

/// The first read buffer of a connection (grown, up to
/// `http.maxHeaderBytes`, for a larger head).
const READ_BUF: usize = 4096;

/// What one connection is served with.
pub struct Conn<'a> {
    pub proxy: &'a Arc<Proxy>,
    pub pool: &'a Pool,
    pub client: Client,
    pub fwd: &'a Forwarding,
    pub shutdown: watch::Receiver<bool>,
}

/// Serves one HTTP/1.1 client connection until it closes, times out or
/// is handed over.
pub async fn serve<S>(mut io: ClientIo<S>, c: Conn<'_>) -> Ended<S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut buf = BytesMut::with_capacity(READ_BUF);
    let mut served = 0u64;
    loop {
        let tuning = c.proxy.tuning();
        io.set_between_requests(buf.is_empty());
        let head = match read_head(&mut io, &mut buf, &c, &tuning, served == 0).await {
            Ok(head) => head,
            Err(end) => return end.into_ended(io, buf),
        };
        served += 1;
        match exchange(&mut io, &mut buf, &c, &tuning, head).await {
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
fn whole_requests(buf: &[u8]) -> bool {
    if buf.is_empty() {
        return true;
    }
    let mut watch = super::framing::Framing::default();
    let mut copy = buf.to_vec();
    watch.feed(&mut copy);
    watch.between_requests()
}

/// Why no head was read.
enum NoHead {
    Closed,
    Timeout {
        mid_head: bool,
    },
    HandOver,
    /// A head refused before admission: answered, the connection closes.
    Refused,
}

impl NoHead {
    fn into_ended<S>(self, io: ClientIo<S>, buf: BytesMut) -> Ended<S> {
        match self {
            Self::Closed | Self::Refused => Ended::Closed,
            Self::Timeout { mid_head } => Ended::HeadTimeout { mid_head },
            Self::HandOver => Ended::HandOver(Box::new(io), buf),
        }
    }
}

/// Reads the next request head; on a drain, an idle connection closes (one
/// that has not sent its first request yet gets a moment for it).
async fn read_head<S>(
    io: &mut ClientIo<S>,
    buf: &mut BytesMut,
    c: &Conn<'_>,
    tuning: &Tuning,
    first: bool,
) -> Result<Box<Head>, NoHead>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let deadline = tokio::time::Instant::now() + tuning.header_read_timeout;
    let mut shutdown = c.shutdown.clone();
    let mut draining = *shutdown.borrow_and_update();
    let mut grace = None;
    loop {
        if !buf.is_empty() {
            match request::parse(buf, c.fwd, tuning) {
                Parsed::Head(head) => return Ok(head),
                Parsed::Partial => {}
                Parsed::HandOver => return Err(NoHead::HandOver),
                Parsed::Bad(bad, method, target) => {
                    let proxy = c.proxy;
                    proxy.counters.requests_by_proto[c.client.proto.index()].fetch_add(1, Ordering::Relaxed);
                    proxy.counters.bad_heads[bad.index()].fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(peer = %c.client.addr, kind = bad.kind(), "request head refused before admission");
                    let started = Instant::now();
                    let response = respond::own(proxy, bad.status(), bad.text(), true);
                    let head_request = method == hyper::Method::HEAD;
                    let logged = Logged::new(method, &buf[target], None, started);
                    let (bytes, _, body_len) = response::own(response, head_request).await;
                    let _ = io.write_all(&bytes).await;
                    logged.done(c, bad.status().as_u16(), None, None, 0, body_len);
                    let _ = io.shutdown().await;
                    return Err(NoHead::Refused);
                }
            }
            if buf.len() >= tuning.max_header_bytes {
                // Too large: hyper answers 431, as on its own path.
                return Err(NoHead::HandOver);
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
            Ok(Ok(0)) | Ok(Err(_)) => {
                // Closed mid-head: hyper would have said nothing either.
                return Err(NoHead::Closed);
            }
            Ok(Ok(_)) => {}
            Err(_) if grace.is_some_and(|g| tokio::time::Instant::now() >= g) => return Err(NoHead::Closed),
            Err(_) => return Err(NoHead::Timeout { mid_head: !buf.is_empty() }),
        }
    }
}

/// How long a drain waits for the first request of a connection that has
/// sent none yet (as on hyper's path).
const FIRST_REQUEST_GRACE: Duration = Duration::from_secs(1);

/// What the connection does after an exchange.
enum Next {
    KeepAlive,
    /// Close after what was written (a lingering close; `between`: the
    /// request was read whole, so nothing lingers unless more came).
    Close {
        between: bool,
    },
    /// The client is gone, or its connection failed: nothing to close
    /// gracefully.
    Gone,
}

/// One request and its response.
async fn exchange<S>(
    io: &mut ClientIo<S>,
    buf: &mut BytesMut,
    c: &Conn<'_>,
    tuning: &Arc<Tuning>,
    mut head: Box<Head>,
) -> Next
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let proxy = c.proxy;
    let started = Instant::now();
    proxy.counters.requests_by_proto[c.client.proto.index()].fetch_add(1, Ordering::Relaxed);
    let logged = proxy.access_log.enabled().then(|| {
        let session = head.session.clone().map(|r| proxy.admission.session_tag(&buf[r]));
        Logged::new(head.method.clone(), &buf[head.target.clone()], session, started)
    });
    fn ask<'b>(head: &Head, buf: &'b [u8]) -> Ask<'b> {
        Ask {
            debug: head.debug,
            web: head.web,
            session: head.session.clone().map(|r| &buf[r]),
            class: head.class,
        }
    }

    // The body, received holding no permit when it fits the buffer (see
    // the pipeline for the order of the checks).
    let received = if head.body == Framed::None {
        if head.debug
            && let Some(retry_after_ms) = breaker_at_head(proxy, true, tuning)
        {
            let response = respond::refuse_breaker(proxy, retry_after_ms, started);
            return own(io, buf, c, response, &head, logged, Some(&relay::Received::none())).await;
        }
        relay::Received::none()
    } else {
        if let Some(retry_after_ms) = breaker_at_head(proxy, head.debug, tuning) {
            let response = respond::refuse_breaker(proxy, retry_after_ms, started);
            return own(io, buf, c, response, &head, logged, None).await;
        }
        if let Err(refusal) = proxy.admission.check(ask(&head, buf)) {
            let response = respond::refuse(proxy, Reason::Admission(refusal), started);
            return own(io, buf, c, response, &head, logged, None).await;
        }
        proxy.counters.bodies_receiving.fetch_add(1, Ordering::Relaxed);
        let received = relay::receive(io, buf, &head, tuning, &proxy.budget).await;
        proxy.counters.bodies_receiving.fetch_sub(1, Ordering::Relaxed);
        match received {
            Ok(received) => received,
            Err(e) => {
                let response = body_failed(proxy, &e, c);
                return own(io, buf, c, response, &head, logged, None).await;
            }
        }
    };
    // The breaker and the limits, taken.
    let ticket = if head.debug {
        None
    } else {
        match proxy.breaker.admit() {
            Decision::Admit(kind) => Some(Ticket::new(proxy.breaker.clone(), kind)),
            Decision::Refuse { retry_after_ms } => {
                let response = respond::refuse_breaker(proxy, retry_after_ms, started);
                return own(io, buf, c, response, &head, logged, Some(&received)).await;
            }
        }
    };
    let permit = match proxy.admission.admit(ask(&head, buf)) {
        Ok(permit) => permit,
        Err(refusal) => {
            let response = respond::refuse(proxy, Reason::Admission(refusal), started);
            return own(io, buf, c, response, &head, logged, Some(&received)).await;
        }
    };

    let upstream = std::mem::take(&mut head.upstream);
    let mut relay = relay::Exchange {
        io,
        buf,
        head: &head,
        upstream,
        received,
        proxy,
        pool: c.pool,
        tuning,
        ticket,
        permit: Some(permit),
        started,
        close: head.close || *c.shutdown.borrow(),
        status: 0,
        bytes_out: 0,
        upstream_time: None,
    };
    let sent = relay.run().await;
    let (status, bytes_out, upstream_time) = (relay.status, relay.bytes_out, relay.upstream_time);
    let body_in = relay.received.bytes();
    match sent {
        Sent::Done { keep_alive } => {
            if let Some(l) = logged {
                l.done(c, status, None, upstream_time, body_in, bytes_out);
            }
            if keep_alive && !*c.shutdown.borrow() { Next::KeepAlive } else { Next::Close { between: true } }
        }
        Sent::Failed(failure) => {
            let response = relay::fail_to_proxy(failure, relay.ticket.take(), proxy, started);
            let received = std::mem::replace(&mut relay.received, relay::Received::none());
            drop(relay);
            // A request the relay consumed already is not consumed again.
            let left = if received.whole() && !received.consumed() { Some(&received) } else { None };
            own(io, buf, c, response, &head, logged, left).await
        }
        Sent::Gone => {
            if let Some(l) = logged {
                l.done(c, status, None, upstream_time, body_in, bytes_out);
            }
            Next::Gone
        }
    }
}

/// Writes a response of the proxy's own for `head`, and logs it.
/// `received`: the request's body as far as it was read (`None`: not
/// read); the buffer then goes past the request, and the connection may
/// close at once after the response if nothing else was sent.
async fn own<S>(
    io: &mut ClientIo<S>,
    buf: &mut BytesMut,
    c: &Conn<'_>,
    response: hyper::Response<super::body::ProxyBody>,
    head: &Head,
    logged: Option<Logged>,
    received: Option<&relay::Received>,
) -> Next
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let status = response.status().as_u16();
    let refused = response.body().meta.refused;
    let (bytes, close, body_len) = response::own(response, head.method == hyper::Method::HEAD).await;
    let read_whole = received.is_some_and(relay::Received::whole);
    if let Some(received) = received {
        relay::consume(buf, head, received);
    }
    let written = io.write_all(&bytes).await;
    if let Some(l) = logged {
        l.done(c, status, refused, None, received.map_or(0, relay::Received::bytes), body_len);
    }
    match written {
        Err(_) => Next::Gone,
        Ok(()) if close || !read_whole => Next::Close { between: read_whole },
        Ok(()) => Next::KeepAlive,
    }
}

/// The proxy's answer to a request body that failed before admission.
fn body_failed(proxy: &Proxy, e: &BodyError, c: &Conn<'_>) -> hyper::Response<super::body::ProxyBody> {
    match e {
        BodyError::BudgetSpent => {
            proxy.counters.refused_buffer_full.fetch_add(1, Ordering::Relaxed);
            respond::refuse(proxy, Reason::BufferFull, Instant::now())
        }
        BodyError::Timeout(rule) => {
            proxy.counters.body_timeouts[rule.index()].fetch_add(1, Ordering::Relaxed);
            respond::body_timeout(proxy)
        }
        BodyError::Client(why) => {
            proxy.counters.client_body_errors.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(peer = %c.client.addr, "request body failed before admission: {why}");
            respond::own(proxy, StatusCode::BAD_REQUEST, "400 Bad Request: the request body failed\n", true)
        }
    }
}

/// What the access log needs of a request, taken from its head.
struct Logged {
    ts: SystemTime,
    started: Instant,
    method: hyper::Method,
    path: String,
    session: Option<u32>,
}

impl Logged {
    fn new(method: hyper::Method, target: &[u8], session: Option<u32>, started: Instant) -> Self {
        Self {
            ts: SystemTime::now(),
            started,
            method,
            path: String::from_utf8_lossy(target).into_owned(),
            session,
        }
    }

    fn done(
        self,
        c: &Conn<'_>,
        status: u16,
        reason: Option<&'static str>,
        upstream: Option<Duration>,
        bytes_in: u64,
        bytes_out: u64,
    ) {
        if !c.proxy.access_log.enabled() {
            return;
        }
        c.proxy.access_log.log(crate::access_log::Entry {
            ts: self.ts,
            client: c.client.addr,
            proto: c.client.proto.as_str(),
            method: self.method,
            path: self.path,
            status,
            reason,
            bytes_in,
            bytes_out,
            ms: self.started.elapsed().as_secs_f64() * 1000.0,
            upstream_ms: upstream.map(|d| d.as_secs_f64() * 1000.0),
            session: self.session,
        });
    }
}
