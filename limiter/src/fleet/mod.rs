//! Fleet-wide limits: in-flight requests per session and of web clients
//! counted across every daemon that names the same store (Redis, or a
//! Redis Cluster) and `fleet.name`.
//!
//! **Permits with leases.** A budget is one sorted set in the store; each
//! request in flight anywhere is one member, `<node>.<incarnation>.<n>`,
//! scored by when its lease ends on the store's clock (no node's clock is
//! read). Taking a permit is one script (`acquire.lua`, one key, so one
//! hash slot: it runs unchanged on a cluster): drop the members whose
//! lease ended, count, add one if below the limit. A node renews the
//! leases of what it holds every third of `fleet.leaseMs`
//! (`renew.lua`, which adds back what the store lost); a node that dies
//! stops renewing and its members end with their lease. Giving a permit
//! back is a `ZREM`, sent off the request's path by a task that batches
//! whatever is given back while the previous batch is out.
//!
//! **Keys.** `limiter:{<name>:s:<h>}` for a session, where `<h>` is 128
//! bits of HMAC-SHA256 under `fleet.hashKeyFile` of the normalised
//! `Authorization` value (as the local limit keys it): the store never
//! holds a token, and every node computes the same key. `limiter:{<name>:web}`
//! for web clients. Each key is its own hash slot, so sessions spread
//! over a cluster's masters.
//!
//! **Identity.** `<node>` is a hash of the host name, `kernel.pinPath` and
//! `http.listen`: the same daemon restarted is the same node. For one
//! lease after it starts, its asks also drop the members of its previous
//! incarnation (a `kill -9` leaves them behind), so a restart does not
//! count twice; not during a handover, when the previous incarnation is
//! alive and its members are real.
//!
//! **Store down.** An ask not answered within `fleet.timeoutMs`, or
//! failing, marks the store down: said once in the log, in
//! `limiter_fleet_store_up`, and no request asks until a probe (from
//! 100 ms, backing off to a second) finds it answering again. Meanwhile
//! `fleet.onStoreDown` decides: `local` admits on the node's own limits
//! (the permits are still held here, and published by the renewal that
//! follows the store's return), `refuse` answers 503 `fleet_down`.

mod permits;
mod store;
mod tasks;

use std::sync::Arc;

pub use self::permits::{Fleet, Held, Kind, SessionView, Snapshot, session_key_for};
use crate::config::FleetConfig;

/// Starts the fleet's limits on this node, when `fleet.store` is set:
/// connects (within a couple of seconds; a store that is not there yet is
/// down, and the probe keeps trying) and starts the releases, renewals
/// and probe. `identity` names this node (the same after a restart);
/// `handover` says whether another daemon serves the gate now.
pub async fn start(
    config: &FleetConfig,
    identity: &str,
    handover: Box<dyn Fn() -> bool + Send + Sync>,
) -> Option<Arc<Fleet>> {
    let (fleet, releases) = Fleet::new(config, identity, handover)?;
    fleet.connect().await;
    tokio::spawn(tasks::run(Arc::downgrade(&fleet), releases));
    Some(fleet)
}
