//! Counters of the proxy itself (admission and the breaker keep their
//! own), rendered by `metrics::http`.

use std::sync::atomic::{AtomicU64, Ordering};

use hyper::StatusCode;

use super::{
    h2_meter::Flood,
    head::Bad,
    proto::Proto,
    refusal_log::{RefusalLog, ResetLog},
};
use crate::{histogram::Histogram, shard::Counter};

#[derive(Debug, Default)]
pub struct Counters {
    /// Rate-limited log lines for 503 refusals.
    pub refusal_log: RefusalLog,
    /// Rate-limited log lines for HTTP/2 connections ended for resets.
    pub reset_log: ResetLog,
    /// Responses sent by status class, 1xx..5xx (bumped by every request:
    /// kept per thread, [`crate::shard`]).
    pub responses: [Counter; 5],
    /// Requests refused because the breaker is open (the pools count
    /// theirs).
    pub refused_breaker: AtomicU64,
    pub upstream_latency: Histogram,
    pub time_to_503: Histogram,
    pub upstream_connect_errors: AtomicU64,
    pub upstream_timeouts: AtomicU64,
    pub upstream_resets: AtomicU64,
    /// Connections closed by hyper for a bad request head, by kind.
    pub header_timeouts: AtomicU64,
    pub heads_too_large: AtomicU64,
    pub malformed: AtomicU64,
    /// Heads refused for carrying both Content-Length and Transfer-Encoding.
    pub framing_conflicts: AtomicU64,
    /// Heads refused before admission, by [`Bad`] (in [`Bad::ALL`] order).
    pub bad_heads: [AtomicU64; Bad::ALL.len()],
    /// Request bodies that failed on the client's side (aborted).
    pub client_body_errors: AtomicU64,
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
    /// Request bodies too slow (408), by [`BodyTimeout`] rule.
    pub body_timeouts: [AtomicU64; BodyTimeout::ALL.len()],
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

/// The rule that answered a too slow request body with 408.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyTimeout {
    /// A body read whole before admission missed `http.requestBodyTimeoutMs`.
    Deadline,
    /// A streamed body averaged less than `http.minDataRate`.
    MinRate,
    /// A streamed body stalled past `http.idleTimeoutMs`.
    Idle,
}

impl BodyTimeout {
    /// Every rule, in the order metrics list them.
    pub const ALL: [BodyTimeout; 3] = [BodyTimeout::Deadline, BodyTimeout::MinRate, BodyTimeout::Idle];

    /// The `kind` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Deadline => "deadline",
            Self::MinRate => "min_rate",
            Self::Idle => "idle",
        }
    }

    /// Its place in [`BodyTimeout::ALL`] and in the counters.
    pub fn index(self) -> usize {
        self as usize
    }
}

impl Counters {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_timeout_rules_are_listed_once_each_in_counter_order() {
        let kinds: Vec<&str> = BodyTimeout::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(kinds, ["deadline", "min_rate", "idle"]);
        assert!(BodyTimeout::ALL.iter().enumerate().all(|(i, r)| r.index() == i));
    }
}
