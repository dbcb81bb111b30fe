//! The fleet's one store script (`limiter/src/fleet/claim.lua`), run by a
//! real `redis-server` on loopback (no namespace, no daemon): the rules
//! the daemons rely on, checked one by one, and the invariant — the
//! shares of the live fields never sum above the limit, except by what
//! nodes had in use — under a few thousand random claims of three nodes.

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use limiter_tests::free_port;

const SCRIPT: &str = include_str!("../../limiter/src/fleet/claim.lua");

/// A `redis-server` of this test's, killed on drop.
struct Redis {
    port: u16,
    child: Child,
    dir: PathBuf,
}

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

    /// Waits until it has run for `s` seconds (a younger Redis keeps a
    /// budget it does not hold quiet).
    fn older_than(&self, s: u64) {
        let deadline = Instant::now() + Duration::from_secs(s + 10);
        loop {
            let up = self
                .cli(&["info", "server"])
                .lines()
                .find_map(|l| l.strip_prefix("uptime_in_seconds:")?.trim().parse::<u64>().ok())
                .unwrap_or(0);
            if up >= s {
                return;
            }
            assert!(Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// One claim: {share, quiet, lapsed, others, others' demand}.
    #[expect(clippy::too_many_arguments, reason = "the script's arguments, in its order")]
    fn claim(
        &self,
        key: &str,
        node: &str,
        limit: u32,
        lease_ms: u32,
        in_use: u32,
        wanted: u32,
        prefix: &str,
        needed: u32,
    ) -> [u64; 5] {
        let args = [
            node.to_owned(),
            limit.to_string(),
            lease_ms.to_string(),
            in_use.to_string(),
            wanted.to_string(),
            prefix.to_owned(),
            needed.to_string(),
        ];
        let mut cmd = vec!["eval", SCRIPT, "1", key];
        cmd.extend(args.iter().map(String::as_str));
        let out = self.cli(&cmd);
        let v: Vec<u64> = out.lines().map(|l| l.trim().parse().unwrap_or_else(|_| panic!("{out}"))).collect();
        v.try_into().unwrap_or_else(|v| panic!("five numbers: {v:?}"))
    }

    /// Every live field's share summed.
    fn sum(&self, key: &str) -> u64 {
        let out = self.cli(&["hgetall", key]);
        let lines: Vec<&str> = out.lines().collect();
        lines
            .chunks(2)
            .filter(|f| f.len() == 2 && f[0] != "quiet")
            .filter_map(|f| f[1].split(' ').next()?.parse::<u64>().ok())
            .sum()
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

const LEASE: u32 = 500;

fn settled() -> Redis {
    let r = Redis::start();
    r.older_than(1);
    r
}

#[test]
#[ignore = "needs redis-server (set-up installs it): run by cargo xtask test"]
fn a_claim_is_granted_what_the_others_leave_and_what_is_in_use_is_always_held() {
    let r = settled();
    assert_eq!(r.claim("k", "a.", 6, LEASE, 0, 4, "", 4), [4, 0, 0, 0, 0]);
    // B wants 4: 2 are left; its demand of 2 is recorded.
    assert_eq!(r.claim("k", "b.", 6, LEASE, 0, 4, "", 4), [2, 0, 0, 4, 0]);
    // C finds nothing, and sees B's demand.
    assert_eq!(r.claim("k", "c.", 6, LEASE, 0, 1, "", 1), [0, 0, 0, 6, 2]);
    assert_eq!(r.sum("k"), 6);
    // What is in use is held, whatever is free (a republish): 3 in use.
    assert_eq!(r.claim("k", "c.", 6, LEASE, 3, 3, "", 3)[0], 3, "in use");
    assert_eq!(r.sum("k"), 9, "over the limit by what C had in use, never by a grant");
    // Nothing wanted: the field goes.
    assert_eq!(r.claim("k", "c.", 6, LEASE, 0, 0, "", 0), [0, 0, 0, 6, 2]);
    assert_eq!(r.sum("k"), 6);
}

#[test]
#[ignore = "needs redis-server (set-up installs it): run by cargo xtask test"]
fn with_others_wanting_more_a_node_gets_its_part_in_proportion_to_its_need() {
    let r = settled();
    // A holds all 6; B's claim for 3 finds nothing and records it.
    assert_eq!(r.claim("k", "a.", 6, LEASE, 6, 6, "", 6)[0], 6);
    assert_eq!(r.claim("k", "b.", 6, LEASE, 0, 3, "", 3)[0], 0);
    // A's renewal, wanting 6 with 2 in use: 6 × 6 / (6 + 3) rounds up to 4.
    assert_eq!(r.claim("k", "a.", 6, LEASE, 2, 6, "", 6)[0], 4);
    // B gets what A gave back.
    assert_eq!(r.claim("k", "b.", 6, LEASE, 0, 3, "", 3)[0], 2);
    assert_eq!(r.sum("k"), 6);
}

#[test]
#[ignore = "needs redis-server (set-up installs it): run by cargo xtask test"]
fn headroom_is_granted_only_while_the_budget_is_less_than_half_used() {
    let r = settled();
    // Needs 2, wants 3, limit 10: 3 (the budget is less than half used).
    assert_eq!(r.claim("k", "a.", 10, LEASE, 0, 3, "", 2)[0], 3);
    // B needs 2 and wants 3: 3 + 2 = 5 is half: no headroom.
    assert_eq!(r.claim("k", "b.", 10, LEASE, 0, 3, "", 2)[0], 2);
}

#[test]
#[ignore = "needs redis-server (set-up installs it): run by cargo xtask test"]
fn a_field_ends_with_its_lease_and_its_node_finds_it_lapsed() {
    let r = settled();
    assert_eq!(r.claim("k", "a.", 4, 300, 0, 4, "", 4)[0], 4);
    assert_eq!(r.claim("k", "b.", 4, 300, 0, 1, "", 1)[0], 0);
    std::thread::sleep(Duration::from_millis(400));
    // A's lease ended: B gets it all; A, with 2 still in use, re-takes them
    // and is told its share had lapsed.
    assert_eq!(r.claim("k", "b.", 4, 300, 0, 4, "", 4)[0], 4);
    let a = r.claim("k", "a.", 4, 300, 2, 2, "", 2);
    assert_eq!((a[0], a[2]), (2, 1));
    // The key goes when its last lease would.
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(r.cli(&["exists", "k"]).trim(), "0");
}

#[test]
#[ignore = "needs redis-server (set-up installs it): run by cargo xtask test"]
fn a_restarted_node_drops_its_previous_incarnations_field() {
    let r = settled();
    assert_eq!(r.claim("k", "n.old.", 4, LEASE, 4, 4, "", 4)[0], 4);
    // The same node, another incarnation, purging: the old field goes.
    assert_eq!(r.claim("k", "n.new.", 4, LEASE, 0, 4, "n.", 4)[0], 4);
    assert_eq!(r.sum("k"), 4);
    // Another node's fields stay.
    assert_eq!(r.claim("k", "m.x.", 4, LEASE, 0, 1, "m.", 1)[0], 0);
}

#[test]
#[ignore = "needs redis-server (set-up installs it): run by cargo xtask test"]
fn a_budget_a_young_redis_does_not_hold_grows_for_no_one_until_a_lease_after_it_started() {
    let r = Redis::start();
    // Redis started less than a lease (3 s) ago: a budget it does not hold
    // may be one it lost; what is in use is republished, nothing grows.
    let a = r.claim("k", "a.", 6, 3000, 2, 4, "", 4);
    assert_eq!((a[0], a[1]), (2, 1), "quiet: only what is in use");
    assert_eq!(r.claim("k", "b.", 6, 3000, 0, 2, "", 2)[0], 0);
    // A lease after it started, the budget grows again.
    r.older_than(4);
    assert_eq!(r.claim("k", "b.", 6, 3000, 0, 2, "", 2)[..2], [2, 0]);
}

#[test]
#[ignore = "needs redis-server (set-up installs it): run by cargo xtask test"]
fn random_claims_of_three_nodes_never_grant_past_the_limit() {
    let r = settled();
    let limit = 7u32;
    let mut in_use = [0u32; 3];
    // A linear congruential sequence: repeatable.
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = |m: u64| {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (x >> 33) % m
    };
    for step in 0..600 {
        let n = next(3) as usize;
        let node = ["a.", "b.", "c."][n];
        // Requests end now and then; the node never uses more than its share.
        if in_use[n] > 0 && next(2) == 0 {
            in_use[n] -= 1;
        }
        let wanted = in_use[n] + next(4) as u32;
        let needed = in_use[n] + (wanted - in_use[n]).min(next(3) as u32);
        let share = r.claim("k", node, limit, 60_000, in_use[n], wanted, "", needed)[0] as u32;
        assert!(share >= in_use[n], "step {step}: what is in use is held");
        // The node takes what its share allows.
        in_use[n] = in_use[n].max(share.min(needed));
        let total: u32 = in_use.iter().sum();
        assert!(total <= limit, "step {step}: {in_use:?} in use, limit {limit}");
        assert!(r.sum("k") <= u64::from(limit), "step {step}: shares {} past the limit", r.sum("k"));
    }
}
