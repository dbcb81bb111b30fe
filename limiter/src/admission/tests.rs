use std::time::{Duration, Instant};

use super::*;

fn limits(normal: u32, per_session: u32, web: u32) -> Limits {
    Limits {
        normal,
        debug_reserved: 3,
        per_session,
        web,
        dry_run: false,
        adaptive_min: None,
        critical_reserve: false,
        tunnels: 0,
        tunnels_per_client: 0,
    }
}

fn normal() -> Ask<'static> {
    Ask::default()
}

fn debug() -> Ask<'static> {
    Ask { debug: true, ..Ask::default() }
}

#[test]
fn the_normal_pool_is_max_threads_minus_eleven() {
    let mut http = crate::config::Config::default().http;
    assert_eq!(Limits::from_config(&http).normal, 197);
    http.max_threads = 20;
    assert_eq!(Limits::from_config(&http).normal, 9);
}

#[test]
fn normal_requests_fill_the_pool_then_are_refused() {
    let a = Admission::new(limits(9, 0, 0));
    let permits: Vec<_> = (0..9).map(|_| a.admit(normal()).unwrap()).collect();
    assert_eq!(a.admit(normal()).unwrap_err(), Refusal::Normal);
    assert_eq!(a.snapshot().normal_in_use, 9);
    drop(permits);
    let s = a.snapshot();
    assert_eq!((s.normal_in_use, s.admitted_normal, s.refused[0]), (0, 9, 1));
}

#[test]
fn debug_takes_reserved_slots_then_free_normal_ones_never_the_reverse() {
    let a = Admission::new(limits(2, 0, 0));
    let n1 = a.admit(normal()).unwrap();
    let _n2 = a.admit(normal()).unwrap();
    // Normal pool full: debug still gets its three reserved slots.
    let d: Vec<_> = (0..3).map(|_| a.admit(debug()).unwrap()).collect();
    assert!(d.iter().all(|p| p.slot() == Slot::Reserved));
    // A fourth debug request finds no reserved slot and no normal slot.
    assert_eq!(a.admit(debug()).unwrap_err(), Refusal::Debug);
    // One normal slot frees: the fourth debug request takes it...
    drop(n1);
    let d4 = a.admit(debug()).unwrap();
    assert_eq!(d4.slot(), Slot::Normal);
    // ...and normal requests never take reserved slots.
    drop(d);
    assert_eq!(a.admit(normal()).unwrap_err(), Refusal::Normal);
    let s = a.snapshot();
    assert_eq!((s.normal_in_use, s.debug_in_use), (2, 0));
}

#[test]
fn sessions_are_limited_independently_and_entries_vanish_at_zero() {
    let a = Admission::new(limits(100, 2, 0));
    let alice = Ask { session: Some(b"Bearer alice"), ..Ask::default() };
    let bob = Ask { session: Some(b"Bearer bob"), ..Ask::default() };
    let a1 = a.admit(alice).unwrap();
    let a2 = a.admit(alice).unwrap();
    assert_eq!(a.admit(alice).unwrap_err(), Refusal::Session);
    let b1 = a.admit(bob).unwrap();
    assert_eq!(a.snapshot().sessions, 2);
    // A refusal left nothing behind: the pool holds exactly three.
    assert_eq!(a.snapshot().normal_in_use, 3);
    drop((a1, a2, b1));
    assert_eq!(a.snapshot().sessions, 0);
    assert_eq!(a.snapshot().normal_in_use, 0);
}

#[test]
fn debug_requests_are_exempt_from_session_and_web_limits() {
    let a = Admission::new(limits(100, 1, 1));
    let s = Ask { session: Some(b"t"), web: true, ..Ask::default() };
    let _held = a.admit(s).unwrap();
    assert_eq!(a.admit(s).unwrap_err(), Refusal::Web);
    let d = Ask { debug: true, session: Some(b"t"), web: true, ..Ask::default() };
    let _d = a.admit(d).expect("debug ignores session and web limits");
    assert_eq!(a.snapshot().web_in_use, 1);
}

#[test]
fn the_first_failing_check_names_the_reason() {
    // Pool before web before session.
    let a = Admission::new(limits(1, 1, 1));
    let both = Ask { session: Some(b"t"), web: true, ..Ask::default() };
    let _p = a.admit(both).unwrap();
    assert_eq!(a.admit(both).unwrap_err(), Refusal::Normal);
    a.set_limits(limits(5, 1, 1));
    assert_eq!(a.admit(both).unwrap_err(), Refusal::Web);
    assert_eq!(a.admit(Ask { session: Some(b"t"), ..Ask::default() }).unwrap_err(), Refusal::Session);
    let s = a.snapshot();
    assert_eq!(&s.refused[..4], &[1, 0, 1, 1]);
    // And no refusal took anything.
    assert_eq!((s.normal_in_use, s.web_in_use, s.sessions), (1, 1, 1));
}

#[test]
fn web_limit_counts_only_requests_with_a_client_id() {
    let a = Admission::new(limits(100, 0, 2));
    let web = Ask { web: true, ..Ask::default() };
    let _w: Vec<_> = (0..2).map(|_| a.admit(web).unwrap()).collect();
    assert_eq!(a.admit(web).unwrap_err(), Refusal::Web);
    let _n = a.admit(normal()).expect("no X-Client-Id: not a web client");
}

#[test]
fn unlimited_sessions_keep_no_entries() {
    let a = Admission::new(limits(100_000, 0, 0));
    let tokens: Vec<String> = (0..10_000).map(|i| format!("Bearer {i}")).collect();
    let permits: Vec<_> = tokens
        .iter()
        .map(|t| a.admit(Ask { session: Some(t.as_bytes()), ..Ask::default() }).unwrap())
        .collect();
    assert_eq!(a.snapshot().sessions, 0);
    drop(permits);
}

#[test]
fn ten_thousand_sessions_leave_no_entries() {
    let a = Admission::new(limits(100_000, 3, 0));
    let tokens: Vec<String> = (0..10_000).map(|i| format!("Bearer {i}")).collect();
    let permits: Vec<_> = tokens
        .iter()
        .map(|t| a.admit(Ask { session: Some(t.as_bytes()), ..Ask::default() }).unwrap())
        .collect();
    assert_eq!(a.snapshot().sessions, 10_000);
    drop(permits);
    assert_eq!(a.snapshot().sessions, 0);
}

#[test]
fn lowering_a_limit_admits_nothing_until_usage_falls_under_it() {
    let a = Admission::new(limits(4, 0, 0));
    let mut held: Vec<_> = (0..4).map(|_| a.admit(normal()).unwrap()).collect();
    a.set_limits(limits(2, 0, 0));
    assert_eq!(a.admit(normal()).unwrap_err(), Refusal::Normal);
    held.truncate(2);
    assert_eq!(a.admit(normal()).unwrap_err(), Refusal::Normal);
    held.truncate(1);
    held.push(a.admit(normal()).unwrap());
    assert_eq!(a.snapshot().normal_in_use, 2);
}

#[test]
fn session_limit_changes_keep_counts_exact() {
    let a = Admission::new(limits(100, 1, 0));
    let t = Ask { session: Some(b"t"), ..Ask::default() };
    let first = a.admit(t).unwrap();
    a.set_limits(limits(100, 0, 0));
    let unlimited = a.admit(t).unwrap();
    a.set_limits(limits(100, 1, 0));
    // `first` still holds the session's one slot.
    assert_eq!(a.admit(t).unwrap_err(), Refusal::Session);
    drop(first);
    drop(unlimited);
    assert_eq!(a.snapshot().sessions, 0);
    let _again = a.admit(t).unwrap();
}

#[test]
fn dry_run_counts_would_be_refusals_and_refuses_nothing() {
    let a = Admission::new(Limits { dry_run: true, ..limits(1, 1, 0) });
    let t = Ask { session: Some(b"t"), ..Ask::default() };
    let p: Vec<_> = (0..3).map(|_| a.admit(t).expect("dry-run admits")).collect();
    let s = a.snapshot();
    assert_eq!(s.refused, [0; Refusal::ALL.len()]);
    assert_eq!(s.would_refuse[Refusal::Normal as usize], 2);
    assert_eq!(s.normal_in_use, 3);
    drop(p);
    let s = a.snapshot();
    assert_eq!((s.normal_in_use, s.sessions), (0, 0));
}

#[test]
fn concurrent_admissions_never_exceed_the_pool() {
    // Four times as many threads as slots, each holding its permit a moment:
    // without the limit, up to 16 would be held at once.
    use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
    let a = Admission::new(limits(4, 0, 0));
    let (holding, peak, refused) = (AtomicU32::new(0), AtomicU32::new(0), AtomicU32::new(0));
    let start = std::sync::Barrier::new(16);
    std::thread::scope(|scope| {
        for _ in 0..16 {
            scope.spawn(|| {
                start.wait();
                for _ in 0..2_000 {
                    match a.admit(Ask::default()) {
                        Ok(p) => {
                            let now = holding.fetch_add(1, SeqCst) + 1;
                            peak.fetch_max(now, SeqCst);
                            std::thread::yield_now();
                            holding.fetch_sub(1, SeqCst);
                            drop(p);
                        }
                        Err(_) => {
                            refused.fetch_add(1, SeqCst);
                        }
                    }
                }
            });
        }
    });
    assert_eq!(peak.load(SeqCst), 4, "the pool filled, and no further");
    assert!(refused.load(SeqCst) > 0, "the threads contended for the slots");
    let s = a.snapshot();
    assert_eq!(s.normal_in_use, 0);
    assert_eq!(u64::from(refused.load(SeqCst)), s.refused[0], "every refusal counted once");
}

#[test]
fn the_check_at_the_head_takes_nothing_and_counts_its_refusal_once() {
    let a = Admission::new(limits(1, 0, 0));
    assert_eq!(a.check(Ask::default()), Ok(()));
    assert_eq!(a.snapshot().normal_in_use, 0, "a check takes no slot");
    let held = a.admit(Ask::default()).unwrap();
    assert_eq!(a.check(Ask::default()), Err(Refusal::Normal));
    assert_eq!(a.snapshot().refused[0], 1);
    drop(held);
    assert_eq!(a.check(Ask::default()), Ok(()));
    let mut dry = limits(1, 0, 0);
    dry.dry_run = true;
    let d = Admission::new(dry);
    let _held = d.admit(Ask::default()).unwrap();
    assert_eq!(d.check(Ask::default()), Ok(()), "dry-run: the admission after the body counts");
    assert_eq!(d.snapshot().would_refuse, [0; Refusal::ALL.len()]);
}

#[test]
fn refusals_are_listed_once_each_at_their_counters_index() {
    let names: Vec<&str> = Refusal::ALL.iter().map(|r| r.as_str()).collect();
    assert_eq!(
        names,
        [
            "normal",
            "debug",
            "web",
            "session",
            "sheddable",
            "critical",
            "fleet_session",
            "fleet_web",
            "fleet_down",
            "tunnels",
            "tunnels_per_client"
        ]
    );
    assert!(Refusal::ALL.iter().enumerate().all(|(i, r)| r.index() == i));
}

fn ask(class: Class) -> Ask<'static> {
    Ask { class, ..Ask::default() }
}

#[test]
fn below_the_limit_no_class_is_refused() {
    let a = Admission::new(Limits { critical_reserve: true, ..limits(8, 0, 0) });
    let held: Vec<Permit> = [Class::Sheddable, Class::Normal, Class::Critical]
        .into_iter()
        .cycle()
        .take(8)
        .map(|c| a.admit(ask(c)).expect("below the limit, never under pressure"))
        .collect();
    assert_eq!(held.len(), 8);
    assert_eq!(a.admit(ask(Class::Sheddable)).unwrap_err(), Refusal::Sheddable);
    assert_eq!(a.admit(ask(Class::Critical)).unwrap_err(), Refusal::Critical);
    assert_eq!(a.admit(ask(Class::Normal)).unwrap_err(), Refusal::Normal);
}

#[test]
fn under_pressure_sheddable_requests_go_first_and_critical_ones_last() {
    let a = Admission::new(Limits { critical_reserve: true, ..limits(16, 0, 0) });
    let mut held: Vec<Permit> = (0..16).map(|_| a.admit(ask(Class::Normal)).unwrap()).collect();
    // Full: the pool is under pressure for the next second.
    held.truncate(11);
    // 11 in use: a sheddable request may use 12 (16 less a quarter).
    let s = a.admit(ask(Class::Sheddable)).expect("12th slot");
    assert_eq!(a.admit(ask(Class::Sheddable)).unwrap_err(), Refusal::Sheddable);
    // Normal ones up to 15 (less a sixteenth, for critical paths).
    let n: Vec<Permit> = (0..3).map(|_| a.admit(ask(Class::Normal)).unwrap()).collect();
    assert_eq!(a.admit(ask(Class::Normal)).unwrap_err(), Refusal::Normal);
    // The last slot is a critical request's.
    let c = a.admit(ask(Class::Critical)).expect("the critical reserve");
    assert_eq!(a.admit(ask(Class::Critical)).unwrap_err(), Refusal::Critical);
    let snap = a.snapshot();
    assert_eq!(snap.refused[Refusal::Sheddable as usize], 1);
    assert_eq!(snap.refused[Refusal::Critical as usize], 1);
    drop((s, n, c, held));
    // Without critical paths configured, normal requests have the whole pool.
    let a = Admission::new(limits(4, 0, 0));
    let held: Vec<Permit> = (0..4).map(|_| a.admit(ask(Class::Normal)).unwrap()).collect();
    drop(held);
    let again: Vec<Permit> = (0..4).map(|_| a.admit(ask(Class::Normal)).unwrap()).collect();
    assert_eq!(again.len(), 4);
    assert_eq!(a.admit(ask(Class::Sheddable)).unwrap_err(), Refusal::Sheddable);
}

#[test]
fn the_adaptive_limit_is_the_normal_pool_s_limit_in_force() {
    let a = Admission::new(Limits { adaptive_min: Some(2), ..limits(20, 0, 0) });
    assert_eq!(a.snapshot().normal_limit, 20, "it starts at the static pool");
    let t0 = Instant::now();
    // Answers of 10 ms, then of 100 ms with 20 in flight: a queue.
    let mut t = t0;
    for ms in [10u64, 10, 100, 100, 100, 100, 100] {
        // As many as it admits (refusals of any class count as pressure).
        let mut held: Vec<Permit> = (0..20).map_while(|_| a.admit(ask(Class::Normal)).ok()).collect();
        assert!(a.admit(ask(Class::Sheddable)).is_err());
        for p in &mut held {
            p.answered(Duration::from_millis(ms));
        }
        drop(held);
        t += Duration::from_millis(150);
        a.tick(t);
    }
    // The answers reached the controller through the permits, and the
    // limit in force is its limit.
    let snap = a.snapshot();
    assert_eq!(snap.normal_ceiling, 20);
    let e = snap.adaptive.expect("on");
    assert_eq!(snap.normal_limit, e.limit);
    assert!(e.descents >= 1 && (e.latency - 0.1).abs() < 1e-6 && e.base_latency > 0.0, "{e:?}");
    assert!(
        snap.adaptive_summary().is_some_and(|s| s.contains(&format!("adaptive limit {} of 20", e.limit)))
    );
    // Switched off by a reload: the static pool again.
    a.set_limits(limits(20, 0, 0));
    assert_eq!(a.snapshot().normal_limit, 20);
    assert!(a.snapshot().adaptive.is_none());
}

#[test]
fn tunnels_are_limited_and_outlive_the_permit_once_the_upstream_accepts() {
    let a = Admission::new(Limits { tunnels: 2, ..limits(8, 0, 0) });
    let upgrade = Ask { tunnel: true, ..Ask::default() };
    // Two upgrade requests take the two places; a third is refused, a
    // plain request is not.
    let mut first = a.admit(upgrade).unwrap();
    let second = a.admit(upgrade).unwrap();
    assert_eq!(a.admit(upgrade).unwrap_err(), Refusal::Tunnels);
    assert_eq!(a.check(upgrade), Err(Refusal::Tunnels));
    let plain = a.admit(Ask::default()).unwrap();
    assert_eq!(a.snapshot().tunnels_in_use, 2);
    // The first becomes a tunnel: its permit goes back, its place stays.
    let tunnel = first.tunnel().expect("it took a place");
    drop(first);
    assert_eq!((a.snapshot().normal_in_use, a.snapshot().tunnels_in_use), (2, 2));
    // The second was refused upstream (no 101): its place goes with it.
    drop(second);
    assert_eq!(a.snapshot().tunnels_in_use, 1);
    let third = a.admit(upgrade).unwrap();
    assert_eq!(a.admit(upgrade).unwrap_err(), Refusal::Tunnels);
    drop((tunnel, third, plain));
    let s = a.snapshot();
    assert_eq!((s.normal_in_use, s.tunnels_in_use, s.tunnels_limit), (0, 0, 2));
    // 0: unlimited; a plain request takes no place.
    let unlimited = Admission::new(limits(8, 0, 0));
    let held: Vec<_> = (0..5).map(|_| unlimited.admit(upgrade).unwrap()).collect();
    assert_eq!(unlimited.snapshot().tunnels_in_use, 5);
    drop(held);
    assert!(a.admit(Ask::default()).unwrap().tunnel().is_none());
}

#[test]
fn one_client_group_cannot_take_every_tunnel_place() {
    let a = Admission::new(Limits { tunnels: 4, tunnels_per_client: 2, ..limits(8, 0, 0) });
    let group = |s: &str| Some(crate::config::Prefix { addr: s.parse().unwrap(), len: 32 });
    let from = |g| Ask { tunnel: true, client_group: g, ..Ask::default() };
    let (x, y) = (from(group("10.0.0.1")), from(group("10.0.0.2")));
    let mut first = a.admit(x).unwrap();
    let second = a.admit(x).unwrap();
    assert_eq!(a.admit(x).unwrap_err(), Refusal::TunnelsPerClient);
    assert_eq!(a.check(x), Err(Refusal::TunnelsPerClient));
    // Another group still gets in; an ungrouped (trusted) upgrade counts
    // under the total alone.
    let other = a.admit(y).unwrap();
    let trusted = a.admit(from(None)).unwrap();
    assert_eq!(a.admit(from(None)).unwrap_err(), Refusal::Tunnels);
    // A tunnel that closes gives its group's place back; so does an
    // upgrade the upstream refused.
    let tunnel = first.tunnel().unwrap();
    drop(first);
    assert_eq!(a.admit(x).unwrap_err(), Refusal::TunnelsPerClient);
    drop(tunnel);
    let third = a.admit(x).unwrap();
    drop((second, third, other, trusted));
    assert_eq!(a.snapshot().tunnels_in_use, 0);
    assert_eq!(a.lock().tunnel_groups.len(), 0, "no group is left behind");
}

#[test]
fn a_debug_request_counts_against_no_client_limit_whatever_it_carries() {
    let a = Admission::new(limits(8, 1, 1));
    let token = &b"Bearer one"[..];
    let debug_with = Ask { debug: true, web: true, session: Some(token), ..Ask::default() };
    assert!(!debug_with.per_client(), "the one rule the fleet's limits follow too");
    // The session's and the web clients' one place are taken...
    let held = a.admit(Ask { web: true, session: Some(token), ..Ask::default() }).unwrap();
    assert_eq!(a.admit(Ask { session: Some(token), ..Ask::default() }).unwrap_err(), Refusal::Session);
    // ...and `/debug/` with the same credential and X-Client-Id still gets in.
    let debug = a.admit(debug_with).unwrap();
    let s = a.snapshot();
    assert_eq!((s.web_in_use, s.debug_in_use), (1, 1));
    drop((held, debug));
}
