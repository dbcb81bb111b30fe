//! Logging: `tracing` to stderr, human-readable by default or JSON
//! (`run --log-json`), with a filter that a reload can change
//! (`admin.logLevel`; `LIMITER_LOG`, when set, wins and pins it).

use std::sync::OnceLock;

use tracing_subscriber::{
    EnvFilter, Registry, layer::SubscriberExt as _, reload, util::SubscriberInitExt as _,
};

static FILTER: OnceLock<reload::Handle<EnvFilter, Registry>> = OnceLock::new();

/// Installs the logger. `level` is `admin.logLevel` (already validated).
pub fn init(json: bool, level: &str) {
    let filter = EnvFilter::try_from_env("LIMITER_LOG").unwrap_or_else(|_| EnvFilter::new(level));
    let (filter, handle) = reload::Layer::new(filter);
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let registry = tracing_subscriber::registry().with(filter);
    let installed = if json {
        registry.with(tracing_subscriber::fmt::layer().json().with_writer(std::io::stderr)).try_init()
    } else {
        registry
            .with(tracing_subscriber::fmt::layer().with_ansi(ansi).with_writer(std::io::stderr))
            .try_init()
    };
    if installed.is_ok() {
        let _ = FILTER.set(handle);
    }
}

/// Applies a reloaded `admin.logLevel`; returns whether the level changed
/// (`LIMITER_LOG` pins the level: then nothing changes).
pub fn set_level(level: &str) -> Result<bool, reload::Error> {
    if std::env::var_os("LIMITER_LOG").is_some() {
        return Ok(false);
    }
    let Some(handle) = FILTER.get() else { return Ok(false) };
    let current = handle.with_current(ToString::to_string)?;
    if current == level {
        return Ok(false);
    }
    handle.reload(EnvFilter::new(level))?;
    Ok(true)
}
