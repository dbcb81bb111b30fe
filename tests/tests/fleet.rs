//! Fleet-wide limits, black-box: several daemons, each in its own network
//! namespace in front of its own upstream listener, share budgets in a
//! real Redis (Debian's `redis-server`, one or a cluster of three
//! masters) that the tests start and stop themselves; clients in the
//! store's namespace spread each session's requests over every node
//! (`limiter_tests::store` draws the topology).
//!
//! The upstream's listeners are one service ([`Upstream::also_on`]), so
//! its `/hold` count, its `/slowhead` peak and its count of each session's
//! requests in progress ([`Upstream::session_peak`]) are what the fleet
//! admitted together: the tests judge the limit by the upstream's count,
//! never by limiter's.

use std::{
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use limiter::fleet::session_key_for;
use limiter_tests::{
    client::{self, Reply},
    in_netns,
    process::wait_for,
    require_kernel,
    store::{self, HASH_KEY, Node, STORE_IP, StoreNet},
    upstream::Upstream,
    write_secret,
};

/// A request from the store's namespace on a thread of its own.
fn spawn_get(
    net: &StoreNet,
    addr: SocketAddr,
    path: &str,
    headers: &[String],
) -> thread::JoinHandle<std::io::Result<Reply>> {
    let netns = net.sb.netns_file();
    let mut raw = format!("GET {path} HTTP/1.1\r\nHost: fleet\r\n");
    for h in headers {
        raw.push_str(h);
        raw.push_str("\r\n");
    }
    raw.push_str("\r\n");
    thread::spawn(move || in_netns(&netns, move || client::send(addr, raw.as_bytes())))
}

fn get(net: &StoreNet, addr: SocketAddr, path: &str, headers: &[String]) -> Reply {
    spawn_get(net, addr, path, headers).join().expect("a client thread").expect("a response")
}

fn auth(token: &str) -> Vec<String> {
    vec![format!("Authorization: {token}")]
}

/// Asserts a fleet refusal: 503, its reason, `Retry-After`, and the
/// connection closed.
fn assert_refused(r: &Reply, reason: &str) {
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.header("x-limiter-refused"), Some(reason));
    assert!(r.header("retry-after").is_some());
    assert_eq!(r.header("connection"), Some("close"));
}

/// Joins `handles`, every one of which must have answered.
/// Starts `n` long requests of `token`, the i-th on `addrs[i % len]`, one
/// at a time: each is in the upstream before the next goes, and one the
/// shares refused at once (nodes claiming in the same instant may split the
/// last units unevenly, within the false-refusal bound of docs/fleet.md) is sent
/// again, so that a test starts from exactly `n` held.
fn hold_each(
    net: &StoreNet,
    up: &Upstream,
    addrs: &[SocketAddr],
    path: &str,
    token: &str,
    n: u64,
) -> Vec<thread::JoinHandle<std::io::Result<Reply>>> {
    let mut held = Vec::new();
    for i in 0..n {
        let mut sent = 0;
        loop {
            let h = spawn_get(net, addrs[i as usize % addrs.len()], path, &auth(token));
            let deadline = Instant::now() + Duration::from_secs(5);
            while up.session_now(token) <= i && !h.is_finished() && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(10));
            }
            if up.session_now(token) > i {
                held.push(h);
                break;
            }
            let reply = h.join().expect("a client thread");
            sent += 1;
            assert!(sent < 20, "request {i} of {token} was never admitted: last {reply:?}");
            thread::sleep(Duration::from_millis(100));
        }
    }
    held
}

fn statuses(handles: Vec<thread::JoinHandle<std::io::Result<Reply>>>) -> Vec<Reply> {
    handles.into_iter().map(|h| h.join().expect("a client thread").expect("a response")).collect()
}

/// Waits until no node has a request of a fleet budget in flight and the
/// store's `keys` hold nothing: no share and no demand left (unused shares and
/// the demand of refused requests go at the renewal after next, within two
/// thirds of a lease and a round trip).
fn wait_all_given_back(net: &StoreNet, port: u16, nodes: &[Node], keys: &[&str]) {
    wait_for("every fleet share given back", Duration::from_secs(8), || {
        nodes.iter().all(|n| {
            n.daemon.metric("limiter_fleet_permits{kind=\"session\"}") == 0.0
                && n.daemon.metric("limiter_fleet_permits{kind=\"web\"}") == 0.0
        }) && keys.iter().all(|k| net.given_back(port, k).unwrap_or(false))
    });
}

const WEB_KEY: &str = "limiter:{default:web}";

/// [`Upstream::wait_holding`], saying on failure what every node and the
/// store held of `keys`.
fn wait_held(up: &Upstream, n: u64, net: &StoreNet, nodes: &[Node], keys: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while up.holding() != n && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(5));
    }
    if up.holding() == n {
        return;
    }
    let mut why = String::new();
    for node in nodes {
        let page = node.daemon.metrics();
        let fleet: Vec<&str> =
            page.lines().filter(|l| l.starts_with("limiter_fleet") && !l.contains("_bucket")).collect();
        why.push_str(&format!("node {}: {}\n", node.addr, fleet.join(" | ")));
    }
    for key in keys {
        why.push_str(&format!(
            "{key}: {}\n",
            net.cli(6379, &["hgetall", key]).unwrap_or_default().replace('\n', " ")
        ));
    }
    panic!("upstream holds {} requests, want {n}:\n{why}", up.holding());
}

/// The tests that count exactly give the store more time than the
/// default 20 ms: a request whose claim is late (a debug build on a busy CI
/// machine) is refused `fleet_down`, as it should be, but not what those
/// tests count.
const PATIENT: &str = "fleet.timeoutMs = 400";

/// No ask failed or timed out on any node (so the counts are the
/// store's).
fn assert_store_never_failed(nodes: &[Node]) {
    for n in nodes {
        assert_eq!(n.daemon.metric("limiter_fleet_store_failures_total"), 0.0, "{}", n.daemon.log());
    }
}

#[test]
#[ignore = "black-box: the daemon binary, root, network namespaces and redis-server; run by `cargo xtask test`"]
fn three_daemons_and_one_redis_hold_a_session_to_exactly_its_fleet_limit() {
    require_kernel!();
    let net = StoreNet::new().unwrap();
    let _redis = net.redis(6379, &[]).unwrap();
    let up = Upstream::start();
    let nodes = store::fleet(
        &net,
        &up,
        3,
        &format!(
            "fleet.store = redis://{STORE_IP}:6379\nfleet.maxSessionConnections = 5\nfleet.maxWebConnections = 4\n{PATIENT}"
        ),
    )
    .unwrap();
    let token = "Bearer tok-A-0123456789-secret";
    let key = session_key_for("default", HASH_KEY, token.as_bytes());

    // Twelve requests of one session, four on each node, together: five
    // reach the upstream, wherever they came in; seven are refused.
    let held: Vec<_> = (0..12).map(|i| spawn_get(&net, nodes[i % 3].addr, "/hold", &auth(token))).collect();
    wait_held(&up, 5, &net, &nodes, &[&key, WEB_KEY]);
    assert_store_never_failed(&nodes);
    wait_for("the seven refusals", Duration::from_secs(5), || {
        held.iter().filter(|h| h.is_finished()).count() == 7
    });
    assert_eq!(up.holding(), 5, "exactly the fleet's limit");
    assert_eq!(up.session_peak(token), 5);
    assert!(net.shares(6379, &key).unwrap() <= 5, "the shares never sum above the limit");
    let refused: u64 = nodes
        .iter()
        .map(|n| n.daemon.metric("limiter_http_refused_total{reason=\"fleet_session\"}") as u64)
        .sum();
    assert_eq!(refused, 7);
    assert!(
        nodes.iter().filter(|n| n.daemon.metric("limiter_fleet_permits{kind=\"session\"}") > 0.0).count()
            >= 2,
        "the session's permits are spread over the nodes"
    );

    // A reader of the store learns no token: not in a key, not in a value.
    let contents = net.contents(6379).unwrap();
    assert!(contents.contains(&key), "{contents}");
    for secret in ["tok-A", "0123456789-secret", "Bearer", "bearer"] {
        assert!(!contents.contains(secret), "the store holds {secret:?}:\n{contents}");
    }

    // The same credential spelled otherwise is the same session; another
    // session has its own budget; `/debug/` is never subject.
    assert_refused(
        &get(&net, nodes[1].addr, "/x", &auth("bearer   tok-A-0123456789-secret ")),
        "fleet_session",
    );
    let other = spawn_get(&net, nodes[2].addr, "/hold", &auth("Bearer tok-B"));
    up.wait_holding(6);
    let debug = spawn_get(&net, nodes[0].addr, "/debug/hold", &auth(token));
    up.wait_holding(7);

    // Web clients: four across the fleet.
    let web: Vec<_> =
        (0..6).map(|i| spawn_get(&net, nodes[i % 3].addr, "/hold", &["X-Client-Id: w".to_owned()])).collect();
    wait_held(&up, 11, &net, &nodes, &[&key, WEB_KEY]);
    wait_for("the two web refusals", Duration::from_secs(5), || {
        web.iter().filter(|h| h.is_finished()).count() == 2
    });
    assert_eq!(up.holding(), 11);
    assert_eq!(net.shares(6379, WEB_KEY).unwrap(), 4);

    // `/status`, `dump` and the metrics show the fleet's view (as the
    // store said it at the node's last claim or renewal: within a renewal).
    let short = limiter::fleet::short_key(&key);
    let fleet_view = |node: &Node| {
        let status: serde_json::Value =
            serde_json::from_str(&node.daemon.admin_get("/status").unwrap()).unwrap();
        status["http"]["fleet"].clone()
    };
    let mut seen = Vec::new();
    wait_for("the fleet's counts seen by every node", Duration::from_secs(3), || {
        seen = nodes.iter().map(fleet_view).collect();
        seen.iter().all(|f| f["up"] == true && f["web_fleet"] == 4)
            && seen.iter().any(|f| {
                f["busiest_sessions"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|s| s["key"] == short.as_str() && s["fleet"] == 5)
            })
    });
    assert_eq!(nodes[0].daemon.metric("limiter_fleet_web_shares"), 4.0);
    let shown = nodes
        .iter()
        .position(|n| fleet_view(n)["tracked_sessions"] == 1)
        .expect("a node holding the session");
    let dump = limiter_tests::limiter(&["dump", "--config", nodes[shown].config.to_str().unwrap()]);
    let dump = String::from_utf8_lossy(&dump.stdout);
    assert!(dump.contains("fleet default") && dump.contains(&short), "{dump}");
    assert!(!dump.contains("tok-A"), "{dump}");

    up.release();
    let replies = statuses(held);
    let (ok, no): (Vec<&Reply>, Vec<&Reply>) = replies.iter().partition(|r| r.status == 200);
    assert_eq!(ok.len(), 5);
    no.iter().for_each(|r| assert_refused(r, "fleet_session"));
    let web = statuses(web);
    assert_eq!(web.iter().filter(|r| r.status == 200).count(), 4);
    web.iter().filter(|r| r.status != 200).for_each(|r| assert_refused(r, "fleet_web"));
    assert_eq!(statuses(vec![other, debug]).iter().map(|r| r.status).collect::<Vec<_>>(), [200, 200]);

    // All of it given back, at once: the budget is whole again.
    wait_all_given_back(&net, 6379, &nodes, &[&key, WEB_KEY]);
    let again: Vec<_> = (0..5).map(|i| spawn_get(&net, nodes[i % 3].addr, "/hold", &auth(token))).collect();
    wait_held(&up, 5, &net, &nodes, &[&key, WEB_KEY]);
    up.release();
    assert!(statuses(again).iter().all(|r| r.status == 200));

    // Five spellings of one Basic credential (one `user:pas` to Jetty's
    // decoder), and the first again, spread over the nodes: one session,
    // five in flight across the fleet.
    wait_all_given_back(&net, 6379, &nodes, &[&key]);
    let spellings =
        ["dXNlcjpwYXM=", "dXNlcjpwYXM", "dXNlcjpwYXN=", "dXNlcjpwYXO=", "dXNlcjpwYXP", "dXNlcjpwYXM="];
    let spelled: Vec<_> = spellings
        .iter()
        .enumerate()
        .map(|(i, b)| spawn_get(&net, nodes[i % 3].addr, "/hold", &auth(&format!("Basic {b}"))))
        .collect();
    wait_held(&up, 5, &net, &nodes, &[&key, WEB_KEY]);
    wait_for("the sixth spelling refused", Duration::from_secs(5), || {
        spelled.iter().filter(|h| h.is_finished()).count() == 1
    });
    assert_eq!(up.holding(), 5, "one credential, one session of five");
    up.release();
    let replies = statuses(spelled);
    assert_eq!(replies.iter().filter(|r| r.status == 200).count(), 5);
    replies.iter().filter(|r| r.status != 200).for_each(|r| assert_refused(r, "fleet_session"));
}

#[test]
#[ignore = "black-box: the daemon binary, root, network namespaces and redis-server; run by `cargo xtask test`"]
fn a_redis_cluster_of_three_masters_holds_sessions_to_exactly_their_fleet_limit() {
    require_kernel!();
    let net = StoreNet::new().unwrap();
    let ports = [7001, 7002, 7003];
    let _cluster = net.cluster(ports).unwrap();
    let up = Upstream::start();
    let nodes = store::fleet(
        &net,
        &up,
        3,
        &format!(
            "fleet.store = redis+cluster://{STORE_IP}:7001,{STORE_IP}:7002\nfleet.maxSessionConnections = 3\nfleet.name = eu-1\n{PATIENT}"
        ),
    )
    .unwrap();
    // Eight sessions, five requests each spread over the nodes: three of
    // each reach the upstream.
    let tokens: Vec<String> = (0..8).map(|i| format!("Bearer cluster-session-{i}")).collect();
    let held: Vec<_> =
        (0..40).map(|i| spawn_get(&net, nodes[i % 3].addr, "/hold", &auth(&tokens[i % 8]))).collect();
    up.wait_holding(24);
    assert_store_never_failed(&nodes);
    wait_for("the sixteen refusals", Duration::from_secs(5), || {
        held.iter().filter(|h| h.is_finished()).count() == 16
    });
    assert_eq!(up.holding(), 24);
    // The sessions' keys are spread over the masters (each its own slot).
    let keys: Vec<String> = tokens.iter().map(|t| session_key_for("eu-1", HASH_KEY, t.as_bytes())).collect();
    let masters_with_keys =
        ports.iter().filter(|&&p| !net.cli(p, &["--scan"]).unwrap().trim().is_empty()).count();
    assert!(masters_with_keys >= 2, "the keys are all on one master");
    for (k, t) in keys.iter().zip(&tokens) {
        assert_eq!(up.session_peak(t), 3, "{t}");
        assert!(net.shares(7001, k).unwrap() <= 3, "{k}");
    }
    up.release();
    let replies = statuses(held);
    assert_eq!(replies.iter().filter(|r| r.status == 200).count(), 24);
    replies.iter().filter(|r| r.status != 200).for_each(|r| assert_refused(r, "fleet_session"));
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    wait_all_given_back(&net, 7001, &nodes, &keys);
}

#[test]
#[ignore = "black-box: the daemon binary, root, network namespaces and redis-server; run by `cargo xtask test`"]
fn a_node_killed_holding_permits_frees_them_within_the_lease_and_a_restart_does_not_count_twice() {
    require_kernel!();
    let net = StoreNet::new().unwrap();
    let password = "redis-password-for-the-fleet";
    let _redis = net.redis(6379, &["--requirepass", password]).unwrap();
    net.set_password(password);
    let password_file = net.sb.dir.join("redis.pass");
    write_secret(&password_file, password);
    let up = Upstream::start();
    let lease = Duration::from_millis(1500);
    let mut nodes = store::fleet(
        &net,
        &up,
        2,
        &format!(
            "fleet.store = redis://{STORE_IP}:6379\nfleet.passwordFile = {}\nfleet.maxSessionConnections = 40\nfleet.leaseMs = {}\n{PATIENT}",
            password_file.display(),
            lease.as_millis()
        ),
    )
    .unwrap();
    let token = "Bearer forty-permits";
    let key = session_key_for("default", HASH_KEY, token.as_bytes());
    let hold_40 = |net: &StoreNet, node: &Node| -> Vec<_> {
        (0..40).map(|_| spawn_get(net, node.addr, "/hold", &auth(token))).collect()
    };

    let _a = hold_40(&net, &nodes[0]);
    up.wait_holding(40);
    assert_refused(&get(&net, nodes[1].addr, "/x", &auth(token)), "fleet_session");
    // B's demand (the refused request) is recorded for a renewal or two:
    // gone before A is killed, so that A's restart can take all forty.
    thread::sleep(lease);

    // A restarted: a new process, which may not take the dead one's forty
    // at once (an upstream may still be working on the dead one's
    // requests); it ends the dead one's field once it has seen it
    // unchanged for a lease, then takes its forty, counted once.
    nodes[0].kill9();
    up.release();
    up.wait_holding(0);
    assert_eq!(net.shares(6379, &key).unwrap(), 40, "the dead process's share is still counted");
    nodes[0].restart().unwrap();
    let restarted = Instant::now();
    loop {
        let r = get(&net, nodes[0].addr, "/x", &auth(token));
        if r.status == 200 {
            break;
        }
        assert_refused(&r, "fleet_session");
        assert!(
            restarted.elapsed() < lease * 4,
            "the dead process's share was never ended:\n{}\n{}",
            nodes[0].daemon.log(),
            net.contents(6379).unwrap_or_default()
        );
        thread::sleep(Duration::from_millis(25));
    }
    let took = restarted.elapsed();
    let _a = hold_40(&net, &nodes[0]);
    up.wait_holding(40);
    assert!(took >= lease && took < lease * 3, "the restart took the forty after {took:?} (lease {lease:?})");
    assert_eq!(net.shares(6379, &key).unwrap(), 40, "counted once");
    assert_refused(&get(&net, nodes[1].addr, "/x", &auth(token)), "fleet_session");

    // A killed for good: within the lease and one renewal period, B can
    // use all forty.
    nodes[0].kill9();
    let killed = Instant::now();
    up.release();
    up.wait_holding(0);
    loop {
        let r = get(&net, nodes[1].addr, "/x", &auth(token));
        if r.status == 200 {
            break;
        }
        assert_refused(&r, "fleet_session");
        assert!(killed.elapsed() < lease * 3, "the dead node's permits were never freed");
        thread::sleep(Duration::from_millis(25));
    }
    let freed = killed.elapsed();
    assert!(freed <= lease + lease / 3 + Duration::from_millis(300), "freed after {freed:?}");
    println!(
        "lease {lease:?}: the restarted process took the forty after {took:?}, a node killed for good freed them after {freed:?}"
    );
    let b = hold_40(&net, &nodes[1]);
    up.wait_holding(40);
    assert_refused(&get(&net, nodes[1].addr, "/x", &auth(token)), "fleet_session");
    up.release();
    assert!(statuses(b).iter().all(|r| r.status == 200));
    eprintln!("a kill -9's forty permits were free again after {freed:?} (lease {lease:?})");
}

/// Clients looping requests of one session over every node, each on a new
/// connection, recording every outcome and the slowest answer.
struct Load {
    stop: Arc<AtomicBool>,
    /// Each request's outcome, how long it took, and when it started.
    outcomes: Arc<Mutex<Vec<(String, Duration, Instant)>>>,
    started: Instant,
    threads: Vec<thread::JoinHandle<()>>,
}

/// Outcomes by kind, and the slowest answer.
type Tally = (std::collections::BTreeMap<String, u64>, Duration);

impl Load {
    fn start(net: &StoreNet, nodes: &[SocketAddr], clients: usize, token: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let outcomes = Arc::new(Mutex::new(Vec::new()));
        let threads = (0..clients)
            .map(|c| {
                let (stop, outcomes, nodes, netns) =
                    (stop.clone(), outcomes.clone(), nodes.to_vec(), net.sb.netns_file());
                let raw = format!(
                    "GET /slowhead?ms=20 HTTP/1.1\r\nHost: f\r\nAuthorization: {token}\r\nConnection: close\r\n\r\n"
                );
                thread::spawn(move || {
                    in_netns(&netns, move || {
                        let mut i = c;
                        while !stop.load(Ordering::Relaxed) {
                            let started = Instant::now();
                            let outcome = match client::send(nodes[i % nodes.len()], raw.as_bytes()) {
                                Ok(r) if r.status == 200 => "200".to_owned(),
                                Ok(r) => format!("{} {}", r.status, r.header("x-limiter-refused").unwrap_or("-")),
                                Err(e) => format!("error {e}"),
                            };
                            outcomes.lock().unwrap().push((outcome, started.elapsed(), started));
                            i += 1;
                        }
                    })
                })
            })
            .collect();
        Self { stop, outcomes, started: Instant::now(), threads }
    }

    /// The requests started since `since`.
    fn since(&self, since: Instant) -> Tally {
        let mut by = std::collections::BTreeMap::new();
        let mut slowest = Duration::ZERO;
        for (o, took, _) in self.outcomes.lock().unwrap().iter().filter(|(_, _, at)| *at >= since) {
            *by.entry(o.clone()).or_insert(0) += 1;
            slowest = slowest.max(*took);
        }
        (by, slowest)
    }

    /// Stops the clients: every request's outcome.
    fn stop(mut self) -> Tally {
        self.stop.store(true, Ordering::Relaxed);
        self.threads.drain(..).for_each(|t| t.join().expect("a client thread"));
        self.since(self.started - Duration::from_secs(1))
    }
}

#[test]
#[ignore = "black-box: the daemon binary, root, network namespaces and redis-server; run by `cargo xtask test`"]
fn redis_restarted_empty_and_redis_stopped_under_load_never_lift_the_limit_and_hang_nothing() {
    require_kernel!();
    let net = StoreNet::new().unwrap();
    let mut redis = net.redis(6379, &[]).unwrap();
    let up = Upstream::start();
    let lease = Duration::from_millis(1500);
    let fleet_keys = |policy: &str| {
        format!(
            "fleet.store = redis://{STORE_IP}:6379\nfleet.maxSessionConnections = 6\nfleet.leaseMs = {}\nfleet.timeoutMs = 150\nfleet.onStoreDown = {policy}",
            lease.as_millis()
        )
    };
    let nodes = store::fleet(&net, &up, 3, &fleet_keys("share")).unwrap();
    let addrs = addrs_of(&nodes);
    let (loaded, quiet) = ("Bearer under-load", "Bearer three-held");
    let quiet_key = session_key_for("default", HASH_KEY, quiet.as_bytes());
    let held: Vec<_> = (0..3).map(|i| spawn_get(&net, addrs[i], "/hold", &auth(quiet))).collect();
    up.wait_holding(3);
    let load = Load::start(&net, &addrs, 12, loaded);
    // The upstream's own count of the loaded session, from here on: never
    // above six, whatever the store does.
    thread::sleep(Duration::from_millis(800));
    up.reset_session_peaks();

    // Redis restarted empty: the nodes go on within their shares, and
    // republish them when it is back; no share grows before the budgets
    // are whole again (the store is younger than a lease).
    redis.kill();
    let restarted = Instant::now();
    redis.start().unwrap();
    wait_for("the held shares republished", lease * 2, || net.shares(6379, &quiet_key).unwrap_or(0) >= 3);
    let whole = restarted.elapsed();
    wait_for("the store seen up again", Duration::from_secs(3), || {
        nodes.iter().all(|n| n.daemon.metric("limiter_fleet_store_up") == 1.0)
    });
    thread::sleep(Duration::from_millis(800));

    // Redis frozen: every request is answered at once (within a share) or
    // within fleet.timeoutMs; the nodes say the store is down and stop
    // claiming; after their shares' leases, fleet_down.
    redis.pause();
    let paused = Instant::now();
    wait_for("the store seen down", Duration::from_secs(2), || {
        nodes.iter().all(|n| n.daemon.metric("limiter_fleet_store_up") == 0.0)
    });
    thread::sleep(lease);
    let (during, slowest) = load.since(paused);
    redis.resume();
    assert!(during.get("503 fleet_down").copied().unwrap_or(0) > 20, "{during:?}");
    assert!(
        slowest < Duration::from_millis(600),
        "a request waited {slowest:?} on a frozen store: {during:?}"
    );
    let log = nodes[0].daemon.log();
    assert_eq!(
        log.matches("fleet store down").count(),
        2,
        "said once per outage (a restart, a freeze):\n{log}"
    );
    wait_for("the store seen up again", Duration::from_secs(3), || {
        nodes.iter().all(|n| n.daemon.metric("limiter_fleet_store_up") == 1.0)
    });
    thread::sleep(Duration::from_millis(500));
    let peak = up.session_peak(loaded);
    assert!(peak <= 6, "the upstream had {peak} of the session at once (fleet limit 6)");

    // onStoreDown = refuse, live: a frozen store now means 503 fleet_down,
    // within a share or not.
    for n in &nodes {
        std::fs::write(
            &n.config,
            std::fs::read_to_string(&n.config)
                .unwrap()
                .replace("onStoreDown = share", "onStoreDown = refuse"),
        )
        .unwrap();
        assert!(n.daemon.reload().contains("reload"));
    }
    thread::sleep(Duration::from_millis(200));
    redis.pause();
    // A node learns the store is frozen from a claim or a renewal that
    // times out; until then it admits within its share (safely).
    wait_for("the store seen down", Duration::from_secs(2), || {
        nodes.iter().all(|n| n.daemon.metric("limiter_fleet_store_up") == 0.0)
    });
    let down = Instant::now();
    thread::sleep(Duration::from_millis(800));
    let (during, slowest) = load.since(down + Duration::from_millis(100));
    redis.resume();
    assert_eq!(during.get("200"), None, "{during:?}");
    assert!(during.get("503 fleet_down").copied().unwrap_or(0) > 20, "{during:?}");
    assert!(slowest < Duration::from_millis(600), "{slowest:?}");

    // Nothing lost, nothing hung: every request had an answer, and once
    // the load stops every share is given back, here and in the store.
    thread::sleep(Duration::from_millis(1000));
    let (all, slowest) = load.stop();
    for (outcome, n) in &all {
        assert!(
            outcome == "200" || outcome == "503 fleet_session" || outcome == "503 fleet_down",
            "{n} requests ended {outcome:?}: {all:?}"
        );
    }
    assert!(slowest < Duration::from_secs(2), "{slowest:?}");
    let peak = up.session_peak(loaded);
    assert!(peak <= 6, "the upstream had {peak} of the session at once (fleet limit 6)");
    up.release();
    assert!(statuses(held).iter().all(|r| r.status == 200));
    let loaded_key = session_key_for("default", HASH_KEY, loaded.as_bytes());
    wait_all_given_back(&net, 6379, &nodes, &[&quiet_key, &loaded_key]);
    eprintln!("under load: {all:?}; shares whole {whole:?} after Redis restarted empty; peak {peak} of 6");
}

#[test]
#[ignore = "black-box: the daemon binary, root, network namespaces and redis-server; run by `cargo xtask test`"]
fn fleet_limits_timeout_and_store_policy_change_live() {
    require_kernel!();
    let net = StoreNet::new().unwrap();
    let redis = net.redis(6379, &[]).unwrap();
    let up = Upstream::start();
    let keys = |session: u32, web: u32, timeout: u32, policy: &str| {
        format!(
            "fleet.store = redis://{STORE_IP}:6379\nfleet.maxSessionConnections = {session}\nfleet.maxWebConnections = {web}\nfleet.timeoutMs = {timeout}\nfleet.onStoreDown = {policy}"
        )
    };
    let node = store::node(&net, &up, &keys(1, 1, 400, "share")).unwrap();
    let reload = |text: String| {
        let config = std::fs::read_to_string(&node.config).unwrap();
        let start = config.find("fleet.store").unwrap();
        std::fs::write(&node.config, format!("{}{text}\n", &config[..start])).unwrap();
        let outcome = node.daemon.reload();
        assert!(!outcome.contains("refused") && !outcome.contains("failed"), "{outcome}");
    };
    let two_at_once = |headers: Vec<String>| -> Vec<u16> {
        let a = spawn_get(&net, node.addr, "/hold", &headers);
        up.wait_holding(1);
        let b = spawn_get(&net, node.addr, "/hold", &headers);
        let deadline = Instant::now() + Duration::from_secs(2);
        while !b.is_finished() && up.holding() < 2 && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5));
        }
        up.release();
        statuses(vec![a, b]).iter().map(|r| r.status).collect()
    };
    // The limits.
    assert_eq!(two_at_once(auth("Bearer s")), [200, 503]);
    assert_eq!(two_at_once(vec!["X-Client-Id: w".into()]), [200, 503]);
    reload(keys(2, 2, 400, "share"));
    assert_eq!(two_at_once(auth("Bearer s")), [200, 200]);
    assert_eq!(two_at_once(vec!["X-Client-Id: w".into()]), [200, 200]);
    // The timeout: a request that claims from a frozen store waits for it
    // fleet.timeoutMs at most, then is refused (the store is not down for
    // one late answer); a new session each time, so each one claims.
    let session = std::sync::atomic::AtomicU32::new(0);
    let claim_on_frozen = || -> (Reply, Duration) {
        let token = format!("Bearer fresh-{}", session.fetch_add(1, Ordering::Relaxed));
        let started = Instant::now();
        let r = get(&net, node.addr, "/x", &auth(&token));
        (r, started.elapsed())
    };
    let up_again = || {
        wait_for("the store up", Duration::from_secs(3), || {
            node.daemon.metric("limiter_fleet_store_up") == 1.0
        })
    };
    redis.pause();
    let (r, took) = claim_on_frozen();
    assert_refused(&r, "fleet_down");
    assert!(took >= Duration::from_millis(400) && took < Duration::from_millis(900), "{took:?}");
    reload(keys(2, 2, 20, "share"));
    let (r, took) = claim_on_frozen();
    assert_refused(&r, "fleet_down");
    assert!(took < Duration::from_millis(350), "{took:?}");
    // A third late claim in a row: the store is down.
    let _ = claim_on_frozen();
    wait_for("the store seen down", Duration::from_secs(2), || {
        node.daemon.metric("limiter_fleet_store_up") == 0.0
    });
    // The policy, with the store down: local admits on the node's limits,
    // refuse and share (a new session holds no share) refuse.
    reload(keys(2, 2, 20, "local"));
    assert_eq!(claim_on_frozen().0.status, 200);
    reload(keys(2, 2, 20, "refuse"));
    assert_refused(&claim_on_frozen().0, "fleet_down");
    redis.resume();
    up_again();
}

#[test]
#[ignore = "black-box: the daemon binary, root, network namespaces and redis-server; run by `cargo xtask test`"]
fn a_node_stopped_gives_its_permits_back_to_the_store_before_it_exits() {
    require_kernel!();
    let net = StoreNet::new().unwrap();
    let _redis = net.redis(6379, &[]).unwrap();
    let up = Upstream::start();
    let mut node = store::node(
        &net,
        &up,
        &format!("fleet.store = redis://{STORE_IP}:6379\nfleet.maxSessionConnections = 5\nfleet.leaseMs = 6000\n{PATIENT}"),
    )
    .unwrap();
    let token = "Bearer drained";
    let key = session_key_for("default", HASH_KEY, token.as_bytes());
    let held: Vec<_> = (0..3).map(|_| spawn_get(&net, node.addr, "/hold", &auth(token))).collect();
    up.wait_holding(3);
    assert!(net.shares(6379, &key).unwrap() >= 3);
    // SIGTERM: the drain lets the three finish, and the share goes back to
    // the store before the process exits (not 6 s later, with the lease).
    node.daemon.signal(nix::sys::signal::Signal::SIGTERM);
    thread::sleep(Duration::from_millis(100));
    up.release();
    assert!(statuses(held).iter().all(|r| r.status == 200));
    assert_eq!(node.daemon.wait(), Some(0));
    assert!(net.given_back(6379, &key).unwrap(), "{}", node.daemon.log());
}

#[test]
#[ignore = "black-box: the daemon binary, root, network namespaces and redis-server; run by `cargo xtask test`"]
fn an_http2_stream_reset_while_its_claim_waits_leaves_nothing_held() {
    use limiter_tests::h2raw;
    require_kernel!();
    let net = StoreNet::new().unwrap();
    let redis = net.redis(6379, &[]).unwrap();
    let up = Upstream::start();
    let node = store::node(
        &net,
        &up,
        &format!(
            "http.h2c = true\nfleet.store = redis://{STORE_IP}:6379\nfleet.maxWebConnections = 2\n{PATIENT}"
        ),
    )
    .unwrap();
    // The store frozen: the claim waits. The client resets its stream
    // meanwhile (hyper drops the request), then the store answers.
    redis.pause();
    let addr = node.addr;
    let client = thread::spawn({
        let netns = net.sb.netns_file();
        move || {
            in_netns(&netns, move || {
                use std::io::Write as _;
                let mut s = h2raw::connect(addr, &[]);
                let block = h2raw::get_block("/x", &[("x-client-id", "w")]);
                s.write_all(&h2raw::frame(h2raw::HEADERS, h2raw::END_HEADERS | h2raw::END_STREAM, 1, &block))
                    .unwrap();
                thread::sleep(Duration::from_millis(100));
                s.write_all(&h2raw::frame(h2raw::RST_STREAM, 0, 1, &8u32.to_be_bytes())).unwrap();
                thread::sleep(Duration::from_millis(100));
                s
            })
        }
    });
    let _s = client.join().unwrap();
    redis.resume();
    // The claim's late answer stands (a share), but nothing holds a unit of
    // it: the reset request never went upstream, and the share, unused,
    // goes back at the renewals (within two thirds of the lease).
    let resumed = Instant::now();
    wait_for("nothing held", Duration::from_secs(1), || {
        node.daemon.metric("limiter_fleet_permits{kind=\"web\"}") == 0.0
    });
    wait_for("the unused share given back", Duration::from_secs(3), || {
        net.shares(6379, WEB_KEY).unwrap_or(u64::MAX) == 0
    });
    eprintln!("the unused share given back {:?} after the store answered", resumed.elapsed());
    assert_eq!(up.hits(), 0, "the reset request never went upstream");
}

#[test]
#[ignore = "black-box: the daemon binary, root, network namespaces and redis-server; run by `cargo xtask test`"]
fn rediss_verifies_the_stores_certificate_and_holds_the_limit_over_tls() {
    require_kernel!();
    let net = StoreNet::new().unwrap();
    let (cert, key) = limiter_tests::tls::self_signed_for(&net.sb.dir, "redis", &format!("IP:{STORE_IP}"));
    let _redis = net.redis_tls(6380, &cert, &key).unwrap();
    let up = Upstream::start();
    let keys = format!(
        "fleet.store = rediss://{STORE_IP}:6380\nfleet.maxSessionConnections = 2\nfleet.onStoreDown = refuse\n{PATIENT}"
    );
    // A node that trusts the store's certificate (SSL_CERT_FILE, read by
    // rustls-native-certs) holds the session to two over TLS.
    let trusting =
        store::node_with_env(&net, &up, &keys, &[("SSL_CERT_FILE", cert.to_str().unwrap())]).unwrap();
    let held: Vec<_> = (0..3).map(|_| spawn_get(&net, trusting.addr, "/hold", &auth("Bearer tls"))).collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    while up.holding() != 2 {
        assert!(Instant::now() < deadline, "{} held:\n{}", up.holding(), trusting.daemon.log());
        thread::sleep(Duration::from_millis(5));
    }
    wait_for("the third refused", Duration::from_secs(5), || {
        held.iter().filter(|h| h.is_finished()).count() == 1
    });
    assert_eq!(trusting.daemon.metric("limiter_fleet_store_up"), 1.0);
    assert_store_never_failed(std::slice::from_ref(&trusting));
    up.release();
    let replies = statuses(held);
    assert_eq!(replies.iter().filter(|r| r.status == 200).count(), 2);
    replies.iter().filter(|r| r.status != 200).for_each(|r| assert_refused(r, "fleet_session"));
    // One that does not (the system's roots) refuses the store: down, and
    // with onStoreDown = refuse its requests get fleet_down.
    let doubting = store::node(&net, &up, &keys).unwrap();
    assert_eq!(doubting.daemon.metric("limiter_fleet_store_up"), 0.0, "{}", doubting.daemon.log());
    assert!(doubting.daemon.log().contains("fleet store down"), "{}", doubting.daemon.log());
    assert_refused(&get(&net, doubting.addr, "/x", &auth("Bearer tls")), "fleet_down");
}

// ---------------------------------------------------------------------------
// Faults: a busy node, a store far away, partitions, pauses, an empty
// restart, a failover, a fleet of two hash keys. The limit is read from
// the upstream's own count of the session's requests in progress.

/// Clients asking for `/sess?ms={ms}` of session `token` in a loop over
/// `nodes` (each on a new connection), with `gap` between their requests,
/// counting what they got.
struct Sessions {
    stop: Arc<AtomicBool>,
    outcomes: Arc<Mutex<std::collections::BTreeMap<String, u64>>>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Sessions {
    fn start(
        net: &StoreNet,
        nodes: &[SocketAddr],
        clients: usize,
        token: &str,
        ms: u64,
        gap: Duration,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let outcomes = Arc::new(Mutex::new(std::collections::BTreeMap::new()));
        let threads = (0..clients)
            .map(|c| {
                let (stop, outcomes, nodes, netns) =
                    (stop.clone(), outcomes.clone(), nodes.to_vec(), net.sb.netns_file());
                let raw = format!(
                    "GET /sess?ms={ms} HTTP/1.1\r\nHost: f\r\nAuthorization: {token}\r\nConnection: close\r\n\r\n"
                );
                thread::spawn(move || {
                    in_netns(&netns, move || {
                        let mut i = c;
                        while !stop.load(Ordering::Relaxed) {
                            let outcome = match client::send(nodes[i % nodes.len()], raw.as_bytes()) {
                                Ok(r) if r.status == 200 => "200".to_owned(),
                                Ok(r) => format!("{} {}", r.status, r.header("x-limiter-refused").unwrap_or("-")),
                                Err(e) => format!("error {e}"),
                            };
                            *outcomes.lock().unwrap().entry(outcome).or_insert(0) += 1;
                            i += 1;
                            thread::sleep(gap);
                        }
                    })
                })
            })
            .collect();
        Self { stop, outcomes, threads }
    }

    fn stop(mut self) -> std::collections::BTreeMap<String, u64> {
        self.stop.store(true, Ordering::Relaxed);
        self.threads.drain(..).for_each(|t| t.join().expect("a client thread"));
        self.outcomes.lock().unwrap().clone()
    }
}

/// Stops `tries` and holds the upstream's own count of session `token`'s
/// requests in progress to `limit` (`what`: when); the peak, and what the
/// clients got.
fn held_to(
    up: &Upstream,
    token: &str,
    limit: u64,
    tries: Sessions,
    what: &str,
) -> (u64, std::collections::BTreeMap<String, u64>) {
    let outcomes = tries.stop();
    let peak = up.session_peak(token);
    assert!(peak <= limit, "{peak} of {limit} in progress {what}: {outcomes:?}");
    (peak, outcomes)
}

/// The nodes' HTTP addresses.
fn addrs_of(nodes: &[Node]) -> Vec<SocketAddr> {
    nodes.iter().map(|n| n.addr).collect()
}

/// Runs `iptables ARGS` in `node`'s namespace.
fn iptables(node: &Node, args: &[&str]) {
    let out = limiter_tests::process::run_with_deadline(
        std::process::Command::new("ip").args(["netns", "exec", &node.sb.name, "iptables"]).args(args),
        Duration::from_secs(10),
    );
    assert!(out.status.success(), "iptables {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Cuts (`-A`) or mends (`-D`) the link between `node` and the store's
/// Redis on `port`, both ways; clients still reach the node.
fn partition(node: &Node, action: &str, port: u16) {
    let port = port.to_string();
    iptables(node, &[action, "OUTPUT", "-p", "tcp", "-d", STORE_IP, "--dport", &port, "-j", "DROP"]);
    iptables(node, &[action, "INPUT", "-p", "tcp", "-s", STORE_IP, "--sport", &port, "-j", "DROP"]);
}

#[test]
#[ignore = "black-box: the daemon binary, root, network namespaces and redis-server; run by `cargo xtask test`"]
fn a_busy_node_renews_its_shares_while_the_store_is_10_ms_away() {
    require_kernel!();
    let net = StoreNet::new().unwrap();
    let _redis = net.redis(6379, &[]).unwrap();
    // The store 10 ms away: every chunk 5 ms late each way.
    let relay = limiter_tests::relay::Relay::start(
        &net.sb.netns_file(),
        format!("{STORE_IP}:7379").parse().unwrap(),
        format!("{STORE_IP}:6379").parse().unwrap(),
        Duration::from_millis(5),
    );
    let up = Upstream::start();
    let nodes = store::fleet(
        &net,
        &up,
        2,
        // A debug build on two shared CPUs: claims 10 ms away get 100 ms.
        &format!(
            "fleet.store = redis://{}\nfleet.maxSessionConnections = 4\nfleet.leaseMs = 1500\nfleet.timeoutMs = 100",
            relay.addr
        ),
    )
    .unwrap();
    let (a, b) = (nodes[0].addr, nodes[1].addr);
    let long = "Bearer long-requests";
    // A holds four 6 s requests of one session...
    let held: Vec<_> = (0..4).map(|_| spawn_get(&net, a, "/sess?ms=6000", &auth(long))).collect();
    wait_for("four held", Duration::from_secs(5), || up.session_now(long) == 4);
    // ...while thousands of short requests of other sessions pass through
    // it (each session below its limit), and B asks for the long session
    // again and again.
    let busy: Vec<Sessions> = (0..8)
        .map(|i| Sessions::start(&net, &[a], 2, &format!("Bearer busy-{i}"), 0, Duration::ZERO))
        .collect();
    let tries = Sessions::start(&net, &[b], 2, long, 100, Duration::from_millis(50));
    thread::sleep(Duration::from_secs(5));
    let tried = tries.stop();
    let busy: Vec<_> = busy.into_iter().map(Sessions::stop).collect();
    assert!(statuses(held).iter().all(|r| r.status == 200));
    // The limit held by the upstream's count: A's leases never lapsed
    // however busy it was.
    let peak = up.session_peak(long);
    assert_eq!(peak, 4, "the upstream had {peak} of the session at once (fleet limit 4); B got {tried:?}");
    assert_eq!(nodes[0].daemon.metric("limiter_fleet_lease_lapsed_total"), 0.0);
    let margin = nodes[0].daemon.metric("limiter_fleet_lease_margin_seconds");
    assert!(margin > 0.5, "the busy node renewed with {margin} s of its lease left");
    assert!(!nodes[0].daemon.log().contains("went out late"), "a renewal round was late");
    // Below their limits, the busy sessions were refused less than 1 % of
    // the time, 10 ms from the store.
    let (mut ok, mut refused) = (0, 0);
    for outcomes in &busy {
        for (o, n) in outcomes {
            if o == "200" { ok += n } else { refused += n }
        }
    }
    assert!(ok > 1000, "{busy:?}");
    assert!(refused * 100 < ok, "{refused} refused of {} below the limit: {busy:?}", ok + refused);
    let claims = nodes[0].daemon.metric("limiter_fleet_claims_total");
    eprintln!(
        "busy node, store 10 ms away: {ok} short requests, {refused} refused, {claims} claims ({:.3} per request); renewal margin {margin:.3} s; B: {tried:?}",
        claims / (ok + refused) as f64
    );
}

#[test]
#[ignore = "black-box: the daemon binary, root, network namespaces, redis-server and iptables; run by `cargo xtask test`"]
fn a_node_cut_from_the_store_keeps_within_its_share_and_requests_shorter_than_a_third_of_the_lease_keep_the_limit()
 {
    require_kernel!();
    let net = StoreNet::new().unwrap();
    let _redis = net.redis(6379, &[]).unwrap();
    let up = Upstream::start();
    // Requests of 1.2 s, leases of 4 s: shorter than a third of the lease,
    // every request a share admits ends within its trust, so a node cut off
    // never leaves work running past what the store counts.
    let nodes = store::fleet(
        &net,
        &up,
        3,
        &format!(
            "fleet.store = redis://{STORE_IP}:6379\nfleet.maxSessionConnections = 6\nfleet.leaseMs = 4000\n{PATIENT}"
        ),
    )
    .unwrap();
    let addrs = addrs_of(&nodes);
    let token = "Bearer partitioned";
    // C holds four.
    let held: Vec<_> = (0..4).map(|_| spawn_get(&net, addrs[2], "/sess?ms=1200", &auth(token))).collect();
    wait_for("four held on C", Duration::from_secs(5), || up.session_now(token) == 4);
    // C is cut from the store; clients keep asking every node.
    partition(&nodes[2], "-A", 6379);
    let cut = Instant::now();
    let tries = Sessions::start(&net, &addrs, 6, token, 1200, Duration::from_millis(20));
    thread::sleep(Duration::from_secs(7));
    let (peak, outcomes) = held_to(&up, token, 6, tries, "with C cut off");
    partition(&nodes[2], "-D", 6379);
    assert!(outcomes.get("200").copied().unwrap_or(0) >= 2, "A and B use what C does not hold: {outcomes:?}");
    // C said the store was down, admitted nothing past its share's lease.
    assert_eq!(nodes[2].daemon.metric("limiter_fleet_store_up"), 0.0);
    assert!(nodes[2].daemon.metric("limiter_http_refused_total{reason=\"fleet_down\"}") > 0.0);
    assert!(statuses(held).iter().all(|r| r.status == 200));
    wait_for("C up again", Duration::from_secs(5), || {
        nodes[2].daemon.metric("limiter_fleet_store_up") == 1.0
    });
    eprintln!("partition of {:?}: peak {peak} of 6; {outcomes:?}", cut.elapsed());
}

#[test]
#[ignore = "black-box: the daemon binary, root, network namespaces, redis-server and iptables; run by `cargo xtask test`"]
fn past_its_lease_a_cut_off_nodes_requests_are_the_only_overshoot_and_are_counted_when_it_returns() {
    require_kernel!();
    let net = StoreNet::new().unwrap();
    let _redis = net.redis(6379, &[]).unwrap();
    let up = Upstream::start();
    // Requests of 6 s, leases of 1.5 s: what docs/fleet.md's guarantee table
    // says then, measured.
    let nodes = store::fleet(
        &net,
        &up,
        3,
        &format!(
            "fleet.store = redis://{STORE_IP}:6379\nfleet.maxSessionConnections = 6\nfleet.leaseMs = 1500\n{PATIENT}"
        ),
    )
    .unwrap();
    let addrs = addrs_of(&nodes);
    let token = "Bearer outlived";
    let held: Vec<_> = (0..4).map(|_| spawn_get(&net, addrs[2], "/sess?ms=6000", &auth(token))).collect();
    wait_for("four held on C", Duration::from_secs(5), || up.session_now(token) == 4);
    up.reset_session_peaks();
    partition(&nodes[2], "-A", 6379);
    let tries = Sessions::start(&net, &addrs[..2], 6, token, 500, Duration::from_millis(20));
    thread::sleep(Duration::from_secs(4));
    partition(&nodes[2], "-D", 6379);
    thread::sleep(Duration::from_secs(2));
    let outcomes = tries.stop();
    let peak = up.session_peak(token);
    // Above the limit by at most what C had in flight when its share
    // lapsed in the store, and only while those requests ran.
    assert!(peak <= 6 + 4, "peak {peak}: {outcomes:?}");
    assert!(statuses(held).iter().all(|r| r.status == 200));
    let deadline = Instant::now() + Duration::from_secs(5);
    while nodes[2].daemon.metric("limiter_fleet_lease_lapsed_total") < 1.0 {
        assert!(
            Instant::now() < deadline,
            "C never counted its lapsed share: {}",
            nodes[2].daemon.log().lines().filter(|l| l.contains("fleet")).collect::<Vec<_>>().join("\n")
        );
        thread::sleep(Duration::from_millis(20));
    }
    eprintln!("lease 1.5 s, requests 6 s, C cut off 4 s: peak {peak} of 6; {outcomes:?}");
}

#[test]
#[ignore = "black-box: the daemon binary, root, network namespaces and redis-server; run by `cargo xtask test`"]
fn a_paused_node_re_takes_what_it_still_holds_and_counts_the_lapse() {
    require_kernel!();
    let net = StoreNet::new().unwrap();
    let _redis = net.redis(6379, &[]).unwrap();
    let up = Upstream::start();
    let nodes = store::fleet(
        &net,
        &up,
        3,
        &format!(
            "fleet.store = redis://{STORE_IP}:6379\nfleet.maxSessionConnections = 6\nfleet.leaseMs = 1500\n{PATIENT}"
        ),
    )
    .unwrap();
    let addrs = addrs_of(&nodes);
    let token = "Bearer paused";
    let held = spawn_get(&net, addrs[2], "/sess?ms=8000", &auth(token));
    wait_for("one held on C", Duration::from_secs(5), || up.session_now(token) == 1);
    up.reset_session_peaks();
    let tries = Sessions::start(&net, &addrs[..2], 8, token, 2000, Duration::from_millis(20));
    nodes[2].daemon.signal(nix::sys::signal::Signal::SIGSTOP);
    thread::sleep(Duration::from_secs(5));
    nodes[2].daemon.signal(nix::sys::signal::Signal::SIGCONT);
    thread::sleep(Duration::from_secs(3));
    let outcomes = tries.stop();
    let peak = up.session_peak(token);
    assert!(peak <= 6 + 1, "peak {peak}: {outcomes:?}");
    assert_eq!(held.join().unwrap().unwrap().status, 200);
    assert!(nodes[2].daemon.metric("limiter_fleet_lease_lapsed_total") >= 1.0, "{}", nodes[2].daemon.log());
    eprintln!("a node paused 5 s holding one (lease 1.5 s): peak {peak} of 6; {outcomes:?}");
}

#[test]
#[ignore = "black-box: the daemon binary, root, network namespaces and redis-server; run by `cargo xtask test`"]
fn redis_restarted_empty_while_shares_are_held_never_lifts_the_limit() {
    require_kernel!();
    let net = StoreNet::new().unwrap();
    let mut redis = net.redis(6379, &[]).unwrap();
    let up = Upstream::start();
    let nodes = store::fleet(
        &net,
        &up,
        3,
        &format!(
            "fleet.store = redis://{STORE_IP}:6379\nfleet.maxSessionConnections = 6\nfleet.leaseMs = 1500\n{PATIENT}"
        ),
    )
    .unwrap();
    let addrs = addrs_of(&nodes);
    let token = "Bearer restarted";
    let held = hold_each(&net, &up, &addrs, "/sess?ms=6000", token, 6);
    let tries = Sessions::start(&net, &addrs, 6, token, 500, Duration::from_millis(20));
    redis.kill();
    redis.start().unwrap();
    thread::sleep(Duration::from_secs(4));
    let (peak, outcomes) = held_to(&up, token, 6, tries, "with Redis restarted empty");
    assert_eq!(peak, 6, "the six held were not all in progress: {outcomes:?}");
    assert!(statuses(held).iter().all(|r| r.status == 200));
    eprintln!("Redis restarted empty under six held: peak {peak}; {outcomes:?}");
}

#[test]
#[ignore = "black-box: the daemon binary, root, network namespaces and redis-server; run by `cargo xtask test`"]
fn a_cluster_masters_failover_never_lifts_the_limit() {
    require_kernel!();
    let net = StoreNet::new().unwrap();
    let ports = [7101, 7102, 7103, 7104, 7105, 7106];
    let mut cluster = net.cluster_of(&ports, 1).unwrap();
    let up = Upstream::start();
    let nodes = store::fleet(
        &net,
        &up,
        3,
        &format!(
            "fleet.store = redis+cluster://{STORE_IP}:7101,{STORE_IP}:7102,{STORE_IP}:7103\nfleet.maxSessionConnections = 6\nfleet.leaseMs = 3000\nfleet.name = failover\n{PATIENT}"
        ),
    )
    .unwrap();
    let addrs = addrs_of(&nodes);
    let token = "Bearer failover";
    let key = session_key_for("failover", HASH_KEY, token.as_bytes());
    let tries = Sessions::start(&net, &addrs, 9, token, 300, Duration::from_millis(10));
    thread::sleep(Duration::from_secs(2));
    let master = net.master_of(7101, &key).unwrap();
    let i = ports.iter().position(|&p| p == master).unwrap();
    cluster[i].kill();
    let killed = Instant::now();
    wait_for("a replica promoted", Duration::from_secs(20), || {
        net.master_of(ports[(i + 1) % 3], &key).is_ok_and(|m| m != master)
    });
    let promoted = killed.elapsed();
    thread::sleep(Duration::from_secs(4));
    let (peak, outcomes) = held_to(&up, token, 6, tries, "through a cluster master's failover");
    assert!(outcomes.get("200").copied().unwrap_or(0) > 20, "{outcomes:?}");
    eprintln!("cluster master killed, replica promoted after {promoted:?}: peak {peak} of 6; {outcomes:?}");
}

#[test]
#[ignore = "black-box: the daemon binary, root, network namespaces and redis-server; run by `cargo xtask test`"]
fn a_node_whose_hash_key_is_not_the_fleets_refuses_to_start() {
    require_kernel!();
    let net = StoreNet::new().unwrap();
    let _redis = net.redis(6379, &[]).unwrap();
    let up = Upstream::start();
    let keys = format!("fleet.store = redis://{STORE_IP}:6379\nfleet.maxSessionConnections = 6");
    let _first = store::node(&net, &up, &keys).unwrap();
    let err = match store::node_with_key(&net, &up, &keys, "another-fleets-hash-key-0123456789") {
        Ok(mut node) => (node.daemon.wait(), node.daemon.log()),
        Err(e) => (None, format!("{e:#}")),
    };
    assert!(err.1.contains("fleet.hashKeyFile") && err.1.contains("not the fleet's"), "{err:?}");
}

#[test]
#[ignore = "black-box: the daemon binary, root, network namespaces and redis-server; run by `cargo xtask test`"]
fn fifty_thousand_sessions_leave_no_key_behind() {
    require_kernel!();
    let net = StoreNet::new().unwrap();
    let _redis = net.redis(6379, &[]).unwrap();
    let up = Upstream::start();
    let node = store::node(
        &net,
        &up,
        &format!("fleet.store = redis://{STORE_IP}:6379\nfleet.maxSessionConnections = 2\nfleet.leaseMs = 1500\n{PATIENT}"),
    )
    .unwrap();
    let addr = node.addr;
    let sent = in_netns(&net.sb.netns_file(), move || {
        let threads: Vec<_> = (0..8)
            .map(|t| {
                thread::spawn(move || {
                    let mut s = client::connect(addr);
                    let mut ok = 0;
                    for i in 0..6250 {
                        use std::io::Write as _;
                        let raw =
                            format!("GET /x HTTP/1.1\r\nHost: f\r\nAuthorization: Bearer s-{t}-{i}\r\n\r\n");
                        s.write_all(raw.as_bytes()).unwrap();
                        let r = client::read_reply(&mut s).unwrap();
                        if r.status == 200 {
                            ok += 1;
                        } else {
                            s = client::connect(addr);
                        }
                    }
                    ok
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).sum::<u64>()
    });
    let peak_keys = net.session_budgets(6379).unwrap();
    wait_for("every session's key gone", Duration::from_secs(10), || {
        net.session_budgets(6379).unwrap_or(1) == 0
    });
    // Then the budgets given back expire (two leases, kept empty): left,
    // the fingerprint, the live nodes, the 17 groups' epochs.
    wait_for("every budget's key gone", Duration::from_secs(20), || {
        net.keys(6379).unwrap_or(usize::MAX) <= 2 + 1 + 17
    });
    let memory = net.cli(6379, &["info", "memory"]).unwrap();
    let peak_memory = memory
        .lines()
        .find_map(|l| l.strip_prefix("used_memory_peak_human:"))
        .unwrap_or("?")
        .trim()
        .to_owned();
    assert!(sent > 49_000, "{sent} of 50,000 admitted");
    eprintln!(
        "50,000 sessions: {sent} admitted, {peak_keys} keys right after, 0 left; Redis peak memory {peak_memory}"
    );
}

#[test]
#[ignore = "black-box: the daemon binary, root, network namespaces and redis-server; run by `cargo xtask test`"]
fn when_a_sessions_traffic_moves_to_another_node_it_gets_the_whole_limit_within_the_lease() {
    require_kernel!();
    let net = StoreNet::new().unwrap();
    let _redis = net.redis(6379, &[]).unwrap();
    let up = Upstream::start();
    let lease = Duration::from_millis(3000);
    let nodes = store::fleet(
        &net,
        &up,
        2,
        &format!("fleet.store = redis://{STORE_IP}:6379\nfleet.maxSessionConnections = 6\n{PATIENT}"),
    )
    .unwrap();
    let token = "Bearer moving";
    // Sticky on A: six at a time, 200 ms each.
    let on_a = Sessions::start(&net, &[nodes[0].addr], 6, token, 200, Duration::ZERO);
    thread::sleep(Duration::from_secs(2));
    let a = on_a.stop();
    // Moved to B: how long until B has all six at once.
    let moved = Instant::now();
    up.reset_session_peaks();
    let on_b = Sessions::start(&net, &[nodes[1].addr], 6, token, 200, Duration::ZERO);
    let mut whole = None;
    while moved.elapsed() < lease * 2 {
        if up.session_now(token) == 6 {
            whole = Some(moved.elapsed());
            break;
        }
        thread::sleep(Duration::from_millis(5));
    }
    let b = on_b.stop();
    let whole = whole.unwrap_or_else(|| panic!("B never had all six: A {a:?}, B {b:?}"));
    assert!(whole <= lease, "B had the whole limit after {whole:?}");
    assert!(up.session_peak(token) <= 6);
    eprintln!("traffic moved from A to B: B had all six after {whole:?} (lease {lease:?}); A {a:?}, B {b:?}");
}

// ---------------------------------------------------------------------------
// The seven ways past the limit the fleet's simulation found (docs/fleet.md,
// "How the limit is checked"), each on real processes and a real Redis,
// judged by the upstream's own count; each fails on the fleet before them.

/// What a [`Moving`] load saw.
#[derive(Clone, Debug, Default)]
struct MoveTally {
    ok: u64,
    /// Refused by the fleet's limit (`fleet_session`).
    refused: u64,
    /// Of them, refused while the upstream had fewer than the limit of the
    /// session in progress (read as the refusal arrived).
    refused_with_room: u64,
    /// Anything else, by kind.
    other: std::collections::BTreeMap<String, u64>,
}

impl MoveTally {
    fn total(&self) -> u64 {
        self.ok + self.refused + self.other.values().sum::<u64>()
    }

    /// Refused with room, of every request.
    fn false_refusals(&self) -> f64 {
        self.refused_with_room as f64 / self.total().max(1) as f64
    }
}

/// Clients of one session sending `/sess` requests of random lengths
/// (`ms`) one after another, all to one node that changes every `period`
/// or, without one, each to a node drawn at random: load that moves
/// between nodes.
struct Moving {
    stop: Arc<AtomicBool>,
    tally: Arc<Mutex<MoveTally>>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Moving {
    #[expect(clippy::too_many_arguments, reason = "the load's shape, all of it")]
    fn start(
        net: &StoreNet,
        up: &Upstream,
        nodes: &[SocketAddr],
        clients: usize,
        token: &str,
        limit: u64,
        ms: (u64, u64),
        period: Option<Duration>,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let tally = Arc::new(Mutex::new(MoveTally::default()));
        let started = Instant::now();
        let threads = (0..clients)
            .map(|c| {
                let (stop, tally, nodes, netns, count, token) = (
                    stop.clone(),
                    tally.clone(),
                    nodes.to_vec(),
                    net.sb.netns_file(),
                    up.session_count(),
                    token.to_owned(),
                );
                thread::spawn(move || {
                    in_netns(&netns, move || {
                        let mut x = 0x9e37_79b9_u64.wrapping_mul(c as u64 + 1);
                        let mut next = move |m: u64| {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            x % m.max(1)
                        };
                        while !stop.load(Ordering::Relaxed) {
                            let node = match period {
                                Some(p) => {
                                    (started.elapsed().as_millis() / p.as_millis()) as usize % nodes.len()
                                }
                                None => next(nodes.len() as u64) as usize,
                            };
                            let d = ms.0 + next(ms.1 - ms.0 + 1);
                            let raw = format!(
                                "GET /sess?ms={d} HTTP/1.1\r\nHost: f\r\nAuthorization: {token}\r\nConnection: close\r\n\r\n"
                            );
                            let reply = client::send(nodes[node], raw.as_bytes());
                            let room = count.now(&token) < limit;
                            let mut t = tally.lock().unwrap();
                            match reply {
                                Ok(r) if r.status == 200 => t.ok += 1,
                                Ok(r) if r.header("x-limiter-refused") == Some("fleet_session") => {
                                    t.refused += 1;
                                    t.refused_with_room += u64::from(room);
                                    drop(t);
                                    // A client refused tries again a little
                                    // later, not in a loop.
                                    thread::sleep(Duration::from_millis(20));
                                    continue;
                                }
                                Ok(r) => {
                                    let k = format!("{} {}", r.status, r.header("x-limiter-refused").unwrap_or("-"));
                                    *t.other.entry(k).or_insert(0) += 1;
                                }
                                Err(e) => *t.other.entry(format!("error {e}")).or_insert(0) += 1,
                            }
                        }
                    })
                })
            })
            .collect();
        Self { stop, tally, threads }
    }

    fn stop(mut self) -> MoveTally {
        self.stop.store(true, Ordering::Relaxed);
        self.threads.drain(..).for_each(|t| t.join().expect("a client thread"));
        self.tally.lock().unwrap().clone()
    }
}

/// Load moving between two nodes (all of it, every 2 s, and each request
/// at random), a session limited to 6, lease 1.5 s, with the store
/// `delay` away each way: never past the limit by the upstream's count,
/// and at most a tenth of the requests refused while it had room.
fn moving_load(delay: Option<Duration>) -> Vec<(String, u64, MoveTally)> {
    let net = StoreNet::new().unwrap();
    let _redis = net.redis(6379, &[]).unwrap();
    let relay = delay.map(|d| {
        limiter_tests::relay::Relay::start(
            &net.sb.netns_file(),
            format!("{STORE_IP}:7379").parse().unwrap(),
            format!("{STORE_IP}:6379").parse().unwrap(),
            d,
        )
    });
    let store = relay.as_ref().map_or_else(|| format!("{STORE_IP}:6379"), |r| r.addr.to_string());
    let up = Upstream::start();
    let nodes = store::fleet(
        &net,
        &up,
        2,
        &format!(
            "fleet.store = redis://{store}\nfleet.maxSessionConnections = 6\nfleet.leaseMs = 1500\nfleet.timeoutMs = 100"
        ),
    )
    .unwrap();
    let addrs = addrs_of(&nodes);
    let mut seen = Vec::new();
    for (name, period) in [("every 2 s", Some(Duration::from_secs(2))), ("each request", None)] {
        let token = format!("Bearer moving-{}", name.len());
        up.reset_session_peaks();
        let load = Moving::start(&net, &up, &addrs, 6, &token, 6, (20, 300), period);
        thread::sleep(Duration::from_secs(10));
        let tally = load.stop();
        let peak = up.session_peak(&token);
        let away = delay.map_or("local".to_owned(), |d| format!("{} ms away", 2 * d.as_millis()));
        eprintln!(
            "store {away}, load moving {name}: peak {peak} of 6; {} requests, {} admitted, {} refused ({} with room: {:.1} %), other {:?}",
            tally.total(),
            tally.ok,
            tally.refused,
            tally.refused_with_room,
            tally.false_refusals() * 100.0,
            tally.other
        );
        seen.push((name.to_owned(), peak, tally));
    }
    assert_store_never_failed(&nodes);
    seen
}

#[test]
#[ignore = "black-box: the daemon binary, root, network namespaces and redis-server; run by `cargo xtask test`"]
fn load_moving_between_nodes_never_passes_the_limit_and_is_rarely_refused_with_room() {
    require_kernel!();
    for delay in [None, Some(Duration::from_millis(5))] {
        for (name, peak, tally) in moving_load(delay) {
            assert!(
                peak <= 6,
                "store {delay:?} away, load moving {name}: {peak} of 6 in progress: {tally:?}"
            );
            assert!(tally.ok > 100, "{name}: {tally:?}");
            assert!(
                tally.false_refusals() <= 0.10,
                "store {delay:?} away, load moving {name}: {:.1} % refused with room: {tally:?}",
                tally.false_refusals() * 100.0
            );
        }
    }
}

#[test]
#[ignore = "black-box: the daemon binary, root, network namespaces, redis-server and iptables; run by `cargo xtask test`"]
fn an_excess_left_by_a_cut_off_node_drains_instead_of_being_refilled() {
    require_kernel!();
    let net = StoreNet::new().unwrap();
    let _redis = net.redis(6379, &[]).unwrap();
    let up = Upstream::start();
    let lease = Duration::from_millis(1500);
    let nodes = store::fleet(
        &net,
        &up,
        3,
        &format!(
            "fleet.store = redis://{STORE_IP}:6379\nfleet.maxSessionConnections = 6\nfleet.leaseMs = 1500\n{PATIENT}"
        ),
    )
    .unwrap();
    let addrs = addrs_of(&nodes);
    let token = "Bearer excess";
    // C holds four requests of 9 s, then is cut off for 3 s: past its
    // lease, A and B fill the six with short requests.
    let held: Vec<_> = (0..4).map(|_| spawn_get(&net, addrs[2], "/sess?ms=9000", &auth(token))).collect();
    wait_for("four held on C", Duration::from_secs(5), || up.session_now(token) == 4);
    partition(&nodes[2], "-A", 6379);
    let load = Sessions::start(&net, &addrs[..2], 8, token, 100, Duration::ZERO);
    thread::sleep(Duration::from_secs(3));
    // C comes back: its four are counted again; A and B must drain to what
    // is left (2), not refill their six as requests end.
    partition(&nodes[2], "-D", 6379);
    thread::sleep(lease + lease / 3);
    up.reset_session_peaks();
    thread::sleep(Duration::from_secs(2));
    let peak = up.session_peak(token);
    let outcomes = load.stop();
    assert!(statuses(held).iter().all(|r| r.status == 200));
    assert!(peak <= 6, "a lease after C came back, {peak} in progress (C's four among them): {outcomes:?}");
    eprintln!("after C's return: peak {peak} of 6 (C's four long ones among them); {outcomes:?}");
}

#[test]
#[ignore = "black-box: the daemon binary, root, network namespaces and redis-server; run by `cargo xtask test`"]
fn a_flushall_while_shares_are_held_never_lifts_the_limit() {
    require_kernel!();
    let net = StoreNet::new().unwrap();
    let _redis = net.redis(6379, &[]).unwrap();
    let up = Upstream::start();
    let nodes = store::fleet(
        &net,
        &up,
        3,
        &format!(
            "fleet.store = redis://{STORE_IP}:6379\nfleet.maxSessionConnections = 6\nfleet.leaseMs = 1500\n{PATIENT}"
        ),
    )
    .unwrap();
    let addrs = addrs_of(&nodes);
    let token = "Bearer flushed";
    let held = hold_each(&net, &up, &addrs, "/sess?ms=5000", token, 6);
    up.reset_session_peaks();
    let tries = Sessions::start(&net, &addrs, 6, token, 300, Duration::from_millis(10));
    thread::sleep(Duration::from_millis(300));
    net.cli(6379, &["flushall"]).unwrap();
    thread::sleep(Duration::from_secs(3));
    let (peak, outcomes) = held_to(&up, token, 6, tries, "after FLUSHALL");
    assert!(statuses(held).iter().all(|r| r.status == 200));
    assert!(nodes.iter().any(|n| n.daemon.metric("limiter_fleet_store_lost_data_total") >= 1.0));
    eprintln!("FLUSHALL under six held: peak {peak}; {outcomes:?}");
}

#[test]
#[ignore = "black-box: the daemon binary, root, network namespaces, redis-server and iptables; run by `cargo xtask test`"]
fn a_cluster_failover_to_a_replica_that_missed_writes_never_lifts_the_limit() {
    require_kernel!();
    let net = StoreNet::new().unwrap();
    let ports = [7201, 7202, 7203, 7204, 7205, 7206];
    let mut cluster = net.cluster_of(&ports, 1).unwrap();
    let up = Upstream::start();
    let nodes = store::fleet(
        &net,
        &up,
        3,
        &format!(
            "fleet.store = redis+cluster://{STORE_IP}:7201,{STORE_IP}:7202,{STORE_IP}:7203\nfleet.maxSessionConnections = 6\nfleet.leaseMs = 1500\nfleet.name = lagging\n{PATIENT}"
        ),
    )
    .unwrap();
    let addrs = addrs_of(&nodes);
    let token = "Bearer lagging";
    let key = session_key_for("lagging", HASH_KEY, token.as_bytes());
    let master = net.master_of(7201, &key).unwrap();
    let i = ports.iter().position(|&p| p == master).unwrap();
    let replica_port = |m: u16| -> u16 {
        let nodes = net.cli(m, &["cluster", "nodes"]).unwrap();
        let myself =
            nodes.lines().find(|l| l.contains("myself")).unwrap().split(' ').next().unwrap().to_owned();
        nodes
            .lines()
            .find(|l| l.contains("slave") && l.contains(&myself))
            .and_then(|l| l.split(' ').nth(1)?.split(['@', ':']).nth(1)?.parse().ok())
            .expect("the master's replica")
    };
    let replica = replica_port(master);
    // Replication to the replica cut: it misses every write from here.
    let cut = net.cut_replication(master).unwrap();
    let held = hold_each(&net, &up, &addrs, "/sess?ms=8000", token, 6);
    up.reset_session_peaks();
    let tries = Sessions::start(&net, &addrs, 9, token, 300, Duration::from_millis(10));
    thread::sleep(Duration::from_millis(500));
    cluster[i].kill();
    wait_for("the lagging replica promoted", Duration::from_secs(20), || {
        net.master_of(ports[(i + 1) % 3], &key).is_ok_and(|m| m == replica)
    });
    thread::sleep(Duration::from_secs(4));
    let (peak, outcomes) = held_to(&up, token, 6, tries, "after a failover to a replica that missed writes");
    net.mend(&cut).ok();
    assert!(statuses(held).iter().all(|r| r.status == 200));
    eprintln!("cluster failover to a lagging replica: peak {peak} of 6; {outcomes:?}");
}

#[test]
#[ignore = "black-box: the daemon binary, root, network namespaces, redis-server and gcc; run by `cargo xtask test`"]
fn the_stores_clock_stepping_either_way_lifts_nothing() {
    require_kernel!();
    let net = StoreNet::new().unwrap();
    let (_redis, clock) = net.redis_with_clock(6379).unwrap();
    let up = Upstream::start();
    let nodes = store::fleet(
        &net,
        &up,
        3,
        &format!(
            "fleet.store = redis://{STORE_IP}:6379\nfleet.maxSessionConnections = 6\nfleet.leaseMs = 1500\n{PATIENT}"
        ),
    )
    .unwrap();
    let addrs = addrs_of(&nodes);
    let token = "Bearer clock";
    let held = hold_each(&net, &up, &addrs, "/sess?ms=7000", token, 6);
    up.reset_session_peaks();
    let tries = Sessions::start(&net, &addrs, 6, token, 300, Duration::from_millis(10));
    // A failover to a host whose clock is ahead, an NTP step: +10 s, then
    // back.
    thread::sleep(Duration::from_millis(300));
    clock.step(10);
    thread::sleep(Duration::from_secs(3));
    clock.step(-20);
    thread::sleep(Duration::from_secs(2));
    let (peak, outcomes) = held_to(&up, token, 6, tries, "with the store's clock stepped");
    clock.step(0);
    assert!(statuses(held).iter().all(|r| r.status == 200));
    eprintln!("the store's clock +10 s then -20 s under six held: peak {peak}; {outcomes:?}");
}

#[test]
#[ignore = "black-box: the daemon binary, root, network namespaces and redis-server; run by `cargo xtask test`"]
fn two_daemons_configured_alike_on_one_host_never_pass_the_limit() {
    require_kernel!();
    let net = StoreNet::new().unwrap();
    let _redis = net.redis(6379, &[]).unwrap();
    let up = Upstream::start();
    let keys = format!(
        "fleet.store = redis://{STORE_IP}:6379\nfleet.maxSessionConnections = 6\nfleet.leaseMs = 1500\n{PATIENT}"
    );
    // A holds six long requests; B, configured as A is on the same host (one
    // host name, one pin path, one listening address: cloned machines,
    // containers), starts and asks for the session all along.
    let a = store::twin_node(&net, &up, &keys).unwrap();
    let token = "Bearer twins";
    let held: Vec<_> = (0..6).map(|_| spawn_get(&net, a.addr, "/sess?ms=6000", &auth(token))).collect();
    wait_for("six held on A", Duration::from_secs(5), || up.session_now(token) == 6);
    up.reset_session_peaks();
    let b = store::twin_node(&net, &up, &keys).unwrap();
    let tries = Sessions::start(&net, &[b.addr], 6, token, 300, Duration::from_millis(10));
    thread::sleep(Duration::from_secs(3));
    let (peak, outcomes) = held_to(&up, token, 6, tries, "with two daemons configured alike");
    assert!(statuses(held).iter().all(|r| r.status == 200));
    assert_ne!(
        a.daemon.admin_get("/status").unwrap().split("\"node\":").nth(1).map(|s| s[..40].to_owned()),
        b.daemon.admin_get("/status").unwrap().split("\"node\":").nth(1).map(|s| s[..40].to_owned()),
        "two processes, two fields"
    );
    eprintln!("twins: peak {peak} of 6; {outcomes:?}");
}

#[test]
#[ignore = "black-box: the daemon binary, root, network namespaces and redis-server; run by `cargo xtask test`"]
fn a_handover_without_the_gate_never_erases_the_draining_daemons_share() {
    require_kernel!();
    let net = StoreNet::new().unwrap();
    let _redis = net.redis(6379, &[]).unwrap();
    let up = Upstream::start();
    let keys = format!(
        "fleet.store = redis://{STORE_IP}:6379\nfleet.maxSessionConnections = 6\nfleet.leaseMs = 1500\n{PATIENT}"
    );
    let nodes = store::fleet(&net, &up, 2, &keys).unwrap();
    let token = "Bearer handed-over";
    // The first daemon of A holds six; a second daemon starts on A's
    // configuration beside it (kernel.enabled = false: no gate, no permit
    // ledger between them) and both serve A's address.
    let held: Vec<_> =
        (0..6).map(|_| spawn_get(&net, nodes[0].addr, "/sess?ms=6000", &auth(token))).collect();
    wait_for("six held on A", Duration::from_secs(5), || up.session_now(token) == 6);
    up.reset_session_peaks();
    let second = limiter_tests::Daemon::start_inside(&nodes[0].sb, &nodes[0].config, &[]).unwrap();
    let tries =
        Sessions::start(&net, &[nodes[0].addr, nodes[1].addr], 6, token, 300, Duration::from_millis(10));
    thread::sleep(Duration::from_secs(3));
    let (peak, outcomes) = held_to(&up, token, 6, tries, "during a handover without the gate");
    assert!(statuses(held).iter().all(|r| r.status == 200));
    drop(second);
    eprintln!("handover without the gate: peak {peak} of 6; {outcomes:?}");
}

#[test]
#[ignore = "black-box: the daemon binary, root, network namespaces, redis-server and iptables; run by `cargo xtask test`"]
fn a_cut_off_node_admits_only_what_ends_within_its_share_s_trust() {
    require_kernel!();
    let net = StoreNet::new().unwrap();
    let _redis = net.redis(6379, &[]).unwrap();
    let up = Upstream::start();
    // Lease 3 s; requests of 0.9 s, shorter than a third of it: C, cut off,
    // keeps admitting within its share (its clients keep asking it), and
    // every request it admits must end before the store lets the others
    // have C's units.
    let nodes = store::fleet(
        &net,
        &up,
        3,
        &format!(
            "fleet.store = redis://{STORE_IP}:6379\nfleet.maxSessionConnections = 6\nfleet.leaseMs = 3000\n{PATIENT}"
        ),
    )
    .unwrap();
    let addrs = addrs_of(&nodes);
    let token = "Bearer covered";
    let on_c = Sessions::start(&net, &addrs[2..], 4, token, 900, Duration::ZERO);
    wait_for("C busy", Duration::from_secs(5), || up.session_now(token) >= 3);
    thread::sleep(Duration::from_millis(1500));
    up.reset_session_peaks();
    partition(&nodes[2], "-A", 6379);
    let on_ab = Sessions::start(&net, &addrs[..2], 6, token, 900, Duration::from_millis(5));
    thread::sleep(Duration::from_secs(6));
    let (c, ab) = (on_c.stop(), on_ab.stop());
    partition(&nodes[2], "-D", 6379);
    let peak = up.session_peak(token);
    assert!(peak <= 6, "{peak} of 6 in progress with C cut off: C {c:?}, A and B {ab:?}");
    assert!(ab.get("200").copied().unwrap_or(0) > 5, "A and B use C's units once it is gone: {ab:?}");
    eprintln!("C cut off, requests of 0.9 s, lease 3 s: peak {peak} of 6; C {c:?}; A and B {ab:?}");
}

#[test]
#[ignore = "black-box: the daemon binary, root, network namespaces and redis-server; run by `cargo xtask test`"]
fn http2_streams_reset_while_they_wait_leave_no_waiter_no_unit_and_no_budget() {
    use limiter_tests::h2raw;
    require_kernel!();
    let net = StoreNet::new().unwrap();
    let redis = net.redis(6379, &[]).unwrap();
    let up = Upstream::start();
    let keys = format!(
        "http.h2c = true\nfleet.store = redis://{STORE_IP}:6379\nfleet.maxSessionConnections = 6\nfleet.maxWebConnections = 50\n{PATIENT}"
    );
    let nodes = store::fleet(&net, &up, 2, &keys).unwrap();
    let token = "Bearer reset-while-waiting";
    // One web request holds a unit of the web budget, so that the next
    // ones take theirs from the share at once; then the store freezes, and
    // 60 streams of one session, and 60 of other sessions (each with
    // X-Client-Id: a web unit taken while the session's claim waits), are
    // reset while their claims wait.
    let web = spawn_get(&net, nodes[0].addr, "/hold", &["X-Client-Id: w".to_owned()]);
    up.wait_holding(1);
    redis.pause();
    let addr = nodes[0].addr;
    let client = thread::spawn({
        let netns = net.sb.netns_file();
        move || {
            in_netns(&netns, move || {
                use std::io::Write as _;
                let mut s = h2raw::connect(addr, &[]);
                for i in 0..120u32 {
                    let session = if i % 2 == 0 { token.to_owned() } else { format!("Bearer other-{i}") };
                    let block = h2raw::get_block("/x", &[("authorization", &session), ("x-client-id", "w")]);
                    let stream = 1 + 2 * i;
                    s.write_all(&h2raw::frame(
                        h2raw::HEADERS,
                        h2raw::END_HEADERS | h2raw::END_STREAM,
                        stream,
                        &block,
                    ))
                    .unwrap();
                }
                thread::sleep(Duration::from_millis(100));
                for i in 0..120u32 {
                    s.write_all(&h2raw::frame(h2raw::RST_STREAM, 0, 1 + 2 * i, &8u32.to_be_bytes())).unwrap();
                }
                thread::sleep(Duration::from_millis(100));
                s
            })
        }
    });
    let _s = client.join().unwrap();
    redis.resume();
    up.release();
    assert_eq!(web.join().unwrap().unwrap().status, 200);
    // Nothing held, nothing waiting: every budget forgotten within a few
    // renewals, and no session left in the store.
    wait_for("nothing held and no budget kept", Duration::from_secs(8), || {
        let n = &nodes[0].daemon;
        n.metric("limiter_fleet_permits{kind=\"web\"}") == 0.0
            && n.metric("limiter_fleet_permits{kind=\"session\"}") == 0.0
            && n.metric("limiter_fleet_sessions") == 0.0
    });
    wait_for("no session's budget in the store", Duration::from_secs(8), || {
        net.session_budgets(6379).unwrap_or(1) == 0
    });
    // And the session whose streams were reset gets all six on the other
    // node: nothing reserved for waiters that are gone.
    let six: Vec<_> = (0..6).map(|_| spawn_get(&net, nodes[1].addr, "/hold", &auth(token))).collect();
    up.wait_holding(6);
    up.release();
    assert!(statuses(six).iter().all(|r| r.status == 200));
    assert_eq!(up.hits(), 7, "no reset request went upstream");
}

#[test]
#[ignore = "black-box: the daemon binary, root, network namespaces and redis-server; run by `cargo xtask test`"]
fn a_store_a_node_cannot_reach_is_fleet_down_never_a_fleet_limit() {
    require_kernel!();
    let net = StoreNet::new().unwrap();
    let mut redis = net.redis(6379, &[]).unwrap();
    let up = Upstream::start();
    let node = store::node(
        &net,
        &up,
        &format!(
            "fleet.store = redis://{STORE_IP}:6379\nfleet.maxSessionConnections = 6\nfleet.maxWebConnections = 6\nfleet.onStoreDown = refuse"
        ),
    )
    .unwrap();
    // Redis killed: fifty requests of new sessions (each claims), as the
    // node finds out and after.
    redis.kill();
    let mut reasons = std::collections::BTreeMap::new();
    for i in 0..50 {
        let r = get(
            &net,
            node.addr,
            "/x",
            &[format!("Authorization: Bearer new-{i}"), "X-Client-Id: w".to_owned()],
        );
        *reasons.entry(r.header("x-limiter-refused").unwrap_or("none").to_owned()).or_insert(0) += 1;
    }
    assert_eq!(reasons.keys().collect::<Vec<_>>(), ["fleet_down"], "{reasons:?}");
}

#[test]
#[ignore = "black-box: the daemon binary, root, network namespaces, redis-server and redis-sentinel; run by `cargo xtask test`"]
fn a_store_that_is_not_a_primary_is_refused_at_start_and_eviction_is_warned_of() {
    require_kernel!();
    let net = StoreNet::new().unwrap();
    let _primary = net.redis(6379, &["--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"]).unwrap();
    let _replica = net.replica(6380, 6379).unwrap();
    let _sentinel = net.sentinel(26379, "mymaster", 6379).unwrap();
    let up = Upstream::start();
    for (store, what) in
        [(format!("{}:6380", store::REPLICA_IP), "a replica"), (format!("{STORE_IP}:26379"), "a Sentinel")]
    {
        let keys = format!("fleet.store = redis://{store}\nfleet.maxSessionConnections = 6");
        let said = match store::node(&net, &up, &keys) {
            Ok(mut n) => format!("exit {:?}: {}", n.daemon.wait(), n.daemon.log()),
            Err(e) => format!("{e:#}"),
        };
        assert!(said.contains("exit status: 78") || said.starts_with("exit Some(78)"), "{store}: {said}");
        assert!(said.contains(what) && said.contains("not a Redis primary"), "{store}: {said}");
    }
    // The primary starts, and says its eviction policy could drop the
    // fleet's keys; check-config says so too.
    let node = store::node(
        &net,
        &up,
        &format!("fleet.store = redis://{STORE_IP}:6379\nfleet.maxSessionConnections = 6"),
    )
    .unwrap();
    assert!(node.daemon.log().contains("maxmemory-policy allkeys-lru"), "{}", node.daemon.log());
    let check = in_netns(&node.sb.netns_file(), {
        let config = node.config.clone();
        move || limiter_tests::limiter(&["check-config", config.to_str().unwrap()])
    });
    let text = String::from_utf8_lossy(&check.stdout);
    assert!(
        text.contains("answers as a primary")
            && text.contains("WARNING fleet store: maxmemory-policy allkeys-lru"),
        "{text}"
    );
}

#[test]
#[ignore = "black-box: the daemon binary, root, network namespaces and redis-server; run by `cargo xtask test`"]
fn with_the_store_killed_a_new_session_gets_its_safe_share_on_each_node_and_the_limit_holds() {
    require_kernel!();
    let net = StoreNet::new().unwrap();
    let mut redis = net.redis(6379, &[]).unwrap();
    let up = Upstream::start();
    let lease = Duration::from_millis(1500);
    let nodes = store::fleet(
        &net,
        &up,
        3,
        &format!(
            "fleet.store = redis://{STORE_IP}:6379\nfleet.maxSessionConnections = 6\nfleet.leaseMs = 1500\n{PATIENT}"
        ),
    )
    .unwrap();
    let addrs = addrs_of(&nodes);
    // The nodes see each other among the live nodes.
    wait_for("three live nodes seen", Duration::from_secs(5), || {
        nodes.iter().all(|n| n.daemon.metric("limiter_fleet_nodes") == 3.0)
    });
    redis.kill();
    let killed = Instant::now();
    // A session no node held when the store went: refused fleet_down until
    // the store has refused connections for a lease, then each node may
    // use floor(6 / 3) = 2 of it.
    let token = "Bearer new-in-the-outage";
    wait_for("the store seen down", Duration::from_secs(5), || {
        nodes.iter().all(|n| n.daemon.metric("limiter_fleet_store_up") == 0.0)
    });
    assert_refused(&get(&net, addrs[0], "/x", &auth(token)), "fleet_down");
    thread::sleep(lease.saturating_sub(killed.elapsed()) + Duration::from_millis(500));
    up.reset_session_peaks();
    let tries = Sessions::start(&net, &addrs, 9, token, 300, Duration::from_millis(10));
    thread::sleep(Duration::from_secs(3));
    let (peak, outcomes) = held_to(&up, token, 6, tries, "within the safe shares");
    let safe: f64 = nodes.iter().map(|n| n.daemon.metric("limiter_fleet_admitted_safe_total")).sum();
    assert!(
        outcomes.get("200").copied().unwrap_or(0) > 10 && safe > 10.0,
        "{safe} within the safe share: {outcomes:?}; the first node's log:\n{}",
        nodes[0].daemon.log().lines().filter(|l| l.contains("fleet")).collect::<Vec<_>>().join("\n")
    );
    eprintln!(
        "store killed, three nodes: a new session admitted within the safe shares, peak {peak} of 6; {outcomes:?}"
    );
}

#[test]
#[ignore = "black-box: the daemon binary, root, network namespaces, redis-server, redis-sentinel and iptables; run by `cargo xtask test`"]
fn a_sentinel_failover_to_a_replica_that_missed_writes_keeps_the_limit() {
    require_kernel!();
    let net = StoreNet::new().unwrap();
    let mut primary = net.redis(6379, &[]).unwrap();
    let replica = net.replica(6380, 6379).unwrap();
    let _sentinel = net.sentinel(26379, "mymaster", 6379).unwrap();
    let up = Upstream::start();
    let nodes = store::fleet(
        &net,
        &up,
        3,
        &format!(
            "fleet.store = redis+sentinel://{STORE_IP}:26379/mymaster\nfleet.maxSessionConnections = 6\nfleet.leaseMs = 1500\n{PATIENT}"
        ),
    )
    .unwrap();
    let addrs = addrs_of(&nodes);
    let token = "Bearer sentinel";
    // Replication cut: the replica misses what follows; then the primary
    // dies and Sentinel promotes the replica.
    let cut = net.cut_replication(6379).unwrap();
    let held = hold_each(&net, &up, &addrs, "/sess?ms=8000", token, 6);
    up.reset_session_peaks();
    let tries = Sessions::start(&net, &addrs, 9, token, 300, Duration::from_millis(10));
    thread::sleep(Duration::from_millis(500));
    primary.kill();
    let killed = Instant::now();
    wait_for("the replica promoted", Duration::from_secs(30), || {
        replica.cli(&["role"]).is_ok_and(|r| r.starts_with("master"))
    });
    let promoted = killed.elapsed();
    wait_for("every node up again", Duration::from_secs(15), || {
        nodes.iter().all(|n| n.daemon.metric("limiter_fleet_store_up") == 1.0)
    });
    // The six held end (8 s); the tries then find room on the new
    // primary.
    assert!(statuses(held).iter().all(|r| r.status == 200));
    thread::sleep(Duration::from_secs(3));
    let (peak, outcomes) = held_to(&up, token, 6, tries, "through a Sentinel failover");
    net.mend(&cut).ok();
    assert!(outcomes.get("200").copied().unwrap_or(0) > 5, "served again after the failover: {outcomes:?}");
    eprintln!("Sentinel failover after {promoted:?}: peak {peak} of 6; {outcomes:?}");
}
