//! Refusal: `sk_lookup` runs when the kernel looks for a listening socket
//! for a new connection attempt (a SYN, or a SYN-cookie ACK), never for
//! packets of established connections. Returning `SK_DROP` for TCP makes
//! the kernel answer with a RST, so the client's `connect()` fails with
//! ECONNREFUSED at once and the accept queue never sees the attempt.
//!
//! Minimum kernel: 5.9.

use core::ptr;

use aya_ebpf::{
    bindings::sk_action::{SK_DROP, SK_PASS},
    macros::sk_lookup,
    programs::SkLookupContext,
};
use limiter_common::{LIMIT_FLAG_DRY_RUN, PortKey};

use crate::{
    atomic,
    maps::{LIMITER_LIMITS, LIMITER_STATS},
};

const IPPROTO_TCP: u32 = 6;

#[sk_lookup]
pub fn limiter_refuse(ctx: SkLookupContext) -> u32 {
    // SAFETY: reading fields of the context the kernel passed.
    let (protocol, local_port) = unsafe { ((*ctx.lookup).protocol, (*ctx.lookup).local_port) };
    if protocol != IPPROTO_TCP {
        return SK_PASS;
    }
    // local_port is host order in sk_lookup (DESIGN.md).
    let key = PortKey::new(local_port as u16);
    let Some(limit) = LIMITER_LIMITS.get_ptr(key) else {
        return SK_PASS;
    };
    let Some(stats) = LIMITER_STATS.get_ptr_mut(key) else {
        // Nothing ever established on this port: it cannot be full
        // (a limit is at least 1).
        return SK_PASS;
    };
    // SAFETY: map values; stats entries are never removed while attached.
    unsafe {
        if (*stats).established < u64::from((*limit).max_established) {
            return SK_PASS;
        }
        if (*limit).flags & LIMIT_FLAG_DRY_RUN != 0 {
            atomic::add(ptr::addr_of_mut!((*stats).would_refuse), 1);
            return SK_PASS;
        }
        atomic::add(ptr::addr_of_mut!((*stats).refused), 1);
    }
    SK_DROP
}
