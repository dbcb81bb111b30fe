//! Figures per request that a noisy machine does not move: user-space
//! instructions (callgrind), system calls (`strace -c -f`) and, for
//! limiter, allocations (its `count-allocations` build). Each server runs
//! alone, one worker, under the tool, for a small and a large number of
//! keep-alive requests from `h2load --h1 -c10`; the difference divided by
//! the difference in requests is the cost of a request, start-up and
//! shutdown cancelled out.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};

/// Requests of the two runs.
pub const FEW: u32 = 1000;
pub const MANY: u32 = 6000;

/// How to start one server listening on `addr`: program and arguments.
#[derive(Clone, Debug)]
pub struct Server {
    pub name: &'static str,
    pub program: PathBuf,
    pub args: Vec<String>,
    pub addr: SocketAddr,
}

/// A tool to run the server under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tool {
    Callgrind,
    Strace,
}

/// Instructions and system calls per request.
#[derive(Clone, Copy, Debug, Default)]
pub struct PerRequest {
    pub instructions: f64,
    pub syscalls: f64,
}

/// Both figures for `server`, against `url_path` (one round each).
pub fn measure(server: &Server, dir: &Path, url_path: &str) -> Result<PerRequest> {
    let per = |tool| -> Result<f64> {
        let few = total(server, tool, dir, url_path, FEW)?;
        let many = total(server, tool, dir, url_path, MANY)?;
        ensure!(
            many > few,
            "{}: {tool:?} counted {few} for {FEW} requests and {many} for {MANY}",
            server.name
        );
        Ok((many - few) as f64 / f64::from(MANY - FEW))
    };
    Ok(PerRequest { instructions: per(Tool::Callgrind)?, syscalls: per(Tool::Strace)? })
}

/// The tool's total for one run of `requests` requests.
fn total(server: &Server, tool: Tool, dir: &Path, url_path: &str, requests: u32) -> Result<u64> {
    let out = dir.join(format!("{}-{tool:?}-{requests}.out", server.name.replace(' ', "_")));
    let _ = std::fs::remove_file(&out);
    let mut cmd = match tool {
        Tool::Callgrind => {
            let mut c = Command::new("valgrind");
            c.arg("--tool=callgrind").arg(format!("--callgrind-out-file={}", out.display()));
            c
        }
        Tool::Strace => {
            let mut c = Command::new("strace");
            c.args(["-f", "-c", "-o"]).arg(&out);
            c
        }
    };
    cmd.arg(&server.program).args(&server.args).stdout(Stdio::null()).stderr(Stdio::null());
    let mut child = cmd.spawn().with_context(|| format!("starting {} under {tool:?}", server.name))?;
    let result = drive(server.name, server.addr, url_path, requests);
    stop(&mut child, tool)?;
    result?;
    let text =
        std::fs::read_to_string(&out).with_context(|| format!("{tool:?} wrote no {}", out.display()))?;
    match tool {
        Tool::Callgrind => text
            .lines()
            .find_map(|l| l.strip_prefix("summary:").or_else(|| l.strip_prefix("totals:")))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .context("no summary line in callgrind's output"),
        Tool::Strace => text
            .lines()
            .rev()
            .find(|l| l.trim_end().ends_with("total"))
            .and_then(|l| {
                // `% time seconds usecs/call calls [errors] total`: the
                // calls column is the fourth.
                l.split_whitespace().nth(3)?.parse().ok()
            })
            .context("no total line in strace's summary"),
    }
}

/// Waits for the server `name` on `addr`, then sends it `requests`
/// keep-alive requests.
fn drive(name: &str, addr: SocketAddr, url_path: &str, requests: u32) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let probe = format!("GET {url_path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
    loop {
        // (`client::send` panics on a refused connection.)
        if std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err() {
            ensure!(Instant::now() < deadline, "{} did not listen within 60 s", name);
            std::thread::sleep(Duration::from_millis(200));
            continue;
        }
        match crate::client::send(addr, probe.as_bytes()) {
            Ok(r) if r.status == 200 => break,
            _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(200)),
            other => bail!("{} did not answer 200 within 60 s: {:?}", name, other.map(|r| r.status)),
        }
    }
    let url = format!("http://{}{url_path}", addr);
    let out = Command::new("h2load")
        .args(["--h1", "-c10", "-n"])
        .arg(requests.to_string())
        .arg(&url)
        .output()
        .context("h2load")?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        text.contains(&format!("{requests} succeeded")) && text.contains(&format!("{requests} 2xx")),
        "{}: not every request answered 2xx: {text}",
        name
    );
    Ok(())
}

/// SIGTERM to the server (under strace: its tracee), then waits.
fn stop(child: &mut Child, tool: Tool) -> Result<()> {
    let pid = match tool {
        Tool::Callgrind => child.id(),
        // strace's child is the server.
        Tool::Strace => std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", child.id()))
            .ok()
            .and_then(|c| c.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| child.id()),
    };
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        if child.try_wait()?.is_some() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    bail!("the server under {tool:?} did not stop within 120 s of SIGTERM")
}

/// Allocations per request of a running limiter built with
/// `count-allocations`, from `limiter_process_allocations_total` around
/// `MANY` requests (less what a scrape itself allocates).
pub fn allocations(proxy: SocketAddr, admin: SocketAddr, url_path: &str) -> Result<f64> {
    let count = || -> Result<u64> {
        let page = crate::http_get(admin, "/metrics")?;
        page.lines()
            .find_map(|l| l.strip_prefix("limiter_process_allocations_total "))
            .and_then(|v| v.trim().parse().ok())
            .context("no limiter_process_allocations_total: not a count-allocations build")
    };
    let name = "limiter (allocations)";
    drive(name, proxy, url_path, 100)?;
    let (a, b) = (count()?, count()?);
    let scrape = b - a;
    drive(name, proxy, url_path, MANY)?;
    let c = count()?;
    Ok((c - b).saturating_sub(scrape) as f64 / f64::from(MANY))
}
