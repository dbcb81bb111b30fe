//! The fleet's live nodes, as this node sees them: each node keeps a
//! field in one hash of the store (`limiter:{<name>}:nodes`, through the
//! claim script like any budget, with nothing to share) renewed with its
//! shares, and ends the fields it has seen unchanged for a lease. The
//! number seen is the safe share's N: what each node may use of a budget
//! it holds no share of once the store has been down for a lease.

use std::{
    collections::VecDeque,
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::sync::watch;

use super::{
    claim::{Answer, Claim},
    shares::{Kind, Seen, gone, observe},
};

#[derive(Debug)]
pub struct Members {
    lease: Duration,
    seen: Vec<Seen>,
    /// The counts seen (this node included), each with when, over the
    /// last lease the store answered.
    counts: VecDeque<(Instant, u32)>,
    /// Since when the store has held this process's field without a
    /// break (the send of the claim that wrote it).
    since: Option<Instant>,
    /// When the last answer's claim was sent.
    last: Option<Instant>,
}

impl Members {
    pub fn new(lease: Duration) -> Self {
        Self { lease, seen: Vec::new(), counts: VecDeque::new(), since: None, last: None }
    }

    /// This node's renewal of its field (`seq` from the budgets'
    /// counter); `leave`: it stops, its field goes.
    pub fn claim(
        &self,
        key: Arc<str>,
        group: Arc<str>,
        seq: u64,
        nonce: u64,
        leave: bool,
        now: Instant,
    ) -> Claim {
        let (done, _) = watch::channel(());
        let n = u32::from(!leave);
        Claim {
            key: Some(key),
            group,
            kind: Kind::Session,
            seq,
            in_use: 0,
            keep: 0,
            need: n,
            want: n,
            gone: gone(&self.seen, now, self.lease),
            unquiet: None,
            nonce,
            growth: false,
            sent: now,
            lapsed: false,
            margin: None,
            done,
        }
    }

    /// The store answered this node's claim sent at `sent`.
    pub fn answered(&mut self, a: &Answer, sent: Instant, now: Instant) {
        if a.stale {
            return;
        }
        // A field the store did not hold (the first, or one it lost) is
        // new to the other nodes from now.
        if !a.had || self.since.is_none() {
            self.since = Some(sent);
        }
        self.last = Some(sent);
        self.seen = observe(&self.seen, &a.seen, now);
        self.counts.push_back((now, 1 + a.seen.len() as u32));
        while self.counts.front().is_some_and(|(at, _)| now.saturating_duration_since(*at) > self.lease) {
            self.counts.pop_front();
        }
    }

    /// The most nodes seen in the last lease the store answered (`None`:
    /// never answered).
    pub fn seen(&self) -> Option<u32> {
        self.counts.iter().map(|(_, n)| *n).max()
    }

    /// The N of the safe share with the store found down at `down`: only
    /// for a node every other node saw among the live ones before (its
    /// field written a lease before), whose own view is fresh (its last
    /// answer sent less than half a lease before). Then every node that
    /// may use the safe share counts every other that may, so their safe
    /// shares together never pass the limit.
    pub fn safe_n(&self, down: Instant) -> Option<u32> {
        let (since, last) = (self.since?, self.last?);
        let known = since + self.lease <= down;
        let fresh = last + self.lease / 2 >= down;
        if known && fresh { self.seen() } else { None }
    }
}
