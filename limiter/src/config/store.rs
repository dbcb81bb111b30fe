//! `fleet.*`: the store the fleet's counts live in, and the fleet's keys
//! as the daemon reads them (the fleet itself is `crate::fleet`).
//!
//! `fleet.store` is parsed here, whole, so that a bad address is an error
//! of the file that names it, with its line, before anything connects:
//!
//! - `redis://[user@]host[:port][/db]`: one Redis (port 6379 by default);
//! - `rediss://…`: the same over TLS (rustls, the system's roots);
//! - `redis+cluster://host:port,host:port,…` (or `rediss+cluster://`):
//!   seed nodes of a Redis Cluster, which gives the rest of its nodes;
//! - `redis+sentinel://host:port,host:port,…/<master>` (or
//!   `rediss+sentinel://`): Sentinels, which name the primary of
//!   `<master>` (port 26379 by default).
//!
//! A password is never part of the address (it would be shown wherever
//! the key is: logs, `check-config`, reload diffs): it comes from
//! `fleet.passwordFile`.

use std::{fmt, path::PathBuf};

use super::Secret;

/// `fleet.store`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreUrl {
    /// TLS to every node.
    pub tls: bool,
    /// The ACL user (`None`: `default`, Redis' user without a name).
    pub user: Option<String>,
    /// The node (one Redis) or the seed nodes (a cluster).
    pub nodes: Vec<(String, u16)>,
    /// A cluster: the seeds tell the client where the rest are.
    pub cluster: bool,
    /// Sentinels (`nodes`) name the primary of this master.
    pub sentinel: Option<String>,
    /// The database of one Redis (a cluster has only 0).
    pub db: i64,
}

impl fmt::Display for StoreUrl {
    /// As an operator wrote it, without a password (there never is one).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tls = if self.tls { "rediss" } else { "redis" };
        let kind = match (self.cluster, &self.sentinel) {
            (true, _) => "+cluster",
            (false, Some(_)) => "+sentinel",
            (false, None) => "",
        };
        write!(f, "{tls}{kind}://")?;
        if let Some(user) = &self.user {
            write!(f, "{user}@")?;
        }
        let nodes: Vec<String> = self.nodes.iter().map(|(h, p)| host_port(h, *p)).collect();
        f.write_str(&nodes.join(","))?;
        if let Some(master) = &self.sentinel {
            write!(f, "/{master}")?;
        }
        if self.db != 0 {
            write!(f, "/{}", self.db)?;
        }
        Ok(())
    }
}

/// `host:port`, brackets around an IPv6 address.
pub fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") }
}

const DEFAULT_PORT: u16 = 6379;
const SENTINEL_PORT: u16 = 26379;

impl StoreUrl {
    /// Parses `fleet.store`; the error says what is wrong with it.
    pub fn parse(value: &str) -> Result<Self, String> {
        let expected = "expected redis://[user@]host[:port][/db], rediss://… (TLS), \
                        redis+cluster://host:port,host:port,… (a Redis Cluster's seed nodes) or \
                        redis+sentinel://host:port,host:port,…/<master> (Sentinels)";
        let Some((scheme, rest)) = value.split_once("://") else { return Err(expected.into()) };
        let (tls, cluster, sentinel) = match scheme {
            "redis" => (false, false, false),
            "rediss" => (true, false, false),
            "redis+cluster" => (false, true, false),
            "rediss+cluster" => (true, true, false),
            "redis+sentinel" => (false, false, true),
            "rediss+sentinel" => (true, false, true),
            other => return Err(format!("unknown scheme `{other}`: {expected}")),
        };
        let (authority, master, db) = if sentinel {
            let mut parts = rest.splitn(3, '/');
            let (a, master, db) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""), parts.next());
            let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
            if master.is_empty() || !master.chars().all(valid) {
                return Err(format!(
                    "redis+sentinel:// needs the master's name after the Sentinels: redis+sentinel://host:port,…/<master>, not `{value}`"
                ));
            }
            let db = match db {
                None | Some("") => 0,
                Some(db) => match db.parse::<i64>() {
                    Ok(n) if (0..=1_000_000).contains(&n) => n,
                    _ => return Err(format!("`{db}` is not a database number")),
                },
            };
            (a, Some(master.to_owned()), db)
        } else {
            let (a, db) = match rest.split_once('/') {
                None => (rest, 0),
                Some((_, "")) => (rest.trim_end_matches('/'), 0),
                Some(_) if cluster => {
                    return Err("a Redis Cluster has only database 0: remove the `/db`".into());
                }
                Some((a, db)) => match db.parse::<i64>() {
                    Ok(n) if (0..=1_000_000).contains(&n) => (a, n),
                    _ => return Err(format!("`{db}` is not a database number")),
                },
            };
            (a, None, db)
        };
        if authority.contains(['?', '#']) {
            return Err(format!("options after the address are not read: {expected}"));
        }
        let (user, hosts) = match authority.rsplit_once('@') {
            None => (None, authority),
            Some((userinfo, _)) if userinfo.contains(':') => {
                return Err("the address holds a password: put it in fleet.passwordFile (mode 0600) \
                            and leave only the user in the address"
                    .into());
            }
            Some(("", _)) => return Err("an empty user before `@`".into()),
            Some((user, hosts)) => (Some(user.to_owned()), hosts),
        };
        let port = if sentinel { SENTINEL_PORT } else { DEFAULT_PORT };
        let nodes = hosts.split(',').map(|n| node(n, port)).collect::<Result<Vec<_>, _>>()?;
        if nodes.len() > 1 && !cluster && !sentinel {
            return Err("several nodes: use redis+cluster:// for a Redis Cluster's seed nodes, or \
                        redis+sentinel://…/<master> for Sentinels"
                .into());
        }
        Ok(Self { tls, user, nodes, cluster, sentinel: master, db })
    }
}

/// One `host[:port]` (`port` when it names none).
fn node(text: &str, default_port: u16) -> Result<(String, u16), String> {
    let text = text.trim();
    let (host, port) = if let Some(v6) = text.strip_prefix('[') {
        let (host, after) =
            v6.split_once(']').ok_or_else(|| format!("`{text}`: no `]` after the address"))?;
        match after {
            "" => (host, None),
            p => (host, Some(p.strip_prefix(':').ok_or_else(|| format!("`{text}`: expected `:port`"))?)),
        }
    } else {
        match text.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (text, None),
        }
    };
    let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '_');
    if host.is_empty() || !host.chars().all(valid) {
        return Err(format!("`{text}` is not a host name or address"));
    }
    let port = match port {
        None => default_port,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 => n,
            _ => return Err(format!("`{p}` is not a port (1-65535)")),
        },
    };
    Ok((host.to_owned(), port))
}

/// `fleet.onStoreDown`: what a request meets while the store does not
/// answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnStoreDown {
    /// Within the share each node holds, until its lease would end; then
    /// 503 `fleet_down`: the limit holds, a partition or a failover does
    /// not lift it.
    #[default]
    Share,
    /// 503 `fleet_down` for every request that needs a fleet permit.
    Refuse,
    /// The node's local limits alone (the fleet's limit is lifted while
    /// the store is away).
    Local,
}

impl OnStoreDown {
    pub const ALL: [OnStoreDown; 3] = [OnStoreDown::Share, OnStoreDown::Refuse, OnStoreDown::Local];

    pub fn parse(value: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|p| p.as_str() == value)
            .ok_or_else(|| "expected share, refuse or local".into())
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Share => "share",
            Self::Refuse => "refuse",
            Self::Local => "local",
        }
    }
}

/// `fleet.*`: limits shared by every daemon naming the same store and
/// `fleet.name`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FleetConfig {
    /// `None`: no fleet limits.
    pub store: Option<StoreUrl>,
    pub password_file: Option<PathBuf>,
    /// Read from `password_file` at load.
    pub password: Option<Secret>,
    pub hash_key_file: Option<PathBuf>,
    /// Read from `hash_key_file` at load: keys the session hash every node
    /// of the fleet shares.
    pub hash_key: Option<Secret>,
    /// In-flight requests per session across the fleet; 0: none.
    pub max_session_connections: u32,
    /// In-flight `X-Client-Id` requests across the fleet; 0: none.
    pub max_web_connections: u32,
    pub name: String,
    pub lease_ms: u64,
    pub timeout_ms: u64,
    pub on_store_down: OnStoreDown,
}

/// `fleet.name`: a store key's part, so only what reads plainly.
pub fn fleet_name(value: &str) -> Result<String, String> {
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if value.is_empty() || value.len() > 64 || !value.chars().all(ok) {
        return Err("1 to 64 of the characters A-Z a-z 0-9 . _ -".into());
    }
    Ok(value.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> StoreUrl {
        StoreUrl::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn addresses_parse_and_print_back_without_what_was_left_out() {
        let one = url("redis://10.0.0.5:6380/2");
        assert_eq!((one.tls, one.cluster, one.db), (false, false, 2));
        assert_eq!(one.nodes, [("10.0.0.5".to_owned(), 6380)]);
        assert_eq!(one.to_string(), "redis://10.0.0.5:6380/2");
        assert_eq!(url("rediss://app@cache.internal").to_string(), "rediss://app@cache.internal:6379");
        let c = url("redis+cluster://a:7000, b:7001,[::1]:7002");
        assert!(c.cluster && !c.tls);
        assert_eq!(c.nodes.len(), 3);
        assert_eq!(c.to_string(), "redis+cluster://a:7000,b:7001,[::1]:7002");
        assert_eq!(url("redis://[::1]").nodes, [("::1".to_owned(), 6379)]);
        assert_eq!(url("redis://h:1/").db, 0);
        let s = url("redis+sentinel://10.0.0.1,10.0.0.2:26380/mymaster");
        assert_eq!(s.sentinel.as_deref(), Some("mymaster"));
        assert_eq!(s.nodes, [("10.0.0.1".to_owned(), 26379), ("10.0.0.2".to_owned(), 26380)]);
        assert_eq!(s.to_string(), "redis+sentinel://10.0.0.1:26379,10.0.0.2:26380/mymaster");
        assert_eq!(url("rediss+sentinel://app@s:1/m/2").to_string(), "rediss+sentinel://app@s:1/m/2");
    }

    #[test]
    fn bad_addresses_say_what_is_wrong() {
        for (bad, says) in [
            ("localhost:6379", "expected redis://"),
            ("http://h:1", "unknown scheme `http`"),
            ("redis://:secret@h:1", "fleet.passwordFile"),
            ("redis://u:secret@h:1", "fleet.passwordFile"),
            ("redis://h:0", "not a port"),
            ("redis://h:99999", "not a port"),
            ("redis://h:1/x", "not a database"),
            ("redis://a:1,b:2", "redis+cluster://"),
            ("redis+cluster://a:1/3", "only database 0"),
            ("redis://", "not a host"),
            ("redis://h o:1", "not a host"),
            ("redis://h:1/?protocol=resp3", "not a database"),
            ("redis://h:1?x", "options"),
            ("redis://[::1:1", "no `]`"),
            ("redis+sentinel://s:1", "master's name"),
            ("redis+sentinel://s:1/", "master's name"),
            ("redis+sentinel://s:1/a b", "master's name"),
            ("redis+sentinel://s:1/m/x", "not a database"),
        ] {
            let err = StoreUrl::parse(bad).expect_err(bad);
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn names_are_plain() {
        assert!(fleet_name("eu-west.1_a").is_ok());
        for bad in ["", "a b", "a{b}", "a:b", &"x".repeat(65)] {
            assert!(fleet_name(bad).is_err(), "{bad}");
        }
    }
}
