//! Why the proxy answers a request 503 itself: the reasons, as the
//! `limiter_http_refused_total` labels, `X-Limiter-Refused`, the access
//! log and the refusal log name them.

use crate::admission::Refusal;

/// Why the proxy refused a request with a 503 (labels of
/// `limiter_http_refused_total` and `X-Limiter-Refused`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// A limit of the pools, web clients or sessions.
    Admission(Refusal),
    /// The breaker is open (or half-open with its probes out).
    Breaker,
    /// `http.bufferMemoryBytes` is spent: the body cannot be buffered.
    BufferFull,
}

impl Reason {
    /// Every reason, in the order metrics list them.
    pub const ALL: [Reason; 6] = [
        Reason::Admission(Refusal::ALL[0]),
        Reason::Admission(Refusal::ALL[1]),
        Reason::Admission(Refusal::ALL[2]),
        Reason::Admission(Refusal::ALL[3]),
        Reason::Breaker,
        Reason::BufferFull,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Admission(r) => r.as_str(),
            Self::Breaker => "breaker",
            Self::BufferFull => "buffer_full",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_the_pools_then_the_breaker_then_the_buffers_each_once() {
        let names: Vec<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(names, ["normal", "debug", "web", "session", "breaker", "buffer_full"]);
    }
}
