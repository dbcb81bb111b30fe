//! The fleet's one store script (`limiter/src/fleet/claim.lua`), run by a
//! real `redis-server` on loopback (no namespace, no daemon): the rules
//! the daemons rely on, checked one by one against the script's answer
//! as the daemon reads it (`limiter::fleet::claim::Answer`), and the
//! invariant — what the store counts for each node is never less than
//! what that node may admit up to — under a few thousand random claims of
//! three nodes. The interleavings of many nodes, delays, losses and
//! faults are the simulation's (`sim/`, `cargo xtask simulate`).

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use limiter::fleet::claim::{Answer, SCRIPT};
use limiter_tests::free_port;

/// A `redis-server` of this test's, killed on drop.
struct Redis {
    port: u16,
    child: Child,
    dir: PathBuf,
}

const EPOCH: &str = "limiter:{t}:epoch";
const KEY: &str = "limiter:{t}:k";

impl Redis {
    fn start() -> Self {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("limiter-claim-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string(), "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server (installed by `cargo xtask setup`)");
        let redis = Self { port, child, dir };
        let deadline = Instant::now() + Duration::from_secs(10);
        while redis.cli(&["ping"]).trim() != "PONG" {
            assert!(Instant::now() < deadline, "redis-server did not answer");
            std::thread::sleep(Duration::from_millis(20));
        }
        redis
    }

    fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli").args(["-p", &self.port.to_string()]).args(args).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn eval(&self, keys: &[&str], argv: &[String]) -> Answer {
        let mut cmd = vec!["eval", SCRIPT];
        let n = keys.len().to_string();
        cmd.push(&n);
        cmd.extend(keys);
        cmd.extend(argv.iter().map(String::as_str));
        let out = self.cli(&cmd);
        Answer::parse(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"))
    }

    /// One claim of [`KEY`].
    fn claim(&self, c: &C) -> Answer {
        let gone: Vec<String> = c.gone.iter().map(|(f, s)| format!("{f} {s}")).collect();
        let argv = [
            c.me.to_owned(),
            c.seq.to_string(),
            c.limit.to_string(),
            c.in_use.to_string(),
            c.keep.to_string(),
            c.need.to_string(),
            c.want.to_string(),
            gone.join(" "),
            c.unquiet.clone().unwrap_or_else(|| "-".into()),
            "60000".into(),
            "12345".into(),
        ];
        self.eval(&[KEY, EPOCH], &argv)
    }

    /// The epoch alone (as a node's connection reads it), ending `unquiet`.
    fn epoch(&self, unquiet: Option<&str>) -> Answer {
        let argv: Vec<String> =
            ["", "0", "0", "0", "0", "0", "0", "", unquiet.unwrap_or("-"), "60000", "777"]
                .iter()
                .map(ToString::to_string)
                .collect();
        self.eval(&[EPOCH], &argv)
    }

    /// What the store counts, field by field: node → share.
    fn shares(&self) -> Vec<(String, u64)> {
        let out = self.cli(&["hgetall", KEY]);
        let lines: Vec<&str> = out.lines().collect();
        lines
            .chunks(2)
            .filter(|f| f.len() == 2)
            .filter_map(|f| Some((f[0].to_owned(), f[1].split(' ').next()?.parse().ok()?)))
            .collect()
    }

    fn sum(&self) -> u64 {
        self.shares().iter().map(|(_, s)| s).sum()
    }

    /// A store whose epoch has been read and its first quiet ended, as a
    /// fleet's after its first lease.
    fn ready() -> Self {
        let r = Self::start();
        let quiet = r.epoch(None).quiet.expect("a store without the epoch is quiet");
        assert_eq!(r.epoch(Some(&quiet)).quiet, None);
        r
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A claim's arguments.
#[derive(Clone, Default)]
struct C {
    me: &'static str,
    seq: u64,
    limit: u32,
    in_use: u32,
    keep: u32,
    need: u32,
    want: u32,
    gone: Vec<(String, u64)>,
    unquiet: Option<String>,
}

fn c(me: &'static str, seq: u64, in_use: u32, keep: u32, need: u32, want: u32) -> C {
    C { me, seq, limit: 6, in_use, keep, need, want, ..C::default() }
}

#[test]
#[ignore = "needs redis-server (set-up installs it): run by cargo xtask test"]
fn a_claim_is_granted_what_the_others_leave_and_what_a_node_may_hold_is_always_counted() {
    let r = Redis::ready();
    let a = r.claim(&c("a", 1, 0, 0, 4, 4));
    assert_eq!((a.cap, a.share, a.others), (4, 4, 0));
    // B needs 4: 2 are left; its demand of 2 is recorded and seen by C.
    let b = r.claim(&c("b", 1, 0, 0, 4, 4));
    assert_eq!((b.cap, b.share, b.others), (2, 2, 4));
    let cc = r.claim(&c("c", 1, 0, 0, 1, 1));
    assert_eq!((cc.cap, cc.others, cc.others_demand), (0, 6, 2));
    assert_eq!(r.sum(), 6);
    // What is in flight is counted whatever is free (a republish): C with
    // 3 in use is counted 3, and may admit nothing.
    let cc = r.claim(&c("c", 2, 3, 0, 3, 3));
    assert_eq!((cc.cap, cc.share), (0, 3), "counted, admits nothing");
    assert_eq!(r.sum(), 9, "over the limit by what C had in flight, never by a grant");
    // What a node keeps while its claim is out is counted too: A keeps 4
    // while it asks for 1 (the others hold 5: 1 is left), and the store
    // counts 4.
    let a = r.claim(&c("a", 2, 1, 4, 1, 1));
    assert_eq!((a.cap, a.share), (1, 4), "A drains toward what is left");
    // A's next claim keeps only what it was told (0): the store counts
    // what is in flight.
    let a = r.claim(&c("a", 3, 1, 0, 1, 1));
    assert_eq!(a.share, 1);
    // Nothing held, nothing wanted: the field goes.
    r.claim(&c("c", 3, 0, 0, 0, 0));
    assert!(r.shares().iter().all(|(f, _)| f != "c"));
}

#[test]
#[ignore = "needs redis-server (set-up installs it): run by cargo xtask test"]
fn with_others_wanting_more_a_node_gets_its_part_in_proportion_to_its_need() {
    let r = Redis::ready();
    assert_eq!(r.claim(&c("a", 1, 0, 0, 6, 6)).cap, 6);
    // B needs 3 and finds nothing: its demand is recorded.
    assert_eq!(r.claim(&c("b", 1, 0, 0, 3, 3)).cap, 0);
    // A renews with its 6 in flight: its part, 6 × 6 / (6 + 3), is 4; the
    // store counts its 6 until they end.
    let a = r.claim(&c("a", 2, 6, 6, 6, 6));
    assert_eq!((a.cap, a.share, a.others_demand), (4, 6, 3));
    // Drained to 4: 6 × 4 / (4 + 3) rounds up to 4, and B gets the rest.
    assert_eq!(r.claim(&c("a", 3, 4, 4, 4, 6)).share, 4);
    assert_eq!(r.claim(&c("b", 2, 0, 0, 3, 3)).cap, 2);
    assert_eq!(r.sum(), 6);
}

#[test]
#[ignore = "needs redis-server (set-up installs it): run by cargo xtask test"]
fn headroom_is_granted_only_while_the_budget_is_less_than_half_used() {
    let r = Redis::ready();
    // Needs 2, wants 3, limit 10: 3 (less than half used).
    assert_eq!(r.claim(&C { limit: 10, ..c("a", 1, 0, 0, 2, 3) }).cap, 3);
    // B needs 2 and wants 3: 3 + 2 is half: no headroom.
    assert_eq!(r.claim(&C { limit: 10, ..c("b", 1, 0, 0, 2, 3) }).cap, 2);
}

#[test]
#[ignore = "needs redis-server (set-up installs it): run by cargo xtask test"]
fn a_field_ends_only_when_a_node_names_it_gone_as_it_saw_it_never_with_time() {
    let r = Redis::ready();
    r.claim(&c("a", 7, 4, 0, 4, 4));
    let b = r.claim(&c("b", 1, 0, 0, 2, 2));
    assert_eq!(b.seen, [("a".to_owned(), 7)]);
    // Time passes: nothing ends (the store reads no clock for it).
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(r.claim(&c("b", 2, 0, 0, 2, 2)).cap, 2);
    // A renewed meanwhile (seq 8): B's word that it saw seq 7 unchanged
    // for a lease ends nothing.
    r.claim(&c("a", 8, 4, 4, 4, 4));
    let b = r.claim(&C { gone: vec![("a".into(), 7)], ..c("b", 3, 0, 0, 2, 2) });
    assert_eq!(b.cap, 2, "a's renewed field stands");
    // Seen unchanged (seq 8) for a lease: gone, and B gets its room.
    let b = r.claim(&C { gone: vec![("a".into(), 8)], ..c("b", 4, 0, 0, 6, 6) });
    assert_eq!((b.cap, b.others), (6, 0));
    // A node never ends its own field that way.
    let b = r.claim(&C { gone: vec![("b".into(), 4)], ..c("b", 5, 6, 6, 6, 6) });
    assert_eq!(b.share, 6);
}

#[test]
#[ignore = "needs redis-server (set-up installs it): run by cargo xtask test"]
fn a_claim_sent_twice_is_answered_as_it_was_and_an_older_one_changes_nothing() {
    let r = Redis::ready();
    let first = r.claim(&c("a", 5, 0, 0, 3, 3));
    let again = r.claim(&c("a", 5, 0, 0, 3, 3));
    assert_eq!((again.stale, again.cap, again.share), (false, first.cap, first.share));
    let older = r.claim(&c("a", 4, 0, 0, 1, 1));
    assert!(older.stale);
    assert_eq!(r.sum(), 3);
}

#[test]
#[ignore = "needs redis-server (set-up installs it): run by cargo xtask test"]
fn a_store_that_lost_the_fleets_data_is_quiet_until_a_node_saw_that_quiet_for_a_lease() {
    let r = Redis::start();
    // A store that never held the epoch (or lost it): quiet.
    let first = r.claim(&c("a", 1, 2, 4, 4, 4));
    let quiet = first.quiet.clone().expect("quiet");
    // While quiet, what a node held is republished (what it kept), and
    // nothing grows: A keeps 4, B gets nothing.
    assert_eq!((first.cap, first.share), (4, 4));
    assert_eq!(r.claim(&c("b", 1, 0, 0, 2, 2)).cap, 0);
    // Only the very quiet a node saw ends it.
    assert!(r.claim(&C { unquiet: Some("999.1".into()), ..c("b", 2, 0, 0, 2, 2) }).quiet.is_some());
    let b = r.claim(&C { unquiet: Some(quiet.clone()), ..c("b", 3, 0, 0, 2, 2) });
    assert_eq!((b.quiet, b.cap), (None, 2));
    // The store flushed: the epoch is gone, quiet again, with another
    // nonce (never the same quiet as before).
    r.cli(&["flushall"]);
    let again = r.epoch(None).quiet.expect("quiet after a flush");
    assert_ne!(again, quiet);
    assert_eq!(r.epoch(Some(&again)).quiet, None);
    // A node that holds a share the store does not have (a write lost):
    // quiet, at once.
    let a = r.claim(&c("a", 9, 1, 3, 3, 3));
    assert!(a.quiet.is_some(), "a node's kept share the store did not hold");
    // An epoch written by another server (a promoted replica): quiet.
    r.cli(&["hset", EPOCH, "id", "0000000000000000000000000000000000000000"]);
    let q = r.epoch(None).quiet.expect("quiet: another server's epoch");
    assert!(q.ends_with(".3"), "{q}: the third generation");
}

#[test]
#[ignore = "needs redis-server (set-up installs it): run by cargo xtask test"]
fn random_claims_of_three_nodes_never_count_less_than_a_node_may_hold() {
    let r = Redis::ready();
    let limit = 7u32;
    // Each node: in flight, cap (what it may admit up to), next seq.
    let mut nodes = [(0u32, 0u32, 1u64); 3];
    let names = ["a", "b", "c"];
    // A linear congruential sequence: repeatable.
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = |m: u64| {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (x >> 33) % m
    };
    for step in 0..600 {
        let n = next(3) as usize;
        let (in_use, cap, seq) = nodes[n];
        // Requests end now and then, and come within the cap.
        let in_use = if in_use > 0 && next(2) == 0 { in_use - 1 } else { in_use };
        let in_use = in_use.max(in_use + (cap.saturating_sub(in_use)).min(next(2) as u32));
        let need = in_use + next(3) as u32;
        let want = need + next(2) as u32;
        let keep = cap.min(want.max(in_use));
        let a = r.claim(&C { limit, ..c(names[n], seq, in_use, keep, need, want) });
        assert!(
            a.share >= in_use.max(keep).max(a.cap),
            "step {step}: {a:?} for {in_use} in use, {keep} kept"
        );
        nodes[n] = (in_use, a.cap, seq + 1);
        // The store counts each node at least what it may hold.
        let counted = r.shares();
        for (i, name) in names.iter().enumerate() {
            let held = nodes[i].0.max(nodes[i].1);
            let c = counted.iter().find(|(f, _)| f == name).map_or(0, |(_, s)| *s);
            assert!(c >= u64::from(held), "step {step}: {name} may hold {held}, the store counts {c}");
        }
        // And grants never take it past the limit: only what nodes had in
        // flight when they had nothing granted does.
        let admissible: u32 = nodes.iter().map(|(_, cap, _)| *cap).sum();
        assert!(admissible <= limit, "step {step}: caps {nodes:?} past {limit}");
    }
}
