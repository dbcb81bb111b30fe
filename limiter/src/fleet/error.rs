//! Why the fleet's limits cannot start (the daemon exits 78: the
//! configuration names a store or a key file that cannot work).

/// Why the fleet's limits cannot start.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error(
        "fleet.hashKeyFile: this node's hash key is not the fleet's (fleet `{name}` on {store} holds the fingerprint {theirs}, this key's is {ours}): every node of a fleet must read the same key file, or sessions would be counted under two keys"
    )]
    HashKey { name: String, store: String, theirs: String, ours: String },
    #[error(
        "fleet.store = {store}: {what}, not a Redis primary: the fleet's counts must be written where every node reads them (name the primary, redis+sentinel://… for a Sentinel, or redis+cluster://… for a cluster)"
    )]
    NotPrimary { store: String, what: String },
}
