//! One worker's pool of HTTP/1.1 connections to the upstream.
//!
//! Each worker thread has its own pool, so a request, its upstream
//! connection and that connection's driver task all live on one thread.
//! A connection goes back to the pool as soon as the response head has
//! arrived; it is only handed out again once hyper reports it ready (the
//! previous response body finished). Connections idle longer than
//! `http.idleTimeoutMs`, or closed by the upstream, are dropped. The
//! timeouts come with each request, from the values in force, so a reload
//! applies to the next request.

use std::{
    io,
    sync::Mutex,
    time::{Duration, Instant},
};

use hyper::{
    Request, Response,
    body::Incoming,
    client::conn::http1::{self, SendRequest},
};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

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
}

pub struct Pool {
    addr: String,
    idle: Mutex<Vec<(SendRequest<Body>, Instant)>>,
}

/// The timeouts one request uses (`http.connectTimeoutMs`,
/// `http.idleTimeoutMs` for pooled connections).
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    pub connect: Duration,
    pub idle: Duration,
}

impl Pool {
    pub fn new(addr: String) -> Self {
        Self { addr, idle: Mutex::new(Vec::new()) }
    }

    /// Sends `req` on a pooled connection, or a new one. A request that a
    /// stale pooled connection refused before sending a byte is retried
    /// once on a fresh connection. (An `async` block, not an `async fn`:
    /// one copy of the request in the future, see [`super::forward`].)
    #[expect(clippy::manual_async_fn, reason = "an async fn would hold its arguments twice")]
    pub fn send(
        &self,
        mut req: Request<Body>,
        timeouts: Timeouts,
    ) -> impl Future<Output = Result<Response<Incoming>, UpstreamError>> {
        async move {
            loop {
                let (mut sender, fresh) = match self.checkout(timeouts.idle) {
                    Some(sender) => (sender, false),
                    None => (self.connect(timeouts.connect).await?, true),
                };
                match sender.try_send_request(req).await {
                    Ok(response) => {
                        self.checkin(sender);
                        return Ok(response);
                    }
                    Err(mut e) => match e.take_message() {
                        Some(unsent) if !fresh => req = unsent,
                        _ => return Err(UpstreamError::Send(e.into_error())),
                    },
                }
            }
        }
    }

    fn checkout(&self, idle_timeout: Duration) -> Option<SendRequest<Body>> {
        let mut idle = self.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = Instant::now();
        idle.retain(|(s, since)| !s.is_closed() && now.duration_since(*since) < idle_timeout);
        let ready = idle.iter().rposition(|(s, _)| s.is_ready())?;
        Some(idle.swap_remove(ready).0)
    }

    fn checkin(&self, sender: SendRequest<Body>) {
        self.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push((sender, Instant::now()));
    }

    async fn connect(&self, timeout: Duration) -> Result<SendRequest<Body>, UpstreamError> {
        let stream = tokio::time::timeout(timeout, TcpStream::connect(&self.addr))
            .await
            .map_err(|_| {
                UpstreamError::Connect(io::Error::new(io::ErrorKind::TimedOut, "http.connectTimeoutMs"))
            })?
            .map_err(UpstreamError::Connect)?;
        let _ = stream.set_nodelay(true);
        let (sender, connection) =
            http1::handshake(TokioIo::new(stream)).await.map_err(UpstreamError::Send)?;
        tokio::spawn(async move {
            if let Err(e) = connection.with_upgrades().await {
                tracing::debug!("upstream connection ended: {e}");
            }
        });
        Ok(sender)
    }
}
