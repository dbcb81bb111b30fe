//! `cargo xtask bench adaptive`: the adaptive limit against its peers, in
//! one run, on loopback. The upstream (`limiter_tests::upstream`'s
//! `/work`) serves `C` requests at once, `S` ms each, and queues the rest,
//! as servlets wait for a database pool; closed-loop clients at eight
//! times `C` (each pauses 20 ms after a 503). Peers, each behind the same
//! upstream: limiter with its static pool (`http.maxThreads = 208`: 197),
//! limiter with `http.adaptive = on` under that ceiling, nginx
//! `limit_conn` at 197, and Netflix's Gradient2 and Vegas as `tower-acc`
//! implements them, in a minimal hyper proxy (`peers/acc-proxy`) that
//! refuses at the limit with `tower::load_shed`, bounded to the same
//! `[2, 197]`.
//!
//! One timeline per peer: steady overload (0-10 s), capacity halved
//! (10-20 s) and restored (20-30 s), a 500 ms stall of the upstream (at
//! 30 s), the service time doubled for 30 s (35-65 s) and restored; then,
//! on a fresh peer, 60 s of clients at half the upstream's capacity.
//! Everything is measured at the clients, so every peer is measured alike:
//! the admitted requests' p99 and goodput, how long a 503 took, how long
//! each change took to be followed, and the concurrency the peer admitted
//! (Σ latency of the 200s / time, Little's law: the limit in effect).
//! Writes BENCHMARKS.md.

use std::{
    net::SocketAddr,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use limiter_tests::{
    Daemon,
    client::http_config,
    closed_loop::{Answer, ClosedLoop, window},
    free_port,
    nginx::Nginx,
    upstream::Upstream,
};

const C: u32 = 8;
const S: u64 = 20;
const CLIENTS: usize = 8 * C as usize;
const CEILING: u32 = 197;
const MIN: u32 = 2;
const BACKOFF: Duration = Duration::from_millis(20);
/// The upstream's most answers a second.
const CAPACITY: f64 = C as f64 * 1000.0 / S as f64;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Peer {
    Static,
    Adaptive,
    Nginx,
    Gradient2,
    Vegas,
}

const PEERS: [Peer; 5] = [Peer::Adaptive, Peer::Static, Peer::Nginx, Peer::Gradient2, Peer::Vegas];

impl Peer {
    fn name(self) -> &'static str {
        match self {
            Self::Static => "limiter, static pool (197)",
            Self::Adaptive => "limiter, http.adaptive = on",
            Self::Nginx => "nginx limit_conn 197",
            Self::Gradient2 => "tower-acc Gradient2",
            Self::Vegas => "tower-acc Vegas",
        }
    }
}

/// A running peer; stopped on drop.
enum Running {
    Limiter(Daemon, std::path::PathBuf),
    Nginx { _nginx: Nginx, dir: std::path::PathBuf },
    Acc(Child),
}

impl Drop for Running {
    fn drop(&mut self) {
        match self {
            Self::Limiter(_, dir) | Self::Nginx { dir, .. } => {
                let _ = std::fs::remove_dir_all(dir);
            }
            Self::Acc(child) => {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

fn start(peer: Peer, upstream: SocketAddr, run: usize) -> Result<(Running, SocketAddr)> {
    let dir = std::env::temp_dir().join(format!("bench-adaptive-{}-{run}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    match peer {
        Peer::Static | Peer::Adaptive => {
            let extra = if peer == Peer::Adaptive {
                format!("http.maxThreads = 208\nhttp.adaptive = on\nhttp.adaptive.minLimit = {MIN}\n")
            } else {
                "http.maxThreads = 208\n".to_owned()
            };
            let (config, proxy) = http_config(&dir, Some(upstream), &extra);
            Ok((Running::Limiter(Daemon::start(&config, &[])?, dir), proxy))
        }
        Peer::Nginx => {
            let port = free_port();
            let server = format!(
                "  upstream up {{ server {upstream}; keepalive 64; }}\n\
                   limit_conn_zone $server_name zone=pool:1m;\n\
                   server {{\n    listen 127.0.0.1:{port};\n    server_name adaptive;\n\
                     location / {{\n      limit_conn pool {CEILING};\n      limit_conn_status 503;\n\
                     proxy_pass http://up;\n      proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n    }}\n  }}"
            );
            let nginx = Nginx::start(&dir, "worker_processes 2;", &server, None)?;
            Ok((Running::Nginx { _nginx: nginx, dir }, format!("127.0.0.1:{port}").parse()?))
        }
        Peer::Gradient2 | Peer::Vegas => {
            let port = free_port();
            let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
            let bin = std::env::var("ACC_PROXY_BIN")
                .context("ACC_PROXY_BIN (set by `cargo xtask bench adaptive`)")?;
            let algorithm = if peer == Peer::Gradient2 { "gradient2" } else { "vegas" };
            let child = Command::new(bin)
                .args([
                    addr.to_string(),
                    upstream.to_string(),
                    algorithm.into(),
                    MIN.to_string(),
                    CEILING.to_string(),
                ])
                .stdout(Stdio::null())
                .spawn()?;
            let deadline = Instant::now() + Duration::from_secs(5);
            while std::net::TcpStream::connect(addr).is_err() {
                anyhow::ensure!(Instant::now() < deadline, "acc-proxy did not listen on {addr}");
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok((Running::Acc(child), addr))
        }
    }
}

/// Admitted concurrency over `[from, to)`: Σ latency of the 200s / time.
fn admitted(answers: &[Answer], from: Duration, to: Duration) -> f64 {
    let sum: f64 = answers
        .iter()
        .filter(|a| a.status == 200 && a.at >= from && a.at < to)
        .map(|a| a.latency.as_secs_f64())
        .sum();
    sum / (to - from).as_secs_f64()
}

/// The first time from `from` (by 100 ms, until `to`) at which the next
/// `span` satisfies `ok` (given its goodput, p99 and admitted
/// concurrency), as a delay from `from`.
fn first(
    answers: &[Answer],
    from: Duration,
    to: Duration,
    span: Duration,
    ok: impl Fn(f64, Duration, f64) -> bool,
) -> Option<Duration> {
    let mut t = from;
    while t + span <= to {
        let w = window(answers, t, t + span, None);
        if ok(w.goodput, w.p99, admitted(answers, t, t + span)) {
            return Some(t - from);
        }
        t += Duration::from_millis(100);
    }
    None
}

#[derive(Debug, Default)]
struct Figures {
    p99: Duration,
    goodput: f64,
    refused_p99: Duration,
    failed: usize,
    down: Option<Duration>,
    up: Option<Duration>,
    stall: Option<Duration>,
    /// Admitted concurrency before the slowdown, in its last 10 s, and
    /// how long after it the goodput and p99 were back.
    before: f64,
    slow: f64,
    back: Option<Duration>,
    half_refused: usize,
    half_goodput: f64,
    /// limiter's own limit (adaptive only): its mean while steady and in
    /// the last 10 s of the slowdown, and its most during the slowdown.
    limit_steady: Option<f64>,
    limit_slow: Option<f64>,
    limit_slow_max: Option<f64>,
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

fn sleep_until(load: &ClosedLoop, t: Duration, daemon: Option<&Daemon>, limits: &mut Vec<(Duration, f64)>) {
    while load.started.elapsed() < t {
        if let Some(d) = daemon {
            limits.push((load.started.elapsed(), d.metric("limiter_http_limit{pool=\"normal\"}")));
        }
        std::thread::sleep(Duration::from_millis(250).min(t.saturating_sub(load.started.elapsed())));
    }
}

fn measure(peer: Peer, run: usize) -> Result<Figures> {
    let upstream = Upstream::start();
    upstream.set_capacity(C);
    let (running, addr) = start(peer, upstream.addr, run)?;
    let daemon = match &running {
        Running::Limiter(d, _) if peer == Peer::Adaptive => Some(d),
        _ => None,
    };
    let path = format!("/work?ms={S}");
    let mut limits = Vec::new();
    let load = ClosedLoop::start(addr, CLIENTS, &[&path], BACKOFF);
    sleep_until(&load, secs(10.0), daemon, &mut limits);
    upstream.set_capacity(C / 2);
    sleep_until(&load, secs(20.0), daemon, &mut limits);
    upstream.set_capacity(C);
    sleep_until(&load, secs(30.0), daemon, &mut limits);
    upstream.stall(Duration::from_millis(500));
    let stall_end = load.started.elapsed();
    sleep_until(&load, secs(35.0), daemon, &mut limits);
    upstream.set_service_percent(200);
    sleep_until(&load, secs(65.0), daemon, &mut limits);
    upstream.set_service_percent(100);
    sleep_until(&load, secs(73.0), daemon, &mut limits);
    let answers = load.stop();

    let steady = window(&answers, secs(3.0), secs(10.0), None);
    let p99_ok = Duration::from_millis(4 * S);
    let mut f = Figures {
        p99: steady.p99,
        goodput: steady.goodput,
        refused_p99: steady.refused_p99,
        failed: answers.iter().filter(|a| a.status != 200 && a.status != 503).count(),
        // Followed down: what it admits queues at most half the new
        // capacity again (admitted concurrency within 1.5 C/2), while
        // still serving 80 % of it.
        down: first(&answers, secs(10.0), secs(20.0), secs(1.0), |g, _, n| {
            g >= 0.8 * CAPACITY / 2.0 && n <= 1.5 * f64::from(C / 2)
        }),
        up: first(&answers, secs(20.0), secs(30.0), secs(1.0), |g, _, _| g >= 0.9 * CAPACITY),
        stall: first(&answers, stall_end, secs(35.0), secs(0.5), |g, _, _| g >= 0.8 * CAPACITY),
        before: admitted(&answers, secs(3.0), secs(10.0)),
        slow: admitted(&answers, secs(55.0), secs(65.0)),
        back: first(&answers, secs(65.0), secs(73.0), secs(1.0), |g, p, _| {
            g >= 0.9 * CAPACITY && p <= p99_ok
        }),
        ..Figures::default()
    };
    if daemon.is_some() {
        let within = |a: f64, b: f64| {
            limits.iter().filter(move |(t, _)| (secs(a)..secs(b)).contains(t)).map(|(_, l)| *l)
        };
        let mean = |v: Vec<f64>| v.iter().sum::<f64>() / v.len().max(1) as f64;
        f.limit_steady = Some(mean(within(3.0, 10.0).collect()));
        f.limit_slow = Some(mean(within(55.0, 65.0).collect()));
        f.limit_slow_max = within(40.0, 65.0).reduce(f64::max);
    }
    drop(running);

    // 60 s at half the upstream's capacity, on a fresh peer.
    let upstream = Upstream::start();
    upstream.set_capacity(C);
    let (running, addr) = start(peer, upstream.addr, run + 100)?;
    let load = ClosedLoop::start(addr, (C / 2) as usize, &[&path], BACKOFF);
    std::thread::sleep(Duration::from_secs(60));
    let answers = load.stop();
    drop(running);
    let half = window(&answers, Duration::ZERO, secs(60.0), None);
    f.half_refused = half.refused + half.failed;
    f.half_goodput = half.goodput;
    eprintln!("{}: {f:?}", peer.name());
    Ok(f)
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

fn delay(d: Option<Duration>) -> String {
    d.map_or_else(|| "never".to_owned(), |d| format!("{:.1} s", d.as_secs_f64()))
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "**missed**" }
}

fn report(rows: &[(Peer, Figures)]) -> String {
    let mut out = format!(
        "On loopback, 2 CPUs shared by everything: an upstream serving {C} requests at once, {S} ms each \
         (at most {CAPACITY:.0} a second), the rest queued; {CLIENTS} closed-loop keep-alive clients (each pauses \
         20 ms after a 503). Measured at the clients. \"Admitted concurrency\" is the sum of the 200s' latencies \
         over the time (Little's law): the limit a peer enforced in effect, whatever it reports.\n\n\
         | peer | admitted p99 (ms) | goodput (/s) | 503 p99 (ms) | followed C to C/2 (admitted concurrency ≤ 1.5 C/2, goodput ≥ 80 %) | followed C/2 to C (goodput ≥ 90 %) | \
         back above 80 % after a 500 ms stall | admitted concurrency, steady / last 10 s of S doubled | back after S \
         restored (goodput ≥ 90 %, p99 ≤ 4 S) | refused at half capacity, 60 s | neither 200 nor 503 |\n|---|---|---|---|---|---|---|---|---|---|---|\n"
    );
    for (peer, f) in rows {
        out.push_str(&format!(
            "| {} | {} | {:.0} | {} | {} | {} | {} | {:.1} / {:.1} | {} | {} of {:.0}/s | {} |\n",
            peer.name(),
            ms(f.p99),
            f.goodput,
            ms(f.refused_p99),
            delay(f.down),
            delay(f.up),
            delay(f.stall),
            f.before,
            f.slow,
            delay(f.back),
            f.half_refused,
            f.half_goodput,
            f.failed,
        ));
    }
    let Some((_, a)) = rows.iter().find(|(p, _)| *p == Peer::Adaptive) else {
        return out;
    };
    let five = Duration::from_secs(5);
    out.push_str(&format!(
        "\nlimiter's own limit (`limiter_http_limit{{pool=\"normal\"}}`, sampled every 250 ms): {:.1} on average \
         while steady, {:.1} on average in the last 10 s of the doubled service time, at most {:.0} during it (the \
         sawtooth of growth and descents peaks above its mean in steady state too).\n\n\
         Targets for `http.adaptive = on`:\n\n| target | figure | |\n|---|---|---|\n\
         | admitted p99 ≤ 4 S ({} ms) | {} ms | {} |\n\
         | goodput ≥ 90 % of {CAPACITY:.0}/s | {:.0}/s | {} |\n\
         | 503s in under 10 ms | p99 {} ms | {} |\n\
         | a step to C/2 followed within 5 s | {} | {} |\n\
         | and back to C within 5 s | {} | {} |\n\
         | at half of capacity for 60 s, zero refusals | {} | {} |\n\
         | after a single 500 ms stall, goodput above 80 % within 2 s | {} | {} |\n\
         | S doubled for 30 s: the limit drifts up by no more than a fifth | admitted concurrency {:.1} before, {:.1} in its last 10 s; mean limit {:.1} before, {:.1} in its last 10 s | {} |\n\
         | and it returns within 5 s after | {} | {} |\n",
        a.limit_steady.unwrap_or(f64::NAN),
        a.limit_slow.unwrap_or(f64::NAN),
        a.limit_slow_max.unwrap_or(f64::NAN),
        4 * S,
        ms(a.p99),
        verdict(a.p99 <= Duration::from_millis(4 * S)),
        a.goodput,
        verdict(a.goodput >= 0.9 * CAPACITY),
        ms(a.refused_p99),
        verdict(a.refused_p99 < Duration::from_millis(10)),
        delay(a.down),
        verdict(a.down.is_some_and(|d| d <= five)),
        delay(a.up),
        verdict(a.up.is_some_and(|d| d <= five)),
        a.half_refused,
        verdict(a.half_refused == 0),
        delay(a.stall),
        verdict(a.stall.is_some_and(|d| d <= Duration::from_secs(2))),
        a.before,
        a.slow,
        a.limit_steady.unwrap_or(f64::NAN),
        a.limit_slow.unwrap_or(f64::NAN),
        verdict(a.slow <= 1.2 * a.before && a.limit_slow.unwrap_or(f64::INFINITY) <= 1.2 * a.limit_steady.unwrap_or(0.0)),
        delay(a.back),
        verdict(a.back.is_some_and(|d| d <= five)),
    ));
    out
}

fn main() -> Result<()> {
    limiter_tests::raise_fd_limit();
    let only: Option<String> = std::env::var("BENCH_PEERS").ok();
    let mut rows = Vec::new();
    for (i, peer) in PEERS.into_iter().enumerate() {
        if only.as_ref().is_some_and(|o| !o.split(',').any(|w| peer.name().contains(w))) {
            continue;
        }
        eprintln!("bench adaptive: {}", peer.name());
        rows.push((peer, measure(peer, i)?));
    }
    let report = report(&rows);
    println!("{report}");
    if only.is_none() {
        limiter_tests::bench::write_section(
            "adaptive",
            "Adaptive limit against its peers",
            "`cargo xtask bench adaptive` (as root; about 12 minutes). `BENCH_PEERS=Vegas,adaptive` runs only \
             the peers whose names contain one of the words, and writes nothing.",
            &report,
        )?;
    }
    Ok(())
}
