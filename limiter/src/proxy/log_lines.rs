//! The proxy's rate-limited log lines, so that an attack (or a failing
//! upstream) cannot flood the disk and no event goes unaccounted: each line
//! says how many went unlogged since the line before it. Lock-free: every
//! worker thread refuses at once under overload.
//!
//! - [`RefusalLog`]: 503 refusals, at most [`LINES_PER_SECOND`] lines per
//!   second of the daemon's clock (so at most twice that across the
//!   boundary of two seconds);
//! - [`ResetLog`]: HTTP/2 connections ended for excessive stream resets
//!   (h2's GOAWAY `ENHANCE_YOUR_CALM`, or the flood meter's cut for
//!   `RST_STREAM`), at most [`RESET_LINES_PER_SECOND`] a second: h2's own
//!   line per such connection is filtered out ([`crate::daemon::logging`]);
//! - [`GroupLog`]: client groups refused at accept for those resets
//!   ([`super::reset_groups`]), at most [`RESET_LINES_PER_SECOND`] a second;
//! - [`ErrorLog`]: failures of the upstream's ([`super::error`]), at most
//!   [`LINES_PER_SECOND`] a second;
//! - [`AbandonLog`]: requests limiter gave up on while the upstream went
//!   on with them ([`super::upstream::abandon`]), at most
//!   [`LINES_PER_SECOND`] a second.

use std::{
    net::IpAddr,
    sync::atomic::{AtomicU32, AtomicU64, Ordering},
    time::Instant,
};

/// Refusal lines per second, at most.
pub const LINES_PER_SECOND: u32 = 10;
/// Lines per second, at most, for connections ended for resets.
pub const RESET_LINES_PER_SECOND: u32 = 1;

/// A budget of lines per second, and the events left out of them.
#[derive(Debug)]
struct Lines {
    per_second: u32,
    epoch: Instant,
    /// The second (since `epoch`) the current window started.
    window: AtomicU64,
    lines: AtomicU32,
    suppressed: AtomicU64,
}

impl Lines {
    fn new(per_second: u32) -> Self {
        Self {
            per_second,
            epoch: Instant::now(),
            window: AtomicU64::new(0),
            lines: AtomicU32::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// Records one event now: `Some(unlogged count)` when a line may be
    /// written for it.
    fn note(&self) -> Option<u64> {
        self.admit(self.epoch.elapsed().as_secs())
    }

    /// The rate limit itself, at second `now`.
    fn admit(&self, now: u64) -> Option<u64> {
        let window = self.window.load(Ordering::Relaxed);
        // Only forward: a thread still holding an older second must not
        // reopen a window that has been used up.
        if now > window
            && self.window.compare_exchange(window, now, Ordering::AcqRel, Ordering::Relaxed).is_ok()
        {
            self.lines.store(0, Ordering::Release);
        }
        if self.lines.fetch_add(1, Ordering::AcqRel) < self.per_second {
            Some(self.suppressed.swap(0, Ordering::AcqRel))
        } else {
            self.suppressed.fetch_add(1, Ordering::AcqRel);
            None
        }
    }

    /// The events left out since the last line, now accounted for.
    fn take_unlogged(&self) -> u64 {
        self.suppressed.swap(0, Ordering::AcqRel)
    }
}

#[derive(Debug)]
pub struct RefusalLog(Lines);

impl Default for RefusalLog {
    fn default() -> Self {
        Self(Lines::new(LINES_PER_SECOND))
    }
}

impl RefusalLog {
    /// Records one refusal; logs it if this second still has room.
    pub fn note(&self, reason: &'static str) {
        if let Some(suppressed) = self.0.note() {
            tracing::info!(reason, unlogged_since_last_line = suppressed, "refused with 503");
        }
    }

    /// Logs the refusals left out since the last line, if any (at shutdown,
    /// so the last burst is accounted for too).
    pub fn flush(&self) {
        let unlogged = self.0.take_unlogged();
        if unlogged > 0 {
            tracing::info!(unlogged_since_last_line = unlogged, "refused with 503 (not logged one by one)");
        }
    }
}

/// Why an HTTP/2 connection was ended for its resets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResetEnd {
    /// h2's GOAWAY `ENHANCE_YOUR_CALM`: too many streams reset before
    /// they were accepted, or too many the server had to reset.
    GoAway,
    /// The flood meter's cut: more `RST_STREAM` frames than its bucket.
    Meter,
}

impl ResetEnd {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::GoAway => "goaway",
            Self::Meter => "flood_meter",
        }
    }
}

#[derive(Debug)]
pub struct ResetLog(Lines);

impl Default for ResetLog {
    fn default() -> Self {
        Self(Lines::new(RESET_LINES_PER_SECOND))
    }
}

impl ResetLog {
    /// Records one connection ended for resets; logs it if this second
    /// still has room.
    pub fn note(&self, client: IpAddr, ended: ResetEnd) {
        if let Some(suppressed) = self.0.note() {
            tracing::warn!(
                %client,
                ended = ended.as_str(),
                unlogged_since_last_line = suppressed,
                "HTTP/2 connection ended for excessive stream resets"
            );
        }
    }

    /// Logs the connections left out since the last line, if any.
    pub fn flush(&self) {
        let unlogged = self.0.take_unlogged();
        if unlogged > 0 {
            tracing::warn!(
                unlogged_since_last_line = unlogged,
                "HTTP/2 connections ended for excessive stream resets (not logged one by one)"
            );
        }
    }
}

#[derive(Debug)]
pub struct GroupLog(Lines);

impl Default for GroupLog {
    fn default() -> Self {
        Self(Lines::new(RESET_LINES_PER_SECOND))
    }
}

impl GroupLog {
    /// Records one client group refused from now on; logs it if this
    /// second still has room.
    pub fn note(&self, group: crate::config::Prefix, connections: u32, refused_for_s: u64) {
        if let Some(suppressed) = self.0.note() {
            tracing::warn!(
                %group,
                connections,
                refused_for_s,
                unlogged_since_last_line = suppressed,
                "client group refused at accept: its HTTP/2 connections keep ending for stream resets"
            );
        }
    }
}

#[derive(Debug)]
pub struct ErrorLog(Lines);

impl Default for ErrorLog {
    fn default() -> Self {
        Self(Lines::new(LINES_PER_SECOND))
    }
}

impl ErrorLog {
    /// Records one failure of the upstream's; logs it, with its cause, if
    /// this second still has room.
    pub fn note(
        &self,
        error: &super::error::Error,
        peer: std::net::SocketAddr,
        id: &crate::request_id::RequestId,
    ) {
        if let Some(suppressed) = self.0.note() {
            tracing::warn!(
                kind = error.kind().as_str(),
                client = %peer,
                request_id = %id,
                unlogged_since_last_line = suppressed,
                "{error}"
            );
        }
    }
}

#[derive(Debug)]
pub struct AbandonLog(Lines);

impl Default for AbandonLog {
    fn default() -> Self {
        Self(Lines::new(LINES_PER_SECOND))
    }
}

impl AbandonLog {
    /// Records one exchange given up on, at its end; logs it if this
    /// second still has room (a warning when the bound ended it: the
    /// upstream may still be working).
    pub fn note(
        &self,
        id: &crate::request_id::RequestId,
        cause: &str,
        end: &str,
        went_on: std::time::Duration,
    ) {
        let Some(suppressed) = self.0.note() else { return };
        let went_on_ms = went_on.as_millis() as u64;
        if end == "bound" {
            tracing::warn!(
                request_id = %id,
                cause,
                end,
                went_on_ms,
                unlogged_since_last_line = suppressed,
                "the upstream was still working on a request limiter gave up on when http.upstreamAbandonMs passed: its connection is closed and its permit returned"
            );
        } else {
            tracing::info!(
                request_id = %id,
                cause,
                end,
                went_on_ms,
                unlogged_since_last_line = suppressed,
                "the upstream went on with a request limiter gave up on; its permit is returned now"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_ten_lines_a_second_and_every_refusal_accounted() {
        let log = Lines::new(LINES_PER_SECOND);
        let (mut lines, mut reported) = (0u64, 0u64);
        // 100,000 refusals spread over 5 seconds.
        for i in 0..100_000u64 {
            if let Some(unlogged) = log.admit(i / 20_000) {
                lines += 1;
                reported += unlogged;
            }
        }
        assert_eq!(lines, 5 * u64::from(LINES_PER_SECOND));
        // One more, a second later, carries what the last lines left out.
        reported += log.admit(6).unwrap();
        lines += 1;
        assert_eq!(lines + reported, 100_001);
    }

    #[test]
    fn one_reset_line_a_second_carries_the_connections_left_out() {
        let log = Lines::new(RESET_LINES_PER_SECOND);
        // 6,273 connections in 4 s (what h2 once logged line by line).
        let (mut lines, mut reported) = (0u64, 0u64);
        for i in 0..6_273u64 {
            if let Some(unlogged) = log.admit(i * 4 / 6_273) {
                lines += 1;
                reported += unlogged;
            }
        }
        assert_eq!(lines, 4);
        assert_eq!(lines + reported + log.take_unlogged(), 6_273);
    }
}
