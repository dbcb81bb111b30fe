//! The daemon's own families: its version and its reloads.

use super::Page;

/// Writes `limiter_build_info` and `limiter_config_reloads_total`.
pub fn write(page: &mut Page, reloads_applied: u64, reloads_rejected: u64) {
    let info = "limiter_build_info";
    page.family(info, "gauge", "Version of the running daemon.").sample(
        info,
        &[("version", env!("CARGO_PKG_VERSION"))],
        1,
    );
    let reloads = "limiter_config_reloads_total";
    page.family(reloads, "counter", "Configuration reloads by result.")
        .sample(reloads, &[("result", "applied")], reloads_applied)
        .sample(reloads, &[("result", "rejected")], reloads_rejected);
}
