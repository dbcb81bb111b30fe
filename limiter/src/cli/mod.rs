//! The commands other than `run`'s serving: each file is one verb of the
//! command line (`main.rs` parses it and calls here).
//!
//! - [`run`]: `limiter run` (sets up the process, then [`crate::daemon`]);
//! - [`check_config`]: validate a file and describe it, key by key;
//! - [`dump`], [`top`]: the pinned maps and the daemon's `/status`;
//! - [`unload`]: remove the gate.

pub mod check_config;
pub mod dump;
pub mod run;
pub mod top;
pub mod unload;

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::ExitCode,
    time::Duration,
};

use crate::{
    admin::api::Status,
    config::{Config, ConfigError},
};

/// Where `dump`, `top` and `unload` look: the pin directory, the admin
/// address and the admin token.
#[derive(Clone, Debug)]
pub struct Target {
    pub pin_path: PathBuf,
    pub admin: SocketAddr,
    pub token: Option<String>,
}

impl Target {
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

/// The daemon's `/status`, or why there is none.
#[derive(Debug)]
pub enum DaemonView {
    Running(Box<Status>),
    NotRunning {
        admin: SocketAddr,
    },
    /// Something answered 200 on the admin address with a body that is not
    /// this version's `/status`.
    Unreadable {
        admin: SocketAddr,
        error: String,
    },
}

impl DaemonView {
    /// Asks the admin listener for `/status`, briefly (with the admin token
    /// when the configuration sets one).
    pub fn fetch(admin: SocketAddr, token: Option<&str>) -> Self {
        match get(admin, "/status", token) {
            None => Self::NotRunning { admin },
            Some(body) => match serde_json::from_str(&body) {
                Ok(status) => Self::Running(Box::new(status)),
                Err(e) => Self::Unreadable { admin, error: e.to_string() },
            },
        }
    }
}

/// A minimal HTTP/1.0 GET returning the body of a 200: enough for the
/// daemon's own admin listener.
fn get(addr: SocketAddr, path: &str, token: Option<&str>) -> Option<String> {
    let timeout = Duration::from_millis(500);
    let mut stream = TcpStream::connect_timeout(&addr, timeout).ok()?;
    stream.set_read_timeout(Some(timeout)).ok()?;
    stream.set_write_timeout(Some(timeout)).ok()?;
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n{auth}\r\n").ok()?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw).ok()?;
    let (head, body) = raw.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?;
    (head.starts_with("HTTP/1.") && status == "200").then(|| body.to_owned())
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
