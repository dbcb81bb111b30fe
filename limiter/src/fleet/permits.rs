//! The fleet's state on this node and the request's path: the live
//! limits, this node's shares ([`super::shares`]), taking a request's
//! units of its budgets (from the share, or after one claim) and giving
//! them back. Every unit taken and every wait for a claim is a guard: a
//! request dropped anywhere (an HTTP/2 stream reset while it waits, a
//! refusal by its other budget) gives back what it held and stops waiting
//! in the count.

use std::{
    fmt::Write as _,
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use redis::Script;
use ring::hmac;
use tokio::sync::Notify;

use super::{
    claim::{Answer, Claim, SCRIPT},
    error::FleetError,
    health::Health,
    members::Members,
    shares::{Budgets, Down, Kind, Take, Why, Within},
    store::{Store, StoreConn},
};
use crate::{
    admission::{Refusal, normalised},
    config::{FleetConfig, OnStoreDown},
    histogram::Histogram,
};

/// The live keys (`fleet.max*Connections`, `timeoutMs`, `onStoreDown`).
#[derive(Debug, Default)]
pub(super) struct Live {
    pub(super) session: AtomicU32,
    pub(super) web: AtomicU32,
    pub(super) timeout_us: AtomicU64,
    /// `OnStoreDown` as its index in [`OnStoreDown::ALL`].
    pub(super) on_store_down: AtomicU32,
}

/// Counters for metrics and `/status`.
#[derive(Debug, Default)]
pub(super) struct Stats {
    /// Claims on requests' paths (one round trip each).
    pub(super) claims: AtomicU64,
    /// Claims that gave back what no request used while other nodes
    /// wanted it.
    pub(super) releases: AtomicU64,
    pub(super) failures: AtomicU64,
    pub(super) unpublished: AtomicU64,
    /// Requests admitted within the safe share with the store down.
    pub(super) safe: AtomicU64,
    pub(super) renewals: AtomicU64,
    /// Requests whose share's trust ended here while they ran (a pause, a
    /// partition, a store away), re-published.
    pub(super) lapsed: AtomicU64,
    /// Times the store was found to have lost data (a group went quiet).
    pub(super) quiet: AtomicU64,
    /// The smallest trust left when a renewal was sent, in the last round
    /// (µs; `u64::MAX`: none yet).
    pub(super) margin_us: AtomicU64,
    /// The web budget's fleet-wide shares as last seen (`u32::MAX`: never).
    pub(super) web_fleet: AtomicU32,
}

/// The number of session groups: a session's budget and its group's
/// epoch share a hash slot, and the groups spread over a cluster's
/// masters.
pub const SESSION_GROUPS: usize = 16;

/// How long a budget's key lives in the store without a claim: only the
/// keys of nodes that all stopped at once wait for it (docs/fleet.md: a
/// step of the store's clock up to this long ends nothing).
pub const KEY_TTL: Duration = Duration::from_secs(3600);

/// The fleet's limits on this node.
pub struct Fleet {
    pub(super) name: String,
    pub(super) lease: Duration,
    hash_key: Option<hmac::Key>,
    pub(super) web_key: Arc<str>,
    /// Every group's epoch key (the web budget's first).
    pub(super) groups: Vec<Arc<str>>,
    /// `<node>.<incarnation>`: this process's field.
    pub(super) me: String,
    pub(super) live: Live,
    pub(super) store: Arc<Store>,
    pub(super) up: AtomicBool,
    /// Since when tries to connect have been refused, each soon after the
    /// last (µs after `born`; 0: the last was not), and the last: no Redis
    /// listens where the store is (dead for every node, not only out of
    /// this one's reach).
    refused_since_us: AtomicU64,
    refused_last_us: AtomicU64,
    /// When this node found the store down (µs since `born`; 0: up).
    down_since_us: AtomicU64,
    born: Instant,
    pub(super) health: Health,
    budgets: Mutex<Budgets>,
    pub(super) members: Mutex<Members>,
    /// Wakes the probe at once (the store was just found down).
    pub(super) probe_now: Arc<Notify>,
    claim: Script,
    round_trip: Histogram,
    pub(super) stats: Stats,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet").field("store", &self.store.describe()).finish_non_exhaustive()
    }
}

/// How long the first connection may take at start before the daemon
/// serves anyway (the store counts as down until the probe reaches it).
const FIRST_CONNECT: Duration = Duration::from_secs(2);

impl Fleet {
    /// The fleet of `config` on this node, not connected yet. `node`
    /// names this machine and daemon (see `daemon::fleet_identity`);
    /// `None`: no `fleet.store`.
    pub(super) fn new(config: &FleetConfig, node: &str) -> Option<Arc<Self>> {
        let url = config.store.clone()?;
        let node = hex(&digest(node.as_bytes()).as_ref()[..8]);
        let incarnation: [u8; 8] = rand_bytes();
        let lease = Duration::from_millis(config.lease_ms);
        let name = config.name.clone();
        let groups = epochs_for(&name).into_iter().map(Arc::from).collect();
        let fleet = Arc::new(Self {
            web_key: format!("limiter:{{{}}}", web_tag(&name)).into(),
            groups,
            name,
            lease,
            hash_key: config.hash_key.as_ref().map(|k| hmac::Key::new(hmac::HMAC_SHA256, k.0.as_bytes())),
            me: format!("{node}.{}", hex(&incarnation)),
            live: Live::default(),
            store: Arc::new(Store::new(url, config.password.as_ref().map(|p| p.0.clone()))),
            // Up until the first connection says otherwise (so that its
            // failure is said, once, as any other).
            up: AtomicBool::new(true),
            refused_since_us: AtomicU64::new(0),
            refused_last_us: AtomicU64::new(0),
            down_since_us: AtomicU64::new(0),
            born: Instant::now(),
            health: Health::default(),
            budgets: Mutex::new(Budgets::new(lease, u64::from_le_bytes(rand_bytes()))),
            members: Mutex::new(Members::new(lease)),
            probe_now: Arc::new(Notify::new()),
            claim: Script::new(SCRIPT),
            round_trip: Histogram::default(),
            stats: Stats {
                web_fleet: AtomicU32::new(u32::MAX),
                margin_us: AtomicU64::new(u64::MAX),
                ..Stats::default()
            },
        });
        fleet.set_live(config);
        Some(fleet)
    }

    /// Connects to the store (within a couple of seconds: a store that is
    /// not there yet is down, and the probe keeps trying), checks that it
    /// is a primary and that this node's hash key is the fleet's, warns
    /// of a policy that could evict the fleet's keys, and reads every
    /// group's epoch (a store that lost the fleet's data, or never had it,
    /// starts quiet for a lease).
    pub(super) async fn connect(self: &Arc<Self>) -> Result<(), FleetError> {
        // Each step within the one deadline: a store that stops answering
        // half-way does not hold the daemon's start.
        let steps = async {
            let mut conn = match self.store.reconnect(FIRST_CONNECT).await {
                Ok(conn) => conn,
                Err(e) => {
                    self.tried_to_connect(e.is_connection_refusal());
                    return Ok(Err(format!("cannot connect: {e}")));
                }
            };
            if let Err(e) = conn.query::<String>(&redis::cmd("PING")).await {
                return Ok(Err(format!("PING failed: {e}")));
            }
            self.store.check_primary(&mut conn).await?;
            self.check_fingerprint(&mut conn).await?;
            self.store.warn_of_eviction(&mut conn).await;
            Ok::<_, FleetError>(Ok(()))
        };
        match tokio::time::timeout(FIRST_CONNECT, steps).await {
            Ok(Ok(Ok(()))) => {
                if !self.read_epochs(true).await {
                    self.went_down("reading the fleet's epochs failed");
                }
                tracing::info!(store = %self.store.describe(), name = %self.name, "fleet store connected");
            }
            Ok(Ok(Err(why))) => self.went_down(&why),
            Ok(Err(fatal)) => return Err(fatal),
            Err(_) => self.went_down("the store did not answer within 2 s"),
        }
        Ok(())
    }

    /// This node's hash key, as the fleet's store keeps it: a keyed hash
    /// of a fixed text (never the key), the same on every node with the
    /// same key file.
    fn fingerprint(&self) -> Option<String> {
        let tag = hmac::sign(self.hash_key.as_ref()?, b"limiter fleet hash key fingerprint v1");
        Some(hex(&tag.as_ref()[..16]))
    }

    /// Publishes this node's fingerprint where none is, and checks it
    /// against the fleet's: `Err` when they differ.
    pub(super) async fn check_fingerprint(&self, conn: &mut StoreConn) -> Result<(), FleetError> {
        let Some(ours) = self.fingerprint() else { return Ok(()) };
        let key = format!("limiter:{{{}}}:hash-key-fingerprint", self.name);
        let set = conn.query::<Option<String>>(redis::cmd("SET").arg(&key).arg(&ours).arg("NX")).await;
        let theirs = conn.query::<Option<String>>(redis::cmd("GET").arg(&key)).await;
        match (set, theirs) {
            (Ok(_), Ok(Some(theirs))) if theirs != ours => Err(FleetError::HashKey {
                name: self.name.clone(),
                store: self.store.describe(),
                theirs,
                ours,
            }),
            // Unreadable: the claims will find out whether the store answers.
            _ => Ok(()),
        }
    }

    /// Applies the live keys of a (re)loaded configuration (a new limit
    /// may leave room: claims wait no backoff after it).
    pub fn set_live(&self, config: &FleetConfig) {
        let l = &self.live;
        let session = l.session.swap(config.max_session_connections, Ordering::Relaxed);
        let web = l.web.swap(config.max_web_connections, Ordering::Relaxed);
        if (session, web) != (config.max_session_connections, config.max_web_connections) {
            self.lock().map.values_mut().for_each(|b| b.backoff = None);
        }
        l.timeout_us.store(config.timeout_ms.saturating_mul(1000), Ordering::Relaxed);
        let policy = OnStoreDown::ALL.iter().position(|p| *p == config.on_store_down).unwrap_or(0);
        l.on_store_down.store(policy as u32, Ordering::Relaxed);
    }

    pub(super) fn on_store_down(&self) -> OnStoreDown {
        OnStoreDown::ALL[self.live.on_store_down.load(Ordering::Relaxed) as usize % OnStoreDown::ALL.len()]
    }

    pub(super) fn timeout(&self) -> Duration {
        Duration::from_micros(self.live.timeout_us.load(Ordering::Relaxed))
    }

    /// The store key of a session, and its group's epoch key.
    fn session_key(&self, authorization: &[u8]) -> Option<(Arc<str>, Arc<str>)> {
        let (key, group) = session_key(&self.name, self.hash_key.as_ref()?, authorization);
        Some((key.into(), self.groups[1 + group].clone()))
    }

    /// The limit in force of a budget of `kind`.
    pub(super) fn limit(&self, kind: Kind) -> u32 {
        match kind {
            Kind::Session => self.live.session.load(Ordering::Relaxed),
            Kind::Web => self.live.web.load(Ordering::Relaxed),
        }
    }

    /// What a request beyond its node's share meets now: `None` while the
    /// store answers.
    fn down(&self, kind: Kind) -> Option<Down> {
        if self.up.load(Ordering::Relaxed) {
            return None;
        }
        Some(match self.on_store_down() {
            OnStoreDown::Local => Down::Local,
            OnStoreDown::Refuse => Down::Refuse,
            OnStoreDown::Share => Down::Share(self.safe_share(kind)),
        })
    }

    /// The safe share of a budget of `kind` with the store down: once the
    /// store has been down for a lease (every share granted before is past
    /// its trust) and refuses connections (it is down for every node, not
    /// only out of this one's reach), `floor(limit / N)` for the N live
    /// nodes seen in the last lease it answered ([`Members::safe_n`]).
    fn safe_share(&self, kind: Kind) -> Option<u32> {
        let (since, last) =
            (self.refused_since_us.load(Ordering::Relaxed), self.refused_last_us.load(Ordering::Relaxed));
        if self.up.load(Ordering::Relaxed) || since == 0 {
            return None;
        }
        let (since, last) =
            (self.born + Duration::from_micros(since), self.born + Duration::from_micros(last));
        // Refused for a lease (every share granted before is past its
        // trust), and lately: the probe tries every third of a lease at
        // most, so a store that came back is found (and this node's
        // requests republished) before its quiet ends.
        if since.elapsed() < self.lease || last.elapsed() > refusal_holds(self.lease) {
            return None;
        }
        // The live nodes as seen up to when this node found the store down
        // (not when it first found it refusing: a probe comes a while
        // later, and by then its last view of the nodes may be older than
        // half a lease).
        let down = self.down_since_us.load(Ordering::Relaxed);
        let down = if down == 0 { since } else { self.born + Duration::from_micros(down) };
        let nodes = self.members.lock().unwrap_or_else(std::sync::PoisonError::into_inner).safe_n(down)?;
        Some(self.limit(kind) / nodes.max(1))
    }

    /// Takes a unit of each budget the request counts against: from this
    /// node's share when it fits (no round trip), else after a claim (one
    /// round trip, shared with the requests that come while it is out),
    /// none for a request no fleet limit applies to. Returns what it holds
    /// (to be dropped with the request) and, if a limit refused, which:
    /// the caller refuses or, in dry-run, goes on with what was taken.
    /// Dropped before it returns, it holds nothing.
    pub async fn acquire(
        self: &Arc<Self>,
        web: bool,
        session: Option<&[u8]>,
    ) -> (Option<FleetUnits>, Option<Refusal>) {
        let web = web && self.limit(Kind::Web) > 0;
        let session = session.filter(|_| self.limit(Kind::Session) > 0).and_then(|a| self.session_key(a));
        let web_budget = || (self.web_key.clone(), self.groups[0].clone());
        // Nothing allocated, nothing asked, for a request no fleet limit
        // applies to.
        let (web, session) = match (web, session) {
            (false, None) => return (None, None),
            (true, None) => (Some(self.take(Kind::Web, web_budget()).await), None),
            (false, Some(s)) => (None, Some(self.take(Kind::Session, s).await)),
            (true, Some(s)) => {
                // Joined: a unit one of them took is a guard inside the
                // join, given back if the join is dropped.
                let (w, s) = tokio::join!(self.take(Kind::Web, web_budget()), self.take(Kind::Session, s));
                (Some(w), Some(s))
            }
        };
        let mut held = Vec::with_capacity(2);
        let mut refusal = None;
        for outcome in [web, session].into_iter().flatten() {
            match outcome {
                Ok(unit) => held.push(unit),
                // A store that did not answer is said first: it is what
                // an operator has to act on.
                Err(r) if refusal.is_none() || r == Refusal::FleetDown => refusal = Some(r),
                Err(_) => {}
            }
        }
        ((!held.is_empty()).then_some(FleetUnits { units: held }), refusal)
    }

    /// One budget's unit for a request.
    async fn take(self: &Arc<Self>, kind: Kind, (key, group): (Arc<str>, Arc<str>)) -> Result<Unit, Refusal> {
        let mut round = 0;
        loop {
            let step = self.lock().take(
                &key,
                kind,
                &group,
                self.limit(kind),
                Instant::now(),
                self.down(kind),
                round,
            );
            let mut answered = match step {
                Take::Taken(within) => {
                    match within {
                        Within::Share => {}
                        Within::Local => _ = self.stats.unpublished.fetch_add(1, Ordering::Relaxed),
                        Within::Safe => _ = self.stats.safe.fetch_add(1, Ordering::Relaxed),
                    }
                    return Ok(Unit { fleet: self.clone(), key });
                }
                Take::Refused(Why::Limit) => return Err(kind.refusal()),
                Take::Refused(Why::Down) => return Err(Refusal::FleetDown),
                Take::Wait(answered) => answered,
                Take::Claim(claim, answered) => {
                    self.stats.claims.fetch_add(1, Ordering::Relaxed);
                    // A task of its own: a request dropped while it waits
                    // (an HTTP/2 reset) does not drop the claim, whose
                    // answer then stands as any other.
                    let fleet = self.clone();
                    tokio::spawn(async move { fleet.claim_and_apply(claim, Sent::ForRequests).await });
                    answered
                }
            };
            // The receiver was taken with the claim marked out: its answer
            // (or its end) cannot be missed. The guard stops counting this
            // request as waiting however the wait ends.
            let waiting = Waiting { fleet: self, key: &key };
            let late = tokio::time::timeout(self.timeout(), answered.changed()).await.is_err();
            drop(waiting);
            if late {
                // This request is refused; the store stays up unless more
                // claims fail (the answer, when it comes, stands).
                return Err(Refusal::FleetDown);
            }
            round += 1;
        }
    }

    /// Sends `claim`, applies what the store answers (or that it did not),
    /// and counts the store's health by it.
    pub(super) async fn claim_and_apply(self: &Arc<Self>, claim: Claim, sent: Sent) -> bool {
        let answer = match self.store.conn() {
            Some(conn) => self.send(conn, &claim, true).await,
            None => Err("no connection".to_owned()),
        };
        let took = claim.sent.elapsed();
        let now = Instant::now();
        if sent == Sent::ForRequests {
            self.round_trip.record(took);
        }
        let ok = match &answer {
            Ok(a) => {
                self.apply(&claim, a, now);
                took <= self.timeout() || sent == Sent::Renewal
            }
            Err(why) => {
                if let Some(key) = &claim.key {
                    self.lock().failed(key, &claim, now);
                }
                tracing::debug!(why, "fleet: a claim failed");
                false
            }
        };
        if sent != Sent::Renewal && self.health.record(ok, now) {
            let why = match &answer {
                Ok(_) => format!(
                    "claims answered later than fleet.timeoutMs (the last after {} ms)",
                    took.as_millis()
                ),
                Err(e) => e.clone(),
            };
            self.went_down(&why);
        }
        // `claim.done` drops here: the requests waiting for it look again.
        answer.is_ok()
    }

    /// Sends one claim (within a third of the lease: past it the store
    /// counts as failing).
    /// `budget`: a budget's claim (not this node's field among the live
    /// nodes).
    async fn send(&self, mut conn: StoreConn, claim: &Claim, budget: bool) -> Result<Answer, String> {
        let limit = claim.key.as_ref().map_or(0, |_| self.limit(claim.kind));
        let mut script = self.claim.prepare_invoke();
        for key in claim.keys() {
            script.key(key);
        }
        let tomb = if budget { crate::lease::given_back_for(self.lease).as_millis() as u64 } else { 0 };
        for arg in claim.argv(&self.me, limit, KEY_TTL.as_millis() as u64, &self.wanted_channel(), tomb) {
            script.arg(arg);
        }
        match tokio::time::timeout(self.lease / 3, conn.eval::<String>(&script)).await {
            Ok(Ok(text)) => Answer::parse(&text),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("no answer within a third of fleet.leaseMs".to_owned()),
        }
    }

    /// What the store answered to `claim`.
    fn apply(&self, claim: &Claim, a: &Answer, now: Instant) {
        let mut budgets = self.lock();
        let (quiet_before, none_before) =
            (budgets.quiet.contains_key(&claim.group), budgets.quiet.is_empty());
        match &claim.key {
            Some(key) => budgets.answered(key, claim, a, now),
            None => budgets.saw_epoch(&claim.group, a.quiet.as_deref(), now),
        }
        let quiet_now = budgets.quiet.contains_key(&claim.group);
        drop(budgets);
        if quiet_now && !quiet_before {
            self.stats.quiet.fetch_add(1, Ordering::Relaxed);
            // Said once for the groups a loss quiets together.
            if none_before {
                tracing::warn!(
                    group = %claim.group,
                    generation = a.generation,
                    "fleet: the store does not hold what this fleet wrote (a restart, a flush, a failover to a replica that missed writes, an eviction, or the fleet's first start): no share of the groups it lost grows for fleet.leaseMs while the nodes republish theirs (limiter_fleet_quiet_groups)"
                );
            } else {
                tracing::debug!(group = %claim.group, generation = a.generation, "fleet: another group quiet");
            }
        }
        if claim.kind == Kind::Web && claim.key.is_some() {
            self.stats.web_fleet.store(a.others + a.share, Ordering::Relaxed);
        }
        if claim.lapsed {
            self.stats.lapsed.fetch_add(u64::from(claim.in_use), Ordering::Relaxed);
            tracing::warn!(
                budget = claim.kind.as_str(),
                in_flight = claim.in_use,
                "fleet: this node's share was past its trust while its requests ran (a pause, a partition or a store away): republished"
            );
        }
    }

    /// Reads (and, where absent, creates) the epochs of every group, or
    /// of the groups seen quiet for a lease (which ends their quiet):
    /// `true` when the store answered every one.
    pub(super) async fn read_epochs(self: &Arc<Self>, all: bool) -> bool {
        let now = Instant::now();
        let claims = {
            let mut budgets = self.lock();
            let due = if all { self.groups.clone() } else { budgets.quiet_due(now) };
            budgets.epochs(&due, now)
        };
        let mut set = tokio::task::JoinSet::new();
        for claim in claims {
            let fleet = self.clone();
            set.spawn(async move { fleet.claim_and_apply(claim, Sent::Renewal).await });
        }
        set.join_all().await.into_iter().all(|ok| ok)
    }

    /// The channel the store tells of wanted budgets on.
    pub(super) fn wanted_channel(&self) -> String {
        super::claim::wanted_channel(&self.name)
    }

    /// The store, for the listener of wanted budgets.
    pub(super) fn store_for_listening(&self) -> Arc<Store> {
        self.store.clone()
    }

    /// Another node wants more of budget `key`: what this node holds of
    /// it beyond its requests goes back now.
    pub(super) fn wanted(self: &Arc<Self>, key: &str) {
        let key: Arc<str> = key.into();
        let claim = self.lock().wanted(&key, Instant::now());
        if let Some(claim) = claim {
            self.stats.releases.fetch_add(1, Ordering::Relaxed);
            let fleet = self.clone();
            tokio::spawn(async move { fleet.claim_and_apply(claim, Sent::Release).await });
        }
    }

    /// The live nodes' hash and its epoch (the fleet's own hash tag).
    pub(super) fn members_key(&self) -> (Arc<str>, Arc<str>) {
        let (key, epoch) = members_for(&self.name);
        (key.into(), epoch.into())
    }

    /// Renews this node's field among the fleet's live nodes.
    pub(super) async fn renew_membership(self: &Arc<Self>, claim: Claim) -> bool {
        let answer = match self.store.conn() {
            Some(conn) => self.send(conn, &claim, false).await,
            None => Err("no connection".to_owned()),
        };
        match answer {
            Ok(a) => {
                let mut members = self.members.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                members.answered(&a, claim.sent, Instant::now());
                true
            }
            Err(why) => {
                tracing::debug!(why, "fleet: renewing this node's field among the live nodes failed");
                false
            }
        }
    }

    /// Marks the store down (once: the first failure says so).
    pub(super) fn went_down(&self, why: &str) {
        self.stats.failures.fetch_add(1, Ordering::Relaxed);
        if self.up.swap(false, Ordering::Relaxed) {
            self.down_since_us.store(self.born.elapsed().as_micros().max(1) as u64, Ordering::Relaxed);
            let policy = self.on_store_down().as_str();
            tracing::warn!(
                store = %self.store.describe(),
                why,
                "fleet store down: requests that need a fleet permit meet fleet.onStoreDown = {policy} until it answers again"
            );
            self.probe_now.notify_one();
        }
    }

    /// Whether a try to connect was refused (`true`) or not.
    pub(super) fn tried_to_connect(&self, refused: bool) {
        if !refused {
            self.refused_since_us.store(0, Ordering::Relaxed);
            self.refused_last_us.store(0, Ordering::Relaxed);
            return;
        }
        let now = self.born.elapsed().as_micros().max(1) as u64;
        let last = self.refused_last_us.swap(now, Ordering::Relaxed);
        let streak = last != 0 && now - last <= refusal_holds(self.lease).as_micros() as u64;
        if !streak {
            self.refused_since_us.store(now, Ordering::Relaxed);
        }
    }

    /// The store answers again.
    pub(super) fn came_up(&self) {
        self.up.store(true, Ordering::Relaxed);
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Budgets> {
        self.budgets.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Gives back a unit (its request is done): while other nodes want
    /// more, what this node then holds beyond its requests goes back now.
    fn release(self: &Arc<Self>, key: &Arc<str>) {
        let claim = self.lock().give_back(key, Instant::now());
        if let Some(claim) = claim {
            self.stats.releases.fetch_add(1, Ordering::Relaxed);
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    let fleet = self.clone();
                    rt.spawn(async move { fleet.claim_and_apply(claim, Sent::Release).await });
                }
                // No runtime (the daemon is gone): it keeps what it had,
                // which its lease ends.
                Err(_) => self.lock().failed(key, &claim, Instant::now()),
            }
        }
    }

    /// Gives back every share not in use (a daemon that stops: what it
    /// held goes back now, not with its lease), within `within`: `true`
    /// when the store took it.
    pub async fn settle(self: &Arc<Self>, within: Duration) -> bool {
        if !self.up.load(Ordering::Relaxed) {
            return false;
        }
        for b in self.lock().map.values_mut() {
            b.wanted = b.in_use;
            b.contended = None;
        }
        tokio::time::timeout(within, self.renew(true)).await.unwrap_or(false)
    }

    /// The round trips of the claims on requests' paths.
    pub fn round_trip(&self) -> &Histogram {
        &self.round_trip
    }

    pub fn snapshot(&self) -> Snapshot {
        let budgets = self.lock();
        let ((shares, in_use), mut sessions) = (budgets.totals(), Vec::new());
        for (key, b) in &budgets.map {
            if b.kind == Kind::Session {
                sessions.push(SessionView {
                    key: short_key(key),
                    here: b.in_use,
                    share: b.share,
                    fleet: b.fleet,
                });
            }
        }
        let quiet_groups = budgets.quiet.len();
        drop(budgets);
        let tracked_sessions = sessions.len();
        sessions.sort_by(|a, b| b.fleet.cmp(&a.fleet).then(b.here.cmp(&a.here)).then(a.key.cmp(&b.key)));
        sessions.truncate(BUSIEST);
        let s = &self.stats;
        let web_fleet = s.web_fleet.load(Ordering::Relaxed);
        let margin = s.margin_us.load(Ordering::Relaxed);
        let members = self.members.lock().unwrap_or_else(std::sync::PoisonError::into_inner).seen();
        Snapshot {
            store: self.store.describe(),
            name: self.name.clone(),
            node: self.me.clone(),
            up: self.up.load(Ordering::Relaxed),
            session_limit: self.limit(Kind::Session),
            web_limit: self.limit(Kind::Web),
            lease_ms: self.lease.as_millis() as u64,
            on_store_down: self.on_store_down().as_str().to_owned(),
            held_session: in_use[0],
            held_web: in_use[1],
            share_session: shares[0],
            share_web: shares[1],
            web_fleet: (web_fleet != u32::MAX).then_some(web_fleet),
            nodes: members,
            quiet_groups,
            tracked_sessions,
            busiest_sessions: sessions,
            claims: s.claims.load(Ordering::Relaxed),
            releases: s.releases.load(Ordering::Relaxed),
            store_failures: s.failures.load(Ordering::Relaxed),
            admitted_unpublished: s.unpublished.load(Ordering::Relaxed),
            admitted_safe: s.safe.load(Ordering::Relaxed),
            renewals: s.renewals.load(Ordering::Relaxed),
            lease_lapsed: s.lapsed.load(Ordering::Relaxed),
            store_lost_data: s.quiet.load(Ordering::Relaxed),
            lease_margin_ms: (margin != u64::MAX).then_some(margin as f64 / 1000.0),
        }
    }
}

/// How long a refused connection says the store is down for every node:
/// the probe's longest wait and a tenth of the lease.
pub fn refusal_holds(lease: Duration) -> Duration {
    Duration::from_secs(1).min(lease / 3) + lease / 10
}

/// Why a claim was sent: its answer counts for the store's health unless
/// it is a renewal (a renewal round that fails marks the store down by
/// itself).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Sent {
    ForRequests,
    Release,
    Renewal,
}

/// The hash tag of the web budget: its key and its epoch's.
fn web_tag(name: &str) -> String {
    format!("{name}:web")
}

/// The hash tag of session group `g`.
fn session_tag(name: &str, g: usize) -> String {
    format!("{name}:s:{g:x}")
}

fn epoch_key(tag: &str) -> Arc<str> {
    format!("limiter:{{{tag}}}:epoch").into()
}

/// The store key of a session's budget in fleet `name` (128 bits of
/// HMAC-SHA256 under the hash key of its normalised `Authorization`
/// value, in the group of its first hex digit), and that group.
fn session_key(name: &str, hash_key: &hmac::Key, authorization: &[u8]) -> (String, usize) {
    let mut ctx = hmac::Context::with_key(hash_key);
    normalised(authorization, |b| ctx.update(b));
    let h = hex(&ctx.sign().as_ref()[..16]);
    let group = usize::from_str_radix(&h[..1], 16).unwrap_or(0) % SESSION_GROUPS;
    (format!("limiter:{{{}}}:{h}", session_tag(name, group)), group)
}

/// [`session_key`] under the hash key as `fleet.hashKeyFile` holds it: an
/// operator's (or a test's) way from a token to the key of its budget.
pub fn session_key_for(name: &str, hash_key: &str, authorization: &[u8]) -> String {
    session_key(name, &hmac::Key::new(hmac::HMAC_SHA256, hash_key.as_bytes()), authorization).0
}

/// The web clients' budget's key in fleet `name`.
pub fn web_key_for(name: &str) -> String {
    format!("limiter:{{{}}}", web_tag(name))
}

/// The epoch key of the group of budget `key` (its hash tag's).
pub fn epoch_of(key: &str) -> String {
    let tag = key.find('{').zip(key.find('}')).map_or(key, |(a, b)| &key[a + 1..b]);
    epoch_key(tag).to_string()
}

/// Every group's epoch key in fleet `name`, the web budget's first.
pub fn epochs_for(name: &str) -> Vec<String> {
    std::iter::once(epoch_key(&web_tag(name)))
        .chain((0..SESSION_GROUPS).map(|g| epoch_key(&session_tag(name, g))))
        .map(|k| k.to_string())
        .collect()
}

/// The live nodes' hash of fleet `name`, and its epoch.
pub fn members_for(name: &str) -> (String, String) {
    (format!("limiter:{{{name}}}:nodes"), epoch_key(name).to_string())
}

/// Sessions `/status` lists, busiest first.
const BUSIEST: usize = 10;

/// A request waiting for a claim: counted until dropped, however the
/// wait ends.
struct Waiting<'a> {
    fleet: &'a Fleet,
    key: &'a Arc<str>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.fleet.lock().waited(self.key);
    }
}

/// One unit of one budget, given back when dropped.
struct Unit {
    fleet: Arc<Fleet>,
    key: Arc<str>,
}

impl Drop for Unit {
    fn drop(&mut self) {
        self.fleet.release(&self.key);
    }
}

/// The fleet units a request holds; given back when dropped (with its
/// local permit, to which it is attached).
pub struct FleetUnits {
    units: Vec<Unit>,
}

impl std::fmt::Debug for FleetUnits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.units.iter().map(|u| &u.key)).finish()
    }
}

/// The fleet as `/status`, `dump` and `top` show it.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Snapshot {
    /// `fleet.store` (never a password) and `fleet.name`.
    pub store: String,
    pub name: String,
    /// This process's field in the store (`<node>.<incarnation>`).
    #[serde(default)]
    pub node: String,
    /// The store answers.
    pub up: bool,
    pub session_limit: u32,
    pub web_limit: u32,
    pub lease_ms: u64,
    pub on_store_down: String,
    /// Requests in flight here that hold a unit of a fleet budget, by kind.
    pub held_session: u32,
    pub held_web: u32,
    /// The shares this node holds, by kind.
    #[serde(default)]
    pub share_session: u32,
    #[serde(default)]
    pub share_web: u32,
    /// The web clients' fleet-wide shares as the store last said them.
    pub web_fleet: Option<u32>,
    /// The fleet's live nodes, as this node last saw them (the safe
    /// share's N).
    #[serde(default)]
    pub nodes: Option<u32>,
    /// Groups this node sees quiet (the store lost data: no share grows).
    #[serde(default)]
    pub quiet_groups: usize,
    /// Sessions this node holds a share of, or a request of.
    pub tracked_sessions: usize,
    /// The busiest of them by their fleet-wide shares as last seen.
    pub busiest_sessions: Vec<SessionView>,
    /// Claims sent for requests beyond the share (one round trip each).
    #[serde(default)]
    pub claims: u64,
    /// Claims that gave back unused units while other nodes wanted them.
    #[serde(default)]
    pub releases: u64,
    /// Times the store was found failing: marked down, or failing again
    /// while down.
    pub store_failures: u64,
    /// Requests admitted with the store down in no share it counts
    /// (`onStoreDown = local`).
    pub admitted_unpublished: u64,
    /// Requests admitted within the safe share with the store down.
    #[serde(default)]
    pub admitted_safe: u64,
    pub renewals: u64,
    /// Requests whose share's trust ended while they ran.
    #[serde(default)]
    pub lease_lapsed: u64,
    /// Times this node found the store without the fleet's data.
    #[serde(default)]
    pub store_lost_data: u64,
    /// The least trust left when the last renewal round was sent (ms).
    #[serde(default)]
    pub lease_margin_ms: Option<f64>,
}

/// One session's budget, by the start of its hashed key.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SessionView {
    /// The first 12 hex digits of its keyed hash (no token).
    pub key: String,
    /// Its requests in flight here.
    pub here: u32,
    /// This node's share.
    #[serde(default)]
    pub share: u32,
    /// Every node's shares together, as last seen.
    pub fleet: u32,
}

/// `limiter:{name:s:a}:0123456789ab…` → `0123456789ab`.
pub fn short_key(key: &str) -> String {
    key.rsplit(':').next().unwrap_or(key).chars().filter(char::is_ascii_hexdigit).take(12).collect()
}

pub(super) fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

fn digest(bytes: &[u8]) -> ring::digest::Digest {
    ring::digest::digest(&ring::digest::SHA256, bytes)
}

fn rand_bytes<const N: usize>() -> [u8; N] {
    use ring::rand::{SecureRandom, SystemRandom};
    let mut out = [0; N];
    SystemRandom::new().fill(&mut out).expect("the system's random source");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_key_is_the_keyed_hash_of_its_normalised_value_in_its_group() {
        let k = |v: &str| session_key_for("f", "0123456789abcdef", v.as_bytes());
        assert_eq!(k("Bearer T"), k(" bearer   T"));
        assert_ne!(k("Bearer T"), k("Bearer t"));
        assert_ne!(k("Bearer T"), session_key_for("g", "0123456789abcdef", b"Bearer T"));
        assert_ne!(k("Bearer T"), session_key_for("f", "0123456789abcdeF", b"Bearer T"));
        let key = k("Bearer T");
        let h = key.rsplit(':').next().unwrap();
        assert_eq!(h.len(), 32);
        assert_eq!(key, format!("limiter:{{f:s:{}}}:{h}", &h[..1]), "its group is its first digit");
        assert!(!key.contains('T'), "{key}");
        // One credential however it is spelled (Basic decoded).
        assert_eq!(k("Basic dXNlcjpwYXM="), k("basic dXNlcjpwYXP"));
    }

    #[test]
    fn short_keys_are_the_start_of_the_hash() {
        assert_eq!(short_key("limiter:{default:s:0}:0123456789abcdef0123"), "0123456789ab");
    }

    #[test]
    fn a_budget_and_its_epoch_share_a_hash_tag() {
        let tag = |k: &str| k[k.find('{').unwrap()..=k.find('}').unwrap()].to_owned();
        for g in 0..SESSION_GROUPS {
            let (key, group) = session_key(
                "f",
                &hmac::Key::new(hmac::HMAC_SHA256, format!("key-{g}").as_bytes()),
                b"Bearer x",
            );
            assert_eq!(tag(&key), tag(&epoch_key(&session_tag("f", group))));
        }
        assert_eq!(tag(&web_key_for("f")), tag(&epoch_key(&web_tag("f"))));
        assert_eq!(epoch_of(&web_key_for("f")), epochs_for("f")[0]);
        let key = session_key_for("f", "0123456789abcdef", b"Bearer x");
        assert!(epochs_for("f").contains(&epoch_of(&key)));
    }
}
