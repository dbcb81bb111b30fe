//! The running daemon as `dump`, `top`, `unload` and `reload` reach it:
//! through the admin socket (`admin.socket`) when there is one, else the
//! TCP listener (`admin.listen`).
//!
//! Neither is trusted blindly. The socket is used only if its directory
//! and the ones above belong to root (or this user) and no one else can
//! write them, and the socket itself is root's (or this user's): a socket
//! someone else put there is refused before a byte is sent. Over TCP, the
//! admin token is sent only to a listener that root (or this user) opened,
//! as `/proc/net/tcp` tells: while the daemon is down any user can bind
//! its address, and must not be handed the token.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    os::unix::{fs::MetadataExt as _, net::UnixStream},
    path::{Path, PathBuf},
    time::Duration,
};

use crate::admin::{api::Status, listener_owner, socket};

/// How to reach the daemon's admin API.
#[derive(Clone, Debug)]
pub struct AdminApi {
    /// `admin.socket`; `None`: `off`.
    pub socket: Option<PathBuf>,
    /// `admin.listen`.
    pub tcp: SocketAddr,
    /// `admin.tokenFile`'s token, for the TCP listener.
    pub token: Option<String>,
}

/// Why no answer came.
#[derive(Debug)]
pub enum Unreached {
    /// Nothing listens there: the daemon is not running.
    NotRunning,
    /// Something is there that limiter will not talk to (and why).
    Refused(String),
    /// It did not answer in time, or not in HTTP.
    NoAnswer,
}

impl AdminApi {
    /// As the configuration `c` says.
    pub fn from_config(c: &crate::config::Config) -> Self {
        Self {
            socket: c.admin.socket.clone(),
            tcp: c.admin.listen.0,
            token: c.admin.token.as_ref().map(|t| t.0.clone()),
        }
    }

    /// Where requests go, as messages name it.
    pub fn describe(&self) -> String {
        match &self.socket {
            Some(path) => format!("admin.socket {}", path.display()),
            None => format!("admin.listen {}", self.tcp),
        }
    }

    /// One HTTP/1.0 request: its status and body.
    pub fn request(&self, method: &str, path: &str, timeout: Duration) -> Result<(u16, String), Unreached> {
        match &self.socket {
            Some(socket) => {
                let stream = connect_socket(socket)?;
                exchange(stream, method, path, "localhost", None, timeout)
            }
            None => {
                let stream = TcpStream::connect_timeout(&self.tcp, Duration::from_millis(500))
                    .map_err(|_| Unreached::NotRunning)?;
                let token = match &self.token {
                    Some(token) => {
                        verify_tcp_owner(self.tcp).map_err(Unreached::Refused)?;
                        Some(token.as_str())
                    }
                    None => None,
                };
                exchange(stream, method, path, &self.tcp.to_string(), token, timeout)
            }
        }
    }
}

/// Connects to the admin socket at `path` once its directory and owner
/// are what they must be.
fn connect_socket(path: &Path) -> Result<UnixStream, Unreached> {
    let me = nix::unistd::geteuid().as_raw();
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(Unreached::NotRunning),
        Err(e) => return Err(Unreached::Refused(format!("{}: {e}", path.display()))),
    };
    socket::check_dir(path, &[me]).map_err(|e| Unreached::Refused(e.to_string()))?;
    if meta.uid() != 0 && meta.uid() != me {
        return Err(Unreached::Refused(format!(
            "{} belongs to uid {} (mode {:04o}), not to root: not the daemon's socket",
            path.display(),
            meta.uid(),
            meta.mode() & 0o7777
        )));
    }
    UnixStream::connect(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound => Unreached::NotRunning,
        _ => Unreached::Refused(format!("{}: {e}", path.display())),
    })
}

/// Fails unless every TCP listener on `addr`'s port that `addr` reaches
/// was opened by root or by this user.
fn verify_tcp_owner(addr: SocketAddr) -> Result<(), String> {
    let me = nix::unistd::geteuid().as_raw();
    let owners = listener_owner::uids(addr);
    match owners.iter().find(|&&uid| uid != 0 && uid != me) {
        _ if owners.is_empty() => Err(format!(
            "cannot tell who listens on admin.listen {addr} (/proc/net/tcp lists no such listener): not sending the admin token"
        )),
        Some(uid) => Err(format!(
            "admin.listen {addr} is held by uid {uid}, not by root: not the daemon; not sending the admin token"
        )),
        None => Ok(()),
    }
}

fn exchange(
    mut stream: impl Read + Write + SetTimeouts,
    method: &str,
    path: &str,
    host: &str,
    token: Option<&str>,
    timeout: Duration,
) -> Result<(u16, String), Unreached> {
    stream.timeouts(timeout).map_err(|_| Unreached::NoAnswer)?;
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    write!(stream, "{method} {path} HTTP/1.0\r\nHost: {host}\r\nContent-Length: 0\r\n{auth}\r\n")
        .map_err(|_| Unreached::NoAnswer)?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw).map_err(|_| Unreached::NoAnswer)?;
    let (head, body) = raw.split_once("\r\n\r\n").ok_or(Unreached::NoAnswer)?;
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).ok_or(Unreached::NoAnswer)?;
    if head.starts_with("HTTP/1.") { Ok((status, body.to_owned())) } else { Err(Unreached::NoAnswer) }
}

/// Read and write timeouts on either kind of stream.
trait SetTimeouts {
    fn timeouts(&mut self, t: Duration) -> std::io::Result<()>;
}

impl SetTimeouts for TcpStream {
    fn timeouts(&mut self, t: Duration) -> std::io::Result<()> {
        self.set_read_timeout(Some(t))?;
        self.set_write_timeout(Some(t))
    }
}

impl SetTimeouts for UnixStream {
    fn timeouts(&mut self, t: Duration) -> std::io::Result<()> {
        self.set_read_timeout(Some(t))?;
        self.set_write_timeout(Some(t))
    }
}

/// The daemon's `/status`, or why there is none.
#[derive(Debug)]
pub enum DaemonView {
    Running(Box<Status>),
    NotRunning {
        admin: String,
    },
    /// Something answered on the admin address, but not with this
    /// version's `/status` (or limiter refused to talk to it: the reason).
    Unreadable {
        admin: String,
        error: String,
    },
}

impl DaemonView {
    /// Asks the admin API for `/status`, briefly.
    pub fn fetch(api: &AdminApi) -> Self {
        let admin = api.describe();
        match api.request("GET", "/status", Duration::from_millis(500)) {
            Err(Unreached::NotRunning) => Self::NotRunning { admin },
            Err(Unreached::NoAnswer) => Self::NotRunning { admin },
            Err(Unreached::Refused(why)) => Self::Unreadable { admin, error: why },
            Ok((200, body)) => match serde_json::from_str(&body) {
                Ok(status) => Self::Running(Box::new(status)),
                Err(e) => Self::Unreadable { admin, error: e.to_string() },
            },
            Ok((status, body)) => {
                Self::Unreadable { admin, error: format!("it answered {status}: {}", body.trim()) }
            }
        }
    }
}
