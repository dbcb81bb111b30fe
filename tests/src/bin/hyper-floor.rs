//! The hyper floor: about the least a reverse proxy on hyper does per
//! request, as a benchmark peer (`cargo xtask bench http`, its counted
//! rows), not part of the product. One current-thread runtime; the server
//! side `http1::Builder`, the client side `http1::handshake` with a pool of
//! idle `SendRequest`s; the response streamed back as hyper gives it.
//! Whatever limiter executes per request above this is limiter's own work.
//!
//! `hyper-floor LISTEN UPSTREAM`; SIGTERM ends it (so callgrind and strace
//! see a normal exit).

use std::{cell::RefCell, net::SocketAddr, rc::Rc};

use anyhow::{Context as _, Result};
use bytes::Bytes;
use hyper::{
    Request, Response,
    body::{Body, Frame, Incoming},
    client::conn::http1::SendRequest,
    service::service_fn,
};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};

type Pool = Rc<RefCell<Vec<SendRequest<Incoming>>>>;

/// The upstream's response body; gives its connection back to the pool
/// when it is done (or dropped).
struct Returning {
    body: Incoming,
    sender: Option<SendRequest<Incoming>>,
    pool: Pool,
}

impl Drop for Returning {
    fn drop(&mut self) {
        if let Some(s) = self.sender.take()
            && !s.is_closed()
        {
            self.pool.borrow_mut().push(s);
        }
    }
}

impl Body for Returning {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

async fn forward(req: Request<Incoming>, upstream: SocketAddr, pool: Pool) -> Result<Response<Returning>> {
    let idle = pool.borrow_mut().pop();
    let mut sender = match idle {
        Some(s) => s,
        None => {
            let stream = TcpStream::connect(upstream).await?;
            stream.set_nodelay(true)?;
            let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
            tokio::task::spawn_local(conn);
            sender
        }
    };
    sender.ready().await?;
    let response = sender.send_request(req).await?;
    Ok(response.map(|body| Returning { body, sender: Some(sender), pool }))
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let listen: SocketAddr = args.next().context("usage: hyper-floor LISTEN UPSTREAM")?.parse()?;
    let upstream: SocketAddr = args.next().context("usage: hyper-floor LISTEN UPSTREAM")?.parse()?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async move {
        let listener = TcpListener::bind(listen).await?;
        let pool: Pool = Rc::default();
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        loop {
            let (stream, _) = tokio::select! {
                accepted = listener.accept() => accepted?,
                _ = term.recv() => return Ok(()),
            };
            stream.set_nodelay(true)?;
            let pool = pool.clone();
            tokio::task::spawn_local(async move {
                let service = service_fn(move |req| forward(req, upstream, pool.clone()));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    })
}
