//! Forwarding an admitted request: the request goes to the upstream in
//! origin form with hop-by-hop headers removed and forwarding headers
//! added; the response comes back carrying the permit, or the proxy
//! answers 502/504/400 itself. The breaker's ticket records the result.

use std::{
    sync::{Arc, atomic::Ordering},
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

use super::{
    Proxy, Tuning,
    body::{Progress, ProxyBody, Stall, Stalled},
    exchange::Streams,
    headers::{Forwarding, strip_hop_by_hop},
    respond,
    shield::{self, MinRate, Prefixed, ReadAhead, Receipt, TooSlow},
    stream_guard,
    upstream::{Pool, Timeouts, UpstreamError},
};
use crate::{admission::Permit, breaker::ticket::Ticket};

#[expect(clippy::too_many_arguments, reason = "the request's parts and every lifetime it carries")]
pub(super) async fn forward(
    mut parts: Parts,
    receipt: Receipt,
    client_upgrade: Option<OnUpgrade>,
    permit: Permit,
    ticket: Option<Ticket>,
    proxy: &Arc<Proxy>,
    pool: &Pool,
    fwd: &Forwarding,
    h2: Option<Arc<Streams>>,
    tuning: Arc<Tuning>,
) -> Response<ProxyBody> {
    let upgrade = client_upgrade.is_some();
    // Any Upgrade header stops the framing watch (the connection may become
    // a tunnel), so unless an upgrade really happens this connection closes.
    let close_after = parts.headers.contains_key(header::UPGRADE);
    // Origin form towards the upstream, whatever form the client used.
    let mut target = hyper::Uri::builder();
    if let Some(pq) = parts.uri.path_and_query() {
        target = target.path_and_query(pq.clone());
    } else {
        target = target.path_and_query("/");
    }
    let Ok(uri) = target.build() else {
        return respond::own(
            proxy,
            StatusCode::BAD_REQUEST,
            "400 Bad Request: unusable request target\n",
            true,
        );
    };
    strip_hop_by_hop(&mut parts.headers, upgrade);
    // HTTP/2 names the host in `:authority`, which hyper puts in the URI.
    let authority = parts.uri.authority().and_then(|a| HeaderValue::from_str(a.as_str()).ok());
    if !parts.headers.contains_key(header::HOST)
        && let Some(a) = authority.filter(|a| super::head::is_valid_host(a.as_bytes()))
    {
        parts.headers.insert(header::HOST, a);
    }
    let host = match parts.headers.get(header::HOST) {
        Some(host) => Some(host.clone()),
        None => {
            // HTTP/1.0 without Host: name the upstream, as HTTP/1.1 needs one.
            let upstream = HeaderValue::from_str(proxy.upstream()).ok();
            if let Some(h) = &upstream {
                parts.headers.insert(header::HOST, h.clone());
            }
            None
        }
    };
    if h2.is_some() {
        join_cookies(&mut parts.headers);
    }
    fwd.apply(&mut parts.headers, host.as_ref());
    parts.uri = uri;
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
    let result =
        answer_within(pool.send(upstream_req, timeouts), progress.as_deref(), tuning.upstream_timeout).await;
    let mut response = match result {
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
                Some(1)
            } else if cause.is_some_and(|c| c.is::<Stalled>()) {
                Some(2)
            } else {
                None
            };
            return match timeout {
                Some(rule) => {
                    proxy.counters.body_timeouts[rule].fetch_add(1, Ordering::Relaxed);
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
                UpstreamError::Send(_) => {
                    (&proxy.counters.upstream_resets, "502 Bad Gateway: the upstream closed the connection\n")
                }
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
            let _ =
                tokio::io::copy_bidirectional(&mut TokioIo::new(client), &mut TokioIo::new(upstream)).await;
        });
        proxy.counters.status(response.status());
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
                Some(conn) => {
                    ProxyBody::boxed(stream_guard::guard(body, Some(permit), &conn.watchlist).boxed_unsync())
                }
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

/// Waits for the upstream's response head: at most `timeout` after the
/// request (body included) was fully sent. While a streaming body
/// (`progress`) is still sending, its own stall timeout applies instead.
async fn answer_within<F: std::future::Future>(
    send: F,
    progress: Option<&Progress>,
    timeout: Duration,
) -> Result<F::Output, ()> {
    let Some(progress) = progress else {
        // Sent whole: one deadline.
        return tokio::time::timeout(timeout, send).await.map_err(drop);
    };
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
