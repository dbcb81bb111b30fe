//! limiter's HTTP/2 server: hyper's (h2), with every stream a request that
//! goes through the same pipeline phases as an HTTP/1.x request. What is
//! HTTP/2's own: the body comes from the stream ([`body::RequestBody`]), a
//! refusal ends its stream and the connection stays open, and the upstream
//! part of each request runs as a task of its own, so that a client that
//! resets its stream does not take the upstream's thread back before the
//! upstream is done: its permit is held while the upstream's answer is
//! followed, for at most `http.upstreamAbandonMs` ([`super::upstream::abandon`]).
//!
//! A connection closes (GOAWAY, streams in flight finish) on drain, or
//! after `http.idleTimeoutMs` without an open stream and without a frame
//! from the client (PINGs aside), or once one of its streams was starved
//! ([`guard`]); after such a GOAWAY it is cut if it still
//! has not closed `http.idleTimeoutMs` later. A connection ended for its
//! stream resets (h2's GOAWAY `ENHANCE_YOUR_CALM`, or the flood meter's
//! cut for `RST_STREAM`) is counted and logged, rate-limited.

mod body;
pub(crate) mod guard;
pub(crate) mod meter;
pub(crate) mod reset_groups;
pub(crate) mod streams;

use std::{
    convert::Infallible,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use http_body_util::BodyExt as _;
use hyper::{
    body::{Body as _, Incoming},
    header::{HeaderName, HeaderValue},
    server::conn::http2,
    service::service_fn,
};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    sync::watch,
};

use self::{
    body::{RequestBody, ResponseBody, StreamBody},
    guard::guard,
    streams::{Open, Streams},
};
use super::{
    Proxy, Tuning,
    answer::Answer,
    error::{Error, Kind},
    io::{ClientIo, Watch},
    log_lines::ResetEnd,
    pipeline::{self, Admitted, Body, Ctx, Logged, Outcome, Reply},
    request::{
        Request, Upstreamed,
        headers::{Client, Forwarding, response_lines},
    },
    upstream::{BodySource as _, Pool},
};
use crate::request_id::RequestId;

/// hyper's HTTP/2 server as the proxy runs it: streams per connection from
/// `http.h2.maxConcurrentStreams`, header lists bounded like HTTP/1 heads,
/// and h2's own bounds on resets kept (see [`meter`] for what
/// limiter adds).
fn builder(tuning: &Tuning) -> http2::Builder<TokioExecutor> {
    let mut builder = http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(tuning.h2_max_concurrent_streams)
        .max_header_list_size(u32::try_from(tuning.max_header_bytes).unwrap_or(u32::MAX))
        .max_pending_accept_reset_streams(20)
        .max_local_error_reset_streams(1024)
        // A peer that stops answering PINGs is gone.
        .keep_alive_interval(Some(tuning.idle_timeout / 2))
        .keep_alive_timeout(Duration::from_secs(20));
    builder
}

/// What one connection is served with.
pub struct Session {
    pub client: Client,
    pub proxy: Arc<Proxy>,
    pub pool: Arc<Pool>,
    pub shutdown: watch::Receiver<bool>,
}

/// Serves one HTTP/2 connection until it closes (see the module's doc).
pub async fn serve<S>(stream: S, conn: Session) -> Result<(), hyper::Error>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (proxy, client) = (conn.proxy.clone(), conn.client.addr.ip());
    let streams = Arc::new(Streams::default());
    let result = drive(stream, conn, streams.clone()).await;
    let ended = if streams.reset_flood.load(Ordering::Relaxed) {
        Some(ResetEnd::Meter)
    } else {
        result.as_ref().err().filter(|e| is_reset_goaway(e)).map(|_| ResetEnd::GoAway)
    };
    if let Some(ended) = ended {
        if ended == ResetEnd::GoAway {
            proxy.counters.h2_reset_goaways.fetch_add(1, Ordering::Relaxed);
        }
        proxy.counters.reset_log.note(client, ended);
        proxy.reset_groups.note(client);
    }
    result
}

/// Whether h2 ended the connection with its GOAWAY `ENHANCE_YOUR_CALM`: too
/// many streams the client reset before they were accepted, or too many
/// the server had to reset.
fn is_reset_goaway(e: &hyper::Error) -> bool {
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        if let Some(h2) = c.downcast_ref::<h2::Error>() {
            return h2.is_go_away() && h2.is_library() && h2.reason() == Some(h2::Reason::ENHANCE_YOUR_CALM);
        }
        cause = c.source();
    }
    false
}

/// What every stream of a connection shares.
struct Shared {
    client: Client,
    proxy: Arc<Proxy>,
    pool: Arc<Pool>,
    fwd: Forwarding,
    streams: Arc<Streams>,
}

async fn drive<S>(stream: S, conn: Session, streams: Arc<Streams>) -> Result<(), hyper::Error>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let Session { client, proxy, pool, shutdown } = conn;
    proxy.counters.connections_by_proto[client.proto.index()].fetch_add(1, Ordering::Relaxed);
    let tuning = proxy.tuning();
    let watch = Watch::h2(streams.activity.clone(), streams.reset_flood.clone());
    let io = ClientIo::new(
        stream,
        watch,
        tuning.idle_timeout,
        tuning.min_data_rate,
        tuning.linger,
        proxy.counters.clone(),
    );
    let shared = Arc::new(Shared {
        client,
        proxy: proxy.clone(),
        pool,
        fwd: Forwarding::new(client),
        streams: streams.clone(),
    });
    let service = service_fn(move |req| serve_stream(req, shared.clone()));
    let conn = builder(&tuning).serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    let idle = tuning.idle_timeout;
    let closing = tokio::select! {
        result = conn.as_mut() => return result,
        () = stopping(shutdown) => false,
        () = streams.idle_for(idle) => {
            proxy.counters.h2_idle_closed.fetch_add(1, Ordering::Relaxed);
            true
        }
        // A starved stream holds a chunk inside hyper that only the
        // connection's end frees.
        () = streams.watchlist.starved(&tuning, &proxy.counters, &proxy.pressure) => true,
    };
    conn.as_mut().graceful_shutdown();
    let bound = if closing { idle } else { tuning.drain_timeout };
    // Streams in flight finish; one a client holds open (a window kept at
    // 0) does not hold the connection past the bound: the watchdog goes on
    // meanwhile.
    let winding_down = async {
        tokio::select! {
            result = conn.as_mut() => result,
            never = cut_starved(&streams, &tuning, &proxy) => match never {},
        }
    };
    tokio::time::timeout(bound, winding_down).await.unwrap_or(Ok(()))
}

/// Resolves once `shutdown` is true.
async fn stopping(mut shutdown: watch::Receiver<bool>) {
    while !*shutdown.borrow_and_update() {
        if shutdown.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Cuts the connection's streams as they starve, for as long as it is
/// polled.
async fn cut_starved(streams: &Streams, tuning: &Tuning, proxy: &Proxy) -> Infallible {
    loop {
        streams.watchlist.starved(tuning, &proxy.counters, &proxy.pressure).await;
    }
}

/// One stream: the pipeline's phases, the upstream part as a task of its
/// own, and the response for hyper.
async fn serve_stream(
    req: hyper::Request<Incoming>,
    s: Arc<Shared>,
) -> Result<hyper::Response<ResponseBody>, Infallible> {
    // Open until the response body is done, not only its head: a long
    // download keeps its connection from counting as idle.
    let open = s.streams.open();
    // A stream reset in the same read as its HEADERS (rapid reset) is
    // already cancelled when hyper first polls this: yielding once lets
    // hyper see the RST_STREAM and drop the stream before it takes a
    // permit or reaches the upstream.
    tokio::task::yield_now().await;
    let started = Instant::now();
    let proxy = &s.proxy;
    let tuning = proxy.tuning();
    proxy.counters.requests_by_proto[s.client.proto.index()].fetch_add(1, Ordering::Relaxed);
    let (parts, body) = req.into_parts();
    let req = match Request::from_h2(&parts, body.is_end_stream()) {
        Ok(req) => req,
        Err(refused) => {
            let answer = Answer::refused_request(proxy, refused);
            let target = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
            let seen = (parts.method.as_str().as_bytes(), target.as_bytes());
            Logged::refused(proxy, s.client, seen, answer.status.as_u16(), answer.why.unwrap_or("-"));
            return Ok(own(&s, answer, None, open, 0));
        }
    };
    let id = req.id(s.client.trusted);
    let ctx = Ctx { proxy, tuning: &tuning, client: s.client, started, id: &id };
    let log = Logged::start(proxy, &req, started, &id);
    let class = match pipeline::request_filter(ctx, &req) {
        Ok(class) => class,
        Err(a) => return Ok(own(&s, a, log, open, 0)),
    };
    if let Err(a) = pipeline::admit_at_head(ctx, &req, class) {
        return Ok(own(&s, a, log, open, 0));
    }
    let mut source = RequestBody::new(body);
    let received = match pipeline::receive(ctx, &req, &mut source).await {
        Ok(received) => received,
        Err(a) => return Ok(own(&s, a, log, open, source.received())),
    };
    let (ticket, permit) = match pipeline::admit(ctx, &req, class).await {
        Ok(admitted) => admitted,
        Err(a) => return Ok(own(&s, a, log, open, source.received())),
    };
    let framing = pipeline::outgoing(&req, &received);
    let mut head = Vec::with_capacity(512);
    let upstreamed = Upstreamed {
        fwd: &s.fwd,
        upstream: proxy.upstream(),
        body: framing,
        upgrade: false,
        id: &id,
        underscores: tuning.underscores_in_headers,
    };
    let dropped = req.write_upstream(&mut head, &upstreamed);
    if dropped > 0 {
        proxy.counters.underscore_fields_dropped.fetch_add(u64::from(dropped), Ordering::Relaxed);
    }
    // The upstream's part goes on whatever becomes of the stream.
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (task_proxy, task_tuning, pool, client) = (proxy.clone(), tuning.clone(), s.pool.clone(), s.client);
    let (method, task_id) = (req.method.clone(), id.clone());
    tokio::spawn(async move {
        let admitted = Admitted {
            proxy: &task_proxy,
            tuning: &task_tuning,
            pool: &pool,
            peer: client.addr,
            head,
            method,
            upgrade: false,
            received,
            framing,
            ticket,
            permit,
            started,
            id: task_id.clone(),
        };
        let reply = pipeline::forward(admitted, &mut source).await;
        let bytes_in = source.received();
        if let Err((reply, bytes_in, log)) = tx.send((reply, bytes_in, log)) {
            // The stream is gone before its response: a body still
            // streaming is followed as `reply` drops
            // ([`super::upstream::abandon`]).
            let out = match &reply {
                Reply::Upstream { head, took, .. } => Outcome::upstream(head.status, *took, bytes_in),
                Reply::Own(answer) => Outcome::own(answer, bytes_in, 0),
                Reply::Upgraded { .. } => Outcome::upstream(101, Duration::ZERO, bytes_in),
            };
            gone(&task_proxy, client, &task_id, log, out, Kind::ClientGone);
        }
    });
    let Ok((reply, bytes_in, log)) = rx.await else {
        // The task ended without an answer: limiter's own failure.
        return Ok(own(&s, Answer::internal(proxy), None, open, 0));
    };
    Ok(match reply {
        Reply::Own(answer) => own(&s, answer, log, open, bytes_in),
        Reply::Upstream { head, head_bytes, body, took } => {
            let mut response = hyper::Response::new(ResponseBody::empty());
            *response.status_mut() =
                hyper::StatusCode::from_u16(head.status).unwrap_or(hyper::StatusCode::BAD_GATEWAY);
            let headers = response.headers_mut();
            for (name, value) in response_lines(&head, &head_bytes) {
                if let (Ok(name), Ok(value)) = (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
                {
                    headers.append(name, value);
                }
            }
            if let Some(n) = body.length(&head) {
                headers.insert(hyper::header::CONTENT_LENGTH, HeaderValue::from(n));
            }
            let cut = Arc::new(AtomicBool::new(false));
            let watchlist = &s.streams.watchlist;
            let body = match body {
                Body::Whole(bytes) if bytes.is_empty() => ResponseBody::empty(),
                // On HTTP/2 a starved stream must not keep its bytes for ever.
                Body::Whole(bytes) => ResponseBody::guarded(
                    guard(
                        http_body_util::Full::new(bytes).map_err(|never| match never {}).boxed_unsync(),
                        false,
                        watchlist,
                        cut.clone(),
                    ),
                    cut,
                ),
                Body::Stream { first, rest } => {
                    let noted = (proxy.counters.clone(), s.client.addr, id.clone());
                    let stream = StreamBody::new(first, rest, cut.clone(), noted);
                    ResponseBody::guarded(guard(stream.boxed_unsync(), true, watchlist, cut.clone()), cut)
                }
            };
            let out = Outcome::upstream(head.status, took, bytes_in);
            let (proxy, client) = (proxy.clone(), s.client);
            response.map(|_| {
                body.finally(open, move |bytes_out, broke| {
                    let out = Outcome { bytes_out, ..out };
                    match broke {
                        Some(kind) => gone(&proxy, client, &id, log, out, kind),
                        None => {
                            if let Some(log) = log {
                                log.done(&proxy, client, out);
                            }
                        }
                    }
                })
            })
        }
        // HTTP/2's requests never ask for an upgrade (an upstream's 101 to
        // one is its failure): nothing comes here.
        Reply::Upgraded { .. } => own(&s, Answer::internal(proxy), log, open, bytes_in),
    })
}

/// A response that did not reach its end on the stream: `kind` says why
/// (the client's reasons counted here; an upstream body that broke off was
/// counted where it broke), and its line.
fn gone(proxy: &Proxy, client: Client, id: &RequestId, log: Option<Logged>, out: Outcome, kind: Kind) {
    if !kind.is_upstream() {
        let error = Error::rule(kind, "the client reset the stream or closed its connection");
        proxy.counters.note(&error, client.addr, id);
    }
    if let Some(log) = log {
        log.done(proxy, client, out.broke(kind));
    }
}

/// An answer of limiter's own on a stream: it ends that stream only.
fn own(
    s: &Shared,
    answer: Answer,
    log: Option<Logged>,
    open: Open,
    bytes_in: u64,
) -> hyper::Response<ResponseBody> {
    let proxy = &s.proxy;
    if answer.refused.is_some() {
        proxy.counters.h2_streams_refused.fetch_add(1, Ordering::Relaxed);
    }
    answer.sent(proxy);
    let out = Outcome::own(&answer, bytes_in, 0);
    let (proxy, client) = (proxy.clone(), s.client);
    answer.into_h2::<ResponseBody>().map(|body| {
        body.finally(open, move |bytes_out, _| {
            if let Some(log) = log {
                log.done(&proxy, client, Outcome { bytes_out, ..out });
            }
        })
    })
}
