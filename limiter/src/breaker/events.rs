//! Where the breaker's state changes go: the log (they are also counted by
//! the breaker itself, for `/metrics`).

use super::{Event, Sink};

/// A sink that writes every state change to the log at `warn`, with the
/// window's figures that caused it.
pub fn log() -> Sink {
    Box::new(|e: &Event| {
        let rate =
            if e.window_requests == 0 { 0.0 } else { e.window_failures as f64 / e.window_requests as f64 };
        tracing::warn!(
            from = e.from.as_str(),
            to = e.to.as_str(),
            cause = ?e.cause,
            window_requests = e.window_requests,
            window_failures = e.window_failures,
            error_rate = format!("{rate:.3}"),
            "circuit breaker {} -> {}",
            e.from.as_str(),
            e.to.as_str()
        );
    })
}
