//! Log lines for 503 refusals, rate-limited: at most [`LINES_PER_SECOND`]
//! lines per second of the daemon's clock (so at most twice that across the
//! boundary of two seconds), each saying how many refusals went
//! unlogged since the line before it, so an overload cannot flood the disk
//! and no refusal goes unaccounted. Lock-free: every worker thread refuses
//! at once under overload.

use std::{
    sync::atomic::{AtomicU32, AtomicU64, Ordering},
    time::Instant,
};

/// Refusal lines per second, at most.
pub const LINES_PER_SECOND: u32 = 10;

#[derive(Debug)]
pub struct RefusalLog {
    epoch: Instant,
    /// The second (since `epoch`) the current window started.
    window: AtomicU64,
    lines: AtomicU32,
    suppressed: AtomicU64,
}

impl Default for RefusalLog {
    fn default() -> Self {
        Self {
            epoch: Instant::now(),
            window: AtomicU64::new(0),
            lines: AtomicU32::new(0),
            suppressed: AtomicU64::new(0),
        }
    }
}

impl RefusalLog {
    /// Records one refusal; logs it if this second still has room.
    pub fn note(&self, reason: &'static str) {
        if let Some(suppressed) = self.admit(self.epoch.elapsed().as_secs()) {
            tracing::info!(reason, unlogged_since_last_line = suppressed, "refused with 503");
        }
    }

    /// Logs the refusals left out since the last line, if any (at shutdown,
    /// so the last burst is accounted for too).
    pub fn flush(&self) {
        let unlogged = self.suppressed.swap(0, Ordering::AcqRel);
        if unlogged > 0 {
            tracing::info!(unlogged_since_last_line = unlogged, "refused with 503 (not logged one by one)");
        }
    }

    /// The rate limit itself, at second `now`: `Some(unlogged count)` when
    /// a line may be written.
    fn admit(&self, now: u64) -> Option<u64> {
        let window = self.window.load(Ordering::Relaxed);
        // Only forward: a thread still holding an older second must not
        // reopen a window that has been used up.
        if now > window
            && self.window.compare_exchange(window, now, Ordering::AcqRel, Ordering::Relaxed).is_ok()
        {
            self.lines.store(0, Ordering::Release);
        }
        if self.lines.fetch_add(1, Ordering::AcqRel) < LINES_PER_SECOND {
            Some(self.suppressed.swap(0, Ordering::AcqRel))
        } else {
            self.suppressed.fetch_add(1, Ordering::AcqRel);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_ten_lines_a_second_and_every_refusal_accounted() {
        let log = RefusalLog::default();
        let (mut lines, mut reported) = (0u64, 0u64);
        // 100,000 refusals spread over 5 seconds.
        for i in 0..100_000u64 {
            if let Some(unlogged) = log.admit(i / 20_000) {
                lines += 1;
                reported += unlogged;
            }
        }
        assert_eq!(lines, 5 * u64::from(LINES_PER_SECOND));
        // One more, a second later, carries what the last lines left out.
        reported += log.admit(6).unwrap();
        lines += 1;
        assert_eq!(lines + reported, 100_001);
    }
}
