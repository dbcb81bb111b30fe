//! One real scrape with every part of the daemon that exports metrics in
//! use: the kernel gate (a port-wide limit, a per-source cap, trusted
//! prefixes, XDP on a veth, dry-run shedding), the proxy over cleartext,
//! h2c and TLS, the access log, fleet limits over a Redis. The tests that hold the metrics to their
//! conventions and the deployment files and manual to the real metric
//! names all read this page, so none of them compares against a list that
//! could be wrong in the same way.

use std::collections::BTreeSet;

use crate::{Daemon, Sandbox, peer::Peer};

/// A daemon running the full configuration, and what it scraped.
pub struct Full {
    pub daemon: Daemon,
    pub page: String,
    _redis: crate::store::Redis,
    // Held for the daemon's lifetime; dropped (removed) after it.
    _peer: Peer,
    pub sb: Sandbox,
}

/// Starts the daemon in a sandbox with everything configured (the adaptive
/// limit on, so its families are served too), sends it a
/// request on each protocol so every labelled family has its series, and
/// scrapes it.
pub fn full() -> Full {
    let sb = Sandbox::new().unwrap();
    let peer = sb.peer().unwrap();
    let (cert, key) = crate::tls::self_signed(&sb.dir, "metrics");
    let redis = crate::store::Redis::start_in(&sb, "127.0.0.1", 6379, &sb.dir.join("redis"), &[]).unwrap();
    let hash_key = sb.dir.join("fleet.key");
    crate::write_secret(&hash_key, crate::store::HASH_KEY);
    let config = sb.config(
        "8080:100",
        &format!(
            "port.8080.perSourceMax = 50\nkernel.trusted = 10.99.0.0/16\nkernel.xdp.interfaces = {}\n\
             http.upstream = sample\nhttp.h2c = true\nhttp.tls.listen = 127.0.0.1:0\n\
             http.tls.certFile = {}\nhttp.tls.keyFile = {}\nhttp.accessLog = {}\nhttp.adaptive = on\n\
             fleet.store = redis://127.0.0.1:6379\nfleet.hashKeyFile = {}\nfleet.maxSessionConnections = 5\n\
             fleet.maxWebConnections = 5\n",
            peer.server_if,
            cert.display(),
            key.display(),
            sb.dir.join("access.log").display(),
            hash_key.display(),
        ),
    );
    let daemon = Daemon::start_inside(&sb, &config, &[]).expect("the daemon starts");
    // A store that never held the fleet's data lets no share grow for a
    // lease after the first node reads it (it may have lost it).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while crate::try_metric(&daemon.metrics(), "limiter_fleet_quiet_groups") != Some(0.0) {
        assert!(std::time::Instant::now() < deadline, "the fleet's quiet never ended:\n{}", daemon.log());
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let text = std::fs::read_to_string(&config).unwrap();
    let proxy: std::net::SocketAddr =
        text.lines().find_map(|l| l.strip_prefix("http.listen = ")).expect("http.listen").parse().unwrap();
    // The daemon serves in the sandbox's namespace: the client goes there.
    let reply =
        sb.in_netns(move || crate::client::get(proxy, "/", &["Authorization: Bearer t", "X-Client-Id: c"]));
    assert_eq!(reply.status, 200, "a request through the proxy: {}", reply.text());
    let page = daemon.metrics();
    Full { daemon, page, _redis: redis, _peer: peer, sb }
}

/// The metric families a page declares with `# TYPE`.
pub fn families(page: &str) -> BTreeSet<String> {
    page.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .map(str::to_owned)
        .collect()
}

/// Whether `name` is a family of the page or one of a histogram's series
/// (`_bucket`, `_sum`, `_count`).
pub fn names_a_family(families: &BTreeSet<String>, name: &str) -> bool {
    families.contains(name)
        || ["_bucket", "_sum", "_count"]
            .iter()
            .any(|s| name.strip_suffix(s).is_some_and(|base| families.contains(base)))
}

/// The metric names of the manual's metrics reference (docs/metrics.md:
/// its table rows' first cells).
pub fn manual_metrics() -> BTreeSet<String> {
    let section = std::fs::read_to_string(crate::workspace().join("docs/metrics.md")).unwrap();
    let mut names = BTreeSet::new();
    for row in section.lines().filter(|l| l.starts_with("| `")) {
        let first = row.split('|').nth(1).unwrap_or_default();
        for name in first.split('`').skip(1).step_by(2) {
            assert!(
                name.starts_with("limiter_") || name.starts_with("process_"),
                "docs/metrics.md's table names `{name}` in a row's first cell: one metric name a row, written whole"
            );
            names.insert(name.to_owned());
        }
    }
    assert!(names.len() > 40, "docs/metrics.md's table: {names:?}");
    names
}
