//! The memory budget of buffered bodies (`http.bufferMemoryBytes`): every
//! request body read whole and every response read ahead reserves its
//! bytes here first, and gives them back when it is dropped.

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

#[derive(Debug, Default)]
pub struct Budget {
    used: AtomicU64,
}

/// Bytes taken from a [`Budget`], given back on drop.
#[derive(Debug)]
pub struct Reservation {
    budget: Arc<Budget>,
    bytes: u64,
}

impl Budget {
    /// Bytes reserved now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Takes `bytes` if the budget of `limit` has room for them.
    pub fn reserve(self: &Arc<Self>, bytes: u64, limit: u64) -> Option<Reservation> {
        self.take(bytes, limit).then(|| Reservation { budget: self.clone(), bytes })
    }

    fn take(&self, bytes: u64, limit: u64) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&after| after <= limit)
            })
            .is_ok()
    }
}

/// Adds `bytes` to `reservation`, starting it if there is none yet;
/// `false` if the budget of `limit` has no room for them.
pub fn take_more(
    budget: &Arc<Budget>,
    reservation: &mut Option<Reservation>,
    bytes: u64,
    limit: u64,
) -> bool {
    match reservation {
        Some(r) => r.grow(bytes, limit),
        None => {
            *reservation = budget.reserve(bytes, limit);
            reservation.is_some()
        }
    }
}

impl Reservation {
    /// Takes `more` bytes into this reservation, if the budget has room.
    pub fn grow(&mut self, more: u64, limit: u64) -> bool {
        let grown = self.budget.take(more, limit);
        if grown {
            self.bytes += more;
        }
        grown
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_stay_within_the_limit_and_come_back() {
        let b = Arc::new(Budget::default());
        let mut first = b.reserve(60, 100).expect("room");
        assert!(b.reserve(50, 100).is_none(), "60 + 50 is over 100");
        let second = b.reserve(40, 100).expect("exactly full");
        assert!(!first.grow(1, 100));
        drop(second);
        assert!(first.grow(30, 100));
        assert_eq!(b.used(), 90);
        drop(first);
        assert_eq!(b.used(), 0);
    }

    #[test]
    fn concurrent_reservations_never_exceed_the_limit() {
        let b = Arc::new(Budget::default());
        let peak = AtomicU64::new(0);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..10_000 {
                        if let Some(r) = b.reserve(7, 50) {
                            peak.fetch_max(b.used(), Ordering::Relaxed);
                            drop(r);
                        }
                    }
                });
            }
        });
        assert!(peak.load(Ordering::Relaxed) <= 50);
        assert_eq!(b.used(), 0);
    }
}
