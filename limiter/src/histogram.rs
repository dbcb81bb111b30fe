//! A fixed-bucket latency histogram with lock-free recording (the proxy
//! records into it; `metrics::page` writes it in Prometheus form). Each
//! thread records into a copy of its own ([`crate::shard`]): every
//! request records one, and a shared one would bounce between the
//! workers' CPUs.

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use crate::shard::{Padded, SHARDS, index};

/// Upper bounds in seconds: fine below a millisecond (time-to-503), wide
/// above (upstream latency).
pub const BOUNDS: [f64; 18] = [
    0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
    0.5, 1.0, 2.5, 5.0, 10.0,
];

/// One thread's counts.
#[derive(Debug, Default)]
struct Buckets {
    /// Per bucket (not cumulative); the last is +Inf.
    counts: [AtomicU64; BOUNDS.len() + 1],
    sum_nanos: AtomicU64,
}

#[derive(Debug)]
pub struct Histogram {
    shards: Box<[Padded<Buckets>; SHARDS]>,
}

impl Default for Histogram {
    fn default() -> Self {
        Self { shards: Box::new(std::array::from_fn(|_| Padded::default())) }
    }
}

impl Histogram {
    pub fn record(&self, elapsed: Duration) {
        let secs = elapsed.as_secs_f64();
        let i = BOUNDS.iter().position(|&b| secs <= b).unwrap_or(BOUNDS.len());
        let mine = &self.shards[index()].0;
        mine.counts[i].fetch_add(1, Ordering::Relaxed);
        mine.sum_nanos.fetch_add(u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Samples in bucket `i`, every thread's.
    fn bucket(&self, i: usize) -> u64 {
        self.shards.iter().map(|s| s.0.counts[i].load(Ordering::Relaxed)).sum()
    }

    pub fn count(&self) -> u64 {
        (0..=BOUNDS.len()).map(|i| self.bucket(i)).sum()
    }

    /// The smallest bucket bound below which at least `q` of the samples
    /// fall (an upper estimate of the quantile), in seconds.
    pub fn quantile_bound(&self, q: f64) -> Option<f64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let want = (q * total as f64).ceil() as u64;
        let mut seen = 0;
        for i in 0..=BOUNDS.len() {
            seen += self.bucket(i);
            if seen >= want {
                return Some(BOUNDS.get(i).copied().unwrap_or(f64::INFINITY));
            }
        }
        None
    }

    /// `(upper bound, samples at or below it)` per bucket, the last bound
    /// `None` (+Inf).
    pub fn cumulative(&self) -> Vec<(Option<f64>, u64)> {
        let mut total = 0;
        (0..=BOUNDS.len())
            .map(|i| {
                total += self.bucket(i);
                (BOUNDS.get(i).copied(), total)
            })
            .collect()
    }

    /// The sum of every sample, in seconds.
    pub fn sum_seconds(&self) -> f64 {
        self.shards.iter().map(|s| s.0.sum_nanos.load(Ordering::Relaxed)).sum::<u64>() as f64 / 1e9
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative_and_quantiles_bound_from_above() {
        let h = Histogram::default();
        for us in [10, 40, 40, 900, 3000] {
            h.record(Duration::from_micros(us));
        }
        let c = h.cumulative();
        assert_eq!(c[0], (Some(0.000_025), 1));
        assert_eq!(c[1], (Some(0.000_05), 3));
        assert_eq!(c[5], (Some(0.001), 4));
        assert_eq!(c[BOUNDS.len()], (None, 5));
        assert_eq!(h.count(), 5);
        assert!((h.sum_seconds() - 0.00399).abs() < 1e-9);
        assert_eq!(h.quantile_bound(0.5), Some(0.000_05));
        assert_eq!(h.quantile_bound(0.99), Some(0.005));
    }
}
