//! The upstream connections: plain keep-alive sockets, an idle list per
//! worker, and one cap on every worker's connections together
//! (`http.maxUpstreamConnections`, [`Upstreams`]). Requests of every
//! downstream protocol (HTTP/1.x and HTTP/2, cleartext or TLS) share them.
//!
//! A request takes the connection returned last (its socket is the
//! warmest), or connects within `http.connectTimeoutMs` while the cap
//! allows. At the cap it takes an idle connection of another worker's (the
//! socket moved to this worker's event loop: two `epoll_ctl` calls, no new
//! connection), or waits for one to come back until the same timeout,
//! then is refused with 503 `upstream_full`: limiter's own cap, never a
//! breaker failure.
//!
//! An idle connection the upstream closed is noticed without a system
//! call: its socket turned readable while it sat in the list (a FIN, or
//! bytes nobody asked for), which the runtime already knows; only then is
//! it peeked, and dropped.

use std::{
    io,
    sync::{
        Arc, Mutex, MutexGuard, Weak,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use bytes::BytesMut;
use tokio::{io::Interest, net::TcpStream, sync::Notify};

use crate::proxy::deadline::Deadline;

/// Every worker's upstream connections together, and their cap.
#[derive(Default)]
pub struct Upstreams {
    /// `http.maxUpstreamConnections` in force (`http.maxThreads` when the
    /// key is 0).
    limit: AtomicUsize,
    /// Connections open or connecting: the slots held.
    open: AtomicUsize,
    /// Connects in progress.
    connecting: AtomicUsize,
    /// A slot was freed.
    freed: Notify,
    /// Each worker's pool, for an idle connection taken at the cap.
    pools: Mutex<Vec<Weak<Pool>>>,
    /// Connects that succeeded, and that failed (timeouts included).
    pub connects_ok: AtomicU64,
    pub connects_failed: AtomicU64,
    /// Exchanges limiter gave up on while the upstream went on with them,
    /// followed to their end holding their permits.
    pub abandoned: super::abandon::Abandoned,
    /// Idle connections of one worker's pool taken by another worker's
    /// request at the cap.
    pub borrowed: AtomicU64,
    /// Requests sent again on another connection after a pooled one closed
    /// before any byte of their response came.
    pub retries: AtomicU64,
}

impl Upstreams {
    pub fn new(limit: usize) -> Arc<Self> {
        let u = Self::default();
        u.limit.store(limit.max(1), Ordering::Relaxed);
        Arc::new(u)
    }

    /// Applies a reloaded limit: connections beyond it close as they
    /// finish their requests ([`Pool::put`]); none is cut.
    pub fn set_limit(&self, limit: usize) {
        self.limit.store(limit.max(1), Ordering::Relaxed);
    }

    pub fn limit(&self) -> usize {
        self.limit.load(Ordering::Relaxed)
    }

    /// Connections open or connecting now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Connects in progress now.
    pub fn connecting(&self) -> usize {
        self.connecting.load(Ordering::Relaxed)
    }

    /// A slot under the cap, if one is free.
    fn slot(self: &Arc<Self>) -> Option<Slot> {
        let limit = self.limit();
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| (n < limit).then_some(n + 1))
            .ok()
            .map(|_| Slot(self.clone()))
    }

    /// An idle connection of a pool other than `mine`, its socket taken
    /// out of that worker's event loop.
    fn take_idle_elsewhere(&self, mine: &Pool) -> Option<Moving> {
        let pools: Vec<Arc<Pool>> = {
            let mut pools = lock(&self.pools);
            pools.retain(|p| p.strong_count() > 0);
            pools.iter().filter_map(Weak::upgrade).collect()
        };
        let found = pools.iter().filter(|p| !std::ptr::eq(p.as_ref(), mine)).find_map(|p| p.give_one());
        if found.is_some() {
            self.borrowed.fetch_add(1, Ordering::Relaxed);
        }
        found
    }
}

impl std::fmt::Debug for Upstreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstreams")
            .field("limit", &self.limit)
            .field("open", &self.open)
            .field("connecting", &self.connecting)
            .finish_non_exhaustive()
    }
}

/// One place under the cap, held by a connection (or its connect) until it
/// closes.
pub struct Slot(Arc<Upstreams>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
        self.0.freed.notify_waiters();
    }
}

/// One upstream connection and what was read from it past the last
/// response (nothing, on a connection that may be reused).
pub struct UpstreamConn {
    pub stream: TcpStream,
    pub buf: BytesMut,
    /// Carried a request before this one.
    pub reused: bool,
    /// The timer of each answer's `http.upstreamTimeoutMs`.
    pub deadline: Deadline,
    _slot: Slot,
}

impl UpstreamConn {
    /// The socket, and what the upstream sent past its last head, for a
    /// tunnel: it no longer counts under the cap.
    pub fn into_tunnel(self) -> (TcpStream, BytesMut) {
        (self.stream, self.buf)
    }
}

/// The read buffer of a new connection.
pub const BUF: usize = 16 * 1024;

struct Idle {
    conn: UpstreamConn,
    since: Instant,
}

/// Why no connection could be had.
#[derive(Debug)]
pub enum GetError {
    /// Connecting failed or timed out.
    Connect(io::Error),
    /// The cap held for the whole connect timeout.
    Full,
}

/// One worker's upstream connections.
pub struct Pool {
    addr: String,
    shared: Arc<Upstreams>,
    idle: Mutex<Vec<Idle>>,
    returned: Notify,
}

/// How often a request waiting at the cap looks again (a slot freed by
/// another worker is announced, but a look is cheap).
const RECHECK: Duration = Duration::from_millis(5);

/// Most idle connections one worker keeps (only a burst's leftovers).
const MAX_IDLE: usize = 1024;

impl Pool {
    /// A worker's pool, counted in `shared`.
    pub fn new(addr: String, shared: Arc<Upstreams>) -> Arc<Self> {
        let pool =
            Arc::new(Self { addr, shared: shared.clone(), idle: Mutex::default(), returned: Notify::new() });
        lock(&shared.pools).push(Arc::downgrade(&pool));
        pool
    }

    pub fn shared(&self) -> &Upstreams {
        &self.shared
    }

    pub fn shared_arc(&self) -> Arc<Upstreams> {
        self.shared.clone()
    }

    fn take_idle(&self, idle_timeout: Duration) -> Option<UpstreamConn> {
        let mut idle = lock(&self.idle);
        let now = Instant::now();
        while let Some(i) = idle.pop() {
            if now.duration_since(i.since) >= idle_timeout || !still_open(&i.conn.stream) {
                continue;
            }
            let mut conn = i.conn;
            conn.reused = true;
            return Some(conn);
        }
        None
    }

    /// A connection for one request: an idle one, a new one, or at the cap
    /// another worker's idle one (see the module's doc).
    pub async fn get(
        &self,
        connect_timeout: Duration,
        idle_timeout: Duration,
    ) -> Result<UpstreamConn, GetError> {
        if let Some(conn) = self.take_idle(idle_timeout) {
            return Ok(conn);
        }
        let deadline = tokio::time::Instant::now() + connect_timeout;
        loop {
            let returned = self.returned.notified();
            let freed = self.shared.freed.notified();
            tokio::pin!(returned, freed);
            returned.as_mut().enable();
            freed.as_mut().enable();
            if let Some(conn) = self.take_idle(idle_timeout) {
                return Ok(conn);
            }
            if let Some(slot) = self.shared.slot() {
                return self.connect(slot, deadline).await;
            }
            if let Some(moved) = self.shared.take_idle_elsewhere(self)
                && let Ok(stream) = TcpStream::from_std(moved.stream)
            {
                return Ok(UpstreamConn {
                    stream,
                    buf: BytesMut::with_capacity(BUF),
                    reused: true,
                    deadline: Deadline::default(),
                    _slot: moved.slot,
                });
            }
            tokio::select! {
                () = &mut returned => {}
                () = &mut freed => {}
                () = tokio::time::sleep(RECHECK) => {}
                () = tokio::time::sleep_until(deadline) => return Err(GetError::Full),
            }
        }
    }

    async fn connect(&self, slot: Slot, deadline: tokio::time::Instant) -> Result<UpstreamConn, GetError> {
        self.shared.connecting.fetch_add(1, Ordering::Relaxed);
        let outcome = tokio::time::timeout_at(deadline, TcpStream::connect(self.addr.as_str())).await;
        self.shared.connecting.fetch_sub(1, Ordering::Relaxed);
        let stream = match outcome {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => return Err(self.failed(e)),
            Err(_) => {
                return Err(self.failed(io::Error::new(io::ErrorKind::TimedOut, "http.connectTimeoutMs")));
            }
        };
        let _ = stream.set_nodelay(true);
        self.shared.connects_ok.fetch_add(1, Ordering::Relaxed);
        let deadline = Deadline::default();
        Ok(UpstreamConn { stream, buf: BytesMut::with_capacity(BUF), reused: false, deadline, _slot: slot })
    }

    fn failed(&self, e: io::Error) -> GetError {
        self.shared.connects_failed.fetch_add(1, Ordering::Relaxed);
        tracing::debug!("connecting to the upstream failed: {e}");
        GetError::Connect(e)
    }

    /// Returns a connection whose last response was read whole and left
    /// nothing behind it; past the cap (lowered by a reload), it closes.
    pub fn put(&self, conn: UpstreamConn) {
        if !conn.buf.is_empty() || self.shared.open() > self.shared.limit() {
            return;
        }
        let mut idle = lock(&self.idle);
        if idle.len() < MAX_IDLE {
            idle.push(Idle { conn, since: Instant::now() });
        }
        drop(idle);
        self.returned.notify_one();
    }

    /// Gives up one idle connection to another worker's request.
    fn give_one(&self) -> Option<Moving> {
        let idle = lock(&self.idle).pop()?;
        let UpstreamConn { stream, _slot: slot, .. } = idle.conn;
        // Closed meanwhile, or not movable: dropped (its slot freed).
        if !still_open(&stream) {
            return None;
        }
        let stream = stream.into_std().ok()?;
        Some(Moving { stream, slot })
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// An idle connection on its way to another worker: a plain socket, out
/// of any event loop, and its slot under the cap.
struct Moving {
    stream: std::net::TcpStream,
    slot: Slot,
}

/// Whether an idle connection is still open: nothing arrived on it since
/// its last response (the runtime's readiness says so without a system
/// call, or a peek finds the readiness stale).
fn still_open(stream: &TcpStream) -> bool {
    use std::task::{Context, Poll, Waker};
    let mut cx = Context::from_waker(Waker::noop());
    match stream.poll_read_ready(&mut cx) {
        Poll::Pending => true,
        // Readable while idle: a FIN, a reset, or bytes nobody asked for.
        // Any of them ends it, unless it was a stale readiness.
        Poll::Ready(_) => {
            let mut byte = [0u8; 1];
            matches!(
                stream.try_io(Interest::READABLE, || {
                    use std::os::fd::AsRawFd as _;
                    nix::sys::socket::recv(
                        stream.as_raw_fd(),
                        &mut byte,
                        nix::sys::socket::MsgFlags::MSG_PEEK | nix::sys::socket::MsgFlags::MSG_DONTWAIT,
                    )
                    .map_err(io::Error::from)
                }),
                Err(ref e) if e.kind() == io::ErrorKind::WouldBlock
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::{io::AsyncWriteExt as _, net::TcpListener};

    use super::*;

    const CONNECT: Duration = Duration::from_secs(5);
    const IDLE: Duration = Duration::from_secs(60);

    async fn upstream() -> (TcpListener, String) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        (listener, addr)
    }

    #[tokio::test]
    async fn a_returned_connection_is_reused_and_one_past_the_cap_waits_for_it() {
        let (listener, addr) = upstream().await;
        let pool = Pool::new(addr, Upstreams::new(1));
        let first = pool.get(CONNECT, IDLE).await.unwrap();
        let _peer = listener.accept().await.unwrap();
        assert!(!first.reused);
        assert_eq!(pool.shared().open(), 1);
        let waiting = tokio::spawn({
            let pool = pool.clone();
            async move { pool.get(CONNECT, IDLE).await.map(|c| c.reused) }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "the cap is 1: it waits");
        pool.put(first);
        assert!(waiting.await.unwrap().unwrap(), "it got the returned connection");
        assert_eq!(pool.shared().connects_ok.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn at_the_cap_a_request_waits_the_connect_timeout_then_is_refused() {
        let (listener, addr) = upstream().await;
        let pool = Pool::new(addr, Upstreams::new(1));
        let _held = pool.get(CONNECT, IDLE).await.unwrap();
        let _peer = listener.accept().await.unwrap();
        let started = tokio::time::Instant::now();
        assert!(matches!(pool.get(Duration::from_millis(100), IDLE).await, Err(GetError::Full)));
        assert!(started.elapsed() >= Duration::from_millis(100));
    }

    #[tokio::test]
    async fn a_slot_comes_back_when_its_connection_closes() {
        let (listener, addr) = upstream().await;
        let pool = Pool::new(addr, Upstreams::new(1));
        let held = pool.get(CONNECT, IDLE).await.unwrap();
        let _peer = listener.accept().await.unwrap();
        let waiting = tokio::spawn({
            let pool = pool.clone();
            async move { pool.get(CONNECT, IDLE).await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        // A response that left bytes behind: not put back, closed.
        drop(held);
        let _second = listener.accept().await.unwrap();
        let conn = waiting.await.unwrap().unwrap();
        assert!(!conn.reused, "a new connection in the freed slot");
        assert_eq!(pool.shared().open(), 1);
    }

    #[tokio::test]
    async fn a_connection_with_bytes_left_over_or_past_a_lowered_cap_is_not_kept() {
        let (listener, addr) = upstream().await;
        let pool = Pool::new(addr, Upstreams::new(2));
        let a = pool.get(CONNECT, IDLE).await.unwrap();
        let mut leftover = pool.get(CONNECT, IDLE).await.unwrap();
        leftover.buf.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
        pool.put(leftover);
        assert_eq!(pool.shared().open(), 1, "a connection with bytes past its response closes");
        let c = pool.get(CONNECT, IDLE).await.unwrap();
        assert!(!c.reused);
        pool.shared().set_limit(1);
        assert_eq!(pool.shared().open(), 2, "the lowered cap cuts nothing in use");
        pool.put(a);
        assert_eq!(pool.shared().open(), 1, "past the cap, a returned connection closes");
        pool.put(c);
        assert_eq!(pool.shared().open(), 1, "at the cap, it is kept");
        assert!(pool.get(CONNECT, IDLE).await.unwrap().reused);
        drop(listener);
    }

    #[tokio::test]
    async fn an_idle_connection_the_upstream_closed_or_wrote_on_is_dropped_not_reused() {
        let (listener, addr) = upstream().await;
        let pool = Pool::new(addr, Upstreams::new(4));
        let (one, two) = (pool.get(CONNECT, IDLE).await.unwrap(), pool.get(CONNECT, IDLE).await.unwrap());
        let (closed, _) = listener.accept().await.unwrap();
        let (mut chatty, _) = listener.accept().await.unwrap();
        pool.put(one);
        pool.put(two);
        drop(closed);
        chatty.write_all(b"HTTP/1.1 408 Request Timeout\r\n\r\n").await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let fresh = pool.get(CONNECT, IDLE).await.unwrap();
        assert!(!fresh.reused, "neither idle connection was taken");
        assert_eq!(pool.shared().open(), 1);
        // An idle connection past the idle timeout is not taken either.
        pool.put(fresh);
        let _peer = listener.accept().await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!pool.get(CONNECT, Duration::from_millis(10)).await.unwrap().reused);
    }

    #[tokio::test]
    async fn at_the_cap_another_workers_idle_connection_is_borrowed() {
        let (listener, addr) = upstream().await;
        let shared = Upstreams::new(1);
        let (mine, theirs) = (Pool::new(addr.clone(), shared.clone()), Pool::new(addr, shared.clone()));
        let conn = theirs.get(CONNECT, IDLE).await.unwrap();
        let _peer = listener.accept().await.unwrap();
        theirs.put(conn);
        let borrowed = mine.get(CONNECT, IDLE).await.unwrap();
        assert!(borrowed.reused);
        assert_eq!((shared.borrowed.load(Ordering::Relaxed), shared.open()), (1, 1));
    }

    #[tokio::test]
    async fn a_refused_connect_is_an_error_and_frees_its_slot() {
        let (listener, addr) = upstream().await;
        drop(listener);
        let pool = Pool::new(addr, Upstreams::new(1));
        assert!(matches!(pool.get(CONNECT, IDLE).await, Err(GetError::Connect(_))));
        assert_eq!((pool.shared().open(), pool.shared().connects_failed.load(Ordering::Relaxed)), (0, 1));
    }
}
