//! The `limiter` command: parses the command line, calls the library.
#![forbid(unsafe_code)]

use std::{path::PathBuf, process::ExitCode, time::Duration};

use clap::{Args, Parser, Subcommand};
use limiter::cli::{self, Access};

/// mimalloc (see [`limiter::allocator`]).
#[cfg(not(feature = "count-allocations"))]
#[global_allocator]
static ALLOCATOR: limiter::allocator::Mimalloc = limiter::allocator::Mimalloc;

/// The benchmark's build: mimalloc, every allocation counted.
#[cfg(feature = "count-allocations")]
#[global_allocator]
static ALLOCATOR: limiter::alloc_count::Counting = limiter::alloc_count::Counting;

#[derive(Parser)]
#[command(
    name = "limiter",
    version,
    about = "Refuses work at the SYN and at HTTP before a server drowns",
    after_help = "Manual: man limiter(8); the manual's pages are in /usr/share/doc/limiter/docs \
                  (the package) or docs/ (the source), starting at docs/README.md."
)]
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
        /// user: a name, or UID[:GID] in numbers (the daemon keeps CAP_BPF
        /// only, in any case).
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
    /// Reload the running daemon's configuration and wait until it is
    /// applied (exit 0) or refused (exit 78, nothing changed).
    Reload {
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
    },
    /// Detach the kernel gate and remove the daemon's own pins (refused
    /// while a daemon serves it, unless --force).
    Unload {
        #[command(flatten)]
        target: PinTarget,
        /// Detach even under a running daemon.
        #[arg(long)]
        force: bool,
    },
    /// Prepare the node for the daemon: mount bpffs (mode 0700) where the
    /// pins go unless it is there, set net.ipv4.tcp_migrate_req = 1 (the
    /// handover); the DaemonSet's init container runs it.
    PrepareNode {
        /// Where bpffs goes.
        #[arg(long, value_name = "DIR", default_value = "/sys/fs/bpf")]
        bpffs: PathBuf,
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    let access = |t: &PinTarget| Access::resolve(t.config.as_deref(), t.pin_path.as_deref());
    match cli.command {
        Command::Run { config, unload_on_exit, log_json, user } => {
            cli::run::main(cli::run::Args { config, unload_on_exit, log_json, user })
        }
        Command::CheckConfig { file } => cli::check_config::main(&file),
        Command::Reload { config } => cli::reload::main(&config),
        Command::Dump { json, target: t } => match access(&t) {
            Ok(t) => cli::dump::main(&t, json),
            Err(e) => cli::fail(e),
        },
        Command::Top { target: t, interval_ms, once } => match access(&t) {
            Ok(t) => cli::top::main(&t, Duration::from_millis(interval_ms), once),
            Err(e) => cli::fail(e),
        },
        Command::PrepareNode { bpffs } => cli::prepare_node::main(&bpffs),
        Command::Unload { target: t, force } => match access(&t) {
            Ok(t) => cli::unload::main(&t, force),
            Err(e) => cli::fail(e),
        },
    }
}
