//! The proxy's listeners and workers: one single-threaded event loop per
//! worker thread, each accepting on its own `SO_REUSEPORT` listeners
//! (`http.listen`, and `http.tls.listen`) with its own upstream pool, and
//! each client connection served on a task of that loop until it closes or
//! the daemon drains: by limiter's HTTP/1.x engine ([`super::h1`]), or by
//! HTTP/2 ([`super::h2`]) when ALPN chose `h2` or a cleartext client sent
//! the HTTP/2 preface (`http.h2c`).

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use tokio::{
    io::{AsyncRead, AsyncWrite, Interest, unix::AsyncFd},
    net::{TcpListener, TcpStream},
    sync::{Notify, watch},
};

use super::{
    Proxy, Tuning,
    counters::HANDSHAKES,
    h1, h2,
    io::ClientIo,
    proto::Proto,
    request::headers::{Client, Forwarding},
    speculative::Speculative,
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
/// path. Returns the workers' join handles; each worker stops after
/// `shutdown`, once its connections have drained.
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
                        match polled(plain) {
                            // On a task of the runtime, not as the future it
                            // blocks on: tokio wakes that one through the
                            // runtime's eventfd, a system call each time a
                            // listener becomes readable.
                            Ok(plain) => {
                                if let Err(e) = tokio::spawn(serve(plain, tls, proxy, shutdown)).await {
                                    tracing::error!("HTTP worker {i} ended: {e}");
                                }
                            }
                            Err(e) => tracing::error!("HTTP worker {i}: {e}"),
                        }
                    });
                })
                .expect("spawn an HTTP worker thread")
        })
        .collect()
}

/// Sets TCP_NODELAY on a listener, which Linux copies to each connection
/// it accepts: one system call per listener (one systemd passed or another
/// daemon bound included) instead of one per connection.
fn nodelay(listener: &impl std::os::fd::AsFd) -> bool {
    socket2::SockRef::from(listener).set_nodelay(true).is_ok()
}

/// `http.listen` in the event loop, readable only: its connections are
/// accepted by [`accept_plain`].
#[allow(unsafe_code, reason = "tokio's registration of a raw descriptor is unsafe")]
fn polled(listener: std::net::TcpListener) -> std::io::Result<AsyncFd<std::net::TcpListener>> {
    // SAFETY: the descriptor is the listener's own, open for as long as the
    // listener lives, and the `AsyncFd` owns the listener.
    Ok(unsafe { AsyncFd::register_with_interest(listener, Interest::READABLE) }?)
}

/// A connection just accepted.
enum Accepted {
    /// From `http.listen`: non-blocking, not in the event loop yet.
    Plain(std::net::TcpStream),
    /// From `http.tls.listen`.
    Tls(TcpStream),
}

impl Accepted {
    fn sock(&self) -> socket2::SockRef<'_> {
        match self {
            Self::Plain(s) => s.into(),
            Self::Tls(s) => s.into(),
        }
    }
}

/// Accepts a connection on `http.listen` without registering it with the
/// event loop (see [`super::speculative`]).
async fn accept_plain(listener: &AsyncFd<std::net::TcpListener>) -> std::io::Result<(Accepted, SocketAddr)> {
    loop {
        let mut ready = listener.readable().await?;
        if let Ok(accepted) = ready.try_io(|l| {
            let (socket, addr) =
                socket2::SockRef::from(l.get_ref()).accept4(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC)?;
            let addr = addr.as_socket().ok_or_else(|| std::io::Error::other("accepted a non-IP peer"))?;
            Ok((Accepted::Plain(socket.into()), addr))
        }) {
            return accepted;
        }
    }
}

/// Accepts one TLS listener's connection, or waits for ever without one.
async fn accept_tls(listener: Option<&TcpListener>) -> std::io::Result<(Accepted, SocketAddr)> {
    match listener {
        Some(l) => l.accept().await.map(|(stream, addr)| (Accepted::Tls(stream), addr)),
        None => std::future::pending().await,
    }
}

/// Accepts client connections until `shutdown` changes, then drains:
/// the listeners close, each connection finishes the requests it is
/// serving and closes (idle keep-alive connections close at once), and
/// whatever is still open after `http.drainTimeoutMs` is cut: this returns,
/// and the worker's runtime drops the tasks left with it.
async fn serve(
    plain: AsyncFd<std::net::TcpListener>,
    tls: Option<TcpListener>,
    proxy: Arc<Proxy>,
    shutdown: watch::Receiver<bool>,
) {
    let pool = proxy.pool();
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
    let port_of = |a: std::io::Result<SocketAddr>| a.map_or(0, |a| a.port());
    let plain_port = port_of(plain.get_ref().local_addr());
    let tls_port = tls.as_ref().map_or(0, |l| port_of(l.local_addr()));
    let inherits_nodelay = nodelay(plain.get_ref()) && tls.as_ref().is_none_or(nodelay);
    loop {
        let (accepted, secure) = tokio::select! {
            accepted = accept_plain(&plain) => (accepted, false),
            accepted = accept_tls(tls.as_ref()) => (accepted, true),
            () = &mut stop => break,
        };
        match accepted {
            Ok((stream, addr)) if proxy.reset_groups.refuses(addr.ip()) => {
                // Its group's HTTP/2 connections keep ending for resets: a
                // RST now, before a handshake or a byte is read (and no
                // TIME-WAIT left here).
                let _ = stream.sock().set_linger(Some(Duration::ZERO));
                drop(stream);
            }
            Ok((stream, addr)) => {
                let counted = Open::track(&open);
                let (proxy, pool, shutdown) = (proxy.clone(), pool.clone(), shutdown.clone());
                let port = if secure { tls_port } else { plain_port };
                if !inherits_nodelay {
                    let _ = stream.sock().set_nodelay(true);
                }
                tokio::spawn(async move {
                    connection(stream, (addr, port), proxy, pool, shutdown).await;
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
    stream: Accepted,
    (addr, port): (SocketAddr, u16),
    proxy: Arc<Proxy>,
    pool: Arc<Pool>,
    shutdown: watch::Receiver<bool>,
) {
    let c = &proxy.counters;
    c.connections_open.fetch_add(1, Ordering::Relaxed);
    c.connections_total.fetch_add(1, Ordering::Relaxed);
    let tuning = proxy.tuning();
    let trusted = tuning.trusted_forwarders.iter().any(|p| p.contains(addr.ip().to_canonical()));
    let client = |proto| Client { addr, proto, port, trusted };
    // Cleartext HTTP/1 inline; TLS and HTTP/2, whose futures are several
    // times larger, boxed: this future is moved into its task on every
    // accept, and sized by its largest branch.
    match stream {
        Accepted::Tls(stream) => {
            Box::pin(async {
                match handshake(stream, &tuning, &proxy).await {
                    Some((tls, Proto::H2Tls)) => {
                        let conn = h2::Session {
                            client: client(Proto::H2Tls),
                            proxy: proxy.clone(),
                            pool,
                            shutdown,
                        };
                        ended_h2(h2::serve(tls, conn).await, addr);
                    }
                    Some((tls, proto)) => {
                        let io = ClientIo::h1(tls, &tuning, proxy.counters.clone());
                        serve_h1(io, client(proto), &proxy, &pool, shutdown).await;
                    }
                    None => {}
                }
            })
            .await;
        }
        Accepted::Plain(stream) if tuning.h2c => {
            // The preface is looked for in the event loop.
            match TcpStream::from_std(stream) {
                Ok(stream) if Box::pin(sends_preface(&stream, tuning.header_read_timeout)).await => {
                    let conn =
                        h2::Session { client: client(Proto::H2c), proxy: proxy.clone(), pool, shutdown };
                    ended_h2(Box::pin(h2::serve(stream, conn)).await, addr);
                }
                Ok(stream) => {
                    let io = ClientIo::h1(Speculative::polled(stream), &tuning, proxy.counters.clone());
                    serve_h1(io, client(Proto::H1), &proxy, &pool, shutdown).await;
                }
                Err(e) => tracing::warn!(peer = %addr, "a connection could not join the event loop: {e}"),
            }
        }
        Accepted::Plain(stream) => {
            let io = ClientIo::h1(Speculative::direct(stream), &tuning, proxy.counters.clone());
            serve_h1(io.closing_on_what_was_read(), client(Proto::H1), &proxy, &pool, shutdown).await;
        }
    }
    c.connections_open.fetch_sub(1, Ordering::Relaxed);
}

fn ended_h2(result: Result<(), hyper::Error>, addr: SocketAddr) {
    if let Err(e) = result {
        tracing::debug!(peer = %addr, "client connection ended: {e}");
    }
}

/// One HTTP/1.x connection, cleartext or TLS.
async fn serve_h1<S>(
    io: ClientIo<S>,
    client: Client,
    proxy: &Arc<Proxy>,
    pool: &Arc<Pool>,
    shutdown: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    proxy.counters.connections_by_proto[client.proto.index()].fetch_add(1, Ordering::Relaxed);
    let fwd = Forwarding::new(client);
    let conn = h1::Session { proxy, pool, client, fwd: &fwd, shutdown };
    // Boxed: the connection's future, copied into its task on every
    // accept, stays small; the engine's state is made once, on the heap.
    Box::pin(h1::serve(io, conn)).await;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn connections_accepted_by_a_listener_with_nodelay_have_it() {
        let listener =
            TcpListener::from_std(bind("127.0.0.1:0".parse().unwrap(), 1).unwrap().remove(0)).unwrap();
        assert!(nodelay(&listener));
        let client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        assert!(accepted.nodelay().unwrap(), "the accepted connection has TCP_NODELAY");
        drop(client);
    }
}
