//! Every key the key table marks *live* changes behaviour on reload: each
//! test here drives the real daemon in-process ([`InProcess`]: the proxy
//! alone, no kernel gate, so no privileges), rewrites its file, reloads
//! through `POST /reload`, and observes the new behaviour on the wire. The
//! kernel's live keys are proven with the real gate in `reload.rs` (and
//! the older kernel tests named in [`ELSEWHERE`]), the fleet's with a
//! real Redis in `fleet.rs`, `admin.logLevel` in
//! `live_log_level.rs` (its own process: the logger is process-wide);
//! [`every_live_key_has_a_behaviour_test`] keeps the lists honest against
//! the table.

use std::{
    io::{ErrorKind, Read as _, Write as _},
    net::SocketAddr,
    thread,
    time::{Duration, Instant},
};

use limiter::config::{KEYS, Reload};
use limiter_tests::{
    client::{self, Reply},
    in_process::InProcess,
    process::wait_for,
    upstream::Upstream,
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
    ("http.requestBufferBytes", "request_buffer_bytes_changes_live"),
    ("http.requestBodyTimeoutMs", "request_body_timeout_changes_live"),
    ("http.bufferMemoryBytes", "buffer_memory_bytes_changes_live"),
    ("http.responseBufferBytes", "response_buffer_bytes_changes_live"),
    ("http.minDataRate", "min_data_rate_changes_live"),
    ("http.minDataRate", "min_data_rate_changes_live_for_slow_readers"),
    ("breaker.threshold", "breaker_threshold_and_min_requests_change_live"),
    ("breaker.minRequests", "breaker_threshold_and_min_requests_change_live"),
    ("breaker.sleepWindowMs", "breaker_sleep_window_changes_while_open"),
    ("breaker.halfOpenMaxProbes", "breaker_half_open_probes_and_successes_change_live"),
    ("breaker.halfOpenSuccesses", "breaker_half_open_probes_and_successes_change_live"),
    ("breaker.failureStatuses", "breaker_failure_statuses_change_live"),
    ("breaker.bypassDebug", "breaker_bypass_debug_changes_live"),
    ("admin.tokenFile", "admin_token_file_changes_live"),
    ("http.trustedForwarders", "trusted_forwarders_change_for_new_connections"),
    ("admin.watchConfig", "admin_watch_config_reloads_on_a_change_and_on_a_configmap_swap"),
    ("http.underscoresInHeaders", "underscores_in_headers_changes_live"),
];

/// Which test in another file proves each remaining live key: the gate's
/// (they need the real kernel, so they live with the kernel tests), and
/// the log level (its own process).
const ELSEWHERE: &[(&str, &str, &str)] = &[
    ("admin.logLevel", "live_log_level.rs", "log_level_changes_live"),
    ("kernel.ports", "kernel.rs", "limits_change_live_and_reload_is_all_or_nothing"),
    ("kernel.trusted", "xdp.rs", "trusted_prefixes_reload_live_and_a_reshaped_gate_is_refused_at_restart"),
    ("kernel.trustedReserve", "reload.rs", "trusted_reserve_changes_live"),
    ("kernel.port.<port>.perSourceMax", "reload.rs", "per_source_max_changes_live"),
    ("kernel.port.<port>.dryRun", "reload.rs", "dry_run_ports_change_live"),
    (
        "http.tls.certFile",
        "front_door.rs",
        "rotation_changes_the_certificate_new_handshakes_present_and_a_bad_pair_changes_nothing",
    ),
    (
        "http.tls.keyFile",
        "front_door.rs",
        "rotation_changes_the_certificate_new_handshakes_present_and_a_bad_pair_changes_nothing",
    ),
    (
        "http.tls.handshakeTimeoutMs",
        "front_door.rs",
        "handshake_timeout_cuts_silent_connections_and_changes_live",
    ),
    ("http.h2.maxConcurrentStreams", "front_door.rs", "max_concurrent_streams_changes_for_new_connections"),
    ("http.shedAtSyn", "shedding.rs", "shedding_and_its_timings_change_live"),
    ("http.shedAfterMs", "shedding.rs", "shedding_and_its_timings_change_live"),
    ("http.shedRefusalRate", "shedding.rs", "shedding_and_its_timings_change_live"),
    ("http.shedReleaseMs", "shedding.rs", "shedding_and_its_timings_change_live"),
    (
        "http.accessLog",
        "front_door.rs",
        "the_access_log_lines_add_up_to_the_requests_sent_and_a_reload_reopens_it",
    ),
    (
        "http.adaptive",
        "adaptive.rs",
        "a_learnt_limit_keeps_admitted_latency_near_the_service_time_and_follows_a_step_of_capacity",
    ),
    ("http.adaptive.minLimit", "adaptive.rs", "the_floor_and_the_classes_change_live"),
    ("http.critical", "adaptive.rs", "the_floor_and_the_classes_change_live"),
    ("http.sheddable", "adaptive.rs", "the_floor_and_the_classes_change_live"),
    ("fleet.maxSessionConnections", "fleet.rs", "fleet_limits_timeout_and_store_policy_change_live"),
    ("fleet.maxWebConnections", "fleet.rs", "fleet_limits_timeout_and_store_policy_change_live"),
    ("fleet.timeoutMs", "fleet.rs", "fleet_limits_timeout_and_store_policy_change_live"),
    ("fleet.onStoreDown", "fleet.rs", "fleet_limits_timeout_and_store_policy_change_live"),
    (
        "http.upstreamAbandonMs",
        "permit_contract.rs",
        "http_upstream_abandon_ms_bounds_how_long_a_permit_waits",
    ),
    (
        "http.maxTunnels",
        "permit_contract.rs",
        "tunnels_over_http_max_tunnels_are_refused_and_each_closed_one_is_logged",
    ),
    (
        "http.maxTunnelsPerClient",
        "permit_contract.rs",
        "tunnels_are_capped_per_client_closed_when_idle_and_freed_when_their_client_goes",
    ),
    (
        "http.tunnelIdleTimeoutMs",
        "permit_contract.rs",
        "tunnels_are_capped_per_client_closed_when_idle_and_freed_when_their_client_goes",
    ),
];

#[test]
fn every_live_key_has_a_behaviour_test() {
    let this = include_str!("live_keys.rs");
    let others = [
        ("kernel.rs", include_str!("kernel.rs")),
        ("xdp.rs", include_str!("xdp.rs")),
        ("reload.rs", include_str!("reload.rs")),
        ("front_door.rs", include_str!("front_door.rs")),
        ("live_log_level.rs", include_str!("live_log_level.rs")),
        ("shedding.rs", include_str!("shedding.rs")),
        ("adaptive.rs", include_str!("adaptive.rs")),
        ("fleet.rs", include_str!("fleet.rs")),
        ("permit_contract.rs", include_str!("permit_contract.rs")),
    ];
    let mut covered: Vec<&str> = Vec::new();
    for (key, test) in HERE {
        assert!(this.contains(&format!("fn {test}()")), "{key}: no test {test} in this file");
        covered.push(key);
    }
    for (key, file, test) in ELSEWHERE {
        let text = others.iter().find(|(f, _)| f == file).map(|(_, t)| *t).expect("a test file");
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
// The HTTP side.

/// A GET on a thread, for requests that must be in flight together.
fn spawn_get(addr: SocketAddr, path: &str, headers: &[&str]) -> thread::JoinHandle<Reply> {
    let (path, headers): (String, Vec<String>) =
        (path.to_owned(), headers.iter().map(|h| (*h).to_owned()).collect());
    thread::spawn(move || client::get(addr, &path, &headers.iter().map(String::as_str).collect::<Vec<_>>()))
}

#[test]
fn max_threads_resizes_the_normal_pool() {
    let up = Upstream::start();
    let d = InProcess::start(up.addr, "http.maxThreads = 12\n");
    let held = spawn_get(d.proxy, "/hold", &[]);
    up.wait_holding(1);
    let refused = d.get("/x", &[]);
    assert_eq!((refused.status, refused.header("x-limiter-refused")), (503, Some("normal")));
    d.reload("http.maxThreads = 13\n");
    assert_eq!(d.get("/x", &[]).status, 200, "a second normal slot after the reload");
    assert_eq!(up.holding(), 1, "the first slot was still taken");
    up.release();
    assert_eq!(held.join().unwrap().status, 200);
}

#[test]
fn session_and_web_limits_change_live() {
    let up = Upstream::start();
    let d = InProcess::start(up.addr, "http.maxSessionConnections = 1\nhttp.maxWebConnections = 1\n");
    let session = spawn_get(d.proxy, "/hold", &["Authorization: Bearer one"]);
    let web = spawn_get(d.proxy, "/hold", &["X-Client-Id: w1"]);
    up.wait_holding(2);
    assert_eq!(d.get("/x", &["Authorization: Bearer one"]).header("x-limiter-refused"), Some("session"));
    assert_eq!(d.get("/x", &["X-Client-Id: w2"]).header("x-limiter-refused"), Some("web"));
    d.reload("http.maxSessionConnections = 2\nhttp.maxWebConnections = 2\n");
    assert_eq!(d.get("/x", &["Authorization: Bearer one"]).status, 200);
    assert_eq!(d.get("/x", &["X-Client-Id: w2"]).status, 200);
    assert_eq!(up.holding(), 2, "the first session and web requests were still in flight");
    up.release();
    assert_eq!((session.join().unwrap().status, web.join().unwrap().status), (200, 200));
}

#[test]
fn dry_run_turns_on_live() {
    let up = Upstream::start();
    let d = InProcess::start(up.addr, "http.maxThreads = 12\n");
    let held = spawn_get(d.proxy, "/hold", &[]);
    up.wait_holding(1);
    assert_eq!(d.get("/x", &[]).status, 503);
    d.reload("http.maxThreads = 12\nhttp.dryRun = true\n");
    assert_eq!(d.get("/x", &[]).status, 200, "dry-run admits past the full pool");
    assert_eq!(up.holding(), 1, "the pool was still full");
    up.release();
    held.join().unwrap();
}

/// How long the proxy keeps a connection that sent half a head open.
fn half_head_lifetime(proxy: SocketAddr) -> Duration {
    let mut s = client::connect(proxy);
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
    let d = InProcess::start(up.addr, "http.headerReadTimeoutMs = 5000\n");
    let mut s = client::connect(d.proxy);
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
    let mut s = client::connect(proxy);
    s.write_all(b"POST /sink HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nx").unwrap();
    let started = Instant::now();
    let reply = client::read_reply(&mut s).expect("an answer");
    (reply.status, started.elapsed())
}

#[test]
fn idle_timeout_changes_for_new_request_bodies() {
    let up = Upstream::start();
    // Streamed bodies (none is read whole first), whose stall the idle
    // timeout catches before the minimum rate's grace ends.
    let d = InProcess::start(up.addr, "http.requestBufferBytes = 0\nhttp.idleTimeoutMs = 1500\n");
    let (status, took) = stalled_post(d.proxy);
    assert_eq!(status, 408);
    assert!(took >= Duration::from_millis(1400), "a 1.5 s idle timeout cut the body after {took:?}");
    d.reload("http.requestBufferBytes = 0\nhttp.idleTimeoutMs = 100\n");
    let (status, took) = stalled_post(d.proxy);
    assert_eq!(status, 408);
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
    // With a backlog of 0 the queue holds one connection: once a filler's
    // handshake is done, the queue is full.
    wait_for("the upstream's accept queue full", Duration::from_secs(5), || {
        fillers.iter().any(|f| f.peer_addr().is_ok())
    });
    let d = InProcess::start(hanging, "http.connectTimeoutMs = 2000\nbreaker.minRequests = 1000\n");
    let timed = |d: &InProcess| {
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
    let d = InProcess::start(up.addr, "breaker.minRequests = 1000\n");
    assert_eq!(d.get("/slowhead?ms=800", &[]).status, 200);
    d.reload("http.upstreamTimeoutMs = 200\nbreaker.minRequests = 1000\n");
    assert_eq!(d.get("/slowhead?ms=800", &[]).status, 504);
}

#[test]
fn max_header_bytes_changes_for_new_connections() {
    let up = Upstream::start();
    let d = InProcess::start(up.addr, "http.maxHeaderBytes = 32768\n");
    let big = format!("X-Big: {}", "a".repeat(12_000));
    assert_eq!(d.get("/x", &[&big]).status, 200);
    d.reload("http.maxHeaderBytes = 8192\n");
    assert_eq!(d.get("/x", &[&big]).status, 431);
}

/// A 503 with `Connection: close` to a request whose body was not read;
/// the connection it came on.
fn refused_with_body_unread(proxy: SocketAddr) -> std::net::TcpStream {
    let mut s = client::connect(proxy);
    s.write_all(b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 100000\r\n\r\n").unwrap();
    let reply = client::read_reply(&mut s).expect("an answer");
    assert_eq!(reply.status, 503);
    s
}

#[test]
fn linger_changes_for_new_connections() {
    let up = Upstream::start();
    let d = InProcess::start(up.addr, "http.maxThreads = 12\nhttp.lingerMs = 0\n");
    let held = spawn_get(d.proxy, "/hold", &[]);
    up.wait_holding(1);
    // Closed at once: a write draws the RST of a closed socket, and a later
    // one fails, well before the 300 ms asked below.
    let mut s = refused_with_body_unread(d.proxy);
    wait_for("lingerMs = 0 closing at once", Duration::from_millis(300), || {
        s.write_all(b"more body").is_err()
    });
    d.reload("http.maxThreads = 12\nhttp.lingerMs = 2000\n");
    let mut s = refused_with_body_unread(d.proxy);
    // Pacing: asked 300 ms into the 2 s linger.
    thread::sleep(Duration::from_millis(300));
    let first = s.write_all(b"more body");
    // The window for a RST to come back over loopback: what is asked is
    // whether one comes.
    thread::sleep(Duration::from_millis(100));
    assert!(first.is_ok() && s.write_all(b"more body").is_ok(), "lingerMs = 2000 keeps draining");
    up.release();
    held.join().unwrap();
}

#[test]
fn retry_after_changes_live() {
    let up = Upstream::start();
    let d = InProcess::start(up.addr, "http.maxThreads = 12\n");
    let held = spawn_get(d.proxy, "/hold", &[]);
    up.wait_holding(1);
    assert_eq!(d.get("/x", &[]).header("retry-after"), Some("1"));
    d.reload("http.maxThreads = 12\nhttp.retryAfterMs = 4500\n");
    assert_eq!(d.get("/x", &[]).header("retry-after"), Some("5"));
    up.release();
    held.join().unwrap();
}

#[test]
fn drain_timeout_changes_live() {
    let up = Upstream::start();
    let mut d = InProcess::start(up.addr, "http.drainTimeoutMs = 60000\n");
    d.reload("http.drainTimeoutMs = 300\n");
    let proxy = d.proxy;
    let held = thread::spawn(move || client::send(proxy, b"GET /hold HTTP/1.1\r\nHost: a\r\n\r\n"));
    up.wait_holding(1);
    let took = d.stop();
    assert!(took < Duration::from_millis(2500), "a 300 ms drain took {took:?}");
    assert!(held.join().unwrap().is_err(), "the request still in flight was cut");
}

// ---------------------------------------------------------------------------
// The shield: bodies read whole before the permits, responses read ahead.

/// A metric's value from the admin listener.
fn metric(d: &InProcess, name: &str) -> f64 {
    d.metric(name)
}

/// A POST announcing `length` bytes that sends one byte per `every` on a
/// thread until the proxy answers; returns the answer and when it came.
fn trickle(proxy: SocketAddr, length: usize, every: Duration) -> thread::JoinHandle<(u16, Duration)> {
    thread::spawn(move || {
        let mut s = client::connect(proxy);
        let head = format!("POST /sink HTTP/1.1\r\nHost: a\r\nContent-Length: {length}\r\n\r\n");
        s.write_all(head.as_bytes()).unwrap();
        let started = Instant::now();
        let mut reader = s.try_clone().unwrap();
        let answer = thread::spawn(move || client::read_reply(&mut reader).map(|r| r.status).unwrap_or(0));
        for _ in 0..length {
            if answer.is_finished() || s.write_all(b"x").is_err() {
                break;
            }
            // Pacing: the trickle's rate.
            thread::sleep(every);
        }
        (answer.join().unwrap(), started.elapsed())
    })
}

fn wait_metric(d: &InProcess, name: &str, want: f64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(d, name) != want {
        assert!(Instant::now() < deadline, "{name} stayed {} (want {want})", metric(d, name));
        thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn request_buffer_bytes_changes_live() {
    let up = Upstream::start();
    let d = InProcess::start(up.addr, "http.maxThreads = 12\nhttp.requestBufferBytes = 0\n");
    // Streamed: the trickling upload holds the one normal slot.
    let first = trickle(d.proxy, 40, Duration::from_millis(50));
    wait_metric(&d, "limiter_http_in_flight{pool=\"normal\"}", 1.0);
    assert_eq!(d.get("/x", &[]).status, 503, "the slot is held by a client sending slowly");
    assert_eq!(first.join().unwrap().0, 200);
    d.reload("http.maxThreads = 12\nhttp.requestBufferBytes = 65536\n");
    // Read whole first: the trickler holds no permit while it sends.
    let second = trickle(d.proxy, 40, Duration::from_millis(50));
    wait_metric(&d, "limiter_http_bodies_receiving", 1.0);
    assert_eq!(metric(&d, "limiter_http_in_flight{pool=\"normal\"}"), 0.0);
    assert_eq!(d.get("/x", &[]).status, 200, "the slot is free while the body arrives");
    assert_eq!(second.join().unwrap().0, 200);
}

#[test]
fn request_body_timeout_changes_live() {
    let up = Upstream::start();
    let d = InProcess::start(up.addr, "http.requestBodyTimeoutMs = 2000\n");
    let (status, took) = trickle(d.proxy, 1000, Duration::from_millis(50)).join().unwrap();
    assert_eq!(status, 408);
    assert!(took >= Duration::from_millis(1900), "a 2 s deadline answered after {took:?}");
    d.reload("http.requestBodyTimeoutMs = 200\n");
    let (status, took) = trickle(d.proxy, 1000, Duration::from_millis(50)).join().unwrap();
    assert_eq!(status, 408);
    assert!(took < Duration::from_millis(1500), "a 200 ms deadline answered after {took:?}");
    assert_eq!(metric(&d, "limiter_http_body_timeouts_total{kind=\"deadline\"}"), 2.0);
}

#[test]
fn buffer_memory_bytes_changes_live() {
    let up = Upstream::start();
    let d = InProcess::start(up.addr, "http.bufferMemoryBytes = 1000\n");
    let post = format!("POST /sink HTTP/1.1\r\nHost: a\r\nContent-Length: 2000\r\n\r\n{}", "x".repeat(2000));
    let refused = client::send(d.proxy, post.as_bytes()).unwrap();
    assert_eq!((refused.status, refused.header("x-limiter-refused")), (503, Some("buffer_full")));
    assert_eq!(metric(&d, "limiter_http_refused_total{reason=\"buffer_full\"}"), 1.0);
    d.reload("http.bufferMemoryBytes = 1048576\n");
    let r = client::send(d.proxy, post.as_bytes()).unwrap();
    assert_eq!((r.status, r.text().trim()), (200, "2000"));
    wait_metric(&d, "limiter_http_buffered_bytes", 0.0);
}

#[test]
fn response_buffer_bytes_changes_live() {
    let up = Upstream::start();
    // 20 MB: more than the sockets between proxy and client can hold.
    let ask = b"GET /big?bytes=20000000 HTTP/1.1\r\nHost: a\r\n\r\n";
    let d = InProcess::start(up.addr, "http.responseBufferBytes = 0\n");
    let mut reader = client::connect(d.proxy);
    reader.write_all(ask).unwrap();
    // Streamed to a client that does not read: the permit stays held, and
    // nothing is read ahead (which would give it back).
    wait_metric(&d, "limiter_http_admitted_total{pool=\"normal\"}", 1.0);
    // The time a read-ahead would have had to take the 20 MB: what is
    // asked is whether the permit is still held after it.
    thread::sleep(Duration::from_millis(300));
    assert_eq!(metric(&d, "limiter_http_in_flight{pool=\"normal\"}"), 1.0);
    assert_eq!(metric(&d, "limiter_http_buffered_bytes"), 0.0);
    drop(reader);
    wait_metric(&d, "limiter_http_in_flight{pool=\"normal\"}", 0.0);
    d.reload("http.responseBufferBytes = 33554432\n");
    let mut reader = client::connect(d.proxy);
    reader.write_all(ask).unwrap();
    // Read ahead: the permit goes back as soon as the upstream is done,
    // while the client has read nothing.
    wait_metric(&d, "limiter_http_buffered_bytes", 20_000_000.0);
    assert_eq!(metric(&d, "limiter_http_in_flight{pool=\"normal\"}"), 0.0);
    let reply = client::read_reply(&mut reader).unwrap();
    assert_eq!((reply.status, reply.body.len()), (200, 20_000_000));
}

#[test]
fn min_data_rate_changes_live() {
    let up = Upstream::start();
    // Streamed bodies, one byte every 100 ms (10 bytes/s).
    let keys = "http.requestBufferBytes = 0\n";
    let d = InProcess::start(up.addr, &format!("{keys}http.minDataRate = 0\n"));
    let (status, took) = trickle(d.proxy, 45, Duration::from_millis(100)).join().unwrap();
    assert_eq!(status, 200, "no minimum: the slow body arrives after {took:?}");
    d.reload(&format!("{keys}http.minDataRate = 100\n"));
    let (status, took) = trickle(d.proxy, 1000, Duration::from_millis(100)).join().unwrap();
    assert_eq!(status, 408, "10 bytes/s is under the 100 bytes/s minimum");
    assert!(took < Duration::from_millis(4500), "cut after the 3 s grace, at {took:?}");
    assert_eq!(metric(&d, "limiter_http_body_timeouts_total{kind=\"min_rate\"}"), 1.0);
    assert_eq!(metric(&d, "limiter_http_in_flight{pool=\"normal\"}"), 0.0, "the permit came back");
}

/// Starts reading a 20 MB response (larger than the read-ahead, so it
/// streams holding its permit) at 1 KB/s, on a thread that stops when told.
fn slow_reader(
    proxy: SocketAddr,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let mut s = client::connect(proxy);
        s.write_all(b"GET /big?bytes=20000000 HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
        let mut buf = [0u8; 100];
        while !stop.load(std::sync::atomic::Ordering::Relaxed) && matches!(s.read(&mut buf), Ok(n) if n > 0) {
            // Pacing: the reader's 1 KB/s.
            thread::sleep(Duration::from_millis(100));
        }
    })
}

#[test]
fn min_data_rate_changes_live_for_slow_readers() {
    use std::sync::{Arc, atomic::AtomicBool};
    let up = Upstream::start();
    let keys = "http.responseBufferBytes = 0\n";
    let d = InProcess::start(up.addr, &format!("{keys}http.minDataRate = 0\n"));
    let stop = Arc::new(AtomicBool::new(false));
    let reader = slow_reader(d.proxy, stop.clone());
    // A timer: past the 3 s grace, after which a minimum would have cut it.
    thread::sleep(Duration::from_secs(4));
    assert_eq!(
        metric(&d, "limiter_http_in_flight{pool=\"normal\"}"),
        1.0,
        "no minimum: the reader keeps its permit"
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    reader.join().unwrap();
    wait_metric(&d, "limiter_http_in_flight{pool=\"normal\"}", 0.0);
    d.reload(&format!("{keys}http.minDataRate = 100000\n"));
    let stop = Arc::new(AtomicBool::new(false));
    let reader = slow_reader(d.proxy, stop.clone());
    // Cut after the 3 s grace: the permit comes back while the reader is
    // still reading what its socket had buffered.
    wait_metric(&d, "limiter_http_slow_readers_total", 1.0);
    wait_metric(&d, "limiter_http_in_flight{pool=\"normal\"}", 0.0);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    reader.join().unwrap();
}

// ---------------------------------------------------------------------------
// The breaker.

#[test]
fn breaker_threshold_and_min_requests_change_live() {
    let up = Upstream::start();
    let d = InProcess::start(up.addr, "breaker.minRequests = 1000\n");
    for _ in 0..20 {
        assert_eq!(d.get("/status?code=500", &[]).status, 500);
    }
    assert_eq!(d.breaker_state(), "closed", "1000 results needed before it may open");
    d.reload("breaker.minRequests = 5\nbreaker.threshold = 0.99\n");
    // 20 failures and now a success: 20/21 = 0.952, not above 0.99.
    assert_eq!(d.get("/x", &[]).status, 200);
    assert_eq!(d.get("/status?code=500", &[]).status, 500);
    assert_eq!(d.breaker_state(), "closed", "21/22 failures is not above 0.99");
    d.reload("breaker.minRequests = 5\nbreaker.threshold = 0.5\n");
    assert_eq!(d.get("/status?code=500", &[]).status, 500);
    assert_eq!(d.breaker_state(), "open");
    let before = up.hits();
    assert_eq!(d.get("/x", &[]).header("x-limiter-refused"), Some("breaker"));
    assert_eq!(up.hits(), before, "nothing reaches the upstream while open");
}

/// Opens the breaker with failing requests to `path`.
fn trip_with(d: &InProcess, path: &str) {
    for _ in 0..50 {
        if d.breaker_state() == "open" {
            return;
        }
        d.get(path, &[]);
    }
    panic!("50 requests to {path} did not open the breaker");
}

/// Opens the breaker with 500s.
fn trip(d: &InProcess) {
    trip_with(d, "/status?code=500");
}

#[test]
fn breaker_sleep_window_changes_while_open() {
    let up = Upstream::start();
    let keys = "breaker.minRequests = 2\nbreaker.sleepWindowMs = 60000\n";
    let d = InProcess::start(up.addr, keys);
    trip(&d);
    // A timer: more than the 300 ms reloaded below have passed since the
    // trip, so a probe is due at once under the new window.
    thread::sleep(Duration::from_millis(400));
    assert_eq!(d.get("/x", &[]).status, 503, "60 s sleep window");
    d.reload("breaker.minRequests = 2\nbreaker.sleepWindowMs = 300\n");
    assert_eq!(d.get("/x", &[]).status, 200, "the probe goes through once 300 ms have passed");
    assert_eq!(d.breaker_state(), "closed");
}

#[test]
fn breaker_half_open_probes_and_successes_change_live() {
    let up = Upstream::start();
    let keys = "breaker.minRequests = 2\nbreaker.sleepWindowMs = 100\n";
    let d = InProcess::start(up.addr, keys);
    let probe_round = |d: &InProcess| {
        trip(d);
        wait_for("the 100 ms sleep window over", Duration::from_secs(5), || {
            let b: serde_json::Value = serde_json::from_str(&d.socket("GET", "/breaker").1).unwrap();
            b["next_probe_in_ms"] == 0
        });
        let a = spawn_get(d.proxy, "/slowhead?ms=700", &[]);
        let b = spawn_get(d.proxy, "/slowhead?ms=700", &[]);
        let mut statuses = [a.join().unwrap().status, b.join().unwrap().status];
        statuses.sort_unstable();
        statuses
    };
    assert_eq!(probe_round(&d), [200, 503], "one probe at a time");
    assert_eq!(d.breaker_state(), "closed", "one success closes it");
    d.reload(&format!("{keys}breaker.halfOpenMaxProbes = 2\nbreaker.halfOpenSuccesses = 3\n"));
    assert_eq!(probe_round(&d), [200, 200], "two probes at a time");
    assert_eq!(d.breaker_state(), "half_open", "two successes of the three needed");
    assert_eq!(d.get("/x", &[]).status, 200);
    assert_eq!(d.breaker_state(), "closed");
}

#[test]
fn breaker_failure_statuses_change_live() {
    let up = Upstream::start();
    let d = InProcess::start(up.addr, "breaker.minRequests = 2\n");
    for _ in 0..5 {
        assert_eq!(d.get("/status?code=429", &[]).status, 429);
    }
    assert_eq!(d.breaker_state(), "closed", "429 is not a failure by default");
    d.reload("breaker.minRequests = 2\nbreaker.failureStatuses = 429\n");
    for _ in 0..5 {
        assert_eq!(d.get("/status?code=500", &[]).status, 500);
    }
    assert_eq!(d.breaker_state(), "closed", "500 is not a failure once the list says 429");
    trip_with(&d, "/status?code=429");
}

#[test]
fn breaker_bypass_debug_changes_live() {
    let up = Upstream::start();
    let d = InProcess::start(up.addr, "");
    assert_eq!(d.socket("POST", "/breaker/open").0, 200);
    assert_eq!(d.get("/x", &[]).status, 503);
    assert_eq!(d.get("/debug/x", &[]).status, 200, "diagnostics pass an open breaker by default");
    d.reload("breaker.bypassDebug = false\n");
    assert_eq!(d.get("/debug/x", &[]).header("x-limiter-refused"), Some("breaker"));
}

// ---------------------------------------------------------------------------
// The admin listener.

#[test]
fn admin_token_file_changes_live() {
    let up = Upstream::start();
    let d = InProcess::start(up.addr, "");
    // Without a token admin.listen serves /metrics and /healthz only; the
    // token opens the rest there.
    assert_eq!(d.admin("GET", "/status", &[]).status, 403);
    let token = d.dir.join("token");
    limiter_tests::write_secret(&token, "0123456789abcdef0123\n");
    d.reload(&format!("admin.tokenFile = {}\n", token.display()));
    assert_eq!(d.admin("GET", "/status", &[]).status, 401);
    assert_eq!(d.admin("GET", "/status", &["Authorization: Bearer 0123456789abcdef0123"]).status, 200);
}

#[test]
fn trusted_forwarders_change_for_new_connections() {
    let up = Upstream::start();
    let d = InProcess::start(up.addr, "");
    let chain = |d: &InProcess| {
        let r = d.get("/headers", &["X-Forwarded-For: 10.0.0.9"]);
        r.text().lines().find_map(|l| l.strip_prefix("x-forwarded-for: ").map(str::to_owned)).unwrap()
    };
    assert_eq!(chain(&d), "127.0.0.1", "untrusted: replaced");
    d.reload("http.trustedForwarders = 127.0.0.1\n");
    assert_eq!(chain(&d), "10.0.0.9, 127.0.0.1", "trusted: extended");
    d.reload("http.trustedForwarders = 10.0.0.0/8\n");
    assert_eq!(chain(&d), "127.0.0.1", "no longer trusted");
}

#[test]
fn admin_watch_config_reloads_on_a_change_and_on_a_configmap_swap() {
    use std::os::unix::fs::symlink;
    let up = Upstream::start();
    let d = InProcess::start(up.addr, "admin.watchConfig = true\nhttp.maxThreads = 12\n");
    let (file, base) = d.file();
    let (file, base) = (file.to_path_buf(), base.to_owned());
    let limit = || d.metric("limiter_http_pool_limit{pool=\"normal\"}");
    let text = |threads: u32, watch: bool| {
        format!("{base}admin.watchConfig = {watch}\nhttp.maxThreads = {threads}\n")
    };
    let within = Duration::from_secs(5);
    assert_eq!(limit(), 1.0);
    // An edit in place, no signal.
    std::fs::write(&file, text(13, true)).unwrap();
    wait_for("the edit applied", within, || limit() == 2.0);
    // The ConfigMap way: the file is a symlink into `..data`, itself a
    // symlink swapped to a new directory on each update.
    let update = |name: &str, body: String| {
        let data = d.dir.join(name);
        std::fs::create_dir_all(&data).unwrap();
        std::fs::write(data.join("limiter.ini"), body).unwrap();
        let tmp = d.dir.join("..data_tmp");
        let _ = std::fs::remove_file(&tmp);
        symlink(name, &tmp).unwrap();
        std::fs::rename(&tmp, d.dir.join("..data")).unwrap();
    };
    update("..2026_12_01_a", text(14, true));
    let tmp = d.dir.join("limiter.ini.tmp");
    symlink("..data/limiter.ini", &tmp).unwrap();
    std::fs::rename(&tmp, &file).unwrap();
    wait_for("the ConfigMap file applied", within, || limit() == 3.0);
    update("..2026_12_01_b", text(15, true));
    wait_for("the ..data swap applied", within, || limit() == 4.0);
    // A bad update applies nothing, once.
    update("..2026_12_01_c", format!("{base}admin.watchConfig = true\nhttp.maxThreads = lots\n"));
    let rejected = "limiter_config_reloads_total{result=\"rejected\"}";
    wait_for("the bad file refused", within, || d.metric(rejected) == 1.0);
    // A window of two and a half looks (one a second): what is asked is
    // that none of them retries.
    thread::sleep(Duration::from_millis(2500));
    assert_eq!((limit(), d.metric(rejected)), (4.0, 1.0), "nothing applied, and not retried in a loop");
    // Turned off (by a change it still sees): later changes wait for a signal.
    update("..2026_12_01_d", text(16, false));
    wait_for("the last watched change applied", within, || limit() == 5.0);
    update("..2026_12_01_e", text(17, false));
    // A window of two and a half looks: what is asked is that none applies
    // the change.
    thread::sleep(Duration::from_millis(2500));
    assert_eq!(limit(), 5.0, "watching is off");
}

#[test]
fn underscores_in_headers_changes_live() {
    let upstream = Upstream::start();
    let d = InProcess::start(upstream.addr, "");
    let head = |d: &InProcess| {
        d.get("/headers", &["X_Custom: 1", "X_Forwarded_For: 6.6.6.6"]).text().to_ascii_lowercase()
    };
    let before = head(&d);
    assert!(!before.contains("x_custom") && !before.contains("6.6.6.6"), "{before}");
    d.reload("http.underscoresInHeaders = on\n");
    let after = head(&d);
    assert!(after.contains("x_custom: 1"), "{after}");
    assert!(!after.contains("6.6.6.6"), "a forwarding header passed in its `_` spelling: {after}");
}
