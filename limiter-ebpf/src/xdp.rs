//! Refusal at the driver: on the interfaces it is attached to, a TCP SYN to
//! a port the gate refuses is turned, in place, into the RST the kernel
//! would have sent (RFC 9293, reset generation for a segment without ACK:
//! `<SEQ=0><ACK=SEG.SEQ+SEG.LEN><CTL=RST,ACK>`) and sent back with
//! `XDP_TX`: no socket, no skb, no conntrack entry.
//!
//! It answers only for this host: the frame must be addressed to the
//! interface's own MAC (not a frame a bridge port or promiscuous interface
//! sees for another host) and to a local address (`bpf_fib_lookup`; on a
//! host that does not forward, every address it accepts is local). A SYN
//! routed through the host to a port number that is full here passes.
//!
//! Everything else passes untouched, unread beyond the headers it needs:
//! non-IP, VLAN-tagged frames, IPv4 with options or fragmented, IPv6 with
//! extension headers, non-TCP, anything but a bare SYN, and any frame whose
//! lengths disagree with its size. Those still meet `sk_lookup` in the
//! stack, which enforces the same limits.
//!
//! Minimum kernel: 5.9 for a pinnable XDP link (generic mode on any
//! interface; driver mode where the driver supports it).

use aya_ebpf::{
    bindings::{
        BPF_FIB_LKUP_RET_FWD_DISABLED, BPF_FIB_LKUP_RET_NOT_FWDED, bpf_fib_lookup as FibParams,
        xdp_action::{XDP_DROP, XDP_PASS, XDP_TX},
    },
    helpers::generated::{bpf_fib_lookup, bpf_xdp_adjust_tail},
    macros::xdp,
    programs::XdpContext,
};
use limiter_common::{AF_INET, AF_INET6, IPPROTO_TCP, Port, path};

use crate::{
    gate::{self, Client},
    maps::LIMITER_IFMAC,
};

const ETH_LEN: usize = 14;
const IP4_LEN: usize = 20;
const IP6_LEN: usize = 40;
const TCP_LEN: usize = 20;
const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const FIN: u8 = 0x01;
const SYN: u8 = 0x02;
const RST: u8 = 0x04;
const ACK: u8 = 0x10;
const TTL: u8 = 64;

#[xdp]
pub fn limiter_xdp(ctx: XdpContext) -> u32 {
    let Some(syn) = syn(&ctx) else {
        return XDP_PASS;
    };
    let Some(why) = gate::refuse(syn.dport, &syn.client, syn.sport.get(), path::XDP) else {
        return XDP_PASS;
    };
    if !for_this_host(&ctx, &syn) {
        return XDP_PASS;
    }
    let verdict = reset(&ctx, &syn);
    if verdict == XDP_TX {
        gate::count_refusal(syn.dport, path::XDP, why);
    }
    verdict
}

/// Whether the SYN is addressed to this host: the interface's own MAC and
/// a local address.
#[inline(always)]
fn for_this_host(ctx: &XdpContext, syn: &Syn) -> bool {
    let Some(eth) = at(ctx, 0, ETH_LEN) else { return false };
    // SAFETY: reading the context the kernel passed.
    let ifindex = unsafe { (*ctx.ctx).ingress_ifindex };
    let Some(own) = (unsafe { LIMITER_IFMAC.get(&ifindex) }) else { return false };
    // SAFETY: 14 bytes checked.
    let dst = unsafe { eth.cast::<[u8; 6]>().read_unaligned() };
    if dst != own.mac {
        return false;
    }
    // SAFETY: every field is plain data; zero is a valid start.
    let mut fib: FibParams = unsafe { core::mem::zeroed() };
    fib.l4_protocol = IPPROTO_TCP;
    fib.sport = syn.sport.to_be();
    fib.dport = syn.dport.to_be();
    fib.ifindex = ifindex;
    if syn.v6 {
        let Some(ip) = at(ctx, ETH_LEN, IP6_LEN) else { return false };
        fib.family = AF_INET6 as u8;
        // SAFETY: 40 bytes checked; the unions hold plain integers.
        unsafe {
            fib.__bindgen_anon_3.ipv6_src = ip.add(8).cast::<[u32; 4]>().read_unaligned();
            fib.__bindgen_anon_4.ipv6_dst = ip.add(24).cast::<[u32; 4]>().read_unaligned();
        }
    } else {
        let Some(ip) = at(ctx, ETH_LEN, IP4_LEN) else { return false };
        fib.family = AF_INET as u8;
        // SAFETY: 20 bytes checked; the unions hold plain integers.
        unsafe {
            fib.__bindgen_anon_1.tot_len = be16(ip, 2).to_be();
            fib.__bindgen_anon_3.ipv4_src = ip.add(12).cast::<u32>().read_unaligned();
            fib.__bindgen_anon_4.ipv4_dst = ip.add(16).cast::<u32>().read_unaligned();
        }
    }
    // SAFETY: the context and a parameter block of the stated size.
    let ret = unsafe {
        bpf_fib_lookup(ctx.ctx.cast(), core::ptr::from_mut(&mut fib), size_of::<FibParams>() as i32, 0)
    };
    // Local delivery (not forwarded), or a host that forwards nothing.
    ret == i64::from(BPF_FIB_LKUP_RET_NOT_FWDED) || ret == i64::from(BPF_FIB_LKUP_RET_FWD_DISABLED)
}

/// What the RST needs from a bare SYN (addresses are swapped in place).
struct Syn {
    v6: bool,
    client: Client,
    sport: Port,
    dport: Port,
    /// SEG.SEQ + SEG.LEN (the SYN flag and any data).
    ack: u32,
}

/// A pointer to `len` bytes at `offset`, if the frame holds them.
#[inline(always)]
fn at(ctx: &XdpContext, offset: usize, len: usize) -> Option<*mut u8> {
    let start = ctx.data();
    if start + offset + len > ctx.data_end() {
        return None;
    }
    Some((start + offset) as *mut u8)
}

#[inline(always)]
fn be16(p: *const u8, offset: usize) -> u16 {
    // SAFETY: callers checked the bounds with `at`.
    unsafe { u16::from_be_bytes(p.add(offset).cast::<[u8; 2]>().read_unaligned()) }
}

/// A port field of a header, converted once, here.
#[inline(always)]
fn port(p: *const u8, offset: usize) -> Port {
    // SAFETY: callers checked the bounds with `at`.
    Port::from_be(unsafe { p.add(offset).cast::<u16>().read_unaligned() })
}

#[inline(always)]
fn be32(p: *const u8, offset: usize) -> u32 {
    // SAFETY: callers checked the bounds with `at`.
    unsafe { u32::from_be_bytes(p.add(offset).cast::<[u8; 4]>().read_unaligned()) }
}

#[inline(always)]
fn syn(ctx: &XdpContext) -> Option<Syn> {
    let eth = at(ctx, 0, ETH_LEN)?;
    let frame = ctx.data_end() - ctx.data();
    let (v6, ip_len, l4_len, client) = match be16(eth, 12) {
        ETH_P_IP => {
            let ip = at(ctx, ETH_LEN, IP4_LEN)?;
            // SAFETY: 20 bytes checked.
            let (vihl, proto) = unsafe { (*ip, *ip.add(9)) };
            // Version 4 without options; neither a fragment nor more to come.
            if vihl != 0x45 || proto != IPPROTO_TCP || be16(ip, 6) & 0x3fff != 0 {
                return None;
            }
            let total = usize::from(be16(ip, 2));
            if total < IP4_LEN + TCP_LEN || ETH_LEN + total > frame {
                return None;
            }
            // SAFETY: 20 bytes checked.
            let src = unsafe { ip.add(12).cast::<u32>().read_unaligned() };
            (false, IP4_LEN, total - IP4_LEN, Client::V4(src))
        }
        ETH_P_IPV6 => {
            let ip = at(ctx, ETH_LEN, IP6_LEN)?;
            // SAFETY: 40 bytes checked.
            let (version, next) = unsafe { (*ip >> 4, *ip.add(6)) };
            // Extension headers (including fragments) pass.
            if version != 6 || next != IPPROTO_TCP {
                return None;
            }
            let payload = usize::from(be16(ip, 4));
            if payload < TCP_LEN || ETH_LEN + IP6_LEN + payload > frame {
                return None;
            }
            // SAFETY: 40 bytes checked.
            let src = unsafe { ip.add(8).cast::<[u32; 4]>().read_unaligned() };
            (true, IP6_LEN, payload, Client::V6(src))
        }
        // VLAN tags, ARP, everything else.
        _ => return None,
    };
    let tcp = at(ctx, ETH_LEN + ip_len, TCP_LEN)?;
    // SAFETY: 20 bytes checked.
    let (offset, flags) = unsafe { (*tcp.add(12) >> 4, *tcp.add(13)) };
    let header = usize::from(offset) * 4;
    if flags & (SYN | ACK | RST | FIN) != SYN || header < TCP_LEN || header > l4_len {
        return None;
    }
    let data = (l4_len - header) as u32;
    Some(Syn {
        v6,
        client,
        sport: port(tcp, 0),
        dport: port(tcp, 2),
        ack: be32(tcp, 4).wrapping_add(1).wrapping_add(data),
    })
}

#[inline(always)]
fn fold(mut acc: u32) -> u16 {
    acc = (acc & 0xffff) + (acc >> 16);
    acc = (acc & 0xffff) + (acc >> 16);
    !(acc as u16)
}

/// Sum of the big-endian 16-bit words of `n` bytes at `p` (n even).
///
/// # Safety
/// `n` bytes at `p` must be inside the frame.
#[inline(always)]
unsafe fn sum16(p: *const u8, n: usize, mut acc: u32) -> u32 {
    let mut i = 0;
    while i < n {
        acc += u32::from(be16(p, i));
        i += 2;
    }
    acc
}

/// Swaps `N` bytes at `a` with `N` bytes at `b`.
///
/// # Safety
/// Both ranges must be inside the frame.
#[inline(always)]
unsafe fn swap<const N: usize>(a: *mut u8, b: *mut u8) {
    // SAFETY: forwarded to the caller.
    unsafe {
        let x = a.cast::<[u8; N]>().read_unaligned();
        a.cast::<[u8; N]>().write_unaligned(b.cast::<[u8; N]>().read_unaligned());
        b.cast::<[u8; N]>().write_unaligned(x);
    }
}

#[inline(always)]
fn put16(p: *mut u8, offset: usize, v: u16) {
    // SAFETY: callers checked the bounds with `at`.
    unsafe { p.add(offset).cast::<[u8; 2]>().write_unaligned(v.to_be_bytes()) }
}

#[inline(always)]
fn put32(p: *mut u8, offset: usize, v: u32) {
    // SAFETY: callers checked the bounds with `at`.
    unsafe { p.add(offset).cast::<[u8; 4]>().write_unaligned(v.to_be_bytes()) }
}

/// Rewrites the SYN into the RST in place and sends it back; passes the
/// frame unchanged if it cannot be shrunk.
#[inline(always)]
fn reset(ctx: &XdpContext, syn: &Syn) -> u32 {
    let ip_len = if syn.v6 { IP6_LEN } else { IP4_LEN };
    let len = ETH_LEN + ip_len + TCP_LEN;
    let frame = ctx.data_end() - ctx.data();
    // Drop options, data and padding first: nothing is written before the
    // frame is known to be the right size. Shrinking keeps the headers.
    if frame != len {
        // SAFETY: the context the kernel passed; `len` keeps every header.
        if unsafe { bpf_xdp_adjust_tail(ctx.ctx, len as i32 - frame as i32) } != 0 {
            return XDP_PASS;
        }
    }
    let Some(p) = at(ctx, 0, len) else {
        // Unreachable (the frame was just shrunk to `len`); a cut frame must
        // not go on as if untouched.
        return XDP_DROP;
    };
    // SAFETY: `len` bytes checked by `at`.
    unsafe {
        swap::<6>(p, p.add(6));
        let ip = p.add(ETH_LEN);
        let tcp = ip.add(ip_len);
        // Addresses: swapped in place, then summed for the pseudo-header.
        let (addrs, alen) = if syn.v6 {
            swap::<16>(ip.add(8), ip.add(24));
            (ip.add(8), 32)
        } else {
            swap::<4>(ip.add(12), ip.add(16));
            (ip.add(12), 8)
        };
        if syn.v6 {
            put32(ip, 0, 0x6000_0000); // version 6, no traffic class or flow label
            put16(ip, 4, TCP_LEN as u16);
            *ip.add(6) = IPPROTO_TCP;
            *ip.add(7) = TTL;
        } else {
            *ip.add(1) = 0; // TOS
            put16(ip, 2, (IP4_LEN + TCP_LEN) as u16);
            put16(ip, 4, 0); // id
            put16(ip, 6, 0x4000); // don't fragment
            *ip.add(8) = TTL;
            put16(ip, 10, 0);
            put16(ip, 10, fold(sum16(ip, IP4_LEN, 0)));
        }
        put16(tcp, 0, syn.dport.get());
        put16(tcp, 2, syn.sport.get());
        put32(tcp, 4, 0);
        put32(tcp, 8, syn.ack);
        put16(tcp, 12, (5 << 12) | u16::from(RST | ACK));
        put16(tcp, 14, 0); // window
        put16(tcp, 16, 0);
        put16(tcp, 18, 0); // urgent pointer
        let pseudo = sum16(addrs, alen, u32::from(IPPROTO_TCP) + TCP_LEN as u32);
        put16(tcp, 16, fold(sum16(tcp, TCP_LEN, pseudo)));
    }
    XDP_TX
}
