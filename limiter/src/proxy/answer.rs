//! Responses limiter writes itself: the admission and breaker 503s (with
//! `Retry-After`, `Cache-Control: no-store` and `X-Limiter-Refused`), the
//! answers to heads it refuses (400, 405, 431, 501), to bodies that fail
//! (400, 408) and to an upstream that fails (502, 504). Each is made, and
//! counted, here, once for both protocols, and written by the protocol that
//! carries it: on HTTP/1 as bytes with `Connection: close`
//! ([`Answer::write_h1`]), on HTTP/2 as a response that ends its stream
//! only ([`Answer::into_h2`]).

use std::{sync::atomic::Ordering, time::Instant};

use hyper::StatusCode;

use super::{
    Proxy,
    error::{Error, Kind},
    h1::framing::HeadError,
    reason::Reason,
    request::{Refused, head::Bad},
};
use crate::{admission::Refusal, breaker::ticket::Ticket};

/// The status and text of the answer to an exchange that failed by
/// `kind` before the client had any of a response.
fn failed_status(kind: Kind) -> (StatusCode, &'static str) {
    match kind {
        Kind::UpstreamConnect => {
            (StatusCode::BAD_GATEWAY, "502 Bad Gateway: cannot connect to the upstream\n")
        }
        Kind::UpstreamTimeout => {
            (StatusCode::GATEWAY_TIMEOUT, "504 Gateway Timeout: the upstream did not answer in time\n")
        }
        Kind::UpstreamClosed => {
            (StatusCode::BAD_GATEWAY, "502 Bad Gateway: the upstream closed the connection\n")
        }
        Kind::UpstreamInvalid => {
            (StatusCode::BAD_GATEWAY, "502 Bad Gateway: the upstream's response cannot be forwarded\n")
        }
        Kind::UpstreamBody => {
            (StatusCode::BAD_GATEWAY, "502 Bad Gateway: the upstream's response broke off\n")
        }
        Kind::ClientSlowBody(_) => {
            (StatusCode::REQUEST_TIMEOUT, "408 Request Timeout: the request body arrived too slowly\n")
        }
        Kind::ClientBody | Kind::ClientGone | Kind::ClientCut => {
            (StatusCode::BAD_REQUEST, "400 Bad Request: the request body failed\n")
        }
    }
}

/// One of limiter's own responses.
#[derive(Clone, Copy, Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub text: &'static str,
    /// Why a 503 refused the request.
    pub refused: Option<Reason>,
    /// Why limiter answered itself, in a word (the access log's `reason`):
    /// a refusal's [`Reason`], a head's [`Bad`] kind, an error's [`Kind`].
    pub why: Option<&'static str>,
    /// `Retry-After`, in seconds.
    pub retry_after: Option<u64>,
    /// When the request's head came: a refusal's time to its 503 is
    /// measured when it is written.
    pub started: Option<Instant>,
}

impl Answer {
    /// A response of limiter's own, counted by status.
    fn own(proxy: &Proxy, status: StatusCode, text: &'static str, why: &'static str) -> Self {
        proxy.counters.status(status);
        Self { status, text, refused: None, why: Some(why), retry_after: None, started: None }
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
            ..Self::own(proxy, StatusCode::SERVICE_UNAVAILABLE, reason.text(), reason.as_str())
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
        Self::own(proxy, bad.status(), bad.text(), bad.kind())
    }

    /// A head refused as it became a request, on either protocol.
    pub fn refused_request(proxy: &Proxy, refused: Refused) -> Self {
        match refused {
            Refused::Bad(bad) => Self::bad(proxy, bad),
            Refused::Connect => Self::own(
                proxy,
                StatusCode::METHOD_NOT_ALLOWED,
                "CONNECT is not supported by this proxy\n",
                "connect",
            ),
        }
    }

    /// An HTTP/1 head that cannot be read as a request (counted by kind).
    pub fn head_error(proxy: &Proxy, e: HeadError) -> Self {
        let c = &proxy.counters;
        let (counter, status, text) = match e {
            HeadError::Malformed => {
                (&c.malformed, StatusCode::BAD_REQUEST, "400 Bad Request: malformed request head\n")
            }
            HeadError::FramingConflict => (
                &c.framing_conflicts,
                StatusCode::BAD_REQUEST,
                "400 Bad Request: the request's length is ambiguous (Content-Length with Transfer-Encoding, lengths that differ, or a coding not ending in chunked)\n",
            ),
            HeadError::TooLarge => (
                &c.heads_too_large,
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "431 Request Header Fields Too Large\n",
            ),
            HeadError::TransferEncoding => return Self::bad(proxy, Bad::TransferEncoding),
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Self::own(proxy, status, text, e.as_str())
    }

    /// limiter could not serve the request (its task for it ended without
    /// an answer): its own failure, not the upstream's.
    pub fn internal(proxy: &Proxy) -> Self {
        Self::own(
            proxy,
            StatusCode::INTERNAL_SERVER_ERROR,
            "500 Internal Server Error: limiter could not serve the request\n",
            "internal",
        )
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

    /// The answer to an exchange that failed before the client had any of
    /// a response (its error counted and logged already, [`Error::note`]):
    /// the upstream's failures record a failure on the ticket (a body that
    /// broke off while read ahead has recorded its head's status already),
    /// the client's drop it unrecorded.
    pub fn failed(proxy: &Proxy, error: &Error, ticket: Option<Ticket>) -> Self {
        let kind = error.kind();
        if let Some(ticket) = ticket
            && kind.is_upstream()
        {
            ticket.record(false);
        }
        let (status, text) = failed_status(kind);
        Self::own(proxy, status, text, kind.as_str())
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
        super::h1::framing::date_line(out);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::error::BodyTimeout;

    /// Every `reason` the access log writes, with its status as docs/access-log.md
    /// gives it, from the tables that make them.
    fn reasons() -> Vec<(String, String)> {
        let mut all: Vec<(String, String)> = Vec::new();
        let mut add = |name: &str, status: String| all.push((name.to_owned(), status));
        for reason in Reason::ALL {
            add(reason.as_str(), "503".to_owned());
        }
        for bad in Bad::ALL {
            add(bad.kind(), bad.status().as_u16().to_string());
        }
        for e in [HeadError::Malformed, HeadError::FramingConflict, HeadError::TooLarge] {
            let status = if e == HeadError::TooLarge { 431 } else { 400 };
            add(e.as_str(), status.to_string());
        }
        add("connect", "405".to_owned());
        add("header_timeout", "408".to_owned());
        add("internal", "500".to_owned());
        for kind in Kind::ALL {
            let status = failed_status(kind).0.as_u16().to_string();
            let status = match kind {
                Kind::UpstreamBody => format!("{status}, or the upstream's"),
                Kind::ClientGone | Kind::ClientCut => "499, or the upstream's".to_owned(),
                _ => status,
            };
            add(kind.as_str(), status);
        }
        all
    }

    /// The first two cells of each row of the access log page's table
    /// whose header is `header`.
    fn readme_table(header: &str) -> Vec<(String, String)> {
        let readme = include_str!("../../../docs/access-log.md");
        let at = readme.find(header).expect("the table is in docs/access-log.md");
        readme[at..]
            .lines()
            .skip(2)
            .take_while(|l| l.starts_with('|'))
            .map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                (cells[1].trim_matches('`').to_owned(), cells[2].to_owned())
            })
            .collect()
    }

    #[test]
    fn the_manual_lists_every_reason_of_the_access_log_with_its_status() {
        assert_eq!(readme_table("| `reason` | status | when |"), reasons());
    }

    /// The names the metrics reference's row lists for `family`'s label.
    fn readme_labels(family: &str) -> Vec<String> {
        let readme = include_str!("../../../docs/metrics.md");
        let row = readme.lines().find(|l| l.starts_with(&format!("| `{family}` |"))).expect("a row");
        let cell = row.split('|').nth(3).expect("a label cell");
        let listed = &cell[cell.find('(').expect("(")..cell.rfind(')').expect(")")];
        listed.split(", ").map(|n| n.trim_matches(|c| c == '(' || c == '`').to_owned()).collect()
    }

    #[test]
    fn the_manual_lists_every_refusal_and_every_error_kind_as_the_metrics_label_them() {
        let refusals: Vec<String> = Reason::ALL.iter().map(|r| r.as_str().to_owned()).collect();
        assert_eq!(readme_labels("limiter_http_refused_total"), refusals);
        let kinds: Vec<String> = Kind::ALL.iter().map(|k| k.as_str().to_owned()).collect();
        assert_eq!(readme_labels("limiter_http_errors_total"), kinds);
        let rules: Vec<String> = BodyTimeout::ALL.iter().map(|r| r.as_str().to_owned()).collect();
        assert_eq!(readme_labels("limiter_http_body_timeouts_total"), rules);
    }
}
