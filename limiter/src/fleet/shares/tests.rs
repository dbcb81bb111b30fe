use super::*;

const LEASE: Duration = Duration::from_millis(3000);

fn key(s: &str) -> Arc<str> {
    s.into()
}

fn group() -> Arc<str> {
    key("g")
}

fn budgets() -> Budgets {
    Budgets::new(LEASE, 7)
}

fn answer(claim: &Claim, cap: u32) -> Answer {
    Answer { seq: claim.seq, cap, share: cap.max(claim.keep).max(claim.in_use), ..Answer::default() }
}

fn take(b: &mut Budgets, k: &Arc<str>, limit: u32, now: Instant, down: Option<Down>, round: u32) -> Take {
    b.take(k, Kind::Session, &group(), limit, now, down, round)
}

/// A budget with `cap` granted at `t0`, none in use.
fn granted(cap: u32, t0: Instant) -> (Budgets, Arc<str>) {
    let (mut b, k) = (budgets(), key("s"));
    let Take::Claim(c, _) = take(&mut b, &k, 10, t0, None, 0) else { panic!() };
    b.answered(&k, &c, &answer(&c, cap), t0);
    b.waited(&k);
    (b, k)
}

#[test]
fn requests_within_the_share_need_no_round_trip_and_one_beyond_it_claims() {
    let (mut b, k, t0) = (budgets(), key("s"), Instant::now());
    // Nothing held yet: the first request claims, for itself alone.
    let Take::Claim(c, _) = take(&mut b, &k, 6, t0, None, 0) else { panic!() };
    assert_eq!((c.keep, c.need, c.want, c.in_use, c.growth), (0, 1, 1, 0, true));
    // A second request while the claim is out waits for it.
    assert!(matches!(take(&mut b, &k, 6, t0, None, 0), Take::Wait(_)));
    b.answered(&k, &c, &answer(&c, 4), t0);
    b.waited(&k);
    b.waited(&k);
    // Four fit the cap, each without a claim; the fifth claims, keeping
    // the four, and a quarter again while the share grows.
    for _ in 0..4 {
        assert!(matches!(take(&mut b, &k, 6, t0, None, 1), Take::Taken(Within::Share)));
    }
    let Take::Claim(c, _) = take(&mut b, &k, 6, t0, None, 0) else { panic!() };
    assert_eq!((c.keep, c.need, c.want, c.in_use), (4, 5, 6, 4), "never past the limit");
}

#[test]
fn a_share_shrinks_before_the_store_hears_of_it_and_stays_shrunk_when_the_answer_is_lost() {
    let t0 = Instant::now();
    let (mut b, k) = granted(6, t0);
    for _ in 0..2 {
        assert!(matches!(take(&mut b, &k, 6, t0, None, 0), Take::Taken(_)));
    }
    // A renewal that asks for what was used (2 of 6), keeping what is in
    // flight: from the moment it is sent, the node admits no more than it
    // keeps, whatever the old cap said.
    let r = b.renewals(t0).pop().unwrap();
    assert_eq!((r.keep, r.need, r.want, r.growth), (2, 2, 2, false));
    assert_eq!(b.map[&k].admissible(t0, LEASE), 2);
    // The third request waits for the renewal instead of taking the
    // units the store is about to give to another node.
    assert!(matches!(take(&mut b, &k, 6, t0, None, 0), Take::Wait(_)));
    b.waited(&k);
    // The answer is lost: the node keeps to what it sent.
    b.failed(&k, &r, t0);
    assert_eq!(b.map[&k].cap, 2);
    // And requests beyond it back off as the store's failure, not the
    // limit's.
    assert!(matches!(take(&mut b, &k, 6, t0, None, 0), Take::Refused(Why::Down)));
    let later = t0 + CLAIM_BACKOFF;
    assert!(matches!(take(&mut b, &k, 6, later, None, 0), Take::Claim(..)));
}

#[test]
fn an_answer_for_an_older_claim_changes_nothing_and_a_stale_one_keeps_the_shrink() {
    let t0 = Instant::now();
    let (mut b, k) = granted(4, t0);
    let r = b.renewals(t0).pop().unwrap();
    assert_eq!((r.keep, r.need), (0, 1), "one wanted since, none in flight");
    // An answer of another seq (a claim given up on) is not this one.
    let mut other = answer(&r, 4);
    other.seq = r.seq - 1;
    let unrelated = Claim { seq: r.seq - 1, ..b.epochs(&[group()], t0).pop().unwrap() };
    b.answered(&k, &unrelated, &other, t0);
    assert!(b.map[&k].claiming.is_some(), "still out");
    b.answered(&k, &r, &Answer { stale: true, ..answer(&r, 4) }, t0);
    assert_eq!(b.map.get(&k).map(|x| x.cap), Some(0), "what was kept stands");
}

#[test]
fn a_share_admits_until_a_third_of_the_lease_before_its_trust_ends() {
    let t0 = Instant::now();
    let (mut b, k) = granted(2, t0);
    let last = t0 + admits_for(LEASE) - Duration::from_millis(1);
    assert!(matches!(take(&mut b, &k, 4, last, None, 0), Take::Taken(_)));
    // From then on a request it admits could outlive the share's trust
    // (nine tenths of the lease) by more than a third of the lease.
    assert_eq!(admits_for(LEASE), Duration::from_millis(1700));
    let past = t0 + admits_for(LEASE);
    assert!(matches!(take(&mut b, &k, 4, past, None, 0), Take::Claim(..)));
}

#[test]
fn with_the_store_down_the_policy_decides() {
    let t0 = Instant::now();
    let (mut b, k) = granted(1, t0);
    let share = Some(Down::Share(None));
    assert!(matches!(take(&mut b, &k, 4, t0, share, 0), Take::Taken(Within::Share)));
    assert!(matches!(take(&mut b, &k, 4, t0, share, 0), Take::Refused(Why::Down)));
    assert!(matches!(take(&mut b, &k, 4, t0, Some(Down::Refuse), 0), Take::Refused(Why::Down)));
    assert!(matches!(take(&mut b, &k, 4, t0, Some(Down::Local), 0), Take::Taken(Within::Local)));
    // A budget it holds no share of: the safe share, counted with what is
    // in flight.
    let other = key("t");
    let safe = Some(Down::Share(Some(2)));
    for _ in 0..2 {
        assert!(matches!(b.take(&other, Kind::Session, &group(), 6, t0, safe, 0), Take::Taken(Within::Safe)));
    }
    assert!(matches!(b.take(&other, Kind::Session, &group(), 6, t0, safe, 0), Take::Refused(Why::Down)));
    // A budget whose share is still trusted uses the share, not the safe
    // share on top of it.
    let trusted = take(&mut b, &k, 4, t0, safe, 0);
    assert!(matches!(trusted, Take::Refused(Why::Down)), "{trusted:?}");
}

#[test]
fn a_renewal_asks_for_what_was_used_and_while_others_want_more_only_what_is_in_use() {
    let t0 = Instant::now();
    let (mut b, k) = granted(6, t0);
    for _ in 0..5 {
        let _ = take(&mut b, &k, 6, t0, None, 0);
    }
    for _ in 0..3 {
        b.give_back(&k, t0);
    }
    // Uncontended: what was used since the last renewal (5) asked for;
    // only what is in flight kept while the renewal is out.
    let r = b.renewals(t0).pop().unwrap();
    assert_eq!((r.in_use, r.keep, r.need, r.want), (2, 2, 5, 5));
    // The store says others want more than they hold.
    b.answered(&k, &r, &Answer { others_demand: 2, ..answer(&r, 5) }, t0);
    let r = b.renewals(t0).pop().unwrap();
    assert_eq!((r.in_use, r.keep, r.need, r.want), (2, 2, 2, 2), "what is in use is kept, and asked for");
}

#[test]
fn while_others_want_more_a_unit_given_back_goes_back_to_the_store() {
    let t0 = Instant::now();
    let (mut b, k) = granted(3, t0);
    let r = b.renewals(t0).pop().unwrap();
    b.answered(&k, &r, &Answer { others_demand: 1, ..answer(&r, 3) }, t0);
    b.map.get_mut(&k).unwrap().sent = Some(t0);
    for _ in 0..3 {
        assert!(matches!(take(&mut b, &k, 6, t0, None, 0), Take::Taken(_)));
    }
    let c = b.give_back(&k, t0).expect("a release");
    assert_eq!((c.in_use, c.keep, c.need, c.want, c.growth), (2, 2, 2, 2, false));
    // Uncontended, nothing goes back before the renewal.
    let (mut b, k) = granted(3, t0);
    let _ = take(&mut b, &k, 6, t0, None, 0);
    assert!(b.give_back(&k, t0).is_none());
}

#[test]
fn a_request_that_stops_waiting_or_gives_back_leaves_nothing_behind() {
    let (mut b, k, t0) = (budgets(), key("s"), Instant::now());
    let Take::Claim(c, _) = take(&mut b, &k, 2, t0, None, 0) else { panic!() };
    assert!(matches!(take(&mut b, &k, 2, t0, None, 0), Take::Wait(_)));
    // Both requests are reset while they wait: their guards say so.
    b.waited(&k);
    b.waited(&k);
    assert_eq!(b.map[&k].pending, 0);
    // The claim's answer, when it comes, stands; a renewal gives back the
    // unused share, and the budget is forgotten.
    b.answered(&k, &c, &answer(&c, 1), t0);
    let r = b.renewals(t0).pop().unwrap();
    assert_eq!((r.keep, r.need, r.want), (0, 1, 1), "what the resets wanted, for one renewal");
    b.answered(&k, &r, &answer(&r, 1), t0);
    let r = b.renewals(t0).pop().unwrap();
    assert_eq!((r.keep, r.need), (0, 0));
    b.answered(&k, &r, &answer(&r, 0), t0);
    assert!(b.map.is_empty(), "{:?}", b.map);
}

#[test]
fn fields_seen_unchanged_for_a_lease_are_named_gone() {
    let t0 = Instant::now();
    let (mut b, k) = granted(1, t0);
    let r = b.renewals(t0).pop().unwrap();
    let seen = vec![("a.1".to_owned(), 5), ("b.2".to_owned(), 9)];
    b.answered(&k, &r, &Answer { seen: seen.clone(), ..answer(&r, 1) }, t0);
    // b renews (a new seq); a does not.
    let t1 = t0 + LEASE / 2;
    let r = b.renewals(t1).pop().unwrap();
    assert!(r.gone.is_empty());
    let seen = vec![("a.1".to_owned(), 5), ("b.2".to_owned(), 10)];
    b.answered(&k, &r, &Answer { seen, ..answer(&r, 1) }, t1);
    let r = b.renewals(t0 + LEASE).pop().unwrap();
    assert_eq!(r.gone, [("a.1".to_owned(), 5)]);
}

#[test]
fn a_quiet_ends_only_once_this_node_has_seen_that_very_quiet_for_a_lease() {
    let (mut b, t0) = (budgets(), Instant::now());
    let g = group();
    b.saw_epoch(&g, Some("11.1"), t0);
    assert!(b.quiet_due(t0 + LEASE / 2).is_empty());
    // The same quiet seen again: its start stands.
    b.saw_epoch(&g, Some("11.1"), t0 + LEASE / 2);
    assert_eq!(b.quiet_due(t0 + LEASE), std::slice::from_ref(&g));
    assert_eq!(b.epochs(std::slice::from_ref(&g), t0 + LEASE)[0].unquiet.as_deref(), Some("11.1"));
    // Another quiet (a store that lost its data again, with a new nonce):
    // seen anew.
    b.saw_epoch(&g, Some("12.1"), t0 + LEASE);
    assert!(b.quiet_due(t0 + LEASE).is_empty());
    assert_eq!(b.epochs(std::slice::from_ref(&g), t0 + LEASE)[0].unquiet, None);
    b.saw_epoch(&g, None, t0 + LEASE);
    assert!(b.quiet.is_empty());
}

#[test]
fn a_growth_refused_while_quiet_is_the_stores_doing() {
    let (mut b, k, t0) = (budgets(), key("s"), Instant::now());
    let Take::Claim(c, _) = take(&mut b, &k, 2, t0, None, 0) else { panic!() };
    b.answered(&k, &c, &Answer { quiet: Some("3.1".into()), ..answer(&c, 0) }, t0);
    b.waited(&k);
    assert!(matches!(take(&mut b, &k, 2, t0, None, 0), Take::Refused(Why::Down)));
}

#[test]
fn a_dead_field_is_named_gone_however_rarely_the_budget_is_asked_for() {
    // A request now and then (rarer than renewals), each refused: the
    // dead node's field, seen at the first claim, is watched past the
    // budget's idleness and named gone a lease after it was first seen.
    let t0 = Instant::now();
    let (mut b, k) = (budgets(), key("s"));
    let dead = vec![("dead.1".to_owned(), 12)];
    let reply = |b: &mut Budgets, c: &Claim, t: Instant| {
        let seen = if c.gone.is_empty() { dead.clone() } else { Vec::new() };
        let others = if c.gone.is_empty() { 40 } else { 0 };
        b.answered(&k, c, &Answer { seen, others, ..answer(c, 0) }, t);
    };
    let (period, every) = (LEASE / 3, Duration::from_millis(1700));
    let mut named = None;
    let mut ms = 0;
    while ms < 4 * LEASE.as_millis() as u64 && named.is_none() {
        let t = t0 + Duration::from_millis(ms);
        if ms % every.as_millis() as u64 == 0
            && let Take::Claim(c, _) = take(&mut b, &k, 40, t, None, 0)
        {
            assert!(c.gone.is_empty());
            reply(&mut b, &c, t);
            b.waited(&k);
        }
        if ms % period.as_millis() as u64 == 0 {
            for r in b.renewals(t) {
                if !r.gone.is_empty() {
                    assert_eq!(r.gone, dead);
                    named = Some(t - t0);
                }
                reply(&mut b, &r, t);
            }
        }
        ms += 100;
    }
    let named = named.expect("the dead field was never named gone");
    assert!(named >= LEASE && named <= LEASE + period, "{named:?}");
    // Ended, nothing is left to watch: the budget is forgotten.
    assert!(b.map.is_empty());
}

#[test]
fn an_idle_budget_watches_live_fields_a_while_then_is_forgotten() {
    let t0 = Instant::now();
    let (mut b, k) = granted(1, t0);
    let mut t = t0;
    let mut seq = 5;
    for _ in 0..20 {
        t += LEASE / 3;
        let Some(r) = b.renewals(t).pop() else { break };
        // The other node renews (a new sequence number each time): alive.
        seq += 1;
        b.answered(&k, &r, &Answer { seen: vec![("live.1".to_owned(), seq)], ..answer(&r, 0) }, t);
    }
    assert!(b.map.is_empty(), "still watched after {:?}", t - t0);
    // Idle from the first renewal: watched a lease and a third more.
    assert!(t - t0 <= LEASE * 2 + LEASE / 3, "{:?}", t - t0);
}
