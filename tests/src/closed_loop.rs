//! Closed-loop HTTP/1.1 clients: each sends a request on its keep-alive
//! connection as soon as the previous one is answered (after a pause when
//! it was refused, as a client honouring a 503 would), and records every
//! answer: when, its status, how long it took and the refusal's reason.
//! The load of the adaptive-limit test, soak scenario and benchmark.

use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

/// One answer.
#[derive(Clone, Debug)]
pub struct Answer {
    /// When it came, from the start of the load.
    pub at: Duration,
    /// 0: the connection failed.
    pub status: u16,
    pub latency: Duration,
    /// `X-Limiter-Refused`.
    pub reason: Option<String>,
    /// Which of the paths it asked for.
    pub path: usize,
}

pub struct ClosedLoop {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<Vec<Answer>>>,
    pub started: Instant,
}

impl ClosedLoop {
    /// `clients` clients of `addr`; client `i` asks for `paths[i %
    /// paths.len()]`, and pauses `backoff` after a 503.
    pub fn start(addr: SocketAddr, clients: usize, paths: &[&str], backoff: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let started = Instant::now();
        let threads = (0..clients)
            .map(|i| {
                let stop = stop.clone();
                let which = i % paths.len();
                let request = format!("GET {} HTTP/1.1\r\nHost: load\r\n\r\n", paths[which]).into_bytes();
                std::thread::spawn(move || client(addr, &request, which, backoff, &stop, started))
            })
            .collect();
        Self { stop, threads, started }
    }

    /// Stops the clients; every answer, in no particular order.
    pub fn stop(self) -> Vec<Answer> {
        self.stop.store(true, Ordering::Relaxed);
        self.threads.into_iter().flat_map(|t| t.join().expect("a client thread")).collect()
    }
}

fn client(
    addr: SocketAddr,
    request: &[u8],
    path: usize,
    backoff: Duration,
    stop: &AtomicBool,
    started: Instant,
) -> Vec<Answer> {
    let mut out = Vec::new();
    let mut conn: Option<BufReader<TcpStream>> = None;
    while !stop.load(Ordering::Relaxed) {
        let sent = Instant::now();
        let answer = (|| -> std::io::Result<(u16, Option<String>, bool)> {
            if conn.is_none() {
                let s = TcpStream::connect(addr)?;
                s.set_read_timeout(Some(Duration::from_secs(10)))?;
                s.set_nodelay(true)?;
                conn = Some(BufReader::new(s));
            }
            let c = conn.as_mut().expect("just connected");
            c.get_mut().write_all(request)?;
            read(c)
        })();
        let (status, reason) = match answer {
            Ok((status, reason, close)) => {
                if close {
                    conn = None;
                }
                (status, reason)
            }
            Err(_) => {
                conn = None;
                (0, None)
            }
        };
        out.push(Answer { at: started.elapsed(), status, latency: sent.elapsed(), reason, path });
        if status != 200 && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(backoff);
        }
    }
    out
}

/// One response with a `Content-Length` body: its status, reason, and
/// whether the server closes the connection after it.
fn read(c: &mut BufReader<TcpStream>) -> std::io::Result<(u16, Option<String>, bool)> {
    let mut line = String::new();
    if c.read_line(&mut line)? == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    let status = line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let (mut length, mut reason, mut close) = (0usize, None, false);
    loop {
        line.clear();
        if c.read_line(&mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let Some((k, v)) = l.split_once(':') else { continue };
        let v = v.trim();
        if k.eq_ignore_ascii_case("content-length") {
            length = v.parse().unwrap_or(0);
        } else if k.eq_ignore_ascii_case("x-limiter-refused") {
            reason = Some(v.to_owned());
        } else if k.eq_ignore_ascii_case("connection") && v.eq_ignore_ascii_case("close") {
            close = true;
        }
    }
    let mut body = vec![0u8; length];
    c.read_exact(&mut body)?;
    Ok((status, reason, close))
}

/// Summary of the answers within `[from, to)`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Window {
    pub ok: usize,
    pub refused: usize,
    pub failed: usize,
    /// 200s per second.
    pub goodput: f64,
    /// Of the 200s.
    pub p50: Duration,
    pub p99: Duration,
    /// Of the 503s.
    pub refused_p99: Duration,
}

pub fn window(answers: &[Answer], from: Duration, to: Duration, path: Option<usize>) -> Window {
    let within: Vec<&Answer> =
        answers.iter().filter(|a| a.at >= from && a.at < to && path.is_none_or(|p| a.path == p)).collect();
    let mut ok: Vec<Duration> = within.iter().filter(|a| a.status == 200).map(|a| a.latency).collect();
    let mut refused: Vec<Duration> = within.iter().filter(|a| a.status == 503).map(|a| a.latency).collect();
    ok.sort_unstable();
    refused.sort_unstable();
    let q = |v: &[Duration], q: f64| {
        if v.is_empty() {
            Duration::ZERO
        } else {
            v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1]
        }
    };
    Window {
        ok: ok.len(),
        refused: refused.len(),
        failed: within.len() - ok.len() - refused.len(),
        goodput: ok.len() as f64 / (to - from).as_secs_f64(),
        p50: q(&ok, 0.5),
        p99: q(&ok, 0.99),
        refused_p99: q(&refused, 0.99),
    }
}
