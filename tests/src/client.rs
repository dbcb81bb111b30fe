//! A raw HTTP/1.1 client for the tests: it writes exactly the bytes a test
//! gives and parses exactly what comes back, so malformed requests, unread
//! bodies and aborted responses can be played.

use std::{
    io::{self, Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    time::Duration,
};

/// A parsed response.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

pub fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect to the proxy");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

/// Reads one line (through LF) without reading past it, so that
/// pipelined responses stay in the socket for the next call.
fn read_line(stream: &mut TcpStream) -> io::Result<String> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        if stream.read(&mut byte)? == 0 {
            return Ok(String::from_utf8_lossy(&line).into_owned());
        }
        line.push(byte[0]);
        if byte[0] == b'\n' {
            return Ok(String::from_utf8_lossy(&line).into_owned());
        }
    }
}

/// Reads one response (Content-Length, chunked, or until EOF), and not a
/// byte more.
pub fn read_reply(stream: &mut TcpStream) -> io::Result<Reply> {
    let line = read_line(stream)?;
    if line.is_empty() {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed before a response"));
    }
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("bad status line {line:?}")))?;
    let mut headers = Vec::new();
    loop {
        let line = read_line(stream)?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.push((k.trim().to_owned(), v.trim().to_owned()));
        }
    }
    let mut reply = Reply { status, headers, body: Vec::new() };
    if status == 101 || status == 204 || status == 304 {
        return Ok(reply);
    }
    if let Some(len) = reply.header("content-length").and_then(|v| v.parse::<usize>().ok()) {
        reply.body.resize(len, 0);
        stream.read_exact(&mut reply.body)?;
    } else if reply.header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        loop {
            let line = read_line(stream)?;
            let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or("0"), 16).unwrap_or(0);
            if size == 0 {
                read_line(stream)?;
                break;
            }
            let start = reply.body.len();
            reply.body.resize(start + size, 0);
            stream.read_exact(&mut reply.body[start..])?;
            read_line(stream)?;
        }
    } else {
        stream.read_to_end(&mut reply.body)?;
    }
    Ok(reply)
}

/// Sends `raw` on a new connection and reads one response.
pub fn send(addr: SocketAddr, raw: &[u8]) -> io::Result<Reply> {
    // A refused connection is an error like any other (a node killed
    // under its clients), not a panic.
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(20)))?;
    s.write_all(raw)?;
    read_reply(&mut s)
}

/// `GET path` with extra header lines (`"Name: value"`).
pub fn get(addr: SocketAddr, path: &str, headers: &[&str]) -> Reply {
    let mut raw = format!("GET {path} HTTP/1.1\r\nHost: test\r\n");
    for h in headers {
        raw.push_str(h);
        raw.push_str("\r\n");
    }
    raw.push_str("\r\n");
    send(addr, raw.as_bytes()).expect("a response")
}

/// Whether the server closed the connection (EOF within 2 s).
pub fn closed_by_server(stream: &mut TcpStream) -> bool {
    stream.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut b = [0u8; 1];
    matches!(stream.read(&mut b), Ok(0))
}

/// An HTTP-only daemon configuration (no kernel gate) in `dir`; returns
/// the file and the proxy's address.
pub fn http_config(dir: &Path, upstream: Option<SocketAddr>, extra: &str) -> (PathBuf, SocketAddr) {
    std::fs::create_dir_all(dir).unwrap();
    let [admin, port] = crate::free_ports();
    let listen: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let upstream = upstream.map(|u| format!("http.upstream = {u}\n")).unwrap_or_default();
    let text = format!(
        "kernel.enabled = false\nadmin.listen = 127.0.0.1:{admin}\nadmin.socket = {}\nhttp.listen = {listen}\n{upstream}{extra}",
        dir.join("admin.sock").display()
    );
    let path = dir.join("limiter.ini");
    std::fs::write(&path, text).unwrap();
    (path, listen)
}

/// Clients looping new connections with one request each
/// (`Connection: close`) inside a network namespace, counting what they
/// get: the load of the handover and restart tests.
pub struct Looping {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    ok: std::sync::Arc<std::sync::atomic::AtomicU64>,
    errors: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Looping {
    /// `n` clients of `addr`, from `netns`.
    pub fn start(netns: &std::fs::File, addr: SocketAddr, n: usize) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let ok = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let errors = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let threads = (0..n)
            .map(|_| {
                let (stop, ok, errors) = (stop.clone(), ok.clone(), errors.clone());
                let netns = netns.try_clone().expect("dup the namespace fd");
                std::thread::spawn(move || {
                    crate::in_netns(&netns, move || {
                        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                            match send(addr, b"GET /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n") {
                                Ok(r) if r.status == 200 => {
                                    ok.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                }
                                Ok(r) => errors.lock().unwrap().push(format!("status {}", r.status)),
                                Err(e) => errors.lock().unwrap().push(e.to_string()),
                            }
                        }
                    })
                })
            })
            .collect();
        Self { stop, ok, errors, threads }
    }

    /// Requests answered 200 so far.
    pub fn ok(&self) -> u64 {
        self.ok.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Stops the clients: requests answered 200, and every other outcome.
    pub fn stop(self) -> (u64, Vec<String>) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let ok = self.ok.clone();
        self.threads.into_iter().for_each(|t| t.join().expect("a client thread"));
        (ok.load(std::sync::atomic::Ordering::Relaxed), self.errors.lock().unwrap().clone())
    }
}
