//! One request, from its head to its response: the head's own checks
//! ([`head`]); the breaker and the pools, web-client and session limits
//! *checked* (a request they would refuse gets its 503 at once, its body
//! unread); the body received holding no permit ([`shield`]); then the
//! breaker and the limits *taken*, and the upstream.
//!
//! Lifetimes, all visible here: the breaker's [`Ticket`] is taken once the
//! body is in and reports the upstream's result (dropped unrecorded if the
//! request is refused or the client goes away); the admission [`Permit`]
//! is taken next and goes back when the upstream has delivered its
//! response (read ahead of the client when it fits the buffer), or with
//! the response body for a larger one.
//!
//! [`Permit`]: crate::admission::Permit

use std::{
    collections::VecDeque,
    convert::Infallible,
    sync::{Arc, atomic::Ordering},
    time::Instant,
};

use hyper::{Method, Request, Response, StatusCode, body::Body as _, header};

use super::{
    Proxy, Tuning,
    body::{ClientBody, ProxyBody},
    counters::BodyTimeout,
    forward::{Admitted, Route, forward},
    head,
    headers::{Client, Forwarding, Seen, is_upgrade},
    path::{class_of, is_debug_path},
    reason::Reason,
    respond,
    shield::{self, Receipt, ReceiveError},
    streams::Streams,
    upstream::Pool,
};
use crate::{
    admission::{Ask, Class},
    breaker::{Decision, State, ticket::Ticket},
};

/// hyper's service function for one client request (an `async` block,
/// see [`forward`]).
#[expect(clippy::manual_async_fn, reason = "an async fn would hold its arguments twice")]
pub(super) fn handle(
    mut req: Request<ClientBody>,
    proxy: Arc<Proxy>,
    pool: Arc<Pool>,
    client: Client,
    h2: Option<Arc<Streams>>,
    fwd: Arc<Forwarding>,
) -> impl Future<Output = Result<Response<ProxyBody>, Infallible>> {
    async move {
        let started = Instant::now();
        if h2.is_some() {
            // A stream reset in the same read as its HEADERS (rapid reset)
            // is already cancelled when hyper first polls this: yielding
            // once lets hyper see the RST_STREAM and drop the stream before
            // it takes a permit or reaches the upstream.
            tokio::task::yield_now().await;
        }
        if req.method() == Method::CONNECT {
            return Ok(respond::own(
                &proxy,
                StatusCode::METHOD_NOT_ALLOWED,
                "CONNECT is not supported by this proxy\n",
                true,
            ));
        }
        // The head's own checks, first: a refused head costs no breaker
        // ticket and no slot.
        let seen = Seen::scan(req.headers());
        if let Err(bad) = head::check(req.headers(), &seen)
            .and_then(|()| head::target(req.method(), req.uri(), req.version(), req.headers(), &seen))
        {
            proxy.counters.bad_heads[bad.index()].fetch_add(1, Ordering::Relaxed);
            tracing::debug!(peer = %client.addr, kind = bad.kind(), "request head refused before admission");
            return Ok(respond::own(&proxy, bad.status(), bad.text(), true));
        }
        let debug = is_debug_path(req.uri().path());
        let upgrade = is_upgrade(req.headers(), &seen).then(|| hyper::upgrade::on(&mut req));
        let tuning = proxy.tuning();
        let class = if debug {
            Class::Normal
        } else {
            class_of(req.uri().path(), &tuning.critical, &tuning.sheddable)
        };
        let (parts, body) = req.into_parts();
        let ask = Ask {
            debug,
            web: seen.client_id,
            session: if seen.authorizations == 0 {
                None
            } else {
                parts.headers.get(header::AUTHORIZATION).map(header::HeaderValue::as_bytes)
            },
            class,
        };

        // A request without a body has nothing to wait for: it is decided
        // once, below. One with a body is checked at the head, taking nothing
        // (what would be refused now is refused now, its body unread), and its
        // body received holding no permit: a client that sends slowly holds
        // none of the upstream's threads.
        let receipt = if body.is_end_stream() {
            if debug && let Some(retry_after_ms) = breaker_at_head(&proxy, debug, &tuning) {
                return Ok(respond::refuse_breaker(&proxy, retry_after_ms, started));
            }
            Receipt::Whole(VecDeque::new())
        } else {
            if let Some(retry_after_ms) = breaker_at_head(&proxy, debug, &tuning) {
                return Ok(respond::refuse_breaker(&proxy, retry_after_ms, started));
            }
            if let Err(refusal) = proxy.admission.check(ask) {
                return Ok(respond::refuse(&proxy, Reason::Admission(refusal), started));
            }
            proxy.counters.bodies_receiving.fetch_add(1, Ordering::Relaxed);
            let received = shield::receive(body, &tuning, &proxy.budget).await;
            proxy.counters.bodies_receiving.fetch_sub(1, Ordering::Relaxed);
            match received {
                Ok(receipt) => receipt,
                Err(ReceiveError::BudgetSpent) => {
                    proxy.counters.refused_buffer_full.fetch_add(1, Ordering::Relaxed);
                    return Ok(respond::refuse(&proxy, Reason::BufferFull, started));
                }
                Err(ReceiveError::Deadline) => {
                    proxy.counters.body_timeouts[BodyTimeout::Deadline.index()]
                        .fetch_add(1, Ordering::Relaxed);
                    return Ok(respond::body_timeout(&proxy));
                }
                Err(ReceiveError::Client(e)) => {
                    proxy.counters.client_body_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(peer = %client.addr, "request body failed before admission: {e}");
                    return Ok(respond::own(
                        &proxy,
                        StatusCode::BAD_REQUEST,
                        "400 Bad Request: the request body failed\n",
                        true,
                    ));
                }
            }
        };

        // 1-4 for real, now that the body is in: the breaker (a half-open
        // probe slot is taken only now), then the pools, web clients, sessions.
        let ticket = if debug {
            None
        } else {
            match proxy.breaker.admit() {
                Decision::Admit(kind) => Some(Ticket::new(proxy.breaker.clone(), kind)),
                Decision::Refuse { retry_after_ms } => {
                    return Ok(respond::refuse_breaker(&proxy, retry_after_ms, started));
                }
            }
        };
        match proxy.admission.admit(ask) {
            Ok(permit) => {
                let req = Admitted { parts, seen, receipt, upgrade, permit, ticket, started };
                Ok(forward(req, Route { proxy: &proxy, pool: &pool, fwd: &fwd, h2, tuning }).await)
            }
            // The ticket is dropped unrecorded: a refusal is not a result.
            Err(refusal) => Ok(respond::refuse(&proxy, Reason::Admission(refusal), started)),
        }
    }
}

/// The breaker's answer at a request's head, taking no probe: `Some` with
/// the time until a probe may be tried if it refuses. Diagnostics pass an
/// open breaker unless `breaker.bypassDebug = false`, and never probe.
pub(super) fn breaker_at_head(proxy: &Proxy, debug: bool, tuning: &Tuning) -> Option<u64> {
    if !debug {
        return proxy.breaker.would_refuse();
    }
    if tuning.bypass_debug || proxy.breaker.state() == State::Closed {
        return None;
    }
    match proxy.breaker.admit_passive() {
        Decision::Refuse { retry_after_ms } => Some(retry_after_ms),
        Decision::Admit(_) => None,
    }
}
