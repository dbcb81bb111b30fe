//! Fleet-wide limits: in-flight requests per session and of web clients
//! counted across every daemon that names the same store (Redis, a Redis
//! Cluster, or a Redis behind Sentinel) and `fleet.name`.
//!
//! **Shares.** A budget is one hash in the store, one field per node
//! process holding a *share* of its limit. The store grants shares
//! atomically (`claim.lua`, one script on one hash slot: it runs
//! unchanged on a cluster) from what the live fields leave; a request
//! within its node's share is admitted at once, without a round trip, and
//! given back here alone ([`shares`]). A node asks for more when its share
//! is full (one round trip, for what is in use and waiting), and a node
//! refused records its demand, so that holders shrink toward their part
//! of the limit at their next claim; while other nodes want more, a
//! holder gives back what its requests leave as they end. Every share is
//! renewed every third of `fleet.leaseMs` ([`tasks`]).
//!
//! **No clock but the nodes' own.** A share is trusted by its node until
//! its claim's send time plus nine tenths of the lease, and admits only
//! requests it covers until then (those shorter than a third of the
//! lease); the store ends a field only when another node has seen it
//! unchanged for a whole lease, by that node's monotonic clock. The
//! store's clock is never read, and a key's time to live ([`KEY_TTL`],
//! an hour) only collects the budgets of nodes that all stopped at once.
//!
//! **A store that lost data** (a restart, a flush, an eviction, a
//! failover to a replica that missed writes) is told by the epoch of each
//! budget's group (`<group>:epoch`: the run id of the server whose data
//! it is), or by a node that holds a share the store does not: the group
//! goes quiet — no share grows, shares are republished — until a node has
//! seen it quiet for a lease.
//!
//! **Keys.** `limiter:{<name>:s:<g>}:<h>` for a session, where `<h>` is
//! 128 bits of HMAC-SHA256 under `fleet.hashKeyFile` of the normalised
//! `Authorization` value (as the local limit keys it) and `<g>` its first
//! hex digit (sixteen groups, spread over a cluster's masters);
//! `limiter:{<name>:web}` for web clients; `limiter:{<tag>}:epoch` for
//! each group; `limiter:{<name>}:nodes` for the live nodes;
//! `limiter:{<name>}:hash-key-fingerprint` for a keyed hash of a fixed
//! text under the fleet's hash key (a node whose key differs refuses to
//! start).
//!
//! **Identity.** A process's field is `<node>.<incarnation>`: `<node>` a
//! hash of the machine's id, `kernel.pinPath` and `http.listen`, the
//! incarnation 64 random bits. No process ever touches another's field
//! but to end it once seen silent for a lease.
//!
//! **Store down** ([`health`]): after three failed or late claims for
//! requests in a row, or at least five and half of a second's; not after
//! one late answer (that request is refused `fleet_down`). A renewal round
//! that fails, or a first connection that does, marks it down at once.
//! Said once in the log and in `limiter_fleet_store_up`; then no request
//! claims until the probe finds the store answering and the shares are
//! republished. Meanwhile `fleet.onStoreDown` decides: `share` admits
//! within the share each node holds while it admits, and, once the store
//! has been down for a lease, up to the safe share `floor(limit / N)` of a
//! budget it holds none of ([`members`]); `refuse` answers 503
//! `fleet_down`; `local` admits on the node's own limits.

pub mod claim;
mod error;
pub mod health;
pub mod members;
mod permits;
pub mod shares;
mod store;
mod tasks;

use std::sync::Arc;

pub use self::{
    error::FleetError,
    permits::{
        Fleet, FleetUnits, KEY_TTL, SESSION_GROUPS, SessionView, Snapshot, epoch_of, epochs_for, members_for,
        refusal_holds, session_key_for, short_key, web_key_for,
    },
    shares::Kind,
};
use crate::config::FleetConfig;

/// Starts the fleet's limits on this node, when `fleet.store` is set:
/// connects (within a couple of seconds; a store that is not there yet is
/// down, and the probe keeps trying), checks the store is a primary and
/// the hash key the fleet's, and starts the renewals and probe. `node`
/// names this machine and daemon.
pub async fn start(config: &FleetConfig, node: &str) -> Result<Option<Arc<Fleet>>, FleetError> {
    let Some(fleet) = Fleet::new(config, node) else { return Ok(None) };
    fleet.connect().await?;
    tokio::spawn(tasks::run(Arc::downgrade(&fleet)));
    tokio::spawn(tasks::listen(Arc::downgrade(&fleet)));
    Ok(Some(fleet))
}

/// What `check-config` says of the store `config` names, if it can reach
/// it within a couple of seconds: whether it is a primary, and whether its
/// eviction policy could drop the fleet's keys. One line each; nothing is
/// written to the store.
pub async fn inspect(config: &FleetConfig) -> Vec<String> {
    let Some(url) = config.store.clone() else { return Vec::new() };
    let store = store::Store::new(url, config.password.as_ref().map(|p| p.0.clone()));
    let wait = std::time::Duration::from_secs(2);
    let mut conn = match store.reconnect(wait).await {
        Ok(conn) => conn,
        Err(e) => {
            return vec![format!("fleet store {}: not reachable from here now ({e})", store.describe())];
        }
    };
    let mut lines = Vec::new();
    match store.check_primary(&mut conn).await {
        Ok(()) => lines.push(format!("fleet store {}: answers as a primary", store.describe())),
        Err(e) => lines.push(format!("WARNING {e} (run exits 78)")),
    }
    if let Some(w) = store.eviction(&mut conn).await {
        lines.push(format!("WARNING {w}"));
    }
    lines
}

#[cfg(test)]
mod tests;
