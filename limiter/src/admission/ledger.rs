//! Permits counted across the daemons serving one gate, so that during a
//! handover (a second `run` beside the first, until the first has drained)
//! the two together never admit more than the limits.
//!
//! The ledger is memory both daemons map (`kernel::shared_memory`, pinned
//! beside the gate). Each daemon owns one record in it and publishes there
//! what it holds: normal slots, reserved `/debug/` slots, web-client
//! permits, and its sessions' counts under a session key both compute the
//! same way (a keyed hash whose key the ledger holds). An admission takes
//! the ledger's lock, adds the other record's counts to its own, decides,
//! and publishes the change before letting go: one decision at a time
//! across both processes, exactly as the in-process lock orders them
//! within one.
//!
//! A record is live while its owner beats: every 500 ms it writes the
//! boot-time clock (shared by every PID namespace, so pods can share the
//! ledger). A record that has not beaten for 2 s belongs to a daemon that
//! died, and so does one whose beat lies more than 500 ms (a beat) ahead
//! of the reader's clock (a clock that is not ours, or a forged beat): its
//! counts are ignored and its slot reused. A daemon that leaves clears its
//! record.
//!
//! The lock is held for a few instructions. A waiter that sees the lock
//! word name the same holder for over 2 s on its own clock takes it over,
//! whoever it names, with a warning: a daemon killed or stopped while
//! holding it, a live one that keeps it, or a value another writer left
//! there, this daemon's own token included (a process lock orders this
//! daemon's threads before the ledger's, so the word names this daemon
//! while it waits only if someone else wrote it). A holder that was only
//! stopped may then decide at the same time as the taker, neither seeing
//! the other's decision; it does not release the taker's lock when it
//! lets go.
//!
//! A daemon checks at each beat and each time it takes the lock that its
//! record still holds its token. If another writer took the record (one
//! that writes the memory, or a third daemon that found it silent while
//! this one was stopped for 2 s), it logs an error, writes nothing more
//! there and counts every live record as another daemon's; it claims a
//! free or silent record again as soon as there is one and writes there
//! what it holds. It keeps its own counts: it always publishes its totals,
//! never a change added to what the record says.
//!
//! What a writer of the memory can do: while it keeps writing (a live
//! record holding the limits, or a lock word it keeps changing), keep
//! admission refused, as a live daemon holding everything would; by
//! writing zeros in the other record, let each daemon admit up to the
//! limits by itself, as without a ledger. What it cannot do: make one
//! daemon admit more than the limits (a count is read as at most 2^30, so
//! adding it to the daemon's own cannot wrap), or keep anything it left
//! working against admission once it stops: a beat it wrote goes silent
//! within 2.5 s, a lock word is taken over after 2 s, and a record it took
//! from a daemon is claimed back 2 s after its last beat there.
//!
//! A daemon alone (no other live record at its last look under the lock)
//! decides without the ledger's lock: its admissions are already ordered
//! by its own lock, and nobody reads its record at the same time but a
//! daemon that joins. It still publishes every change in its record. It
//! says so in its record (`ALONE`, written under the lock), and a daemon
//! that joins waits, after claiming its record, until no live record says
//! so (at most 2.5 s; warned): the one alone notices the new record at its
//! next admission, release or beat (the other record's token or beat is
//! no longer what it saw), finishes what it was deciding, takes the lock
//! from then on and clears its `ALONE`. So the pair never decides apart.
//! A daemon of a version before this protocol neither waits nor writes
//! `ALONE` (and always takes the lock): started beside one alone, its
//! first decision may not see one decision of the other that was under
//! way as it joined. Per request, the lock and the clock read it needs
//! were most of what the daemons' shared state cost (`cargo xtask bench
//! shared`).
//!
//! Sessions are published in a table of 4,096 slots per record; a session
//! that finds no slot in 16 probes is counted only locally (the other
//! daemon cannot see it), and counted in [`Ledger::unpublished`].
//!
//! Each record also holds the adaptive limit its daemon learnt
//! (`http.adaptive`), so that a daemon taking over starts from it rather
//! than from the ceiling. A writer of the memory can make a starting
//! daemon take any limit between `http.adaptive.minLimit` and the static
//! pool from there, no more; the controller moves on from it.
//!
//! Layout (64-bit words): `[lock, format, seed0, seed1, 0, 0, 0, 0]` then
//! per record `[token, beat, normal, reserved, web, learnt, alone, 0]` and the
//! session table as `(key, count)` pairs.

use std::{
    cell::RefCell,
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex, MutexGuard, PoisonError, TryLockError,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use crate::kernel::shared_memory::Mapping;

/// Records in the ledger: the daemon that serves and the one taking over.
const OWNERS: usize = 2;
/// Session slots per record.
pub const SESSION_SLOTS: usize = 4096;
/// Slots a session key probes.
const SESSION_PROBES: usize = 16;

const HEADER: usize = 8;
const LOCK: usize = 0;
const FORMAT: usize = 1;
const SEED: usize = 2;
/// `LDGR` and format 1.
const FORMAT_ID: u64 = 0x4c44_4752_0000_0001;

const TOKEN: usize = 0;
const BEAT: usize = 1;
const NORMAL: usize = 2;
const RESERVED: usize = 3;
const WEB: usize = 4;
/// The adaptive limit the daemon learnt (high 32 bits) and its base
/// latency in microseconds (low 32 bits); 0: none.
const LEARNT: usize = 5;
/// 1 while the daemon decides without the lock (it found itself alone).
const ALONE: usize = 6;
const SESSIONS: usize = 8;
const OWNER_WORDS: usize = SESSIONS + 2 * SESSION_SLOTS;

/// Bytes of the shared memory the ledger needs.
pub const BYTES: u32 = ((HEADER + OWNERS * OWNER_WORDS) * 8) as u32;

const BEAT_EVERY: Duration = Duration::from_millis(500);
/// A record older than this belongs to a daemon that is gone.
const STALE_MS: u64 = 2000;
/// A record whose beat lies further ahead of the reader's clock than this
/// (one beat) is gone too.
const AHEAD_MS: u64 = BEAT_EVERY.as_millis() as u64;
/// A lock word that names the same holder for longer than this is taken
/// over, whoever it names.
const LOCK_MS: u64 = STALE_MS;
/// The most a count of another record is read as: far above any limit, and
/// a daemon's own count added to it cannot wrap a `u32`.
const COUNT_MAX: u64 = 1 << 30;
/// [`Ledger::record`] while this daemon has none.
const NO_RECORD: usize = usize::MAX;
/// How long a daemon that joins waits for one alone to take the lock.
const JOIN_WAIT: Duration = Duration::from_millis(STALE_MS + AHEAD_MS);

/// Why a daemon could not join the ledger.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error(
        "two limiter daemons already serve the gate in {0} (a handover in progress): let the old one \
         finish draining, then start this one"
    )]
    Full(PathBuf),
    #[error("the permit ledger in {0} has another format (made by another limiter version)")]
    Format(PathBuf),
}

/// This daemon's record in the shared ledger.
pub struct Ledger {
    mem: Mapping,
    clock: Clock,
    token: u64,
    /// This daemon's record, or [`NO_RECORD`] while another writer has the
    /// one it had and none is free; changed under `mine`'s lock.
    record: AtomicUsize,
    /// What this daemon has published; its lock orders this daemon's
    /// threads before the ledger's lock.
    mine: Mutex<Mine>,
    unpublished: AtomicU64,
}

/// What this daemon has published: its record is written from this, never
/// read back.
#[derive(Debug, Default)]
struct Mine {
    /// Normal, reserved and web-client permits.
    counts: [u64; 3],
    /// Requests in flight by session key, for sessions that have a slot.
    sessions: HashMap<u64, u64>,
    /// What the other records held (token, beat) when this daemon last
    /// found itself alone under the lock, and decides without it since;
    /// `None`: it takes the lock.
    alone: Option<[(u64, u64); OWNERS]>,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger").field("record", &self.record()).finish_non_exhaustive()
    }
}

/// What the other daemon holds now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Others {
    pub normal: u32,
    pub reserved: u32,
    pub web: u32,
}

/// A change of what this daemon holds, published under the lock.
#[derive(Clone, Copy, Debug, Default)]
pub struct Change {
    pub normal: i64,
    pub reserved: i64,
    pub web: i64,
}

/// Milliseconds of CLOCK_BOOTTIME.
fn now_ms() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
        .map_or(0, |t| t.tv_sec() as u64 * 1000 + t.tv_nsec() as u64 / 1_000_000)
}

/// What records beat with and what a waiter times a held lock by: the
/// boot-time clock, or in tests a clock moved by hand.
#[derive(Clone, Debug, Default)]
struct Clock {
    #[cfg(test)]
    fake: Option<Arc<AtomicU64>>,
}

impl Clock {
    fn now_ms(&self) -> u64 {
        #[cfg(test)]
        if let Some(ms) = &self.fake {
            return ms.load(Ordering::SeqCst);
        }
        now_ms()
    }
}

impl Ledger {
    /// Joins the ledger in `mem` (of the gate pinned in `pin_dir`): takes a
    /// free record, or one whose owner stopped beating, waiting up to
    /// `wait` for one.
    pub fn join(mem: Mapping, pin_dir: &Path, wait: Duration) -> Result<Arc<Self>, LedgerError> {
        Self::join_with(mem, pin_dir, wait, Clock::default())
    }

    fn join_with(
        mem: Mapping,
        pin_dir: &Path,
        wait: Duration,
        clock: Clock,
    ) -> Result<Arc<Self>, LedgerError> {
        assert!(mem.words().len() >= BYTES as usize / 8, "the mapping holds the ledger");
        let token = fastrand::u64(1..);
        let start = Instant::now();
        let me = loop {
            let w = mem.words();
            let format = w[FORMAT].load(Ordering::Acquire);
            if format != 0 && format != FORMAT_ID {
                return Err(LedgerError::Format(pin_dir.to_path_buf()));
            }
            if (0..OWNERS).any(|o| free(w, o, clock.now_ms())) {
                let guard = lock_words(w, token, &clock);
                // Checked again under the lock: the other may have just joined.
                let now = clock.now_ms();
                if let Some(o) = (0..OWNERS).find(|&o| free(w, o, now)) {
                    if w[FORMAT].load(Ordering::Relaxed) == 0 {
                        w[SEED].store(super::session::random_u64(), Ordering::Relaxed);
                        w[SEED + 1].store(super::session::random_u64(), Ordering::Relaxed);
                        w[FORMAT].store(FORMAT_ID, Ordering::Relaxed);
                    }
                    claim(w, o, token, now);
                    drop(guard);
                    break o;
                }
                drop(guard);
                continue;
            }
            if start.elapsed() >= wait {
                return Err(LedgerError::Full(pin_dir.to_path_buf()));
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        tracing::debug!(record = me, "joined the HTTP permit ledger");
        wait_for_lone_daemons(mem.words(), me, &clock);
        Ok(Arc::new(Self {
            mem,
            clock,
            token,
            record: AtomicUsize::new(me),
            mine: Mutex::default(),
            unpublished: AtomicU64::new(0),
        }))
    }

    /// How often a daemon must [`Self::beat`] while it uses the ledger
    /// (from the start of serving; [`Self::join`] beat once).
    pub const BEAT_EVERY: Duration = BEAT_EVERY;

    /// The key of the session hash, the same in every daemon of the gate.
    pub fn seed(&self) -> (u64, u64) {
        let w = self.mem.words();
        (w[SEED].load(Ordering::Relaxed), w[SEED + 1].load(Ordering::Relaxed))
    }

    /// Tells the other daemon this one is alive, in its record if the
    /// record still holds its token; if not, takes the lock, which notices
    /// the loss and claims a free record if there is one.
    pub fn beat(&self) {
        let w = self.mem.words();
        match self.record() {
            Some(me) if w[owner(me) + TOKEN].load(Ordering::Acquire) == self.token => {
                w[owner(me) + BEAT].store(self.clock.now_ms(), Ordering::Release);
                // Alone and idle while another joined: take the lock, which
                // tells the joiner this daemon no longer decides apart. (If
                // `mine` is held, a decision is under way, and the next one
                // looks.)
                let joined = match self.mine.try_lock() {
                    Ok(mine) => mine.alone.is_some_and(|seen| !self.still_alone(w, &seen)),
                    Err(TryLockError::Poisoned(p)) => {
                        p.into_inner().alone.is_some_and(|seen| !self.still_alone(w, &seen))
                    }
                    Err(TryLockError::WouldBlock) => false,
                };
                if joined {
                    drop(self.lock());
                }
            }
            _ => drop(self.lock()),
        }
    }

    /// Whether this daemon, alone when the other records held `seen`, still
    /// is: its record is its own and the others have not changed.
    fn still_alone(&self, w: &[AtomicU64], seen: &[(u64, u64); OWNERS]) -> bool {
        let Some(me) = self.record() else {
            return false;
        };
        w[owner(me) + TOKEN].load(Ordering::Acquire) == self.token
            && (0..OWNERS).filter(|&o| o != me).all(|o| {
                (w[owner(o) + TOKEN].load(Ordering::Acquire), w[owner(o) + BEAT].load(Ordering::Acquire))
                    == seen[o]
            })
    }

    /// This daemon's record, if it has one.
    fn record(&self) -> Option<usize> {
        Some(self.record.load(Ordering::Relaxed)).filter(|&r| r != NO_RECORD)
    }

    /// Sessions that found no slot in the shared table (counted locally only).
    pub fn unpublished(&self) -> u64 {
        self.unpublished.load(Ordering::Relaxed)
    }

    /// Takes the ledger's lock (a few instructions while the other daemon
    /// does not hold it, 2 s at most while a holder keeps it), checking
    /// that this daemon's record is still its own.
    pub fn lock(&self) -> Locked<'_> {
        let mut mine = self.mine.lock().unwrap_or_else(PoisonError::into_inner);
        let w = self.mem.words();
        if let Some(seen) = mine.alone {
            if self.still_alone(w, &seen) {
                // Nobody else decides: this daemon's own lock (held) orders
                // its decisions, and what it publishes a joiner reads once
                // this daemon has cleared its `ALONE`.
                return Locked {
                    ledger: self,
                    counted: [false; OWNERS],
                    _guard: None,
                    mine: RefCell::new(mine),
                };
            }
            mine.alone = None;
        }
        let guard = lock_words(w, self.token, &self.clock);
        let now = self.clock.now_ms();
        let mut me = self.record();
        if let Some(r) = me
            && w[owner(r) + TOKEN].load(Ordering::Relaxed) != self.token
        {
            tracing::error!(
                record = r,
                "another writer took this daemon's record in the HTTP permit ledger: the other daemon \
                 does not see what this one holds until it has a record again"
            );
            me = None;
            self.record.store(NO_RECORD, Ordering::Relaxed);
        }
        if me.is_none()
            && let Some(o) = (0..OWNERS).find(|&o| free(w, o, now))
        {
            claim(w, o, self.token, now);
            self.republish(w, o, &mut mine);
            me = Some(o);
            self.record.store(o, Ordering::Relaxed);
            tracing::warn!(record = o, "claimed a record in the HTTP permit ledger again");
        }
        let counted: [bool; OWNERS] = std::array::from_fn(|o| me != Some(o) && !free(w, o, now));
        if let Some(r) = me {
            // Decided under the lock (this call's decision included) until
            // the next look finds it alone again.
            let alone = !counted.contains(&true);
            mine.alone = alone.then(|| {
                std::array::from_fn(|o| {
                    (w[owner(o) + TOKEN].load(Ordering::Relaxed), w[owner(o) + BEAT].load(Ordering::Relaxed))
                })
            });
            w[owner(r) + ALONE].store(u64::from(alone), Ordering::Release);
        }
        Locked { ledger: self, counted, _guard: Some(guard), mine: RefCell::new(mine) }
    }

    /// Writes what this daemon holds into record `o`, just claimed.
    fn republish(&self, w: &[AtomicU64], o: usize, mine: &mut Mine) {
        let at = owner(o);
        for (i, c) in [NORMAL, RESERVED, WEB].into_iter().zip(mine.counts) {
            w[at + i].store(c, Ordering::Relaxed);
        }
        mine.sessions.retain(|&key, &mut n| {
            let slot = probes(key).find(|&i| w[at + session(i) + 1].load(Ordering::Relaxed) == 0);
            if let Some(i) = slot {
                w[at + session(i)].store(key, Ordering::Relaxed);
                w[at + session(i) + 1].store(n, Ordering::Relaxed);
            } else {
                self.unpublished.fetch_add(1, Ordering::Relaxed);
            }
            slot.is_some()
        });
    }
}

impl Drop for Ledger {
    fn drop(&mut self) {
        let w = self.mem.words();
        let guard = lock_words(w, self.token, &self.clock);
        if let Some(me) = self.record()
            && w[owner(me) + TOKEN].load(Ordering::Relaxed) == self.token
        {
            for word in &w[owner(me)..owner(me) + OWNER_WORDS] {
                word.store(0, Ordering::Relaxed);
            }
        }
        drop(guard);
    }
}

/// The ledger while this daemon holds its lock.
pub struct Locked<'a> {
    ledger: &'a Ledger,
    /// The records counted as other daemons': every live one but this
    /// daemon's own (both while it has none).
    counted: [bool; OWNERS],
    /// The ledger's lock; `None` while this daemon is alone.
    _guard: Option<Guard<'a>>,
    mine: RefCell<MutexGuard<'a, Mine>>,
}

impl Locked<'_> {
    fn words(&self) -> &[AtomicU64] {
        self.ledger.mem.words()
    }

    /// Word indexes of the records counted as other daemons'.
    fn others_records(&self) -> impl Iterator<Item = usize> + '_ {
        (0..OWNERS).filter(|&o| self.counted[o]).map(owner)
    }

    /// Whether another daemon serves the gate now.
    pub fn has_peer(&self) -> bool {
        self.counted.contains(&true)
    }

    /// What the other daemon holds (nothing if there is none).
    pub fn others(&self) -> Others {
        let w = self.words();
        let sum = |i: usize| {
            let n: u64 = self.others_records().map(|p| w[p + i].load(Ordering::Relaxed).min(COUNT_MAX)).sum();
            n.min(COUNT_MAX) as u32
        };
        Others { normal: sum(NORMAL), reserved: sum(RESERVED), web: sum(WEB) }
    }

    /// What the other daemon's adaptive controller learnt: its limit and
    /// base latency in microseconds (`None`: no other, or it learnt
    /// nothing).
    pub fn others_learnt(&self) -> Option<(u32, u32)> {
        let w = self.words();
        self.others_records()
            .map(|p| w[p + LEARNT].load(Ordering::Relaxed))
            .find(|&v| v != 0)
            .map(|v| ((v >> 32) as u32, v as u32))
    }

    /// Publishes what this daemon's controller learnt (0, 0: nothing).
    pub fn publish_learnt(&self, limit: u32, base_us: u32) {
        if let Some(me) = self.ledger.record() {
            self.words()[owner(me) + LEARNT]
                .store((u64::from(limit) << 32) | u64::from(base_us), Ordering::Relaxed);
        }
    }

    /// The other daemon's requests in flight for session `key`.
    pub fn other_session(&self, key: u64) -> u32 {
        let w = self.words();
        let n: u64 = self
            .others_records()
            .filter_map(|p| {
                probes(key)
                    .map(|i| {
                        (
                            w[p + session(i)].load(Ordering::Relaxed),
                            w[p + session(i) + 1].load(Ordering::Relaxed),
                        )
                    })
                    .find(|&(k, n)| k == key && n > 0)
                    .map(|(_, n)| n.min(COUNT_MAX))
            })
            .sum();
        n.min(COUNT_MAX) as u32
    }

    /// Publishes a change of this daemon's counts (its totals, in its
    /// record if it has one).
    pub fn publish(&self, change: Change) {
        let mut mine = self.mine.borrow_mut();
        for (c, d) in mine.counts.iter_mut().zip([change.normal, change.reserved, change.web]) {
            *c = c.wrapping_add_signed(d);
        }
        if let Some(me) = self.ledger.record() {
            let w = self.words();
            for (i, c) in [NORMAL, RESERVED, WEB].into_iter().zip(mine.counts) {
                w[owner(me) + i].store(c, Ordering::Relaxed);
            }
        }
    }

    /// Adds `delta` (±1) to this daemon's count of session `key`; `false`
    /// if the session has no slot and could not get one, or this daemon
    /// has no record (then it is not published: the caller must not take
    /// it back either).
    pub fn publish_session(&self, key: u64, delta: i64) -> bool {
        let mut mine = self.mine.borrow_mut();
        let n = match (mine.sessions.get(&key).copied(), delta > 0) {
            (Some(n), _) => n.wrapping_add_signed(delta),
            (None, true) => 1,
            (None, false) => return false,
        };
        let Some(me) = self.ledger.record().map(owner) else {
            // Taken back from the record this daemon had; nothing new.
            return if delta > 0 { false } else { set(&mut mine.sessions, key, n) };
        };
        let w = self.words();
        let at = |i: usize| (&w[me + session(i)], &w[me + session(i) + 1]);
        let found = probes(key).find(|&i| {
            let (k, n) = at(i);
            k.load(Ordering::Relaxed) == key && n.load(Ordering::Relaxed) > 0
        });
        let slot = match found {
            Some(i) => Some(i),
            None if delta > 0 => probes(key).find(|&i| at(i).1.load(Ordering::Relaxed) == 0),
            // Its slot was written over: nothing there to take back.
            None => return set(&mut mine.sessions, key, n),
        };
        let Some(i) = slot else {
            self.ledger.unpublished.fetch_add(1, Ordering::Relaxed);
            return false;
        };
        let (k, count) = at(i);
        k.store(key, Ordering::Relaxed);
        count.store(n, Ordering::Relaxed);
        set(&mut mine.sessions, key, n)
    }
}

/// Sets session `key`'s count to `n` (none at 0); `true`.
fn set(sessions: &mut HashMap<u64, u64>, key: u64, n: u64) -> bool {
    if n == 0 {
        sessions.remove(&key);
    } else {
        sessions.insert(key, n);
    }
    true
}

/// Word index of record `o`.
fn owner(o: usize) -> usize {
    HEADER + o * OWNER_WORDS
}

/// Word index, within a record, of session slot `i`.
fn session(i: usize) -> usize {
    SESSIONS + 2 * i
}

/// The slots session `key` probes.
fn probes(key: u64) -> impl Iterator<Item = usize> {
    let start = (key as usize) % SESSION_SLOTS;
    (0..SESSION_PROBES).map(move |i| (start + i) % SESSION_SLOTS)
}

/// Whether a record that beat at `beat` is gone at `now`: silent for 2 s,
/// or beating more than a beat ahead of `now`.
fn stale(beat: u64, now: u64) -> bool {
    now.saturating_sub(beat) > STALE_MS || beat.saturating_sub(now) > AHEAD_MS
}

/// Whether record `o` may be claimed: no daemon's, or a gone one's.
fn free(w: &[AtomicU64], o: usize, now: u64) -> bool {
    w[owner(o) + TOKEN].load(Ordering::Relaxed) == 0 || stale(w[owner(o) + BEAT].load(Ordering::Relaxed), now)
}

/// Waits, after this daemon claimed record `me`, until no other live
/// record says its daemon decides alone, for at most [`JOIN_WAIT`].
fn wait_for_lone_daemons(w: &[AtomicU64], me: usize, clock: &Clock) {
    let start = Instant::now();
    let lone = || {
        let now = clock.now_ms();
        (0..OWNERS).any(|o| o != me && !free(w, o, now) && w[owner(o) + ALONE].load(Ordering::Acquire) != 0)
    };
    while lone() {
        if start.elapsed() >= JOIN_WAIT {
            tracing::warn!(
                "the other daemon in the HTTP permit ledger still decides alone {} ms after this one joined: \
                 going on (its record is counted from now on)",
                JOIN_WAIT.as_millis()
            );
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Makes record `o` the empty record of `token` (under the lock).
fn claim(w: &[AtomicU64], o: usize, token: u64, now: u64) {
    for word in &w[owner(o)..owner(o) + OWNER_WORDS] {
        word.store(0, Ordering::Relaxed);
    }
    w[owner(o) + BEAT].store(now, Ordering::Relaxed);
    w[owner(o) + TOKEN].store(token, Ordering::Relaxed);
}

/// Held lock; released on drop unless another took it over meanwhile.
struct Guard<'a> {
    lock: &'a AtomicU64,
    token: u64,
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        // A holder whose lock was taken over leaves it to the taker.
        let _ = self.lock.compare_exchange(self.token, 0, Ordering::Release, Ordering::Relaxed);
    }
}

/// Takes the lock word for `token`: spinning, then yielding. A word that
/// names the same holder for longer than [`LOCK_MS`] on `clock` is taken
/// over, whoever it names.
fn lock_words<'a>(w: &'a [AtomicU64], token: u64, clock: &Clock) -> Guard<'a> {
    let lock = &w[LOCK];
    let mut spins = 0u32;
    let mut seen: Option<(u64, u64)> = None;
    loop {
        let held = match lock.compare_exchange_weak(0, token, Ordering::Acquire, Ordering::Relaxed) {
            Ok(_) => return Guard { lock, token },
            Err(held) => held,
        };
        spins = spins.wrapping_add(1);
        if spins < 64 {
            std::hint::spin_loop();
            continue;
        }
        std::thread::yield_now();
        let now = clock.now_ms();
        match seen {
            Some((h, since)) if h == held => {
                if now.saturating_sub(since) > LOCK_MS {
                    if lock.compare_exchange(held, token, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                        tracing::warn!(
                            holder = holder(w, held, token, now),
                            "took over the HTTP permit ledger's lock, held for over 2 s"
                        );
                        return Guard { lock, token };
                    }
                    seen = None;
                }
            }
            _ => seen = Some((held, now)),
        }
    }
}

/// Who the lock word `held` names, for the log of a takeover by `token`.
fn holder(w: &[AtomicU64], held: u64, token: u64, now: u64) -> &'static str {
    if held == token {
        return "this daemon's own token, which it did not hold (written by another)";
    }
    let record = (0..OWNERS).find(|&o| w[owner(o) + TOKEN].load(Ordering::Relaxed) == held);
    match record {
        Some(o) if !stale(w[owner(o) + BEAT].load(Ordering::Relaxed), now) => "a live daemon",
        Some(_) => "a daemon that stopped beating",
        None => "no daemon's token (one that died joining, or written by another)",
    }
}

#[cfg(test)]
mod tests;
