//! When the store counts as down: after [`CONSECUTIVE`] failures in a row,
//! or once at least [`WINDOW_FAILURES`] of the claims in the current
//! second failed and they are at least half of them; never for one late
//! answer (a request whose claim is late is refused, with `fleet_down`,
//! and the store stays up). A failure is a claim that failed, or one
//! answered later than `fleet.timeoutMs`.

use std::{
    sync::Mutex,
    time::{Duration, Instant},
};

pub const CONSECUTIVE: u32 = 3;
pub const WINDOW_FAILURES: u32 = 5;
const WINDOW: Duration = Duration::from_secs(1);

#[derive(Debug)]
pub struct Health(Mutex<State>);

#[derive(Debug)]
struct State {
    in_a_row: u32,
    window_start: Instant,
    ok: u32,
    failed: u32,
}

impl Default for Health {
    fn default() -> Self {
        Self(Mutex::new(State { in_a_row: 0, window_start: Instant::now(), ok: 0, failed: 0 }))
    }
}

impl Health {
    /// Records a claim's outcome at `now`: `true` when the store is to
    /// count as down from now on.
    pub fn record(&self, ok: bool, now: Instant) -> bool {
        let mut s = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if now.saturating_duration_since(s.window_start) >= WINDOW {
            (s.window_start, s.ok, s.failed) = (now, 0, 0);
        }
        if ok {
            s.in_a_row = 0;
            s.ok += 1;
            return false;
        }
        s.in_a_row += 1;
        s.failed += 1;
        s.in_a_row >= CONSECUTIVE || (s.failed >= WINDOW_FAILURES && s.failed >= s.ok)
    }

    /// The store answers again: a fresh start.
    pub fn reset(&self, now: Instant) {
        let mut s = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        *s = State { in_a_row: 0, window_start: now, ok: 0, failed: 0 };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_late_answer_never_marks_the_store_down_three_in_a_row_do() {
        let (h, t0) = (Health::default(), Instant::now());
        assert!(!h.record(false, t0));
        assert!(!h.record(true, t0));
        assert!(!h.record(false, t0));
        assert!(!h.record(false, t0));
        assert!(h.record(false, t0), "the third in a row");
    }

    #[test]
    fn a_failure_rate_of_half_over_a_second_marks_it_down() {
        let (h, t0) = (Health::default(), Instant::now());
        // Alternating: never three in a row, but half of the second's.
        let mut down = false;
        for i in 0..10 {
            down |= h.record(i % 2 == 1, t0 + Duration::from_millis(i * 10));
        }
        assert!(down);
        // Spread over seconds, the same failures are not enough.
        let h = Health::default();
        for i in 0..20 {
            assert!(!h.record(i % 4 != 0, t0 + Duration::from_millis(i * 250)), "at {i}");
        }
    }
}
