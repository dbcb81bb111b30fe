//! Logging: `tracing` to stderr, human-readable by default or JSON
//! (`run --log-json`), with a filter that a reload can change
//! (`admin.logLevel`; `LIMITER_LOG`, when set, wins and pins it). When
//! stderr is journald's (`JOURNAL_STREAM` is set), each human-readable
//! line starts with its syslog priority (`<3>` error .. `<7>` debug), so
//! `journalctl -p warning` finds the warnings.
//!
//! h2's own events (HTTP/2's codec, tracing target `h2`) are kept at
//! `error` unless the filter names `h2` itself: h2 writes one WARN for each
//! connection it ends for excessive stream resets (rapid reset: thousands a
//! second), and limiter logs those connections itself, rate-limited
//! ([`crate::proxy::log_lines::ResetLog`]).

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

/// The filter's directives for `level` (`admin.logLevel` or `LIMITER_LOG`):
/// as written, with h2's target held at `error` unless a directive names it.
pub fn directives(level: &str) -> String {
    let names_h2 = level.split(',').any(|d| {
        let target = d.trim().split(['=', '[']).next().unwrap_or("");
        target == "h2" || target.starts_with("h2::")
    });
    if names_h2 { level.to_owned() } else { format!("{level},h2=error") }
}

/// Installs the logger. `level` is `admin.logLevel` (already validated).
pub fn init(json: bool, level: &str) {
    // A LIMITER_LOG that is no filter is said once logging is up.
    let mut bad_env = None;
    let filter = std::env::var("LIMITER_LOG")
        .ok()
        .and_then(|env| match EnvFilter::try_new(directives(&env)) {
            Ok(f) => Some(f),
            Err(e) => {
                bad_env = Some((env, e.to_string()));
                None
            }
        })
        .unwrap_or_else(|| EnvFilter::new(directives(level)));
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
    if let Some((env, why)) = bad_env {
        tracing::warn!(
            "LIMITER_LOG={env:?} is not a log filter ({why}): logging at admin.logLevel = {level} instead"
        );
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
    let wanted = EnvFilter::new(directives(level));
    if current == wanted.to_string() {
        return Ok(false);
    }
    handle.reload(wanted)?;
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
    fn h2s_own_events_are_held_at_error_unless_the_filter_names_h2() {
        assert_eq!(directives("info"), "info,h2=error");
        assert_eq!(directives("debug,limiter::proxy=trace"), "debug,limiter::proxy=trace,h2=error");
        assert_eq!(directives("info,h2=debug"), "info,h2=debug");
        assert_eq!(directives("info, h2::proto=trace"), "info, h2::proto=trace");
        // A target that only starts with the letters is not h2's.
        assert_eq!(directives("h2o=debug"), "h2o=debug,h2=error");
        for level in ["info", "debug", "warn,limiter=debug", "info,h2=debug"] {
            assert!(EnvFilter::try_new(directives(level)).is_ok(), "{level}");
        }
    }

    #[test]
    fn levels_map_to_syslog_priorities() {
        let got: Vec<u8> =
            [Level::ERROR, Level::WARN, Level::INFO, Level::DEBUG, Level::TRACE].map(priority).to_vec();
        assert_eq!(got, [3, 4, 6, 7, 7]);
    }
}
