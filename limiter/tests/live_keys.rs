//! Every key the key table marks *live* changes behaviour on reload: each
//! test here drives the real daemon in-process (`daemon::prepare` and
//! `daemon::run` on `127.0.0.1:0`, the proxy alone, no kernel gate),
//! rewrites its file, reloads through `POST /reload`, and observes the new
//! behaviour on the wire. The kernel's live keys are proven with the real
//! gate in `tests/tests/reload.rs` (and the older kernel tests named in
//! [`KERNEL`]); [`every_live_key_has_a_behaviour_test`] keeps the lists
//! honest against the table.

use std::{
    io::{ErrorKind, Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use limiter::{
    config::{Config, KEYS, Reload},
    daemon::{self, RunOptions},
};

/// Which test proves each live key of the HTTP side, the breaker and the
/// admin listener (all in this file).
const HERE: &[(&str, &str)] = &[
    ("http.maxThreads", "max_threads_resizes_the_normal_pool"),
    ("http.maxSessionConnections", "session_and_web_limits_change_live"),
    ("http.maxWebConnections", "session_and_web_limits_change_live"),
    ("http.dryRun", "dry_run_turns_on_live"),
    ("http.headerReadTimeoutMs", "header_read_timeout_changes_for_new_connections"),
    ("http.idleTimeoutMs", "idle_timeout_changes_for_new_request_bodies"),
    ("http.connectTimeoutMs", "connect_timeout_changes_for_the_next_request"),
    ("http.upstreamTimeoutMs", "upstream_timeout_changes_for_the_next_request"),
    ("http.maxHeaderBytes", "max_header_bytes_changes_for_new_connections"),
    ("http.lingerMs", "linger_changes_for_new_connections"),
    ("http.retryAfterMs", "retry_after_changes_live"),
    ("http.drainTimeoutMs", "drain_timeout_changes_live"),
    ("breaker.threshold", "breaker_threshold_and_min_requests_change_live"),
    ("breaker.minRequests", "breaker_threshold_and_min_requests_change_live"),
    ("breaker.sleepWindowMs", "breaker_sleep_window_changes_while_open"),
    ("breaker.halfOpenMaxProbes", "breaker_half_open_probes_and_successes_change_live"),
    ("breaker.halfOpenSuccesses", "breaker_half_open_probes_and_successes_change_live"),
    ("breaker.failureStatuses", "breaker_failure_statuses_change_live"),
    ("breaker.bypassDebug", "breaker_bypass_debug_changes_live"),
    ("admin.tokenFile", "admin_token_file_changes_live"),
    ("admin.logLevel", "log_level_changes_live"),
];

/// Which kernel test proves each live key of the gate (they need the real
/// kernel, so they live with the kernel tests).
const KERNEL: &[(&str, &str, &str)] = &[
    ("kernel.ports", "kernel.rs", "limits_change_live_and_reload_is_all_or_nothing"),
    ("kernel.trusted", "xdp.rs", "trusted_prefixes_reload_live_and_a_reshaped_gate_is_refused_at_restart"),
    ("kernel.trustedReserve", "reload.rs", "trusted_reserve_changes_live"),
    ("kernel.port.<port>.perSourceMax", "reload.rs", "per_source_max_changes_live"),
    ("kernel.port.<port>.dryRun", "reload.rs", "dry_run_ports_change_live"),
];

#[test]
fn every_live_key_has_a_behaviour_test() {
    let this = include_str!("live_keys.rs");
    let kernel = [
        ("kernel.rs", include_str!("../../tests/tests/kernel.rs")),
        ("xdp.rs", include_str!("../../tests/tests/xdp.rs")),
        ("reload.rs", include_str!("../../tests/tests/reload.rs")),
    ];
    let mut covered: Vec<&str> = Vec::new();
    for (key, test) in HERE {
        assert!(this.contains(&format!("fn {test}()")), "{key}: no test {test} in this file");
        covered.push(key);
    }
    for (key, file, test) in KERNEL {
        let text = kernel.iter().find(|(f, _)| f == file).map(|(_, t)| *t).expect("a kernel test file");
        assert!(text.contains(&format!("fn {test}()")), "{key}: no test {test} in tests/tests/{file}");
        covered.push(key);
    }
    let mut live: Vec<&str> = KEYS.iter().filter(|k| k.reload == Reload::Live).map(|k| k.name).collect();
    live.sort_unstable();
    covered.sort_unstable();
    covered.dedup();
    assert_eq!(covered, live, "the live keys of the table and the keys with a behaviour test differ");
}

// ---------------------------------------------------------------------------
// The harness: a daemon in this process, an upstream on threads, raw
// HTTP/1.1 clients.

/// A daemon running in this process, stopped on drop.
struct Running {
    dir: PathBuf,
    file: PathBuf,
    base: String,
    proxy: SocketAddr,
    admin: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<thread::JoinHandle<()>>,
}

static SEQ: AtomicU64 = AtomicU64::new(0);

impl Running {
    /// Starts the daemon on `extra` (keys after the harness's own), in
    /// front of `upstream`.
    fn start(upstream: SocketAddr, extra: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "limiter-live-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("limiter.ini");
        let base = format!(
            "kernel.enabled = false\nadmin.listen = 127.0.0.1:0\nhttp.listen = 127.0.0.1:0\n\
             http.workers = 1\nhttp.upstream = {upstream}\n"
        );
        std::fs::write(&file, format!("{base}{extra}")).unwrap();
        let config = Config::load(&file).unwrap();
        let options = RunOptions { config_path: file.clone(), unload_on_exit: false };
        let prepared = daemon::prepare(config, options).unwrap();
        let admin = prepared.admin_addr().unwrap();
        let proxy = prepared.http_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async move {
                let (_reload_tx, reloads) = tokio::sync::mpsc::unbounded_channel();
                daemon::run(prepared, reloads, async move {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
            });
        });
        Self { dir, file, base, proxy, admin, stop: Some(stop), thread: Some(thread) }
    }

    /// Rewrites the file with `extra` and reloads; panics unless applied.
    fn reload(&self, extra: &str) {
        std::fs::write(&self.file, format!("{}{extra}", self.base)).unwrap();
        let r = self.admin("POST", "/reload", &[]);
        assert_eq!(r.status, 200, "reload: {}", r.body);
        assert!(r.body.contains("\"applied\":true"), "{}", r.body);
    }

    fn get(&self, path: &str, headers: &[&str]) -> Reply {
        get(self.proxy, path, headers)
    }

    fn admin(&self, method: &str, path: &str, headers: &[&str]) -> Reply {
        let extra: String = headers.iter().map(|h| format!("{h}\r\n")).collect();
        call(
            self.admin,
            &format!(
                "{method} {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\nContent-Length: 0\r\n{extra}\r\n"
            ),
        )
    }

    /// Stops the daemon; returns how long `run` took to return.
    fn stop(&mut self) -> Duration {
        let started = Instant::now();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        started.elapsed()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[derive(Debug)]
struct Reply {
    status: u16,
    head: String,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// Sends `raw` on a new connection and reads the response to EOF.
fn call(addr: SocketAddr, raw: &str) -> Reply {
    let mut s = connect(addr);
    s.write_all(raw.as_bytes()).unwrap();
    read_reply(&mut s)
}

fn read_reply(s: &mut TcpStream) -> Reply {
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    Reply { status, head: head.to_owned(), body: body.to_owned() }
}

fn get(addr: SocketAddr, path: &str, headers: &[&str]) -> Reply {
    let extra: String = headers.iter().map(|h| format!("{h}\r\n")).collect();
    call(addr, &format!("GET {path} HTTP/1.1\r\nHost: app\r\nConnection: close\r\n{extra}\r\n"))
}

/// A GET on a thread, for requests that must be in flight together.
fn spawn_get(addr: SocketAddr, path: &str, headers: &[&str]) -> thread::JoinHandle<Reply> {
    let (path, headers): (String, Vec<String>) =
        (path.to_owned(), headers.iter().map(|h| (*h).to_owned()).collect());
    thread::spawn(move || get(addr, &path, &headers.iter().map(String::as_str).collect::<Vec<_>>()))
}

/// An upstream on threads: `/slow/MS` answers 200 after MS ms, `/status/N`
/// answers N, anything else 200 at once. It counts the requests it saw and
/// how many are in progress.
struct Upstream {
    addr: SocketAddr,
    hits: Arc<AtomicU64>,
    busy: Arc<AtomicU64>,
}

impl Upstream {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (hits, busy) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (h, b) = (hits.clone(), busy.clone());
        thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (h, b) = (h.clone(), b.clone());
                thread::spawn(move || serve_upstream(stream, &h, &b));
            }
        });
        Self { addr, hits, busy }
    }

    fn hits(&self) -> u64 {
        self.hits.load(Ordering::SeqCst)
    }

    /// Waits until `n` requests are in progress upstream.
    fn wait_busy(&self, n: u64) {
        wait_for("requests in progress upstream", || self.busy.load(Ordering::SeqCst) == n);
    }
}

fn serve_upstream(mut stream: TcpStream, hits: &AtomicU64, busy: &AtomicU64) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        // One request at a time on this connection: its head, then its body
        // by Content-Length (the proxy always frames what it sends).
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        let length: usize = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap_or(0))
            })
            .unwrap_or(0);
        while buf.len() < head_end + length {
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        buf.drain(..head_end + length);
        hits.fetch_add(1, Ordering::SeqCst);
        busy.fetch_add(1, Ordering::SeqCst);
        let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
        let mut status = 200;
        if let Some(ms) = path.strip_prefix("/slow/") {
            thread::sleep(Duration::from_millis(ms.parse().unwrap_or(0)));
        } else if let Some(n) = path.strip_prefix("/status/") {
            status = n.parse().unwrap_or(500);
        }
        busy.fetch_sub(1, Ordering::SeqCst);
        let answer = format!("HTTP/1.1 {status} X\r\nContent-Length: 2\r\n\r\nok");
        if stream.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(5));
    }
}

/// The breaker's state from the admin listener.
fn breaker_state(d: &Running) -> String {
    let body = d.admin("GET", "/breaker", &[]).body;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["state"].as_str().unwrap().to_owned()
}

// ---------------------------------------------------------------------------
// The HTTP side.

#[test]
fn max_threads_resizes_the_normal_pool() {
    let up = Upstream::start();
    let d = Running::start(up.addr, "http.maxThreads = 12\n");
    let held = spawn_get(d.proxy, "/slow/1500", &[]);
    up.wait_busy(1);
    let refused = d.get("/x", &[]);
    assert_eq!((refused.status, refused.header("x-limiter-refused")), (503, Some("normal")));
    d.reload("http.maxThreads = 13\n");
    assert_eq!(d.get("/x", &[]).status, 200, "a second normal slot after the reload");
    assert_eq!(held.join().unwrap().status, 200);
}

#[test]
fn session_and_web_limits_change_live() {
    let up = Upstream::start();
    let d = Running::start(up.addr, "http.maxSessionConnections = 1\nhttp.maxWebConnections = 1\n");
    let session = spawn_get(d.proxy, "/slow/1500", &["Authorization: Bearer one"]);
    let web = spawn_get(d.proxy, "/slow/1500", &["X-Client-Id: w1"]);
    up.wait_busy(2);
    assert_eq!(d.get("/x", &["Authorization: Bearer one"]).header("x-limiter-refused"), Some("session"));
    assert_eq!(d.get("/x", &["X-Client-Id: w2"]).header("x-limiter-refused"), Some("web"));
    d.reload("http.maxSessionConnections = 2\nhttp.maxWebConnections = 2\n");
    assert_eq!(d.get("/x", &["Authorization: Bearer one"]).status, 200);
    assert_eq!(d.get("/x", &["X-Client-Id: w2"]).status, 200);
    assert_eq!((session.join().unwrap().status, web.join().unwrap().status), (200, 200));
}

#[test]
fn dry_run_turns_on_live() {
    let up = Upstream::start();
    let d = Running::start(up.addr, "http.maxThreads = 12\n");
    let held = spawn_get(d.proxy, "/slow/1500", &[]);
    up.wait_busy(1);
    assert_eq!(d.get("/x", &[]).status, 503);
    d.reload("http.maxThreads = 12\nhttp.dryRun = true\n");
    assert_eq!(d.get("/x", &[]).status, 200, "dry-run admits past the full pool");
    held.join().unwrap();
}

/// How long the proxy keeps a connection that sent half a head open.
fn half_head_lifetime(proxy: SocketAddr) -> Duration {
    let mut s = connect(proxy);
    s.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n").unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 256];
    while let Ok(n) = s.read(&mut buf) {
        if n == 0 {
            break;
        }
    }
    started.elapsed()
}

#[test]
fn header_read_timeout_changes_for_new_connections() {
    let up = Upstream::start();
    let d = Running::start(up.addr, "http.headerReadTimeoutMs = 5000\n");
    let mut s = connect(d.proxy);
    s.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n").unwrap();
    s.set_read_timeout(Some(Duration::from_millis(700))).unwrap();
    let mut buf = [0u8; 16];
    let err = s.read(&mut buf).expect_err("still open after 0.7 s");
    assert!(matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut), "{err}");
    d.reload("http.headerReadTimeoutMs = 200\n");
    let lifetime = half_head_lifetime(d.proxy);
    assert!(lifetime < Duration::from_millis(2000), "cut after {lifetime:?} with a 200 ms timeout");
}

/// Sends a POST whose body stops after one byte; returns the status and
/// how long the answer took.
fn stalled_post(proxy: SocketAddr) -> (u16, Duration) {
    let mut s = connect(proxy);
    s.write_all(b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nx").unwrap();
    let started = Instant::now();
    let reply = read_reply(&mut s);
    (reply.status, started.elapsed())
}

#[test]
fn idle_timeout_changes_for_new_request_bodies() {
    let up = Upstream::start();
    let d = Running::start(up.addr, "http.idleTimeoutMs = 1500\n");
    let (status, took) = stalled_post(d.proxy);
    assert_eq!(status, 400);
    assert!(took >= Duration::from_millis(1400), "a 1.5 s idle timeout cut the body after {took:?}");
    d.reload("http.idleTimeoutMs = 100\n");
    let (status, took) = stalled_post(d.proxy);
    assert_eq!(status, 400);
    assert!(took < Duration::from_millis(1000), "a 100 ms idle timeout took {took:?}");
}

#[test]
fn connect_timeout_changes_for_the_next_request() {
    // An upstream whose accept queue is full: the kernel drops further
    // SYNs, so connecting hangs until the proxy's timeout.
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into()).unwrap();
    socket.listen(0).unwrap();
    let hanging: SocketAddr = socket.local_addr().unwrap().as_socket().unwrap();
    let mut fillers = Vec::new();
    for _ in 0..4 {
        let f = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        f.set_nonblocking(true).unwrap();
        let _ = f.connect(&hanging.into());
        fillers.push(f);
    }
    thread::sleep(Duration::from_millis(100));
    let d = Running::start(hanging, "http.connectTimeoutMs = 2000\nbreaker.minRequests = 1000\n");
    let timed = |d: &Running| {
        let started = Instant::now();
        let r = d.get("/x", &[]);
        (r.status, started.elapsed())
    };
    let (status, took) = timed(&d);
    assert_eq!(status, 502);
    assert!(took >= Duration::from_millis(1900), "502 after {took:?} with a 2 s connect timeout");
    d.reload("http.connectTimeoutMs = 300\nbreaker.minRequests = 1000\n");
    let (status, took) = timed(&d);
    assert_eq!(status, 502);
    assert!(took < Duration::from_millis(1200), "502 after {took:?} with a 300 ms connect timeout");
    drop(fillers);
}

#[test]
fn upstream_timeout_changes_for_the_next_request() {
    let up = Upstream::start();
    let d = Running::start(up.addr, "breaker.minRequests = 1000\n");
    assert_eq!(d.get("/slow/800", &[]).status, 200);
    d.reload("http.upstreamTimeoutMs = 200\nbreaker.minRequests = 1000\n");
    assert_eq!(d.get("/slow/800", &[]).status, 504);
}

#[test]
fn max_header_bytes_changes_for_new_connections() {
    let up = Upstream::start();
    let d = Running::start(up.addr, "http.maxHeaderBytes = 32768\n");
    let big = format!("X-Big: {}", "a".repeat(12_000));
    assert_eq!(d.get("/x", &[&big]).status, 200);
    d.reload("http.maxHeaderBytes = 8192\n");
    assert_eq!(d.get("/x", &[&big]).status, 431);
}

/// After a 503 with `Connection: close`: whether the connection still
/// takes bytes without a reset 300 ms after the proxy's FIN.
fn lingers_after_503(proxy: SocketAddr) -> bool {
    let mut s = connect(proxy);
    s.write_all(b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
    let reply = read_reply(&mut s);
    assert_eq!(reply.status, 503);
    thread::sleep(Duration::from_millis(300));
    // The first write after the peer closed draws its RST; the second fails.
    let first = s.write_all(b"more body");
    thread::sleep(Duration::from_millis(100));
    let second = s.write_all(b"more body");
    first.is_ok() && second.is_ok()
}

#[test]
fn linger_changes_for_new_connections() {
    let up = Upstream::start();
    let d = Running::start(up.addr, "http.maxThreads = 12\nhttp.lingerMs = 0\n");
    let held = spawn_get(d.proxy, "/slow/3000", &[]);
    up.wait_busy(1);
    assert!(!lingers_after_503(d.proxy), "lingerMs = 0 closes at once");
    d.reload("http.maxThreads = 12\nhttp.lingerMs = 2000\n");
    assert!(lingers_after_503(d.proxy), "lingerMs = 2000 keeps draining");
    held.join().unwrap();
}

#[test]
fn retry_after_changes_live() {
    let up = Upstream::start();
    let d = Running::start(up.addr, "http.maxThreads = 12\n");
    let held = spawn_get(d.proxy, "/slow/1500", &[]);
    up.wait_busy(1);
    assert_eq!(d.get("/x", &[]).header("retry-after"), Some("1"));
    d.reload("http.maxThreads = 12\nhttp.retryAfterMs = 4500\n");
    assert_eq!(d.get("/x", &[]).header("retry-after"), Some("5"));
    held.join().unwrap();
}

#[test]
fn drain_timeout_changes_live() {
    let up = Upstream::start();
    let mut d = Running::start(up.addr, "http.drainTimeoutMs = 60000\n");
    d.reload("http.drainTimeoutMs = 300\n");
    let held = spawn_get(d.proxy, "/slow/5000", &[]);
    up.wait_busy(1);
    let took = d.stop();
    assert!(took < Duration::from_millis(2500), "a 300 ms drain took {took:?}");
    assert_eq!(held.join().unwrap().status, 0, "the request still in flight was cut");
}

// ---------------------------------------------------------------------------
// The breaker.

#[test]
fn breaker_threshold_and_min_requests_change_live() {
    let up = Upstream::start();
    let d = Running::start(up.addr, "breaker.minRequests = 1000\n");
    for _ in 0..20 {
        assert_eq!(d.get("/status/500", &[]).status, 500);
    }
    assert_eq!(breaker_state(&d), "closed", "1000 results needed before it may open");
    d.reload("breaker.minRequests = 5\nbreaker.threshold = 0.99\n");
    // 20 failures and now a success: 20/21 = 0.952, not above 0.99.
    assert_eq!(d.get("/x", &[]).status, 200);
    assert_eq!(d.get("/status/500", &[]).status, 500);
    assert_eq!(breaker_state(&d), "closed", "21/22 failures is not above 0.99");
    d.reload("breaker.minRequests = 5\nbreaker.threshold = 0.5\n");
    assert_eq!(d.get("/status/500", &[]).status, 500);
    assert_eq!(breaker_state(&d), "open");
    let before = up.hits();
    assert_eq!(d.get("/x", &[]).header("x-limiter-refused"), Some("breaker"));
    assert_eq!(up.hits(), before, "nothing reaches the upstream while open");
}

/// Opens the breaker with failing requests to `path`.
fn trip_with(d: &Running, path: &str) {
    for _ in 0..50 {
        if breaker_state(d) == "open" {
            return;
        }
        d.get(path, &[]);
    }
    panic!("50 requests to {path} did not open the breaker");
}

/// Opens the breaker with 500s.
fn trip(d: &Running) {
    trip_with(d, "/status/500");
}

#[test]
fn breaker_sleep_window_changes_while_open() {
    let up = Upstream::start();
    let keys = "breaker.minRequests = 2\nbreaker.sleepWindowMs = 60000\n";
    let d = Running::start(up.addr, keys);
    trip(&d);
    thread::sleep(Duration::from_millis(400));
    assert_eq!(d.get("/x", &[]).status, 503, "60 s sleep window");
    d.reload("breaker.minRequests = 2\nbreaker.sleepWindowMs = 300\n");
    assert_eq!(d.get("/x", &[]).status, 200, "the probe goes through once 300 ms have passed");
    assert_eq!(breaker_state(&d), "closed");
}

#[test]
fn breaker_half_open_probes_and_successes_change_live() {
    let up = Upstream::start();
    let keys = "breaker.minRequests = 2\nbreaker.sleepWindowMs = 100\n";
    let d = Running::start(up.addr, keys);
    let probe_round = |d: &Running| {
        trip(d);
        thread::sleep(Duration::from_millis(150));
        let a = spawn_get(d.proxy, "/slow/700", &[]);
        let b = spawn_get(d.proxy, "/slow/700", &[]);
        let mut statuses = [a.join().unwrap().status, b.join().unwrap().status];
        statuses.sort_unstable();
        statuses
    };
    assert_eq!(probe_round(&d), [200, 503], "one probe at a time");
    assert_eq!(breaker_state(&d), "closed", "one success closes it");
    d.reload(&format!("{keys}breaker.halfOpenMaxProbes = 2\nbreaker.halfOpenSuccesses = 3\n"));
    assert_eq!(probe_round(&d), [200, 200], "two probes at a time");
    assert_eq!(breaker_state(&d), "half_open", "two successes of the three needed");
    assert_eq!(d.get("/x", &[]).status, 200);
    assert_eq!(breaker_state(&d), "closed");
}

#[test]
fn breaker_failure_statuses_change_live() {
    let up = Upstream::start();
    let d = Running::start(up.addr, "breaker.minRequests = 2\n");
    for _ in 0..5 {
        assert_eq!(d.get("/status/429", &[]).status, 429);
    }
    assert_eq!(breaker_state(&d), "closed", "429 is not a failure by default");
    d.reload("breaker.minRequests = 2\nbreaker.failureStatuses = 429\n");
    for _ in 0..5 {
        assert_eq!(d.get("/status/500", &[]).status, 500);
    }
    assert_eq!(breaker_state(&d), "closed", "500 is not a failure once the list says 429");
    trip_with(&d, "/status/429");
}

#[test]
fn breaker_bypass_debug_changes_live() {
    let up = Upstream::start();
    let d = Running::start(up.addr, "");
    assert_eq!(d.admin("POST", "/breaker/open", &[]).status, 200);
    assert_eq!(d.get("/x", &[]).status, 503);
    assert_eq!(d.get("/debug/x", &[]).status, 200, "diagnostics pass an open breaker by default");
    d.reload("breaker.bypassDebug = false\n");
    assert_eq!(d.get("/debug/x", &[]).header("x-limiter-refused"), Some("breaker"));
}

// ---------------------------------------------------------------------------
// The admin listener and the log.

#[test]
fn admin_token_file_changes_live() {
    let up = Upstream::start();
    let d = Running::start(up.addr, "");
    assert_eq!(d.admin("GET", "/status", &[]).status, 200);
    let token = d.dir.join("token");
    std::fs::write(&token, "0123456789abcdef0123\n").unwrap();
    d.reload(&format!("admin.tokenFile = {}\n", token.display()));
    assert_eq!(d.admin("GET", "/status", &[]).status, 401);
    assert_eq!(d.admin("GET", "/status", &["Authorization: Bearer 0123456789abcdef0123"]).status, 200);
}

#[test]
fn log_level_changes_live() {
    // The logger is this process's; LIMITER_LOG would pin its level.
    assert!(std::env::var_os("LIMITER_LOG").is_none(), "unset LIMITER_LOG to run this test");
    limiter::daemon::logging::init(false, "warn");
    let up = Upstream::start();
    let d = Running::start(up.addr, "admin.logLevel = warn\n");
    assert!(!tracing::enabled!(tracing::Level::INFO), "warn: info lines are filtered out");
    d.reload("admin.logLevel = debug\n");
    assert!(tracing::enabled!(tracing::Level::DEBUG), "debug lines now reach the log");
    d.reload("admin.logLevel = error\n");
    assert!(!tracing::enabled!(tracing::Level::WARN));
}
