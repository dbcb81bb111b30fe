//! The admin API: `GET /metrics` (Prometheus text), `GET /status` (JSON,
//! what `limiter dump` adds when the daemon runs), `GET /healthz` (503
//! while draining), `POST /reload`, and the breaker override:
//! `GET /breaker`, `POST /breaker/open`, `POST /breaker/close`,
//! `POST /breaker/auto`. Who may use which path depends on where it is
//! asked ([`Scope`]):
//!
//! - the admin socket ([`socket`], `admin.socket`): every path, no token;
//!   the socket's owner and mode decide who can connect;
//! - the TCP listener (`admin.listen`, loopback by default), which every
//!   local user can reach: `GET /metrics` and `/healthz` only, unless
//!   `admin.tokenFile` is set; then every path, each but `/healthz`
//!   behind `Authorization: Bearer TOKEN`;
//! - `admin.metricsListen`: `GET /metrics` and `/healthz` only.
//!
//! The TCP listeners answer only requests addressed to themselves
//! ([`origin`]: their own `Host`, no other site's `Origin`), so a web page
//! can neither drive them nor read them.
//!
//! The listener serves a small [`Control`] interface; the daemon implements
//! it. [`api`] holds the typed bodies, shared with `dump` and `top`.

pub mod api;
pub mod auth;
pub mod listener_owner;
pub mod origin;
mod slots;
pub mod socket;

use std::sync::Arc;

use bytes::Bytes;
use hyper::{Method, Request, Response, StatusCode, header};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::{TcpListener, UnixListener},
    sync::watch,
};

use self::api::{ReloadOutcome, Status};
use crate::{
    breaker::{self, Mode},
    config::Secret,
    kernel::KernelError,
    plain_http as plain,
};

/// What the admin listener asks of the daemon.
pub trait Control: Send + Sync + 'static {
    /// The `/metrics` page.
    fn metrics(&self) -> Result<String, KernelError>;
    fn status(&self) -> Result<Status, KernelError>;
    /// Whether the daemon is draining (`/healthz` then says 503).
    fn draining(&self) -> bool;
    /// Whether the kernel gate was detached under the daemon (`/healthz`
    /// then says 503 too).
    fn gate_lost(&self) -> bool {
        false
    }
    /// Whether the gate's maps hold neither configuration since a failed
    /// rollback (`/healthz` then says 503 too).
    fn gate_mixed(&self) -> bool {
        false
    }
    /// Re-reads and applies the configuration (blocking: run it off the
    /// event loop).
    fn reload(&self) -> ReloadOutcome;
    /// Sets the breaker's mode, when given, and returns its state; `None`
    /// when there is no proxy, so no breaker.
    fn breaker(&self, mode: Option<Mode>) -> Option<breaker::Snapshot>;
    /// The bearer token every path but `/healthz` requires, if any.
    fn token(&self) -> Option<Secret>;
    /// The address the listener of `scope` was configured with
    /// (`admin.listen`, `admin.metricsListen`).
    fn configured_addr(&self, scope: Scope) -> std::net::SocketAddr;
}

/// What a listener serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// `admin.socket`: everything, no token (the socket's mode decides).
    Socket,
    /// `admin.listen`: `/metrics` and `/healthz`; everything behind the
    /// token when there is one.
    Full,
    /// `admin.metricsListen`: `GET /metrics` and `/healthz` only, read-only,
    /// no token (for Prometheus and the kubelet).
    MetricsOnly,
}

/// Admin connections served at once. When they are all open, a new one
/// takes the slot of the oldest with no request in progress ([`slots`]),
/// so a local client that opens many connections cannot keep a probe out.
pub const MAX_CONNECTIONS: usize = 256;
/// A request head must arrive within this long of the connection (or of
/// the previous response); then the connection closes.
pub const HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
/// Request heads larger than this get 431 and the connection closes.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;

/// A listener of the admin API: TCP or the admin socket.
pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

/// A connection of either kind.
trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

impl Listener {
    /// The next connection: the stream, who it is from (for the log), and
    /// the local address a TCP one was made to.
    async fn accept(&self) -> std::io::Result<(Box<dyn Stream>, String, Option<std::net::SocketAddr>)> {
        match self {
            Self::Tcp(l) => {
                let (stream, peer) = l.accept().await?;
                let local = stream.local_addr()?;
                Ok((Box::new(stream), peer.to_string(), Some(local)))
            }
            Self::Unix(l) => {
                let (stream, _) = l.accept().await?;
                let peer = stream
                    .peer_cred()
                    .map_or_else(|_| "admin socket".to_owned(), |c| format!("uid {}", c.uid()));
                Ok((Box::new(stream), peer, None))
            }
        }
    }
}

/// Serves until `shutdown` turns true. Connections are short; each runs on
/// its own task, within [`MAX_CONNECTIONS`], [`HEADER_TIMEOUT`] and
/// [`MAX_HEAD_BYTES`]; kernel reads and reloads run off the runtime, so a
/// slow scrape never delays `/healthz`.
pub async fn serve(
    listener: Listener,
    control: Arc<dyn Control>,
    scope: Scope,
    mut shutdown: watch::Receiver<bool>,
) {
    let slots = Arc::new(slots::Slots::new(MAX_CONNECTIONS));
    let mut connections = tokio::task::JoinSet::new();
    loop {
        // Ended connections leave the set as they go.
        while connections.try_join_next().is_some() {}
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, peer, local)) = accepted else { continue };
                let slot = match slots.take() {
                    slots::Taken::Slot(slot, evicted) => {
                        if evicted.is_some() {
                            tracing::debug!(%peer, "admin listener: {MAX_CONNECTIONS} connections open; closed the oldest idle one");
                        }
                        slot
                    }
                    slots::Taken::Full => {
                        tracing::debug!(%peer, "admin listener: {MAX_CONNECTIONS} requests in progress; closing this connection");
                        continue;
                    }
                };
                let (control, slots) = (control.clone(), slots.clone());
                connections.spawn(async move {
                    let in_service = slot.clone();
                    let limits = plain::Limits {
                        header_timeout: HEADER_TIMEOUT,
                        max_head: MAX_HEAD_BYTES,
                        max_body: MAX_HEAD_BYTES,
                    };
                    let connection = plain::serve(stream, limits, move |req| {
                        let busy = in_service.busy();
                        let answer = handle(req, control.clone(), scope, local);
                        async move {
                            let answer = answer.await;
                            drop(busy);
                            answer
                        }
                    });
                    tokio::select! {
                        _ = connection => {}
                        () = slot.evicted() => {}
                    }
                    slots.release(&slot);
                });
            }
            _ = shutdown.changed() => break,
        }
    }
    // No new connection (queued ones go to a daemon taking over, whose
    // listener shares the port); the requests being answered get their
    // answers before the daemon exits, within a bound (an idle keep-alive
    // connection is closed at it).
    drop(listener);
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, async { while connections.join_next().await.is_some() {} })
        .await;
}

/// How long a stopping daemon's admin listener lets the requests it took
/// finish.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// Runs `f` (a kernel read) on the blocking pool.
async fn off_runtime<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    tokio::task::spawn_blocking(f).await.ok()
}

async fn handle(
    req: Request<Bytes>,
    control: Arc<dyn Control>,
    scope: Scope,
    local: Option<std::net::SocketAddr>,
) -> Response<Bytes> {
    // `admin.metricsListen` serves read-only pages to scrapers that may
    // name it by a DNS name: its Host is not checked, a page's Origin is.
    // No browser reaches the admin socket.
    let checked = match (scope, local) {
        (Scope::Full, Some(local)) => origin::check(req.headers(), local, control.configured_addr(scope)),
        (Scope::MetricsOnly, Some(local)) => {
            origin::check_origin(req.headers(), local, control.configured_addr(scope))
        }
        _ => Ok(()),
    };
    if let Err(foreign) = checked {
        return reply(StatusCode::FORBIDDEN, "text/plain", foreign.explain().into());
    }
    // Every local user can reach admin.listen: without a token it tells
    // what any scraper may know, and steers nothing.
    if scope == Scope::Full
        && control.token().is_none()
        && !matches!(req.uri().path(), "/metrics" | "/healthz")
    {
        return reply(
            StatusCode::FORBIDDEN,
            "text/plain",
            "admin.listen serves GET /metrics and /healthz only without admin.tokenFile: use the admin \
             socket (admin.socket; limiter reload, dump and top do), or set admin.tokenFile\n"
                .into(),
        );
    }
    if scope == Scope::MetricsOnly && !matches!(req.uri().path(), "/metrics" | "/healthz") {
        return reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            "admin.metricsListen serves GET /metrics and /healthz only\n".into(),
        );
    }
    if scope == Scope::MetricsOnly && req.method() != Method::GET {
        return reply(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "GET only\n".into());
    }
    if scope == Scope::Full
        && req.uri().path() != "/healthz"
        && !auth::authorized(&req, control.token().as_ref())
    {
        let mut response =
            reply(StatusCode::UNAUTHORIZED, "text/plain", "a bearer token is required\n".into());
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer realm=\"limiter\""));
        return response;
    }
    let json = |status, body: String| reply(status, "application/json", body);
    let breaker = |mode| match control.breaker(mode) {
        Some(snapshot) => json(StatusCode::OK, to_json(&snapshot)),
        None => {
            reply(StatusCode::NOT_FOUND, "text/plain", "no proxy, so no breaker (no http.upstream)\n".into())
        }
    };
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => {
            let c = control.clone();
            match off_runtime(move || c.metrics()).await {
                Some(Ok(text)) => reply(StatusCode::OK, "text/plain; version=0.0.4; charset=utf-8", text),
                Some(Err(e)) => reply(StatusCode::INTERNAL_SERVER_ERROR, "text/plain", format!("{e}\n")),
                None => reply(StatusCode::INTERNAL_SERVER_ERROR, "text/plain", "the scrape failed\n".into()),
            }
        }
        (&Method::GET, "/status") => {
            let c = control.clone();
            match off_runtime(move || c.status()).await {
                Some(Ok(status)) => json(StatusCode::OK, to_json(&status)),
                Some(Err(e)) => reply(StatusCode::INTERNAL_SERVER_ERROR, "text/plain", format!("{e}\n")),
                None => {
                    reply(StatusCode::INTERNAL_SERVER_ERROR, "text/plain", "the status read failed\n".into())
                }
            }
        }
        (&Method::GET, "/healthz") => {
            if control.draining() {
                reply(StatusCode::SERVICE_UNAVAILABLE, "text/plain", "draining\n".into())
            } else if control.gate_lost() {
                reply(StatusCode::SERVICE_UNAVAILABLE, "text/plain", "the kernel gate was detached\n".into())
            } else if control.gate_mixed() {
                let why = "the kernel gate's maps hold neither configuration (a failed change could not be undone)\n";
                reply(StatusCode::SERVICE_UNAVAILABLE, "text/plain", why.into())
            } else {
                reply(StatusCode::OK, "text/plain", "ok\n".into())
            }
        }
        (&Method::POST, "/reload") => {
            let c = control.clone();
            match tokio::task::spawn_blocking(move || c.reload()).await {
                Ok(outcome) => {
                    let status =
                        if outcome.applied { StatusCode::OK } else { StatusCode::UNPROCESSABLE_ENTITY };
                    json(status, to_json::<ReloadOutcome>(&outcome))
                }
                Err(e) => reply(StatusCode::INTERNAL_SERVER_ERROR, "text/plain", format!("reload: {e}\n")),
            }
        }
        (&Method::GET, "/breaker") => breaker(None),
        (&Method::POST, "/breaker/open") => breaker(Some(Mode::ForcedOpen)),
        (&Method::POST, "/breaker/close") => breaker(Some(Mode::ForcedClosed)),
        (&Method::POST, "/breaker/auto") => breaker(Some(Mode::Auto)),
        (_, "/metrics" | "/status" | "/healthz" | "/breaker") => {
            reply(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "GET only\n".into())
        }
        (_, "/breaker/open" | "/breaker/close" | "/breaker/auto" | "/reload") => {
            reply(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "POST only\n".into())
        }
        _ => reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found: try /metrics, /status or /healthz\n".into(),
        ),
    }
}

fn to_json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("admin bodies serialise")
}

fn reply(status: StatusCode, content_type: &'static str, body: String) -> Response<Bytes> {
    let mut response = Response::new(Bytes::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static(content_type));
    response
}
