//! Listening sockets passed by systemd (socket activation, the
//! `sd_listen_fds` protocol): `LISTEN_PID` names this process and
//! `LISTEN_FDS` counts the sockets, from file descriptor 3 on. Each passed
//! socket serves the configured listener with the same local address
//! (`http.listen`, `http.tls.listen`, `admin.listen`,
//! `admin.metricsListen`); a listener without one binds as usual. Because
//! the sockets belong to the `.socket` unit, they outlive the process: on a
//! restart, new connections wait in the kernel's queue instead of being
//! refused.

use std::{
    net::{SocketAddr, TcpListener},
    os::fd::{FromRawFd as _, OwnedFd},
};

/// The first passed descriptor (`SD_LISTEN_FDS_START`).
const FIRST_FD: i32 = 3;

/// Why the passed sockets cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ActivationError {
    #[error("socket activation: LISTEN_FDS={0:?} is not a count of descriptors")]
    Count(String),
    #[error("socket activation: descriptor {fd} is not a listening TCP socket ({why})")]
    NotListening { fd: i32, why: String },
    #[error(
        "socket activation passed a socket on {addr} that no listener key names (http.listen, \
         http.tls.listen, admin.listen, admin.metricsListen): make the .socket unit's ListenStream= \
         and the configuration agree"
    )]
    Unused { addr: SocketAddr },
}

/// The sockets passed to this process, not yet taken by a listener.
#[derive(Debug, Default)]
pub struct Passed(Vec<(SocketAddr, TcpListener)>);

impl Passed {
    /// The sockets passed to this process: none without `LISTEN_FDS`, or
    /// when `LISTEN_PID` names another process (they were meant for a
    /// parent).
    pub fn from_env() -> Result<Self, ActivationError> {
        let (Ok(pid), Ok(count)) = (std::env::var("LISTEN_PID"), std::env::var("LISTEN_FDS")) else {
            return Ok(Self::default());
        };
        if pid.trim().parse::<u32>() != Ok(std::process::id()) {
            return Ok(Self::default());
        }
        let n: i32 = count.trim().parse().map_err(|_| ActivationError::Count(count.clone()))?;
        let mut passed = Vec::new();
        for fd in FIRST_FD..FIRST_FD + n {
            let socket = socket2::Socket::from(own(fd));
            let not = |why: String| ActivationError::NotListening { fd, why };
            let listening = socket.is_listener().map_err(|e| not(e.to_string()))?;
            let ty = socket.r#type().map_err(|e| not(e.to_string()))?;
            if !listening || ty != socket2::Type::STREAM {
                return Err(not("not a listening stream socket".into()));
            }
            let addr = socket
                .local_addr()
                .ok()
                .and_then(|a| a.as_socket())
                .ok_or_else(|| not("not an IPv4 or IPv6 socket".into()))?;
            socket.set_cloexec(true).map_err(|e| not(e.to_string()))?;
            socket.set_nonblocking(true).map_err(|e| not(e.to_string()))?;
            passed.push((addr, TcpListener::from(socket)));
        }
        Ok(Self(passed))
    }

    /// Whether any socket was passed.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Takes the passed socket listening on `addr`, if there is one.
    pub fn take(&mut self, key: &str, addr: SocketAddr) -> Option<TcpListener> {
        let i = self.0.iter().position(|(a, _)| *a == addr)?;
        tracing::info!(key, %addr, "listening on the socket systemd passed (socket activation)");
        Some(self.0.remove(i).1)
    }

    /// Fails if a passed socket was left: the unit and the configuration
    /// disagree.
    pub fn finish(self) -> Result<(), ActivationError> {
        match self.0.first() {
            Some((addr, _)) => Err(ActivationError::Unused { addr: *addr }),
            None => Ok(()),
        }
    }
}

/// Takes ownership of passed descriptor `fd`.
#[allow(unsafe_code, reason = "the one descriptor the sd_listen_fds protocol hands this process")]
fn own(fd: i32) -> OwnedFd {
    // SAFETY: LISTEN_PID names this process, so descriptors 3..3+LISTEN_FDS
    // were open when it was executed: nothing it opened since can have
    // those numbers, and `from_env` (which runs once) is their only owner.
    unsafe { OwnedFd::from_raw_fd(fd) }
}
