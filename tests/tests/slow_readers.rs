//! Slow readers against the pools: HTTP/2 connections that hold their
//! windows at 0 on streams whose responses are too large to be read ahead
//! (`http.responseBufferBytes`), and HTTP/1.1 clients that read nothing,
//! keep the permits of those responses. While a pool refuses someone,
//! such a response is cut once it has left its chunk untaken for a second
//! (docs/trust.md, "What limiter trusts", "Slow readers"), its upstream
//! response read to its end and dropped, its permit back then, so other
//! clients are served within about a second; downloads that keep reading
//! are not cut.
//!
//! The HTTP/2 attack is written frame by frame (`limiter_tests::h2raw`),
//! over h2c and over TLS (rustls, ALPN `h2`); the daemon runs in this
//! process. Before the rule, each attack left 0 of 20 ordinary requests
//! served.

use std::{
    io::{self, Read, Write},
    net::{SocketAddr, TcpStream},
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use limiter_tests::{
    h2raw,
    in_process::InProcess,
    process::{run_with_deadline, wait_for},
    upstream::Upstream,
};

const WAIT: Duration = Duration::from_secs(10);

/// `http.maxThreads = 30`: 30 − 8 − 3 = 19 normal slots.
const SLOTS: u32 = 19;
/// Two connections of 15 streams each: more than the pool.
const CONNECTIONS: u32 = 2;
const STREAMS: u32 = 15;
/// Far larger than `http.responseBufferBytes` (64 KiB): streamed holding
/// its permit.
const BIG: &str = "/big?bytes=4000000";
/// Ordinary requests from another client, one every [`EVERY`].
const ORDINARY: usize = 20;
const EVERY: Duration = Duration::from_millis(200);

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("limiter-slow-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn daemon(up: &Upstream, extra: &str) -> InProcess {
    InProcess::start(
        up.addr,
        &format!("http.h2c = true\nhttp.maxThreads = 30\nhttp.drainTimeoutMs = 1000\n{extra}"),
    )
}

/// The preface, SETTINGS_INITIAL_WINDOW_SIZE = 0 (no stream may be sent a
/// byte of DATA until the client grants it), and `STREAMS` GETs of
/// [`BIG`]: what one attacking connection writes.
fn attack() -> Vec<u8> {
    let mut out = [h2raw::PREFACE, &h2raw::settings(&[(h2raw::INITIAL_WINDOW_SIZE, 0)])].concat();
    let block = h2raw::get_block(BIG, &[]);
    for i in 0..STREAMS {
        out.extend(h2raw::frame(h2raw::HEADERS, h2raw::END_HEADERS | h2raw::END_STREAM, 2 * i + 1, &block));
    }
    out
}

/// Reads one frame from any stream of bytes (`None` at EOF or on an error).
fn read_frame(s: &mut impl Read) -> Option<h2raw::Frame> {
    let mut head = [0u8; 9];
    s.read_exact(&mut head).ok()?;
    let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload).ok()?;
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    Some(h2raw::Frame { kind: head[3], flags: head[4], stream, payload })
}

/// Whether the server sends GOAWAY on `s` (read with `timeout` set on its
/// socket) before it closes or goes quiet.
fn goaway(s: &mut impl Read) -> bool {
    std::iter::from_fn(|| read_frame(s)).any(|f| f.kind == h2raw::GOAWAY)
}

/// Waits until the attack holds the pool: every slot taken by its
/// streams, the streams past the pool refused.
fn pool_held(d: &InProcess) {
    wait_for("the attack's streams admitted and refused", WAIT, || {
        d.metric("limiter_http_admitted_total{pool=\"normal\"}") == f64::from(SLOTS)
            && d.metric("limiter_http2_streams_refused_total") == f64::from(CONNECTIONS * STREAMS - SLOTS)
    });
    assert_eq!(d.metric("limiter_http_in_flight{pool=\"normal\"}"), f64::from(SLOTS), "every slot held");
}

/// [`ORDINARY`] requests from another client, one every [`EVERY`]: how
/// many got 200, and every status in order.
fn ordinary(d: &InProcess) -> (usize, Vec<u16>) {
    let start = Instant::now();
    let statuses: Vec<u16> = (0..ORDINARY)
        .map(|i| {
            let at = start + EVERY * i as u32;
            std::thread::sleep(at.saturating_duration_since(Instant::now()));
            d.get("/x", &[]).status
        })
        .collect();
    (statuses.iter().filter(|&&s| s == 200).count(), statuses)
}

/// What the attack ends with: most ordinary requests served, every one
/// after the first two seconds, the attacking streams cut as slow readers,
/// every pool back to 0.
fn judged(d: &InProcess, how: &str, served: usize, statuses: &[u16]) {
    let cut = d.metric("limiter_http_slow_readers_total");
    eprintln!("{how}: {served}/{ORDINARY} ordinary requests got 200 {statuses:?}; {cut} slow readers cut");
    assert!(served >= 12, "{how}: most ordinary requests must be served: {served}/{ORDINARY} {statuses:?}");
    assert!(statuses[10..].iter().all(|&s| s == 200), "{how}: every one after 2 s: {statuses:?}");
    assert!(cut >= f64::from(SLOTS), "{how}: every attacking stream holding a permit is cut: {cut}");
    for pool in ["normal", "debug", "web"] {
        assert_eq!(
            d.metric(&format!("limiter_http_in_flight{{pool=\"{pool}\"}}")),
            0.0,
            "{how}: {pool} pool"
        );
    }
}

#[test]
fn two_h2c_connections_at_window_zero_cannot_hold_the_pool() {
    let up = Upstream::start();
    let d = daemon(&up, "");
    let mut attackers: Vec<TcpStream> = (0..CONNECTIONS)
        .map(|_| {
            let mut s = TcpStream::connect(d.proxy).unwrap();
            s.set_nodelay(true).unwrap();
            s.write_all(&attack()).unwrap();
            s
        })
        .collect();
    pool_held(&d);
    let (served, statuses) = ordinary(&d);
    judged(&d, "h2c", served, &statuses);
    for s in &mut attackers {
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        assert!(goaway(s), "a connection whose streams were cut gets GOAWAY");
    }
    assert_eq!(d.get("/x", &[]).status, 200, "the proxy still serves");
}

/// A self-signed certificate for `localhost` that rustls accepts as its
/// own trust anchor (an end entity: `openssl req -x509` alone makes a CA,
/// which webpki refuses as a server's certificate): `(cert, key)` in `dir`.
fn end_entity(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let (cert, key) = (dir.join("slow.crt"), dir.join("slow.key"));
    let out = run_with_deadline(
        std::process::Command::new("openssl")
            .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"])
            .args(["-days", "30", "-subj", "/CN=slow", "-addext", "subjectAltName=DNS:localhost"])
            .args(["-addext", "basicConstraints=critical,CA:FALSE", "-addext", "extendedKeyUsage=serverAuth"])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert),
        WAIT,
    );
    assert!(out.status.success(), "openssl req: {}", String::from_utf8_lossy(&out.stderr));
    (cert, key)
}

/// A TLS client offering only `h2`, trusting the pair's certificate.
fn tls_client(cert: &Path) -> Arc<rustls::ClientConfig> {
    use rustls::pki_types::{CertificateDer, pem::PemObject as _};
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(cert).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let mut config =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(config)
}

type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// A TLS connection to `addr` that negotiated `h2`, with the attack written.
fn tls_attack(addr: SocketAddr, config: &Arc<rustls::ClientConfig>) -> io::Result<Tls> {
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(config.clone(), name).map_err(io::Error::other)?;
    let tcp = TcpStream::connect(addr)?;
    tcp.set_nodelay(true)?;
    tcp.set_read_timeout(Some(WAIT))?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    tls.write_all(&attack())?;
    tls.flush()?;
    assert_eq!(tls.conn.alpn_protocol(), Some(&b"h2"[..]), "ALPN chose h2");
    Ok(tls)
}

#[test]
fn two_h2_connections_over_tls_at_window_zero_cannot_hold_the_pool() {
    let up = Upstream::start();
    let dir = scratch("tls");
    let (cert, key) = end_entity(&dir);
    let d = daemon(
        &up,
        &format!(
            "http.tls.listen = 127.0.0.1:0\nhttp.tls.certFile = {}\nhttp.tls.keyFile = {}\n",
            cert.display(),
            key.display()
        ),
    );
    let config = tls_client(&cert);
    let mut attackers: Vec<Tls> =
        (0..CONNECTIONS).map(|_| tls_attack(d.tls.expect("a TLS listener"), &config).unwrap()).collect();
    pool_held(&d);
    assert_eq!(d.metric("limiter_http_protocol_connections_total{proto=\"h2+tls\"}"), 2.0);
    let (served, statuses) = ordinary(&d);
    judged(&d, "h2 over TLS", served, &statuses);
    for s in &mut attackers {
        s.sock.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        assert!(goaway(s), "a connection whose streams were cut gets GOAWAY");
    }
    assert_eq!(d.get("/x", &[]).status, 200, "the proxy still serves");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_stream_that_starves_after_its_connection_got_goaway_is_cut_too() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let up = Upstream::start();
    // maxThreads = 13: 2 normal slots, for two streams of one connection
    // at window 0, the second opened half a second after the first.
    let d = InProcess::start(up.addr, "http.h2c = true\nhttp.maxThreads = 13\nhttp.drainTimeoutMs = 1000\n");
    let mut s = h2raw::connect(d.proxy, &[(h2raw::INITIAL_WINDOW_SIZE, 0)]);
    let block = h2raw::get_block(BIG, &[]);
    let d = &d;
    let held = |n: f64| move || d.metric("limiter_http_in_flight{pool=\"normal\"}") == n;
    s.write_all(&h2raw::frame(h2raw::HEADERS, h2raw::END_HEADERS | h2raw::END_STREAM, 1, &block)).unwrap();
    wait_for("the first stream admitted", WAIT, held(1.0));
    std::thread::sleep(Duration::from_millis(500));
    s.write_all(&h2raw::frame(h2raw::HEADERS, h2raw::END_HEADERS | h2raw::END_STREAM, 3, &block)).unwrap();
    wait_for("the second stream admitted", WAIT, held(2.0));
    // Another client refused every 200 ms: the first stream is cut (and its
    // connection gets GOAWAY), then the second, half a second later.
    let stop = Arc::new(AtomicBool::new(false));
    let refusing = {
        let (stop, addr) = (stop.clone(), d.proxy);
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                limiter_tests::client::get(addr, "/x", &[]);
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };
    let started = Instant::now();
    wait_for("both permits back", Duration::from_secs(5), held(0.0));
    let took = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    refusing.join().unwrap();
    eprintln!("both streams cut {took:?} after the first refusal");
    assert_eq!(d.metric("limiter_http_slow_readers_total"), 2.0);
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    assert!(goaway(&mut s), "the connection got GOAWAY");
}

/// A response far larger than the socket's buffers, both ends together
/// (a cut reader's permit returns once limiter has read the rest of it
/// from the upstream, at the upstream's pace).
const HUGE: &str = "/big?bytes=16777216";

/// An HTTP/1.1 client that asks for [`HUGE`] with a receive buffer of a
/// few KiB, and reads nothing.
fn h1_slow_reader(addr: SocketAddr) -> TcpStream {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.set_recv_buffer_size(4096).unwrap();
    s.connect(&addr.into()).unwrap();
    let mut s = TcpStream::from(s);
    s.write_all(format!("GET {HUGE} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes()).unwrap();
    s
}

#[test]
fn http1_slow_readers_cannot_hold_the_pool_either() {
    let up = Upstream::start();
    // The minimum rate off: a client reading just above it would keep its
    // permit as long (16 MiB at 1 KiB/s: four and a half hours).
    let d = daemon(&up, "http.minDataRate = 0\n");
    let mut attackers: Vec<TcpStream> = (0..SLOTS).map(|_| h1_slow_reader(d.proxy)).collect();
    wait_for("the pool held", WAIT, || {
        d.metric("limiter_http_in_flight{pool=\"normal\"}") == f64::from(SLOTS)
    });
    // Long enough for every socket to fill and its last chunk to wait.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(d.metric("limiter_http_slow_readers_total"), 0.0, "no pressure yet: nobody is cut");
    let (served, statuses) = ordinary(&d);
    let cut = d.metric("limiter_http_slow_readers_total");
    eprintln!("HTTP/1.1: {served}/{ORDINARY} ordinary requests got 200 {statuses:?}; {cut} slow readers cut");
    // The first refusal starts the pressure, and every reader is cut at
    // once: their chunks have waited for more than a second already.
    assert!(served >= ORDINARY - 2, "{served}/{ORDINARY} {statuses:?}");
    assert_eq!(cut, f64::from(SLOTS));
    assert_eq!(d.metric("limiter_http_in_flight{pool=\"normal\"}"), 0.0);
    // A cut reader gets what its socket held, then the connection ends.
    let reader = &mut attackers[0];
    reader.set_read_timeout(Some(WAIT)).unwrap();
    let mut buf = vec![0u8; 1 << 16];
    let mut got = 0u64;
    while let Ok(n @ 1..) = reader.read(&mut buf) {
        got += n as u64;
    }
    assert!(got < 16 << 20, "the response was cut short: {got} bytes");
    eprintln!("a cut reader got {got} bytes before the connection ended");
}

/// Reads an HTTP/2 download on `s` (stream 1), granting back every 100 ms
/// the window it used: about 640 KiB/s on a 64 KiB window. The bytes of
/// DATA received once the stream ends.
fn steady_h2_download(s: &mut TcpStream) -> usize {
    let started = Instant::now();
    let mut got = 0usize;
    loop {
        let mut credit = 0usize;
        let round = Instant::now();
        while round.elapsed() < Duration::from_millis(100) {
            match h2raw::read_frame(s, Duration::from_millis(20)) {
                Ok(Some(f)) if f.kind == h2raw::DATA && f.stream == 1 => {
                    (got, credit) = (got + f.payload.len(), credit + f.payload.len());
                    if f.flags & h2raw::END_STREAM != 0 {
                        return got;
                    }
                }
                Ok(Some(f)) => assert_ne!(f.kind, h2raw::GOAWAY, "GOAWAY after {got} bytes"),
                Ok(None) => panic!("closed after {got} bytes"),
                Err(_) => {}
            }
        }
        assert!(started.elapsed() < 3 * WAIT, "{got} bytes so far");
        if credit > 0 {
            let grant = (credit as u32).to_be_bytes();
            let update = |stream| h2raw::frame(h2raw::WINDOW_UPDATE, 0, stream, &grant);
            s.write_all(&[update(0), update(1)].concat()).unwrap();
        }
    }
}

/// GETs `path` over HTTP/1.1 with a 64 KiB receive buffer, reading 64 KiB
/// every 50 ms: the body's length once read whole, `None` if refused.
fn paced_h1_download(addr: SocketAddr, path: &str) -> Option<usize> {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.set_recv_buffer_size(64 * 1024).unwrap();
    s.connect(&addr.into()).unwrap();
    let mut s = TcpStream::from(s);
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").as_bytes()).unwrap();
    let mut all = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => all.extend_from_slice(&buf[..n]),
            Err(e) => panic!("after {} bytes: {e}", all.len()),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let head_end = all.windows(4).position(|w| w == b"\r\n\r\n").expect("a response head") + 4;
    let head = String::from_utf8_lossy(&all[..head_end]);
    if head.starts_with("HTTP/1.1 503") {
        return None;
    }
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    Some(all.len() - head_end)
}

#[test]
fn downloads_that_keep_reading_are_not_cut_while_the_pool_refuses() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let up = Upstream::start();
    // maxThreads = 14: 3 normal slots, two held by the upstream, one for
    // the download.
    let d = InProcess::start(up.addr, "http.h2c = true\nhttp.maxThreads = 14\n");
    let holds: Vec<_> = (0..2)
        .map(|_| {
            let addr = d.proxy;
            std::thread::spawn(move || limiter_tests::client::get(addr, "/hold", &[]).status)
        })
        .collect();
    up.wait_holding(2);
    // HTTP/2, at about 640 KiB/s: a 16 KiB chunk never waits a second.
    let mut s = h2raw::connect(d.proxy, &[]);
    let block = h2raw::get_block("/big?bytes=3000000", &[]);
    s.write_all(&h2raw::frame(h2raw::HEADERS, h2raw::END_HEADERS | h2raw::END_STREAM, 1, &block)).unwrap();
    wait_for("the download admitted", WAIT, || d.metric("limiter_http_in_flight{pool=\"normal\"}") == 3.0);
    // Another client refused every 100 ms: the pool is under pressure all along.
    let (stop, refused) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let refusing = {
        let (stop, refused, addr) = (stop.clone(), refused.clone(), d.proxy);
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if limiter_tests::client::get(addr, "/x", &[]).status == 503 {
                    refused.fetch_add(1, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let started = Instant::now();
    assert_eq!(steady_h2_download(&mut s), 3_000_000);
    let h2_took = started.elapsed();

    // HTTP/1.1 at about 1.3 MB/s through a 64 KiB receive buffer: the
    // proxy's socket is full all along (asked again if the other client's
    // request took the free slot first).
    let started = Instant::now();
    let body = std::iter::repeat_with(|| paced_h1_download(d.proxy, "/big?bytes=3000000"))
        .take(20)
        .find_map(|r| r)
        .expect("a slot for the download");
    assert_eq!(body, 3_000_000);
    let h1_took = started.elapsed();

    stop.store(true, Ordering::Relaxed);
    refusing.join().unwrap();
    let refused = refused.load(Ordering::Relaxed);
    eprintln!("under pressure ({refused} refusals): HTTP/2 download in {h2_took:?}, HTTP/1.1 in {h1_took:?}");
    assert!(refused >= 10, "the pool refused all along: {refused}");
    assert_eq!(d.metric("limiter_http_slow_readers_total"), 0.0, "neither download was cut");
    up.release();
    for h in holds {
        assert_eq!(h.join().unwrap(), 200);
    }
    wait_for("the pools back to 0", WAIT, || d.metric("limiter_http_in_flight{pool=\"normal\"}") == 0.0);
}
