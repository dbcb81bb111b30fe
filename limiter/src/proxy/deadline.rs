//! One timer for the successive deadlines of one connection: the head
//! of each request a client sends (`http.headerReadTimeoutMs`), the answer
//! to each request sent on an upstream connection (`http.upstreamTimeoutMs`).
//!
//! A fresh `tokio::time::timeout` per request inserts a timer into the
//! worker's timer wheel and removes it again, and when its deadline is
//! earlier than every timer in the wheel (a 10 s head timeout while every
//! other connection waits on its upstream with 30 s) the runtime writes to
//! its own eventfd to recompute how long it may sleep: a system call, and
//! a turn of the event loop, for about a quarter of all requests under
//! keep-alive load. A [`Deadline`] keeps its timer for the connection's
//! life and moves it later in place (tokio only records the new time; the
//! wheel re-files the timer when its old slot comes round), and it is not
//! armed at all while what it guards finishes at once.
//!
//! The same happens to the first head of a new connection while the wheel
//! holds only answers' timers, 30 s out. So a deadline may be armed
//! earlier than it falls (`arm_within`: an upstream answer's timer no
//! later than a head's timeout ahead); firing early, it is armed again
//! for what is left. A client's first head then never has the earliest
//! timer in the wheel, and an answer slower than that costs one more
//! firing per `arm_within`.

use std::{
    future::{Future, poll_fn},
    pin::{Pin, pin},
    task::Poll,
    time::Duration,
};

use tokio::time::{Instant, Sleep, sleep_until};

/// A connection's timer (created on the first wait that has to wait).
#[derive(Default)]
pub struct Deadline {
    sleep: Option<Pin<Box<Sleep>>>,
}

/// `until` passed before what was guarded finished.
#[derive(Debug, PartialEq, Eq)]
pub struct Elapsed;

impl Deadline {
    /// `work`'s output, or [`Elapsed`] once `until` has passed without it.
    /// `work` is polled first, so a deadline is armed only when it waits.
    pub async fn within<F: Future>(&mut self, until: Instant, work: F) -> Result<F::Output, Elapsed> {
        self.within_armed(until, None, work).await
    }

    /// [`Deadline::within`], its timer armed no later than `arm_within`
    /// ahead (see the module's doc).
    pub async fn within_armed<F: Future>(
        &mut self,
        until: Instant,
        arm_within: Option<Duration>,
        work: F,
    ) -> Result<F::Output, Elapsed> {
        let mut work = pin!(work);
        poll_fn(|cx| {
            if let Poll::Ready(out) = work.as_mut().poll(cx) {
                return Poll::Ready(Ok(out));
            }
            loop {
                // The clock is read only to arm early.
                let at = match arm_within {
                    None => until,
                    Some(ahead) => {
                        let now = Instant::now();
                        if now >= until {
                            return Poll::Ready(Err(Elapsed));
                        }
                        until.min(now + ahead)
                    }
                };
                let sleep = match &mut self.sleep {
                    Some(sleep) => {
                        if sleep.deadline() != at {
                            // Later: recorded in place. Earlier, or after
                            // the timer fired: filed again.
                            sleep.as_mut().reset(at);
                        }
                        sleep
                    }
                    None => self.sleep.insert(Box::pin(sleep_until(at))),
                };
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                if at == until {
                    return Poll::Ready(Err(Elapsed));
                }
                // Fired early: armed again above for what is left.
            }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn work_that_finishes_at_once_arms_nothing() {
        let mut d = Deadline::default();
        let out = d.within(Instant::now() + Duration::from_secs(1), async { 7 }).await;
        assert_eq!(out, Ok(7));
        assert!(d.sleep.is_none(), "no timer for work that did not wait");
    }

    #[tokio::test(start_paused = true)]
    async fn each_deadline_holds_whether_later_or_earlier_than_the_last() {
        let mut d = Deadline::default();
        let start = Instant::now();
        // Waits past its deadline: Elapsed, at the deadline.
        let out = d.within(start + Duration::from_secs(10), std::future::pending::<()>()).await;
        assert_eq!(out, Err(Elapsed));
        assert_eq!(Instant::now(), start + Duration::from_secs(10));
        // Work that ends before a later deadline: its output.
        let now = Instant::now();
        let out = d.within(now + Duration::from_secs(30), tokio::time::sleep(Duration::from_secs(5))).await;
        assert_eq!(out, Ok(()));
        assert_eq!(Instant::now(), now + Duration::from_secs(5));
        // A later deadline after an earlier armed one (moved in place),
        // then an earlier one than armed: each fires at its own time.
        let now = Instant::now();
        let out = d.within(now + Duration::from_secs(60), std::future::pending::<()>()).await;
        assert_eq!(out, Err(Elapsed));
        assert_eq!(Instant::now(), now + Duration::from_secs(60));
        let now = Instant::now();
        let _ = d.within(now + Duration::from_secs(30), tokio::time::sleep(Duration::from_secs(1))).await;
        let out = d.within(now + Duration::from_secs(3), std::future::pending::<()>()).await;
        assert_eq!(out, Err(Elapsed));
        assert_eq!(Instant::now(), now + Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn armed_early_it_still_ends_at_the_deadline_and_not_before() {
        let mut d = Deadline::default();
        let now = Instant::now();
        let ahead = Some(Duration::from_secs(10));
        let out = d.within_armed(now + Duration::from_secs(30), ahead, std::future::pending::<()>()).await;
        assert_eq!(out, Err(Elapsed));
        assert_eq!(Instant::now(), now + Duration::from_secs(30), "fired early twice, then at the deadline");
        let now = Instant::now();
        let slow = tokio::time::sleep(Duration::from_secs(25));
        let out = d.within_armed(now + Duration::from_secs(30), ahead, slow).await;
        assert_eq!(out, Ok(()), "work that ends after the early arming but before the deadline");
        assert_eq!(Instant::now(), now + Duration::from_secs(25));
    }
}
