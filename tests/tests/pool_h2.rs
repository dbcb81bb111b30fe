//! The permit contract over HTTP/2, against real Jetty: a permit stands
//! for one of the upstream's threads and is held while the upstream works
//! on the request, whatever the client does. Jetty 9.4 with 40 threads
//! and a servlet that takes 200 ms, behind limiter's TLS listener with
//! `http.maxThreads = 40` (29 normal slots and 3 for `/debug/`); `h2load
//! -c 8 -m 50 -D 8` (400 streams at once, far past the pool, and every
//! stream still in flight reset when its 8 s are up), `/debug/` asked over
//! HTTP/2 meanwhile, three runs back to back. Jetty must never work on
//! more requests at once than limiter has slots, nor queue one for want
//! of a thread. (Before the one pipeline, Jetty saw 35 and 38 at once in
//! two runs of three: a stream reset gave its permit back while Jetty
//! still worked on its request.)

use std::{
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use limiter_tests::{in_process::InProcess, jetty::Jetty, process::run_with_deadline, tls::self_signed};

/// What `/debug/` probes got: 200s, and anything else.
#[derive(Default)]
struct Probes {
    ok: AtomicU64,
    other: AtomicU64,
}

#[test]
#[ignore = "needs Debian's jetty9, a JDK and h2load (set-up installs them): run by cargo xtask test"]
fn http2_load_never_overruns_the_upstreams_threads() {
    let jetty = Jetty::start(40);
    let dir = std::env::temp_dir().join(format!("limiter-pool-h2-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = self_signed(&dir, "pool");
    let d = InProcess::start(
        jetty.addr,
        &format!(
            "http.maxThreads = 40\nhttp.tls.listen = 127.0.0.1:0\nhttp.tls.certFile = {}\nhttp.tls.keyFile = {}\n",
            cert.display(),
            key.display()
        ),
    );
    let tls = d.tls.expect("a TLS listener");
    let slots = 40 - 8;
    // Three runs back to back, as an operator's load comes: each one's end
    // (every stream in flight reset) meets the next one's start.
    jetty.reset();
    let stop = Arc::new(AtomicBool::new(false));
    let probes = Arc::new(Probes::default());
    let prober = {
        let (stop, probes) = (stop.clone(), probes.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let out = Command::new("curl")
                    .args(["-sk", "--http2", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "5"])
                    .arg(format!("https://127.0.0.1:{}/debug/probe?ms=200", tls.port()))
                    .output()
                    .expect("curl (installed by set-up)");
                let counter = if out.stdout == b"200" { &probes.ok } else { &probes.other };
                counter.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    for run in 1..=3 {
        let out = run_with_deadline(
            Command::new("h2load")
                .args(["-c", "8", "-m", "50", "-D", "8"])
                .arg(format!("https://127.0.0.1:{}/work?ms=200", tls.port())),
            Duration::from_secs(60),
        );
        let report = String::from_utf8_lossy(&out.stdout);
        assert!(report.contains("status codes:"), "run {run}: h2load ran: {report}");
        let stats = jetty.stats();
        eprintln!(
            "after run {run}: Jetty at most {} at once so far, {} queued, {} served",
            stats.peak, stats.queued_peak, stats.served
        );
    }
    stop.store(true, Ordering::Relaxed);
    prober.join().unwrap();
    limiter_tests::process::wait_for("Jetty done with every request", Duration::from_secs(10), || {
        jetty.stats().inflight == 0
    });
    let stats = jetty.stats();
    let (ok, other) = (probes.ok.load(Ordering::Relaxed), probes.other.load(Ordering::Relaxed));
    eprintln!(
        "Jetty at most {} at once, {} queued, {} served; /debug/ probes {ok} ok, {other} not",
        stats.peak, stats.queued_peak, stats.served
    );
    assert!(stats.served > 1000, "the load reached Jetty: {stats:?}");
    assert!(
        stats.peak <= slots,
        "Jetty worked on {} requests at once, past limiter's {slots} slots",
        stats.peak
    );
    assert_eq!(stats.queued_peak, 0, "Jetty queued requests for want of a thread");
    assert!(ok > 0, "no /debug/ probe answered 200");
    assert_eq!(other, 0, "a /debug/ probe was not answered 200");
    let _ = std::fs::remove_dir_all(&dir);
}
