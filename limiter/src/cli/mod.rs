//! The commands other than `run`'s serving: each file is one verb of the
//! command line (`main.rs` parses it and calls here).
//!
//! - [`run`]: `limiter run` (sets up the process, then [`crate::daemon`]);
//! - [`check_config`]: validate a file and describe it, key by key;
//! - [`dump`], [`top`]: the pinned maps and the daemon's `/status`
//!   ([`status`] asks for it, on the admin socket or listener it verified);
//! - [`reload`]: a reload that returns once the daemon applied or refused
//!   it (systemd's `ExecReload`);
//! - [`unload`]: remove the gate;
//! - [`prepare_node`]: bpffs and the handover's sysctl on a node (the
//!   DaemonSet's init container).
//!
//! Exit status: 0 success; [`EX_CONFIG`] (78) for what the configuration
//! gets wrong, from `run`, `check-config` and `reload` alike; 1 for
//! failures of the environment (a listener that cannot bind, a missing
//! interface, incompatible pins, capabilities); clap's 2 for usage.

pub mod check_config;
pub mod dump;
pub mod prepare_node;
pub mod reload;
pub mod run;
pub mod status;
pub mod top;
pub mod unload;

pub use self::status::{AdminApi, DaemonView};

use std::{
    io::Write as _,
    path::{Path, PathBuf},
    process::ExitCode,
};

use crate::config::{Config, ConfigError};

/// Where `dump`, `top` and `unload` look: the pin directory and the
/// admin API.
#[derive(Clone, Debug)]
pub struct Access {
    pub pin_path: PathBuf,
    pub admin: AdminApi,
}

impl Access {
    /// From a configuration file, or the defaults with an optional pin
    /// directory.
    pub fn resolve(config: Option<&Path>, pin_path: Option<&Path>) -> Result<Self, ConfigError> {
        let c = match config {
            Some(file) => Config::load(file)?,
            None => Config::default(),
        };
        Ok(Self {
            admin: AdminApi::from_config(&c),
            pin_path: pin_path.map_or(c.kernel.pin_path, Path::to_path_buf),
        })
    }
}

/// Prints to stdout; a closed pipe (`limiter dump | head`) is not an error.
pub fn out(text: &str) -> ExitCode {
    match std::io::stdout().write_all(text.as_bytes()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => fail(format!("writing to stdout: {e}")),
    }
}

/// `sysexits.h`'s EX_CONFIG: the configuration is wrong (systemd's
/// `RestartPreventExitStatus=78` then stops retrying).
pub const EX_CONFIG: u8 = 78;

/// Says what failed on stderr; exit status 1 (the environment failed:
/// worth retrying).
pub fn fail(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("limiter: {message}");
    ExitCode::FAILURE
}

/// Says what is wrong with the configuration on stderr; exit status 78.
pub fn fail_config(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("limiter: {message}");
    ExitCode::from(EX_CONFIG)
}
