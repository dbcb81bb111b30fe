//! limiter's kernel programs, one file per hook:
//!
//! - [`sock_ops`]: counts established server-side TCP connections per local
//!   port and client group (attached to a cgroup v2; kernel ≥ 5.15 for
//!   `bpf_get_netns_cookie` in sock_ops);
//! - [`walk`]: counts, once at start-up, connections older than the gate
//!   (`iter/tcp`);
//! - [`sk_lookup`]: refuses a connection attempt the gate does not admit,
//!   so the kernel answers the SYN with a RST (attached to a network
//!   namespace; kernel ≥ 5.9);
//! - [`xdp`]: refuses the same attempts at the driver with a RST it builds
//!   itself (attached to the listed interfaces).
//!
//! The decision is [`gate`]; all share the maps in [`maps`]. No logging on these paths: every byte of
//! a program runs once per connection.
#![no_std]
#![no_main]
#![feature(core_intrinsics)]
#![expect(internal_features, reason = "the bpf target has no stable 64-bit atomics")]

mod atomic;
mod count;
mod gate;
mod maps;
mod sk_lookup;
mod sock_ops;
mod sources;
mod walk;
mod xdp;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // Unreachable by construction: the verifier rejects any program with a
    // reachable panic path.
    loop {}
}

/// GPL-compatible, as sk_storage helpers require.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
