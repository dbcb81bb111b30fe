//! What one seed runs: the fleet (nodes, limits, lease, policy), the
//! store's distance, the clients and how they spread over the nodes, and
//! the faults, at which times. Everything is drawn from the seed, within
//! the fault families asked for, so that a seed names a run.

use std::{fmt, time::Duration};

use crate::rng::Rng;

/// `fleet.onStoreDown`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    Share,
    Refuse,
    Local,
}

/// Where a client's requests go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Always this node.
    Sticky(usize),
    /// Each request to the next node.
    RoundRobin,
    /// Each request to a node drawn at random.
    Random,
    /// Every client of the fleet to the same node, which changes every
    /// period (load that moves between nodes).
    Alternating { period_us: u64 },
}

/// One client: a loop of requests, one at a time.
#[derive(Clone, Debug)]
pub struct Client {
    /// The session (`Authorization`), if any.
    pub session: Option<u32>,
    /// Whether it sends `X-Client-Id`.
    pub web: bool,
    pub route: Route,
    /// Each request's time at the upstream, drawn from `lo..=hi` (µs).
    pub duration_us: (u64, u64),
    /// Its pause between requests (µs).
    pub think_us: (u64, u64),
    /// Its pause after a refusal, besides (µs).
    pub after_refusal_us: u64,
    /// The chance that a request still waiting for a claim is reset (an
    /// HTTP/2 stream the client gives up on), and when.
    pub cancel: f64,
}

/// A fault, injected at a time of the run.
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// The node and the store cannot reach each other for a while; what
    /// was sent meanwhile arrives when it ends (`hold`, TCP retransmits)
    /// or never (the connection breaks).
    Partition { node: usize, for_us: u64, hold: bool },
    /// The node stops (`SIGSTOP`) for a while.
    Pause { node: usize, for_us: u64 },
    /// `kill -9`; the same daemon starts again after a while.
    Kill { node: usize, restart_after_us: u64 },
    /// Redis killed (connections refused meanwhile), then started again
    /// empty.
    StoreRestart { down_us: u64 },
    /// `FLUSHALL`.
    StoreFlush,
    /// The link to the replica cut for a while, then the primary lost and
    /// the replica promoted (missing what it did not receive).
    FailOver { lag_us: u64 },
    /// The store's wall clock steps (µs, either way).
    ClockStep { delta_us: i64 },
    /// The store stops answering (`SIGSTOP`) for a while.
    Freeze { for_us: u64 },
}

/// The fault families a run may draw from.
pub const FAMILIES: [&str; 12] = [
    "cancel",
    "partition",
    "pause",
    "kill",
    "restart",
    "flush",
    "failover",
    "clock",
    "identity",
    "freeze",
    "delay",
    "loss",
];

/// One run.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub seed: u64,
    pub nodes: usize,
    pub session_limit: u32,
    pub web_limit: u32,
    pub lease_ms: u64,
    pub timeout_ms: u64,
    pub policy: Policy,
    /// The store's one-way distance, and up to how much more (µs).
    pub one_way_us: u64,
    pub jitter_us: u64,
    /// The chance a message is held long (answered late: up to half a
    /// lease), and the chance it is lost (never answered).
    pub spike: f64,
    pub loss: f64,
    pub clients: Vec<Client>,
    pub faults: Vec<(u64, Fault)>,
    /// Nodes that share one identity (cloned machines, one host name).
    pub shared_identity: bool,
    /// How long clients send (µs); the run then drains.
    pub run_us: u64,
}

impl Scenario {
    /// The run of `seed`, with faults from `families` only.
    pub fn generate(seed: u64, families: &[&str]) -> Self {
        // The load from one sequence, the faults from another: the same
        // seed with other fault families runs the same load.
        let mut rng = Rng::new(seed);
        let mut fault_rng = rng.fork();
        let nodes = rng.range(2, 4) as usize;
        let lease_ms = *rng.pick(&[600, 1500, 3000]);
        let one_way_us = *rng.pick(&[50, 500, 2_500, 5_000, 7_500]);
        let timeout_ms = (one_way_us * 2 / 1000 + rng.range(10, 150)).min(lease_ms / 3);
        let policy = *rng.pick(&[Policy::Share, Policy::Share, Policy::Share, Policy::Refuse, Policy::Local]);
        let session_limit = rng.range(2, 8) as u32;
        let web_limit = if rng.chance(0.3) { rng.range(2, 10) as u32 } else { 0 };
        let lease_us = lease_ms * 1000;
        let run_us = rng.range(8, 20) * 1_000_000;
        let cancel_on = families.contains(&"cancel");
        let sessions = rng.range(1, 3) as u32;
        let mut clients = Vec::new();
        for s in 0..sessions {
            let route = match rng.range(0, 4) {
                0 => Route::Sticky(rng.range(0, nodes as u64 - 1) as usize),
                1 => Route::RoundRobin,
                2 => Route::Random,
                _ => Route::Alternating { period_us: rng.range(300, 4000) * 1000 },
            };
            let duration_us = match rng.range(0, 3) {
                0 => (1_000, 50_000),
                1 => (1_000, lease_us / 4),
                2 => (lease_us / 10, lease_us / 2),
                _ => (lease_us / 2, lease_us * 2),
            };
            let concurrency = rng.range(1, u64::from(session_limit) * 2);
            for _ in 0..concurrency {
                clients.push(Client {
                    session: Some(s),
                    web: web_limit > 0 && rng.chance(0.5),
                    route,
                    duration_us,
                    think_us: (0, rng.range(0, 50_000)),
                    after_refusal_us: 0,
                    cancel: if cancel_on { 0.3 } else { 0.0 },
                });
            }
        }
        if web_limit > 0 {
            for _ in 0..rng.range(1, u64::from(web_limit)) {
                clients.push(Client {
                    session: None,
                    web: true,
                    route: Route::Random,
                    duration_us: (1_000, lease_us / 4),
                    think_us: (0, 20_000),
                    after_refusal_us: 0,
                    cancel: if cancel_on { 0.3 } else { 0.0 },
                });
            }
        }
        let mut faults = Vec::new();
        let when = |rng: &mut Rng| rng.range(1_000_000, run_us.saturating_sub(1_000_000).max(1_000_001));
        let rng = &mut fault_rng;
        for family in families {
            let count = rng.range(1, 3);
            for _ in 0..count {
                let node = rng.range(0, nodes as u64 - 1) as usize;
                let fault = match *family {
                    "partition" => Fault::Partition {
                        node,
                        for_us: rng.range(lease_us / 4, lease_us * 3),
                        hold: rng.chance(0.5),
                    },
                    "pause" => Fault::Pause { node, for_us: rng.range(lease_us / 4, lease_us * 3) },
                    "kill" => Fault::Kill { node, restart_after_us: rng.range(10_000, lease_us * 2) },
                    "restart" => Fault::StoreRestart { down_us: rng.range(0, lease_us * 2) },
                    "flush" => Fault::StoreFlush,
                    "failover" => Fault::FailOver { lag_us: rng.range(0, lease_us) },
                    "clock" => {
                        let step = rng.range(lease_us / 2, 10_000_000) as i64;
                        Fault::ClockStep { delta_us: if rng.chance(0.5) { step } else { -step } }
                    }
                    "freeze" => Fault::Freeze { for_us: rng.range(50_000, lease_us * 2) },
                    _ => continue,
                };
                faults.push((when(rng), fault));
            }
        }
        faults.sort_by_key(|f| f.0);
        Self {
            seed,
            nodes,
            session_limit,
            web_limit,
            lease_ms,
            timeout_ms,
            policy,
            one_way_us,
            jitter_us: one_way_us / 2,
            spike: if families.contains(&"delay") { *fault_rng.pick(&[0.005, 0.02, 0.1]) } else { 0.0 },
            loss: if families.contains(&"loss") { *fault_rng.pick(&[0.002, 0.01, 0.05]) } else { 0.0 },
            clients,
            faults,
            shared_identity: families.contains(&"identity"),
            run_us,
        }
    }

    /// The load of the false-refusal measure (docs/fleet.md): a session
    /// limited to 6 over two nodes, six clients sending requests of 20-300
    /// ms one after another (20 ms apart after a refusal), all to one node
    /// that changes every `period` or each to a node at random; lease
    /// 1.5 s; the store `one_way_us` away; no fault.
    pub fn moving(seed: u64, one_way_us: u64, period: Option<Duration>) -> Self {
        let route = match period {
            Some(p) => Route::Alternating { period_us: p.as_micros() as u64 },
            None => Route::Random,
        };
        let client = Client {
            session: Some(0),
            web: false,
            route,
            duration_us: (20_000, 300_000),
            think_us: (0, 0),
            after_refusal_us: 20_000,
            cancel: 0.0,
        };
        Self {
            seed,
            nodes: 2,
            session_limit: 6,
            web_limit: 0,
            lease_ms: 1500,
            timeout_ms: 100,
            policy: Policy::Share,
            one_way_us,
            jitter_us: one_way_us / 5,
            spike: 0.0,
            loss: 0.0,
            clients: vec![client; 6],
            faults: Vec::new(),
            shared_identity: false,
            run_us: 12_000_000,
        }
    }

    pub fn lease_us(&self) -> u64 {
        self.lease_ms * 1000
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "seed {}: {} nodes{}, session limit {}, web limit {}, lease {} ms, timeout {} ms, onStoreDown {:?}, store {} µs away (+{}, {} late, {} lost), run {} s",
            self.seed,
            self.nodes,
            if self.shared_identity { " sharing one identity" } else { "" },
            self.session_limit,
            self.web_limit,
            self.lease_ms,
            self.timeout_ms,
            self.policy,
            self.one_way_us,
            self.jitter_us,
            self.spike,
            self.loss,
            self.run_us / 1_000_000
        )?;
        for c in &self.clients {
            writeln!(
                f,
                "  client: session {:?} web {} {:?}, {}-{} ms at the upstream, cancels {}",
                c.session,
                c.web,
                c.route,
                c.duration_us.0 / 1000,
                c.duration_us.1 / 1000,
                c.cancel
            )?;
        }
        for (at, fault) in &self.faults {
            writeln!(f, "  at {:.3} s: {fault:?}", *at as f64 / 1e6)?;
        }
        Ok(())
    }
}
