//! The world one seed runs in: virtual time, one queue of events, the
//! network between the nodes and the store (FIFO per connection, as TCP
//! is, delayed, cut by partitions), the store and its script, the nodes
//! (each a [`Node`] driving limiter's share logic), the clients, the
//! faults, and the checker that reads every step.

use std::{
    cmp::Reverse,
    collections::{BTreeMap, BinaryHeap},
    time::{Duration, Instant},
};

use crate::{
    check::{Budget, Checker, Violation},
    lua::Script,
    rng::Rng,
    scenario::{Fault, Route, Scenario},
    store::{Reply, Store},
};

/// What a node sends the store.
#[derive(Clone, Debug)]
pub enum Command {
    /// A new connection (the reply says it is made).
    Connect,
    /// The claim script.
    Eval { keys: Vec<String>, argv: Vec<String> },
    /// Any other command.
    Cmd(Vec<String>),
}

/// What a node asks of the world while it handles an event.
pub struct Io<'a> {
    pub now_us: u64,
    base: Instant,
    effects: &'a mut Vec<Effect>,
    tracing: bool,
}

#[derive(Debug)]
enum Effect {
    Send { id: u64, cmd: Command },
    Timer { after_us: u64, tag: u64 },
    Admit { req: u64 },
    Refuse { req: u64, reason: &'static str },
    Applied { budget: Budget, sent_us: u64 },
    ClaimOutcome { budget: Budget, answered: bool },
    Trace(String),
}

impl Io<'_> {
    /// The node's clock (its `Instant`s are this run's base plus virtual
    /// time).
    pub fn now(&self) -> Instant {
        self.base + Duration::from_micros(self.now_us)
    }

    /// An `Instant` of this run as virtual µs.
    pub fn us(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.base).as_micros() as u64
    }

    pub fn send(&mut self, id: u64, cmd: Command) {
        self.effects.push(Effect::Send { id, cmd });
    }

    pub fn timer(&mut self, after: Duration, tag: u64) {
        self.effects.push(Effect::Timer { after_us: after.as_micros() as u64, tag });
    }

    pub fn admit(&mut self, req: u64) {
        self.effects.push(Effect::Admit { req });
    }

    pub fn refuse(&mut self, req: u64, reason: &'static str) {
        self.effects.push(Effect::Refuse { req, reason });
    }

    /// The store's answer for `budget` to a claim sent at `sent` was
    /// applied: the node's share of it is renewed from then.
    pub fn applied(&mut self, budget: Budget, sent: Instant) {
        let sent_us = self.us(sent);
        self.effects.push(Effect::Applied { budget, sent_us });
    }

    /// A claim for `budget` ended: answered by the store, or not.
    pub fn claim_outcome(&mut self, budget: Budget, answered: bool) {
        self.effects.push(Effect::ClaimOutcome { budget, answered });
    }

    pub fn tracing(&self) -> bool {
        self.tracing
    }

    pub fn trace(&mut self, line: impl FnOnce() -> String) {
        if self.tracing {
            self.effects.push(Effect::Trace(line()));
        }
    }
}

/// A node of the fleet, as the world drives it.
pub trait Node {
    fn start(&mut self, io: &mut Io);
    /// A request arrives (its budgets: web, session).
    fn arrive(&mut self, io: &mut Io, req: u64, web: bool, session: Option<u32>);
    /// Its client reset it (an HTTP/2 stream) while it waited.
    fn cancel(&mut self, io: &mut Io, req: u64);
    /// The store published that another node wants budget `key`.
    fn wanted(&mut self, io: &mut Io, key: &str);
    /// The upstream is done with an admitted request.
    fn end(&mut self, io: &mut Io, req: u64);
    fn answer(&mut self, io: &mut Io, id: u64, reply: Result<Reply, String>);
    fn timer(&mut self, io: &mut Io, tag: u64);
    /// Whether it counts the store as up.
    fn store_up(&self) -> bool;
    /// Its field in the store's hashes.
    fn field(&self) -> String;
    /// What it still holds with nothing in flight (should be nothing).
    fn leaks(&self) -> Vec<String>;
}

/// Makes the node of `index`, incarnation `incarnation`, with identity
/// `identity`.
pub type MakeNode<'a> = dyn Fn(&Scenario, usize, u32, &str) -> Box<dyn Node> + 'a;

#[derive(Debug)]
enum Ev {
    ClientNext {
        client: usize,
    },
    Arrive {
        req: u64,
    },
    UpstreamEnd {
        req: u64,
    },
    Cancel {
        req: u64,
    },
    ToStore {
        node: usize,
        inc: u32,
        id: u64,
        cmd: Command,
        conn: Option<u64>,
    },
    ToNode {
        node: usize,
        inc: u32,
        id: u64,
        reply: Result<Reply, String>,
    },
    Timer {
        node: usize,
        inc: u32,
        tag: u64,
    },
    FaultStart {
        index: usize,
    },
    FaultEnd {
        index: usize,
    },
    Restart {
        node: usize,
    },
    /// The node gives back what a request held (the upstream is done).
    Release {
        node: usize,
        inc: u32,
        req: u64,
    },
    /// A client's reset reaches the node.
    Reset {
        node: usize,
        inc: u32,
        req: u64,
    },
    /// A published wanted budget reaches the node.
    Wanted {
        node: usize,
        inc: u32,
        key: String,
    },
    Replicate,
}

impl Ev {
    /// Events a paused node cannot take until it resumes.
    fn for_node(&self) -> Option<usize> {
        match self {
            Self::ToNode { node, .. }
            | Self::Timer { node, .. }
            | Self::Release { node, .. }
            | Self::Reset { node, .. }
            | Self::Wanted { node, .. } => Some(*node),
            _ => None,
        }
    }
}

struct Slot {
    node: Option<Box<dyn Node>>,
    incarnation: u32,
    paused: bool,
    /// Events that came while it was paused.
    deferred: Vec<Ev>,
    /// Cut from the store: `Some(hold)`.
    partition: Option<bool>,
    /// What was sent while cut, held for the end of the partition.
    held: Vec<Ev>,
    /// The store connection it has (the store's generation then).
    conn: Option<u64>,
    /// Latest delivery times each way (FIFO).
    last_to_store: u64,
    last_to_node: u64,
    /// Requests arrived while it was paused.
    waiting: Vec<u64>,
}

#[derive(Debug)]
struct Request {
    client: usize,
    node: usize,
    inc: u32,
    budgets: Vec<Budget>,
    duration_us: u64,
    /// Admitted, refused, cancelled or dropped: the client moved on.
    done: bool,
    /// Its client reset it while it waited.
    cancelled: bool,
    /// The node answered it (admitted or refused).
    decided: bool,
}

/// What one run saw.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    pub violations: Vec<Violation>,
    pub admitted: u64,
    pub refused: BTreeMap<&'static str, u64>,
    /// Refused by a fleet limit while the budget had fewer than its limit
    /// in flight.
    pub false_refusals: u64,
    pub requests: u64,
    pub claims: u64,
    pub trace: Vec<String>,
}

pub struct World<'a> {
    sc: &'a Scenario,
    now: u64,
    seq: u64,
    queue: BinaryHeap<Reverse<(u64, u64)>>,
    events: BTreeMap<u64, Ev>,
    rng: Rng,
    net: Rng,
    store: Store,
    /// The store's connections: bumped when they all break (a restart, a
    /// failover).
    store_gen: u64,
    frozen: Option<Vec<Ev>>,
    /// The Redis process is gone: connections are refused.
    dead: bool,
    script: Script,
    slots: Vec<Slot>,
    make: &'a MakeNode<'a>,
    identities: Vec<String>,
    requests: BTreeMap<u64, Request>,
    next_req: u64,
    rr: Vec<usize>,
    base: Instant,
    pub check: Checker,
    tracing: bool,
    trace: Vec<String>,
    outcome: Outcome,
    sending: bool,
    /// Kinds of violation that do not end the run (to look past them).
    ignore: Vec<String>,
}

impl<'a> World<'a> {
    pub fn new(
        sc: &'a Scenario,
        cover_us: u64,
        script: Script,
        make: &'a MakeNode<'a>,
        tracing: bool,
    ) -> Self {
        let mut rng = Rng::new(sc.seed.wrapping_mul(31).wrapping_add(7));
        let net = rng.fork();
        let identities = (0..sc.nodes)
            .map(|i| if sc.shared_identity { "host-a".to_owned() } else { format!("host-{i}") })
            .collect();
        Self {
            sc,
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            events: BTreeMap::new(),
            rng,
            net,
            store: Store::new(0),
            store_gen: 1,
            frozen: None,
            dead: false,
            script,
            slots: Vec::new(),
            make,
            identities,
            requests: BTreeMap::new(),
            next_req: 0,
            rr: vec![0; sc.clients.len()],
            base: Instant::now(),
            check: Checker::new(sc, cover_us),
            tracing,
            trace: Vec::new(),
            outcome: Outcome::default(),
            sending: true,
            ignore: Vec::new(),
        }
    }

    /// Goes on past violations of these kinds (counting nothing of them).
    pub fn ignoring(mut self, kinds: &[String]) -> Self {
        self.ignore = kinds.to_vec();
        self
    }

    fn at(&mut self, t: u64, ev: Ev) {
        self.seq += 1;
        self.queue.push(Reverse((t, self.seq)));
        self.events.insert(self.seq, ev);
    }

    fn note(&mut self, line: impl FnOnce() -> String) {
        if self.tracing {
            let l = line();
            self.trace.push(format!("{:>10.6} {l}", self.now as f64 / 1e6));
        }
    }

    /// Runs the scenario, its drain and the final checks.
    pub fn run(mut self) -> Outcome {
        for i in 0..self.sc.nodes {
            self.slots.push(Slot {
                node: None,
                incarnation: 0,
                paused: false,
                deferred: Vec::new(),
                partition: None,
                held: Vec::new(),
                conn: None,
                last_to_store: 0,
                last_to_node: 0,
                waiting: Vec::new(),
            });
            self.start_node(i);
        }
        for c in 0..self.sc.clients.len() {
            let t = self.rng.range(0, 200_000);
            self.at(t, Ev::ClientNext { client: c });
        }
        for i in 0..self.sc.faults.len() {
            self.at(self.sc.faults[i].0, Ev::FaultStart { index: i });
        }
        self.at(1_000, Ev::Replicate);
        let lease = self.sc.lease_us();
        let faults_end = self.sc.faults.iter().map(|(at, f)| at + fault_length(f, lease)).max().unwrap_or(0);
        let stop = self.sc.run_us;
        let end = stop.max(faults_end) + 6 * lease + 3_000_000;
        while let Some(Reverse((t, seq))) = self.queue.pop() {
            if t > end {
                break;
            }
            self.now = t;
            if self.sending && t >= stop {
                self.sending = false;
                self.note(|| "clients stop".into());
            }
            let ev = self.events.remove(&seq).expect("an event");
            self.check.age(self.now);
            self.step(ev);
            if let Some(v) = self.check.verify(self.now)
                && self.fail(v)
            {
                break;
            }
            if !self.outcome.violations.is_empty() {
                break;
            }
        }
        if self.outcome.violations.is_empty() {
            self.final_checks();
        }
        self.outcome.trace = std::mem::take(&mut self.trace);
        self.outcome
    }

    /// Records a violation: `true` unless its kind is ignored.
    fn fail(&mut self, v: Violation) -> bool {
        if self.ignore.iter().any(|k| k == v.kind()) {
            return false;
        }
        self.note(|| format!("VIOLATION: {v}"));
        self.outcome.violations.push(v);
        true
    }

    fn final_checks(&mut self) {
        for (i, slot) in self.slots.iter().enumerate() {
            let Some(node) = &slot.node else { continue };
            for leak in node.leaks() {
                self.outcome.violations.push(Violation::Leak { node: i, what: leak });
            }
            if !node.store_up() {
                self.outcome.violations.push(Violation::Leak {
                    node: i,
                    what: "still counts the store down after every fault ended".into(),
                });
            }
        }
        let ignore = self.ignore.clone();
        self.outcome.violations.retain(|v| !ignore.iter().any(|k| k == v.kind()));
        // What a live node left in a budget (a dead one's field waits for
        // a node that needs the budget to end it, or for the key's time to
        // live).
        // A failover that lost writes may bring back a share given back:
        // it counts until a node that needs the budget ends it.
        let failed_over = self.sc.faults.iter().any(|(_, f)| matches!(f, Fault::FailOver { .. }));
        let live: Vec<String> = if failed_over {
            Vec::new()
        } else {
            self.slots.iter().filter_map(|s| s.node.as_ref().map(|n| n.field())).collect()
        };
        let mut left = Vec::new();
        for key in self.store.keys_with("limiter:", self.now).into_iter().filter(|k| is_budget(k)) {
            for (field, value) in self.store.fields(&key, self.now) {
                // A field given back stays empty a while (its sequence
                // number makes an older claim stale).
                if live.contains(&field) && !value.starts_with("0 0 0 ") {
                    left.push(format!("{key} {field} = {value}"));
                }
            }
        }
        if !left.is_empty() {
            self.outcome.violations.push(Violation::Leak {
                node: usize::MAX,
                what: format!(
                    "fields of live nodes left in budgets with nothing in flight: {}",
                    left.join("; ")
                ),
            });
        }
        if let Some(v) = self.check.stuck(self.now) {
            self.outcome.violations.push(v);
        }
    }

    fn start_node(&mut self, i: usize) {
        let inc = self.slots[i].incarnation + 1;
        let node = (self.make)(self.sc, i, inc, &self.identities[i]);
        let slot = &mut self.slots[i];
        slot.incarnation = inc;
        slot.node = Some(node);
        slot.conn = None;
        slot.paused = false;
        self.note(|| format!("node {i}#{inc} starts"));
        self.dispatch(i, |n, io| n.start(io));
    }

    /// Runs `f` on node `i` (alive, not paused) and applies what it did.
    fn dispatch(&mut self, i: usize, f: impl FnOnce(&mut dyn Node, &mut Io)) {
        let mut effects = Vec::new();
        let Some(node) = self.slots[i].node.as_mut() else { return };
        {
            let mut io =
                Io { now_us: self.now, base: self.base, effects: &mut effects, tracing: self.tracing };
            f(node.as_mut(), &mut io);
        }
        let inc = self.slots[i].incarnation;
        for e in effects {
            match e {
                Effect::Send { id, cmd } => self.send(i, inc, id, cmd),
                Effect::Timer { after_us, tag } => {
                    self.at(self.now + after_us, Ev::Timer { node: i, inc, tag })
                }
                Effect::Admit { req } => self.admitted(req),
                Effect::Refuse { req, reason } => self.refused(req, reason),
                Effect::Applied { budget, sent_us } => self.check.applied(i, inc, budget, sent_us, self.now),
                Effect::ClaimOutcome { budget, answered } => {
                    self.check.claim_outcome(i, inc, budget, answered, self.now)
                }
                Effect::Trace(line) => self.note(|| format!("node {i}#{inc} {line}")),
            }
        }
    }

    /// A message's way to or from the store: `None` when it is lost.
    /// (Losses and late messages end with the clients, so that the run
    /// drains as every fault does.)
    fn one_way(&mut self) -> Option<u64> {
        if self.sending && self.sc.loss > 0.0 && self.net.chance(self.sc.loss) {
            return None;
        }
        let spike = if self.sending && self.sc.spike > 0.0 && self.net.chance(self.sc.spike) {
            self.net.range(1_000, self.sc.lease_us() / 2)
        } else {
            0
        };
        Some(self.sc.one_way_us + self.net.range(0, self.sc.jitter_us) + spike)
    }

    fn send(&mut self, i: usize, inc: u32, id: u64, cmd: Command) {
        let conn = self.slots[i].conn;
        if conn.is_none() && !matches!(cmd, Command::Connect) {
            let t = self.now;
            self.at(t, Ev::ToNode { node: i, inc, id, reply: Err("no connection to the store".into()) });
            return;
        }
        let Some(way) = self.one_way() else {
            self.note(|| format!("message {id} of node {i} lost"));
            return;
        };
        let t = self.now + way;
        let slot = &mut self.slots[i];
        let t = t.max(slot.last_to_store);
        slot.last_to_store = t;
        let ev = Ev::ToStore { node: i, inc, id, cmd, conn };
        match slot.partition {
            Some(true) => slot.held.push(ev),
            Some(false) => {}
            None => self.at(t, ev),
        }
    }

    fn reply(&mut self, i: usize, inc: u32, id: u64, reply: Result<Reply, String>) {
        let Some(way) = self.one_way() else {
            self.note(|| format!("answer {id} to node {i} lost"));
            return;
        };
        let t = self.now + way;
        let slot = &mut self.slots[i];
        let t = t.max(slot.last_to_node);
        slot.last_to_node = t;
        let ev = Ev::ToNode { node: i, inc, id, reply };
        match slot.partition {
            Some(true) => slot.held.push(ev),
            Some(false) => {}
            None => self.at(t, ev),
        }
    }

    fn step(&mut self, ev: Ev) {
        if let Some(i) = ev.for_node()
            && self.slots[i].paused
        {
            self.slots[i].deferred.push(ev);
            return;
        }
        match ev {
            Ev::ClientNext { client } => self.client_next(client),
            Ev::Arrive { req } => self.arrive(req),
            Ev::UpstreamEnd { req } => self.upstream_end(req),
            Ev::Cancel { req } => {
                let Some(r) = self.requests.get_mut(&req) else { return };
                if r.done {
                    return;
                }
                r.done = true;
                r.cancelled = true;
                let (node, inc, client) = (r.node, r.inc, r.client);
                self.note(|| format!("request {req} reset by its client"));
                self.check.ended_waiting(req);
                self.client_after(client);
                self.step(Ev::Reset { node, inc, req });
            }
            Ev::Reset { node, inc, req } => {
                if self.slots[node].incarnation == inc {
                    self.dispatch(node, |n, io| n.cancel(io, req));
                }
            }
            Ev::Wanted { node, inc, key } => {
                if self.slots[node].incarnation == inc {
                    self.dispatch(node, |n, io| n.wanted(io, &key));
                }
            }
            Ev::Release { node, inc, req } => {
                if self.slots[node].incarnation == inc {
                    self.dispatch(node, |n, io| n.end(io, req));
                }
            }
            Ev::ToStore { node, inc, id, cmd, conn } => {
                if let Some(queue) = &mut self.frozen {
                    queue.push(Ev::ToStore { node, inc, id, cmd, conn });
                    return;
                }
                self.at_store(node, inc, id, cmd, conn);
            }
            Ev::ToNode { node, inc, id, reply } => {
                if self.slots[node].incarnation != inc {
                    return;
                }
                if id & CONNECT_ID_FLAG != 0
                    && let Ok(Reply::Int(turn)) = &reply
                {
                    self.slots[node].conn = Some(*turn as u64);
                }
                self.dispatch(node, |n, io| n.answer(io, id, reply));
            }
            Ev::Timer { node, inc, tag } => {
                if self.slots[node].incarnation == inc {
                    self.dispatch(node, |n, io| n.timer(io, tag));
                }
            }
            Ev::FaultStart { index } => self.fault_start(index),
            Ev::FaultEnd { index } => self.fault_end(index),
            Ev::Restart { node } => self.start_node(node),
            Ev::Replicate => {
                self.store.replicate(self.now);
                if !self.queue.is_empty() {
                    self.at(self.now + 1_000, Ev::Replicate);
                }
            }
        }
    }

    fn at_store(&mut self, node: usize, inc: u32, id: u64, cmd: Command, conn: Option<u64>) {
        let reply = match cmd {
            Command::Connect if self.dead => Err("connection refused".to_owned()),
            Command::Connect => Ok(Reply::Int(self.store_gen as i64)),
            _ if self.dead => Err("connection reset by the store".to_owned()),
            _ if conn != Some(self.store_gen) => Err("connection reset by the store".to_owned()),
            Command::Eval { keys, argv } => {
                self.outcome.claims += 1;
                let r = self.script.eval(&mut self.store, self.now, &keys, &argv);
                self.note(|| format!("store runs claim {keys:?} {argv:?} -> {r:?}"));
                // Every node subscribed hears what the script published.
                for (_, key) in std::mem::take(&mut self.store.published) {
                    for i in 0..self.slots.len() {
                        let (Some(way), None) = (self.one_way(), self.slots[i].partition) else { continue };
                        if self.slots[i].node.is_some() {
                            let inc = self.slots[i].incarnation;
                            self.at(self.now + way, Ev::Wanted { node: i, inc, key: key.clone() });
                        }
                    }
                }
                match r {
                    Reply::Error(e) => Err(e),
                    r => Ok(r),
                }
            }
            Command::Cmd(args) => match self.store.command(self.now, &args) {
                Reply::Error(e) => Err(e),
                r => Ok(r),
            },
        };
        self.reply(node, inc, id, reply);
    }

    fn client_next(&mut self, client: usize) {
        if !self.sending {
            return;
        }
        let c = &self.sc.clients[client];
        let node = match c.route {
            Route::Sticky(n) => n,
            Route::RoundRobin => {
                self.rr[client] = (self.rr[client] + 1) % self.sc.nodes;
                self.rr[client]
            }
            Route::Random => self.rng.range(0, self.sc.nodes as u64 - 1) as usize,
            Route::Alternating { period_us } => ((self.now / period_us) % self.sc.nodes as u64) as usize,
        };
        let mut budgets = Vec::new();
        if c.web && self.sc.web_limit > 0 {
            budgets.push(Budget::Web);
        }
        if let Some(s) = c.session {
            budgets.push(Budget::Session(s));
        }
        let duration_us = self.rng.range(c.duration_us.0, c.duration_us.1);
        let cancel = c.cancel > 0.0 && self.rng.chance(c.cancel);
        let cancel_after = self.rng.range(1_000, self.sc.timeout_ms * 3000);
        let req = self.next_req;
        self.next_req += 1;
        self.outcome.requests += 1;
        self.requests.insert(
            req,
            Request {
                client,
                node,
                inc: self.slots[node].incarnation,
                budgets,
                duration_us,
                done: false,
                cancelled: false,
                decided: false,
            },
        );
        self.at(self.now, Ev::Arrive { req });
        if cancel {
            self.at(self.now + cancel_after, Ev::Cancel { req });
        }
    }

    fn client_after(&mut self, client: usize) {
        let (lo, hi) = self.sc.clients[client].think_us;
        let t = self.now + self.rng.range(lo, hi);
        self.at(t, Ev::ClientNext { client });
    }

    fn client_after_refusal(&mut self, client: usize) {
        let (lo, hi) = self.sc.clients[client].think_us;
        let t = self.now + self.rng.range(lo, hi) + self.sc.clients[client].after_refusal_us;
        self.at(t, Ev::ClientNext { client });
    }

    fn arrive(&mut self, req: u64) {
        let Some(r) = self.requests.get_mut(&req) else { return };
        if r.done {
            return;
        }
        let node = r.node;
        let slot = &mut self.slots[node];
        if slot.node.is_none() {
            // Nobody listens: the client's connection is refused.
            r.done = true;
            let client = r.client;
            self.client_after(client);
            return;
        }
        if slot.paused {
            slot.waiting.push(req);
            return;
        }
        r.inc = slot.incarnation;
        let web = r.budgets.contains(&Budget::Web);
        let session = r.budgets.iter().find_map(|b| match b {
            Budget::Session(s) => Some(*s),
            Budget::Web => None,
        });
        let budgets = r.budgets.clone();
        self.check.waiting(req, self.now, &budgets);
        self.note(|| format!("request {req} arrives at node {node}: web {web}, session {session:?}"));
        self.dispatch(node, |n, io| n.arrive(io, req, web, session));
    }

    fn admitted(&mut self, req: u64) {
        let Some(r) = self.requests.get_mut(&req) else { return };
        // Admitted before its reset reached the node (a node paused in
        // between): it goes upstream all the same, its client gone.
        if r.decided || (r.done && !r.cancelled) {
            return;
        }
        r.decided = true;
        r.done = true;
        let (node, inc, budgets, duration) = (r.node, r.inc, r.budgets.clone(), r.duration_us);
        self.outcome.admitted += 1;
        self.note(|| format!("request {req} admitted at node {node}#{inc} for {} ms", duration / 1000));
        self.check.ended_waiting(req);
        let lifted = self.slots[node].node.as_ref().is_some_and(|n| !n.store_up());
        self.check.admit(req, node, inc, &budgets, self.now, lifted);
        self.at(self.now + duration, Ev::UpstreamEnd { req });
    }

    fn refused(&mut self, req: u64, reason: &'static str) {
        let Some(r) = self.requests.get_mut(&req) else { return };
        if r.decided || (r.done && !r.cancelled) {
            return;
        }
        r.decided = true;
        if r.cancelled {
            return;
        }
        r.done = true;
        let (node, inc, client, budgets) = (r.node, r.inc, r.client, r.budgets.clone());
        *self.outcome.refused.entry(reason).or_insert(0) += 1;
        let arrived = self.check.arrived(req).unwrap_or(self.now);
        self.check.ended_waiting(req);
        let room = self.check.room(&budgets);
        if room && (reason == "fleet_session" || reason == "fleet_web") {
            self.outcome.false_refusals += 1;
        }
        self.note(|| {
            format!("request {req} refused at node {node}#{inc}: {reason} (room in the fleet: {room})")
        });
        if let Some(v) = self.check.refusal(node, inc, &budgets, reason, arrived) {
            self.fail(v);
        }
        if let Some(v) = self.check.starved(node, inc, &budgets, reason, self.now) {
            self.fail(v);
        }
        self.client_after_refusal(client);
    }

    fn upstream_end(&mut self, req: u64) {
        let Some(r) = self.requests.get(&req) else { return };
        let (node, inc, client, cancelled) = (r.node, r.inc, r.client, r.cancelled);
        self.check.end(req);
        self.note(|| format!("request {req} done at the upstream"));
        if !cancelled {
            self.client_after(client);
        }
        self.requests.remove(&req);
        self.step(Ev::Release { node, inc, req });
    }

    fn fault_start(&mut self, index: usize) {
        let (_, fault) = self.sc.faults[index].clone();
        self.note(|| format!("FAULT {fault:?}"));
        let lease = self.sc.lease_us();
        match fault {
            Fault::Partition { node, hold, .. } => self.slots[node].partition = Some(hold),
            Fault::Pause { node, .. } => self.slots[node].paused = true,
            Fault::Kill { node, .. } if self.slots[node].node.is_none() => return,
            Fault::Kill { node, restart_after_us } => {
                self.slots[node].node = None;
                self.slots[node].conn = None;
                self.slots[node].deferred.clear();
                self.slots[node].held.clear();
                let waiting: Vec<u64> = self
                    .requests
                    .iter()
                    .filter(|(_, r)| r.node == node && !r.done)
                    .map(|(k, _)| *k)
                    .collect();
                for req in waiting {
                    let r = self.requests.get_mut(&req).expect("a request");
                    r.done = true;
                    let client = r.client;
                    self.check.ended_waiting(req);
                    self.client_after(client);
                }
                self.slots[node].waiting.clear();
                self.at(self.now + restart_after_us, Ev::Restart { node });
            }
            Fault::StoreRestart { .. } => {
                self.store.restart(self.now);
                self.store_gen += 1;
                self.dead = true;
            }
            Fault::StoreFlush => self.store.flush(self.now),
            Fault::FailOver { .. } => self.store.replication_delay_us = None,
            Fault::ClockStep { delta_us } => self.store.skew_us += delta_us,
            Fault::Freeze { .. } => self.frozen = Some(self.frozen.take().unwrap_or_default()),
        }
        let length = fault_length(&self.sc.faults[index].1, lease);
        self.at(self.now + length, Ev::FaultEnd { index });
    }

    fn fault_end(&mut self, index: usize) {
        let (_, fault) = self.sc.faults[index].clone();
        match fault {
            Fault::Partition { node, hold, .. } => {
                let slot = &mut self.slots[node];
                slot.partition = None;
                let held = std::mem::take(&mut slot.held);
                if !hold {
                    slot.conn = None;
                }
                self.note(|| {
                    format!("partition of node {node} ends ({} messages delivered late)", held.len())
                });
                for ev in held {
                    let t = self.now + self.sc.one_way_us;
                    self.at(t, ev);
                }
            }
            Fault::Pause { node, .. } => {
                let slot = &mut self.slots[node];
                slot.paused = false;
                let deferred = std::mem::take(&mut slot.deferred);
                let waiting = std::mem::take(&mut slot.waiting);
                self.note(|| format!("node {node} resumes"));
                for ev in deferred {
                    self.at(self.now, ev);
                }
                for req in waiting {
                    self.at(self.now, Ev::Arrive { req });
                }
            }
            Fault::StoreRestart { .. } => {
                self.store.restart(self.now);
                self.dead = false;
                self.note(|| "the store is started again, empty".into());
            }
            Fault::FailOver { .. } => {
                let lost = self.store.replica_behind();
                self.store.fail_over(self.now);
                self.store_gen += 1;
                self.note(|| format!("the replica is promoted; {lost} writes lost"));
            }
            Fault::Freeze { .. } => {
                let queued = self.frozen.take().unwrap_or_default();
                self.note(|| format!("the store answers again ({} commands queued)", queued.len()));
                for ev in queued {
                    self.step(ev);
                }
            }
            _ => {}
        }
    }
}

/// Ids of connection attempts carry this bit, so the world knows which
/// answers make a connection.
pub const CONNECT_ID_FLAG: u64 = 1 << 62;

fn is_budget(key: &str) -> bool {
    !key.contains("fingerprint") && !key.ends_with(":epoch") && !key.contains(":nodes")
}

/// How long a fault lasts (µs).
fn fault_length(f: &Fault, lease: u64) -> u64 {
    match f {
        Fault::Partition { for_us, .. } | Fault::Pause { for_us, .. } | Fault::Freeze { for_us } => *for_us,
        Fault::Kill { restart_after_us, .. } => *restart_after_us,
        Fault::StoreRestart { down_us } => *down_us,
        Fault::FailOver { lag_us } => *lag_us,
        _ => lease / 10,
    }
}
