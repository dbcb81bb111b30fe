//! The HTTP/1.1 reverse proxy: admission first, then the request streams to
//! the upstream and the response streams back, each holding its permit
//! until the response body has been handed to the client connection (or
//! the client went away).
//!
//! A request over a limit is answered `503` at once, before anything
//! reaches the upstream, with `Connection: close` and `Retry-After`; the
//! connection then closes with a bounded lingering close ([`io`]) so the
//! 503 arrives intact even when the request body was never read.
//!
//! - [`server`]: listeners, worker threads, connections, drain;
//! - [`pipeline`]: one request: head checks → breaker → pools → forward
//!   → respond;
//! - [`head`]: what a head must satisfy before admission (`Host`,
//!   `Authorization`, `Transfer-Encoding`);
//! - [`path`]: which paths are diagnostic (`/debug/`), as the upstream
//!   resolves them;
//! - [`forward`]: the request to the upstream and its response back;
//! - [`respond`]: the responses the proxy writes itself (503s, errors);
//! - [`reason`]: why a request is refused (shared by the pipeline, the
//!   responses and the metrics);
//! - [`streams`]: the open streams of an HTTP/2 connection (shared by the
//!   server and each exchange);
//! - [`upstream`]: each worker's upstream connection pool;
//! - [`body`], [`io`], [`framing`], [`headers`]: bodies, the client
//!   socket, the framing watch, hop-by-hop and forwarding headers;
//! - [`shared`], [`tuning`], [`counters`]: what the workers share, the
//!   values a reload changes, the proxy's counters;
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
pub mod path;
pub mod pipeline;
pub mod proto;
pub mod reason;
pub mod refusal_log;
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
