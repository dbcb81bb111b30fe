//! The start-up walk: an `iter/tcp` program the daemon runs once after
//! attaching, over every TCP socket of the gated network namespace (the
//! iterator's namespace is the one it is opened from). It counts the
//! server-side connections that were established before the gate attached
//! and so never passed through sock_ops, and sets their sock_ops
//! state-callback flag (`bpf_setsockopt(TCP_BPF_SOCK_OPS_CB_FLAGS)`, kernel
//! 6.10), so that `limiter_count` sees their close and uncounts them like
//! any other. Where the flag cannot be set, the connection is not counted
//! (`untracked_sockets`).
//!
//! The iterator calls this program with the socket locked, so neither the
//! socket's handshake callback nor its close can run meanwhile: a socket is
//! either counted here or by sock_ops (whichever puts its cookie in the
//! connection table first),
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
//! Minimum kernel: 5.19 (socket locked in the TCP iterator); 6.10 to count
//! anything (`TCP_BPF_SOCK_OPS_CB_FLAGS`).

use core::{ffi::c_void, ptr};

use aya_ebpf::{
    bindings::BPF_SOCK_OPS_STATE_CB_FLAG,
    helpers::generated::{
        bpf_get_socket_cookie, bpf_getsockopt, bpf_probe_read_kernel, bpf_setsockopt, bpf_skc_to_tcp_sock,
    },
};
use limiter_common::{AF_INET, Port, SockOffsets, source};

use crate::{
    count,
    maps::{LIMITER_CONFIG, LIMITER_WALK},
};

/// Set by the daemon at load time (`EbpfLoader::set_global`).
#[unsafe(no_mangle)]
static LIMITER_OFFSETS: SockOffsets = SockOffsets {
    daddr: 0,
    v6_daddr: 0,
    num: 0,
    family: 0,
    state: 0,
    sk_cgroup: 0,
    cgroup_kn: 0,
    kn_id: 0,
    cgroup_self: 0,
    css_parent: 0,
};

/// `struct bpf_iter__tcp`.
#[repr(C)]
pub struct IterTcp {
    meta: *mut c_void,
    sk_common: *mut c_void,
    uid: u32,
}

const SOL_TCP: i32 = 6;
/// `TCP_BPF_SOCK_OPS_CB_FLAGS` (include/uapi/linux/bpf.h, kernel 6.10).
const TCP_BPF_SOCK_OPS_CB_FLAGS: i32 = 1008;
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

/// Gets or sets (`op`: `bpf_getsockopt` or `bpf_setsockopt`) the socket's
/// `TCP_BPF_SOCK_OPS_CB_FLAGS` through `flags`.
#[inline(always)]
fn cb_flags(
    op: unsafe fn(*mut c_void, i32, i32, *mut c_void, i32) -> i64,
    tcp: *mut c_void,
    flags: &mut i32,
) -> i64 {
    // SAFETY: `tcp` is a full TCP socket the iterator holds locked; `flags`
    // is ours, of the stated size.
    unsafe {
        op(tcp, SOL_TCP, TCP_BPF_SOCK_OPS_CB_FLAGS, ptr::from_mut(flags).cast(), size_of::<i32>() as i32)
    }
}

/// Whether the socket's cgroup is `id` or below it (at most 16 levels up).
fn in_cgroup(sk: *const u8, off: &SockOffsets, id: u64) -> bool {
    let mut cgroup: u64 = read(sk, off.sk_cgroup);
    for _ in 0..16 {
        if cgroup == 0 {
            return false;
        }
        let kn: u64 = read(cgroup as *const u8, off.cgroup_kn);
        if kn != 0 && read::<u64>(kn as *const u8, off.kn_id) == id {
            return true;
        }
        let parent: u64 = read(cgroup as *const u8, off.cgroup_self + off.css_parent);
        // `self` is the cgroup's own css: the parent css sits at the same
        // offset inside the parent cgroup.
        cgroup = if parent == 0 { 0 } else { parent - u64::from(off.cgroup_self) };
    }
    false
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
    // skc_num: the local port, host order.
    let port = Port::from_host(u32::from(read::<u16>(base, off.num)));
    if state == TCP_LISTEN {
        if let Some(seen) = LIMITER_WALK.get_ptr_mut(port.index()) {
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
    if LIMITER_WALK.get(port.index()).copied() != Some(1) {
        return 0;
    }
    let Some(config) = LIMITER_CONFIG.get(0) else {
        return 0;
    };
    // Only sockets whose close limiter_count will see: those of the gated
    // cgroup or a cgroup below it.
    if !in_cgroup(base, &off, config.cgroup_id) {
        return 0;
    }
    let family: u16 = read(base, off.family);
    let group = || {
        if family == AF_INET {
            source::key_v4(read(base, off.daddr), port, config.prefix_v4)
        } else {
            source::key_v6(read(base, off.v6_daddr), port, config.prefix_v4, config.prefix_v6)
        }
    };
    // SAFETY: `skc` is the iterator's socket; NULL unless a full TCP socket.
    let tcp = unsafe { bpf_skc_to_tcp_sock(skc) };
    if tcp.is_null() {
        return 0;
    }
    // SAFETY: a full socket the iterator holds locked.
    let cookie = unsafe { bpf_get_socket_cookie(tcp.cast()) };
    if !count::counted(cookie) {
        // Its close must reach limiter_count before it is counted.
        let mut flags: i32 = 0;
        if cb_flags(bpf_getsockopt, tcp.cast(), &mut flags) != 0 {
            flags = 0;
        }
        flags |= BPF_SOCK_OPS_STATE_CB_FLAG as i32;
        if cb_flags(bpf_setsockopt, tcp.cast(), &mut flags) != 0 {
            count::untracked();
            return 0;
        }
    }
    count::count(cookie, port, group, config, false);
    0
}
