//! What this node holds of each fleet budget, and every decision made of
//! it without the store: whether a request fits the node's share (no round
//! trip), when to claim more and how much, what the store's answer to a
//! claim changes, what a renewal asks for. No I/O and no clock of its own
//! (every call is given `now`), so that the rules are tested exactly.
//!
//! A budget's **share** is what the store granted this node of its limit
//! (the shares of live nodes never sum above it, `claim.lua`, but for what
//! a node had in flight when its lease lapsed), valid until
//! the claim's send time plus the lease less a tenth (this node's clock;
//! the store's lease starts later, when its script runs, so the node stops
//! trusting a share before the store frees it). A request takes a unit of
//! the share; beyond it, it claims more (one round trip, for what is in use
//! and waiting, plus a quarter while demand rises: the store grants that
//! headroom only while the budget is less than half used), and requests
//! that come while
//! the claim is out wait for its answer instead of claiming again. A claim
//! that finds no room makes the node refuse, without asking, for
//! [`CLAIM_BACKOFF`]. A renewal (every third of the lease) asks for what
//! was used since the last one: a share not used for a renewal period is
//! given back.

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::sync::watch;

use limiter::{admission::Refusal, config::OnStoreDown};

/// Which budget a key is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Session,
    Web,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Session => "session",
            Self::Web => "web",
        }
    }

    /// The refusal of this budget's limit.
    pub fn refusal(self) -> Refusal {
        match self {
            Self::Session => Refusal::FleetSession,
            Self::Web => Refusal::FleetWeb,
        }
    }
}

/// After a claim that found no room, how long requests beyond the share
/// are refused without asking the store again.
pub const CLAIM_BACKOFF: Duration = Duration::from_millis(100);

/// Claims one request may wait for (or send) at most. A request is
/// refused when a claim found no room (the budget backs off) or its wait
/// runs out; a burst beyond the share is served by a claim or two, each
/// asking for what has come, and this only bounds a request that keeps
/// being overtaken.
pub const ROUNDS: u32 = 8;

/// A claim that follows a growth within this asks for headroom.
pub const RISING: Duration = Duration::from_secs(1);

/// One budget as this node holds it.
#[derive(Debug)]
pub struct Budget {
    pub kind: Kind,
    /// Its requests in flight on this node.
    pub in_use: u32,
    /// What the store granted this node.
    pub share: u32,
    /// Until when the share holds (this node's clock); `None`: no share
    /// was granted yet (or, under `onStoreDown = local`, requests were
    /// admitted while the store was down).
    pub until: Option<Instant>,
    /// The most this node used or wanted since the last renewal.
    pub wanted: u32,
    /// No claim before this (the last one found no room).
    pub quiet_until: Option<Instant>,
    /// A claim in flight: its answer (or its end) wakes the requests
    /// waiting on this.
    pub claiming: Option<watch::Receiver<()>>,
    /// Requests waiting for a claim (the next claim asks for them too).
    pub pending: u32,
    /// When the share last grew: demand is rising while claims follow
    /// each other within [`RISING`].
    pub grew: Option<Instant>,
    /// The fleet's shares (this node's and the others') as last seen.
    pub fleet: u32,
}

impl Budget {
    fn new(kind: Kind) -> Self {
        Self {
            kind,
            in_use: 0,
            share: 0,
            until: None,
            wanted: 0,
            quiet_until: None,
            claiming: None,
            pending: 0,
            grew: None,
            fleet: 0,
        }
    }

    /// The share, while it holds.
    fn valid_share(&self, now: Instant) -> u32 {
        if self.until.is_some_and(|u| now < u) { self.share } else { 0 }
    }

    /// What a claim asks for: what it needs (what is in use and the
    /// requests waiting for a claim, this one among them), and what it
    /// wants: a quarter again while demand rises (the share grew within
    /// [`RISING`]), which the store grants only while the budget is less
    /// than half used; never past the limit.
    fn growth(&self, limit: u32, now: Instant) -> (u32, u32) {
        let needed = (self.in_use + self.pending.max(1)).min(limit).max(self.in_use + 1);
        let rising = self.grew.is_some_and(|g| now.saturating_duration_since(g) < RISING);
        let headroom = if rising { needed.div_ceil(4) } else { 0 };
        (needed, (needed + headroom).min(limit).max(needed))
    }
}

/// What a request does next for one budget.
#[derive(Debug)]
pub enum Take {
    /// It holds a unit of the budget now.
    Taken { unpublished: bool },
    /// Refused by the limit (the share is full and cannot grow now), or
    /// with the store down.
    Refused { store_down: bool },
    /// Wait for the claim in flight, then look again.
    Wait(watch::Receiver<()>),
    /// Claim `needed` and up to `wanted` (with `in_use` in flight): this
    /// request sends it (`done` says it was answered), and waits as others
    /// do.
    Claim { needed: u32, wanted: u32, in_use: u32, done: watch::Sender<()>, wait: watch::Receiver<()> },
}

/// The store's answer to a claim.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Answer {
    pub share: u32,
    /// The budget is quiet: the store may have lost it, so it grows for
    /// no one yet.
    pub quiet: bool,
    /// This node's share was gone from the store while it had requests in
    /// flight (a lease that lapsed, a store that lost it): re-taken.
    pub lapsed: bool,
    pub others: u32,
    pub others_demand: u32,
}

/// A renewal's claim for one budget.
#[derive(Debug)]
pub struct Renewal {
    pub key: Arc<str>,
    pub kind: Kind,
    pub wanted: u32,
    pub in_use: u32,
    /// The share's lease left when the renewal was sent (`None`: none).
    pub margin: Option<Duration>,
    /// The share lapsed here (this node's clock) with requests in flight:
    /// a pause, a partition, a store away for longer than the lease.
    pub lapsed: bool,
    /// Says it was answered (requests beyond the share wait for it).
    pub done: watch::Sender<()>,
}

/// Every budget this node uses or holds a share of.
#[derive(Debug, Default)]
pub struct Budgets {
    pub map: HashMap<Arc<str>, Budget>,
}

impl Budgets {
    /// One request's turn at a budget of `limit`. `down`: the store is
    /// down, and what the policy says; `round`: the claims this request
    /// already waited for (after [`ROUNDS`], it fits or is refused).
    pub fn take(
        &mut self,
        key: &Arc<str>,
        kind: Kind,
        limit: u32,
        now: Instant,
        down: Option<OnStoreDown>,
        round: u32,
    ) -> Take {
        let b = self.map.entry(key.clone()).or_insert_with(|| Budget::new(kind));
        let fits = b.in_use < b.valid_share(now);
        if let Some(policy) = down {
            let taken = match policy {
                OnStoreDown::Local => Some(true),
                OnStoreDown::Share if fits => Some(false),
                OnStoreDown::Share | OnStoreDown::Refuse => None,
            };
            return match taken {
                Some(unpublished) => {
                    b.in_use += 1;
                    b.wanted = b.wanted.max(b.in_use);
                    Take::Taken { unpublished }
                }
                None => {
                    self.forget_if_idle(key);
                    Take::Refused { store_down: true }
                }
            };
        }
        if fits {
            b.in_use += 1;
            b.wanted = b.wanted.max(b.in_use);
            return Take::Taken { unpublished: false };
        }
        b.wanted = b.wanted.max(b.in_use + 1);
        if round < ROUNDS {
            if let Some(claim) = &b.claiming {
                b.pending += 1;
                return Take::Wait(claim.clone());
            }
            if b.quiet_until.is_none_or(|q| now >= q) {
                b.pending += 1;
                let (done, wait) = watch::channel(());
                b.claiming = Some(wait.clone());
                let (needed, wanted) = b.growth(limit, now);
                return Take::Claim { needed, wanted, in_use: b.in_use, done, wait };
            }
        }
        Take::Refused { store_down: false }
    }

    /// A request that waited for a claim ([`Take::Wait`], [`Take::Claim`])
    /// is done waiting (answered or not).
    pub fn waited(&mut self, key: &Arc<str>) {
        if let Some(b) = self.map.get_mut(key) {
            b.pending = b.pending.saturating_sub(1);
            self.forget_if_idle(key);
        }
    }

    /// A unit given back (its request is done).
    pub fn give_back(&mut self, key: &Arc<str>) {
        if let Some(b) = self.map.get_mut(key) {
            b.in_use = b.in_use.saturating_sub(1);
            self.forget_if_idle(key);
        }
    }

    /// Drops a budget nothing is left of here: no request, no share, no
    /// claim out, and no demand for the next renewal to record.
    fn forget_if_idle(&mut self, key: &Arc<str>) {
        let idle = |b: &Budget| {
            b.in_use == 0 && b.share == 0 && b.claiming.is_none() && b.wanted == 0 && b.pending == 0
        };
        if self.map.get(key).is_some_and(idle) {
            self.map.remove(key);
        }
    }

    /// The store answered a claim sent at `sent` (`growth`: for requests
    /// beyond the share; else a renewal): the share, valid for the lease
    /// less a tenth from then; a growth that found no room backs off.
    pub fn claimed(
        &mut self,
        key: &Arc<str>,
        sent: Instant,
        lease: Duration,
        a: Answer,
        growth: bool,
        now: Instant,
    ) {
        let Some(b) = self.map.get_mut(key) else { return };
        b.claiming = None;
        if growth && a.share > b.share {
            b.grew = Some(now);
        }
        if growth && a.share <= b.in_use {
            b.quiet_until = Some(now + CLAIM_BACKOFF);
        }
        b.share = a.share;
        b.until = Some(sent + lease - lease / 10);
        b.fleet = a.others + a.share;
        self.forget_if_idle(key);
    }

    /// A claim failed or was not answered: nothing changes but that it is
    /// no longer out, and requests beyond the share back off.
    pub fn claim_failed(&mut self, key: &Arc<str>, now: Instant) {
        let Some(b) = self.map.get_mut(key) else { return };
        b.claiming = None;
        b.quiet_until = Some(now + CLAIM_BACKOFF);
        self.forget_if_idle(key);
    }

    /// What a renewal claims, budget by budget: what was used (or wanted)
    /// since the last renewal, at least what is in use. Each budget's
    /// claim is marked out; budgets with a claim already out wait for the
    /// next renewal.
    pub fn renewals(&mut self, now: Instant) -> Vec<Renewal> {
        let mut out = Vec::with_capacity(self.map.len());
        for (key, b) in &mut self.map {
            if b.claiming.is_some() {
                continue;
            }
            let wanted = b.wanted.max(b.in_use);
            b.wanted = b.in_use;
            let (done, wait) = watch::channel(());
            b.claiming = Some(wait);
            out.push(Renewal {
                key: key.clone(),
                kind: b.kind,
                wanted,
                in_use: b.in_use,
                margin: b.until.map(|u| u.saturating_duration_since(now)),
                lapsed: b.in_use > 0 && b.until.is_some_and(|u| u <= now),
                done,
            });
        }
        out
    }

    /// This node's shares and requests in flight, by kind: ([session,
    /// web] shares, [session, web] in use).
    pub fn totals(&self) -> ([u32; 2], [u32; 2]) {
        let (mut shares, mut in_use) = ([0; 2], [0; 2]);
        for b in self.map.values() {
            let i = usize::from(b.kind == Kind::Web);
            shares[i] += b.share;
            in_use[i] += b.in_use;
        }
        (shares, in_use)
    }
}
