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
pub mod rng;
pub mod scenario;
pub mod store;

pub mod world;

use crate::{
    scenario::Scenario,
    world::{MakeNode, Outcome, World},
};

/// Which fleet runs: the one before the simulation, or today's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    Before,
}

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
    match version {
        Version::Before => {
            let script = lua::Script::new("claim.lua", before::SCRIPT).expect("the script compiles");
            let make: &MakeNode = &|sc, i, inc, id| Box::new(before::node::Before::new(sc, i, inc, id));
            // Its manual: a share covers requests shorter than the lease.
            World::new(sc, (1, 1), script, make, options.tracing).ignoring(&options.ignore).run()
        }
    }
}
