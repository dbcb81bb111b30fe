//! The kind of a network interface (`veth`, `bridge`, ...), as rtnetlink
//! reports it (`IFLA_INFO_KIND`); a physical NIC has none. `kernel.xdp.mode
//! = auto` uses it: on a veth, a frame sent with `XDP_TX` in driver mode
//! waits on the peer unless the peer runs an XDP program of its own (the
//! refused client sits through SYN retransmits), so a veth gets generic
//! mode, where the RST goes out through the stack.

use std::{fs::File, os::fd::AsRawFd as _};

use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, recv, sendto, socket,
};

const RTM_NEWLINK: u16 = 16;
const RTM_GETLINK: u16 = 18;
const NLM_F_REQUEST: u16 = 1;
const IFLA_IFNAME: u16 = 3;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;
const NLMSG_HEADER: usize = 16;
const IFINFOMSG: usize = 16;

/// The kind of `interface` in `netns`; `None` for a physical NIC, or when
/// the question cannot be answered (then `auto` tries driver mode first).
pub fn kind(netns: &File, interface: &str) -> Option<String> {
    super::env::in_netns(netns, || Ok::<_, super::KernelError>(ask(interface))).ok().flatten()
}

fn ask(interface: &str) -> Option<String> {
    parse(&query(interface).ok()?)
}

/// The kernel's answer to `RTM_GETLINK` for `interface`.
fn query(interface: &str) -> std::io::Result<Vec<u8>> {
    let fd =
        socket(AddressFamily::Netlink, SockType::Raw, SockFlag::SOCK_CLOEXEC, SockProtocol::NetlinkRoute)?;
    sendto(fd.as_raw_fd(), &request(interface), &NetlinkAddr::new(0, 0), MsgFlags::empty())?;
    let mut buf = vec![0u8; 32 * 1024];
    let n = recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty())?;
    buf.truncate(n);
    Ok(buf)
}

/// `RTM_GETLINK` for one interface, by name.
fn request(interface: &str) -> Vec<u8> {
    let name_len = interface.len() + 1;
    let attr_len = 4 + name_len;
    let total = NLMSG_HEADER + IFINFOMSG + attr_len.next_multiple_of(4);
    let mut out = Vec::with_capacity(total);
    out.extend((total as u32).to_ne_bytes());
    out.extend(RTM_GETLINK.to_ne_bytes());
    out.extend(NLM_F_REQUEST.to_ne_bytes());
    out.extend(1u32.to_ne_bytes()); // sequence
    out.extend(0u32.to_ne_bytes()); // port id: the kernel fills it in
    out.extend([0u8; IFINFOMSG]); // AF_UNSPEC, any index: the name decides
    out.extend((attr_len as u16).to_ne_bytes());
    out.extend(IFLA_IFNAME.to_ne_bytes());
    out.extend(interface.as_bytes());
    out.push(0);
    out.resize(total, 0);
    out
}

/// `IFLA_INFO_KIND` from an `RTM_NEWLINK` answer (`None` for an error
/// answer or a link without one).
fn parse(answer: &[u8]) -> Option<String> {
    let u16_at = |b: &[u8], i: usize| b.get(i..i + 2).map(|s| u16::from_ne_bytes([s[0], s[1]]));
    if u16_at(answer, 4)? != RTM_NEWLINK {
        return None;
    }
    let attrs = answer.get(NLMSG_HEADER + IFINFOMSG..)?;
    let linkinfo = attribute(attrs, IFLA_LINKINFO)?;
    let kind = attribute(linkinfo, IFLA_INFO_KIND)?;
    let kind = kind.split(|&b| b == 0).next()?;
    std::str::from_utf8(kind).ok().map(str::to_owned)
}

/// The payload of the first attribute of `kind` in a run of rtattrs.
fn attribute(mut attrs: &[u8], kind: u16) -> Option<&[u8]> {
    while attrs.len() >= 4 {
        let len = usize::from(u16::from_ne_bytes([attrs[0], attrs[1]]));
        let this = u16::from_ne_bytes([attrs[2], attrs[3]]) & 0x3fff; // without the nested/byte-order flags
        if len < 4 || len > attrs.len() {
            return None;
        }
        if this == kind {
            return Some(&attrs[4..len]);
        }
        attrs = attrs.get(len.next_multiple_of(4)..).unwrap_or(&[]);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(kind: u16, payload: &[u8]) -> Vec<u8> {
        let mut out = ((4 + payload.len()) as u16).to_ne_bytes().to_vec();
        out.extend(kind.to_ne_bytes());
        out.extend(payload);
        out.resize(out.len().next_multiple_of(4), 0);
        out
    }

    fn answer(kind: u16, attrs: &[u8]) -> Vec<u8> {
        let mut out = ((NLMSG_HEADER + IFINFOMSG + attrs.len()) as u32).to_ne_bytes().to_vec();
        out.extend(kind.to_ne_bytes());
        out.extend([0u8; 10]);
        out.extend([0u8; IFINFOMSG]);
        out.extend(attrs);
        out
    }

    #[test]
    fn the_kind_is_read_from_the_nested_link_info() {
        let info =
            attr(IFLA_LINKINFO | 0x8000, &[attr(IFLA_INFO_KIND, b"veth\0"), attr(2, b"data")].concat());
        let msg = answer(RTM_NEWLINK, &[attr(IFLA_IFNAME, b"veth0\0"), info].concat());
        assert_eq!(parse(&msg).as_deref(), Some("veth"));
        let physical = answer(RTM_NEWLINK, &attr(IFLA_IFNAME, b"eth0\0"));
        assert_eq!(parse(&physical), None);
        assert_eq!(parse(&answer(2, &[])), None, "an error answer");
        assert_eq!(parse(&msg[..20]), None, "truncated");
    }

    #[test]
    fn the_request_names_the_interface_padded() {
        let r = request("veth0");
        assert_eq!(r.len(), 16 + 16 + 12);
        assert_eq!(u32::from_ne_bytes(r[..4].try_into().unwrap()) as usize, r.len());
        assert_eq!(&r[36..42], b"veth0\0");
    }

    #[test]
    fn the_kernel_answers_the_request_for_loopback_with_its_link() {
        // A real round trip: `lo` comes back as RTM_NEWLINK (a malformed
        // request would come back as NLMSG_ERROR), with no kind.
        let answer = query("lo").expect("rtnetlink answers");
        assert_eq!(u16::from_ne_bytes([answer[4], answer[5]]), RTM_NEWLINK, "{answer:?}");
        assert_eq!(parse(&answer), None, "loopback has no IFLA_INFO_KIND");
        let missing = query("no-such-if0").expect("rtnetlink answers");
        assert_eq!(u16::from_ne_bytes([missing[4], missing[5]]), 2, "an unknown name is an NLMSG_ERROR");
        assert_eq!(ask("no-such-if0"), None);
    }
}
