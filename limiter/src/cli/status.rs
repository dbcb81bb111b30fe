//! The running daemon as `dump` and `top` see it: its typed `/status`,
//! asked for briefly on the admin listener.

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    time::Duration,
};

use crate::admin::api::Status;

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
    match request(addr, "GET", path, token, Duration::from_millis(500)) {
        Some((200, body)) => Some(body),
        _ => None,
    }
}

/// One HTTP/1.0 request to the admin listener: its status and body
/// (`None`: no answer within `timeout`).
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    timeout: Duration,
) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    stream.set_read_timeout(Some(timeout)).ok()?;
    stream.set_write_timeout(Some(timeout)).ok()?;
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    write!(stream, "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Length: 0\r\n{auth}\r\n").ok()?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw).ok()?;
    let (head, body) = raw.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    head.starts_with("HTTP/1.").then(|| (status, body.to_owned()))
}
