use super::*;

const TICK: Duration = Duration::from_millis(10);

/// Feeds `samples` one tick apart from `t`; the transitions with the
/// tick they happened at.
fn run(h: &mut Hysteresis, t: &mut Instant, samples: &[u64]) -> Vec<(usize, Transition)> {
    let mut out = Vec::new();
    for (i, &refused) in samples.iter().enumerate() {
        *t += TICK;
        if let Some(tr) = h.step(*t, Sample { refused, breaker_open: false }) {
            out.push((i, tr));
        }
    }
    out
}

/// A Poisson stream of refusals at `per_second`, as counts per tick
/// (xorshift64*: the same stream on every run).
fn poisson(per_second: f64, ticks: usize, seed: u64) -> Vec<u64> {
    let mut state = seed;
    let mut uniform = || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        ((state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    let tick = TICK.as_secs_f64();
    let mut counts = vec![0u64; ticks];
    let mut at = 0.0;
    loop {
        at += -uniform().ln() / per_second;
        let i = (at / tick) as usize;
        if i >= ticks {
            return counts;
        }
        counts[i] += 1;
    }
}

#[test]
fn starts_once_the_refusals_in_the_window_reach_the_rate() {
    // 100 a second over 50 ms: 5 refusals.
    let mut h = Hysteresis::new(Duration::from_millis(50), Duration::from_millis(100), 100.0);
    let mut t = Instant::now();
    // Four refusals within the window, then they age out of it.
    assert_eq!(run(&mut h, &mut t, &[1, 1, 1, 1, 0, 0, 0, 0, 0]), []);
    assert!(!h.shedding());
    // One a tick: the fifth within 50 ms starts it.
    assert_eq!(run(&mut h, &mut t, &[1, 1, 1, 1, 1]), [(4, Transition::Start)]);
    assert!(h.shedding());
    // A burst of five in one tick is the rate over the window too.
    let mut h = Hysteresis::new(Duration::from_millis(50), Duration::from_millis(100), 100.0);
    assert_eq!(run(&mut h, &mut t, &[0, 5]), [(1, Transition::Start)]);
}

#[test]
fn a_trickle_of_refusals_one_in_every_sample_does_not_start_it_below_the_rate() {
    // The old trigger's failure: one refusal every 10 ms sample is 100 a
    // second, which started it after 200 ms; with a threshold of 200 a
    // second it must not start.
    let mut h = Hysteresis::new(Duration::from_millis(200), Duration::from_millis(1000), 200.0);
    let mut t = Instant::now();
    assert_eq!(run(&mut h, &mut t, &[1; 1000]), []);
}

#[test]
fn poisson_refusals_at_half_the_rate_never_start_it_and_at_twice_start_it_within_the_window() {
    // The defaults: 500 a second over 200 ms.
    let (after, rate) = (Duration::from_millis(200), 500.0);
    let window_ticks = (after.as_millis() / TICK.as_millis()) as usize;
    for seed in [1, 2, 3, 0x5eed] {
        // Ten minutes at half the rate.
        let mut h = Hysteresis::new(after, Duration::from_millis(1000), rate);
        let mut t = Instant::now();
        assert_eq!(run(&mut h, &mut t, &poisson(rate / 2.0, 60_000, seed)), [], "seed {seed}");
        // Twice the rate, from quiet: started within the window.
        let mut h = Hysteresis::new(after, Duration::from_millis(1000), rate);
        let mut t = Instant::now();
        let started = run(&mut h, &mut t, &poisson(rate * 2.0, 10 * window_ticks, seed));
        let first = started.first().map(|&(i, _)| i);
        assert!(first.is_some_and(|i| i < window_ticks), "seed {seed}: started at tick {first:?}");
        // At the rate itself it starts too, within a few windows.
        let mut h = Hysteresis::new(after, Duration::from_millis(1000), rate);
        let mut t = Instant::now();
        let started = run(&mut h, &mut t, &poisson(rate, 20 * window_ticks, seed));
        assert!(started.first().is_some_and(|&(i, _)| i < 5 * window_ticks), "seed {seed}: {started:?}");
    }
}

#[test]
fn an_open_breaker_starts_it_after_the_window() {
    let mut h = Hysteresis::new(Duration::from_millis(50), Duration::from_millis(100), 100.0);
    let mut t = Instant::now();
    let open = Sample { refused: 0, breaker_open: true };
    t += TICK;
    assert_eq!(h.step(t, Sample::default()), None);
    let mut started = None;
    for i in 0..10 {
        t += TICK;
        if h.step(t, open).is_some() {
            started = Some(i);
            break;
        }
    }
    assert_eq!(started, Some(4), "five samples of 10 ms cover the 50 ms window");
}

#[test]
fn stops_only_after_refusing_nothing_for_the_whole_release() {
    let mut h = Hysteresis::new(Duration::from_millis(20), Duration::from_millis(100), 100.0);
    let mut t = Instant::now();
    assert_eq!(run(&mut h, &mut t, &[0, 1, 1]), [(2, Transition::Start)]);
    // Nine quiet samples (90 ms), one refusing: still shedding.
    let mut gap = vec![0; 9];
    gap.push(1);
    assert_eq!(run(&mut h, &mut t, &gap), []);
    assert!(h.shedding());
    // Ten quiet samples: stop on the tenth.
    assert_eq!(run(&mut h, &mut t, &[0; 10]), [(9, Transition::Stop)]);
    assert!(!h.shedding());
    // And it takes the rate over a new window to start again.
    assert_eq!(run(&mut h, &mut t, &[1]), []);
    assert_eq!(run(&mut h, &mut t, &[1]), [(0, Transition::Start)]);
}

#[test]
fn reset_forgets_the_window_and_new_settings_apply_at_once() {
    let mut h = Hysteresis::new(Duration::from_millis(20), Duration::from_millis(1000), 100.0);
    let mut t = Instant::now();
    assert_eq!(run(&mut h, &mut t, &[0, 1, 1]), [(2, Transition::Start)]);
    h.reset();
    assert!(!h.shedding());
    run(&mut h, &mut t, &[0; 3]);
    assert_eq!(run(&mut h, &mut t, &[1, 1]), [(1, Transition::Start)]);
    h.set_timings(Duration::from_millis(20), Duration::from_millis(30), 100.0);
    assert_eq!(run(&mut h, &mut t, &[0, 0, 0]), [(2, Transition::Stop)]);
    // A higher rate: what started it before no longer does.
    h.set_timings(Duration::from_millis(20), Duration::from_millis(30), 1000.0);
    assert_eq!(run(&mut h, &mut t, &[1, 1, 1, 1]), []);
    assert_eq!(run(&mut h, &mut t, &[10, 10]), [(1, Transition::Start)]);
}
