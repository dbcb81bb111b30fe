//! Figures per request that a noisy machine does not move: user-space
//! instructions (callgrind), system calls (`strace -c -f`) and, for
//! limiter, allocations (its `count-allocations` build). Each server runs
//! alone, one worker, under the tool, for a small and a large number of
//! requests from `h2load --h1 -c10` (keep-alive ones answered, or new
//! connections refused: [`Load`]); the difference divided by the
//! difference in requests is the cost of a request, start-up and shutdown
//! cancelled out.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};

use crate::upstream::Upstream;

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

/// The requests counted.
#[derive(Clone, Copy)]
pub enum Load<'a> {
    /// Keep-alive `GET`s of a path, every one answered 2xx.
    KeepAlive(&'a str),
    /// A new connection per request (`Connection: close`), every one
    /// refused with a 503: the session it names (`Authorization: Bearer
    /// counted`, limited to one request in flight) is held full by a
    /// request that `upstream` holds meanwhile.
    Refused(&'a Upstream),
}

/// What a refused load's requests name, and what holds that session.
const REFUSED_AUTH: &str = "Authorization: Bearer counted";

/// Both figures for `server`, under `load` (one round each).
pub fn measure(server: &Server, dir: &Path, load: Load) -> Result<PerRequest> {
    let per = |tool| -> Result<f64> {
        let few = total(server, tool, dir, load, FEW)?;
        let many = total(server, tool, dir, load, MANY)?;
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
fn total(server: &Server, tool: Tool, dir: &Path, load: Load, requests: u32) -> Result<u64> {
    let kind = match load {
        Load::KeepAlive(_) => "",
        Load::Refused(_) => "-refused",
    };
    let out = dir.join(format!("{}{kind}-{tool:?}-{requests}.out", server.name.replace(' ', "_")));
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
    let result = drive(server.name, server.addr, load, requests);
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
/// requests of `load`.
fn drive(name: &str, addr: SocketAddr, load: Load, requests: u32) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let url_path = match load {
        Load::KeepAlive(path) => path,
        Load::Refused(_) => "/",
    };
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
    let mut h2load = Command::new("h2load");
    h2load.args(["--h1", "-c10", "-n"]).arg(requests.to_string());
    // (h2load counts a 5xx as a failed request.)
    let (held, expected) = match load {
        Load::KeepAlive(_) => (None, ["succeeded", "2xx"]),
        Load::Refused(upstream) => {
            let hold = format!("GET /hold HTTP/1.1\r\nHost: a\r\n{REFUSED_AUTH}\r\n\r\n");
            let held = std::thread::spawn(move || crate::client::send(addr, hold.as_bytes()));
            upstream.wait_holding(1);
            h2load.args(["-H", REFUSED_AUTH, "-H", "Connection: close"]);
            (Some((upstream, held)), ["done", "5xx"])
        }
    };
    let out = h2load.arg(&url).output().context("h2load");
    if let Some((upstream, held)) = held {
        upstream.release();
        let answer = held.join().map_err(|_| anyhow::anyhow!("the holding request panicked"))?;
        ensure!(answer.is_ok_and(|r| r.status == 200), "{}: the held request did not end in a 200", name);
    }
    let text = String::from_utf8_lossy(&out?.stdout).into_owned();
    ensure!(
        expected.iter().all(|e| text.contains(&format!("{requests} {e}"))),
        "{}: not every request answered {}: {text}",
        name,
        expected[1]
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
pub fn allocations(proxy: SocketAddr, admin: SocketAddr, load: Load) -> Result<f64> {
    let count = || -> Result<u64> {
        let page = crate::http_get(admin, "/metrics")?;
        page.lines()
            .find_map(|l| l.strip_prefix("limiter_process_allocations_total "))
            .and_then(|v| v.trim().parse().ok())
            .context("no limiter_process_allocations_total: not a count-allocations build")
    };
    let name = "limiter (allocations)";
    drive(name, proxy, load, 100)?;
    let (a, b) = (count()?, count()?);
    let scrape = b - a;
    drive(name, proxy, load, MANY)?;
    let c = count()?;
    Ok((c - b).saturating_sub(scrape) as f64 / f64::from(MANY))
}
