//! A node of the fleet as it was before the simulation: its share logic
//! ([`super::shares`], [`super::health`]) driven the way its async shell
//! (`fleet/permits.rs`, `fleet/tasks.rs` of that revision) drove them,
//! step for step: a request's takes joined, each waiting for the claim
//! out up to `fleet.timeoutMs` per round, a claim sent on a task of its
//! own with a third of the lease to answer, a renewal round every third
//! of the lease, the probe's back-off, the first lease and a third's
//! purge of the node's other incarnations; and, as that shell did, a
//! request dropped while it waits calls nothing.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::{Duration, Instant},
};

use limiter::config::OnStoreDown;

use super::{
    health::Health,
    shares::{Answer, Budgets, Kind, Take},
};

use crate::{
    check::Budget,
    rng::Rng,
    scenario::{Policy, Scenario},
    store::Reply,
    world::{CONNECT_ID_FLAG, Command, Io, Node},
};

const FIRST_CONNECT: Duration = Duration::from_secs(2);
const PROBE_FIRST: Duration = Duration::from_millis(100);
const PROBE_MAX: Duration = Duration::from_secs(1);
const CONNECT: Duration = Duration::from_secs(1);
const PROBED_KEYS: usize = 16;

#[derive(Debug)]
enum Msg {
    FirstConnect,
    FirstPing,
    Growth { key: Arc<str>, sent: Instant },
    Renewal { key: Arc<str>, sent: Instant, lapsed: bool },
    ProbeConnect,
    ProbePing,
    ProbeKey,
}

#[derive(Debug, Clone, Copy)]
enum Timer {
    Deadline { req: u64, take: usize, turn: u64 },
    Wake { req: u64, take: usize, turn: u64 },
    ClaimTimeout { id: u64 },
    RenewalDue { turn: u64 },
    Backoff { turn: u64 },
    ProbeWait { turn: u64 },
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum St {
    Run,
    Wait { turn: u64 },
    Ok,
    Err(&'static str),
}

#[derive(Debug)]
struct TakeSt {
    key: Arc<str>,
    kind: Kind,
    round: u32,
    st: St,
}

/// The renewal task's state.
#[derive(Debug, PartialEq)]
enum Loop {
    /// Waiting for the next round (or a notification).
    Sleep,
    /// A round out: claims not answered yet, whether one failed, and
    /// whether the probe sent it.
    Renew {
        outstanding: usize,
        failed: bool,
        probing: bool,
    },
    Backoff,
    ProbeConnect,
    ProbePing,
    ProbeKeys {
        outstanding: usize,
        ok: bool,
    },
}

pub struct Before {
    limits: (u32, u32),
    lease: Duration,
    timeout: Duration,
    policy: OnStoreDown,
    prefix: String,
    me: String,
    started: Instant,
    budgets: Budgets,
    health: Health,
    up: bool,
    ready: bool,
    queued: Vec<(u64, bool, Option<u32>)>,
    rng: Rng,
    next: u64,
    msgs: HashMap<u64, Msg>,
    timers: HashMap<u64, Timer>,
    waiters: BTreeMap<Arc<str>, Vec<(u64, usize)>>,
    acq: BTreeMap<u64, Vec<TakeSt>>,
    held: BTreeMap<u64, Vec<Arc<str>>>,
    /// The renewal task.
    state: Loop,
    loop_gen: u64,
    due: Instant,
    backoff: Duration,
    notified: bool,
}

fn key_of(b: Budget) -> (Arc<str>, Kind) {
    match b {
        Budget::Web => ("limiter:{sim:web}".into(), Kind::Web),
        Budget::Session(s) => (format!("limiter:{{sim:s:{s:032x}}}").into(), Kind::Session),
    }
}

fn budget_of(key: &str) -> Budget {
    match key.strip_prefix("limiter:{sim:s:") {
        Some(hex) => Budget::Session(u32::from_str_radix(hex.trim_end_matches('}'), 16).unwrap_or(0)),
        None => Budget::Web,
    }
}

impl Before {
    pub fn new(sc: &Scenario, index: usize, incarnation: u32, identity: &str) -> Self {
        let mut rng = Rng::new(sc.seed ^ ((index as u64) << 32) ^ u64::from(incarnation));
        let policy = match sc.policy {
            Policy::Share => OnStoreDown::Share,
            Policy::Refuse => OnStoreDown::Refuse,
            Policy::Local => OnStoreDown::Local,
        };
        let prefix = format!("{identity}.");
        Self {
            limits: (sc.session_limit, sc.web_limit),
            lease: Duration::from_millis(sc.lease_ms),
            timeout: Duration::from_millis(sc.timeout_ms),
            policy,
            me: format!("{prefix}{:08x}.", rng.next_u64() as u32),
            prefix,
            started: Instant::now(),
            budgets: Budgets::default(),
            health: Health::default(),
            up: true,
            ready: false,
            queued: Vec::new(),
            rng,
            next: 0,
            msgs: HashMap::new(),
            timers: HashMap::new(),
            waiters: BTreeMap::new(),
            acq: BTreeMap::new(),
            held: BTreeMap::new(),
            state: Loop::Sleep,
            loop_gen: 0,
            due: Instant::now(),
            backoff: PROBE_FIRST,
            notified: false,
        }
    }

    fn limit(&self, kind: Kind) -> u32 {
        match kind {
            Kind::Session => self.limits.0,
            Kind::Web => self.limits.1,
        }
    }

    fn id(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    fn timer(&mut self, io: &mut Io, after: Duration, t: Timer) -> u64 {
        let tag = self.id();
        self.timers.insert(tag, t);
        io.timer(after, tag);
        tag
    }

    fn send(&mut self, io: &mut Io, msg: Msg, cmd: Command) -> u64 {
        let mut id = self.id();
        if matches!(cmd, Command::Connect) {
            id |= CONNECT_ID_FLAG;
        }
        self.msgs.insert(id, msg);
        io.send(id, cmd);
        id
    }

    fn went_down(&mut self, io: &mut Io, why: &str) {
        if self.up {
            self.up = false;
            io.trace(|| format!("store down: {why}"));
            self.notified = true;
            if self.state == Loop::Sleep {
                self.loop_wake(io);
            }
        }
    }

    // ---- the request's path (permits.rs) ----

    fn step_take(&mut self, io: &mut Io, req: u64, i: usize) {
        let now = io.now();
        let down = (!self.up).then_some(self.policy);
        let Some(takes) = self.acq.get_mut(&req) else { return };
        let t = &mut takes[i];
        let (key, kind, round) = (t.key.clone(), t.kind, t.round);
        let limit = match kind {
            Kind::Session => self.limits.0,
            Kind::Web => self.limits.1,
        };
        match self.budgets.take(&key, kind, limit, now, down, round) {
            Take::Taken { .. } => t.st = St::Ok,
            Take::Refused { store_down } => {
                t.st = St::Err(if store_down { "fleet_down" } else { refusal(kind) });
            }
            Take::Wait(_) => self.wait_on(io, req, i, &key),
            Take::Claim { needed, wanted, in_use, .. } => {
                let argv = vec![
                    self.me.clone(),
                    limit.to_string(),
                    self.lease.as_millis().to_string(),
                    in_use.to_string(),
                    wanted.to_string(),
                    if self.purging(now) { self.prefix.clone() } else { String::new() },
                    needed.to_string(),
                ];
                io.trace(|| format!("claims {key} (needed {needed}, wanted {wanted}, in use {in_use})"));
                let id = self.send(
                    io,
                    Msg::Growth { key: key.clone(), sent: now },
                    Command::Eval { keys: vec![key.to_string()], argv },
                );
                self.timer(io, self.lease / 3, Timer::ClaimTimeout { id });
                self.wait_on(io, req, i, &key);
            }
        }
        self.finish_if_done(io, req);
    }

    fn wait_on(&mut self, io: &mut Io, req: u64, i: usize, key: &Arc<str>) {
        let turn = self.id();
        self.acq.get_mut(&req).expect("a request")[i].st = St::Wait { turn };
        self.waiters.entry(key.clone()).or_default().push((req, i));
        self.timer(io, self.timeout, Timer::Deadline { req, take: i, turn });
    }

    /// The claim out for `key` ended: its waiters wake (each a moment
    /// later, in order, as tasks woken by one send are).
    fn wake(&mut self, io: &mut Io, key: &Arc<str>) {
        for (req, take) in self.waiters.remove(key).unwrap_or_default() {
            let Some(St::Wait { turn }) = self.acq.get(&req).map(|t| t[take].st) else { continue };
            let after = Duration::from_micros(self.rng.range(0, 50));
            self.timer(io, after, Timer::Wake { req, take, turn });
        }
    }

    fn finish_if_done(&mut self, io: &mut Io, req: u64) {
        let Some(takes) = self.acq.get(&req) else { return };
        if takes.iter().any(|t| matches!(t.st, St::Run | St::Wait { .. })) {
            return;
        }
        let takes = self.acq.remove(&req).expect("a request");
        let refusal = takes.iter().find_map(|t| match t.st {
            St::Err(r) => Some(r),
            _ => None,
        });
        let ok: Vec<Arc<str>> = takes.iter().filter(|t| t.st == St::Ok).map(|t| t.key.clone()).collect();
        match refusal {
            Some(r) => {
                for k in &ok {
                    self.budgets.give_back(k);
                }
                io.refuse(req, r);
            }
            None => {
                self.held.insert(req, ok);
                io.admit(req);
            }
        }
    }

    fn purging(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.started) < self.lease + self.lease / 3
    }

    // ---- claims (permits.rs, tasks.rs) ----

    fn claim_answered(&mut self, io: &mut Io, msg: Msg, reply: Result<Reply, String>) {
        let now = io.now();
        let answer =
            reply.and_then(|r| parse(&r).ok_or_else(|| format!("an answer of five numbers, not {r:?}")));
        match msg {
            Msg::Growth { key, sent } => {
                let budget = budget_of(&key);
                let took = now.saturating_duration_since(sent);
                match answer {
                    Ok(a) => {
                        self.budgets.claimed(&key, sent, self.lease, a, true, now);
                        io.applied(budget, sent);
                        io.claim_outcome(budget, true);
                        if self.health.record(took <= self.timeout, now) {
                            self.went_down(io, "claims answered late");
                        }
                    }
                    Err(e) => {
                        self.budgets.claim_failed(&key, now);
                        io.claim_outcome(budget, false);
                        if self.health.record(false, now) {
                            self.went_down(io, &e);
                        }
                    }
                }
                self.wake(io, &key);
            }
            Msg::Renewal { key, sent, lapsed } => {
                let budget = budget_of(&key);
                let ok = match answer {
                    Ok(a) => {
                        let a = Answer { lapsed: a.lapsed || lapsed, ..a };
                        self.budgets.claimed(&key, sent, self.lease, a, false, now);
                        io.applied(budget, sent);
                        io.claim_outcome(budget, true);
                        true
                    }
                    Err(_) => {
                        self.budgets.claim_failed(&key, now);
                        io.claim_outcome(budget, false);
                        false
                    }
                };
                self.wake(io, &key);
                if let Loop::Renew { outstanding, failed, probing } = &mut self.state {
                    *outstanding -= 1;
                    *failed |= !ok;
                    if *outstanding == 0 {
                        let (failed, probing) = (*failed, *probing);
                        self.round_done(io, !failed, probing);
                    }
                }
            }
            _ => {}
        }
    }

    /// `renew_all`: `false` at once without a connection; else the round
    /// goes out.
    fn renew_all(&mut self, io: &mut Io, probing: bool) {
        let now = io.now();
        let mut renewals = self.budgets.renewals(now);
        renewals.sort_by(|a, b| a.key.cmp(&b.key));
        if renewals.is_empty() {
            self.round_done(io, true, probing);
            return;
        }
        self.state = Loop::Renew { outstanding: renewals.len(), failed: false, probing };
        for r in renewals {
            let limit = self.limit(r.kind);
            let argv = vec![
                self.me.clone(),
                limit.to_string(),
                self.lease.as_millis().to_string(),
                r.in_use.to_string(),
                r.wanted.to_string(),
                if self.purging(now) { self.prefix.clone() } else { String::new() },
                r.wanted.to_string(),
            ];
            io.trace(|| format!("renews {} (wanted {}, in use {})", r.key, r.wanted, r.in_use));
            let id = self.send(
                io,
                Msg::Renewal { key: r.key.clone(), sent: now, lapsed: r.lapsed },
                Command::Eval { keys: vec![r.key.to_string()], argv },
            );
            self.timer(io, self.lease / 3, Timer::ClaimTimeout { id });
        }
    }

    fn round_done(&mut self, io: &mut Io, ok: bool, probing: bool) {
        let now = io.now();
        if !ok && !probing {
            self.went_down(io, "renewing failed");
        }
        if probing {
            if ok {
                self.health.reset(now);
                self.up = true;
                io.trace(|| "store up again; shares republished".into());
                self.due = now + self.lease / 3;
                self.backoff = PROBE_FIRST;
            } else {
                self.backoff = (self.backoff * 2).min(PROBE_MAX);
            }
        }
        self.state = Loop::Sleep;
        self.loop_wake(io);
    }

    /// The task's loop head: sleep until the round is due (up), or back
    /// off and probe (down).
    fn loop_wake(&mut self, io: &mut Io) {
        self.loop_gen += 1;
        let turn = self.loop_gen;
        let now = io.now();
        if self.up {
            if self.notified {
                self.notified = false;
                // A notification stored while it worked: it loops again.
            }
            self.state = Loop::Sleep;
            let after = self.due.saturating_duration_since(now);
            self.timer(io, after, Timer::RenewalDue { turn });
        } else {
            self.notified = false;
            self.state = Loop::Backoff;
            self.timer(io, self.backoff, Timer::Backoff { turn });
        }
    }

    fn probe_keys(&mut self, io: &mut Io) {
        let mut keys: Vec<Arc<str>> = self.budgets.map.keys().cloned().collect();
        keys.sort();
        keys.truncate(PROBED_KEYS);
        let wait = self.timeout.max(PROBE_FIRST / 2);
        self.loop_gen += 1;
        let turn = self.loop_gen;
        if keys.is_empty() {
            self.send(io, Msg::ProbePing, Command::Cmd(vec!["PING".into()]));
            self.state = Loop::ProbeKeys { outstanding: 1, ok: true };
        } else {
            self.state = Loop::ProbeKeys { outstanding: keys.len(), ok: true };
            for k in keys {
                self.send(io, Msg::ProbeKey, Command::Cmd(vec!["PTTL".into(), k.to_string()]));
            }
        }
        self.timer(io, wait, Timer::ProbeWait { turn });
    }

    fn probe_failed(&mut self, io: &mut Io) {
        self.backoff = (self.backoff * 2).min(PROBE_MAX);
        self.state = Loop::Sleep;
        self.loop_wake(io);
    }
}

fn refusal(kind: Kind) -> &'static str {
    match kind {
        Kind::Session => "fleet_session",
        Kind::Web => "fleet_web",
    }
}

fn parse(r: &Reply) -> Option<Answer> {
    let Reply::Array(v) = r else { return None };
    let n: Vec<u32> = v.iter().map(|x| x.int().map(|n| n as u32)).collect::<Option<_>>()?;
    (n.len() == 5).then(|| Answer {
        share: n[0],
        quiet: n[1] == 1,
        lapsed: n[2] == 1,
        others: n[3],
        others_demand: n[4],
    })
}

impl Node for Before {
    fn start(&mut self, io: &mut Io) {
        self.started = io.now();
        self.budgets = Budgets::default();
        self.health.reset(io.now());
        let id = self.send(io, Msg::FirstConnect, Command::Connect);
        self.timer(io, FIRST_CONNECT, Timer::ClaimTimeout { id });
    }

    fn arrive(&mut self, io: &mut Io, req: u64, web: bool, session: Option<u32>) {
        if !self.ready {
            self.queued.push((req, web, session));
            return;
        }
        let mut takes = Vec::new();
        if web && self.limits.1 > 0 {
            let (key, kind) = key_of(Budget::Web);
            takes.push(TakeSt { key, kind, round: 0, st: St::Run });
        }
        if let Some(s) = session
            && self.limits.0 > 0
        {
            let (key, kind) = key_of(Budget::Session(s));
            takes.push(TakeSt { key, kind, round: 0, st: St::Run });
        }
        if takes.is_empty() {
            self.held.insert(req, Vec::new());
            io.admit(req);
            return;
        }
        let n = takes.len();
        self.acq.insert(req, takes);
        for i in 0..n {
            self.step_take(io, req, i);
        }
    }

    fn wanted(&mut self, _io: &mut Io, _key: &str) {}

    fn cancel(&mut self, _io: &mut Io, req: u64) {
        // The acquire future is dropped: its waits call nothing, the unit
        // it had taken of one budget is never given back.
        self.acq.remove(&req);
        for w in self.waiters.values_mut() {
            w.retain(|(r, _)| *r != req);
        }
    }

    fn end(&mut self, _io: &mut Io, req: u64) {
        for k in self.held.remove(&req).unwrap_or_default() {
            self.budgets.give_back(&k);
        }
    }

    fn answer(&mut self, io: &mut Io, id: u64, reply: Result<Reply, String>) {
        let Some(msg) = self.msgs.remove(&id) else { return };
        match msg {
            Msg::FirstConnect => match reply {
                Ok(_) => {
                    self.send(io, Msg::FirstPing, Command::Cmd(vec!["PING".into()]));
                }
                Err(e) => {
                    self.went_down(io, &e);
                    self.became_ready(io);
                }
            },
            Msg::FirstPing => {
                if let Err(e) = reply {
                    self.went_down(io, &e);
                }
                self.became_ready(io);
            }
            Msg::ProbeConnect => {
                if self.state != Loop::ProbeConnect {
                    return;
                }
                match reply {
                    Ok(_) => {
                        // The hash key's fingerprint: one round trip.
                        self.state = Loop::ProbePing;
                        self.send(io, Msg::ProbePing, Command::Cmd(vec!["PING".into()]));
                    }
                    Err(_) => self.probe_failed(io),
                }
            }
            Msg::ProbePing if self.state == Loop::ProbePing => match reply {
                Ok(_) => self.probe_keys(io),
                Err(_) => self.probe_failed(io),
            },
            Msg::ProbePing | Msg::ProbeKey => {
                if let Loop::ProbeKeys { outstanding, ok } = &mut self.state {
                    *outstanding -= 1;
                    *ok &= reply.is_ok();
                    if *outstanding == 0 {
                        if *ok {
                            self.renew_all(io, true);
                        } else {
                            self.probe_failed(io);
                        }
                    }
                }
            }
            msg => self.claim_answered(io, msg, reply),
        }
    }

    fn timer(&mut self, io: &mut Io, tag: u64) {
        let Some(t) = self.timers.remove(&tag) else { return };
        match t {
            Timer::Deadline { req, take, turn } => {
                let Some(takes) = self.acq.get_mut(&req) else { return };
                if takes[take].st != (St::Wait { turn }) {
                    return;
                }
                let key = takes[take].key.clone();
                takes[take].st = St::Err("fleet_down");
                self.budgets.waited(&key);
                if let Some(w) = self.waiters.get_mut(&key) {
                    w.retain(|x| *x != (req, take));
                }
                self.finish_if_done(io, req);
            }
            Timer::Wake { req, take, turn } => {
                let Some(takes) = self.acq.get_mut(&req) else { return };
                if takes[take].st != (St::Wait { turn }) {
                    return;
                }
                let key = takes[take].key.clone();
                takes[take].st = St::Run;
                takes[take].round += 1;
                self.budgets.waited(&key);
                self.step_take(io, req, take);
            }
            Timer::ClaimTimeout { id } => {
                if let Some(msg) = self.msgs.remove(&id) {
                    match msg {
                        Msg::FirstConnect => {
                            self.went_down(io, "no connection within 2 s");
                            self.became_ready(io);
                        }
                        msg => {
                            self.claim_answered(io, msg, Err("no answer within a third of the lease".into()))
                        }
                    }
                }
            }
            Timer::RenewalDue { turn } => {
                if turn != self.loop_gen || self.state != Loop::Sleep {
                    return;
                }
                let now = io.now();
                if !self.up {
                    self.loop_wake(io);
                    return;
                }
                self.due += self.lease / 3;
                if self.due < now {
                    self.due = now + self.lease / 3;
                }
                self.renew_all(io, false);
            }
            Timer::Backoff { turn } => {
                if turn != self.loop_gen || self.state != Loop::Backoff {
                    return;
                }
                self.state = Loop::ProbeConnect;
                self.send(io, Msg::ProbeConnect, Command::Connect);
                let turn = self.loop_gen;
                self.timer(io, CONNECT, Timer::ProbeWait { turn });
            }
            Timer::ProbeWait { turn } => {
                if turn != self.loop_gen {
                    return;
                }
                match self.state {
                    Loop::ProbeConnect | Loop::ProbePing => self.probe_failed(io),
                    Loop::ProbeKeys { .. } => self.probe_failed(io),
                    _ => {}
                }
            }
        }
    }

    fn store_up(&self) -> bool {
        self.up
    }

    fn field(&self) -> String {
        self.me.clone()
    }

    fn leaks(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (k, b) in &self.budgets.map {
            out.push(format!(
                "budget {k} kept: in use {}, share {}, waiting {}, claim out {}",
                b.in_use,
                b.share,
                b.pending,
                b.claiming.is_some()
            ));
        }
        if !self.acq.is_empty() {
            out.push(format!("{} requests still acquiring", self.acq.len()));
        }
        out
    }
}

impl Before {
    fn became_ready(&mut self, io: &mut Io) {
        if self.ready {
            return;
        }
        self.ready = true;
        self.due = io.now() + self.lease / 3;
        self.loop_wake(io);
        for (req, web, session) in std::mem::take(&mut self.queued) {
            self.arrive(io, req, web, session);
        }
    }
}
