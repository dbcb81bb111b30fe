//! A benchmark peer, not part of limiter: the smallest reverse proxy on
//! hyper that puts Netflix's adaptive concurrency algorithms, as
//! `tower-acc` implements them in Rust, in front of an upstream, the way
//! a service would use them: `tower::load_shed` over `tower-acc`'s
//! `ConcurrencyLimit`, so a request over the limit gets a 503 at once
//! instead of waiting. `cargo xtask bench adaptive` runs it beside
//! limiter.
//!
//! Usage: `acc-proxy LISTEN UPSTREAM gradient2|vegas MIN MAX`: the
//! algorithm with its default settings, but its limit kept within
//! `[MIN, MAX]` (limiter's `http.adaptive.minLimit` and static pool).

use std::{convert::Infallible, net::SocketAddr, sync::Arc};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, combinators::BoxBody};
use hyper::{Request, Response, StatusCode, body::Incoming, service::service_fn};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::{TokioExecutor, TokioIo},
};
use tower::{BoxError, Service, ServiceBuilder, ServiceExt as _, load_shed::error::Overloaded};
use tower_acc::{ConcurrencyLimitLayer, Gradient2, Vegas};

type Body = BoxBody<Bytes, hyper::Error>;

fn text(status: StatusCode, s: &'static str) -> Response<Body> {
    let mut r =
        Response::new(Full::new(Bytes::from_static(s.as_bytes())).map_err(|never| match never {}).boxed());
    *r.status_mut() = status;
    r
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, listen, upstream, algorithm, min, max] = &args[..] else {
        eprintln!("usage: acc-proxy LISTEN UPSTREAM gradient2|vegas MIN MAX");
        std::process::exit(2);
    };
    let listen: SocketAddr = listen.parse().expect("LISTEN: an address");
    let upstream: Arc<str> = upstream.as_str().into();
    let (min, max): (usize, usize) = (min.parse().expect("MIN"), max.parse().expect("MAX"));
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async move {
        let client: Client<HttpConnector, Incoming> = Client::builder(TokioExecutor::new()).build_http();
        let forward = tower::service_fn(move |mut req: Request<Incoming>| {
            let uri = format!("http://{upstream}{}", req.uri().path_and_query().map_or("/", |p| p.as_str()));
            *req.uri_mut() = uri.parse().expect("a URI");
            client.request(req)
        });
        match algorithm.as_str() {
            "gradient2" => {
                let algo = Gradient2::builder().min_limit(min).max_limit(max).build();
                serve(
                    listen,
                    ServiceBuilder::new()
                        .load_shed()
                        .layer(ConcurrencyLimitLayer::new(algo))
                        .service(forward),
                )
                .await
            }
            "vegas" => {
                let algo = Vegas::builder().max_limit(max).build();
                serve(
                    listen,
                    ServiceBuilder::new()
                        .load_shed()
                        .layer(ConcurrencyLimitLayer::new(algo))
                        .service(forward),
                )
                .await
            }
            other => panic!("unknown algorithm {other}"),
        }
    });
}

async fn serve<S>(listen: SocketAddr, limited: S)
where
    S: Service<Request<Incoming>, Response = Response<Incoming>, Error = BoxError> + Clone + Send + 'static,
    S::Future: Send,
{
    let listener = tokio::net::TcpListener::bind(listen).await.expect("bind");
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let _ = stream.set_nodelay(true);
        let limited = limited.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<Incoming>| {
                let svc = limited.clone();
                async move {
                    Ok::<_, Infallible>(match svc.oneshot(req).await {
                        Ok(r) => r.map(|b| b.boxed()),
                        Err(e) if e.is::<Overloaded>() => {
                            text(StatusCode::SERVICE_UNAVAILABLE, "over the adaptive limit\n")
                        }
                        Err(_) => text(StatusCode::BAD_GATEWAY, "upstream failed\n"),
                    })
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
