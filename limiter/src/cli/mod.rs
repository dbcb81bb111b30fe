//! The commands other than `run`'s serving: each file is one verb of the
//! command line (`main.rs` parses it and calls here).
//!
//! - [`run`]: `limiter run` (sets up the process, then [`crate::daemon`]);
//! - [`check_config`]: validate a file and describe it, key by key;
//! - [`dump`], [`top`]: the pinned maps and the daemon's `/status`
//!   ([`status`] asks for it);
//! - [`unload`]: remove the gate.

pub mod check_config;
pub mod dump;
pub mod run;
pub mod status;
pub mod top;
pub mod unload;

pub use self::status::DaemonView;

use std::{
    io::Write as _,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::ExitCode,
};

use crate::config::{Config, ConfigError};

/// Where `dump`, `top` and `unload` look: the pin directory, the admin
/// address and the admin token.
#[derive(Clone, Debug)]
pub struct Access {
    pub pin_path: PathBuf,
    pub admin: SocketAddr,
    pub token: Option<String>,
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
            pin_path: pin_path.map_or(c.kernel.pin_path, Path::to_path_buf),
            admin: c.admin.listen.0,
            token: c.admin.token.map(|t| t.0),
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

/// Says what failed on stderr; exit status 1.
pub fn fail(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("limiter: {message}");
    ExitCode::FAILURE
}
