//! Responses limiter writes itself: the admission and breaker 503s (with
//! `Retry-After`, `Cache-Control: no-store` and `X-Limiter-Refused`), the
//! answers to heads it refuses (400, 405, 431, 501), to bodies that fail
//! (400, 408) and to an upstream that fails (502, 504). Each is counted
//! where it is made, and written by the protocol that carries it: on
//! HTTP/1 as bytes with `Connection: close` ([`Answer::write_h1`]), on
//! HTTP/2 as a response that ends its stream only.

use std::{sync::atomic::Ordering, time::Instant};

use hyper::StatusCode;

use super::{Proxy, counters::BodyTimeout, head::Bad, reason::Reason};
use crate::{admission::Refusal, breaker::ticket::Ticket};

/// One of limiter's own responses.
#[derive(Clone, Copy, Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub text: &'static str,
    /// Why a 503 refused the request.
    pub refused: Option<Reason>,
    /// `Retry-After`, in seconds.
    pub retry_after: Option<u64>,
    /// When the request's head came: a refusal's time to its 503 is
    /// measured when it is written.
    pub started: Option<Instant>,
}

impl Answer {
    /// A response of limiter's own, counted by status.
    pub fn own(proxy: &Proxy, status: StatusCode, text: &'static str) -> Self {
        proxy.counters.status(status);
        Self { status, text, refused: None, retry_after: None, started: None }
    }

    /// The admission 503 (counted by whoever refused: the pools, or
    /// [`Self::refuse_breaker`]).
    pub fn refuse(proxy: &Proxy, reason: Reason, started: Instant) -> Self {
        proxy.counters.refusal_log.note(reason.as_str());
        if let Reason::Admission(r) = reason
            && (r.of_pool() || r == Refusal::Debug)
        {
            // A pool is full (for a request of any class): slow readers
            // holding its permits are cut sooner.
            proxy.pressure.refused();
        }
        Self {
            refused: Some(reason),
            retry_after: Some(proxy.tuning().retry_after_secs),
            started: Some(started),
            ..Self::own(proxy, StatusCode::SERVICE_UNAVAILABLE, reason.text())
        }
    }

    /// The breaker's 503: its `Retry-After` says when the next probe may be
    /// tried, plus up to 10 % (at least a second) of jitter so that refused
    /// clients do not all return in the same second.
    pub fn refuse_breaker(proxy: &Proxy, retry_after_ms: u64, started: Instant) -> Self {
        proxy.counters.refused_breaker.fetch_add(1, Ordering::Relaxed);
        let secs = retry_after_ms.div_ceil(1000).max(1);
        let jitter = fastrand::u64(0..=(secs / 10).max(1));
        Self { retry_after: Some(secs + jitter), ..Self::refuse(proxy, Reason::Breaker, started) }
    }

    /// A head refused before admission (counted by kind).
    pub fn bad(proxy: &Proxy, bad: Bad) -> Self {
        proxy.counters.bad_heads[bad.index()].fetch_add(1, Ordering::Relaxed);
        Self::own(proxy, bad.status(), bad.text())
    }

    /// `CONNECT`, which this proxy does not tunnel.
    pub fn connect(proxy: &Proxy) -> Self {
        Self::own(proxy, StatusCode::METHOD_NOT_ALLOWED, "CONNECT is not supported by this proxy\n")
    }

    /// A request body too slow to arrive, by `rule`.
    pub fn body_timeout(proxy: &Proxy, rule: BodyTimeout) -> Self {
        proxy.counters.body_timeouts[rule.index()].fetch_add(1, Ordering::Relaxed);
        Self::own(
            proxy,
            StatusCode::REQUEST_TIMEOUT,
            "408 Request Timeout: the request body arrived too slowly\n",
        )
    }

    /// A request body the client broke off, or framed wrongly.
    pub fn body_failed(proxy: &Proxy) -> Self {
        proxy.counters.client_body_errors.fetch_add(1, Ordering::Relaxed);
        Self::own(proxy, StatusCode::BAD_REQUEST, "400 Bad Request: the request body failed\n")
    }

    /// `http.bufferMemoryBytes` is spent: the body cannot be held.
    pub fn buffer_full(proxy: &Proxy, started: Instant) -> Self {
        proxy.counters.refused_buffer_full.fetch_add(1, Ordering::Relaxed);
        Self::refuse(proxy, Reason::BufferFull, started)
    }

    /// Every upstream connection allowed stayed busy: limiter's own cap,
    /// not the upstream's failure (the ticket goes unrecorded).
    pub fn upstream_full(proxy: &Proxy, ticket: Option<Ticket>, started: Instant) -> Self {
        drop(ticket);
        proxy.counters.refused_upstream_full.fetch_add(1, Ordering::Relaxed);
        Self::refuse(proxy, Reason::UpstreamFull, started)
    }

    /// No response head within `http.upstreamTimeoutMs`: a failure.
    pub fn upstream_timeout(proxy: &Proxy, ticket: Option<Ticket>) -> Self {
        if let Some(t) = ticket {
            t.record(false);
        }
        proxy.counters.upstream_timeouts.fetch_add(1, Ordering::Relaxed);
        Self::own(
            proxy,
            StatusCode::GATEWAY_TIMEOUT,
            "504 Gateway Timeout: the upstream did not answer in time\n",
        )
    }

    /// Connecting failed (`connect`), or the connection failed before a
    /// whole response head: a failure, 502.
    pub fn upstream_failed(proxy: &Proxy, ticket: Option<Ticket>, connect: bool) -> Self {
        if let Some(t) = ticket {
            t.record(false);
        }
        let (counter, text) = if connect {
            (&proxy.counters.upstream_connect_errors, "502 Bad Gateway: cannot connect to the upstream\n")
        } else {
            (&proxy.counters.upstream_resets, "502 Bad Gateway: the upstream closed the connection\n")
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Self::own(proxy, StatusCode::BAD_GATEWAY, text)
    }

    /// The response body broke off while read ahead: nothing has reached
    /// the client yet, so it can still be told (the ticket recorded the
    /// response).
    pub fn response_broke_off(proxy: &Proxy) -> Self {
        proxy.counters.upstream_resets.fetch_add(1, Ordering::Relaxed);
        Self::own(proxy, StatusCode::BAD_GATEWAY, "502 Bad Gateway: the upstream's response broke off\n")
    }

    /// The `reason` name of a refusal (the access log's).
    pub fn reason(&self) -> Option<&'static str> {
        self.refused.map(Reason::as_str)
    }

    /// The answer is being written: a refusal's time to its 503 is told.
    pub fn sent(&self, proxy: &Proxy) {
        if let (Some(_), Some(started)) = (self.refused, self.started) {
            proxy.counters.time_to_503.record(started.elapsed());
        }
    }

    /// The answer as HTTP/1.1 bytes, closing the connection (to a `HEAD`,
    /// without its body, its length kept). Returns the body bytes written.
    pub fn write_h1(&self, out: &mut Vec<u8>, to_head: bool) -> u64 {
        out.extend_from_slice(b"HTTP/1.1 ");
        out.extend_from_slice(self.status.as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(self.status.canonical_reason().unwrap_or("").as_bytes());
        out.extend_from_slice(b"\r\ncontent-type: text/plain; charset=utf-8\r\n");
        if let Some(secs) = self.retry_after {
            out.extend_from_slice(b"retry-after: ");
            out.extend_from_slice(itoa::Buffer::new().format(secs).as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        if let Some(reason) = self.refused {
            out.extend_from_slice(b"cache-control: no-store\r\nx-limiter-refused: ");
            out.extend_from_slice(reason.as_str().as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        super::http1::date_line(out);
        out.extend_from_slice(b"content-length: ");
        out.extend_from_slice(itoa::Buffer::new().format(self.text.len()).as_bytes());
        out.extend_from_slice(b"\r\nconnection: close\r\n\r\n");
        if to_head {
            return 0;
        }
        out.extend_from_slice(self.text.as_bytes());
        self.text.len() as u64
    }

    /// The answer as an HTTP/2 response (its stream ends; the connection
    /// stays open for the others).
    pub fn into_h2<B: From<bytes::Bytes>>(self) -> hyper::Response<B> {
        use hyper::header::{self, HeaderValue};
        let mut response = hyper::Response::new(B::from(bytes::Bytes::from_static(self.text.as_bytes())));
        *response.status_mut() = self.status;
        let h = response.headers_mut();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
        if let Some(secs) = self.retry_after {
            h.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if let Some(reason) = self.refused {
            h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            h.insert(
                header::HeaderName::from_static("x-limiter-refused"),
                HeaderValue::from_static(reason.as_str()),
            );
        }
        response
    }
}
