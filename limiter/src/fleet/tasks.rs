//! The fleet's work off the requests' path, in one task so that it is
//! ordered: the releases (batched: whatever was given back while the
//! previous batch was out goes in the next), the renewal of every lease
//! this node holds, and, while the store is down, the probe that finds it
//! back (then publishes the releases held meanwhile and renews at once,
//! which adds back whatever the store lost).
//!
//! A release given back after a renewal took its list is sent after that
//! renewal's `ZADD`, never before: a renewal cannot bring back a member
//! already given back.

use std::{
    collections::HashMap,
    sync::{Arc, Weak, atomic::Ordering},
    time::Duration,
};

use tokio::{sync::mpsc, task::JoinSet, time::Instant};

use super::permits::{Fleet, Part};

/// The probe's first wait after the store was found down, and its longest.
const PROBE_FIRST: Duration = Duration::from_millis(100);
const PROBE_MAX: Duration = Duration::from_secs(1);
/// Releases sent in one batch at most.
const BATCH: usize = 4096;
/// Releases kept while the store is down, at most (beyond, their leases
/// end them).
const PENDING_MAX: usize = 1 << 16;
/// Members renewed by one script call at most (Lua's stack is 8000 deep).
const RENEW_CHUNK: usize = 1000;
/// How long connecting may take in a probe.
const CONNECT: Duration = Duration::from_secs(1);

/// Runs until the fleet is dropped.
pub(super) async fn run(fleet: Weak<Fleet>, mut rx: mpsc::UnboundedReceiver<Part>) {
    let mut pending: Vec<Part> = Vec::new();
    let mut backoff = PROBE_FIRST;
    let Some((period, probe_now)) = fleet.upgrade().map(|f| (f.lease / 3, f.probe_now.clone())) else {
        return;
    };
    let mut next_renewal = Instant::now() + period;
    loop {
        let up = match fleet.upgrade() {
            Some(f) => f.up.load(Ordering::Relaxed),
            None => return,
        };
        if up {
            backoff = PROBE_FIRST;
            tokio::select! {
                biased;
                part = rx.recv() => {
                    let Some(part) = part else { return };
                    pending.push(part);
                    while pending.len() < BATCH && let Ok(part) = rx.try_recv() {
                        pending.push(part);
                    }
                    let Some(f) = fleet.upgrade() else { return };
                    f.flush(&mut pending).await;
                }
                () = tokio::time::sleep_until(next_renewal) => {
                    let Some(f) = fleet.upgrade() else { return };
                    f.renew_all().await;
                    next_renewal = Instant::now() + period;
                }
                () = probe_now.notified() => {}
            }
            continue;
        }
        // Down: keep what is given back until the probe.
        let deadline = Instant::now() + backoff;
        loop {
            tokio::select! {
                part = rx.recv() => match part {
                    Some(part) if pending.len() < PENDING_MAX => pending.push(part),
                    Some(_) => {
                        // Its lease ends it.
                        if let Some(f) = fleet.upgrade() {
                            f.stats.unsent.fetch_sub(1, Ordering::Relaxed);
                        }
                    }
                    None => return,
                },
                () = tokio::time::sleep_until(deadline) => break,
            }
        }
        let Some(f) = fleet.upgrade() else { return };
        if f.probe().await {
            tracing::info!(store = %f.store.describe(), "fleet store answers again: republishing this node's permits");
            f.up.store(true, Ordering::Relaxed);
            f.flush(&mut pending).await;
            f.renew_all().await;
            next_renewal = Instant::now() + period;
        } else {
            backoff = (backoff * 2).min(PROBE_MAX);
        }
    }
}

impl Fleet {
    /// Whether the store answers: a new connection, and a `PING` answered
    /// within `fleet.timeoutMs` (50 ms at least).
    async fn probe(&self) -> bool {
        let Ok(mut conn) = self.store.reconnect(CONNECT).await else { return false };
        matches!(
            tokio::time::timeout(
                self.timeout().max(PROBE_FIRST / 2),
                conn.query::<String>(&redis::cmd("PING"))
            )
            .await,
            Ok(Ok(_))
        )
    }

    /// How long a background batch may take before the store counts as down.
    fn batch_timeout(&self) -> Duration {
        self.lease / 3
    }

    /// Sends the releases in `pending` (a `ZREM` per key, all at once).
    async fn flush(self: &Arc<Self>, pending: &mut Vec<Part>) {
        let Some(conn) = self.store.conn() else { return };
        let mut by_key: HashMap<Arc<str>, Vec<String>> = HashMap::new();
        for (key, seq) in pending.drain(..) {
            by_key.entry(key).or_default().push(self.member(seq));
        }
        let n: usize = by_key.values().map(Vec::len).sum();
        let mut set = JoinSet::new();
        for (key, members) in by_key {
            let mut conn = conn.clone();
            set.spawn(async move { conn.query::<u64>(redis::cmd("ZREM").arg(&*key).arg(members)).await });
        }
        match tokio::time::timeout(self.batch_timeout(), set.join_all()).await {
            Ok(results) => match results.into_iter().find_map(Result::err) {
                None => {
                    self.stats.releases.fetch_add(n as u64, Ordering::Relaxed);
                }
                Some(e) => self.went_down(&format!("releasing: {e}")),
            },
            Err(_) => self.went_down("releasing: no answer within a third of fleet.leaseMs"),
        }
        // Sent or failed, the batch is no longer unsent.
        self.stats.unsent.fetch_sub(n as u64, Ordering::Relaxed);
    }

    /// Renews the lease of every permit this node holds, adding back those
    /// the store lost, and notes each key's fleet count (the web clients'
    /// whether or not this node holds one).
    async fn renew_all(self: &Arc<Self>) {
        let Some(conn) = self.store.conn() else { return };
        let mut held: Vec<(Arc<str>, Vec<String>)> = {
            let table = self.lock();
            table
                .keys
                .iter()
                .map(|(key, e)| (key.clone(), e.members.iter().map(|&seq| self.member(seq)).collect()))
                .collect()
        };
        // The web clients' fleet count is read at every renewal, held here
        // or not (a cleanup and a ZCARD), so `/status` says it fresh.
        if self.live.web.load(Ordering::Relaxed) > 0 && !held.iter().any(|(k, _)| *k == self.web_key) {
            held.push((self.web_key.clone(), Vec::new()));
        }
        if held.is_empty() {
            return;
        }
        let lease_ms = self.lease.as_millis() as u64;
        let mut set = JoinSet::new();
        for (key, members) in held {
            for chunk in members.chunks(RENEW_CHUNK) {
                let (mut conn, key, fleet) = (conn.clone(), key.clone(), self.clone());
                let chunk = chunk.to_vec();
                set.spawn(async move {
                    let mut script = fleet.renew.prepare_invoke();
                    script.key(&*key).arg(lease_ms).arg(chunk);
                    conn.eval::<u32>(&script).await.map(|count| (key, count))
                });
            }
        }
        match tokio::time::timeout(self.batch_timeout(), set.join_all()).await {
            Ok(results) => {
                let mut table = self.lock();
                let mut failed = None;
                for result in results {
                    match result {
                        Ok((key, count)) => {
                            if key == self.web_key {
                                self.stats.web_fleet.store(count, Ordering::Relaxed);
                            }
                            table.seen(&key, count);
                        }
                        Err(e) => failed = Some(e),
                    }
                }
                drop(table);
                match failed {
                    None => {
                        self.stats.renewals.fetch_add(1, Ordering::Relaxed);
                    }
                    Some(e) => self.went_down(&format!("renewing: {e}")),
                }
            }
            Err(_) => self.went_down("renewing: no answer within a third of fleet.leaseMs"),
        }
    }
}
