//! The admin listener's connection slots. A listener serves at most
//! [`super::MAX_CONNECTIONS`] connections; when they are all taken, a new
//! connection does not wait or get closed: it takes the slot of the oldest
//! connection that has no request in progress, which is closed. So any
//! local process can open connections, but cannot hold the listener: a
//! probe that connects and sends its request at once is served however
//! many idle connections others keep open.

use std::{
    collections::VecDeque,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
};

use tokio::sync::Notify;

/// One connection's slot: whether a request is in progress, and the
/// signal that closes it.
#[derive(Default)]
pub struct Slot {
    id: u64,
    busy: AtomicBool,
    evicted: Notify,
}

impl Slot {
    /// Marks a request in progress until the guard drops.
    pub fn busy(self: &Arc<Self>) -> Busy {
        self.busy.store(true, Ordering::Release);
        Busy(self.clone())
    }

    /// Resolves when another connection took this one's slot.
    pub async fn evicted(&self) {
        self.evicted.notified().await;
    }
}

/// A request in progress on a connection (see [`Slot::busy`]).
pub struct Busy(Arc<Slot>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.store(false, Ordering::Release);
    }
}

/// The slots of one listener.
pub struct Slots {
    open: Mutex<VecDeque<Arc<Slot>>>,
    next: AtomicU64,
    max: usize,
}

/// What [`Slots::take`] did.
pub enum Taken {
    /// A slot, free or taken from an idle connection (which was signalled).
    Slot(Arc<Slot>, Option<u64>),
    /// Every connection has a request in progress: the new one is closed.
    Full,
}

impl Slots {
    pub fn new(max: usize) -> Self {
        Self { open: Mutex::new(VecDeque::with_capacity(max)), next: AtomicU64::new(0), max }
    }

    /// A slot for a new connection; `Some(id)` in the answer names the
    /// connection evicted for it.
    pub fn take(&self) -> Taken {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let mut evicted = None;
        if open.len() >= self.max {
            match open.iter().position(|s| !s.busy.load(Ordering::Acquire)) {
                Some(oldest_idle) => {
                    let slot = open.remove(oldest_idle).expect("a position within the queue");
                    // `notify_one` stores the signal if the connection is
                    // not waiting on it yet.
                    slot.evicted.notify_one();
                    evicted = Some(slot.id);
                }
                None => return Taken::Full,
            }
        }
        let slot = Arc::new(Slot { id: self.next.fetch_add(1, Ordering::Relaxed), ..Slot::default() });
        open.push_back(slot.clone());
        Taken::Slot(slot, evicted)
    }

    /// Gives back the slot of a connection that ended on its own.
    pub fn release(&self, slot: &Arc<Slot>) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(at) = open.iter().position(|s| Arc::ptr_eq(s, slot)) {
            open.remove(at);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.open.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(t: Taken) -> (Arc<Slot>, Option<u64>) {
        match t {
            Taken::Slot(s, e) => (s, e),
            Taken::Full => panic!("no slot"),
        }
    }

    #[test]
    fn a_full_listener_evicts_its_oldest_idle_connection() {
        let slots = Slots::new(3);
        let (a, _) = slot(slots.take());
        let (b, _) = slot(slots.take());
        let (c, _) = slot(slots.take());
        let _busy = a.busy();
        // a has a request in progress: b, the oldest idle one, goes.
        let (d, evicted) = slot(slots.take());
        assert_eq!(evicted, Some(b.id));
        assert_eq!(slots.len(), 3);
        let (_e, evicted) = slot(slots.take());
        assert_eq!(evicted, Some(c.id));
        let _busy_d = d.busy();
        let (_f, evicted) = slot(slots.take());
        assert!(evicted.is_some());
        // A connection that ends gives its slot back.
        slots.release(&d);
        assert_eq!(slots.len(), 2);
    }

    #[test]
    fn a_listener_whose_connections_all_have_requests_closes_the_new_one() {
        let slots = Slots::new(2);
        let (a, _) = slot(slots.take());
        let (b, _) = slot(slots.take());
        let (_x, _y) = (a.busy(), b.busy());
        assert!(matches!(slots.take(), Taken::Full));
    }

    #[tokio::test]
    async fn an_evicted_connection_is_told_even_before_it_waits() {
        let slots = Slots::new(1);
        let (a, _) = slot(slots.take());
        let _ = slot(slots.take());
        tokio::time::timeout(std::time::Duration::from_secs(1), a.evicted()).await.expect("told");
    }
}
