//! Why the proxy answers a request 503 itself: each reason's name (the
//! `limiter_http_refused_total` labels, `X-Limiter-Refused`, the access
//! log and the refusal log) and its 503's text, in one place.

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
    /// Every upstream connection `http.maxUpstreamConnections` allows
    /// stayed busy for `http.connectTimeoutMs`.
    UpstreamFull,
}

impl Reason {
    /// Every reason, in the order metrics list them: admission's (built
    /// from [`Refusal::ALL`], so a new limit is listed here too), then the
    /// proxy's own.
    pub const ALL: [Reason; Refusal::ALL.len() + 3] = {
        let mut all = [Reason::Breaker; Refusal::ALL.len() + 3];
        let mut i = 0;
        while i < Refusal::ALL.len() {
            all[i] = Reason::Admission(Refusal::ALL[i]);
            i += 1;
        }
        all[i] = Reason::Breaker;
        all[i + 1] = Reason::BufferFull;
        all[i + 2] = Reason::UpstreamFull;
        all
    };

    /// Its name: the `reason` label, `X-Limiter-Refused`, the access log's
    /// and the refusal log's `reason` (admission names its own).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Admission(r) => r.as_str(),
            Self::Breaker => "breaker",
            Self::BufferFull => "buffer_full",
            Self::UpstreamFull => "upstream_full",
        }
    }

    /// The body of its 503.
    pub fn text(self) -> &'static str {
        match self {
            Self::Admission(Refusal::Normal) => {
                "503 Service Unavailable: the server is at its request limit\n"
            }
            Self::Admission(Refusal::Debug) => "503 Service Unavailable: no diagnostic slot is free\n",
            Self::Admission(Refusal::Web) => "503 Service Unavailable: the web-client limit is reached\n",
            Self::Admission(Refusal::Session) => {
                "503 Service Unavailable: this session has too many requests in flight\n"
            }
            Self::Admission(Refusal::Sheddable) => {
                "503 Service Unavailable: the server is near its request limit and sheds this kind of request first\n"
            }
            Self::Admission(Refusal::Critical) => {
                "503 Service Unavailable: the server is at its request limit, even for critical requests\n"
            }
            Self::Admission(Refusal::FleetSession) => {
                "503 Service Unavailable: this session has too many requests in flight across the fleet\n"
            }
            Self::Admission(Refusal::FleetWeb) => {
                "503 Service Unavailable: the web-client limit is reached across the fleet\n"
            }
            Self::Admission(Refusal::FleetDown) => {
                "503 Service Unavailable: the fleet's limits cannot be checked now; retry later\n"
            }
            Self::Admission(Refusal::Tunnels) => {
                "503 Service Unavailable: too many upgraded connections are open\n"
            }
            Self::Admission(Refusal::TunnelsPerClient) => {
                "503 Service Unavailable: too many upgraded connections are open from this client\n"
            }
            Self::Breaker => "503 Service Unavailable: the upstream is failing; retry later\n",
            Self::BufferFull => "503 Service Unavailable: no memory is free to buffer the request body\n",
            Self::UpstreamFull => "503 Service Unavailable: every upstream connection is busy\n",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_admissions_then_the_breaker_then_the_buffers_then_the_upstream_cap_each_once() {
        let names: Vec<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        // Admission's, in its own order (its test lists them), then the proxy's.
        let admission: Vec<&str> = Refusal::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(names[..admission.len()], admission);
        assert_eq!(names[admission.len()..], ["breaker", "buffer_full", "upstream_full"]);
        let texts: std::collections::BTreeSet<&str> = Reason::ALL.iter().map(|r| r.text()).collect();
        assert_eq!(texts.len(), Reason::ALL.len(), "each reason says its own 503");
    }
}
