//! Counting: `BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB` fires once per accepted
//! handshake; there the socket asks for state callbacks and is counted on
//! its port (and, if the port has a per-source cap, its client group)
//! under its cookie ([`count`]). Its `BPF_TCP_CLOSE` transition (reached
//! exactly once, whichever way the connection ends) uncounts it if the
//! cookie is this gate's. The start-up walk sets the same callback flag on
//! the connections it counts, so one close path serves both.
//!
//! Why not a tracepoint for the close: a tracing program does not run
//! while it is already running on the same CPU, so a socket reset in a
//! softirq that interrupted the program's run for another socket is missed
//! (the kernel counts it in `recursion_misses`); a flood of resets showed
//! counts stuck above 0. sock_ops callbacks have no such guard.
//!
//! Minimum kernel: 5.15 (`bpf_get_netns_cookie` in sock_ops).

use aya_ebpf::{
    EbpfContext as _,
    bindings::{
        BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB, BPF_SOCK_OPS_STATE_CB, BPF_SOCK_OPS_STATE_CB_FLAG, BPF_TCP_CLOSE,
    },
    helpers::generated::{bpf_get_netns_cookie, bpf_get_socket_cookie},
    macros::sock_ops,
    programs::SockOpsContext,
};
use limiter_common::{AF_INET, AF_INET6, Port, source};

use crate::{count, maps::LIMITER_CONFIG};

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

fn on_close(ctx: &SockOpsContext) {
    // SAFETY: the helper only reads the context pointer the kernel gave us.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    if count::uncount(cookie) {
        return;
    }
    // SAFETY: reading the `sk` field of the context the kernel passed.
    let sk = unsafe { (*ctx.ops).__bindgen_anon_2.sk };
    if !sk.is_null() {
        count::legacy::uncount(sk.cast());
    }
}

fn on_established(ctx: &SockOpsContext) {
    let family = ctx.family();
    if family != u32::from(AF_INET) && family != u32::from(AF_INET6) {
        return;
    }
    let Some(config) = LIMITER_CONFIG.get(0) else {
        return;
    };
    // SAFETY: the helper only reads the context pointer the kernel gave us.
    if unsafe { bpf_get_netns_cookie(ctx.as_ptr()) } != config.netns_cookie {
        return;
    }
    // local_port is host order in sock_ops (DESIGN.md).
    let port = Port::from_host(ctx.local_port());
    // remote addresses are network order in memory; read only for a port
    // with a per-source cap.
    let group = || {
        if family == u32::from(AF_INET) {
            source::key_v4(ctx.remote_ip4(), port, config.prefix_v4)
        } else {
            source::key_v6(ctx.remote_ip6(), port, config.prefix_v4, config.prefix_v6)
        }
    };
    // Ask for the state callbacks first: if that fails nothing is counted,
    // so nothing waits for a close that would not be seen.
    let flags = ctx.cb_flags() | BPF_SOCK_OPS_STATE_CB_FLAG;
    if ctx.set_cb_flags(flags as i32).is_err() {
        count::untracked();
        return;
    }
    // SAFETY: the helper only reads the context pointer the kernel gave us.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    count::count(cookie, port, group, config, true);
}
