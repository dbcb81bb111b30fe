//! The store's connection: one multiplexed connection to one Redis, or a
//! Redis Cluster client (which finds the cluster's nodes from the seeds
//! and follows its slots), shared by every proxy worker, replaced by the
//! fleet's probe when it breaks.

use std::{sync::RwLock, time::Duration};

use redis::{
    AsyncConnectionConfig, Client, ConnectionAddr, ConnectionInfo, FromRedisValue, IntoConnectionInfo,
    RedisConnectionInfo, RedisResult, ScriptInvocation,
    aio::{ConnectionLike, MultiplexedConnection},
    cluster::ClusterClientBuilder,
    cluster_async::ClusterConnection,
};

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
}

impl Store {
    pub(super) fn new(url: StoreUrl, password: Option<String>) -> Self {
        Self { url, password, conn: RwLock::new(None) }
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

    fn info(&self, host: &str, port: u16) -> RedisResult<ConnectionInfo> {
        let addr = if self.url.tls {
            ConnectionAddr::TcpTls { host: host.to_owned(), port, insecure: false, tls_params: None }
        } else {
            ConnectionAddr::Tcp(host.to_owned(), port)
        };
        let mut redis = RedisConnectionInfo::default().set_db(self.url.db);
        if let Some(user) = &self.url.user {
            redis = redis.set_username(user);
        }
        if let Some(password) = &self.password {
            redis = redis.set_password(password);
        }
        Ok(addr.into_connection_info()?.set_redis_settings(redis))
    }

    async fn connect(&self, timeout: Duration) -> RedisResult<StoreConn> {
        if !self.url.cluster {
            let (host, port) = &self.url.nodes[0];
            let client = Client::open(self.info(host, *port)?)?;
            // Requests carry the fleet's own deadlines; the connection's
            // own would only add a second, different one.
            let config =
                AsyncConnectionConfig::new().set_connection_timeout(Some(timeout)).set_response_timeout(None);
            return Ok(StoreConn::Single(
                client.get_multiplexed_async_connection_with_config(&config).await?,
            ));
        }
        let seeds = self.url.nodes.iter().map(|(h, p)| self.info(h, *p)).collect::<RedisResult<Vec<_>>>()?;
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

    /// The store as the configuration names it (never with a password).
    pub(super) fn describe(&self) -> String {
        self.url.to_string()
    }
}
