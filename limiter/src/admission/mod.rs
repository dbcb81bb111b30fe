//! HTTP admission: permits for the normal pool, the reserved `/debug/`
//! slots, web clients (`X-Client-Id`) and sessions (`Authorization`).
//!
//! One short critical section decides a request: every applicable limit is
//! checked first and the permits are taken only if all pass, so a refusal
//! never leaves a partial permit behind and a concurrent request never sees
//! a slot that is about to be given back. A [`Permit`] returns everything it
//! took when dropped.
//!
//! Sessions are kept under a keyed hash of the normalised `Authorization`
//! value (`session.rs`): the token itself is never stored, and an entry
//! disappears when its count reaches zero, so memory is bounded by what is
//! in flight, whatever the number of distinct tokens.

pub mod ledger;
pub mod adaptive;
mod session;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard},
};

use self::{
    ledger::{Change, Ledger, Locked, Others},
    session::SessionKeys,
};
use crate::config::{DEBUG_SLOTS, HttpConfig};

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
}

impl Refusal {
    pub const ALL: [Refusal; 4] = [Refusal::Normal, Refusal::Debug, Refusal::Web, Refusal::Session];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "normal",
            Self::Debug => "debug",
            Self::Web => "web",
            Self::Session => "session",
        }
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
}

impl Limits {
    pub fn from_config(http: &HttpConfig) -> Self {
        Self {
            normal: http.normal_limit(),
            debug_reserved: DEBUG_SLOTS,
            per_session: http.max_session_connections,
            web: http.max_web_connections,
            dry_run: http.dry_run,
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
    /// Keyed hash of the session → requests in flight. Only kept while
    /// a per-session limit is set.
    sessions: HashMap<u64, u32>,
    admitted: [u64; 2],
    refused: [u64; Refusal::ALL.len()],
    would_refuse: [u64; Refusal::ALL.len()],
}

impl Inner {
    /// Nothing in use yet, under `limits`.
    fn new(limits: Limits) -> Self {
        Self {
            limits,
            normal: 0,
            reserved: 0,
            web: 0,
            sessions: HashMap::new(),
            admitted: [0; 2],
            refused: [0; Refusal::ALL.len()],
            would_refuse: [0; Refusal::ALL.len()],
        }
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
}

/// Counters and gauges, for metrics and dump.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Snapshot {
    pub normal_in_use: u32,
    pub normal_limit: u32,
    pub debug_in_use: u32,
    pub debug_limit: u32,
    pub web_in_use: u32,
    pub web_limit: u32,
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
}

/// Held from admission until the response is finished or the client is
/// gone; gives back every slot it took when dropped.
#[derive(Debug)]
pub struct Permit {
    admission: Arc<Admission>,
    slot: Slot,
    web: bool,
    session: Option<u64>,
    /// The session's unit is in the ledger (to be taken back there).
    session_published: bool,
}

impl Permit {
    pub fn slot(&self) -> Slot {
        self.slot
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut inner = self.admission.lock();
        match self.slot {
            Slot::Normal => inner.normal -= 1,
            Slot::Reserved => inner.reserved -= 1,
        }
        if self.web {
            inner.web -= 1;
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
        self.lock().limits = limits;
    }

    pub fn limits(&self) -> Limits {
        self.lock().limits
    }

    /// Takes every permit the request needs, or none: `Err` names the first
    /// check that failed, in the order pool, web client, session.
    pub fn admit(self: &Arc<Self>, ask: Ask<'_>) -> Result<Permit, Refusal> {
        let session = self.session_of(ask);
        let mut inner = self.lock();
        let shared = self.shared();
        let limits = inner.limits;
        let Decision { slot, web, session, refusal } = decide(&inner, &limits, ask, session, shared.as_ref());
        if let Some(reason) = refusal {
            if !limits.dry_run {
                inner.refused[reason.index()] += 1;
                return Err(reason);
            }
            inner.would_refuse[reason.index()] += 1;
        }
        // Dry-run admits past a full pool on a normal slot, counted as such.
        let slot = slot.unwrap_or_else(|(_, fallback)| fallback);
        match slot {
            Slot::Normal => inner.normal += 1,
            Slot::Reserved => inner.reserved += 1,
        }
        inner.admitted[usize::from(ask.debug)] += 1;
        if web {
            inner.web += 1;
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
        Ok(Permit { admission: self.clone(), slot, web, session, session_published })
    }

    /// The session of an `Authorization` value as logs may show it: 32 bits
    /// of its keyed hash (the value itself is never shown).
    pub fn session_tag(&self, authorization: &[u8]) -> u32 {
        (self.session_keys.key(authorization) >> 32) as u32
    }

    /// The keyed hash of the request's session (none for `/debug/`).
    fn session_of(&self, ask: Ask<'_>) -> Option<u64> {
        ask.session.filter(|_| !ask.debug).map(|token| self.session_keys.key(token))
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
        match decide(&inner, &limits, ask, session, shared.as_ref()).refusal {
            Some(reason) if !limits.dry_run => {
                inner.refused[reason.index()] += 1;
                Err(reason)
            }
            _ => Ok(()),
        }
    }

    /// Refusals and would-be refusals (dry-run) of `reason` so far; the
    /// admission lock only (no ledger), for a sampler.
    pub fn refusals(&self, reason: Refusal) -> u64 {
        let inner = self.lock();
        inner.refused[reason.index()] + inner.would_refuse[reason.index()]
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
            normal_limit: limits.normal,
            debug_in_use: inner.reserved,
            debug_limit: limits.debug_reserved,
            web_in_use: inner.web,
            web_limit: limits.web,
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
    /// Its session's key, when sessions are limited.
    session: Option<u64>,
    /// The first check that fails, in the order pool, web client, session.
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
    let slot = if ask.debug {
        if reserved < limits.debug_reserved {
            Ok(Slot::Reserved)
        } else if normal < limits.normal {
            Ok(Slot::Normal)
        } else {
            Err((Refusal::Debug, Slot::Normal))
        }
    } else if normal < limits.normal {
        Ok(Slot::Normal)
    } else {
        Err((Refusal::Normal, Slot::Normal))
    };
    let web = ask.web && !ask.debug;
    let web_full = web && limits.web > 0 && inner.web + others.web >= limits.web;
    let session = session.filter(|_| limits.per_session > 0);
    let session_full = session.is_some_and(|h| {
        let theirs = shared.map_or(0, |s| s.other_session(h));
        inner.sessions.get(&h).copied().unwrap_or(0) + theirs >= limits.per_session
    });
    let refusal = match slot {
        Err((reason, _)) => Some(reason),
        Ok(_) if web_full => Some(Refusal::Web),
        Ok(_) if session_full => Some(Refusal::Session),
        Ok(_) => None,
    };
    Decision { slot, web, session, refusal }
}

#[cfg(test)]
mod tests;
