//! The memory budget of buffered bodies (`http.bufferMemoryBytes`): every
//! request body read whole and every response read ahead reserves its
//! bytes here first, and gives them back when it is dropped.

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

use bytes::{Bytes, BytesMut};

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

/// A body held in memory as its pieces come, within a size limit and the
/// budget: the first piece kept as it came (no copy for a body that comes
/// in one), later ones copied into one buffer sized for the whole.
#[derive(Default)]
pub struct Collect {
    first: Option<Bytes>,
    held: Option<BytesMut>,
    total: u64,
    reservation: Option<Reservation>,
    /// The whole length was reserved at once.
    exact: Option<u64>,
    /// The whole length, when known.
    hint: Option<u64>,
}

impl Collect {
    /// A body of length `n`, reserved whole (`None`: the budget is spent).
    pub fn exact(budget: &Arc<Budget>, n: u64, limit: u64) -> Option<Self> {
        let reservation = budget.reserve(n, limit)?;
        Some(Self { reservation: Some(reservation), exact: Some(n), hint: Some(n), ..Self::default() })
    }

    /// A body of unknown length, reserved as it comes.
    pub fn growing() -> Self {
        Self::default()
    }

    /// A body of length `n`, reserved as it comes (the budget then counts
    /// what is held, not what is promised), held in one buffer of that size.
    pub fn sized(n: u64) -> Self {
        Self { hint: Some(n), ..Self::default() }
    }

    /// Bytes held so far.
    pub fn len(&self) -> u64 {
        self.total
    }

    /// Adds a piece, if the body stays within `max` bytes and the budget
    /// of `limit` has room; `Err` gives the piece back.
    pub fn push(&mut self, data: Bytes, max: u64, budget: &Arc<Budget>, limit: u64) -> Result<(), Bytes> {
        let n = data.len() as u64;
        let fits = match self.exact {
            Some(exact) => self.total + n <= exact,
            None => self.total + n <= max && take_more(budget, &mut self.reservation, n, limit),
        };
        if !fits {
            return Err(data);
        }
        self.total += n;
        match (&mut self.held, self.first.take()) {
            (Some(held), _) => held.extend_from_slice(&data),
            (None, None) => self.first = Some(data),
            (None, Some(first)) => {
                let size = self.exact.or(self.hint).unwrap_or(self.total.max(2 * first.len() as u64));
                let mut held = BytesMut::with_capacity(size as usize);
                held.extend_from_slice(&first);
                held.extend_from_slice(&data);
                self.held = Some(held);
            }
        }
        Ok(())
    }

    /// Everything held, then `extra`: bytes that keep their share of the
    /// budget while they live (given back when the last copy is written
    /// out, not when the body is handed over).
    pub fn finish(mut self, extra: Option<Bytes>) -> Bytes {
        let bytes = match (self.held.take(), self.first.take(), extra) {
            (Some(held), _, None) => held.freeze(),
            (None, Some(first), None) => first,
            (None, None, None) => Bytes::new(),
            (None, None, Some(extra)) => extra,
            (held, first, Some(extra)) => {
                let mut all = held.unwrap_or_else(|| BytesMut::from(first.unwrap_or_default()));
                all.extend_from_slice(&extra);
                all.freeze()
            }
        };
        match self.reservation.take() {
            None => bytes,
            Some(reservation) => Bytes::from_owner(Budgeted { bytes, _reservation: reservation }),
        }
    }
}

/// Bytes and their share of the budget.
struct Budgeted {
    bytes: Bytes,
    _reservation: Reservation,
}

impl AsRef<[u8]> for Budgeted {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
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
    fn a_collected_body_holds_its_share_until_its_last_copy_goes() {
        let b = Arc::new(Budget::default());
        let mut c = Collect::growing();
        assert!(c.push(Bytes::from_static(b"hello "), 11, &b, 100).is_ok());
        assert!(c.push(Bytes::from_static(b"world"), 11, &b, 100).is_ok());
        assert_eq!(
            c.push(Bytes::from_static(b"!"), 11, &b, 100),
            Err(Bytes::from_static(b"!")),
            "past the size"
        );
        assert_eq!(b.used(), 11);
        let body = c.finish(None);
        assert_eq!(&body[..], b"hello world");
        let copy = body.clone();
        drop(body);
        assert_eq!(b.used(), 11, "a copy still holds it");
        drop(copy);
        assert_eq!(b.used(), 0);
        let mut exact = Collect::exact(&b, 5, 100).expect("room");
        assert_eq!(b.used(), 5, "reserved whole at once");
        assert!(exact.push(Bytes::from_static(b"abcde"), 0, &b, 100).is_ok());
        assert!(Collect::exact(&b, 96, 100).is_none(), "the budget is spent");
        assert_eq!(&exact.finish(Some(Bytes::from_static(b"f")))[..], b"abcdef");
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
