//! The fleet's work off the requests' path: the renewal of every share
//! this node holds, every third of `fleet.leaseMs` on a timer of its own
//! (nothing else the node does can delay it: a round starts when it is due
//! and its claims go out together), and, while the store is down, the
//! probe that finds it back.
//!
//! A renewal round is a claim for each budget of what was used since the
//! last one (at least what is in flight): it extends the share's trust,
//! gives back what was not used, takes what was wanted and refused if
//! there is room now, republishes a share the store lost, and ends the
//! fields of nodes seen silent for a lease. With it go this node's field
//! among the fleet's live nodes, and the end of every quiet this node has
//! seen for a lease. A round sent later than a third of the lease past its
//! time is logged; the least trust left when a round was sent is
//! `limiter_fleet_lease_margin_seconds`.
//!
//! The probe finds the store "up" only when it answers as a primary, for
//! the budgets themselves (on a cluster, their slots' masters), then
//! reads every group's epoch and republishes every share (a renewal
//! round), and only then marks the store up: no request of this node
//! claims from a store that does not hold this node's shares yet.

use std::{
    sync::{Arc, Weak, atomic::Ordering},
    time::Duration,
};

use tokio::{task::JoinSet, time::Instant};

use super::permits::{Fleet, Sent};

/// The probe's first wait after the store was found down, and its longest
/// (never more than a third of the lease: a node using the safe share
/// finds a store that came back, and republishes, before the store's
/// quiet ends: a lease after any node saw it back).
const PROBE_FIRST: Duration = Duration::from_millis(100);
const PROBE_MAX: Duration = Duration::from_secs(1);

fn probe_max(lease: Duration) -> Duration {
    PROBE_MAX.min(lease / 3)
}
/// How long connecting may take in a probe.
const CONNECT: Duration = Duration::from_secs(1);
/// Budgets a probe asks about at most.
const PROBED_KEYS: usize = 16;

/// Runs until the fleet is dropped.
pub(super) async fn run(fleet: Weak<Fleet>) {
    let Some((period, probe_now)) = fleet.upgrade().map(|f| (f.lease / 3, f.probe_now.clone())) else {
        return;
    };
    let mut backoff = PROBE_FIRST.min(probe_max(period * 3));
    let mut due = Instant::now() + period;
    loop {
        let Some(f) = fleet.upgrade() else { return };
        if f.up.load(Ordering::Relaxed) {
            backoff = PROBE_FIRST.min(probe_max(period * 3));
            drop(f);
            tokio::select! {
                () = tokio::time::sleep_until(due) => {}
                () = probe_now.notified() => continue,
            }
            let Some(f) = fleet.upgrade() else { return };
            let late = Instant::now().saturating_duration_since(due);
            if late > period {
                tracing::warn!(late_ms = late.as_millis() as u64, "fleet: a renewal round went out late");
            }
            due += period;
            if due < Instant::now() {
                due = Instant::now() + period;
            }
            f.renew_all().await;
            continue;
        }
        drop(f);
        tokio::time::sleep(backoff).await;
        let Some(f) = fleet.upgrade() else { return };
        if f.probe().await && f.read_epochs(true).await && f.renew_all().await {
            f.health.reset(std::time::Instant::now());
            f.came_up();
            tracing::info!(store = %f.store.describe(), "fleet store answers again; this node's shares are republished");
            due = Instant::now() + period;
        } else {
            backoff = (backoff * 2).min(probe_max(period * 3));
        }
    }
}

/// Listens, while the fleet lives, for the budgets other nodes want more
/// of than the store could give them (`claim.lua` publishes them), and
/// gives back at once what this node holds of them beyond its requests.
/// A lost subscription is made again; meanwhile the renewals do it, a
/// renewal period later.
pub(super) async fn listen(fleet: Weak<Fleet>) {
    use futures_util::StreamExt as _;
    loop {
        let Some(f) = fleet.upgrade() else { return };
        let (store, channel) = (f.store_for_listening(), f.wanted_channel());
        drop(f);
        match store.subscribe(&channel, CONNECT).await {
            Ok(mut stream) => {
                while let Some(msg) = stream.next().await {
                    let Some(f) = fleet.upgrade() else { return };
                    if let Ok(key) = msg.get_payload::<String>() {
                        f.wanted(&key);
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "fleet: no subscription to the budgets wanted"),
        }
        tokio::time::sleep(PROBE_MAX).await;
    }
}

impl Fleet {
    /// Whether the store answers: a new connection to a primary (the
    /// hash key checked again), and an answer within `fleet.timeoutMs`
    /// (50 ms at least) for each budget this node holds (up to
    /// [`PROBED_KEYS`]), or a `PING`.
    async fn probe(&self) -> bool {
        let mut conn = match self.store.reconnect(CONNECT).await {
            Ok(conn) => conn,
            Err(e) => {
                tracing::debug!(error = %e, "fleet: probe: no connection to the store");
                self.tried_to_connect(e.is_connection_refusal());
                return false;
            }
        };
        self.tried_to_connect(false);
        if let Err(e) = self.store.check_primary(&mut conn).await {
            tracing::error!("{e}");
            return false;
        }
        if let Err(e) = self.check_fingerprint(&mut conn).await {
            tracing::error!("{e}");
            return false;
        }
        let keys: Vec<Arc<str>> = {
            let mut keys: Vec<Arc<str>> = self.lock().map.keys().cloned().collect();
            keys.sort();
            keys.truncate(PROBED_KEYS);
            keys
        };
        let wait = self.timeout().max(PROBE_FIRST / 2);
        let mut set = JoinSet::new();
        if keys.is_empty() {
            let mut conn = conn.clone();
            set.spawn(async move { conn.query::<String>(&redis::cmd("PING")).await.map(drop) });
        }
        for key in keys {
            let mut conn = conn.clone();
            set.spawn(async move { conn.query::<i64>(redis::cmd("PTTL").arg(&*key)).await.map(drop) });
        }
        let answered =
            matches!(tokio::time::timeout(wait, set.join_all()).await, Ok(r) if r.iter().all(Result::is_ok));
        if !answered {
            tracing::debug!(
                wait_ms = wait.as_millis() as u64,
                "fleet: probe: the store did not answer in time"
            );
        }
        answered
    }

    /// One renewal round: a claim for each budget this node holds or uses,
    /// this node's field among the live nodes, and the end of the quiets
    /// seen for a lease, all at once; `true` when the store answered every
    /// one.
    pub(super) async fn renew_all(self: &Arc<Self>) -> bool {
        self.renew(false).await
    }

    /// [`Self::renew_all`]; `leaving`: the node stops, and its field
    /// among the live nodes goes.
    pub(super) async fn renew(self: &Arc<Self>, leaving: bool) -> bool {
        if self.store.conn().is_none() {
            return false;
        }
        let now = std::time::Instant::now();
        let (mut claims, member_seq) = {
            let mut budgets = self.lock();
            let claims = budgets.renewals(now);
            let due = budgets.quiet_due(now);
            let epochs = budgets.epochs(&due, now);
            let seq = (budgets.next_seq(), budgets.next_nonce());
            (claims.into_iter().chain(epochs).collect::<Vec<_>>(), seq)
        };
        if let Some(margin) = claims.iter().filter_map(|c| c.margin).min() {
            self.stats.margin_us.store(margin.as_micros() as u64, Ordering::Relaxed);
        }
        let members = self.members_key();
        let member = self.members.lock().unwrap_or_else(std::sync::PoisonError::into_inner).claim(
            members.0,
            members.1,
            member_seq.0,
            member_seq.1,
            leaving,
            now,
        );
        let mut set = JoinSet::new();
        {
            let fleet = self.clone();
            set.spawn(async move { fleet.renew_membership(member).await });
        }
        for claim in claims.drain(..) {
            let fleet = self.clone();
            set.spawn(async move { fleet.claim_and_apply(claim, Sent::Renewal).await });
        }
        let all = set.join_all().await.into_iter().all(|ok| ok);
        if all {
            self.stats.renewals.fetch_add(1, Ordering::Relaxed);
        } else {
            self.went_down("renewing: the store did not answer every claim of a round");
        }
        all
    }
}
