//! nginx as the benchmarks' peer: its configuration around a `server`
//! block, started (optionally inside a network namespace) and stopped
//! with its workers.

use std::{
    fs,
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, Result};

/// A running nginx master; SIGTERM on drop (it stops its workers, then
/// exits: SIGKILL would leave the workers behind).
pub struct Nginx {
    child: Child,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.child.wait();
    }
}

impl Nginx {
    /// Starts nginx under `prefix` with `processes` (how many, or
    /// `master_process off`) and the `server` lines, in the network
    /// namespace at `netns` if given.
    pub fn start(prefix: &Path, processes: &str, server: &str, netns: Option<&Path>) -> Result<Self> {
        let path = prefix.join("nginx.conf");
        fs::write(&path, conf(prefix, processes, server))?;
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net={}", ns.display())).arg("nginx");
                c
            }
            None => Command::new("nginx"),
        };
        let child = cmd
            .arg("-p")
            .arg(prefix)
            .arg("-c")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("start nginx (installed by `cargo xtask bench`)")?;
        std::thread::sleep(Duration::from_millis(300));
        Ok(Self { child })
    }

    /// The worker processes (the master only supervises them).
    pub fn workers(&self) -> Vec<u32> {
        crate::bench::children(self.child.id())
    }
}

/// nginx's configuration under `prefix`: `processes`, then the `server`
/// lines inside `http`.
pub fn conf(prefix: &Path, processes: &str, server: &str) -> String {
    fs::create_dir_all(prefix.join("logs")).expect("nginx's log directory");
    format!(
        "daemon off;\n{processes}\npid {pid};\nerror_log {err} warn;\n\
         events {{ worker_connections 8192; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {tmp};\n  proxy_temp_path {tmp};\n\
         fastcgi_temp_path {tmp};\n  uwsgi_temp_path {tmp};\n  scgi_temp_path {tmp};\n{server}\n}}\n",
        pid = prefix.join("nginx.pid").display(),
        err = prefix.join("logs/error.log").display(),
        tmp = prefix.display(),
    )
}
