//! The fleet's state on this node and the request's path: the live
//! limits, this node's shares ([`super::shares`]), taking a request's
//! units of its budgets (from the share, or after one claim) and giving
//! them back (here only: the share stays until a renewal gives back what
//! is not used).

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
    health::Health,
    shares::{Answer, Budgets, Kind, Take},
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
    pub(super) failures: AtomicU64,
    pub(super) unpublished: AtomicU64,
    pub(super) renewals: AtomicU64,
    /// Requests whose lease the store had let lapse while they ran (a
    /// pause, a partition, a store that lost it), re-taken.
    pub(super) lapsed: AtomicU64,
    /// The smallest lease left when a renewal was sent, in the last round
    /// (µs; `u64::MAX`: none yet).
    pub(super) margin_us: AtomicU64,
    /// The web budget's fleet-wide shares as last seen (`u32::MAX`: never).
    pub(super) web_fleet: AtomicU32,
}

/// The fleet's limits on this node.
pub struct Fleet {
    name: String,
    pub(super) lease: Duration,
    hash_key: Option<hmac::Key>,
    pub(super) web_key: Arc<str>,
    /// `<identity>.`: this node's fields start with it.
    node: String,
    /// `<identity>.<incarnation>.`: this process's field.
    me: String,
    started: Instant,
    pub(super) live: Live,
    pub(super) store: Store,
    pub(super) up: AtomicBool,
    pub(super) health: Health,
    budgets: Mutex<Budgets>,
    /// Wakes the probe at once (the store was just found down).
    pub(super) probe_now: Arc<Notify>,
    /// Whether another daemon serves the gate now (a handover).
    handover: Box<dyn Fn() -> bool + Send + Sync>,
    claim: Script,
    round_trip: Histogram,
    pub(super) stats: Stats,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet").field("store", &self.store.describe()).finish_non_exhaustive()
    }
}

/// Why the fleet's limits cannot start.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error(
        "fleet.hashKeyFile: this node's hash key is not the fleet's (fleet `{name}` on {store} holds the fingerprint {theirs}, this key's is {ours}): every node of a fleet must read the same key file, or sessions would be counted under two keys"
    )]
    HashKey { name: String, store: String, theirs: String, ours: String },
}

/// How long the first connection may take at start before the daemon
/// serves anyway (the store counts as down until the probe reaches it).
const FIRST_CONNECT: Duration = Duration::from_secs(2);

/// What a claim's script says.
type Claimed = (u32, u32, u32, u32, u32);

impl Fleet {
    /// The fleet of `config` on this node, not connected yet. `identity`
    /// names this node (the same after a restart); `handover` says whether
    /// another daemon serves the gate now. `None`: no `fleet.store`.
    pub(super) fn new(
        config: &FleetConfig,
        identity: &str,
        handover: Box<dyn Fn() -> bool + Send + Sync>,
    ) -> Option<Arc<Self>> {
        let url = config.store.clone()?;
        let node = format!("{}.", hex(&digest(identity.as_bytes()).as_ref()[..8]));
        let incarnation: [u8; 4] = rand_bytes();
        let fleet = Arc::new(Self {
            name: config.name.clone(),
            lease: Duration::from_millis(config.lease_ms),
            hash_key: config.hash_key.as_ref().map(|k| hmac::Key::new(hmac::HMAC_SHA256, k.0.as_bytes())),
            web_key: format!("limiter:{{{}:web}}", config.name).into(),
            me: format!("{node}{}.", hex(&incarnation)),
            node,
            started: Instant::now(),
            live: Live::default(),
            store: Store::new(url, config.password.as_ref().map(|p| p.0.clone())),
            // Up until the first connection says otherwise (so that its
            // failure is said, once, as any other).
            up: AtomicBool::new(true),
            health: Health::default(),
            budgets: Mutex::new(Budgets::default()),
            probe_now: Arc::new(Notify::new()),
            handover,
            claim: Script::new(include_str!("claim.lua")),
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
    /// not there yet is down, and the probe keeps trying) and checks that
    /// this node's hash key is the fleet's.
    pub(super) async fn connect(&self) -> Result<(), FleetError> {
        let ping = async {
            let mut conn =
                self.store.reconnect(FIRST_CONNECT).await.map_err(|e| format!("cannot connect: {e}"))?;
            conn.query::<String>(&redis::cmd("PING")).await.map_err(|e| format!("PING failed: {e}"))?;
            Ok::<_, String>(conn)
        };
        match tokio::time::timeout(FIRST_CONNECT, ping).await {
            Ok(Ok(mut conn)) => {
                self.check_fingerprint(&mut conn).await?;
                tracing::info!(store = %self.store.describe(), name = %self.name, "fleet store connected");
            }
            Ok(Err(why)) => self.went_down(&why),
            Err(_) => self.went_down("no answer to PING"),
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
            self.lock().map.values_mut().for_each(|b| b.quiet_until = None);
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

    /// The store key of a session.
    fn session_key(&self, authorization: &[u8]) -> Option<Arc<str>> {
        Some(session_key(&self.name, self.hash_key.as_ref()?, authorization).into())
    }

    /// The limit in force of a budget of `kind`.
    fn limit(&self, kind: Kind) -> u32 {
        match kind {
            Kind::Session => self.live.session.load(Ordering::Relaxed),
            Kind::Web => self.live.web.load(Ordering::Relaxed),
        }
    }

    /// Takes a unit of each budget the request counts against: from this
    /// node's share when it fits (no round trip), else after a claim (one
    /// round trip, shared with the requests that come while it is out),
    /// none for a request no fleet limit applies to. Returns what it holds
    /// (to be dropped with the request) and, if a limit refused, which:
    /// the caller refuses or, in dry-run, goes on with what was taken.
    pub async fn acquire(
        self: &Arc<Self>,
        web: bool,
        session: Option<&[u8]>,
    ) -> (Option<FleetUnits>, Option<Refusal>) {
        let web = web && self.limit(Kind::Web) > 0;
        let session = session.filter(|_| self.limit(Kind::Session) > 0).and_then(|a| self.session_key(a));
        // Nothing allocated, nothing asked, for a request no fleet limit
        // applies to.
        let (web, session) = match (web, session) {
            (false, None) => return (None, None),
            (true, None) => (Some(self.take(Kind::Web, self.web_key.clone()).await), None),
            (false, Some(key)) => (None, Some(self.take(Kind::Session, key).await)),
            (true, Some(key)) => {
                let (w, s) =
                    tokio::join!(self.take(Kind::Web, self.web_key.clone()), self.take(Kind::Session, key));
                (Some(w), Some(s))
            }
        };
        let mut held = Vec::with_capacity(2);
        let mut refusal = None;
        for outcome in [web, session].into_iter().flatten() {
            match outcome {
                Ok(key) => held.push(key),
                Err(r) => refusal = refusal.or(Some(r)),
            }
        }
        (FleetUnits::new(self, held), refusal)
    }

    /// One budget's unit for a request: `Ok` with the key it holds.
    async fn take(self: &Arc<Self>, kind: Kind, key: Arc<str>) -> Result<Arc<str>, Refusal> {
        let mut round = 0;
        loop {
            let down = (!self.up.load(Ordering::Relaxed)).then(|| self.on_store_down());
            let step = self.lock().take(&key, kind, self.limit(kind), Instant::now(), down, round);
            let mut answered = match step {
                Take::Taken { unpublished } => {
                    if unpublished {
                        self.stats.unpublished.fetch_add(1, Ordering::Relaxed);
                    }
                    return Ok(key);
                }
                Take::Refused { store_down } => {
                    return Err(if store_down { Refusal::FleetDown } else { kind.refusal() });
                }
                Take::Wait(answered) => answered,
                Take::Claim { needed, wanted, in_use, done, wait } => {
                    self.stats.claims.fetch_add(1, Ordering::Relaxed);
                    // A task of its own: a request dropped while it waits (an
                    // HTTP/2 reset) does not drop the claim, whose answer
                    // then stands as any other.
                    let (fleet, key) = (self.clone(), key.clone());
                    let asked = (needed, wanted);
                    tokio::spawn(
                        async move { fleet.claim_for_request(key, kind, asked, in_use, done).await },
                    );
                    wait
                }
            };
            // The receiver was taken with the claim marked out: its answer
            // (or its end) cannot be missed.
            let late = tokio::time::timeout(self.timeout(), answered.changed()).await.is_err();
            self.lock().waited(&key);
            if late {
                // This request is refused; the store stays up unless more
                // claims fail (the answer, when it comes, stands).
                return Err(Refusal::FleetDown);
            }
            round += 1;
        }
    }

    /// A claim sent for requests beyond the share; its answer wakes them.
    async fn claim_for_request(
        self: Arc<Self>,
        key: Arc<str>,
        kind: Kind,
        (needed, wanted): (u32, u32),
        in_use: u32,
        done: tokio::sync::watch::Sender<()>,
    ) {
        let sent = Instant::now();
        let answer = match self.store.conn() {
            Some(conn) => self.send_claim(conn, &key, kind, (needed, wanted), in_use).await,
            None => Err("no connection".to_owned()),
        };
        let took = sent.elapsed();
        self.round_trip.record(took);
        let now = Instant::now();
        match answer {
            Ok(a) => {
                self.apply(&key, kind, sent, a, in_use, true);
                if self.health.record(took <= self.timeout(), now) {
                    self.went_down(&format!(
                        "claims answered later than fleet.timeoutMs (the last after {} ms)",
                        took.as_millis()
                    ));
                }
            }
            Err(why) => {
                self.lock().claim_failed(&key, now);
                if self.health.record(false, now) {
                    self.went_down(&why);
                }
            }
        }
        let _ = done.send(());
    }

    /// Sends one claim (within a third of the lease: past it the store
    /// counts as failing).
    pub(super) async fn send_claim(
        &self,
        mut conn: StoreConn,
        key: &str,
        kind: Kind,
        (needed, wanted): (u32, u32),
        in_use: u32,
    ) -> Result<Answer, String> {
        let lease_ms = self.lease.as_millis() as u64;
        let mut script = self.claim.prepare_invoke();
        script.key(key).arg(&self.me).arg(self.limit(kind)).arg(lease_ms).arg(in_use).arg(wanted);
        script.arg(if self.purging() { self.node.as_str() } else { "" }).arg(needed);
        match tokio::time::timeout(self.lease / 3, conn.eval::<Claimed>(&script)).await {
            Ok(Ok((share, quiet, lapsed, others, others_demand))) => {
                Ok(Answer { share, quiet: quiet == 1, lapsed: lapsed == 1, others, others_demand })
            }
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("no answer within a third of fleet.leaseMs".to_owned()),
        }
    }

    /// What the store answered for `key` (a claim sent at `sent` with
    /// `in_use` in flight; `growth`: for requests beyond the share).
    pub(super) fn apply(
        &self,
        key: &Arc<str>,
        kind: Kind,
        sent: Instant,
        a: Answer,
        in_use: u32,
        growth: bool,
    ) {
        if kind == Kind::Web {
            self.stats.web_fleet.store(a.others + a.share, Ordering::Relaxed);
        }
        if a.lapsed && in_use > 0 {
            self.stats.lapsed.fetch_add(u64::from(in_use), Ordering::Relaxed);
            tracing::warn!(
                budget = kind.as_str(),
                in_flight = in_use,
                "fleet: this node's share had lapsed in the store while its requests ran (a pause, a partition or a store that lost it): re-taken"
            );
        }
        self.lock().claimed(key, sent, self.lease, a, growth, Instant::now());
    }

    /// The first lease and a third after start, with no handover under
    /// way: claims drop the previous incarnation's fields.
    fn purging(&self) -> bool {
        self.started.elapsed() < self.lease + self.lease / 3 && !(self.handover)()
    }

    /// Marks the store down (once: the first failure says so).
    pub(super) fn went_down(&self, why: &str) {
        self.stats.failures.fetch_add(1, Ordering::Relaxed);
        if self.up.swap(false, Ordering::Relaxed) {
            let policy = self.on_store_down().as_str();
            tracing::warn!(
                store = %self.store.describe(),
                why,
                "fleet store down: requests that need a fleet permit meet fleet.onStoreDown = {policy} until it answers again"
            );
            self.probe_now.notify_one();
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Budgets> {
        self.budgets.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Gives back what a request held (here: its share stays until a
    /// renewal gives back what is not used).
    fn release(&self, keys: &[Arc<str>]) {
        let mut budgets = self.lock();
        for key in keys {
            budgets.give_back(key);
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
        }
        tokio::time::timeout(within, self.renew_all()).await.unwrap_or(false)
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
        drop(budgets);
        let tracked_sessions = sessions.len();
        sessions.sort_by(|a, b| b.fleet.cmp(&a.fleet).then(b.here.cmp(&a.here)).then(a.key.cmp(&b.key)));
        sessions.truncate(BUSIEST);
        let s = &self.stats;
        let web_fleet = s.web_fleet.load(Ordering::Relaxed);
        let margin = s.margin_us.load(Ordering::Relaxed);
        Snapshot {
            store: self.store.describe(),
            name: self.name.clone(),
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
            tracked_sessions,
            busiest_sessions: sessions,
            claims: s.claims.load(Ordering::Relaxed),
            store_failures: s.failures.load(Ordering::Relaxed),
            admitted_unpublished: s.unpublished.load(Ordering::Relaxed),
            renewals: s.renewals.load(Ordering::Relaxed),
            lease_lapsed: s.lapsed.load(Ordering::Relaxed),
            lease_margin_ms: (margin != u64::MAX).then_some(margin as f64 / 1000.0),
        }
    }
}

/// The store key of a session's budget in fleet `name`: 128 bits of
/// HMAC-SHA256 under the hash key of its normalised `Authorization` value.
fn session_key(name: &str, hash_key: &hmac::Key, authorization: &[u8]) -> String {
    let mut ctx = hmac::Context::with_key(hash_key);
    normalised(authorization, |b| ctx.update(b));
    format!("limiter:{{{name}:s:{}}}", hex(&ctx.sign().as_ref()[..16]))
}

/// [`session_key`] under the hash key as `fleet.hashKeyFile` holds it: an
/// operator's (or a test's) way from a token to the key of its budget.
pub fn session_key_for(name: &str, hash_key: &str, authorization: &[u8]) -> String {
    session_key(name, &hmac::Key::new(hmac::HMAC_SHA256, hash_key.as_bytes()), authorization)
}

/// Sessions `/status` lists, busiest first.
const BUSIEST: usize = 10;

/// The fleet units a request holds; given back when dropped (with its
/// local permit, to which it is attached).
pub struct FleetUnits {
    fleet: Arc<Fleet>,
    keys: Vec<Arc<str>>,
}

impl FleetUnits {
    fn new(fleet: &Arc<Fleet>, keys: Vec<Arc<str>>) -> Option<Self> {
        (!keys.is_empty()).then(|| Self { fleet: fleet.clone(), keys })
    }
}

impl Drop for FleetUnits {
    fn drop(&mut self) {
        self.fleet.release(&self.keys);
    }
}

/// The fleet as `/status`, `dump` and `top` show it.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Snapshot {
    /// `fleet.store` (never a password) and `fleet.name`.
    pub store: String,
    pub name: String,
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
    /// Sessions this node holds a share of, or a request of.
    pub tracked_sessions: usize,
    /// The busiest of them by their fleet-wide shares as last seen.
    pub busiest_sessions: Vec<SessionView>,
    /// Claims sent for requests beyond the share (one round trip each).
    #[serde(default)]
    pub claims: u64,
    /// Times the store was found failing: marked down, or failing again
    /// while down.
    pub store_failures: u64,
    /// Requests admitted while the store was down (`fleet.onStoreDown = local`).
    pub admitted_unpublished: u64,
    pub renewals: u64,
    /// Requests whose lease had lapsed in the store while they ran.
    #[serde(default)]
    pub lease_lapsed: u64,
    /// The least lease left when the last renewal round was sent (ms).
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

/// `limiter:{name:s:0123456789ab…}` → `0123456789ab`.
fn short_key(key: &str) -> String {
    key.rsplit(':').next().unwrap_or(key).chars().filter(char::is_ascii_hexdigit).take(12).collect()
}

fn hex(bytes: &[u8]) -> String {
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
    fn a_session_key_is_the_keyed_hash_of_its_normalised_value() {
        let k = |v: &str| session_key_for("f", "0123456789abcdef", v.as_bytes());
        assert_eq!(k("Bearer T"), k(" bearer   T"));
        assert_ne!(k("Bearer T"), k("Bearer t"));
        assert_ne!(k("Bearer T"), session_key_for("g", "0123456789abcdef", b"Bearer T"));
        assert_ne!(k("Bearer T"), session_key_for("f", "0123456789abcdeF", b"Bearer T"));
        let key = k("Bearer T");
        assert!(
            key.starts_with("limiter:{f:s:")
                && key.ends_with('}')
                && key.len() == "limiter:{f:s:}".len() + 32
        );
        assert!(!key.contains('T'), "{key}");
        // One credential however it is spelled (Basic decoded).
        assert_eq!(k("Basic dXNlcjpwYXM="), k("basic dXNlcjpwYXP"));
    }

    #[test]
    fn short_keys_are_the_start_of_the_hash() {
        assert_eq!(short_key("limiter:{default:s:0123456789abcdef0123}"), "0123456789ab");
    }
}
