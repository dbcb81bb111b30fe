//! The circuit breaker's families.

use super::Page;
use crate::breaker::{Mode, Snapshot, State};

/// Writes the breaker's families from its snapshot.
pub fn write(page: &mut Page, b: &Snapshot) {
    page.family("limiter_breaker_state", "gauge", "1 for the breaker's current state.");
    for state in [State::Closed, State::Open, State::HalfOpen] {
        page.sample("limiter_breaker_state", &[("state", state.as_str())], u8::from(b.state == state));
    }
    page.family(
        "limiter_breaker_mode",
        "gauge",
        "1 for the breaker's mode (auto, or forced by an operator).",
    );
    for mode in [Mode::Auto, Mode::ForcedOpen, Mode::ForcedClosed] {
        page.sample("limiter_breaker_mode", &[("mode", mode.as_str())], u8::from(b.mode == mode));
    }
    page.family("limiter_breaker_window_requests", "gauge", "Results in the rolling window.").sample(
        "limiter_breaker_window_requests",
        &[],
        b.window_requests,
    );
    page.family("limiter_breaker_window_error_ratio", "gauge", "Failures / results in the rolling window.")
        .sample("limiter_breaker_window_error_ratio", &[], b.error_rate);
    page.family("limiter_breaker_trips_total", "counter", "Times the breaker opened on its own.").sample(
        "limiter_breaker_trips_total",
        &[],
        b.trips,
    );
    page.family(
        "limiter_breaker_last_trip_timestamp_seconds",
        "gauge",
        "Unix time of the last trip (0: never).",
    )
    .sample("limiter_breaker_last_trip_timestamp_seconds", &[], b.last_trip_unix.unwrap_or(0));
    page.family("limiter_breaker_transitions_total", "counter", "State changes, by the state entered.");
    for (i, state) in [State::Closed, State::Open, State::HalfOpen].iter().enumerate() {
        page.sample("limiter_breaker_transitions_total", &[("to", state.as_str())], b.transitions[i]);
    }
}
