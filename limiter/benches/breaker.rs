//! The breaker's per-request overhead (admit + record), single-threaded and
//! with every core contending. Run by `cargo xtask bench breaker`, which
//! writes the figures into BENCHMARKS.md.

use std::{hint::black_box, sync::Arc, time::Duration};

use criterion::{Criterion, criterion_group, criterion_main};
use limiter::breaker::{Breaker, Decision};

mod common;

fn request(b: &Breaker, success: bool) {
    if let Decision::Admit(kind) = black_box(b.admit()) {
        b.record(kind, black_box(success));
    }
}

fn benches(c: &mut Criterion) {
    let b = common::closed_breaker();
    c.bench_function("single_thread_success", |bench| bench.iter(|| request(&b, true)));
    let mut n = 0u32;
    c.bench_function("single_thread_5pct_failures", |bench| {
        bench.iter(|| {
            n = n.wrapping_add(1);
            request(&b, !n.is_multiple_of(20))
        })
    });
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    // Reported per request of the aggregate: wall time / (threads x iters).
    c.bench_function("all_cores_contending_success", |bench| {
        let b = b.clone();
        let op: common::Op = Arc::new(move || request(&b, true));
        bench.iter_custom(|iters| common::contended(threads, iters, op.clone()))
    });
}

criterion_group! {
    name = breaker_benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = benches
}
criterion_main!(breaker_benches);
