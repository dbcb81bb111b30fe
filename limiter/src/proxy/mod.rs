//! The HTTP reverse proxy. Clients speak HTTP/1.1 or HTTP/2: in
//! cleartext on `http.listen` (HTTP/2 there by prior knowledge, with
//! `http.h2c`), or over TLS on `http.tls.listen` (rustls, ALPN `h2` or
//! `http/1.1`). Client connections are kept alive. Requests go to the
//! upstream as HTTP/1.1 over each worker's pool of keep-alive upstream
//! connections; an `Upgrade` the upstream accepts (WebSocket) becomes a
//! tunnel.
//!
//! Admission comes first: the head's own checks, then the breaker and the
//! limits (pools, web clients, sessions), checked at the head, then a body
//! up to `http.requestBufferBytes` received holding no permit, then the
//! breaker and the limits taken. Then the request streams
//! to the upstream and the response streams back, holding its permit
//! until the upstream has delivered it (read ahead of the client when it
//! fits `http.responseBufferBytes`) or its body has been handed to the
//! client connection (or the client went away).
//!
//! A request over a limit is answered `503` at once, before anything
//! reaches the upstream, with `Retry-After` and `X-Limiter-Refused`. On
//! HTTP/1 it carries `Connection: close` and the connection then closes
//! with a bounded lingering close ([`io`]) so the 503 arrives intact even
//! when the request body was never read; on HTTP/2 the stream ends with
//! its 503 and the connection stays open for its other streams.
//!
//! - [`server`]: listeners, TLS handshakes, worker threads, connections
//!   (HTTP/1.1 or HTTP/2), drain;
//! - [`exchange`]: one request and its response as the connection sees
//!   it (counted by protocol, access-logged, HTTP/2's headers);
//! - [`pipeline`]: one request: head checks → breaker → pools → body →
//!   forward → respond;
//! - [`head`]: what a head must satisfy before admission (`Host`,
//!   `Authorization`, `Transfer-Encoding`);
//! - [`path`]: which paths are diagnostic (`/debug/`), as the upstream
//!   resolves them;
//! - [`shield`], [`budget`]: bodies received before admission and
//!   responses read ahead, within the memory budget;
//! - [`forward`]: the request to the upstream and its response back;
//! - [`native`]: the native HTTP/1.1 engine (`http.h1Engine = native`),
//!   which serves HTTP/1.1 without hyper and calls the same rules;
//! - [`upstream`]: each worker's pool of keep-alive upstream connections,
//!   and the cap on all of them;
//! - [`respond`], [`reason`]: the responses the proxy writes itself (503s,
//!   errors) and why it refuses;
//! - [`streams`], [`stream_guard`], [`h2_meter`]: an HTTP/2 connection's
//!   open streams, its starved streams (and HTTP/1's responses cut under
//!   pressure), its floods of frames;
//! - [`pressure`]: whether the pools refused a request within the last
//!   second (slow readers then lose their permits sooner);
//! - [`body`], [`io`], [`framing`], [`headers`]: bodies, the client
//!   socket, the HTTP/1 framing watch, hop-by-hop and forwarding headers;
//! - [`proto`]: the four ways in (`h1`, `h1+tls`, `h2+tls`, `h2c`);
//! - [`shared`], [`tuning`], [`counters`], [`refusal_log`]: what the
//!   workers share, the values a reload changes, the proxy's counters,
//!   the rate-limited refusal logs;
//! - [`reset_groups`]: client groups refused at accept while their HTTP/2
//!   connections keep ending for stream resets;
//! - [`sample`]: the built-in demo upstream (`http.upstream = sample`).

pub mod body;
pub mod budget;
pub mod counters;
pub mod exchange;
pub mod forward;
pub mod framing;
pub mod h2_meter;
pub mod head;
pub mod headers;
pub mod io;
pub mod native;
pub mod path;
pub mod pipeline;
pub mod pressure;
pub mod proto;
pub mod reason;
pub mod refusal_log;
pub mod reset_groups;
pub mod respond;
pub mod sample;
pub mod server;
pub mod shared;
pub mod shield;
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
