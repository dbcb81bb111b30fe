//! What every worker thread of the proxy shares.

use std::sync::{Arc, RwLock};

use super::{
    Counters, Tuning,
    budget::Budget,
    pressure::Pressure,
    reset_groups::ResetGroups,
    upstream::{Pool, Upstreams},
};
use crate::{
    access_log::AccessLogger,
    admission::{Admission, Limits, ledger::Ledger},
    breaker::{self, Breaker, MonotonicClock},
    config::Config,
};

pub struct Proxy {
    /// The pools, web-client and session limits: one lock for all workers,
    /// held for a few integer operations per request.
    pub admission: Arc<Admission>,
    pub breaker: Arc<Breaker>,
    pub counters: Arc<Counters>,
    /// The memory of buffered bodies (`http.bufferMemoryBytes`).
    pub budget: Arc<Budget>,
    /// When the pools last refused a request: slow readers then lose
    /// their permits sooner.
    pub pressure: Arc<Pressure>,
    /// Every worker's upstream connections and their cap
    /// (`http.maxUpstreamConnections`).
    pub upstreams: Arc<Upstreams>,
    /// Client groups refused at accept for their connections' resets.
    pub reset_groups: ResetGroups,
    /// Replaced whole on reload; each connection and request takes the
    /// current one (a reference count, not a copy).
    tuning: RwLock<Arc<Tuning>>,
    upstream: String,
    /// `http.accessLog`.
    pub access_log: AccessLogger,
}

impl Proxy {
    /// With `ledger`, admission counts the permits of the other daemon
    /// serving the same gate too (a handover).
    pub fn new(config: &Config, upstream: String, ledger: Option<Arc<Ledger>>) -> Arc<Self> {
        Arc::new(Self {
            admission: Admission::with_ledger(Limits::from_config(&config.http), ledger),
            breaker: Arc::new(Breaker::new(
                breaker::Policy::from_config(&config.breaker),
                MonotonicClock::default(),
                breaker::events::log(),
            )),
            counters: Arc::new(Counters::default()),
            budget: Arc::new(Budget::default()),
            pressure: Arc::new(Pressure::default()),
            upstreams: Upstreams::new(config.http.upstream_connection_limit()),
            reset_groups: ResetGroups::new(
                &config.kernel,
                std::time::Duration::from_millis(config.http.h2_reset_refusal_ms),
            ),
            tuning: RwLock::new(Arc::new(Tuning::from_config(config))),
            upstream,
            access_log: AccessLogger::start(&config.http.access_log),
        })
    }

    /// `host:port` requests go to.
    pub fn upstream(&self) -> &str {
        &self.upstream
    }

    /// The values in force now.
    pub fn tuning(&self) -> Arc<Tuning> {
        self.tuning.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// A pool of upstream connections for the calling worker's runtime.
    pub(super) fn pool(&self) -> Arc<Pool> {
        Pool::new(self.upstream.clone(), self.upstreams.clone())
    }

    /// Applies a reloaded configuration's live keys (limits, timeouts,
    /// breaker policy); what is in flight keeps what it started with.
    pub fn reload(&self, config: &Config) {
        self.admission.set_limits(Limits::from_config(&config.http));
        self.breaker.set_policy(breaker::Policy::from_config(&config.breaker));
        // With `http.maxUpstreamConnections = 0` the cap follows `http.maxThreads`.
        self.upstreams.set_limit(config.http.upstream_connection_limit());
        self.reset_groups.reload(&config.kernel);
        *self.tuning.write().unwrap_or_else(std::sync::PoisonError::into_inner) =
            Arc::new(Tuning::from_config(config));
        self.access_log.reload(&config.http.access_log);
    }
}
