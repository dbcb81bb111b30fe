//! What workers share per request, one thread alone and every core
//! contending: the admission pool (its lock, and the Arc its permit holds),
//! the same with the handover ledger a daemon with a kernel gate always
//! keeps (a lock word and counts in memory the daemons share), the
//! breaker's closed path, one atomic add and subtract on a shared word
//! (what the kernel gate does to a port's count per connection), and the
//! per-thread counters (`shard`) for contrast. Run by
//! `cargo xtask bench shared`, which writes the figures and the scaling
//! model they feed into BENCHMARKS.md.

use std::{
    hint::black_box,
    os::fd::{AsFd as _, OwnedFd},
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use criterion::{Criterion, criterion_group, criterion_main};

mod common;
use limiter::{
    admission::{Admission, Ask, Limits, ledger},
    breaker::Decision,
    kernel::shared_memory::Mapping,
    shard::Counter,
};

fn limits() -> Limits {
    Limits {
        normal: 1_000_000,
        debug_reserved: 3,
        per_session: 0,
        web: 0,
        dry_run: false,
        adaptive_min: None,
        critical_reserve: false,
        tunnels: 0,
        tunnels_per_client: 0,
    }
}

/// A ledger on a memfd: the same mapping a pinned map gives, without root.
fn ledger() -> (OwnedFd, Arc<ledger::Ledger>) {
    let fd = nix::sys::memfd::memfd_create("bench-ledger", nix::sys::memfd::MFdFlags::MFD_CLOEXEC).unwrap();
    nix::unistd::ftruncate(fd.as_fd(), i64::from(ledger::BYTES)).unwrap();
    let map = Mapping::new(fd.as_fd(), ledger::BYTES as usize).unwrap();
    let ledger = ledger::Ledger::join(map, Path::new("/bench"), Duration::ZERO).unwrap();
    (fd, ledger)
}

fn benches(c: &mut Criterion) {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let (_memory, ledger) = ledger();
    let cases: Vec<(&str, common::Op)> = vec![
        ("admission", {
            let a = Admission::new(limits());
            Arc::new(move || drop(black_box(a.admit(Ask::default()))))
        }),
        ("admission_ledger", {
            let a = Admission::with_ledger(limits(), Some(ledger));
            Arc::new(move || drop(black_box(a.admit(Ask::default()))))
        }),
        ("breaker", {
            let b = common::closed_breaker();
            Arc::new(move || {
                if let Decision::Admit(kind) = black_box(b.admit()) {
                    b.record(kind, true);
                }
            })
        }),
        ("shared_word", {
            let w = Arc::new(AtomicU64::new(0));
            Arc::new(move || {
                black_box(w.fetch_add(1, Ordering::SeqCst));
                w.fetch_sub(1, Ordering::Relaxed);
            })
        }),
        ("per_thread", {
            let s = Arc::new(Counter::default());
            Arc::new(move || s.fetch_add(1, Ordering::Relaxed))
        }),
    ];
    for (name, op) in cases {
        c.bench_function(&format!("{name}_one_thread"), |b| b.iter(|| op()));
        c.bench_function(&format!("{name}_all_cores"), |b| {
            b.iter_custom(|iters| common::contended(threads, iters, op.clone()))
        });
    }
}

criterion_group! {
    name = shared_benches;
    config = Criterion::default().measurement_time(Duration::from_secs(2)).warm_up_time(Duration::from_millis(500));
    targets = benches
}
criterion_main!(shared_benches);
