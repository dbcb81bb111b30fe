//! `admin.logLevel` changes on reload. Alone in its own test binary: the
//! logger is the process's, and the other in-process daemons' reloads
//! would set its level too.

use limiter_tests::{in_process::InProcess, upstream::Upstream};

#[test]
fn log_level_changes_live() {
    // LIMITER_LOG pins the level: then a reload must not change it.
    assert!(std::env::var_os("LIMITER_LOG").is_none(), "unset LIMITER_LOG to run this test");
    limiter::daemon::logging::init(false, "warn");
    let up = Upstream::start();
    let d = InProcess::start(up.addr, "admin.logLevel = warn\n");
    assert!(!tracing::enabled!(tracing::Level::INFO), "warn: info lines are filtered out");
    d.reload("admin.logLevel = debug\n");
    assert!(tracing::enabled!(tracing::Level::DEBUG), "debug lines now reach the log");
    d.reload("admin.logLevel = error\n");
    assert!(!tracing::enabled!(tracing::Level::WARN));
}
