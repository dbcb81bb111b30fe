//! limiter's HTTP/2 server: hyper's (h2), with every stream a request that
//! goes through the same pipeline phases as an HTTP/1.x request. What is
//! HTTP/2's own: the body comes from the stream ([`H2Body`]), a refusal
//! ends its stream and the connection stays open, the response's
//! connection-specific headers are left out, and the upstream part of each
//! request runs as a task of its own, so that a client that resets its
//! stream does not take the upstream's thread back before the upstream is
//! done (its permit is held until then).
//!
//! A connection closes (GOAWAY, streams in flight finish) on drain, or
//! after `http.idleTimeoutMs` without an open stream and without a frame
//! from the client (PINGs aside), or once one of its streams was starved
//! ([`super::stream_guard`]); after such a GOAWAY it is cut if it still
//! has not closed `http.idleTimeoutMs` later. A connection ended for its
//! stream resets (h2's GOAWAY `ENHANCE_YOUR_CALM`, or the flood meter's
//! cut for `RST_STREAM`) is counted and logged, rate-limited.

use std::{
    convert::Infallible,
    pin::Pin,
    sync::{Arc, atomic::Ordering},
    task::{Context, Poll},
    time::{Duration, Instant},
};

use bytes::Bytes;
use http_body_util::BodyExt as _;
use hyper::{
    body::{Body, Frame, Incoming, SizeHint},
    header::{HeaderName, HeaderValue},
    server::conn::http2,
    service::service_fn,
};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    sync::watch,
};

use super::{
    Proxy, Tuning,
    answer::Answer,
    headers::{Client, Forwarding, Seen, connection_named, is_hop_by_hop},
    http1::Framing,
    io::{ClientIo, Watch},
    pipeline::{self, Admitted, Body as ReplyBody, CLIENT_GONE, Ctx, Logged, Outcome, Reply},
    refusal_log::ResetEnd,
    request::{Refused, Request, Upstreamed},
    stream_guard::{self, BoxError},
    streams::{Open, Streams},
    upstream::{BodySource, Pool, ResponseBody},
};

/// hyper's HTTP/2 server as the proxy runs it: streams per connection from
/// `http.h2.maxConcurrentStreams`, header lists bounded like HTTP/1 heads,
/// and h2's own bounds on resets kept (see [`super::h2_meter`] for what
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
pub struct Conn {
    pub client: Client,
    pub proxy: Arc<Proxy>,
    pub pool: Arc<Pool>,
    pub shutdown: watch::Receiver<bool>,
}

/// Serves one HTTP/2 connection until it closes (see the module's doc).
pub async fn serve<S>(stream: S, conn: Conn) -> Result<(), hyper::Error>
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

async fn drive<S>(stream: S, conn: Conn, streams: Arc<Streams>) -> Result<(), hyper::Error>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let Conn { client, proxy, pool, shutdown } = conn;
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
) -> Result<hyper::Response<H2Body>, Infallible> {
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
            let answer = match refused {
                Refused::Connect => Answer::connect(proxy),
                Refused::Bad(bad) => Answer::bad(proxy, bad),
            };
            return Ok(own(&s, answer, None, open, 0));
        }
    };
    let ctx = Ctx { proxy, tuning: &tuning, client: s.client, started };
    let id = req.id(s.client.trusted);
    let log = Logged::start(proxy, &req, started, &id);
    let class = match pipeline::request_filter(ctx, &req) {
        Ok(class) => class,
        Err(a) => return Ok(own(&s, a, log, open, 0)),
    };
    if let Err(a) = pipeline::admit_at_head(ctx, &req, class) {
        return Ok(own(&s, a, log, open, 0));
    }
    let mut source = H2Body::request(body);
    let received = match pipeline::receive(ctx, &req, &mut source).await {
        Ok(received) => received,
        Err(a) => return Ok(own(&s, a, log, open, 0)),
    };
    let (ticket, permit) = match pipeline::admit(ctx, &req, class).await {
        Ok(admitted) => admitted,
        Err(a) => return Ok(own(&s, a, log, open, received.bytes.len() as u64)),
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
    let method = req.method.clone();
    tokio::spawn(async move {
        let admitted = Admitted {
            proxy: &task_proxy,
            tuning: &task_tuning,
            pool: &pool,
            head,
            method,
            upgrade: false,
            received,
            framing,
            ticket,
            permit,
            started,
            id,
        };
        let mut bytes_in = 0;
        let reply = pipeline::forward(admitted, source, &mut bytes_in).await;
        if let Err((reply, bytes_in, log)) = tx.send((reply, bytes_in, log)) {
            // The stream is gone: a response body still streaming is read to
            // its end in the background, holding its permit.
            let upstream = match &reply {
                Reply::Upstream { took, .. } => Some(*took),
                _ => None,
            };
            if let Some(log) = log {
                let out = Outcome { status: CLIENT_GONE, reason: None, upstream, bytes_in, bytes_out: 0 };
                log.done(&task_proxy, client, out);
            }
        }
    });
    let Ok((reply, bytes_in, log)) = rx.await else {
        let answer = Answer::own(proxy, hyper::StatusCode::BAD_GATEWAY, "502 Bad Gateway\n");
        return Ok(own(&s, answer, None, open, 0));
    };
    Ok(match reply {
        Reply::Own(answer) => own(&s, answer, log, open, bytes_in),
        Reply::Upstream { head, head_bytes, body, took } => {
            let mut response = hyper::Response::new(H2Body::empty());
            *response.status_mut() =
                hyper::StatusCode::from_u16(head.status).unwrap_or(hyper::StatusCode::BAD_GATEWAY);
            let headers = response.headers_mut();
            let seen = Seen::of_names(head.fields.iter().map(|f| f.name.get(&head_bytes)));
            let named: Vec<&[u8]> = if seen.connection() {
                connection_named(
                    head.fields
                        .iter()
                        .filter(|f| f.name.get(&head_bytes).eq_ignore_ascii_case(b"connection"))
                        .map(|f| f.value.get(&head_bytes)),
                )
                .collect()
            } else {
                Vec::new()
            };
            for f in &head.fields {
                let name = f.name.get(&head_bytes);
                if (seen.any_hop_by_hop() && is_hop_by_hop(name, &named))
                    || name.eq_ignore_ascii_case(b"content-length")
                {
                    continue;
                }
                if let (Ok(name), Ok(value)) =
                    (HeaderName::from_bytes(name), HeaderValue::from_bytes(f.value.get(&head_bytes)))
                {
                    headers.append(name, value);
                }
            }
            let length = match &body {
                ReplyBody::Whole(bytes) if head.framing != Framing::None => Some(bytes.len() as u64),
                ReplyBody::Whole(_) => head.length.filter(|_| head.status != 204),
                ReplyBody::Stream { first, rest } => rest.remaining().map(|n| first.len() as u64 + n),
            };
            if let Some(n) = length {
                headers.insert(hyper::header::CONTENT_LENGTH, HeaderValue::from(n));
            }
            let body = match body {
                ReplyBody::Whole(bytes) if bytes.is_empty() => H2Body::empty(),
                // On HTTP/2 a starved stream must not keep its bytes for ever.
                ReplyBody::Whole(bytes) => H2Body::guarded(stream_guard::guard(
                    http_body_util::Full::new(bytes).map_err(|never| match never {}).boxed_unsync(),
                    false,
                    &s.streams.watchlist,
                    None,
                )),
                ReplyBody::Stream { first, rest } => {
                    let cut = Arc::new(std::sync::atomic::AtomicBool::new(false));
                    H2Body::guarded(stream_guard::guard(
                        StreamBody::new(first, rest, cut.clone()).boxed_unsync(),
                        true,
                        &s.streams.watchlist,
                        Some(cut),
                    ))
                }
            };
            let status = head.status;
            let (proxy, client) = (proxy.clone(), s.client);
            response.map(|_| {
                body.finally(open, move |bytes_out| {
                    if let Some(log) = log {
                        let out = Outcome { status, reason: None, upstream: Some(took), bytes_in, bytes_out };
                        log.done(&proxy, client, out);
                    }
                })
            })
        }
        // Upgrades are HTTP/1's only.
        Reply::Upgraded { .. } => {
            let answer = Answer::own(proxy, hyper::StatusCode::BAD_GATEWAY, "502 Bad Gateway\n");
            own(&s, answer, log, open, bytes_in)
        }
    })
}

/// An answer of limiter's own on a stream: it ends that stream only.
fn own(
    s: &Shared,
    answer: Answer,
    log: Option<Logged>,
    open: Open,
    bytes_in: u64,
) -> hyper::Response<H2Body> {
    let proxy = &s.proxy;
    if answer.refused.is_some() {
        proxy.counters.h2_streams_refused.fetch_add(1, Ordering::Relaxed);
    }
    answer.sent(proxy);
    let (status, reason) = (answer.status.as_u16(), answer.reason());
    let (proxy, client) = (proxy.clone(), s.client);
    answer.into_h2::<H2Body>().map(|body| {
        body.finally(open, move |bytes_out| {
            if let Some(log) = log {
                log.done(&proxy, client, Outcome { status, reason, upstream: None, bytes_in, bytes_out });
            }
        })
    })
}

/// The bodies of a stream: its request's, as the pipeline reads it, and
/// its response's, as hyper sends it.
pub enum H2Body {
    /// The request body hyper hands over.
    Request(Incoming),
    /// A response body in memory.
    Full(Option<Bytes>, Done),
    /// A response body under the stream guard.
    Guarded(stream_guard::Guarded, Done),
}

/// What a response body does when it is done (or dropped): the access log's
/// line with the bytes sent, and its place among the open streams.
#[derive(Default)]
pub struct Done {
    sent: u64,
    on_done: Option<Box<dyn FnOnce(u64) + Send>>,
    _open: Option<Open>,
}

impl Done {
    fn fire(&mut self) {
        if let Some(f) = self.on_done.take() {
            f(self.sent);
        }
    }
}

impl Drop for Done {
    fn drop(&mut self) {
        self.fire();
    }
}

impl H2Body {
    fn request(body: Incoming) -> Self {
        Self::Request(body)
    }

    fn empty() -> Self {
        Self::Full(None, Done::default())
    }

    fn guarded(body: stream_guard::Guarded) -> Self {
        Self::Guarded(body, Done::default())
    }

    /// Calls `f` with the bytes sent once the body is done or dropped, and
    /// holds the stream open until then.
    fn finally(mut self, open: Open, f: impl FnOnce(u64) + Send + 'static) -> Self {
        if let Self::Full(_, done) | Self::Guarded(_, done) = &mut self {
            done.on_done = Some(Box::new(f));
            done._open = Some(open);
        }
        self
    }
}

impl From<Bytes> for H2Body {
    fn from(bytes: Bytes) -> Self {
        Self::Full((!bytes.is_empty()).then_some(bytes), Done::default())
    }
}

impl BodySource for H2Body {
    async fn next(&mut self) -> Result<Option<Bytes>, ()> {
        let Self::Request(body) = self else { return Ok(None) };
        loop {
            match body.frame().await {
                None => return Ok(None),
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) if data.is_empty() => {}
                    Ok(data) => return Ok(Some(data)),
                    // Trailers are dropped.
                    Err(_) => {}
                },
                Some(Err(e)) => {
                    tracing::debug!("request body: {e}");
                    return Err(());
                }
            }
        }
    }
}

impl Body for H2Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            Self::Request(_) => Poll::Ready(None),
            Self::Full(bytes, done) => match bytes.take() {
                Some(b) => {
                    done.sent += b.len() as u64;
                    done.fire();
                    Poll::Ready(Some(Ok(Frame::data(b))))
                }
                None => {
                    done.fire();
                    Poll::Ready(None)
                }
            },
            Self::Guarded(body, done) => {
                let poll = Pin::new(&mut *body).poll_frame(cx);
                match &poll {
                    Poll::Ready(Some(Ok(frame))) => {
                        done.sent += frame.data_ref().map_or(0, |d| d.len() as u64);
                        if body.is_end_stream() {
                            done.fire();
                        }
                    }
                    Poll::Ready(_) => done.fire(),
                    Poll::Pending => {}
                }
                poll
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Request(_) => true,
            Self::Full(bytes, _) => bytes.is_none(),
            Self::Guarded(body, _) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Request(_) => SizeHint::with_exact(0),
            Self::Full(bytes, _) => SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64)),
            Self::Guarded(body, _) => body.size_hint(),
        }
    }
}

/// A response body streamed from the upstream: what was read ahead, then
/// the rest as it comes (its permit held until the upstream's last byte).
/// Dropped before its end, the rest is followed to the upstream's end; if
/// the stream guard cut it (`cut`), its connection closes instead.
struct StreamBody {
    first: Option<Bytes>,
    rest: Box<ResponseBody>,
    cut: Arc<std::sync::atomic::AtomicBool>,
}

impl StreamBody {
    fn new(first: Bytes, rest: Box<ResponseBody>, cut: Arc<std::sync::atomic::AtomicBool>) -> Self {
        Self { first: (!first.is_empty()).then_some(first), rest, cut }
    }
}

impl Drop for StreamBody {
    fn drop(&mut self) {
        if self.cut.load(Ordering::Relaxed) {
            self.rest.close();
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
            Poll::Ready(Err(())) => Poll::Ready(Some(Err("the upstream's response broke off".into()))),
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
