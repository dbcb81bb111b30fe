//! What the simulation holds the fleet to, read from the world's own
//! record (which requests the upstream is running, since when, at which
//! node; which answers each node applied), never from a node's counts:
//!
//! - **Safety**: at every step, for every budget, the requests the
//!   upstream runs are at most the limit, except those the manual lets
//!   past it, which the checker tells apart itself: a request older than
//!   the manual's bound whose node has had no answer of the store for
//!   that budget applied for a lease (it outlived its share's lease while
//!   its node could not renew it: a partition, a pause, a store away, a
//!   node killed); and, under `onStoreDown = local`, a request admitted
//!   while its node counted the store down (the limit is lifted then).
//!   Once let past, a request stays past (the store may have given its
//!   units to others meanwhile).
//! - **Reasons**: a refusal that names a fleet limit (`fleet_session`,
//!   `fleet_web`) only where the node's last claim of that budget was
//!   answered: a store that did not answer is `fleet_down`.
//! - **No starving**: a node refuses a budget by its fleet limit, with
//!   room, for two leases without admitting one of it in between, while
//!   the budget was never full meanwhile (room: fewer than the limit run
//!   by the upstream or waiting for a node's decision, since a waiting
//!   request may hold a unit of one budget while it claims another). A
//!   dead or cut-off node's share ends within a lease of a node seeing
//!   it unchanged; a share not used goes back within a renewal period.
//! - **Liveness** (at the end, every fault over, every client stopped,
//!   the run drained): no node holds a unit, a waiter or a budget, no
//!   budget is left in the store, no request waits, every node counts
//!   the store up.

use std::{
    collections::{BTreeMap, HashMap},
    fmt,
};

use crate::scenario::{Policy, Scenario};

/// A budget of the fleet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Budget {
    Web,
    Session(u32),
}

/// What the checker found.
#[derive(Clone, Debug, PartialEq)]
pub enum Violation {
    Overshoot {
        budget: Budget,
        in_flight: usize,
        limit: u32,
        requests: String,
    },
    /// Admitted into an excess the store knew of (one that never drains).
    Refilled {
        budget: Budget,
        in_flight: usize,
        limit: u32,
        req: u64,
    },
    WrongReason {
        node: usize,
        budget: Budget,
        reason: &'static str,
    },
    Leak {
        node: usize,
        what: String,
    },
    Stuck {
        req: u64,
        waited_us: u64,
    },
    /// Refused by a fleet limit with room at the upstream for so long.
    Starved {
        node: usize,
        budget: Budget,
        room_us: u64,
    },
}

impl Violation {
    /// A short name, for tallies.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Overshoot { .. } => "overshoot",
            Self::Refilled { .. } => "refilled an excess",
            Self::WrongReason { .. } => "wrong reason",
            Self::Leak { .. } => "leak",
            Self::Stuck { .. } => "stuck",
            Self::Starved { .. } => "starved",
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Overshoot { budget, in_flight, limit, requests } => {
                write!(f, "{budget:?}: {in_flight} in flight at the upstream, limit {limit} ({requests})")
            }
            Self::Refilled { budget, in_flight, limit, req } => write!(
                f,
                "{budget:?}: request {req} admitted with {in_flight} in flight by the store's own record, limit {limit} (an excess refilled)"
            ),
            Self::WrongReason { node, budget, reason } => write!(
                f,
                "node {node} refused {budget:?} as `{reason}` where its last claim of it had no answer (fleet_down)"
            ),
            Self::Leak { node, what } => write!(f, "node {node}: {what}"),
            Self::Stuck { req, waited_us } => {
                write!(f, "request {req} waited {} ms and never had an answer", waited_us / 1000)
            }
            Self::Starved { node, budget, room_us } => write!(
                f,
                "node {node} refused {budget:?} by its fleet limit, with room, for {} ms, admitting none",
                room_us / 1000
            ),
        }
    }
}

#[derive(Debug)]
struct Flight {
    node: usize,
    inc: u32,
    admitted_us: u64,
    /// Per budget: whether it is let past the limit.
    budgets: Vec<(Budget, bool)>,
    /// Per budget, once it is let past: when its node's store knew of it
    /// again (an answer applied to a claim sent after).
    known: Vec<Option<u64>>,
    /// When it was let past.
    past_at: u64,
}

/// When a node's claims of a budget were last answered, and last failed.
type Outcomes = (Option<u64>, Option<u64>);

pub struct Checker {
    lease_us: u64,
    /// The manual's bound: a request older than this whose node cannot
    /// renew may outlive its share.
    cover_us: u64,
    session_limit: u32,
    web_limit: u32,
    policy: Policy,
    flights: BTreeMap<u64, Flight>,
    /// When the answer last applied by each node incarnation for each
    /// budget was sent.
    applied: HashMap<(usize, u32, Budget), u64>,
    /// When each node incarnation's claims of each budget were last
    /// answered, and last failed.
    answered: HashMap<(usize, u32, Budget), Outcomes>,
    /// Requests a node has not decided yet: when each arrived, and its
    /// budgets (it may hold a unit of one while it waits for another).
    waiting: BTreeMap<u64, (u64, Vec<Budget>)>,
    /// How long after the store learns of an excess every node has heard.
    drain_us: u64,
    excess: Option<Violation>,
    /// Since when each node incarnation has refused each budget by its
    /// limit with room at the upstream, admitting none of it since (and
    /// the upstream never running the limit meanwhile).
    starving: HashMap<(usize, u32, Budget), u64>,
}

impl Checker {
    /// `cover_us`: the manual's bound on the requests a share covers
    /// while its node cannot renew it.
    pub fn new(sc: &Scenario, cover_us: u64) -> Self {
        Self {
            lease_us: sc.lease_us(),
            cover_us,
            session_limit: sc.session_limit,
            web_limit: sc.web_limit,
            policy: sc.policy,
            flights: BTreeMap::new(),
            applied: HashMap::new(),
            answered: HashMap::new(),
            waiting: BTreeMap::new(),
            drain_us: sc.lease_us() / 3 + 4 * (sc.one_way_us + sc.jitter_us) + 10_000,
            excess: None,
            starving: HashMap::new(),
        }
    }

    fn limit(&self, b: Budget) -> u32 {
        match b {
            Budget::Web => self.web_limit,
            Budget::Session(_) => self.session_limit,
        }
    }

    pub fn waiting(&mut self, req: u64, now: u64, budgets: &[Budget]) {
        self.waiting.insert(req, (now, budgets.to_vec()));
        self.unless_room(budgets);
    }

    pub fn ended_waiting(&mut self, req: u64) {
        self.waiting.remove(&req);
    }

    /// A request the upstream now runs; `lifted`: admitted while its node
    /// counted the store down (past the limit under `onStoreDown =
    /// local`, by the manual).
    pub fn admit(&mut self, req: u64, node: usize, inc: u32, budgets: &[Budget], now: u64, lifted: bool) {
        let lifted = lifted && self.policy == Policy::Local;
        self.flights.insert(
            req,
            Flight {
                node,
                inc,
                admitted_us: now,
                budgets: budgets.iter().map(|b| (*b, lifted)).collect(),
                known: vec![None; budgets.len()],
                past_at: 0,
            },
        );
        if let Some(v) = self.admitted_into_known_excess(req, now) {
            self.excess = Some(v);
        }
        for b in budgets {
            self.starving.remove(&(node, inc, *b));
        }
        self.unless_room(budgets);
    }

    /// What of budget `b` may be held: the requests the upstream runs and
    /// those not decided yet.
    fn occupied(&self, b: Budget) -> usize {
        self.in_flight(b, false).len() + self.waiting.values().filter(|(_, bs)| bs.contains(&b)).count()
    }

    /// No node starves for a budget that was full meanwhile.
    fn unless_room(&mut self, budgets: &[Budget]) {
        for b in budgets {
            if self.occupied(*b) >= self.limit(*b) as usize {
                self.starving.retain(|(_, _, x), _| x != b);
            }
        }
    }

    /// A request admitted while its budget is over the limit by requests
    /// the store has known of long enough for every node to have heard
    /// (a renewal period and the store's round trips): an excess must
    /// drain, not be refilled.
    fn admitted_into_known_excess(&self, req: u64, now: u64) -> Option<Violation> {
        let f = self.flights.get(&req)?;
        // An admission the policy lifts the limit for is not held to it.
        for (b, _) in f.budgets.iter().filter(|(_, lifted)| !lifted) {
            // Past the limit but known to the store again long enough
            // for every node to have heard, while its node still renews.
            let known = |g: &Flight| {
                let renews = |b: &Budget| {
                    let last = self.applied.get(&(g.node, g.inc, *b)).copied().unwrap_or(0);
                    now.saturating_sub(last) <= self.lease_us
                };
                g.budgets.iter().zip(&g.known).any(|((x, past), k)| {
                    *x == *b && (!*past || (k.is_some_and(|k| k + self.drain_us <= now) && renews(x)))
                })
            };
            let counted: Vec<u64> = self.flights.iter().filter(|(_, g)| known(g)).map(|(r, _)| *r).collect();
            if counted.len() > self.limit(*b) as usize {
                return Some(Violation::Refilled {
                    budget: *b,
                    in_flight: counted.len(),
                    limit: self.limit(*b),
                    req,
                });
            }
        }
        None
    }

    /// A violation found at an admission, taken by the next verify.
    pub fn take_excess(&mut self) -> Option<Violation> {
        self.excess.take()
    }

    pub fn end(&mut self, req: u64) {
        self.flights.remove(&req);
    }

    pub fn applied(&mut self, node: usize, inc: u32, budget: Budget, sent_us: u64, now: u64) {
        let e = self.applied.entry((node, inc, budget)).or_insert(0);
        *e = (*e).max(sent_us);
        for f in self.flights.values_mut().filter(|f| f.node == node && f.inc == inc) {
            for ((b, past), known) in f.budgets.iter().zip(f.known.iter_mut()) {
                if *b == budget && *past && known.is_none() && sent_us >= f.past_at {
                    *known = Some(now);
                }
            }
        }
    }

    pub fn claim_outcome(&mut self, node: usize, inc: u32, budget: Budget, answered: bool, now: u64) {
        let e = self.answered.entry((node, inc, budget)).or_default();
        if answered { e.0 = Some(now) } else { e.1 = Some(now) }
    }

    /// Lets past the limit the requests the manual lets past it by now
    /// (before the step at `now` changes anything).
    pub fn age(&mut self, now: u64) {
        for f in self.flights.values_mut() {
            if now.saturating_sub(f.admitted_us) <= self.cover_us {
                continue;
            }
            for (b, past) in &mut f.budgets {
                let last = self.applied.get(&(f.node, f.inc, *b)).copied().unwrap_or(0);
                if !*past && now.saturating_sub(last) > self.lease_us {
                    *past = true;
                    f.past_at = now;
                }
            }
        }
    }

    fn in_flight(&self, b: Budget, counted_only: bool) -> Vec<(u64, &Flight)> {
        self.flights
            .iter()
            .filter(|(_, f)| f.budgets.iter().any(|(x, past)| *x == b && !(counted_only && *past)))
            .map(|(r, f)| (*r, f))
            .collect()
    }

    /// The invariant after a step.
    pub fn verify(&mut self, now: u64) -> Option<Violation> {
        let refilled = self.take_excess();
        let mut budgets: Vec<Budget> =
            self.flights.values().flat_map(|f| f.budgets.iter().map(|b| b.0)).collect();
        budgets.sort();
        budgets.dedup();
        for b in budgets {
            let counted = self.in_flight(b, true);
            if counted.len() > self.limit(b) as usize {
                let requests = counted
                    .iter()
                    .map(|(r, f)| {
                        format!(
                            "{r}@node{}#{} for {} ms",
                            f.node,
                            f.inc,
                            now.saturating_sub(f.admitted_us) / 1000
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(", ");
                return Some(Violation::Overshoot {
                    budget: b,
                    in_flight: counted.len(),
                    limit: self.limit(b),
                    requests,
                });
            }
        }
        refilled
    }

    /// Whether every budget of a request had room (fewer than its limit
    /// in flight, every request counted).
    pub fn room(&self, budgets: &[Budget]) -> bool {
        budgets.iter().all(|b| self.in_flight(*b, false).len() < self.limit(*b) as usize)
    }

    /// A refusal of a request that arrived at `arrived`: a reason that
    /// names a limit needs a store that answered. Wrong when, as the
    /// request arrived, the node's last claim of that budget had failed
    /// and none was answered since.
    pub fn refusal(
        &self,
        node: usize,
        inc: u32,
        budgets: &[Budget],
        reason: &'static str,
        arrived: u64,
    ) -> Option<Violation> {
        let budget = match reason {
            "fleet_session" => budgets.iter().find(|b| matches!(b, Budget::Session(_)))?,
            "fleet_web" => budgets.iter().find(|b| **b == Budget::Web)?,
            _ => return None,
        };
        let (answered, failed) = self.answered.get(&(node, inc, *budget)).copied().unwrap_or_default();
        let failed_before = failed.is_some_and(|f| f <= arrived && answered.is_none_or(|a| a < f));
        let answered_since = answered.is_some_and(|a| a >= arrived);
        (failed_before && !answered_since).then_some(Violation::WrongReason { node, budget: *budget, reason })
    }

    /// A refusal by a fleet limit with room at the upstream: wrong when
    /// its node has refused that budget so for two leases, admitting none.
    pub fn starved(
        &mut self,
        node: usize,
        inc: u32,
        budgets: &[Budget],
        reason: &str,
        now: u64,
    ) -> Option<Violation> {
        let budget = *match reason {
            "fleet_session" => budgets.iter().find(|b| matches!(b, Budget::Session(_)))?,
            "fleet_web" => budgets.iter().find(|b| **b == Budget::Web)?,
            _ => return None,
        };
        if self.occupied(budget) >= self.limit(budget) as usize {
            self.unless_room(&[budget]);
            return None;
        }
        let since = *self.starving.entry((node, inc, budget)).or_insert(now);
        let room_us = now - since;
        (room_us >= 2 * self.lease_us).then_some(Violation::Starved { node, budget, room_us })
    }

    /// When a waiting request arrived.
    pub fn arrived(&self, req: u64) -> Option<u64> {
        self.waiting.get(&req).map(|w| w.0)
    }

    /// A request still waiting at the end.
    pub fn stuck(&self, now: u64) -> Option<Violation> {
        self.waiting.iter().next().map(|(r, (since, _))| Violation::Stuck { req: *r, waited_us: now - since })
    }
}
