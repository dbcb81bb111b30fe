//! Frames for the XDP tests: builders for SYNs (with correct checksums, so
//! a malformed variant differs from a good one in exactly one way), a
//! parser that checks every checksum itself, and a raw capture socket.

use std::{
    ffi::CString,
    io,
    net::IpAddr,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    time::{Duration, Instant},
};

pub const SYN: u8 = 0x02;
pub const RST: u8 = 0x04;
pub const ACK: u8 = 0x10;

/// One's-complement sum of 16-bit big-endian words (odd length padded).
pub fn sum(bytes: &[u8], mut acc: u32) -> u32 {
    for pair in bytes.chunks(2) {
        let word = u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]);
        acc += u32::from(word);
    }
    acc
}

pub fn fold(mut acc: u32) -> u16 {
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    !(acc as u16)
}

fn addr_bytes(a: IpAddr) -> Vec<u8> {
    match a {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// The TCP checksum of `segment` between `src` and `dst`.
pub fn tcp_checksum(src: IpAddr, dst: IpAddr, segment: &[u8]) -> u16 {
    let mut acc = sum(&addr_bytes(src), 0);
    acc = sum(&addr_bytes(dst), acc);
    acc += 6 + segment.len() as u32;
    fold(sum(segment, acc))
}

/// A TCP segment: header with `options` (padded to 4 bytes) and `payload`.
pub struct Segment<'a> {
    pub sport: u16,
    pub dport: u16,
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
    pub options: &'a [u8],
    pub payload: &'a [u8],
}

/// An Ethernet frame carrying `seg` from `src` to `dst` (IPv4 or IPv6 by
/// the address family), every checksum correct.
pub fn frame(src: IpAddr, dst: IpAddr, seg: &Segment<'_>) -> Vec<u8> {
    let mut tcp = Vec::new();
    let mut options = seg.options.to_vec();
    while !options.len().is_multiple_of(4) {
        options.push(1); // NOP
    }
    let offset = (20 + options.len()) / 4;
    tcp.extend_from_slice(&seg.sport.to_be_bytes());
    tcp.extend_from_slice(&seg.dport.to_be_bytes());
    tcp.extend_from_slice(&seg.seq.to_be_bytes());
    tcp.extend_from_slice(&seg.ack.to_be_bytes());
    tcp.push((offset as u8) << 4);
    tcp.push(seg.flags);
    tcp.extend_from_slice(&64240u16.to_be_bytes());
    tcp.extend_from_slice(&[0, 0, 0, 0]);
    tcp.extend_from_slice(&options);
    tcp.extend_from_slice(seg.payload);
    let c = tcp_checksum(src, dst, &tcp);
    tcp[16..18].copy_from_slice(&c.to_be_bytes());

    let mut f = vec![0x02, 0, 0, 0, 0, 0x01, 0x02, 0, 0, 0, 0, 0x02];
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            f.extend_from_slice(&0x0800u16.to_be_bytes());
            let mut ip = vec![0x45, 0];
            ip.extend_from_slice(&((20 + tcp.len()) as u16).to_be_bytes());
            ip.extend_from_slice(&[0x12, 0x34, 0x40, 0, 64, 6, 0, 0]);
            ip.extend_from_slice(&s.octets());
            ip.extend_from_slice(&d.octets());
            let c = fold(sum(&ip, 0));
            ip[10..12].copy_from_slice(&c.to_be_bytes());
            f.extend_from_slice(&ip);
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            f.extend_from_slice(&0x86ddu16.to_be_bytes());
            f.extend_from_slice(&[0x60, 0, 0, 0]);
            f.extend_from_slice(&(tcp.len() as u16).to_be_bytes());
            f.extend_from_slice(&[6, 64]);
            f.extend_from_slice(&s.octets());
            f.extend_from_slice(&d.octets());
        }
        _ => panic!("mixed address families"),
    }
    f.extend_from_slice(&tcp);
    f
}

/// A parsed TCP/IP frame, with its checksums checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    pub src: IpAddr,
    pub dst: IpAddr,
    pub ttl: u8,
    pub sport: u16,
    pub dport: u16,
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
    pub window: u16,
    pub header_len: usize,
    pub payload_len: usize,
    /// IPv4 header checksum correct (always true for IPv6, which has none).
    pub ip_checksum_ok: bool,
    pub tcp_checksum_ok: bool,
    /// Frame length agrees with the IP length fields exactly (no padding).
    pub exact_length: bool,
}

/// Parses an Ethernet/IP/TCP frame without IP options or extension headers.
pub fn parse(f: &[u8]) -> Option<Parsed> {
    let mac = |o: usize| -> [u8; 6] { f[o..o + 6].try_into().unwrap() };
    if f.len() < 14 {
        return None;
    }
    let (src, dst, ttl, l4, l4_len, ip_ok) = match u16::from_be_bytes([f[12], f[13]]) {
        0x0800 => {
            let ip = f.get(14..34)?;
            if ip[0] != 0x45 || ip[9] != 6 {
                return None;
            }
            let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
            let s: [u8; 4] = ip[12..16].try_into().ok()?;
            let d: [u8; 4] = ip[16..20].try_into().ok()?;
            (IpAddr::from(s), IpAddr::from(d), ip[8], 34, total.checked_sub(20)?, fold(sum(ip, 0)) == 0)
        }
        0x86dd => {
            let ip = f.get(14..54)?;
            if ip[6] != 6 {
                return None;
            }
            let payload = usize::from(u16::from_be_bytes([ip[4], ip[5]]));
            let s: [u8; 16] = ip[8..24].try_into().ok()?;
            let d: [u8; 16] = ip[24..40].try_into().ok()?;
            (IpAddr::from(s), IpAddr::from(d), ip[7], 54, payload, true)
        }
        _ => return None,
    };
    let seg = f.get(l4..l4 + l4_len)?;
    if seg.len() < 20 {
        return None;
    }
    let header_len = usize::from(seg[12] >> 4) * 4;
    Some(Parsed {
        src_mac: mac(6),
        dst_mac: mac(0),
        src,
        dst,
        ttl,
        sport: u16::from_be_bytes([seg[0], seg[1]]),
        dport: u16::from_be_bytes([seg[2], seg[3]]),
        seq: u32::from_be_bytes(seg[4..8].try_into().ok()?),
        ack: u32::from_be_bytes(seg[8..12].try_into().ok()?),
        flags: seg[13],
        window: u16::from_be_bytes([seg[14], seg[15]]),
        header_len,
        payload_len: seg.len().saturating_sub(header_len),
        ip_checksum_ok: ip_ok,
        // Summing a segment that carries its checksum gives 0 when it is right.
        tcp_checksum_ok: tcp_checksum(src, dst, seg) == 0,
        exact_length: f.len() == l4 + l4_len,
    })
}

/// A raw `AF_PACKET` socket on one interface, seeing frames both ways.
pub struct Capture {
    fd: OwnedFd,
}

impl Capture {
    /// Opens a capture on `interface` of the calling thread's namespace.
    pub fn open(interface: &str) -> io::Result<Self> {
        let name = CString::new(interface).map_err(io::Error::other)?;
        // SAFETY: plain libc calls; the fd is owned at once.
        unsafe {
            let index = libc::if_nametoindex(name.as_ptr());
            if index == 0 {
                return Err(io::Error::last_os_error());
            }
            let proto = (libc::ETH_P_ALL as u16).to_be();
            let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, i32::from(proto));
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            let fd = OwnedFd::from_raw_fd(fd);
            let mut sll: libc::sockaddr_ll = std::mem::zeroed();
            sll.sll_family = libc::AF_PACKET as u16;
            sll.sll_protocol = proto;
            sll.sll_ifindex = index as i32;
            let r = libc::bind(
                fd.as_raw_fd(),
                std::ptr::from_ref(&sll).cast(),
                size_of::<libc::sockaddr_ll>() as u32,
            );
            if r != 0 {
                return Err(io::Error::last_os_error());
            }
            let tv = libc::timeval { tv_sec: 0, tv_usec: 100_000 };
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                std::ptr::from_ref(&tv).cast(),
                size_of::<libc::timeval>() as u32,
            );
            Ok(Self { fd })
        }
    }

    /// Frames seen until `pred` accepts one (returned with all before it),
    /// or `timeout` passes.
    pub fn until(&self, timeout: Duration, mut pred: impl FnMut(&[u8]) -> bool) -> (Vec<Vec<u8>>, bool) {
        let deadline = Instant::now() + timeout;
        let mut frames = Vec::new();
        let mut buf = vec![0u8; 65_536];
        while Instant::now() < deadline {
            // SAFETY: reading into our buffer of the stated length.
            let n = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n <= 0 {
                continue;
            }
            let frame = buf[..n as usize].to_vec();
            let done = pred(&frame);
            frames.push(frame);
            if done {
                return (frames, true);
            }
        }
        (frames, false)
    }
}
