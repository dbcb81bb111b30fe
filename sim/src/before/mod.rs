//! The fleet as it was before this simulation existed (limiter at
//! `2a191dd`): its share logic, its store-down rule and its claim script,
//! kept here unchanged so that `limiter-sim --before` shows, on any
//! machine, what the simulation finds in it (docs/fleet.md, "How the
//! limit is checked"). Nothing of the daemon uses it.

pub mod health;
pub mod node;
pub mod shares;

/// Its claim script, as that revision loaded it.
pub const SCRIPT: &str = include_str!("claim.lua");
