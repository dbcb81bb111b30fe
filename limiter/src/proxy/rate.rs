//! The minimum data rate (`http.minDataRate`): a transfer that holds a
//! permit (a request body streamed to the upstream, a response streamed to
//! its client) must bring that many bytes per second over every stretch
//! after a grace, so a fast start cannot pay for a trickle after it.

use std::time::Duration;

use tokio::time::Instant;

/// How long a transfer may take before its rate counts.
pub const GRACE: Duration = Duration::from_secs(3);

/// When to look again at a transfer of `bytes` since `since` that must
/// bring `rate` bytes per second: a time already past means it did not.
/// A transfer that has kept the rate for at least [`GRACE`] is measured
/// afresh from now, so the rate holds over every stretch of the transfer,
/// not only on average since its start.
pub fn rate_due(since: &mut Instant, bytes: &mut u64, rate: u64) -> Instant {
    let now = Instant::now();
    let elapsed = now.saturating_duration_since(*since);
    if elapsed >= GRACE && *bytes as f64 >= rate as f64 * elapsed.as_secs_f64() {
        *since = now;
        *bytes = 0;
    }
    // Within the grace: look again when it ends. After it (and not reset):
    // the rate is not kept, the time is up.
    let grace_end = *since + GRACE;
    if now < grace_end { grace_end } else { *since + Duration::from_secs_f64(*bytes as f64 / rate as f64) }
}

/// A transfer measured against the minimum rate and the idle timeout.
#[derive(Debug)]
pub struct Pace {
    since: Instant,
    bytes: u64,
    rate: u64,
    idle: Duration,
}

/// Which rule a transfer broke.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Broke {
    MinRate,
    Idle,
}

impl Pace {
    pub fn new(rate: u64, idle: Duration) -> Self {
        Self { since: Instant::now(), bytes: 0, rate, idle }
    }

    /// `n` bytes came.
    pub fn add(&mut self, n: usize) {
        self.bytes += n as u64;
    }

    /// Until when the next bytes may take, and the rule that sets it.
    pub fn due(&mut self) -> (Instant, Broke) {
        let idle = Instant::now() + self.idle;
        if self.rate == 0 {
            return (idle, Broke::Idle);
        }
        let due = rate_due(&mut self.since, &mut self.bytes, self.rate);
        if due < idle { (due, Broke::MinRate) } else { (idle, Broke::Idle) }
    }

    /// At a deadline set by [`Self::due`] for `rule`: whether the transfer
    /// really broke it (the rate may still be kept once looked at again).
    pub fn broke(&mut self, rule: Broke) -> bool {
        match rule {
            Broke::Idle => true,
            Broke::MinRate => rate_due(&mut self.since, &mut self.bytes, self.rate) <= Instant::now(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IDLE: Duration = Duration::from_secs(60);

    #[tokio::test(start_paused = true)]
    async fn a_transfer_has_the_grace_then_must_keep_the_rate_over_every_stretch() {
        let mut pace = Pace::new(1000, IDLE);
        let (due, rule) = pace.due();
        assert_eq!(
            (due - Instant::now(), rule),
            (GRACE, Broke::MinRate),
            "nothing is judged within the grace"
        );
        // 3000 bytes in the grace's 3 s keep 1000 B/s: measured afresh.
        pace.add(3000);
        tokio::time::advance(GRACE).await;
        assert!(!pace.broke(Broke::MinRate));
        // A fast start does not pay for a trickle after it: 500 B in the
        // next 3 s is under the rate, and due when 500 B's worth passed.
        pace.add(500);
        tokio::time::advance(GRACE).await;
        assert!(pace.broke(Broke::MinRate));
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_rate_only_the_idle_timeout_counts() {
        let mut pace = Pace::new(0, IDLE);
        assert_eq!(pace.due(), (Instant::now() + IDLE, Broke::Idle));
        let mut slow = Pace::new(1, Duration::from_secs(1));
        assert_eq!(slow.due().1, Broke::Idle, "the idle timeout comes before the grace ends");
    }

    #[tokio::test(start_paused = true)]
    async fn a_rate_kept_on_average_but_late_is_looked_at_again_not_cut() {
        let mut pace = Pace::new(100, IDLE);
        tokio::time::advance(Duration::from_secs(2)).await;
        pace.add(1000);
        // Past the grace, 1000 B in 3.5 s is over 100 B/s: not broken.
        tokio::time::advance(Duration::from_millis(1500)).await;
        assert!(!pace.broke(Broke::MinRate));
        let (due, _) = pace.due();
        assert_eq!(due - Instant::now(), GRACE, "measured afresh, with a new grace");
    }
}
