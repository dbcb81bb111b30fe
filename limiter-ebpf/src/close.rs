//! Uncounting: the `inet_sock_set_state` tracepoint fires on every TCP
//! state change of every socket (`tcp_set_state`); on a change to
//! `TCP_CLOSE`, a socket carrying this gate's mark is uncounted. Unlike the
//! sock_ops state callback, it needs no per-socket flag, so it also sees
//! the close of connections the start-up walk counted, which never passed
//! through sock_ops. Cost for other sockets: one compare per state change,
//! and one storage lookup per close.
//!
//! Minimum kernel: 5.11 (sk_storage from tracing programs).

use core::{ffi::c_void, ptr};

use aya_ebpf::{
    helpers::generated::bpf_sk_storage_get, macros::btf_tracepoint, programs::BtfTracePointContext,
};
use limiter_common::SockMark;

use crate::{count, maps::LIMITER_SOCKS};

const TCP_CLOSE: i32 = 7;

#[btf_tracepoint(function = "inet_sock_set_state")]
pub fn limiter_close(ctx: BtfTracePointContext) -> i32 {
    // inet_sock_set_state(const struct sock *sk, int oldstate, int newstate)
    let newstate: i32 = ctx.arg(2);
    if newstate != TCP_CLOSE {
        return 0;
    }
    let sk: *mut c_void = ctx.arg(0);
    if sk.is_null() {
        return 0;
    }
    let map = ptr::from_ref(&LIMITER_SOCKS).cast_mut().cast::<c_void>();
    // SAFETY: `sk` is the traced socket (a BTF pointer the verifier checks).
    let mark = unsafe { bpf_sk_storage_get(map, sk, ptr::null_mut(), 0) }.cast::<SockMark>();
    if !mark.is_null() {
        count::uncount(mark);
    }
    0
}
