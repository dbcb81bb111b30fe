//! The `limiter` command: parses the command line, calls the library.
#![forbid(unsafe_code)]

use std::{net::SocketAddr, path::PathBuf, process::ExitCode};

use clap::{Args, Parser, Subcommand};

/// mimalloc: per-thread free lists suit the one-thread-per-worker proxy
/// better than glibc's arenas (fewer locked operations per request).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
use limiter::{
    config::{Config, defaults},
    daemon::{self, RunOptions},
    dump, kernel,
};

#[derive(Parser)]
#[command(name = "limiter", version, about = "Refuses work at the SYN and at HTTP before a server drowns")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Load (or adopt) the kernel gate and run the daemon.
    Run {
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
        /// Remove the kernel gate when the daemon stops (demos, tests).
        #[arg(long)]
        unload_on_exit: bool,
        /// Log as JSON lines instead of human-readable text.
        #[arg(long)]
        log_json: bool,
        /// After loading the gate and binding the listeners, run as this
        /// user (the daemon keeps CAP_BPF only, in any case).
        #[arg(long, value_name = "USER")]
        user: Option<String>,
    },
    /// Validate a configuration file and print what it means.
    CheckConfig { file: PathBuf },
    /// Show the pinned kernel counters (works while the daemon is down).
    Dump {
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        target: PinTarget,
    },
    /// A live view: per-port counts and refusal rates, HTTP pools, breaker
    /// (80 columns; plain lines when the output is not a terminal).
    Top {
        #[command(flatten)]
        target: PinTarget,
        /// Refresh interval in milliseconds.
        #[arg(long, value_name = "MS", default_value_t = 1000)]
        interval_ms: u64,
        /// Print one block and exit.
        #[arg(long)]
        once: bool,
    },
    /// Detach the kernel gate and remove the daemon's own pins.
    Unload {
        #[command(flatten)]
        target: PinTarget,
    },
}

#[derive(Args)]
#[group(multiple = false)]
struct PinTarget {
    /// Take the pin path and admin address from this configuration file.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The pin directory (default /sys/fs/bpf/limiter).
    #[arg(long, value_name = "DIR")]
    pin_path: Option<PathBuf>,
}

impl PinTarget {
    /// The pin directory, the admin address and the admin token.
    fn resolve(&self) -> Result<(PathBuf, SocketAddr, Option<String>), String> {
        match (&self.config, &self.pin_path) {
            (Some(file), _) => {
                let c = Config::load(file).map_err(|e| e.to_string())?;
                Ok((c.kernel.pin_path, c.admin.listen, c.admin.token.map(|t| t.0)))
            }
            (None, path) => Ok((
                path.clone().unwrap_or_else(|| PathBuf::from(defaults::PIN_PATH)),
                defaults::ADMIN_LISTEN.parse().expect("valid default"),
                None,
            )),
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run { config, unload_on_exit, log_json, user } => {
            // First: a SIGHUP or SIGTERM during start-up waits for the
            // daemon's handlers instead of killing it.
            limiter::privileges::block_signals();
            // The level comes from the file; a bad file is reported below.
            let level = Config::load(&config).map_or_else(|_| "info".to_owned(), |c| c.admin.log_level);
            limiter::logging::init(log_json, &level);
            let options = RunOptions { config_path: config, unload_on_exit };
            let prepared = match daemon::prepare(&options) {
                Ok(p) => p,
                Err(e) => return fail(e.to_string()),
            };
            if let Err(e) = limiter::privileges::drop_to(user.as_deref(), prepared.pin_path()) {
                return fail(format!("dropping privileges: {e}"));
            }
            let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => return fail(format!("starting the runtime: {e}")),
            };
            match runtime.block_on(daemon::run(options, prepared)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(e.to_string()),
            }
        }
        Command::CheckConfig { file } => match Config::load(&file) {
            Ok(c) => out(&describe(&c)),
            Err(e) => {
                eprintln!("limiter: {e}");
                ExitCode::from(2)
            }
        },
        Command::Dump { json, target } => {
            let (pin_path, admin, token) = match target.resolve() {
                Ok(t) => t,
                Err(e) => return fail(e),
            };
            let daemon = dump::daemon_view(admin, token.as_deref());
            let snap = match dump::snapshot(&pin_path) {
                Ok(s) => Some(s),
                // A daemon running without the gate still has pools to show.
                Err(kernel::KernelError::NotLoaded(_)) if matches!(daemon, dump::DaemonView::Running(_)) => {
                    None
                }
                Err(e) => return fail(e.to_string()),
            };
            let text = if json {
                format!("{:#}\n", dump::json(snap.as_ref(), &daemon))
            } else {
                dump::table(snap.as_ref(), &daemon)
            };
            out(&text)
        }
        Command::Top { target, interval_ms, once } => {
            let (pin_path, admin, token) = match target.resolve() {
                Ok(t) => t,
                Err(e) => return fail(e),
            };
            let interval = std::time::Duration::from_millis(interval_ms.max(100));
            limiter::top::run(&pin_path, admin, token.as_deref(), interval, once);
            ExitCode::SUCCESS
        }
        Command::Unload { target } => {
            let (pin_path, _, _) = match target.resolve() {
                Ok(t) => t,
                Err(e) => return fail(e),
            };
            match kernel::unload(&pin_path) {
                Ok(out) => {
                    for path in &out.removed {
                        println!("removed {}", path.display());
                    }
                    for path in &out.foreign {
                        println!("left {} (not limiter's)", path.display());
                    }
                    println!("kernel gate unloaded from {}", pin_path.display());
                    ExitCode::SUCCESS
                }
                Err(e) => fail(e.to_string()),
            }
        }
    }
}

fn describe(c: &Config) -> String {
    let ports: Vec<String> = c.kernel.ports.iter().map(|(p, m)| format!("{p}:{m}")).collect();
    let unlimited = |n: u32| if n == 0 { "unlimited".to_owned() } else { n.to_string() };
    let kernel = if c.kernel.enabled {
        let k = &c.kernel;
        let options: Vec<String> = k
            .port_options
            .iter()
            .map(|(p, o)| {
                let mut parts = Vec::new();
                if o.per_source_max != 0 {
                    parts.push(format!("perSourceMax {}", o.per_source_max));
                }
                if o.dry_run {
                    parts.push("DRY RUN".to_owned());
                }
                format!("{p}: {}", parts.join(", "))
            })
            .collect();
        let trusted: Vec<String> = k.trusted.iter().map(ToString::to_string).collect();
        format!(
            "  kernel.ports       {}\n  kernel.port.*      {}\n  client groups      IPv4 /{}, IPv6 /{}, {} table slots\n  \
             kernel.trusted     {} (reserve {})\n  kernel.xdp         {}\n  \
             kernel.pinPath     {}\n  kernel.cgroup      {}\n  kernel.netns       {}\n",
            if ports.is_empty() { "(none: count only)".into() } else { ports.join(", ") },
            if options.is_empty() { "(none)".into() } else { options.join("; ") },
            k.source_prefix_v4,
            k.source_prefix_v6,
            k.source_table_size,
            if trusted.is_empty() { "(none)".into() } else { trusted.join(", ") },
            k.trusted_reserve,
            if k.xdp_interfaces.is_empty() {
                "(no interface: sk_lookup only)".into()
            } else {
                format!("{} ({:?} mode)", k.xdp_interfaces.join(", "), k.xdp_mode)
            },
            k.pin_path.display(),
            k.cgroup.as_ref().map_or("(the cgroup v2 root)".into(), |p| p.display().to_string()),
            k.netns.as_ref().map_or("(the daemon's own)".into(), |p| p.display().to_string()),
        )
    } else {
        "  kernel             disabled (kernel.enabled = false)\n".to_owned()
    };
    format!(
        "{}: OK\n{kernel}  \
         http               listen {}, upstream {}, {} workers\n  \
         http limits        maxThreads {} -> normal pool {}, /debug/ slots {}; per session {}; web clients {}{}\n  \
         breaker            opens above {} errors over {} ms (at least {} results), probes after {} ms\n  \
         admin.listen       {}\n  ignored keys       {} (the business runtime's)\n",
        c.source.as_ref().map_or("<config>".into(), |p| p.display().to_string()),
        c.http.listen,
        c.http.upstream.as_deref().unwrap_or("(built-in sample)"),
        c.http.workers,
        c.http.max_threads,
        c.http.normal_limit(),
        defaults::DEBUG_SLOTS,
        unlimited(c.http.max_session_connections),
        unlimited(c.http.max_web_connections),
        if c.http.dry_run { " (DRY RUN: counts, refuses nothing)" } else { "" },
        c.breaker.threshold,
        c.breaker.window_ms,
        c.breaker.min_requests,
        c.breaker.sleep_window_ms,
        c.admin.listen,
        c.ignored.len(),
    )
}

/// Prints to stdout; a closed pipe (`limiter dump | head`) is not an error.
fn out(text: &str) -> ExitCode {
    use std::io::Write as _;
    match std::io::stdout().write_all(text.as_bytes()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => fail(format!("writing to stdout: {e}")),
    }
}

fn fail(message: String) -> ExitCode {
    eprintln!("limiter: {message}");
    ExitCode::FAILURE
}
