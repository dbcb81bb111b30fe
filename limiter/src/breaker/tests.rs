use std::sync::Arc;

use proptest::prelude::*;

use super::*;

/// The ticket of an admitted probe.
fn probe(d: Decision) -> TicketKind {
    match d {
        Decision::Admit(kind @ TicketKind::Probe(_)) => kind,
        other => panic!("expected a probe, got {other:?}"),
    }
}

fn settings() -> Policy {
    Policy {
        threshold: 0.5,
        min_requests: 10,
        sleep_window_ms: 30_000,
        window_ms: 30_000,
        bucket_ms: 1_000,
        half_open_max_probes: 1,
        half_open_successes: 1,
    }
}

struct Fixture {
    clock: Arc<ManualClock>,
    events: Arc<Mutex<Vec<Event>>>,
    breaker: Breaker<Arc<ManualClock>>,
}

fn fixture(s: Policy) -> Fixture {
    let clock = Arc::new(ManualClock::default());
    clock.advance(1_000_000); // far from zero, so nothing hides at epoch 0
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink_events = events.clone();
    let breaker =
        Breaker::new(s, clock.clone(), Box::new(move |e| sink_events.lock().unwrap().push(e.clone())));
    Fixture { clock, events, breaker }
}

impl Fixture {
    fn results(&self, successes: u32, failures: u32) {
        for _ in 0..successes {
            assert_eq!(self.breaker.admit(), Decision::Admit(TicketKind::Normal));
            self.breaker.record(TicketKind::Normal, true);
        }
        for _ in 0..failures {
            if let Decision::Admit(kind) = self.breaker.admit() {
                self.breaker.record(kind, false);
            }
        }
    }

    fn trip(&self) {
        self.results(0, 10);
        assert_eq!(self.breaker.state(), State::Open);
    }

    fn states(&self) -> Vec<(State, State, Cause)> {
        self.events.lock().unwrap().iter().map(|e| (e.from, e.to, e.cause)).collect()
    }
}

#[test]
fn min_requests_minus_one_failures_never_trip() {
    let f = fixture(settings());
    f.results(0, 9);
    assert_eq!(f.breaker.state(), State::Closed);
    f.results(0, 1);
    assert_eq!(f.breaker.state(), State::Open);
    let e = &f.events.lock().unwrap()[0];
    assert_eq!((e.cause, e.window_requests, e.window_failures), (Cause::Threshold, 10, 10));
}

#[test]
fn the_threshold_is_strictly_greater_than() {
    let f = fixture(settings());
    f.results(5, 5); // exactly 0.5: stays closed
    assert_eq!(f.breaker.state(), State::Closed);
    f.results(0, 1); // 6/11 > 0.5
    assert_eq!(f.breaker.state(), State::Open);
}

#[test]
fn successes_never_trip_and_keep_the_rate_down() {
    let f = fixture(settings());
    f.results(100, 0);
    f.results(0, 100);
    // 100/200 = 0.5 exactly at the last failure: not above.
    assert_eq!(f.breaker.state(), State::Closed);
}

#[test]
fn old_buckets_fall_out_of_the_window() {
    let f = fixture(settings());
    f.results(0, 9);
    // 29.999 s later the failures are still in the window...
    f.clock.advance(29_000);
    assert_eq!(f.breaker.snapshot().window_requests, 9);
    // ...one more bucket and they are gone.
    f.clock.advance(1_000);
    assert_eq!(f.breaker.snapshot().window_requests, 0);
    f.results(0, 1);
    assert_eq!(f.breaker.state(), State::Closed, "stale failures counted");
    assert_eq!(f.breaker.snapshot().window_requests, 1);
}

#[test]
fn a_recycled_bucket_starts_from_zero() {
    let f = fixture(settings());
    f.results(3, 0);
    f.clock.advance(30_000); // same ring slot, next lap
    f.results(0, 9);
    let s = f.breaker.snapshot();
    assert_eq!((s.window_requests, s.window_failures), (9, 9));
}

#[test]
fn the_sleep_window_is_honoured_to_the_millisecond() {
    let f = fixture(settings());
    f.trip();
    f.clock.advance(29_999);
    assert_eq!(f.breaker.admit(), Decision::Refuse { retry_after_ms: 1 });
    f.clock.advance(1);
    assert!(matches!(f.breaker.admit(), Decision::Admit(TicketKind::Probe(_))));
    assert_eq!(f.breaker.state(), State::HalfOpen);
}

#[test]
fn open_refusals_say_when_to_come_back() {
    let f = fixture(settings());
    f.trip();
    f.clock.advance(10_000);
    assert_eq!(f.breaker.admit(), Decision::Refuse { retry_after_ms: 20_000 });
    assert_eq!(f.breaker.snapshot().next_probe_in_ms, Some(20_000));
}

#[test]
fn concurrent_probes_are_capped() {
    let f = fixture(Policy { half_open_max_probes: 2, ..settings() });
    for round in 0..50 {
        f.trip();
        f.clock.advance(30_000);
        // Eight threads ask at once as the sleep window ends: exactly two
        // become probes, whichever thread moves it to half-open.
        let start = std::sync::Barrier::new(8);
        let probes: Vec<TicketKind> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    scope.spawn(|| {
                        start.wait();
                        f.breaker.admit()
                    })
                })
                .collect();
            handles
                .into_iter()
                .filter_map(|h| match h.join().unwrap() {
                    Decision::Admit(kind @ TicketKind::Probe(_)) => Some(kind),
                    Decision::Admit(other) => panic!("round {round}: a non-probe admitted: {other:?}"),
                    Decision::Refuse { .. } => None,
                })
                .collect()
        });
        assert_eq!(probes.len(), 2, "round {round}");
        assert_eq!(f.breaker.snapshot().probes_in_flight, 2);
        // An abandoned probe frees its slot without deciding anything.
        f.breaker.abandon(probes[0]);
        assert_eq!(f.breaker.state(), State::HalfOpen);
        let third = probe(f.breaker.admit());
        // A failure re-opens it for the next round.
        f.breaker.record(third, false);
        f.breaker.abandon(probes[1]);
        assert_eq!(f.breaker.state(), State::Open);
    }
}

#[test]
fn a_probe_failure_reopens_and_restamps() {
    let f = fixture(settings());
    f.trip();
    f.clock.advance(30_000);
    let p = probe(f.breaker.admit());
    f.clock.advance(500);
    f.breaker.record(p, false);
    assert_eq!(f.breaker.state(), State::Open);
    // The new sleep window counts from the probe failure.
    f.clock.advance(29_999);
    assert_eq!(f.breaker.admit(), Decision::Refuse { retry_after_ms: 1 });
    assert_eq!(f.breaker.snapshot().trips, 2);
}

#[test]
fn success_closes_and_clears_the_window() {
    let f = fixture(Policy { half_open_successes: 2, half_open_max_probes: 2, ..settings() });
    f.trip();
    f.clock.advance(30_000);
    let (p1, p2) = (probe(f.breaker.admit()), probe(f.breaker.admit()));
    f.breaker.record(p1, true);
    assert_eq!(f.breaker.state(), State::HalfOpen, "one success of two");
    f.breaker.record(p2, true);
    assert_eq!(f.breaker.state(), State::Closed);
    assert_eq!(f.breaker.snapshot().window_requests, 0);
    assert_eq!(
        f.states(),
        vec![
            (State::Closed, State::Open, Cause::Threshold),
            (State::Open, State::HalfOpen, Cause::SleepElapsed),
            (State::HalfOpen, State::Closed, Cause::ProbesSucceeded),
        ]
    );
}

#[test]
fn a_probe_from_an_earlier_round_decides_nothing() {
    let f = fixture(Policy { half_open_max_probes: 2, ..settings() });
    f.trip();
    f.clock.advance(30_000);
    let (p1, p2) = (probe(f.breaker.admit()), probe(f.breaker.admit()));
    f.breaker.record(p1, false); // re-opens
    f.clock.advance(30_000);
    let p3 = probe(f.breaker.admit());
    // The late success of p2 neither closes it nor frees a slot of this round.
    f.breaker.record(p2, true);
    assert_eq!(f.breaker.state(), State::HalfOpen);
    assert_eq!(f.breaker.snapshot().probes_in_flight, 1);
    let _p4 = probe(f.breaker.admit());
    assert!(matches!(f.breaker.admit(), Decision::Refuse { .. }), "p2 freed a slot of the new round");
    f.breaker.record(p3, true);
    assert_eq!(f.breaker.state(), State::Closed);
}

#[test]
fn results_of_requests_admitted_before_the_trip_do_not_decide() {
    let f = fixture(settings());
    f.trip();
    // Late successes of requests admitted while closed.
    for _ in 0..50 {
        f.breaker.record(TicketKind::Normal, true);
    }
    assert_eq!(f.breaker.state(), State::Open);
    f.clock.advance(30_000);
    assert!(matches!(f.breaker.admit(), Decision::Admit(TicketKind::Probe(_))));
    f.breaker.record(TicketKind::Normal, true);
    assert_eq!(f.breaker.state(), State::HalfOpen, "only the probe decides");
}

#[test]
fn forcing_open_closed_and_back_to_automatic() {
    let f = fixture(settings());
    f.breaker.set_mode(Mode::ForcedOpen);
    assert!(matches!(f.breaker.admit(), Decision::Refuse { .. }));
    f.clock.advance(60_000);
    assert!(matches!(f.breaker.admit(), Decision::Refuse { .. }), "forced open never probes");
    assert_eq!(f.breaker.snapshot().trips, 0);
    f.breaker.set_mode(Mode::ForcedClosed);
    f.results(0, 50);
    assert_eq!(f.breaker.state(), State::Closed, "forced closed never trips");
    assert_eq!(f.breaker.snapshot().mode, Mode::ForcedClosed);
    f.breaker.set_mode(Mode::Auto);
    assert_eq!(f.breaker.snapshot().window_requests, 0);
    f.trip();
    assert!(f.states().iter().all(|(_, _, c)| *c != Cause::SleepElapsed));
}

#[test]
fn concurrent_results_are_all_counted() {
    let f = fixture(Policy { min_requests: u64::MAX, ..settings() });
    let b = Arc::new(f.breaker);
    let threads: Vec<_> = (0..4)
        .map(|i| {
            let b = b.clone();
            std::thread::spawn(move || {
                for _ in 0..10_000 {
                    b.record(TicketKind::Normal, i % 2 == 0);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let s = b.snapshot();
    assert_eq!((s.window_requests, s.window_failures), (40_000, 20_000));
}

#[derive(Clone, Debug)]
enum Op {
    Advance(u64),
    Request { success: bool, abandon: bool },
    Force(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u64..5_000).prop_map(Op::Advance),
        (any::<bool>(), prop::bool::weighted(0.1))
            .prop_map(|(success, abandon)| Op::Request { success, abandon }),
        prop::sample::select(vec![0u8, 1, 2]).prop_map(Op::Force),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn invariants_hold_for_any_sequence(
        ops in prop::collection::vec(op(), 1..300),
        probes in 1u32..4,
        successes in 1u32..4,
        min in 1u64..20,
    ) {
        let f = fixture(Policy {
            half_open_max_probes: probes,
            half_open_successes: successes,
            min_requests: min,
            window_ms: 10_000,
            bucket_ms: 1_000,
            sleep_window_ms: 3_000,
            ..settings()
        });
        let mut outstanding: Vec<TicketKind> = Vec::new();
        for op in ops {
            match op {
                Op::Advance(ms) => f.clock.advance(ms),
                Op::Request { success, abandon } => {
                    if let Decision::Admit(kind) = f.breaker.admit() {
                        outstanding.push(kind);
                    }
                    // Finish the oldest outstanding request.
                    if outstanding.len() > 3 || !outstanding.is_empty() && success {
                        let kind = outstanding.remove(0);
                        if abandon { f.breaker.abandon(kind) } else { f.breaker.record(kind, success) }
                    }
                }
                Op::Force(m) => f.breaker.set_mode([Mode::Auto, Mode::ForcedOpen, Mode::ForcedClosed][m as usize]),
            }
            let s = f.breaker.snapshot();
            // Only buckets inside the window count, and counts are sane.
            prop_assert!(s.window_failures <= s.window_requests);
            prop_assert!(s.probes_in_flight <= probes);
            prop_assert!((0.0..=1.0).contains(&s.error_rate));
            if s.mode == Mode::ForcedOpen { prop_assert_eq!(s.state, State::Open); }
            if s.mode == Mode::ForcedClosed { prop_assert_eq!(s.state, State::Closed); }
        }
        // A window of 10 buckets never holds results older than 10 s.
        f.clock.advance(10_000);
        prop_assert_eq!(f.breaker.snapshot().window_requests, 0);
        // State changes only along the allowed edges (operators aside).
        for e in f.events.lock().unwrap().iter() {
            prop_assert_ne!(e.from, e.to);
            if e.cause != Cause::Operator {
                let allowed = matches!(
                    (e.from, e.to),
                    (State::Closed, State::Open)
                        | (State::Open, State::HalfOpen)
                        | (State::HalfOpen, State::Open)
                        | (State::HalfOpen, State::Closed)
                );
                prop_assert!(allowed, "{:?} -> {:?} ({:?})", e.from, e.to, e.cause);
            }
        }
    }
}

#[test]
fn the_check_at_the_head_agrees_with_admit_and_takes_no_probe() {
    let f = fixture(Policy { half_open_max_probes: 1, ..settings() });
    assert_eq!(f.breaker.would_refuse(), None);
    f.trip();
    f.clock.advance(10_000);
    assert_eq!(f.breaker.would_refuse(), Some(20_000));
    f.clock.advance(20_000);
    // Due: the head passes, and asking twice still leaves the probe free.
    assert_eq!(f.breaker.would_refuse(), None);
    assert_eq!(f.breaker.would_refuse(), None);
    let p = probe(f.breaker.admit());
    assert_eq!(f.breaker.would_refuse(), Some(1000), "the one probe is out");
    f.breaker.abandon(p);
    assert_eq!(f.breaker.would_refuse(), None);
    f.breaker.set_mode(Mode::ForcedOpen);
    assert!(f.breaker.would_refuse().is_some());
}
