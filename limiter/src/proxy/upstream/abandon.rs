//! Exchanges limiter gave up on while the upstream still works on them: a
//! request answered 504 (no response head within `http.upstreamTimeoutMs`),
//! a response whose client went away, reset its stream or was cut for
//! reading too slowly before the upstream had delivered it, a request
//! body that failed on the client's side half-way upstream, an upload the
//! upstream took no byte of for `http.idleTimeoutMs` (alive, not reading
//! yet).
//!
//! Closing the upstream connection does not end the upstream's work (a
//! servlet that computes does not notice), so the request's permits (the
//! pools', the session's, the web clients', the fleet's) stay held while
//! the upstream goes on: its answer is read (and dropped) to its end, and
//! its connection goes back to the pool if it can carry another request;
//! or the upstream closes the connection (or, once its response has
//! begun, stalls on its body past `http.idleTimeoutMs`; waiting for a
//! response head has no idle bound: an upstream computing sends nothing
//! until it answers); or `http.upstreamAbandonMs` passes after limiter
//! gave up, and limiter closes the connection. Only then do the permits
//! return. Each is counted by [`Cause`] and [`End`]
//! (`limiter_http_abandoned_total`) and logged, at most ten lines a second,
//! with the request's id and how long the upstream went on. (The reading
//! is the upstream client's: [`super::follow_pending`].)

use std::{sync::atomic::Ordering, time::Duration};

use crate::request_id::RequestId;

/// Why limiter gave up on an exchange the upstream still works on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// No response head within `http.upstreamTimeoutMs` (the client got 504).
    Timeout,
    /// The client went away or reset its stream before the response was
    /// delivered.
    ClientGone,
    /// The request body failed on the client's side (it broke off, framed
    /// it wrongly, or sent it too slowly) after part of it went upstream.
    ClientBody,
    /// The upstream took no byte of the request for `http.idleTimeoutMs`
    /// (the client got 502): alive, not reading yet.
    Stalled,
    /// limiter cut the client for taking its response too slowly.
    ClientSlow,
}

impl Cause {
    pub const ALL: [Cause; 5] =
        [Cause::Timeout, Cause::ClientGone, Cause::ClientBody, Cause::Stalled, Cause::ClientSlow];

    /// The `cause` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::ClientGone => "client_gone",
            Self::ClientBody => "client_body",
            Self::Stalled => "stalled",
            Self::ClientSlow => "client_slow",
        }
    }
}

/// How an exchange given up on ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// The upstream delivered its answer to its end.
    Answered,
    /// The upstream closed or broke the connection, or stalled on it past
    /// `http.idleTimeoutMs`.
    Closed,
    /// `http.upstreamAbandonMs` passed: limiter closed the connection.
    Bound,
}

impl End {
    pub const ALL: [End; 3] = [End::Answered, End::Closed, End::Bound];

    /// The `end` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Answered => "answered",
            Self::Closed => "closed",
            Self::Bound => "bound",
        }
    }
}

/// Counts of exchanges given up on, by cause and end, and now.
#[derive(Debug, Default)]
pub struct Abandoned {
    counts: [[std::sync::atomic::AtomicU64; End::ALL.len()]; Cause::ALL.len()],
    /// Followed now (their permits held).
    pub now: std::sync::atomic::AtomicU64,
    log: crate::proxy::log_lines::AbandonLog,
}

impl Abandoned {
    pub fn count(&self, cause: Cause, end: End) -> u64 {
        self.counts[cause as usize][end as usize].load(Ordering::Relaxed)
    }

    pub(super) fn ended(&self, id: &RequestId, cause: Cause, end: End, went_on: Duration) {
        self.counts[cause as usize][end as usize].fetch_add(1, Ordering::Relaxed);
        self.log.note(id, cause.as_str(), end.as_str(), went_on);
    }
}

/// What an exchange given up on is followed with.
#[derive(Clone, Debug)]
pub struct Abandon {
    pub id: RequestId,
    /// `http.upstreamAbandonMs` in force when the request was sent.
    pub bound: Duration,
    /// `http.idleTimeoutMs`: the most the upstream may stall on its answer.
    pub idle: Duration,
}
