//! A second network namespace joined to a [`Sandbox`] by a veth pair: the
//! client side of tests that need a real interface between client and
//! server (XDP runs on the server's end of the pair).

use std::{
    fs::File,
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream},
    process::Command,
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

use anyhow::{Context as _, Result};

use crate::{Sandbox, run};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// The client namespace, the veth pair and their addresses.
pub struct Peer {
    pub ns: String,
    netns: File,
    /// The server's end, in the sandbox's namespace.
    pub server_if: String,
    /// The client's end, in [`Peer::ns`].
    pub client_if: String,
    pub server_v4: Ipv4Addr,
    pub client_v4: Ipv4Addr,
    pub server_v6: Ipv6Addr,
    pub client_v6: Ipv6Addr,
    /// Subnet number `n` of 10.77.n.0/24 and fd77:n::/64.
    pub n: u8,
}

impl Sandbox {
    /// Creates the client namespace and the veth pair (created inside the
    /// sandbox's namespace, so nothing touches the host's).
    pub fn peer(&self) -> Result<Peer> {
        let n = (NEXT.fetch_add(1, Ordering::Relaxed) % 200 + 1) as u8;
        let ns = format!("{}-c", self.name);
        let tag = std::process::id() % 100_000;
        let server_if = format!("ls{tag}-{n}");
        let client_if = format!("lc{tag}-{n}");
        run("ip", &["netns", "add", &ns])?;
        let peer = Peer {
            netns: File::open(format!("/var/run/netns/{ns}")).context("open client netns")?,
            ns,
            server_if,
            client_if,
            server_v4: Ipv4Addr::new(10, 77, n, 1),
            client_v4: Ipv4Addr::new(10, 77, n, 2),
            server_v6: format!("fd77:{n}::1").parse()?,
            client_v6: format!("fd77:{n}::2").parse()?,
            n,
        };
        let (sb, c) = (self.name.as_str(), peer.ns.as_str());
        let (s_if, c_if) = (peer.server_if.as_str(), peer.client_if.as_str());
        run("ip", &["-n", c, "link", "set", "lo", "up"])?;
        run("ip", &["-n", sb, "link", "add", s_if, "type", "veth", "peer", "name", c_if, "netns", c])?;
        run("ip", &["-n", sb, "addr", "add", &format!("10.77.{n}.1/24"), "dev", s_if])?;
        run("ip", &["-n", sb, "-6", "addr", "add", &format!("fd77:{n}::1/64"), "dev", s_if, "nodad"])?;
        run("ip", &["-n", c, "addr", "add", &format!("10.77.{n}.2/24"), "dev", c_if])?;
        run("ip", &["-n", c, "-6", "addr", "add", &format!("fd77:{n}::2/64"), "dev", c_if, "nodad"])?;
        run("ip", &["-n", sb, "link", "set", s_if, "up"])?;
        run("ip", &["-n", c, "link", "set", c_if, "up"])?;
        Ok(peer)
    }
}

impl Peer {
    /// Adds an address on the client's end (`10.77.n.9/24`, `fd77:n::9/64`).
    pub fn add_client_addr(&self, cidr: &str) -> Result<()> {
        let mut args = vec!["-n", &self.ns];
        if cidr.contains(':') {
            args.push("-6");
        }
        args.extend(["addr", "add", cidr, "dev", &self.client_if]);
        if cidr.contains(':') {
            args.push("nodad");
        }
        run("ip", &args).map(drop)
    }

    /// Lets the client bind any address of `prefix` (an IPv6 "AnyIP" local
    /// route) and the server route replies to it over the veth.
    pub fn client_prefix_v6(&self, sandbox: &Sandbox, prefix: &str) -> Result<()> {
        run("ip", &["-n", &self.ns, "-6", "route", "add", "local", prefix, "dev", "lo"])?;
        run("ip", &["-n", &sandbox.name, "-6", "route", "add", prefix, "via", &self.client_v6.to_string()])
            .map(drop)
    }

    /// Turns checksum offload off on both ends, so every checksum on the
    /// wire is computed in full.
    pub fn checksum_offload_off(&self, sandbox: &Sandbox) -> Result<()> {
        run(
            "ip",
            &["netns", "exec", &sandbox.name, "ethtool", "-K", &self.server_if, "tx", "off", "rx", "off"],
        )?;
        run("ip", &["netns", "exec", &self.ns, "ethtool", "-K", &self.client_if, "tx", "off", "rx", "off"])
            .map(drop)
    }

    /// Attaches XDP program `prog_id` (driver mode) to the client's end.
    ///
    /// A veth end that sends a frame with `XDP_TX` in driver mode puts it
    /// on its peer's ring but wakes the peer only if the peer runs an XDP
    /// program itself (kernel 6.18, `veth_xdp_flush`); otherwise the frame
    /// waits until other traffic wakes the peer, and a refused client can
    /// sit through SYN retransmits. The gate's own program passes
    /// everything that is not a SYN to a limited port, which the client's
    /// end never receives, so it serves as that program.
    pub fn wake_on_xdp_tx(&self, prog_id: u32) -> Result<()> {
        run(
            "ip",
            &[
                "netns",
                "exec",
                &self.ns,
                "bpftool",
                "net",
                "attach",
                "xdpdrv",
                "id",
                &prog_id.to_string(),
                "dev",
                &self.client_if,
            ],
        )
        .map(drop)
    }

    /// A new handle on the client namespace, for threads that enter it.
    pub fn netns_file(&self) -> File {
        self.netns.try_clone().expect("dup netns fd")
    }

    /// The server end's ifindex and MAC, as the sandbox's namespace sees them.
    pub fn server_link(&self, sandbox: &Sandbox) -> Result<(u32, [u8; 6])> {
        let out = run("ip", &["-n", &sandbox.name, "-j", "link", "show", "dev", &self.server_if])?;
        let v: serde_json::Value = serde_json::from_str(&out)?;
        let index = v[0]["ifindex"].as_u64().context("ifindex")? as u32;
        let text = v[0]["address"].as_str().context("address")?;
        let mut mac = [0u8; 6];
        for (b, h) in mac.iter_mut().zip(text.split(':')) {
            *b = u8::from_str_radix(h, 16)?;
        }
        Ok((index, mac))
    }

    /// Runs `f` on a thread inside the client namespace.
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        crate::in_netns(&self.netns, f)
    }

    /// A connection from the client namespace, from `src` if given.
    pub fn connect(&self, dst: SocketAddr, src: Option<IpAddr>) -> io::Result<TcpStream> {
        self.run(move || connect_from(dst, src))
    }
}

/// A blocking connect with a 3 s timeout, bound to `src` if given.
pub fn connect_from(dst: SocketAddr, src: Option<IpAddr>) -> io::Result<TcpStream> {
    let s = socket2::Socket::new(socket2::Domain::for_address(dst), socket2::Type::STREAM, None)?;
    if let Some(src) = src {
        // Addresses of a local route (AnyIP) are not configured ones.
        if src.is_ipv6() {
            s.set_freebind_ipv6(true)?;
        }
        s.bind(&SocketAddr::new(src, 0).into())?;
    }
    s.connect_timeout(&dst.into(), Duration::from_secs(3))?;
    Ok(s.into())
}

impl Drop for Peer {
    fn drop(&mut self) {
        // Deleting the namespace deletes its veth end, and with it the pair.
        let _ = crate::process::try_run_with_deadline(
            Command::new("ip").args(["netns", "del", &self.ns]),
            crate::process::DEADLINE,
        );
    }
}

/// `addr:port` as a socket address.
pub fn sa(addr: impl Into<IpAddr>, port: u16) -> SocketAddr {
    SocketAddr::new(addr.into(), port)
}
