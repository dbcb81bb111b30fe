//! The controller against a simulated upstream: `servers` requests served
//! at once, each in a service time drawn around `service`, the rest
//! waiting in a FIFO queue (as servlets wait for a database connection),
//! and closed-loop clients that send again as soon as they are answered
//! (after 10 ms when refused). Time is simulated in 1 ms steps; the
//! controller ticks every 10 ms, as the daemon's timer does.

use std::collections::VecDeque;

use super::*;

const MS: u64 = 1000;

/// What the upstream and the clients do, as functions of the time (ms).
struct Scenario {
    servers: Box<dyn Fn(u64) -> usize>,
    /// Mean service time (ms).
    service: Box<dyn Fn(u64) -> f64>,
    /// Service times are uniform in `service × (1 ± jitter)`.
    jitter: f64,
    clients: Box<dyn Fn(u64) -> usize>,
    /// The upstream serves nothing in [start, end) ms.
    stall: Option<(u64, u64)>,
}

/// What happened in each simulated second.
#[derive(Clone, Debug, Default)]
struct Second {
    answered: u64,
    refused: u64,
    /// Latencies (ms) of the answers.
    latencies: Vec<u64>,
    /// The limit at the end of each 10 ms tick.
    limits: Vec<u32>,
}

impl Second {
    fn p99(&self) -> u64 {
        let mut l = self.latencies.clone();
        l.sort_unstable();
        l.get((l.len() * 99).div_ceil(100).saturating_sub(1)).copied().unwrap_or(0)
    }

    fn mean_limit(&self) -> f64 {
        self.limits.iter().map(|&l| f64::from(l)).sum::<f64>() / self.limits.len().max(1) as f64
    }

    fn max_limit(&self) -> u32 {
        self.limits.iter().copied().max().unwrap_or(0)
    }
}

struct Sim {
    c: Controller,
    seed: u64,
    in_flight: u32,
    /// (sent at, generation) of requests waiting in the upstream's queue.
    queue: VecDeque<(u64, u32, usize)>,
    /// (ends at, sent at, generation, client) of requests being served.
    serving: Vec<(u64, u64, u32, usize)>,
    /// When each client sends next (`None`: waiting for an answer).
    ready: Vec<Option<u64>>,
    now: u64,
    /// What the controller reported.
    changes: Vec<Change>,
}

impl Sim {
    fn new(bounds: Bounds, seed: u64) -> Self {
        Self::with(Controller::new(bounds, bounds.ceiling, 0), seed)
    }

    fn with(c: Controller, seed: u64) -> Self {
        Self {
            c,
            seed,
            in_flight: 0,
            queue: VecDeque::new(),
            serving: Vec::new(),
            ready: Vec::new(),
            now: 0,
            changes: Vec::new(),
        }
    }

    fn uniform(&mut self) -> f64 {
        self.seed ^= self.seed >> 12;
        self.seed ^= self.seed << 25;
        self.seed ^= self.seed >> 27;
        ((self.seed.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// Runs `seconds` more of `s`; what each second saw.
    fn run(&mut self, s: &Scenario, seconds: u64) -> Vec<Second> {
        let mut out = Vec::new();
        for _ in 0..seconds {
            let mut sec = Second::default();
            for _ in 0..1000 {
                self.step(s, &mut sec);
            }
            out.push(sec);
        }
        out
    }

    fn step(&mut self, s: &Scenario, sec: &mut Second) {
        let t = self.now;
        let stalled = s.stall.is_some_and(|(a, b)| (a..b).contains(&t));
        if !stalled {
            // Answers due now.
            let mut i = 0;
            while i < self.serving.len() {
                let (end, sent, generation, client) = self.serving[i];
                if end <= t {
                    self.serving.swap_remove(i);
                    self.in_flight -= 1;
                    self.c.answered((t - sent) * MS, generation);
                    sec.answered += 1;
                    sec.latencies.push(t - sent);
                    if let Some(r) = self.ready.get_mut(client) {
                        *r = Some(t);
                    }
                } else {
                    i += 1;
                }
            }
            while self.serving.len() < (s.servers)(t)
                && let Some((sent, generation, client)) = self.queue.pop_front()
            {
                let mean = (s.service)(t);
                let d = mean * (1.0 + s.jitter * (2.0 * self.uniform() - 1.0));
                self.serving.push((t + (d.round() as u64).max(1), sent, generation, client));
            }
        }
        let clients = (s.clients)(t);
        if self.ready.len() < clients {
            self.ready.resize(clients, Some(t));
        }
        for client in 0..clients {
            if self.ready[client].is_some_and(|r| r <= t) {
                if self.in_flight < self.c.limit() {
                    self.in_flight += 1;
                    self.c.admitted(self.in_flight);
                    self.queue.push_back((t, self.c.generation(), client));
                    self.ready[client] = None;
                } else {
                    self.c.refused();
                    sec.refused += 1;
                    self.ready[client] = Some(t + 10);
                }
            }
        }
        if t % 10 == 9 {
            self.changes.extend(self.c.tick(t * MS));
            sec.limits.push(self.c.limit());
        }
        self.now += 1;
    }
}

fn constant<T: Copy + 'static>(v: T) -> Box<dyn Fn(u64) -> T> {
    Box::new(move |_| v)
}

/// The overload: a pool of 197 (`http.maxThreads = 208`) before an
/// upstream that serves `servers` at once in `service` ms.
fn overload(servers: usize, service: f64, clients: usize) -> Scenario {
    Scenario {
        servers: constant(servers),
        service: constant(service),
        jitter: 0.2,
        clients: constant(clients),
        stall: None,
    }
}

const POOL: Bounds = Bounds { min: 1, ceiling: 197 };
const SEEDS: [u64; 4] = [0x9e37_79b9_7f4a_7c15, 7, 0xdead_beef, 12345];

fn goodput(secs: &[Second]) -> f64 {
    secs.iter().map(|s| s.answered as f64).sum::<f64>() / secs.len() as f64
}

fn p99(secs: &[Second]) -> u64 {
    let all =
        Second { latencies: secs.iter().flat_map(|s| s.latencies.clone()).collect(), ..Second::default() };
    all.p99()
}

#[test]
fn an_upstream_that_queues_is_held_near_its_capacity_with_latency_within_four_service_times() {
    for seed in SEEDS {
        // 20 at once, 20 ms each: 1,000 a second at most; 150 clients.
        let mut sim = Sim::new(POOL, seed);
        let s = overload(20, 20.0, 150);
        let secs = sim.run(&s, 20);
        let settled = &secs[3..];
        assert!(p99(settled) <= 80, "seed {seed}: p99 {} ms, service 20 ms", p99(settled));
        assert!(goodput(settled) >= 900.0, "seed {seed}: goodput {} of 1000/s", goodput(settled));
        let e = sim.c.estimates();
        assert!((15.0..=26.0).contains(&e.capacity), "seed {seed}: capacity {e:?}");
        assert!((0.015..=0.03).contains(&e.base_latency), "seed {seed}: {e:?}");
    }
}

/// Property 1.
#[test]
fn a_healthy_upstream_below_capacity_is_refused_nothing_noise_included() {
    for seed in SEEDS {
        for (jitter, clients) in [(0.2, 10), (0.9, 10), (0.9, 19)] {
            let mut sim = Sim::new(POOL, seed);
            let s = Scenario { jitter, ..overload(20, 20.0, clients) };
            let secs = sim.run(&s, 60);
            let refused: u64 = secs.iter().map(|s| s.refused).sum();
            assert_eq!(refused, 0, "seed {seed}, jitter {jitter}, {clients} clients");
            assert!(secs.iter().all(|s| s.max_limit() >= clients as u32));
        }
    }
}

/// Property 2, a capacity that stays down: the limit stays down for the
/// whole 30 s, then grows back once the upstream recovers.
#[test]
fn under_a_sustained_loss_of_capacity_the_limit_stays_down_then_grows_back() {
    for seed in SEEDS {
        let mut sim = Sim::new(POOL, seed);
        let s = Scenario {
            servers: Box::new(|t| if (10_000..40_000).contains(&t) { 5 } else { 20 }),
            ..overload(20, 20.0, 150)
        };
        let secs = sim.run(&s, 50);
        for (i, sec) in secs[13..40].iter().enumerate() {
            assert!(
                sec.mean_limit() <= 5.0 * 1.6,
                "seed {seed}: second {}: limit {}",
                i + 13,
                sec.mean_limit()
            );
            assert!(sec.p99() <= 80, "seed {seed}: second {}: p99 {}", i + 13, sec.p99());
        }
        // Back within 5 s of recovery.
        for sec in &secs[45..] {
            assert!(sec.answered >= 900, "seed {seed}: {} answered after recovery", sec.answered);
        }
    }
}

/// Property 2, a slower upstream at the same concurrency (service time
/// doubled for 30 s): a queue-free latency rise does not cut the limit for
/// long, the base follows it, and the limit does not drift up.
#[test]
fn a_doubled_service_time_is_not_taken_for_a_queue_and_the_limit_does_not_drift() {
    for seed in SEEDS {
        let mut sim = Sim::new(POOL, seed);
        let s = Scenario {
            service: Box::new(|t| if (10_000..40_000).contains(&t) { 40.0 } else { 20.0 }),
            ..overload(20, 20.0, 150)
        };
        let secs = sim.run(&s, 50);
        let before = secs[5..10].iter().map(Second::mean_limit).sum::<f64>() / 5.0;
        for (i, sec) in secs[12..40].iter().enumerate() {
            assert!(
                sec.mean_limit() <= before * 1.2,
                "seed {seed}: second {}: limit {} against {before} before",
                i + 12,
                sec.mean_limit()
            );
            // 20 at once in 40 ms: 500 a second.
            assert!(sec.answered >= 450, "seed {seed}: second {}: {} answered", i + 12, sec.answered);
        }
        for sec in &secs[45..] {
            assert!(sec.answered >= 900, "seed {seed}: {} answered after", sec.answered);
            assert!(sec.p99() <= 80);
        }
    }
}

/// Property 3: a single 500 ms stall, and noise.
#[test]
fn a_single_stall_does_not_keep_the_limit_down() {
    for seed in SEEDS {
        let mut sim = Sim::new(POOL, seed);
        let s = Scenario { stall: Some((10_000, 10_500)), jitter: 0.5, ..overload(20, 20.0, 150) };
        let secs = sim.run(&s, 20);
        let before = secs[5..10].iter().map(Second::mean_limit).sum::<f64>() / 5.0;
        // Goodput above 80 % within 2 s of the stall's end (10.5 s).
        for sec in &secs[12..] {
            assert!(
                sec.answered >= 800,
                "seed {seed}: {:?}",
                secs.iter().map(|s| s.answered).collect::<Vec<_>>()
            );
        }
        assert!(
            secs[12].mean_limit() >= before * 0.7,
            "seed {seed}: {} against {before}",
            secs[12].mean_limit()
        );
    }
}

/// Property 4: capacity halved then restored, each followed within 5 s.
#[test]
fn a_step_of_capacity_down_and_up_is_followed_within_five_seconds() {
    for seed in SEEDS {
        let mut sim = Sim::new(POOL, seed);
        let s = Scenario {
            servers: Box::new(|t| if (10_000..20_000).contains(&t) { 10 } else { 20 }),
            ..overload(20, 20.0, 150)
        };
        let secs = sim.run(&s, 30);
        for sec in &secs[15..20] {
            assert!(sec.p99() <= 80, "seed {seed}: p99 {} after the step down", sec.p99());
            assert!(sec.answered >= 450, "seed {seed}");
            assert!(sec.mean_limit() <= 10.0 * 1.6, "seed {seed}: limit {}", sec.mean_limit());
        }
        for sec in &secs[25..] {
            assert!(sec.answered >= 900, "seed {seed}: {} after the step up", sec.answered);
            assert!(sec.p99() <= 80);
        }
    }
}

/// Property 5: the controller is a fixed size whatever it has seen (O(1)
/// per request), and a daemon taking over starts from the limit and base
/// the other learnt instead of the ceiling.
#[test]
fn a_controller_resumed_from_a_handover_starts_from_the_learnt_limit() {
    let mut sim = Sim::new(POOL, 1);
    let s = overload(20, 20.0, 150);
    sim.run(&s, 10);
    let learnt = sim.c.estimates();
    assert!(learnt.limit < 40, "{learnt:?}");
    let mut next = Controller::new(POOL, POOL.ceiling, sim.now * MS);
    next.resume(learnt.limit, learnt.base_latency);
    assert_eq!(next.limit(), learnt.limit);
    let mut sim2 = Sim::with(next, 2);
    sim2.now = sim.now;
    let secs = sim2.run(&s, 5);
    for sec in &secs {
        assert!(
            sec.max_limit() <= learnt.limit * 2,
            "{} after resuming at {}",
            sec.max_limit(),
            learnt.limit
        );
        assert!(sec.p99() <= 80, "p99 {}", sec.p99());
    }
    // Fixed size: nothing it holds grows with what it has seen.
    assert!(size_of::<Controller>() <= 256);
}

#[test]
fn the_limit_stays_within_its_bounds_and_a_reload_clamps_it() {
    let mut sim = Sim::new(Bounds { min: 12, ceiling: 197 }, 3);
    let secs = sim.run(&overload(4, 20.0, 150), 10);
    assert!(secs.iter().all(|s| s.limits.iter().all(|&l| (12..=197).contains(&l))));
    assert!(sim.c.limit() <= 24, "{:?}", sim.c.estimates());
    sim.c.set_bounds(Bounds { min: 2, ceiling: 8 });
    assert!(sim.c.limit() <= 8);
    let mut c = Controller::new(Bounds { min: 50, ceiling: 10 }, 100, 0);
    assert_eq!(c.limit(), 10, "a minimum above the ceiling is the ceiling");
    c.set_bounds(Bounds { min: 0, ceiling: 0 });
    assert_eq!(c.limit(), 1);
}

#[test]
fn a_change_of_more_than_a_fifth_is_reported_and_no_other() {
    let mut sim = Sim::new(POOL, 5);
    let s = Scenario {
        servers: Box::new(|t| if (5_000..10_000).contains(&t) { 5 } else { 20 }),
        ..overload(20, 20.0, 150)
    };
    sim.run(&s, 15);
    let ch = &sim.changes;
    assert!(ch.iter().all(|c| f64::from(c.from.abs_diff(c.to)) > f64::from(c.from) / 5.0), "{ch:?}");
    // The start, the step down and the step up each show; the sawtooth
    // around a steady capacity mostly does not.
    assert!(ch.first().is_some_and(|c| c.from == 197 && c.why == "queue"), "{ch:?}");
    assert!(ch.iter().any(|c| c.to <= 10), "{ch:?}");
    assert!(ch.len() < 60, "{} changes in 15 s: {ch:?}", ch.len());
}

/// Switched on in the middle of an overload the static pool let queue:
/// the base it learnt while only watching finds the queue.
#[test]
fn switched_on_during_an_overload_it_finds_the_queue_it_watched_form() {
    for seed in SEEDS {
        let mut c = Controller::new(POOL, POOL.ceiling, 0);
        c.set_enforcing(false);
        let mut sim = Sim::with(c, seed);
        let s = overload(20, 20.0, 150);
        let watched = sim.run(&s, 5);
        assert!(watched[4].p99() >= 140, "the static pool queues: {}", watched[4].p99());
        assert_eq!(sim.c.limit(), POOL.ceiling, "watching changes nothing");
        sim.c.set_enforcing(true);
        let on = sim.run(&s, 10);
        for sec in &on[5..] {
            assert!(
                sec.p99() <= 80 && sec.answered >= 900,
                "seed {seed}: p99 {} ms, {} answered",
                sec.p99(),
                sec.answered
            );
        }
    }
}
