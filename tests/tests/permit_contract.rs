//! Permits that last as long as the upstream's work, and only trusted
//! forwarders speaking for the client — judged by real Jetty's own count of
//! the servlets it runs and its own view of each request, never by
//! limiter's:
//!
//! - a 504 and a client that leaves mid-download keep their permits until
//!   Jetty is done (before, every timeout admitted another pool's worth of
//!   work: Jetty ran 10 requests at once with 5 slots);
//! - `http.upstreamAbandonMs` bounds how long;
//! - an upload Jetty does not read yet (a 502 after `http.idleTimeoutMs`
//!   of no progress) and clients cut for reading too slowly keep their
//!   permits until Jetty is done; a buffered PUT Jetty took part of is
//!   never sent again;
//! - every forwarding header an upstream component reads, and its `_`
//!   spelling, forged by an untrusted client, never reaches Jetty's view;
//! - five spellings of one Basic credential (each one Jetty's own
//!   `BasicAuthenticator` admits) are one session;
//! - tunnels over `http.maxTunnels` are refused, each closed one logged;
//!   one client cannot take every place, an idle tunnel and one whose
//!   client has gone are closed;
//! - an upstream's final answer that comes before it read the body (a 413)
//!   is what the client gets, and no breaker failure.

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    process::Command,
    thread::JoinHandle,
    time::{Duration, Instant},
};

use limiter::proxy::request::headers::CONSUMERS;
use limiter_tests::{
    Daemon,
    client::{self, Reply, connect, get, read_reply},
    h2raw,
    in_process::InProcess,
    jetty::{Jetty, View},
    process::{run_with_deadline, wait_for},
    upstream::Upstream,
};

fn spawn_get(addr: SocketAddr, path: &str, headers: &[&str]) -> JoinHandle<Reply> {
    let path = path.to_owned();
    let headers: Vec<String> = headers.iter().map(|h| (*h).to_owned()).collect();
    std::thread::spawn(move || {
        let refs: Vec<&str> = headers.iter().map(String::as_str).collect();
        get(addr, &path, &refs)
    })
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("limiter-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The access log's lines, once `n` are there.
fn log_lines(path: &std::path::Path, n: usize) -> Vec<serde_json::Value> {
    let mut lines = Vec::new();
    wait_for(&format!("{n} access log lines"), Duration::from_secs(5), || {
        lines = std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect();
        lines.len() >= n
    });
    lines
}

/// `http.maxThreads = 16`: 5 normal slots.
const SLOTS: u64 = 5;

#[test]
#[ignore = "needs Debian's jetty9 and a JDK (set-up installs them): run by cargo xtask test"]
fn a_504_keeps_its_permit_until_jetty_is_done() {
    let jetty = Jetty::start(40);
    let dir = temp_dir("timeout");
    let log = dir.join("access.log");
    let d = InProcess::start(
        jetty.addr,
        &format!("http.maxThreads = 16\nhttp.upstreamTimeoutMs = 1000\nhttp.accessLog = {}\n", log.display()),
    );
    jetty.reset();
    let started = Instant::now();
    // Five requests Jetty works on for 4 s: each gets 504 after 1 s.
    let first: Vec<_> =
        (0..SLOTS).map(|i| spawn_get(d.proxy, &format!("/slow?ms=4000&i={i}"), &[])).collect();
    for h in first {
        assert_eq!(h.join().unwrap().status, 504);
    }
    assert!(started.elapsed() < Duration::from_millis(2500), "the 504s came at the timeout");
    assert_eq!(jetty.stats().inflight, SLOTS, "Jetty still works on all five");
    // Six more while Jetty works: its threads are busy, so every one is
    // refused at once and none reaches it.
    let more: Vec<_> = (0..6).map(|i| spawn_get(d.proxy, &format!("/more?ms=4000&i={i}"), &[])).collect();
    for h in more {
        let reply = h.join().unwrap();
        assert_eq!(reply.status, 503, "{reply:?}");
        assert_eq!(reply.header("x-limiter-refused"), Some("normal"));
    }
    assert_eq!(d.metric("limiter_http_abandoned_in_flight"), SLOTS as f64);
    assert_eq!(d.metric("limiter_http_in_flight{pool=\"normal\"}"), SLOTS as f64);
    // Jetty answers at 4 s: the permits come back then, the connections
    // were read to their end.
    wait_for("the permits back once Jetty answered", Duration::from_secs(6), || {
        d.metric("limiter_http_in_flight{pool=\"normal\"}") == 0.0
    });
    assert!(started.elapsed() >= Duration::from_millis(3900), "a permit came back before Jetty was done");
    let stats = jetty.stats();
    assert!(stats.peak <= SLOTS, "Jetty ran {} at once with {SLOTS} slots", stats.peak);
    assert_eq!(stats.served, SLOTS, "a refused request reached Jetty");
    assert_eq!(d.metric("limiter_http_abandoned_total{cause=\"timeout\",end=\"answered\"}"), SLOTS as f64);
    assert_eq!(d.metric("limiter_http_abandoned_in_flight"), 0.0);
    // The breaker counted each timeout.
    assert_eq!(d.metric("limiter_breaker_window_requests"), SLOTS as f64);
    assert_eq!(d.metric("limiter_breaker_window_error_ratio"), 1.0);
    // Each 504's line names the id Jetty got as X-Request-Id.
    let lines = log_lines(&log, 11);
    let timeouts: Vec<&str> =
        lines.iter().filter(|l| l["status"] == 504).map(|l| l["id"].as_str().expect("an id")).collect();
    assert_eq!(timeouts.len(), SLOTS as usize);
    let mut seen: Vec<String> = jetty.served().into_iter().map(|s| s.request_id).collect();
    seen.sort();
    let mut logged: Vec<String> = timeouts.iter().map(|s| (*s).to_owned()).collect();
    logged.sort();
    assert_eq!(seen, logged);
    assert!(logged.iter().all(|id| id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit())));
    // The slots serve again.
    let again: Vec<_> = (0..SLOTS).map(|_| spawn_get(d.proxy, "/again?ms=100", &[])).collect();
    for h in again {
        assert_eq!(h.join().unwrap().status, 200);
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
#[ignore = "needs Debian's jetty9 and a JDK (set-up installs them): run by cargo xtask test"]
fn http_upstream_abandon_ms_bounds_how_long_a_permit_waits() {
    let jetty = Jetty::start(40);
    let d = InProcess::start(jetty.addr, "http.maxThreads = 16\nhttp.upstreamTimeoutMs = 500\n");
    d.reload("http.maxThreads = 16\nhttp.upstreamTimeoutMs = 500\nhttp.upstreamAbandonMs = 700\n");
    jetty.reset();
    let started = Instant::now();
    assert_eq!(get(d.proxy, "/slow?ms=5000", &[]).status, 504);
    assert_eq!(d.metric("limiter_http_in_flight{pool=\"normal\"}"), 1.0, "held after the 504");
    wait_for("the permit back at the bound", Duration::from_secs(3), || {
        d.metric("limiter_http_in_flight{pool=\"normal\"}") == 0.0
    });
    let back = started.elapsed();
    assert!(back >= Duration::from_millis(1150) && back < Duration::from_millis(3000), "back after {back:?}");
    assert_eq!(jetty.stats().inflight, 1, "Jetty still works on it: the bound, not Jetty, ended it");
    assert_eq!(d.metric("limiter_http_abandoned_total{cause=\"timeout\",end=\"bound\"}"), 1.0);
    // 0: given back at once, as limiter did before the bound existed.
    d.reload("http.maxThreads = 16\nhttp.upstreamTimeoutMs = 500\nhttp.upstreamAbandonMs = 0\n");
    assert_eq!(get(d.proxy, "/slow?ms=3000", &[]).status, 504);
    wait_for("the permit back at once", Duration::from_millis(300), || {
        d.metric("limiter_http_in_flight{pool=\"normal\"}") == 0.0
    });
    assert_eq!(d.metric("limiter_http_abandoned_total{cause=\"timeout\",end=\"bound\"}"), 2.0);
}

/// A PUT of `bytes` to `path` on a new connection: the reply (0 when the
/// connection failed).
fn put(proxy: SocketAddr, path: &str, bytes: usize) -> u16 {
    let mut s = connect(proxy);
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let head = format!("PUT {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {bytes}\r\n\r\n");
    if s.write_all(head.as_bytes()).is_err() {
        return 0;
    }
    let chunk = vec![b'u'; 64 * 1024];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len());
        // limiter may answer (and stop reading) before the body is all sent.
        if s.write_all(&chunk[..n]).is_err() {
            break;
        }
        left -= n;
    }
    read_reply(&mut s).map_or(0, |r| r.status)
}

/// Four other clients asking for `path` all along, for `how_long`: each
/// thread's count of 200s.
fn asking_all_along(proxy: SocketAddr, path: &str, how_long: Duration) -> Vec<JoinHandle<usize>> {
    let started = Instant::now();
    (0..4)
        .map(|_| {
            let path = path.to_owned();
            std::thread::spawn(move || {
                let mut ok = 0;
                while started.elapsed() < how_long {
                    ok += usize::from(get(proxy, &path, &[]).status == 200);
                    std::thread::sleep(Duration::from_millis(20));
                }
                ok
            })
        })
        .collect()
}

#[test]
#[ignore = "needs Debian's jetty9 and a JDK (set-up installs them): run by cargo xtask test"]
fn an_upload_jetty_does_not_read_yet_keeps_its_permit_until_jetty_is_done() {
    // 2 normal slots (13 - 8 - 3); uploads of 8 MB to a servlet that
    // computes 4 s before it reads; limiter gives up writing after 500 ms
    // of no progress.
    const SLOTS: u64 = 2;
    let jetty = Jetty::start(40);
    let d = InProcess::start(jetty.addr, "http.maxThreads = 13\nhttp.idleTimeoutMs = 500\n");
    jetty.reset();
    let uploads: Vec<_> = (0..SLOTS)
        .map(|_| {
            let proxy = d.proxy;
            std::thread::spawn(move || put(proxy, "/up?before=4000", 8 << 20))
        })
        .collect();
    wait_for("both uploads admitted", Duration::from_secs(5), || {
        d.metric("limiter_http_in_flight{pool=\"normal\"}") == SLOTS as f64
    });
    let others = asking_all_along(d.proxy, "/other?ms=50", Duration::from_secs(6));
    let statuses: Vec<u16> = uploads.into_iter().map(|h| h.join().unwrap()).collect();
    let served_others: usize = others.into_iter().map(|h| h.join().unwrap()).sum();
    let stats = jetty.stats();
    eprintln!(
        "uploads Jetty reads after 4 s: {statuses:?}; Jetty's peak {} for {SLOTS} slots; {served_others} other requests served",
        stats.peak
    );
    assert!(statuses.iter().all(|&s| s == 502), "{statuses:?}");
    assert!(stats.peak <= SLOTS, "Jetty ran {} at once with {SLOTS} slots", stats.peak);
    assert_eq!(d.metric("limiter_http_abandoned_total{cause=\"stalled\",end=\"answered\"}"), SLOTS as f64);
    assert_eq!(d.metric("limiter_http_in_flight{pool=\"normal\"}"), 0.0);
}

#[test]
#[ignore = "needs Debian's jetty9 and a JDK (set-up installs them): run by cargo xtask test"]
fn clients_cut_for_reading_too_slowly_keep_their_permits_until_jetty_is_done() {
    // 2 normal slots; two clients that read nothing of 16 MB written by
    // Jetty over 3 s; four others ask all along, so the pool refuses and
    // the readers are cut after a second.
    const SLOTS: u64 = 2;
    let jetty = Jetty::start(40);
    let d = InProcess::start(jetty.addr, "http.maxThreads = 13\nhttp.minDataRate = 0\n");
    jetty.reset();
    let readers: Vec<TcpStream> = (0..SLOTS)
        .map(|_| {
            let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            s.set_recv_buffer_size(4096).unwrap();
            s.connect(&d.proxy.into()).unwrap();
            let mut s = TcpStream::from(s);
            s.write_all(b"GET /big?bytes=16777216&ms=3000 HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
            s
        })
        .collect();
    wait_for("both readers admitted", Duration::from_secs(5), || {
        d.metric("limiter_http_in_flight{pool=\"normal\"}") == SLOTS as f64
    });
    let others = asking_all_along(d.proxy, "/other", Duration::from_secs(5));
    let served_others: usize = others.into_iter().map(|h| h.join().unwrap()).sum();
    let stats = jetty.stats();
    let cut = d.metric("limiter_http_slow_readers_total");
    eprintln!(
        "slow readers cut: {cut}; Jetty's peak {} for {SLOTS} slots; {served_others} other requests served",
        stats.peak
    );
    assert_eq!(cut, SLOTS as f64, "both readers cut");
    assert!(stats.peak <= SLOTS, "Jetty ran {} at once with {SLOTS} slots", stats.peak);
    assert!(served_others > 0, "the slots served others once Jetty was done");
    assert_eq!(
        d.metric("limiter_http_abandoned_total{cause=\"client_slow\",end=\"answered\"}"),
        SLOTS as f64
    );
    drop(readers);
}

#[test]
#[ignore = "needs Debian's jetty9 and a JDK (set-up installs them): run by cargo xtask test"]
fn a_buffered_put_jetty_took_part_of_is_never_sent_twice() {
    let jetty = Jetty::start(40);
    let d = InProcess::start(
        jetty.addr,
        "http.maxThreads = 40\nhttp.idleTimeoutMs = 500\nhttp.requestBufferBytes = 16777216\n",
    );
    // A pooled connection to Jetty first.
    assert_eq!(get(d.proxy, "/warm", &[]).status, 200);
    jetty.reset();
    // Buffered whole, sent on the pooled connection; Jetty takes the head
    // and what the sockets hold, then computes 3 s before it reads on.
    assert_eq!(put(d.proxy, "/put?before=3000", 12 << 20), 502);
    wait_for("Jetty done with the PUT", Duration::from_secs(10), || jetty.stats().inflight == 0);
    // Jetty's own count: the servlet ran once (sent again, a second would
    // have run beside it, and been served whole); the one it ran found
    // the body cut short where limiter stopped.
    let puts: Vec<_> = jetty.served().into_iter().filter(|s| s.method == "PUT").collect();
    assert!(puts.is_empty(), "a PUT was sent again and served whole: {puts:?}");
    assert_eq!(jetty.stats().peak, 1, "Jetty ran the PUT more than once at a time");
    assert_eq!(d.metric("limiter_http_upstream_retries_total"), 0.0);
}

/// Starts a download of `path` over HTTP/1.1, reads the head and some of
/// the body, then leaves (a RST).
fn leave_mid_download(proxy: SocketAddr, path: &str) {
    let mut s = connect(proxy);
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes()).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 16384];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") || got.len() < 70_000 {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "the download ended early");
        got.extend_from_slice(&buf[..n]);
    }
    assert!(got.starts_with(b"HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&got[..40]));
    socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO)).unwrap();
}

/// The same over HTTP/2 (prior knowledge): the stream is reset once some
/// of its body came, and the connection closes.
fn reset_mid_download(proxy: SocketAddr, path: &str) {
    let mut s = h2raw::connect(proxy, &[]);
    let block = h2raw::get_block(path, &[]);
    s.write_all(&h2raw::frame(h2raw::HEADERS, h2raw::END_HEADERS | h2raw::END_STREAM, 1, &block)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        assert!(Instant::now() < deadline, "no DATA on the stream");
        match h2raw::read_frame(&mut s, Duration::from_secs(5)).unwrap() {
            Some(f) if f.kind == h2raw::DATA && f.stream == 1 => break,
            Some(_) => {}
            None => panic!("the connection closed before any DATA"),
        }
    }
    // RST_STREAM CANCEL.
    s.write_all(&h2raw::frame(h2raw::RST_STREAM, 0, 1, &8u32.to_be_bytes())).unwrap();
    std::thread::sleep(Duration::from_millis(50));
}

#[test]
#[ignore = "needs Debian's jetty9 and a JDK (set-up installs them): run by cargo xtask test"]
fn clients_that_leave_mid_download_keep_their_permits_until_jetty_is_done() {
    let jetty = Jetty::start(40);
    let d = InProcess::start(jetty.addr, "http.maxThreads = 16\nhttp.h2c = true\n");
    jetty.reset();
    // Five downloads of 8 MB that Jetty writes over 3 s; their clients
    // leave once some of it came (three over HTTP/1.1, two reset their
    // HTTP/2 streams).
    let path = |i| format!("/dl?bytes=8000000&ms=3000&i={i}");
    let leaving: Vec<_> = (0..SLOTS)
        .map(|i| {
            let (proxy, path) = (d.proxy, path(i));
            std::thread::spawn(move || {
                if i < 3 { leave_mid_download(proxy, &path) } else { reset_mid_download(proxy, &path) }
            })
        })
        .collect();
    for h in leaving {
        h.join().unwrap();
    }
    let left = Instant::now();
    // Jetty still writes all five: nothing more is admitted meanwhile.
    let more: Vec<_> = (0..6).map(|i| spawn_get(d.proxy, &format!("/more?ms=3000&i={i}"), &[])).collect();
    for h in more {
        assert_eq!(h.join().unwrap().status, 503);
    }
    assert_eq!(d.metric("limiter_http_abandoned_in_flight"), SLOTS as f64);
    wait_for("the permits back once Jetty wrote its last byte", Duration::from_secs(6), || {
        d.metric("limiter_http_in_flight{pool=\"normal\"}") == 0.0
    });
    assert!(left.elapsed() >= Duration::from_millis(1500), "a permit came back long before Jetty was done");
    let stats = jetty.stats();
    assert!(stats.peak <= SLOTS, "Jetty ran {} at once with {SLOTS} slots", stats.peak);
    assert_eq!(stats.served, SLOTS);
    assert_eq!(
        d.metric("limiter_http_abandoned_total{cause=\"client_gone\",end=\"answered\"}"),
        SLOTS as f64
    );
}

/// The headers an untrusted client forges to pass as Jetty's proxy, and
/// what Jetty would make of them.
const JETTY_FORGED: [(&str, &str); 9] = [
    ("X-Proxied-Https", "on"),
    ("Proxy-ssl-id", "FORGED-SESSION"),
    ("Proxy-auth-cert", "FORGED-CERT"),
    ("X-Forwarded-Proto", "https"),
    ("X-Forwarded-Host", "forged.example"),
    ("X-Forwarded-Port", "4443"),
    ("X-Forwarded-Server", "forged.example"),
    ("Forwarded", "for=6.6.6.6;proto=https;host=forged.example"),
    ("X-Forwarded-For", "6.6.6.6"),
];

/// Jetty's view of `GET /view` through limiter with `headers`, over
/// HTTP/1.1 or (`h2c`) HTTP/2 with curl.
fn view(proxy: SocketAddr, headers: &[(String, String)], h2c: bool) -> View {
    if !h2c {
        let lines: Vec<String> = headers.iter().map(|(n, v)| format!("{n}: {v}")).collect();
        let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
        let reply = get(proxy, "/view", &refs);
        assert_eq!(reply.status, 200, "{reply:?}");
        return View::parse(&reply.text());
    }
    let mut cmd = Command::new("curl");
    cmd.args(["-s", "--http2-prior-knowledge", "--max-time", "10"]);
    for (n, v) in headers {
        cmd.arg("-H").arg(format!("{n}: {v}"));
    }
    cmd.arg(format!("http://{proxy}/view"));
    let out = run_with_deadline(&mut cmd, Duration::from_secs(15));
    assert!(out.status.success(), "curl: {}", String::from_utf8_lossy(&out.stderr));
    View::parse(&String::from_utf8_lossy(&out.stdout))
}

fn owned(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(n, v)| ((*n).to_owned(), (*v).to_owned())).collect()
}

fn underscored(pairs: &[(String, String)]) -> Vec<(String, String)> {
    pairs.iter().map(|(n, v)| (n.replace('-', "_"), v.clone())).collect()
}

#[test]
#[ignore = "needs Debian's jetty9, a JDK and curl (set-up installs them): run by cargo xtask test"]
fn forged_forwarding_headers_never_reach_jettys_view() {
    let jetty = Jetty::start(40);
    let d = InProcess::start(jetty.addr, "http.h2c = true\n");
    for h2c in [false, true] {
        let honest = view(d.proxy, &[], h2c);
        assert_eq!(honest.fact("secure"), "false");
        assert_eq!(honest.fact("remote_addr"), "127.0.0.1");
        // Jetty's own forwarding headers, as written and with `_`: Jetty's
        // view is the honest one.
        let forged = owned(&JETTY_FORGED);
        for headers in [forged.clone(), underscored(&forged), [forged.clone(), underscored(&forged)].concat()]
        {
            let v = view(d.proxy, &headers, h2c);
            assert_eq!(v.facts, honest.facts, "h2c {h2c}: Jetty's view moved with {headers:?}");
            let leaked: Vec<_> = v
                .headers
                .iter()
                .filter(|(n, val)| {
                    n.contains('_')
                        || val.contains("FORGED")
                        || val.contains("forged")
                        || val.contains("6.6.6.6")
                })
                .collect();
            assert!(leaked.is_empty(), "h2c {h2c}: reached Jetty: {leaked:?}");
        }
        // Every consumer's headers, each spelling: none arrives with the
        // client's value.
        for consumer in CONSUMERS {
            let headers: Vec<(String, String)> = consumer
                .reads
                .iter()
                .flat_map(|n| {
                    let value = format!("FORGED-{}", consumer.name.replace(' ', "-"));
                    [(n.replace('_', "-"), value.clone()), (n.replace('-', "_"), value)]
                })
                .collect();
            let v = view(d.proxy, &headers, h2c);
            let leaked: Vec<_> =
                v.headers.iter().filter(|(n, val)| n.contains('_') || val.contains("FORGED")).collect();
            assert!(
                leaked.is_empty(),
                "h2c {h2c}: {} ({}) headers reached Jetty: {leaked:?}",
                consumer.name,
                consumer.component
            );
            assert_eq!(v.facts, honest.facts, "h2c {h2c}: {} moved Jetty's view", consumer.name);
        }
    }
    assert!(d.metric("limiter_http_underscore_fields_dropped_total") > 0.0);
}

/// Five spellings Jetty's BasicAuthenticator reads as one `user:pas`.
const SPELLINGS: [&str; 5] = ["dXNlcjpwYXM=", "dXNlcjpwYXM", "dXNlcjpwYXN=", "dXNlcjpwYXO=", "dXNlcjpwYXP"];

#[test]
#[ignore = "needs Debian's jetty9 and a JDK (set-up installs them): run by cargo xtask test"]
fn five_spellings_of_one_basic_credential_are_one_session() {
    let jetty = Jetty::start(40);
    let d = InProcess::start(jetty.addr, "http.maxSessionConnections = 1\n");
    // Jetty's own authenticator admits each spelling: one credential.
    for spelling in SPELLINGS {
        let auth = format!("Authorization: Basic {spelling}");
        assert_eq!(get(d.proxy, "/secure/x", &[&auth]).status, 200, "Jetty refused {spelling}");
    }
    assert_eq!(
        get(d.proxy, "/secure/x", &["Authorization: Basic dXNlcjpwYXNz"]).status,
        401,
        "a wrong password"
    );
    // All five at once: one session, one admitted.
    let at_once: Vec<_> = SPELLINGS
        .iter()
        .map(|s| spawn_get(d.proxy, "/secure/x?ms=1500", &[&format!("Authorization: Basic {s}")]))
        .collect();
    let replies: Vec<Reply> = at_once.into_iter().map(|h| h.join().unwrap()).collect();
    let ok = replies.iter().filter(|r| r.status == 200).count();
    let refused = replies.iter().filter(|r| r.header("x-limiter-refused") == Some("session")).count();
    assert_eq!((ok, refused), (1, 4), "{replies:?}");
}

/// Opens an upgrade through the proxy: the reply's status, and the
/// connection (a tunnel when 101).
fn upgrade(proxy: SocketAddr) -> (u16, TcpStream) {
    let mut s = connect(proxy);
    s.write_all(b"GET /upgrade HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
        .unwrap();
    let reply = read_reply(&mut s).unwrap();
    if reply.status == 503 {
        assert_eq!(reply.header("x-limiter-refused"), Some("tunnels"), "{reply:?}");
    }
    (reply.status, s)
}

#[test]
fn tunnels_over_http_max_tunnels_are_refused_and_each_closed_one_is_logged() {
    let upstream = Upstream::start();
    let dir = temp_dir("tunnels");
    let log = dir.join("access.log");
    let d = InProcess::start(
        upstream.addr,
        &format!("http.maxTunnels = 2\nhttp.accessLog = {}\n", log.display()),
    );
    let (first, mut a) = upgrade(d.proxy);
    let (second, _b) = upgrade(d.proxy);
    assert_eq!((first, second), (101, 101));
    assert_eq!(d.metric("limiter_http_tunnels"), 2.0);
    assert_eq!(upgrade(d.proxy).0, 503);
    assert_eq!(d.metric("limiter_http_refused_total{reason=\"tunnels\"}"), 1.0);
    // A tunnel carries bytes both ways; plain requests are not limited.
    a.write_all(b"hello through").unwrap();
    let mut echo = [0u8; 13];
    a.read_exact(&mut echo).unwrap();
    assert_eq!(&echo, b"hello through");
    assert_eq!(get(d.proxy, "/", &[]).status, 200);
    // The tunnel closes: its line, with its bytes, and its place is free.
    drop(a);
    wait_for("the closed tunnel's place back", Duration::from_secs(5), || {
        d.metric("limiter_http_tunnels") == 1.0
    });
    let lines = log_lines(&log, 3);
    let tunnel = lines.iter().find(|l| l["status"] == 101).expect("the tunnel's line");
    assert_eq!(tunnel["bytes_in"], 13, "{tunnel}");
    assert_eq!(tunnel["bytes_out"], 13, "{tunnel}");
    assert!(tunnel["id"].as_str().is_some_and(|id| id.len() == 16));
    let (status, _c) = upgrade(d.proxy);
    assert_eq!(status, 101);
    // The limit is live.
    d.reload("http.maxTunnels = 3\nhttp.accessLog = off\n");
    let (status, _d) = upgrade(d.proxy);
    assert_eq!(status, 101);
    assert_eq!(upgrade(d.proxy).0, 503);
    let _ = std::fs::remove_dir_all(dir);
}

/// An upstream that accepts every upgrade and never closes a tunnel (it
/// keeps each socket open for ever, even after limiter's side closed),
/// counting the tunnels limiter still holds open to it: its own count.
fn never_closing_upgrades() -> (SocketAddr, std::sync::Arc<std::sync::atomic::AtomicI64>) {
    use std::sync::{
        Arc,
        atomic::{AtomicI64, Ordering},
    };
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let open = Arc::new(AtomicI64::new(0));
    let count = open.clone();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(mut s) = s else { return };
            let open = open.clone();
            std::thread::spawn(move || {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if s.read(&mut byte).unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                s.write_all(
                    b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
                )
                .unwrap();
                open.fetch_add(1, Ordering::SeqCst);
                // Read to limiter's close, then hold the socket regardless.
                let mut sink = [0u8; 1024];
                while s.read(&mut sink).unwrap_or(0) > 0 {}
                open.fetch_sub(1, Ordering::SeqCst);
                std::thread::sleep(Duration::from_secs(3600));
            });
        }
    });
    (addr, count)
}

/// An upgrade from `source` (a loopback address); the reply and the
/// connection.
fn upgrade_from(proxy: SocketAddr, source: &str) -> (Reply, TcpStream) {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.bind(&SocketAddr::new(source.parse().unwrap(), 0).into()).unwrap();
    s.connect(&proxy.into()).unwrap();
    let mut s: TcpStream = s.into();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /ws HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n").unwrap();
    (read_reply(&mut s).unwrap(), s)
}

#[test]
fn tunnels_are_capped_per_client_closed_when_idle_and_freed_when_their_client_goes() {
    use std::sync::atomic::Ordering;
    let (up, open) = never_closing_upgrades();
    let d = InProcess::start(
        up,
        "http.maxTunnels = 4\nhttp.maxTunnelsPerClient = 2\nhttp.tunnelIdleTimeoutMs = 2000\n",
    );
    // One client takes its two places; a third from it is refused, another
    // client still gets in.
    let (a, mut a_conn) = upgrade_from(d.proxy, "127.0.0.1");
    let (b, b_conn) = upgrade_from(d.proxy, "127.0.0.1");
    let (c, _) = upgrade_from(d.proxy, "127.0.0.1");
    assert_eq!((a.status, b.status, c.status), (101, 101, 503));
    assert_eq!(c.header("x-limiter-refused"), Some("tunnels_per_client"), "{c:?}");
    let (other, _other_conn) = upgrade_from(d.proxy, "127.0.0.2");
    assert_eq!(other.status, 101);
    wait_for("three tunnels at the upstream", Duration::from_secs(5), || open.load(Ordering::SeqCst) == 3);
    assert_eq!(d.metric("limiter_http_refused_total{reason=\"tunnels_per_client\"}"), 1.0);
    // A client that goes: the upstream is told at once, and the tunnel's
    // place is freed within the grace though the upstream never closes.
    let gone = Instant::now();
    drop(b_conn);
    wait_for("the upstream told of the gone client", Duration::from_secs(5), || {
        open.load(Ordering::SeqCst) == 2
    });
    let told = gone.elapsed();
    wait_for("the gone client's place freed", Duration::from_secs(5), || {
        d.metric("limiter_http_tunnels") == 2.0
    });
    let freed = gone.elapsed();
    assert!(freed < Duration::from_millis(1900), "freed after {freed:?}");
    // Its client's place is back.
    let (again, _again_conn) = upgrade_from(d.proxy, "127.0.0.1");
    assert_eq!(again.status, 101);
    // Traffic keeps a tunnel open past the idle bound...
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        a_conn.write_all(b"x").unwrap();
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(open.load(Ordering::SeqCst) >= 1);
    // ...and with none either way every tunnel is closed after it: both
    // sides see the close, and every place is free.
    let idle_from = Instant::now();
    wait_for("every tunnel closed when idle", Duration::from_secs(10), || open.load(Ordering::SeqCst) == 0);
    let idle_for = idle_from.elapsed();
    assert!(idle_for >= Duration::from_millis(1500), "closed after {idle_for:?} idle");
    let mut rest = Vec::new();
    assert!(a_conn.read_to_end(&mut rest).is_ok(), "the client sees the close");
    assert_eq!(d.metric("limiter_http_tunnels"), 0.0);
    eprintln!(
        "a gone client's tunnel: the upstream told after {told:?}, its place freed after {freed:?}; \
         idle tunnels closed {idle_for:?} after their last byte"
    );
    // Both keys are live: a client's third tunnel gets in once the cap is
    // 3, and a new tunnel is closed after the new idle bound.
    d.reload("http.maxTunnels = 4\nhttp.maxTunnelsPerClient = 3\nhttp.tunnelIdleTimeoutMs = 600\n");
    let held: Vec<_> = (0..3).map(|_| upgrade_from(d.proxy, "127.0.0.1")).collect();
    assert!(held.iter().all(|(r, _)| r.status == 101), "three from one client under a cap of 3");
    assert_eq!(upgrade_from(d.proxy, "127.0.0.1").0.status, 503);
    let opened = Instant::now();
    wait_for("the new idle bound closing them", Duration::from_secs(5), || {
        d.metric("limiter_http_tunnels") == 0.0
    });
    let closed = opened.elapsed();
    assert!(
        closed >= Duration::from_millis(500) && closed < Duration::from_millis(1900),
        "closed after {closed:?}"
    );
}

/// An upstream that answers 413 as soon as it has a head and closes,
/// without reading the body.
fn early_413() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut conn = conn;
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = conn.write_all(
                    b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 10\r\nConnection: close\r\n\r\ntoo large\n",
                );
                // Closed with the body unread: the kernel answers what
                // still comes with a RST.
                std::thread::sleep(Duration::from_millis(20));
            });
        }
    });
    addr
}

#[test]
fn an_answer_before_the_body_was_read_reaches_the_client_and_is_no_failure() {
    let d = InProcess::start(early_413(), "breaker.minRequests = 1\n");
    for (framing, len) in [("Content-Length: 8000000", Some(8_000_000)), ("Transfer-Encoding: chunked", None)]
    {
        let mut s = connect(d.proxy);
        s.write_all(format!("POST /upload HTTP/1.1\r\nHost: t\r\n{framing}\r\n\r\n").as_bytes()).unwrap();
        // The client keeps sending, as a browser uploading a file does,
        // until its writes fail or the answer is read.
        let writer = {
            let mut s = s.try_clone().unwrap();
            std::thread::spawn(move || {
                let chunk = vec![b'x'; 65536];
                for _ in 0..(8_000_000 / 65536) {
                    let piece = match len {
                        Some(_) => chunk.clone(),
                        None => {
                            [format!("{:x}\r\n", chunk.len()).into_bytes(), chunk.clone(), b"\r\n".to_vec()]
                                .concat()
                        }
                    };
                    if s.write_all(&piece).is_err() {
                        return;
                    }
                }
            })
        };
        let reply = read_reply(&mut s).unwrap();
        assert_eq!(reply.status, 413, "{framing}: {reply:?}");
        assert_eq!(reply.text(), "too large\n");
        assert_eq!(reply.header("connection"), Some("close"));
        drop(s);
        let _ = writer.join();
    }
    // The upstream answered: no failure, and the breaker stays closed.
    assert_eq!(d.metric("limiter_breaker_window_error_ratio"), 0.0);
    assert_eq!(d.breaker_state(), "closed");
    assert_eq!(d.metric("limiter_http_upstream_errors_total{kind=\"reset\"}"), 0.0);
}

#[test]
#[ignore = "black-box: the daemon binary and its log; run by `cargo xtask test`"]
fn an_exchange_given_up_on_is_logged_with_the_id_the_upstream_got() {
    let upstream = Upstream::start();
    let dir = temp_dir("abandon-log");
    let (config, proxy) = client::http_config(&dir, Some(upstream.addr), "http.upstreamTimeoutMs = 300\n");
    let d = Daemon::start(&config, &[]).unwrap();
    // The upstream answers 1 s after its head: limiter's 504 at 0.3 s.
    let reply = get(proxy, "/slowhead?ms=1000", &[]);
    assert_eq!(reply.status, 504);
    assert_eq!(d.metric("limiter_http_in_flight{pool=\"normal\"}"), 1.0, "held after the 504");
    wait_for("the upstream's late answer read", Duration::from_secs(5), || {
        d.metric("limiter_http_abandoned_total{cause=\"timeout\",end=\"answered\"}") == 1.0
    });
    assert_eq!(d.metric("limiter_http_in_flight{pool=\"normal\"}"), 0.0);
    let log = d.log();
    let line = log
        .lines()
        .find(|l| l.contains("limiter gave up on"))
        .unwrap_or_else(|| panic!("no line for the abandoned request:\n{log}"));
    assert!(line.contains("cause=\"timeout\"") || line.contains("cause=timeout"), "{line}");
    assert!(line.contains("end=\"answered\"") || line.contains("end=answered"), "{line}");
    let id = line.split("request_id=").nth(1).and_then(|r| r.get(..16)).unwrap_or_else(|| panic!("{line}"));
    assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{line}");
    let went_on: u64 = line
        .split("went_on_ms=")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!((500..2000).contains(&went_on), "the upstream went on {went_on} ms after the 504: {line}");
    let _ = std::fs::remove_dir_all(dir);
}
