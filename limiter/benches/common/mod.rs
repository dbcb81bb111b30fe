//! What the criterion benchmarks share.

use std::{
    sync::{Arc, Barrier},
    time::{Duration, Instant},
};

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

/// One request's (or connection's) operation on the state under test.
pub type Op = Arc<dyn Fn() + Send + Sync>;

/// Runs `op` `iters` times on every core at once; the wall time over all
/// the operations (so a fully serialised operation shows its whole cost
/// per operation, and one that scales shows its cost divided by the cores).
pub fn contended(threads: usize, iters: u64, op: Op) -> Duration {
    let start = Arc::new(Barrier::new(threads + 1));
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let (op, start) = (op.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                for _ in 0..iters {
                    op();
                }
            })
        })
        .collect();
    start.wait();
    let t = Instant::now();
    for w in workers {
        w.join().unwrap();
    }
    t.elapsed() / threads as u32
}
