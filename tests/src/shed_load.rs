//! The load of coupled shedding, shared by `bench-shed` and the
//! soak: from a client network namespace across a veth, keep-alive
//! clients that each ask for a request the upstream holds (`/slowhead`),
//! a flood of new connections from many untrusted source addresses, and
//! a trusted source asking for `/debug/` on a new connection every few
//! milliseconds. What each met is tallied.

use std::{
    fs::File,
    io::{self, ErrorKind, Read as _, Write as _},
    net::{IpAddr, SocketAddr, TcpStream},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use crate::peer::connect_from;

/// How long a connect or a response may take before it counts as a
/// timeout.
pub const PATIENCE: Duration = Duration::from_secs(2);

/// What to send, from where, for how long.
#[derive(Clone, Debug)]
pub struct Plan {
    pub target: SocketAddr,
    /// The upstream holds each request this long (`/slowhead?ms=`).
    pub hold_ms: u64,
    /// Keep-alive clients, from `client`.
    pub clients: usize,
    pub client: IpAddr,
    /// Flood threads, each cycling over `flood_sources`.
    pub flood_threads: usize,
    pub flood_sources: Vec<IpAddr>,
    /// The trusted source of the `/debug/` prober.
    pub trusted: IpAddr,
    pub duration: Duration,
}

/// What a connection attempt met.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Met {
    /// RST at the SYN.
    Reset,
    /// An answer with this status.
    Status(u16),
    /// No connection or no answer within [`PATIENCE`].
    Timeout,
    /// Anything else (a reset after the handshake, a malformed answer).
    Broken,
}

/// Counts by what was met: resets, 503s, 200s, timeouts, other.
#[derive(Debug, Default)]
pub struct Tally {
    pub reset: AtomicU64,
    pub refused_503: AtomicU64,
    pub ok: AtomicU64,
    pub timeout: AtomicU64,
    pub other: AtomicU64,
}

impl Tally {
    fn add(&self, met: Met) {
        let c = match met {
            Met::Reset => &self.reset,
            Met::Status(503) => &self.refused_503,
            Met::Status(200) => &self.ok,
            Met::Timeout => &self.timeout,
            _ => &self.other,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// (resets, 503s, 200s, timeouts, other).
    pub fn get(&self) -> [u64; 5] {
        [&self.reset, &self.refused_503, &self.ok, &self.timeout, &self.other]
            .map(|c| c.load(Ordering::Relaxed))
    }
}

/// What one run met.
#[derive(Debug, Default)]
pub struct Outcome {
    pub clients: Tally,
    pub flood: Tally,
    pub debug: Tally,
    /// Milliseconds from sending a request to its whole 200 answer, every
    /// 200 of the clients and the flood.
    pub latencies_ms: Mutex<Vec<f64>>,
    pub elapsed: Duration,
}

impl Outcome {
    /// 200s per second, clients and flood together.
    pub fn goodput(&self) -> f64 {
        (self.clients.get()[2] + self.flood.get()[2]) as f64 / self.elapsed.as_secs_f64()
    }

    /// The `q` quantile of the 200s' latencies, ms (0 without any).
    pub fn latency_ms(&self, q: f64) -> f64 {
        let mut v = self.latencies_ms.lock().unwrap().clone();
        if v.is_empty() {
            return 0.0;
        }
        v.sort_by(f64::total_cmp);
        v[((v.len() - 1) as f64 * q).round() as usize]
    }

    /// Attempts refused (a RST or a 503), clients and flood.
    pub fn refused(&self) -> u64 {
        let (c, f) = (self.clients.get(), self.flood.get());
        c[0] + c[1] + f[0] + f[1]
    }

    /// The share of `/debug/` attempts answered 200.
    pub fn debug_availability(&self) -> f64 {
        let d = self.debug.get();
        let tries: u64 = d.iter().sum();
        if tries == 0 { 0.0 } else { d[2] as f64 / tries as f64 }
    }
}

/// Runs `plan` from the client namespace `netns`.
pub fn run(netns: &File, plan: &Plan) -> Outcome {
    let out = Arc::new(Outcome::default());
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let mut threads = Vec::new();
    let spawn = |f: Box<dyn FnOnce() + Send>| {
        let netns = netns.try_clone().expect("the client namespace");
        thread::spawn(move || {
            nix::sched::setns(std::os::fd::AsFd::as_fd(&netns), nix::sched::CloneFlags::CLONE_NEWNET)
                .expect("enter the client namespace");
            f();
        })
    };
    let path = format!("/slowhead?ms={}", plan.hold_ms);
    for _ in 0..plan.clients {
        let (out, stop, plan, path) = (out.clone(), stop.clone(), plan.clone(), path.clone());
        threads.push(spawn(Box::new(move || keep_alive(&plan, &path, &out, &stop))));
    }
    for i in 0..plan.flood_threads {
        let (out, stop, plan, path) = (out.clone(), stop.clone(), plan.clone(), path.clone());
        threads.push(spawn(Box::new(move || {
            let mut n = i;
            while !stop.load(Ordering::Relaxed) {
                let source = plan.flood_sources[n % plan.flood_sources.len()];
                n += plan.flood_threads;
                let sent = Instant::now();
                let met = once(plan.target, source, &path);
                if met == Met::Status(200) {
                    out.latencies_ms.lock().unwrap().push(sent.elapsed().as_secs_f64() * 1000.0);
                }
                out.flood.add(met);
            }
        })));
    }
    {
        let (out, stop, plan) = (out.clone(), stop.clone(), plan.clone());
        threads.push(spawn(Box::new(move || {
            while !stop.load(Ordering::Relaxed) {
                out.debug.add(once(plan.target, plan.trusted, "/debug/ping"));
                thread::sleep(Duration::from_millis(20));
            }
        })));
    }
    thread::sleep(plan.duration);
    stop.store(true, Ordering::Relaxed);
    threads.into_iter().for_each(|t| t.join().expect("a load thread"));
    let mut out = Arc::into_inner(out).expect("every thread joined");
    out.elapsed = started.elapsed();
    out
}

/// One client: one request at a time on one connection, reconnecting
/// after a 503 (which closes it) or a reset.
fn keep_alive(plan: &Plan, path: &str, out: &Outcome, stop: &AtomicBool) {
    let mut conn: Option<TcpStream> = None;
    while !stop.load(Ordering::Relaxed) {
        let stream = match conn.take() {
            Some(s) => s,
            None => match connect(plan.target, plan.client) {
                Ok(s) => s,
                Err(met) => {
                    out.clients.add(met);
                    // A client backs off a little before it reconnects.
                    thread::sleep(Duration::from_millis(5));
                    continue;
                }
            },
        };
        let sent = Instant::now();
        let (met, keep) = exchange(stream, path, true);
        if met == Met::Status(200) {
            out.latencies_ms.lock().unwrap().push(sent.elapsed().as_secs_f64() * 1000.0);
        }
        out.clients.add(met);
        conn = keep;
    }
}

/// One new connection from `source` and one request for `path`.
pub fn once(target: SocketAddr, source: IpAddr, path: &str) -> Met {
    match connect(target, source) {
        Ok(s) => exchange(s, path, false).0,
        Err(met) => met,
    }
}

fn connect(target: SocketAddr, source: IpAddr) -> Result<TcpStream, Met> {
    match connect_from(target, Some(source)) {
        Ok(s) => Ok(s),
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => Err(Met::Reset),
        Err(e) if e.kind() == ErrorKind::TimedOut || e.kind() == ErrorKind::WouldBlock => Err(Met::Timeout),
        Err(_) => Err(Met::Broken),
    }
}

/// Sends one request and reads the whole answer; the connection back if
/// it stays open.
fn exchange(mut s: TcpStream, path: &str, keep_alive: bool) -> (Met, Option<TcpStream>) {
    let _ = s.set_read_timeout(Some(PATIENCE));
    let _ = s.set_nodelay(true);
    let close = if keep_alive { "" } else { "Connection: close\r\n" };
    if s.write_all(format!("GET {path} HTTP/1.1\r\nHost: shed\r\n{close}\r\n").as_bytes()).is_err() {
        return (Met::Broken, None);
    }
    match read_answer(&mut s) {
        Ok((status, closes)) => (Met::Status(status), (keep_alive && !closes).then_some(s)),
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => (Met::Timeout, None),
        Err(_) => (Met::Broken, None),
    }
}

/// Reads one answer with a `Content-Length` body: (status, whether the
/// server closes the connection after it).
fn read_answer(s: &mut TcpStream) -> io::Result<(u16, bool)> {
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Err(ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let status: u16 = head.get(9..12).and_then(|s| s.parse().ok()).ok_or(ErrorKind::InvalidData)?;
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let closes = head.lines().any(|l| l.starts_with("connection:") && l.contains("close"));
    let mut have = buf.len() - head_end;
    while have < length {
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Err(ErrorKind::UnexpectedEof.into());
        }
        have += n;
    }
    Ok((status, closes))
}
