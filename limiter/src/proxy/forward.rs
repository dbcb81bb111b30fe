//! Forwarding an admitted request: the request goes to the upstream in
//! origin form with hop-by-hop headers removed and forwarding headers
//! added; the response comes back carrying the permit, or the proxy
//! answers 502/504/400 itself. The breaker's ticket records the result.

use std::{
    pin::Pin,
    sync::{Arc, atomic::Ordering},
    task::{Context, Poll, ready},
    time::{Duration, Instant},
};

use http_body_util::BodyExt as _;
use hyper::body::Body as _;
use hyper::{
    Request, Response, StatusCode,
    body::Incoming,
    header::{self, HeaderValue},
    http::request::Parts,
    upgrade::OnUpgrade,
};
use hyper_util::rt::TokioIo;
use tokio::time::Sleep;

use super::{
    Proxy, Tuning,
    body::{Progress, ProxyBody, Stall, Stalled},
    counters::BodyTimeout,
    headers::{Forwarding, Seen, strip_hop_by_hop},
    respond,
    shield::{self, MinRate, Prefixed, ReadAhead, Receipt, TooSlow},
    stream_guard,
    streams::Streams,
    upstream::{Pool, Timeouts, UpstreamError},
};
use crate::{admission::Permit, breaker::ticket::Ticket};

#[expect(clippy::too_many_arguments, reason = "the request's parts and every lifetime it carries")]
/// (An `async` block, not an `async fn`: an `async fn` moves its
/// arguments into the future, then again into locals on its first poll,
/// so a large argument costs two copies in the future and one more move.
/// The proxy's per-request futures are written this way.)
#[expect(clippy::manual_async_fn, reason = "an async fn would hold its arguments twice")]
pub(super) fn forward(
    mut parts: Parts,
    mut seen: Seen,
    receipt: Receipt,
    client_upgrade: Option<OnUpgrade>,
    permit: Permit,
    ticket: Option<Ticket>,
    proxy: &Arc<Proxy>,
    pool: &Pool,
    fwd: &Forwarding,
    h2: Option<Arc<Streams>>,
    tuning: Arc<Tuning>,
) -> impl Future<Output = Response<ProxyBody>> {
    async move {
        let upgrade = client_upgrade.is_some();
        // Any Upgrade header stops the framing watch (the connection may become
        // a tunnel), so unless an upgrade really happens this connection closes.
        let close_after = seen.upgrade();
        // Origin form towards the upstream, whatever form the client used
        // (an HTTP/1 request in origin form, the usual one, is sent as it is).
        let origin_form = parts.uri.scheme().is_none()
            && parts.uri.authority().is_none()
            && parts.uri.path_and_query().is_some();
        if !origin_form {
            let target = hyper::Uri::builder()
                .path_and_query(parts.uri.path_and_query().map_or("/", |pq| pq.as_str()));
            let Ok(uri) = target.build() else {
                return respond::own(
                    proxy,
                    StatusCode::BAD_REQUEST,
                    "400 Bad Request: unusable request target\n",
                    true,
                );
            };
            parts.uri = uri;
        }
        if strip_hop_by_hop(&mut parts.headers, &seen, upgrade) {
            // `Connection` named other headers (even `Host`): look again.
            seen = Seen::scan(&parts.headers);
        }
        let host = if seen.hosts > 0 {
            parts.headers.get(header::HOST).cloned()
        } else if let Some(a) = parts
            .uri
            .authority()
            // HTTP/2 names the host in `:authority`, which hyper puts in the URI.
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
            .filter(|a| super::head::is_valid_host(a.as_bytes()))
        {
            parts.headers.insert(header::HOST, a.clone());
            Some(a)
        } else {
            // HTTP/1.0 without Host: name the upstream, as HTTP/1.1 needs one.
            if let Ok(upstream) = HeaderValue::from_str(proxy.upstream()) {
                parts.headers.insert(header::HOST, upstream);
            }
            None
        };
        if h2.is_some() {
            join_cookies(&mut parts.headers);
        }
        fwd.apply(&mut parts.headers, host.as_ref(), seen.chained);
        parts.version = hyper::Version::HTTP_11;
        // A body in memory is sent as soon as the upstream takes it (the
        // upstream timeout counts from now); a streaming one reports when it
        // has been read to its end.
        let mut progress = None;
        let body = match receipt {
            Receipt::Whole(frames) => Prefixed::whole(frames),
            Receipt::Streaming(frames, rest) => {
                let rest = MinRate::new(rest, tuning.min_data_rate);
                let p = progress.insert(Arc::new(Progress::default()));
                Prefixed::streaming(frames, Stall::with_progress(rest, tuning.idle_timeout, p.clone()))
            }
        };
        let upstream_req = Request::from_parts(parts, body);

        let sent = Instant::now();
        let timeouts = Timeouts { connect: tuning.connect_timeout, idle: tuning.idle_timeout };
        let answer =
            answer_within(pool.send(upstream_req, timeouts), progress.as_deref(), tuning.upstream_timeout);
        let mut response = match answer.await {
            Err(_) => {
                if let Some(t) = ticket {
                    t.record(false)
                }
                proxy.counters.upstream_timeouts.fetch_add(1, Ordering::Relaxed);
                return respond::own(
                    proxy,
                    StatusCode::GATEWAY_TIMEOUT,
                    "504 Gateway Timeout: the upstream did not answer in time\n",
                    true,
                );
            }
            Ok(Err(UpstreamError::Send(e))) if e.is_user() => {
                // The client's body failed (aborted), or came too slowly (under
                // http.minDataRate, or stalled past http.idleTimeoutMs): not
                // the upstream's fault, not a result. The upstream request is
                // dropped, and the permit with it.
                drop(ticket);
                tracing::debug!("request body failed: {e:?}");
                let cause = std::error::Error::source(&e);
                let timeout = if cause.is_some_and(|c| c.is::<TooSlow>()) {
                    Some(BodyTimeout::MinRate)
                } else if cause.is_some_and(|c| c.is::<Stalled>()) {
                    Some(BodyTimeout::Idle)
                } else {
                    None
                };
                return match timeout {
                    Some(rule) => {
                        proxy.counters.body_timeouts[rule.index()].fetch_add(1, Ordering::Relaxed);
                        respond::body_timeout(proxy)
                    }
                    None => {
                        proxy.counters.client_body_errors.fetch_add(1, Ordering::Relaxed);
                        respond::own(
                            proxy,
                            StatusCode::BAD_REQUEST,
                            "400 Bad Request: the request body failed\n",
                            true,
                        )
                    }
                };
            }
            Ok(Err(e)) => {
                if let Some(t) = ticket {
                    t.record(false)
                }
                let (counter, text) = match e {
                    UpstreamError::Connect(_) => (
                        &proxy.counters.upstream_connect_errors,
                        "502 Bad Gateway: cannot connect to the upstream\n",
                    ),
                    UpstreamError::Send(_) => (
                        &proxy.counters.upstream_resets,
                        "502 Bad Gateway: the upstream closed the connection\n",
                    ),
                };
                counter.fetch_add(1, Ordering::Relaxed);
                tracing::debug!("upstream request failed: {e:?}");
                return respond::own(proxy, StatusCode::BAD_GATEWAY, text, true);
            }
            Ok(Ok(response)) => response,
        };
        let upstream_time = sent.elapsed();
        proxy.counters.upstream_latency.record(upstream_time);
        if let Some(ticket) = ticket {
            ticket.record(!tuning.is_failure(response.status().as_u16()));
        }

        if let Some(client_upgrade) = client_upgrade
            && response.status() == StatusCode::SWITCHING_PROTOCOLS
        {
            let upstream_upgrade = hyper::upgrade::on(&mut response);
            proxy.counters.upgrades.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(async move {
                let (Ok(client), Ok(upstream)) = tokio::join!(client_upgrade, upstream_upgrade) else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut TokioIo::new(client), &mut TokioIo::new(upstream))
                    .await;
            });
            proxy.counters.status(response.status());
            // The upgrade is complete: the permit goes back now, the
            // tunnel is not an HTTP request any more.
            drop(permit);
            return response.map(|_| ProxyBody::empty());
        }
        let (mut parts, body) = response.into_parts();
        let seen = Seen::scan(&parts.headers);
        strip_hop_by_hop(&mut parts.headers, &seen, false);
        if close_after {
            // Refused upgrade: the framing watch stopped at the Upgrade head,
            // so this connection must not carry another request.
            parts.headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        let body = match shield::read_ahead(body, &tuning, &proxy.budget).await {
            Ok(ReadAhead::Whole(frames)) => {
                // The upstream has delivered its last byte: its thread is free,
                // however slowly the client reads.
                drop(permit);
                let body = Prefixed::<Stall<Incoming>>::whole(frames).boxed_unsync();
                match &h2 {
                    // On HTTP/2 a starved stream must not keep its bytes for ever.
                    Some(conn) if !body.is_end_stream() => {
                        ProxyBody::boxed(stream_guard::guard(body, None, &conn.watchlist).boxed_unsync())
                    }
                    _ => ProxyBody::boxed(body),
                }
            }
            Ok(ReadAhead::Streaming(frames, rest)) => {
                let rest = Stall::new(rest, tuning.idle_timeout);
                let body = Prefixed::streaming(frames, rest).boxed_unsync();
                match &h2 {
                    // One stream can starve while its connection flows: a
                    // watchdog, not the socket, notices.
                    Some(conn) => ProxyBody::boxed(
                        stream_guard::guard(body, Some(permit), &conn.watchlist).boxed_unsync(),
                    ),
                    None => ProxyBody::boxed(body).with_permit(permit),
                }
            }
            Err(e) => {
                // Nothing has reached the client yet: it can still be told.
                proxy.counters.upstream_resets.fetch_add(1, Ordering::Relaxed);
                tracing::debug!("upstream response body failed before the client got it: {e}");
                return respond::own(
                    proxy,
                    StatusCode::BAD_GATEWAY,
                    "502 Bad Gateway: the upstream's response broke off\n",
                    true,
                );
            }
        };
        proxy.counters.status(parts.status);
        let mut body = body;
        body.meta.upstream = Some(upstream_time);
        Response::from_parts(parts, body)
    }
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
