use super::*;

const LEASE: Duration = Duration::from_millis(3000);

fn key(s: &str) -> Arc<str> {
    s.into()
}

fn answer(share: u32) -> Answer {
    Answer { share, ..Answer::default() }
}

#[test]
fn requests_within_the_share_need_no_round_trip_and_one_beyond_it_claims() {
    let (mut b, k, t0) = (Budgets::default(), key("s"), Instant::now());
    // Nothing held yet: the first request claims, for itself alone.
    let Take::Claim { needed, wanted, in_use, .. } = b.take(&k, Kind::Session, 6, t0, None, 0) else {
        panic!()
    };
    assert_eq!((needed, wanted, in_use), (1, 1, 0));
    // A second request while the claim is out waits for it.
    assert!(matches!(b.take(&k, Kind::Session, 6, t0, None, 0), Take::Wait(_)));
    b.claimed(&k, t0, LEASE, answer(4), true, t0);
    b.waited(&k);
    b.waited(&k);
    // Four fit the share, each without a claim; the fifth claims half again.
    for _ in 0..4 {
        assert!(matches!(b.take(&k, Kind::Session, 6, t0, None, 1), Take::Taken { unpublished: false }));
    }
    let Take::Claim { needed, wanted, in_use, .. } = b.take(&k, Kind::Session, 6, t0, None, 0) else {
        panic!()
    };
    assert_eq!(
        (needed, wanted, in_use),
        (5, 6, 4),
        "5 needed, a quarter again while rising, never past the limit"
    );
}

#[test]
fn a_claim_that_finds_no_room_refuses_without_asking_for_the_backoff() {
    let (mut b, k, t0) = (Budgets::default(), key("s"), Instant::now());
    assert!(matches!(b.take(&k, Kind::Session, 2, t0, None, 0), Take::Claim { .. }));
    b.claimed(&k, t0, LEASE, answer(0), true, t0);
    assert!(matches!(b.take(&k, Kind::Session, 2, t0, None, 0), Take::Refused { store_down: false }));
    let later = t0 + CLAIM_BACKOFF;
    assert!(matches!(b.take(&k, Kind::Session, 2, later, None, 0), Take::Claim { .. }));
    // A request that waited for as many claims as it may is refused.
    assert!(matches!(b.take(&k, Kind::Session, 2, later, None, ROUNDS), Take::Refused { store_down: false }));
    // One that waited less waits for the claim out.
    assert!(matches!(b.take(&k, Kind::Session, 2, later, None, 1), Take::Wait(_)));
}

#[test]
fn a_share_holds_until_a_tenth_before_its_lease_ends_on_this_nodes_clock() {
    let (mut b, k, t0) = (Budgets::default(), key("s"), Instant::now());
    let _ = b.take(&k, Kind::Session, 4, t0, None, 0);
    b.claimed(&k, t0, LEASE, answer(2), true, t0);
    let almost = t0 + Duration::from_millis(2699);
    assert!(matches!(b.take(&k, Kind::Session, 4, almost, None, 0), Take::Taken { .. }));
    let lapsed = t0 + Duration::from_millis(2700);
    assert!(matches!(b.take(&k, Kind::Session, 4, lapsed, None, 0), Take::Claim { in_use: 1, .. }));
}

#[test]
fn with_the_store_down_the_policy_decides() {
    let (k, t0) = (key("s"), Instant::now());
    let held = || {
        let mut b = Budgets::default();
        let _ = b.take(&k, Kind::Session, 4, t0, None, 0);
        b.claimed(&k, t0, LEASE, answer(2), true, t0);
        b
    };
    // share: within the share while it holds, then nothing.
    let mut b = held();
    let down = Some(OnStoreDown::Share);
    assert!(matches!(b.take(&k, Kind::Session, 4, t0, down, 0), Take::Taken { unpublished: false }));
    assert!(matches!(b.take(&k, Kind::Session, 4, t0, down, 0), Take::Taken { unpublished: false }));
    assert!(matches!(b.take(&k, Kind::Session, 4, t0, down, 0), Take::Refused { store_down: true }));
    b.give_back(&k);
    let gone = t0 + LEASE;
    assert!(matches!(b.take(&k, Kind::Session, 4, gone, down, 0), Take::Refused { store_down: true }));
    // refuse: nothing, share or not.
    let mut b = held();
    assert!(matches!(b.take(&k, Kind::Session, 4, t0, Some(OnStoreDown::Refuse), 0), Take::Refused { .. }));
    // local: everything, unpublished.
    let mut b = held();
    for _ in 0..5 {
        let taken = b.take(&k, Kind::Session, 4, t0, Some(OnStoreDown::Local), 0);
        assert!(matches!(taken, Take::Taken { unpublished: true }));
    }
    assert_eq!(b.map[&k].in_use, 5);
}

#[test]
fn a_renewal_asks_for_what_was_used_since_the_last_and_gives_back_the_rest() {
    let (mut b, k, t0) = (Budgets::default(), key("s"), Instant::now());
    let _ = b.take(&k, Kind::Session, 8, t0, None, 0);
    b.claimed(&k, t0, LEASE, answer(6), true, t0);
    b.waited(&k);
    for _ in 0..5 {
        let _ = b.take(&k, Kind::Session, 8, t0, None, 0);
    }
    (0..3).for_each(|_| b.give_back(&k));
    let at = t0 + Duration::from_secs(1);
    let r = b.renewals(at);
    assert_eq!(r.len(), 1);
    assert_eq!((r[0].wanted, r[0].in_use), (5, 2), "the peak since the last renewal");
    assert_eq!(r[0].margin, Some(Duration::from_millis(1700)));
    // Out: the budget's claim is marked, a request beyond waits for it.
    assert!(b.renewals(at).is_empty());
    b.claimed(&k, at, LEASE, answer(5), true, at);
    // Nothing more used: the next renewal keeps what is in use only.
    let r = b.renewals(at + Duration::from_secs(1));
    assert_eq!((r[0].wanted, r[0].in_use), (2, 2));
    b.claimed(&k, at, LEASE, answer(2), true, at);
    (0..2).for_each(|_| b.give_back(&k));
    let r = b.renewals(at + Duration::from_secs(2));
    assert_eq!((r[0].wanted, r[0].in_use), (2, 0));
    // Nothing in use, a share of 0: the budget is forgotten here.
    b.claimed(&k, at, LEASE, answer(0), true, at);
    assert!(b.map.is_empty());
}

#[test]
fn a_refused_request_is_wanted_at_the_next_renewal_so_the_share_grows_when_room_frees() {
    let (mut b, k, t0) = (Budgets::default(), key("s"), Instant::now());
    let _ = b.take(&k, Kind::Session, 4, t0, None, 0);
    b.claimed(&k, t0, LEASE, answer(1), true, t0);
    let _ = b.take(&k, Kind::Session, 4, t0, None, 0);
    // Full, and a claim just found no room: refused, and remembered.
    assert!(matches!(b.take(&k, Kind::Session, 4, t0, None, 0), Take::Claim { .. }));
    b.claimed(&k, t0, LEASE, answer(1), true, t0);
    assert!(matches!(b.take(&k, Kind::Session, 4, t0, None, 0), Take::Refused { .. }));
    let r = b.renewals(t0 + Duration::from_secs(1));
    assert_eq!((r[0].wanted, r[0].in_use), (2, 1));
}

#[test]
fn a_failed_claim_backs_off_and_a_budget_is_forgotten_once_nothing_is_left_of_it() {
    let (mut b, k, t0) = (Budgets::default(), key("s"), Instant::now());
    let _ = b.take(&k, Kind::Web, 4, t0, None, 0);
    b.claim_failed(&k, t0);
    b.waited(&k);
    // Its demand is kept for the next renewal to record; meanwhile no claim.
    assert!(matches!(b.take(&k, Kind::Web, 4, t0, None, 0), Take::Refused { store_down: false }));
    let r = b.renewals(t0 + Duration::from_secs(1));
    assert_eq!((r[0].wanted, r[0].in_use), (1, 0));
    b.claimed(&k, t0, LEASE, answer(2), true, t0);
    let _ = b.take(&k, Kind::Web, 4, t0, None, 0);
    assert_eq!(b.totals(), ([0, 2], [0, 1]));
    b.give_back(&k);
    // Nothing used since: the renewal gives the share back, and the
    // budget is forgotten here.
    let r = b.renewals(t0 + Duration::from_secs(2));
    assert_eq!((r[0].wanted, r[0].in_use), (1, 0), "used since the last renewal");
    b.claimed(&k, t0, LEASE, answer(1), true, t0);
    let r = b.renewals(t0 + Duration::from_secs(3));
    assert_eq!((r[0].wanted, r[0].in_use), (0, 0));
    b.claimed(&k, t0, LEASE, answer(0), true, t0);
    assert!(b.map.is_empty());
}

#[test]
fn a_claim_asks_for_the_requests_waiting_for_it_too() {
    let (mut b, k, t0) = (Budgets::default(), key("s"), Instant::now());
    let _ = b.take(&k, Kind::Session, 40, t0, None, 0);
    // 39 more come while the first claim is out.
    for _ in 0..39 {
        assert!(matches!(b.take(&k, Kind::Session, 40, t0, None, 0), Take::Wait(_)));
    }
    b.claimed(&k, t0, LEASE, answer(1), true, t0);
    // The first takes its unit; the next claim asks for everyone left.
    b.waited(&k);
    assert!(matches!(b.take(&k, Kind::Session, 40, t0, None, 1), Take::Taken { .. }));
    b.waited(&k);
    let Take::Claim { needed, in_use, .. } = b.take(&k, Kind::Session, 40, t0, None, 1) else { panic!() };
    assert_eq!((needed, in_use), (40, 1));
}
