//! The built-in sample upstream, used with `http.upstream = sample`, so
//! the proxy can be tried end to end with nothing else running:
//!
//! - `GET /slow?ms=N` answers after N ms (default 5000): a few concurrent
//!   ones fill a small pool and provoke 503s;
//! - `POST`/`PUT` read the whole body and say how many bytes came;
//! - anything else answers at once.

use std::{convert::Infallible, net::SocketAddr, time::Duration};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::{Method, Request, Response, body::Incoming, service::service_fn};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// Starts the sample upstream on a free loopback port; returns its address.
pub async fn start() -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service_fn(answer))
                    .await;
            });
        }
    });
    Ok(addr)
}

async fn answer(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let text = match (req.method(), req.uri().path()) {
        (&Method::POST | &Method::PUT, path) => {
            let path = path.to_owned();
            let mut body = req.into_body();
            let mut bytes = 0usize;
            while let Some(Ok(frame)) = body.frame().await {
                bytes += frame.data_ref().map_or(0, Bytes::len);
            }
            format!("sample upstream: received {bytes} bytes on {path}\n")
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
    Ok(Response::new(Full::new(Bytes::from(text))))
}
