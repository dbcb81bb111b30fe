//! Reloading: re-read the file, validate all of it, then apply it whole or
//! not at all (SIGHUP and `POST /reload`).

use std::path::Path;

use super::Daemon;
use crate::{
    admin::api::ReloadOutcome,
    config::{Config, ConfigError},
    kernel::KernelError,
};

/// Why a reload applied nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{} changed, which needs a restart", .0.join(", "))]
    Restart(Vec<&'static str>),
    #[error(transparent)]
    Kernel(#[from] KernelError),
}

impl Daemon {
    /// Reloads, logs and counts the outcome.
    pub fn reload(&self) -> ReloadOutcome {
        super::notify::reloading();
        let outcome = self.reload_and_log();
        super::notify::ready();
        outcome
    }

    fn reload_and_log(&self) -> ReloadOutcome {
        match self.try_reload(&self.config_path) {
            Ok(changes) => {
                self.reloads_ok.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if changes.is_empty() {
                    tracing::info!("reload: configuration applied; nothing changed");
                } else {
                    tracing::info!(changes = %changes.join("; "), "reload: configuration applied");
                }
                self.reloaded.notify_waiters();
                ReloadOutcome { applied: true, changes, error: None }
            }
            Err(why) => {
                self.reloads_failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::error!("reload rejected, nothing changed: {why}");
                ReloadOutcome { applied: false, changes: Vec::new(), error: Some(why.to_string()) }
            }
        }
    }

    fn try_reload(&self, path: &Path) -> Result<Vec<String>, ReloadError> {
        // Read under the lock: of two overlapping reloads, the one applied
        // last is the one that read the file last.
        let mut config = self.config.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let new = Config::load(path)?;
        let restart = config.restart_changes(&new);
        if !restart.is_empty() {
            return Err(ReloadError::Restart(restart));
        }
        let mut changes = config.changes_to(&new);
        for warning in &new.warnings {
            tracing::warn!("reload: {warning}");
        }
        // The kernel part can fail (a map write); it goes first so that a
        // failure leaves the HTTP side untouched too.
        if let Some(g) = &self.gate {
            let limits = g.write().apply(&new.kernel)?;
            changes.extend(limits.iter().map(|c| format!("kernel limits {c}")));
        }
        if let Some(proxy) = &self.proxy {
            proxy.reload(&new);
        }
        if let Err(e) = super::logging::set_level(&new.admin.log_level) {
            tracing::warn!("admin.logLevel: {e}");
        }
        *config = new;
        Ok(changes)
    }
}
