//! `cargo xtask bench http`: wrk against the upstream directly, limiter in
//! front of it, and nginx with `limit_conn` in front of it, for the same
//! limits, in one run, interleaved and repeated. Writes BENCHMARKS.md.
//!
//! (1) Under the limit, keep-alive: nginx (`return 200`) is the upstream;
//!     50 connections, per-session limit 100 keyed on `Authorization`.
//! (2) Over the limit, a fresh connection per request (`Connection: close`
//!     for both proxies, so both close after the 503): the upstream holds
//!     each request 100 ms; per-session limit 10 against 50 connections, so
//!     most requests are refused. Reported: 503s per second, and limiter's
//!     own time-to-503 histogram.
//!
//! (3) Small bodies (1 KiB POST), keep-alive, the nginx upstream: limiter
//!     (which reads such a body whole before admission) beside nginx, and,
//!     with `LIMITER_BIN_BEFORE` (`cargo xtask bench http --before REV`),
//!     beside the limiter of an earlier revision, interleaved in one run.
//!
//! nginx is configured fairly: one worker per core, upstream keepalive,
//! `access_log off`. limiter runs without its kernel gate (not in the HTTP
//! path).

use std::{
    fs,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, Result, bail, ensure};
use limiter_tests::{
    Daemon,
    bench::{median, spread},
    client, free_port, http_get,
    upstream::Upstream,
};

const ROUNDS: usize = 5;
const SECONDS: u32 = 5;
const CONNECTIONS: u32 = 50;

struct Nginx {
    child: Child,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGTERM to the master: it stops its workers and then exits.
        // (SIGKILL would leave the workers behind.)
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.child.wait();
    }
}

fn nginx(dir: &Path, name: &str, server: &str) -> Result<Nginx> {
    let prefix = dir.join(name);
    fs::create_dir_all(prefix.join("logs"))?;
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    let conf = format!(
        "daemon off;\nworker_processes {workers};\npid {pid};\nerror_log {err} warn;\n\
         events {{ worker_connections 8192; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {tmp};\n  proxy_temp_path {tmp};\n\
         fastcgi_temp_path {tmp};\n  uwsgi_temp_path {tmp};\n  scgi_temp_path {tmp};\n{server}\n}}\n",
        pid = prefix.join("nginx.pid").display(),
        err = prefix.join("logs/error.log").display(),
        tmp = prefix.display(),
    );
    let path = prefix.join("nginx.conf");
    fs::write(&path, conf)?;
    let child = Command::new("nginx")
        .arg("-p")
        .arg(&prefix)
        .arg("-c")
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("start nginx (installed by `cargo xtask bench http`)")?;
    std::thread::sleep(Duration::from_millis(300));
    Ok(Nginx { child })
}

/// One wrk run's figures.
#[derive(Clone, Copy, Debug, Default)]
struct Run {
    rps: f64,
    non_2xx_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
}

fn wrk(url: &str, headers: &[&str]) -> Result<Run> {
    wrk_with(url, headers, None)
}

/// wrk with a Lua script (for a request with a body).
fn wrk_with(url: &str, headers: &[&str], script: Option<&Path>) -> Result<Run> {
    let mut cmd = Command::new("wrk");
    cmd.args(["-t2", &format!("-c{CONNECTIONS}"), &format!("-d{SECONDS}s"), "--latency"]);
    if let Some(script) = script {
        cmd.arg("-s").arg(script);
    }
    for h in headers {
        cmd.args(["-H", h]);
    }
    let out = cmd.arg(url).output().context("run wrk")?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(out.status.success(), "wrk failed: {text}");
    let field = |prefix: &str| -> Option<&str> {
        text.lines().find_map(|l| l.trim().strip_prefix(prefix)).map(str::trim)
    };
    let ms = |v: &str| -> f64 {
        let (num, unit): (String, String) = v.chars().partition(|c| c.is_ascii_digit() || *c == '.');
        let n: f64 = num.parse().unwrap_or(f64::NAN);
        match unit.as_str() {
            "us" => n / 1000.0,
            "ms" => n,
            "s" => n * 1000.0,
            "m" => n * 60_000.0,
            _ => f64::NAN,
        }
    };
    let non_2xx: f64 = field("Non-2xx or 3xx responses:").and_then(|v| v.parse().ok()).unwrap_or(0.0);
    Ok(Run {
        rps: field("Requests/sec:").and_then(|v| v.parse().ok()).context("no Requests/sec in wrk output")?,
        non_2xx_per_s: non_2xx / f64::from(SECONDS),
        p50_ms: field("50%").map(ms).unwrap_or(f64::NAN),
        p99_ms: field("99%").map(ms).unwrap_or(f64::NAN),
    })
}

fn limiter_config(dir: &Path, upstream: SocketAddr, per_session: u32) -> (PathBuf, SocketAddr) {
    client::http_config(
        &dir.join(format!("limiter-{per_session}")),
        Some(upstream),
        &format!(
            "http.maxThreads = 208\nhttp.maxSessionConnections = {per_session}\nhttp.retryAfterMs = 1000\n"
        ),
    )
}

fn nginx_proxy(dir: &Path, name: &str, listen: u16, upstream: SocketAddr, per_session: u32) -> Result<Nginx> {
    nginx(
        dir,
        name,
        &format!(
            "  upstream up {{ server {upstream}; keepalive 64; }}\n\
               limit_conn_zone $http_authorization zone=perauth:10m;\n\
               server {{\n    listen 127.0.0.1:{listen};\n    location / {{\n\
                 limit_conn perauth {per_session};\n      limit_conn_status 503;\n\
                 proxy_pass http://up;\n      proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n    }}\n  }}"
        ),
    )
}

fn main() -> Result<()> {
    let dir = std::env::temp_dir().join(format!("limiter-bench-http-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir)?;
    let result = bench(&dir);
    let _ = fs::remove_dir_all(&dir);
    let report = result?;
    print!("{report}");
    limiter_tests::bench::write_section(
        "http",
        "HTTP admission",
        "`cargo xtask bench http` (installs nginx and wrk itself).",
        &report,
    )
}

fn bench(dir: &Path) -> Result<String> {
    let auth = "Authorization: Bearer bench-session";
    // (1) Under the limit: an nginx upstream that answers at once.
    let up_port = free_port();
    let upstream: SocketAddr = format!("127.0.0.1:{up_port}").parse()?;
    let _origin = nginx(
        dir,
        "origin",
        &format!("  server {{ listen 127.0.0.1:{up_port}; location / {{ return 200 \"ok\\n\"; }} }}"),
    )?;
    let (config, limiter_addr) = limiter_config(dir, upstream, 100);
    let daemon = Daemon::start(&config, &[])?;
    let nginx_port = free_port();
    let _proxy = nginx_proxy(dir, "proxy", nginx_port, upstream, 100)?;
    let targets = [
        ("upstream directly (nginx)", format!("http://{upstream}/")),
        ("limiter -> upstream", format!("http://{limiter_addr}/")),
        ("nginx limit_conn -> upstream", format!("http://127.0.0.1:{nginx_port}/")),
    ];
    for (_, url) in &targets {
        // Warm-up and a check that every path answers 200.
        let r = wrk(url, &[auth])?;
        ensure!(r.non_2xx_per_s == 0.0, "{url} answered non-2xx under the limit");
    }
    let mut under: Vec<Vec<Run>> = vec![Vec::new(); 3];
    for round in 0..ROUNDS {
        for k in 0..3 {
            let i = (round + k) % 3;
            under[i].push(wrk(&targets[i].1, &[auth])?);
        }
        eprintln!("under-limit round {}/{ROUNDS}", round + 1);
    }
    drop(daemon);
    let bodies = small_bodies(dir, upstream, nginx_port, auth)?;

    // (2) Over the limit: an upstream that holds each request 100 ms.
    let slow = Upstream::start();
    let (config, limiter_addr) = limiter_config(dir, slow.addr, 10);
    let daemon = Daemon::start(&config, &[])?;
    let nginx_port = free_port();
    let _proxy2 = nginx_proxy(dir, "proxy-over", nginx_port, slow.addr, 10)?;
    let over_targets = [
        ("limiter", format!("http://{limiter_addr}/slowhead?ms=100")),
        ("nginx limit_conn", format!("http://127.0.0.1:{nginx_port}/slowhead?ms=100")),
    ];
    for (_, url) in &over_targets {
        let r = wrk(url, &[auth, "Connection: close"])?;
        if r.non_2xx_per_s == 0.0 {
            bail!("{url}: nothing was refused over the limit");
        }
    }
    let mut over: Vec<Vec<Run>> = vec![Vec::new(); 2];
    for round in 0..ROUNDS {
        for k in 0..2 {
            let i = (round + k) % 2;
            over[i].push(wrk(&over_targets[i].1, &[auth, "Connection: close"])?);
        }
        eprintln!("over-limit round {}/{ROUNDS}", round + 1);
    }
    let metrics = http_get(daemon.admin, "/metrics")?;
    let p99 = quantile_from_metrics(&metrics, "limiter_http_time_to_503_seconds", 0.99);
    let p50 = quantile_from_metrics(&metrics, "limiter_http_time_to_503_seconds", 0.50);
    drop(daemon);

    let mut text = report(&targets.map(|t| t.0), &under, &over_targets.map(|t| t.0), &over, p50, p99);
    text.push_str(&bodies);
    Ok(text)
}

/// (3): 1 KiB POST bodies through this limiter, nginx and (if given) the
/// limiter of an earlier revision.
fn small_bodies(dir: &Path, upstream: SocketAddr, nginx_port: u16, auth: &str) -> Result<String> {
    let script = dir.join("post-1k.lua");
    fs::write(
        &script,
        "wrk.method = \"POST\"\nwrk.body = string.rep(\"x\", 1024)\nwrk.headers[\"Content-Type\"] = \"application/octet-stream\"\n",
    )?;
    let (config, limiter_addr) = limiter_config(dir, upstream, 100);
    let _now = Daemon::start(&config, &[])?;
    let mut targets = vec![
        ("limiter (this build)".to_owned(), format!("http://{limiter_addr}/")),
        ("nginx limit_conn".to_owned(), format!("http://127.0.0.1:{nginx_port}/")),
    ];
    let before = std::env::var_os("LIMITER_BIN_BEFORE").map(PathBuf::from);
    let _before = match &before {
        Some(bin) => {
            let (config, addr) = client::http_config(
                &dir.join("limiter-before"),
                Some(upstream),
                "http.maxThreads = 208\nhttp.maxSessionConnections = 100\nhttp.retryAfterMs = 1000\n",
            );
            let d = Daemon::start_binary(bin, &config, &[])?;
            let rev = std::env::var("LIMITER_BEFORE_REV").unwrap_or_else(|_| "before".into());
            targets.push((format!("limiter ({rev})"), format!("http://{addr}/")));
            Some(d)
        }
        None => None,
    };
    for (_, url) in &targets {
        let r = wrk_with(url, &[auth], Some(&script))?;
        ensure!(r.non_2xx_per_s == 0.0, "{url} answered non-2xx to small POSTs");
    }
    let n = targets.len();
    let mut runs: Vec<Vec<Run>> = vec![Vec::new(); n];
    for round in 0..ROUNDS {
        for k in 0..n {
            let i = (round + k) % n;
            runs[i].push(wrk_with(&targets[i].1, &[auth], Some(&script))?);
        }
        eprintln!("small-body round {}/{ROUNDS}", round + 1);
    }
    let med = |runs: &[Run], f: fn(&Run) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
    let mut out = String::from(
        "\n(3) Small bodies: 1 KiB POSTs, keep-alive, nginx upstream answering at once (limiter reads each body whole before admission)\n\n",
    );
    out.push_str("| path | requests/s | p50 ms | p99 ms |\n|---|---|---|---|\n");
    for (i, (name, _)) in targets.iter().enumerate() {
        out.push_str(&format!(
            "| {name} | {} | {:.2} | {:.2} |\n",
            spread(&runs[i].iter().map(|r| r.rps).collect::<Vec<_>>()),
            med(&runs[i], |r| r.p50_ms),
            med(&runs[i], |r| r.p99_ms),
        ));
    }
    let now = med(&runs[0], |r| r.rps);
    out.push_str(&format!("\nlimiter / nginx: {:.2}x", now / med(&runs[1], |r| r.rps)));
    if n > 2 {
        out.push_str(&format!("; this build / {}: {:.2}x", targets[2].0, now / med(&runs[2], |r| r.rps)));
    }
    out.push_str(".\n");
    Ok(out)
}

/// The upper bound of the first bucket holding quantile `q`.
fn quantile_from_metrics(text: &str, name: &str, q: f64) -> Option<f64> {
    let prefix = format!("{name}_bucket{{le=\"");
    let buckets: Vec<(f64, f64)> = text
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .filter_map(|rest| {
            let (le, count) = rest.split_once("\"} ")?;
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
            Some((le, count.parse().ok()?))
        })
        .collect();
    let total = buckets.last()?.1;
    buckets.iter().find(|(_, c)| *c >= q * total).map(|(le, _)| *le)
}

fn report(
    names: &[&str; 3],
    under: &[Vec<Run>],
    over_names: &[&str; 2],
    over: &[Vec<Run>],
    p50: Option<f64>,
    p99: Option<f64>,
) -> String {
    let col = |runs: &[Run], f: fn(&Run) -> f64| spread(&runs.iter().map(f).collect::<Vec<_>>());
    let med = |runs: &[Run], f: fn(&Run) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
    let mut out = format!(
        "wrk -t2 -c{CONNECTIONS} -d{SECONDS}s, {ROUNDS} interleaved rounds, {} CPUs (wrk, proxies and upstream share them).\n\
         Figures: median (min-max).\n\n",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    out.push_str("(1) Under the limit, keep-alive, nginx upstream answering at once\n\n");
    out.push_str("| path | requests/s | p50 ms | p99 ms |\n|---|---|---|---|\n");
    for (i, name) in names.iter().enumerate() {
        out.push_str(&format!(
            "| {name} | {} | {:.2} | {:.2} |\n",
            col(&under[i], |r| r.rps),
            med(&under[i], |r| r.p50_ms),
            med(&under[i], |r| r.p99_ms),
        ));
    }
    let (l_rps, n_rps) = (med(&under[1], |r| r.rps), med(&under[2], |r| r.rps));
    let (l_p99, n_p99) = (med(&under[1], |r| r.p99_ms), med(&under[2], |r| r.p99_ms));
    out.push_str(&format!(
        "\nTarget: limiter's throughput >= nginx's: {} ({:.2}x); p99 no worse: {} ({:.2} ms vs {:.2} ms).\n\n",
        if l_rps >= n_rps { "met" } else { "MISSED" },
        l_rps / n_rps,
        if l_p99 <= n_p99 { "met" } else { "MISSED" },
        l_p99,
        n_p99
    ));
    out.push_str("(2) Over the limit (10 per session, 50 connections), a new connection per request, upstream holding 100 ms\n\n");
    out.push_str("| proxy | 503/s | all responses/s | client p99 ms |\n|---|---|---|---|\n");
    for (i, name) in over_names.iter().enumerate() {
        out.push_str(&format!(
            "| {name} | {} | {} | {:.2} |\n",
            col(&over[i], |r| r.non_2xx_per_s),
            col(&over[i], |r| r.rps),
            med(&over[i], |r| r.p99_ms)
        ));
    }
    let (l503, n503) = (med(&over[0], |r| r.non_2xx_per_s), med(&over[1], |r| r.non_2xx_per_s));
    let fmt = |v: Option<f64>| v.map_or("n/a".to_owned(), |s| format!("{:.3} ms", s * 1000.0));
    out.push_str(&format!(
        "\nlimiter's server-side time-to-503 (its histogram, bucket upper bounds): p50 <= {}, p99 <= {}.\n\
         Targets: 503 rate >= nginx's: {} ({:.2}x); server-side time-to-503 p99 under 1 ms: {}.\n",
        fmt(p50),
        fmt(p99),
        if l503 >= n503 { "met" } else { "MISSED" },
        l503 / n503,
        if p99.is_some_and(|p| p <= 0.001) { "met" } else { "MISSED" },
    ));
    out
}
