//! The pure helpers behind the map writes: trie keys and the limit
//! changes a reload reports.

use limiter_common::{LIMIT_FLAG_DRY_RUN, PortLimit};

use super::*;

fn prefix(text: &str) -> Prefix {
    let (addr, len) = text.split_once('/').unwrap();
    Prefix { addr: addr.parse().unwrap(), len: len.parse().unwrap() }
}

#[test]
fn ipv4_prefixes_are_keyed_as_ipv4_mapped_ipv6() {
    let (len, data) = trie_key(&prefix("192.0.2.0/24"));
    assert_eq!(len, 120);
    assert_eq!(data, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 0]);
    // What the XDP and sk_lookup paths look up for client 192.0.2.7 falls
    // under it: the key is the mapped address.
    assert_eq!(data[..15], "::ffff:192.0.2.7".parse::<std::net::Ipv6Addr>().unwrap().octets()[..15]);
    let (len, data) = trie_key(&prefix("2001:db8::/32"));
    assert_eq!((len, &data[..4]), (32, &[0x20, 0x01, 0x0d, 0xb8][..]));
    assert_eq!(data[4..], [0; 12]);
}

#[test]
fn trie_keys_read_back_as_the_prefixes_the_configuration_names() {
    for text in ["10.0.0.0/8", "192.0.2.9/32", "0.0.0.0/0", "fd00::/8", "2001:db8::1/128", "::/0"] {
        let p = prefix(text);
        let (len, data) = trie_key(&p);
        let back = prefix_of(len, data);
        assert_eq!(back, p, "{text}");
        assert_eq!(back.to_string(), text, "dump shows what the file says");
    }
}

#[test]
fn only_a_full_mapped_prefix_reads_back_as_ipv4() {
    let mapped = "::ffff:10.0.0.0".parse::<std::net::Ipv6Addr>().unwrap().octets();
    // 96 bits and more of ::ffff:0:0/96 are IPv4 prefixes (the config
    // normalises ::ffff:a.b.c.d/len the same way).
    assert_eq!(prefix_of(104, mapped).to_string(), "10.0.0.0/8");
    let any = "::ffff:0.0.0.0".parse::<std::net::Ipv6Addr>().unwrap().octets();
    assert_eq!(prefix_of(96, any).to_string(), "0.0.0.0/0");
    // Shorter: an IPv6 prefix that merely covers the mapped range.
    assert_eq!(prefix_of(95, mapped).to_string(), "::ffff:10.0.0.0/95");
    // Not mapped at all: IPv6 whatever the length.
    let v6 = "2001:db8::".parse::<std::net::Ipv6Addr>().unwrap().octets();
    assert_eq!(prefix_of(112, v6).to_string(), "2001:db8::/112");
}

fn limit(max: u32, per_source: u32, flags: u32) -> PortLimit {
    PortLimit { max_established: max, flags, per_source_max: per_source, _pad: 0 }
}

#[test]
fn limit_changes_read_as_the_log_line_shows_them() {
    let change = |from, to| LimitChange { port: 8080, from, to }.to_string();
    assert_eq!(change(None, Some(limit(400, 0, 0))), "+8080(max 400)");
    assert_eq!(change(Some(limit(400, 20, 0)), None), "-8080(max 400 perSource 20)");
    assert_eq!(
        change(Some(limit(400, 0, 0)), Some(limit(0, 5, LIMIT_FLAG_DRY_RUN))),
        "8080(max 400 -> perSource 5 dry-run)"
    );
    assert_eq!(change(None, None), "8080(unchanged)");
}
