//! Counters every request bumps, kept one copy per thread. Two workers
//! that bump one shared atomic pull its cache line back and forth between
//! their CPUs on every request (a miss each time, and the line stays
//! nowhere); with a copy each, padded to cache lines of its own, every
//! bump stays in its CPU's cache. Reading sums the copies: a scrape's cost,
//! not a request's.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Copies of each counter: more than the workers of any node limiter runs
/// on needs apart (threads past it share a copy, which is still correct).
pub const SHARDS: usize = 16;

/// This thread's copy (threads are given one in turn as they first ask).
pub fn index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static MINE: usize = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
    }
    MINE.with(|i| *i)
}

/// A value on cache lines of its own (two lines: adjacent-line prefetch
/// pulls lines in pairs).
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct Padded<T>(pub T);

/// A counter, or an up-and-down gauge, kept per thread.
#[derive(Debug)]
pub struct Counter {
    shards: [Padded<AtomicU64>; SHARDS],
}

impl Default for Counter {
    fn default() -> Self {
        Self { shards: std::array::from_fn(|_| Padded::default()) }
    }
}

impl Counter {
    /// Adds `n` to this thread's copy (the names and the ordering argument
    /// are an atomic's, so a shared counter and a sharded one read alike).
    pub fn fetch_add(&self, n: u64, order: Ordering) {
        self.shards[index()].0.fetch_add(n, order);
    }

    /// Takes `n` from this thread's copy (a gauge: what one thread adds it
    /// takes back, the sum stays right).
    pub fn fetch_sub(&self, n: u64, order: Ordering) {
        self.shards[index()].0.fetch_sub(n, order);
    }

    /// The sum of every copy.
    pub fn load(&self, order: Ordering) -> u64 {
        self.shards.iter().fold(0u64, |sum, s| sum.wrapping_add(s.0.load(order)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_on_many_threads_sum_to_every_bump() {
        let c = Counter::default();
        std::thread::scope(|s| {
            for _ in 0..(SHARDS + 3) {
                s.spawn(|| {
                    for _ in 0..1000 {
                        c.fetch_add(2, Ordering::Relaxed);
                        c.fetch_sub(1, Ordering::Relaxed);
                    }
                });
            }
        });
        assert_eq!(c.load(Ordering::Relaxed), (SHARDS as u64 + 3) * 1000);
    }

    #[test]
    fn each_copy_has_cache_lines_of_its_own() {
        assert_eq!(std::mem::align_of::<Padded<AtomicU64>>(), 128);
        assert_eq!(std::mem::size_of::<Counter>(), 128 * SHARDS);
    }
}
