//! `cargo xtask bench scrape`: what a Prometheus scrape costs the daemon,
//! this build against the last build of pinned layout 2 (which read every
//! slot of the source table on every scrape), in one run, for a source
//! table of 65,536 and of 1,048,576 slots holding connections from 1,000
//! client groups. Prints the figures and writes them into BENCHMARKS.md.
//!
//! For each build and size:
//! - the first `/metrics` of the process, and the median of 20 more with
//!   nothing changed in between, and of 20 with 100 groups' connections
//!   closed and reopened before each;
//! - `/healthz` latency (median, 99th percentile, worst of 400) while 50
//!   clients scrape `/metrics` back to back, and the scrape rate then;
//! - the `bpf(2)` calls a scrape makes of the source table (this build
//!   reports them in `/status`; layout 2 made one per 8,192 slots).

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream},
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use limiter_tests::{Daemon, Sandbox, accept_n, bench::median, client, peer::connect_from};

const PORT: u16 = 7300;
const GROUPS: u32 = 1000;
const CHURN: u32 = 100;
const SCRAPERS: usize = 50;
const PROBES: usize = 400;

struct Figures {
    first_ms: f64,
    unchanged_ms: f64,
    churn_ms: f64,
    healthz: [f64; 3],
    scrapes_per_s: f64,
    calls: Option<[u64; 3]>,
}

fn get(addr: SocketAddr, path: &str) -> Result<(u16, Duration, String)> {
    let raw = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    let started = Instant::now();
    let r = client::send(addr, raw.as_bytes())?;
    Ok((r.status, started.elapsed(), r.text()))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// One client connection from group `g` (127.1.x.y/32), held with its
/// accepted end.
fn open(sb: &Sandbox, listener: &std::net::TcpListener, g: u32) -> Result<(TcpStream, TcpStream)> {
    let src = IpAddr::V4(Ipv4Addr::new(127, 1, (g >> 8) as u8, g as u8));
    let dst = SocketAddr::from((Ipv4Addr::LOCALHOST, PORT));
    let c = sb.in_netns(move || connect_from(dst, Some(src))).with_context(|| format!("group {g}"))?;
    Ok((c, accept_n(listener, 1).remove(0)))
}

fn measure(bin: &Path, slots: u32, new_build: bool) -> Result<Figures> {
    let sb = Sandbox::new()?;
    let config = sb.config(
        &format!("{PORT}:100000"),
        &format!("kernel.sourceTableSize = {slots}\nkernel.port.{PORT}.perSourceMax = 1000\nadmin.logLevel = info\n"),
    );
    let daemon = Daemon::start_binary(bin, &config, &[])?;
    let admin = daemon.admin;
    let listener = sb.listen(&format!("0.0.0.0:{PORT}"), 4096);
    let mut held: Vec<_> = (0..GROUPS).map(|g| open(&sb, &listener, g)).collect::<Result<_>>()?;
    // Read with the build under test (this one does not read layout 2).
    let established =
        || Some(limiter_tests::port(&limiter_tests::dump_with(bin, &sb.pin_path), PORT).established);
    let deadline = Instant::now() + Duration::from_secs(10);
    while established() != Some(u64::from(GROUPS)) {
        anyhow::ensure!(Instant::now() < deadline, "{GROUPS} connections counted: {:?}", established());
        thread::sleep(Duration::from_millis(50));
    }
    let calls = |d: &Daemon| -> Option<u64> {
        let s: serde_json::Value = serde_json::from_str(&d.admin_get("/status").ok()?).ok()?;
        s["kernel"]["gate"]["source_read_calls"].as_u64()
    };
    let (_, first, page) = get(admin, "/metrics")?;
    anyhow::ensure!(page.contains("limiter_kernel_source_slots_used"), "a real page");
    let first_calls = calls(&daemon);
    let mut unchanged = Vec::new();
    for _ in 0..20 {
        unchanged.push(ms(get(admin, "/metrics")?.1));
    }
    let unchanged_calls = calls(&daemon);
    let mut churn = Vec::new();
    for round in 0..20u32 {
        for k in 0..CHURN {
            let g = (round * CHURN + k) % GROUPS;
            held[g as usize] = open(&sb, &listener, g + GROUPS)?;
        }
        thread::sleep(Duration::from_millis(20));
        churn.push(ms(get(admin, "/metrics")?.1));
    }
    // One more churn round, read through /status to count its calls.
    for k in 0..CHURN {
        held[k as usize] = open(&sb, &listener, k + 2 * GROUPS)?;
    }
    thread::sleep(Duration::from_millis(20));
    let churn_calls = calls(&daemon);

    let stop = Arc::new(AtomicBool::new(false));
    let pages = Arc::new(AtomicU64::new(0));
    let scrapers: Vec<_> = (0..SCRAPERS)
        .map(|_| {
            let (stop, pages) = (stop.clone(), pages.clone());
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if get(admin, "/metrics").is_ok_and(|(s, _, _)| s == 200) {
                        pages.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(500));
    let (p0, t0) = (pages.load(Ordering::Relaxed), Instant::now());
    let mut healthz = Vec::new();
    for _ in 0..PROBES {
        let (status, took, _) = get(admin, "/healthz")?;
        anyhow::ensure!(status == 200, "/healthz answered {status}");
        healthz.push(ms(took));
        thread::sleep(Duration::from_millis(5));
    }
    let scrapes_per_s = (pages.load(Ordering::Relaxed) - p0) as f64 / t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    scrapers.into_iter().for_each(|s| s.join().unwrap());
    healthz.sort_by(f64::total_cmp);
    drop(held);
    drop(daemon);
    let _ = limiter_tests::limiter(&["unload", "--pin-path", sb.pin_path.to_str().unwrap()]);
    let calls = if new_build {
        Some([first_calls.unwrap_or(0), unchanged_calls.unwrap_or(0), churn_calls.unwrap_or(0)])
    } else {
        None
    };
    Ok(Figures {
        first_ms: ms(first),
        unchanged_ms: median(&unchanged),
        churn_ms: median(&churn),
        healthz: [median(&healthz), healthz[healthz.len() * 99 / 100], *healthz.last().unwrap()],
        scrapes_per_s,
        calls,
    })
}

fn main() -> Result<()> {
    if let Some(why) = limiter_tests::kernel_tests_blocked() {
        anyhow::bail!("the benchmark: {why}");
    }
    limiter_tests::raise_fd_limit();
    let now = limiter_tests::limiter_bin();
    let before = std::env::var_os("LIMITER_BIN_BEFORE")
        .context("LIMITER_BIN_BEFORE: run through `cargo xtask bench scrape`")?;
    let rev = std::env::var("LIMITER_BEFORE_REV").unwrap_or_else(|_| "layout 2".into());
    let mut report = format!(
        "A gate-only daemon (release build), its source table holding {GROUPS} client groups' connections; \
         this build against `{}` (the last of pinned layout 2, which read every slot on every scrape). \
         `/healthz` under {SCRAPERS} clients scraping `/metrics` back to back ({PROBES} probes, 5 ms apart).\n\n\
         | slots | build | first /metrics | /metrics, nothing changed | /metrics, {CHURN} groups changed | /healthz under scrapes: median / p99 / worst | scrapes/s then | source-table bpf(2) calls: first / unchanged / {CHURN} changed |\n\
         |---|---|---|---|---|---|---|---|\n",
        &rev[..rev.len().min(12)]
    );
    for slots in [65_536u32, 1_048_576] {
        for (name, bin, new_build) in
            [("before", Path::new(&before), false), ("this build", now.as_path(), true)]
        {
            eprintln!("measuring {name} with {slots} slots");
            let f = measure(bin, slots, new_build)?;
            let calls = match f.calls {
                Some([a, b, c]) => format!("{a} / {b} / {c}"),
                None => {
                    let full = u64::from(slots).div_ceil(8192);
                    format!("{full} / {full} / {full} (every slot)")
                }
            };
            report.push_str(&format!(
                "| {slots} | {name} | {:.1} ms | {:.2} ms | {:.2} ms | {:.2} / {:.2} / {:.1} ms | {:.0} | {calls} |\n",
                f.first_ms, f.unchanged_ms, f.churn_ms, f.healthz[0], f.healthz[1], f.healthz[2], f.scrapes_per_s
            ));
        }
    }
    report.push('\n');
    print!("{report}");
    limiter_tests::bench::write_section(
        "scrape",
        "Scrape cost",
        "`cargo xtask bench scrape` (as root; builds the layout-2 revision to compare).",
        &report,
    )?;
    Ok(())
}
