//! The fleet's state on this node and the request's path: the live
//! limits, what this node holds by key, taking a request's permits (one
//! round trip) and giving them back (queued for the release task).

use std::{
    collections::{HashMap, HashSet},
    fmt::Write as _,
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use redis::Script;
use ring::hmac;
use tokio::sync::{Notify, mpsc};

use super::store::{Conn, Store};
use crate::{
    admission::{Refusal, normalised},
    config::{FleetConfig, OnStoreDown},
    histogram::Histogram,
};

/// Which budget a key is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Session,
    Web,
}

/// The live keys (`fleet.max*Connections`, `timeoutMs`, `onStoreDown`).
#[derive(Debug, Default)]
pub(super) struct Live {
    pub(super) session: AtomicU32,
    pub(super) web: AtomicU32,
    pub(super) timeout_us: AtomicU64,
    pub(super) refuse_when_down: AtomicBool,
}

/// A permit taken (or, with the store down, held here only): its key
/// and member number.
pub(super) type Part = (Arc<str>, u64);

/// What this node holds, by key.
#[derive(Debug, Default)]
pub(super) struct Table {
    pub(super) keys: HashMap<Arc<str>, Entry>,
}

#[derive(Debug)]
pub(super) struct Entry {
    kind: Kind,
    pub(super) members: HashSet<u64>,
    /// The fleet's count as the store last said it.
    fleet: u32,
}

/// Counters for metrics and `/status`.
#[derive(Debug, Default)]
pub(super) struct Stats {
    pub(super) asks: AtomicU64,
    pub(super) failures: AtomicU64,
    pub(super) unpublished: AtomicU64,
    pub(super) renewals: AtomicU64,
    pub(super) releases: AtomicU64,
    /// Permits given back here and not yet sent to the store (or dropped
    /// for their lease to end them).
    pub(super) unsent: AtomicU64,
    /// The web budget's fleet count as last seen (`u32::MAX`: never).
    pub(super) web_fleet: AtomicU32,
}

/// The fleet's limits on this node.
pub struct Fleet {
    name: String,
    pub(super) lease: Duration,
    hash_key: Option<hmac::Key>,
    pub(super) web_key: Arc<str>,
    /// `<identity>.`: this node's members start with it.
    node: String,
    /// `<identity>.<incarnation>.`: this process's.
    me: String,
    started: Instant,
    pub(super) live: Live,
    pub(super) store: Store,
    pub(super) up: AtomicBool,
    seq: AtomicU64,
    table: Mutex<Table>,
    releases: mpsc::UnboundedSender<Part>,
    /// Wakes the probe at once (the store was just found down).
    pub(super) probe_now: Arc<Notify>,
    /// Whether another daemon serves the gate now (a handover).
    handover: Box<dyn Fn() -> bool + Send + Sync>,
    acquire: Script,
    pub(super) renew: Script,
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
    /// The fleet of `config` on this node, not connected yet, and where
    /// its releases go. `identity` names this node (the same after a
    /// restart); `handover` says whether another daemon serves the gate
    /// now. `None`: no `fleet.store`.
    pub(super) fn new(
        config: &FleetConfig,
        identity: &str,
        handover: Box<dyn Fn() -> bool + Send + Sync>,
    ) -> Option<(Arc<Self>, mpsc::UnboundedReceiver<Part>)> {
        let url = config.store.clone()?;
        let node = format!("{}.", hex(&digest(identity.as_bytes()).as_ref()[..8]));
        let incarnation: [u8; 4] = rand_bytes();
        let (tx, rx) = mpsc::unbounded_channel();
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
            seq: AtomicU64::new(0),
            table: Mutex::new(Table::default()),
            releases: tx,
            probe_now: Arc::new(Notify::new()),
            handover,
            acquire: Script::new(include_str!("acquire.lua")),
            renew: Script::new(include_str!("renew.lua")),
            round_trip: Histogram::default(),
            stats: Stats { web_fleet: AtomicU32::new(u32::MAX), ..Stats::default() },
        });
        fleet.set_live(config);
        Some((fleet, rx))
    }

    /// Connects to the store (within a couple of seconds: a store that is
    /// not there yet is down, and the probe keeps trying).
    pub(super) async fn connect(&self) {
        let ping = async {
            let mut conn =
                self.store.reconnect(FIRST_CONNECT).await.map_err(|e| format!("cannot connect: {e}"))?;
            conn.query::<String>(&redis::cmd("PING")).await.map_err(|e| format!("PING failed: {e}"))
        };
        match tokio::time::timeout(FIRST_CONNECT, ping).await {
            Ok(Ok(_)) => {
                tracing::info!(store = %self.store.describe(), name = %self.name, "fleet store connected")
            }
            Ok(Err(why)) => self.went_down(&why),
            Err(_) => self.went_down("no answer to PING"),
        }
    }

    /// Applies the live keys of a (re)loaded configuration.
    pub fn set_live(&self, config: &FleetConfig) {
        let l = &self.live;
        l.session.store(config.max_session_connections, Ordering::Relaxed);
        l.web.store(config.max_web_connections, Ordering::Relaxed);
        l.timeout_us.store(config.timeout_ms.saturating_mul(1000), Ordering::Relaxed);
        l.refuse_when_down.store(config.on_store_down == OnStoreDown::Refuse, Ordering::Relaxed);
    }

    fn on_store_down(&self) -> OnStoreDown {
        if self.live.refuse_when_down.load(Ordering::Relaxed) {
            OnStoreDown::Refuse
        } else {
            OnStoreDown::Local
        }
    }

    pub(super) fn timeout(&self) -> Duration {
        Duration::from_micros(self.live.timeout_us.load(Ordering::Relaxed))
    }

    /// The store key of a session.
    fn session_key(&self, authorization: &[u8]) -> Option<Arc<str>> {
        Some(session_key(&self.name, self.hash_key.as_ref()?, authorization).into())
    }

    pub(super) fn member(&self, seq: u64) -> String {
        format!("{}{seq:x}", self.me)
    }

    /// Takes the request's fleet permits: one store round trip for both
    /// (its web-client key and its session's are asked at once), none for
    /// a request no fleet limit applies to. Returns
    /// what it holds (to be dropped with the request) and, if a limit
    /// refused, which: the caller refuses or, in dry-run, goes on with
    /// what was taken.
    pub async fn acquire(
        self: &Arc<Self>,
        web: bool,
        session: Option<&[u8]>,
    ) -> (Option<Held>, Option<Refusal>) {
        let (web_limit, session_limit) =
            (self.live.web.load(Ordering::Relaxed), self.live.session.load(Ordering::Relaxed));
        let web = web && web_limit > 0;
        let session = session.filter(|_| session_limit > 0).and_then(|a| self.session_key(a));
        // Nothing allocated, nothing asked, for a request no fleet limit
        // applies to.
        if !web && session.is_none() {
            return (None, None);
        }
        let mut asks: Vec<(Kind, Arc<str>, u32)> = Vec::with_capacity(2);
        if web {
            asks.push((Kind::Web, self.web_key.clone(), web_limit));
        }
        if let Some(key) = session {
            asks.push((Kind::Session, key, session_limit));
        }
        let first = self.seq.fetch_add(asks.len() as u64, Ordering::Relaxed);
        let parts: Vec<(Kind, Part)> = asks
            .iter()
            .enumerate()
            .map(|(i, (kind, key, _))| (*kind, (key.clone(), first + i as u64)))
            .collect();
        let conn = self.store.conn().filter(|_| self.up.load(Ordering::Relaxed));
        let Some(conn) = conn else { return self.store_down(parts) };
        self.stats.asks.fetch_add(1, Ordering::Relaxed);
        // The ask is a task of its own: a request dropped while it waits (an
        // HTTP/2 stream reset, say) does not drop the ask, whose permits are
        // then given back as soon as it is answered, not left to their lease.
        let (fleet, purge) = (self.clone(), self.purging());
        let ask = tokio::spawn(async move { fleet.ask(conn, asks, parts, purge).await });
        ask.await.unwrap_or((None, None))
    }

    /// The store's answers to `asks` (the keys of `parts`), within
    /// `fleet.timeoutMs`: what is held, and which limit refused.
    async fn ask(
        self: &Arc<Self>,
        conn: Conn,
        asks: Vec<(Kind, Arc<str>, u32)>,
        parts: Vec<(Kind, Part)>,
        purge: bool,
    ) -> (Option<Held>, Option<Refusal>) {
        let started = Instant::now();
        let members: Vec<String> = parts.iter().map(|(_, (_, seq))| self.member(*seq)).collect();
        let lease_ms = self.lease.as_millis() as u64;
        let ask = |i: usize| {
            let mut conn = conn.clone();
            let (_, key, limit) = &asks[i];
            let mut script = self.acquire.prepare_invoke();
            script.key(&**key).arg(&members[i]).arg(*limit).arg(lease_ms);
            match purge {
                true => script.arg(&self.node).arg(&self.me),
                false => script.arg("").arg(""),
            };
            async move { conn.eval::<(u32, u32)>(&script).await }
        };
        let answers = tokio::time::timeout(self.timeout(), async {
            match asks.len() {
                1 => vec![ask(0).await],
                _ => {
                    let (a, b) = tokio::join!(ask(0), ask(1));
                    vec![a, b]
                }
            }
        })
        .await;
        self.round_trip.record(started.elapsed());
        let answers = match answers {
            Err(_) => {
                self.went_down(&format!("no answer within {} µs", self.timeout().as_micros()));
                return self.store_down(parts);
            }
            Ok(answers) => match answers.into_iter().collect::<Result<Vec<_>, _>>() {
                Ok(answers) => answers,
                Err(e) => {
                    self.went_down(&e.to_string());
                    return self.store_down(parts);
                }
            },
        };
        let mut refusal = None;
        let mut held = Vec::with_capacity(parts.len());
        let mut table = self.lock();
        for ((kind, part), (taken, count)) in parts.into_iter().zip(answers) {
            if kind == Kind::Web {
                self.stats.web_fleet.store(count, Ordering::Relaxed);
            }
            if taken == 1 {
                table.hold(kind, &part, count);
                held.push(part);
            } else {
                table.seen(&part.0, count);
                refusal = refusal.or(Some(match kind {
                    Kind::Web => Refusal::FleetWeb,
                    Kind::Session => Refusal::FleetSession,
                }));
            }
        }
        drop(table);
        (Held::new(self, held), refusal)
    }

    /// The request's permits with the store down: held here (published
    /// when it returns) under `local`; under `refuse`, a refusal (with
    /// them held for dry-run).
    fn store_down(self: &Arc<Self>, parts: Vec<(Kind, Part)>) -> (Option<Held>, Option<Refusal>) {
        let refusal = (self.on_store_down() == OnStoreDown::Refuse).then_some(Refusal::FleetDown);
        if refusal.is_none() {
            self.stats.unpublished.fetch_add(1, Ordering::Relaxed);
        }
        let mut table = self.lock();
        for (kind, part) in &parts {
            table.hold(*kind, part, 0);
        }
        drop(table);
        (Held::new(self, parts.into_iter().map(|(_, p)| p).collect()), refusal)
    }

    /// The first lease after start, with no handover under way: asks
    /// drop the previous incarnation's members.
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

    pub(super) fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Gives back what a request held.
    fn release(&self, parts: &mut Vec<Part>) {
        let mut table = self.lock();
        for part in parts.iter() {
            table.release(part);
        }
        drop(table);
        self.stats.unsent.fetch_add(parts.len() as u64, Ordering::Relaxed);
        for part in parts.drain(..) {
            // The task ends only with the fleet: a send cannot fail here.
            let _ = self.releases.send(part);
        }
    }

    /// Waits (at most `within`) until what was given back has reached the
    /// store, so that a daemon that stops leaves nothing for its lease to
    /// end: `true` when it has.
    pub async fn settle(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while self.stats.unsent.load(Ordering::Relaxed) > 0 {
            if Instant::now() > deadline || !self.up.load(Ordering::Relaxed) {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        true
    }

    /// The round trips of the asks on requests' paths.
    pub fn round_trip(&self) -> &Histogram {
        &self.round_trip
    }

    pub fn snapshot(&self) -> Snapshot {
        let table = self.lock();
        let (mut held_session, mut held_web) = (0, 0);
        let mut sessions = Vec::new();
        for (key, e) in &table.keys {
            let here = e.members.len() as u32;
            match e.kind {
                Kind::Web => held_web += here,
                Kind::Session => {
                    held_session += here;
                    sessions.push(SessionView { key: short_key(key), here, fleet: e.fleet.max(here) });
                }
            }
        }
        let tracked_sessions = sessions.len();
        drop(table);
        sessions.sort_by(|a, b| b.fleet.cmp(&a.fleet).then(b.here.cmp(&a.here)).then(a.key.cmp(&b.key)));
        sessions.truncate(BUSIEST);
        let s = &self.stats;
        let web_fleet = s.web_fleet.load(Ordering::Relaxed);
        Snapshot {
            store: self.store.describe(),
            name: self.name.clone(),
            up: self.up.load(Ordering::Relaxed),
            session_limit: self.live.session.load(Ordering::Relaxed),
            web_limit: self.live.web.load(Ordering::Relaxed),
            lease_ms: self.lease.as_millis() as u64,
            on_store_down: self.on_store_down().as_str().to_owned(),
            held_session,
            held_web,
            web_fleet: (web_fleet != u32::MAX).then_some(web_fleet),
            tracked_sessions,
            busiest_sessions: sessions,
            asks: s.asks.load(Ordering::Relaxed),
            store_failures: s.failures.load(Ordering::Relaxed),
            admitted_unpublished: s.unpublished.load(Ordering::Relaxed),
            renewals: s.renewals.load(Ordering::Relaxed),
            releases: s.releases.load(Ordering::Relaxed),
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

impl Table {
    fn hold(&mut self, kind: Kind, (key, seq): &Part, fleet: u32) {
        let e =
            self.keys.entry(key.clone()).or_insert_with(|| Entry { kind, members: HashSet::new(), fleet: 0 });
        e.members.insert(*seq);
        if fleet > 0 {
            e.fleet = fleet;
        }
    }

    pub(super) fn seen(&mut self, key: &str, fleet: u32) {
        if let Some(e) = self.keys.get_mut(key) {
            e.fleet = fleet;
        }
    }

    fn release(&mut self, (key, seq): &Part) {
        if let Some(e) = self.keys.get_mut(key) {
            e.members.remove(seq);
            if e.members.is_empty() {
                self.keys.remove(key);
            }
        }
    }
}

/// The fleet permits a request holds; given back when dropped (with its
/// local permit, to which it is attached).
pub struct Held {
    fleet: Arc<Fleet>,
    parts: Vec<Part>,
}

impl Held {
    fn new(fleet: &Arc<Fleet>, parts: Vec<Part>) -> Option<Self> {
        (!parts.is_empty()).then(|| Self { fleet: fleet.clone(), parts })
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.fleet.release(&mut self.parts);
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
    /// Fleet permits this node holds, by budget.
    pub held_session: u32,
    pub held_web: u32,
    /// The web clients' fleet-wide count as the store last said it.
    pub web_fleet: Option<u32>,
    /// Sessions this node holds a fleet permit of.
    pub tracked_sessions: usize,
    /// The busiest of them by their fleet-wide count as last seen.
    pub busiest_sessions: Vec<SessionView>,
    /// Requests that asked the store.
    pub asks: u64,
    /// Asks or renewals that failed or timed out.
    pub store_failures: u64,
    /// Requests admitted while the store was down (`onStoreDown = local`).
    pub admitted_unpublished: u64,
    pub renewals: u64,
    pub releases: u64,
}

/// One session's fleet permits, by the start of its hashed key.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SessionView {
    /// The first 12 hex digits of its keyed hash (no token).
    pub key: String,
    pub here: u32,
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
    }

    #[test]
    fn short_keys_are_the_start_of_the_hash() {
        assert_eq!(short_key("limiter:{default:s:0123456789abcdef0123}"), "0123456789ab");
    }
}
