//! `limiter run`: start (or adopt) the kernel gate, serve the HTTP proxy
//! and the admin listener, reload on SIGHUP, stop on SIGTERM/SIGINT leaving
//! the gate pinned and enforcing (unless `--unload-on-exit`).

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::SystemTime,
};

use tokio::{
    net::TcpListener,
    signal::unix::{SignalKind, signal},
    sync::watch,
};

use crate::{
    config::{Config, ConfigError},
    kernel::{self, Gate, KernelError, Origin, Target},
    metrics::{self, Page},
    proxy::{self, Http},
};

/// Why the daemon could not start or had to stop.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error("{key} {addr}: cannot listen: {source}")]
    Listen { key: &'static str, addr: std::net::SocketAddr, source: std::io::Error },
    #[error("starting the sample upstream: {0}")]
    Sample(std::io::Error),
    #[error("installing signal handlers: {0}")]
    Signals(std::io::Error),
}

/// How `run` was asked to behave.
#[derive(Clone, Debug)]
pub struct RunOptions {
    pub config_path: PathBuf,
    /// Remove the gate when the daemon stops (demos and tests).
    pub unload_on_exit: bool,
}

/// The kernel gate as the daemon holds it.
struct GateState {
    /// Map handles; a mutex because reload writes while metrics read, and
    /// each operation is a few syscalls.
    gate: Mutex<Gate>,
    target: Target,
    origin: Origin,
}

/// What the admin listener and the signal handlers share.
pub struct State {
    config_path: PathBuf,
    /// Set on SIGTERM: `/healthz` answers 503 so that load balancers and
    /// readiness probes stop sending work while requests drain.
    pub draining: std::sync::atomic::AtomicBool,
    gate: Option<GateState>,
    http: Arc<Http>,
    config: Mutex<Config>,
    started: SystemTime,
    reloads_ok: AtomicU64,
    reloads_failed: AtomicU64,
}

impl State {
    pub fn metrics(&self) -> Result<String, KernelError> {
        let mut page = Page::default();
        page.family("limiter_build_info", "gauge", "Version of the running daemon.").sample(
            "limiter_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))],
            1,
        );
        if let Some(g) = &self.gate {
            let snap = g.gate.lock().expect("gate lock").snapshot()?;
            metrics::kernel(&mut page, &snap);
        }
        self.http.metrics(&mut page);
        page.family("limiter_config_reloads_total", "counter", "Configuration reloads by result.")
            .sample(
                "limiter_config_reloads_total",
                &[("result", "applied")],
                self.reloads_ok.load(Ordering::Relaxed),
            )
            .sample(
                "limiter_config_reloads_total",
                &[("result", "rejected")],
                self.reloads_failed.load(Ordering::Relaxed),
            );
        Ok(page.finish())
    }

    pub fn status(&self) -> Result<serde_json::Value, KernelError> {
        let kernel = match &self.gate {
            Some(g) => serde_json::json!({
                "origin": match g.origin { Origin::Adopted => "adopted", Origin::Loaded { .. } => "loaded" },
                "target": g.target,
                "gate": g.gate.lock().expect("gate lock").snapshot()?,
            }),
            None => serde_json::Value::Null,
        };
        let config = self.config.lock().expect("config lock");
        Ok(serde_json::json!({
            "version": env!("CARGO_PKG_VERSION"),
            "pid": std::process::id(),
            "started_unix": self.started.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
            "config": config.source,
            "kernel": kernel,
            "http": self.http.status(),
        }))
    }

    /// Sets the breaker's mode (when given) and returns its state as JSON.
    pub fn breaker(&self, mode: Option<crate::breaker::Mode>) -> serde_json::Value {
        if let Some(mode) = mode {
            tracing::warn!(mode = mode.as_str(), "circuit breaker mode set on the admin listener");
            self.http.breaker.set_mode(mode);
        }
        serde_json::to_value(self.http.breaker.snapshot()).unwrap_or_default()
    }

    /// The bearer token the admin listener requires, if any.
    pub fn admin_token(&self) -> Option<crate::config::Secret> {
        self.config.lock().expect("config lock").admin.token.clone()
    }

    /// Re-reads the configuration file and applies it whole, or nothing
    /// (SIGHUP and `POST /reload`). Returns what changed, or why nothing
    /// did.
    pub fn reload(&self) -> Result<Vec<String>, String> {
        match self.try_reload(&self.config_path) {
            Ok(changes) => {
                self.reloads_ok.fetch_add(1, Ordering::Relaxed);
                if changes.is_empty() {
                    tracing::info!("reload: configuration applied; nothing changed");
                } else {
                    tracing::info!(changes = %changes.join("; "), "reload: configuration applied");
                }
                Ok(changes)
            }
            Err(why) => {
                self.reloads_failed.fetch_add(1, Ordering::Relaxed);
                tracing::error!("reload rejected, nothing changed: {why}");
                Err(why)
            }
        }
    }

    fn try_reload(&self, path: &Path) -> Result<Vec<String>, String> {
        // Read under the lock: of two overlapping reloads, the one applied
        // last is the one that read the file last.
        let mut config = self.config.lock().expect("config lock");
        let new = Config::load(path).map_err(|e| e.to_string())?;
        let changed: Vec<&str> = config
            .restart_only()
            .into_iter()
            .zip(new.restart_only())
            .filter(|(old, new)| old != new)
            .map(|((key, _), _)| key)
            .collect();
        if !changed.is_empty() {
            return Err(format!("{} changed, which needs a restart", changed.join(", ")));
        }
        if new.http.upstream != config.http.upstream {
            return Err("http.upstream changed, which needs a restart".into());
        }
        self.http.can_reload(&new).map_err(|key| format!("{key} changed, which needs a restart"))?;
        let mut changes = config.changes_to(&new);
        // The kernel part can fail (a map write); it goes first so that a
        // failure leaves the HTTP side untouched too.
        if let Some(g) = &self.gate {
            let limits = g.gate.lock().expect("gate lock").apply(&new.kernel).map_err(|e| e.to_string())?;
            changes.extend(limits.iter().map(|c| format!("kernel limits {c}")));
        }
        self.http.reload(&new);
        if let Err(e) = crate::logging::set_level(&new.admin.log_level) {
            tracing::warn!("admin.logLevel: {e}");
        }
        *config = new;
        Ok(changes)
    }
}

/// What [`prepare`] set up with the privileges the daemon starts with.
pub struct Prepared {
    config: Config,
    admin: std::net::TcpListener,
    http_listeners: Vec<std::net::TcpListener>,
    gate: Option<GateState>,
}

impl Prepared {
    /// The kernel gate's pin directory, when the gate runs.
    pub fn pin_path(&self) -> Option<&Path> {
        self.gate.as_ref().map(|_| self.config.kernel.pin_path.as_path())
    }
}

/// The privileged part of start-up, run before any other thread exists (so
/// that dropping privileges afterwards covers every thread): read the
/// configuration, bind the listeners, load or adopt the kernel gate.
pub fn prepare(options: &RunOptions) -> Result<Prepared, DaemonError> {
    let config = Config::load(&options.config_path)?;
    for key in &config.ignored {
        tracing::debug!(key, "ignored: belongs to the business runtime");
    }
    let admin = std::net::TcpListener::bind(config.admin.listen)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .map_err(|source| DaemonError::Listen { key: "admin.listen", addr: config.admin.listen, source })?;
    let http_listeners = proxy::bind(config.http.listen, config.http.workers)
        .map_err(|source| DaemonError::Listen { key: "http.listen", addr: config.http.listen, source })?;
    let gate = if config.kernel.enabled { Some(start_gate(&config)?) } else { None };
    if gate.is_none() {
        tracing::info!("kernel.enabled = false: HTTP proxy only, no kernel gate");
    }
    Ok(Prepared { config, admin, http_listeners, gate })
}

/// Runs the daemon until SIGTERM or SIGINT (then drains).
pub async fn run(options: RunOptions, prepared: Prepared) -> Result<(), DaemonError> {
    let Prepared { config, admin, http_listeners, gate } = prepared;
    let mut hup = signal(SignalKind::hangup()).map_err(DaemonError::Signals)?;
    let mut term = signal(SignalKind::terminate()).map_err(DaemonError::Signals)?;
    let mut int = signal(SignalKind::interrupt()).map_err(DaemonError::Signals)?;
    // `main` blocked these until the handlers above were installed, so a
    // SIGHUP during start-up waits instead of killing the daemon.
    crate::privileges::unblock_signals();
    let admin = TcpListener::from_std(admin).map_err(|source| DaemonError::Listen {
        key: "admin.listen",
        addr: config.admin.listen,
        source,
    })?;

    let upstream = match &config.http.upstream {
        Some(u) => u.clone(),
        None => {
            let addr = proxy::sample::start().await.map_err(DaemonError::Sample)?;
            tracing::info!(%addr, "no http.upstream configured: forwarding to the built-in sample upstream (GET /slow?ms=N answers slowly)");
            addr.to_string()
        }
    };
    let http = Http::new(&config, upstream);
    let limits = http.admission.limits();
    tracing::info!(
        listen = %http_listeners[0].local_addr().map(|a| a.to_string()).unwrap_or_default(),
        workers = http_listeners.len(),
        upstream = http.upstream(),
        normal = limits.normal,
        debug = limits.debug_reserved,
        per_session = limits.per_session,
        web = limits.web,
        dry_run = limits.dry_run,
        admin = %admin.local_addr().map(|a| a.to_string()).unwrap_or_default(),
        "HTTP proxy serving"
    );

    let pin_path = config.kernel.pin_path.clone();
    let drain = std::time::Duration::from_millis(config.http.drain_timeout_ms);
    let state = Arc::new(State {
        config_path: options.config_path.clone(),
        draining: std::sync::atomic::AtomicBool::new(false),
        gate,
        http: http.clone(),
        config: Mutex::new(config),
        started: SystemTime::now(),
        reloads_ok: AtomicU64::new(0),
        reloads_failed: AtomicU64::new(0),
    });
    let (stop_tx, stop_rx) = watch::channel(false);
    let (admin_stop_tx, admin_stop_rx) = watch::channel(false);
    let admin_task = tokio::spawn(crate::admin::serve(admin, state.clone(), admin_stop_rx));
    let workers = proxy::run_workers(http_listeners, http.clone(), stop_rx);

    loop {
        tokio::select! {
            _ = hup.recv() => {
                let state = state.clone();
                let _ = tokio::task::spawn_blocking(move || state.reload()).await;
            }
            _ = term.recv() => { tracing::info!("SIGTERM: stopping"); break; }
            _ = int.recv() => { tracing::info!("SIGINT: stopping"); break; }
        }
    }
    // Drain: stop accepting, let requests in flight finish (up to
    // http.drainTimeoutMs), keep the admin listener up meanwhile so
    // /healthz can say so; the kernel gate stays pinned and enforcing.
    state.draining.store(true, Ordering::Relaxed);
    let in_flight = http.counters.connections_open.load(Ordering::Relaxed);
    tracing::info!(
        open_connections = in_flight,
        timeout_ms = drain.as_millis() as u64,
        "draining: no new HTTP connections; requests in flight may finish"
    );
    let _ = stop_tx.send(true);
    let started = std::time::Instant::now();
    let _ = tokio::task::spawn_blocking(move || workers.into_iter().for_each(|w| drop(w.join()))).await;
    http.counters.refusal_log.flush();
    let left = http.counters.connections_open.load(Ordering::Relaxed);
    tracing::info!(took_ms = started.elapsed().as_millis() as u64, connections_cut = left, "drained");
    let _ = admin_stop_tx.send(true);
    let _ = admin_task.await;
    let had_gate = state.gate.is_some();
    drop(state);
    if had_gate && options.unload_on_exit {
        let out = kernel::unload(&pin_path)?;
        tracing::info!(removed = out.removed.len(), "kernel gate unloaded (--unload-on-exit)");
    } else if had_gate {
        tracing::info!(pin_path = %pin_path.display(), "stopped; the kernel gate stays pinned and enforcing");
    }
    Ok(())
}

fn start_gate(config: &Config) -> Result<GateState, DaemonError> {
    let kernel::Started { gate, origin, target, changes, xdp, walked } = Gate::start(&config.kernel)?;
    match origin {
        Origin::Loaded { mounted_bpffs } => tracing::info!(
            pin_path = %config.kernel.pin_path.display(),
            cgroup = %target.cgroup.display(),
            netns = %target.netns.display(),
            netns_cookie = target.netns_cookie,
            mounted_bpffs,
            preexisting_connections_counted = walked,
            "kernel gate loaded and attached"
        ),
        Origin::Adopted => tracing::info!(
            pin_path = %config.kernel.pin_path.display(),
            "kernel gate adopted: it was pinned and enforcing; nothing re-attached"
        ),
    }
    for x in &xdp {
        match &x.fallback_reason {
            None => tracing::info!(interface = %x.interface, mode = x.mode, "XDP refusal attached"),
            Some(why) => tracing::info!(
                interface = %x.interface,
                mode = x.mode,
                driver_mode_error = %why,
                "XDP refusal attached in generic mode (the driver has no native XDP)"
            ),
        }
    }
    let ports: Vec<String> = changes.iter().map(ToString::to_string).collect();
    tracing::info!(changes = %ports.join(" "), "kernel gate enforcing");
    Ok(GateState { gate: Mutex::new(gate), target, origin })
}
