//! The proxy's listeners and workers: one single-threaded event loop per
//! worker thread, each accepting on its own `SO_REUSEPORT` listener with
//! its own upstream pool, and each client connection served by hyper on
//! a task of that loop until it closes or the daemon drains.

use std::{
    net::SocketAddr,
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use hyper::{StatusCode, server::conn::http1, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{net::TcpListener, sync::watch};

use super::{
    Proxy, Tuning,
    headers::{Client, Scheme},
    io::ClientIo,
    pipeline::handle,
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

/// Runs one worker thread per listener, each with its own single-threaded
/// runtime and upstream pool, as nginx runs one event loop per worker: a
/// request never changes thread, so no cross-thread wake-ups on the hot
/// path. Returns when every worker has stopped after `shutdown`.
pub fn run_workers(
    listeners: Vec<std::net::TcpListener>,
    proxy: Arc<Proxy>,
    shutdown: watch::Receiver<bool>,
) -> Vec<std::thread::JoinHandle<()>> {
    listeners
        .into_iter()
        .enumerate()
        .map(|(i, listener)| {
            let (proxy, shutdown) = (proxy.clone(), shutdown.clone());
            std::thread::Builder::new()
                .name(format!("http-worker-{i}"))
                .spawn(move || {
                    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                        Ok(rt) => rt,
                        Err(e) => return tracing::error!("HTTP worker {i}: cannot start its runtime: {e}"),
                    };
                    runtime.block_on(async move {
                        match TcpListener::from_std(listener) {
                            Ok(listener) => serve(listener, proxy, shutdown).await,
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
pub async fn serve(listener: TcpListener, proxy: Arc<Proxy>, mut shutdown: watch::Receiver<bool>) {
    let pool = proxy.pool();
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, addr)) => {
                    // http.listen is cleartext; a TLS listener says Scheme::Https here.
                    let client = Client { addr, scheme: Scheme::Http };
                    tasks.spawn(connection(stream, client, proxy.clone(), pool.clone(), shutdown.clone()));
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
    let drain = proxy.tuning().drain_timeout;
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

async fn connection(
    stream: tokio::net::TcpStream,
    client: Client,
    proxy: Arc<Proxy>,
    pool: Arc<Pool>,
    shutdown: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let tuning = proxy.tuning();
    let io = ClientIo::new(
        stream,
        tuning.idle_timeout,
        tuning.min_data_rate,
        tuning.linger,
        proxy.counters.clone(),
    );
    proxy.counters.connections_open.fetch_add(1, Ordering::Relaxed);
    proxy.counters.connections_total.fetch_add(1, Ordering::Relaxed);
    let service = {
        let proxy = proxy.clone();
        service_fn(move |req| handle(req, proxy.clone(), pool.clone(), client))
    };
    let conn = http1(&tuning).serve_connection(TokioIo::new(io), service).with_upgrades();
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
        let c = &proxy.counters;
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
        tracing::debug!(peer = %client.addr, "client connection ended: {e}");
    }
    proxy.counters.connections_open.fetch_sub(1, Ordering::Relaxed);
}
