//! One request, from its head to its response, as named phases: the same
//! for an HTTP/1.x request and an HTTP/2 stream. What differs between the
//! two (where the body comes from, how the answer goes out) is the
//! session's ([`super::h1`], [`super::h2`]); where a rule applies is found
//! by its phase here.
//!
//! 1. [`request_filter`]: the head's own checks ([`Request::check`]) and
//!    its class (`/debug/`, critical, sheddable). A refused head costs no
//!    breaker ticket and no slot.
//! 2. [`admit_at_head`]: for a request with a body, the breaker and the
//!    pools, web-client and session limits *checked*, taking nothing: what
//!    would be refused now is refused now, its body unread (a `/debug/`
//!    request meets the breaker here too, without a probe). A request
//!    without a body has nothing to wait for: phase 4 decides it.
//! 3. [`receive`]: a body up to `http.requestBufferBytes` received whole,
//!    holding no permit (within `http.requestBodyTimeoutMs` and the memory
//!    budget); a larger one streams later.
//! 4. [`admit`]: the breaker's ticket (a half-open probe is taken only
//!    now) and the permits, the node's then the fleet's (`crate::fleet`:
//!    within the node's share, no round trip), taken together or not at all.
//! 5. [`forward`]: the upstream ([`super::upstream`]), its result on the
//!    ticket, an accepted upgrade (its tunnel slot kept, the permit given
//!    back), the response body read ahead when it fits
//!    `http.responseBufferBytes` (the permit goes back) or streamed holding
//!    it. An exchange given up on (a 504) keeps its permit until the
//!    upstream is done with it ([`super::upstream::abandon`]).
//! 6. Within [`forward`]: an upstream or a body that failed before the
//!    client had anything gets limiter's own answer ([`Answer::failed`]),
//!    its [`Error`] counted and logged.
//! 7. [`Logged`]: the access log's line, once the response is done, with
//!    the [`Outcome`] rules both protocols share.

use std::{
    net::SocketAddr,
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant, SystemTime},
};

use bytes::Bytes;
use hyper::Method;

use super::{
    Proxy, Tuning,
    answer::Answer,
    budget::Collect,
    error::{BodyTimeout, Error, Kind},
    h1::framing::{Framing, ResponseHead},
    reason::Reason,
    request::{
        BodyLen, Outgoing, Request,
        headers::Client,
        path::{class_of, is_debug_path},
    },
    upstream::{
        self, Abandon, Ahead, Answered, BodySource, Failed, Outbound, Pool, ResponseBody, Send, UpstreamConn,
    },
};
use crate::request_id::RequestId;
use crate::{
    admission::{Ask, Class, Permit, TunnelSlot},
    breaker::{Decision, State, ticket::Ticket},
    config::Prefix,
};

/// What a request's phases share.
#[derive(Clone, Copy)]
pub struct Ctx<'a> {
    pub proxy: &'a Arc<Proxy>,
    pub tuning: &'a Tuning,
    pub client: Client,
    /// When its head came.
    pub started: Instant,
    pub id: &'a RequestId,
}

/// What the head says for admission.
#[derive(Clone, Copy, Debug)]
pub struct Classified {
    pub debug: bool,
    pub class: Class,
    /// An upgrade's client group (`http.maxTunnelsPerClient`).
    pub client_group: Option<Prefix>,
}

impl Classified {
    fn ask<'r>(self, req: &'r Request) -> Ask<'r> {
        Ask {
            debug: self.debug,
            web: req.seen.client_id,
            session: req.authorization(),
            class: self.class,
            tunnel: req.is_upgrade(),
            client_group: self.client_group,
        }
    }
}

/// Phase 1: the head's checks, and its class.
pub fn request_filter(ctx: Ctx<'_>, req: &Request) -> Result<Classified, Answer> {
    if let Err(bad) = req.check() {
        tracing::debug!(peer = %ctx.client.addr, kind = bad.kind(), "request head refused before admission");
        return Err(Answer::bad(ctx.proxy, bad));
    }
    let path = req.path();
    let debug = is_debug_path(path);
    let class =
        if debug { Class::Normal } else { class_of(path, &ctx.tuning.critical, &ctx.tuning.sheddable) };
    // A forwarder's connection carries many clients: no group of one.
    let client_group = (req.is_upgrade() && !ctx.client.trusted)
        .then(|| ctx.proxy.client_group(ctx.client.addr.ip()))
        .flatten();
    Ok(Classified { debug, class, client_group })
}

/// Phase 2: refused at the head, taking nothing: the breaker, then (for a
/// request with a body, which is received before the permits) the limits.
pub fn admit_at_head(ctx: Ctx<'_>, req: &Request, c: Classified) -> Result<(), Answer> {
    let with_body = req.body != BodyLen::None;
    if (with_body || c.debug)
        && let Some(retry_after_ms) = breaker_at_head(ctx.proxy, c.debug, ctx.tuning)
    {
        return Err(Answer::refuse_breaker(ctx.proxy, retry_after_ms, ctx.started));
    }
    if with_body && let Err(refusal) = ctx.proxy.admission.check(c.ask(req)) {
        return Err(Answer::refuse(ctx.proxy, Reason::Admission(refusal), ctx.started));
    }
    Ok(())
}

/// The breaker's answer at a request's head, taking no probe: `Some` with
/// the time until a probe may be tried if it refuses. Diagnostics pass an
/// open breaker unless `breaker.bypassDebug = false`, and never probe.
fn breaker_at_head(proxy: &Proxy, debug: bool, tuning: &Tuning) -> Option<u64> {
    if !debug {
        return proxy.breaker.would_refuse();
    }
    if tuning.bypass_debug || proxy.breaker.state() == State::Closed {
        return None;
    }
    match proxy.breaker.admit_passive() {
        Decision::Refuse { retry_after_ms } => Some(retry_after_ms),
        Decision::Admit(_) => None,
    }
}

/// A request body as received before admission.
pub struct Received {
    /// What came (all of it when `whole`), holding its share of the budget.
    pub bytes: Bytes,
    pub whole: bool,
}

/// Phase 3: the body, received whole when it fits the buffer (holding no
/// permit), or as far as it came before it outgrew it.
pub async fn receive<B: BodySource>(ctx: Ctx<'_>, req: &Request, source: &mut B) -> Result<Received, Answer> {
    let t = ctx.tuning;
    let (limit, budget) = (t.request_buffer_bytes, &ctx.proxy.budget);
    let collect = match req.body {
        BodyLen::None => return Ok(Received { bytes: Bytes::new(), whole: true }),
        BodyLen::Length(n) if limit == 0 || n > limit => None,
        _ if limit == 0 => None,
        BodyLen::Length(n) => match Collect::exact(budget, n, t.buffer_memory_bytes) {
            Some(c) => Some(c),
            None => return Err(Answer::buffer_full(ctx.proxy, ctx.started)),
        },
        BodyLen::Chunked | BodyLen::Unknown => Some(Collect::growing()),
    };
    // Too large for the buffer: it streams, holding the permit.
    let Some(mut collect) = collect else { return Ok(Received { bytes: Bytes::new(), whole: false }) };
    let counters = &ctx.proxy.counters;
    counters.bodies_receiving.fetch_add(1, Ordering::Relaxed);
    let deadline = tokio::time::Instant::now() + t.request_body_timeout;
    let outcome = loop {
        let error = match tokio::time::timeout_at(deadline, source.next()).await {
            Err(_) => Error::rule(Kind::ClientSlowBody(BodyTimeout::Deadline), "http.requestBodyTimeoutMs"),
            Ok(Err(error)) => error,
            Ok(Ok(None)) => break Ok(Received { bytes: collect.finish(None), whole: true }),
            Ok(Ok(Some(data))) => {
                if let Err(data) = collect.push(data, limit, budget, t.buffer_memory_bytes) {
                    if collect.len() + data.len() as u64 <= limit {
                        break Err(Answer::buffer_full(ctx.proxy, ctx.started));
                    }
                    break Ok(Received { bytes: collect.finish(Some(data)), whole: false });
                }
                continue;
            }
        };
        counters.note(&error, ctx.client.addr, ctx.id);
        break Err(Answer::failed(ctx.proxy, &error, None));
    };
    counters.bodies_receiving.fetch_sub(1, Ordering::Relaxed);
    outcome
}

/// Phase 4: the breaker's ticket, then the permits (the pools, web
/// clients, sessions), for real now that the body is in, then the
/// fleet's (`fleet.*`), all or nothing: a fleet refusal gives the local
/// permits back. A request waits for the store only when its node's share
/// of a fleet budget is full (a claim, one round trip, shared by the
/// requests waiting on it).
pub async fn admit(ctx: Ctx<'_>, req: &Request, c: Classified) -> Result<(Option<Ticket>, Permit), Answer> {
    let proxy = ctx.proxy;
    let ticket = if c.debug {
        None
    } else {
        match proxy.breaker.admit() {
            Decision::Admit(kind) => Some(Ticket::new(proxy.breaker.clone(), kind)),
            Decision::Refuse { retry_after_ms } => {
                return Err(Answer::refuse_breaker(proxy, retry_after_ms, ctx.started));
            }
        }
    };
    let ask = c.ask(req);
    let mut permit = match proxy.admission.admit(ask) {
        Ok(permit) => permit,
        // The ticket is dropped unrecorded: a refusal is not a result.
        Err(refusal) => return Err(Answer::refuse(proxy, Reason::Admission(refusal), ctx.started)),
    };
    // The fleet's limits are per client too (never on `/debug/`).
    if let Some(fleet) = &proxy.fleet
        && ask.per_client()
    {
        let (held, refusal) = fleet.acquire(ask.web, ask.session).await;
        if let Some(refusal) = refusal
            && proxy.admission.refused_elsewhere(refusal)
        {
            drop((held, permit, ticket));
            return Err(Answer::refuse(proxy, Reason::Admission(refusal), ctx.started));
        }
        if let Some(held) = held {
            permit.attach(Box::new(held));
        }
    }
    Ok((ticket, permit))
}

/// How the body goes upstream: in memory with its length, or streamed
/// with the client's length, or in limiter's chunks.
pub fn outgoing(req: &Request, received: &Received) -> Outgoing {
    match (received.whole, req.body) {
        (true, _) if received.bytes.is_empty() => Outgoing::None,
        (true, _) => Outgoing::Length(received.bytes.len() as u64),
        (false, BodyLen::Length(n)) => Outgoing::Length(n),
        (false, _) => Outgoing::Chunked,
    }
}

/// An admitted request on its way upstream: what phase 5 needs. (An
/// HTTP/2 stream's runs as a task of its own, which owns what this
/// borrows: its client may reset the stream, and the upstream's work goes
/// on, holding the permit.)
pub struct Admitted<'a> {
    pub proxy: &'a Proxy,
    pub tuning: &'a Tuning,
    pub pool: &'a Arc<Pool>,
    pub peer: SocketAddr,
    /// The head limiter wrote for the upstream.
    pub head: Vec<u8>,
    pub method: Method,
    pub upgrade: bool,
    pub received: Received,
    pub framing: Outgoing,
    pub ticket: Option<Ticket>,
    pub permit: Permit,
    pub started: Instant,
    pub id: RequestId,
}

/// The response, as phase 5 leaves it for the session to send.
pub enum Reply {
    Own(Answer),
    Upstream {
        head: ResponseHead,
        /// The head's bytes (its spans point here).
        head_bytes: Bytes,
        body: Body,
        took: Duration,
    },
    /// An upgrade the upstream accepted (`101`): the connection to join to
    /// the client's (HTTP/1 only), and its place under `http.maxTunnels`,
    /// held until the tunnel closes; the permit went back.
    Upgraded {
        head: ResponseHead,
        head_bytes: Bytes,
        conn: UpstreamConn,
        slot: Option<TunnelSlot>,
    },
}

/// A response body, as it goes to the client.
pub enum Body {
    /// Read ahead whole: the upstream is done, the permit is back.
    Whole(Bytes),
    /// What was read, then the rest as the upstream sends it, holding the
    /// permit.
    Stream { first: Bytes, rest: Box<ResponseBody> },
}

impl Body {
    /// The `Content-Length` the client is told, on either protocol, when
    /// it is known: a body's own length; for a response without a body (to
    /// a `HEAD`, a 304), the upstream's, which says what a `GET` would have
    /// had (never for a 204); for a body streamed, when the upstream said.
    pub fn length(&self, head: &ResponseHead) -> Option<u64> {
        match self {
            Self::Whole(_) if head.framing == Framing::None => head.length.filter(|_| head.status != 204),
            Self::Whole(bytes) => Some(bytes.len() as u64),
            Self::Stream { first, rest } => rest.remaining().map(|n| first.len() as u64 + n),
        }
    }

    /// The response has no body to send (a `HEAD`'s, a 204, a 304, an
    /// empty one): only its head goes out.
    pub fn is_none(&self, head: &ResponseHead) -> bool {
        matches!(self, Self::Whole(_) if head.framing == Framing::None)
    }
}

/// Phase 5: the upstream, then its response. `rest` is the client's body
/// beyond what was received (read only when the body streams).
pub async fn forward<B: BodySource>(a: Admitted<'_>, rest: &mut B) -> Reply {
    let t = a.tuning;
    let s = Send {
        pool: a.pool,
        connect_timeout: t.connect_timeout,
        idle_timeout: t.idle_timeout,
        upstream_timeout: t.upstream_timeout,
        arm_within: t.header_read_timeout,
        min_rate: t.min_data_rate,
        idempotent: idempotent(&a.method),
        to_head: a.method == Method::HEAD,
        upgrade: a.upgrade,
    };
    let body = if a.received.whole {
        Outbound::Whole(a.received.bytes)
    } else {
        Outbound::Stream { first: a.received.bytes, rest, framing: a.framing }
    };
    let answered = upstream::send(&s, &a.head, body).await;
    let proxy = a.proxy;
    let Answered { conn, head, head_bytes, took } = match answered {
        Ok(answered) => answered,
        Err(Failed::Full) => return Reply::Own(Answer::upstream_full(proxy, a.ticket, a.started)),
        // Phase 6: limiter's own answer to a request the upstream did not
        // answer.
        Err(Failed::Error { error, busy }) => {
            proxy.counters.note(&error, a.peer, &a.id);
            let answer = Answer::failed(proxy, &error, a.ticket);
            if let Some(busy) = busy {
                let abandon = Abandon { id: a.id, bound: t.upstream_abandon, idle: t.idle_timeout };
                upstream::follow_pending(busy, a.pool.clone(), a.permit, s.to_head, abandon);
            }
            return Reply::Own(answer);
        }
    };
    let mut permit = a.permit;
    proxy.counters.upstream_latency.record(took);
    permit.answered(took);
    if let Some(ticket) = a.ticket {
        ticket.record(!t.is_failure(head.status));
    }
    proxy.counters.status_code(head.status);
    if head.status == 101 {
        // The upgrade is complete: the permit goes back now, a tunnel is
        // not an HTTP request any more; its tunnel slot stays.
        proxy.counters.upgrades.fetch_add(1, Ordering::Relaxed);
        let slot = permit.tunnel();
        return Reply::Upgraded { head, head_bytes, conn, slot };
    }
    let abandon = Abandon { id: a.id.clone(), bound: t.upstream_abandon, idle: t.idle_timeout };
    let mut rest = ResponseBody::new(conn, &head, a.pool.clone(), t.idle_timeout, permit, Some(abandon));
    let body = match rest.read_ahead(t.response_buffer_bytes, &proxy.budget, t.buffer_memory_bytes).await {
        Ok(Ahead::Whole(bytes)) => Body::Whole(bytes),
        Ok(Ahead::Streaming(first)) => Body::Stream { first, rest: Box::new(rest) },
        // Nothing has reached the client yet: it can still be told.
        Err(error) => {
            proxy.counters.note(&error, a.peer, &a.id);
            return Reply::Own(Answer::failed(proxy, &error, None));
        }
    };
    Reply::Upstream { head, head_bytes, body, took }
}

/// Methods that may be sent twice (RFC 9110 §9.2.2).
fn idempotent(method: &Method) -> bool {
    [Method::GET, Method::HEAD, Method::OPTIONS, Method::PUT, Method::DELETE, Method::TRACE].contains(method)
}

/// Phase 7: what the access log needs of a request, from its head; its
/// line is written by [`Logged::done`] once the response is done (or the
/// client went away).
pub struct Logged {
    ts: SystemTime,
    id: RequestId,
    started: Instant,
    method: Method,
    path: String,
    session: Option<u32>,
}

/// How a request ended, for its line: the rules of its `status`,
/// `reason` and byte counts, once for both protocols.
#[derive(Clone, Copy, Debug)]
pub struct Outcome {
    pub status: u16,
    pub reason: Option<&'static str>,
    pub upstream: Option<Duration>,
    /// The request body's data bytes limiter read from the client
    /// ([`BodySource::received`]).
    pub bytes_in: u64,
    /// The response body's bytes the client's connection took.
    pub bytes_out: u64,
}

/// The status logged for a request whose client went away before any of
/// its response could be sent (nginx's).
pub const CLIENT_GONE: u16 = 499;

impl Outcome {
    /// An answer of limiter's own.
    pub fn own(answer: &Answer, bytes_in: u64, bytes_out: u64) -> Self {
        Self { status: answer.status.as_u16(), reason: answer.why, upstream: None, bytes_in, bytes_out }
    }

    /// The upstream's response, `status`, answered after `took`.
    pub fn upstream(status: u16, took: Duration, bytes_in: u64) -> Self {
        Self { status, reason: None, upstream: Some(took), bytes_in, bytes_out: 0 }
    }

    /// The response did not reach its end: `kind` says why. A client gone
    /// (or cut) before any byte of its response was sent is logged 499.
    pub fn broke(mut self, kind: Kind) -> Self {
        if matches!(kind, Kind::ClientGone | Kind::ClientCut) && self.bytes_out == 0 && self.status != 101 {
            self.status = CLIENT_GONE;
        }
        self.reason = Some(kind.as_str());
        self
    }
}

impl Logged {
    /// The request's line-to-be, if the access log is on.
    pub fn start(proxy: &Proxy, req: &Request, started: Instant, id: &RequestId) -> Option<Self> {
        proxy.access_log.enabled().then(|| Self {
            ts: SystemTime::now(),
            id: id.clone(),
            started,
            method: req.method.clone(),
            path: String::from_utf8_lossy(req.target()).into_owned(),
            session: req.authorization().map(|a| proxy.admission.session_tag(a)),
        })
    }

    /// A head refused before it became a request: `method` and `path` as
    /// far as they were read (`-` for a head not read as a request at all),
    /// its answer's status and why.
    pub fn refused(
        proxy: &Proxy,
        client: Client,
        (method, path): (&[u8], &[u8]),
        status: u16,
        reason: &'static str,
    ) {
        if !proxy.access_log.enabled() {
            return;
        }
        let log = Self {
            ts: SystemTime::now(),
            id: RequestId::own(),
            started: Instant::now(),
            method: Method::from_bytes(method).unwrap_or_else(|_| Method::from_bytes(b"-").expect("a token")),
            path: String::from_utf8_lossy(path).into_owned(),
            session: None,
        };
        log.done(
            proxy,
            client,
            Outcome { status, reason: Some(reason), upstream: None, bytes_in: 0, bytes_out: 0 },
        );
    }

    pub fn done(self, proxy: &Proxy, client: Client, o: Outcome) {
        proxy.access_log.log(crate::access_log::Entry {
            ts: self.ts,
            id: self.id,
            client: client.addr,
            proto: client.proto.as_str(),
            method: self.method,
            path: self.path,
            status: o.status,
            reason: o.reason,
            bytes_in: o.bytes_in,
            bytes_out: o.bytes_out,
            ms: self.started.elapsed().as_secs_f64() * 1000.0,
            upstream_ms: o.upstream.map(|d| d.as_secs_f64() * 1000.0),
            session: self.session,
        });
    }
}
