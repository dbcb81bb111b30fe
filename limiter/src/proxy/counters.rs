//! Counters of the proxy itself (admission and the breaker keep their
//! own), rendered by `metrics::http`.

use std::{
    net::SocketAddr,
    sync::atomic::{AtomicU64, Ordering},
};

use hyper::StatusCode;

use super::{
    error::{Error, Kind},
    h2::meter::Flood,
    log_lines::{ErrorLog, RefusalLog, ResetLog},
    proto::Proto,
    request::head::Bad,
};
use crate::{histogram::Histogram, request_id::RequestId, shard::Counter};

#[derive(Debug, Default)]
pub struct Counters {
    /// Rate-limited log lines for 503 refusals.
    pub refusal_log: RefusalLog,
    /// Rate-limited log lines for HTTP/2 connections ended for resets.
    pub reset_log: ResetLog,
    /// Rate-limited log lines for the upstream's failures.
    pub error_log: ErrorLog,
    /// Exchanges failed, by [`Kind`] (in [`Kind::ALL`] order).
    pub errors: [AtomicU64; Kind::ALL.len()],
    /// Responses sent by status class, 1xx..5xx (bumped by every request:
    /// kept per thread, [`crate::shard`]).
    pub responses: [Counter; 5],
    /// Requests refused because the breaker is open (the pools count
    /// theirs).
    pub refused_breaker: AtomicU64,
    pub upstream_latency: Histogram,
    pub time_to_503: Histogram,
    /// HTTP/1 connections closed at a head: not whole within
    /// `http.headerReadTimeoutMs` (an idle keep-alive connection too), ...
    pub header_timeouts: AtomicU64,
    /// ... past `http.maxHeaderBytes`, ...
    pub heads_too_large: AtomicU64,
    /// ... or not a request head httparse reads.
    pub malformed: AtomicU64,
    /// Heads whose framing two readers could read differently (the framing
    /// module's list: both a length and a coding, lengths that differ, ...).
    pub framing_conflicts: AtomicU64,
    /// Heads refused before admission, by [`Bad`] (in [`Bad::ALL`] order).
    pub bad_heads: [AtomicU64; Bad::ALL.len()],
    /// Requests refused because `http.bufferMemoryBytes` was spent.
    pub refused_buffer_full: AtomicU64,
    /// Requests refused because every upstream connection
    /// `http.maxUpstreamConnections` allows stayed busy.
    pub refused_upstream_full: AtomicU64,
    /// Requests receiving their body before admission now (no permit).
    pub bodies_receiving: AtomicU64,
    /// Client connections (HTTP/2: streams) cut for taking a response too
    /// slowly: under `http.minDataRate`, or under pressure ([`super::pressure`]).
    pub slow_readers: AtomicU64,
    /// Request fields left out for a `_` in their name
    /// (`http.underscoresInHeaders`).
    pub underscore_fields_dropped: AtomicU64,
    pub connections_open: Counter,
    pub connections_total: Counter,
    pub upgrades: AtomicU64,
    /// Connections served, by [`Proto`] (in [`Proto::ALL`] order), once
    /// the protocol is known (after the TLS handshake).
    pub connections_by_proto: [Counter; Proto::ALL.len()],
    /// Requests (HTTP/2: streams) received, by [`Proto`].
    pub requests_by_proto: [Counter; Proto::ALL.len()],
    /// TLS handshakes, by [`HANDSHAKES`] outcome.
    pub tls_handshakes: [AtomicU64; HANDSHAKES.len()],
    /// HTTP/2 streams answered 503 (the connection stays open).
    pub h2_streams_refused: AtomicU64,
    /// HTTP/2 connections cut by the flood meter, by [`Flood`] kind.
    pub h2_floods: [AtomicU64; Flood::ALL.len()],
    /// HTTP/2 connections h2 ended with GOAWAY `ENHANCE_YOUR_CALM` for
    /// excessive stream resets.
    pub h2_reset_goaways: AtomicU64,
    /// HTTP/2 connections closed after `http.idleTimeoutMs` without streams.
    pub h2_idle_closed: AtomicU64,
}

/// How TLS handshakes end: `ok`, or failed by cause (`timeout`: not done
/// within `http.tls.handshakeTimeoutMs`; `closed`: the client went away;
/// `alert`: the client refused ours (an untrusted certificate, say);
/// `protocol`: not TLS, no common version or cipher, a bad message; `io`).
pub const HANDSHAKES: [&str; 6] = ["ok", "timeout", "closed", "alert", "protocol", "io"];

impl Counters {
    /// Counts an exchange's failure by kind and logs it (see
    /// [`super::error`]), with the request's client and id.
    pub fn note(&self, error: &Error, peer: SocketAddr, id: &RequestId) {
        let kind = error.kind();
        self.errors[kind.index()].fetch_add(1, Ordering::Relaxed);
        if kind.is_upstream() {
            self.error_log.note(error, peer, id);
        } else {
            tracing::debug!(kind = kind.as_str(), client = %peer, request_id = %id, "{error}");
        }
    }

    /// Counts a response by its status class.
    pub fn status(&self, status: StatusCode) {
        self.status_code(status.as_u16());
    }

    /// Counts a response by its status class, from its number.
    pub fn status_code(&self, status: u16) {
        let class = usize::from(status / 100).clamp(1, 5) - 1;
        self.responses[class].fetch_add(1, Ordering::Relaxed);
    }
}
