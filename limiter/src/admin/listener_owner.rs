//! Who opened the TCP listeners a connection to an address would reach,
//! as `/proc/net/tcp` and `/proc/net/tcp6` say (in this network
//! namespace): the CLI sends the admin token only to root's, and a daemon
//! that finds its address taken names who holds it.

use std::net::SocketAddr;

/// The uids of the listeners that a connection to `addr` could reach.
pub fn uids(addr: SocketAddr) -> Vec<u32> {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .flat_map(|t| listeners_on(&t, addr))
        .collect()
}

/// The uids of the listeners in a `/proc/net/tcp{,6}` table that a
/// connection to `addr` could reach (its address or a wildcard).
fn listeners_on(table: &str, addr: SocketAddr) -> Vec<u32> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (local, state, uid) = (f.get(1)?, f.get(3)?, f.get(7)?);
            if *state != "0A" {
                return None;
            }
            let (ip, port) = local.split_once(':')?;
            if u16::from_str_radix(port, 16).ok()? != addr.port() {
                return None;
            }
            let wildcard = ip.bytes().all(|b| b == b'0');
            let same = match addr {
                SocketAddr::V4(a) => {
                    ip.len() == 8 && u32::from_str_radix(ip, 16).ok()?.to_ne_bytes() == a.ip().octets()
                }
                SocketAddr::V6(_) => false,
            };
            (wildcard || same || ip.len() == 32).then(|| uid.parse().ok()).flatten()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str =
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:26AD 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0
   1: 0100007F:26AE 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 2 1 0
   2: 00000000:26AF 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1001        0 3 1 0
   3: 0100007F:26AE 0100007F:9C40 01 00000000:00000000 00:00000000 00000000  1002        0 4 1 0
";

    #[test]
    fn the_listener_owners_are_read_by_address_and_port() {
        // 0x26AD = 9901, 0x26AE = 9902, 0x26AF = 9903.
        assert_eq!(listeners_on(TABLE, "127.0.0.1:9901".parse().unwrap()), vec![0]);
        assert_eq!(
            listeners_on(TABLE, "127.0.0.1:9902".parse().unwrap()),
            vec![1000],
            "established rows are not listeners"
        );
        assert_eq!(
            listeners_on(TABLE, "127.0.0.1:9903".parse().unwrap()),
            vec![1001],
            "a wildcard listener reaches it"
        );
        assert_eq!(listeners_on(TABLE, "127.0.0.2:9901".parse().unwrap()), Vec::<u32>::new());
    }
}
