//! HAProxy as the benchmarks' second peer (Debian's 2.6): one process of
//! `nbthread` threads in the foreground (`-db`), its configuration written
//! whole by the caller's `frontend`/`backend` sections under the
//! [`conf`] defaults; stopped by its own pid on drop.

use std::{
    fs,
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, Result};

/// A running HAProxy; SIGTERM on drop (a hard stop: the benchmark is done
/// with it).
pub struct Haproxy {
    child: Child,
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.child.wait();
    }
}

impl Haproxy {
    /// Checks, then starts HAProxy on `sections` with `threads` threads,
    /// its files under `dir`.
    pub fn start(dir: &Path, threads: usize, sections: &str) -> Result<Self> {
        fs::create_dir_all(dir)?;
        let path = dir.join("haproxy.cfg");
        fs::write(&path, conf(threads, sections))?;
        let check =
            Command::new("haproxy").arg("-c").arg("-f").arg(&path).output().context("start haproxy")?;
        anyhow::ensure!(
            check.status.success(),
            "haproxy -c: {}{}",
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        );
        let log = fs::File::create(dir.join("haproxy.log"))?;
        let child = Command::new("haproxy")
            .arg("-db")
            .arg("-f")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("start haproxy (installed by `cargo xtask bench`)")?;
        std::thread::sleep(Duration::from_millis(300));
        let mut haproxy = Self { child };
        if let Some(status) = haproxy.child.try_wait()? {
            anyhow::bail!(
                "haproxy exited ({status}): {}",
                fs::read_to_string(dir.join("haproxy.log")).unwrap_or_default()
            );
        }
        Ok(haproxy)
    }

    /// Its one process (the threads are its tasks).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// The global and default sections, as HAProxy's documentation sets a
/// reverse proxy up (`maxconn` within the file descriptors a test
/// machine allows: two per proxied connection): HTTP mode, keep-alive both sides, idle upstream
/// connections shared between client connections (`http-reuse always`),
/// no logging; then `sections`.
pub fn conf(threads: usize, sections: &str) -> String {
    format!(
        "global\n  nbthread {threads}\n  maxconn 8000\n\n\
         defaults\n  mode http\n  option http-keep-alive\n  http-reuse always\n\
         \x20 timeout connect 5s\n  timeout client 60s\n  timeout server 60s\n  timeout queue 60s\n\n{sections}\n"
    )
}

/// A frontend on `listen` proxying to `upstream` with the limits of the
/// benchmarks' limiter: the server's `maxconn` at limiter's normal pool
/// (HAProxy queues past it), and at most `per_session` connections tracked
/// per `Authorization` value, refused 503 past that (a stick table counting
/// the connections that carry it).
pub fn limit_proxy(listen: &str, upstream: std::net::SocketAddr, pool: u32, per_session: u32) -> String {
    format!(
        "frontend fe\n  bind {listen}\n\
         \x20 http-request track-sc0 req.hdr(Authorization) table sessions if {{ req.hdr(Authorization) -m found }}\n\
         \x20 http-request deny deny_status 503 if {{ sc0_conn_cur gt {per_session} }}\n\
         \x20 default_backend up\n\n\
         backend sessions\n  stick-table type string len 256 size 100k store conn_cur\n\n\
         backend up\n  server origin {upstream} maxconn {pool}\n"
    )
}
