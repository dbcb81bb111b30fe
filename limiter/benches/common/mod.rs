//! What the criterion benchmarks share.

use std::sync::Arc;

use limiter::breaker::{Breaker, MonotonicClock, Policy};

/// A breaker that never trips: the closed-state path a healthy upstream
/// takes on every request.
pub fn closed_breaker() -> Arc<Breaker> {
    let policy = Policy {
        threshold: 0.5,
        min_requests: u64::MAX,
        sleep_window_ms: 30_000,
        window_ms: 30_000,
        bucket_ms: 1_000,
        half_open_max_probes: 1,
        half_open_successes: 1,
    };
    Arc::new(Breaker::new(policy, MonotonicClock::default(), Box::new(|_| {})))
}
