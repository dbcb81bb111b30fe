//! One exchange, a request and its response, as its connection sees it:
//! counted by protocol, held in its HTTP/2 connection's count of open
//! streams, written to the access log when its response body is done, and
//! on HTTP/2 rid of HTTP/1's connection headers (a refused stream ends
//! with its 503; the connection stays open for its other streams).

use std::{
    convert::Infallible,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};

use hyper::{Request, Response, body::Incoming, header};

use super::{
    Proxy,
    body::{ClientBody, ProxyBody},
    headers::{Client, Forwarding},
    pipeline::handle,
    streams::Streams,
    upstream::Pool,
};
use crate::access_log::Entry;

/// hyper's service function for one request (HTTP/2: one stream; an
/// `async` block, see [`super::forward`]).
#[expect(clippy::manual_async_fn, reason = "an async fn would hold its arguments twice")]
pub(super) fn serve(
    req: Request<Incoming>,
    proxy: Arc<Proxy>,
    pool: Arc<Pool>,
    client: Client,
    streams: Option<Arc<Streams>>,
    fwd: Arc<Forwarding>,
) -> impl Future<Output = Result<Response<ProxyBody>, Infallible>> {
    async move {
        // Open until the response body is done, not only its head: a long
        // download keeps its connection from counting as idle.
        let open = streams.as_ref().map(|s| s.open());
        proxy.counters.requests_by_proto[client.proto.index()].fetch_add(1, Ordering::Relaxed);
        let log = proxy.access_log.enabled().then(|| Logged::new(&req, client, &proxy));
        let req = req.map(|body| ClientBody::new(body, log.as_ref().map(|l| l.bytes_in.clone())));
        let Ok(mut response) = handle(req, proxy.clone(), pool, client, streams, fwd).await;
        if client.proto.is_h2() {
            // HTTP/2 has no connection-specific headers; a refusal ends this
            // stream only.
            response.headers_mut().remove(header::CONNECTION);
            if response.body().meta.refused.is_some() {
                proxy.counters.h2_streams_refused.fetch_add(1, Ordering::Relaxed);
            }
        }
        if let Some(open) = open {
            response = response.map(|body| body.keep(Box::new(open)));
        }
        Ok(match log {
            None => response,
            Some(log) => {
                let status = response.status().as_u16();
                let meta = response.body().meta;
                response.map(|body| {
                    body.on_done(Box::new(move |bytes_out| {
                        log.done(status, meta.refused, meta.upstream, bytes_out);
                    }))
                })
            }
        })
    }
}

/// What the access log needs of a request, taken from its head.
struct Logged {
    proxy: Arc<Proxy>,
    ts: SystemTime,
    started: Instant,
    client: Client,
    method: hyper::Method,
    path: String,
    session: Option<u32>,
    bytes_in: Arc<AtomicU64>,
}

impl Logged {
    fn new(req: &Request<Incoming>, client: Client, proxy: &Arc<Proxy>) -> Self {
        Self {
            proxy: proxy.clone(),
            ts: SystemTime::now(),
            started: Instant::now(),
            client,
            method: req.method().clone(),
            path: req.uri().path_and_query().map_or_else(|| "/".to_owned(), |pq| pq.as_str().to_owned()),
            session: req
                .headers()
                .get(header::AUTHORIZATION)
                .map(|v| proxy.admission.session_tag(v.as_bytes())),
            bytes_in: Arc::new(AtomicU64::new(0)),
        }
    }

    fn done(self, status: u16, reason: Option<&'static str>, upstream: Option<Duration>, bytes_out: u64) {
        self.proxy.access_log.log(Entry {
            ts: self.ts,
            client: self.client.addr,
            proto: self.client.proto.as_str(),
            method: self.method,
            path: self.path,
            status,
            reason,
            bytes_in: self.bytes_in.load(Ordering::Relaxed),
            bytes_out,
            ms: self.started.elapsed().as_secs_f64() * 1000.0,
            upstream_ms: upstream.map(|d| d.as_secs_f64() * 1000.0),
            session: self.session,
        });
    }
}
