//! `limiter unload`: detach the gate, remove the daemon's own pins.

use std::process::ExitCode;

use super::{Access, DaemonView, fail};
use crate::kernel;

/// Unloads the gate; refuses while a daemon serves it, unless `force`.
pub fn main(target: &Access, force: bool) -> ExitCode {
    if !force
        && let DaemonView::Running(status) = DaemonView::fetch(&target.admin)
        && let Some(kernel) = &status.kernel
        && kernel.gate.as_ref().is_none_or(|g| g.pin_path == target.pin_path)
    {
        return fail(format!(
            "limiter (pid {}) is running with the gate in {}: stop it first (the gate stays pinned when it \
             stops; `systemctl stop limiter`), then unload; or pass --force to detach the gate under it",
            status.pid,
            target.pin_path.display()
        ));
    }
    match kernel::unload(&target.pin_path) {
        Ok(out) => {
            for path in &out.removed {
                println!("removed {}", path.display());
            }
            for path in &out.foreign {
                println!("left {} (not limiter's)", path.display());
            }
            println!("kernel gate unloaded from {}", target.pin_path.display());
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}
