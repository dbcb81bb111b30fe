//! The HTTP/1.1 reverse proxy: admission first, then the request streams to
//! the upstream and the response streams back, each holding its permit
//! until the response body has been handed to the client connection (or
//! the client went away).
//!
//! A request over a limit is answered `503` at once, before anything
//! reaches the upstream, with `Connection: close` and `Retry-After`; the
//! connection then closes with a bounded lingering close ([`io`]) so the
//! 503 arrives intact even when the request body was never read.

pub mod body;
pub mod framing;
pub mod headers;
pub mod io;
pub mod refusal_log;
pub mod sample;
pub mod upstream;

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{
        Arc, RwLock,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use http_body_util::BodyExt as _;
use hyper::{
    Method, Request, Response, StatusCode,
    body::Incoming,
    header::{self, HeaderValue},
    service::service_fn,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{net::TcpListener, sync::watch};

use self::{
    body::{Progress, ProxyBody, Stall},
    headers::{add_forwarded, is_upgrade, strip_hop_by_hop},
    io::ClientIo,
    upstream::{Pool, UpstreamError},
};
use crate::{
    admission::{Admission, Ask, Limits, Reason},
    breaker::{self, Breaker, Decision, State, TicketKind},
    config::Config,
    histogram::Histogram,
    metrics::Page,
};

/// Settings that a reload may change.
#[derive(Clone, Debug)]
pub struct Settings {
    pub retry_after_secs: u64,
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub upstream_timeout: Duration,
    pub linger: Duration,
    pub max_header_bytes: usize,
    /// Upstream statuses that count as breaker failures.
    pub failure_statuses: Vec<(u16, u16)>,
    /// `/debug/` requests pass an open breaker.
    pub bypass_debug: bool,
    /// On shutdown, how long requests in flight may take to finish.
    pub drain_timeout: Duration,
}

impl Settings {
    pub fn from_config(config: &Config) -> Self {
        let http = &config.http;
        Self {
            failure_statuses: config.breaker.failure_statuses.clone(),
            bypass_debug: config.breaker.bypass_debug,
            drain_timeout: Duration::from_millis(config.http.drain_timeout_ms),
            retry_after_secs: http.retry_after_ms.div_ceil(1000),
            header_read_timeout: Duration::from_millis(http.header_read_timeout_ms),
            idle_timeout: Duration::from_millis(http.idle_timeout_ms),
            upstream_timeout: Duration::from_millis(http.upstream_timeout_ms),
            linger: Duration::from_millis(http.linger_ms),
            max_header_bytes: http.max_header_bytes as usize,
        }
    }
}

/// Counters of the proxy itself (admission keeps its own).
#[derive(Debug, Default)]
pub struct Counters {
    /// Rate-limited log lines for 503 refusals.
    pub refusal_log: refusal_log::RefusalLog,
    /// Responses sent by status class, 1xx..5xx.
    pub responses: [AtomicU64; 5],
    pub upstream_latency: Histogram,
    pub time_to_503: Histogram,
    pub upstream_connect_errors: AtomicU64,
    pub upstream_timeouts: AtomicU64,
    pub upstream_resets: AtomicU64,
    /// Connections closed by hyper for a bad request head, by kind.
    pub header_timeouts: AtomicU64,
    pub heads_too_large: AtomicU64,
    pub malformed: AtomicU64,
    /// Heads refused for carrying both Content-Length and Transfer-Encoding.
    pub framing_conflicts: AtomicU64,
    /// Request bodies that failed or stalled on the client's side.
    pub client_body_errors: AtomicU64,
    pub connections_open: AtomicU64,
    pub connections_total: AtomicU64,
    pub upgrades: AtomicU64,
}

impl Counters {
    fn status(&self, status: StatusCode) {
        let class = usize::from(status.as_u16() / 100).clamp(1, 5) - 1;
        self.responses[class].fetch_add(1, Ordering::Relaxed);
    }
}

/// The proxy's state shared by every worker thread.
pub struct Http {
    pub admission: Arc<Admission>,
    pub breaker: Breaker,
    /// Breaker transitions by the state entered (closed, open, half-open).
    pub transitions: Arc<[AtomicU64; 3]>,
    pub counters: Arc<Counters>,
    settings: RwLock<Arc<Settings>>,
    upstream: String,
    connect_timeout: Duration,
    pool_idle: Duration,
}

/// The upstream connection pool of one worker thread.
type UpstreamClient = Arc<Pool>;

impl Http {
    pub fn new(config: &Config, upstream: String) -> Arc<Self> {
        let transitions: Arc<[AtomicU64; 3]> = Arc::default();
        let counted = transitions.clone();
        let sink: breaker::Sink = Box::new(move |e| {
            counted[e.to as usize].fetch_add(1, Ordering::Relaxed);
            let rate = if e.window_requests == 0 {
                0.0
            } else {
                e.window_failures as f64 / e.window_requests as f64
            };
            tracing::warn!(
                from = e.from.as_str(),
                to = e.to.as_str(),
                cause = ?e.cause,
                window_requests = e.window_requests,
                window_failures = e.window_failures,
                error_rate = format!("{rate:.3}"),
                "circuit breaker {} -> {}",
                e.from.as_str(),
                e.to.as_str()
            );
        });
        Arc::new(Self {
            admission: Admission::new(Limits::from_config(&config.http)),
            breaker: Breaker::new(
                breaker::Settings::from_config(&config.breaker),
                breaker::MonotonicClock::default(),
                sink,
            ),
            transitions,
            counters: Arc::new(Counters::default()),
            settings: RwLock::new(Arc::new(Settings::from_config(config))),
            upstream,
            connect_timeout: Duration::from_millis(config.http.connect_timeout_ms),
            pool_idle: Duration::from_millis(config.http.idle_timeout_ms),
        })
    }

    /// A pool of upstream connections for the calling worker's runtime.
    fn client(&self) -> UpstreamClient {
        Arc::new(Pool::new(self.upstream.clone(), self.connect_timeout, self.pool_idle))
    }

    pub fn upstream(&self) -> &str {
        &self.upstream
    }

    /// The settings in force (a reference count, not a copy).
    pub fn settings(&self) -> Arc<Settings> {
        self.settings.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Whether `config` can be applied without a restart (the breaker's
    /// ring is sized for its window).
    pub fn can_reload(&self, config: &Config) -> Result<(), &'static str> {
        if self.breaker.fits(&breaker::Settings::from_config(&config.breaker)) {
            Ok(())
        } else {
            Err("breaker.windowMs / breaker.bucketMs (the number of buckets)")
        }
    }

    /// Applies a reloaded configuration (limits, timeouts, breaker
    /// settings; check [`Self::can_reload`] first).
    pub fn reload(&self, config: &Config) {
        self.admission.set_limits(Limits::from_config(&config.http));
        self.breaker.set_settings(breaker::Settings::from_config(&config.breaker));
        *self.settings.write().unwrap_or_else(std::sync::PoisonError::into_inner) =
            Arc::new(Settings::from_config(config));
    }

    /// The HTTP families of `/metrics`.
    pub fn metrics(&self, page: &mut Page) {
        let a = self.admission.snapshot();
        page.family("limiter_http_in_flight", "gauge", "Requests holding a permit, by pool.")
            .sample("limiter_http_in_flight", &[("pool", "normal")], a.normal_in_use)
            .sample("limiter_http_in_flight", &[("pool", "debug")], a.debug_in_use)
            .sample("limiter_http_in_flight", &[("pool", "web")], a.web_in_use);
        page.family("limiter_http_pool_limit", "gauge", "Size of each pool (0 = unlimited).")
            .sample("limiter_http_pool_limit", &[("pool", "normal")], a.normal_limit)
            .sample("limiter_http_pool_limit", &[("pool", "debug")], a.debug_limit)
            .sample("limiter_http_pool_limit", &[("pool", "web")], a.web_limit)
            .sample("limiter_http_pool_limit", &[("pool", "session")], a.session_limit);
        page.family(
            "limiter_http_sessions",
            "gauge",
            "Sessions with a request in flight (kept only while limited).",
        )
        .sample("limiter_http_sessions", &[], a.sessions);
        page.family("limiter_http_admitted_total", "counter", "Requests admitted, by pool asked for.")
            .sample("limiter_http_admitted_total", &[("pool", "normal")], a.admitted_normal)
            .sample("limiter_http_admitted_total", &[("pool", "debug")], a.admitted_debug);
        page.family(
            "limiter_http_refused_total",
            "counter",
            "Requests answered 503 by admission, by reason.",
        );
        for (i, reason) in Reason::ALL.iter().enumerate() {
            page.sample("limiter_http_refused_total", &[("reason", reason.as_str())], a.refused[i]);
        }
        page.family(
            "limiter_http_would_refuse_total",
            "counter",
            "Requests http.dryRun admitted that a limit would have refused, by reason.",
        );
        for (i, reason) in Reason::ALL.iter().enumerate() {
            page.sample("limiter_http_would_refuse_total", &[("reason", reason.as_str())], a.would_refuse[i]);
        }
        let c = &self.counters;
        page.family("limiter_http_responses_total", "counter", "Responses sent to clients, by status class.");
        for (i, class) in ["1xx", "2xx", "3xx", "4xx", "5xx"].iter().enumerate() {
            page.sample(
                "limiter_http_responses_total",
                &[("class", class)],
                c.responses[i].load(Ordering::Relaxed),
            );
        }
        page.family("limiter_http_upstream_errors_total", "counter", "Upstream failures, by kind.")
            .sample(
                "limiter_http_upstream_errors_total",
                &[("kind", "connect")],
                c.upstream_connect_errors.load(Ordering::Relaxed),
            )
            .sample(
                "limiter_http_upstream_errors_total",
                &[("kind", "timeout")],
                c.upstream_timeouts.load(Ordering::Relaxed),
            )
            .sample(
                "limiter_http_upstream_errors_total",
                &[("kind", "reset")],
                c.upstream_resets.load(Ordering::Relaxed),
            );
        page.family("limiter_http_bad_requests_total", "counter", "Client connections closed for a bad request head, by kind (malformed includes framing conflicts, also counted alone).")
            .sample("limiter_http_bad_requests_total", &[("kind", "header_timeout")], c.header_timeouts.load(Ordering::Relaxed))
            .sample("limiter_http_bad_requests_total", &[("kind", "too_large")], c.heads_too_large.load(Ordering::Relaxed))
            .sample("limiter_http_bad_requests_total", &[("kind", "malformed")], c.malformed.load(Ordering::Relaxed))
            .sample("limiter_http_bad_requests_total", &[("kind", "framing_conflict")], c.framing_conflicts.load(Ordering::Relaxed))
            .sample("limiter_http_bad_requests_total", &[("kind", "body")], c.client_body_errors.load(Ordering::Relaxed));
        page.family("limiter_http_connections", "gauge", "Client connections open.").sample(
            "limiter_http_connections",
            &[],
            c.connections_open.load(Ordering::Relaxed),
        );
        page.family("limiter_http_connections_total", "counter", "Client connections accepted.").sample(
            "limiter_http_connections_total",
            &[],
            c.connections_total.load(Ordering::Relaxed),
        );
        page.family(
            "limiter_http_upgrades_total",
            "counter",
            "Connections switched to another protocol (WebSocket).",
        )
        .sample("limiter_http_upgrades_total", &[], c.upgrades.load(Ordering::Relaxed));
        let b = self.breaker.snapshot();
        page.family("limiter_breaker_state", "gauge", "1 for the breaker's current state.");
        for state in [State::Closed, State::Open, State::HalfOpen] {
            page.sample("limiter_breaker_state", &[("state", state.as_str())], u8::from(b.state == state));
        }
        page.family(
            "limiter_breaker_mode",
            "gauge",
            "1 for the breaker's mode (auto, or forced by an operator).",
        );
        for mode in [breaker::Mode::Auto, breaker::Mode::ForcedOpen, breaker::Mode::ForcedClosed] {
            page.sample("limiter_breaker_mode", &[("mode", mode.as_str())], u8::from(b.mode == mode));
        }
        page.family("limiter_breaker_window_requests", "gauge", "Results in the rolling window.").sample(
            "limiter_breaker_window_requests",
            &[],
            b.window_requests,
        );
        page.family(
            "limiter_breaker_window_error_rate",
            "gauge",
            "Failures / results in the rolling window.",
        )
        .sample("limiter_breaker_window_error_rate", &[], b.error_rate);
        page.family("limiter_breaker_trips_total", "counter", "Times the breaker opened on its own.").sample(
            "limiter_breaker_trips_total",
            &[],
            b.trips,
        );
        page.family(
            "limiter_breaker_last_trip_timestamp_seconds",
            "gauge",
            "Unix time of the last trip (0: never).",
        )
        .sample("limiter_breaker_last_trip_timestamp_seconds", &[], b.last_trip_unix.unwrap_or(0));
        page.family("limiter_breaker_transitions_total", "counter", "State changes, by the state entered.");
        for (i, state) in [State::Closed, State::Open, State::HalfOpen].iter().enumerate() {
            page.sample(
                "limiter_breaker_transitions_total",
                &[("to", state.as_str())],
                self.transitions[i].load(Ordering::Relaxed),
            );
        }
        c.upstream_latency.write(
            page,
            "limiter_http_upstream_latency_seconds",
            "From the request sent upstream to the upstream's response head.",
        );
        c.time_to_503.write(
            page,
            "limiter_http_time_to_503_seconds",
            "From the request head parsed to the admission 503 handed to the connection.",
        );
    }

    /// What `/status` and `dump` show of the proxy.
    pub fn status(&self) -> serde_json::Value {
        serde_json::json!({
            "upstream": self.upstream,
            "pools": self.admission.snapshot(),
            "breaker": self.breaker.snapshot(),
            "time_to_503_p99_bound_seconds": self.counters.time_to_503.quantile_bound(0.99),
        })
    }
}

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

/// Runs one worker thread per listener, each with its own single-threaded
/// runtime and upstream pool, as nginx runs one event loop per worker: a
/// request never changes thread, so no cross-thread wake-ups on the hot
/// path. Returns when every worker has stopped after `shutdown`.
pub fn run_workers(
    listeners: Vec<std::net::TcpListener>,
    http: Arc<Http>,
    shutdown: watch::Receiver<bool>,
) -> Vec<std::thread::JoinHandle<()>> {
    listeners
        .into_iter()
        .enumerate()
        .map(|(i, listener)| {
            let (http, shutdown) = (http.clone(), shutdown.clone());
            std::thread::Builder::new()
                .name(format!("http-worker-{i}"))
                .spawn(move || {
                    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                        Ok(rt) => rt,
                        Err(e) => return tracing::error!("HTTP worker {i}: cannot start its runtime: {e}"),
                    };
                    runtime.block_on(async move {
                        match TcpListener::from_std(listener) {
                            Ok(listener) => serve(listener, http, shutdown).await,
                            Err(e) => tracing::error!("HTTP worker {i}: {e}"),
                        }
                    });
                })
                .expect("spawn an HTTP worker thread")
        })
        .collect()
}

/// Accepts client connections until `shutdown` turns true, then drains:
/// the listener closes, each connection finishes the request it is serving
/// and closes (idle keep-alive connections close at once), and whatever is
/// still open after `http.drainTimeoutMs` is cut.
pub async fn serve(listener: TcpListener, http: Arc<Http>, mut shutdown: watch::Receiver<bool>) {
    let client = http.client();
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    tasks.spawn(connection(stream, peer, http.clone(), client.clone(), shutdown.clone()));
                }
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!("accept on http.listen failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            _ = shutdown.changed() => break,
        }
    }
    drop(listener);
    let drain = http.settings().drain_timeout;
    let drained = tokio::time::timeout(drain, async { while tasks.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::warn!(
            connections = tasks.len(),
            timeout_ms = drain.as_millis() as u64,
            "drain timeout: cutting the connections still open"
        );
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
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

async fn connection(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    http: Arc<Http>,
    client: UpstreamClient,
    shutdown: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let settings = http.settings();
    let io = ClientIo::new(stream, settings.idle_timeout, settings.linger, http.counters.clone());
    http.counters.connections_open.fetch_add(1, Ordering::Relaxed);
    http.counters.connections_total.fetch_add(1, Ordering::Relaxed);
    let service = {
        let http = http.clone();
        service_fn(move |req| handle(req, http.clone(), client.clone(), peer))
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(settings.header_read_timeout)
        .max_buf_size(settings.max_header_bytes.max(8192))
        .keep_alive(true);
    let conn = builder.serve_connection(TokioIo::new(io), service).with_upgrades();
    tokio::pin!(conn);
    let result = tokio::select! {
        result = conn.as_mut() => result,
        () = stopping(shutdown) => {
            // Finish the request in flight (its response goes out without
            // keep-alive), then close; an idle connection closes now.
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        let c = &http.counters;
        if e.is_timeout() {
            c.header_timeouts.fetch_add(1, Ordering::Relaxed);
        } else if e.is_parse_too_large() {
            c.heads_too_large.fetch_add(1, Ordering::Relaxed);
            c.status(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
        } else if e.is_parse() {
            // Framing conflicts are counted as they are found, in ClientIo.
            c.malformed.fetch_add(1, Ordering::Relaxed);
            c.status(StatusCode::BAD_REQUEST);
        }
        tracing::debug!(%peer, "client connection ended: {e}");
    }
    http.counters.connections_open.fetch_sub(1, Ordering::Relaxed);
}

async fn handle(
    req: Request<Incoming>,
    http: Arc<Http>,
    client: UpstreamClient,
    peer: SocketAddr,
) -> Result<Response<ProxyBody>, Infallible> {
    let started = Instant::now();
    if req.method() == Method::CONNECT {
        return Ok(http.own(
            StatusCode::METHOD_NOT_ALLOWED,
            "CONNECT is not supported by this proxy\n",
            true,
        ));
    }
    let debug = is_debug_path(req.uri().path());
    // 1. The breaker, before any permit is taken.
    let ticket = if debug {
        // Diagnostics are never results; they pass an open breaker unless
        // breaker.bypassDebug = false, and then never consume a probe.
        if !http.settings().bypass_debug
            && http.breaker.state() != State::Closed
            && let Decision::Refuse { retry_after_ms } = http.breaker.admit_passive()
        {
            return Ok(http.refuse_breaker(retry_after_ms, started));
        }
        None
    } else {
        match http.breaker.admit() {
            Decision::Admit(kind) => Some(Ticket { http: http.clone(), kind: Some(kind) }),
            Decision::Refuse { retry_after_ms } => return Ok(http.refuse_breaker(retry_after_ms, started)),
        }
    };
    // 2-4. Pools, web clients, sessions.
    let headers = req.headers();
    let ask = Ask {
        debug,
        web: headers.contains_key("x-client-id"),
        session: headers.get(header::AUTHORIZATION).map(HeaderValue::as_bytes),
    };
    match http.admission.admit(ask) {
        Ok(permit) => Ok(forward(req, permit, ticket, &http, &client, peer).await),
        // The ticket is dropped unrecorded: a refusal is not a result.
        Err(reason) => Ok(http.refuse(reason, started)),
    }
}

/// Waits for the upstream's response head: at most `timeout` after the
/// request (body included) was fully sent. While the body is still
/// streaming, its own stall timeout applies instead.
async fn answer_within<F: std::future::Future>(
    send: F,
    progress: &Progress,
    timeout: Duration,
) -> Result<F::Output, ()> {
    tokio::pin!(send);
    loop {
        let deadline =
            progress.done_at().map_or_else(|| tokio::time::Instant::now() + timeout, |t| t + timeout);
        tokio::select! {
            out = &mut send => return Ok(out),
            () = tokio::time::sleep_until(deadline) => {
                if progress.done_at().is_some_and(|t| t + timeout <= tokio::time::Instant::now()) {
                    return Err(());
                }
            }
        }
    }
}

/// Whether a path is a diagnostic one: `/debug/...` with no dot-segment
/// (`/debug/../api` would reach `/api` at an upstream that normalises
/// paths, with the privileges of a diagnostic request) and no encoded dot
/// or slash.
fn is_debug_path(path: &str) -> bool {
    if !path.starts_with("/debug/") {
        return false;
    }
    let lower = path.to_ascii_lowercase();
    if lower.contains("%2e") || lower.contains("%2f") || lower.contains("%5c") || path.contains('\\') {
        return false;
    }
    !path.split('/').any(|seg| seg == "." || seg == "..")
}

/// The breaker's side of one admitted request. Dropped without a result
/// (client gone, refused by admission), it records nothing and frees a
/// half-open probe slot.
struct Ticket {
    http: Arc<Http>,
    kind: Option<TicketKind>,
}

impl Ticket {
    fn record(mut self, success: bool) {
        if let Some(kind) = self.kind.take() {
            self.http.breaker.record(kind, success);
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Some(kind) = self.kind.take() {
            self.http.breaker.abandon(kind);
        }
    }
}

impl Http {
    /// A response the proxy writes itself.
    fn own(&self, status: StatusCode, text: &'static str, close: bool) -> Response<ProxyBody> {
        self.counters.status(status);
        let mut response = Response::new(ProxyBody::full(text));
        *response.status_mut() = status;
        let h = response.headers_mut();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
        if close {
            h.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }

    /// The breaker's 503: its `Retry-After` says when the next probe may
    /// be tried, plus up to 10 % (at least a second) of jitter so that
    /// refused clients do not all return in the same second.
    fn refuse_breaker(self: &Arc<Self>, retry_after_ms: u64, started: Instant) -> Response<ProxyBody> {
        self.admission.count_refusal(Reason::Breaker);
        let secs = retry_after_ms.div_ceil(1000).max(1);
        let jitter = fastrand::u64(0..=(secs / 10).max(1));
        let mut response = self.refuse(Reason::Breaker, started);
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs + jitter));
        response
    }

    /// The admission 503.
    fn refuse(self: &Arc<Self>, reason: Reason, started: Instant) -> Response<ProxyBody> {
        let text: &'static str = match reason {
            Reason::Normal => "503 Service Unavailable: the server is at its request limit\n",
            Reason::Debug => "503 Service Unavailable: no diagnostic slot is free\n",
            Reason::Web => "503 Service Unavailable: the web-client limit is reached\n",
            Reason::Session => "503 Service Unavailable: this session has too many requests in flight\n",
            Reason::Breaker => "503 Service Unavailable: the upstream is failing; retry later\n",
        };
        self.counters.refusal_log.note(reason.as_str());
        let mut response = self.own(StatusCode::SERVICE_UNAVAILABLE, text, true);
        let retry = self.settings().retry_after_secs;
        let h = response.headers_mut();
        h.insert(header::RETRY_AFTER, HeaderValue::from(retry));
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        h.insert("x-limiter-refused", HeaderValue::from_static(reason.as_str()));
        let http = self.clone();
        response
            .map(|body| body.on_end(Box::new(move || http.counters.time_to_503.record(started.elapsed()))))
    }
}

async fn forward(
    mut req: Request<Incoming>,
    permit: crate::admission::Permit,
    ticket: Option<Ticket>,
    http: &Arc<Http>,
    client: &UpstreamClient,
    peer: SocketAddr,
) -> Response<ProxyBody> {
    let settings = http.settings();
    let upgrade = is_upgrade(req.headers());
    // Any Upgrade header stops the framing watch (the connection may become
    // a tunnel), so unless an upgrade really happens this connection closes.
    let close_after = req.headers().contains_key(header::UPGRADE);
    let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
    let (mut parts, body) = req.into_parts();
    // Origin form towards the upstream, whatever form the client used.
    let mut target = hyper::Uri::builder();
    if let Some(pq) = parts.uri.path_and_query() {
        target = target.path_and_query(pq.clone());
    } else {
        target = target.path_and_query("/");
    }
    let Ok(uri) = target.build() else {
        return http.own(StatusCode::BAD_REQUEST, "400 Bad Request: unusable request target\n", true);
    };
    strip_hop_by_hop(&mut parts.headers, upgrade);
    let host = match parts.headers.get(header::HOST) {
        Some(host) => Some(host.clone()),
        None => {
            // HTTP/1.0 without Host: name the upstream, as HTTP/1.1 needs one.
            let upstream = HeaderValue::from_str(&http.upstream).ok();
            if let Some(h) = &upstream {
                parts.headers.insert(header::HOST, h.clone());
            }
            None
        }
    };
    add_forwarded(&mut parts.headers, peer, host.as_ref());
    parts.uri = uri;
    parts.version = hyper::Version::HTTP_11;
    let progress = Arc::new(Progress::default());
    let upstream_req =
        Request::from_parts(parts, Stall::with_progress(body, settings.idle_timeout, progress.clone()));

    let sent = Instant::now();
    let result = answer_within(client.send(upstream_req), &progress, settings.upstream_timeout).await;
    let mut response = match result {
        Err(_) => {
            if let Some(t) = ticket {
                t.record(false)
            }
            http.counters.upstream_timeouts.fetch_add(1, Ordering::Relaxed);
            return http.own(
                StatusCode::GATEWAY_TIMEOUT,
                "504 Gateway Timeout: the upstream did not answer in time\n",
                true,
            );
        }
        Ok(Err(UpstreamError::Send(e))) if e.is_user() => {
            // The client's body failed (aborted, or stalled past
            // http.idleTimeoutMs): not the upstream's fault, not a result.
            drop(ticket);
            http.counters.client_body_errors.fetch_add(1, Ordering::Relaxed);
            tracing::debug!("request body failed: {e:?}");
            return http.own(
                StatusCode::BAD_REQUEST,
                "400 Bad Request: the request body failed or stalled\n",
                true,
            );
        }
        Ok(Err(e)) => {
            if let Some(t) = ticket {
                t.record(false)
            }
            let (counter, text) = match e {
                UpstreamError::Connect(_) => (
                    &http.counters.upstream_connect_errors,
                    "502 Bad Gateway: cannot connect to the upstream\n",
                ),
                UpstreamError::Send(_) => {
                    (&http.counters.upstream_resets, "502 Bad Gateway: the upstream closed the connection\n")
                }
            };
            counter.fetch_add(1, Ordering::Relaxed);
            tracing::debug!("upstream request failed: {e:?}");
            return http.own(StatusCode::BAD_GATEWAY, text, true);
        }
        Ok(Ok(response)) => response,
    };
    http.counters.upstream_latency.record(sent.elapsed());
    if let Some(ticket) = ticket {
        let status = response.status().as_u16();
        let failed = settings.failure_statuses.iter().any(|&(lo, hi)| (lo..=hi).contains(&status));
        ticket.record(!failed);
    }

    if let Some(client_upgrade) = client_upgrade
        && response.status() == StatusCode::SWITCHING_PROTOCOLS
    {
        let upstream_upgrade = hyper::upgrade::on(&mut response);
        http.counters.upgrades.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            let (Ok(client), Ok(upstream)) = tokio::join!(client_upgrade, upstream_upgrade) else {
                return;
            };
            let _ =
                tokio::io::copy_bidirectional(&mut TokioIo::new(client), &mut TokioIo::new(upstream)).await;
        });
        http.counters.status(response.status());
        // The upgrade is complete: the permit goes back now, the
        // tunnel is not an HTTP request any more.
        drop(permit);
        return response.map(|_| ProxyBody::empty());
    }
    let (mut parts, body) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers, false);
    if close_after {
        // Refused upgrade: the framing watch stopped at the Upgrade head,
        // so this connection must not carry another request.
        parts.headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    http.counters.status(parts.status);
    let body = ProxyBody::boxed(Stall::new(body, settings.idle_timeout).boxed_unsync()).with_permit(permit);
    Response::from_parts(parts, body)
}

#[cfg(test)]
mod tests {
    use super::is_debug_path;

    #[test]
    fn debug_paths_cannot_climb_out() {
        assert!(is_debug_path("/debug/pprof"));
        assert!(is_debug_path("/debug/a.b/c..d"));
        for path in [
            "/debug/../api",
            "/debug/./x",
            "/debug/..",
            "/debug/%2e%2e/api",
            "/debug/x%2Fy",
            "/debugx",
            "/api/debug/x",
        ] {
            assert!(!is_debug_path(path), "{path}");
        }
    }
}
