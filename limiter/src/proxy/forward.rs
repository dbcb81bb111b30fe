//! Forwarding an admitted request, phase by phase (as a proxy's exchange
//! is usually cut up), each phase a function:
//! - `request_filter`: the head made fit for the upstream (origin form,
//!   hop-by-hop headers removed, `Host` and the forwarding headers added);
//! - `upstream_request`: the body added as it was received; the request
//!   then goes to the worker's pool within the upstream timeout;
//! - `response_filter`: the result recorded on the breaker's ticket, an
//!   accepted upgrade tunnelled, the response's hop-by-hop headers removed;
//! - `response_body_filter`: a small body read ahead (the permit goes
//!   back), a larger one streamed carrying the permit;
//! - `fail_to_proxy`: when the upstream or the client's body fails before
//!   the client has anything, the proxy's own 502/504/408/400.

use std::{
    ops::ControlFlow,
    pin::Pin,
    sync::{Arc, atomic::Ordering},
    task::{Context, Poll, ready},
    time::{Duration, Instant},
};

use http_body_util::BodyExt as _;
use hyper::body::Body as _;
use hyper::{
    Request, Response, StatusCode,
    header::{self, HeaderValue},
    http::{request, response},
    upgrade::OnUpgrade,
};
use hyper_util::rt::TokioIo;
use tokio::time::Sleep;

use super::{
    Proxy, Tuning,
    body::{BoxError, Progress, ProxyBody, Stall, Stalled},
    counters::BodyTimeout,
    headers::{Forwarding, Seen, strip_hop_by_hop},
    reason::Reason,
    respond,
    shield::{self, MinRate, Prefixed, ReadAhead, Receipt, TooSlow},
    stream_guard,
    streams::Streams,
    upstream::{self, Pool, ResponseBody, Timeouts, UpstreamError},
};
use crate::{admission::Permit, breaker::ticket::Ticket};

/// An admitted request, as the pipeline hands it over: its head, its body
/// so far, and every lifetime it carries.
pub(super) struct Admitted {
    pub parts: request::Parts,
    pub seen: Seen,
    pub receipt: Receipt,
    /// The client's side of the upgrade it asked for.
    pub upgrade: Option<OnUpgrade>,
    pub permit: Permit,
    /// `None` for a diagnostic request (it took no breaker probe).
    pub ticket: Option<Ticket>,
    /// When its head arrived (a 503 of the upstream cap is timed from it).
    pub started: Instant,
}

/// What every admitted request of a connection goes with: the proxy, the
/// worker's upstream pool, the connection's forwarding headers and (on
/// HTTP/2) its streams, and the values in force for this request.
pub(super) struct Route<'a> {
    pub proxy: &'a Proxy,
    pub pool: &'a Arc<Pool>,
    pub fwd: &'a Forwarding,
    pub h2: Option<Arc<Streams>>,
    pub tuning: Arc<Tuning>,
}

/// Forwards an admitted request: the response for the client, the
/// upstream's or the proxy's own.
///
/// (An `async` block, not an `async fn`: an `async fn` moves its
/// arguments into the future, then again into locals on its first poll,
/// so a large argument costs two copies in the future and one more move.
/// The proxy's per-request futures are written this way; for the same
/// reason the block uses `req`'s fields in place rather than binding them
/// to locals, and the phases that do not wait are plain functions, whose
/// locals are not kept in the future.)
#[expect(clippy::manual_async_fn, reason = "an async fn would hold its arguments twice")]
pub(super) fn forward(mut req: Admitted, to: Route<'_>) -> impl Future<Output = Response<ProxyBody>> {
    async move {
        // Any Upgrade header stops the framing watch (the connection may become
        // a tunnel), so unless an upgrade really happens this connection closes.
        let close_after = req.seen.upgrade();
        if let ControlFlow::Break(response) =
            request_filter(&mut req.parts, req.seen, req.upgrade.is_some(), &to)
        {
            return response;
        }
        let (upstream_req, progress) = upstream_request(req.parts, req.receipt, &to.tuning);

        let sent = Instant::now();
        let timeouts = Timeouts {
            connect: to.tuning.connect_timeout,
            idle: to.tuning.idle_timeout,
            upstream: to.tuning.upstream_timeout,
        };
        let answer = answer_within(
            to.pool.send(upstream_req, timeouts),
            progress.as_deref(),
            to.tuning.upstream_timeout,
        );
        let response = match answer.await {
            Ok(Ok(response)) => response,
            Ok(Err(UpstreamError::Full)) => {
                return fail_to_proxy(Failure::Full(req.started), req.ticket, to.proxy);
            }
            Ok(Err(e)) => return fail_to_proxy(Failure::Upstream(e), req.ticket, to.proxy),
            Err(()) => return fail_to_proxy(Failure::Timeout, req.ticket, to.proxy),
        };
        let upstream_time = sent.elapsed();
        to.proxy.counters.upstream_latency.record(upstream_time);
        req.permit.answered(upstream_time);
        let (parts, body) = match response_filter(response, req.ticket, req.upgrade, close_after, &to) {
            ControlFlow::Continue(head) => head,
            ControlFlow::Break(tunnel) => {
                // The upgrade is complete: the permit goes back now, the
                // tunnel is not an HTTP request any more.
                drop(req.permit);
                return tunnel;
            }
        };
        let read = shield::read_ahead(body, &to.tuning, &to.proxy.budget).await;
        match response_body_filter(read, req.permit, &to) {
            Ok(mut body) => {
                to.proxy.counters.status(parts.status);
                body.meta.upstream = Some(upstream_time);
                Response::from_parts(parts, body)
            }
            Err(failure) => fail_to_proxy(failure, None, to.proxy),
        }
    }
}

/// The request filter: the head as the upstream gets it, in origin form
/// with hop-by-hop headers removed and `Host` and the forwarding headers
/// set; `Break` with the 400 for a target it cannot name. (`upgrade`: the
/// client asked for one, so its `Upgrade` and `Connection` stay.)
fn request_filter(
    parts: &mut request::Parts,
    mut seen: Seen,
    upgrade: bool,
    to: &Route<'_>,
) -> ControlFlow<Response<ProxyBody>> {
    // The request's authority ([`super::head::target`] checked it): the
    // target's own (HTTP/1 absolute form, HTTP/2 `:authority`) wins over
    // `Host` (RFC 9112 §3.2.2, RFC 9113 §8.3.1), read before the target
    // becomes origin form.
    let authority = parts.uri.authority().and_then(|a| HeaderValue::from_str(a.as_str()).ok());
    // Origin form towards the upstream, whatever form the client used
    // (an HTTP/1 request in origin form, the usual one, is sent as it is).
    let origin_form = parts.uri.scheme().is_none()
        && parts.uri.authority().is_none()
        && parts.uri.path_and_query().is_some();
    if !origin_form {
        let target =
            hyper::Uri::builder().path_and_query(parts.uri.path_and_query().map_or("/", |pq| pq.as_str()));
        let Ok(uri) = target.build() else {
            return ControlFlow::Break(respond::own(
                to.proxy,
                StatusCode::BAD_REQUEST,
                "400 Bad Request: unusable request target\n",
                true,
            ));
        };
        parts.uri = uri;
    }
    if strip_hop_by_hop(&mut parts.headers, &seen, upgrade) {
        // `Connection` named other headers (even `Host`): look again.
        seen = Seen::scan(&parts.headers);
    }
    let host = if let Some(a) = authority {
        parts.headers.insert(header::HOST, a.clone());
        Some(a)
    } else if seen.hosts > 0 {
        parts.headers.get(header::HOST).cloned()
    } else {
        // HTTP/1.0 without Host: name the upstream, as HTTP/1.1 needs one.
        if let Ok(upstream) = HeaderValue::from_str(to.proxy.upstream()) {
            parts.headers.insert(header::HOST, upstream);
        }
        None
    };
    if to.h2.is_some() {
        join_cookies(&mut parts.headers);
    }
    to.fwd.apply(&mut parts.headers, host.as_ref().map(HeaderValue::as_bytes), &seen);
    parts.version = hyper::Version::HTTP_11;
    ControlFlow::Continue(())
}

/// The upstream request: the filtered head with its body, and how far a
/// streaming body has been sent. A body in memory is sent as soon as the
/// upstream takes it (the upstream timeout counts from now); a streaming
/// one reports when it has been read to its end.
fn upstream_request(
    parts: request::Parts,
    receipt: Receipt,
    tuning: &Tuning,
) -> (Request<upstream::Body>, Option<Arc<Progress>>) {
    let mut progress = None;
    let body = match receipt {
        Receipt::Whole(frames) => Prefixed::whole(frames),
        Receipt::Streaming(frames, rest) => {
            let rest = MinRate::new(rest, tuning.min_data_rate);
            let p = progress.insert(Arc::new(Progress::default()));
            Prefixed::streaming(frames, Stall::with_progress(rest, tuning.idle_timeout, p.clone()))
        }
    };
    (Request::from_parts(parts, body), progress)
}

/// The response filter: the upstream's result goes to the breaker's
/// ticket, an upgrade the upstream accepted becomes a tunnel (`Break`
/// with its 101), and the head loses its hop-by-hop headers (and closes
/// the connection after a refused upgrade, `close_after`).
fn response_filter(
    mut response: Response<ResponseBody>,
    ticket: Option<Ticket>,
    client_upgrade: Option<OnUpgrade>,
    close_after: bool,
    to: &Route<'_>,
) -> ControlFlow<Response<ProxyBody>, (response::Parts, ResponseBody)> {
    if let Some(ticket) = ticket {
        ticket.record(!to.tuning.is_failure(response.status().as_u16()));
    }
    if let Some(client_upgrade) = client_upgrade
        && response.status() == StatusCode::SWITCHING_PROTOCOLS
    {
        let upstream_upgrade = hyper::upgrade::on(&mut response);
        to.proxy.counters.upgrades.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            let (Ok(client), Ok(upstream)) = tokio::join!(client_upgrade, upstream_upgrade) else {
                return;
            };
            let _ =
                tokio::io::copy_bidirectional(&mut TokioIo::new(client), &mut TokioIo::new(upstream)).await;
        });
        to.proxy.counters.status(response.status());
        return ControlFlow::Break(response.map(|_| ProxyBody::empty()));
    }
    let (mut parts, body) = response.into_parts();
    let seen = Seen::scan(&parts.headers);
    strip_hop_by_hop(&mut parts.headers, &seen, false);
    if close_after {
        // Refused upgrade: the framing watch stopped at the Upgrade head,
        // so this connection must not carry another request.
        parts.headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    ControlFlow::Continue((parts, body))
}

/// The response body filter: a body read ahead whole gives the permit
/// back, one larger than the buffer streams carrying it (on HTTP/2 both
/// under the stream guard); a body that broke off while read ahead is a
/// failure the client can still be told of.
fn response_body_filter(
    read: Result<ReadAhead<ResponseBody>, BoxError>,
    permit: Permit,
    to: &Route<'_>,
) -> Result<ProxyBody, Failure> {
    match read {
        Ok(ReadAhead::Whole(frames)) => {
            // The upstream has delivered its last byte: its thread is free,
            // however slowly the client reads.
            drop(permit);
            let body = Prefixed::<Stall<ResponseBody>>::whole(frames).boxed_unsync();
            Ok(match &to.h2 {
                // On HTTP/2 a starved stream must not keep its bytes for ever.
                Some(conn) if !body.is_end_stream() => {
                    ProxyBody::boxed(stream_guard::guard(body, None, &conn.watchlist).boxed_unsync())
                }
                _ => ProxyBody::boxed(body),
            })
        }
        Ok(ReadAhead::Streaming(frames, rest)) => {
            let rest = Stall::new(rest, to.tuning.idle_timeout);
            let body = Prefixed::streaming(frames, rest).boxed_unsync();
            Ok(match &to.h2 {
                // One stream can starve while its connection flows: a
                // watchdog, not the socket, notices.
                Some(conn) => {
                    ProxyBody::boxed(stream_guard::guard(body, Some(permit), &conn.watchlist).boxed_unsync())
                }
                // On HTTP/1 the socket's rate is ClientIo's; under
                // pressure the response must also keep taking its chunks.
                None => ProxyBody::boxed(
                    stream_guard::guard_h1(
                        body,
                        permit,
                        to.proxy.pressure.clone(),
                        to.proxy.counters.clone(),
                    )
                    .boxed_unsync(),
                ),
            })
        }
        Err(e) => Err(Failure::ResponseBody(e)),
    }
}

/// How forwarding failed before anything of the response reached the
/// client.
enum Failure {
    /// No response head within `http.upstreamTimeoutMs` of the request
    /// sent.
    Timeout,
    /// Connecting to the upstream, or sending the request to it (the
    /// client's body failing included).
    Upstream(UpstreamError),
    /// The response body broke off while read ahead.
    ResponseBody(BoxError),
    /// Every upstream connection `http.maxUpstreamConnections` allows
    /// stayed busy (the request's head arrived at this instant).
    Full(Instant),
}

/// The failure phase: the proxy's own answer, counted, with the ticket
/// (if not recorded yet) recording a failure of the upstream's, or
/// dropped unrecorded for one of the client's.
fn fail_to_proxy(failure: Failure, ticket: Option<Ticket>, proxy: &Proxy) -> Response<ProxyBody> {
    match failure {
        Failure::Full(started) => upstream_full(proxy, ticket, started),
        Failure::Upstream(UpstreamError::Full) => upstream_full(proxy, ticket, Instant::now()),
        Failure::Timeout => upstream_timeout(proxy, ticket),
        Failure::Upstream(UpstreamError::Send(e)) if e.is_user() => {
            // The client's body failed (aborted), or came too slowly (under
            // http.minDataRate, or stalled past http.idleTimeoutMs).
            tracing::debug!("request body failed: {e:?}");
            let cause = std::error::Error::source(&e);
            let timeout = if cause.is_some_and(|c| c.is::<TooSlow>()) {
                Some(BodyTimeout::MinRate)
            } else if cause.is_some_and(|c| c.is::<Stalled>()) {
                Some(BodyTimeout::Idle)
            } else {
                None
            };
            client_body_failed(proxy, ticket, timeout)
        }
        Failure::Upstream(e) => {
            tracing::debug!("upstream request failed: {e:?}");
            upstream_failed(proxy, ticket, matches!(e, UpstreamError::Connect(_)))
        }
        Failure::ResponseBody(e) => {
            tracing::debug!("upstream response body failed before the client got it: {e}");
            response_broke_off(proxy)
        }
    }
}

/// Every upstream connection allowed stayed busy: limiter's own cap, not
/// the upstream's failure. The ticket is dropped unrecorded, and the
/// client gets an admission 503 (its request's head came at `started`).
pub(super) fn upstream_full(proxy: &Proxy, ticket: Option<Ticket>, started: Instant) -> Response<ProxyBody> {
    drop(ticket);
    proxy.counters.refused_upstream_full.fetch_add(1, Ordering::Relaxed);
    respond::refuse(proxy, Reason::UpstreamFull, started)
}

/// No response head within `http.upstreamTimeoutMs`: a failure.
pub(super) fn upstream_timeout(proxy: &Proxy, ticket: Option<Ticket>) -> Response<ProxyBody> {
    if let Some(t) = ticket {
        t.record(false)
    }
    proxy.counters.upstream_timeouts.fetch_add(1, Ordering::Relaxed);
    respond::own(
        proxy,
        StatusCode::GATEWAY_TIMEOUT,
        "504 Gateway Timeout: the upstream did not answer in time
",
        true,
    )
}

/// The client's body failed or came too slowly (`timeout`: by which
/// rule): not the upstream's fault, not a result. The upstream request is
/// dropped, and the permit with it.
pub(super) fn client_body_failed(
    proxy: &Proxy,
    ticket: Option<Ticket>,
    timeout: Option<BodyTimeout>,
) -> Response<ProxyBody> {
    drop(ticket);
    match timeout {
        Some(rule) => {
            proxy.counters.body_timeouts[rule.index()].fetch_add(1, Ordering::Relaxed);
            respond::body_timeout(proxy)
        }
        None => {
            proxy.counters.client_body_errors.fetch_add(1, Ordering::Relaxed);
            respond::own(proxy, StatusCode::BAD_REQUEST, "400 Bad Request: the request body failed\n", true)
        }
    }
}

/// Connecting to the upstream failed (`connect`), or the connection failed
/// before a whole response head: a failure, 502.
pub(super) fn upstream_failed(proxy: &Proxy, ticket: Option<Ticket>, connect: bool) -> Response<ProxyBody> {
    if let Some(t) = ticket {
        t.record(false)
    }
    let (counter, text) = if connect {
        (&proxy.counters.upstream_connect_errors, "502 Bad Gateway: cannot connect to the upstream\n")
    } else {
        (&proxy.counters.upstream_resets, "502 Bad Gateway: the upstream closed the connection\n")
    };
    counter.fetch_add(1, Ordering::Relaxed);
    respond::own(proxy, StatusCode::BAD_GATEWAY, text, true)
}

/// The response body broke off while read ahead: nothing has reached the
/// client yet, it can still be told (the ticket recorded the response).
pub(super) fn response_broke_off(proxy: &Proxy) -> Response<ProxyBody> {
    proxy.counters.upstream_resets.fetch_add(1, Ordering::Relaxed);
    respond::own(proxy, StatusCode::BAD_GATEWAY, "502 Bad Gateway: the upstream's response broke off\n", true)
}

pin_project_lite::pin_project! {
    /// Waits for the upstream's response head: at most `timeout` after the
    /// request (body included) was fully sent. While a streaming body
    /// (`progress`) is still sending, its own stall timeout applies
    /// instead. (A future of its own, not an `async fn`: the request's
    /// future is held once, see [`forward`].)
    struct AnswerWithin<'p, F> {
        #[pin]
        send: F,
        #[pin]
        deadline: Sleep,
        progress: Option<&'p Progress>,
        timeout: Duration,
    }
}

fn answer_within<F: Future>(send: F, progress: Option<&Progress>, timeout: Duration) -> AnswerWithin<'_, F> {
    let from = progress.and_then(Progress::done_at).unwrap_or_else(tokio::time::Instant::now);
    AnswerWithin { send, deadline: tokio::time::sleep_until(from + timeout), progress, timeout }
}

impl<F: Future> Future for AnswerWithin<'_, F> {
    type Output = Result<F::Output, ()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if let Poll::Ready(out) = this.send.poll(cx) {
            return Poll::Ready(Ok(out));
        }
        loop {
            ready!(this.deadline.as_mut().poll(cx));
            let now = tokio::time::Instant::now();
            match this.progress.map(|p| p.done_at()) {
                // Sent whole, or sent since and the time is up.
                None => return Poll::Ready(Err(())),
                Some(Some(done)) if done + *this.timeout <= now => return Poll::Ready(Err(())),
                Some(Some(done)) => this.deadline.as_mut().reset(done + *this.timeout),
                // Still streaming: look again a timeout from now.
                Some(None) => this.deadline.as_mut().reset(now + *this.timeout),
            }
        }
    }
}

/// HTTP/2 may split `Cookie` into one field per cookie; towards an
/// HTTP/1.1 upstream they are joined with `; ` into one (RFC 9113
/// §8.2.3).
fn join_cookies(headers: &mut hyper::HeaderMap) {
    let mut cookies = headers.get_all(header::COOKIE).iter();
    if cookies.nth(1).is_none() {
        return;
    }
    let joined: Vec<&[u8]> = headers.get_all(header::COOKIE).iter().map(HeaderValue::as_bytes).collect();
    if let Ok(value) = HeaderValue::from_bytes(&joined.join(&b"; "[..])) {
        headers.insert(header::COOKIE, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_cookies_are_joined_for_the_upstream() {
        let mut h = hyper::HeaderMap::new();
        h.append(header::COOKIE, HeaderValue::from_static("a=1"));
        h.append(header::COOKIE, HeaderValue::from_static("b=2"));
        join_cookies(&mut h);
        let all: Vec<_> = h.get_all(header::COOKIE).iter().collect();
        assert_eq!(all, ["a=1; b=2"]);
        let mut one = hyper::HeaderMap::new();
        one.append(header::COOKIE, HeaderValue::from_static("a=1"));
        join_cookies(&mut one);
        assert_eq!(one.get(header::COOKIE).unwrap(), "a=1");
    }
}
