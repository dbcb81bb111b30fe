//! A fixed-bucket latency histogram with lock-free recording, exported in
//! Prometheus form (`_bucket{le}`, `_sum`, `_count`).

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use super::Page;

/// Upper bounds in seconds: fine below a millisecond (time-to-503), wide
/// above (upstream latency).
pub const BOUNDS: [f64; 18] = [
    0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
    0.5, 1.0, 2.5, 5.0, 10.0,
];

#[derive(Debug, Default)]
pub struct Histogram {
    /// Per bucket (not cumulative); the last is +Inf.
    counts: [AtomicU64; BOUNDS.len() + 1],
    sum_nanos: AtomicU64,
}

impl Histogram {
    pub fn record(&self, elapsed: Duration) {
        let secs = elapsed.as_secs_f64();
        let i = BOUNDS.iter().position(|&b| secs <= b).unwrap_or(BOUNDS.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_nanos.fetch_add(u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
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
        for (i, c) in self.counts.iter().enumerate() {
            seen += c.load(Ordering::Relaxed);
            if seen >= want {
                return Some(BOUNDS.get(i).copied().unwrap_or(f64::INFINITY));
            }
        }
        None
    }

    /// Writes the family `name` with its help text.
    pub fn write(&self, page: &mut Page, name: &str, help: &str) {
        page.family(name, "histogram", help);
        let bucket = format!("{name}_bucket");
        let mut cumulative = 0;
        for (i, c) in self.counts.iter().enumerate() {
            cumulative += c.load(Ordering::Relaxed);
            let le = BOUNDS.get(i).map_or("+Inf".to_owned(), |b| b.to_string());
            page.sample(&bucket, &[("le", &le)], cumulative);
        }
        page.sample(&format!("{name}_sum"), &[], self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9);
        page.sample(&format!("{name}_count"), &[], cumulative);
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
        let mut page = Page::default();
        h.write(&mut page, "t_seconds", "T.");
        let text = page.finish();
        assert!(text.contains("t_seconds_bucket{le=\"0.000025\"} 1\n"), "{text}");
        assert!(text.contains("t_seconds_bucket{le=\"0.00005\"} 3\n"), "{text}");
        assert!(text.contains("t_seconds_bucket{le=\"0.001\"} 4\n"), "{text}");
        assert!(text.contains("t_seconds_bucket{le=\"+Inf\"} 5\n"), "{text}");
        assert!(text.contains("t_seconds_count 5\n"), "{text}");
        assert_eq!(h.quantile_bound(0.5), Some(0.000_05));
        assert_eq!(h.quantile_bound(0.99), Some(0.005));
    }
}
