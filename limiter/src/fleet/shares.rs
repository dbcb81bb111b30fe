//! What this node holds of each fleet budget, and every decision made of
//! it without the store: whether a request fits the node's share (no
//! round trip), when to claim and what to ask, what the store's answer
//! changes, what a renewal asks, which other nodes' fields have gone
//! silent, when a quiet group may end. No I/O and no clock of its own
//! (every call is given `now`), so that the rules are tested exactly and
//! the fleet's simulation (`sim/`) runs these very rules.
//!
//! A budget's **cap** is what this node may admit up to; its **share** is
//! what the store counts for it, never less than the cap nor than what is
//! in flight (`claim.lua`). The cap changes only two ways, so that the
//! node never admits past what the store records:
//!
//! - it **shrinks before the store hears of it**: a claim names what the
//!   node keeps until the answer ([`Claim::keep`]) and the node admits no
//!   more than that meanwhile, nor after a claim that failed (the store may
//!   have recorded it or not);
//! - it **grows only by an answer**, which the store recorded first.
//!
//! A share is **trusted** until its claim's send time plus nine tenths of
//! the lease (a node's field lives in the store until another node has
//! seen it unchanged for a whole lease, by its own clock, from an answer
//! that came after it was written), and admits requests only until a
//! third of the lease before that ([`crate::lease::admits_for`]): every request it
//! admits shorter than a third of the lease ends within its trust, even
//! if the node is cut off from the store the moment after.

use std::{
    collections::HashMap,
    hash::BuildHasherDefault,
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::sync::watch;

pub use super::claim::Kind;
use super::claim::{Answer, Claim};
use crate::lease::{admits_for, trusted_for};

/// After a claim that found no room, or failed, how long requests beyond
/// the share are refused without asking the store again.
pub const CLAIM_BACKOFF: Duration = Duration::from_millis(20);

/// Claims one request may wait for at most (it is then refused): a burst
/// beyond the share is served by a claim or two, each asking for what
/// has come; this bounds a request that keeps being overtaken.
pub const ROUNDS: u32 = 8;

/// A claim that follows a growth within this asks for headroom.
pub const RISING: Duration = Duration::from_secs(1);

/// Why a request is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// The budget's limit: the store answered that it is full.
    Limit,
    /// The store: down, not answering, or quiet after losing data.
    Down,
}

/// What a request meets while the store counts as down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Down {
    /// Within a share this node holds, else 503 `fleet_down`; with
    /// `Some(n)`, a budget it holds no trusted share of may use up to `n`
    /// (the safe share).
    Share(Option<u32>),
    Refuse,
    /// The node's own limits alone.
    Local,
}

/// A claim out: what the node keeps until its answer.
#[derive(Debug)]
pub struct Out {
    pub seq: u64,
    pub keep: u32,
    wait: watch::Receiver<()>,
}

/// Another node's field, as this node last saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub field: String,
    pub seq: u64,
    /// When this node first saw that sequence number (an answer's
    /// arrival: after it was written).
    pub since: Instant,
}

/// One budget as this node holds it.
#[derive(Debug)]
pub struct Budget {
    pub kind: Kind,
    /// The key of its group's epoch.
    pub group: Arc<str>,
    /// Its requests in flight on this node.
    pub in_use: u32,
    /// What this node may admit up to (while its share is trusted).
    pub cap: u32,
    /// What the store counts for this node.
    pub share: u32,
    /// What the store records this node asked for beyond its cap (its
    /// next renewal clears it).
    pub demand: u32,
    /// A claim's outcome is unknown (it failed or was not answered): what
    /// the store holds for this node is known again only from an answer,
    /// so the budget is kept until one comes.
    pub unsure: bool,
    /// When the claim of the last answer applied was sent.
    pub sent: Option<Instant>,
    /// The most this node used or wanted since the last renewal.
    pub wanted: u32,
    /// No claim before this, and why.
    pub backoff: Option<(Instant, Why)>,
    /// A claim in flight.
    pub claiming: Option<Out>,
    /// Requests waiting for the claim in flight.
    pub pending: u32,
    /// When the cap last grew: demand is rising while claims follow each
    /// other within [`RISING`].
    pub grew: Option<Instant>,
    /// When an answer last said other nodes want more than they hold.
    pub contended: Option<Instant>,
    /// The fleet's shares (this node's and the others') as last seen.
    pub fleet: u32,
    /// The other nodes' fields, as last seen.
    pub seen: Vec<Seen>,
    /// Nothing is left of the budget here but other nodes' fields seen:
    /// since when its renewals only watch them ([`WATCH`]).
    pub watching: Option<Instant>,
}

/// How long a budget nothing is left of here is still renewed while it
/// lists other nodes' fields: long enough that a field seen at its first
/// claim is seen unchanged for a lease and ended if it is a dead node's,
/// however rarely the budget's requests come (a lease and a renewal
/// period from the first renewal that finds it idle).
fn watch(lease: Duration) -> Duration {
    lease + lease / 3
}

impl Budget {
    fn new(kind: Kind, group: Arc<str>) -> Self {
        Self {
            kind,
            group,
            in_use: 0,
            cap: 0,
            share: 0,
            demand: 0,
            unsure: false,
            sent: None,
            wanted: 0,
            backoff: None,
            claiming: None,
            pending: 0,
            grew: None,
            contended: None,
            fleet: 0,
            seen: Vec::new(),
            watching: None,
        }
    }

    /// No request, share, claim or demand is left of it here.
    fn idle(&self) -> bool {
        self.in_use == 0
            && self.share == 0
            && self.demand == 0
            && !self.unsure
            && self.cap == 0
            && self.claiming.is_none()
            && self.wanted == 0
            && self.pending == 0
    }

    /// Whether the share is trusted to admit at `now`.
    fn admits(&self, now: Instant, lease: Duration) -> bool {
        self.sent.is_some_and(|s| now < s + admits_for(lease))
    }

    /// What may be admitted up to now: the cap while the share admits,
    /// no more than a claim out keeps.
    pub fn admissible(&self, now: Instant, lease: Duration) -> u32 {
        let cap = if self.admits(now, lease) { self.cap } else { 0 };
        self.claiming.as_ref().map_or(cap, |o| cap.min(o.keep))
    }

    /// Whether other nodes wanted more than they held within a lease.
    fn is_contended(&self, now: Instant, lease: Duration) -> bool {
        self.contended.is_some_and(|c| now.saturating_duration_since(c) < lease)
    }
}

/// What a unit was taken within.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Within {
    /// The node's share: the store counts it.
    Share,
    /// Nothing the store counts: `onStoreDown = local`.
    Local,
    /// The safe share, with the store down.
    Safe,
}

/// What a request does next for one budget.
#[derive(Debug)]
pub enum Take {
    /// It holds a unit of the budget now.
    Taken(Within),
    Refused(Why),
    /// Wait for the claim in flight, then look again.
    Wait(watch::Receiver<()>),
    /// Send this claim (it is marked out), then wait as others do.
    Claim(Claim, watch::Receiver<()>),
}

/// A fixed hasher: the map's order (the order renewals go out in) is the
/// same for the same history, as the simulation needs. Its keys are
/// keyed hashes no client chooses.
type Fixed = BuildHasherDefault<std::hash::DefaultHasher>;

/// Every budget this node uses or holds a share of, and the groups it has
/// seen quiet.
#[derive(Debug)]
pub struct Budgets {
    pub map: HashMap<Arc<str>, Budget, Fixed>,
    /// Groups seen quiet: which quiet, and since when.
    pub quiet: HashMap<Arc<str>, (String, Instant), Fixed>,
    pub lease: Duration,
    /// The last claim's sequence number (one counter for every budget: a
    /// budget forgotten and met again never repeats one).
    seq: u64,
    /// Draws the nonces of the epochs this node's claims may make
    /// (SplitMix64 from a seed of the process's own).
    nonces: u64,
}

impl Budgets {
    /// `seed`: random bits of this process's (no two nodes draw the same
    /// nonces).
    pub fn new(lease: Duration, seed: u64) -> Self {
        Self { map: HashMap::default(), quiet: HashMap::default(), lease, seq: 0, nonces: seed }
    }

    /// A nonce for an epoch a claim may make: 48 bits, exact in the
    /// script's numbers.
    pub fn next_nonce(&mut self) -> u64 {
        self.nonce()
    }

    fn nonce(&mut self) -> u64 {
        self.nonces = self.nonces.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.nonces;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) >> 16
    }

    pub fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// One request's turn at budget `key` (of group `group`) of `limit`.
    /// `down`: the store counts as down, and what the policy says;
    /// `round`: the claims this request already waited for.
    #[expect(clippy::too_many_arguments, reason = "a budget's name, limit and the moment, all needed")]
    pub fn take(
        &mut self,
        key: &Arc<str>,
        kind: Kind,
        group: &Arc<str>,
        limit: u32,
        now: Instant,
        down: Option<Down>,
        round: u32,
    ) -> Take {
        let lease = self.lease;
        let b = self.map.entry(key.clone()).or_insert_with(|| Budget::new(kind, group.clone()));
        let fits = b.in_use < b.admissible(now, lease);
        if let Some(down) = down {
            let taken = match down {
                Down::Local => Some(Within::Local),
                Down::Share(_) if fits => Some(Within::Share),
                // A budget it holds no trusted share of: the safe share.
                Down::Share(Some(safe)) if !b.admits(now, lease) && b.in_use < safe => Some(Within::Safe),
                Down::Share(_) | Down::Refuse => None,
            };
            return match taken {
                Some(within) => {
                    b.in_use += 1;
                    b.wanted = b.wanted.max(b.in_use);
                    Take::Taken(within)
                }
                None => {
                    self.forget_if_idle(key);
                    Take::Refused(Why::Down)
                }
            };
        }
        if fits {
            b.in_use += 1;
            b.wanted = b.wanted.max(b.in_use);
            return Take::Taken(Within::Share);
        }
        b.wanted = b.wanted.max(b.in_use + 1);
        let backoff = b.backoff.filter(|(until, _)| now < *until).map(|(_, why)| why);
        if round >= ROUNDS {
            // The last claim failed: the store's fault, not the limit's.
            return Take::Refused(backoff.unwrap_or(Why::Limit));
        }
        if let Some(out) = &b.claiming {
            b.pending += 1;
            return Take::Wait(out.wait.clone());
        }
        if let Some(why) = backoff {
            return Take::Refused(why);
        }
        b.pending += 1;
        let need = (b.in_use + b.pending).min(limit).max(b.in_use + 1);
        let rising = b.grew.is_some_and(|g| now.saturating_duration_since(g) < RISING);
        let want = (need + if rising { need.div_ceil(4) } else { 0 }).min(limit).max(need);
        let keep = b.admissible(now, lease);
        let claim = self.claim(key, now, keep, need, want, true);
        let wait = self.map[key].claiming.as_ref().expect("marked out").wait.clone();
        Take::Claim(claim, wait)
    }

    /// A claim of budget `key`, marked out.
    fn claim(
        &mut self,
        key: &Arc<str>,
        now: Instant,
        keep: u32,
        need: u32,
        want: u32,
        growth: bool,
    ) -> Claim {
        let seq = self.next_seq();
        let lease = self.lease;
        let b = self.map.get_mut(key).expect("a budget");
        let gone = gone(&b.seen, now, lease);
        let (done, wait) = watch::channel(());
        b.claiming = Some(Out { seq, keep, wait });
        let group = b.group.clone();
        let lapsed = b.in_use > 0 && b.sent.is_some_and(|s| now >= s + trusted_for(lease));
        let margin = b.sent.map(|s| (s + trusted_for(lease)).saturating_duration_since(now));
        let (kind, in_use) = (b.kind, b.in_use);
        Claim {
            key: Some(key.clone()),
            unquiet: self.unquiet(&group, now),
            nonce: self.nonce(),
            group,
            kind,
            seq,
            in_use,
            keep,
            need,
            want,
            gone,
            growth,
            sent: now,
            lapsed,
            margin,
            done,
        }
    }

    /// The quiet of `group` this node has seen for a lease.
    fn unquiet(&self, group: &Arc<str>, now: Instant) -> Option<String> {
        match self.quiet.get(group) {
            Some((quiet, since)) if now.saturating_duration_since(*since) >= self.lease => {
                Some(quiet.clone())
            }
            _ => None,
        }
    }

    /// A group's epoch as an answer said it.
    pub fn saw_epoch(&mut self, group: &Arc<str>, quiet: Option<&str>, now: Instant) {
        match quiet {
            None => _ = self.quiet.remove(group),
            Some(q) if self.quiet.get(group).is_some_and(|(seen, _)| seen == q) => {}
            Some(q) => _ = self.quiet.insert(group.clone(), (q.to_owned(), now)),
        }
    }

    /// A request that waited for a claim is done waiting (answered or
    /// not, or gone: its guard calls this when dropped).
    pub fn waited(&mut self, key: &Arc<str>) {
        if let Some(b) = self.map.get_mut(key) {
            b.pending = b.pending.saturating_sub(1);
            self.forget_if_idle(key);
        }
    }

    /// A unit given back (its request is done, or never went upstream).
    /// While other nodes want more than they hold, what this node then
    /// holds beyond its requests goes back at once: the claim to send.
    pub fn give_back(&mut self, key: &Arc<str>, now: Instant) -> Option<Claim> {
        let lease = self.lease;
        let b = self.map.get_mut(key)?;
        b.in_use = b.in_use.saturating_sub(1);
        let headroom = b.admissible(now, lease) > b.in_use + b.pending;
        if b.claiming.is_none() && headroom && b.is_contended(now, lease) {
            let n = b.in_use + b.pending;
            return Some(self.claim(key, now, n, n, n, false));
        }
        self.forget_if_idle(key);
        None
    }

    /// Another node wants more of budget `key` than the store could give it
    /// (the store said so): this node counts as contended from now, and
    /// what it holds beyond its requests goes back at once (the claim to
    /// send, unless one is out or nothing is spare).
    pub fn wanted(&mut self, key: &Arc<str>, now: Instant) -> Option<Claim> {
        let lease = self.lease;
        let b = self.map.get_mut(key)?;
        b.contended = Some(now);
        let spare = b.admissible(now, lease) > b.in_use + b.pending;
        if b.claiming.is_some() || !spare {
            return None;
        }
        let n = b.in_use + b.pending;
        Some(self.claim(key, now, n, n, n, false))
    }

    /// Drops a budget nothing is left of here (no request, no share, no
    /// claim out, no demand for the next renewal to record) unless it
    /// lists other nodes' fields: those its renewals watch a while.
    fn forget_if_idle(&mut self, key: &Arc<str>) {
        if self.map.get(key).is_some_and(|b| b.idle() && b.seen.is_empty()) {
            self.map.remove(key);
        }
    }

    /// The store answered claim `claim` (of budget `key`) at `now`.
    pub fn answered(&mut self, key: &Arc<str>, claim: &Claim, a: &Answer, now: Instant) {
        self.saw_epoch(&claim.group, a.quiet.as_deref(), now);
        let Some(b) = self.map.get_mut(key) else { return };
        if b.claiming.as_ref().map(|o| o.seq) != Some(claim.seq) {
            return;
        }
        b.claiming = None;
        if a.stale {
            b.cap = b.cap.min(claim.keep);
            self.forget_if_idle(key);
            return;
        }
        b.unsure = false;
        if claim.growth && a.cap > b.cap {
            b.grew = Some(now);
        }
        // A growth that found no room backs off, unless other nodes hold
        // units they do not use: told that this budget is wanted, they give
        // them back within a round trip, so the waiting requests claim
        // again at once (each within its own fleet.timeoutMs).
        if claim.growth && a.cap <= b.in_use && (a.spare == 0 || a.quiet.is_some()) {
            let why = if a.quiet.is_some() { Why::Down } else { Why::Limit };
            b.backoff = Some((now + CLAIM_BACKOFF, why));
        }
        if a.others_demand > 0 {
            b.contended = Some(now);
        }
        b.cap = a.cap;
        b.share = a.share;
        b.demand = claim.need.saturating_sub(a.cap);
        b.sent = Some(claim.sent);
        b.fleet = a.others + a.share;
        b.seen = observe(&b.seen, &a.seen, now);
        self.forget_if_idle(key);
    }

    /// A claim failed or was not answered: the store may have recorded it
    /// or not, so what it kept stands, and requests beyond the share back
    /// off (`fleet_down`).
    pub fn failed(&mut self, key: &Arc<str>, claim: &Claim, now: Instant) {
        let Some(b) = self.map.get_mut(key) else { return };
        if b.claiming.as_ref().map(|o| o.seq) != Some(claim.seq) {
            return;
        }
        b.claiming = None;
        b.cap = b.cap.min(claim.keep);
        b.unsure = true;
        b.backoff = Some((now + CLAIM_BACKOFF, Why::Down));
    }

    /// What a renewal claims, budget by budget: what was used (or
    /// wanted) since the last renewal, so that a share not used for a
    /// renewal period goes back; while other nodes want more than they
    /// hold, or after a claim whose answer was lost or late, only what is
    /// in use. A budget nothing is left of here but other nodes' fields is
    /// renewed a while to watch them ([`watch`]). Each is marked out;
    /// budgets with a claim out wait for the next round.
    pub fn renewals(&mut self, now: Instant) -> Vec<Claim> {
        let lease = self.lease;
        let mut keys: Vec<Arc<str>> =
            self.map.iter().filter(|(_, b)| b.claiming.is_none()).map(|(k, _)| k.clone()).collect();
        keys.sort();
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            let b = self.map.get_mut(&key).expect("a budget");
            if !b.idle() {
                b.watching = None;
            } else if now.saturating_duration_since(*b.watching.get_or_insert(now)) >= watch(lease) {
                self.map.remove(&key);
                continue;
            }
            let used = b.wanted.max(b.in_use);
            let busy = b.in_use + b.pending;
            let (need, want) = if b.unsure {
                // Its last answer was lost or late: a unit granted that it
                // may not hear of in time would be held from the others
                // for nothing.
                (busy, busy)
            } else if b.is_contended(now, lease) {
                (busy, used)
            } else {
                (used, used)
            };
            // Only what is in flight is kept while the renewal is out (a
            // request beyond it waits one round trip for the answer): the
            // store may then give the rest to a node that wants it at once.
            let keep = b.admissible(now, lease).min(b.in_use);
            b.wanted = b.in_use;
            out.push(self.claim(&key, now, keep, need, want, false));
        }
        out
    }

    /// Claims of the epochs of `groups` alone: each group seen quiet for a
    /// lease ends its quiet (the others are read).
    pub fn epochs<'a>(&mut self, groups: impl IntoIterator<Item = &'a Arc<str>>, now: Instant) -> Vec<Claim> {
        groups
            .into_iter()
            .map(|group| {
                let (done, _) = watch::channel(());
                Claim {
                    nonce: self.nonce(),
                    key: None,
                    group: group.clone(),
                    kind: Kind::Session,
                    seq: 0,
                    in_use: 0,
                    keep: 0,
                    need: 0,
                    want: 0,
                    gone: Vec::new(),
                    unquiet: self.unquiet(group, now),
                    growth: false,
                    sent: now,
                    lapsed: false,
                    margin: None,
                    done,
                }
            })
            .collect()
    }

    /// Groups seen quiet for a lease (their quiet may end).
    pub fn quiet_due(&self, now: Instant) -> Vec<Arc<str>> {
        let mut due: Vec<Arc<str>> = self
            .quiet
            .iter()
            .filter(|(_, (_, since))| now.saturating_duration_since(*since) >= self.lease)
            .map(|(g, _)| g.clone())
            .collect();
        due.sort();
        due
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

/// The other nodes' fields an answer lists, each seen since it was first
/// seen with that sequence number (an answer's arrival, after the field
/// was written).
pub fn observe(old: &[Seen], answer: &[(String, u64)], now: Instant) -> Vec<Seen> {
    answer
        .iter()
        .map(|(field, seq)| {
            let since = old.iter().find(|s| s.field == *field && s.seq == *seq).map_or(now, |s| s.since);
            Seen { field: field.clone(), seq: *seq, since }
        })
        .collect()
}

/// The fields seen unchanged for a lease: their nodes stopped renewing
/// (each renews every third of a lease), so they are gone.
pub fn gone(seen: &[Seen], now: Instant, lease: Duration) -> Vec<(String, u64)> {
    seen.iter()
        .filter(|s| now.saturating_duration_since(s.since) >= lease)
        .map(|s| (s.field.clone(), s.seq))
        .collect()
}

#[cfg(test)]
mod tests;
