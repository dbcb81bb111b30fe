//! One request, from its head to its response: the head's own checks
//! ([`head`]), the breaker, then the pools, web-client and session limits,
//! then the upstream.
//!
//! Lifetimes, all visible here: the breaker's [`Ticket`] is taken first
//! and reports the upstream's result (dropped unrecorded if the request is
//! refused or the client goes away); the admission [`Permit`] is taken
//! next and travels with the response body, so it returns when the body
//! has been handed to the client connection (or the client is gone).
//!
//! [`Permit`]: crate::admission::Permit

use std::{
    convert::Infallible,
    sync::{Arc, atomic::Ordering},
    time::Instant,
};

use hyper::{Method, Request, Response, StatusCode, body::Incoming, header};

use super::{
    Proxy, body::ProxyBody, forward::forward, head, headers::Client, path::is_debug_path, respond,
    upstream::Pool,
};
use crate::{
    admission::{Ask, Refusal},
    breaker::{Decision, State, ticket::Ticket},
};

/// Why the proxy refused a request with a 503 (labels of
/// `limiter_http_refused_total` and `X-Limiter-Refused`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// A limit of the pools, web clients or sessions.
    Admission(Refusal),
    /// The breaker is open (or half-open with its probes out).
    Breaker,
}

impl Reason {
    /// Every reason, in the order metrics list them.
    pub const ALL: [Reason; 5] = [
        Reason::Admission(Refusal::ALL[0]),
        Reason::Admission(Refusal::ALL[1]),
        Reason::Admission(Refusal::ALL[2]),
        Reason::Admission(Refusal::ALL[3]),
        Reason::Breaker,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Admission(r) => r.as_str(),
            Self::Breaker => "breaker",
        }
    }
}

/// hyper's service function for one client request.
pub(super) async fn handle(
    req: Request<Incoming>,
    proxy: Arc<Proxy>,
    pool: Arc<Pool>,
    client: Client,
) -> Result<Response<ProxyBody>, Infallible> {
    let started = Instant::now();
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
    if let Err(bad) = head::check(req.headers()) {
        proxy.counters.bad_heads[bad.index()].fetch_add(1, Ordering::Relaxed);
        tracing::debug!(peer = %client.addr, kind = bad.kind(), "request head refused before admission");
        return Ok(respond::own(&proxy, bad.status(), bad.text(), true));
    }
    let debug = is_debug_path(req.uri().path());
    // 1. The breaker, before any permit is taken.
    let ticket = if debug {
        // Diagnostics are never results; they pass an open breaker unless
        // breaker.bypassDebug = false, and then never consume a probe.
        if !proxy.tuning().bypass_debug
            && proxy.breaker.state() != State::Closed
            && let Decision::Refuse { retry_after_ms } = proxy.breaker.admit_passive()
        {
            return Ok(respond::refuse_breaker(&proxy, retry_after_ms, started));
        }
        None
    } else {
        match proxy.breaker.admit() {
            Decision::Admit(kind) => Some(Ticket::new(proxy.breaker.clone(), kind)),
            Decision::Refuse { retry_after_ms } => {
                return Ok(respond::refuse_breaker(&proxy, retry_after_ms, started));
            }
        }
    };
    // 2-4. Pools, web clients, sessions.
    let headers = req.headers();
    let ask = Ask {
        debug,
        web: headers.contains_key("x-client-id"),
        session: headers.get(header::AUTHORIZATION).map(header::HeaderValue::as_bytes),
    };
    match proxy.admission.admit(ask) {
        Ok(permit) => Ok(forward(req, permit, ticket, &proxy, &pool, client).await),
        // The ticket is dropped unrecorded: a refusal is not a result.
        Err(refusal) => Ok(respond::refuse(&proxy, Reason::Admission(refusal), started)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_the_pools_then_the_breaker_each_once() {
        let names: Vec<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(names, ["normal", "debug", "web", "session", "breaker"]);
    }
}
