//! The HTTP reverse proxy. Clients speak HTTP/1.1 or HTTP/2: in
//! cleartext on `http.listen` (HTTP/2 there by prior knowledge, with
//! `http.h2c`), or over TLS on `http.tls.listen` (rustls, ALPN `h2` or
//! `http/1.1`). Client connections are kept alive. Requests go to the
//! upstream as HTTP/1.1 over each worker's pool of keep-alive upstream
//! connections, every byte of their framing written by limiter; an
//! `Upgrade` the upstream accepts (WebSocket) becomes a tunnel.
//!
//! Admission comes first: the head's own checks, then the breaker and the
//! limits (pools, web clients, sessions), checked at the head, then a body
//! up to `http.requestBufferBytes` received holding no permit, then the
//! breaker and the limits taken. Then the request streams
//! to the upstream and the response streams back, holding its permit
//! until the upstream has delivered it (read ahead of the client when it
//! fits `http.responseBufferBytes`): a client that goes away, resets its
//! stream, reads slowly or is cut does not give the upstream's thread back
//! before the upstream is done.
//!
//! A request over a limit is answered `503` at once, before anything
//! reaches the upstream, with `Retry-After` and `X-Limiter-Refused`. On
//! HTTP/1 it carries `Connection: close` and the connection then closes
//! with a bounded lingering close ([`io`]) so the 503 arrives intact even
//! when the request body was never read; on HTTP/2 the stream ends with
//! its 503 and the connection stays open for its other streams.
//!
//! - [`server`]: listeners, TLS handshakes, worker threads, connections,
//!   drain;
//! - [`h1`], [`h2`]: the two sessions: limiter's HTTP/1.x engine, and
//!   HTTP/2 on hyper; what differs between them (where a body comes from,
//!   how a response goes out) and nothing else;
//! - [`pipeline`]: one request as named phases, for both: head checks →
//!   breaker and limits at the head → body → breaker and permits →
//!   upstream → response → access log;
//! - [`http1`]: HTTP/1 framing, read strictly and written by limiter, for
//!   requests and responses, heads and bodies;
//! - [`request`]: a request head whichever protocol brought it, its checks
//!   and the head the upstream gets (with its id, [`crate::request_id`]);
//! - [`head`], [`headers`], [`path`]: what a head must satisfy before
//!   admission, hop-by-hop and forwarding headers, which paths are
//!   diagnostic (`/debug/`), critical or sheddable;
//! - [`upstream`]: the one upstream client and its pool of connections,
//!   shared by every protocol, under one cap;
//! - [`answer`], [`reason`]: the responses the proxy writes itself (503s,
//!   errors) and why it refuses;
//! - [`budget`], [`rate`], [`pressure`]: the memory of held bodies, the
//!   minimum data rate, whether the pools refused a request within the
//!   last second (slow readers then lose their permits sooner);
//! - [`streams`], [`stream_guard`], [`h2_meter`]: an HTTP/2 connection's
//!   open streams, its starved streams, its floods of frames;
//! - [`io`]: the client socket (the write stall, the slow reader, the
//!   lingering close);
//! - [`proto`]: the four ways in (`h1`, `h1+tls`, `h2+tls`, `h2c`);
//! - [`shared`], [`tuning`], [`counters`], [`refusal_log`]: what the
//!   workers share, the values a reload changes, the proxy's counters,
//!   the rate-limited refusal logs;
//! - [`reset_groups`]: client groups refused at accept while their HTTP/2
//!   connections keep ending for stream resets;
//! - [`sample`]: the built-in demo upstream (`http.upstream = sample`).

pub mod answer;
pub mod budget;
pub mod counters;
pub mod h1;
pub mod h2;
pub mod h2_meter;
pub mod head;
pub mod headers;
pub mod http1;
pub mod io;
pub mod path;
pub mod pipeline;
pub mod pressure;
pub mod proto;
pub mod rate;
pub mod reason;
pub mod refusal_log;
pub mod request;
pub mod reset_groups;
pub mod sample;
pub mod server;
pub mod shared;
pub mod stream_guard;
pub mod streams;
pub mod tuning;
pub mod upstream;

pub use self::{
    counters::Counters,
    reason::Reason,
    server::{Listeners, bind, run_workers, serve},
    shared::Proxy,
    tuning::Tuning,
};
