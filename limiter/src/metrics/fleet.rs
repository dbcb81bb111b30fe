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
        "Time a request waited for the store's answer to its ask for fleet permits.",
        fleet.round_trip(),
    );
    page.family("limiter_fleet_limit", "gauge", "The fleet-wide limit in force, by budget (0: none).")
        .sample("limiter_fleet_limit", &[("kind", "session")], f.session_limit)
        .sample("limiter_fleet_limit", &[("kind", "web")], f.web_limit);
    page.family("limiter_fleet_permits", "gauge", "Fleet permits this node holds, by budget.")
        .sample("limiter_fleet_permits", &[("kind", "session")], f.held_session)
        .sample("limiter_fleet_permits", &[("kind", "web")], f.held_web);
    page.family(
        "limiter_fleet_web_in_flight",
        "gauge",
        "Web-client requests in flight across the fleet, as the store last said (absent until it said).",
    );
    if let Some(n) = f.web_fleet {
        page.sample("limiter_fleet_web_in_flight", &[], n);
    }
    page.family("limiter_fleet_sessions", "gauge", "Sessions this node holds a fleet permit of.").sample(
        "limiter_fleet_sessions",
        &[],
        f.tracked_sessions,
    );
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
        "limiter_fleet_asks_total",
        "counter",
        "Requests that asked the store for fleet permits (one round trip each).",
    )
    .sample("limiter_fleet_asks_total", &[], f.asks);
    page.family(
        "limiter_fleet_store_failures_total",
        "counter",
        "Asks, releases and renewals the store failed or did not answer in time.",
    )
    .sample("limiter_fleet_store_failures_total", &[], f.store_failures);
    page.family(
        "limiter_fleet_admitted_unpublished_total",
        "counter",
        "Requests admitted on the node's limits alone while the store was down (fleet.onStoreDown = local).",
    )
    .sample("limiter_fleet_admitted_unpublished_total", &[], f.admitted_unpublished);
    page.family("limiter_fleet_renewals_total", "counter", "Renewals of every lease this node holds.")
        .sample("limiter_fleet_renewals_total", &[], f.renewals);
    page.family("limiter_fleet_releases_total", "counter", "Fleet permits given back to the store.").sample(
        "limiter_fleet_releases_total",
        &[],
        f.releases,
    );
}
