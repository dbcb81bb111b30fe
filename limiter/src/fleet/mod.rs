//! Fleet-wide limits: in-flight requests per session and of web clients
//! counted across every daemon that names the same store (Redis, or a
//! Redis Cluster) and `fleet.name`.
//!
//! **Shares.** A budget is one hash in the store, one field per node that
//! holds a *share* of its limit, with the share's lease on the store's
//! clock (no node's clock is read there). The store grants shares
//! atomically (`claim.lua`, one key, so one hash slot: it runs unchanged
//! on a cluster) so that the shares of the live nodes never sum above the
//! limit, but for what a node still had in flight when its lease lapsed
//! (docs/fleet.md, "Why the limit holds"); a request within its node's share is
//! admitted at once, without a round trip, and given back here alone
//! ([`shares`]). A node asks for more when its share is full (one round
//! trip, for what is in use and waiting, plus a quarter while demand rises,
//! granted only while the budget is less than half used),
//! and a node refused records its demand, so that holders shrink toward a
//! fair part of the limit at their next renewal; a node gives back what it
//! has not used for a renewal period. Every share's lease is renewed every
//! third of `fleet.leaseMs` ([`tasks`]); a node that dies stops renewing
//! and its share ends with its lease.
//!
//! **Keys.** `limiter:{<name>:s:<h>}` for a session, where `<h>` is 128
//! bits of HMAC-SHA256 under `fleet.hashKeyFile` of the normalised
//! `Authorization` value (as the local limit keys it): the store never
//! holds a token, and every node computes the same key. `limiter:{<name>:web}`
//! for web clients. Each key is its own hash slot, so sessions spread
//! over a cluster's masters. `limiter:{<name>}:hash-key-fingerprint` holds
//! a keyed hash of a fixed text under the fleet's hash key: a node whose
//! key differs refuses to start.
//!
//! **Identity.** A node's field is `<node>.<incarnation>.`, `<node>` a
//! hash of the host name, `kernel.pinPath` and `http.listen`: the same
//! daemon restarted is the same node. For one lease and a third after it
//! starts, its claims also drop the fields of its previous incarnation (a
//! `kill -9` leaves one behind), so a restart does not count twice; not
//! during a handover, when the previous incarnation is alive.
//!
//! **Store down** ([`health`]): after three failed or late claims for
//! requests in a row, or at least five and half of a second's; not after
//! one late answer (that request is refused `fleet_down`). A renewal round
//! that fails, or a first connection that does, marks it down at once (a
//! share that cannot be renewed will lapse). Said once in the log and in
//! `limiter_fleet_store_up`; then no request claims until the probe finds
//! the store answering for the budgets and the shares are republished.
//! Meanwhile `fleet.onStoreDown` decides: `share` admits within the share
//! each node holds until a tenth of a lease before its lease would end (by
//! its own clock), `refuse` answers 503
//! `fleet_down`, `local` admits on the node's own limits.

mod health;
mod permits;
mod shares;
mod store;
mod tasks;

use std::sync::Arc;

pub use self::{
    permits::{Fleet, FleetError, FleetUnits, SessionView, Snapshot, session_key_for},
    shares::Kind,
};
use crate::config::FleetConfig;

/// Starts the fleet's limits on this node, when `fleet.store` is set:
/// connects (within a couple of seconds; a store that is not there yet is
/// down, and the probe keeps trying), checks the hash key against the
/// fleet's, and starts the renewals and probe. `identity` names this node
/// (the same after a restart); `handover` says whether another daemon
/// serves the gate now.
pub async fn start(
    config: &FleetConfig,
    identity: &str,
    handover: Box<dyn Fn() -> bool + Send + Sync>,
) -> Result<Option<Arc<Fleet>>, FleetError> {
    let Some(fleet) = Fleet::new(config, identity, handover) else { return Ok(None) };
    fleet.connect().await?;
    tokio::spawn(tasks::run(Arc::downgrade(&fleet)));
    Ok(Some(fleet))
}

#[cfg(test)]
mod tests;
