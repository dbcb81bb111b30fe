//! The store's connection: one multiplexed connection to one Redis (named
//! by its address, or found through Sentinel), or a Redis Cluster client
//! (which finds the cluster's nodes from the seeds and follows its slots),
//! shared by every proxy worker, replaced by the fleet's probe when it
//! breaks. A store that is not a primary (a replica, a Sentinel itself)
//! is refused: what the fleet writes must be what every node reads.

use std::{sync::RwLock, time::Duration};

use redis::{
    AsyncConnectionConfig, Client, ConnectionAddr, ConnectionInfo, FromRedisValue, IntoConnectionInfo,
    RedisConnectionInfo, RedisResult, ScriptInvocation,
    aio::{ConnectionLike, MultiplexedConnection},
    cluster::ClusterClientBuilder,
    cluster_async::ClusterConnection,
};

use super::error::FleetError;
use crate::config::StoreUrl;

/// A connection to the store, cheap to clone (every clone shares it).
#[derive(Clone)]
pub(super) enum StoreConn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl StoreConn {
    /// Runs a script (`EVALSHA`, loading it first where the store does not
    /// have it, as after a restart).
    pub(super) async fn eval<T: FromRedisValue>(&mut self, script: &ScriptInvocation<'_>) -> RedisResult<T> {
        match self {
            Self::Single(c) => script.invoke_async(c).await,
            Self::Cluster(c) => script.invoke_async(c).await,
        }
    }

    /// Runs one command.
    pub(super) async fn query<T: FromRedisValue>(&mut self, cmd: &redis::Cmd) -> RedisResult<T> {
        let value = match self {
            Self::Single(c) => c.req_packed_command(cmd).await?,
            Self::Cluster(c) => c.req_packed_command(cmd).await?,
        };
        redis::from_redis_value(value).map_err(Into::into)
    }
}

/// Where the store is and how to reach it.
pub(super) struct Store {
    url: StoreUrl,
    password: Option<String>,
    /// The connection in use; `None` until one is made.
    conn: RwLock<Option<StoreConn>>,
    /// The primary Sentinel named last (for the log).
    primary: RwLock<Option<(String, u16)>>,
}

impl Store {
    pub(super) fn new(url: StoreUrl, password: Option<String>) -> Self {
        Self { url, password, conn: RwLock::new(None), primary: RwLock::new(None) }
    }

    /// The connection in use, if any.
    pub(super) fn conn(&self) -> Option<StoreConn> {
        self.conn.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// A new connection, made within `timeout`, in place of the one in use.
    pub(super) async fn reconnect(&self, timeout: Duration) -> RedisResult<StoreConn> {
        let conn = tokio::time::timeout(timeout, self.connect(timeout)).await.map_err(|_| {
            redis::RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no connection within {} ms", timeout.as_millis()),
            ))
        })??;
        *self.conn.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(conn.clone());
        Ok(conn)
    }

    fn info(&self, host: &str, port: u16, auth: bool) -> RedisResult<ConnectionInfo> {
        let addr = if self.url.tls {
            ConnectionAddr::TcpTls { host: host.to_owned(), port, insecure: false, tls_params: None }
        } else {
            ConnectionAddr::Tcp(host.to_owned(), port)
        };
        let mut redis = RedisConnectionInfo::default().set_db(self.url.db);
        if auth {
            if let Some(user) = &self.url.user {
                redis = redis.set_username(user);
            }
            if let Some(password) = &self.password {
                redis = redis.set_password(password);
            }
        }
        Ok(addr.into_connection_info()?.set_redis_settings(redis))
    }

    async fn single(
        &self,
        host: &str,
        port: u16,
        auth: bool,
        timeout: Duration,
    ) -> RedisResult<MultiplexedConnection> {
        let client = Client::open(self.info(host, port, auth)?)?;
        // Requests carry the fleet's own deadlines; the connection's own
        // would only add a second, different one.
        let config =
            AsyncConnectionConfig::new().set_connection_timeout(Some(timeout)).set_response_timeout(None);
        client.get_multiplexed_async_connection_with_config(&config).await
    }

    async fn connect(&self, timeout: Duration) -> RedisResult<StoreConn> {
        if let Some(master) = &self.url.sentinel {
            return self.through_sentinel(master, timeout).await.map(|(c, _)| StoreConn::Single(c));
        }
        if !self.url.cluster {
            let (host, port) = &self.url.nodes[0];
            return Ok(StoreConn::Single(self.single(host, *port, true, timeout).await?));
        }
        let seeds =
            self.url.nodes.iter().map(|(h, p)| self.info(h, *p, true)).collect::<RedisResult<Vec<_>>>()?;
        let mut builder = ClusterClientBuilder::new(seeds).connection_timeout(timeout).retries(2);
        if let Some(user) = &self.url.user {
            builder = builder.username(user);
        }
        if let Some(password) = &self.password {
            builder = builder.password(password);
        }
        if self.url.tls {
            builder = builder.tls(redis::TlsMode::Secure);
        }
        Ok(StoreConn::Cluster(builder.build()?.get_async_connection().await?))
    }

    /// A subscription to `channel` on the store (a cluster's nodes all
    /// hear every publish: the first seed that answers).
    pub(super) async fn subscribe(
        &self,
        channel: &str,
        timeout: Duration,
    ) -> RedisResult<redis::aio::PubSubStream> {
        let nodes = match &self.url.sentinel {
            Some(master) => vec![self.through_sentinel(master, timeout).await?.1],
            None => self.url.nodes.clone(),
        };
        let mut last = None;
        for (host, port) in nodes {
            let subscribed = async {
                let mut pubsub = Client::open(self.info(&host, port, true)?)?.get_async_pubsub().await?;
                pubsub.subscribe(channel).await?;
                Ok::<_, redis::RedisError>(pubsub.into_on_message())
            };
            match tokio::time::timeout(timeout, subscribed).await {
                Ok(Ok(stream)) => return Ok(stream),
                Ok(Err(e)) => last = Some(e),
                Err(_) => {
                    last = Some(redis::RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "no subscription in time",
                    )));
                }
            }
        }
        Err(last.unwrap_or_else(|| {
            redis::RedisError::from(std::io::Error::other("no store node to subscribe on"))
        }))
    }

    /// Asks each Sentinel in turn for `master`'s address and connects to
    /// it (the Sentinels without a password, the primary with the
    /// fleet's): the first whose answer is a primary now, and its address.
    async fn through_sentinel(
        &self,
        master: &str,
        timeout: Duration,
    ) -> RedisResult<(MultiplexedConnection, (String, u16))> {
        let mut why = String::from("no Sentinel answered");
        // The primary Sentinel named refused the connection: its Redis is
        // gone (said as such, for the safe share).
        let mut refused = None;
        for (host, port) in &self.url.nodes {
            let asked = async {
                let mut sentinel = self.single(host, *port, false, timeout).await?;
                let addr: Option<(String, String)> = redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(master)
                    .query_async(&mut sentinel)
                    .await?;
                Ok::<_, redis::RedisError>(addr)
            };
            let addr = match asked.await {
                Ok(Some((h, p))) => (h, p.parse::<u16>().unwrap_or(6379)),
                Ok(None) => {
                    why = format!("Sentinel {host}:{port} knows no master named {master}");
                    continue;
                }
                Err(e) => {
                    why = format!("Sentinel {host}:{port}: {e}");
                    continue;
                }
            };
            match self.single(&addr.0, addr.1, true, timeout).await {
                Ok(mut conn) => {
                    if role(&mut conn).await.as_deref() == Some("master") {
                        let mut named =
                            self.primary.write().unwrap_or_else(std::sync::PoisonError::into_inner);
                        if named.as_ref() != Some(&addr) {
                            tracing::info!(master, primary = %format!("{}:{}", addr.0, addr.1), "fleet: Sentinel names the primary");
                        }
                        *named = Some(addr.clone());
                        return Ok((conn, addr));
                    }
                    why = format!(
                        "{}:{}, named by Sentinel {host}:{port}, is not a primary (yet)",
                        addr.0, addr.1
                    );
                }
                Err(e) => {
                    why = format!("{}:{}, named by Sentinel {host}:{port}: {e}", addr.0, addr.1);
                    if e.is_connection_refusal() {
                        refused = Some(e);
                    }
                }
            }
        }
        Err(refused.unwrap_or_else(|| redis::RedisError::from(std::io::Error::other(why))))
    }

    /// `Err` when the store is not a Redis primary (a replica, a Sentinel
    /// named by `redis://`). A store that does not say (an ACL without
    /// `ROLE` or `INFO`) is taken at its word when its claims succeed.
    pub(super) async fn check_primary(&self, conn: &mut StoreConn) -> Result<(), FleetError> {
        let StoreConn::Single(c) = conn else { return Ok(()) };
        match role(c).await.as_deref() {
            None | Some("master") => Ok(()),
            Some(other) => Err(FleetError::NotPrimary {
                store: self.describe(),
                what: match other {
                    "slave" | "replica" => "a replica".to_owned(),
                    "sentinel" => "a Sentinel (name it as redis+sentinel://host:port/<master>)".to_owned(),
                    other => format!("a server whose role is {other}"),
                },
            }),
        }
    }

    /// Warns when the store may evict keys (`maxmemory` set and a policy
    /// other than `noeviction`): a budget's hash evicted is a share lost
    /// that only its holder's next claim finds out.
    pub(super) async fn warn_of_eviction(&self, conn: &mut StoreConn) {
        if let Some(warning) = self.eviction(conn).await {
            tracing::warn!(store = %self.describe(), "{warning}");
        }
    }

    /// What to say of the store's eviction settings (`None`: nothing).
    pub(super) async fn eviction(&self, conn: &mut StoreConn) -> Option<String> {
        let info = conn.query::<String>(redis::cmd("INFO").arg("memory")).await.ok()?;
        let field = |name: &str| {
            info.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':')).map(|v| v.trim().to_owned())
        };
        eviction_warning(field("maxmemory").as_deref(), field("maxmemory_policy").as_deref())
    }

    /// The store as the configuration names it (never with a password).
    pub(super) fn describe(&self) -> String {
        self.url.to_string()
    }
}

/// A Redis' role (`ROLE`, or `INFO replication` where `ROLE` is refused).
async fn role(conn: &mut MultiplexedConnection) -> Option<String> {
    if let Ok(redis::Value::Array(v)) = redis::cmd("ROLE").query_async::<redis::Value>(conn).await
        && let Some(first) = v.first()
        && let Ok(role) = redis::from_redis_value::<String>(first.clone())
    {
        return Some(role);
    }
    let info: String = redis::cmd("INFO").arg("replication").query_async(conn).await.ok()?;
    info.lines().find_map(|l| l.strip_prefix("role:")).map(|r| r.trim().to_owned())
}

/// What to say of a store's eviction settings (`None`: nothing).
pub fn eviction_warning(maxmemory: Option<&str>, policy: Option<&str>) -> Option<String> {
    let max: u64 = maxmemory?.parse().ok()?;
    let policy = policy?;
    (max > 0 && policy != "noeviction").then(|| {
        format!(
            "fleet store: maxmemory-policy {policy} with maxmemory {max}: Redis may evict the fleet's keys under memory pressure, and a budget's key evicted is a share lost until its holder's next claim; set maxmemory-policy noeviction (the fleet then gets errors, and counts the store down, rather than wrong counts)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eviction_is_warned_of_only_where_it_can_happen() {
        assert!(eviction_warning(Some("0"), Some("allkeys-lru")).is_none(), "no maxmemory: no eviction");
        assert!(eviction_warning(Some("1000000"), Some("noeviction")).is_none());
        for policy in ["allkeys-lru", "volatile-lru", "volatile-ttl", "allkeys-random"] {
            let w = eviction_warning(Some("1000000"), Some(policy)).unwrap();
            assert!(w.contains(policy) && w.contains("noeviction"), "{w}");
        }
    }
}
