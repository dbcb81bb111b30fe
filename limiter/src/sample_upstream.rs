//! The built-in sample upstream, used with `http.upstream = sample`, so
//! the proxy can be tried end to end with nothing else running:
//!
//! - `GET /slow?ms=N` answers after N ms (default 5000): a few concurrent
//!   ones fill a small pool and provoke 503s;
//! - `POST`/`PUT` read the whole body and say how many bytes came;
//! - anything else answers at once.

use std::{net::SocketAddr, time::Duration};

use bytes::Bytes;
use hyper::{Method, Request, Response};
use tokio::net::TcpListener;

use crate::plain_http as plain;

/// Starts the sample upstream on a free loopback port; returns its address.
pub async fn start() -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let limits = plain::Limits {
        header_timeout: Duration::from_secs(60),
        max_head: 64 * 1024,
        max_body: 64 * 1024 * 1024,
    };
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            tokio::spawn(plain::serve(stream, limits, answer));
        }
    });
    Ok(addr)
}

async fn answer(req: Request<Bytes>) -> Response<Bytes> {
    let text = match (req.method(), req.uri().path()) {
        (&Method::POST | &Method::PUT, path) => {
            format!("sample upstream: received {} bytes on {path}\n", req.body().len())
        }
        (_, "/slow") => {
            let ms = req
                .uri()
                .query()
                .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("ms=")))
                .and_then(|v| v.parse().ok())
                .unwrap_or(5000u64)
                .min(600_000);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            format!("sample upstream: slow answer after {ms} ms\n")
        }
        (method, path) => format!("sample upstream: {method} {path}\n"),
    };
    Response::new(Bytes::from(text))
}
