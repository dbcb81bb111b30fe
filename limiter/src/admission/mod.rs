//! HTTP admission: permits for the normal pool, the reserved `/debug/`
//! slots, web clients (`X-Client-Id`) and sessions (`Authorization`).
//!
//! One short critical section decides a request: every applicable limit is
//! checked first and the permits are taken only if all pass, so a refusal
//! never leaves a partial permit behind and a concurrent request never sees
//! a slot that is about to be given back. A [`Permit`] returns everything it
//! took when dropped.
//!
//! With `http.adaptive = on` the normal pool's limit is learnt
//! ([`adaptive`]): the controller lives under the same lock, sees every
//! admission, refusal and answer of the normal pool, and moves the limit
//! between `http.adaptive.minLimit` and the static pool.
//!
//! **Criticality.** A request is sheddable, normal or critical
//! (`http.sheddable`, `http.critical`). Below the limit every class is
//! admitted. Once the normal pool has been full (a refusal, or an
//! admission that filled it) within the last [`PRESSURE`], sheddable
//! requests may only take the pool up to three quarters of its limit,
//! and, when critical paths are configured, normal requests up to the
//! limit less a sixteenth (at least one slot): what is left of the pool
//! under pressure goes to the higher classes first, without a queue.
//!
//! Sessions are kept under a keyed hash of the normalised `Authorization`
//! value (`credential.rs`, `session.rs`): the token itself is never stored, and an entry
//! disappears when its count reaches zero, so memory is bounded by what is
//! in flight, whatever the number of distinct tokens.

pub mod adaptive;
mod credential;
pub mod ledger;
mod session;

pub use self::credential::normalised;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant},
};

use self::{
    adaptive::{Bounds, Controller, Estimates},
    ledger::{Change, Ledger, Locked, Others},
    session::SessionKeys,
};
use crate::config::{DEBUG_SLOTS, HttpConfig, Prefix};

/// Which limit refused a request (or in dry-run would have).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// The normal pool is full.
    Normal,
    /// A `/debug/` request found the reserved slots and the normal pool full.
    Debug,
    /// The web-client limit (`X-Client-Id`).
    Web,
    /// The session's limit (`Authorization`).
    Session,
    /// The normal pool refused a sheddable request (`http.sheddable`).
    Sheddable,
    /// The normal pool refused a critical request (`http.critical`).
    Critical,
    /// The session's limit across the fleet (`fleet.maxSessionConnections`).
    FleetSession,
    /// The web-client limit across the fleet (`fleet.maxWebConnections`).
    FleetWeb,
    /// The fleet's store does not answer and `fleet.onStoreDown = refuse`.
    FleetDown,
    /// An upgrade request found `http.maxTunnels` tunnels open.
    Tunnels,
    /// An upgrade request found `http.maxTunnelsPerClient` tunnels open
    /// from its client group.
    TunnelsPerClient,
}

impl Refusal {
    pub const ALL: [Refusal; 11] = [
        Refusal::Normal,
        Refusal::Debug,
        Refusal::Web,
        Refusal::Session,
        Refusal::Sheddable,
        Refusal::Critical,
        Refusal::FleetSession,
        Refusal::FleetWeb,
        Refusal::FleetDown,
        Refusal::Tunnels,
        Refusal::TunnelsPerClient,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "normal",
            Self::Debug => "debug",
            Self::Web => "web",
            Self::Session => "session",
            Self::Sheddable => "sheddable",
            Self::Critical => "critical",
            Self::FleetSession => "fleet_session",
            Self::FleetWeb => "fleet_web",
            Self::FleetDown => "fleet_down",
            Self::Tunnels => "tunnels",
            Self::TunnelsPerClient => "tunnels_per_client",
        }
    }

    /// A refusal of the fleet's (decided by `crate::fleet`, counted here).
    pub fn of_fleet(self) -> bool {
        matches!(self, Self::FleetSession | Self::FleetWeb | Self::FleetDown)
    }

    /// A refusal of the normal pool, whatever the request's class.
    pub fn of_pool(self) -> bool {
        matches!(self, Self::Normal | Self::Sheddable | Self::Critical)
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The limits in force; replaced whole on reload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Slots for requests that are not `/debug/`.
    pub normal: u32,
    /// Slots only `/debug/` requests may take.
    pub debug_reserved: u32,
    /// In-flight requests per session; 0 = unlimited.
    pub per_session: u32,
    /// In-flight requests carrying `X-Client-Id`; 0 = unlimited.
    pub web: u32,
    /// Count would-be refusals, refuse nothing.
    pub dry_run: bool,
    /// Learn the normal pool's limit below `normal` (`http.adaptive`),
    /// down to this (`http.adaptive.minLimit`); `None`: the static pool.
    pub adaptive_min: Option<u32>,
    /// Critical paths are configured: under pressure, normal requests
    /// leave them a reserve.
    pub critical_reserve: bool,
    /// Tunnels (upgraded connections) open at once; 0 = unlimited.
    pub tunnels: u32,
    /// Tunnels open at once from one client group; 0 = unlimited.
    pub tunnels_per_client: u32,
}

impl Limits {
    pub fn from_config(http: &HttpConfig) -> Self {
        Self {
            normal: http.normal_limit(),
            debug_reserved: DEBUG_SLOTS,
            per_session: http.max_session_connections,
            web: http.max_web_connections,
            dry_run: http.dry_run,
            adaptive_min: http.adaptive.then_some(http.adaptive_min_limit),
            critical_reserve: !http.critical.is_empty(),
            tunnels: http.max_tunnels,
            tunnels_per_client: http.max_tunnels_per_client,
        }
    }
}

/// How long after the normal pool was last full it counts as under
/// pressure (the classes' reserves apply).
pub const PRESSURE: Duration = Duration::from_secs(1);

/// What the adaptive controller learnt is written to the ledger again
/// this often even when it has not changed.
const REPUBLISH: Duration = Duration::from_millis(500);

/// A request's class (`http.sheddable`, `http.critical`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Class {
    Sheddable,
    #[default]
    Normal,
    Critical,
}

impl Class {
    /// The refusal of the normal pool for a request of this class.
    fn refusal(self) -> Refusal {
        match self {
            Self::Sheddable => Refusal::Sheddable,
            Self::Normal => Refusal::Normal,
            Self::Critical => Refusal::Critical,
        }
    }

    /// Slots of a pool of `limit` that a request of this class may use
    /// while the pool is under pressure.
    fn under_pressure(self, limit: u32, critical_reserve: bool) -> u32 {
        match self {
            Self::Sheddable => limit - (limit / 4).max(1).min(limit),
            Self::Normal if critical_reserve => limit - (limit / 16).max(1).min(limit),
            Self::Normal | Self::Critical => limit,
        }
    }
}

/// What admission needs to know about a request.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ask<'a> {
    /// The path starts with `/debug/`.
    pub debug: bool,
    /// The request carries `X-Client-Id`.
    pub web: bool,
    /// The `Authorization` value, if any.
    pub session: Option<&'a [u8]>,
    /// Its class (ignored for `/debug/`).
    pub class: Class,
    /// It asks to become a tunnel (an upgrade): it takes a tunnel slot too,
    /// which outlives the permit once the upstream accepts.
    pub tunnel: bool,
    /// The client group a tunnel counts against (`None`: a trusted
    /// source or forwarder, under `http.maxTunnels` alone).
    pub client_group: Option<Prefix>,
}

impl Ask<'_> {
    /// Whether the limits per client apply: the session's and the web
    /// clients', this daemon's and the fleet's alike. Not to `/debug/`,
    /// whatever it carries: the operator's way in is never one client's
    /// to use up (it has its reserved slots, and the normal pool).
    pub fn per_client(&self) -> bool {
        !self.debug
    }
}

/// Which pool slot a permit holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    Normal,
    Reserved,
}

#[derive(Debug)]
struct Inner {
    limits: Limits,
    /// Normal slots in use (by normal requests and by `/debug/` requests
    /// that found the reserved slots taken).
    normal: u32,
    /// Reserved slots in use.
    reserved: u32,
    web: u32,
    /// Tunnels open, and upgrade requests that may become one.
    tunnels: u32,
    /// The same, per client group (only groups with one open).
    tunnel_groups: HashMap<Prefix, u32>,
    /// Keyed hash of the session → requests in flight. Only kept while
    /// a per-session limit is set.
    sessions: HashMap<u64, u32>,
    admitted: [u64; 2],
    refused: [u64; Refusal::ALL.len()],
    would_refuse: [u64; Refusal::ALL.len()],
    /// The learnt limit (`http.adaptive = on`; watching only when off).
    adaptive: Controller,
    /// When the normal pool was last full.
    full_at: Option<Instant>,
    /// Where the controllers' clocks start.
    epoch: Instant,
    /// A timer sleeps until the next decision ([`Admission::stirred`]).
    sleepers: bool,
}

impl Inner {
    /// Nothing in use yet, under `limits`.
    fn new(limits: Limits) -> Self {
        let bounds = Bounds { min: 1, ceiling: limits.normal };
        let mut adaptive = Controller::new(bounds, limits.normal, 0);
        adaptive.set_enforcing(false);
        let mut inner = Self {
            limits,
            normal: 0,
            reserved: 0,
            web: 0,
            tunnels: 0,
            tunnel_groups: HashMap::new(),
            sessions: HashMap::new(),
            admitted: [0; 2],
            refused: [0; Refusal::ALL.len()],
            would_refuse: [0; Refusal::ALL.len()],
            adaptive,
            full_at: None,
            epoch: Instant::now(),
            sleepers: false,
        };
        inner.set_limits(limits);
        inner
    }

    /// Microseconds since `epoch`: the controller's clock.
    fn micros(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.epoch).as_micros() as u64
    }

    fn set_limits(&mut self, limits: Limits) {
        self.limits = limits;
        // The controller runs whether or not it is on: off, it watches.
        let bounds = Bounds { min: limits.adaptive_min.unwrap_or(1), ceiling: limits.normal };
        self.adaptive.set_bounds(bounds);
        self.adaptive.set_enforcing(limits.adaptive_min.is_some());
    }

    /// The adaptive controller, when it is on.
    fn enforcing(&self) -> Option<&Controller> {
        self.limits.adaptive_min.map(|_| &self.adaptive)
    }

    /// The normal pool's limit in force.
    fn normal_limit(&self) -> u32 {
        self.enforcing().map_or(self.limits.normal, Controller::limit)
    }

    /// A refusal (or would-be refusal) of `reason`: the normal pool's tell
    /// the controller and mark the pool full.
    fn pool_refused(&mut self, reason: Refusal) {
        if reason.of_pool() {
            self.full_at = Some(Instant::now());
            self.adaptive.refused();
        }
    }

    /// A tunnel place of `group` given back.
    fn tunnel_closed(&mut self, group: Option<Prefix>) {
        if let Some(g) = group
            && let Some(n) = self.tunnel_groups.get_mut(&g)
        {
            *n -= 1;
            if *n == 0 {
                self.tunnel_groups.remove(&g);
            }
        }
    }

    /// The pool has been full within [`PRESSURE`].
    fn under_pressure(&self) -> bool {
        self.full_at.is_some_and(|t| t.elapsed() < PRESSURE)
    }
}

/// The shared admission state of the proxy.
#[derive(Debug)]
pub struct Admission {
    inner: Mutex<Inner>,
    /// Keys the session hash: random per process, or the ledger's.
    session_keys: SessionKeys,
    /// The permits of the other daemon serving the same gate during a
    /// handover (`ledger`); taken after `inner`, published under its lock.
    ledger: Option<Arc<Ledger>>,
    /// What [`Self::tick`] last published in the ledger (limit and base
    /// latency in µs), and when: the ledger's lock is taken when that
    /// changes, and at least every [`REPUBLISH`] (a record claimed again
    /// starts empty).
    published: Mutex<Option<((u32, u32), Instant)>>,
    /// Wakes the timers that sleep while nothing happens (the adaptive
    /// controller's, coupled shedding's): the next decision, new limits,
    /// or [`Self::stir`].
    stir: tokio::sync::Notify,
}

/// Counters and gauges, for metrics and dump.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Snapshot {
    pub normal_in_use: u32,
    pub normal_limit: u32,
    pub debug_in_use: u32,
    pub debug_limit: u32,
    pub web_in_use: u32,
    pub web_limit: u32,
    /// Tunnels open (and upgrade requests that may become one), and their
    /// limit (0 = unlimited).
    #[serde(default)]
    pub tunnels_in_use: u32,
    #[serde(default)]
    pub tunnels_limit: u32,
    pub session_limit: u32,
    /// Sessions with a request in flight (tracked only when limited).
    pub sessions: usize,
    pub dry_run: bool,
    pub admitted_normal: u64,
    pub admitted_debug: u64,
    /// Permits the other daemon serving the gate holds (a handover), by
    /// pool: normal, `/debug/` reserve, web clients. `None`: no other.
    #[serde(default)]
    pub peer_in_use: Option<[u32; 3]>,
    /// Refusals by reason, in [`Refusal::ALL`] order.
    pub refused: [u64; Refusal::ALL.len()],
    pub would_refuse: [u64; Refusal::ALL.len()],
    /// The static pool (`http.maxThreads - 11`): the ceiling of
    /// `normal_limit` when it is learnt.
    #[serde(default)]
    pub normal_ceiling: u32,
    /// The adaptive controller's estimates (`None`: `http.adaptive = off`).
    #[serde(default)]
    pub adaptive: Option<Estimates>,
}

impl Snapshot {
    /// The adaptive limit in one line, as `dump` and `top` show it
    /// (`None`: `http.adaptive = off`).
    pub fn adaptive_summary(&self) -> Option<String> {
        let e = self.adaptive.as_ref()?;
        let known = |v: f64, unit: &str| if v > 0.0 { format!("{v:.1}{unit}") } else { "unknown".to_owned() };
        Some(format!(
            "adaptive limit {} of {} (base latency {}, last {}, {:.0} answers/s, capacity {}; {} descents, {} found no queue)",
            e.limit,
            self.normal_ceiling,
            known(e.base_latency * 1e3, " ms"),
            known(e.latency * 1e3, " ms"),
            e.throughput,
            known(e.capacity, ""),
            e.descents,
            e.rebased,
        ))
    }
}

/// Held from admission until the upstream has delivered its response, or
/// limiter gave up on it (`http.upstreamAbandonMs`, a client cut for
/// reading too slowly; a response read ahead whole gives it back before the
/// client has it, an upgrade at its `101`); gives back every slot it took
/// when dropped.
#[derive(Debug)]
pub struct Permit {
    admission: Arc<Admission>,
    slot: Slot,
    web: bool,
    /// It holds a tunnel slot (given back with it unless [`Self::tunnel`]
    /// takes it).
    tunnel: bool,
    /// The client group its tunnel slot counts against.
    tunnel_group: Option<Prefix>,
    session: Option<u64>,
    /// The session's unit is in the ledger (to be taken back there).
    session_published: bool,
    /// The adaptive controller's generation at admission.
    generation: u32,
    /// How long the upstream took to its response head (µs), told to the
    /// controller when the permit goes back.
    answered_us: Option<u64>,
    /// What else the request holds that goes back with the permit (the
    /// fleet's permits), dropped after the local slots are given back.
    attached: Option<Box<dyn std::any::Any + Send + Sync>>,
}

impl Permit {
    pub fn slot(&self) -> Slot {
        self.slot
    }

    /// The upstream answered (its response head) `latency` after the
    /// request was sent.
    pub fn answered(&mut self, latency: Duration) {
        self.answered_us = Some(latency.as_micros() as u64);
    }

    /// Holds `other` as long as the permit: it is dropped with it.
    pub fn attach(&mut self, other: Box<dyn std::any::Any + Send + Sync>) {
        self.attached = Some(other);
    }

    /// The upstream accepted the upgrade: the tunnel slot, taken out of the
    /// permit, is held until the tunnel closes (the rest of the permit goes
    /// back when it is dropped). `None` for a request that took none.
    pub fn tunnel(&mut self) -> Option<TunnelSlot> {
        std::mem::take(&mut self.tunnel).then(|| TunnelSlot(self.admission.clone(), self.tunnel_group))
    }
}

/// One open tunnel under `http.maxTunnels` (and its client group's
/// place under `http.maxTunnelsPerClient`), given back when dropped.
#[derive(Debug)]
pub struct TunnelSlot(Arc<Admission>, Option<Prefix>);

impl Drop for TunnelSlot {
    fn drop(&mut self) {
        let mut inner = self.0.lock();
        inner.tunnels -= 1;
        inner.tunnel_closed(self.1);
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut inner = self.admission.lock();
        match self.slot {
            Slot::Normal => {
                inner.normal -= 1;
                if let Some(us) = self.answered_us {
                    inner.adaptive.answered(us, self.generation);
                }
            }
            Slot::Reserved => inner.reserved -= 1,
        }
        if self.web {
            inner.web -= 1;
        }
        if self.tunnel {
            inner.tunnels -= 1;
            inner.tunnel_closed(self.tunnel_group);
        }
        if let Some(h) = self.session
            && let Some(n) = inner.sessions.get_mut(&h)
        {
            *n -= 1;
            if *n == 0 {
                inner.sessions.remove(&h);
            }
        }
        if let Some(ledger) = &self.admission.ledger {
            let shared = ledger.lock();
            shared.publish(change(self.slot, self.web, -1));
            if let (Some(h), true) = (self.session, self.session_published) {
                shared.publish_session(h, -1);
            }
        }
    }
}

/// What taking (`sign` 1) or giving back (-1) a permit changes.
fn change(slot: Slot, web: bool, sign: i64) -> Change {
    Change {
        normal: if slot == Slot::Normal { sign } else { 0 },
        reserved: if slot == Slot::Reserved { sign } else { 0 },
        web: if web { sign } else { 0 },
    }
}

impl Admission {
    pub fn new(limits: Limits) -> Arc<Self> {
        Self::with_ledger(limits, None)
    }

    /// Admission that counts the permits of the other daemon serving the
    /// same gate too (`ledger`).
    pub fn with_ledger(limits: Limits, ledger: Option<Arc<Ledger>>) -> Arc<Self> {
        Arc::new(Self {
            inner: Mutex::new(Inner::new(limits)),
            session_keys: ledger
                .as_ref()
                .map_or_else(SessionKeys::default, |l| SessionKeys::with_seed(l.seed())),
            ledger,
            published: Mutex::new(None),
            stir: tokio::sync::Notify::new(),
        })
    }

    /// The ledger's lock, when there is a ledger (taken after `inner`).
    fn shared(&self) -> Option<Locked<'_>> {
        self.ledger.as_ref().map(|l| l.lock())
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave counts half-updated
        // (each update is a few integer operations), so keep going.
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// New limits for new requests; permits in flight keep their slots.
    pub fn set_limits(&self, limits: Limits) {
        // Session entries of permits in flight stay until those permits
        // return, whatever the new limit: the counts stay exact.
        self.lock().set_limits(limits);
        self.stir();
    }

    /// Wakes every timer asleep in [`Self::stirred`] (the daemon drains,
    /// the configuration changed).
    pub fn stir(&self) {
        self.stir.notify_waiters();
    }

    /// Armed at once: resolves at the next decision (admitted or refused),
    /// new limits, or [`Self::stir`]. A timer with nothing to do arms it,
    /// looks again whether it still has nothing to do, then awaits it: no
    /// wake-up falls between the look and the wait.
    pub fn stirred(&self) -> std::pin::Pin<Box<tokio::sync::futures::Notified<'_>>> {
        let mut armed = Box::pin(self.stir.notified());
        armed.as_mut().enable();
        self.lock().sleepers = true;
        armed
    }

    /// Wakes the sleepers of [`Self::stirred`] at a decision (one flag
    /// read while none sleeps).
    fn decided(&self, inner: &mut Inner) {
        if inner.sleepers {
            inner.sleepers = false;
            self.stir.notify_waiters();
        }
    }

    /// Nothing in flight and nothing for the adaptive controller since
    /// its bin began: its timer may sleep until [`Self::stirred`].
    pub fn idle(&self) -> bool {
        let inner = self.lock();
        inner.normal == 0 && inner.reserved == 0 && inner.adaptive.quiet()
    }

    /// The adaptive controller's timer slept from `now` on, idle.
    pub fn woke(&self, now: Instant) {
        let mut inner = self.lock();
        let t = inner.micros(now);
        inner.adaptive.woke(t);
    }

    /// Runs the adaptive controller (every few milliseconds, from a
    /// timer): `Some` when its limit moved by more than a fifth. Publishes
    /// what it learnt in the ledger (zeros while off) when it changes, and
    /// at least every `REPUBLISH`.
    pub fn tick(&self, now: Instant) -> Option<adaptive::Change> {
        let mut inner = self.lock();
        let t = inner.micros(now);
        let change = inner.adaptive.tick(t);
        let learnt = inner.enforcing().map(Controller::estimates);
        drop(inner);
        if let Some(ledger) = &self.ledger {
            let (limit, base) = learnt.map_or((0, 0.0), |e| (e.limit, e.base_latency));
            let learnt = (limit, (base * 1e6).min(f64::from(u32::MAX)) as u32);
            let mut published = self.published.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if published
                .is_none_or(|(was, at)| was != learnt || now.saturating_duration_since(at) >= REPUBLISH)
            {
                ledger.lock().publish_learnt(learnt.0, learnt.1);
                *published = Some((learnt, now));
            }
        }
        change
    }

    /// Starts the adaptive controller from what the other daemon serving
    /// the gate learnt (a handover); `Some` with the limit taken.
    pub fn resume_from_peer(&self) -> Option<u32> {
        let mut inner = self.lock();
        inner.enforcing()?;
        let (limit, base_us) = self.shared()?.others_learnt()?;
        inner.adaptive.resume(limit, f64::from(base_us) / 1e6);
        Some(inner.adaptive.limit())
    }

    pub fn limits(&self) -> Limits {
        self.lock().limits
    }

    /// Takes every permit the request needs, or none: `Err` names the first
    /// check that failed, in the order pool, web client, session, tunnels.
    pub fn admit(self: &Arc<Self>, ask: Ask<'_>) -> Result<Permit, Refusal> {
        let session = self.session_of(ask);
        let mut inner = self.lock();
        let shared = self.shared();
        let limits = inner.limits;
        let Decision { slot, web, tunnel, session, refusal } =
            decide(&inner, &limits, ask, session, shared.as_ref());
        self.decided(&mut inner);
        if let Some(reason) = refusal {
            inner.pool_refused(reason);
            if !limits.dry_run {
                inner.refused[reason.index()] += 1;
                return Err(reason);
            }
            inner.would_refuse[reason.index()] += 1;
        }
        // Dry-run admits past a full pool on a normal slot, counted as such.
        let slot = slot.unwrap_or_else(|(_, fallback)| fallback);
        match slot {
            Slot::Normal => {
                inner.normal += 1;
                let in_flight = inner.normal;
                if in_flight >= inner.normal_limit() {
                    inner.full_at = Some(Instant::now());
                }
                inner.adaptive.admitted(in_flight);
            }
            Slot::Reserved => inner.reserved += 1,
        }
        let generation = inner.adaptive.generation();
        inner.admitted[usize::from(ask.debug)] += 1;
        if web {
            inner.web += 1;
        }
        let tunnel_group = ask.client_group.filter(|_| tunnel);
        if tunnel {
            inner.tunnels += 1;
            if let Some(g) = tunnel_group {
                *inner.tunnel_groups.entry(g).or_insert(0) += 1;
            }
        }
        if let Some(h) = session {
            *inner.sessions.entry(h).or_insert(0) += 1;
        }
        let mut session_published = false;
        if let Some(shared) = &shared {
            shared.publish(change(slot, web, 1));
            session_published = session.is_some_and(|h| shared.publish_session(h, 1));
        }
        drop(shared);
        drop(inner);
        Ok(Permit {
            admission: self.clone(),
            slot,
            web,
            tunnel,
            tunnel_group,
            session,
            session_published,
            generation,
            answered_us: None,
            attached: None,
        })
    }

    /// The session of an `Authorization` value as logs may show it: 32 bits
    /// of its keyed hash (the value itself is never shown).
    pub fn session_tag(&self, authorization: &[u8]) -> u32 {
        (self.session_keys.key(authorization) >> 32) as u32
    }

    /// The keyed hash of the request's session (none for `/debug/`).
    fn session_of(&self, ask: Ask<'_>) -> Option<u64> {
        ask.session.filter(|_| ask.per_client()).map(|token| self.session_keys.key(token))
    }

    /// Whether [`Self::admit`] would admit `ask` now, taking nothing (the
    /// check at the head, before the body is read): `Err` names the limit
    /// that refuses it, counted as a refusal. In dry-run it always passes
    /// (the admission after the body counts what it would refuse).
    pub fn check(&self, ask: Ask<'_>) -> Result<(), Refusal> {
        let session = self.session_of(ask);
        let mut inner = self.lock();
        let shared = self.shared();
        let limits = inner.limits;
        let refusal = decide(&inner, &limits, ask, session, shared.as_ref()).refusal;
        self.decided(&mut inner);
        if let Some(reason) = refusal {
            inner.pool_refused(reason);
        }
        match refusal {
            Some(reason) if !limits.dry_run => {
                inner.refused[reason.index()] += 1;
                Err(reason)
            }
            _ => Ok(()),
        }
    }

    /// A limit decided elsewhere (the fleet's) refused the request:
    /// counted as a refusal, or in dry-run as a would-be refusal. `true`:
    /// refuse it (not in dry-run).
    pub fn refused_elsewhere(&self, reason: Refusal) -> bool {
        let mut inner = self.lock();
        self.decided(&mut inner);
        if inner.limits.dry_run {
            inner.would_refuse[reason.index()] += 1;
            false
        } else {
            inner.refused[reason.index()] += 1;
            true
        }
    }

    /// Refusals and would-be refusals of the normal pool, every class's.
    pub fn pool_refusals(&self) -> u64 {
        let inner = self.lock();
        Refusal::ALL
            .iter()
            .filter(|r| r.of_pool())
            .map(|r| inner.refused[r.index()] + inner.would_refuse[r.index()])
            .sum()
    }

    pub fn snapshot(&self) -> Snapshot {
        let inner = self.lock();
        let peer_in_use = self.shared().filter(Locked::has_peer).map(|s| {
            let o = s.others();
            [o.normal, o.reserved, o.web]
        });
        let limits = inner.limits;
        Snapshot {
            normal_in_use: inner.normal,
            normal_limit: inner.normal_limit(),
            normal_ceiling: limits.normal,
            adaptive: inner.enforcing().map(Controller::estimates),
            debug_in_use: inner.reserved,
            debug_limit: limits.debug_reserved,
            web_in_use: inner.web,
            web_limit: limits.web,
            tunnels_in_use: inner.tunnels,
            tunnels_limit: limits.tunnels,
            session_limit: limits.per_session,
            sessions: inner.sessions.len(),
            dry_run: limits.dry_run,
            admitted_normal: inner.admitted[0],
            admitted_debug: inner.admitted[1],
            peer_in_use,
            refused: inner.refused,
            would_refuse: inner.would_refuse,
        }
    }
}

/// What the limits say of a request, before anything is taken.
struct Decision {
    /// The slot it takes, or the refusal and the slot dry-run would use.
    slot: Result<Slot, (Refusal, Slot)>,
    /// It counts against the web-client limit.
    web: bool,
    /// It takes a tunnel slot.
    tunnel: bool,
    /// Its session's key, when sessions are limited.
    session: Option<u64>,
    /// The first check that fails, in the order pool, web client, session,
    /// tunnels.
    refusal: Option<Refusal>,
}

/// Decides with this daemon's counts plus, during a handover, the other
/// daemon's (`shared`).
fn decide(
    inner: &Inner,
    limits: &Limits,
    ask: Ask<'_>,
    session: Option<u64>,
    shared: Option<&Locked<'_>>,
) -> Decision {
    let others = shared.map_or(Others::default(), Locked::others);
    let normal = inner.normal + others.normal;
    let reserved = inner.reserved + others.reserved;
    let limit = inner.normal_limit();
    let slot = if ask.debug {
        if reserved < limits.debug_reserved {
            Ok(Slot::Reserved)
        } else if normal < limit {
            Ok(Slot::Normal)
        } else {
            Err((Refusal::Debug, Slot::Normal))
        }
    } else {
        let below = ask.class.under_pressure(limit, limits.critical_reserve);
        // The clock is read only in the reserve, near a full pool.
        if normal < below || (normal < limit && !inner.under_pressure()) {
            Ok(Slot::Normal)
        } else {
            Err((ask.class.refusal(), Slot::Normal))
        }
    };
    let web = ask.web && ask.per_client();
    let web_full = web && limits.web > 0 && inner.web + others.web >= limits.web;
    let session = session.filter(|_| limits.per_session > 0);
    let session_full = session.is_some_and(|h| {
        let theirs = shared.map_or(0, |s| s.other_session(h));
        inner.sessions.get(&h).copied().unwrap_or(0) + theirs >= limits.per_session
    });
    // Tunnels are this daemon's alone (not in the ledger), and bound
    // `/debug/` upgrades too: a tunnel is not a request.
    let tunnel = ask.tunnel;
    let tunnels_full = tunnel && limits.tunnels > 0 && inner.tunnels >= limits.tunnels;
    let group_full = tunnel
        && limits.tunnels_per_client > 0
        && ask
            .client_group
            .is_some_and(|g| inner.tunnel_groups.get(&g).copied().unwrap_or(0) >= limits.tunnels_per_client);
    let refusal = match slot {
        Err((reason, _)) => Some(reason),
        Ok(_) if web_full => Some(Refusal::Web),
        Ok(_) if session_full => Some(Refusal::Session),
        Ok(_) if group_full => Some(Refusal::TunnelsPerClient),
        Ok(_) if tunnels_full => Some(Refusal::Tunnels),
        Ok(_) => None,
    };
    Decision { slot, web, tunnel, session, refusal }
}

#[cfg(test)]
mod tests;
