//! The ledger's protocol on shared memory two "daemons" map separately (a
//! memfd stands in for the pinned map: the same `mmap`, without root).

use std::{
    os::fd::{AsFd as _, OwnedFd},
    path::Path,
    sync::Arc,
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
    Mapping::new(fd.as_fd(), BYTES as usize).unwrap()
}

fn join(fd: &OwnedFd) -> Result<Arc<Ledger>, LedgerError> {
    Ledger::join(map(fd), Path::new("/test"), Duration::ZERO)
}

#[test]
fn each_daemon_sees_what_the_other_holds_and_only_while_it_lives() {
    let fd = memory();
    let (a, b) = (join(&fd).unwrap(), join(&fd).unwrap());
    assert_ne!(a.me, b.me);
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
    raw.words()[owner(a.me) + BEAT].store(now_ms() - STALE_MS - 1, Ordering::Relaxed);
    let c = join(&fd).unwrap();
    assert_eq!(c.me, a.me);
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
    let limits = Limits { normal: 10, debug_reserved: 3, per_session: 2, web: 3, dry_run: false };
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
    let limits = Limits { normal: 4, debug_reserved: 1, per_session: 0, web: 2, dry_run: false };
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
    let limits = Limits { normal: 8, debug_reserved: 0, per_session: 0, web: 0, dry_run: false };
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
