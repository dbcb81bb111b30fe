//! The daemon as the admin listener sees it: [`Daemon`] implements
//! [`Control`] (metrics, status, reload, breaker override, token).

use std::{
    path::PathBuf,
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::SystemTime,
};

use super::{gate::HeldGate, shedding};
use crate::{
    admin::{
        Control,
        api::{HttpStatus, KernelStatus, ReloadOutcome, Status},
    },
    breaker::{self, Mode},
    config::{Config, Secret},
    kernel::{Attachment, KernelError},
    metrics::{self, Page},
    proxy::Proxy,
    proxy::proto::Proto,
};

/// What the admin listener, the signal handlers and the drain share.
pub struct Daemon {
    pub(super) config_path: PathBuf,
    /// Set on SIGTERM: `/healthz` answers 503 so that load balancers and
    /// readiness probes stop sending work while requests drain.
    pub(super) draining: AtomicBool,
    pub(super) gate: Option<HeldGate>,
    /// `None`: no `http.upstream`, the kernel gate alone.
    pub(super) proxy: Option<Arc<Proxy>>,
    pub(super) config: Mutex<Config>,
    pub(super) started: SystemTime,
    pub(super) reloads_ok: AtomicU64,
    pub(super) reloads_failed: AtomicU64,
    /// The gate was detached under the running daemon (`limiter unload
    /// --force`): `/healthz` answers 503.
    pub(super) gate_lost: AtomicBool,
    /// The daemon could not look whether the gate is attached (said once;
    /// not a detach).
    pub(super) gate_unknown: AtomicBool,
    /// The coupled shedding's controller (with a gate and a proxy).
    pub(super) shedding: Option<Arc<shedding::Status>>,
    /// Woken by every reload that applied (the configuration watcher
    /// sleeps on it while `admin.watchConfig` is off).
    pub(super) reloaded: tokio::sync::Notify,
}

impl shedding::Host for Daemon {
    fn config(&self) -> MutexGuard<'_, Config> {
        self.config.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }
}

impl Daemon {
    /// Looks whether the gate is still attached; the first time it is not,
    /// says so loudly (it stays so: only a restart attaches it again).
    pub fn check_gate(&self) {
        let Some(g) = &self.gate else { return };
        // A reload holding the gate writes to its maps: look next time
        // (the look runs on the timer's thread and must not wait).
        let Some(gate) = g.try_read() else { return };
        let attachment = gate.attachment();
        drop(gate);
        match attachment {
            Attachment::Attached => {}
            Attachment::Detached => {
                if !self.gate_lost.swap(true, Ordering::Relaxed) {
                    tracing::error!(
                        "the kernel gate was detached under the running daemon (limiter unload --force?): \
                         nothing is refused at the SYN now; /healthz answers 503; restart the daemon to \
                         attach it again"
                    );
                }
            }
            // Not a detach: the gate may well be enforcing. Said once.
            Attachment::Unknown(why) => {
                if !self.gate_unknown.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        why = %why,
                        "cannot look whether the kernel gate is still attached; not reported as detached"
                    );
                }
            }
        }
    }

    /// Whether `admin.watchConfig` is on in the configuration in force.
    pub fn watches_config(&self) -> bool {
        self.config.lock().unwrap_or_else(std::sync::PoisonError::into_inner).admin.watch_config
    }
}

impl Control for Daemon {
    fn metrics(&self) -> Result<String, KernelError> {
        let mut page = Page::default();
        let reloads = (self.reloads_ok.load(Ordering::Relaxed), self.reloads_failed.load(Ordering::Relaxed));
        metrics::daemon::write(&mut page, reloads.0, reloads.1);
        metrics::process::write(&mut page, &metrics::process::Process::read());
        #[cfg(feature = "count-allocations")]
        metrics::process::write_allocations(&mut page);
        if let Some(g) = &self.gate {
            // A failed kernel read leaves the gate's families out and says
            // so; the rest of the page is still worth scraping.
            let snap = g.read().snapshot();
            let ok = snap.is_ok();
            match snap {
                Ok(snap) => metrics::kernel::write(&mut page, &snap),
                Err(e) => tracing::warn!("/metrics: reading the kernel gate's maps failed: {e}"),
            }
            page.family(
                "limiter_kernel_scrape_success",
                "gauge",
                "1 when the gate's maps were read for this page, 0 when the read failed (their families are missing).",
            )
            .sample("limiter_kernel_scrape_success", &[], u8::from(ok));
            let (failures, mixed) = g.read().rollback_state();
            page.family(
                "limiter_kernel_rollback_failures_total",
                "counter",
                "Map writes that putting back a failed change failed to undo (the maps then hold neither configuration).",
            )
            .sample("limiter_kernel_rollback_failures_total", &[], failures);
            page.family(
                "limiter_kernel_gate_consistent",
                "gauge",
                "0 from a failed rollback until a change is applied whole (the maps hold neither configuration), else 1.",
            )
            .sample("limiter_kernel_gate_consistent", &[], u8::from(!mixed));
        }
        if let Some(proxy) = &self.proxy {
            let pools = proxy.admission.snapshot();
            metrics::http::write(&mut page, &pools, &proxy.counters, proxy.budget.used());
            if let Some(fleet) = &proxy.fleet {
                metrics::fleet::write(&mut page, fleet, &fleet.snapshot(), &pools);
            }
            metrics::http::write_front_door(&mut page, &proxy.counters, &proxy.access_log.stats);
            metrics::http::write_upstreams(&mut page, &proxy.upstreams);
            metrics::http::write_reset_groups(&mut page, &proxy.reset_groups);
            metrics::breaker::write(&mut page, &proxy.breaker.snapshot());
            if let Some(s) = &self.shedding {
                metrics::http::write_shedding(&mut page, &s.view());
            }
        }
        Ok(page.finish())
    }

    fn status(&self) -> Result<Status, KernelError> {
        let kernel = match &self.gate {
            Some(g) => Some(KernelStatus {
                origin: g.origin,
                target: g.target.clone(),
                gate: Some(g.read().snapshot()?),
            }),
            None => None,
        };
        let http = self.proxy.as_ref().map(|p| HttpStatus {
            upstream: p.upstream().to_owned(),
            pools: p.admission.snapshot(),
            refused_breaker: p.counters.refused_breaker.load(Ordering::Relaxed),
            refused_buffer_full: p.counters.refused_buffer_full.load(Ordering::Relaxed),
            refused_upstream_full: p.counters.refused_upstream_full.load(Ordering::Relaxed),
            upstream_connections: p.upstreams.open() as u64,
            upstream_connection_limit: p.upstreams.limit() as u64,
            buffered_bytes: p.budget.used(),
            bodies_receiving: p.counters.bodies_receiving.load(Ordering::Relaxed),
            breaker: p.breaker.snapshot(),
            time_to_503_p99_bound_seconds: p.counters.time_to_503.quantile_bound(0.99),
            requests_by_proto: Proto::ALL
                .iter()
                .map(|proto| {
                    let n = p.counters.requests_by_proto[proto.index()].load(Ordering::Relaxed);
                    (proto.as_str().to_owned(), n)
                })
                .collect(),
            shedding: self.shedding.as_ref().map(|s| s.view()),
            fleet: p.fleet.as_ref().map(|f| f.snapshot()),
        });
        let config = self.config.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        Ok(Status {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            pid: std::process::id(),
            started_unix: self.started.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
            config: config.source.clone(),
            kernel,
            http,
        })
    }

    fn draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    fn gate_mixed(&self) -> bool {
        self.gate.as_ref().and_then(|g| g.try_read()).is_some_and(|g| g.rollback_state().1)
    }

    fn gate_lost(&self) -> bool {
        self.gate_lost.load(Ordering::Relaxed)
    }

    fn reload(&self) -> ReloadOutcome {
        Daemon::reload(self)
    }

    fn breaker(&self, mode: Option<Mode>) -> Option<breaker::Snapshot> {
        let proxy = self.proxy.as_ref()?;
        if let Some(mode) = mode {
            tracing::warn!(mode = mode.as_str(), "circuit breaker mode set on the admin listener");
            proxy.breaker.set_mode(mode);
        }
        Some(proxy.breaker.snapshot())
    }

    fn token(&self) -> Option<Secret> {
        self.config.lock().unwrap_or_else(std::sync::PoisonError::into_inner).admin.token.clone()
    }

    fn configured_addr(&self, scope: crate::admin::Scope) -> std::net::SocketAddr {
        let config = self.config.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match scope {
            crate::admin::Scope::Full | crate::admin::Scope::Socket => config.admin.listen.0,
            crate::admin::Scope::MetricsOnly => {
                config.admin.metrics_listen.map_or(config.admin.listen.0, |a| a.0)
            }
        }
    }
}
