//! The adaptive limit's timer (`http.adaptive`): runs the controller every
//! 10 ms, logs a change of the limit by more than a fifth (at most one
//! line a second, saying how many it left out), and on start takes the
//! limit the other daemon serving the gate learnt (a handover). While
//! nothing is in flight and the controller has nothing to close, it
//! sleeps until the next request is decided (an idle daemon wakes for
//! nothing); the controller's bin starts again when it wakes.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use crate::proxy::Proxy;

const TICK: Duration = Duration::from_millis(10);
/// At most one log line about the limit in this long.
const LOG_EVERY: Duration = Duration::from_secs(1);

/// Runs until the task is aborted.
pub async fn run(proxy: Arc<Proxy>) {
    let admission = &proxy.admission;
    if let Some(limit) = admission.resume_from_peer() {
        tracing::info!(
            limit,
            "adaptive limit: starting from the limit the other daemon serving the gate learnt"
        );
    }
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut logged: Option<Instant> = None;
    let mut left_out = 0u64;
    loop {
        tick.tick().await;
        let now = Instant::now();
        let change = admission.tick(now);
        if change.is_none() && admission.idle() {
            let stirred = admission.stirred();
            if admission.idle() {
                stirred.await;
                admission.woke(Instant::now());
            }
            tick.reset();
        }
        let Some(change) = change else {
            continue;
        };
        if logged.is_some_and(|t| now.duration_since(t) < LOG_EVERY) {
            left_out += 1;
            continue;
        }
        logged = Some(now);
        let e = admission.snapshot().adaptive.unwrap_or_default();
        tracing::info!(
            from = change.from,
            to = change.to,
            why = change.why,
            base_latency_ms = (e.base_latency * 1e4).round() / 10.0,
            latency_ms = (e.latency * 1e4).round() / 10.0,
            capacity = (e.capacity * 10.0).round() / 10.0,
            changes_not_logged = left_out,
            "adaptive limit of the normal pool changed by more than a fifth"
        );
        left_out = 0;
    }
}
