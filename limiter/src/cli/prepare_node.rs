//! `limiter prepare-node`: what a node needs before the daemon starts and
//! that the daemon, in a container of its own, cannot do for itself — the
//! DaemonSet's privileged init container runs it (its image has no shell).
//!
//! - bpffs at the host's `/sys/fs/bpf` (mode 0700), so the pins outlive
//!   the pod; a mount made inside the daemon's container would vanish
//!   with it;
//! - `net.ipv4.tcp_migrate_req = 1`, so the connections queued on the
//!   listeners of a daemon that stops move to its successor's (handover).
//!
//! Each step says what it found or did; doing it twice changes nothing.

use std::{path::Path, process::ExitCode};

use super::fail;
use crate::kernel;

/// The sysctl the handover relies on, as a path under `/proc/sys`.
const MIGRATE_REQ: &str = "/proc/sys/net/ipv4/tcp_migrate_req";

/// Mounts bpffs at `bpffs` unless it is there, then sets the sysctl.
pub fn main(bpffs: &Path) -> ExitCode {
    match kernel::env::mount_bpffs(bpffs) {
        Ok(true) => println!("mounted bpffs at {} (mode 0700)", bpffs.display()),
        Ok(false) => println!("bpffs already mounted at {}", bpffs.display()),
        Err(e) => return fail(e),
    }
    match std::fs::read_to_string(MIGRATE_REQ) {
        Ok(v) if v.trim() == "1" => println!("net.ipv4.tcp_migrate_req already 1"),
        Ok(_) => match std::fs::write(MIGRATE_REQ, "1") {
            Ok(()) => println!("net.ipv4.tcp_migrate_req = 1"),
            Err(e) => return fail(format!("setting net.ipv4.tcp_migrate_req ({MIGRATE_REQ}): {e}")),
        },
        Err(e) => return fail(format!("reading {MIGRATE_REQ} (a kernel before 5.14?): {e}")),
    }
    ExitCode::SUCCESS
}
