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
//! died: its counts are ignored, its slot reused, and a lock it held is
//! taken over. A daemon that leaves clears its record.
//!
//! Sessions are published in a table of 4,096 slots per record; a session
//! that finds no slot in 16 probes is counted only locally (the other
//! daemon cannot see it), and counted in [`Ledger::unpublished`].
//!
//! Layout (64-bit words): `[lock, format, seed0, seed1, 0, 0, 0, 0]` then
//! per record `[token, beat, normal, reserved, web, 0, 0, 0]` and the
//! session table as `(key, count)` pairs.

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
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
const SESSIONS: usize = 8;
const OWNER_WORDS: usize = SESSIONS + 2 * SESSION_SLOTS;

/// Bytes of the shared memory the ledger needs.
pub const BYTES: u32 = ((HEADER + OWNERS * OWNER_WORDS) * 8) as u32;

const BEAT_EVERY: Duration = Duration::from_millis(500);
/// A record older than this belongs to a daemon that is gone.
const STALE_MS: u64 = 2000;

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
    me: usize,
    token: u64,
    unpublished: AtomicU64,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger").field("record", &self.me).finish_non_exhaustive()
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

fn now_ms() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
        .map_or(0, |t| t.tv_sec() as u64 * 1000 + t.tv_nsec() as u64 / 1_000_000)
}

impl Ledger {
    /// Joins the ledger in `mem` (of the gate pinned in `pin_dir`): takes a
    /// free record, or one whose owner stopped beating, waiting up to
    /// `wait` for one.
    pub fn join(mem: Mapping, pin_dir: &Path, wait: Duration) -> Result<Arc<Self>, LedgerError> {
        assert!(mem.words().len() >= BYTES as usize / 8, "the mapping holds the ledger");
        let token = fastrand::u64(1..);
        let start = Instant::now();
        let me = loop {
            let w = mem.words();
            let format = w[FORMAT].load(Ordering::Acquire);
            if format != 0 && format != FORMAT_ID {
                return Err(LedgerError::Format(pin_dir.to_path_buf()));
            }
            let free = (0..OWNERS).find(|&o| {
                let t = w[owner(o) + TOKEN].load(Ordering::Acquire);
                t == 0 || stale(w[owner(o) + BEAT].load(Ordering::Acquire))
            });
            if let Some(o) = free {
                let guard = lock_words(w, token);
                // Checked again under the lock: the other may have just joined.
                let t = w[owner(o) + TOKEN].load(Ordering::Relaxed);
                if t == 0 || stale(w[owner(o) + BEAT].load(Ordering::Relaxed)) {
                    if w[FORMAT].load(Ordering::Relaxed) == 0 {
                        w[SEED].store(super::session::random_u64(), Ordering::Relaxed);
                        w[SEED + 1].store(super::session::random_u64(), Ordering::Relaxed);
                        w[FORMAT].store(FORMAT_ID, Ordering::Relaxed);
                    }
                    for word in &w[owner(o)..owner(o) + OWNER_WORDS] {
                        word.store(0, Ordering::Relaxed);
                    }
                    w[owner(o) + BEAT].store(now_ms(), Ordering::Relaxed);
                    w[owner(o) + TOKEN].store(token, Ordering::Relaxed);
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
        Ok(Arc::new(Self { mem, me, token, unpublished: AtomicU64::new(0) }))
    }

    /// Beats every 500 ms while the ledger is in use (run it as a task from
    /// the start of serving; [`Self::join`] beat once).
    pub async fn beating(ledger: std::sync::Weak<Self>) {
        let mut every = tokio::time::interval(BEAT_EVERY);
        loop {
            every.tick().await;
            match ledger.upgrade() {
                Some(l) => l.beat(),
                None => return,
            }
        }
    }

    /// The key of the session hash, the same in every daemon of the gate.
    pub fn seed(&self) -> (u64, u64) {
        let w = self.mem.words();
        (w[SEED].load(Ordering::Relaxed), w[SEED + 1].load(Ordering::Relaxed))
    }

    /// Tells the other daemon this one is alive.
    pub fn beat(&self) {
        let w = self.mem.words();
        w[owner(self.me) + BEAT].store(now_ms(), Ordering::Release);
    }

    /// Sessions that found no slot in the shared table (counted locally only).
    pub fn unpublished(&self) -> u64 {
        self.unpublished.load(Ordering::Relaxed)
    }

    /// Takes the ledger's lock (a few instructions while the other daemon
    /// does not hold it).
    pub fn lock(&self) -> Locked<'_> {
        let w = self.mem.words();
        let peer = owner(1 - self.me);
        let guard = lock_words(w, self.token);
        let live = {
            let t = w[peer + TOKEN].load(Ordering::Relaxed);
            t != 0 && !stale(w[peer + BEAT].load(Ordering::Relaxed))
        };
        Locked { ledger: self, peer: live.then_some(peer), _guard: guard }
    }
}

impl Drop for Ledger {
    fn drop(&mut self) {
        let w = self.mem.words();
        let guard = lock_words(w, self.token);
        if w[owner(self.me) + TOKEN].load(Ordering::Relaxed) == self.token {
            for word in &w[owner(self.me)..owner(self.me) + OWNER_WORDS] {
                word.store(0, Ordering::Relaxed);
            }
        }
        drop(guard);
    }
}

/// The ledger while this daemon holds its lock.
pub struct Locked<'a> {
    ledger: &'a Ledger,
    /// The other record, if its daemon is alive.
    peer: Option<usize>,
    _guard: Guard<'a>,
}

impl Locked<'_> {
    fn words(&self) -> &[AtomicU64] {
        self.ledger.mem.words()
    }

    /// Whether another daemon serves the gate now.
    pub fn has_peer(&self) -> bool {
        self.peer.is_some()
    }

    /// What the other daemon holds (nothing if there is none).
    pub fn others(&self) -> Others {
        let Some(p) = self.peer else { return Others::default() };
        let w = self.words();
        let get = |i: usize| w[p + i].load(Ordering::Relaxed) as u32;
        Others { normal: get(NORMAL), reserved: get(RESERVED), web: get(WEB) }
    }

    /// The other daemon's requests in flight for session `key`.
    pub fn other_session(&self, key: u64) -> u32 {
        let Some(p) = self.peer else { return 0 };
        let w = self.words();
        probes(key)
            .map(|i| {
                (w[p + session(i)].load(Ordering::Relaxed), w[p + session(i) + 1].load(Ordering::Relaxed))
            })
            .find(|&(k, n)| k == key && n > 0)
            .map_or(0, |(_, n)| n as u32)
    }

    /// Publishes a change of this daemon's counts.
    pub fn publish(&self, change: Change) {
        let w = self.words();
        let me = owner(self.ledger.me);
        for (i, d) in [(NORMAL, change.normal), (RESERVED, change.reserved), (WEB, change.web)] {
            if d != 0 {
                let v = w[me + i].load(Ordering::Relaxed).wrapping_add_signed(d);
                w[me + i].store(v, Ordering::Relaxed);
            }
        }
    }

    /// Adds `delta` (±1) to this daemon's count of session `key`; `false`
    /// if the session has no slot and could not get one (then it is not
    /// published: the caller must not take it back either).
    pub fn publish_session(&self, key: u64, delta: i64) -> bool {
        let w = self.words();
        let me = owner(self.ledger.me);
        let at = |i: usize| (&w[me + session(i)], &w[me + session(i) + 1]);
        let found = probes(key).find(|&i| {
            let (k, n) = at(i);
            k.load(Ordering::Relaxed) == key && n.load(Ordering::Relaxed) > 0
        });
        let slot = match found {
            Some(i) => Some(i),
            None if delta > 0 => probes(key).find(|&i| at(i).1.load(Ordering::Relaxed) == 0),
            None => return false,
        };
        let Some(i) = slot else {
            self.ledger.unpublished.fetch_add(1, Ordering::Relaxed);
            return false;
        };
        let (k, n) = at(i);
        k.store(key, Ordering::Relaxed);
        n.store(n.load(Ordering::Relaxed).wrapping_add_signed(delta), Ordering::Relaxed);
        true
    }
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

fn stale(beat: u64) -> bool {
    now_ms().saturating_sub(beat) > STALE_MS
}

/// Held lock; released on drop.
struct Guard<'a> {
    lock: &'a AtomicU64,
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        self.lock.store(0, Ordering::Release);
    }
}

/// Takes the lock word for `token`: spinning, then yielding. A lock held
/// by the same token for longer than a record takes to go stale, by no
/// live record, is taken over (a daemon killed while holding it).
fn lock_words(w: &[AtomicU64], token: u64) -> Guard<'_> {
    let lock = &w[LOCK];
    let mut spins = 0u32;
    let mut seen: Option<(u64, Instant)> = None;
    loop {
        let held = match lock.compare_exchange_weak(0, token, Ordering::Acquire, Ordering::Relaxed) {
            Ok(_) => return Guard { lock },
            Err(held) => held,
        };
        spins = spins.wrapping_add(1);
        if spins < 64 {
            std::hint::spin_loop();
            continue;
        }
        std::thread::yield_now();
        match seen {
            Some((h, since)) if h == held => {
                if since.elapsed() > Duration::from_millis(STALE_MS) {
                    let alive = (0..OWNERS).any(|o| {
                        w[owner(o) + TOKEN].load(Ordering::Relaxed) == held
                            && !stale(w[owner(o) + BEAT].load(Ordering::Relaxed))
                    });
                    if !alive
                        && lock.compare_exchange(held, token, Ordering::Acquire, Ordering::Relaxed).is_ok()
                    {
                        tracing::warn!("took over the HTTP permit ledger's lock from a daemon that stopped");
                        return Guard { lock };
                    }
                    seen = None;
                }
            }
            _ => seen = Some((held, Instant::now())),
        }
    }
}

#[cfg(test)]
mod tests;
