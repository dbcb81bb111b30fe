//! The adaptive limit of the normal pool (`http.adaptive = on`): how many
//! requests the upstream serves at once without queueing them, learnt from
//! the time admitted requests wait for their response head.
//!
//! An upstream that serves `C` requests at once in `S` each answers in `S`
//! while `C` or fewer are in flight; past `C` the rest wait in its queue and
//! every answer takes `in flight / throughput` (Little's law). The
//! controller keeps two estimates: the *base latency* (the answer time
//! without a queue) and, from the throughput measured while the upstream
//! was saturated, the *capacity* `throughput × base`. The limit is
//! `capacity` after a descent and grows from there while answers stay
//! within half again of the base.
//!
//! Latency is read in *bins*: completions of at least 100 ms and at least
//! [`MIN_COUNT`] answers (at most 1 s). Each bin's mean is compared with
//! the base:
//!
//! - **Within `1 + TOLERANCE` of it**: no queue. The limit grows by a tenth
//!   a bin (at least 1) up to the ceiling, whether or not it is reached, so
//!   a healthy upstream below capacity finds its limit at the ceiling and
//!   nothing is refused (no probing ever cuts a healthy pool).
//! - **Above it in two bins running**: a *descent*. The limit halves from
//!   what was really in flight, and the requests admitted after the cut
//!   (tagged by a generation number, so those queued before it do not
//!   count) are timed. If their answers came back faster by a quarter,
//!   the latency was a queue, and the descent halves again; once they no
//!   longer do, the queue is gone: the base is their latency, the capacity
//!   the highest throughput seen in the descent times that base, and the
//!   limit the capacity (at least the level the descent stopped at). If
//!   the very first halving changed nothing, the latency was not a queue
//!   but a slower upstream (a heavier request mix, a slower dependency
//!   with the same concurrency): the base is re-learnt and the limit
//!   restored. A slower upstream therefore does not pull the limit down
//!   for long, and a queue never raises the base (the drift of gradient
//!   controllers whose minimum latency is re-measured under load).
//! - **While refusing**, a descent starts at least every [`PROBE_EVERY`]
//!   even without a latency rise: a base learnt while the upstream was
//!   already queueing (a start in the middle of an overload) is found out.
//!   The pool is refusing anyway, and the probe lasts a bin or two.
//!
//! A stall (a GC pause) shows as one long bin followed by fast answers: the
//! descent's first halving finds the fast answers and stops, and the limit
//! is back near capacity within a few bins of growth.
//!
//! The controller is plain data: time is passed in (microseconds from any
//! origin), so tests drive it with a simulated clock. Admission calls it
//! under its own lock: [`Controller::admitted`] and
//! [`Controller::answered`] are O(1), [`Controller::tick`] is O(1)
//! amortised and runs every few milliseconds from a timer.

/// A bin lasts at least this long (µs)...
const MIN_BIN: u64 = 100_000;
/// ... and holds at least this many answers, unless it reaches
/// [`MAX_BIN`].
pub const MIN_COUNT: u64 = 8;
/// A bin ends after this long whatever it holds (µs).
const MAX_BIN: u64 = 1_000_000;
/// A bin whose mean latency exceeds the base by more than this fraction
/// shows a queue.
pub const TOLERANCE: f64 = 0.5;
/// Growth per bin without a queue.
const GROWTH: f64 = 0.1;
/// Each level of a descent keeps this fraction of the one before.
const CUT: f64 = 0.6;
/// A descent goes on while answers after a cut are faster than this
/// fraction of those before it.
const FELL: f64 = 0.75;
/// A descent level that gets no answers of its own for this long ends it
/// (demand went away; µs).
const LEVEL_TIMEOUT: u64 = 2_000_000;
/// While the pool refuses, a descent at least this often (µs).
pub const PROBE_EVERY: u64 = 30_000_000;

/// The bounds of the limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    pub min: u32,
    /// The static pool.
    pub ceiling: u32,
}

/// What the controller estimates, for metrics, `/status` and `dump`.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Estimates {
    /// The limit in force.
    pub limit: u32,
    /// Answer time without a queue, seconds (0: not yet known).
    pub base_latency: f64,
    /// The last bin's mean answer time, seconds.
    pub latency: f64,
    /// The last bin's answers per second.
    pub throughput: f64,
    /// Requests the upstream serves at once, from the last descent (0:
    /// none yet).
    pub capacity: f64,
    /// Descents so far, and how many found no queue.
    pub descents: u64,
    pub rebased: u64,
}

/// A change of the limit worth telling (more than a fifth).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Change {
    pub from: u32,
    pub to: u32,
    pub why: &'static str,
}

#[derive(Clone, Copy, Debug, Default)]
struct Bin {
    start: u64,
    count: u64,
    sum: u64,
    /// The most in flight at an admission during the bin.
    peak: u32,
    /// Answers to requests admitted in the current generation.
    fresh_count: u64,
    fresh_sum: u64,
    refused: bool,
}

#[derive(Clone, Copy, Debug)]
struct Descent {
    /// The limit before the descent began.
    before: f64,
    /// The mean latency at the previous level.
    previous: f64,
    /// The highest throughput seen so far in the descent (per second).
    best_rate: f64,
    /// When the current level began, and its answers so far.
    since: u64,
    fresh_count: u64,
    fresh_sum: u64,
    /// Levels timed so far (the first is the level the descent began
    /// at, uncut).
    steps: u32,
    /// Started by the probe: descend until the latency stops falling.
    probe: bool,
}

#[derive(Clone, Copy, Debug)]
enum Phase {
    Steady {
        /// Bins in a row above the base.
        high: u32,
    },
    Descending(Descent),
}

/// The adaptive limit of one pool.
#[derive(Clone, Debug)]
pub struct Controller {
    bounds: Bounds,
    limit: f64,
    /// Seconds; 0 until the first bin.
    base: f64,
    /// The base was learnt by a descent that went down until the latency
    /// stopped falling (not taken from the first answers, nor re-learnt
    /// from a single cut that changed nothing): a later descent may stop
    /// as soon as the latency is back to it.
    trusted: bool,
    capacity: f64,
    generation: u32,
    bin: Bin,
    phase: Phase,
    last_descent: Option<u64>,
    latency: f64,
    throughput: f64,
    descents: u64,
    rebased: u64,
    /// The limit is enforced; otherwise (`http.adaptive = off`) the
    /// controller only watches, learning a base from the answers so that
    /// switching it on in the middle of an overload finds the queue.
    enforcing: bool,
}

impl Controller {
    /// A controller starting at `start` (the ceiling on a fresh start, the
    /// learnt limit on a handover).
    pub fn new(bounds: Bounds, start: u32, now: u64) -> Self {
        let bounds = sane(bounds);
        Self {
            bounds,
            limit: f64::from(start.clamp(bounds.min, bounds.ceiling)),
            base: 0.0,
            trusted: false,
            capacity: 0.0,
            generation: 0,
            bin: Bin { start: now, ..Bin::default() },
            phase: Phase::Steady { high: 0 },
            last_descent: None,
            latency: 0.0,
            throughput: 0.0,
            descents: 0,
            rebased: 0,
            enforcing: true,
        }
    }

    /// Enforces the limit, or only watches (then the base is the lowest
    /// bin mean seen, and the limit the ceiling). Switched on, it starts
    /// from the ceiling with that base, to be confirmed by a descent.
    pub fn set_enforcing(&mut self, on: bool) {
        if on && !self.enforcing {
            self.limit = f64::from(self.bounds.ceiling);
            self.phase = Phase::Steady { high: 0 };
            self.trusted = false;
        }
        self.enforcing = on;
    }

    /// New bounds (a reload); the limit is clamped into them.
    pub fn set_bounds(&mut self, bounds: Bounds) {
        self.bounds = sane(bounds);
        self.limit = self.limit.clamp(f64::from(self.bounds.min), f64::from(self.bounds.ceiling));
    }

    pub fn limit(&self) -> u32 {
        self.limit as u32
    }

    /// Starts from what another daemon learnt (a handover): its limit and
    /// its base latency in seconds (0: it had none).
    pub fn resume(&mut self, limit: u32, base: f64) {
        self.limit = f64::from(limit).clamp(f64::from(self.bounds.min), f64::from(self.bounds.ceiling));
        if base.is_finite() && base > 0.0 {
            self.base = base;
            self.trusted = true;
        }
    }

    /// The generation a request admitted now belongs to.
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// A request was admitted with `in_flight` in the pool (itself
    /// included).
    pub fn admitted(&mut self, in_flight: u32) {
        self.bin.peak = self.bin.peak.max(in_flight);
    }

    /// Nothing admitted, refused or answered since the bin began: the
    /// timer may sleep (see [`Self::woke`]).
    pub fn quiet(&self) -> bool {
        let b = &self.bin;
        b.count == 0 && b.peak == 0 && !b.refused
    }

    /// The timer slept while [`Self::quiet`]: the bin starts `now`, so
    /// the sleep is not taken for a second of no answers.
    pub fn woke(&mut self, now: u64) {
        if self.quiet() {
            self.bin.start = now;
        }
    }

    /// The pool refused a request.
    pub fn refused(&mut self) {
        self.bin.refused = true;
    }

    /// A request of `generation` got its response head `latency_us` after
    /// it was sent.
    pub fn answered(&mut self, latency_us: u64, generation: u32) {
        self.bin.count += 1;
        self.bin.sum += latency_us;
        if generation == self.generation {
            self.bin.fresh_count += 1;
            self.bin.fresh_sum += latency_us;
        }
    }

    pub fn estimates(&self) -> Estimates {
        Estimates {
            limit: self.limit(),
            base_latency: self.base,
            latency: self.latency,
            throughput: self.throughput,
            capacity: self.capacity,
            descents: self.descents,
            rebased: self.rebased,
        }
    }

    /// Closes the bin when it is due; `Some` when the limit moved by more
    /// than a fifth.
    pub fn tick(&mut self, now: u64) -> Option<Change> {
        let age = now.saturating_sub(self.bin.start);
        if age < MIN_BIN || (self.bin.count < MIN_COUNT && age < MAX_BIN) {
            return None;
        }
        let bin = std::mem::replace(&mut self.bin, Bin { start: now, ..Bin::default() });
        let before = self.limit();
        let why = self.close(bin, now, age);
        let after = self.limit();
        let moved = f64::from(before.abs_diff(after)) > f64::from(before) / 5.0;
        (moved && why.is_some()).then(|| Change { from: before, to: after, why: why.unwrap_or("") })
    }

    fn close(&mut self, bin: Bin, now: u64, age: u64) -> Option<&'static str> {
        if bin.count == 0 {
            // Nothing answered for a whole second: idle, or a stall (a
            // stall shows in the next bin).
            return None;
        }
        let mean = bin.sum as f64 / bin.count as f64 / 1e6;
        let rate = bin.count as f64 / (age as f64 / 1e6);
        self.latency = mean;
        self.throughput = rate;
        if self.base == 0.0 {
            // The first answers after a start were admitted into an empty
            // pool: they have not queued behind one another yet.
            self.base = mean;
        }
        if !self.enforcing {
            self.base = self.base.min(mean);
            return None;
        }
        match self.phase {
            Phase::Steady { high } => self.steady(bin, now, mean, rate, high),
            Phase::Descending(d) => self.descend(d, bin, now, rate),
        }
    }

    fn steady(&mut self, bin: Bin, now: u64, mean: f64, rate: f64, high: u32) -> Option<&'static str> {
        let queue = mean > self.base * (1.0 + TOLERANCE);
        let probe = bin.refused && self.last_descent.is_none_or(|t| now.saturating_sub(t) >= PROBE_EVERY);
        if (queue && high >= 1) || probe {
            let from = f64::from(bin.peak).min(self.limit).max(1.0);
            self.descents += 1;
            self.last_descent = Some(now);
            let d = Descent {
                before: self.limit,
                previous: mean,
                best_rate: rate,
                since: now,
                fresh_count: 0,
                fresh_sum: 0,
                steps: 0,
                probe: probe && !queue,
            };
            // First a level at what is in flight, timed with the requests
            // admitted from now: the reference the cuts are judged by.
            self.level(d, from);
            return Some(if probe && !queue { "probe" } else { "queue" });
        }
        if queue {
            self.phase = Phase::Steady { high: high + 1 };
            return None;
        }
        self.phase = Phase::Steady { high: 0 };
        let ceiling = f64::from(self.bounds.ceiling);
        if self.limit < ceiling {
            self.limit = (self.limit + (self.limit * GROWTH).max(1.0)).min(ceiling);
            return Some("growth");
        }
        None
    }

    /// Sets the limit to `to` and times the requests admitted after.
    fn level(&mut self, mut d: Descent, to: f64) {
        self.limit = to.floor().max(f64::from(self.bounds.min));
        self.generation = self.generation.wrapping_add(1);
        d.since = self.bin.start;
        d.fresh_count = 0;
        d.fresh_sum = 0;
        self.phase = Phase::Descending(d);
    }

    fn descend(&mut self, mut d: Descent, bin: Bin, now: u64, rate: f64) -> Option<&'static str> {
        d.best_rate = d.best_rate.max(rate);
        d.fresh_count += bin.fresh_count;
        d.fresh_sum += bin.fresh_sum;
        if d.fresh_count < MIN_COUNT {
            if now.saturating_sub(d.since) >= LEVEL_TIMEOUT {
                // No demand at this level: what was learnt stands.
                self.limit = d.before.max(self.limit);
                self.phase = Phase::Steady { high: 0 };
                return Some("descent ended without answers");
            }
            self.phase = Phase::Descending(d);
            return None;
        }
        let fresh = d.fresh_sum as f64 / d.fresh_count as f64 / 1e6;
        if d.steps == 0 {
            d.previous = fresh;
            d.steps = 1;
            let to = self.limit * CUT;
            self.level(d, to);
            return None;
        }
        let at_floor = self.limit <= f64::from(self.bounds.min);
        let fell = fresh < d.previous * FELL;
        if fell && !d.probe && self.trusted && fresh <= self.base * (1.0 + TOLERANCE) {
            // Back to the base a full descent learnt: the queue is gone,
            // no need to look lower.
            self.phase = Phase::Steady { high: 0 };
            self.base = self.base.min(fresh);
            return Some(self.settle(d));
        }
        // Slower still with fewer in flight: the queue was still growing
        // when the descent began.
        let rose = fresh * FELL > d.previous;
        if (fell || rose) && !at_floor {
            // Faster with fewer in flight: a queue at the previous level;
            // maybe still one at this level.
            d.previous = fresh;
            d.steps += 1;
            let to = self.limit * CUT;
            self.level(d, to);
            return None;
        }
        self.phase = Phase::Steady { high: 0 };
        if d.steps == 1 && !fell && !rose {
            // The first cut changed nothing: the latency was not a queue.
            self.base = fresh;
            self.trusted = false;
            self.rebased += 1;
            self.limit = d.before;
            return Some("slower upstream, no queue");
        }
        // The queue is gone at this level: its latency is the base.
        self.base = fresh;
        self.trusted = true;
        Some(self.settle(d))
    }

    /// Ends a descent that found a queue: the capacity is the best
    /// throughput seen times the base.
    fn settle(&mut self, d: Descent) -> &'static str {
        self.capacity = d.best_rate * self.base;
        let floor = f64::from(self.bounds.min).max(self.limit);
        self.limit = self.capacity.floor().clamp(floor, f64::from(self.bounds.ceiling));
        "queue"
    }
}

fn sane(b: Bounds) -> Bounds {
    let ceiling = b.ceiling.max(1);
    Bounds { min: b.min.clamp(1, ceiling), ceiling }
}

#[cfg(test)]
mod tests;
