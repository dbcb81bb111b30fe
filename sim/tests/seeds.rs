//! A few seeds of the fleet's simulation, in the unit tests' build (the
//! test suite runs thousands, optimised: `cargo xtask simulate`): one per
//! fault set, today's fleet holding every guarantee; a hole planted by
//! hand found; the same seed replayed to the same trace.

use limiter_sim::{Options, PLANTS, Version, first_failure, rotation, run, scenario::FAMILIES, suite};

#[test]
fn todays_fleet_holds_on_a_seed_of_each_fault_set() {
    let n = rotation().len() as u64;
    let t = suite(Version::Now, 0, n);
    assert!(t.failures.is_empty(), "{:#?}", t.failures);
    assert!(t.admitted > 1000, "{t:?}");
}

#[test]
fn a_hole_planted_by_hand_is_found() {
    let plant = PLANTS.iter().position(|p| p.0.contains("while the store is quiet")).expect("a plant");
    let found = first_failure(Version::Planted(plant), &FAMILIES, 20);
    assert!(found.is_some(), "{}: not found in 20 seeds", PLANTS[plant].0);
}

#[test]
fn a_seed_replays_exactly() {
    let families = ["partition", "loss"];
    let options = Options { tracing: true, ..Options::default() };
    let (_, a) = run(Version::Now, 5, &families, &options);
    let (_, b) = run(Version::Now, 5, &families, &options);
    assert!(a.trace.len() > 1000);
    assert_eq!(a.trace, b.trace);
}
