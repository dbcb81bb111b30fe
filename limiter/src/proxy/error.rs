//! Why an exchange failed: an [`Error`] is a [`Kind`] (what failed, on
//! which side, which is what an operator acts on and what is counted) and
//! a cause (the I/O error, the framing rule, the bound that was reached),
//! as hyper's and pingora's errors are. Every failure of a read or a write
//! on either side of the proxy is one, made where it happens; it is
//! counted by kind (`limiter_http_errors_total`) and logged once, where the
//! exchange it ended is answered or closed (`Counters::note`): the
//! upstream's failures at `warn` (at most ten lines a second), the
//! client's at `debug` (a client that goes away is no fault of the node's).

use std::fmt;

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

/// What failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Connecting to the upstream failed or took past
    /// `http.connectTimeoutMs` (502).
    UpstreamConnect,
    /// No response head within `http.upstreamTimeoutMs` (504).
    UpstreamTimeout,
    /// The upstream closed, reset or stalled the connection before a whole
    /// response head (502).
    UpstreamClosed,
    /// The upstream answered what limiter does not forward (502).
    UpstreamInvalid,
    /// The response body broke off, was framed wrongly or stalled past
    /// `http.idleTimeoutMs` (502 if the client had none of it yet; its
    /// connection or stream cut otherwise).
    UpstreamBody,
    /// The client broke its request body off or framed it wrongly (400).
    ClientBody,
    /// The client sent its request body too slowly (408), by a rule.
    ClientSlowBody(BodyTimeout),
    /// The client went away (or its connection failed) before its
    /// response was written.
    ClientGone,
    /// limiter cut a client too slow to take its response.
    ClientCut,
}

impl Kind {
    /// Every kind, in the order metrics list them.
    pub const ALL: [Kind; 11] = [
        Kind::UpstreamConnect,
        Kind::UpstreamTimeout,
        Kind::UpstreamClosed,
        Kind::UpstreamInvalid,
        Kind::UpstreamBody,
        Kind::ClientBody,
        Kind::ClientSlowBody(BodyTimeout::Deadline),
        Kind::ClientSlowBody(BodyTimeout::MinRate),
        Kind::ClientSlowBody(BodyTimeout::Idle),
        Kind::ClientGone,
        Kind::ClientCut,
    ];

    /// The `kind` label, and the access log's `reason`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::UpstreamConnect => "upstream_connect",
            Self::UpstreamTimeout => "upstream_timeout",
            Self::UpstreamClosed => "upstream_closed",
            Self::UpstreamInvalid => "upstream_invalid",
            Self::UpstreamBody => "upstream_body",
            Self::ClientBody => "client_body",
            Self::ClientSlowBody(BodyTimeout::Deadline) => "client_body_deadline",
            Self::ClientSlowBody(BodyTimeout::MinRate) => "client_body_min_rate",
            Self::ClientSlowBody(BodyTimeout::Idle) => "client_body_idle",
            Self::ClientGone => "client_gone",
            Self::ClientCut => "client_cut",
        }
    }

    /// What it means, for a log line.
    fn text(self) -> &'static str {
        match self {
            Self::UpstreamConnect => "connecting to the upstream failed",
            Self::UpstreamTimeout => "the upstream sent no response head within http.upstreamTimeoutMs",
            Self::UpstreamClosed => "the upstream's connection ended before a whole response head",
            Self::UpstreamInvalid => "the upstream's response cannot be forwarded",
            Self::UpstreamBody => "the upstream's response body broke off",
            Self::ClientBody => "the client's request body failed",
            Self::ClientSlowBody(_) => "the client's request body came too slowly",
            Self::ClientGone => "the client went away",
            Self::ClientCut => "the client read too slowly and was cut",
        }
    }

    /// The upstream's failure (an operator looks at the upstream), not the
    /// client's.
    pub fn is_upstream(self) -> bool {
        matches!(
            self,
            Self::UpstreamConnect
                | Self::UpstreamTimeout
                | Self::UpstreamClosed
                | Self::UpstreamInvalid
                | Self::UpstreamBody
        )
    }

    /// Its place in [`Kind::ALL`] and in the counters.
    pub fn index(self) -> usize {
        match self {
            Self::UpstreamConnect => 0,
            Self::UpstreamTimeout => 1,
            Self::UpstreamClosed => 2,
            Self::UpstreamInvalid => 3,
            Self::UpstreamBody => 4,
            Self::ClientBody => 5,
            Self::ClientSlowBody(rule) => 6 + rule.index(),
            Self::ClientGone => 9,
            Self::ClientCut => 10,
        }
    }
}

/// The cause of an [`Error`].
#[derive(Debug)]
pub enum Cause {
    /// An I/O error of the socket.
    Io(std::io::Error),
    /// An error of the library that reads the protocol (h2's).
    Other(Box<dyn std::error::Error + Send + Sync>),
    /// A rule or a bound, in words (`"a chunk size of 2^60 or more"`,
    /// `"http.idleTimeoutMs"`).
    Rule(&'static str),
    /// The peer closed its side.
    Closed,
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io(e) => write!(f, "{e}"),
            Self::Other(e) => write!(f, "{e}"),
            Self::Rule(rule) => f.write_str(rule),
            Self::Closed => f.write_str("the connection was closed"),
        }
    }
}

/// An exchange's failure: what failed and why.
#[derive(Debug)]
pub struct Error {
    kind: Kind,
    cause: Cause,
}

impl Error {
    pub fn new(kind: Kind, cause: Cause) -> Self {
        Self { kind, cause }
    }

    pub fn io(kind: Kind, e: std::io::Error) -> Self {
        Self::new(kind, Cause::Io(e))
    }

    pub fn other(kind: Kind, e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self::new(kind, Cause::Other(e.into()))
    }

    pub fn rule(kind: Kind, rule: &'static str) -> Self {
        Self::new(kind, Cause::Rule(rule))
    }

    pub fn closed(kind: Kind) -> Self {
        Self::new(kind, Cause::Closed)
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    pub fn cause(&self) -> &Cause {
        &self.cause
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind.text(), self.cause)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.cause {
            Cause::Io(e) => Some(e),
            Cause::Other(e) => Some(e.as_ref()),
            Cause::Rule(_) | Cause::Closed => None,
        }
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

    #[test]
    fn kinds_are_listed_once_each_in_counter_order() {
        assert!(Kind::ALL.iter().enumerate().all(|(i, k)| k.index() == i));
        let names: std::collections::BTreeSet<&str> = Kind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(names.len(), Kind::ALL.len());
    }

    #[test]
    fn an_error_says_what_failed_and_why() {
        let e = Error::io(Kind::UpstreamConnect, std::io::ErrorKind::ConnectionRefused.into());
        assert_eq!(e.to_string(), "connecting to the upstream failed: connection refused");
        assert!(std::error::Error::source(&e).is_some());
        let e = Error::rule(Kind::UpstreamInvalid, "a 101 to a request that asked for no upgrade");
        assert_eq!(
            e.to_string(),
            "the upstream's response cannot be forwarded: a 101 to a request that asked for no upgrade"
        );
    }
}
