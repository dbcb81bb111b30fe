//! The proxy's listeners and workers: one single-threaded event loop per
//! worker thread, each accepting on its own `SO_REUSEPORT` listeners
//! (`http.listen`, and `http.tls.listen`) with its own upstream pool, and
//! each client connection served by hyper on a task of that loop until it
//! closes or the daemon drains: HTTP/1.1, or HTTP/2 when ALPN chose `h2`
//! or a cleartext client sent the HTTP/2 preface (`http.h2c`).

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use hyper::{
    StatusCode,
    server::conn::{http1, http2},
    service::service_fn,
};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::{TcpListener, TcpStream},
    sync::{Notify, watch},
};

use super::{
    Proxy, Tuning,
    counters::HANDSHAKES,
    exchange,
    headers::Client,
    headers::Forwarding,
    io::{ClientIo, H1Flags, Watch},
    native,
    proto::Proto,
    refusal_log::ResetEnd,
    streams::Streams,
    upstream::Pool,
};

/// Binds `addr` `workers` times with `SO_REUSEPORT`, so each worker thread
/// accepts its own share of connections (port 0: the first bind picks the
/// port, the others share it).
pub fn bind(addr: SocketAddr, workers: usize) -> std::io::Result<Vec<std::net::TcpListener>> {
    let mut listeners: Vec<std::net::TcpListener> = Vec::with_capacity(workers);
    for _ in 0..workers.max(1) {
        let at = listeners.first().map_or(Ok(addr), std::net::TcpListener::local_addr)?;
        let socket = socket2::Socket::new(socket2::Domain::for_address(at), socket2::Type::STREAM, None)?;
        socket.set_reuse_address(true)?;
        socket.set_reuse_port(true)?;
        socket.set_nonblocking(true)?;
        socket.bind(&at.into())?;
        socket.listen(4096)?;
        listeners.push(socket.into());
    }
    Ok(listeners)
}

/// Each worker's listeners: `http.listen`, and `http.tls.listen` when set.
pub struct Listeners {
    pub plain: Vec<std::net::TcpListener>,
    pub tls: Option<Vec<std::net::TcpListener>>,
}

/// Runs one worker thread per listener, each with its own single-threaded
/// runtime and upstream pool, as nginx runs one event loop per worker: a
/// request never changes thread, so no cross-thread wake-ups on the hot
/// path. Returns when every worker has stopped after `shutdown`.
pub fn run_workers(
    listeners: Listeners,
    proxy: Arc<Proxy>,
    shutdown: watch::Receiver<bool>,
) -> Vec<std::thread::JoinHandle<()>> {
    let mut tls = listeners.tls.map(Vec::into_iter);
    listeners
        .plain
        .into_iter()
        .enumerate()
        .map(|(i, plain)| {
            let tls = tls.as_mut().and_then(Iterator::next);
            let (proxy, shutdown) = (proxy.clone(), shutdown.clone());
            std::thread::Builder::new()
                .name(format!("http-worker-{i}"))
                .spawn(move || {
                    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                        Ok(rt) => rt,
                        Err(e) => return tracing::error!("HTTP worker {i}: cannot start its runtime: {e}"),
                    };
                    runtime.block_on(async move {
                        let tls = match tls.map(TcpListener::from_std).transpose() {
                            Ok(tls) => tls,
                            Err(e) => return tracing::error!("HTTP worker {i}: http.tls.listen: {e}"),
                        };
                        match TcpListener::from_std(plain) {
                            Ok(plain) => serve(plain, tls, proxy, shutdown).await,
                            Err(e) => tracing::error!("HTTP worker {i}: {e}"),
                        }
                    });
                })
                .expect("spawn an HTTP worker thread")
        })
        .collect()
}

/// Accepts one listener's connection, or waits for ever without one.
async fn accept(listener: Option<&TcpListener>) -> std::io::Result<(TcpStream, SocketAddr)> {
    match listener {
        Some(l) => l.accept().await,
        None => std::future::pending().await,
    }
}

/// Accepts client connections until `shutdown` changes, then drains:
/// the listeners close, each connection finishes the requests it is
/// serving and closes (idle keep-alive connections close at once), and
/// whatever is still open after `http.drainTimeoutMs` is cut: this returns,
/// and the worker's runtime drops the tasks left with it.
pub async fn serve(
    plain: TcpListener,
    tls: Option<TcpListener>,
    proxy: Arc<Proxy>,
    shutdown: watch::Receiver<bool>,
) {
    let pool = proxy.pool();
    let native = (proxy.tuning().h1_engine == crate::config::H1Engine::Native)
        .then(|| native::upstream::Pool::new(proxy.upstream().to_owned(), proxy.upstreams.clone()));
    // Connections are counted, not joined: nothing on the accept path
    // wakes up when one ends.
    let open = Arc::new(Open::default());
    let mut stop_rx = shutdown.clone();
    let stop = async move {
        let _ = stop_rx.changed().await;
    };
    tokio::pin!(stop);
    // Each listener's port, for `X-Forwarded-Port`: read once, not per
    // connection.
    let port_of = |l: Option<&TcpListener>| l.and_then(|l| l.local_addr().ok()).map_or(0, |a| a.port());
    let (plain_port, tls_port) = (port_of(Some(&plain)), port_of(tls.as_ref()));
    loop {
        let (accepted, secure) = tokio::select! {
            accepted = plain.accept() => (accepted, false),
            accepted = accept(tls.as_ref()) => (accepted, true),
            () = &mut stop => break,
        };
        match accepted {
            Ok((stream, addr)) if proxy.reset_groups.refuses(addr.ip()) => {
                // Its group's HTTP/2 connections keep ending for resets: a
                // RST now, before a handshake or a byte is read (and no
                // TIME-WAIT left here).
                let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
                drop(stream);
            }
            Ok((stream, addr)) => {
                let counted = Open::track(&open);
                let (proxy, pool, shutdown) = (proxy.clone(), pool.clone(), shutdown.clone());
                let native = native.clone();
                let port = if secure { tls_port } else { plain_port };
                tokio::spawn(async move {
                    connection(stream, (addr, port), secure, proxy, (pool, native), shutdown).await;
                    drop(counted);
                });
            }
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                let key = if secure { "http.tls.listen" } else { "http.listen" };
                tracing::warn!("accept on {key} failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    drop((plain, tls));
    let drain = proxy.tuning().drain_timeout;
    if tokio::time::timeout(drain, open.none()).await.is_err() {
        tracing::warn!(
            connections = open.count.load(Ordering::Relaxed),
            timeout_ms = drain.as_millis() as u64,
            "drain timeout: cutting the connections still open"
        );
    }
}

/// A worker's open client connections.
#[derive(Default)]
struct Open {
    count: AtomicUsize,
    closed_last: Notify,
}

/// One of them, until dropped (with its task, however it ends).
struct Counted(Arc<Open>);

impl Open {
    fn track(open: &Arc<Self>) -> Counted {
        open.count.fetch_add(1, Ordering::Relaxed);
        Counted(open.clone())
    }

    /// Resolves once none is open.
    async fn none(&self) {
        loop {
            let closed = self.closed_last.notified();
            tokio::pin!(closed);
            closed.as_mut().enable();
            if self.count.load(Ordering::Acquire) == 0 {
                return;
            }
            closed.await;
        }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.closed_last.notify_waiters();
        }
    }
}

/// Resolves once `shutdown` is true.
async fn stopping(mut shutdown: watch::Receiver<bool>) {
    while !*shutdown.borrow_and_update() {
        if shutdown.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// hyper's HTTP/1 server as the proxy runs it. The framing watch must
/// agree with this parser (its differential test drives this same
/// builder): a parser setting that changes what a head or a body may be
/// (`ignore_invalid_headers`, say) changes the watch's rules too.
pub(super) fn http1(tuning: &Tuning) -> http1::Builder {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(tuning.header_read_timeout)
        .max_buf_size(tuning.max_header_bytes)
        .keep_alive(true);
    builder
}

/// hyper's HTTP/2 server as the proxy runs it: streams per connection from
/// `http.h2.maxConcurrentStreams`, header lists bounded like HTTP/1 heads,
/// and h2's own bounds on resets kept (see [`super::h2_meter`] for what
/// limiter adds).
fn http2(tuning: &Tuning) -> http2::Builder<TokioExecutor> {
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

/// The 24 bytes a prior-knowledge HTTP/2 client sends first.
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Whether a cleartext connection starts with the HTTP/2 preface, looking
/// without taking (`false` as soon as a byte differs, at EOF, or when the
/// client sends nothing for the head timeout: HTTP/1 handles those).
///
/// A prefix of the preface so far waits for the next bytes to arrive, not
/// for a timer: the peek reports "would block", which clears the socket's
/// readiness until the kernel queues more data. A client that sends
/// `PRI * HTTP/2` and stops costs nothing until the head timeout; one that
/// sends it and closes is done (no more bytes can come).
async fn sends_preface(stream: &TcpStream, within: Duration) -> bool {
    let look = async {
        loop {
            let ready = stream.ready(tokio::io::Interest::READABLE).await?;
            let peeked = stream.try_io(tokio::io::Interest::READABLE, || {
                let mut buf = [0u8; PREFACE.len()];
                let n = stream_peek(stream, &mut buf)?;
                if n == 0 || buf[..n] != PREFACE[..n] {
                    Ok(false)
                } else if n == PREFACE.len() {
                    Ok(true)
                } else {
                    Err(std::io::ErrorKind::WouldBlock.into())
                }
            });
            match peeked {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if ready.is_read_closed() {
                        return Ok(false);
                    }
                }
                other => return other,
            }
        }
    };
    matches!(tokio::time::timeout(within, look).await, Ok(Ok::<_, std::io::Error>(true)))
}

/// A non-blocking `MSG_PEEK` on the connection's socket.
fn stream_peek(stream: &TcpStream, buf: &mut [u8]) -> std::io::Result<usize> {
    use nix::sys::socket::{MsgFlags, recv};
    use std::os::fd::AsRawFd as _;
    recv(stream.as_raw_fd(), buf, MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT).map_err(std::io::Error::from)
}

async fn connection(
    stream: TcpStream,
    (addr, port): (SocketAddr, u16),
    secure: bool,
    proxy: Arc<Proxy>,
    (pool, native): (Arc<Pool>, Option<Arc<native::upstream::Pool>>),
    shutdown: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let c = &proxy.counters;
    c.connections_open.fetch_add(1, Ordering::Relaxed);
    c.connections_total.fetch_add(1, Ordering::Relaxed);
    let tuning = proxy.tuning();
    let trusted = tuning.trusted_forwarders.iter().any(|p| p.contains(addr.ip().to_canonical()));
    let conn = |proto| Conn {
        client: Client { addr, proto, port, trusted },
        proxy: proxy.clone(),
        pool,
        native,
        shutdown,
    };
    let flags = Arc::new(H1Flags::default());
    // Cleartext HTTP/1 inline; TLS and HTTP/2, whose futures are several
    // times larger, boxed: this future is moved into its task on every
    // accept, and sized by its largest branch.
    let result = if secure {
        Box::pin(async {
            match handshake(stream, &tuning, &proxy).await {
                Some((tls, Proto::H2Tls)) => serve_h2(tls, conn(Proto::H2Tls)).await,
                Some((tls, proto)) => serve_h1(tls, conn(proto), flags.clone()).await,
                None => Ok(()),
            }
        })
        .await
    } else if tuning.h2c && Box::pin(sends_preface(&stream, tuning.header_read_timeout)).await {
        Box::pin(serve_h2(stream, conn(Proto::H2c))).await
    } else {
        serve_h1(stream, conn(Proto::H1), flags.clone()).await
    };
    if let Err(e) = result {
        // A head hyper refused never became a request: the access log
        // still gets a line for it, with what hyper answered and why.
        let refused = if e.is_timeout() {
            c.header_timeouts.fetch_add(1, Ordering::Relaxed);
            // hyper says the same of a keep-alive connection that idled
            // past the timeout between requests: only a head begun and
            // not finished is a request refused (nothing is sent either
            // way; 408, as nginx logs its client_header_timeout).
            flags
                .cut_mid_head
                .load(Ordering::Relaxed)
                .then_some((StatusCode::REQUEST_TIMEOUT, "header_timeout"))
        } else if e.is_parse_too_large() {
            c.heads_too_large.fetch_add(1, Ordering::Relaxed);
            c.status(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
            Some((StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, "too_large"))
        } else if e.is_parse() {
            // Framing conflicts are counted as they are found, in ClientIo.
            c.malformed.fetch_add(1, Ordering::Relaxed);
            c.status(StatusCode::BAD_REQUEST);
            Some((StatusCode::BAD_REQUEST, "malformed"))
        } else {
            None
        };
        if let Some((status, reason)) = refused {
            log_refused_head(&proxy, addr, secure, status, reason);
        }
        tracing::debug!(peer = %addr, "client connection ended: {e}");
    }
    c.connections_open.fetch_sub(1, Ordering::Relaxed);
}

/// The access log's line for a head that never became a request.
fn log_refused_head(proxy: &Proxy, addr: SocketAddr, secure: bool, status: StatusCode, reason: &'static str) {
    if !proxy.access_log.enabled() {
        return;
    }
    proxy.access_log.log(crate::access_log::Entry {
        ts: std::time::SystemTime::now(),
        client: addr,
        proto: if secure { Proto::H1Tls } else { Proto::H1 }.as_str(),
        method: hyper::Method::from_bytes(b"-").expect("a token"),
        path: "-".to_owned(),
        status: status.as_u16(),
        reason: Some(reason),
        bytes_in: 0,
        bytes_out: 0,
        ms: 0.0,
        upstream_ms: None,
        session: None,
    });
}

/// The TLS handshake, within `http.tls.handshakeTimeoutMs` and holding no
/// permit; counted by outcome. The protocol is what ALPN chose.
async fn handshake(
    stream: TcpStream,
    tuning: &Tuning,
    proxy: &Proxy,
) -> Option<(tokio_rustls::server::TlsStream<TcpStream>, Proto)> {
    let config = tuning.tls.clone()?;
    let accept = tokio_rustls::TlsAcceptor::from(config).accept(stream);
    let outcome = match tokio::time::timeout(tuning.tls_handshake_timeout, accept).await {
        Err(_) => Err("timeout"),
        Ok(Err(e)) => Err(handshake_failure(&e)),
        Ok(Ok(tls)) => Ok(tls),
    };
    let counted = |name: &str| HANDSHAKES.iter().position(|h| *h == name).unwrap_or(HANDSHAKES.len() - 1);
    match outcome {
        Ok(tls) => {
            proxy.counters.tls_handshakes[counted("ok")].fetch_add(1, Ordering::Relaxed);
            let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
            Some((tls, if h2 { Proto::H2Tls } else { Proto::H1Tls }))
        }
        Err(cause) => {
            proxy.counters.tls_handshakes[counted(cause)].fetch_add(1, Ordering::Relaxed);
            tracing::debug!(cause, "TLS handshake failed");
            None
        }
    }
}

/// The cause label of a failed handshake.
fn handshake_failure(e: &std::io::Error) -> &'static str {
    if let Some(tls) = e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) {
        return match tls {
            rustls::Error::AlertReceived(_) => "alert",
            _ => "protocol",
        };
    }
    match e.kind() {
        std::io::ErrorKind::UnexpectedEof
        | std::io::ErrorKind::ConnectionReset
        | std::io::ErrorKind::BrokenPipe => "closed",
        std::io::ErrorKind::InvalidData => "protocol",
        _ => "io",
    }
}

/// A client connection whose protocol is known, and what serving it needs.
struct Conn {
    client: Client,
    proxy: Arc<Proxy>,
    pool: Arc<Pool>,
    /// The worker's native upstream connections, when the native engine
    /// serves HTTP/1.1 (`http.h1Engine`).
    native: Option<Arc<native::upstream::Pool>>,
    shutdown: watch::Receiver<bool>,
}

impl Conn {
    /// Counts the connection by protocol; the values it is served with.
    fn start(&self) -> Arc<Tuning> {
        self.proxy.counters.connections_by_proto[self.client.proto.index()].fetch_add(1, Ordering::Relaxed);
        self.proxy.tuning()
    }
}

/// One HTTP/1 connection, cleartext or TLS: served by the native engine
/// when it is on (hyper takes over what it hands over), by hyper
/// otherwise.
async fn serve_h1<S>(stream: S, conn: Conn, flags: Arc<H1Flags>) -> Result<(), hyper::Error>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let tuning = conn.start();
    let fwd = Arc::new(Forwarding::new(conn.client));
    let Some(raw) = conn.native.clone() else {
        let io = client_io(stream, Watch::h1(), &tuning, &conn.proxy).with_flags(flags.clone());
        return serve_hyper_h1(io, conn, flags, fwd).await;
    };
    let io = client_io(stream, Watch::Native { between_requests: true }, &tuning, &conn.proxy);
    let served = native::Conn {
        proxy: &conn.proxy,
        pool: &raw,
        client: conn.client,
        fwd: &fwd,
        shutdown: conn.shutdown.clone(),
    };
    // Boxed: the connection's future, copied into its task on every
    // accept, stays small; the engine's state is made once, on the heap.
    match Box::pin(native::serve(io, served)).await {
        native::Ended::Closed => Ok(()),
        native::Ended::HeadTimeout { mid_head } => {
            // As hyper's header timeout is counted and logged (see
            // `connection`).
            conn.proxy.counters.header_timeouts.fetch_add(1, Ordering::Relaxed);
            if mid_head {
                let secure = conn.client.proto == Proto::H1Tls;
                log_refused_head(
                    &conn.proxy,
                    conn.client.addr,
                    secure,
                    StatusCode::REQUEST_TIMEOUT,
                    "header_timeout",
                );
            }
            Ok(())
        }
        native::Ended::HandOver(mut io, read) => {
            io.hand_over(read, flags.clone());
            Box::pin(serve_hyper_h1(*io, conn, flags, fwd)).await
        }
    }
}

/// One HTTP/1 connection served by hyper.
async fn serve_hyper_h1<S>(
    io: ClientIo<S>,
    conn: Conn,
    flags: Arc<H1Flags>,
    fwd: Arc<Forwarding>,
) -> Result<(), hyper::Error>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let tuning = conn.proxy.tuning();
    let Conn { client, proxy, pool, shutdown, .. } = conn;
    let asked = flags;
    let service = {
        let (proxy, asked) = (proxy.clone(), asked.clone());
        service_fn(move |req| {
            asked.asked.store(true, Ordering::Relaxed);
            exchange::serve(req, proxy.clone(), pool.clone(), client, None, fwd.clone())
        })
    };
    let conn = http1(&tuning).serve_connection(TokioIo::new(io), service).with_upgrades();
    tokio::pin!(conn);
    tokio::select! {
        result = conn.as_mut() => result,
        () = stopping(shutdown) => {
            // A connection accepted just before the listener closed may
            // have its first request on the way: wait for it a moment
            // rather than close it unanswered (a handover's clients would
            // see "closed before a response").
            let grace = tokio::time::Instant::now() + FIRST_REQUEST_GRACE;
            while !asked.asked.load(Ordering::Relaxed) && tokio::time::Instant::now() < grace {
                tokio::select! {
                    result = conn.as_mut() => return result,
                    () = tokio::time::sleep(Duration::from_millis(5)) => {}
                }
            }
            // Finish the request in flight (its response goes out without
            // keep-alive), then close; an idle connection closes now.
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    }
}

/// How long a drain waits for the first request of a connection that has
/// sent none yet.
const FIRST_REQUEST_GRACE: Duration = Duration::from_secs(1);

/// One HTTP/2 connection: every stream is a request of its own, admitted
/// or refused on its own; the connection closes (GOAWAY, streams in
/// flight finish) on drain, or after `http.idleTimeoutMs` without an open
/// stream and without a frame from the client (PINGs aside), or once one
/// of its streams was starved ([`super::stream_guard`]); after such a
/// GOAWAY it is cut if it still has not closed `http.idleTimeoutMs` later
/// (what a starved stream left in hyper's send buffer goes with it).
///
/// A connection ended for its stream resets (h2's GOAWAY
/// `ENHANCE_YOUR_CALM`, or the flood meter's cut for `RST_STREAM`) is
/// counted and logged, rate-limited ([`super::refusal_log::ResetLog`]).
async fn serve_h2<S>(stream: S, conn: Conn) -> Result<(), hyper::Error>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (proxy, client) = (conn.proxy.clone(), conn.client.addr.ip());
    let streams = Arc::new(Streams::default());
    let result = drive_h2(stream, conn, streams.clone()).await;
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

async fn drive_h2<S>(stream: S, conn: Conn, streams: Arc<Streams>) -> Result<(), hyper::Error>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let tuning = conn.start();
    let Conn { client, proxy, pool, shutdown, .. } = conn;
    let watch = Watch::h2(streams.activity.clone(), streams.reset_flood.clone());
    let io = client_io(stream, watch, &tuning, &proxy);
    let fwd = Arc::new(Forwarding::new(client));
    let service = {
        let (proxy, streams) = (proxy.clone(), streams.clone());
        service_fn(move |req| {
            exchange::serve(req, proxy.clone(), pool.clone(), client, Some(streams.clone()), fwd.clone())
        })
    };
    let conn = http2(&tuning).serve_connection(TokioIo::new(io), service);
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
    // 0) does not hold the connection past the bound, nor its permit past
    // its deadline: the watchdog goes on meanwhile.
    let winding_down = async {
        tokio::select! {
            result = conn.as_mut() => result,
            never = cut_starved(&streams, &tuning, &proxy) => match never {},
        }
    };
    tokio::time::timeout(bound, winding_down).await.unwrap_or(Ok(()))
}

/// Cuts the connection's streams as they starve, for as long as it is
/// polled.
async fn cut_starved(streams: &Streams, tuning: &Tuning, proxy: &Proxy) -> std::convert::Infallible {
    loop {
        streams.watchlist.starved(tuning, &proxy.counters, &proxy.pressure).await;
    }
}

fn client_io<S>(stream: S, watch: Watch, tuning: &Tuning, proxy: &Proxy) -> ClientIo<S> {
    ClientIo::new(
        stream,
        watch,
        tuning.idle_timeout,
        tuning.min_data_rate,
        tuning.linger,
        proxy.counters.clone(),
    )
}
