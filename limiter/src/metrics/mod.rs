//! Prometheus metrics: [`page`] writes the text format; one module per part
//! of the daemon renders its families from that part's own snapshot or
//! counters ([`daemon`], [`kernel`], [`http`], [`fleet`], [`breaker`]), and [`process`] the
//! standard `process_*` families. Nothing here is called by
//! the parts it renders.

pub mod breaker;
pub mod daemon;
pub mod fleet;
pub mod http;
pub mod kernel;
pub mod page;
pub mod process;

pub use self::page::Page;
