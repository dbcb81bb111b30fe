//! The fleet's work off the requests' path: the renewal of every share
//! this node holds, every third of `fleet.leaseMs` on a timer of its own
//! (nothing else the node does can delay it: a round starts when it is due
//! and its claims go out together), and, while the store is down, the
//! probe that finds it back.
//!
//! A renewal is a claim for what was used since the last one (at least
//! what is in flight): it extends the share's lease, gives back what was
//! not used, takes what was wanted and refused if there is room now, and
//! republishes a share the store lost. A round sent later than a third of
//! the lease past its time is logged; the least lease left when a round
//! was sent is `limiter_fleet_lease_margin_seconds`.
//!
//! The probe finds the store "up" only when it answers for the budgets
//! themselves (on a cluster, their slots' masters), then republishes every
//! share (a renewal round) and only then marks the store up: no request
//! of this node claims from a store that does not hold this node's shares
//! yet.

use std::{
    sync::{Arc, Weak, atomic::Ordering},
    time::Duration,
};

use tokio::{task::JoinSet, time::Instant};

use super::{permits::Fleet, shares::Answer};

/// The probe's first wait after the store was found down, and its longest.
const PROBE_FIRST: Duration = Duration::from_millis(100);
const PROBE_MAX: Duration = Duration::from_secs(1);
/// How long connecting may take in a probe.
const CONNECT: Duration = Duration::from_secs(1);
/// Budgets a probe asks about at most.
const PROBED_KEYS: usize = 16;

/// Runs until the fleet is dropped.
pub(super) async fn run(fleet: Weak<Fleet>) {
    let Some((period, probe_now)) = fleet.upgrade().map(|f| (f.lease / 3, f.probe_now.clone())) else {
        return;
    };
    let mut backoff = PROBE_FIRST;
    let mut due = Instant::now() + period;
    loop {
        let Some(f) = fleet.upgrade() else { return };
        if f.up.load(Ordering::Relaxed) {
            backoff = PROBE_FIRST;
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
        if f.probe().await && f.renew_all().await {
            f.health.reset(std::time::Instant::now());
            f.up.store(true, Ordering::Relaxed);
            tracing::info!(store = %f.store.describe(), "fleet store answers again; this node's shares are republished");
            due = Instant::now() + period;
        } else {
            backoff = (backoff * 2).min(PROBE_MAX);
        }
    }
}

impl Fleet {
    /// Whether the store answers: a new connection (the hash key checked
    /// again), and an answer within `fleet.timeoutMs` (50 ms at least) for
    /// each budget this node holds (up to [`PROBED_KEYS`]), or a `PING`.
    async fn probe(&self) -> bool {
        let Ok(mut conn) = self.store.reconnect(CONNECT).await else { return false };
        if let Err(e) = self.check_fingerprint(&mut conn).await {
            tracing::error!("{e}");
            return false;
        }
        let keys: Vec<Arc<str>> = self.lock().map.keys().take(PROBED_KEYS).cloned().collect();
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
        matches!(tokio::time::timeout(wait, set.join_all()).await, Ok(r) if r.iter().all(Result::is_ok))
    }

    /// One renewal round: a claim for each budget this node holds or uses,
    /// all at once; `true` when the store answered every one.
    pub(super) async fn renew_all(self: &Arc<Self>) -> bool {
        let Some(conn) = self.store.conn() else { return false };
        let now = std::time::Instant::now();
        let renewals = self.lock().renewals(now);
        if renewals.is_empty() {
            self.stats.renewals.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        if let Some(margin) = renewals.iter().filter_map(|r| r.margin).min() {
            self.stats.margin_us.store(margin.as_micros() as u64, Ordering::Relaxed);
        }
        let mut set = JoinSet::new();
        for r in renewals {
            let (fleet, conn) = (self.clone(), conn.clone());
            set.spawn(async move {
                let sent = std::time::Instant::now();
                let answer = fleet.send_claim(conn, &r.key, r.kind, (r.wanted, r.wanted), r.in_use).await;
                match &answer {
                    Ok(a) => {
                        // Lapsed here by this node's clock, or in the store
                        // (a store that lost it): re-taken either way.
                        let a = Answer { lapsed: a.lapsed || r.lapsed, ..*a };
                        fleet.apply(&r.key, r.kind, sent, a, r.in_use, false);
                    }
                    Err(_) => fleet.lock().claim_failed(&r.key, std::time::Instant::now()),
                }
                let _ = r.done.send(());
                answer.err()
            });
        }
        let failed = set.join_all().await.into_iter().flatten().next();
        match failed {
            None => {
                self.stats.renewals.fetch_add(1, Ordering::Relaxed);
                true
            }
            Some(e) => {
                self.went_down(&format!("renewing: {e}"));
                false
            }
        }
    }
}
