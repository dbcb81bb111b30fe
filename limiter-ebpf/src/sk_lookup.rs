//! Refusal: `sk_lookup` runs when the kernel looks for a listening socket
//! for a new connection attempt (a SYN, or a SYN-cookie ACK), never for
//! packets of established connections. Returning `SK_DROP` for TCP makes
//! the kernel answer with a RST, so the client's `connect()` fails with
//! ECONNREFUSED at once and the accept queue never sees the attempt.
//!
//! Minimum kernel: 5.9.

use aya_ebpf::bindings::BPF_NOEXIST;
use aya_ebpf::{
    bindings::sk_action::{SK_DROP, SK_PASS},
    macros::sk_lookup,
    programs::SkLookupContext,
};
use limiter_common::{LIMIT_FLAG_DRY_RUN, PortKey, Refusals};

use crate::maps::{LIMITER_LIMITS, LIMITER_REFUSED, LIMITER_STATS};

const IPPROTO_TCP: u32 = 6;

#[sk_lookup]
pub fn limiter_refuse(ctx: SkLookupContext) -> u32 {
    // SAFETY: reading fields of the context the kernel passed.
    let (protocol, local_port) = unsafe { ((*ctx.lookup).protocol, (*ctx.lookup).local_port) };
    if protocol != IPPROTO_TCP {
        return SK_PASS;
    }
    // local_port is host order in sk_lookup (DESIGN.md).
    let port = local_port & 0xffff;
    let Some(limit) = LIMITER_LIMITS.get(port) else {
        return SK_PASS;
    };
    if limit.max_established == 0 {
        // Not enforced: the common case for most ports, one array load.
        return SK_PASS;
    }
    let Some(stats) = LIMITER_STATS.get_ptr(port) else {
        return SK_PASS;
    };
    // Written by sock_ops on other CPUs with atomic adds; an aligned 8-byte
    // load cannot tear.
    // SAFETY: array values live as long as the map.
    let established = unsafe { core::ptr::addr_of!((*stats).established).read_volatile() };
    if established < u64::from(limit.max_established) {
        return SK_PASS;
    }
    let key = PortKey::new(port as u16);
    let dry_run = limit.flags & LIMIT_FLAG_DRY_RUN != 0;
    if let Some(refusals) = refusals_for(key) {
        // This CPU's own counter: a plain add, no other CPU writes it and
        // the program cannot migrate while it runs.
        // SAFETY: a live per-CPU map value.
        unsafe {
            if dry_run {
                (*refusals).would_refuse += 1;
            } else {
                (*refusals).refused += 1;
            }
        }
    }
    if dry_run { SK_PASS } else { SK_DROP }
}

fn refusals_for(key: PortKey) -> Option<*mut Refusals> {
    if let Some(r) = LIMITER_REFUSED.get_ptr_mut(key) {
        return Some(r);
    }
    // First refusal on this port (another CPU may insert at the same time).
    let _ = LIMITER_REFUSED.insert(key, Refusals::default(), BPF_NOEXIST.into());
    LIMITER_REFUSED.get_ptr_mut(key)
}
