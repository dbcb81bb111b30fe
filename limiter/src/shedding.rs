//! When coupled shedding starts and stops (`http.shedAfterMs`,
//! `http.shedReleaseMs`): a hysteresis over samples of "the normal pool
//! refused something since the last sample, or the breaker was open".
//!
//! Shedding starts once every sample for `after` has been refusing, and
//! stops once every sample for `release` has refused nothing. A refusing
//! sample covers the interval since the previous sample, so a run of them
//! is timed from the sample before its first.

use std::time::{Duration, Instant};

/// A change of state, as [`Hysteresis::step`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transition {
    /// Refusing for `after`: shed new connections.
    Start,
    /// Refusing nothing for `release`: stop shedding.
    Stop,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Not shedding; refusing since then (`None`: the last sample refused
    /// nothing).
    Open { refusing_since: Option<Instant> },
    /// Shedding; refusing nothing since then.
    Shedding { quiet_since: Option<Instant> },
}

/// The hysteresis of one controller.
#[derive(Clone, Copy, Debug)]
pub struct Hysteresis {
    after: Duration,
    release: Duration,
    state: State,
    /// The previous sample's time.
    last: Option<Instant>,
}

impl Hysteresis {
    pub fn new(after: Duration, release: Duration) -> Self {
        Self { after, release, state: State::Open { refusing_since: None }, last: None }
    }

    /// New timings (a reload); a run in progress keeps its start.
    pub fn set_timings(&mut self, after: Duration, release: Duration) {
        self.after = after;
        self.release = release;
    }

    pub fn shedding(&self) -> bool {
        matches!(self.state, State::Shedding { .. })
    }

    /// Back to not shedding, forgetting any run (shedding was switched off).
    pub fn reset(&mut self) {
        self.state = State::Open { refusing_since: None };
    }

    /// One sample taken at `now`: whether the pool refused since the last.
    pub fn step(&mut self, now: Instant, refusing: bool) -> Option<Transition> {
        let start = self.last.unwrap_or(now);
        self.last = Some(now);
        match &mut self.state {
            State::Open { refusing_since } => {
                if !refusing {
                    *refusing_since = None;
                    return None;
                }
                let since = *refusing_since.get_or_insert(start);
                if now.duration_since(since) >= self.after {
                    self.state = State::Shedding { quiet_since: None };
                    return Some(Transition::Start);
                }
                None
            }
            State::Shedding { quiet_since } => {
                if refusing {
                    *quiet_since = None;
                    return None;
                }
                let since = *quiet_since.get_or_insert(start);
                if now.duration_since(since) >= self.release {
                    self.state = State::Open { refusing_since: None };
                    return Some(Transition::Stop);
                }
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TICK: Duration = Duration::from_millis(10);

    /// Feeds `samples` one tick apart from `t`; the transitions with the
    /// tick they happened at.
    fn run(h: &mut Hysteresis, t: &mut Instant, samples: &[bool]) -> Vec<(usize, Transition)> {
        let mut out = Vec::new();
        for (i, &refusing) in samples.iter().enumerate() {
            *t += TICK;
            if let Some(tr) = h.step(*t, refusing) {
                out.push((i, tr));
            }
        }
        out
    }

    #[test]
    fn starts_only_after_refusing_for_the_whole_delay() {
        let mut h = Hysteresis::new(Duration::from_millis(50), Duration::from_millis(100));
        let mut t = Instant::now();
        run(&mut h, &mut t, &[false]);
        // Four refusing samples cover 40 ms, then one quiet: no start.
        assert_eq!(run(&mut h, &mut t, &[true, true, true, true, false]), []);
        assert!(!h.shedding());
        // Five refusing samples cover 50 ms: start on the fifth.
        assert_eq!(run(&mut h, &mut t, &[true, true, true, true, true]), [(4, Transition::Start)]);
        assert!(h.shedding());
    }

    #[test]
    fn stops_only_after_refusing_nothing_for_the_whole_release() {
        let mut h = Hysteresis::new(Duration::from_millis(20), Duration::from_millis(100));
        let mut t = Instant::now();
        assert_eq!(run(&mut h, &mut t, &[false, true, true]), [(2, Transition::Start)]);
        // Nine quiet samples (90 ms), one refusing: still shedding.
        let mut gap = vec![false; 9];
        gap.push(true);
        assert_eq!(run(&mut h, &mut t, &gap), []);
        assert!(h.shedding());
        // Ten quiet samples: stop on the tenth.
        assert_eq!(run(&mut h, &mut t, &[false; 10]), [(9, Transition::Stop)]);
        assert!(!h.shedding());
        // And it takes a whole new run to start again.
        assert_eq!(run(&mut h, &mut t, &[true]), []);
        assert_eq!(run(&mut h, &mut t, &[true]), [(0, Transition::Start)]);
    }

    #[test]
    fn alternating_samples_never_start_with_a_delay_longer_than_a_tick() {
        let mut h = Hysteresis::new(Duration::from_millis(30), Duration::from_millis(30));
        let mut t = Instant::now();
        let flapping: Vec<bool> = (0..100).map(|i| i % 2 == 0).collect();
        assert_eq!(run(&mut h, &mut t, &flapping), []);
    }

    #[test]
    fn reset_forgets_a_run_and_new_timings_apply_to_the_run_in_progress() {
        let mut h = Hysteresis::new(Duration::from_millis(20), Duration::from_millis(1000));
        let mut t = Instant::now();
        assert_eq!(run(&mut h, &mut t, &[false, true, true]), [(2, Transition::Start)]);
        h.reset();
        assert!(!h.shedding());
        run(&mut h, &mut t, &[false; 3]);
        assert_eq!(run(&mut h, &mut t, &[true, true]), [(1, Transition::Start)]);
        h.set_timings(Duration::from_millis(20), Duration::from_millis(30));
        assert_eq!(run(&mut h, &mut t, &[false, false, false]), [(2, Transition::Stop)]);
    }
}
