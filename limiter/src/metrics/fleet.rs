//! `limiter_fleet_*`: the fleet-wide limits (`fleet.*`) on this node.

use super::Page;
use crate::{
    admission::{self, Refusal},
    fleet::{Fleet, Snapshot},
};

/// Families from the fleet's snapshot and round trips, and its refusals
/// as admission counted them (`pools`).
pub fn write(page: &mut Page, fleet: &Fleet, f: &Snapshot, pools: &admission::Snapshot) {
    page.family(
        "limiter_fleet_store_up",
        "gauge",
        "1 while the fleet's store answers, 0 while it is down (requests meet fleet.onStoreDown).",
    )
    .sample("limiter_fleet_store_up", &[], u8::from(f.up));
    page.histogram(
        "limiter_fleet_round_trip_seconds",
        "Time requests beyond their node's share waited for the store's answer to a claim.",
        fleet.round_trip(),
    );
    page.family("limiter_fleet_limit", "gauge", "The fleet-wide limit in force, by budget (0: none).")
        .sample("limiter_fleet_limit", &[("kind", "session")], f.session_limit)
        .sample("limiter_fleet_limit", &[("kind", "web")], f.web_limit);
    page.family(
        "limiter_fleet_permits",
        "gauge",
        "Requests in flight on this node that hold a unit of a fleet budget, by budget.",
    )
    .sample("limiter_fleet_permits", &[("kind", "session")], f.held_session)
    .sample("limiter_fleet_permits", &[("kind", "web")], f.held_web);
    page.family(
        "limiter_fleet_share",
        "gauge",
        "The shares of fleet budgets this node holds (requests within them need no round trip), by budget.",
    )
    .sample("limiter_fleet_share", &[("kind", "session")], f.share_session)
    .sample("limiter_fleet_share", &[("kind", "web")], f.share_web);
    page.family(
        "limiter_fleet_web_shares",
        "gauge",
        "The web clients' budget as every node's shares together, as the store last said (absent until it said).",
    );
    if let Some(n) = f.web_fleet {
        page.sample("limiter_fleet_web_shares", &[], n);
    }
    page.family("limiter_fleet_sessions", "gauge", "Sessions this node holds a share or a request of.")
        .sample("limiter_fleet_sessions", &[], f.tracked_sessions);
    page.family(
        "limiter_fleet_refused_total",
        "counter",
        "Requests answered 503 by a fleet limit, by reason (also in limiter_http_refused_total).",
    );
    for r in Refusal::ALL.iter().filter(|r| r.of_fleet()) {
        page.sample("limiter_fleet_refused_total", &[("reason", r.as_str())], pools.refused[*r as usize]);
    }
    page.family(
        "limiter_fleet_would_refuse_total",
        "counter",
        "Requests http.dryRun admitted that a fleet limit would have refused, by reason.",
    );
    for r in Refusal::ALL.iter().filter(|r| r.of_fleet()) {
        page.sample(
            "limiter_fleet_would_refuse_total",
            &[("reason", r.as_str())],
            pools.would_refuse[*r as usize],
        );
    }
    page.family(
        "limiter_fleet_claims_total",
        "counter",
        "Claims sent for requests beyond their node's share (one round trip each; requests that came while one was out waited for it).",
    )
    .sample("limiter_fleet_claims_total", &[], f.claims);
    page.family(
        "limiter_fleet_store_failures_total",
        "counter",
        "Claims and renewals the store failed or answered later than fleet.timeoutMs.",
    )
    .sample("limiter_fleet_store_failures_total", &[], f.store_failures);
    page.family(
        "limiter_fleet_admitted_unpublished_total",
        "counter",
        "Requests admitted on the node's limits alone while the store was down (fleet.onStoreDown = local).",
    )
    .sample("limiter_fleet_admitted_unpublished_total", &[], f.admitted_unpublished);
    page.family(
        "limiter_fleet_admitted_safe_total",
        "counter",
        "Requests admitted within the safe share (floor(limit / nodes)) of a budget this node held no share of, with the store refusing connections for a lease (fleet.onStoreDown = share).",
    )
    .sample("limiter_fleet_admitted_safe_total", &[], f.admitted_safe);
    page.family(
        "limiter_fleet_releases_total",
        "counter",
        "Claims that gave back what this node's requests left of a share while other nodes wanted more (off the requests' path).",
    )
    .sample("limiter_fleet_releases_total", &[], f.releases);
    page.family("limiter_fleet_renewals_total", "counter", "Renewal rounds of every share this node holds.")
        .sample("limiter_fleet_renewals_total", &[], f.renewals);
    page.family(
        "limiter_fleet_lease_lapsed_total",
        "counter",
        "Requests whose share's trust ended on this node while they ran (a pause, a partition, a store away), republished by the next claim.",
    )
    .sample("limiter_fleet_lease_lapsed_total", &[], f.lease_lapsed);
    page.family(
        "limiter_fleet_store_lost_data_total",
        "counter",
        "Times this node found the store without the fleet's data (a restart, a flush, a failover to a replica that missed writes, an eviction; and the fleet's first start): the group went quiet.",
    )
    .sample("limiter_fleet_store_lost_data_total", &[], f.store_lost_data);
    page.family(
        "limiter_fleet_quiet_groups",
        "gauge",
        "Budget groups this node sees quiet: the store lost data, no share of them grows until a node has seen it quiet for fleet.leaseMs.",
    )
    .sample("limiter_fleet_quiet_groups", &[], f.quiet_groups);
    page.family(
        "limiter_fleet_nodes",
        "gauge",
        "The fleet's live nodes (processes) as this node last saw them: the N of the safe share (absent before the store answered).",
    );
    if let Some(n) = f.nodes {
        page.sample("limiter_fleet_nodes", &[], n);
    }
    page.family(
        "limiter_fleet_lease_margin_seconds",
        "gauge",
        "The least trust left (this node's clock) on a share when the last renewal round was sent (absent before one).",
    );
    if let Some(ms) = f.lease_margin_ms {
        page.sample("limiter_fleet_lease_margin_seconds", &[], ms / 1000.0);
    }
}
