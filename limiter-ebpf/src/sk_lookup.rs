//! Refusal in the stack: `sk_lookup` runs when the kernel looks for a
//! listening socket for a new connection attempt (a SYN, or a SYN-cookie
//! ACK), never for packets of established connections. Returning `SK_DROP`
//! for TCP makes the kernel answer with a RST, so the client's `connect()`
//! fails with ECONNREFUSED at once and the accept queue never sees the
//! attempt. It sees every attempt, loopback included; the XDP program
//! refuses earlier on the interfaces it is attached to.
//!
//! Minimum kernel: 5.9.

use core::ptr;

use aya_ebpf::{
    bindings::sk_action::{SK_DROP, SK_PASS},
    macros::sk_lookup,
    programs::SkLookupContext,
};
use limiter_common::{AF_INET, IPPROTO_TCP, Port, path};

use crate::gate::{self, Client};

#[sk_lookup]
pub fn limiter_refuse(ctx: SkLookupContext) -> u32 {
    // SAFETY: reading fields of the context the kernel passed.
    let (protocol, family, local_port) =
        unsafe { ((*ctx.lookup).protocol, (*ctx.lookup).family, (*ctx.lookup).local_port) };
    if protocol != u32::from(IPPROTO_TCP) {
        return SK_PASS;
    }
    // Each field read on its own at its constant offset (volatile): the
    // verifier refuses a load through a context pointer that was moved.
    // SAFETY: as above; remote addresses are network order in memory.
    let client = unsafe {
        let l = ctx.lookup;
        if family == u32::from(AF_INET) {
            Client::V4(ptr::addr_of!((*l).remote_ip4).read_volatile())
        } else {
            Client::V6([
                ptr::addr_of!((*l).remote_ip6[0]).read_volatile(),
                ptr::addr_of!((*l).remote_ip6[1]).read_volatile(),
                ptr::addr_of!((*l).remote_ip6[2]).read_volatile(),
                ptr::addr_of!((*l).remote_ip6[3]).read_volatile(),
            ])
        }
    };
    // SAFETY: as above; remote_port is a __be16.
    let sport = u16::from_be(unsafe { ptr::addr_of!((*ctx.lookup).remote_port).read_volatile() });
    // local_port is host order in sk_lookup (DESIGN.md).
    if gate::refuse(Port::from_host(local_port), &client, sport, path::SK_LOOKUP).is_some() {
        SK_DROP
    } else {
        SK_PASS
    }
}
