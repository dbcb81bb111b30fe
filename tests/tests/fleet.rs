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
/// store's `keys` are gone: no share and no demand left (unused shares and
/// the demand of refused requests go at the renewal after next, within two
/// thirds of a lease and a round trip).
fn wait_all_given_back(net: &StoreNet, port: u16, nodes: &[Node], keys: &[&str]) {
    wait_for("every fleet share given back", Duration::from_secs(8), || {
        nodes.iter().all(|n| {
            n.daemon.metric("limiter_fleet_permits{kind=\"session\"}") == 0.0
                && n.daemon.metric("limiter_fleet_permits{kind=\"web\"}") == 0.0
        }) && keys.iter().all(|k| !net.exists(port, k).unwrap_or(true))
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
    let short = key["limiter:{default:s:".len()..][..12].to_owned();
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

    // A restarted under the same identity takes its forty again at once:
    // the previous process's members are its own, not another node's.
    nodes[0].kill9();
    up.release();
    up.wait_holding(0);
    assert_eq!(net.shares(6379, &key).unwrap(), 40, "the dead process's share is still leased");
    nodes[0].restart().unwrap();
    let restarted = Instant::now();
    let _a = hold_40(&net, &nodes[0]);
    up.wait_holding(40);
    assert!(restarted.elapsed() < lease, "a restart waited for its own lease: {:?}", restarted.elapsed());
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
    let addrs: Vec<SocketAddr> = nodes.iter().map(|n| n.addr).collect();
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
    let redis = net.redis(6379, &[]).unwrap();
    // No share grows on a Redis younger than a lease (6 s here).
    redis.wait_older_than(Duration::from_secs(6)).unwrap();
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
    assert!(!net.exists(6379, &key).unwrap(), "{}", node.daemon.log());
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
fn a_node_cut_from_the_store_keeps_within_its_share_and_a_lease_longer_than_its_requests_keeps_the_limit() {
    require_kernel!();
    let net = StoreNet::new().unwrap();
    let redis = net.redis(6379, &[]).unwrap();
    // No share grows on a Redis younger than a lease (4 s here).
    redis.wait_older_than(Duration::from_secs(4)).unwrap();
    let up = Upstream::start();
    // Requests of 3 s, leases of 4 s: a share outlives every request it
    // covers, so a node cut off never leaves work running past its lease.
    let nodes = store::fleet(
        &net,
        &up,
        3,
        &format!(
            "fleet.store = redis://{STORE_IP}:6379\nfleet.maxSessionConnections = 6\nfleet.leaseMs = 4000"
        ),
    )
    .unwrap();
    let addrs: Vec<SocketAddr> = nodes.iter().map(|n| n.addr).collect();
    let token = "Bearer partitioned";
    // C holds four.
    let held: Vec<_> = (0..4).map(|_| spawn_get(&net, addrs[2], "/sess?ms=3000", &auth(token))).collect();
    wait_for("four held on C", Duration::from_secs(5), || up.session_now(token) == 4);
    // C is cut from the store; clients keep asking every node.
    partition(&nodes[2], "-A", 6379);
    let cut = Instant::now();
    let tries = Sessions::start(&net, &addrs, 6, token, 3000, Duration::from_millis(20));
    thread::sleep(Duration::from_secs(7));
    let outcomes = tries.stop();
    partition(&nodes[2], "-D", 6379);
    let peak = up.session_peak(token);
    assert!(
        peak <= 6,
        "the upstream had {peak} of the session at once with C cut off (fleet limit 6): {outcomes:?}"
    );
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
            "fleet.store = redis://{STORE_IP}:6379\nfleet.maxSessionConnections = 6\nfleet.leaseMs = 1500"
        ),
    )
    .unwrap();
    let addrs: Vec<SocketAddr> = nodes.iter().map(|n| n.addr).collect();
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
            "fleet.store = redis://{STORE_IP}:6379\nfleet.maxSessionConnections = 6\nfleet.leaseMs = 1500"
        ),
    )
    .unwrap();
    let addrs: Vec<SocketAddr> = nodes.iter().map(|n| n.addr).collect();
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
            "fleet.store = redis://{STORE_IP}:6379\nfleet.maxSessionConnections = 6\nfleet.leaseMs = 1500"
        ),
    )
    .unwrap();
    let addrs: Vec<SocketAddr> = nodes.iter().map(|n| n.addr).collect();
    let token = "Bearer restarted";
    let held = hold_each(&net, &up, &addrs, "/sess?ms=6000", token, 6);
    let tries = Sessions::start(&net, &addrs, 6, token, 500, Duration::from_millis(20));
    redis.kill();
    redis.start().unwrap();
    thread::sleep(Duration::from_secs(4));
    let outcomes = tries.stop();
    let peak = up.session_peak(token);
    assert_eq!(peak, 6, "the upstream had {peak} of the session at once (fleet limit 6): {outcomes:?}");
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
            "fleet.store = redis+cluster://{STORE_IP}:7101,{STORE_IP}:7102,{STORE_IP}:7103\nfleet.maxSessionConnections = 6\nfleet.leaseMs = 3000\nfleet.name = failover"
        ),
    )
    .unwrap();
    let addrs: Vec<SocketAddr> = nodes.iter().map(|n| n.addr).collect();
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
    let outcomes = tries.stop();
    let peak = up.session_peak(token);
    assert!(peak <= 6, "the upstream had {peak} of the session at once (fleet limit 6): {outcomes:?}");
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
    let peak_keys = net.keys(6379).unwrap();
    wait_for("every session's key gone", Duration::from_secs(10), || net.keys(6379).unwrap_or(0) <= 1);
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
