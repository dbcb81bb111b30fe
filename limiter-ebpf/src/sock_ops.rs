//! Counting: `BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB` fires once per accepted
//! handshake; there the socket is marked and asks for state callbacks, and
//! its `BPF_TCP_CLOSE` transition (reached exactly once, whichever way the
//! connection ends) decrements. Only sockets carrying this gate's mark are
//! ever decremented, so a socket flagged by another program, or one that
//! predates the gate, cannot push a count below what was counted.
//!
//! Minimum kernel: 5.15 (`bpf_get_netns_cookie` in sock_ops; sk_storage in
//! sock_ops since 5.10).

use core::{ffi::c_void, ptr};

use aya_ebpf::{
    EbpfContext as _,
    bindings::{
        BPF_NOEXIST, BPF_SK_STORAGE_GET_F_CREATE, BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB, BPF_SOCK_OPS_STATE_CB,
        BPF_SOCK_OPS_STATE_CB_FLAG, BPF_TCP_CLOSE,
    },
    helpers::generated::{bpf_get_netns_cookie, bpf_sk_storage_get},
    macros::sock_ops,
    programs::SockOpsContext,
};
use limiter_common::{PortKey, SockMark};

use crate::{
    atomic,
    maps::{LIMITER_ACTIVE, LIMITER_CONFIG, LIMITER_SOCKS, LIMITER_STATS},
};

const AF_INET: u32 = 2;
const AF_INET6: u32 = 10;

#[sock_ops]
pub fn limiter_count(ctx: SockOpsContext) -> u32 {
    match ctx.op() {
        BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB => on_established(&ctx),
        // args[1] is the new state.
        BPF_SOCK_OPS_STATE_CB if ctx.arg(1) == BPF_TCP_CLOSE => on_close(&ctx),
        _ => {}
    }
    // sock_ops programs return 1; the value is not a verdict for these ops.
    1
}

fn on_established(ctx: &SockOpsContext) {
    let family = ctx.family();
    if family != AF_INET && family != AF_INET6 {
        return;
    }
    let Some(settings) = LIMITER_CONFIG.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: the helper only reads the context pointer the kernel gave us.
    let cookie = unsafe { bpf_get_netns_cookie(ctx.as_ptr()) };
    // SAFETY: array values live as long as the map.
    if cookie != unsafe { (*settings).netns_cookie } {
        return;
    }
    // local_port is host order in sock_ops (DESIGN.md); ports fit in 16 bits.
    let port = ctx.local_port() as u16;
    // Ask for the state callbacks first: if that fails nothing is counted,
    // and if marking then fails the close callback finds no mark.
    let flags = ctx.cb_flags() | BPF_SOCK_OPS_STATE_CB_FLAG;
    if ctx.set_cb_flags(flags as i32).is_err() {
        untracked(settings);
        return;
    }
    let mut mark = SockMark { port, _pad: 0, counted: 1 };
    let Some(stored) = sock_mark(ctx, &mut mark, BPF_SK_STORAGE_GET_F_CREATE.into()) else {
        untracked(settings);
        return;
    };
    let Some(stats) = LIMITER_STATS.get_ptr_mut(u32::from(port)) else {
        // Unreachable: the array holds every port. Undo the mark so the
        // close callback does not decrement what was not counted.
        // SAFETY: `stored` is this socket's storage, valid while it lives.
        unsafe { (*stored).counted = 0 };
        untracked(settings);
        return;
    };
    // SAFETY: array values live as long as the map; each field is 8-byte
    // aligned.
    let first = unsafe {
        // The storage may have existed with counted == 0 (a socket that was
        // counted, closed and reused cannot happen, but be exact anyway).
        (*stored).port = port;
        (*stored).counted = 1;
        let established = atomic::add(ptr::addr_of_mut!((*stats).established), 1) + 1;
        atomic::raise(ptr::addr_of_mut!((*stats).high_watermark), established);
        atomic::add(ptr::addr_of_mut!((*stats).admitted), 1) == 0
    };
    if first {
        // Once per port ever: tell readers this port has counters.
        let _ = LIMITER_ACTIVE.insert(PortKey::new(port), 1, BPF_NOEXIST.into());
    }
}

fn on_close(ctx: &SockOpsContext) {
    let Some(stored) = sock_mark(ctx, ptr::null_mut(), 0) else {
        return;
    };
    // SAFETY: this socket's storage, valid while the socket lives.
    let (port, counted) = unsafe { ((*stored).port, (*stored).counted) };
    if counted == 0 {
        return;
    }
    // SAFETY: as above.
    unsafe { (*stored).counted = 0 };
    let Some(stats) = LIMITER_STATS.get_ptr_mut(u32::from(port)) else {
        return;
    };
    // SAFETY: see on_established.
    unsafe {
        atomic::sub(ptr::addr_of_mut!((*stats).established), 1);
    }
}

/// This socket's mark; with `BPF_SK_STORAGE_GET_F_CREATE`, created from
/// `init` when absent.
fn sock_mark(ctx: &SockOpsContext, init: *mut SockMark, flags: u64) -> Option<*mut SockMark> {
    // SAFETY: reading the `sk` field of the context the kernel passed.
    let sk = unsafe { (*ctx.ops).__bindgen_anon_2.sk };
    if sk.is_null() {
        return None;
    }
    let map = ptr::from_ref(&LIMITER_SOCKS).cast_mut().cast::<c_void>();
    // SAFETY: `sk` is the non-null full socket of this callback.
    let stored = unsafe { bpf_sk_storage_get(map, sk.cast(), init.cast(), flags) }.cast::<SockMark>();
    (!stored.is_null()).then_some(stored)
}

fn untracked(settings: *mut limiter_common::Settings) {
    // SAFETY: array value, valid as long as the map.
    unsafe {
        atomic::add(ptr::addr_of_mut!((*settings).untracked), 1);
    }
}
