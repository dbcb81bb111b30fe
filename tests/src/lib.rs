//! Harness for limiter's black-box tests: a throwaway network namespace and
//! child cgroup per test, the real daemon binary, real sockets.
//!
//! Why it is shaped like this (docs/TOOLCHAIN.md, "Kernel-test isolation rules"): a network namespace switch
//! applies to one thread, cgroup membership to a whole process, and a socket
//! keeps the namespace and cgroup it was created in. So sockets are created
//! on short-lived threads that entered the test's namespace, and a
//! listener is created while this process sits in the test's cgroup (it is
//! moved back at once); accepted sockets inherit the listener's cgroup.
//! Tests therefore run one at a time (`--test-threads=1`).
//!
//! The daemon itself runs in the host's namespace and is pointed at the
//! test's namespace and cgroup by its configuration, as an operator would
//! point it at a container's.

use std::{
    fs::{self, File},
    io::{self, Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream, UdpSocket},
    os::fd::AsFd as _,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

pub mod bench;
pub mod bpf;
pub mod client;
pub mod closed_loop;
pub mod counted;
pub mod differential;
pub mod h2raw;
pub mod haproxy;
pub mod in_process;
pub mod jetty;
pub mod matrix;
pub mod nginx;
pub mod packet;
pub mod peer;
pub mod process;
pub mod recorder;
pub mod relay;
pub mod replay;
pub mod sched;
pub mod scrape;
pub mod shed_load;
pub mod store;
pub mod tls;
pub mod upstream;
pub mod user;
pub mod wire;

use anyhow::{Context as _, Result, bail, ensure};
use nix::{
    sched::{CloneFlags, setns},
    sys::signal::{Signal, kill},
    unistd::Pid,
};
use serde_json::Value;

/// The root of the cgroup v2 mount, found as the daemon finds it (the
/// first `cgroup2` line of `/proc/self/mounts`: `/sys/fs/cgroup/unified`
/// here, `/sys/fs/cgroup` on a stock Debian).
pub fn cgroup_root() -> PathBuf {
    limiter::kernel::env::cgroup2_mount().expect("a cgroup v2 mount (kernel tests need one)")
}

/// The daemon binary under test.
pub fn limiter_bin() -> PathBuf {
    std::env::var_os("LIMITER_BIN")
        .map_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/debug/limiter"), PathBuf::from)
}

/// Runs `limiter ARGS` to completion (within [`process::DEADLINE`]).
pub fn limiter(args: &[&str]) -> Output {
    process::limiter_with_deadline(args, process::DEADLINE)
}

/// Runs `f` on a short-lived thread that entered `netns` (a namespace
/// switch applies to one thread).
pub fn in_netns<T: Send + 'static>(netns: &File, f: impl FnOnce() -> T + Send + 'static) -> T {
    let netns = netns.try_clone().expect("dup netns fd");
    std::thread::spawn(move || {
        setns(netns.as_fd(), CloneFlags::CLONE_NEWNET).expect("setns");
        f()
    })
    .join()
    .expect("netns thread")
}

/// Why this process cannot run kernel tests, if it cannot: they need root
/// (CAP_BPF, CAP_NET_ADMIN, CAP_SYS_ADMIN) and a cgroup v2 mount.
pub fn kernel_tests_blocked() -> Option<String> {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    let caps = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
        .unwrap_or(0);
    if caps & (1 << 39) == 0 || caps & (1 << 12) == 0 || caps & (1 << 21) == 0 {
        return Some("kernel tests need root (CAP_BPF, CAP_NET_ADMIN, CAP_SYS_ADMIN)".into());
    }
    if let Err(e) = limiter::kernel::env::cgroup2_mount() {
        return Some(format!("kernel tests need a cgroup v2 mount: {e}"));
    }
    None
}

/// Fails the calling test, with the reason, unless kernel tests can run
/// here. (They are `#[ignore]`d, so a plain `cargo test` lists them as
/// ignored; `cargo xtask test` runs them, and there a missing privilege is
/// a failure, never a pass.)
#[macro_export]
macro_rules! require_kernel {
    () => {
        if let Some(why) = $crate::kernel_tests_blocked() {
            panic!("{why}");
        }
    };
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// One test's network namespace, cgroup and pin directory, removed on drop.
pub struct Sandbox {
    pub name: String,
    pub netns_path: PathBuf,
    pub cgroup: PathBuf,
    pub pin_path: PathBuf,
    pub dir: PathBuf,
    netns: File,
    home_cgroup: PathBuf,
}

impl Sandbox {
    pub fn new() -> Result<Self> {
        let name = format!("lt-{}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed));
        run("ip", &["netns", "add", &name])?;
        run("ip", &["-n", &name, "link", "set", "lo", "up"])?;
        let netns_path = PathBuf::from(format!("/var/run/netns/{name}"));
        let netns = File::open(&netns_path).context("open netns")?;
        let cgroup = cgroup_root().join(&name);
        fs::create_dir(&cgroup).context("create child cgroup")?;
        let dir = std::env::temp_dir().join(&name);
        fs::create_dir_all(&dir)?;
        Ok(Self {
            pin_path: PathBuf::from(format!("/sys/fs/bpf/{name}")),
            home_cgroup: home_cgroup()?,
            netns_path,
            netns,
            cgroup,
            dir,
            name,
        })
    }

    /// A new handle on this namespace, for threads that enter it.
    pub fn netns_file(&self) -> File {
        self.netns.try_clone().expect("dup netns fd")
    }

    /// The inode `bpftool link` reports for this namespace.
    pub fn netns_inode(&self) -> u64 {
        self.netns.metadata().map(|m| m.ino()).unwrap_or(0)
    }

    /// Writes a configuration targeting this sandbox; `extra` is appended.
    pub fn config(&self, ports: &str, extra: &str) -> PathBuf {
        let path = self.dir.join("limiter.ini");
        let [admin, listen] = free_ports();
        let text = format!(
            "kernel.ports = {ports}\nkernel.pinPath = {}\nkernel.cgroup = {}\nkernel.netns = {}\nadmin.listen = 127.0.0.1:{admin}\nadmin.socket = {}\nhttp.listen = 127.0.0.1:{listen}\n{extra}",
            self.pin_path.display(),
            self.cgroup.display(),
            self.netns_path.display(),
            self.dir.join("admin.sock").display(),
        );
        fs::write(&path, text).expect("write config");
        path
    }

    /// Runs `f` on a thread inside this namespace.
    pub fn in_netns<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        in_netns(&self.netns, f)
    }

    /// Runs `f` while this whole process sits in the sandbox cgroup.
    fn in_cgroup<T>(&self, f: impl FnOnce() -> T) -> T {
        let pid = std::process::id().to_string();
        fs::write(self.cgroup.join("cgroup.procs"), &pid).expect("enter cgroup");
        let out = f();
        fs::write(self.home_cgroup.join("cgroup.procs"), &pid).expect("leave cgroup");
        out
    }

    /// A TCP listener on `addr` (in this namespace, in this cgroup, so the
    /// gate counts its connections).
    pub fn listen(&self, addr: &str, backlog: i32) -> TcpListener {
        self.in_cgroup(|| self.listen_uncounted_with(addr, backlog))
    }

    /// A listener in this namespace but outside the cgroup: not counted.
    pub fn listen_uncounted(&self, addr: &str) -> TcpListener {
        self.listen_uncounted_with(addr, 128)
    }

    /// A dual-stack listener on `[::]:port` (IPv4 clients arrive as
    /// IPv4-mapped IPv6), counted.
    pub fn listen_dual_stack(&self, port: u16, backlog: i32) -> TcpListener {
        self.in_cgroup(|| self.listen_with(&format!("[::]:{port}"), backlog, false))
    }

    fn listen_uncounted_with(&self, addr: &str, backlog: i32) -> TcpListener {
        self.listen_with(addr, backlog, true)
    }

    fn listen_with(&self, addr: &str, backlog: i32, v6_only: bool) -> TcpListener {
        let addr: SocketAddr = addr.parse().expect("address");
        self.in_netns(move || {
            let domain = socket2::Domain::for_address(addr);
            let s = socket2::Socket::new(domain, socket2::Type::STREAM, None).expect("socket");
            s.set_reuse_address(true).expect("SO_REUSEADDR");
            if addr.is_ipv6() {
                s.set_only_v6(v6_only).expect("IPV6_V6ONLY");
            }
            s.bind(&addr.into()).expect("bind");
            s.listen(backlog).expect("listen");
            TcpListener::from(s)
        })
    }

    /// A client connection made from inside the counted cgroup.
    pub fn connect_from_cgroup(&self, addr: &str) -> io::Result<TcpStream> {
        self.in_cgroup(|| self.connect(addr))
    }

    /// A UDP socket bound in this namespace.
    pub fn udp(&self, addr: &str) -> UdpSocket {
        let addr = addr.to_owned();
        self.in_netns(move || UdpSocket::bind(addr).expect("bind udp"))
    }

    /// A blocking client connection (client sockets live in the test's own
    /// cgroup, so they are never counted).
    pub fn connect(&self, addr: &str) -> io::Result<TcpStream> {
        let addr: SocketAddr = addr.parse().expect("address");
        self.in_netns(move || TcpStream::connect_timeout(&addr, Duration::from_secs(3)))
    }

    /// `n` non-blocking connects fired back to back from one thread per
    /// CPU at once (so handshakes race on every CPU); returns the sockets.
    pub fn connect_burst(&self, addr: &str, n: usize) -> Vec<socket2::Socket> {
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
        let start = std::sync::Arc::new(std::sync::Barrier::new(threads));
        let handles: Vec<_> = (0..threads)
            .map(|i| {
                let share = n / threads + usize::from(i < n % threads);
                let netns = self.netns.try_clone().expect("dup netns fd");
                let start = start.clone();
                let addr = addr.to_owned();
                std::thread::spawn(move || {
                    setns(netns.as_fd(), CloneFlags::CLONE_NEWNET).expect("setns");
                    start.wait();
                    connect_nonblocking(&addr, share)
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().expect("burst thread")).collect()
    }
}

/// `n` non-blocking connects from the calling thread's namespace.
fn connect_nonblocking(addr: &str, n: usize) -> Vec<socket2::Socket> {
    let addr: SocketAddr = addr.parse().expect("address");
    {
        {
            (0..n)
                .map(|_| {
                    let s =
                        socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::STREAM, None)
                            .expect("socket");
                    s.set_nonblocking(true).expect("nonblocking");
                    let _ = s.connect(&addr.into()); // EINPROGRESS or ECONNREFUSED
                    s
                })
                .collect()
        }
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        // Only this sandbox's own objects, by their own names.
        if self.pin_path.exists() {
            for entry in fs::read_dir(&self.pin_path).into_iter().flatten().flatten() {
                let _ = fs::remove_file(entry.path());
            }
            let _ = fs::remove_dir(&self.pin_path);
        }
        let _ = process::try_run_with_deadline(
            Command::new("ip").args(["netns", "del", &self.name]),
            process::DEADLINE,
        );
        let _ = fs::remove_dir(&self.cgroup);
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// This process's cgroup v2 directory, from `/proc/self/cgroup` ("0::/path").
fn home_cgroup() -> Result<PathBuf> {
    let text = fs::read_to_string("/proc/self/cgroup")?;
    let rel =
        text.lines().find_map(|l| l.strip_prefix("0::")).context("no cgroup v2 line in /proc/self/cgroup")?;
    Ok(cgroup_root().join(rel.trim_start_matches('/')))
}

/// A port free on the host's loopback right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port()
}

/// `N` distinct free ports (each held until all are picked: two calls of
/// [`free_port`] may return the same one).
pub fn free_ports<const N: usize>() -> [u16; N] {
    let held: Vec<TcpListener> =
        (0..N).map(|_| TcpListener::bind("127.0.0.1:0").expect("free port")).collect();
    std::array::from_fn(|i| held[i].local_addr().expect("its port").port())
}

/// Runs `cmd ARGS` to completion (within [`process::DEADLINE`]); its
/// stdout, or its stderr as the error.
pub fn run(cmd: &str, args: &[&str]) -> Result<String> {
    let out = process::run_with_deadline(Command::new(cmd).args(args), process::DEADLINE);
    // Some tools (bpftool --json) report their error on stdout.
    let said = if out.stderr.is_empty() { &out.stdout } else { &out.stderr };
    ensure!(
        out.status.success(),
        "{cmd} {} ({}): {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(said)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The repository's root (this crate lives one level below it).
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}

/// Writes a file only its owner may read (mode 0600), as the daemon
/// requires of `admin.tokenFile`.
pub fn write_secret(path: &Path, contents: &str) {
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    f.write_all(contents.as_bytes()).unwrap();
}

/// A running daemon, killed (by its own pid) on drop.
pub struct Daemon {
    child: Child,
    pub config: PathBuf,
    pub admin: SocketAddr,
    /// The admin socket (`admin.socket`), where every path but
    /// `/metrics` and `/healthz` is asked.
    pub socket: Option<PathBuf>,
    log: PathBuf,
    /// The namespace the daemon itself runs in, when not the test's.
    netns: Option<File>,
    /// Cleared before the child is reaped, so the watchdog never signals a
    /// pid that may have been reused.
    watched: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// How long a test may keep a daemon: a test still holding one after this
/// is hung, and killing the daemon makes it fail (its sockets close)
/// instead of hanging CI.
pub const DAEMON_LIFETIME: Duration = Duration::from_secs(600);

/// Kills `pid` after [`DAEMON_LIFETIME`] unless the returned flag is
/// cleared first, and says so in the daemon's log.
fn watchdog(pid: Pid, log: &Path) -> std::sync::Arc<std::sync::atomic::AtomicBool> {
    let watched = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let (flag, log) = (watched.clone(), log.to_path_buf());
    std::thread::spawn(move || {
        let deadline = Instant::now() + DAEMON_LIFETIME;
        while Instant::now() < deadline {
            if !flag.load(Ordering::SeqCst) {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        if flag.load(Ordering::SeqCst) {
            let _ = kill(pid, Signal::SIGKILL);
            if let Ok(mut f) = fs::OpenOptions::new().append(true).open(&log) {
                let _ =
                    writeln!(f, "test harness: killed the daemon after {DAEMON_LIFETIME:?} (a hung test)");
            }
        }
    });
    watched
}

impl Daemon {
    /// Starts `limiter run --config CONFIG` and waits until its admin
    /// listener answers.
    pub fn start(config: &Path, extra_args: &[&str]) -> Result<Self> {
        Self::start_binary(&limiter_bin(), config, extra_args)
    }

    /// [`Self::start`] with another build of the daemon (benchmarks compare
    /// revisions).
    pub fn start_binary(bin: &Path, config: &Path, extra_args: &[&str]) -> Result<Self> {
        let mut cmd = Command::new(bin);
        cmd.arg("run").arg("--config").arg(config).args(extra_args);
        Self::spawn(cmd, config, None)
    }

    /// [`Self::start`] logging at the config's `admin.logLevel` (info by
    /// default) instead of debug, as in production: benchmarks, where
    /// debug would also log each HTTP/2 frame and TLS handshake step
    /// (h2's and rustls' own events) and halve the proxy's rate.
    pub fn start_with_config_log_level(config: &Path) -> Result<Self> {
        let mut cmd = Command::new(limiter_bin());
        cmd.arg("run").arg("--config").arg(config).env_remove("LIMITER_LOG");
        Self::spawn(cmd, config, None)
    }

    /// [`Self::start`] with these environment variables set (systemd's
    /// `NOTIFY_SOCKET`, `JOURNAL_STREAM`).
    pub fn start_with_env(config: &Path, env: &[(&str, &str)]) -> Result<Self> {
        let mut cmd = Command::new(limiter_bin());
        cmd.arg("run").arg("--config").arg(config).envs(env.iter().copied());
        Self::spawn(cmd, config, None)
    }

    /// Starts the daemon inside the sandbox: in its network namespace (so
    /// its proxy and admin listeners are there) and in its cgroup (so the
    /// gate counts the proxy's own connections).
    pub fn start_inside(sb: &Sandbox, config: &Path, extra_args: &[&str]) -> Result<Self> {
        Self::spawn(Self::inside(sb, config, extra_args), config, Some(sb.netns_file()))
    }

    /// [`Self::start_inside`] logging at the config's `admin.logLevel`, as
    /// in production (for benchmarks).
    pub fn start_inside_at_config_log_level(sb: &Sandbox, config: &Path) -> Result<Self> {
        let mut cmd = Self::inside(sb, config, &[]);
        cmd.env_remove("LIMITER_LOG");
        Self::spawn(cmd, config, Some(sb.netns_file()))
    }

    /// [`Self::start_inside`] at the config's log level when `quiet`, with
    /// `env` set.
    pub fn start_inside_with(sb: &Sandbox, config: &Path, quiet: bool, env: &[(&str, &str)]) -> Result<Self> {
        let mut cmd = Self::inside(sb, config, &[]);
        if quiet {
            cmd.env_remove("LIMITER_LOG");
        }
        cmd.envs(env.iter().copied());
        Self::spawn(cmd, config, Some(sb.netns_file()))
    }

    /// `limiter run` in the sandbox's network namespace and cgroup.
    fn inside(sb: &Sandbox, config: &Path, extra_args: &[&str]) -> Command {
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            // nsenter switches the network namespace only (`ip netns exec`
            // would also remount /sys, hiding the cgroup v2 mount below it).
            .arg(r#"echo $$ > "$1/cgroup.procs" && shift && exec nsenter --net="$@""#)
            .arg("sh")
            .arg(&sb.cgroup)
            .arg(&sb.netns_path)
            .arg(limiter_bin())
            .arg("run")
            .arg("--config")
            .arg(config)
            .args(extra_args);
        cmd
    }

    /// [`Self::start_inside`] without waiting for anything: the daemon
    /// may still be starting (or fail to) when this returns.
    pub fn launch_inside(sb: &Sandbox, config: &Path) -> Result<Self> {
        Self::launch(Self::inside(sb, config, &[]), config, Some(sb.netns_file()))
    }

    fn spawn(cmd: Command, config: &Path, netns: Option<File>) -> Result<Self> {
        let mut daemon = Self::launch(cmd, config, netns)?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(status) = daemon.child.try_wait()? {
                bail!("daemon exited during start-up ({status}):\n{}", daemon.log());
            }
            if daemon.admin_get("/healthz").is_ok() {
                return Ok(daemon);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        bail!("daemon did not answer on {} within 10 s:\n{}", daemon.admin, daemon.log())
    }

    fn launch(mut cmd: Command, config: &Path, netns: Option<File>) -> Result<Self> {
        let text = fs::read_to_string(config)?;
        let admin: SocketAddr = match text.lines().find_map(|l| l.strip_prefix("admin.listen = ")) {
            Some(addr) => addr.parse()?,
            // A file with sections (`[admin]` then `listen = ...`): as the daemon reads it.
            None => limiter::config::Config::load(config).map_err(|e| anyhow::anyhow!("{e}"))?.admin.listen.0,
        };
        let socket = limiter::config::Config::load(config).ok().and_then(|c| c.admin.socket);
        let log = config.with_extension(format!("log.{}", SEQ.fetch_add(1, Ordering::Relaxed)));
        // Debug unless the caller chose (or removed) LIMITER_LOG.
        if cmd.get_envs().all(|(k, _)| k != "LIMITER_LOG") {
            cmd.env("LIMITER_LOG", "debug");
        }
        let child = cmd.stdout(Stdio::null()).stderr(File::create(&log)?).spawn()?;
        let watched = watchdog(Pid::from_raw(child.id() as i32), &log);
        Ok(Self { child, config: config.to_path_buf(), admin, socket, log, netns, watched })
    }

    /// Whether the daemon has exited (its status, reaped), without waiting.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// GET on the admin API: `/metrics` and `/healthz` on the TCP
    /// listener (from the daemon's namespace), every other path on the
    /// admin socket; the body of a 200.
    pub fn admin_get(&self, path: &str) -> Result<String> {
        if !matches!(path, "/metrics" | "/healthz") {
            return self.admin_socket("GET", path);
        }
        let (admin, path) = (self.admin, path.to_owned());
        match &self.netns {
            Some(netns) => in_netns(netns, move || http_get(admin, &path)),
            None => http_get(admin, &path),
        }
    }

    /// POST on the admin socket; the body of a 200.
    pub fn admin_post(&self, path: &str) -> Result<String> {
        self.admin_socket("POST", path)
    }

    fn admin_socket(&self, method: &str, path: &str) -> Result<String> {
        let socket = self.socket.as_ref().context("the daemon's configuration sets no admin.socket")?;
        let (status, body) = unix_request(socket, method, path)?;
        ensure!(status == 200, "{method} {path}: {status} {body}");
        Ok(body)
    }

    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    /// What the daemon logged so far (its log file always exists: a test
    /// that cannot read it fails, it does not read an empty log).
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log)
            .unwrap_or_else(|e| panic!("the daemon's log {}: {e}", self.log.display()))
    }

    pub fn signal(&self, signal: Signal) {
        kill(self.pid(), signal).expect("signal the daemon");
    }

    /// Sends SIGHUP and waits until the log shows the reload's outcome.
    pub fn reload(&self) -> String {
        let before = self.log().matches("reload").count();
        self.signal(Signal::SIGHUP);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            let log = self.log();
            if log.matches("reload").count() > before {
                return log.lines().rfind(|l| l.contains("reload")).unwrap_or("").to_owned();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("no reload outcome logged:\n{}", self.log());
    }

    /// Waits for the daemon to exit and returns its status code.
    /// Waits (at most [`process::DEADLINE`]) for the daemon to exit and
    /// returns its status code.
    pub fn wait(&mut self) -> Option<i32> {
        assert!(
            process::exited_within(self.pid(), process::DEADLINE),
            "the daemon did not exit within {:?}:\n{}",
            process::DEADLINE,
            self.log()
        );
        self.watched.store(false, Ordering::SeqCst);
        self.child.wait().ok().and_then(|s| s.code())
    }

    /// Lets this daemon outlive [`DAEMON_LIFETIME`]: a benchmark's runs are
    /// longer than any test's.
    #[must_use]
    pub fn unwatched(self) -> Self {
        self.watched.store(false, Ordering::SeqCst);
        self
    }

    pub fn metrics(&self) -> String {
        self.admin_get("/metrics").expect("GET /metrics")
    }

    /// One sample of `/metrics`; fails the test when the page lacks it.
    pub fn metric(&self, sample: &str) -> f64 {
        metric(&self.metrics(), sample)
    }
}

/// The value of one sample of a Prometheus page: `sample` is its name and
/// labels exactly as the page writes them (`limiter_http_in_flight{pool="normal"}`).
/// Fails the test when the page has no such sample, so a renamed metric
/// or label cannot pass as a zero.
pub fn metric(page: &str, sample: &str) -> f64 {
    try_metric(page, sample).unwrap_or_else(|| panic!("no sample `{sample}` in /metrics:\n{page}"))
}

/// [`metric`] for a sample that may rightly be absent.
pub fn try_metric(page: &str, sample: &str) -> Option<f64> {
    let sample = sample.trim_end();
    page.lines()
        .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' '))
        .map(|v| v.trim().parse().unwrap_or_else(|_| panic!("`{sample}` has no number: `{v}`")))
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.watched.store(false, Ordering::SeqCst);
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One HTTP/1.0 request on the admin socket at `socket`: status and body.
pub fn unix_request(socket: &Path, method: &str, path: &str) -> Result<(u16, String)> {
    let mut s = std::os::unix::net::UnixStream::connect(socket)
        .with_context(|| format!("connecting to {}", socket.display()))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "{method} {path} HTTP/1.0\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n")?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)?;
    let (head, body) = raw.split_once("\r\n\r\n").context("no header end")?;
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).context("no status")?;
    Ok((status, body.to_owned()))
}

/// A one-shot HTTP/1.0 GET returning the body of a 200.
pub fn http_get(addr: SocketAddr, path: &str) -> Result<String> {
    http_call(addr, "GET", path)
}

/// A one-shot HTTP/1.0 POST (no body) returning the body of a 200.
pub fn http_post(addr: SocketAddr, path: &str) -> Result<String> {
    http_call(addr, "POST", path)
}

fn http_call(addr: SocketAddr, method: &str, path: &str) -> Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    // The admin listener answers only requests addressed to itself.
    write!(s, "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Length: 0\r\n\r\n")?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)?;
    let (head, body) = raw.split_once("\r\n\r\n").context("no header end")?;
    ensure!(head.split_whitespace().nth(1) == Some("200"), "status: {head}");
    Ok(body.to_owned())
}

/// The program id behind the pinned link `pin` in a dump.
/// The link rows of a dump: pin → (link id, program id).
pub fn links(dump: &Value) -> std::collections::BTreeMap<String, (u64, u64)> {
    dump["kernel"]["links"]
        .as_array()
        .expect("links in the dump")
        .iter()
        .map(|l| {
            let id = |k: &str| l[k].as_u64().unwrap_or_else(|| panic!("{k} of {l}"));
            (l["pin"].as_str().expect("a pin name").to_owned(), (id("link_id"), id("program_id")))
        })
        .collect()
}

pub fn link_program(dump: &Value, pin: &str) -> u32 {
    dump["kernel"]["links"]
        .as_array()
        .and_then(|l| l.iter().find(|l| l["pin"] == pin))
        .and_then(|l| l["program_id"].as_u64())
        .unwrap_or_else(|| panic!("no attached link {pin} in {dump}")) as u32
}

/// How many times program `id` ran since `stats` (the guard of
/// [`bpf::enable_stats`], which proves the counting is on) was taken.
/// bpftool leaves `run_cnt` and `run_time_ns` out while a program has not
/// run at all: with the counting on, that is 0, and only that. Any other
/// gap (no such program, a count without its time) fails the test.
pub fn run_count(id: u32, stats: &std::os::fd::OwnedFd) -> u64 {
    let _ = stats;
    let out = run("bpftool", &["prog", "show", "id", &id.to_string(), "--json"]).expect("bpftool prog show");
    let v: Value = serde_json::from_str(&out).expect("bpftool json");
    assert_eq!(v["id"].as_u64(), Some(u64::from(id)), "bpftool shows another program than {id}: {v}");
    match (v["run_cnt"].as_u64(), v["run_time_ns"].as_u64()) {
        (Some(n), Some(_)) => n,
        (None, None) => 0,
        _ => panic!("bpftool shows a run count without its time, or the other way round, for {id}: {v}"),
    }
}

/// Raises this process's open-file limit to its hard limit.
pub fn raise_fd_limit() {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: plain libc calls on a local struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur = lim.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
}

/// The kernel part of `limiter dump --json --pin-path DIR`.
pub fn dump(pin_path: &Path) -> Value {
    dump_with(&limiter_bin(), pin_path)
}

/// [`dump`] with another build of the daemon (an older layout's).
pub fn dump_with(bin: &Path, pin_path: &Path) -> Value {
    let out = Command::new(bin)
        .args(["dump", "--json", "--pin-path", pin_path.to_str().expect("utf-8")])
        .output()
        .expect("run limiter dump");
    assert!(out.status.success(), "dump failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("dump --json is JSON")
}

/// One port's row from a dump, as JSON (`Null` if the port has none).
pub fn port_row(dump: &Value, port: u16) -> Value {
    dump["kernel"]["ports"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["port"] == port))
        .cloned()
        .unwrap_or(Value::Null)
}

/// One port's row from a dump; fails the test if the dump has no row for
/// the port or the row lacks a count (a reader that took a missing value
/// for 0 would pass a test whose dump lost the port).
pub fn port(dump: &Value, port: u16) -> PortView {
    let row = port_row(dump, port);
    assert!(!row.is_null(), "the dump has no row for port {port}: {dump}");
    let n = |k: &str| row[k].as_u64().unwrap_or_else(|| panic!("port {port}'s row has no {k}: {row}"));
    PortView {
        limit: row["limit"].as_u64(),
        established: n("established"),
        high_watermark: n("high_watermark"),
        admitted: n("admitted"),
        refused: n("refused"),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortView {
    pub limit: Option<u64>,
    pub established: u64,
    pub high_watermark: u64,
    pub admitted: u64,
    pub refused: u64,
}

/// Polls the dump until `port`'s established count is `want` (closes are
/// processed asynchronously by the kernel), then returns the row; panics
/// with the last row seen after 5 s.
pub fn wait_established(pin_path: &Path, p: u16, want: u64) -> PortView {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let row = port(&dump(pin_path), p);
        if row.established == want {
            return row;
        }
        assert!(
            Instant::now() < deadline,
            "port {p}: established stayed {} (want {want}): {row:?}",
            row.established
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Accepts until `n` connections are held (with a deadline).
pub fn accept_n(listener: &TcpListener, n: usize) -> Vec<TcpStream> {
    listener.set_nonblocking(false).expect("blocking");
    (0..n).map(|_| listener.accept().expect("accept").0).collect()
}

/// Whether the listener has nothing waiting to be accepted.
pub fn accept_queue_empty(listener: &TcpListener) -> bool {
    listener.set_nonblocking(true).expect("nonblocking");
    let empty = matches!(listener.accept(), Err(e) if e.kind() == io::ErrorKind::WouldBlock);
    listener.set_nonblocking(false).expect("blocking");
    empty
}

/// Sets SO_LINGER to zero so that closing sends a RST.
pub fn reset_on_close(stream: &TcpStream) {
    socket2::SockRef::from(stream).set_linger(Some(Duration::ZERO)).expect("SO_LINGER");
}

/// Writes a line on `client` and expects it echoed back by `server`'s
/// side (the test plays both ends).
pub fn carries_data(client: &mut TcpStream, server: &mut TcpStream) -> bool {
    let msg = b"ping\n";
    if client.write_all(msg).is_err() {
        return false;
    }
    let mut buf = [0u8; 5];
    server.set_read_timeout(Some(Duration::from_secs(2))).ok();
    if server.read_exact(&mut buf).is_err() || &buf != msg {
        return false;
    }
    if server.write_all(&buf).is_err() {
        return false;
    }
    client.set_read_timeout(Some(Duration::from_secs(2))).ok();
    client.read_exact(&mut buf).is_ok() && &buf == msg
}
