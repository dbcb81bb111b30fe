//! The breaker's side of one admitted request.

use std::sync::Arc;

use super::{Breaker, Clock, MonotonicClock, TicketKind};

/// Carried by a request the breaker admitted, from admission to the
/// upstream's answer. [`Ticket::record`] reports the result; dropped
/// without one (client gone, refused by the pools after the breaker let it
/// through), it records nothing and frees a half-open probe slot.
pub struct Ticket<C: Clock = MonotonicClock> {
    breaker: Arc<Breaker<C>>,
    kind: Option<TicketKind>,
}

impl<C: Clock> Ticket<C> {
    pub fn new(breaker: Arc<Breaker<C>>, kind: TicketKind) -> Self {
        Self { breaker, kind: Some(kind) }
    }

    /// Reports the request's result.
    pub fn record(mut self, success: bool) {
        if let Some(kind) = self.kind.take() {
            self.breaker.record(kind, success);
        }
    }
}

impl<C: Clock> Drop for Ticket<C> {
    fn drop(&mut self) {
        if let Some(kind) = self.kind.take() {
            self.breaker.abandon(kind);
        }
    }
}
