//! Coupled shedding in the running daemon (`http.shedAtSyn`): every
//! [`TICK`], how many requests the normal pool refused since the last tick
//! (and whether the breaker is open) goes to the [`Hysteresis`]; while it says
//! shed, the kernel flags of the proxy's listening ports are raised and
//! renewed, each for one [`LEASE`]; they are lowered when it says stop,
//! when a reload switches `http.shedAtSyn` off, and when the daemon drains.
//! A daemon that dies stops renewing: its flags lapse within one lease.
//! While it does not shed and nothing is refused, the controller sleeps
//! until a request is decided, the configuration changes or the daemon
//! drains.
//!
//! While shedding, one new connection in [`PROBE_ONE_IN`] is still let in,
//! so that some clients keep getting the HTTP 503 with its `Retry-After`
//! (a client that only ever meets RSTs learns nothing about when to come
//! back), and so that the refusals this controller samples keep saying
//! whether the pool is still saturated.

use std::{
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};

use crate::{
    admin::api::ShedStatus,
    breaker,
    config::Config,
    kernel::shed::{LEASE, ShedFlags, ShedMode},
    proxy::Proxy,
    shedding::{Hysteresis, Sample, Transition},
};

/// How often the pools are sampled.
pub const TICK: Duration = Duration::from_millis(10);
/// A raised flag is renewed this often, well inside its lease.
const RENEW: Duration = Duration::from_millis(250);
/// While shedding, one new connection attempt in this many is admitted.
pub const PROBE_ONE_IN: u32 = 16;

/// What `/status` and `/metrics` show of the controller.
#[derive(Debug, Default)]
pub struct Status {
    /// The proxy's listening ports, the ones shed.
    ports: Vec<u16>,
    enabled: AtomicBool,
    active: AtomicBool,
    dry_run: AtomicBool,
    since: Mutex<Option<SystemTime>>,
    started: AtomicU64,
    stopped: AtomicU64,
}

impl Status {
    pub fn new(ports: Vec<u16>) -> Arc<Self> {
        Arc::new(Self { ports, ..Self::default() })
    }

    pub fn view(&self) -> ShedStatus {
        let since = *self.since.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        ShedStatus {
            enabled: self.enabled.load(Ordering::Relaxed),
            active: self.active.load(Ordering::Relaxed),
            dry_run: self.dry_run.load(Ordering::Relaxed),
            ports: self.ports.clone(),
            since_unix_ms: since
                .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
                .map(|d| d.as_millis() as u64),
            probe_one_in: PROBE_ONE_IN,
            started: self.started.load(Ordering::Relaxed),
            stopped: self.stopped.load(Ordering::Relaxed),
        }
    }

    fn set(&self, active: bool) {
        self.active.store(active, Ordering::Relaxed);
        *self.since.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = active.then(SystemTime::now);
        let counter = if active { &self.started } else { &self.stopped };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// What the controller reads of the running daemon every tick. The
/// daemon (`control`) implements it: the daemon holds the controller's
/// [`Status`], so this module does not name the daemon in turn.
pub trait Host: Send + Sync + 'static {
    /// The configuration in force (a reload replaces it).
    fn config(&self) -> MutexGuard<'_, Config>;
    /// The daemon is draining: the flags come down and the controller ends.
    fn draining(&self) -> bool;
}

/// The keys in force, read every tick (all of them reload live).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Settings {
    enabled: bool,
    after: Duration,
    release: Duration,
    rate: f64,
    dry_run: bool,
}

impl Settings {
    fn of(config: &Config, ports: &[u16]) -> Self {
        let port_dry_run = ports.iter().any(|p| config.kernel.port_options.get(p).is_some_and(|o| o.dry_run));
        Self {
            enabled: config.http.shed_at_syn,
            after: Duration::from_millis(config.http.shed_after_ms),
            release: Duration::from_millis(config.http.shed_release_ms),
            rate: config.http.shed_refusal_rate as f64,
            dry_run: config.http.dry_run || port_dry_run,
        }
    }
}

/// The controller: runs until the daemon drains, then lowers its flags.
pub async fn run(daemon: Arc<impl Host>, proxy: Arc<Proxy>, mut flags: ShedFlags, status: Arc<Status>) {
    let settings = || Settings::of(&daemon.config(), &status.ports);
    let first = settings();
    let mut hysteresis = Hysteresis::new(first.after, first.release, first.rate);
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let refused = || proxy.admission.pool_refusals();
    let mut last_refused = refused();
    let mut raised: Option<(Instant, bool)> = None;
    let mut failing = false;
    // Nothing to do until a request is refused (or the breaker opens, or
    // the daemon drains, or the configuration changes): sleep until then.
    let mut quiet = false;
    loop {
        if quiet {
            let stirred = proxy.admission.stirred();
            let breaker_open = proxy.breaker.state() == breaker::State::Open;
            if refused() == last_refused && !breaker_open && !daemon.draining() {
                stirred.await;
            }
            tick.reset();
        }
        tick.tick().await;
        let s = settings();
        status.enabled.store(s.enabled, Ordering::Relaxed);
        let draining = daemon.draining();
        let now_refused = refused();
        let sample = Sample {
            refused: now_refused.saturating_sub(last_refused),
            breaker_open: proxy.breaker.state() == breaker::State::Open,
        };
        last_refused = now_refused;
        quiet = sample.refused == 0 && !sample.breaker_open;
        if !s.enabled || draining {
            if hysteresis.shedding() {
                let why = if draining { "the daemon is draining" } else { "http.shedAtSyn was switched off" };
                lower(&mut flags, &status.ports, &mut failing);
                status.set(false);
                tracing::info!(ports = ?status.ports, why, "stopped shedding new connections at the SYN");
            }
            hysteresis.reset();
            raised = None;
            if draining {
                return;
            }
            continue;
        }
        hysteresis.set_timings(s.after, s.release, s.rate);
        let step = hysteresis.step(Instant::now(), sample);
        // Shedding, it renews its flags and times the release.
        quiet &= !hysteresis.shedding();
        match step {
            Some(Transition::Start) => {
                raise(&mut flags, &status.ports, s.dry_run, &mut failing);
                raised = Some((Instant::now(), s.dry_run));
                status.dry_run.store(s.dry_run, Ordering::Relaxed);
                status.set(true);
                tracing::warn!(
                    ports = ?status.ports,
                    window_ms = s.after.as_millis() as u64,
                    refusals_per_second = s.rate,
                    dry_run = s.dry_run,
                    probe_one_in = PROBE_ONE_IN,
                    "the normal pool refuses at the shedding rate: shedding new connections at the SYN (the kernel gate \
                     answers them with a RST); established connections keep their HTTP answers"
                );
            }
            Some(Transition::Stop) => {
                lower(&mut flags, &status.ports, &mut failing);
                raised = None;
                status.set(false);
                tracing::info!(
                    ports = ?status.ports,
                    quiet_for_ms = s.release.as_millis() as u64,
                    "the normal pool has had room: stopped shedding new connections at the SYN"
                );
            }
            None => {
                if let Some((at, dry_run)) = raised
                    && (at.elapsed() >= RENEW || dry_run != s.dry_run)
                {
                    raise(&mut flags, &status.ports, s.dry_run, &mut failing);
                    raised = Some((Instant::now(), s.dry_run));
                    status.dry_run.store(s.dry_run, Ordering::Relaxed);
                }
            }
        }
    }
}

fn raise(flags: &mut ShedFlags, ports: &[u16], dry_run: bool, failing: &mut bool) {
    let mode = ShedMode { dry_run, probe_one_in: PROBE_ONE_IN };
    let result = ports.iter().try_for_each(|&p| flags.raise(p, mode));
    report(result, "raising", failing);
}

fn lower(flags: &mut ShedFlags, ports: &[u16], failing: &mut bool) {
    let result = ports.iter().try_for_each(|&p| flags.lower(p));
    report(result, "lowering", failing);
}

/// Logs a failed write once until writes succeed again (a raised flag
/// that cannot be renewed lapses within its lease).
fn report(result: Result<(), crate::kernel::KernelError>, what: &str, failing: &mut bool) {
    match result {
        Ok(()) => *failing = false,
        Err(e) if !*failing => {
            *failing = true;
            tracing::error!(
                error = %e,
                lease_ms = LEASE.as_millis() as u64,
                "{what} the kernel's shedding flags failed; a raised flag lapses within its lease"
            );
        }
        Err(_) => {}
    }
}
