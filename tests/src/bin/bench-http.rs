//! `cargo xtask bench http`: wrk against the upstream directly, limiter in
//! front of it, and nginx with `limit_conn` in front of it, for the same
//! limits, in one run, interleaved and repeated. Writes BENCHMARKS.md.
//!
//! (1) Under the limit, keep-alive: nginx (`return 200`) is the upstream;
//!     50 connections, per-session limit 100 keyed on `Authorization`.
//! (1b) The same, a new connection per request (`Connection: close`), each
//!     admitted and answered 200 by the upstream: the connection's own cost
//!     on the HTTP/1.1 path, not only a refusal's.
//! (2) Over the limit, a fresh connection per request (`Connection: close`
//!     for both proxies, so both close after the 503): the upstream holds
//!     each request 100 ms; per-session limit 10 against 50 connections, so
//!     most requests are refused. Reported: 503s per second, and limiter's
//!     own time-to-503 histogram.
//!
//! (3) Small bodies (1 KiB POST), keep-alive, the nginx upstream: limiter
//!     (which reads such a body whole before admission) beside nginx, and,
//!     with `LIMITER_BIN_BEFORE` (`cargo xtask bench http --before REV`;
//!     that build also runs in (1) and (1b), interleaved),
//!     beside the limiter of an earlier revision, interleaved in one run.
//!
//! The front door: limiter's TLS listener beside nginx's
//! (`ssl`, `http2`) in front of the upstream of (1):
//!
//! (4) HTTP/2 over TLS (ALPN h2), h2load: 50 connections with 10 streams
//!     each. h2load prints no percentiles, so p50 and p99 are computed here
//!     from its `--log-file` (one line per request with its duration).
//! (5) HTTP/1.1 over TLS, wrk keep-alive, 50 connections.
//! (6) A new connection per request over TLS: h2load `--h1` with 4,000
//!     clients of one request each, reported as handshakes per second.
//!     Every handshake is full: a client that connects once has no session
//!     to offer. (wrk and h2load reconnecting after `Connection: close`
//!     offer the previous connection's session, and both servers resume it:
//!     that would measure resumptions.)
//!
//! For (4)-(6) both sides use the same self-signed P-256 certificate, one
//! worker per core, limits far above the load, and resumption configured
//! alike: rustls' default (an in-memory cache of 256 sessions, stateful
//! TLS 1.3 tickets, no ticket key) against nginx's `ssl_session_cache
//! shared` with `ssl_session_tickets off` (OpenSSL then issues stateful
//! TLS 1.3 tickets too). Each row also reports the proxy's CPU time per
//! request (limiter's process, nginx's workers, from /proc), which says
//! whether a miss is the proxy's own cost.
//!
//! Counted, not timed (7): one worker each, keep-alive, `h2load --h1 -c10`
//! through limiter, nginx `limit_conn` (`master_process off`), the
//! hyper floor (`tests/src/bin/hyper-floor.rs`, the least a hyper proxy
//! does) to the upstream of (1): user-space instructions per request
//! (callgrind), system calls per request (`strace -c -f`), and limiter's
//! allocations per request (its `count-allocations` build, from
//! `LIMITER_BIN_COUNTING`). `BENCH_COUNTED_ONLY=1` runs (7) alone and
//! prints it, BENCHMARKS.md untouched; with `BENCH_KEEP=1` too, the
//! callgrind and strace outputs stay in the directory it names, for
//! `callgrind_annotate`.
//!
//! (8) The matrix of load shapes (`limiter_tests::matrix`): wrk with 1 and
//!     2 threads × 10, 50 and 200 connections × with and without an
//!     `Authorization` header × keep-alive and a new connection per
//!     request, and HTTP/1.1 over TLS, through limiter, nginx `limit_conn`
//!     and HAProxy (Debian's 2.6: `http-reuse always`, the server's
//!     `maxconn` at limiter's pool, a stick table for the per-session
//!     limit), each with as many workers or threads as CPUs; with the
//!     scheduler's figures and system calls per request of each. Its own
//!     section of BENCHMARKS.md (`http-matrix`); `BENCH_MATRIX_ALONE=1`
//!     runs it alone, and with `BENCH_MATRIX_HOLD=1` measures nothing: it
//!     prints the three servers' addresses and pids and keeps them up
//!     until its stdin closes, for a profiler.
//!
//! nginx is configured fairly: one worker per core, upstream keepalive,
//! `access_log off`. limiter runs without its kernel gate (not in the HTTP
//! path), and in (4)-(6) at its configured log level (info), not debug.

use std::{
    fs,
    io::Read as _,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail, ensure};
use limiter_tests::{
    Daemon,
    bench::{Run, cpu_seconds, median, spread},
    client,
    counted::{self, Load, Server},
    free_port,
    haproxy::{self, Haproxy},
    http_get, matrix,
    nginx::{self, Nginx},
    sched::{PerRequest, Sched},
    upstream::Upstream,
};

const ROUNDS: usize = 5;
const SECONDS: u32 = 5;
const CONNECTIONS: u32 = 50;

fn nginx(dir: &Path, name: &str, server: &str) -> Result<Nginx> {
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    Nginx::start(&dir.join(name), &format!("worker_processes {workers};"), server, None)
}

/// nginx's `limit_conn` proxy, listening on `listen`.
fn nginx_proxy_server(listen: u16, upstream: SocketAddr, per_session: u32) -> String {
    format!(
        "  upstream up {{ server {upstream}; keepalive 64; }}\n\
           limit_conn_zone $http_authorization zone=perauth:10m;\n\
           server {{\n    listen 127.0.0.1:{listen};\n    location / {{\n\
             limit_conn perauth {per_session};\n      limit_conn_status 503;\n\
             proxy_pass http://up;\n      proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n    }}\n  }}"
    )
}

fn wrk(url: &str, headers: &[&str]) -> Result<Run> {
    wrk_with(url, headers, None)
}

/// wrk with a Lua script (for a request with a body).
fn wrk_with(url: &str, headers: &[&str], script: Option<&Path>) -> Result<Run> {
    limiter_tests::bench::wrk(Command::new("wrk"), CONNECTIONS, SECONDS, url, headers, script)
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
    nginx(dir, name, &nginx_proxy_server(listen, upstream, per_session))
}

fn main() -> Result<()> {
    let dir = std::env::temp_dir().join(format!("limiter-bench-http-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir)?;
    if std::env::var_os("BENCH_COUNTED_ONLY").is_some() {
        let result = counted_alone(&dir);
        if std::env::var_os("BENCH_KEEP").is_some() {
            eprintln!("outputs kept in {}", dir.display());
        } else {
            let _ = fs::remove_dir_all(&dir);
        }
        print!("{}", result?);
        return Ok(());
    }
    if std::env::var_os("BENCH_MATRIX_ALONE").is_some() {
        let result = matrix(&dir);
        if std::env::var_os("BENCH_MATRIX_HOLD").is_some() {
            let _ = fs::remove_dir_all(&dir);
            return result.map(drop);
        }
        if std::env::var_os("BENCH_KEEP").is_some() {
            eprintln!("kept {}", dir.display());
        } else {
            let _ = fs::remove_dir_all(&dir);
        }
        return write_matrix(&result?);
    }
    let result = bench(&dir).and_then(|report| Ok((report, matrix(&dir)?)));
    let _ = fs::remove_dir_all(&dir);
    let (report, shapes) = result?;
    print!("{report}");
    limiter_tests::bench::write_section(
        "http",
        "HTTP admission",
        "`cargo xtask bench http` (installs nginx, HAProxy, wrk, h2load and openssl itself).",
        &report,
    )?;
    write_matrix(&shapes)
}

/// Prints the matrix and writes its section of BENCHMARKS.md.
fn write_matrix(report: &str) -> Result<()> {
    print!("{report}");
    limiter_tests::bench::write_section(
        "http-matrix",
        "HTTP load shapes: limiter, nginx and HAProxy",
        "`cargo xtask bench http` (the matrix alone: `BENCH_MATRIX_ALONE=1`; some shapes: \
         `BENCH_MATRIX_ONLY=-t1`; `BENCH_MATRIX_ROUNDS`, `BENCH_MATRIX_SECONDS`).",
        report,
    )
}

/// (8) The matrix of load shapes (`limiter_tests::matrix`): limiter, nginx
/// `limit_conn` and HAProxy with the same limits, plain and over TLS, in
/// front of an nginx upstream answering at once.
fn matrix(dir: &Path) -> Result<String> {
    let dir = dir.join("matrix");
    fs::create_dir_all(&dir)?;
    let (upstream, _origin) = origin(&dir)?;
    let (cert, key) = self_signed(&dir)?;
    let cores = cores();
    // Limits every shape stays under (200 connections of one session at
    // most): the cost of keeping them, not of refusing.
    let (pool, per_session) = (1000, 1000);
    let tls_port = free_port();
    let (config, limiter_addr) = client::http_config(
        &dir.join("limiter"),
        Some(upstream),
        &format!(
            // The normal pool is maxThreads - 8 - 3.
            "http.maxThreads = {}\nhttp.maxSessionConnections = {per_session}\nhttp.workers = {cores}\n\
             http.tls.listen = 127.0.0.1:{tls_port}\nhttp.tls.certFile = {}\nhttp.tls.keyFile = {}\n",
            pool + 8 + 3,
            cert.display(),
            key.display(),
        ),
    );
    // The matrix runs for about half an hour.
    let daemon = Daemon::start_with_config_log_level(&config)?.unwatched();
    let (nginx_port, nginx_tls) = (free_port(), free_port());
    let location = format!(
        "location / {{\n      limit_conn perauth {per_session};\n      limit_conn_status 503;\n\
         proxy_pass http://up;\n      proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n    }}"
    );
    let proxy = nginx(
        &dir,
        "nginx",
        &format!(
            "  upstream up {{ server {upstream}; keepalive 64; keepalive_requests 1000000; }}\n\
               limit_conn_zone $http_authorization zone=perauth:10m;\n\
               keepalive_requests 1000000;\n\
               server {{\n    listen 127.0.0.1:{nginx_port};\n    {location}\n  }}\n\
               server {{\n    listen 127.0.0.1:{nginx_tls} ssl;\n    ssl_certificate {cert};\n    ssl_certificate_key {key};\n\
                 ssl_protocols TLSv1.2 TLSv1.3;\n    ssl_session_cache shared:SSL:1m;\n    ssl_session_tickets off;\n    {location}\n  }}",
            cert = cert.display(),
            key = key.display(),
        ),
    )?;
    // HAProxy reads the certificate and its key from one file.
    let pem = dir.join("haproxy.pem");
    fs::write(&pem, [fs::read(&cert)?, fs::read(&key)?].concat())?;
    let (ha_port, ha_tls) = (free_port(), free_port());
    let ha = Haproxy::start(
        &dir.join("haproxy"),
        cores,
        &format!(
            "{}\nfrontend fe_tls\n  bind 127.0.0.1:{ha_tls} ssl crt {}\n  default_backend up\n",
            haproxy::limit_proxy(&format!("127.0.0.1:{ha_port}"), upstream, pool, per_session),
            pem.display()
        ),
    )?;
    let servers = [
        matrix::Server {
            name: "limiter".into(),
            http: format!("http://{limiter_addr}/"),
            https: Some(format!("https://127.0.0.1:{tls_port}/")),
            pids: vec![daemon.pid().as_raw() as u32],
        },
        matrix::Server {
            name: "nginx".into(),
            http: format!("http://127.0.0.1:{nginx_port}/"),
            https: Some(format!("https://127.0.0.1:{nginx_tls}/")),
            pids: proxy.workers(),
        },
        matrix::Server {
            name: "HAProxy".into(),
            http: format!("http://127.0.0.1:{ha_port}/"),
            https: Some(format!("https://127.0.0.1:{ha_tls}/")),
            pids: vec![ha.pid()],
        },
    ];
    if std::env::var_os("BENCH_MATRIX_HOLD").is_some() {
        // For a profiler: the three servers stay up until stdin closes.
        for s in &servers {
            eprintln!("matrix hold: {} {} {:?} pids {:?}", s.name, s.http, s.https, s.pids);
        }
        std::io::stdin().read_to_end(&mut Vec::new())?;
        return Ok(String::new());
    }
    let settings = matrix::Settings::from_env();
    let cells = matrix::run(&servers, &settings, "Authorization: Bearer bench-session").map_err(|e| {
        // What limiter said, should it be the one that failed.
        let log = daemon.log();
        let tail: Vec<&str> = log.lines().rev().take(20).collect();
        e.context(format!(
            "limiter's last log lines:\n{}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        ))
    })?;
    Ok(matrix::report(&servers, &cells, &settings))
}

/// A self-signed P-256 certificate for 127.0.0.1 and localhost under
/// `dir`: (certificate, key).
fn self_signed(dir: &Path) -> Result<(PathBuf, PathBuf)> {
    let tls = dir.join("tls");
    fs::create_dir_all(&tls)?;
    let (cert, key) = (tls.join("cert.pem"), tls.join("key.pem"));
    let path = |p: &Path| p.to_str().map(str::to_owned).context("a temporary path that is not UTF-8");
    let (key_path, cert_path) = (path(&key)?, path(&cert)?);
    let mut args: Vec<&str> = "req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \
                               -subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1"
        .split_whitespace()
        .collect();
    args.extend(["-keyout", &key_path, "-out", &cert_path]);
    limiter_tests::run("openssl", &args)?;
    Ok((cert, key))
}

fn bench(dir: &Path) -> Result<String> {
    let auth = "Authorization: Bearer bench-session";
    // (1) Under the limit: an nginx upstream that answers at once.
    let (upstream, origin_nginx) = origin(dir)?;
    let (config, limiter_addr) = limiter_config(dir, upstream, 100);
    let daemon = Daemon::start(&config, &[])?;
    let nginx_port = free_port();
    let proxy = nginx_proxy(dir, "proxy", nginx_port, upstream, 100)?;
    let mut targets = vec![
        ("upstream directly (nginx)".to_owned(), format!("http://{upstream}/")),
        ("limiter -> upstream".to_owned(), format!("http://{limiter_addr}/")),
        ("nginx limit_conn -> upstream".to_owned(), format!("http://127.0.0.1:{nginx_port}/")),
    ];
    // Whose scheduler figures each row reports: the server in front.
    let mut pids = vec![origin_nginx.workers(), vec![daemon.pid().as_raw() as u32], proxy.workers()];
    // With `--before REV`, that build's limiter too, interleaved.
    let _before = match std::env::var_os("LIMITER_BIN_BEFORE") {
        Some(bin) => {
            let (config, addr) = limiter_config(&dir.join("before"), upstream, 100);
            let d = Daemon::start_binary(Path::new(&bin), &config, &[])?;
            let rev = std::env::var("LIMITER_BEFORE_REV").unwrap_or_else(|_| "before".into());
            targets.push((format!("limiter at {rev} -> upstream"), format!("http://{addr}/")));
            pids.push(vec![d.pid().as_raw() as u32]);
            Some(d)
        }
        None => None,
    };
    let n = targets.len();
    for (_, url) in &targets {
        // Warm-up and a check that every path answers 200.
        let r = wrk(url, &[auth])?;
        ensure!(r.non_2xx_per_s == 0.0, "{url} answered non-2xx under the limit");
    }
    let mut under: Vec<Vec<Run>> = vec![Vec::new(); n];
    let mut under_sched = vec![(Sched::default(), 0.0); n];
    for round in 0..ROUNDS {
        for k in 0..n {
            let i = (round + k) % n;
            let before = Sched::of(&pids[i])?;
            let r = wrk(&targets[i].1, &[auth])?;
            let seen = Sched::of(&pids[i])?.since(before);
            under_sched[i] = (under_sched[i].0.plus(seen), under_sched[i].1 + r.rps * f64::from(SECONDS));
            under[i].push(r);
        }
        eprintln!("under-limit round {}/{ROUNDS}", round + 1);
    }
    let mut fresh: Vec<Vec<Run>> = vec![Vec::new(); n];
    let mut fresh_sched = vec![(Sched::default(), 0.0); n];
    for round in 0..ROUNDS {
        for k in 0..n {
            let i = (round + k) % n;
            let before = Sched::of(&pids[i])?;
            let r = wrk(&targets[i].1, &[auth, "Connection: close"])?;
            let seen = Sched::of(&pids[i])?.since(before);
            ensure!(r.non_2xx_per_s == 0.0, "{}: non-2xx under the limit on new connections", targets[i].1);
            fresh_sched[i] = (fresh_sched[i].0.plus(seen), fresh_sched[i].1 + r.rps * f64::from(SECONDS));
            fresh[i].push(r);
        }
        eprintln!("new-connection round {}/{ROUNDS}", round + 1);
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

    let names: Vec<&str> = targets.iter().map(|t| t.0.as_str()).collect();
    let mut text = report(&names, &under, &over_targets.map(|t| t.0), &over, p50, p99);
    text.push_str(&sched_report("(1)", &names, &under_sched));
    text.push_str(&fresh_report(&names, &fresh));
    text.push_str(&sched_report("(1b)", &names, &fresh_sched));
    text.push_str(&bodies);
    text.push_str(&front_door(dir, upstream, auth)?);
    text.push_str(&counted(dir, upstream)?);
    Ok(text)
}

/// The upstream of (1) and (7): nginx answering `200 ok` at once.
fn origin(dir: &Path) -> Result<(SocketAddr, Nginx)> {
    let up_port = free_port();
    let upstream: SocketAddr = format!("127.0.0.1:{up_port}").parse()?;
    let nginx = nginx(
        dir,
        "origin",
        &format!("  server {{ listen 127.0.0.1:{up_port}; location / {{ return 200 \"ok\\n\"; }} }}"),
    )?;
    Ok((upstream, nginx))
}

/// (7) with its own upstream.
fn counted_alone(dir: &Path) -> Result<String> {
    let (upstream, _origin) = origin(dir)?;
    counted(dir, upstream)
}

/// A limiter of one worker for the counted rows, on `upstream`, with
/// `extra` keys: the server, its configuration file and its address.
fn counted_limiter(dir: &Path, upstream: SocketAddr, extra: &str) -> (Server, PathBuf, SocketAddr) {
    let (config, addr) = client::http_config(
        dir,
        Some(upstream),
        &format!("http.maxThreads = 208\nhttp.workers = 1\nadmin.logLevel = info\n{extra}"),
    );
    let server = Server {
        name: "limiter",
        program: limiter_tests::limiter_bin(),
        args: vec!["run".into(), "--config".into(), config.display().to_string()],
        addr,
    };
    (server, config, addr)
}

/// nginx `limit_conn` of one worker, no master, for the counted rows.
fn counted_nginx(prefix: &Path, upstream: SocketAddr, per_session: u32) -> Result<Server> {
    let port = free_port();
    let conf = prefix.join("nginx.conf");
    fs::write(
        &conf,
        nginx::conf(
            prefix,
            "master_process off;\nworker_processes 1;",
            &nginx_proxy_server(port, upstream, per_session),
        ),
    )?;
    Ok(Server {
        name: "nginx limit_conn",
        program: "nginx".into(),
        args: vec!["-p".into(), prefix.display().to_string(), "-c".into(), conf.display().to_string()],
        addr: format!("127.0.0.1:{port}").parse()?,
    })
}

/// The counted table's rows; allocations are limiter's alone.
fn push_rows(text: &mut String, rows: &[(&str, counted::PerRequest)], limiter_allocations: &str) {
    for (name, r) in rows {
        let allocs = if *name == "limiter" { limiter_allocations } else { "-" };
        text.push_str(&format!("| {name} | {:.0} | {:.2} | {allocs} |\n", r.instructions, r.syscalls));
    }
}

/// (7): instructions, system calls and allocations per request.
fn counted(dir: &Path, upstream: SocketAddr) -> Result<String> {
    let (limiter, config, limiter_addr) = counted_limiter(&dir.join("counted-limiter"), upstream, "");
    let nginx = counted_nginx(&dir.join("counted-nginx"), upstream, 100)?;
    let floor_port = free_port();
    let floor = Server {
        name: "hyper floor",
        program: std::env::current_exe()?.with_file_name("hyper-floor"),
        args: vec![format!("127.0.0.1:{floor_port}"), upstream.to_string()],
        addr: format!("127.0.0.1:{floor_port}").parse()?,
    };
    let mut rows = Vec::new();
    for server in [&limiter, &nginx, &floor] {
        eprintln!("counting {} (callgrind, strace)", server.name);
        rows.push((server.name, counted::measure(server, dir, Load::KeepAlive("/"))?));
    }
    let counting = std::env::var_os("LIMITER_BIN_COUNTING");
    let allocations = |config: &Path, addr: SocketAddr, load: Load| -> Result<String> {
        Ok(match &counting {
            Some(bin) => {
                let daemon = Daemon::start_binary(Path::new(bin), config, &[])?;
                let a = counted::allocations(addr, daemon.admin, load)?;
                drop(daemon);
                format!("{a:.1}")
            }
            None => "not measured (LIMITER_BIN_COUNTING unset)".into(),
        })
    };
    let allocs_kept = allocations(&config, limiter_addr, Load::KeepAlive("/"))?;

    // Refused: one session's single slot held, a new connection per 503.
    let holding = Upstream::start();
    let (refusing, refusing_config, refusing_addr) = counted_limiter(
        &dir.join("counted-limiter-refusing"),
        holding.addr,
        "http.maxSessionConnections = 1\n",
    );
    let nginx_refusing = counted_nginx(&dir.join("counted-nginx-refusing"), holding.addr, 1)?;
    let mut refused = Vec::new();
    for server in [&refusing, &nginx_refusing] {
        eprintln!("counting {} refusing (callgrind, strace)", server.name);
        refused.push((server.name, counted::measure(server, dir, Load::Refused(&holding))?));
    }
    let allocs_refused = allocations(&refusing_config, refusing_addr, Load::Refused(&holding))?;
    let (l, n) = (rows[0].1, rows[1].1);
    let mut text = format!(
        "\n(7) Counted, not timed: one worker each, keep-alive, `h2load --h1 -c10`, {} minus {} requests \
         (start-up and shutdown cancel out), the upstream of (1):\n\n\
         | server | user-space instructions / request (callgrind) | system calls / request (strace -c -f) | allocations / request |\n\
         |---|---|---|---|\n",
        counted::MANY,
        counted::FEW
    );
    push_rows(&mut text, &rows, &allocs_kept);
    text.push_str(&format!(
        "\nTarget, instructions per request no more than nginx limit_conn's: {} ({:.2}x); system calls: {} ({:.2}x).\n",
        verdict(l.instructions <= n.instructions),
        l.instructions / n.instructions,
        verdict(l.syscalls <= n.syscalls),
        l.syscalls / n.syscalls
    ));
    text.push_str(&format!(
        "\nThe same, refused: a new connection per request (`Connection: close`), each answered 503 by the \
         session limit (one session of one slot, held by a request to the upstream of (2) meanwhile), \
         {} minus {} connections:\n\n\
         | server | user-space instructions / refused connection | system calls / refused connection | allocations / refused connection |\n\
         |---|---|---|---|\n",
        counted::MANY,
        counted::FEW
    ));
    push_rows(&mut text, &refused, &allocs_refused);
    let (l, n) = (refused[0].1, refused[1].1);
    text.push_str(&format!(
        "\nInstructions per refused connection against nginx limit_conn's: {:.2}x; system calls {:.2}x.\n",
        l.instructions / n.instructions,
        l.syscalls / n.syscalls
    ));
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
    names: &[&str],
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
    out.push_str(&path_table(names, under));
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
        verdict(l503 >= n503),
        l503 / n503,
        verdict(p99.is_some_and(|p| p <= 0.001)),
    ));
    out
}

/// What the scheduler saw of each row's server over all its rounds, per
/// request (`limiter_tests::sched`).
fn sched_report(row: &str, names: &[&str], runs: &[(Sched, f64)]) -> String {
    let mut out = format!(
        "\n{row}, what the scheduler saw of the server in front (all its threads, all rounds), per request:\n\n{}",
        PerRequest::HEADER
    );
    for (name, (sched, requests)) in names.iter().zip(runs) {
        out.push_str(&sched.per_request(*requests).row(name));
    }
    out
}

/// (1b): admitted requests, a new connection each.
fn fresh_report(names: &[&str], fresh: &[Vec<Run>]) -> String {
    format!(
        "\n(1b) Under the limit, a new connection per request (`Connection: close`), each answered 200\n\n{}",
        path_table(names, fresh)
    )
}

/// The rows of (1) and (1b), upstream directly, limiter, nginx; then the
/// target: limiter's throughput at least nginx's,
/// its p99 no worse.
fn path_table(names: &[&str], runs: &[Vec<Run>]) -> String {
    let med = |runs: &[Run], f: fn(&Run) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
    let mut out = "| path | requests/s | p50 ms | p99 ms |\n|---|---|---|---|\n".to_owned();
    for (i, name) in names.iter().enumerate() {
        out.push_str(&format!(
            "| {name} | {} | {:.2} | {:.2} |\n",
            spread(&runs[i].iter().map(|r| r.rps).collect::<Vec<_>>()),
            med(&runs[i], |r| r.p50_ms),
            med(&runs[i], |r| r.p99_ms),
        ));
    }
    let (l_rps, n_rps) = (med(&runs[1], |r| r.rps), med(&runs[2], |r| r.rps));
    let (l_p99, n_p99) = (med(&runs[1], |r| r.p99_ms), med(&runs[2], |r| r.p99_ms));
    out.push_str(&format!(
        "\nTarget: limiter's throughput >= nginx's: {} ({:.2}x); p99 no worse: {} ({l_p99:.2} ms vs {n_p99:.2} ms).\n\n",
        verdict(l_rps >= n_rps),
        l_rps / n_rps,
        verdict(l_p99 <= n_p99),
    ));
    out
}

/// "met" or "missed", for a target's verdict.
fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "missed" }
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

// (4)-(6): the front door.

/// Admission limits of the front-door rows, per session and in total, far
/// above what they hold at once: 500 streams in (4), [`HANDSHAKE_CLIENTS`]
/// requests in (6).
const FRONT_LIMIT: u32 = 8192;
/// (4): concurrent streams per HTTP/2 connection.
const STREAMS: u32 = 10;
/// (6): h2load clients, each making one connection with one request. At
/// about 1,000-1,500 handshakes per second on 2 shared CPUs a run takes
/// 3-4 s.
const HANDSHAKE_CLIENTS: u32 = 4000;

/// One front-door run.
#[derive(Clone, Copy, Debug)]
struct Sample {
    /// Requests (in (6): handshakes) per second.
    rate: f64,
    p50_ms: f64,
    p99_ms: f64,
    /// The proxy's CPU time (user + system) per request, in µs.
    cpu_us: f64,
}

/// A proxy under test: where to send the load, and the processes whose
/// CPU time is its cost.
struct Side {
    name: &'static str,
    url: String,
    pids: Vec<u32>,
}

/// What one h2load run printed.
struct H2load {
    succeeded: f64,
    rps: f64,
    /// Protocol, cipher, key exchange and ALPN, as h2load names them.
    negotiated: String,
    alpn: String,
}

/// Runs h2load and checks that every request it started in time answered
/// 2xx.
fn h2load(args: &[&str], url: &str) -> Result<H2load> {
    let out = Command::new("h2load").args(args).arg(url).output().context("run h2load")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let what = format!("h2load {} {url}", args.join(" "));
    ensure!(out.status.success(), "{what} failed: {text}{}", String::from_utf8_lossy(&out.stderr));
    let line = |prefix: &str| text.lines().find_map(|l| l.strip_prefix(prefix)).map(str::trim);
    // "finished in 5.01s, 42390.00 req/s, 1.17MB/s"
    let rps: f64 = line("finished in ")
        .and_then(|l| l.split(", ").nth(1)?.strip_suffix(" req/s")?.parse().ok())
        .with_context(|| format!("{what}: no req/s in its output: {text}"))?;
    // "requests: 50214 total, 50450 started, 50214 done, 50000 succeeded, 214 failed, 214 errored, 0 timeout"
    // "status codes: 50000 2xx, 0 3xx, 0 4xx, 0 5xx"
    let count = |prefix: &str, name: &str| -> Option<f64> {
        line(prefix)?.split(", ").find_map(|p| p.trim().strip_suffix(name))?.trim().parse().ok()
    };
    let (done, succeeded, ok) =
        (count("requests:", " done"), count("requests:", " succeeded"), count("status codes:", " 2xx"));
    let (Some(done), Some(succeeded), Some(ok)) = (done, succeeded, ok) else {
        bail!("{what}: no request counts in its output: {text}");
    };
    ensure!(
        done > 0.0 && succeeded == done && ok == done,
        "{what}: not every request answered 2xx:\n{}\n{}",
        line("requests:").unwrap_or(""),
        line("status codes:").unwrap_or("")
    );
    let negotiated = ["TLS Protocol:", "Cipher:", "Server Temp Key:", "Application protocol:"]
        .iter()
        .filter_map(|p| line(p))
        .collect::<Vec<_>>()
        .join(", ");
    let alpn = line("Application protocol:").unwrap_or("").to_owned();
    Ok(H2load { succeeded, rps, negotiated, alpn })
}

/// p50 and p99 of the request durations in an h2load `--log-file` (one
/// line per request: start time, status, duration in µs), in ms.
fn logged_quantiles(path: &Path) -> Result<(f64, f64)> {
    let text = fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    let mut us: Vec<f64> = text.lines().filter_map(|l| l.split_whitespace().nth(2)?.parse().ok()).collect();
    ensure!(!us.is_empty(), "{}: no requests logged", path.display());
    us.sort_by(f64::total_cmp);
    // The nearest-rank quantile: the smallest duration with at least q of
    // the requests at or below it.
    let q = |q: f64| us[((q * us.len() as f64).ceil() as usize).clamp(1, us.len()) - 1] / 1000.0;
    Ok((q(0.50), q(0.99)))
}

/// Whether this nginx has the `http2` directive (1.25.1 and later); older
/// ones take `http2` as a `listen` parameter.
fn nginx_has_http2_directive() -> Result<bool> {
    let out = Command::new("nginx").arg("-v").output().context("run nginx -v")?;
    // "nginx version: nginx/1.22.1" (on stderr)
    let text = String::from_utf8_lossy(&out.stderr);
    let version: Vec<u32> = text
        .split_once("nginx/")
        .and_then(|(_, v)| v.split_whitespace().next())
        .context("no version in `nginx -v`")?
        .split('.')
        .filter_map(|n| n.parse().ok())
        .collect();
    Ok(version >= vec![1, 25, 1])
}

/// nginx as the TLS front door, as limiter is configured: TLS 1.2 and
/// 1.3, ALPN h2 and http/1.1, at most 100 streams per connection, the
/// same `limit_conn` keyed on `Authorization` as (1). Its upstream
/// keepalive cache holds [`HANDSHAKE_CLIENTS`] idle connections per
/// worker, so that, like limiter's pool (which keeps every idle one), it
/// keeps the connections the busiest row needed ((1)'s 64 would make
/// nginx connect anew for most requests of (4) and (6)). And
/// `keepalive_requests` is lifted: its default of 1,000 would close each
/// client connection after 1,000 requests (h2load then loses that
/// connection's clients), where limiter has no such cap.
fn nginx_front_door(dir: &Path, listen: u16, upstream: SocketAddr, cert: &Path, key: &Path) -> Result<Nginx> {
    let (listen_http2, http2_on) =
        if nginx_has_http2_directive()? { ("", "\n    http2 on;") } else { (" http2", "") };
    nginx(
        dir,
        "front-door",
        &format!(
            "  upstream up {{ server {upstream}; keepalive {HANDSHAKE_CLIENTS}; }}\n\
               limit_conn_zone $http_authorization zone=perauth:10m;\n\
               server {{\n    listen 127.0.0.1:{listen} ssl{listen_http2};{http2_on}\n\
                 ssl_certificate {cert};\n    ssl_certificate_key {key};\n\
                 ssl_protocols TLSv1.2 TLSv1.3;\n\
                 ssl_session_cache shared:SSL:1m;\n    ssl_session_tickets off;\n\
                 http2_max_concurrent_streams 100;\n    keepalive_requests 1000000;\n\
                 location / {{\n      limit_conn perauth {FRONT_LIMIT};\n      limit_conn_status 503;\n\
                 proxy_pass http://up;\n      proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n    }}\n  }}",
            cert = cert.display(),
            key = key.display(),
        ),
    )
}

/// Runs `one` against each side once (a warm-up, which also checks it),
/// then [`ROUNDS`] interleaved rounds; the runs of each side.
fn interleaved(
    what: &str,
    sides: &[Side; 2],
    mut one: impl FnMut(usize, &Side) -> Result<Sample>,
) -> Result<[Vec<Sample>; 2]> {
    for (i, side) in sides.iter().enumerate() {
        one(i, side)?;
    }
    let mut runs = [Vec::new(), Vec::new()];
    for round in 0..ROUNDS {
        for k in 0..2 {
            let i = (round + k) % 2;
            runs[i].push(one(i, &sides[i])?);
        }
        eprintln!("{what} round {}/{ROUNDS}", round + 1);
    }
    Ok(runs)
}

/// (4)-(6): limiter's TLS listener beside nginx's, in front of the upstream
/// of (1).
fn front_door(dir: &Path, upstream: SocketAddr, auth: &str) -> Result<String> {
    let (cert, key) = self_signed(dir)?;
    let cores = cores();
    let tls_port = free_port();
    let (config, _) = client::http_config(
        &dir.join("limiter-tls"),
        Some(upstream),
        &format!(
            // The normal pool is maxThreads - 8 - 3 (README).
            "http.maxThreads = {}\nhttp.maxSessionConnections = {FRONT_LIMIT}\nhttp.retryAfterMs = 1000\n\
             http.workers = {cores}\nhttp.accessLog = off\nhttp.h2.maxConcurrentStreams = 100\n\
             http.tls.listen = 127.0.0.1:{tls_port}\nhttp.tls.certFile = {}\nhttp.tls.keyFile = {}\n",
            FRONT_LIMIT + 8 + 3,
            cert.display(),
            key.display(),
        ),
    );
    let daemon = Daemon::start_with_config_log_level(&config)?;
    let nginx_port = free_port();
    let proxy = nginx_front_door(dir, nginx_port, upstream, &cert, &key)?;
    let workers = proxy.workers();
    ensure!(
        !workers.is_empty(),
        "the front-door nginx has no workers:\n{}",
        fs::read_to_string(dir.join("front-door/logs/error.log")).unwrap_or_default()
    );
    let sides = [
        Side {
            name: "limiter",
            url: format!("https://127.0.0.1:{tls_port}/"),
            pids: vec![daemon.pid().as_raw() as u32],
        },
        Side { name: "nginx", url: format!("https://127.0.0.1:{nginx_port}/"), pids: workers },
    ];
    let mut negotiated = [String::new(), String::new()];

    // (4) HTTP/2 over TLS.
    let log = dir.join("h2load.log");
    let h2_args = [
        "-t2".to_owned(),
        format!("-c{CONNECTIONS}"),
        format!("-m{STREAMS}"),
        format!("-D{SECONDS}"),
        format!("--log-file={}", log.display()),
        "-H".to_owned(),
        auth.to_owned(),
    ];
    let h2 = interleaved("HTTP/2 over TLS", &sides, |i, side| {
        let _ = fs::remove_file(&log); // h2load appends to it
        let before = cpu_seconds(&side.pids);
        let r = h2load(&h2_args.iter().map(String::as_str).collect::<Vec<_>>(), &side.url)?;
        let cpu = cpu_seconds(&side.pids) - before;
        ensure!(r.alpn == "h2", "{}: negotiated {:?}, not h2", side.url, r.alpn);
        negotiated[i] = r.negotiated;
        let (p50_ms, p99_ms) = logged_quantiles(&log)?;
        Ok(Sample { rate: r.rps, p50_ms, p99_ms, cpu_us: cpu / r.succeeded * 1e6 })
    })?;

    // (5) HTTP/1.1 over TLS (wrk offers no ALPN: HTTP/1.1 on both).
    let h1 = interleaved("HTTP/1.1 over TLS", &sides, |_, side| {
        let before = cpu_seconds(&side.pids);
        let r = wrk(&side.url, &[auth])?;
        let cpu = cpu_seconds(&side.pids) - before;
        ensure!(r.non_2xx_per_s == 0.0, "{} answered non-2xx over TLS", side.url);
        Ok(Sample {
            rate: r.rps,
            p50_ms: r.p50_ms,
            p99_ms: r.p99_ms,
            cpu_us: cpu / (r.rps * f64::from(SECONDS)) * 1e6,
        })
    })?;

    // (6) A full handshake per request.
    let clients = format!("{HANDSHAKE_CLIENTS}");
    let hs_args = ["--h1", "-t2", "-c", &clients, "-n", &clients, "-H", auth];
    let hs = interleaved("TLS handshake", &sides, |_, side| {
        let before = cpu_seconds(&side.pids);
        let r = h2load(&hs_args, &side.url)?;
        let cpu = cpu_seconds(&side.pids) - before;
        ensure!(r.alpn == "http/1.1", "{}: negotiated {:?}, not http/1.1", side.url, r.alpn);
        Ok(Sample { rate: r.rps, p50_ms: f64::NAN, p99_ms: f64::NAN, cpu_us: cpu / r.succeeded * 1e6 })
    })?;
    drop(daemon);

    Ok(front_door_report(&sides, &negotiated, &h2, &h1, &hs))
}

fn front_door_report(
    sides: &[Side; 2],
    negotiated: &[String; 2],
    h2: &[Vec<Sample>; 2],
    h1: &[Vec<Sample>; 2],
    hs: &[Vec<Sample>; 2],
) -> String {
    let values = |runs: &[Sample], f: fn(&Sample) -> f64| runs.iter().map(f).collect::<Vec<_>>();
    let med = |runs: &[Sample], f: fn(&Sample) -> f64| median(&values(runs, f));
    let ms = |runs: &[Sample], f: fn(&Sample) -> f64| {
        let v = values(runs, f);
        let (min, max) =
            (v.iter().copied().fold(f64::INFINITY, f64::min), v.iter().copied().fold(0.0, f64::max));
        format!("{:.2} ({min:.2}-{max:.2})", median(&v))
    };
    let cores = cores();
    // What a missed row's own figures say about it.
    let limits = |runs: &[Vec<Sample>; 2], unit: &str| -> String {
        let (l, n) = (med(&runs[0], |s| s.cpu_us), med(&runs[1], |s| s.cpu_us));
        if l > n {
            format!(
                "What limits it: CPU. limiter spends {l:.0} µs of CPU per {unit} against nginx's {n:.0} µs ({:.2}x); \
                 the load generator, both proxies and the upstream share the {cores} CPUs, so every µs the proxy \
                 spends is taken from the others.\n",
                l / n
            )
        } else {
            format!(
                "limiter's CPU per {unit} ({l:.0} µs) is not above nginx's ({n:.0} µs), so its CPU cost does not \
                 explain the miss; the rest is in when the work is done (scheduling, how writes are batched), \
                 which this program does not measure.\n"
            )
        }
    };
    let mut out = format!(
        "\nFront door (TLS and HTTP/2): limiter's TLS listener beside nginx (`ssl`, `http2`), {cores} workers each, the same \
         self-signed P-256 certificate, the upstream of (1), limits of {FRONT_LIMIT} (never reached). Session resumption \
         alike: rustls' default (256-session cache, stateful TLS 1.3 tickets, no ticket key) and nginx \
         `ssl_session_cache shared:SSL:1m; ssl_session_tickets off` (stateful TLS 1.3 tickets). CPU: user + system \
         time of limiter's process and of nginx's workers over each run (/proc), per request. {ROUNDS} \
         interleaved rounds per row.\n\
         Negotiated (h2load): limiter {}; nginx {}.\n",
        negotiated[0], negotiated[1]
    );
    let latency_row = |out: &mut String, title: &str, runs: &[Vec<Sample>; 2]| {
        out.push_str(title);
        out.push_str(
            "| proxy | requests/s | p50 ms | p99 ms | proxy CPU µs per request |\n|---|---|---|---|---|\n",
        );
        for (side, r) in sides.iter().zip(runs) {
            out.push_str(&format!(
                "| {} | {} | {:.2} | {} | {:.1} |\n",
                side.name,
                spread(&values(r, |s| s.rate)),
                med(r, |s| s.p50_ms),
                ms(r, |s| s.p99_ms),
                med(r, |s| s.cpu_us),
            ));
        }
        let (l_rate, n_rate) = (med(&runs[0], |s| s.rate), med(&runs[1], |s| s.rate));
        let (l_p99, n_p99) = (med(&runs[0], |s| s.p99_ms), med(&runs[1], |s| s.p99_ms));
        out.push_str(&format!(
            "\nTargets: throughput >= nginx's: {} ({:.2}x); p99 no worse: {} ({l_p99:.2} ms vs {n_p99:.2} ms).\n",
            verdict(l_rate >= n_rate),
            l_rate / n_rate,
            verdict(l_p99 <= n_p99),
        ));
        if l_rate < n_rate || l_p99 > n_p99 {
            out.push_str(&limits(runs, "request"));
        }
    };
    latency_row(
        &mut out,
        &format!(
            "\n(4) HTTP/2 over TLS (ALPN h2): h2load -t2 -c{CONNECTIONS} -m{STREAMS} -D {SECONDS}, {} streams in \
             flight; p50 and p99 computed from h2load's --log-file (every request's duration)\n\n",
            CONNECTIONS * STREAMS
        ),
        h2,
    );
    latency_row(
        &mut out,
        &format!(
            "\n(5) HTTP/1.1 over TLS, keep-alive: wrk -t2 -c{CONNECTIONS} -d{SECONDS}s --latency (p50, p99: wrk's)\n\n"
        ),
        h1,
    );
    out.push_str(&format!(
        "\n(6) A new connection per request over TLS: h2load --h1 -t2 -c{HANDSHAKE_CLIENTS} -n{HANDSHAKE_CLIENTS}, \
         each client one connection with one request, so every handshake is full (no client has a session to \
         offer); all clients start at once, so no latency is reported (each one's is its place in the queue)\n\n\
         | proxy | handshakes/s | proxy CPU µs per connection |\n|---|---|---|\n"
    ));
    for (side, r) in sides.iter().zip(hs) {
        out.push_str(&format!(
            "| {} | {} | {:.1} |\n",
            side.name,
            spread(&values(r, |s| s.rate)),
            med(r, |s| s.cpu_us)
        ));
    }
    let (l, n) = (med(&hs[0], |s| s.rate), med(&hs[1], |s| s.rate));
    out.push_str(&format!("\nTarget: handshakes/s >= nginx's: {} ({:.2}x).\n", verdict(l >= n), l / n));
    if l < n {
        out.push_str(&limits(hs, "connection"));
    }
    out
}
