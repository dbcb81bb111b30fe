//! Client groups whose HTTP/2 connections keep ending for stream resets
//! (h2's GOAWAY `ENHANCE_YOUR_CALM`, or the flood meter's cut for
//! `RST_STREAM`): rapid reset from a client that reconnects after each
//! GOAWAY costs a handshake, a connection and a GOAWAY each time, so with
//! `http.h2.resetRefusalMs` set, a group that has had [`THRESHOLD`] such
//! connections within [`WINDOW`] is refused at accept that long: its new
//! connections are closed with a RST before any TLS handshake, preface or
//! request is read. Off by default: every client of a group pays for one
//! (clients behind one NAT, or a local proxy in front of limiter, are one
//! group), as with the per-source caps, which are opt-in too.
//!
//! Groups are the per-source caps' (`kernel.sourcePrefixV4`/`V6`, default
//! one address), whether or not the kernel gate runs; trusted prefixes
//! (`kernel.trusted`) are never refused. The table holds at most
//! [`MAX_GROUPS`] groups (a group that finds it full is not counted), so
//! its memory is bounded whatever the number of sources. An accept looks
//! at it only while some group is refused (one atomic load otherwise).

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{
        Mutex, RwLock,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use crate::config::{KernelConfig, Prefix};
use crate::proxy::log_lines::GroupLog;

/// Connections ended for resets, within [`WINDOW`], that get a group
/// refused.
pub const THRESHOLD: u32 = 10;
/// The window those connections are counted in.
pub const WINDOW: Duration = Duration::from_secs(10);
/// Groups the table holds at most.
pub const MAX_GROUPS: usize = 4096;

#[derive(Clone, Copy, Debug)]
struct Entry {
    /// When the current window of this group started.
    since: Instant,
    /// Connections ended for resets in it.
    count: u32,
    /// Refused at accept until then.
    refused_until: Option<Instant>,
}

#[derive(Debug, Default)]
pub struct ResetGroups {
    /// How sources are grouped and which are trusted (`kernel.*`).
    rules: RwLock<KernelConfig>,
    /// How long a group is refused (`http.h2.resetRefusalMs`); `None`: never.
    refuse_for: Option<Duration>,
    table: Mutex<HashMap<Prefix, Entry>>,
    /// Groups refused now (an accept looks at the table only while > 0).
    refused_now: AtomicUsize,
    /// Connections closed at accept because their group was refused.
    pub refused_connections: AtomicU64,
    /// Times a group started being refused.
    pub groups_refused: AtomicU64,
    log: GroupLog,
}

impl ResetGroups {
    pub fn new(kernel: &KernelConfig, refuse_for: Duration) -> Self {
        Self {
            rules: RwLock::new(kernel.clone()),
            refuse_for: (!refuse_for.is_zero()).then_some(refuse_for),
            ..Self::default()
        }
    }

    /// Applies a reload's `kernel.trusted` (the prefix lengths need a
    /// restart, so the groups counted so far keep their meaning).
    pub fn reload(&self, kernel: &KernelConfig) {
        *self.rules.write().unwrap_or_else(std::sync::PoisonError::into_inner) = kernel.clone();
    }

    /// Groups refused now.
    pub fn refused_now(&self) -> usize {
        self.refused_now.load(Ordering::Relaxed)
    }

    /// One HTTP/2 connection from `client` ended for its resets.
    pub fn note(&self, client: IpAddr) {
        self.note_at(client, Instant::now());
    }

    /// Whether a connection just accepted from `client` is refused (and
    /// counted so).
    pub fn refuses(&self, client: IpAddr) -> bool {
        if self.refused_now() == 0 {
            return false;
        }
        let refused = self.refuses_at(client, Instant::now());
        if refused {
            self.refused_connections.fetch_add(1, Ordering::Relaxed);
        }
        refused
    }

    /// The client group of `client` (`None`: trusted), by the rules in
    /// force.
    pub fn group(&self, client: IpAddr) -> Option<Prefix> {
        let rules = self.rules.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        (!rules.is_trusted(client)).then(|| rules.group_of(client))
    }

    fn note_at(&self, client: IpAddr, now: Instant) {
        let Some(refuse_for) = self.refuse_for else { return };
        let Some(group) = self.group(client) else { return };
        let mut table = self.table.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if table.len() >= MAX_GROUPS && !table.contains_key(&group) {
            self.expire(&mut table, now);
            // Counting windows that are over mean nothing any more.
            table.retain(|_, e| e.refused_until.is_some() || now.duration_since(e.since) < WINDOW);
            if table.len() >= MAX_GROUPS {
                return;
            }
        }
        let entry = table.entry(group).or_insert(Entry { since: now, count: 0, refused_until: None });
        if entry.refused_until.is_some() {
            // Already refused: a connection accepted before the refusal.
            return;
        }
        if now.duration_since(entry.since) >= WINDOW {
            *entry = Entry { since: now, count: 0, refused_until: None };
        }
        entry.count += 1;
        if entry.count >= THRESHOLD {
            entry.refused_until = Some(now + refuse_for);
            self.refused_now.fetch_add(1, Ordering::Relaxed);
            self.groups_refused.fetch_add(1, Ordering::Relaxed);
            self.log.note(group, entry.count, refuse_for.as_secs());
        }
    }

    fn refuses_at(&self, client: IpAddr, now: Instant) -> bool {
        let Some(group) = self.group(client) else { return false };
        let mut table = self.table.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        self.expire(&mut table, now);
        table.get(&group).is_some_and(|e| e.refused_until.is_some())
    }

    /// Ends the refusals whose time is up.
    fn expire(&self, table: &mut HashMap<Prefix, Entry>, now: Instant) {
        if self.refused_now() == 0 {
            return;
        }
        table.retain(|_, e| match e.refused_until {
            Some(until) if until <= now => {
                self.refused_now.fetch_sub(1, Ordering::Relaxed);
                false
            }
            _ => true,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REFUSE_FOR: Duration = Duration::from_secs(30);

    fn groups(extra: &str) -> ResetGroups {
        let file = format!("kernel.sourcePrefixV4 = 24\n{extra}");
        let config = crate::config::Config::parse(&file, "t.ini").unwrap();
        ResetGroups::new(&config.kernel, REFUSE_FOR)
    }

    #[test]
    fn off_by_default_nothing_is_counted_or_refused() {
        let config = crate::config::Config::parse("", "t.ini").unwrap();
        let g = ResetGroups::new(&config.kernel, Duration::from_millis(config.http.h2_reset_refusal_ms));
        let t = Instant::now();
        for _ in 0..3 * THRESHOLD {
            g.note_at(ip("192.0.2.1"), t);
        }
        assert_eq!(g.refused_now(), 0);
        assert!(g.table.lock().unwrap().is_empty());
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_group_is_refused_after_the_threshold_within_the_window_and_for_a_while() {
        let g = groups("");
        let t = Instant::now();
        for i in 0..THRESHOLD - 1 {
            g.note_at(ip(&format!("192.0.2.{i}")), t);
        }
        assert!(!g.refuses_at(ip("192.0.2.200"), t), "one short of the threshold");
        assert_eq!(g.refused_now(), 0);
        // The tenth, from another address of the same /24.
        g.note_at(ip("192.0.2.99"), t + Duration::from_secs(1));
        assert_eq!(g.refused_now(), 1);
        assert!(g.refuses_at(ip("192.0.2.7"), t + Duration::from_secs(2)), "the whole group");
        assert!(!g.refuses_at(ip("192.0.3.7"), t + Duration::from_secs(2)), "not the next group");
        assert!(
            g.refuses_at(ip("::ffff:192.0.2.7"), t + Duration::from_secs(2)),
            "IPv4-mapped counts as IPv4"
        );
        let after = t + Duration::from_secs(1) + REFUSE_FOR;
        assert!(!g.refuses_at(ip("192.0.2.7"), after), "the refusal ends");
        assert_eq!(g.refused_now(), 0);
    }

    #[test]
    fn connections_spread_wider_than_the_window_are_not_a_flood() {
        let g = groups("");
        let t = Instant::now();
        for i in 0..3 * THRESHOLD {
            g.note_at(ip("198.51.100.1"), t + WINDOW / 2 * i);
        }
        assert_eq!(g.refused_now(), 0);
    }

    #[test]
    fn trusted_prefixes_are_never_refused() {
        let g = groups("kernel.trusted = 192.0.2.0/24\n");
        let t = Instant::now();
        for _ in 0..2 * THRESHOLD {
            g.note_at(ip("192.0.2.1"), t);
        }
        assert_eq!(g.refused_now(), 0);
        assert!(!g.refuses_at(ip("192.0.2.1"), t));
    }

    #[test]
    fn the_table_is_bounded_whatever_the_sources() {
        let g = groups("kernel.sourcePrefixV6 = 128\n");
        let t = Instant::now();
        for i in 0..(2 * MAX_GROUPS) as u128 {
            g.note_at(IpAddr::V6((0x2001_0db8_u128 << 96 | i).into()), t);
        }
        assert_eq!(g.table.lock().unwrap().len(), MAX_GROUPS);
        // Once their windows are over, new groups find room again.
        g.note_at(ip("2001:db8:ffff::1"), t + WINDOW);
        assert_eq!(g.table.lock().unwrap().len(), 1);
    }
}
