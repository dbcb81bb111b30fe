//! The circuit breaker in front of the upstream: Closed → Open → HalfOpen.
//!
//! No I/O, and time comes from an injected [`Clock`], so every transition
//! is tested to the millisecond without waiting.
//!
//! - **Closed**: results go into `windowMs / bucketMs` buckets of a ring
//!   (memory is the ring, whatever the request rate; a bucket is reset
//!   when time comes back round to it). After a failure, if the window
//!   holds at least `minRequests` results and the error rate is strictly
//!   above `threshold`, the breaker trips to Open and stamps the time.
//! - **Open**: every request is refused, with the time until the next probe
//!   may be tried. Once `sleepWindowMs` has passed, the next request moves
//!   it to HalfOpen.
//! - **HalfOpen**: at most `halfOpenMaxProbes` requests in flight; a probe
//!   failure re-opens (and restamps), `halfOpenSuccesses` consecutive
//!   successes close it and clear the window.
//!
//! The success path in Closed takes no lock: an atomic load of the state,
//! and an atomic add into this thread's stripe of the current bucket. Locks are taken on
//! transitions, in HalfOpen, and once per bucket period to recycle a
//! bucket. Results of requests admitted before a trip still land in the
//! window, but only probes decide the way out of Open.
//!
//! Every state change is an [`Event`], counted here and handed to the sink
//! given at construction ([`events::log`] writes it to the log). A request
//! admitted through the breaker carries a [`ticket::Ticket`] that reports
//! its result, or frees its probe slot when dropped without one.

use std::sync::{
    Arc, Mutex, MutexGuard,
    atomic::{AtomicU8, AtomicU64, Ordering},
};

use crate::config::BreakerConfig;

/// Milliseconds on a monotonic clock.
pub trait Clock: Send + Sync {
    fn now_ms(&self) -> u64;
}

/// The real clock: milliseconds since the breaker was built.
pub struct MonotonicClock(std::time::Instant);

impl Default for MonotonicClock {
    fn default() -> Self {
        Self(std::time::Instant::now())
    }
}

impl Clock for MonotonicClock {
    fn now_ms(&self) -> u64 {
        self.0.elapsed().as_millis() as u64
    }
}

/// A clock the tests move by hand.
#[derive(Default)]
pub struct ManualClock(pub AtomicU64);

impl ManualClock {
    pub fn advance(&self, ms: u64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

impl<C: Clock> Clock for Arc<C> {
    fn now_ms(&self) -> u64 {
        (**self).now_ms()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Closed,
    Open,
    HalfOpen,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Open => "open",
            Self::HalfOpen => "half_open",
        }
    }

    fn from_u8(v: u8) -> Self {
        match v {
            0 => Self::Closed,
            1 => Self::Open,
            _ => Self::HalfOpen,
        }
    }
}

/// An operator's override, set on the admin listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    Auto,
    ForcedOpen,
    ForcedClosed,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::ForcedOpen => "forced_open",
            Self::ForcedClosed => "forced_closed",
        }
    }
}

/// Why the state changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// The window's error rate went above the threshold.
    Threshold,
    /// The sleep window passed; probing.
    SleepElapsed,
    /// A probe failed.
    ProbeFailed,
    /// Enough probes succeeded.
    ProbesSucceeded,
    /// An operator forced it (or returned it to automatic).
    Operator,
}

/// A state change and the figures that caused it.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Event {
    pub from: State,
    pub to: State,
    pub cause: Cause,
    pub at_ms: u64,
    pub window_requests: u64,
    pub window_failures: u64,
}

/// The breaker's thresholds and timings (milliseconds), from `breaker.*`.
#[derive(Clone, Debug, PartialEq)]
pub struct Policy {
    pub threshold: f64,
    pub min_requests: u64,
    pub sleep_window_ms: u64,
    pub window_ms: u64,
    pub bucket_ms: u64,
    pub half_open_max_probes: u32,
    pub half_open_successes: u32,
}

impl Policy {
    pub fn from_config(c: &BreakerConfig) -> Self {
        Self {
            threshold: c.threshold,
            min_requests: u64::from(c.min_requests),
            sleep_window_ms: c.sleep_window_ms,
            window_ms: c.window_ms,
            bucket_ms: c.bucket_ms,
            half_open_max_probes: c.half_open_max_probes,
            half_open_successes: c.half_open_successes,
        }
    }

    fn buckets(&self) -> usize {
        (self.window_ms / self.bucket_ms).max(1) as usize
    }
}

/// Counters are striped: each thread adds into its own cache line, so
/// every core recording at once does not bounce one line between them.
const STRIPES: usize = 16;

#[derive(Default)]
#[repr(align(64))]
struct Stripe {
    successes: AtomicU64,
    failures: AtomicU64,
}

/// One bucket of the ring; `epoch` is the absolute bucket number
/// (`now / bucketMs`) its counts belong to.
#[derive(Default)]
struct Bucket {
    epoch: AtomicU64,
    stripes: [Stripe; STRIPES],
}

impl Bucket {
    fn zero(&self) {
        for s in &self.stripes {
            s.successes.store(0, Ordering::Relaxed);
            s.failures.store(0, Ordering::Relaxed);
        }
    }

    /// (results, failures).
    fn sum(&self) -> (u64, u64) {
        self.stripes.iter().fold((0, 0), |(t, f), s| {
            let fail = s.failures.load(Ordering::Relaxed);
            (t + fail + s.successes.load(Ordering::Relaxed), f + fail)
        })
    }
}

/// This thread's stripe, assigned round-robin on first use.
fn stripe() -> usize {
    use std::cell::Cell;
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    thread_local!(static STRIPE: Cell<usize> = const { Cell::new(usize::MAX) });
    STRIPE.with(|s| {
        if s.get() == usize::MAX {
            s.set(NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES);
        }
        s.get()
    })
}

/// What the lock protects: everything but the hot counters.
struct Slow {
    policy: Policy,
    mode: Mode,
    tripped_at_ms: u64,
    tripped_at_unix: Option<u64>,
    trips: u64,
    probes_in_flight: u32,
    probe_successes: u32,
    /// Bumped on every state change: a probe of an earlier half-open round
    /// (still out when its round ended) decides nothing and frees nothing.
    round: u64,
}

pub type Sink = Box<dyn Fn(&Event) + Send + Sync>;

pub struct Breaker<C: Clock = MonotonicClock> {
    clock: C,
    /// [`State`] as a u8: read on every request without the lock.
    state: AtomicU8,
    buckets: Vec<Bucket>,
    /// `breaker.bucketMs`, fixed for the breaker's life (the ring's shape).
    bucket_ms: u64,
    /// State changes, by the state entered ([`State`] as the index).
    transitions: [AtomicU64; 3],
    slow: Mutex<Slow>,
    sink: Sink,
}

/// The breaker's decision for one request.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Go ahead; report the result (or drop the ticket if there is none).
    Admit(TicketKind),
    /// Refused; the next probe may be tried in this many ms.
    Refuse { retry_after_ms: u64 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TicketKind {
    /// Closed (or forced closed): the result feeds the window.
    Normal,
    /// A half-open probe of the given round: its result decides the way
    /// out of Open.
    Probe(u64),
}

/// A snapshot for metrics, dump and tests.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Snapshot {
    pub state: State,
    pub mode: Mode,
    pub window_requests: u64,
    pub window_failures: u64,
    pub error_rate: f64,
    pub trips: u64,
    pub last_trip_unix: Option<u64>,
    pub probes_in_flight: u32,
    /// When Open: ms until a probe may be tried.
    pub next_probe_in_ms: Option<u64>,
    /// State changes since start, by the state entered (closed, open,
    /// half-open).
    pub transitions: [u64; 3],
}

impl<C: Clock> Breaker<C> {
    pub fn new(policy: Policy, clock: C, sink: Sink) -> Self {
        // The ring is sized for the window at start; a reload that changes
        // windowMs/bucketMs needs the size the config check bounds (3600).
        let n = policy.buckets();
        Self {
            clock,
            state: AtomicU8::new(State::Closed as u8),
            buckets: (0..n).map(|_| Bucket::default()).collect(),
            bucket_ms: policy.bucket_ms,
            transitions: Default::default(),
            slow: Mutex::new(Slow {
                policy,
                mode: Mode::Auto,
                tripped_at_ms: 0,
                tripped_at_unix: None,
                trips: 0,
                probes_in_flight: 0,
                probe_successes: 0,
                round: 0,
            }),
            sink,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Slow> {
        self.slow.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn state(&self) -> State {
        State::from_u8(self.state.load(Ordering::Acquire))
    }

    /// New thresholds and timings. The window and its buckets keep the
    /// shape the breaker was built with (`breaker.windowMs` and
    /// `breaker.bucketMs` are restart keys).
    pub fn set_policy(&self, policy: Policy) {
        let mut slow = self.lock();
        slow.policy = Policy { window_ms: slow.policy.window_ms, bucket_ms: slow.policy.bucket_ms, ..policy };
    }

    /// Decides one request.
    pub fn admit(&self) -> Decision {
        match self.state() {
            State::Closed => Decision::Admit(TicketKind::Normal),
            State::Open | State::HalfOpen => self.admit_slow(),
        }
    }

    fn admit_slow(&self) -> Decision {
        let now = self.clock.now_ms();
        let mut slow = self.lock();
        match slow.mode {
            Mode::ForcedOpen => {
                return Decision::Refuse { retry_after_ms: slow.policy.sleep_window_ms };
            }
            Mode::ForcedClosed => return Decision::Admit(TicketKind::Normal),
            Mode::Auto => {}
        }
        match self.state() {
            State::Closed => Decision::Admit(TicketKind::Normal),
            State::Open => {
                let due = slow.tripped_at_ms + slow.policy.sleep_window_ms;
                if now < due {
                    return Decision::Refuse { retry_after_ms: due - now };
                }
                slow.probe_successes = 0;
                slow.probes_in_flight = 1;
                self.transition(&mut slow, State::HalfOpen, Cause::SleepElapsed, now);
                Decision::Admit(TicketKind::Probe(slow.round))
            }
            State::HalfOpen => {
                if slow.probes_in_flight < slow.policy.half_open_max_probes {
                    slow.probes_in_flight += 1;
                    Decision::Admit(TicketKind::Probe(slow.round))
                } else {
                    // A probe is out; the answer comes within the upstream
                    // timeout. Ask to come back soon.
                    Decision::Refuse { retry_after_ms: 1000 }
                }
            }
        }
    }

    /// Whether [`Self::admit`] would refuse now, taking nothing (no probe
    /// slot: the check at a request's head, before its body is read).
    /// `Some`: the ms until a probe may be tried.
    pub fn would_refuse(&self) -> Option<u64> {
        if self.state() == State::Closed {
            return None;
        }
        let now = self.clock.now_ms();
        let slow = self.lock();
        match (slow.mode, self.state()) {
            (Mode::ForcedClosed, _) | (_, State::Closed) => None,
            (Mode::ForcedOpen, _) => Some(slow.policy.sleep_window_ms),
            (Mode::Auto, State::Open) => {
                let due = slow.tripped_at_ms + slow.policy.sleep_window_ms;
                (now < due).then(|| due - now)
            }
            (Mode::Auto, State::HalfOpen) => {
                (slow.probes_in_flight >= slow.policy.half_open_max_probes).then_some(1000)
            }
        }
    }

    /// Decides a request that must not become a probe (a diagnostic
    /// request when `bypassDebug` is off): admitted only while closed.
    pub fn admit_passive(&self) -> Decision {
        let slow = self.lock();
        match (slow.mode, self.state()) {
            (Mode::ForcedClosed, _) | (_, State::Closed) => Decision::Admit(TicketKind::Normal),
            (Mode::Auto, State::Open) => {
                let due = slow.tripped_at_ms + slow.policy.sleep_window_ms;
                Decision::Refuse { retry_after_ms: due.saturating_sub(self.clock.now_ms()).max(1000) }
            }
            _ => Decision::Refuse { retry_after_ms: 1000 },
        }
    }

    /// Reports the result of an admitted request.
    pub fn record(&self, kind: TicketKind, success: bool) {
        match kind {
            TicketKind::Normal => {
                self.add(success);
                if !success && self.state() == State::Closed {
                    self.maybe_trip();
                }
            }
            TicketKind::Probe(round) => self.probe_result(round, Some(success)),
        }
    }

    /// An admitted request ended without a result (client abort, refused
    /// by admission after the breaker let it through).
    pub fn abandon(&self, kind: TicketKind) {
        if let TicketKind::Probe(round) = kind {
            self.probe_result(round, None);
        }
    }

    fn add(&self, success: bool) {
        let bucket_ms = self.bucket_ms;
        let epoch = self.clock.now_ms() / bucket_ms;
        let bucket = &self.buckets[(epoch % self.buckets.len() as u64) as usize];
        if bucket.epoch.load(Ordering::Acquire) != epoch {
            // Once per bucket period: recycle it under the lock, zeroing
            // before publishing the new epoch, so no add lands in counts
            // that are about to be zeroed.
            let _slow = self.lock();
            if bucket.epoch.load(Ordering::Acquire) != epoch {
                bucket.zero();
                bucket.epoch.store(epoch, Ordering::Release);
            }
        }
        let stripe = &bucket.stripes[stripe()];
        let counter = if success { &stripe.successes } else { &stripe.failures };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// (requests, failures) in the window ending now.
    fn window(&self) -> (u64, u64) {
        let bucket_ms = self.bucket_ms;
        let now = self.clock.now_ms() / bucket_ms;
        let n = self.buckets.len() as u64;
        let (mut total, mut failures) = (0, 0);
        for b in &self.buckets {
            let epoch = b.epoch.load(Ordering::Acquire);
            if epoch <= now && now - epoch < n {
                let (t, f) = b.sum();
                total += t;
                failures += f;
            }
        }
        (total, failures)
    }

    fn clear_window(&self) {
        for b in &self.buckets {
            b.zero();
        }
    }

    fn maybe_trip(&self) {
        let (total, failures) = self.window();
        let mut slow = self.lock();
        if slow.mode != Mode::Auto || self.state() != State::Closed {
            return;
        }
        if total < slow.policy.min_requests || failures as f64 / total as f64 <= slow.policy.threshold {
            return;
        }
        let now = self.clock.now_ms();
        self.trip(&mut slow, Cause::Threshold, now, (total, failures));
    }

    fn trip(&self, slow: &mut Slow, cause: Cause, now: u64, window: (u64, u64)) {
        slow.tripped_at_ms = now;
        slow.tripped_at_unix =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).ok().map(|d| d.as_secs());
        slow.trips += 1;
        slow.probes_in_flight = 0;
        slow.probe_successes = 0;
        self.transition_with(slow, State::Open, cause, now, window);
    }

    fn probe_result(&self, round: u64, success: Option<bool>) {
        let now = self.clock.now_ms();
        let mut slow = self.lock();
        if round != slow.round {
            return;
        }
        slow.probes_in_flight = slow.probes_in_flight.saturating_sub(1);
        if slow.mode != Mode::Auto || self.state() != State::HalfOpen {
            return;
        }
        match success {
            None => {}
            Some(false) => {
                let window = self.window();
                self.trip(&mut slow, Cause::ProbeFailed, now, window);
            }
            Some(true) => {
                slow.probe_successes += 1;
                if slow.probe_successes >= slow.policy.half_open_successes {
                    let window = self.window();
                    self.clear_window();
                    slow.probe_successes = 0;
                    self.transition_with(&mut slow, State::Closed, Cause::ProbesSucceeded, now, window);
                }
            }
        }
    }

    fn transition(&self, slow: &mut Slow, to: State, cause: Cause, now: u64) {
        let window = self.window();
        self.transition_with(slow, to, cause, now, window);
    }

    fn transition_with(&self, slow: &mut Slow, to: State, cause: Cause, now: u64, window: (u64, u64)) {
        let from = self.state();
        slow.round += 1;
        self.state.store(to as u8, Ordering::Release);
        self.transitions[to as usize].fetch_add(1, Ordering::Relaxed);
        (self.sink)(&Event {
            from,
            to,
            cause,
            at_ms: now,
            window_requests: window.0,
            window_failures: window.1,
        });
    }

    /// An operator's override; `Mode::Auto` returns to automatic from a
    /// clean Closed state.
    pub fn set_mode(&self, mode: Mode) {
        let now = self.clock.now_ms();
        let mut slow = self.lock();
        if slow.mode == mode {
            return;
        }
        slow.mode = mode;
        slow.probes_in_flight = 0;
        slow.probe_successes = 0;
        // Probes still out belong to the automatic round that just ended.
        slow.round += 1;
        let to = match mode {
            // Not a trip: the trip count and time are the upstream's story.
            Mode::ForcedOpen => State::Open,
            Mode::ForcedClosed => State::Closed,
            Mode::Auto => {
                self.clear_window();
                State::Closed
            }
        };
        if self.state() != to {
            self.transition(&mut slow, to, Cause::Operator, now);
        }
    }

    pub fn snapshot(&self) -> Snapshot {
        let (requests, failures) = self.window();
        let now = self.clock.now_ms();
        let slow = self.lock();
        let state = self.state();
        Snapshot {
            state,
            mode: slow.mode,
            window_requests: requests,
            window_failures: failures,
            error_rate: if requests == 0 { 0.0 } else { failures as f64 / requests as f64 },
            trips: slow.trips,
            last_trip_unix: slow.tripped_at_unix,
            probes_in_flight: slow.probes_in_flight,
            next_probe_in_ms: (state == State::Open && slow.mode == Mode::Auto)
                .then(|| (slow.tripped_at_ms + slow.policy.sleep_window_ms).saturating_sub(now)),
            transitions: std::array::from_fn(|i| self.transitions[i].load(Ordering::Relaxed)),
        }
    }
}

pub mod events;
pub mod ticket;

#[cfg(test)]
mod tests;
