//! The fleet's store for tests and the fleet benchmark: Debian's
//! `redis-server`, one or a cluster of three, in a namespace of their own
//! with a bridge, and daemons in namespaces of theirs, each joined to the
//! bridge by a veth pair, so that several daemons reach one store as
//! nodes of a fleet do, and clients in the store's namespace reach every
//! daemon.
//!
//! ```text
//!   store netns: br0 10.77.0.1/24 and 10.77.0.2 (a replica's), redis-server(s)
//!                and redis-sentinel on 10.77.0.1, clients
//!      |-- veth -- node 1 netns: 10.77.0.11 (limiter, its upstream on 127.0.0.1)
//!      |-- veth -- node 2 netns: 10.77.0.12
//!      `-- veth -- node 3 netns: 10.77.0.13
//! ```

use std::{
    fs,
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};

use crate::{Daemon, Sandbox, process, run, upstream::Upstream, write_secret};

/// The store's address on the bridge.
pub const STORE_IP: &str = "10.77.0.1";
/// A second address in the store's namespace, for a replica: replication
/// from the primary to it can be cut alone (iptables by address).
pub const REPLICA_IP: &str = "10.77.0.2";

/// The store's namespace and bridge.
pub struct StoreNet {
    pub sb: Sandbox,
    joined: AtomicU32,
    /// The password `redis-cli` gives (`requirepass`).
    password: std::sync::Mutex<Option<String>>,
}

impl StoreNet {
    pub fn new() -> Result<Self> {
        let sb = Sandbox::new()?;
        let n = sb.name.as_str();
        run("ip", &["-n", n, "link", "add", "br0", "type", "bridge"])?;
        // A bridge whose address is not set takes the lowest of its
        // ports': a node joining with a lower one would change the store's
        // MAC under the nodes that joined before (their neighbour entries
        // then point nowhere for seconds). Set, it never changes.
        run("ip", &["-n", n, "link", "set", "br0", "address", "02:00:0a:4d:00:01"])?;
        run("ip", &["-n", n, "addr", "add", &format!("{STORE_IP}/24"), "dev", "br0"])?;
        run("ip", &["-n", n, "addr", "add", &format!("{REPLICA_IP}/24"), "dev", "br0"])?;
        run("ip", &["-n", n, "link", "set", "br0", "up"])?;
        Ok(Self { sb, joined: AtomicU32::new(0), password: std::sync::Mutex::new(None) })
    }

    /// Joins `node`'s namespace to the bridge: its address there.
    pub fn join(&self, node: &Sandbox) -> Result<IpAddr> {
        let i = self.joined.fetch_add(1, Ordering::Relaxed) + 1;
        let (store, (host, peer)) = (self.sb.name.as_str(), (format!("vs{i}"), format!("vn{i}")));
        let ip = format!("10.77.0.{}", 10 + i);
        run(
            "ip",
            &["-n", store, "link", "add", &host, "type", "veth", "peer", "name", &peer, "netns", &node.name],
        )?;
        run("ip", &["-n", store, "link", "set", &host, "master", "br0", "up"])?;
        run("ip", &["-n", &node.name, "addr", "add", &format!("{ip}/24"), "dev", &peer])?;
        run("ip", &["-n", &node.name, "link", "set", &peer, "up"])?;
        Ok(ip.parse()?)
    }

    /// `redis-cli` authenticates with `password` from now on.
    pub fn set_password(&self, password: &str) {
        *self.password.lock().unwrap() = Some(password.to_owned());
    }

    /// `redis-cli` against the node on `port`, in the store's namespace:
    /// its output.
    pub fn cli(&self, port: u16, args: &[&str]) -> Result<String> {
        let mut cmd = Command::new("nsenter");
        if let Some(password) = &*self.password.lock().unwrap() {
            cmd.env("REDISCLI_AUTH", password);
        }
        let out = process::run_with_deadline(
            cmd.arg(format!("--net={}", self.sb.netns_path.display()))
                .args(["redis-cli", "-h", STORE_IP, "-p", &port.to_string()])
                .args(args),
            Duration::from_secs(30),
        );
        if !out.status.success() {
            bail!("redis-cli {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// One Redis on `port` (with `extra` arguments, `--requirepass x`
    /// say), answering.
    pub fn redis(&self, port: u16, extra: &[&str]) -> Result<Redis> {
        let dir = self.sb.dir.join(format!("redis-{port}"));
        fs::create_dir_all(&dir)?;
        let args: Vec<String> = extra.iter().map(ToString::to_string).collect();
        Redis::start_in(&self.sb, STORE_IP, port, &dir, &args)
    }

    /// A replica of the primary on `master_port`, on [`REPLICA_IP`]:`port`,
    /// in sync when this returns.
    pub fn replica(&self, port: u16, master_port: u16) -> Result<Redis> {
        let dir = self.sb.dir.join(format!("redis-{port}"));
        let args: Vec<String> = [
            "--replicaof",
            STORE_IP,
            &master_port.to_string(),
            // Its connection to the primary leaves from the bridge's first
            // address: Sentinel must be told where it listens.
            "--replica-announce-ip",
            REPLICA_IP,
            "--repl-diskless-sync",
            "yes",
            "--repl-diskless-sync-delay",
            "0",
        ]
        .iter()
        .map(ToString::to_string)
        .collect();
        let r = Redis::start_in(&self.sb, REPLICA_IP, port, &dir, &args)?;
        let deadline = Instant::now() + Duration::from_secs(20);
        while !r.cli(&["info", "replication"])?.contains("master_link_status:up") {
            if Instant::now() > deadline {
                bail!("the replica on {port} never synced:\n{}", r.log());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(r)
    }

    /// A Sentinel on `port` watching the primary on `master_port` as
    /// `master` (quorum one: the test's one Sentinel decides; a primary
    /// silent for a second is down).
    pub fn sentinel(&self, port: u16, master: &str, master_port: u16) -> Result<Redis> {
        let dir = self.sb.dir.join(format!("sentinel-{port}"));
        fs::create_dir_all(&dir)?;
        let conf = dir.join("sentinel.conf");
        fs::write(
            &conf,
            format!(
                "port {port}\nbind {STORE_IP}\nprotected-mode no\ndir {}\n\
                 sentinel monitor {master} {STORE_IP} {master_port} 1\n\
                 sentinel down-after-milliseconds {master} 1000\n\
                 sentinel failover-timeout {master} 10000\n\
                 sentinel parallel-syncs {master} 1\n",
                dir.display()
            ),
        )?;
        let mut s = Redis {
            netns: self.sb.netns_path.clone(),
            host: STORE_IP.to_owned(),
            port,
            program: "redis-sentinel",
            env: Vec::new(),
            args: vec![conf.display().to_string()],
            cli_args: Vec::new(),
            dir,
            child: None,
        };
        s.start()?;
        Ok(s)
    }

    /// Runs `iptables ARGS` in the store's namespace.
    pub fn iptables(&self, args: &[&str]) -> Result<()> {
        run("ip", &[&["netns", "exec", &self.sb.name, "iptables"], args].concat())?;
        Ok(())
    }

    /// Cuts replication from the primary on `master_port` to its one
    /// replica (the connection the primary lists as a replica's): the
    /// replica keeps its connection and misses every write meanwhile. The
    /// rule, for [`Self::mend`].
    pub fn cut_replication(&self, master_port: u16) -> Result<Vec<String>> {
        let clients = self.cli(master_port, &["client", "list", "type", "replica"])?;
        let addr = clients
            .split_whitespace()
            .find_map(|w| w.strip_prefix("addr="))
            .with_context(|| format!("no replica of {master_port}: {clients}"))?;
        let (ip, port) = addr.rsplit_once(':').context("a replica's address")?;
        let rule: Vec<String> = [
            "OUTPUT",
            "-p",
            "tcp",
            "-s",
            STORE_IP,
            "--sport",
            &master_port.to_string(),
            "-d",
            ip,
            "--dport",
            port,
            "-j",
            "DROP",
        ]
        .iter()
        .map(ToString::to_string)
        .collect();
        let args: Vec<&str> = std::iter::once("-A").chain(rule.iter().map(String::as_str)).collect();
        self.iptables(&args)?;
        Ok(rule)
    }

    /// Removes a rule [`Self::cut_replication`] added.
    pub fn mend(&self, rule: &[String]) -> Result<()> {
        let args: Vec<&str> = std::iter::once("-D").chain(rule.iter().map(String::as_str)).collect();
        self.iptables(&args)
    }

    /// One Redis on `port` whose wall clock [`Clock::step`] moves (a
    /// preloaded shim, built here with gcc, adds an offset read from a
    /// file to `gettimeofday`, `clock_gettime(CLOCK_REALTIME)` and
    /// `time`; its monotonic clock is the machine's).
    pub fn redis_with_clock(&self, port: u16) -> Result<(Redis, Clock)> {
        let dir = self.sb.dir.join(format!("redis-{port}"));
        fs::create_dir_all(&dir)?;
        let shim = dir.join("clock-step.so");
        let source = dir.join("clock-step.c");
        fs::write(&source, CLOCK_SHIM)?;
        run(
            "gcc",
            &["-shared", "-fPIC", "-O2", "-o", &shim.display().to_string(), &source.display().to_string()],
        )?;
        let offset = dir.join("clock-offset");
        fs::write(&offset, "0\n")?;
        let mut redis = Redis::new_in(&self.sb, STORE_IP, port, &dir, &[]);
        redis.env = vec![
            ("LD_PRELOAD".into(), shim.display().to_string()),
            ("LIMITER_CLOCK_OFFSET_FILE".into(), offset.display().to_string()),
        ];
        redis.start()?;
        Ok((redis, Clock { file: offset }))
    }

    /// One Redis serving TLS only on `port`, with the certificate `cert`
    /// (its key `key`), clients not asked for one.
    pub fn redis_tls(&self, port: u16, cert: &std::path::Path, key: &std::path::Path) -> Result<Redis> {
        let dir = self.sb.dir.join(format!("redis-{port}"));
        fs::create_dir_all(&dir)?;
        let (cert, key) = (cert.display().to_string(), key.display().to_string());
        let mut redis = Redis {
            netns: self.sb.netns_path.clone(),
            host: STORE_IP.to_owned(),
            port,
            program: "redis-server",
            env: Vec::new(),
            args: [
                "--bind",
                STORE_IP,
                "--port",
                "0",
                "--tls-port",
                &port.to_string(),
                "--tls-cert-file",
                &cert,
            ]
            .iter()
            .chain(&["--tls-key-file", &key, "--tls-auth-clients", "no", "--save", "", "--appendonly", "no"])
            .chain(&["--protected-mode", "no", "--dir", &dir.display().to_string()])
            .map(ToString::to_string)
            .collect(),
            cli_args: vec!["--tls".into(), "--cacert".into(), cert.clone()],
            dir,
            child: None,
        };
        redis.start()?;
        Ok(redis)
    }

    /// A Redis Cluster of three masters on `ports` (no replicas), every
    /// slot served.
    pub fn cluster(&self, ports: [u16; 3]) -> Result<Vec<Redis>> {
        self.cluster_of(&ports, 0)
    }

    /// A Redis Cluster on `ports` with `replicas` replicas per master (the
    /// first ports masters, as `redis-cli --cluster create` assigns them),
    /// every slot served. A master's failure is noticed after 1 s.
    pub fn cluster_of(&self, ports: &[u16], replicas: u32) -> Result<Vec<Redis>> {
        let nodes = ports
            .iter()
            .map(|&p| {
                let conf = format!("nodes-{p}.conf");
                self.redis(
                    p,
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        &conf,
                        "--cluster-node-timeout",
                        if replicas > 0 { "1000" } else { "3000" },
                        // Replicas sync at once, and may take over however
                        // long ago they last heard from their master.
                        "--repl-diskless-sync-delay",
                        "0",
                        "--cluster-replica-validity-factor",
                        "0",
                    ],
                )
            })
            .collect::<Result<Vec<_>>>()?;
        let mut args = vec!["--cluster".to_owned(), "create".to_owned()];
        args.extend(ports.iter().map(|p| format!("{STORE_IP}:{p}")));
        args.extend(["--cluster-replicas".to_owned(), replicas.to_string(), "--cluster-yes".to_owned()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.cli(ports[0], &args)?;
        let deadline = Instant::now() + Duration::from_secs(30);
        for &p in ports {
            while !self.cli(p, &["cluster", "info"])?.contains("cluster_state:ok") {
                if Instant::now() > deadline {
                    bail!("the cluster did not come up on {p}");
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        for &p in ports {
            if self.cli(p, &["role"])?.starts_with("slave") {
                while !self.cli(p, &["info", "replication"])?.contains("master_link_status:up") {
                    if Instant::now() > deadline {
                        bail!("the replica on {p} never synced");
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
        Ok(nodes)
    }

    /// The port of the master serving `key`'s slot now.
    pub fn master_of(&self, any_port: u16, key: &str) -> Result<u16> {
        let slot: u64 = self.cli(any_port, &["cluster", "keyslot", key])?.trim().parse()?;
        for line in self.cli(any_port, &["cluster", "nodes"])?.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            if f.len() < 9 || !f[2].contains("master") || f[2].contains("fail") {
                continue;
            }
            for range in &f[8..] {
                let (lo, hi) = range.split_once('-').unwrap_or((range, range));
                if let (Ok(lo), Ok(hi)) = (lo.parse::<u64>(), hi.parse::<u64>())
                    && (lo..=hi).contains(&slot)
                {
                    let port = f[1].split(['@', ':']).nth(1).context("a node's port")?;
                    return Ok(port.parse()?);
                }
            }
        }
        bail!("no master serves the slot of {key}")
    }

    /// Every key on the Redis on `port` and what it holds, one line each
    /// (what a reader of the store sees).
    pub fn contents(&self, port: u16) -> Result<String> {
        let mut out = String::new();
        for key in self.cli(port, &["--scan"])?.lines().filter(|k| !k.is_empty()) {
            out.push_str(key);
            out.push('\n');
            let kind = self.cli(port, &["type", key])?;
            let read: &[&str] = if kind.trim() == "hash" { &["hgetall", key] } else { &["get", key] };
            out.push_str(&self.cli(port, read)?);
        }
        Ok(out)
    }

    /// A budget's shares in the store on `port` (`-c`: a cluster's node
    /// redirects): every live node's share summed.
    pub fn shares(&self, port: u16, key: &str) -> Result<u64> {
        let fields = self.cli(port, &["-c", "hgetall", key])?;
        let lines: Vec<&str> = fields.lines().collect();
        Ok(lines
            .chunks(2)
            .filter(|f| f.len() == 2 && f[0] != "quiet")
            .filter_map(|f| f[1].split(' ').next()?.parse::<u64>().ok())
            .sum())
    }

    /// Whether budget `key` holds nothing any more on `port`: gone, or only
    /// fields given back (kept empty two leases: no share, no demand).
    pub fn given_back(&self, port: u16, key: &str) -> Result<bool> {
        let fields = self.cli(port, &["-c", "hgetall", key])?;
        let lines: Vec<&str> = fields.lines().collect();
        Ok(lines.chunks(2).all(|f| f.len() == 2 && f[1].starts_with("0 0 0 ")))
    }

    /// Whether `key` is in the store on `port`.
    pub fn exists(&self, port: u16, key: &str) -> Result<bool> {
        Ok(self.cli(port, &["-c", "exists", key])?.trim() == "1")
    }

    /// The keys in the store on `port`.
    pub fn keys(&self, port: u16) -> Result<usize> {
        Ok(self.cli(port, &["dbsize"])?.trim().parse()?)
    }

    /// The sessions' budgets in the store on `port` (not the epochs, the
    /// live nodes or the fingerprint the fleet keeps besides).
    /// The budgets left, split by who holds them: `(live, dead)` — those
    /// where a node among fleet `name`'s live nodes holds a unit, and those
    /// that hold only units of nodes no longer live (budgets whose every
    /// field was given back, kept empty two leases, are neither) (a node killed
    /// before it gave them back: they end when a live node next asks for
    /// the budget, or with the key's TTL); and the longest TTL left (ms).
    pub fn budget_holders(&self, port: u16, name: &str) -> Result<(usize, usize, i64)> {
        // One script, run by the store itself: a scan from outside costs a
        // process per key.
        const COUNT: &str = r"
            local live = {}
            for _, f in ipairs(redis.call('HKEYS', ARGV[1])) do live[f] = true end
            local held, dead, ttl = 0, 0, 0
            for _, k in ipairs(redis.call('KEYS', 'limiter:*')) do
              if not (k:find(':epoch$') or k:find(':nodes$') or k:find(':wanted$') or k:find(':hash%-key%-fingerprint$')) then
                local kv = redis.call('HGETALL', k)
                local holds, given = false, true
                for i = 1, #kv, 2 do
                  local share = tonumber(string.match(kv[i + 1], '^(%d+)'))
                  if live[kv[i]] and share and share > 0 then holds = true end
                  if not string.find(kv[i + 1], '^0 0 0 ') then given = false end
                end
                if holds then held = held + 1
                elseif not given then dead = dead + 1; ttl = math.max(ttl, redis.call('PTTL', k)) end
              end
            end
            return {held, dead, ttl}";
        let out = self.cli(port, &["eval", COUNT, "0", &format!("limiter:{{{name}}}:nodes")])?;
        let n: Vec<i64> = out.lines().filter_map(|l| l.trim().parse().ok()).collect();
        anyhow::ensure!(n.len() == 3, "the store's count of budgets: {out:?}");
        Ok((n[0] as usize, n[1] as usize, n[2]))
    }

    /// Session budgets that hold a share or a demand (those whose every
    /// field was given back stay two leases, empty, and are not counted;
    /// [`Self::keys`] sees them until they expire).
    pub fn session_budgets(&self, port: u16) -> Result<usize> {
        const COUNT: &str = r"
            local n = 0
            for _, k in ipairs(redis.call('KEYS', 'limiter:{*:s:*}:*')) do
              if not k:find(':epoch$') then
                local kv = redis.call('HGETALL', k)
                for i = 2, #kv, 2 do
                  if not string.find(kv[i], '^0 0 0 ') then n = n + 1; break end
                end
              end
            end
            return n";
        Ok(self.cli(port, &["eval", COUNT, "0"])?.trim().parse()?)
    }
}

/// The wall clock of a Redis started by [`StoreNet::redis_with_clock`].
pub struct Clock {
    file: PathBuf,
}

impl Clock {
    /// Steps the clock to `secs` from the machine's (either way).
    pub fn step(&self, secs: i64) {
        fs::write(&self.file, format!("{secs}\n")).expect("the clock's offset file");
    }
}

/// The shim [`StoreNet::redis_with_clock`] preloads: the real clocks
/// through the system call (no libc lookup, so nothing recurses), the
/// offset read afresh on every call.
const CLOCK_SHIM: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static long long offset_seconds(void) {
    const char *path = getenv("LIMITER_CLOCK_OFFSET_FILE");
    char buf[32] = {0};
    if (!path) return 0;
    int fd = (int)syscall(SYS_open, path, O_RDONLY);
    if (fd < 0) return 0;
    long n = syscall(SYS_read, fd, buf, sizeof buf - 1);
    syscall(SYS_close, fd);
    return n > 0 ? atoll(buf) : 0;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    long r = syscall(SYS_clock_gettime, id, ts);
    if (r == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) ts->tv_sec += offset_seconds();
    return (int)r;
}

int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec ts;
    (void)tz;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return -1;
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
    return 0;
}

time_t time(time_t *t) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (t) *t = ts.tv_sec;
    return ts.tv_sec;
}
"#;

/// A `redis-server` (or `redis-sentinel`) the test started (stopped with
/// it, by its pid).
pub struct Redis {
    netns: PathBuf,
    host: String,
    pub port: u16,
    /// `redis-server`, or `redis-sentinel`.
    program: &'static str,
    /// Its environment besides the test's.
    env: Vec<(String, String)>,
    args: Vec<String>,
    /// What `redis-cli` needs besides the address (`--tls --cacert …`).
    cli_args: Vec<String>,
    pub dir: PathBuf,
    child: Option<Child>,
}

impl Redis {
    /// A Redis on `host:port` in `sb`'s namespace, keeping nothing on
    /// disk, with `extra` arguments; answering when this returns.
    pub fn start_in(
        sb: &Sandbox,
        host: &str,
        port: u16,
        dir: &std::path::Path,
        extra: &[String],
    ) -> Result<Self> {
        fs::create_dir_all(dir)?;
        let mut redis = Self::new_in(sb, host, port, dir, extra);
        redis.start()?;
        Ok(redis)
    }

    /// [`Self::start_in`], not started yet.
    fn new_in(sb: &Sandbox, host: &str, port: u16, dir: &std::path::Path, extra: &[String]) -> Self {
        let mut args: Vec<String> =
            ["--bind", host, "--port", &port.to_string(), "--save", "", "--appendonly", "no"]
                .iter()
                .map(ToString::to_string)
                .collect();
        args.extend(["--protected-mode".into(), "no".into(), "--dir".into(), dir.display().to_string()]);
        args.extend(extra.iter().cloned());
        Self {
            netns: sb.netns_path.clone(),
            host: host.to_owned(),
            port,
            program: "redis-server",
            env: Vec::new(),
            args,
            cli_args: Vec::new(),
            dir: dir.to_path_buf(),
            child: None,
        }
    }

    /// `redis-cli` against it.
    pub fn cli(&self, args: &[&str]) -> Result<String> {
        let out = process::run_with_deadline(
            Command::new("nsenter")
                .arg(format!("--net={}", self.netns.display()))
                .args(["redis-cli", "-h", &self.host, "-p", &self.port.to_string()])
                .args(&self.cli_args)
                .args(args),
            Duration::from_secs(30),
        );
        if !out.status.success() {
            bail!("redis-cli {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Starts it (again: a restart starts empty, nothing is saved).
    pub fn start(&mut self) -> Result<()> {
        let log = fs::File::create(self.dir.join("redis.log"))?;
        // nsenter execs the server: the child's pid is the server's.
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", self.netns.display())).arg(self.program).args(&self.args);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let child = cmd
            .stdout(log.try_clone()?)
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("start {} (installed by `cargo xtask setup`)", self.program))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let ping = Command::new("nsenter")
                .arg(format!("--net={}", self.netns.display()))
                .args(["redis-cli", "-h", &self.host, "-p", &self.port.to_string()])
                .args(&self.cli_args)
                .arg("ping")
                .output()?;
            // A server with a password answers NOAUTH: it is up.
            let said = String::from_utf8_lossy(&ping.stdout);
            if said.contains("PONG") || said.contains("NOAUTH") {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("redis-server on {} did not answer:\n{}", self.port, self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until it has run for `age`.
    pub fn wait_older_than(&self, age: Duration) -> Result<()> {
        let deadline = Instant::now() + age + Duration::from_secs(10);
        loop {
            let mut cmd = Command::new("nsenter");
            cmd.arg(format!("--net={}", self.netns.display()))
                .args(["redis-cli", "-h", &self.host, "-p", &self.port.to_string()])
                .args(&self.cli_args);
            if let Some(i) = self.args.iter().position(|a| a == "--requirepass") {
                cmd.env("REDISCLI_AUTH", &self.args[i + 1]);
            }
            let info = cmd.args(["info", "server"]).output()?;
            let up = String::from_utf8_lossy(&info.stdout)
                .lines()
                .find_map(|l| l.strip_prefix("uptime_in_seconds:")?.trim().parse::<u64>().ok());
            if up.is_some_and(|s| Duration::from_secs(s) >= age) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("redis-server on {} reports no uptime past {age:?}", self.port);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Its process id, while it runs.
    pub fn process_id(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn pid(&self) -> Option<Pid> {
        self.child.as_ref().map(|c| Pid::from_raw(c.id() as i32))
    }

    /// `kill -9`: its data is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Freezes it (`SIGSTOP`): connections stay open, nothing answers.
    pub fn pause(&self) {
        if let Some(pid) = self.pid() {
            kill(pid, Signal::SIGSTOP).expect("stop redis");
        }
    }

    pub fn resume(&self) {
        if let Some(pid) = self.pid() {
            kill(pid, Signal::SIGCONT).expect("continue redis");
        }
    }

    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
    }

    /// Its address as `fleet.store` names a node.
    pub fn addr(&self) -> SocketAddr {
        format!("{}:{}", self.host, self.port).parse().expect("an address")
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.resume();
        self.kill();
    }
}

/// One daemon of a fleet: its namespace (joined to the store's bridge),
/// the daemon, and where it listens on the bridge.
pub struct Node {
    pub daemon: Daemon,
    pub addr: SocketAddr,
    pub config: PathBuf,
    pub sb: Sandbox,
}

/// The key every node of a test fleet shares (`fleet.hashKeyFile`).
pub const HASH_KEY: &str = "fleet-test-hash-key-0123456789abcdef";

/// `n` daemons in front of `upstream` (each with a listener of its own in
/// its namespace), joined to `net`, with `fleet` keys appended to the
/// configuration (`fleet.store` among them), once the quiet of the
/// fleet's first start is over ([`wait_quiet_over`]).
pub fn fleet(net: &StoreNet, upstream: &Upstream, n: usize, fleet: &str) -> Result<Vec<Node>> {
    let nodes: Vec<Node> = (0..n)
        .map(|_| start_node(net, upstream, fleet, false, &[], HASH_KEY, false))
        .collect::<Result<_>>()?;
    wait_quiet_over(&nodes)?;
    Ok(nodes)
}

/// Waits until no node sees a quiet group: a store that never held the
/// fleet's data (its first start) is one that may have lost it, so no
/// share grows for a lease after the first node reads it
/// (`limiter_fleet_quiet_groups`).
pub fn wait_quiet_over(nodes: &[Node]) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    for n in nodes {
        loop {
            let page = n.daemon.admin_get("/metrics").unwrap_or_default();
            // No such metric on a page scraped: no quiet to wait for (a
            // node without `fleet.store`, or the fleet before the
            // simulation, for a run of these tests against it with
            // `LIMITER_BIN=<older build>`).
            let none = page.contains("limiter_build_info") && !page.contains("limiter_fleet_quiet_groups");
            if none || crate::try_metric(&page, "limiter_fleet_quiet_groups").is_some_and(|q| q == 0.0) {
                break;
            }
            if Instant::now() > deadline {
                bail!("the fleet's quiet did not end on {}:\n{}", n.addr, n.daemon.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok(())
}

/// One node of [`fleet`] (logging at debug, as tests do), once it sees no
/// quiet.
pub fn node(net: &StoreNet, upstream: &Upstream, fleet: &str) -> Result<Node> {
    let node = start_node(net, upstream, fleet, false, &[], HASH_KEY, false)?;
    wait_quiet_over(std::slice::from_ref(&node))?;
    Ok(node)
}

/// [`node`] with a hash key of its own in its `fleet.hashKeyFile`.
pub fn node_with_key(net: &StoreNet, upstream: &Upstream, fleet: &str, hash_key: &str) -> Result<Node> {
    start_node(net, upstream, fleet, false, &[], hash_key, false)
}

/// [`node`] with these environment variables (`SSL_CERT_FILE`, say).
pub fn node_with_env(net: &StoreNet, upstream: &Upstream, fleet: &str, env: &[(&str, &str)]) -> Result<Node> {
    let node = start_node(net, upstream, fleet, false, env, HASH_KEY, false)?;
    wait_quiet_over(std::slice::from_ref(&node))?;
    Ok(node)
}

/// A node logging at its configuration's level, as in production (for
/// the benchmark).
pub fn quiet_node(net: &StoreNet, upstream: &Upstream, fleet: &str) -> Result<Node> {
    let node = start_node(net, upstream, fleet, true, &[], HASH_KEY, false)?;
    wait_quiet_over(std::slice::from_ref(&node))?;
    Ok(node)
}

/// [`node`] configured as every other twin is: the same `kernel.pinPath`
/// and `http.listen` (`0.0.0.0:8080`), on the same host: what a daemon's
/// name in the fleet was made of before it carried random bits of its own
/// (cloned machines, containers that share a host name).
pub fn twin_node(net: &StoreNet, upstream: &Upstream, fleet: &str) -> Result<Node> {
    let node = start_node(net, upstream, fleet, false, &[], HASH_KEY, true)?;
    wait_quiet_over(std::slice::from_ref(&node))?;
    Ok(node)
}

/// A node in a sandbox of its own on the store's network; `twin`: with
/// the `kernel.pinPath` and `http.listen` every twin has.
fn start_node(
    net: &StoreNet,
    upstream: &Upstream,
    fleet: &str,
    quiet: bool,
    env: &[(&str, &str)],
    hash_key: &str,
    twin: bool,
) -> Result<Node> {
    let sb = Sandbox::new()?;
    let ip = net.join(&sb)?;
    let listener = sb.in_netns(|| std::net::TcpListener::bind("127.0.0.1:0").expect("an upstream port"));
    let up = upstream.also_on(listener);
    let key = sb.dir.join("fleet.key");
    write_secret(&key, hash_key);
    let addr: SocketAddr = format!("{ip}:8080").parse()?;
    let config = sb.dir.join("limiter.ini");
    let (pins, listen) = if twin {
        ("/sys/fs/bpf/limiter-twin".to_owned(), "0.0.0.0:8080".to_owned())
    } else {
        (sb.pin_path.display().to_string(), addr.to_string())
    };
    fs::write(
        &config,
        format!(
            "kernel.enabled = false\nkernel.pinPath = {pins}\nadmin.listen = 127.0.0.1:9901\nadmin.socket = {}\n\
             http.listen = {listen}\nhttp.upstream = {up}\nfleet.hashKeyFile = {}\n{fleet}\n",
            sb.dir.join("admin.sock").display(),
            key.display(),
        ),
    )?;
    let daemon = Daemon::start_inside_with(&sb, &config, quiet, env)?;
    Ok(Node { daemon, addr, config, sb })
}

impl Node {
    /// Stops the daemon with `kill -9` (its fleet permits are left in the
    /// store, to end with their lease).
    pub fn kill9(&mut self) {
        self.daemon.signal(Signal::SIGKILL);
        let _ = self.daemon.wait();
    }

    /// Starts the daemon again on the same configuration (the same node).
    pub fn restart(&mut self) -> Result<()> {
        self.daemon = Daemon::start_inside(&self.sb, &self.config, &[])?;
        Ok(())
    }
}
