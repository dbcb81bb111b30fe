//! The HTTP reverse proxy. Clients speak HTTP/1.1 or HTTP/2: in
//! cleartext on `http.listen` (HTTP/2 there by prior knowledge, with
//! `http.h2c`), or over TLS on `http.tls.listen` (rustls, ALPN `h2` or
//! `http/1.1`). Client connections are kept alive. Requests go to the
//! upstream as HTTP/1.1 over each worker's pool of keep-alive upstream
//! connections, every byte of their framing written by limiter; an
//! `Upgrade` the upstream accepts (WebSocket) becomes a tunnel.
//!
//! Admission comes first: the head's own checks; for a request with a body,
//! the breaker and the limits (pools, web clients, sessions) checked at the
//! head and a body up to `http.requestBufferBytes` received holding no
//! permit; then the breaker and the limits taken. Then the request streams
//! to the upstream and the response streams back, holding its permit
//! until the upstream has delivered it (read ahead of the client when it
//! fits `http.responseBufferBytes`): a client that goes away or resets its
//! stream does not give the upstream's thread back before the upstream is
//! done, for at most `http.upstreamAbandonMs` (see [`upstream::abandon`]);
//! a client limiter cuts for reading too slowly has its upstream connection
//! closed, and its permit back at once.
//!
//! A request over a limit is answered `503` at once, before anything
//! reaches the upstream, with `Retry-After` and `X-Limiter-Refused`. On
//! HTTP/1 it carries `Connection: close` and the connection then closes
//! with a bounded lingering close ([`io`]) so the 503 arrives intact even
//! when the request body was never read; on HTTP/2 the stream ends with
//! its 503 and the connection stays open for its other streams.
//!
//! Read top down, the way a request comes in:
//!
//! - [`server`]: listeners, TLS handshakes, worker threads, connections,
//!   drain;
//! - [`h1`], [`h2`]: the two sessions, what differs between them (where a
//!   body comes from, how a response goes out) and nothing else:
//!   limiter's HTTP/1.x engine with its framing module ([`h1::framing`]:
//!   read strictly and written by limiter, heads and bodies), and HTTP/2
//!   on hyper with what guards it (the flood meter, the open streams, the
//!   stream guard for starved streams, the client groups refused at accept
//!   for their resets);
//! - [`pipeline`]: one request as named phases, for both: head checks →
//!   breaker and limits at the head → body → breaker and permits →
//!   upstream → response → access log;
//! - [`request`]: a request head whichever protocol brought it, its checks
//!   ([`request::head`]), its headers (hop-by-hop and forwarding,
//!   [`request::headers`]), its path's class ([`request::path`]) and the
//!   head the upstream gets (with its id, [`crate::request_id`]);
//! - [`upstream`]: the one upstream client and its pool of connections,
//!   shared by every protocol, under one cap;
//! - [`answer`], [`reason`], [`error`]: the responses the proxy writes
//!   itself (503s, errors), why it refuses, why an exchange failed;
//! - [`budget`], [`rate`], [`pressure`]: the memory of held bodies, the
//!   minimum data rate, whether the pools refused a request within the
//!   last second (slow readers then lose their permits sooner);
//! - [`io`]: the client socket (the write stall, the slow reader, the
//!   lingering close);
//! - [`proto`]: the four ways in (`h1`, `h1+tls`, `h2+tls`, `h2c`);
//! - [`shared`], [`tuning`], [`counters`], [`log_lines`]: what the
//!   workers share, the values a reload changes, the proxy's counters,
//!   the rate-limited log lines.

pub(crate) mod answer;
pub(crate) mod budget;
pub(crate) mod counters;
pub(crate) mod deadline;
pub(crate) mod error;
pub(crate) mod h1;
pub(crate) mod h2;
pub(crate) mod io;
pub(crate) mod log_lines;
pub(crate) mod pipeline;
pub(crate) mod pressure;
pub(crate) mod proto;
pub(crate) mod rate;
pub(crate) mod reason;
pub mod request;
pub(crate) mod server;
pub(crate) mod shared;
pub(crate) mod speculative;
#[cfg(test)]
mod testing;
pub(crate) mod tuning;
pub(crate) mod upstream;

pub use self::{
    counters::Counters,
    // The framing module, for the oracle the fuzz target and the corpus
    // test share.
    h1::framing,
    proto::Proto,
    reason::Reason,
    server::{Listeners, bind, run_workers},
    shared::Proxy,
    tuning::Tuning,
};
