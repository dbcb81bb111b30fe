//! The store, as the claim script and the nodes see it: a Redis primary
//! holding strings and hashes with expiry on its own (steppable) clock,
//! answering the few commands limiter sends, and a replica that follows
//! it through a log of writes, late or not at all, to fail over to.
//!
//! What Redis does that matters to the fleet is modelled; nothing else:
//! keys expire by the primary's wall clock (so a step of that clock ends
//! them), `INFO` tells its run id, uptime and role, a restart or a
//! `FLUSHALL` empties it, a failover promotes a replica that may miss the
//! last writes (a new run id, the replica's own uptime), and a hash whose
//! last field goes is gone.

use std::collections::BTreeMap;

/// A Redis reply (RESP2), as a client and the script see it.
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    Nil,
    Int(i64),
    Bulk(String),
    Status(String),
    Error(String),
    Array(Vec<Reply>),
}

impl Reply {
    pub fn int(&self) -> Option<i64> {
        match self {
            Self::Int(n) => Some(*n),
            Self::Bulk(s) => s.parse().ok(),
            _ => None,
        }
    }

    pub fn text(&self) -> Option<&str> {
        match self {
            Self::Bulk(s) | Self::Status(s) => Some(s),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Value {
    Str(String),
    /// Fields in insertion order, as a small Redis hash keeps them.
    Hash(Vec<(String, String)>),
}

/// One write, as the replica receives it.
#[derive(Clone, Debug)]
enum Op {
    Set(String, Value),
    Del(String),
    ExpireAt(String, i64),
    Persist(String),
    Flush,
}

/// A data set: keys, values, expiry times (wall ms).
#[derive(Clone, Debug, Default)]
struct Data {
    keys: BTreeMap<String, Value>,
    expires: BTreeMap<String, i64>,
}

impl Data {
    fn apply(&mut self, op: &Op) {
        match op {
            Op::Set(k, v) => {
                self.keys.insert(k.clone(), v.clone());
            }
            Op::Del(k) => {
                self.keys.remove(k);
                self.expires.remove(k);
            }
            Op::ExpireAt(k, at) => {
                if self.keys.contains_key(k) {
                    self.expires.insert(k.clone(), *at);
                }
            }
            Op::Persist(k) => {
                self.expires.remove(k);
            }
            Op::Flush => *self = Self::default(),
        }
    }
}

/// The wall clock every store starts from (µs), far from zero as a real
/// one is.
const WALL_BASE_US: i64 = 1_765_000_000_000_000;

/// A Redis primary and its replica.
#[derive(Debug)]
pub struct Store {
    data: Data,
    pub run_id: String,
    pub replid: String,
    /// Virtual µs when this server (the primary now) started.
    started_us: u64,
    /// The primary's wall clock: virtual time plus this (µs).
    pub skew_us: i64,
    /// The replica: its data, the writes it has not applied yet (each
    /// with the virtual time it was written), its start.
    replica: Data,
    backlog: Vec<(u64, Op)>,
    replica_started_us: u64,
    /// Replication delay; `None`: the link to the replica is cut.
    pub replication_delay_us: Option<u64>,
    /// Servers started so far (names run ids).
    generation: u64,
    /// Commands that wrote (a count for the trace).
    pub writes: u64,
    /// `INFO memory`'s policy.
    pub maxmemory_policy: &'static str,
    /// What `PUBLISH` sent since the world last took it: channel, message.
    pub published: Vec<(String, String)>,
}

impl Store {
    pub fn new(now_us: u64) -> Self {
        let mut s = Self {
            data: Data::default(),
            run_id: String::new(),
            replid: String::new(),
            started_us: now_us,
            skew_us: 0,
            replica: Data::default(),
            backlog: Vec::new(),
            replica_started_us: now_us,
            replication_delay_us: Some(1_000),
            generation: 0,
            writes: 0,
            maxmemory_policy: "noeviction",
            published: Vec::new(),
        };
        s.new_identity();
        s
    }

    fn new_identity(&mut self) {
        self.generation += 1;
        self.run_id = format!("{:040x}", self.generation * 0x1111_1111);
        self.replid = format!("{:040x}", self.generation * 0x2222_2222);
    }

    /// The primary's wall clock, in ms.
    pub fn wall_ms(&self, now_us: u64) -> i64 {
        (WALL_BASE_US + now_us as i64 + self.skew_us).div_euclid(1000)
    }

    fn write(&mut self, now_us: u64, op: Op) {
        self.data.apply(&op);
        self.backlog.push((now_us, op));
        self.writes += 1;
    }

    /// Applies to the replica what it has received by `now_us`.
    pub fn replicate(&mut self, now_us: u64) {
        let Some(delay) = self.replication_delay_us else { return };
        let due = self.backlog.iter().take_while(|(at, _)| at + delay <= now_us).count();
        for (_, op) in self.backlog.drain(..due) {
            self.replica.apply(&op);
        }
    }

    /// Restarted empty (nothing saved): a new run id, uptime from now;
    /// the replica resyncs from the empty primary.
    pub fn restart(&mut self, now_us: u64) {
        self.data = Data::default();
        self.replica = Data::default();
        self.backlog.clear();
        self.started_us = now_us;
        self.new_identity();
    }

    /// `FLUSHALL`: every key gone, the same server (run id, uptime).
    pub fn flush(&mut self, now_us: u64) {
        self.write(now_us, Op::Flush);
    }

    /// The replica promoted: its data, whatever it had not received
    /// lost; a new run id and replication id, the replica's uptime. A new
    /// replica follows it, in sync.
    pub fn fail_over(&mut self, now_us: u64) {
        self.replicate(now_us);
        self.data = std::mem::take(&mut self.replica);
        self.replica = self.data.clone();
        self.backlog.clear();
        self.started_us = self.replica_started_us;
        self.replica_started_us = now_us;
        self.replication_delay_us = Some(self.replication_delay_us.unwrap_or(1_000));
        self.new_identity();
    }

    /// The writes the replica has not applied (what a failover now loses).
    pub fn replica_behind(&self) -> usize {
        self.backlog.len()
    }

    fn live(&mut self, key: &str, now_us: u64) -> bool {
        let wall = self.wall_ms(now_us);
        if self.data.expires.get(key).is_some_and(|&at| at <= wall) {
            self.write(now_us, Op::Del(key.to_owned()));
        }
        self.data.keys.contains_key(key)
    }

    fn hash(&mut self, key: &str, now_us: u64) -> Result<Vec<(String, String)>, Reply> {
        if !self.live(key, now_us) {
            return Ok(Vec::new());
        }
        match &self.data.keys[key] {
            Value::Hash(h) => Ok(h.clone()),
            Value::Str(_) => Err(wrong_type()),
        }
    }

    fn set_hash(&mut self, key: &str, fields: Vec<(String, String)>, now_us: u64) {
        if fields.is_empty() {
            self.write(now_us, Op::Del(key.to_owned()));
        } else {
            self.write(now_us, Op::Set(key.to_owned(), Value::Hash(fields)));
        }
    }

    /// Every key and what it holds (for the trace), as `key: value`.
    pub fn dump(&mut self, now_us: u64) -> Vec<String> {
        let keys: Vec<String> = self.data.keys.keys().cloned().collect();
        let mut out = Vec::new();
        for k in keys {
            if !self.live(&k, now_us) {
                continue;
            }
            let ttl = self.data.expires.get(&k).map(|at| at - self.wall_ms(now_us));
            out.push(format!("{k} ttl={ttl:?}: {:?}", self.data.keys[&k]));
        }
        out
    }

    /// The keys whose names start with `prefix`.
    pub fn keys_with(&mut self, prefix: &str, now_us: u64) -> Vec<String> {
        let keys: Vec<String> = self.data.keys.keys().filter(|k| k.starts_with(prefix)).cloned().collect();
        keys.into_iter().filter(|k| self.live(k, now_us)).collect()
    }

    /// A hash's fields (empty when it is not there).
    pub fn fields(&mut self, key: &str, now_us: u64) -> Vec<(String, String)> {
        self.hash(key, now_us).unwrap_or_default()
    }

    /// Runs one command (as a client or the script sends it).
    pub fn command(&mut self, now_us: u64, args: &[String]) -> Reply {
        let Some(name) = args.first() else { return Reply::Error("ERR empty command".into()) };
        let arg = |i: usize| args.get(i).map(String::as_str);
        let name = name.to_ascii_uppercase();
        let arity = |n: usize| args.len() >= n;
        match name.as_str() {
            "PING" => Reply::Status("PONG".into()),
            "PUBLISH" if arity(3) => {
                self.published.push((args[1].clone(), args[2].clone()));
                Reply::Int(0)
            }
            "TIME" => {
                let us = WALL_BASE_US + now_us as i64 + self.skew_us;
                Reply::Array(vec![
                    Reply::Bulk(us.div_euclid(1_000_000).to_string()),
                    Reply::Bulk(us.rem_euclid(1_000_000).to_string()),
                ])
            }
            "INFO" => Reply::Bulk(self.info(now_us, arg(1).unwrap_or("default"))),
            "ROLE" => Reply::Array(vec![Reply::Bulk("master".into()), Reply::Int(0), Reply::Array(vec![])]),
            "GET" if arity(2) => {
                let k = &args[1];
                if !self.live(k, now_us) {
                    return Reply::Nil;
                }
                match &self.data.keys[k.as_str()] {
                    Value::Str(s) => Reply::Bulk(s.clone()),
                    Value::Hash(_) => wrong_type(),
                }
            }
            "SET" if arity(3) => {
                let nx = args[3..].iter().any(|a| a.eq_ignore_ascii_case("nx"));
                if nx && self.live(&args[1], now_us) {
                    return Reply::Nil;
                }
                self.write(now_us, Op::Set(args[1].clone(), Value::Str(args[2].clone())));
                self.write(now_us, Op::Persist(args[1].clone()));
                Reply::Status("OK".into())
            }
            "DEL" if arity(2) => {
                let mut n = 0;
                for k in &args[1..] {
                    if self.live(k, now_us) {
                        self.write(now_us, Op::Del(k.clone()));
                        n += 1;
                    }
                }
                Reply::Int(n)
            }
            "EXISTS" if arity(2) => {
                Reply::Int(args[1..].iter().filter(|k| self.live(k, now_us)).count() as i64)
            }
            "HGETALL" if arity(2) => match self.hash(&args[1], now_us) {
                Ok(h) => {
                    Reply::Array(h.into_iter().flat_map(|(f, v)| [Reply::Bulk(f), Reply::Bulk(v)]).collect())
                }
                Err(e) => e,
            },
            "HMGET" if arity(3) => match self.hash(&args[1], now_us) {
                Ok(h) => Reply::Array(
                    args[2..]
                        .iter()
                        .map(|f| {
                            h.iter().find(|(g, _)| g == f).map_or(Reply::Nil, |(_, v)| Reply::Bulk(v.clone()))
                        })
                        .collect(),
                ),
                Err(e) => e,
            },
            "HGET" if arity(3) => match self.hash(&args[1], now_us) {
                Ok(h) => {
                    h.into_iter().find(|(f, _)| *f == args[2]).map_or(Reply::Nil, |(_, v)| Reply::Bulk(v))
                }
                Err(e) => e,
            },
            "HSET" if args.len() >= 4 && args.len().is_multiple_of(2) => match self.hash(&args[1], now_us) {
                Ok(mut h) => {
                    let mut added = 0;
                    for pair in args[2..].chunks(2) {
                        match h.iter_mut().find(|(f, _)| *f == pair[0]) {
                            Some(slot) => slot.1 = pair[1].clone(),
                            None => {
                                h.push((pair[0].clone(), pair[1].clone()));
                                added += 1;
                            }
                        }
                    }
                    self.set_hash(&args[1], h, now_us);
                    Reply::Int(added)
                }
                Err(e) => e,
            },
            "HDEL" if arity(3) => match self.hash(&args[1], now_us) {
                Ok(mut h) => {
                    let before = h.len();
                    h.retain(|(f, _)| !args[2..].contains(f));
                    let removed = before - h.len();
                    if removed > 0 {
                        self.set_hash(&args[1], h, now_us);
                    }
                    Reply::Int(removed as i64)
                }
                Err(e) => e,
            },
            "HLEN" if arity(2) => match self.hash(&args[1], now_us) {
                Ok(h) => Reply::Int(h.len() as i64),
                Err(e) => e,
            },
            "PEXPIRE" if arity(3) => {
                let Ok(ms) = args[2].parse::<i64>() else {
                    return Reply::Error("ERR value is not an integer or out of range".into());
                };
                if !self.live(&args[1], now_us) {
                    return Reply::Int(0);
                }
                if ms <= 0 {
                    self.write(now_us, Op::Del(args[1].clone()));
                } else {
                    let at = self.wall_ms(now_us) + ms;
                    self.write(now_us, Op::ExpireAt(args[1].clone(), at));
                }
                Reply::Int(1)
            }
            "PTTL" if arity(2) => {
                if !self.live(&args[1], now_us) {
                    return Reply::Int(-2);
                }
                match self.data.expires.get(args[1].as_str()) {
                    None => Reply::Int(-1),
                    Some(at) => Reply::Int(at - self.wall_ms(now_us)),
                }
            }
            _ => Reply::Error(format!("ERR unknown command or wrong arguments: {args:?}")),
        }
    }

    fn info(&self, now_us: u64, section: &str) -> String {
        let uptime = now_us.saturating_sub(self.started_us) / 1_000_000;
        let server = format!(
            "# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\nrun_id:{}\r\nuptime_in_seconds:{uptime}\r\n",
            self.run_id
        );
        let replication = format!(
            "# Replication\r\nrole:master\r\nconnected_slaves:1\r\nmaster_replid:{}\r\n",
            self.replid
        );
        let memory = format!("# Memory\r\nmaxmemory:0\r\nmaxmemory_policy:{}\r\n", self.maxmemory_policy);
        match section.to_ascii_lowercase().as_str() {
            "server" => server,
            "replication" => replication,
            "memory" => memory,
            _ => format!("{server}\r\n{replication}\r\n{memory}"),
        }
    }
}

fn wrong_type() -> Reply {
    Reply::Error("WRONGTYPE Operation against a key holding the wrong kind of value".into())
}
