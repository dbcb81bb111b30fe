//! An upstream written for the tests: it counts what reaches it and can
//! hold, stream, sink, stall, reset and upgrade on demand.
//!
//! | path | behaviour |
//! |---|---|
//! | `/hold`, any path ending in `/hold` | answers once [`Upstream::release`] is called |
//! | `/sess?ms=N` | answers after N ms |
//! | `/headers`, any path ending in `/headers` | answers with the request head it received |
//! | `/big?bytes=N` | streams N bytes in 64 KiB chunks |
//! | `POST /sink` | reads the whole body, answers its length |
//! | `/slowhead?ms=N` | waits N ms before the response head |
//! | `/upgrade` | `101 Switching Protocols`, then echoes bytes |
//! | `/flap` | 500 while [`Upstream::set_failing`] is on, else 200 |
//! | `/status?code=N` | answers with status N |
//! | any path ending in `/work`, `?ms=N` | served N ms (default 20; scaled by [`Upstream::set_service_percent`]) by one of [`Upstream::set_capacity`] workers (4 at first); the rest wait in a FIFO queue, as servlets wait for a database connection ([`Upstream::stall`] pauses them) |
//! | anything else | `200 ok` |
//!
//! `/hold` and `/sess` count the requests of each session (`Authorization`
//! value, as sent) in progress at once, and their peak
//! ([`Upstream::session_peak`]): what a fleet admitted, as the upstream
//! sees it.

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, StreamBody, combinators::BoxBody};
use hyper::{Request, Response, StatusCode, body::Frame, body::Incoming, service::service_fn};
use hyper_util::rt::TokioIo;
use tokio::{net::TcpListener, sync::Notify};

type Body = BoxBody<Bytes, Infallible>;

struct Shared {
    hits: AtomicU64,
    /// `/flap` answers 500 while set.
    failing: std::sync::atomic::AtomicBool,
    flap_hits: AtomicU64,
    holding: AtomicU64,
    /// `/slowhead` requests in progress now, and the most at once.
    slow_now: AtomicU64,
    slow_peak: AtomicU64,
    /// Connections accepted in all, and the most open at once.
    accepted: AtomicU64,
    open_peak: AtomicU64,
    /// A second descriptor of each connection open here, by number, to
    /// ask the kernel whether the peer has closed it.
    sockets: std::sync::Mutex<Vec<(u64, std::net::TcpStream)>>,
    release: Notify,
    /// The workers of `/work`.
    workers: tokio::sync::Semaphore,
    capacity: std::sync::Mutex<u32>,
    /// `/work`'s service time, in percent of what the request asks.
    service_percent: AtomicU64,
    /// Per `Authorization` value: requests of `/hold` and `/sess` in
    /// progress now, and the most at once.
    sessions: std::sync::Mutex<std::collections::HashMap<String, (u64, u64)>>,
}

impl Default for Shared {
    fn default() -> Self {
        Self {
            hits: AtomicU64::default(),
            failing: std::sync::atomic::AtomicBool::default(),
            flap_hits: AtomicU64::default(),
            holding: AtomicU64::default(),
            slow_now: AtomicU64::default(),
            slow_peak: AtomicU64::default(),
            accepted: AtomicU64::default(),
            open_peak: AtomicU64::default(),
            sockets: std::sync::Mutex::default(),
            release: Notify::default(),
            workers: tokio::sync::Semaphore::new(WORKERS as usize),
            capacity: std::sync::Mutex::new(WORKERS),
            service_percent: AtomicU64::new(100),
            sessions: std::sync::Mutex::default(),
        }
    }
}

/// `/work`'s workers at first.
pub const WORKERS: u32 = 4;

/// A running test upstream; stops with its runtime when dropped.
pub struct Upstream {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    _runtime: tokio::runtime::Runtime,
}

/// The upstream's count of each session's `/hold` and `/sess` requests in
/// progress ([`Upstream::session_count`]).
#[derive(Clone)]
pub struct SessionCount(Arc<Shared>);

impl SessionCount {
    pub fn now(&self, authorization: &str) -> u64 {
        self.0.sessions.lock().unwrap().get(authorization).map_or(0, |&(now, _)| now)
    }
}

impl Upstream {
    pub fn start() -> Self {
        Self::on(std::net::TcpListener::bind("127.0.0.1:0").unwrap())
    }

    /// Serves on `listener` (one a test made where it wants it: in a
    /// sandbox's namespace and cgroup, say).
    pub fn on(listener: std::net::TcpListener) -> Self {
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let shared = Arc::new(Shared::default());
        let addr = serve(&runtime, listener, shared.clone());
        Self { addr, shared, _runtime: runtime }
    }

    /// Serves `listener` too, as the same upstream: its counters and its
    /// `/hold` count what reaches either (one service behind several
    /// daemons, each in its own namespace). Returns the listener's address.
    pub fn also_on(&self, listener: std::net::TcpListener) -> SocketAddr {
        serve(&self._runtime, listener, self.shared.clone())
    }

    /// How many `/work` requests are served at once from now (those over
    /// the new capacity finish first).
    pub fn set_capacity(&self, n: u32) {
        let mut capacity = self.shared.capacity.lock().unwrap();
        if n > *capacity {
            self.shared.workers.add_permits((n - *capacity) as usize);
        } else if n < *capacity {
            let (s, fewer) = (self.shared.clone(), *capacity - n);
            self._runtime.spawn(async move {
                if let Ok(p) = s.workers.acquire_many(fewer).await {
                    p.forget();
                }
            });
        }
        *capacity = n;
    }

    /// `/work` takes `percent` % of the time it is asked for from now.
    pub fn set_service_percent(&self, percent: u64) {
        self.shared.service_percent.store(percent, Ordering::SeqCst);
    }

    /// Stops starting `/work` requests for `d` (a GC pause), once those
    /// in service have finished; returns when the stall is over.
    pub fn stall(&self, d: Duration) {
        let s = self.shared.clone();
        let capacity = *s.capacity.lock().unwrap();
        self._runtime.block_on(async move {
            if let Ok(all) = s.workers.acquire_many(capacity).await {
                tokio::time::sleep(d).await;
                drop(all);
            }
        });
    }

    /// The most `/slowhead` requests the upstream had in progress at once.
    pub fn slow_peak(&self) -> u64 {
        self.shared.slow_peak.load(Ordering::SeqCst)
    }

    /// Starts [`Self::slow_peak`] again from what is in progress now.
    pub fn reset_slow_peak(&self) {
        self.shared.slow_peak.store(self.shared.slow_now.load(Ordering::SeqCst), Ordering::SeqCst);
    }

    /// Connections the upstream accepted, in all.
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// The most connections the upstream had open at once: at each
    /// accept, the connections whose peer had not closed them (this
    /// side's kernel's view, not this server's: it reads a close late
    /// under load).
    pub fn open_peak(&self) -> u64 {
        self.shared.open_peak.load(Ordering::SeqCst)
    }

    /// Requests that reached the upstream.
    pub fn hits(&self) -> u64 {
        self.shared.hits.load(Ordering::SeqCst)
    }

    /// Makes `/flap` answer 500 (true) or 200 (false).
    pub fn set_failing(&self, failing: bool) {
        self.shared.failing.store(failing, Ordering::SeqCst);
    }

    /// Requests that reached `/flap`.
    pub fn flap_hits(&self) -> u64 {
        self.shared.flap_hits.load(Ordering::SeqCst)
    }

    /// Requests waiting in `/hold`.
    pub fn holding(&self) -> u64 {
        self.shared.holding.load(Ordering::SeqCst)
    }

    /// Waits until `n` requests are held (5 s at most).
    pub fn wait_holding(&self, n: u64) {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while self.holding() != n {
            assert!(
                std::time::Instant::now() < deadline,
                "upstream holds {} requests, want {n}",
                self.holding()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// A handle on the count of each session's requests in progress, for
    /// client threads.
    pub fn session_count(&self) -> SessionCount {
        SessionCount(self.shared.clone())
    }

    /// The most `/hold` and `/sess` requests of session `authorization` the
    /// upstream had in progress at once (since [`Self::reset_session_peaks`]).
    pub fn session_peak(&self, authorization: &str) -> u64 {
        self.shared.sessions.lock().unwrap().get(authorization).map_or(0, |&(_, peak)| peak)
    }

    /// Its requests in progress now.
    pub fn session_now(&self, authorization: &str) -> u64 {
        self.shared.sessions.lock().unwrap().get(authorization).map_or(0, |&(now, _)| now)
    }

    /// Starts every session's peak again from what is in progress now.
    pub fn reset_session_peaks(&self) {
        for (now, peak) in self.shared.sessions.lock().unwrap().values_mut() {
            *peak = *now;
        }
    }

    /// Lets every held request answer.
    pub fn release(&self) {
        self.shared.release.notify_waiters();
    }
}

/// Accepts on `listener` with `runtime`, answering from `shared`.
fn serve(
    runtime: &tokio::runtime::Runtime,
    listener: std::net::TcpListener,
    shared: Arc<Shared>,
) -> SocketAddr {
    listener.set_nonblocking(true).unwrap();
    let listener = {
        let _entered = runtime.enter();
        TcpListener::from_std(listener).unwrap()
    };
    let addr = listener.local_addr().unwrap();
    runtime.spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let s = shared.clone();
            let id = s.accepted.fetch_add(1, Ordering::SeqCst);
            // The peak as this side's kernel has it: the connections the
            // peer holds open. One the proxy closed is in CLOSE_WAIT here
            // from the moment its FIN arrives, though this server may read
            // the end only later (and count it open until then).
            {
                let mut sockets = s.sockets.lock().unwrap();
                let held = 1 + sockets.iter().filter(|(_, dup)| !peer_closed(dup)).count() as u64;
                s.open_peak.fetch_max(held, Ordering::SeqCst);
                if let Ok(dup) = socket2::SockRef::from(&stream).try_clone() {
                    sockets.push((id, dup.into()));
                }
            }
            tokio::spawn(async move {
                let service = service_fn({
                    let s = s.clone();
                    move |req| answer(req, s.clone())
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .with_upgrades()
                    .await;
                s.sockets.lock().unwrap().retain(|(n, _)| *n != id);
            });
        }
    });
    addr
}

/// Whether the peer has closed a connection: its FIN (or a reset) has
/// arrived and nothing it sent before is unread (bytes still unread: not
/// closed, as far as this side can tell).
fn peer_closed(socket: &std::net::TcpStream) -> bool {
    let mut one = [std::mem::MaybeUninit::<u8>::uninit(); 1];
    // The descriptor shares the connection's O_NONBLOCK: this never waits.
    match socket2::SockRef::from(socket).peek(&mut one) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    }
}

fn full(text: impl Into<Bytes>) -> Body {
    Full::new(text.into()).boxed()
}

async fn answer(mut req: Request<Incoming>, s: Arc<Shared>) -> Result<Response<Body>, Infallible> {
    s.hits.fetch_add(1, Ordering::SeqCst);
    let query = |key: &str| -> Option<u64> {
        req.uri().query()?.split('&').find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
    };
    // Counted per session while in progress, even if the connection goes
    // away and hyper drops this future.
    struct InSession(Arc<Shared>, String);
    impl Drop for InSession {
        fn drop(&mut self) {
            if let Some((now, _)) = self.0.sessions.lock().unwrap().get_mut(&self.1) {
                *now -= 1;
            }
        }
    }
    let path = req.uri().path();
    let _in_session = (path.ends_with("/hold") || path == "/sess").then(|| {
        let auth = req
            .headers()
            .get("authorization")
            .map_or_else(String::new, |v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        let mut sessions = s.sessions.lock().unwrap();
        let (now, peak) = sessions.entry(auth.clone()).or_default();
        *now += 1;
        *peak = (*peak).max(*now);
        InSession(s.clone(), auth)
    });
    let response = match req.uri().path() {
        // Any path ending so, however crafted: the tests see what the
        // proxy forwarded, byte for byte.
        "/sess" => {
            tokio::time::sleep(Duration::from_millis(query("ms").unwrap_or(1000))).await;
            Response::new(full("session\n"))
        }
        p if p.ends_with("/hold") => {
            let released = s.release.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            // Counted while held, even if the connection goes away and
            // hyper drops this future.
            struct Held<'a>(&'a AtomicU64);
            impl Drop for Held<'_> {
                fn drop(&mut self) {
                    self.0.fetch_sub(1, Ordering::SeqCst);
                }
            }
            s.holding.fetch_add(1, Ordering::SeqCst);
            let _held = Held(&s.holding);
            released.await;
            Response::new(full("released\n"))
        }
        p if p.ends_with("/work") => {
            let ms = query("ms").unwrap_or(20) * s.service_percent.load(Ordering::SeqCst) / 100;
            let _worker = s.workers.acquire().await;
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Response::new(full("worked\n"))
        }
        "/flap" => {
            s.flap_hits.fetch_add(1, Ordering::SeqCst);
            let mut r = Response::new(full("flap\n"));
            if s.failing.load(Ordering::SeqCst) {
                *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
            }
            r
        }
        "/status" => {
            let mut r = Response::new(full("status\n"));
            *r.status_mut() = query("code")
                .and_then(|c| u16::try_from(c).ok())
                .and_then(|c| StatusCode::from_u16(c).ok())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            r
        }
        p if p.ends_with("/headers") => {
            let mut text = format!("{} {} {:?}\n", req.method(), req.uri(), req.version());
            for (k, v) in req.headers() {
                text.push_str(&format!("{k}: {}\n", v.to_str().unwrap_or("?")));
            }
            Response::new(full(text))
        }
        "/big" => {
            let total = query("bytes").unwrap_or(1 << 20);
            let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
            let mut r = Response::new(StreamBody::new(Chunks { left: total, chunk }).boxed());
            r.headers_mut().insert("content-length", total.into());
            r
        }
        "/sink" => {
            let mut body = req.into_body();
            let mut n = 0u64;
            while let Some(Ok(frame)) = body.frame().await {
                n += frame.data_ref().map_or(0, |d| d.len() as u64);
            }
            Response::new(full(format!("{n}\n")))
        }
        "/slowhead" => {
            struct InProgress<'a>(&'a AtomicU64);
            impl Drop for InProgress<'_> {
                fn drop(&mut self) {
                    self.0.fetch_sub(1, Ordering::SeqCst);
                }
            }
            let now = s.slow_now.fetch_add(1, Ordering::SeqCst) + 1;
            s.slow_peak.fetch_max(now, Ordering::SeqCst);
            let _in_progress = InProgress(&s.slow_now);
            tokio::time::sleep(Duration::from_millis(query("ms").unwrap_or(1000))).await;
            Response::new(full("late\n"))
        }
        "/upgrade" => {
            let on = hyper::upgrade::on(&mut req);
            tokio::spawn(async move {
                if let Ok(up) = on.await {
                    let mut io = TokioIo::new(up);
                    let (mut r, mut w) = tokio::io::split(&mut io);
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                }
            });
            let mut r = Response::new(full(""));
            *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
            r.headers_mut().insert("upgrade", "echo".parse().unwrap());
            r.headers_mut().insert("connection", "upgrade".parse().unwrap());
            r
        }
        _ => Response::new(full("ok\n")),
    };
    Ok(response)
}

/// Streams `left` bytes in chunks.
struct Chunks {
    left: u64,
    chunk: Bytes,
}

impl futures_core::Stream for Chunks {
    type Item = Result<Frame<Bytes>, Infallible>;
    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        if self.left == 0 {
            return std::task::Poll::Ready(None);
        }
        let n = self.left.min(self.chunk.len() as u64) as usize;
        self.left -= n as u64;
        std::task::Poll::Ready(Some(Ok(Frame::data(self.chunk.slice(..n)))))
    }
}
