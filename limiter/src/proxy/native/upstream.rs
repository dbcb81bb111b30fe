//! The native engine's upstream connections: plain keep-alive sockets, one
//! idle list per worker, under the same cap as hyper's pools
//! (`http.maxUpstreamConnections`, [`Upstreams`]). A request takes the
//! most recently returned connection (its socket is the warmest), or
//! connects within `http.connectTimeoutMs` while the cap allows; at the cap
//! it takes an idle one of another worker's (its socket moved to this
//! worker's event loop: two `epoll_ctl` calls, no new connection), or waits
//! for one to come back until the same timeout, then is refused with
//! `upstream_full` as on hyper's path.
//!
//! An idle connection the upstream closed is noticed without a system
//! call: its socket turned readable while it sat in the list (a FIN, or
//! bytes nobody asked for), which the runtime already knows; only then is
//! it peeked, and dropped.

use std::{
    io,
    sync::{Arc, Mutex, atomic::Ordering},
    time::{Duration, Instant},
};

use bytes::BytesMut;
use tokio::{io::Interest, net::TcpStream, sync::Notify};

use super::super::upstream::{IdleList, Slot, Upstreams};

/// One upstream connection and what was read from it past the last
/// response (nothing, on a connection that may be reused).
pub struct Conn {
    pub stream: TcpStream,
    pub buf: BytesMut,
    /// Carried a request before this one.
    pub reused: bool,
    _slot: Slot,
}

struct Idle {
    conn: Conn,
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

/// Most idle connections one worker keeps (as hyper's pool, unbounded in
/// practice below the cap; this only bounds a burst's leftovers).
const MAX_IDLE: usize = 1024;

impl Pool {
    pub fn new(addr: String, shared: Arc<Upstreams>) -> Arc<Self> {
        let pool =
            Arc::new(Self { addr, shared: shared.clone(), idle: Mutex::default(), returned: Notify::new() });
        let weak: std::sync::Weak<dyn IdleList> = Arc::downgrade(&pool) as std::sync::Weak<dyn IdleList>;
        shared.register(weak);
        pool
    }

    fn take_idle(&self, idle_timeout: Duration) -> Option<Conn> {
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

    /// A connection for one request.
    pub async fn get(&self, connect_timeout: Duration, idle_timeout: Duration) -> Result<Conn, GetError> {
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
            // At the cap: an idle connection of another worker's, its
            // socket moved from that worker's event loop to this one's.
            if let Some(conn) = self.shared.take_idle_elsewhere(std::ptr::from_ref(self).cast())
                && let Ok(moved) = conn.downcast::<Moving>()
                && let Ok(stream) = TcpStream::from_std(moved.stream)
            {
                return Ok(Conn {
                    stream,
                    buf: BytesMut::with_capacity(BUF),
                    reused: true,
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

    async fn connect(&self, slot: Slot, deadline: tokio::time::Instant) -> Result<Conn, GetError> {
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
        Ok(Conn { stream, buf: BytesMut::with_capacity(BUF), reused: false, _slot: slot })
    }

    fn failed(&self, e: io::Error) -> GetError {
        self.shared.connects_failed.fetch_add(1, Ordering::Relaxed);
        tracing::debug!("connecting to the upstream failed: {e}");
        GetError::Connect(e)
    }

    /// Returns a connection whose last response was read whole and left
    /// nothing behind it.
    pub fn put(&self, conn: Conn) {
        if !conn.buf.is_empty() {
            return;
        }
        let mut idle = lock(&self.idle);
        if idle.len() < MAX_IDLE {
            idle.push(Idle { conn, since: Instant::now() });
        }
        drop(idle);
        self.returned.notify_one();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// An idle connection on its way to another worker: a plain socket, out
/// of any event loop, and its slot under the cap.
struct Moving {
    stream: std::net::TcpStream,
    slot: Slot,
}

impl IdleList for Pool {
    fn give_one(&self) -> Option<Box<dyn std::any::Any + Send>> {
        let idle = lock(&self.idle).pop()?;
        let Conn { stream, _slot: slot, .. } = idle.conn;
        // Closed meanwhile, or not movable: dropped (its slot freed).
        if !still_open(&stream) {
            return None;
        }
        let stream = stream.into_std().ok()?;
        Some(Box::new(Moving { stream, slot }))
    }
}

/// The read buffer of a new connection.
pub const BUF: usize = 16 * 1024;

/// Whether an idle connection is still open: nothing arrived on it since
/// its last response (the runtime's readiness says so without a system
/// call), or what arrived was not its end.
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
