//! The admission decision for a connection attempt, shared by the refusal
//! paths (`sk_lookup`, XDP) so both enforce the same limits and count into
//! the same counters.
//!
//! Order: the port cap, then the client group's cap (and, for a group the
//! source table has no slot for, the full-table policy: refuse). A trusted
//! client passes a full port while the port is under its limit plus
//! `trusted_reserve`, and passes per-source caps. Dry-run ports count what
//! they would refuse and refuse nothing.
//!
//! Then the coupled shedding ([`ShedPort`]): while the daemon has raised a
//! port's flag and its deadline has not passed, a new connection the
//! limits admit is shed (reason `shed`), except one in `probe_one_in`
//! (by a keyed hash of the client's address and port, so the XDP and
//! `sk_lookup` programs pick the same probes) and any from a trusted
//! prefix. A dry-run flag counts what it would shed.

use aya_ebpf::{bindings::BPF_NOEXIST, btf_maps::lpm_trie::Key, helpers::generated::bpf_ktime_get_boot_ns};
use limiter_common::{
    LIMIT_FLAG_DRY_RUN, Port, PortKey, Refusals, SHED_FLAG_DRY_RUN, ShedCounts, SourceKey, reason, source,
};

use crate::{
    maps::{
        LIMITER_CONFIG, LIMITER_LIMITS, LIMITER_REFUSED, LIMITER_SHED, LIMITER_SHEDCNT, LIMITER_STATS,
        LIMITER_TRUSTED,
    },
    sources,
};

/// The client of a connection attempt; addresses as they lie in the packet
/// or socket (network byte order in memory).
#[derive(Clone, Copy)]
pub enum Client {
    V4(u32),
    V6([u32; 4]),
}

impl Client {
    #[inline(always)]
    fn group(&self, port: Port, prefix_v4: u32, prefix_v6: u32) -> SourceKey {
        match *self {
            Self::V4(a) => source::key_v4(a, port, prefix_v4),
            Self::V6(a) => source::key_v6(a, port, prefix_v4, prefix_v6),
        }
    }

    /// The attempt's keyed hash: the client's whole address and its port
    /// (`sport`, host order).
    #[inline(always)]
    fn attempt_hash(&self, sport: u16, seed: u32) -> u32 {
        let key = match *self {
            Self::V4(a) => source::key_v4(a, Port::from_host(u32::from(sport)), 32),
            Self::V6(a) => source::key_v6(a, Port::from_host(u32::from(sport)), 32, 128),
        };
        source::hash(&key, seed)
    }

    #[inline(always)]
    fn trusted(&self) -> bool {
        let data: [u8; 16] = match *self {
            Self::V4(a) => {
                let b = a.to_ne_bytes();
                [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, b[0], b[1], b[2], b[3]]
            }
            Self::V6(w) => {
                let (a, b, c, d) =
                    (w[0].to_ne_bytes(), w[1].to_ne_bytes(), w[2].to_ne_bytes(), w[3].to_ne_bytes());
                [
                    a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3], c[0], c[1], c[2], c[3], d[0], d[1], d[2],
                    d[3],
                ]
            }
        };
        LIMITER_TRUSTED.get(&Key::new(128, data)).is_some()
    }
}

const NONE: usize = usize::MAX;

/// Decides an attempt to open a connection to local `port` from `client`
/// (its port `sport`, host order). Returns the refusal reason to refuse.
/// On `sk_lookup` the refusal (or would-be refusal, trusted admission,
/// probe) is counted here; XDP counts its refusal with [`count_refusal`]
/// once the RST is on its way.
#[inline(always)]
pub fn refuse(port: Port, client: &Client, sport: u16, path: usize) -> Option<usize> {
    if let Some(why) = by_limits(port, client, path) {
        return Some(why);
    }
    shed(port, client, sport, path)
}

/// The coupled shedding's decision, for an attempt the limits admit.
#[inline(always)]
fn shed(port: Port, client: &Client, sport: u16, path: usize) -> Option<usize> {
    let shed = LIMITER_SHED.get(port.index())?;
    if shed.until_boot_ns == 0 {
        // Not shedding: the common case, one array load.
        return None;
    }
    // SAFETY: a helper without arguments.
    if unsafe { bpf_ktime_get_boot_ns() } >= shed.until_boot_ns {
        // The daemon stopped renewing: the port is open again.
        return None;
    }
    let config = LIMITER_CONFIG.get(0)?;
    // Only sk_lookup counts what it lets through: XDP passes it on to
    // sk_lookup, which decides the same way and counts it once.
    let counted = path != limiter_common::path::XDP;
    let key = PortKey::new(port.get());
    if shed.probe_one_in != 0 && client.attempt_hash(sport, config.hash_seed) % shed.probe_one_in == 0 {
        if counted && let Some(c) = shed_counts_for(key) {
            // SAFETY: this CPU's own per-CPU value.
            unsafe { (*c).probes += 1 };
        }
        return None;
    }
    if config.trusted_count != 0 && client.trusted() {
        if counted && let Some(c) = shed_counts_for(key) {
            // SAFETY: as above.
            unsafe { (*c).trusted_admitted += 1 };
        }
        return None;
    }
    if shed.flags & SHED_FLAG_DRY_RUN != 0 {
        if counted && let Some(c) = shed_counts_for(key) {
            // SAFETY: as above.
            unsafe { (*c).would_refuse += 1 };
        }
        return None;
    }
    if counted {
        count_refusal(port, path, reason::SHED);
    }
    Some(reason::SHED)
}

/// The limits' decision (port cap, per-source cap, trusted, dry-run).
#[inline(always)]
fn by_limits(port: Port, client: &Client, path: usize) -> Option<usize> {
    let limit = LIMITER_LIMITS.get(port.index())?;
    if !limit.enforced() {
        // Not enforced: the common case for most ports, one array load.
        return None;
    }
    let (Some(stats), Some(config)) = (LIMITER_STATS.get_ptr(port.index()), LIMITER_CONFIG.get(0)) else {
        return None;
    };
    // Written by other CPUs with atomic adds; an aligned 8-byte load cannot
    // tear.
    // SAFETY: array values live as long as the map.
    let established = unsafe { core::ptr::addr_of!((*stats).established).read_volatile() };
    let max = u64::from(limit.max_established);
    let mut why = NONE;
    if max != 0 && established >= max {
        why = reason::PORT;
    } else if limit.per_source_max != 0 {
        let group = client.group(port, config.prefix_v4, config.prefix_v6);
        let usage = sources::usage(&group, config.hash_seed, config.source_mask);
        if usage.count >= limit.per_source_max {
            why = reason::SOURCE;
        } else if usage.count == 0 && !usage.room {
            why = reason::TABLE;
        }
    }
    if why == NONE {
        return None;
    }
    let key = PortKey::new(port.get());
    let dry_run = limit.flags & LIMIT_FLAG_DRY_RUN != 0;
    // What XDP lets through meets sk_lookup in the stack, which decides
    // again: only refusals are counted at XDP, so a dry-run or trusted
    // attempt is counted once.
    if path == limiter_common::path::XDP && dry_run {
        return None;
    }
    if config.trusted_count != 0
        && (why != reason::PORT || established < max + u64::from(config.trusted_reserve))
        && client.trusted()
    {
        if path == limiter_common::path::XDP {
            return None;
        }
        if let Some(r) = refusals_for(key) {
            // SAFETY: this CPU's own per-CPU value; nothing else writes it.
            unsafe { (*r).trusted_admitted += 1 };
        }
        return None;
    }
    if dry_run {
        if let Some(r) = refusals_for(key) {
            // SAFETY: as below.
            unsafe {
                if let Some(c) = (*r).would_refuse.get_mut(why) {
                    *c += 1;
                }
            }
        }
        return None;
    }
    if path != limiter_common::path::XDP {
        count_refusal(port, path, why);
    }
    Some(why)
}

/// Counts one refusal of `port` for reason `why` on `path`.
#[inline(always)]
pub fn count_refusal(port: Port, path: usize, why: usize) {
    if why == reason::SHED {
        if let Some(c) = shed_counts_for(PortKey::new(port.get())) {
            // SAFETY: this CPU's own per-CPU value; the index is checked.
            unsafe {
                if let Some(n) = (*c).refused.get_mut(path) {
                    *n += 1;
                }
            }
        }
        return;
    }
    if let Some(r) = refusals_for(PortKey::new(port.get())) {
        // This CPU's own counter: a plain add, no other CPU writes it and
        // the program cannot migrate while it runs.
        // SAFETY: a live per-CPU map value; the index is checked.
        unsafe {
            if let Some(c) = (*r).refused.get_mut(path * reason::COUNT + why) {
                *c += 1;
            }
        }
    }
}

fn refusals_for(key: PortKey) -> Option<*mut Refusals> {
    if let Some(r) = LIMITER_REFUSED.get_ptr_mut(key) {
        return Some(r);
    }
    // First refusal on this port (another CPU may insert at the same time).
    let _ = LIMITER_REFUSED.insert(key, Refusals::default(), BPF_NOEXIST.into());
    LIMITER_REFUSED.get_ptr_mut(key)
}

fn shed_counts_for(key: PortKey) -> Option<*mut ShedCounts> {
    if let Some(c) = LIMITER_SHEDCNT.get_ptr_mut(key) {
        return Some(c);
    }
    let _ = LIMITER_SHEDCNT.insert(key, ShedCounts::default(), BPF_NOEXIST.into());
    LIMITER_SHEDCNT.get_ptr_mut(key)
}
