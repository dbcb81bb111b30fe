//! What the proxy's session tests share: a [`Rig`] serves HTTP/1
//! connections whose client side is the test's (an in-memory pipe), in
//! front of an upstream the test scripts byte by byte (a listener on
//! loopback: the upstream client only speaks TCP). Nothing needs root.

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use tokio::{
    io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _, DuplexStream},
    net::{TcpListener, TcpStream},
    sync::watch,
    task::JoinHandle,
};

use super::{
    Proto, Proxy, h1,
    io::ClientIo,
    request::headers::{Client, Forwarding},
    upstream::Pool,
};
use crate::config::Config;

/// One proxy, one worker's pool, and the upstream's listening socket.
pub struct Rig {
    pub proxy: Arc<Proxy>,
    pub pool: Arc<Pool>,
    pub upstream: TcpListener,
    log: PathBuf,
    shutdown: watch::Sender<bool>,
}

impl Rig {
    /// A proxy configured with `keys` (lines of a `config.ini`) on top of
    /// what every rig has: its upstream, an access log of its own.
    pub async fn new(keys: &str) -> Self {
        let upstream = TcpListener::bind("127.0.0.1:0").await.expect("bind the scripted upstream");
        let addr = upstream.local_addr().expect("its address").to_string();
        let dir = std::env::temp_dir().join(format!("limiter-rig-{}-{}", std::process::id(), next()));
        std::fs::create_dir_all(&dir).expect("the rig's directory");
        let log = dir.join("access.log");
        let text = format!("http.upstream = {addr}\nhttp.accessLog = {}\n{keys}\n", log.display());
        let config = Config::parse(&text, "rig.ini").expect("the rig's configuration");
        let proxy = Proxy::new(&config, addr, None, None);
        let pool = Pool::new(proxy.upstream().to_owned(), proxy.upstreams.clone());
        Self { proxy, pool, upstream, log, shutdown: watch::channel(false).0 }
    }

    /// A client connection served as the proxy serves one, and the task
    /// serving it.
    pub fn connect(&self) -> (DuplexStream, JoinHandle<()>) {
        let (client, server) = tokio::io::duplex(64 * 1024);
        (client, self.serve(server))
    }

    /// Serves `stream` as an HTTP/1 client connection from 192.0.2.1.
    pub fn serve<S>(&self, stream: S) -> JoinHandle<()>
    where
        S: AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (proxy, pool, shutdown) = (self.proxy.clone(), self.pool.clone(), self.shutdown.subscribe());
        tokio::spawn(async move {
            let tuning = proxy.tuning();
            let addr: SocketAddr = "192.0.2.1:40000".parse().expect("an address");
            let client = Client { addr, proto: Proto::H1, port: 8080, trusted: false };
            let fwd = Forwarding::new(client);
            let io = ClientIo::h1(stream, &tuning, proxy.counters.clone());
            h1::serve(io, h1::Session { proxy: &proxy, pool: &pool, client, fwd: &fwd, shutdown }).await
        })
    }

    /// The next connection the proxy opens to the upstream, within 5 s.
    pub async fn accept(&self) -> TcpStream {
        let (stream, _) = tokio::time::timeout(Duration::from_secs(5), self.upstream.accept())
            .await
            .expect("the proxy connects to the upstream within 5 s")
            .expect("accept");
        stream
    }

    /// Normal-pool permits held now.
    pub fn in_use(&self) -> u32 {
        self.proxy.admission.snapshot().normal_in_use
    }

    /// Waits (up to 5 s) until no normal-pool permit is held; how many are
    /// held then.
    pub async fn until_free(&self) -> u32 {
        for _ in 0..500 {
            if self.in_use() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.in_use()
    }

    /// The access log's lines once there are `n` of them (within 5 s).
    pub async fn log_lines(&self, n: usize) -> Vec<serde_json::Value> {
        for _ in 0..500 {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            let lines: Vec<_> = text.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect();
            if lines.len() >= n {
                assert_eq!(lines.len(), n, "exactly {n} access-log lines: {text}");
                return lines;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("fewer than {n} access-log lines after 5 s: {:?}", std::fs::read_to_string(&self.log));
    }

    pub fn errors(&self, kind: super::error::Kind) -> u64 {
        self.proxy.counters.errors[kind.index()].load(Ordering::Relaxed)
    }

    /// Starts a drain, as a shutdown does.
    pub fn drain(&self) {
        let _ = self.shutdown.send(true);
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        if let Some(dir) = self.log.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn next() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Reads one head (through its empty line) off `s`, byte by byte so that
/// nothing past it is taken; panics after 5 s.
pub async fn head<S: AsyncRead + Unpin>(s: &mut S) -> String {
    let mut head = Vec::new();
    let read = async {
        while !head.ends_with(b"\r\n\r\n") {
            let mut byte = [0u8; 1];
            if s.read(&mut byte).await.expect("read a head") == 0 {
                panic!("closed after {:?}", String::from_utf8_lossy(&head));
            }
            head.push(byte[0]);
        }
    };
    tokio::time::timeout(Duration::from_secs(5), read).await.expect("a head within 5 s");
    String::from_utf8(head).expect("a head in ASCII")
}

/// Reads exactly `n` bytes off `s` (within 5 s).
pub async fn exactly<S: AsyncRead + Unpin>(s: &mut S, n: usize) -> Vec<u8> {
    let mut body = vec![0u8; n];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut body))
        .await
        .expect("the bytes within 5 s")
        .expect("read");
    body
}

/// Reads `s` to its end (within 5 s).
pub async fn to_end<S: AsyncRead + Unpin>(s: &mut S) -> Vec<u8> {
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest))
        .await
        .expect("the end within 5 s")
        .expect("read");
    rest
}

/// A response the scripted upstream writes: `200` with `body` and its
/// length.
pub async fn answer(up: &mut TcpStream, body: &str) {
    let text = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}", body.len());
    up.write_all(text.as_bytes()).await.expect("the upstream writes");
}

/// The status of a response head.
pub fn status(head: &str) -> u16 {
    head.get(9..12).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("no status in {head:?}"))
}

/// A header's value in a head (the first, any case).
pub fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}
