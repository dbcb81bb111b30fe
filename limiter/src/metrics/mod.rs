//! Prometheus metrics: [`page`] writes the text format; one module per part
//! of the daemon renders its families from that part's own snapshot
//! ([`kernel`], [`http`], [`breaker`]); [`histogram`] is the latency type
//! they record into.

pub mod breaker;
pub mod histogram;
pub mod http;
pub mod kernel;
pub mod page;

pub use self::{histogram::Histogram, page::Page};
