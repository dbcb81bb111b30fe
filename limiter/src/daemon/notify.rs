//! systemd's readiness protocol (`sd_notify(3)`): with `NOTIFY_SOCKET`
//! set (a `Type=notify` unit), the daemon says READY=1 once the gate
//! enforces and every listener serves, RELOADING=1 then READY=1 around a
//! reload, and STOPPING=1 when it starts to drain. Without it, nothing.

use std::os::{linux::net::SocketAddrExt as _, unix::net::UnixDatagram};

/// Sends `state` (lines of `KEY=value`) to the service manager, if there
/// is one. A failure is logged, never fatal: the daemon serves either way.
pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else { return };
    let path = path.to_string_lossy().into_owned();
    let sent = UnixDatagram::unbound().and_then(|socket| {
        let addr = match path.strip_prefix('@') {
            // An abstract socket (systemd's default for services).
            Some(name) => std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?,
            None => std::os::unix::net::SocketAddr::from_pathname(&path)?,
        };
        socket.send_to_addr(state.as_bytes(), &addr)
    });
    if let Err(e) = sent {
        tracing::warn!(socket = %path, "NOTIFY_SOCKET: cannot tell the service manager {state:?}: {e}");
    }
}

/// READY=1, with the main pid (the manager may have started a wrapper).
pub fn ready() {
    notify(&format!("READY=1\nMAINPID={}\nSTATUS=serving", std::process::id()));
}

/// RELOADING=1 with the monotonic clock, as systemd 253+ asks.
pub fn reloading() {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map_or(0, |t| t.tv_sec() as u64 * 1_000_000 + t.tv_nsec() as u64 / 1000);
    notify(&format!("RELOADING=1\nMONOTONIC_USEC={now}\nSTATUS=reloading"));
}

pub fn stopping() {
    notify("STOPPING=1\nSTATUS=draining");
}
