//! The gate at the NIC and past connlimit: XDP refusal with a crafted RST,
//! hostile frames, per-source caps, trusted prefixes, dry-run ports and
//! connections older than the gate. Two network namespaces joined by a veth
//! pair; the daemon gates the server's. Run one at a time.

use std::{
    io::ErrorKind,
    net::{IpAddr, Ipv6Addr, TcpListener, TcpStream},
    time::{Duration, Instant},
};

use limiter_tests::{
    bpf,
    packet::{self, ACK, Capture, RST, SYN, Segment},
    peer::{Peer, connect_from, sa},
    port_row as row,
    process::{DEADLINE, limiter_with_deadline, terminate, wait_for},
    *,
};
use serde_json::Value;

const XDP_PASS: u32 = 2;
const XDP_TX: u32 = 3;

/// A sandbox with a peer, and a config gating `ports` with XDP on the
/// server's end of the veth.
fn setup(ports: &str, extra: &str) -> (Sandbox, Peer, std::path::PathBuf) {
    let sb = Sandbox::new().unwrap();
    let peer = sb.peer().unwrap();
    let config = sb.config(ports, &format!("kernel.xdp.interfaces = {}\n{extra}", peer.server_if));
    (sb, peer, config)
}

/// Starts the daemon and makes the client's veth end wake for frames the
/// server's end sends with XDP_TX (see [`Peer::wake_on_xdp_tx`]).
fn start(sb: &Sandbox, peer: &Peer, config: &std::path::Path) -> Daemon {
    let daemon = Daemon::start(config, &[]).unwrap();
    let id = link_program(&dump(&sb.pin_path), &format!("link_xdp_{}", peer.server_if));
    peer.wake_on_xdp_tx(id).unwrap();
    daemon
}

fn refusals(d: &Value, port: u16) -> Value {
    row(d, port)["refused_by"].clone()
}

/// Accepts one connection (blocking, 3 s).
fn accept(l: &TcpListener) -> TcpStream {
    l.set_nonblocking(false).unwrap();
    l.accept().unwrap().0
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn xdp_refuses_at_the_driver_and_sk_lookup_never_sees_the_syn() {
    require_kernel!();
    let p = free_port();
    let (sb, peer, config) = setup(&format!("{p}:2"), "");
    let daemon = start(&sb, &peer, &config);
    let log = daemon.log();
    assert!(
        log.contains("XDP refusal attached") && log.contains(&peer.server_if),
        "the log names the interface and mode:\n{log}"
    );
    let l4 = sb.listen(&format!("0.0.0.0:{p}"), 128);
    let l6 = sb.listen(&format!("[::]:{p}"), 128);
    let mut c1 = peer.connect(sa(peer.server_v4, p), None).unwrap();
    let mut s1 = accept(&l4);
    let mut c2 = peer.connect(sa(peer.server_v6, p), None).unwrap();
    let mut s2 = accept(&l6);
    wait_established(&sb.pin_path, p, 2);

    let d = dump(&sb.pin_path);
    let sk_lookup = link_program(&d, "link_sk_lookup");
    let xdp = link_program(&d, &format!("link_xdp_{}", peer.server_if));
    let _stats = bpf::enable_stats().unwrap();
    for server in [IpAddr::from(peer.server_v4), IpAddr::from(peer.server_v6)] {
        let (lookups, xdp_runs) = (run_count(sk_lookup, &_stats), run_count(xdp, &_stats));
        let started = Instant::now();
        let err = peer.connect(sa(server, p), None).unwrap_err();
        let took = started.elapsed();
        assert_eq!(err.kind(), ErrorKind::ConnectionRefused, "{server}: {err}");
        assert!(took < Duration::from_millis(500), "{server}: refused after {took:?}");
        assert_eq!(run_count(sk_lookup, &_stats), lookups, "{server}: the SYN reached sk_lookup");
        assert!(run_count(xdp, &_stats) > xdp_runs, "{server}: the XDP program did not run");
    }
    let r = refusals(&dump(&sb.pin_path), p);
    assert_eq!(
        (r["xdp"].as_u64(), r["sk_lookup"].as_u64(), r["port_full"].as_u64()),
        (Some(2), Some(0), Some(2))
    );

    // Loopback never crosses the veth: sk_lookup refuses there, same limit.
    assert_eq!(sb.connect(&format!("127.0.0.1:{p}")).unwrap_err().kind(), ErrorKind::ConnectionRefused);
    let r = refusals(&dump(&sb.pin_path), p);
    assert_eq!((r["xdp"].as_u64(), r["sk_lookup"].as_u64()), (Some(2), Some(1)));

    // Established flows (non-SYN traffic through the XDP program) still work.
    assert!(carries_data(&mut c1, &mut s1) && carries_data(&mut s1, &mut c1));
    assert!(carries_data(&mut c2, &mut s2) && carries_data(&mut s2, &mut c2));
    drop((c1, s1, c2, s2));
    wait_established(&sb.pin_path, p, 0);
    // Room again: the next SYN passes XDP and connects.
    let _c = peer.connect(sa(peer.server_v4, p), None).unwrap();
    let metrics = daemon.metrics();
    for line in [
        format!("limiter_kernel_refused_total{{port=\"{p}\",reason=\"port_full\",path=\"xdp\"}} 2"),
        format!("limiter_kernel_refused_total{{port=\"{p}\",reason=\"port_full\",path=\"sk_lookup\"}} 1"),
        format!("limiter_kernel_xdp_attached{{interface=\"{}\"}} 1", peer.server_if),
    ] {
        assert!(metrics.lines().any(|l| l == line), "missing `{line}` in\n{metrics}");
    }
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn the_default_mode_on_a_veth_refuses_without_anything_on_the_peer() {
    require_kernel!();
    let p = free_port();
    // kernel.xdp.mode left at auto, and nothing attached to the client's end.
    let (sb, peer, config) = setup(&format!("{p}:1"), "");
    let daemon = Daemon::start(&config, &[]).unwrap();
    let log = daemon.log();
    assert!(
        log.contains("XDP refusal attached in generic mode") && log.contains("a veth"),
        "the log says why:\n{log}"
    );
    let l4 = sb.listen(&format!("0.0.0.0:{p}"), 128);
    let _c1 = peer.connect(sa(peer.server_v4, p), None).unwrap();
    let _s1 = accept(&l4);
    wait_established(&sb.pin_path, p, 1);
    let started = Instant::now();
    let err = peer.connect(sa(peer.server_v4, p), None).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused, "{err}");
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "refused after {:?}, not a timeout",
        started.elapsed()
    );
    assert_eq!(refusals(&dump(&sb.pin_path), p)["xdp"].as_u64(), Some(1), "refused by XDP");
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn the_crafted_rst_is_correct_on_the_wire_for_ipv4_and_ipv6() {
    require_kernel!();
    let p = free_port();
    let (sb, peer, config) = setup(&format!("{p}:1"), "");
    peer.checksum_offload_off(&sb).unwrap();
    let _daemon = start(&sb, &peer, &config);
    let l4 = sb.listen(&format!("0.0.0.0:{p}"), 128);
    let _l6 = sb.listen(&format!("[::]:{p}"), 128);
    let _held = peer.connect(sa(peer.server_v4, p), None).unwrap();
    let _held_server = accept(&l4);
    wait_established(&sb.pin_path, p, 1);

    for server in [IpAddr::from(peer.server_v4), IpAddr::from(peer.server_v6)] {
        let interface = peer.client_if.clone();
        let capture = peer.run(move || Capture::open(&interface)).unwrap();
        let err = peer.connect(sa(server, p), None).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ConnectionRefused);
        let (frames, found) = capture.until(Duration::from_secs(2), |f| {
            packet::parse(f).is_some_and(|x| x.flags & RST != 0 && x.sport == p)
        });
        assert!(found, "{server}: no RST captured among {} frames", frames.len());
        let parsed: Vec<_> = frames.iter().filter_map(|f| packet::parse(f)).collect();
        let syn = parsed.iter().find(|x| x.flags == SYN && x.dport == p).expect("the SYN was captured");
        let rst = parsed.last().unwrap();
        // The test's own checksum code agrees with the kernel's on the SYN
        // (offload off: computed in full), so it can judge the RST.
        assert!(syn.ip_checksum_ok && syn.tcp_checksum_ok, "{server}: kernel SYN checksums: {syn:?}");
        assert!(rst.ip_checksum_ok, "{server}: IPv4 header checksum of the RST: {rst:?}");
        assert!(rst.tcp_checksum_ok, "{server}: TCP checksum of the RST: {rst:?}");
        assert!(rst.exact_length && rst.header_len == 20 && rst.payload_len == 0, "{rst:?}");
        // RFC 9293: a reset for a segment without ACK: <SEQ=0><ACK=SEG.SEQ+SEG.LEN><CTL=RST,ACK>.
        assert_eq!(rst.flags, RST | ACK);
        assert_eq!(rst.seq, 0);
        assert_eq!(rst.ack, syn.seq.wrapping_add(1 + syn.payload_len as u32));
        assert_eq!(rst.window, 0);
        assert_eq!((rst.src, rst.dst, rst.sport, rst.dport), (syn.dst, syn.src, syn.dport, syn.sport));
        assert_eq!((rst.src_mac, rst.dst_mac), (syn.dst_mac, syn.src_mac));
        assert_eq!(rst.ttl, 64);
    }
    let r = refusals(&dump(&sb.pin_path), p);
    assert_eq!((r["xdp"].as_u64(), r["sk_lookup"].as_u64()), (Some(2), Some(0)));
}

/// The XDP program's fd, from the daemon's pinned link.
fn xdp_prog(sb: &Sandbox, peer: &Peer) -> std::os::fd::OwnedFd {
    let id = link_program(&dump(&sb.pin_path), &format!("link_xdp_{}", peer.server_if));
    bpf::prog_fd(id).unwrap()
}

fn with_ip_options(good: &[u8]) -> Vec<u8> {
    // IHL 6: four bytes of options (NOPs) after the fixed header.
    let mut f = good[..34].to_vec();
    f.extend_from_slice(&[1, 1, 1, 1]);
    f.extend_from_slice(&good[34..]);
    f[14] = 0x46;
    let total = u16::from_be_bytes([f[16], f[17]]) + 4;
    f[16..18].copy_from_slice(&total.to_be_bytes());
    f[24..26].copy_from_slice(&[0, 0]);
    let c = packet::fold(packet::sum(&f[14..38], 0));
    f[24..26].copy_from_slice(&c.to_be_bytes());
    f
}

fn ipv4_field(good: &[u8], at: usize, bytes: &[u8]) -> Vec<u8> {
    let mut f = good.to_vec();
    f[14 + at..14 + at + bytes.len()].copy_from_slice(bytes);
    f[24..26].copy_from_slice(&[0, 0]);
    let c = packet::fold(packet::sum(&f[14..34], 0));
    f[24..26].copy_from_slice(&c.to_be_bytes());
    f
}

fn with_v6_extension(good6: &[u8], next: u8) -> Vec<u8> {
    // An 8-byte extension header (hop-by-hop, routing, fragment,
    // destination options) between the IPv6 header and TCP.
    let mut f = good6[..54].to_vec();
    f[20] = next;
    f.extend_from_slice(&[6, 0, 0, 0, 0, 0, 0, 0]);
    f.extend_from_slice(&good6[54..]);
    let payload = u16::from_be_bytes([f[18], f[19]]) + 8;
    f[18..20].copy_from_slice(&payload.to_be_bytes());
    f
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn hostile_frames_pass_untouched_and_a_syn_to_a_full_port_becomes_a_rst() {
    require_kernel!();
    let p = free_port();
    let (sb, peer, config) = setup(&format!("{p}:1"), "");
    let _daemon = start(&sb, &peer, &config);
    let l = sb.listen(&format!("0.0.0.0:{p}"), 128);
    let _held = peer.connect(sa(peer.server_v4, p), None).unwrap();
    let _held_server = accept(&l);
    wait_established(&sb.pin_path, p, 1);
    let prog = std::sync::Arc::new(xdp_prog(&sb, &peer));
    // Frames arrive on the server's veth end and are addressed to its MAC;
    // the namespace forwards, so "not for a local address" is decided by
    // the routing table, not by a host that forwards nothing.
    let (ifindex, mac) = peer.server_link(&sb).unwrap();
    let forwarding = |on: u8| {
        for key in [format!("net.ipv4.ip_forward={on}"), format!("net.ipv6.conf.all.forwarding={on}")] {
            run("ip", &["netns", "exec", &sb.name, "sysctl", "-q", "-w", &key]).unwrap();
        }
    };
    forwarding(1);
    // A host behind the client, reached through the namespace.
    run("ip", &["-n", &sb.name, "route", "add", "198.51.100.0/24", "via", &peer.client_v4.to_string()])
        .unwrap();
    run("ip", &["-n", &sb.name, "-6", "route", "add", "2001:db8::/64", "via", &peer.client_v6.to_string()])
        .unwrap();
    let run_on = |frame: Vec<u8>| {
        let prog = prog.clone();
        sb.in_netns(move || bpf::test_run_on(&prog, &frame, 1, Some(ifindex)))
    };
    let addressed = |mut f: Vec<u8>| {
        f[..6].copy_from_slice(&mac);
        f
    };

    let (c4, s4) = (IpAddr::from(peer.client_v4), IpAddr::from(peer.server_v4));
    let (c6, s6) = (IpAddr::from(peer.client_v6), IpAddr::from(peer.server_v6));
    let mss = [2, 4, 0x05, 0xb4];
    let seg = |flags, dport, payload: &'static [u8]| Segment {
        sport: 40_000,
        dport,
        seq: 0xfffffff0,
        ack: 0,
        flags,
        options: &mss,
        payload,
    };
    let good4 = addressed(packet::frame(c4, s4, &seg(SYN, p, b"")));
    let good6 = addressed(packet::frame(c6, s6, &seg(SYN, p, b"")));

    // The positive controls: SYNs to the full port become RSTs, with or
    // without data (TFO), IPv4 and IPv6.
    for (frame, len, data) in [
        (good4.clone(), 54, 0),
        (good6.clone(), 74, 0),
        (addressed(packet::frame(c4, s4, &seg(SYN, p, b"hello"))), 54, 5),
        (addressed(packet::frame(c6, s6, &seg(SYN, p, b"hello"))), 74, 5),
    ] {
        let out = run_on(frame.clone()).unwrap();
        assert_eq!(out.retval, XDP_TX, "a SYN to the full port must be answered");
        assert_eq!(out.data.len(), len);
        let rst = packet::parse(&out.data).unwrap();
        let syn = packet::parse(&frame).unwrap();
        assert!(rst.ip_checksum_ok && rst.tcp_checksum_ok && rst.exact_length, "{rst:?}");
        assert_eq!((rst.flags, rst.seq), (RST | ACK, 0));
        assert_eq!(rst.ack, syn.seq.wrapping_add(1 + data), "ACK = SEG.SEQ + SEG.LEN (wraps)");
        assert_eq!((rst.src, rst.dst, rst.sport, rst.dport), (syn.dst, syn.src, p, 40_000));
    }

    let mut hostile: Vec<(String, Vec<u8>)> = Vec::new();
    for (name, good) in [("ipv4", &good4), ("ipv6", &good6)] {
        for cut in 14..good.len() {
            hostile.push((format!("{name} truncated to {cut} bytes"), good[..cut].to_vec()));
        }
    }
    let n = good4.len();
    hostile.extend([
        ("ipv4 options".into(), with_ip_options(&good4)),
        ("ipv4 more-fragments".into(), ipv4_field(&good4, 6, &[0x20, 0])),
        ("ipv4 fragment offset".into(), ipv4_field(&good4, 6, &[0, 8])),
        (
            "ipv4 total length past the frame".into(),
            ipv4_field(&good4, 2, &((n - 14 + 1) as u16).to_be_bytes()),
        ),
        ("ipv4 total length shorter than its headers".into(), ipv4_field(&good4, 2, &39u16.to_be_bytes())),
        ("ipv4 total length 0".into(), ipv4_field(&good4, 2, &[0, 0])),
        ("ipv4 version 6 in an IPv4 frame".into(), ipv4_field(&good4, 0, &[0x65])),
        ("ipv4 UDP".into(), ipv4_field(&good4, 9, &[17])),
        ("ipv6 hop-by-hop header".into(), with_v6_extension(&good6, 0)),
        ("ipv6 routing header".into(), with_v6_extension(&good6, 43)),
        ("ipv6 fragment header".into(), with_v6_extension(&good6, 44)),
        ("ipv6 destination options".into(), with_v6_extension(&good6, 60)),
        ("ipv6 payload length past the frame".into(), {
            let mut f = good6.clone();
            f[18..20].copy_from_slice(&((good6.len() - 54 + 1) as u16).to_be_bytes());
            f
        }),
        ("ipv6 payload length 0".into(), {
            let mut f = good6.clone();
            f[18..20].copy_from_slice(&[0, 0]);
            f
        }),
        ("vlan-tagged SYN".into(), {
            let mut f = good4[..12].to_vec();
            f.extend_from_slice(&[0x81, 0x00, 0x00, 0x07]);
            f.extend_from_slice(&good4[12..]);
            f
        }),
        ("ARP".into(), {
            let mut f = good4.clone();
            f[12..14].copy_from_slice(&[0x08, 0x06]);
            f
        }),
        ("tcp data offset 4".into(), {
            let mut f = good4.clone();
            f[46] = 4 << 4;
            f
        }),
        ("tcp data offset past the segment".into(), {
            let mut f = good4.clone();
            f[46] = 15 << 4;
            f
        }),
    ]);
    for (flags, what) in
        [(SYN | ACK, "SYN-ACK"), (ACK, "ACK"), (RST, "RST"), (SYN | RST, "SYN+RST"), (SYN | 0x01, "SYN+FIN")]
    {
        hostile.push((
            format!("ipv4 {what} to the full port"),
            addressed(packet::frame(c4, s4, &seg(flags, p, b""))),
        ));
        hostile.push((
            format!("ipv6 {what} to the full port"),
            addressed(packet::frame(c6, s6, &seg(flags, p, b""))),
        ));
    }
    hostile.push((
        "ipv4 SYN to an unlimited port".into(),
        addressed(packet::frame(c4, s4, &seg(SYN, p ^ 1, b""))),
    ));
    hostile.push((
        "ipv6 SYN to an unlimited port".into(),
        addressed(packet::frame(c6, s6, &seg(SYN, p ^ 1, b""))),
    ));
    // Not for this host: another MAC (a bridge port, a promiscuous
    // interface), a broadcast, an address the host would route onwards.
    hostile.push((
        "ipv4 SYN to the full port for another host's MAC".into(),
        packet::frame(c4, s4, &seg(SYN, p, b"")),
    ));
    hostile.push(("ipv4 SYN to the full port, broadcast MAC".into(), {
        let mut f = good4.clone();
        f[..6].copy_from_slice(&[0xff; 6]);
        f
    }));
    let elsewhere4: IpAddr = "198.51.100.7".parse().unwrap();
    let elsewhere6: IpAddr = "2001:db8::7".parse().unwrap();
    hostile.push((
        "ipv4 SYN to port p of an address routed elsewhere".into(),
        addressed(packet::frame(c4, elsewhere4, &seg(SYN, p, b""))),
    ));
    hostile.push((
        "ipv6 SYN to port p of an address routed elsewhere".into(),
        addressed(packet::frame(c6, elsewhere6, &seg(SYN, p, b""))),
    ));

    for (name, frame) in &hostile {
        let out = run_on(frame.clone()).unwrap_or_else(|e| panic!("{name}: test run failed: {e}"));
        assert_eq!(out.retval, XDP_PASS, "{name}: must pass");
        assert_eq!(&out.data, frame, "{name}: must pass unmodified");
    }
    eprintln!("{} hostile frames passed untouched", hostile.len());
    // None of them counted as a refusal; the four controls did.
    assert_eq!(refusals(&dump(&sb.pin_path), p)["xdp"], 4);
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn per_source_caps_and_trusted_prefixes_count_exactly_for_dual_stack_clients() {
    require_kernel!();
    let (p, q) = (free_port(), free_port());
    let sb = Sandbox::new().unwrap();
    let peer = sb.peer().unwrap();
    let n = peer.n;
    let trusted = format!("10.77.{n}.9");
    peer.add_client_addr(&format!("{trusted}/24")).unwrap();
    peer.add_client_addr(&format!("fd77:{n}::3/64")).unwrap();
    let config = sb.config(
        &format!("{p}:100, {q}:2"),
        &format!(
            "kernel.xdp.interfaces = {}\nkernel.port.{p}.perSourceMax = 2\nkernel.trusted = {trusted}/32, fd99::/16\nkernel.trustedReserve = 2\n",
            peer.server_if
        ),
    );
    let _daemon = start(&sb, &peer, &config);
    let lp = sb.listen_dual_stack(p, 128);
    let lq = sb.listen_dual_stack(q, 128);
    let (v4, v6) = (IpAddr::from(peer.server_v4), IpAddr::from(peer.server_v6));
    let other6: IpAddr = format!("fd77:{n}::3").parse().unwrap();
    let trusted: IpAddr = trusted.parse().unwrap();
    let mut held = Vec::new();
    let mut open = |dst: IpAddr, port: u16, src: Option<IpAddr>, l: &TcpListener| {
        let c = peer.connect(sa(dst, port), src)?;
        held.push((c, accept(l)));
        Ok::<(), std::io::Error>(())
    };
    let refused = |r: std::io::Result<()>| matches!(r, Err(e) if e.kind() == ErrorKind::ConnectionRefused);

    // IPv4 clients reach the dual-stack listener as ::ffff:a.b.c.d; the
    // kernel counts them as IPv4, as the refusal paths see them.
    open(v4, p, None, &lp).unwrap();
    open(v4, p, None, &lp).unwrap();
    assert!(refused(open(v4, p, None, &lp)), "third from one IPv4 client");
    // One /64 is one group: ::2 and ::3 share the cap.
    open(v6, p, None, &lp).unwrap();
    open(v6, p, Some(other6), &lp).unwrap();
    let third = open(v6, p, Some(other6), &lp);
    let why = format!("{third:?}");
    assert!(refused(third), "third from one IPv6 /64: {why} {}", dump(&sb.pin_path)["kernel"]);
    // A trusted client passes the per-source cap.
    for _ in 0..3 {
        open(v4, p, Some(trusted), &lp).unwrap();
    }
    wait_established(&sb.pin_path, p, 7);
    let d = dump(&sb.pin_path);
    let r = row(&d, p);
    assert_eq!(r["refused_by"]["source_full"], 2);
    assert_eq!(r["refused_by"]["xdp"], 2);
    assert_eq!(r["trusted_admitted"], 1);
    assert_eq!(r["sources"], 3);
    let mut groups: Vec<(String, u64)> = d["kernel"]["top_sources"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g["port"] == p)
        .map(|g| (g["group"].as_str().unwrap().to_owned(), g["established"].as_u64().unwrap()))
        .collect();
    groups.sort();
    assert_eq!(
        groups,
        vec![(format!("10.77.{n}.2/32"), 2), (format!("10.77.{n}.9/32"), 3), (format!("fd77:{n}::/64"), 2),]
    );

    // The trusted reserve: port q holds 2, trusted clients get 2 more.
    open(v4, q, None, &lq).unwrap();
    open(v6, q, None, &lq).unwrap();
    assert!(refused(open(v4, q, None, &lq)), "a full port refuses an untrusted client");
    open(v4, q, Some(trusted), &lq).unwrap();
    open(v4, q, Some(trusted), &lq).unwrap();
    assert!(refused(open(v4, q, Some(trusted), &lq)), "the reserve is 2");
    wait_established(&sb.pin_path, q, 4);
    let r = row(&dump(&sb.pin_path), q);
    assert_eq!((r["refused_by"]["port_full"].as_u64(), r["trusted_admitted"].as_u64()), (Some(2), Some(2)));

    drop(held);
    wait_established(&sb.pin_path, p, 0);
    wait_established(&sb.pin_path, q, 0);
    let d = dump(&sb.pin_path);
    assert_eq!(d["kernel"]["source_slots_used"], 0, "every group's slot back to 0");
    assert_eq!(d["kernel"]["untracked_sources"], 0);
    // Room again for the same clients.
    let c = peer.connect(sa(v4, p), None).unwrap();
    drop(c);
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn a_full_source_table_refuses_new_sources_over_100k_distinct_sources() {
    require_kernel!();
    raise_fd_limit();
    let p = free_port();
    let (sb, peer, config) = setup(
        &format!("{p}:1000000"),
        &format!(
            "kernel.port.{p}.perSourceMax = 1\nkernel.sourcePrefixV6 = 128\nkernel.sourceTableSize = 1024\n"
        ),
    );
    let n = peer.n;
    peer.client_prefix_v6(&sb, &format!("fd78:{n}::/64")).unwrap();
    let _daemon = start(&sb, &peer, &config);
    let l = sb.listen(&format!("[::]:{p}"), 4096);
    let server = sa(peer.server_v6, p);
    // Warm the path first (neighbour entries both ways), from an address
    // outside the waves' range: a first SYN-ACK that waits on neighbour
    // discovery once took longer than a wave's 3 s connect timeout.
    let warm: std::net::IpAddr = format!("fd78:{n}::ffff:ffff").parse().unwrap();
    let first = peer
        .run(move || (0..3).find_map(|_| connect_from(server, Some(warm)).ok()).expect("warm-up connection"));
    drop(accept_n(&l, 1));
    drop(first);
    wait_established(&sb.pin_path, p, 0);
    let admitted_before = row(&dump(&sb.pin_path), p)["admitted"].as_u64().unwrap();
    const SOURCES: u32 = 100_000;
    const WAVE: u32 = 1_250;
    let started = Instant::now();
    let (mut total_ok, mut total_refused, mut most) = (0u64, 0u64, 0u64);
    let mut next = 1u32;
    while next <= SOURCES {
        let first = next;
        let last = (first + WAVE - 1).min(SOURCES);
        next = last + 1;
        let (ok, refused): (Vec<TcpStream>, u64) = peer.run(move || {
            let mut ok = Vec::new();
            let mut refused = 0;
            for i in first..=last {
                let src = Ipv6Addr::new(0xfd78, u16::from(n), 0, 0, 0, 0, (i >> 16) as u16, i as u16);
                match connect_from(server, Some(src.into())) {
                    Ok(s) => ok.push(s),
                    Err(e) if e.kind() == ErrorKind::ConnectionRefused => refused += 1,
                    Err(e) => panic!("source {src}: neither admitted nor refused: {e}"),
                }
            }
            (ok, refused)
        });
        let admitted = ok.len() as u64;
        assert!(admitted <= 1024, "more groups admitted ({admitted}) than the table has slots");
        let servers = accept_n(&l, ok.len());
        let d = dump(&sb.pin_path);
        assert_eq!(row(&d, p)["established"], admitted);
        assert!(d["kernel"]["source_slots_used"].as_u64().unwrap() <= 1024);
        most = most.max(admitted);
        total_ok += admitted;
        total_refused += refused;
        drop(ok);
        drop(servers);
        wait_established(&sb.pin_path, p, 0);
    }
    let d = dump(&sb.pin_path);
    let r = row(&d, p);
    eprintln!(
        "{SOURCES} sources in {:?}: {total_ok} admitted, {total_refused} refused (table full), \
         at most {most} groups at once in 1024 slots, {} untracked",
        started.elapsed(),
        d["kernel"]["untracked_sources"]
    );
    assert!(total_refused > 0, "the waves overfill the table, so the policy must have refused");
    // What the gate counted is what the clients saw: every admitted
    // connection a handshake, every refusal a full table.
    assert_eq!(r["admitted"].as_u64().unwrap() - admitted_before, total_ok);
    assert_eq!(r["refused"], total_refused);
    assert_eq!(r["refused_by"]["source_table_full"], total_refused);
    assert_eq!(r["refused_by"]["source_full"], 0);
    assert_eq!(r["established"], 0);
    assert_eq!(d["kernel"]["source_slots_used"], 0);
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn a_dry_run_port_refuses_nothing_and_counts_what_it_would_have() {
    require_kernel!();
    let p = free_port();
    let (sb, peer, config) = setup(&format!("{p}:1"), &format!("kernel.port.{p}.dryRun = true\n"));
    let daemon = start(&sb, &peer, &config);
    let l = sb.listen(&format!("0.0.0.0:{p}"), 128);
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(sb.connect(&format!("127.0.0.1:{p}")).expect("dry-run refuses nothing (sk_lookup)"));
    }
    held.push(peer.connect(sa(peer.server_v4, p), None).expect("dry-run refuses nothing (xdp)"));
    let servers = accept_n(&l, 4);
    let view = wait_established(&sb.pin_path, p, 4);
    assert_eq!(view.refused, 0);
    let r = row(&dump(&sb.pin_path), p);
    assert_eq!((r["dry_run"].as_bool(), r["would_refuse"].as_u64()), (Some(true), Some(3)));
    assert_eq!(r["would_refuse_by"]["port_full"], 3);
    let line = format!("limiter_kernel_would_refuse_total{{port=\"{p}\",reason=\"port_full\"}} 3");
    assert!(daemon.metrics().lines().any(|l| l == line), "missing {line}");
    drop((held, servers));
    wait_established(&sb.pin_path, p, 0);
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn connections_older_than_the_gate_are_counted_and_uncounted() {
    require_kernel!();
    let p = free_port();
    let sb = Sandbox::new().unwrap();
    let l = sb.listen(&format!("127.0.0.1:{p}"), 128);
    let l6 = sb.listen(&format!("[::1]:{p}"), 128);
    // Before the gate: 4 IPv4 and 1 IPv6 established, and one whose client
    // has closed (CLOSE_WAIT: still an open fd on the server).
    let mut clients: Vec<TcpStream> =
        (0..4).map(|_| sb.connect(&format!("127.0.0.1:{p}")).unwrap()).collect();
    let mut servers = accept_n(&l, 4);
    clients.push(sb.connect(&format!("[::1]:{p}")).unwrap());
    servers.extend(accept_n(&l6, 1));
    let half = sb.connect(&format!("127.0.0.1:{p}")).unwrap();
    let half_server = accept_n(&l, 1).pop().unwrap();
    drop(half);
    // An unaccepted one too: established in the accept queue.
    let queued = sb.connect(&format!("127.0.0.1:{p}")).unwrap();
    // Connections of a listener outside the gated cgroup are not the gate's
    // to count (sock_ops never sees them), before or after.
    let q = free_port();
    let outside = sb.listen_uncounted(&format!("127.0.0.1:{q}"));
    let outside_pair = (sb.connect(&format!("127.0.0.1:{q}")).unwrap(), accept_n(&outside, 1));

    let config = sb.config(&format!("{p}:8"), "");
    let mut daemon = Daemon::start(&config, &[]).unwrap();
    assert!(daemon.log().contains("preexisting_connections_counted=7"), "{}", daemon.log());
    let view = wait_established(&sb.pin_path, p, 7);
    assert_eq!(view.admitted, 0, "walked connections are not handshakes the gate saw");
    assert_eq!(dump(&sb.pin_path)["kernel"]["walked"], 7);
    let row = port_row(&dump(&sb.pin_path), q);
    assert!(row.is_null(), "port {q}, outside the cgroup, was counted: {row}");
    drop(outside_pair);
    // They count against the limit: one more fits, the next is refused.
    let extra = sb.connect(&format!("127.0.0.1:{p}")).unwrap();
    wait_established(&sb.pin_path, p, 8);
    assert_eq!(sb.connect(&format!("127.0.0.1:{p}")).unwrap_err().kind(), ErrorKind::ConnectionRefused);

    // A restart adopts the gate and walks nothing again: no double count.
    assert_eq!(terminate(&mut daemon, DEADLINE), Some(0));
    let daemon = Daemon::start(&config, &[]).unwrap();
    assert_eq!(wait_established(&sb.pin_path, p, 8).established, 8);

    // Every way they end brings the count back to 0.
    drop(half_server);
    wait_established(&sb.pin_path, p, 7);
    for (i, (c, s)) in clients.into_iter().zip(servers).enumerate() {
        if i % 2 == 0 {
            reset_on_close(&c);
        }
        drop(c);
        drop(s);
    }
    drop((queued, extra));
    drop((l, l6));
    wait_established(&sb.pin_path, p, 0);
    drop(daemon);
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn trusted_prefixes_reload_live_and_a_reshaped_gate_is_refused_at_restart() {
    require_kernel!();
    let p = free_port();
    let (sb, peer, config) = setup(&format!("{p}:1"), "kernel.trustedReserve = 1\n");
    let mut daemon = start(&sb, &peer, &config);
    let l = sb.listen(&format!("0.0.0.0:{p}"), 128);
    let _held = (peer.connect(sa(peer.server_v4, p), None).unwrap(), accept(&l));
    wait_established(&sb.pin_path, p, 1);
    assert_eq!(peer.connect(sa(peer.server_v4, p), None).unwrap_err().kind(), ErrorKind::ConnectionRefused);

    // Trust the client by a reload: its next connection uses the reserve.
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("{text}kernel.trusted = 10.77.{}.0/24\n", peer.n)).unwrap();
    let outcome = daemon.reload();
    assert!(outcome.contains("applied"), "{outcome}");
    let _trusted = (peer.connect(sa(peer.server_v4, p), None).unwrap(), accept(&l));
    wait_established(&sb.pin_path, p, 2);
    assert_eq!(dump(&sb.pin_path)["kernel"]["trusted"][0], format!("10.77.{}.0/24", peer.n));

    // A bad reload changes nothing; one touching a restart-only key names it.
    std::fs::write(&config, format!("{text}kernel.trusted = 10.77.{}.1/24\n", peer.n)).unwrap();
    assert!(daemon.reload().contains("host bits"));
    std::fs::write(
        &config,
        format!("{text}kernel.trusted = 10.77.{}.0/24\nkernel.sourcePrefixV4 = 24\n", peer.n),
    )
    .unwrap();
    assert!(daemon.reload().contains("kernel.sourcePrefixV4"));
    assert_eq!(dump(&sb.pin_path)["kernel"]["source_prefix_v4"], 32);

    // The pinned gate's shape is fixed: a restart asking for another one is
    // refused with the key and what to run, and the gate keeps enforcing.
    assert_eq!(terminate(&mut daemon, DEADLINE), Some(0));
    let run = || limiter_with_deadline(&["run", "--config", config.to_str().unwrap()], DEADLINE);
    let out = run();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("kernel.sourcePrefixV4 = 32") && err.contains("limiter unload"),
        "{err}"
    );
    std::fs::write(&config, format!("{text}kernel.connectionTableSize = 4096\n")).unwrap();
    let out = run();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("kernel.connectionTableSize = 262144")
            && err.contains("limiter unload"),
        "{err}"
    );
    std::fs::write(
        &config,
        format!("{}kernel.trusted = 10.77.{}.0/24\n", text.replace(&peer.server_if, "lo"), peer.n),
    )
    .unwrap();
    let out = run();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("kernel.xdp.interfaces"), "{err}");
    let typo = text.replace(&peer.server_if, "nosuchif0");
    std::fs::write(&config, typo).unwrap();
    let out = run();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("kernel.xdp.interfaces: no interface nosuchif0"), "{err}");
    assert_eq!(peer.connect(sa(peer.server_v4, p), None).unwrap_err().kind(), ErrorKind::ConnectionRefused);
}

/// (link id, program id) of every pinned link in a dump.
#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn a_restart_swaps_the_programs_in_their_pinned_links_without_a_gap() {
    require_kernel!();
    let p = free_port();
    let (sb, peer, config) = setup(&format!("{p}:1"), "");
    let mut daemon = start(&sb, &peer, &config);
    let l = sb.listen(&format!("0.0.0.0:{p}"), 128);
    let held = (peer.connect(sa(peer.server_v4, p), None).unwrap(), accept(&l));
    wait_established(&sb.pin_path, p, 1);
    let before = limiter_tests::links(&dump(&sb.pin_path));

    // Attempts through both refusal paths, all through the restart.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let attempts = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let prober = {
        let (stop, attempts) = (stop.clone(), attempts.clone());
        let (veth, lo) = (sb.netns_file(), sb.netns_file());
        let server = sa(peer.server_v4, p);
        let peer_ns = peer.netns_file();
        std::thread::spawn(move || {
            let mut outcomes = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for (netns, dst) in [(&peer_ns, server), (&lo, sa(std::net::Ipv4Addr::LOCALHOST, p))] {
                    let netns = netns.try_clone().unwrap();
                    let r = std::thread::spawn(move || {
                        nix::sched::setns(
                            std::os::fd::AsFd::as_fd(&netns),
                            nix::sched::CloneFlags::CLONE_NEWNET,
                        )
                        .unwrap();
                        connect_from(dst, None).map(drop).map_err(|e| e.kind())
                    })
                    .join()
                    .unwrap();
                    outcomes.push(r);
                    attempts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                // Pacing: the prober's rate, not synchronisation.
                std::thread::sleep(Duration::from_millis(5));
            }
            drop(veth);
            outcomes
        })
    };
    // Some attempts in each phase: before, while no daemon runs, after.
    let more = |phase: &str| {
        let from = attempts.load(std::sync::atomic::Ordering::Relaxed);
        wait_for(&format!("the prober's attempts {phase}"), Duration::from_secs(10), || {
            attempts.load(std::sync::atomic::Ordering::Relaxed) >= from + 10
        });
    };
    more("before the restart");
    assert_eq!(terminate(&mut daemon, DEADLINE), Some(0));
    more("with no daemon running");
    let daemon = Daemon::start(&config, &[]).unwrap();
    more("after the restart");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let outcomes = prober.join().unwrap();

    assert!(outcomes.len() >= 30, "the prober ran ({} attempts)", outcomes.len());
    for o in &outcomes {
        assert_eq!(
            *o,
            Err(ErrorKind::ConnectionRefused),
            "an attempt during the restart was not refused: {o:?}"
        );
    }
    let after = limiter_tests::links(&dump(&sb.pin_path));
    assert_eq!(before.keys().collect::<Vec<_>>(), after.keys().collect::<Vec<_>>());
    for (pin, (link, program)) in &before {
        let (link2, program2) = after[pin];
        assert_eq!(*link, link2, "{pin}: the same link, not a new attachment");
        assert_ne!(*program, program2, "{pin}: this binary's program now runs in it");
    }
    assert!(daemon.log().contains("program swapped in its pinned link"), "{}", daemon.log());
    // The connection counted by the old program is uncounted by the new one.
    assert_eq!(wait_established(&sb.pin_path, p, 1).established, 1);
    drop(held);
    wait_established(&sb.pin_path, p, 0);
}
