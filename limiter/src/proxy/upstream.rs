//! The upstream connections: each worker's pool of HTTP/1.1 keep-alive
//! connections, and the cap on all of them together.
//!
//! Each worker thread has its own pool, so a request, its upstream
//! connection and that connection's driver task all live on one thread.
//! A connection goes back to the pool as soon as the response head has
//! arrived; it is only handed out again once hyper reports it ready (the
//! previous response body finished). Connections idle longer than
//! `http.idleTimeoutMs`, or closed by the upstream, are dropped. The
//! timeouts come with each request, from the values in force, so a reload
//! applies to the next request.
//!
//! **Nothing a request starts at the upstream is abandoned when the
//! request is** (a client gone, an HTTP/2 stream reset: rapid reset opens
//! and cancels streams by the thousand):
//! - a connect runs as a task of its own and its connection goes to the
//!   pool, whoever asked for it; a request that finds no idle connection
//!   starts one only while its worker has fewer connects in progress than
//!   requests waiting for a connection, so a cancelled request's connect is
//!   taken over by the next request instead of being doubled;
//! - a request already handed to a connection is finished in the
//!   background when its client goes away (its response read and dropped,
//!   up to [`ORPHAN_BODY_BYTES`]), so the connection goes back to the pool
//!   instead of being closed with a request half-done; a response body
//!   dropped before its end ([`ResponseBody`]) is read to its end in the
//!   background, within the same bound, for the same reason;
//! - [`Upstreams`] caps every connection open or connecting, on every
//!   worker, at `http.maxUpstreamConnections` (`http.maxThreads` when 0: one
//!   per upstream thread). A request that finds the cap reached takes an
//!   idle connection of another worker's pool if one is ready (its driver
//!   stays on its own thread), else waits for a connection to come free (its
//!   pool's, or a slot freed anywhere) for at most `http.connectTimeoutMs`,
//!   then is refused with 503 `upstream_full`: limiter's own cap, never a
//!   breaker failure.
//!
//! A connection upgraded to a tunnel (WebSocket) leaves the count when the
//! upgrade completes: it is not an HTTP connection any more.

use std::{
    collections::VecDeque,
    io,
    pin::Pin,
    sync::{
        Arc, Mutex, MutexGuard, Weak,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    time::{Duration, Instant},
};

use bytes::Bytes;
use http_body_util::BodyExt as _;
use hyper::{
    Request, Response,
    body::{Body as _, Frame, Incoming, SizeHint},
    client::conn::{
        TrySendError,
        http1::{self, SendRequest},
    },
};
use hyper_util::rt::TokioIo;
use tokio::{net::TcpStream, sync::Notify};

use super::{
    body::{ClientBody, Stall},
    shield::{MinRate, Prefixed},
};

/// A request body on its way upstream: what was read before admission,
/// then (for a large body) the rest, streamed with its stall timeout and
/// minimum rate.
pub type Body = Prefixed<Stall<MinRate<ClientBody>>>;

/// Why the upstream did not answer.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("connecting to the upstream: {0}")]
    Connect(io::Error),
    #[error("upstream connection failed: {0}")]
    Send(hyper::Error),
    /// `http.maxUpstreamConnections` were all busy for `http.connectTimeoutMs`:
    /// limiter's own limit, not the upstream's failure.
    #[error("every upstream connection allowed (http.maxUpstreamConnections) is busy")]
    Full,
}

/// The most of a response body read (and dropped) to keep the connection
/// of a request whose client went away; a larger body closes it.
pub const ORPHAN_BODY_BYTES: usize = 64 * 1024;

/// How often a request waiting for a connection looks at its pool again
/// (a pooled connection becomes ready when its previous response body is
/// done, which nothing announces).
const RECHECK: Duration = Duration::from_millis(5);

/// The timeouts one request uses (`http.connectTimeoutMs`,
/// `http.idleTimeoutMs` for pooled connections and bodies,
/// `http.upstreamTimeoutMs` for a request finished in the background).
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    pub connect: Duration,
    pub idle: Duration,
    pub upstream: Duration,
}

/// Every worker's upstream connections together, and their cap.
#[derive(Default)]
pub struct Upstreams {
    /// `http.maxUpstreamConnections` in force (`http.maxThreads` when the
    /// key is 0).
    limit: AtomicUsize,
    /// Connections open or connecting: the slots held.
    open: AtomicUsize,
    /// Connects in progress.
    pub(super) connecting: AtomicUsize,
    /// A slot was freed.
    pub(super) freed: Notify,
    /// Each worker's pool, for room made at the cap.
    pools: Mutex<Vec<Weak<Pool>>>,
    /// Other pools of plain connections (the native engine's, one per
    /// worker), for room made at the cap.
    other_pools: Mutex<Vec<Weak<dyn IdleList>>>,
    /// Connects that succeeded, and that failed (timeouts included).
    pub connects_ok: AtomicU64,
    pub connects_failed: AtomicU64,
    /// Requests whose client went away after they were handed to a
    /// connection, finished in the background.
    pub orphans_finished: AtomicU64,
    /// Idle connections of one worker's pool taken by another worker's
    /// request at the cap.
    pub borrowed: AtomicU64,
}

impl Upstreams {
    pub fn new(limit: usize) -> Arc<Self> {
        let u = Self::default();
        u.limit.store(limit.max(1), Ordering::Relaxed);
        Arc::new(u)
    }

    /// Applies a reloaded limit (connections beyond it close as they
    /// finish; none is cut).
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
    pub(super) fn slot(self: &Arc<Self>) -> Option<Slot> {
        let limit = self.limit();
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| (n < limit).then_some(n + 1))
            .ok()
            .map(|_| Slot(self.clone()))
    }

    /// An idle, ready connection of another worker's pool, for a request
    /// of `mine` at the cap: the connection is used from this worker (its
    /// driver stays on its own thread) rather than closed and replaced.
    fn borrow(&self, mine: &Pool, idle_timeout: Duration) -> Option<(SendRequest<Body>, bool)> {
        let pools: Vec<Arc<Pool>> = {
            let mut pools = self.pools.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            pools.retain(|p| p.strong_count() > 0);
            pools.iter().filter_map(Weak::upgrade).collect()
        };
        let found = pools
            .iter()
            .filter(|p| !std::ptr::eq(p.as_ref(), mine))
            .find_map(|p| p.lock().checkout(idle_timeout));
        if found.is_some() {
            self.borrowed.fetch_add(1, Ordering::Relaxed);
        }
        found
    }
}

/// One place under the cap: held by a connect in progress, then by its
/// connection's driver task until the connection ends.
/// A worker's pool of plain idle connections (the native engine's), which
/// another worker's may take one from at the cap.
pub trait IdleList: Send + Sync {
    /// Gives up one idle connection, its socket taken out of this
    /// worker's event loop.
    fn give_one(&self) -> Option<Box<dyn std::any::Any + Send>>;
}

impl Upstreams {
    /// Lists `pool` among those [`Upstreams::close_idle_elsewhere`] asks.
    pub(super) fn register(&self, pool: Weak<dyn IdleList>) {
        self.other_pools.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(pool);
    }

    /// An idle connection of a listed pool other than `mine`, if one has
    /// any.
    pub(super) fn take_idle_elsewhere(&self, mine: *const ()) -> Option<Box<dyn std::any::Any + Send>> {
        let pools: Vec<Arc<dyn IdleList>> = {
            let mut pools = self.other_pools.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            pools.retain(|p| p.strong_count() > 0);
            pools.iter().filter_map(Weak::upgrade).collect()
        };
        let found = pools
            .iter()
            .filter(|p| !std::ptr::eq(Arc::as_ptr(p).cast::<()>(), mine))
            .find_map(|p| p.give_one());
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

pub(super) struct Slot(Arc<Upstreams>);

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Slot")
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
        self.0.freed.notify_waiters();
    }
}

/// A pooled connection.
struct Idle {
    sender: SendRequest<Body>,
    since: Instant,
    /// Never used yet (a stale one is retried, a fresh one is not).
    fresh: bool,
}

impl Idle {
    /// Whether a request may be handed to it now: hyper takes one request
    /// on a new connection before its driver has run, and another once the
    /// previous response is done.
    fn ready(&self) -> bool {
        self.fresh || self.sender.is_ready()
    }
}

#[derive(Default)]
struct State {
    idle: Vec<Idle>,
    /// This worker's connects in progress.
    connecting: usize,
    /// This worker's requests waiting for a connection.
    waiting: usize,
    /// Connects that failed while requests were waiting: each is one
    /// waiting request's answer.
    failed: VecDeque<io::Error>,
}

/// One worker's pool.
pub struct Pool {
    addr: String,
    shared: Arc<Upstreams>,
    state: Mutex<State>,
    /// A connect ended (its connection is in `idle`, or its error in
    /// `failed`).
    returned: Notify,
}

/// The request handed to a connection, until its response head arrives.
type Sent = Pin<Box<dyn Future<Output = Result<Response<Incoming>, TrySendError<Request<Body>>>> + Send>>;

impl Pool {
    /// A worker's pool, counted in `shared`.
    pub fn new(addr: String, shared: Arc<Upstreams>) -> Arc<Self> {
        let pool =
            Arc::new(Self { addr, shared: shared.clone(), state: Mutex::default(), returned: Notify::new() });
        shared.pools.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(Arc::downgrade(&pool));
        pool
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Sends `req` on a pooled connection, or a new one. A request that a
    /// stale pooled connection refused before sending a byte is retried
    /// once on a fresh connection. (An `async` block, not an `async fn`:
    /// one copy of the request in the future, see [`super::forward`].)
    #[expect(clippy::manual_async_fn, reason = "an async fn would hold its arguments twice")]
    pub fn send(
        self: &Arc<Self>,
        mut req: Request<Body>,
        timeouts: Timeouts,
    ) -> impl Future<Output = Result<Response<ResponseBody>, UpstreamError>> {
        async move {
            loop {
                let (mut sender, fresh) = self.get(timeouts).await?;
                let sent: Sent = Box::pin(sender.try_send_request(req));
                let mut in_flight =
                    InFlight { pool: self.clone(), sent: Some(sent), sender: Some(sender), timeouts };
                match in_flight.response().await {
                    Ok(response) => {
                        let idle = timeouts.idle;
                        return Ok(response.map(|inner| ResponseBody {
                            inner: Some(inner),
                            done: false,
                            idle,
                        }));
                    }
                    Err(mut e) => match e.take_message() {
                        Some(unsent) if !fresh => req = unsent,
                        _ => return Err(UpstreamError::Send(e.into_error())),
                    },
                }
            }
        }
    }

    /// A ready connection: an idle one of this pool, or a new one, within
    /// the cap (see the module's doc); `bool`: never used.
    async fn get(self: &Arc<Self>, t: Timeouts) -> Result<(SendRequest<Body>, bool), UpstreamError> {
        if let Some(found) = self.lock().checkout(t.idle) {
            return Ok(found);
        }
        let _waiting = Waiting::new(self);
        let deadline = tokio::time::Instant::now() + t.connect;
        // Whether the cap kept this request from starting a connect it
        // needed (then, at the deadline, limiter refuses it itself).
        let mut capped = false;
        loop {
            let returned = self.returned.notified();
            let freed = self.shared.freed.notified();
            tokio::pin!(returned, freed);
            returned.as_mut().enable();
            freed.as_mut().enable();
            let mut borrow = false;
            {
                let mut state = self.lock();
                if let Some(found) = state.checkout(t.idle) {
                    return Ok(found);
                }
                if let Some(e) = state.failed.pop_front() {
                    return Err(UpstreamError::Connect(e));
                }
                if state.connecting < state.waiting {
                    match self.shared.slot() {
                        Some(slot) => {
                            state.connecting += 1;
                            capped = false;
                            drop(state);
                            self.spawn_connect(slot, t.connect);
                        }
                        None => {
                            capped = true;
                            borrow = true;
                        }
                    }
                }
            }
            if borrow && let Some(found) = self.shared.borrow(self, t.idle) {
                return Ok(found);
            }
            tokio::select! {
                () = &mut returned => {}
                () = &mut freed => {}
                () = tokio::time::sleep(RECHECK) => {}
                () = tokio::time::sleep_until(deadline) => {
                    return Err(if capped {
                        UpstreamError::Full
                    } else {
                        UpstreamError::Connect(io::Error::new(io::ErrorKind::TimedOut, "http.connectTimeoutMs"))
                    });
                }
            }
        }
    }

    /// Connects in a task of its own: however the request that asked for
    /// it ends, the connection goes to the pool (or its error to a request
    /// still waiting).
    fn spawn_connect(self: &Arc<Self>, slot: Slot, timeout: Duration) {
        let pool = self.clone();
        pool.shared.connecting.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            let outcome = connect(&pool.addr, timeout, slot).await;
            pool.shared.connecting.fetch_sub(1, Ordering::Relaxed);
            let mut state = pool.lock();
            state.connecting -= 1;
            match outcome {
                Ok(sender) => {
                    pool.shared.connects_ok.fetch_add(1, Ordering::Relaxed);
                    state.idle.push(Idle { sender, since: Instant::now(), fresh: true });
                }
                Err(e) => {
                    pool.shared.connects_failed.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!("connecting to the upstream failed: {e}");
                    // Nobody waiting: nobody to answer (the connect's
                    // requests are gone, and were not results).
                    if state.failed.len() < state.waiting {
                        state.failed.push_back(e);
                    }
                }
            }
            drop(state);
            pool.returned.notify_waiters();
        });
    }

    fn checkin(&self, sender: SendRequest<Body>) {
        self.lock().idle.push(Idle { sender, since: Instant::now(), fresh: false });
    }

    /// Finishes in the background a request whose client went away after
    /// it was handed to a connection: its response is read and dropped
    /// (up to [`ORPHAN_BODY_BYTES`], within the timeouts), and the
    /// connection goes back to the pool; anything else closes it.
    async fn finish_orphan(self: Arc<Self>, sent: Sent, sender: SendRequest<Body>, t: Timeouts) {
        let finished = async {
            let response = tokio::time::timeout(t.upstream, sent).await.ok()?.ok()?;
            let mut body = response.into_body();
            let mut read = 0usize;
            loop {
                match tokio::time::timeout(t.idle, body.frame()).await.ok()? {
                    None => return Some(()),
                    Some(Ok(frame)) => {
                        read += frame.data_ref().map_or(0, |d| d.len());
                        if read > ORPHAN_BODY_BYTES {
                            return None;
                        }
                    }
                    Some(Err(_)) => return None,
                }
            }
        };
        if finished.await.is_some() {
            self.checkin(sender);
        }
        self.shared.orphans_finished.fetch_add(1, Ordering::Relaxed);
    }
}

impl State {
    /// A ready pooled connection, dropping the stale ones.
    fn checkout(&mut self, idle_timeout: Duration) -> Option<(SendRequest<Body>, bool)> {
        let now = Instant::now();
        self.idle.retain(|i| !i.sender.is_closed() && now.duration_since(i.since) < idle_timeout);
        let ready = self.idle.iter().rposition(Idle::ready)?;
        let idle = self.idle.swap_remove(ready);
        Some((idle.sender, idle.fresh))
    }
}

/// A request waiting for a connection, counted in its pool while it waits.
struct Waiting<'a>(&'a Pool);

impl<'a> Waiting<'a> {
    fn new(pool: &'a Pool) -> Self {
        pool.lock().waiting += 1;
        Self(pool)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.waiting -= 1;
        // Errors nobody waits for any more answer nobody.
        let keep = state.waiting;
        state.failed.truncate(keep);
    }
}

/// A request handed to a connection, until its response head: dropped
/// before (the client went away), it is finished in the background rather
/// than abandoned, so the connection is kept.
struct InFlight {
    pool: Arc<Pool>,
    sent: Option<Sent>,
    sender: Option<SendRequest<Body>>,
    timeouts: Timeouts,
}

impl InFlight {
    /// The response head; the connection goes back to the pool with it.
    async fn response(&mut self) -> Result<Response<Incoming>, TrySendError<Request<Body>>> {
        let Some(sent) = self.sent.as_mut() else { unreachable!("a request is sent once") };
        let outcome = sent.await;
        self.sent = None;
        let sender = self.sender.take();
        if outcome.is_ok()
            && let Some(sender) = sender
        {
            self.pool.checkin(sender);
        }
        outcome
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let (Some(sent), Some(sender)) = (self.sent.take(), self.sender.take())
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(self.pool.clone().finish_orphan(sent, sender, self.timeouts));
        }
    }
}

/// A new connection to `addr` holding `slot`, its driver spawned.
async fn connect(addr: &str, timeout: Duration, slot: Slot) -> Result<SendRequest<Body>, io::Error> {
    let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "http.connectTimeoutMs"))??;
    let _ = stream.set_nodelay(true);
    let (sender, connection) = http1::handshake(TokioIo::new(stream)).await.map_err(io::Error::other)?;
    tokio::spawn(async move {
        let _slot = slot;
        if let Err(e) = connection.with_upgrades().await {
            tracing::debug!("upstream connection ended: {e}");
        }
    });
    Ok(sender)
}

/// The upstream's response body. Dropped before its end (the client went
/// away, its stream was reset), the rest is read in the background, up to
/// [`ORPHAN_BODY_BYTES`] within `http.idleTimeoutMs` a frame, so that its
/// connection can be pooled again instead of closed.
#[derive(Debug)]
pub struct ResponseBody {
    inner: Option<Incoming>,
    /// Read to its end (or failed): nothing left to drain.
    done: bool,
    idle: Duration,
}

impl hyper::body::Body for ResponseBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let Some(inner) = this.inner.as_mut() else { return Poll::Ready(None) };
        let poll = Pin::new(inner).poll_frame(cx);
        if matches!(poll, Poll::Ready(None | Some(Err(_)))) {
            this.done = true;
        }
        poll
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Incoming::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.as_ref().map_or_else(|| SizeHint::with_exact(0), Incoming::size_hint)
    }
}

impl Drop for ResponseBody {
    fn drop(&mut self) {
        let Some(mut body) = self.inner.take() else { return };
        if self.done || body.is_end_stream() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let idle = self.idle;
        runtime.spawn(async move {
            let mut read = 0usize;
            while let Ok(Some(Ok(frame))) = tokio::time::timeout(idle, body.frame()).await {
                read += frame.data_ref().map_or(0, |d| d.len());
                if read > ORPHAN_BODY_BYTES {
                    // Too much to read for nothing: the connection closes.
                    return;
                }
            }
        });
    }
}
