//! `limiter unload`: detach the gate, remove the daemon's own pins.

use std::process::ExitCode;

use super::{Access, fail};
use crate::kernel;

pub fn main(target: &Access) -> ExitCode {
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
