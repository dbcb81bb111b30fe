//! When coupled shedding starts and stops (`http.shedAfterMs`,
//! `http.shedRefusalRate`, `http.shedReleaseMs`): a hysteresis over
//! samples of how many requests the normal pool refused since the last
//! sample (and whether the breaker was open).
//!
//! Shedding starts once the refusals in the last `after` reach `rate` ×
//! `after`: a refusal rate over a sliding window, with a threshold that
//! does not depend on how the refusals arrive. (It used to start once
//! every 10 ms sample for `after` held a refusal: with refusals arriving
//! as a Poisson stream, a run of 20 such samples took minutes at 100 a
//! second and about a second at 200, a threshold no one had chosen.) A
//! sample taken while the breaker was open counts as refusing at `rate`
//! over its interval, so an open breaker starts shedding after `after`.
//! With the defaults (500 a second over 200 ms: 100 refusals), refusals
//! arriving at twice the rate start it within about half the window, at
//! the rate within a few windows, and at half the rate never in practice
//! (100 against a Poisson mean of 50 is 7 standard deviations; the unit
//! tests feed ten minutes of it). Below about 80 refusals in the window,
//! noise starts it now and then: 40 against a mean of 20 did so 6 to 13
//! times an hour in simulations, so the configuration warns.
//!
//! It stops once every sample for `release` has refused nothing (and the
//! breaker was closed). A sample covers the interval since the previous
//! one, so a quiet run is timed from the sample before its first.

use std::{
    collections::VecDeque,
    time::{Duration, Instant},
};

/// A change of state, as [`Hysteresis::step`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transition {
    /// Refusing at the rate over `after`: shed new connections.
    Start,
    /// Refusing nothing for `release`: stop shedding.
    Stop,
}

/// What one sample saw since the previous one.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sample {
    /// Requests the normal pool refused.
    pub refused: u64,
    /// The breaker was open.
    pub breaker_open: bool,
}

/// The hysteresis of one controller.
#[derive(Clone, Debug)]
pub struct Hysteresis {
    after: Duration,
    release: Duration,
    /// Refusals per second over `after` that start shedding.
    rate: f64,
    shedding: bool,
    /// The samples within the last `after`: when, and what they weigh in
    /// refusals (an open breaker's at the rate).
    window: VecDeque<(Instant, f64)>,
    in_window: f64,
    /// While shedding: refusing nothing since then.
    quiet_since: Option<Instant>,
    /// The previous sample's time.
    last: Option<Instant>,
}

impl Hysteresis {
    pub fn new(after: Duration, release: Duration, rate: f64) -> Self {
        Self {
            after,
            release,
            rate,
            shedding: false,
            window: VecDeque::new(),
            in_window: 0.0,
            quiet_since: None,
            last: None,
        }
    }

    /// New settings (a reload); the samples already taken stay.
    pub fn set_timings(&mut self, after: Duration, release: Duration, rate: f64) {
        self.after = after;
        self.release = release;
        self.rate = rate;
    }

    pub fn shedding(&self) -> bool {
        self.shedding
    }

    /// Back to not shedding, forgetting the samples (shedding was
    /// switched off).
    pub fn reset(&mut self) {
        self.shedding = false;
        self.window.clear();
        self.in_window = 0.0;
        self.quiet_since = None;
    }

    /// The refusals in the window that start shedding.
    fn threshold(&self) -> f64 {
        self.rate * self.after.as_secs_f64()
    }

    /// One sample taken at `now`.
    pub fn step(&mut self, now: Instant, sample: Sample) -> Option<Transition> {
        let start = self.last.unwrap_or(now);
        self.last = Some(now);
        let weight = if sample.breaker_open {
            (sample.refused as f64).max(self.rate * now.duration_since(start).as_secs_f64())
        } else {
            sample.refused as f64
        };
        self.window.push_back((now, weight));
        self.in_window += weight;
        while let Some(&(at, w)) = self.window.front() {
            if now.duration_since(at) < self.after {
                break;
            }
            self.window.pop_front();
            self.in_window -= w;
        }
        // Sums of whole numbers (and of the breaker's weights) drift in
        // floating point; an empty window is exactly 0.
        if self.window.is_empty() {
            self.in_window = 0.0;
        }
        let refusing = sample.refused > 0 || sample.breaker_open;
        if !self.shedding {
            if self.in_window > 0.0 && self.in_window >= self.threshold() {
                self.shedding = true;
                self.quiet_since = None;
                return Some(Transition::Start);
            }
            return None;
        }
        if refusing {
            self.quiet_since = None;
            return None;
        }
        let since = *self.quiet_since.get_or_insert(start);
        if now.duration_since(since) >= self.release {
            self.shedding = false;
            self.quiet_since = None;
            self.window.clear();
            self.in_window = 0.0;
            return Some(Transition::Stop);
        }
        None
    }
}

#[cfg(test)]
mod tests;
