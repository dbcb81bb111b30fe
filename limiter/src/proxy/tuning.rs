//! The proxy's values that a reload may change, read once per connection
//! or per request (so a reload applies to what comes next).

use std::{sync::Arc, time::Duration};

use crate::config::Config;

#[derive(Clone, Debug)]
pub struct Tuning {
    pub retry_after_secs: u64,
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub connect_timeout: Duration,
    pub upstream_timeout: Duration,
    /// How long a permit waits for the upstream after limiter gave up on
    /// its exchange (`http.upstreamAbandonMs`).
    pub upstream_abandon: Duration,
    /// A tunnel idle this long is closed (`None`: never).
    pub tunnel_idle_timeout: Option<Duration>,
    /// `http.underscoresInHeaders`.
    pub underscores_in_headers: bool,
    pub linger: Duration,
    pub max_header_bytes: usize,
    /// Upstream statuses that count as breaker failures.
    pub failure_statuses: Vec<(u16, u16)>,
    /// `/debug/` requests pass an open breaker.
    pub bypass_debug: bool,
    /// On shutdown, how long requests in flight may take to finish.
    pub drain_timeout: Duration,
    /// Bodies up to this size are read whole before the permits (0: off).
    pub request_buffer_bytes: u64,
    pub request_body_timeout: Duration,
    /// The budget of every buffered body and read-ahead together.
    pub buffer_memory_bytes: u64,
    /// Responses up to this size are read ahead of the client (0: off).
    pub response_buffer_bytes: u64,
    /// `http.minDataRate`: the least rate, over every stretch after a grace
    /// ([`super::rate`]), of a request body streamed upstream and of a client
    /// reading a streamed response (0: off).
    pub min_data_rate: u64,
    /// What new TLS handshakes use (the pair as last loaded).
    pub tls: Option<Arc<rustls::ServerConfig>>,
    pub tls_handshake_timeout: Duration,
    /// Prior-knowledge h2c on `http.listen`.
    pub h2c: bool,
    pub h2_max_concurrent_streams: u32,
    /// Clients whose forwarding headers are kept (`http.trustedForwarders`).
    pub trusted_forwarders: Vec<crate::config::Prefix>,
    /// Normalised path prefixes of critical and sheddable requests.
    pub critical: Vec<String>,
    pub sheddable: Vec<String>,
}

impl Tuning {
    pub fn from_config(config: &Config) -> Self {
        let http = &config.http;
        let ms = Duration::from_millis;
        Self {
            retry_after_secs: http.retry_after_ms.div_ceil(1000),
            header_read_timeout: ms(http.header_read_timeout_ms),
            idle_timeout: ms(http.idle_timeout_ms),
            connect_timeout: ms(http.connect_timeout_ms),
            upstream_timeout: ms(http.upstream_timeout_ms),
            upstream_abandon: ms(http.upstream_abandon_ms),
            tunnel_idle_timeout: (http.tunnel_idle_timeout_ms > 0).then(|| ms(http.tunnel_idle_timeout_ms)),
            underscores_in_headers: http.underscores_in_headers,
            linger: ms(http.linger_ms),
            max_header_bytes: http.max_header_bytes as usize,
            failure_statuses: config.breaker.failure_statuses.clone(),
            bypass_debug: config.breaker.bypass_debug,
            drain_timeout: ms(http.drain_timeout_ms),
            request_buffer_bytes: u64::from(http.request_buffer_bytes),
            request_body_timeout: ms(http.request_body_timeout_ms),
            buffer_memory_bytes: http.buffer_memory_bytes,
            response_buffer_bytes: u64::from(http.response_buffer_bytes),
            min_data_rate: u64::from(http.min_data_rate),
            tls: http.tls.as_ref().map(crate::tls::Pair::server_config),
            tls_handshake_timeout: ms(http.tls_handshake_timeout_ms),
            h2c: http.h2c,
            h2_max_concurrent_streams: http.h2_max_concurrent_streams,
            trusted_forwarders: http.trusted_forwarders.clone(),
            critical: http.critical.clone(),
            sheddable: http.sheddable.clone(),
        }
    }

    /// Whether the upstream's `status` counts as a breaker failure.
    pub fn is_failure(&self, status: u16) -> bool {
        self.failure_statuses.iter().any(|&(lo, hi)| (lo..=hi).contains(&status))
    }
}
