//! A node of today's fleet: limiter's own share logic
//! (`fleet::shares::Budgets`), store-down rule (`fleet::health`), live
//! nodes (`fleet::members`) and claim encoding (`fleet::claim`: the
//! script's `ARGV` and the parser of its answer), driven the way the
//! daemon's async shell (`fleet/permits.rs`, `fleet/tasks.rs`) drives
//! them: a request's takes joined, each waiting for the claim out up to
//! `fleet.timeoutMs` per round, its waits and units guards that give back
//! whatever way the request ends, claims on tasks of their own with a
//! third of the lease to answer, releases while others want more, a
//! renewal round every third of the lease with this node's field among
//! the live nodes and the end of every quiet seen for a lease, the probe
//! that reads every epoch and republishes before the store counts as up.
//! What the shell does between the calls is restated here; what it
//! decides is not.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::{Duration, Instant},
};

use limiter::fleet::{
    KEY_TTL, Kind,
    claim::{Answer, Claim},
    epoch_of, epochs_for,
    health::Health,
    members::Members,
    members_for, refusal_holds, session_key_for,
    shares::{Budgets, Down, Take, Why},
    web_key_for,
};

use crate::{
    check::Budget,
    rng::Rng,
    scenario::{Policy, Scenario},
    store::Reply,
    world::{CONNECT_ID_FLAG, Command, Io, Node as SimNode},
};

const FIRST_CONNECT: Duration = Duration::from_secs(2);
const PROBE_FIRST: Duration = Duration::from_millis(100);
const PROBE_MAX: Duration = Duration::from_secs(1);
const CONNECT: Duration = Duration::from_secs(1);
const PROBED_KEYS: usize = 16;

/// The fleet's name in the simulation, and its hash key.
const NAME: &str = "sim";
const HASH_KEY: &str = "simulated-fleet-hash-key";

/// Why a claim went out (as the shell's `Sent`).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Sent {
    ForRequests,
    Release,
    Renewal,
}

#[derive(Debug)]
enum Msg {
    FirstConnect,
    FirstPing,
    FirstRole,
    FirstInfo,
    Claim { claim: Claim, sent: Sent, round: Option<u64> },
    Member { _claim: Claim, round: u64 },
    ProbeConnect,
    ProbeRole,
    ProbeKey,
}

#[derive(Debug, Clone, Copy)]
enum Timer {
    Deadline {
        req: u64,
        take: usize,
        turn: u64,
    },
    Wake {
        req: u64,
        take: usize,
        turn: u64,
    },
    ClaimTimeout {
        id: u64,
    },
    /// The first connection's steps, within one deadline.
    FirstConnect,
    RenewalDue {
        turn: u64,
    },
    Backoff {
        turn: u64,
    },
    ProbeWait {
        turn: u64,
    },
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
    group: Arc<str>,
    kind: Kind,
    round: u32,
    st: St,
}

/// What the renewal task is doing.
#[derive(Debug, PartialEq)]
enum Loop {
    Sleep,
    /// Epochs, a renewal round: claims not answered yet, whether one
    /// failed, and what comes after.
    Round {
        id: u64,
        outstanding: usize,
        failed: bool,
        then: Then,
    },
    Backoff,
    ProbeConnect,
    ProbeRole,
    ProbeKeys {
        outstanding: usize,
        ok: bool,
    },
}

#[derive(Debug, PartialEq, Clone, Copy)]
enum Then {
    /// A renewal round of the up path.
    Renewed,
    /// The epochs read at start.
    Started,
    /// The probe's epochs: a renewal round next.
    ProbeEpochs,
    /// The probe's renewal round: up if it succeeds.
    ProbeRenewed,
}

pub struct Node {
    limits: (u32, u32),
    lease: Duration,
    timeout: Duration,
    policy: Policy,
    me: String,
    budgets: Budgets,
    members: Members,
    health: Health,
    up: bool,
    down_since: Option<Instant>,
    /// Since when tries to connect have been refused, each soon after the
    /// last, and the last (`None`: the last was not).
    refused: Option<(Instant, Instant)>,
    ready: bool,
    queued: Vec<(u64, bool, Option<u32>)>,
    rng: Rng,
    next: u64,
    msgs: HashMap<u64, Msg>,
    timers: HashMap<u64, Timer>,
    waiters: BTreeMap<Arc<str>, Vec<(u64, usize)>>,
    acq: BTreeMap<u64, Vec<TakeSt>>,
    held: BTreeMap<u64, Vec<Arc<str>>>,
    state: Loop,
    turn: u64,
    due: Instant,
    backoff: Duration,
    web: (Arc<str>, Arc<str>),
    groups: Vec<Arc<str>>,
    /// The simulation's budget of each store key this node may use, and
    /// each session's keys.
    budgets_of: HashMap<Arc<str>, Budget>,
    sessions: Vec<(Arc<str>, Arc<str>, Kind)>,
    /// The channel the store tells of wanted budgets on.
    channel: String,
}

/// A budget's store key and its group's epoch key, as the daemon names
/// them.
fn keys_of(b: Budget) -> (Arc<str>, Arc<str>, Kind) {
    let key = match b {
        Budget::Web => web_key_for(NAME),
        Budget::Session(s) => session_key_for(NAME, HASH_KEY, format!("Bearer s{s}").as_bytes()),
    };
    let kind = if b == Budget::Web { Kind::Web } else { Kind::Session };
    (Arc::from(epoch_of(&key)), Arc::from(key), kind)
}

impl Node {
    pub fn new(sc: &Scenario, index: usize, incarnation: u32, identity: &str) -> Self {
        let mut rng = Rng::new(sc.seed ^ ((index as u64) << 32) ^ u64::from(incarnation) ^ 0x5eed);
        let lease = Duration::from_millis(sc.lease_ms);
        let (wg, wk, _) = keys_of(Budget::Web);
        Self {
            limits: (sc.session_limit, sc.web_limit),
            lease,
            timeout: Duration::from_millis(sc.timeout_ms),
            policy: sc.policy,
            me: format!("{identity}.{:016x}", rng.next_u64()),
            budgets: Budgets::new(lease, rng.next_u64()),
            members: Members::new(lease),
            health: Health::default(),
            up: true,
            down_since: None,
            refused: None,
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
            turn: 0,
            due: Instant::now(),
            backoff: PROBE_FIRST,
            web: (wk, wg),
            groups: epochs_for(NAME).into_iter().map(Arc::from).collect(),
            budgets_of: std::iter::once(Budget::Web)
                .chain((0..8).map(Budget::Session))
                .map(|b| (keys_of(b).1, b))
                .collect(),
            sessions: (0..8).map(|s| keys_of(Budget::Session(s))).collect(),
            channel: limiter::fleet::claim::wanted_channel(NAME),
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

    /// As the shell's `tried_to_connect`.
    fn tried_to_connect(&mut self, now: Instant, refused: bool) {
        self.refused = match (refused, self.refused) {
            (false, _) => None,
            (true, Some((since, last)))
                if now.saturating_duration_since(last) <= refusal_holds(self.lease) =>
            {
                Some((since, now))
            }
            (true, _) => Some((now, now)),
        };
    }

    fn went_down(&mut self, io: &mut Io, why: &str) {
        if self.up {
            self.up = false;
            self.down_since = Some(io.now());
            io.trace(|| format!("store down: {why}"));
            if self.state == Loop::Sleep {
                self.loop_wake(io);
            }
        }
    }

    fn down(&self, kind: Kind, now: Instant) -> Option<Down> {
        if self.up {
            return None;
        }
        Some(match self.policy {
            Policy::Local => Down::Local,
            Policy::Refuse => Down::Refuse,
            Policy::Share => {
                let safe = self
                    .refused
                    .filter(|(since, last)| {
                        now.saturating_duration_since(*since) >= self.lease
                            && now.saturating_duration_since(*last) <= refusal_holds(self.lease)
                    })
                    .and_then(|(since, _)| self.members.safe_n(self.down_since.unwrap_or(since)))
                    .map(|n| self.limit(kind) / n.max(1));
                Down::Share(safe)
            }
        })
    }

    // ---- the request's path (permits.rs) ----

    fn step_take(&mut self, io: &mut Io, req: u64, i: usize) {
        let now = io.now();
        let Some(takes) = self.acq.get(&req) else { return };
        let (key, group, kind, round) = {
            let t = &takes[i];
            (t.key.clone(), t.group.clone(), t.kind, t.round)
        };
        let down = self.down(kind, now);
        let limit = self.limit(kind);
        let step = self.budgets.take(&key, kind, &group, limit, now, down, round);
        io.trace(|| {
            let what = match &step {
                Take::Taken(within) => format!("taken within {within:?}"),
                Take::Refused(why) => format!("refused ({why:?})"),
                Take::Wait(_) => "waits for the claim out".to_owned(),
                Take::Claim(c, _) => format!("claims (seq {})", c.seq),
            };
            format!("request {req} take {i} round {round} of {key}: {what}")
        });
        let st = match step {
            Take::Taken(_) => Some(St::Ok),
            Take::Refused(Why::Limit) => Some(St::Err(refusal(kind))),
            Take::Refused(Why::Down) => Some(St::Err("fleet_down")),
            Take::Wait(_) => None,
            Take::Claim(claim, _) => {
                io.trace(|| {
                    format!(
                        "claims {key} (keep {}, need {}, want {}, in use {})",
                        claim.keep, claim.need, claim.want, claim.in_use
                    )
                });
                self.send_claim(io, claim, Sent::ForRequests, None);
                None
            }
        };
        match st {
            Some(st) => self.acq.get_mut(&req).expect("a request")[i].st = st,
            None => self.wait_on(io, req, i, &key),
        }
        self.finish_if_done(io, req);
    }

    fn wait_on(&mut self, io: &mut Io, req: u64, i: usize, key: &Arc<str>) {
        let turn = self.id();
        self.acq.get_mut(&req).expect("a request")[i].st = St::Wait { turn };
        self.waiters.entry(key.clone()).or_default().push((req, i));
        self.timer(io, self.timeout, Timer::Deadline { req, take: i, turn });
    }

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
        // A store that did not answer is said first.
        let errs: Vec<&'static str> = takes
            .iter()
            .filter_map(|t| match t.st {
                St::Err(r) => Some(r),
                _ => None,
            })
            .collect();
        let refusal = errs.iter().find(|r| **r == "fleet_down").or(errs.first()).copied();
        let ok: Vec<Arc<str>> = takes.iter().filter(|t| t.st == St::Ok).map(|t| t.key.clone()).collect();
        match refusal {
            Some(r) => {
                for k in &ok {
                    self.release(io, k);
                }
                io.refuse(req, r);
            }
            None => {
                self.held.insert(req, ok);
                io.admit(req);
            }
        }
    }

    /// A unit's guard dropped.
    fn release(&mut self, io: &mut Io, key: &Arc<str>) {
        if let Some(claim) = self.budgets.give_back(key, io.now()) {
            io.trace(|| format!("releases {key} down to {}", claim.keep));
            self.send_claim(io, claim, Sent::Release, None);
        }
    }

    // ---- claims ----

    fn send_claim(&mut self, io: &mut Io, claim: Claim, sent: Sent, round: Option<u64>) {
        let limit = claim.key.as_ref().map_or(0, |_| self.limit(claim.kind));
        let tomb = limiter::lease::given_back_for(self.lease).as_millis() as u64;
        let argv = claim.argv(&self.me, limit, KEY_TTL.as_millis() as u64, &self.channel, tomb);
        let keys = claim.keys().iter().map(|k| (*k).to_owned()).collect();
        let id = self.send(io, Msg::Claim { claim, sent, round }, Command::Eval { keys, argv });
        self.timer(io, self.lease / 3, Timer::ClaimTimeout { id });
    }

    fn send_member(&mut self, io: &mut Io, round: u64, now: Instant) {
        let (key, epoch) = members_for(NAME);
        let (seq, nonce) = (self.budgets.next_seq(), self.budgets.next_nonce());
        let claim = self.members.claim(key.into(), epoch.into(), seq, nonce, false, now);
        let argv = claim.argv(&self.me, 0, KEY_TTL.as_millis() as u64, &self.channel, 0);
        let keys = claim.keys().iter().map(|k| (*k).to_owned()).collect();
        let id = self.send(io, Msg::Member { _claim: claim, round }, Command::Eval { keys, argv });
        self.timer(io, self.lease / 3, Timer::ClaimTimeout { id });
    }

    /// `claim_and_apply`, once the answer (or its absence) is in.
    fn claim_ended(
        &mut self,
        io: &mut Io,
        claim: Claim,
        sent: Sent,
        round: Option<u64>,
        reply: Result<Reply, String>,
    ) {
        let now = io.now();
        let took = now.saturating_duration_since(claim.sent);
        let answer = reply.and_then(|r| match r {
            Reply::Bulk(text) => Answer::parse(&text),
            other => Err(format!("the claim script answered {other:?}")),
        });
        let budget = claim.key.as_ref().and_then(|k| self.budgets_of.get(k).copied());
        let ok = match &answer {
            Ok(a) => {
                match &claim.key {
                    Some(key) => self.budgets.answered(key, &claim, a, now),
                    None => self.budgets.saw_epoch(&claim.group, a.quiet.as_deref(), now),
                }
                if let Some(b) = budget {
                    io.applied(b, claim.sent);
                    io.claim_outcome(b, true);
                }
                took <= self.timeout || sent == Sent::Renewal
            }
            Err(e) => {
                if let Some(key) = &claim.key {
                    self.budgets.failed(key, &claim, now);
                }
                if let Some(b) = budget {
                    io.claim_outcome(b, false);
                }
                io.trace(|| format!("claim of {:?} failed: {e}", claim.key));
                false
            }
        };
        if sent != Sent::Renewal && self.health.record(ok, now) {
            self.went_down(io, "claims failed or late");
        }
        if let Some(key) = &claim.key {
            let key = key.clone();
            drop(claim);
            self.wake(io, &key);
        }
        if let Some(id) = round {
            self.round_claim_done(io, id, answer.is_ok());
        }
    }

    // ---- the renewal task (tasks.rs) ----

    /// `renew`: the renewals, the epochs of the quiets seen for a lease,
    /// this node's field among the live nodes, all at once.
    fn renew_all(&mut self, io: &mut Io, then: Then) {
        let now = io.now();
        let renewals = self.budgets.renewals(now);
        let due = self.budgets.quiet_due(now);
        let epochs = self.budgets.epochs(&due, now);
        let id = self.id();
        let claims: Vec<Claim> = renewals.into_iter().chain(epochs).collect();
        self.state = Loop::Round { id, outstanding: claims.len() + 1, failed: false, then };
        for claim in claims {
            io.trace(|| {
                format!(
                    "renews {:?} (keep {}, need {}, want {}, in use {}, unquiet {})",
                    claim.key.as_deref().unwrap_or(&claim.group),
                    claim.keep,
                    claim.need,
                    claim.want,
                    claim.in_use,
                    claim.unquiet.as_deref().unwrap_or("-")
                )
            });
            self.send_claim(io, claim, Sent::Renewal, Some(id));
        }
        self.send_member(io, id, now);
    }

    /// `read_epochs(true)`: every group's epoch.
    fn read_epochs(&mut self, io: &mut Io, then: Then) {
        let now = io.now();
        let groups = self.groups.clone();
        let claims = self.budgets.epochs(&groups, now);
        let id = self.id();
        self.state = Loop::Round { id, outstanding: claims.len(), failed: false, then };
        for claim in claims {
            self.send_claim(io, claim, Sent::Renewal, Some(id));
        }
    }

    fn round_claim_done(&mut self, io: &mut Io, id: u64, ok: bool) {
        let Loop::Round { id: current, outstanding, failed, then } = &mut self.state else { return };
        if *current != id {
            return;
        }
        *outstanding -= 1;
        *failed |= !ok;
        if *outstanding > 0 {
            return;
        }
        let (ok, then) = (!*failed, *then);
        let now = io.now();
        match then {
            Then::Started => {
                if !ok {
                    self.went_down(io, "reading the fleet's epochs failed");
                }
                self.state = Loop::Sleep;
                self.became_ready(io);
            }
            Then::Renewed => {
                if !ok {
                    self.went_down(io, "renewing failed");
                }
                self.state = Loop::Sleep;
                self.loop_wake(io);
            }
            Then::ProbeEpochs if ok => self.renew_all(io, Then::ProbeRenewed),
            Then::ProbeRenewed if ok => {
                self.health.reset(now);
                self.up = true;
                self.down_since = None;
                io.trace(|| "store up again; shares republished".into());
                self.due = now + self.lease / 3;
                self.backoff = PROBE_FIRST.min(self.lease / 3);
                self.state = Loop::Sleep;
                self.loop_wake(io);
            }
            Then::ProbeEpochs | Then::ProbeRenewed => self.probe_failed(io),
        }
    }

    fn loop_wake(&mut self, io: &mut Io) {
        self.turn += 1;
        let turn = self.turn;
        let now = io.now();
        if self.up {
            self.state = Loop::Sleep;
            let after = self.due.saturating_duration_since(now);
            self.timer(io, after, Timer::RenewalDue { turn });
        } else {
            self.state = Loop::Backoff;
            self.timer(io, self.backoff, Timer::Backoff { turn });
        }
    }

    fn probe_keys(&mut self, io: &mut Io) {
        let mut keys: Vec<Arc<str>> = self.budgets.map.keys().cloned().collect();
        keys.sort();
        keys.truncate(PROBED_KEYS);
        let wait = self.timeout.max(PROBE_FIRST / 2);
        self.turn += 1;
        let turn = self.turn;
        if keys.is_empty() {
            self.send(io, Msg::ProbeKey, Command::Cmd(vec!["PING".into()]));
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
        self.backoff = (self.backoff * 2).min(PROBE_MAX.min(self.lease / 3));
        self.state = Loop::Sleep;
        self.loop_wake(io);
    }

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

fn refusal(kind: Kind) -> &'static str {
    match kind {
        Kind::Session => "fleet_session",
        Kind::Web => "fleet_web",
    }
}

impl SimNode for Node {
    fn start(&mut self, io: &mut Io) {
        self.budgets = Budgets::new(self.lease, self.rng.next_u64());
        self.health.reset(io.now());
        self.send(io, Msg::FirstConnect, Command::Connect);
        self.timer(io, FIRST_CONNECT, Timer::FirstConnect);
    }

    fn arrive(&mut self, io: &mut Io, req: u64, web: bool, session: Option<u32>) {
        if !self.ready {
            self.queued.push((req, web, session));
            return;
        }
        let mut takes = Vec::new();
        if web && self.limits.1 > 0 {
            let (key, group) = self.web.clone();
            takes.push(TakeSt { key, group, kind: Kind::Web, round: 0, st: St::Run });
        }
        if let Some(s) = session
            && self.limits.0 > 0
        {
            let (group, key, kind) = self.sessions[s as usize].clone();
            takes.push(TakeSt { key, group, kind, round: 0, st: St::Run });
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

    fn wanted(&mut self, io: &mut Io, key: &str) {
        // As the shell's listener: what this node holds of the budget
        // beyond its requests goes back at once.
        if let Some(claim) = self.budgets.wanted(&Arc::from(key), io.now()) {
            io.trace(|| format!("gives back {key} down to {} (wanted)", claim.keep));
            self.send_claim(io, claim, Sent::Release, None);
        }
    }

    fn cancel(&mut self, io: &mut Io, req: u64) {
        // The join is dropped: each wait's guard stops counting it, each
        // unit taken is given back.
        let Some(takes) = self.acq.remove(&req) else { return };
        for (i, t) in takes.iter().enumerate() {
            match t.st {
                St::Wait { .. } => {
                    self.budgets.waited(&t.key);
                    if let Some(w) = self.waiters.get_mut(&t.key) {
                        w.retain(|x| *x != (req, i));
                    }
                }
                St::Ok => self.release(io, &t.key),
                St::Run | St::Err(_) => {}
            }
        }
    }

    fn end(&mut self, io: &mut Io, req: u64) {
        for k in self.held.remove(&req).unwrap_or_default() {
            self.release(io, &k);
        }
    }

    fn answer(&mut self, io: &mut Io, id: u64, reply: Result<Reply, String>) {
        let Some(msg) = self.msgs.remove(&id) else { return };
        match msg {
            Msg::FirstConnect => match reply {
                Ok(_) => _ = self.send(io, Msg::FirstPing, Command::Cmd(vec!["PING".into()])),
                Err(e) => {
                    self.tried_to_connect(io.now(), e.contains("refused"));
                    self.went_down(io, &e);
                    self.became_ready(io);
                }
            },
            Msg::FirstPing => match reply {
                Ok(_) => _ = self.send(io, Msg::FirstRole, Command::Cmd(vec!["ROLE".into()])),
                Err(e) => {
                    self.went_down(io, &e);
                    self.became_ready(io);
                }
            },
            Msg::FirstRole => {
                self.send(io, Msg::FirstInfo, Command::Cmd(vec!["INFO".into(), "memory".into()]));
            }
            Msg::FirstInfo => self.read_epochs(io, Then::Started),
            Msg::ProbeConnect => {
                if self.state != Loop::ProbeConnect {
                    return;
                }
                match reply {
                    Ok(_) => {
                        self.tried_to_connect(io.now(), false);
                        self.state = Loop::ProbeRole;
                        self.send(io, Msg::ProbeRole, Command::Cmd(vec!["ROLE".into()]));
                    }
                    Err(e) => {
                        self.tried_to_connect(io.now(), e.contains("refused"));
                        self.probe_failed(io);
                    }
                }
            }
            Msg::ProbeRole => {
                if self.state != Loop::ProbeRole {
                    return;
                }
                match reply {
                    Ok(_) => self.probe_keys(io),
                    Err(_) => self.probe_failed(io),
                }
            }
            Msg::ProbeKey => {
                if let Loop::ProbeKeys { outstanding, ok } = &mut self.state {
                    *outstanding -= 1;
                    *ok &= reply.is_ok();
                    if *outstanding == 0 {
                        if *ok {
                            self.read_epochs(io, Then::ProbeEpochs);
                        } else {
                            self.probe_failed(io);
                        }
                    }
                }
            }
            Msg::Claim { claim, sent, round } => self.claim_ended(io, claim, sent, round, reply),
            Msg::Member { _claim: claim, round } => {
                let now = io.now();
                let ok = match reply {
                    Ok(Reply::Bulk(text)) => match Answer::parse(&text) {
                        Ok(a) => {
                            self.members.answered(&a, claim.sent, now);
                            true
                        }
                        Err(_) => false,
                    },
                    _ => false,
                };
                self.round_claim_done(io, round, ok);
            }
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
                let Some(msg) = self.msgs.remove(&id) else { return };
                let e = Err("no answer within a third of the lease".to_owned());
                match msg {
                    Msg::Claim { claim, sent, round } => self.claim_ended(io, claim, sent, round, e),
                    Msg::Member { round, .. } => self.round_claim_done(io, round, false),
                    _ => {}
                }
            }
            Timer::FirstConnect => {
                // Still in its steps (not yet reading the epochs, which
                // have deadlines of their own): down, and serving.
                let stepping = self.msgs.values().any(|m| {
                    matches!(m, Msg::FirstConnect | Msg::FirstPing | Msg::FirstRole | Msg::FirstInfo)
                });
                if !self.ready && stepping {
                    self.msgs.retain(|_, m| {
                        !matches!(m, Msg::FirstConnect | Msg::FirstPing | Msg::FirstRole | Msg::FirstInfo)
                    });
                    self.went_down(io, "the store did not answer within 2 s");
                    self.became_ready(io);
                }
            }
            Timer::RenewalDue { turn } => {
                if turn != self.turn || self.state != Loop::Sleep {
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
                self.renew_all(io, Then::Renewed);
            }
            Timer::Backoff { turn } => {
                if turn != self.turn || self.state != Loop::Backoff {
                    return;
                }
                self.state = Loop::ProbeConnect;
                self.send(io, Msg::ProbeConnect, Command::Connect);
                self.turn += 1;
                let turn = self.turn;
                self.timer(io, CONNECT, Timer::ProbeWait { turn });
            }
            Timer::ProbeWait { turn } => {
                if turn != self.turn {
                    return;
                }
                if matches!(self.state, Loop::ProbeConnect | Loop::ProbeRole | Loop::ProbeKeys { .. }) {
                    self.probe_failed(io);
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
                "budget {k} kept: in use {}, cap {}, share {}, waiting {}, claim out {}",
                b.in_use,
                b.cap,
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
