//! The ledger's protocol on shared memory two "daemons" map separately (a
//! memfd stands in for the pinned map: the same `mmap`, without root).

use std::{
    os::fd::{AsFd as _, OwnedFd},
    path::Path,
    sync::{Arc, atomic::AtomicBool},
    time::Duration,
};

use super::*;
use crate::admission::{Admission, Ask, Limits, Refusal};

fn memory() -> OwnedFd {
    let fd = nix::sys::memfd::memfd_create("ledger-test", nix::sys::memfd::MFdFlags::MFD_CLOEXEC).unwrap();
    nix::unistd::ftruncate(fd.as_fd(), i64::from(BYTES)).unwrap();
    fd
}

fn map(fd: &OwnedFd) -> Mapping {
    Mapping::of_memfd(fd.as_fd(), BYTES as usize).unwrap()
}

fn join(fd: &OwnedFd) -> Result<Arc<Ledger>, LedgerError> {
    Ledger::join(map(fd), Path::new("/test"), Duration::ZERO)
}

/// A clock the test moves, at a boot time of 1,000 s.
fn fake_clock() -> (Clock, Arc<AtomicU64>) {
    let ms = Arc::new(AtomicU64::new(1_000_000));
    (Clock { fake: Some(ms.clone()) }, ms)
}

fn join_at(fd: &OwnedFd, clock: &Clock) -> Arc<Ledger> {
    Ledger::join_with(map(fd), Path::new("/test"), Duration::ZERO, clock.clone()).unwrap()
}

/// Word index of `ledger`'s record.
fn record_of(ledger: &Ledger) -> usize {
    owner(ledger.record().expect("a record"))
}

/// Takes `ledger`'s lock in another thread while the fake clock `ms` moves
/// 10 ms at a time (calling `meanwhile` at each step, to beat): the fake
/// milliseconds it waited, or `None` if it still waited after 10 times the
/// bound (then the lock word is cleared to let it go).
fn waited_for_lock(ledger: &Ledger, ms: &AtomicU64, meanwhile: impl Fn()) -> Option<u64> {
    let got = AtomicBool::new(false);
    let start = ms.load(Ordering::SeqCst);
    let waited = std::thread::scope(|s| {
        s.spawn(|| {
            drop(ledger.lock());
            got.store(true, Ordering::SeqCst);
        });
        while !got.load(Ordering::SeqCst) {
            if ms.load(Ordering::SeqCst) - start > 10 * LOCK_MS {
                ledger.mem.words()[LOCK].store(0, Ordering::SeqCst);
                return None;
            }
            meanwhile();
            std::thread::sleep(Duration::from_millis(1));
            ms.fetch_add(10, Ordering::SeqCst);
        }
        Some(ms.load(Ordering::SeqCst) - start)
    });
    // The lock was let go: the taker does not leave the word set.
    assert_eq!(ledger.mem.words()[LOCK].load(Ordering::SeqCst), 0);
    waited
}

#[test]
fn each_daemon_sees_what_the_other_holds_and_only_while_it_lives() {
    let fd = memory();
    let (a, b) = (join(&fd).unwrap(), join(&fd).unwrap());
    assert_ne!(a.record(), b.record());
    a.lock().publish(Change { normal: 2, reserved: 1, web: 1 });
    assert_eq!(b.lock().others(), Others { normal: 2, reserved: 1, web: 1 });
    assert_eq!(a.lock().others(), Others::default());
    a.lock().publish(Change { normal: -1, reserved: -1, web: 0 });
    assert_eq!(b.lock().others(), Others { normal: 1, reserved: 0, web: 1 });
    drop(a);
    assert!(!b.lock().has_peer(), "a daemon that leaves clears its record");
    assert_eq!(b.lock().others(), Others::default());
}

#[test]
fn a_third_daemon_is_refused_and_a_dead_ones_record_is_reused() {
    let fd = memory();
    let (a, _b) = (join(&fd).unwrap(), join(&fd).unwrap());
    assert!(matches!(join(&fd), Err(LedgerError::Full(_))));
    // `a` stops beating (killed): its record goes stale and is taken.
    let raw = map(&fd);
    a.lock().publish(Change { normal: 5, ..Change::default() });
    raw.words()[record_of(&a) + BEAT].store(now_ms() - STALE_MS - 1, Ordering::Relaxed);
    let c = join(&fd).unwrap();
    assert_eq!(c.record(), a.record());
    assert_eq!(c.lock().others(), Others::default(), "b holds nothing");
    assert_eq!(_b.lock().others(), Others::default(), "the dead record's counts are gone");
    std::mem::forget(a); // its drop would clear c's record: it is "dead"
}

#[test]
fn both_daemons_compute_one_session_key_and_count_it_together() {
    let fd = memory();
    let (a, b) = (join(&fd).unwrap(), join(&fd).unwrap());
    assert_eq!(a.seed(), b.seed());
    assert_ne!(a.seed(), (0, 0));
    let limits = Limits {
        normal: 10,
        debug_reserved: 3,
        per_session: 2,
        web: 3,
        dry_run: false,
        adaptive_min: None,
        critical_reserve: false,
        tunnels: 0,
        tunnels_per_client: 0,
    };
    let (x, y) = (Admission::with_ledger(limits, Some(a)), Admission::with_ledger(limits, Some(b)));
    let token = Ask { session: Some(b"Bearer T"), ..Ask::default() };
    let p1 = x.admit(token).unwrap();
    let p2 = y.admit(Ask { session: Some(b"bearer  T"), ..Ask::default() }).unwrap();
    assert_eq!(y.admit(token).unwrap_err(), Refusal::Session, "two in flight across both daemons");
    assert_eq!(x.admit(token).unwrap_err(), Refusal::Session);
    drop(p1);
    let p3 = y.admit(token).unwrap();
    drop((p2, p3));
    assert!(x.admit(token).is_ok() && y.admit(token).is_ok());
}

#[test]
fn two_daemons_together_never_admit_more_than_the_pools() {
    let fd = memory();
    let (a, b) = (join(&fd).unwrap(), join(&fd).unwrap());
    let limits = Limits {
        normal: 4,
        debug_reserved: 1,
        per_session: 0,
        web: 2,
        dry_run: false,
        adaptive_min: None,
        critical_reserve: false,
        tunnels: 0,
        tunnels_per_client: 0,
    };
    let (x, y) = (Admission::with_ledger(limits, Some(a)), Admission::with_ledger(limits, Some(b)));
    let web = Ask { web: true, ..Ask::default() };
    let held = [x.admit(web).unwrap(), y.admit(Ask::default()).unwrap(), x.admit(Ask::default()).unwrap()];
    // Web: x holds one of 2; the pool holds 3 of 4.
    let w2 = y.admit(web).unwrap();
    assert_eq!(x.admit(web).unwrap_err(), Refusal::Normal, "the pool is full across both first");
    drop(w2);
    let w3 = y.admit(web).unwrap();
    drop(w3);
    drop(held);
    let mut many = Vec::new();
    for i in 0..4 {
        many.push(if i % 2 == 0 { x.admit(Ask::default()) } else { y.admit(Ask::default()) }.unwrap());
    }
    assert_eq!(x.admit(Ask::default()).unwrap_err(), Refusal::Normal);
    assert_eq!(y.admit(Ask::default()).unwrap_err(), Refusal::Normal);
    let debug = Ask { debug: true, ..Ask::default() };
    let d = y.admit(debug).unwrap();
    assert_eq!(x.admit(debug).unwrap_err(), Refusal::Debug, "the reserve is shared too");
    assert_eq!(x.snapshot().peer_in_use, Some([2, 1, 0]));
    drop((d, many));
    assert_eq!(x.snapshot().peer_in_use, Some([0, 0, 0]));
}

#[test]
fn concurrent_admissions_in_two_daemons_never_overshoot() {
    let fd = memory();
    let limits = Limits {
        normal: 8,
        debug_reserved: 0,
        per_session: 0,
        web: 0,
        dry_run: false,
        adaptive_min: None,
        critical_reserve: false,
        tunnels: 0,
        tunnels_per_client: 0,
    };
    let daemons = [join(&fd).unwrap(), join(&fd).unwrap()].map(|l| Admission::with_ledger(limits, Some(l)));
    let in_flight = std::sync::atomic::AtomicU32::new(0);
    let peak = std::sync::atomic::AtomicU32::new(0);
    std::thread::scope(|s| {
        for d in &daemons {
            for _ in 0..2 {
                s.spawn(|| {
                    for _ in 0..20_000 {
                        if let Ok(p) = d.admit(Ask::default()) {
                            let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                            peak.fetch_max(now, Ordering::SeqCst);
                            std::hint::spin_loop();
                            in_flight.fetch_sub(1, Ordering::SeqCst);
                            drop(p);
                        }
                    }
                });
            }
        }
    });
    assert!(peak.load(Ordering::SeqCst) <= 8, "peak {} in flight across both", peak.load(Ordering::SeqCst));
    for d in &daemons {
        assert_eq!(d.snapshot().normal_in_use, 0);
        assert_eq!(d.snapshot().peer_in_use, Some([0, 0, 0]));
    }
}

#[test]
fn a_lock_held_by_a_dead_daemon_is_taken_over() {
    let fd = memory();
    let a = join(&fd).unwrap();
    let raw = map(&fd);
    // A token no record has: the holder died while joining.
    raw.words()[LOCK].store(0xdead, Ordering::Relaxed);
    let started = Instant::now();
    drop(a.lock());
    assert!(started.elapsed() >= Duration::from_millis(STALE_MS), "held for the stale time first");
    assert_eq!(raw.words()[LOCK].load(Ordering::Relaxed), 0);
}

#[test]
fn sessions_without_a_slot_are_counted_locally_only() {
    let fd = memory();
    let a = join(&fd).unwrap();
    let shared = a.lock();
    // Keys that all probe the same 16 slots.
    for i in 0..SESSION_PROBES as u64 {
        assert!(shared.publish_session(i * SESSION_SLOTS as u64 + 7, 1));
    }
    assert!(!shared.publish_session(99 * SESSION_SLOTS as u64 + 7, 1));
    assert!(!shared.publish_session(99 * SESSION_SLOTS as u64 + 7, -1), "nothing to take back");
    drop(shared);
    assert_eq!(a.unpublished(), 1);
}

#[test]
fn a_beat_in_the_future_is_stale() {
    let now = 1_000_000;
    assert!(!stale(now, now) && !stale(now - STALE_MS, now) && stale(now - STALE_MS - 1, now));
    assert!(!stale(now + AHEAD_MS, now), "a clock a little ahead is tolerated");
    assert!(stale(now + AHEAD_MS + 1, now) && stale(u64::MAX, now));

    let fd = memory();
    let (clock, _) = fake_clock();
    let (a, b) = (join_at(&fd, &clock), join_at(&fd, &clock));
    a.lock().publish(Change { normal: 3, ..Change::default() });
    let raw = map(&fd);
    raw.words()[record_of(&a) + BEAT].store(clock.now_ms() + AHEAD_MS, Ordering::Relaxed);
    assert_eq!(b.lock().others().normal, 3, "a beat one beat ahead is live");
    // A beat far ahead (a clock not ours, or forged) would otherwise keep
    // the record live for ever.
    raw.words()[record_of(&a) + BEAT].store(clock.now_ms() + 3_600_000, Ordering::Relaxed);
    assert!(!b.lock().has_peer());
    assert_eq!(b.lock().others(), Others::default(), "its counts are ignored");
    let c = join_at(&fd, &clock);
    assert_eq!(c.record(), a.record(), "its record is reused");
    drop(a);
    assert_eq!(raw.words()[record_of(&c) + TOKEN].load(Ordering::Relaxed), c.token, "a leaves c's record be");
}

#[test]
fn a_lock_word_with_our_own_token_is_taken_over_within_the_bound() {
    let fd = memory();
    let (clock, ms) = fake_clock();
    let a = join_at(&fd, &clock);
    // Written by another: no thread of `a` holds it, and `a` is alive.
    a.mem.words()[LOCK].store(a.token, Ordering::SeqCst);
    let waited = waited_for_lock(&a, &ms, || a.beat()).expect("taken over");
    assert!(waited > LOCK_MS && waited <= LOCK_MS + 500, "taken over after {waited} ms");
}

#[test]
fn a_lock_held_by_a_live_daemon_past_the_bound_is_taken_over() {
    let fd = memory();
    let (clock, ms) = fake_clock();
    let (a, b) = (join_at(&fd, &clock), join_at(&fd, &clock));
    let held = b.lock();
    let waited = waited_for_lock(&a, &ms, || b.beat()).expect("taken over");
    assert!(waited > LOCK_MS && waited <= LOCK_MS + 500, "taken over after {waited} ms");
    assert!(a.lock().has_peer(), "b is alive all along");
    // `a` took it and let it go; another takes it now, then `b` lets go
    // of the lock it was held: the other keeps it.
    let other = lock_words(a.mem.words(), 0x07e4, &clock);
    drop(held);
    assert_eq!(a.mem.words()[LOCK].load(Ordering::SeqCst), 0x07e4);
    drop(other);
    assert_eq!(a.mem.words()[LOCK].load(Ordering::SeqCst), 0);
}

#[test]
fn a_record_written_over_by_another_is_noticed_and_claimed_back_when_silent() {
    let fd = memory();
    let (clock, ms) = fake_clock();
    let (a, b) = (join_at(&fd, &clock), join_at(&fd, &clock));
    let shared = a.lock();
    shared.publish(Change { normal: 2, web: 1, ..Change::default() });
    assert!(shared.publish_session(7, 1));
    drop(shared);
    let mine = record_of(&a);
    let raw = map(&fd);
    let w = raw.words();
    // Another writer takes the record, with counts of its own.
    w[mine + TOKEN].store(0xf0f0, Ordering::Relaxed);
    w[mine + NORMAL].store(1000, Ordering::Relaxed);
    let beat = w[mine + BEAT].load(Ordering::Relaxed);
    ms.fetch_add(100, Ordering::SeqCst);
    a.beat();
    assert_eq!(a.record(), None, "noticed at the beat");
    assert_eq!(w[mine + BEAT].load(Ordering::Relaxed), beat, "no beat into a record not ours");
    let shared = a.lock();
    shared.publish(Change { normal: 1, ..Change::default() });
    assert_eq!(w[mine + NORMAL].load(Ordering::Relaxed), 1000, "nothing published into it");
    assert_eq!(shared.others().normal, 1000, "counted as another's");
    drop(shared);
    b.lock().publish(Change { normal: 1, ..Change::default() });
    assert_eq!(a.lock().others(), Others { normal: 1001, reserved: 0, web: 1 }, "both records count");
    // The writer stops beating it: 2 s later `a` claims it back, with
    // what `a` holds (not what the writer wrote).
    ms.fetch_add(STALE_MS, Ordering::SeqCst);
    b.beat();
    a.beat();
    assert_eq!(a.record().map(owner), Some(mine));
    assert_eq!(w[mine + TOKEN].load(Ordering::Relaxed), a.token);
    assert_eq!(b.lock().others(), Others { normal: 3, reserved: 0, web: 1 });
    assert_eq!(b.lock().other_session(7), 1, "its sessions are published again");
    assert_eq!(a.lock().others(), Others { normal: 1, reserved: 0, web: 0 }, "b alone again");
}

#[test]
fn another_records_counts_are_read_as_at_most_2_pow_30() {
    let fd = memory();
    let (clock, _) = fake_clock();
    let (a, b) = (join_at(&fd, &clock), join_at(&fd, &clock));
    let limits = Limits {
        normal: 4,
        debug_reserved: 0,
        per_session: 2,
        web: 0,
        dry_run: false,
        adaptive_min: None,
        critical_reserve: false,
        tunnels: 0,
        tunnels_per_client: 0,
    };
    let x = Admission::with_ledger(limits, Some(a));
    let p = x.admit(Ask::default()).unwrap();
    let w = b.mem.words();
    for forged in [1 << 32, u64::MAX] {
        // Read as a u32, these were 0 (admitting as if b held nothing) or
        // wrapped when added to x's own count.
        w[record_of(&b) + NORMAL].store(forged, Ordering::Relaxed);
        assert_eq!(x.admit(Ask::default()).unwrap_err(), Refusal::Normal);
        assert_eq!(x.snapshot().peer_in_use, Some([1 << 30, 0, 0]));
    }
    w[record_of(&b) + NORMAL].store(0, Ordering::Relaxed);
    let key = x.session_keys.key(b"Bearer T");
    let shared = b.lock();
    assert!(shared.publish_session(key, 1));
    drop(shared);
    let slot = probes(key).find(|&i| w[record_of(&b) + session(i)].load(Ordering::Relaxed) == key).unwrap();
    w[record_of(&b) + session(slot) + 1].store(1 << 32, Ordering::Relaxed);
    let token = Ask { session: Some(b"Bearer T"), ..Ask::default() };
    assert_eq!(x.admit(token).unwrap_err(), Refusal::Session);
    drop(p);
}

#[test]
fn alone_a_daemon_decides_without_the_lock_and_a_joiner_waits_until_it_takes_it_again() {
    let fd = memory();
    let (clock, _ms) = fake_clock();
    let a = join_at(&fd, &clock);
    let raw = map(&fd);
    let w = raw.words();
    let alone = |l: &Ledger| w[record_of(l) + ALONE].load(Ordering::SeqCst);
    // The first look is under the lock; it finds no one else.
    assert!(!a.lock().has_peer());
    assert_eq!(alone(&a), 1);
    // From then on it neither takes nor waits for the lock (a foreign
    // holder would keep it spinning for 2 s of a clock that does not
    // move), and still publishes what it holds.
    w[LOCK].store(0x5555, Ordering::SeqCst);
    let (done, decided) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            a.lock().publish(Change { normal: 3, ..Change::default() });
            done.send(()).unwrap();
        });
        decided.recv_timeout(Duration::from_secs(5)).expect("a daemon alone waited for the lock");
    });
    assert_eq!(w[record_of(&a) + NORMAL].load(Ordering::SeqCst), 3);
    assert_eq!(w[LOCK].load(Ordering::SeqCst), 0x5555, "the lock word was not touched");
    w[LOCK].store(0, Ordering::SeqCst);

    // A daemon that joins waits until the one alone takes the lock again,
    // which it does at its next decision, and reads what it published.
    let (joined, b) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| joined.send(join_at(&fd, &clock)).unwrap());
        assert!(b.recv_timeout(Duration::from_millis(300)).is_err(), "joined while the other decided alone");
        let shared = a.lock();
        assert!(shared.has_peer(), "the new record is counted at once");
        drop(shared);
        let b = b.recv_timeout(Duration::from_secs(5)).expect("the joiner never went on");
        assert_eq!(alone(&a), 0);
        assert_eq!(b.lock().others().normal, 3);
        // The one that was alone decides under the lock while the other is there.
        w[LOCK].store(0x5555, Ordering::SeqCst);
        let (done, decided) = std::sync::mpsc::channel();
        let a = &a;
        s.spawn(move || {
            drop(a.lock());
            done.send(()).unwrap();
        });
        assert!(decided.recv_timeout(Duration::from_millis(200)).is_err(), "decided apart from the other");
        w[LOCK].store(0, Ordering::SeqCst);
        decided.recv_timeout(Duration::from_secs(5)).expect("the lock was free again");
        // Once the other leaves, it is alone again.
        drop(b);
        assert!(!a.lock().has_peer());
        assert_eq!(alone(a), 1);
    });
}

#[test]
fn an_idle_daemon_alone_lets_a_joiner_in_at_its_next_beat() {
    let fd = memory();
    let (clock, _ms) = fake_clock();
    let a = join_at(&fd, &clock);
    drop(a.lock());
    let (joined, b) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| joined.send(join_at(&fd, &clock)).unwrap());
        assert!(b.recv_timeout(Duration::from_millis(300)).is_err(), "joined while the other decided alone");
        a.beat();
        let b = b.recv_timeout(Duration::from_secs(5)).expect("the beat did not let the joiner in");
        assert!(b.lock().has_peer());
    });
}
