//! A deterministic simulation of the fleet's shares (FoundationDB's
//! simulation and TigerBeetle's VOPR are the models): several nodes, each
//! running limiter's real share logic, and one store running limiter's
//! real claim script in an embedded Lua 5.1, driven by a seeded
//! scheduler over virtual time. Requests arrive and end at random, claims
//! and answers are delayed, lost or held by partitions and answered
//! late, streams are reset while they wait, nodes are paused, killed and
//! restarted or share an identity, the store restarts empty, is flushed,
//! fails over to a replica missing a suffix of its writes, has its clock
//! stepped and freezes. [`check`] holds every step to the manual's
//! guarantees; a failing seed replays exactly, with its trace.

pub mod before;
pub mod check;
pub mod lua;
pub mod node;
pub mod rng;
pub mod scenario;
pub mod store;

pub mod world;

use std::time::Duration;

use crate::{
    check::Violation,
    scenario::{FAMILIES, Scenario},
    world::{MakeNode, Outcome, World},
};

/// Which fleet runs: today's, today's with a hole planted by hand in its
/// script ([`PLANTS`]), or the one before the simulation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    Now,
    Planted(usize),
    Before,
}

/// Holes planted by hand in today's claim script: what each breaks, and
/// the text it replaces with what. The simulation must find every one.
pub const PLANTS: [(&str, &str, &str); 5] = [
    (
        "the store does not count what a node has in flight",
        "local share = math.max(in_use, keep, cap)",
        "local share = math.max(keep, cap)",
    ),
    ("a store that lost the fleet's data never goes quiet", "if e[1] ~= id then", "if false then"),
    ("shares grow while the store is quiet", "cap = math.min(keep, want)", "cap = want"),
    (
        "a field ends whatever sequence number the node saw",
        "(f ~= me and gone[f] == s)",
        "(f ~= me and gone[f] ~= nil)",
    ),
    ("a dead node's field is never ended", "(f ~= me and gone[f] == s)", "false"),
];

/// How to run seeds.
#[derive(Clone, Debug, Default)]
pub struct Options {
    pub tracing: bool,
    /// Violation kinds to look past.
    pub ignore: Vec<String>,
}

/// Runs the scenario of `seed` with faults from `families`.
pub fn run(version: Version, seed: u64, families: &[&str], options: &Options) -> (Scenario, Outcome) {
    let sc = Scenario::generate(seed, families);
    let outcome = run_scenario(version, &sc, options);
    (sc, outcome)
}

pub fn run_scenario(version: Version, sc: &Scenario, options: &Options) -> Outcome {
    // The manual's bound: a share covers the requests shorter than this
    // whatever fails (limiter's own rule, not restated).
    let cover = limiter::lease::covers(Duration::from_millis(sc.lease_ms)).as_micros() as u64;
    match version {
        Version::Now | Version::Planted(_) => {
            let source = match version {
                Version::Planted(i) => {
                    let (_, from, to) = PLANTS[i];
                    assert!(limiter::fleet::claim::SCRIPT.contains(from), "plant {i}: the script changed");
                    limiter::fleet::claim::SCRIPT.replace(from, to)
                }
                _ => limiter::fleet::claim::SCRIPT.to_owned(),
            };
            let script = lua::Script::new("claim.lua", &source).expect("the script compiles");
            let make: &MakeNode = &|sc, i, inc, id| Box::new(node::Node::new(sc, i, inc, id));
            World::new(sc, cover, script, make, options.tracing).ignoring(&options.ignore).run()
        }
        Version::Before => {
            let script = lua::Script::new("claim.lua", before::SCRIPT).expect("the script compiles");
            let make: &MakeNode = &|sc, i, inc, id| Box::new(before::node::Before::new(sc, i, inc, id));
            // Its manual: a share covers requests shorter than the lease.
            World::new(sc, sc.lease_us(), script, make, options.tracing).ignoring(&options.ignore).run()
        }
    }
}

/// The fault families a suite rotates through: none, each alone, all.
pub fn rotation() -> Vec<Vec<&'static str>> {
    let mut r = vec![Vec::new()];
    r.extend(FAMILIES.iter().map(|f| vec![*f]));
    r.push(FAMILIES.to_vec());
    r
}

/// A seed that failed: its faults, what it broke.
#[derive(Clone, Debug)]
pub struct Failure {
    pub seed: u64,
    pub faults: String,
    pub violation: Violation,
}

/// What a run of many seeds saw.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    pub seeds: u64,
    pub requests: u64,
    pub admitted: u64,
    pub false_refusals: u64,
    pub failures: Vec<Failure>,
}

/// The faults' name as `--faults` takes it.
pub fn faults_name(families: &[&str]) -> String {
    match families.len() {
        0 => "none".into(),
        n if n == FAMILIES.len() => "all".into(),
        _ => families.join(","),
    }
}

/// Runs `seeds` seeds from `from`, the i-th with the i-th faults of the
/// [`rotation`].
pub fn suite(version: Version, from: u64, seeds: u64) -> Tally {
    let rotation = rotation();
    let mut t = Tally::default();
    for seed in from..from + seeds {
        let families = &rotation[(seed % rotation.len() as u64) as usize];
        let (_, out) = run(version, seed, families, &Options::default());
        t.seeds += 1;
        t.requests += out.requests;
        t.admitted += out.admitted;
        t.false_refusals += out.false_refusals;
        if let Some(v) = out.violations.into_iter().next() {
            t.failures.push(Failure { seed, faults: faults_name(families), violation: v });
        }
    }
    t
}

/// The false-refusal measure of docs/fleet.md ([`Scenario::moving`]) over
/// `seeds` seeds: refused by the limit while the fleet had room, of every
/// request, and the requests.
pub fn moving(
    version: Version,
    one_way_us: u64,
    period: Option<Duration>,
    seeds: u64,
) -> (f64, u64, Vec<Violation>) {
    let (mut refused, mut requests, mut violations) = (0, 0, Vec::new());
    for seed in 0..seeds {
        let sc = Scenario::moving(seed, one_way_us, period);
        let out = run_scenario(version, &sc, &Options::default());
        refused += out.false_refusals;
        requests += out.requests;
        violations.extend(out.violations);
    }
    (refused as f64 / requests.max(1) as f64, requests, violations)
}

/// The first of `seeds` seeds, each with the fault set the suite gives it
/// ([`rotation`]), on which `version` fails: the seed, its faults, what
/// it broke.
pub fn first_failure_in_rotation(version: Version, seeds: u64) -> Option<(u64, String, Violation)> {
    let rotation = rotation();
    (0..seeds).find_map(|seed| {
        let families = &rotation[(seed % rotation.len() as u64) as usize];
        let (_, out) = run(version, seed, families, &Options::default());
        out.violations.into_iter().next().map(|v| (seed, faults_name(families), v))
    })
}

/// The first of `seeds` seeds with faults from `families` whose run
/// breaks a guarantee, and what it broke.
pub fn first_failure(version: Version, families: &[&str], seeds: u64) -> Option<(u64, Violation)> {
    (0..seeds).find_map(|seed| {
        let (_, out) = run(version, seed, families, &Options::default());
        out.violations.into_iter().next().map(|v| (seed, v))
    })
}
