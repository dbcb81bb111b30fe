//! Responses the proxy writes itself: admission and breaker 503s (with
//! `Retry-After`, `Connection: close` and the reason), and its own errors.
//! On HTTP/2 the exchange drops `Connection: close`: the stream ends with
//! the response and the connection stays open for its other streams.

use std::{sync::Arc, sync::atomic::Ordering, time::Instant};

use hyper::{
    Response, StatusCode,
    header::{self, HeaderValue},
};

use super::{Proxy, body::ProxyBody, reason::Reason};
use crate::admission::Refusal;

static X_LIMITER_REFUSED: header::HeaderName = header::HeaderName::from_static("x-limiter-refused");

/// A response of the proxy's own, counted by status; `close` ends the
/// connection after it.
pub(super) fn own(proxy: &Proxy, status: StatusCode, text: &'static str, close: bool) -> Response<ProxyBody> {
    proxy.counters.status(status);
    let mut response = Response::new(ProxyBody::full(text));
    *response.status_mut() = status;
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    if close {
        h.insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// The breaker's 503: its `Retry-After` says when the next probe may be
/// tried, plus up to 10 % (at least a second) of jitter so that refused
/// clients do not all return in the same second.
pub(super) fn refuse_breaker(
    proxy: &Arc<Proxy>,
    retry_after_ms: u64,
    started: Instant,
) -> Response<ProxyBody> {
    proxy.counters.refused_breaker.fetch_add(1, Ordering::Relaxed);
    let secs = retry_after_ms.div_ceil(1000).max(1);
    let jitter = fastrand::u64(0..=(secs / 10).max(1));
    let mut response = refuse(proxy, Reason::Breaker, started);
    response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs + jitter));
    response
}

/// The admission 503 (counted by whoever refused: the pools, or
/// [`refuse_breaker`]).
pub(super) fn refuse(proxy: &Proxy, reason: Reason, started: Instant) -> Response<ProxyBody> {
    proxy.counters.refusal_log.note(reason.as_str());
    if let Reason::Admission(r) = reason
        && (r.of_pool() || r == Refusal::Debug)
    {
        // A pool is full (for a request of any class): slow readers
        // holding its permits are cut sooner.
        proxy.pressure.refused();
    }
    let mut response = own(proxy, StatusCode::SERVICE_UNAVAILABLE, reason.text(), true);
    let h = response.headers_mut();
    h.insert(header::RETRY_AFTER, HeaderValue::from(proxy.tuning().retry_after_secs));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(X_LIMITER_REFUSED.clone(), HeaderValue::from_static(reason.as_str()));
    response.body_mut().meta.refused = Some(reason.as_str());
    let counters = proxy.counters.clone();
    response.map(|body| body.on_end(Box::new(move || counters.time_to_503.record(started.elapsed()))))
}

/// 408 for a request body too slow to arrive (whichever rule caught it);
/// the connection closes.
pub(super) fn body_timeout(proxy: &Proxy) -> Response<ProxyBody> {
    own(
        proxy,
        StatusCode::REQUEST_TIMEOUT,
        "408 Request Timeout: the request body arrived too slowly\n",
        true,
    )
}
