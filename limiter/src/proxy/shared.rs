//! What every worker thread of the proxy shares.

use std::sync::{
    Arc, RwLock,
    atomic::{AtomicU64, Ordering},
};

use super::{
    Counters, Tuning,
    budget::Budget,
    h2::reset_groups::ResetGroups,
    pressure::Pressure,
    upstream::{Pool, Upstreams},
};
use crate::{
    access_log::AccessLogger,
    admission::{Admission, Limits, ledger::Ledger},
    breaker::{self, Breaker, MonotonicClock},
    config::Config,
    fleet::Fleet,
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
    /// Replaced whole on reload; each thread reads its own copy of the
    /// current one ([`Proxy::tuning`]).
    tuning: RwLock<Arc<Tuning>>,
    /// Bumped by every reload: a thread's copy of older values is stale.
    generation: AtomicU64,
    /// Tells this proxy's copies apart from another's on the same thread
    /// (in-process tests run several).
    id: u64,
    upstream: String,
    /// `http.accessLog`.
    pub access_log: AccessLogger,
    /// The fleet-wide limits (`fleet.store`), if any.
    pub fleet: Option<Arc<Fleet>>,
}

impl Proxy {
    /// With `ledger`, admission counts the permits of the other daemon
    /// serving the same gate too (a handover); with `fleet`, requests take
    /// the fleet's permits as well.
    pub fn new(
        config: &Config,
        upstream: String,
        ledger: Option<Arc<Ledger>>,
        fleet: Option<Arc<Fleet>>,
    ) -> Arc<Self> {
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
            generation: AtomicU64::new(0),
            id: {
                static NEXT: AtomicU64 = AtomicU64::new(0);
                NEXT.fetch_add(1, Ordering::Relaxed)
            },
            upstream,
            access_log: AccessLogger::start(&config.http.access_log),
            fleet,
        })
    }

    /// `host:port` requests go to.
    pub fn upstream(&self) -> &str {
        &self.upstream
    }

    /// The values in force now. Each thread keeps a copy of its own (taken
    /// again after a reload): every request asks, and a shared `Arc` and
    /// lock would be written by every worker on every request, their cache
    /// lines bouncing between the workers' CPUs.
    /// The client group of `client` as the per-source caps group it
    /// (`None`: a source in `kernel.trusted`).
    pub fn client_group(&self, client: std::net::IpAddr) -> Option<crate::config::Prefix> {
        self.reset_groups.group(client)
    }

    pub fn tuning(&self) -> Arc<Tuning> {
        thread_local! {
            static COPY: std::cell::RefCell<Option<(u64, u64, Arc<Tuning>)>> = const { std::cell::RefCell::new(None) };
        }
        let generation = self.generation.load(Ordering::Acquire);
        COPY.with_borrow_mut(|copy| match copy {
            Some((id, seen, tuning)) if *id == self.id && *seen == generation => tuning.clone(),
            _ => {
                let current = self.tuning.read().unwrap_or_else(std::sync::PoisonError::into_inner);
                let mine = Arc::new(Tuning::clone(&current));
                *copy = Some((self.id, generation, mine.clone()));
                mine
            }
        })
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
        self.generation.fetch_add(1, Ordering::Release);
        self.access_log.reload(&config.http.access_log);
        if let Some(fleet) = &self.fleet {
            fleet.set_live(&config.fleet);
        }
    }
}
