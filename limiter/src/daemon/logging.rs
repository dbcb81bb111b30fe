//! Logging: `tracing` to stderr, human-readable by default or JSON
//! (`run --log-json`), with a filter that a reload can change
//! (`admin.logLevel`; `LIMITER_LOG`, when set, wins and pins it). When
//! stderr is journald's (`JOURNAL_STREAM` is set), each human-readable
//! line starts with its syslog priority (`<3>` error .. `<7>` debug), so
//! `journalctl -p warning` finds the warnings.

use std::sync::OnceLock;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::{
    EnvFilter, Registry,
    fmt::{FmtContext, FormatEvent, FormatFields, format::Writer},
    layer::SubscriberExt as _,
    registry::LookupSpan,
    reload,
    util::SubscriberInitExt as _,
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
    } else if std::env::var_os("JOURNAL_STREAM").is_some() {
        let format = Priority(tracing_subscriber::fmt::format().without_time());
        registry
            .with(
                tracing_subscriber::fmt::layer()
                    .event_format(format)
                    .with_ansi(false)
                    .with_writer(std::io::stderr),
            )
            .try_init()
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

/// The syslog priority of a level, as `sd-daemon(3)` prefixes it.
pub fn priority(level: Level) -> u8 {
    match level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        _ => 7,
    }
}

/// A format that starts each line with `<priority>` for journald (which
/// keeps its own timestamps, so the line has none).
struct Priority<F>(F);

impl<S, N, F> FormatEvent<S, N> for Priority<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        write!(writer, "<{}>", priority(*event.metadata().level()))?;
        self.0.format_event(ctx, writer, event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_map_to_syslog_priorities() {
        let got: Vec<u8> =
            [Level::ERROR, Level::WARN, Level::INFO, Level::DEBUG, Level::TRACE].map(priority).to_vec();
        assert_eq!(got, [3, 4, 6, 7, 7]);
    }
}
