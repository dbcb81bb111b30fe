//! The start-up walk: an `iter/tcp` program the daemon runs once after
//! attaching, over every TCP socket of the gated network namespace (the
//! iterator's namespace is the one it is opened from). It counts the
//! server-side connections that were established before the gate attached
//! and so never passed through sock_ops; [`crate::close`] uncounts them
//! when they close.
//!
//! The iterator calls this program with the socket locked, so neither the
//! socket's handshake callback nor its close can run meanwhile: a socket is
//! either counted here or by sock_ops (the mark's compare-and-swap decides),
//! and a socket closing during the walk is either seen closed here or
//! counted before its close. The daemon reads the iterator twice: the first
//! pass also records which ports have a listener (a connection is
//! server-side when its local port has one), so the second pass counts the
//! connections the first pass met before their listener.
//!
//! Field offsets of `struct sock_common` come from the kernel's BTF through
//! [`LIMITER_OFFSETS`] (set by the daemon at load time), so no kernel headers
//! are compiled in.
//!
//! Minimum kernel: 5.19 (socket locked in the TCP iterator).

use core::{ffi::c_void, ptr};

use aya_ebpf::{
    bindings::BPF_SK_STORAGE_GET_F_CREATE,
    helpers::generated::{bpf_probe_read_kernel, bpf_sk_storage_get, bpf_skc_to_tcp_sock},
};
use limiter_common::{SockMark, SockOffsets, source};

use crate::{
    count,
    maps::{LIMITER_CONFIG, LIMITER_SOCKS, LIMITER_WALK},
};

/// Set by the daemon at load time (`EbpfLoader::set_global`).
#[unsafe(no_mangle)]
static LIMITER_OFFSETS: SockOffsets =
    SockOffsets { daddr: 0, v6_daddr: 0, num: 0, family: 0, state: 0, _pad: 0 };

/// `struct bpf_iter__tcp`.
#[repr(C)]
pub struct IterTcp {
    meta: *mut c_void,
    sk_common: *mut c_void,
    uid: u32,
}

const AF_INET: u16 = 2;
const TCP_ESTABLISHED: u8 = 1;
const TCP_FIN_WAIT1: u8 = 4;
const TCP_FIN_WAIT2: u8 = 5;
const TCP_CLOSE_WAIT: u8 = 8;
const TCP_LAST_ACK: u8 = 9;
const TCP_LISTEN: u8 = 10;
const TCP_CLOSING: u8 = 11;

fn read<T: Default>(base: *const u8, offset: u32) -> T {
    let mut out = T::default();
    // SAFETY: probe-read copies into our stack value; a bad address fails
    // the helper and leaves the default.
    unsafe {
        bpf_probe_read_kernel(
            ptr::from_mut(&mut out).cast(),
            size_of::<T>() as u32,
            base.wrapping_add(offset as usize).cast(),
        );
    }
    out
}

#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/tcp")]
pub extern "C" fn limiter_walk(ctx: *mut IterTcp) -> i32 {
    // SAFETY: the context the kernel passed.
    let skc = unsafe { (*ctx).sk_common };
    if skc.is_null() {
        return 0;
    }
    // SAFETY: a static of this object; volatile so the value the daemon set
    // is read, not the zero it was compiled with.
    let off = unsafe { ptr::addr_of!(LIMITER_OFFSETS).read_volatile() };
    let base = skc.cast::<u8>().cast_const();
    let state: u8 = read(base, off.state);
    let port: u16 = read(base, off.num);
    if state == TCP_LISTEN {
        if let Some(seen) = LIMITER_WALK.get_ptr_mut(u32::from(port)) {
            // SAFETY: array value.
            unsafe { *seen = 1 };
        }
        return 0;
    }
    if !matches!(
        state,
        TCP_ESTABLISHED | TCP_FIN_WAIT1 | TCP_FIN_WAIT2 | TCP_CLOSE_WAIT | TCP_LAST_ACK | TCP_CLOSING
    ) {
        return 0;
    }
    if LIMITER_WALK.get(u32::from(port)).copied() != Some(1) {
        return 0;
    }
    let Some(settings) = LIMITER_CONFIG.get(0) else {
        return 0;
    };
    let family: u16 = read(base, off.family);
    let group = if family == AF_INET {
        source::key_v4(read(base, off.daddr), port, settings.prefix_v4)
    } else {
        source::key_v6(read(base, off.v6_daddr), port, settings.prefix_v4, settings.prefix_v6)
    };
    // SAFETY: `skc` is the iterator's socket; NULL unless a full TCP socket.
    let tcp = unsafe { bpf_skc_to_tcp_sock(skc) };
    if tcp.is_null() {
        return 0;
    }
    let mut init = SockMark::default();
    let map = ptr::from_ref(&LIMITER_SOCKS).cast_mut().cast::<c_void>();
    // SAFETY: a full socket the iterator holds locked.
    let mark = unsafe {
        bpf_sk_storage_get(
            map,
            tcp.cast(),
            ptr::from_mut(&mut init).cast(),
            BPF_SK_STORAGE_GET_F_CREATE.into(),
        )
    }
    .cast::<SockMark>();
    if !mark.is_null() {
        count::count(mark, port, &group, settings, false);
    }
    0
}
