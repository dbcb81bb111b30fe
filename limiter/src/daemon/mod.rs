//! `limiter run`: start (or adopt) the kernel gate, serve the HTTP proxy
//! and the admin listener, reload on request, drain and stop on shutdown
//! leaving the gate pinned and enforcing (unless `--unload-on-exit`).
//!
//! Start-up is two steps, so that privileges can be dropped between them:
//! [`prepare`] does everything that needs them (binds the listeners, loads
//! or adopts the gate) before any other thread exists; [`run`] serves. Its
//! inputs are a stream of reload requests and a shutdown future, so the
//! command line passes signals ([`signals`]) and a test passes its own.
//!
//! - [`control`]: the [`Daemon`] the admin listener controls;
//! - [`reload`]: applying a re-read configuration, whole or not at all;
//! - [`gate`]: the kernel gate as the daemon holds it;
//! - [`shedding`]: coupled shedding, the kernel flags raised while the
//!   HTTP pools keep refusing;
//! - [`privileges`], [`logging`], [`signals`]: process set-up.

pub mod activation;
pub mod adaptive;
pub mod config_watch;
pub mod control;
pub mod gate;
pub mod logging;
pub mod notify;
pub mod privileges;
pub mod reload;
pub mod shedding;
pub mod signals;

use std::{
    future::Future,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Instant, SystemTime},
};

use tokio::{
    net::TcpListener,
    sync::{mpsc, watch},
};

pub use self::control::Daemon;
use self::gate::HeldGate;
use crate::{
    admission::ledger::{self, Ledger},
    config::{Addr, Config, ConfigError, Upstream},
    kernel::{self, KernelError},
    proxy::{self, Proxy},
};

/// Why the daemon could not start or had to stop.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error("{key} {addr}: cannot listen: {source}{held}")]
    Listen { key: &'static str, addr: SocketAddr, source: std::io::Error, held: String },
    #[error("starting the sample upstream: {0}")]
    Sample(std::io::Error),
    #[error(transparent)]
    Ledger(#[from] crate::admission::ledger::LedgerError),
    #[error(transparent)]
    Activation(#[from] activation::ActivationError),
    #[error(transparent)]
    Socket(#[from] crate::admin::socket::SocketError),
    #[error(transparent)]
    Fleet(#[from] crate::fleet::FleetError),
}

/// How `run` was asked to behave.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// The file a reload re-reads.
    pub config_path: PathBuf,
    /// Remove the gate when the daemon stops (demos and tests).
    pub unload_on_exit: bool,
    /// The uid of `--user`, which may own the pin directory.
    pub user_uid: Option<u32>,
}

/// What [`prepare`] set up with the privileges the daemon starts with.
pub struct Prepared {
    config: Config,
    options: RunOptions,
    admin: std::net::TcpListener,
    /// The admin socket (`admin.socket`), unless `off`.
    socket: Option<crate::admin::socket::Bound>,
    /// `admin.metricsListen`, when set.
    metrics: Option<std::net::TcpListener>,
    /// One per worker and listener; `None` without a proxy.
    http: Option<proxy::Listeners>,
    gate: Option<HeldGate>,
    /// The HTTP permits shared with another daemon serving the same gate
    /// (a handover); with a proxy and a gate.
    ledger: Option<Arc<Ledger>>,
}

impl Prepared {
    /// The kernel gate's pin directory, when the gate runs.
    pub fn pin_path(&self) -> Option<&Path> {
        self.gate.as_ref().map(|_| self.config.kernel.pin_path.as_path())
    }

    /// Where the metrics-only listener listens, if there is one.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Where the admin listener listens.
    pub fn admin_addr(&self) -> std::io::Result<SocketAddr> {
        self.admin.local_addr()
    }

    /// Where the proxy listens, if there is one.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http.as_ref().and_then(|l| l.plain.first()).and_then(|l| l.local_addr().ok())
    }

    /// Where the proxy's TLS listener listens, if there is one.
    pub fn tls_addr(&self) -> Option<SocketAddr> {
        self.http.as_ref().and_then(|l| l.tls.as_ref()?.first()?.local_addr().ok())
    }
}

fn listen_error(key: &'static str, addr: SocketAddr) -> impl FnOnce(std::io::Error) -> DaemonError {
    move |source| {
        // Taken: say whose it is (a local user may have bound it while
        // the daemon was down).
        let held = if source.kind() == std::io::ErrorKind::AddrInUse {
            let mut uids = crate::admin::listener_owner::uids(addr);
            uids.sort_unstable();
            uids.dedup();
            match uids.as_slice() {
                [] => String::new(),
                uids => format!(
                    " (held by uid {})",
                    uids.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
                ),
            }
        } else {
            String::new()
        };
        DaemonError::Listen { key, addr, source, held }
    }
}

/// The privileged part of start-up, run before any other thread exists (so
/// that dropping privileges afterwards covers every thread): bind the
/// listeners, load or adopt the kernel gate.
pub fn prepare(config: Config, options: RunOptions) -> Result<Prepared, DaemonError> {
    for key in &config.ignored {
        tracing::debug!(key, "ignored: belongs to the business runtime");
    }
    for warning in &config.warnings {
        tracing::warn!("{warning}");
    }
    let admin_addr = config.admin.listen.0;
    // Sockets systemd passed (a `limiter.socket` unit) serve the listeners
    // with their addresses; the rest bind here.
    let mut passed = activation::Passed::from_env()?;
    // Handover: a second daemon on the same configuration binds beside
    // this one (SO_REUSEPORT on every listener); with
    // net.ipv4.tcp_migrate_req = 1 the connections queued on a listener
    // that closes move to the other daemon's (see docs/lifecycle.md).
    let mut listen = |key: &'static str, addr: SocketAddr, workers: usize| match passed.take(key, addr) {
        Some(l) => (0..workers.max(1))
            .map(|_| l.try_clone())
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(listen_error(key, addr)),
        None => proxy::bind(addr, workers).map_err(listen_error(key, addr)),
    };
    let admin = listen("admin.listen", admin_addr, 1)?.remove(0);
    let metrics = match config.admin.metrics_listen {
        Some(Addr(addr)) => Some(listen("admin.metricsListen", addr, 1)?.remove(0)),
        None => None,
    };
    let http = match &config.http.upstream {
        Some(_) => {
            let plain = listen("http.listen", config.http.listen.0, config.http.workers)?;
            let tls = match config.http.tls_listen {
                Some(Addr(addr)) => Some(listen("http.tls.listen", addr, config.http.workers)?),
                None => None,
            };
            Some(proxy::Listeners { plain, tls })
        }
        None => None,
    };
    passed.finish()?;
    let owners: Vec<u32> = options.user_uid.into_iter().collect();
    let gate = if config.kernel.enabled { Some(HeldGate::start(&config.kernel, &owners)?) } else { None };
    match (&gate, &http) {
        (None, _) => tracing::info!("kernel.enabled = false: HTTP proxy only, no kernel gate"),
        (Some(_), None) => tracing::info!(
            "no http.upstream: the kernel gate and the admin listener only, no HTTP proxy (gate-only mode)"
        ),
        (Some(_), Some(_)) => {}
    }
    // Joined with the privileges start-up has (the ledger is a pinned map).
    let ledger = match (&gate, &http) {
        (Some(_), Some(_)) => {
            let pin_dir = &config.kernel.pin_path;
            let memory = kernel::shared_memory::open(pin_dir, ledger::BYTES)?;
            Some(Ledger::join(memory, pin_dir, std::time::Duration::from_secs(3))?)
        }
        _ => None,
    };
    // Made as root, in root's directory: after the drop the daemon keeps
    // serving it, and no other user can replace it. Last, since it is
    // renamed over the path: a daemon taking over replaces the serving
    // one's socket only once nothing else can fail its start.
    let socket = match &config.admin.socket {
        Some(path) => Some(crate::admin::socket::bind(path, config.admin.socket_group.as_deref())?),
        None => None,
    };
    Ok(Prepared { config, options, admin, socket, metrics, http, gate, ledger })
}

/// Serves until `shutdown` resolves, then drains: reloads whenever
/// `reloads` yields.
pub async fn run(
    prepared: Prepared,
    mut reloads: mpsc::UnboundedReceiver<()>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), DaemonError> {
    let Prepared { config, options, admin, socket, metrics, http: http_listeners, gate, ledger } = prepared;
    let admin_addr = config.admin.listen.0;
    let metrics_addr = config.admin.metrics_listen.map_or(admin_addr, |a| a.0);
    let admin = TcpListener::from_std(admin).map_err(listen_error("admin.listen", admin_addr))?;

    let proxy = match &config.http.upstream {
        None => None,
        Some(upstream) => {
            let upstream = match upstream {
                Upstream::At(addr) => addr.clone(),
                Upstream::Sample => {
                    let addr = crate::sample_upstream::start().await.map_err(DaemonError::Sample)?;
                    tracing::info!(%addr, "http.upstream = sample: forwarding to the built-in sample upstream (GET /slow?ms=N answers slowly)");
                    addr.to_string()
                }
            };
            let fleet = start_fleet(&config).await?;
            Some(Proxy::new(&config, upstream, ledger.clone(), fleet))
        }
    };
    if let (Some(proxy), Some(listeners)) = (&proxy, &http_listeners) {
        let limits = proxy.admission.limits();
        tracing::info!(
            listen = %listeners.plain[0].local_addr().map(|a| a.to_string()).unwrap_or_default(),
            tls = %listeners.tls.as_ref().and_then(|l| l[0].local_addr().ok()).map(|a| a.to_string()).unwrap_or_else(|| "off".into()),
            h2c = config.http.h2c,
            workers = listeners.plain.len(),
            upstream = proxy.upstream(),
            normal = limits.normal,
            debug = limits.debug_reserved,
            per_session = limits.per_session,
            web = limits.web,
            dry_run = limits.dry_run,
            admin = %admin.local_addr().map(|a| a.to_string()).unwrap_or_default(),
            "HTTP proxy serving"
        );
    } else {
        tracing::info!(admin = %admin.local_addr().map(|a| a.to_string()).unwrap_or_default(), "admin listener serving");
    }

    let pin_path = config.kernel.pin_path.clone();
    // Coupled shedding needs the gate (its programs refuse the SYNs) and
    // the proxy (its pools say when); it runs whenever both do, so a
    // reload can switch http.shedAtSyn on.
    let shed = match (&gate, &proxy, &http_listeners) {
        (Some(gate), Some(_), Some(listeners)) => {
            let mut ports: Vec<u16> = listeners
                .plain
                .iter()
                .chain(listeners.tls.iter().flatten())
                .filter_map(|l| l.local_addr().ok().map(|a| a.port()))
                .collect();
            ports.sort_unstable();
            ports.dedup();
            // Through the pin directory the gate holds open: the daemon may
            // have dropped to a user that cannot walk to it by its path.
            let reach = gate.read().reach().to_path_buf();
            match kernel::shed::ShedFlags::open(&reach) {
                Ok(flags) => Some((flags, shedding::Status::new(ports))),
                Err(e) => {
                    tracing::error!(error = %e, "coupled shedding unavailable: cannot open the kernel's shedding flags");
                    None
                }
            }
        }
        _ => None,
    };
    let daemon = Arc::new(Daemon {
        config_path: options.config_path.clone(),
        draining: AtomicBool::new(false),
        gate,
        proxy: proxy.clone(),
        config: Mutex::new(config),
        started: SystemTime::now(),
        reloads_ok: AtomicU64::new(0),
        reloads_failed: AtomicU64::new(0),
        gate_lost: AtomicBool::new(false),
        gate_unknown: AtomicBool::new(false),
        shedding: shed.as_ref().map(|(_, s)| s.clone()),
        reloaded: tokio::sync::Notify::new(),
    });
    let adaptive_task = proxy.clone().map(|p| tokio::spawn(adaptive::run(p)));
    let shed_task = match (shed, &proxy) {
        (Some((flags, status)), Some(proxy)) => {
            Some(tokio::spawn(shedding::run(daemon.clone(), proxy.clone(), flags, status)))
        }
        _ => None,
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    let (admin_stop_tx, admin_stop_rx) = watch::channel(false);
    let metrics_task = match metrics.map(TcpListener::from_std).transpose() {
        Ok(Some(listener)) => Some(tokio::spawn(crate::admin::serve(
            crate::admin::Listener::Tcp(listener),
            daemon.clone(),
            crate::admin::Scope::MetricsOnly,
            admin_stop_rx.clone(),
        ))),
        Ok(None) => None,
        Err(e) => return Err(listen_error("admin.metricsListen", metrics_addr)(e)),
    };
    let socket_task = match &socket {
        Some(bound) => {
            let listener = bound.listener.try_clone().and_then(tokio::net::UnixListener::from_std).map_err(
                |source| crate::admin::socket::SocketError::Io {
                    path: bound.path.clone(),
                    what: "serving",
                    source,
                },
            )?;
            Some(tokio::spawn(crate::admin::serve(
                crate::admin::Listener::Unix(listener),
                daemon.clone(),
                crate::admin::Scope::Socket,
                admin_stop_rx.clone(),
            )))
        }
        None => None,
    };
    let admin_task = tokio::spawn(crate::admin::serve(
        crate::admin::Listener::Tcp(admin),
        daemon.clone(),
        crate::admin::Scope::Full,
        admin_stop_rx,
    ));
    let workers = match (&proxy, http_listeners) {
        (Some(proxy), Some(listeners)) => proxy::run_workers(listeners, proxy.clone(), stop_rx),
        _ => Vec::new(),
    };

    // The gate enforces (prepare loaded or adopted it), the listeners were
    // bound before and the workers and admin task now serve them.
    notify::ready();
    // One timer for what must run while the daemon is idle: the permit
    // ledger's beat, and the look whether the gate is still attached (a
    // gate detached under the daemon is noticed within seconds).
    let housekeeping = (daemon.gate.is_some() || ledger.is_some())
        .then(|| tokio::spawn(housekeeping(daemon.clone(), ledger.clone())));
    let (changed_tx, mut changed) = mpsc::unbounded_channel();
    let watcher = tokio::spawn(config_watch::run(options.config_path.clone(), daemon.clone(), changed_tx));
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            Some(()) = reloads.recv() => reload_off_runtime(&daemon).await,
            Some(()) = changed.recv() => reload_off_runtime(&daemon).await,
            () = &mut shutdown => break,
        }
    }
    watcher.abort();
    if let Some(task) = housekeeping {
        task.abort();
    }
    // Drain: stop accepting, let requests in flight finish (up to
    // http.drainTimeoutMs), keep the admin listener up meanwhile so
    // /healthz can say so; the kernel gate stays pinned and enforcing.
    daemon.draining.store(true, Ordering::Relaxed);
    // The shedding controller may sleep: it sees the drain now.
    if let Some(proxy) = &proxy {
        proxy.admission.stir();
    }
    notify::stopping();
    if let Some(proxy) = &proxy {
        let drain = proxy.tuning().drain_timeout;
        tracing::info!(
            open_connections = proxy.counters.connections_open.load(Ordering::Relaxed),
            timeout_ms = drain.as_millis() as u64,
            "draining: no new HTTP connections; requests in flight may finish"
        );
    }
    let _ = stop_tx.send(true);
    // The controller sees the drain and lowers its flags.
    if let Some(task) = shed_task {
        let _ = task.await;
    }
    let started = Instant::now();
    let joined = tokio::task::spawn_blocking(move || {
        for w in workers {
            if w.join().is_err() {
                tracing::error!("an HTTP worker thread panicked; its connections ended with it");
            }
        }
    });
    if let Err(e) = joined.await {
        tracing::error!(error = %e, "joining the HTTP workers failed");
    }
    if let Some(task) = adaptive_task {
        task.abort();
    }
    if let Some(proxy) = &proxy {
        proxy.counters.refusal_log.flush();
        proxy.counters.reset_log.flush();
        let left = proxy.counters.connections_open.load(Ordering::Relaxed);
        tracing::info!(took_ms = started.elapsed().as_millis() as u64, connections_cut = left, "drained");
        // The shares go back to the store before the exit, not with their
        // lease.
        if let Some(fleet) = &proxy.fleet
            && !fleet.settle(std::time::Duration::from_millis(500)).await
        {
            tracing::warn!(
                "fleet: some shares could not be given back to the store; their leases will end them"
            );
        }
    }
    let _ = admin_stop_tx.send(true);
    let _ = admin_task.await;
    for task in [metrics_task, socket_task].into_iter().flatten() {
        let _ = task.await;
    }
    if let Some(bound) = &socket {
        bound.remove_if_ours();
    }
    let had_gate = daemon.gate.is_some();
    drop(daemon);
    if had_gate && options.unload_on_exit {
        let out = kernel::unload(&pin_path)?;
        tracing::info!(removed = out.removed.len(), "kernel gate unloaded (--unload-on-exit)");
    } else if had_gate {
        tracing::info!(pin_path = %pin_path.display(), "stopped; the kernel gate stays pinned and enforcing");
    }
    Ok(())
}

/// The fleet-wide limits, when `fleet.store` is set. This node's name in
/// the fleet is its machine's id (`/etc/machine-id`), pin path and
/// listening address; each process adds an incarnation of its own, so no
/// two processes share a field, on one host or on two.
async fn start_fleet(config: &Config) -> Result<Option<Arc<crate::fleet::Fleet>>, crate::fleet::FleetError> {
    if config.fleet.store.is_none() {
        return Ok(None);
    }
    let node = format!("{}\n{}\n{}", machine_id(), config.kernel.pin_path.display(), config.http.listen);
    crate::fleet::start(&config.fleet, &node).await
}

/// The machine's id (systemd's `/etc/machine-id`, or D-Bus'), or, where
/// there is none (some containers), the host name: only a label, since a
/// process's field carries random bits of its own.
fn machine_id() -> String {
    ["/etc/machine-id", "/var/lib/dbus/machine-id", "/proc/sys/kernel/hostname"]
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok().map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()))
        .unwrap_or_default()
}

/// The gate's look comes every this many ledger beats (2 s).
const GATE_LOOK_EVERY: u32 = 4;

/// Beats the permit ledger every [`Ledger::BEAT_EVERY`] when there is one,
/// and looks every 2 s whether the gate is still attached: one wake-up
/// for both (the look is a few `bpf(2)` calls, made on this thread).
async fn housekeeping(daemon: Arc<Daemon>, ledger: Option<Arc<Ledger>>) {
    let beats = ledger.is_some();
    let period = if beats { Ledger::BEAT_EVERY } else { Ledger::BEAT_EVERY * GATE_LOOK_EVERY };
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut n = 0u32;
    loop {
        tick.tick().await;
        if let Some(l) = &ledger {
            l.beat();
        }
        if !beats || n.is_multiple_of(GATE_LOOK_EVERY) {
            daemon.check_gate();
        }
        n = n.wrapping_add(1);
    }
}

/// A reload (SIGHUP, or the watched file changed) on a blocking thread; a
/// reload that panicked is said and counted as failed, never lost.
async fn reload_off_runtime(daemon: &Arc<Daemon>) {
    let d = daemon.clone();
    if let Err(e) = tokio::task::spawn_blocking(move || d.reload()).await {
        daemon.reloads_failed.fetch_add(1, Ordering::Relaxed);
        tracing::error!(
            error = %e,
            "reload: it panicked part-way; what it applied before stays (reload again to apply the whole file)"
        );
    }
}
