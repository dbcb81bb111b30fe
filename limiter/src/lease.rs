//! A fleet share's lease, as fractions of `fleet.leaseMs`: how long a
//! node trusts its share, which requests that share covers whatever
//! fails, how long it admits requests. The fleet decides by these, the
//! configuration warns by them, the simulation checks by them
//! (docs/fleet.md, "Why the limit holds").

use std::time::Duration;

/// How long after its claim was sent a share is trusted: nine tenths of
/// the lease (the store keeps it a lease at least; a tenth is left for
/// clocks that run apart).
pub fn trusted_for(lease: Duration) -> Duration {
    lease * 9 / 10
}

/// The requests a share covers whatever fails: those shorter than a
/// third of the lease.
pub fn covers(lease: Duration) -> Duration {
    lease / 3
}

/// How long after its claim was sent a share admits requests: its trust
/// less what it covers.
pub fn admits_for(lease: Duration) -> Duration {
    trusted_for(lease) - covers(lease)
}

/// How long a budget whose every field was given back keeps them, empty
/// (so that a node's older claim still on its way finds itself stale):
/// two leases.
pub fn given_back_for(lease: Duration) -> Duration {
    lease * 2
}
