//! `cargo xtask VERB`: the project's build, set-up, test and benchmark verbs.
//!
//! Every verb that builds first runs [`setup::ensure`], which installs only
//! what is missing (nightly rust-src, LLVM 22, bpf-linker) and costs about a
//! second when everything is present.

mod bench;
mod deadline;
mod deb;
mod docs;
mod image;
mod lanes;
mod programs;
mod release;
mod scaling;
mod setup;

use std::{
    env, fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

const USAGE: &str = "\
usage: cargo xtask VERB [ARGS]

  setup                      check and install the build prerequisites
  run [--config FILE] [ARGS] build the daemon and run it (default: examples/limiter.ini,
                             unloading the kernel gate on exit)
  test [FILTER]              set up, then run every test: unit tests, then the
                             real-kernel and HTTP tests one at a time (needs root)
  bench kernel               accept/refuse rates and per-program cost against
                             iptables connlimit; writes BENCHMARKS.md
  bench http [--before REV]  wrk through limiter and through nginx limit_conn
                             (and through limiter built at REV, for small
                             bodies); writes BENCHMARKS.md
  bench scrape               what /metrics and /healthz cost with 65,536 and 1,048,576
                             source slots, against the last layout-2 build; writes
                             BENCHMARKS.md
  bench shed                 coupled shedding against limiter without it and nginx
                             limit_conn under a flood of new connections over a veth;
                             writes BENCHMARKS.md
  bench adaptive             the adaptive limit against the static pool, nginx
                             limit_conn and tower-acc's Gradient2 and Vegas before an
                             upstream whose capacity and service time change;
                             writes BENCHMARKS.md
  bench fleet                fleet-wide limits on and off over a real Redis: req/s,
                             p50/p99, store commands per request, the bare round
                             trip; writes BENCHMARKS.md
  bench breaker              the breaker's per-request cost (criterion)
  simulate [ARGS]            the fleet's deterministic simulation (sim/): by default
                             --suite 2000 (as the test suite runs it: seeds over every
                             fault family, the planted holes, the fleet before it);
                             --seeds N [--from S] [--faults F] [--before], or
                             --seed S [--faults F] to replay one with its trace
  soak [--short]             overload, flood, upstream-fault, hostile-client,
                             control-plane, coupled-shedding, adaptive-limit and fleet
                             scenarios against the real daemon and
                             gate; prints a table, fails if anything was lost
  fuzz [--seconds N]         the HTTP/1 framing module's fuzz target under libFuzzer
                             (cargo fuzz on the nightly toolchain, installed if
                             missing) for N seconds (default 300)
  dist                       a release tarball in target/dist: the binary (kernel
                             programs embedded), example config, systemd units,
                             Kubernetes manifest, README and manual
  image [--name NAME] [--archive FILE]
                             the OCI image the DaemonSet runs (buildah, from
                             scratch; default name registry.example.com/limiter:VERSION);
                             prints its name, ID and digest, and writes it as an OCI archive
  deb [--revision N]         the Debian package target/dist/limiter_VERSION-N_amd64.deb
  release                    the tarball, the package and the image archive of one
                             release build, with target/dist/SHA256SUMS
  docs                       write the manual's key reference from the key table and
                             check every link and anchor of the documentation
";

fn main() {
    if let Err(e) = real_main() {
        eprintln!("xtask: error: {e:#}");
        std::process::exit(1);
    }
}

fn real_main() -> Result<()> {
    let mut args = env::args().skip(1);
    let verb = args.next().unwrap_or_default();
    let rest: Vec<String> = args.collect();
    match verb.as_str() {
        "setup" => setup::ensure(setup::Purpose::Test),
        "run" => run(&rest),
        "test" => test(&rest),
        "bench" => bench::main(&rest),
        "soak" => {
            setup::ensure(setup::Purpose::Test)?;
            soak(rest.iter().any(|a| a == "--short"))
        }
        "simulate" => {
            setup::ensure(setup::Purpose::Build)?;
            simulate(&rest)
        }
        "fuzz" => {
            setup::ensure(setup::Purpose::Build)?;
            let seconds = rest
                .iter()
                .position(|a| a == "--seconds")
                .and_then(|i| rest.get(i + 1))
                .map(|s| s.parse::<u64>().context("--seconds takes a number"))
                .transpose()?
                .unwrap_or(300);
            fuzz(seconds)
        }
        "image" => {
            setup::ensure(setup::Purpose::Package)?;
            image::main(&rest)
        }
        "deb" => {
            setup::ensure(setup::Purpose::Package)?;
            deb::main(&rest)
        }
        "release" => {
            setup::ensure(setup::Purpose::Package)?;
            release::main()
        }
        "docs" => docs::main(),
        "dist" => {
            setup::ensure(setup::Purpose::Build)?;
            let tarball = dist()?;
            println!("{}", tarball.display());
            Ok(())
        }
        "" | "-h" | "--help" | "help" => {
            print!("{USAGE}");
            Ok(())
        }
        other => bail!("unknown verb `{other}`\n{USAGE}"),
    }
}

/// The workspace root (xtask lives one level below it).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask has a parent").to_path_buf()
}

pub fn cargo() -> Command {
    let mut cmd = Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(root());
    cmd
}

/// Sets a file's permission bits.
pub fn set_mode(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))?;
    Ok(())
}

pub fn status(what: &str, cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("{what}: could not start {cmd:?}"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}

/// Builds the daemon in the given profile and returns the binary's path.
pub fn build_daemon(release: bool) -> Result<PathBuf> {
    let mut cmd = cargo();
    cmd.args(["build", "--package", "limiter", "--bin", "limiter"]);
    if release {
        cmd.arg("--release");
    }
    status("building the daemon", &mut cmd)?;
    Ok(root().join("target").join(if release { "release" } else { "debug" }).join("limiter"))
}

/// Builds the release daemon and the fleet's simulation in `target/suite`
/// (beside another build in `target`), their output to `log`; returns the
/// daemon's path (the simulation's is [`suite_simulation`]).
fn build_release_aside(log: &Path) -> Result<PathBuf> {
    let target = root().join("target/suite");
    let mut cmd = cargo();
    cmd.args(["build", "--release", "--package", "limiter", "--bin", "limiter"])
        .args(["--package", "limiter-sim", "--bin", "limiter-sim"])
        .env("CARGO_TARGET_DIR", &target);
    status("building the release daemon and the fleet's simulation", logged(&mut cmd, log)?)?;
    Ok(target.join("release/limiter"))
}

/// The simulation [`build_release_aside`] built.
fn suite_simulation() -> PathBuf {
    root().join("target/suite/release/limiter-sim")
}

/// Runs `cmd` in the scheduler's idle class (`SCHED_IDLE`): on a CPU only
/// when nothing else wants it.
fn idle_class(cmd: &mut Command) {
    use std::os::unix::process::CommandExt as _;
    // SAFETY: the closure runs in the child between fork and exec and calls
    // only sched_setscheduler, which is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            let param = libc::sched_param { sched_priority: 0 };
            if libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Seeds of the fleet's simulation the test suite runs.
const SUITE_SEEDS: &str = "2000";

/// `cargo xtask simulate`: builds the simulation (optimised: a seed is a
/// few hundred thousand events) and runs it with `args`.
fn simulate(args: &[String]) -> Result<()> {
    let mut build = cargo();
    build.args(["build", "--release", "--package", "limiter-sim", "--bin", "limiter-sim"]);
    status("building the fleet's simulation", &mut build)?;
    let args: Vec<String> =
        if args.is_empty() { vec!["--suite".into(), SUITE_SEEDS.into()] } else { args.to_vec() };
    status("the fleet's simulation", Command::new(root().join("target/release/limiter-sim")).args(&args))
}

/// `cmd` with its output appended to `log`.
fn logged<'c>(cmd: &'c mut Command, log: &Path) -> Result<&'c mut Command> {
    let file = fs::OpenOptions::new().create(true).append(true).open(log).context("a build log")?;
    Ok(cmd.stdout(file.try_clone()?).stderr(file))
}

/// Runs the soak suite against the release daemon: the short version (the
/// test suite's), or the long one.
fn soak(short: bool) -> Result<()> {
    soak_with(short, &build_daemon(true)?)
}

/// [`soak`] against the release daemon `bin`.
fn soak_with(short: bool, bin: &Path) -> Result<()> {
    let mut cmd = cargo();
    // The daemon is the release build either way; the soak's own clients
    // are built for release only for the long version (the short one runs
    // the build the tests made, at no cost).
    cmd.args(["run", "--package", "limiter-tests", "--bin", "soak"]);
    if !short {
        cmd.arg("--release");
    }
    cmd.arg("--").env("LIMITER_BIN", bin);
    if short {
        cmd.arg("--short");
    }
    status("the soak suite", &mut cmd)
}

/// The version of cargo-fuzz the fuzz verb installs when it is missing.
const CARGO_FUZZ: &str = "0.13.2";

/// Runs the framing module's fuzz target (`fuzz/fuzz_targets/framing.rs`)
/// under libFuzzer for `seconds`, from its kept seeds and what earlier runs
/// found (`target/fuzz-corpus/framing`). A failing input
/// is saved under `fuzz/artifacts/framing`: keep it in
/// `fuzz/regressions/framing`, where the test suite replays it.
fn fuzz(seconds: u64) -> Result<()> {
    let installed =
        Command::new("cargo").args(["fuzz", "--version"]).output().is_ok_and(|o| o.status.success());
    if !installed {
        status(
            &format!("installing cargo-fuzz {CARGO_FUZZ}"),
            cargo().args(["install", "cargo-fuzz", "--locked", "--version", CARGO_FUZZ]),
        )?;
    }
    // What the fuzzer adds goes to a working corpus under target/; the kept
    // seeds (fuzz/corpus/framing) are read, never written.
    let working = root().join("target/fuzz-corpus/framing");
    std::fs::create_dir_all(&working)?;
    status(
        "the framing fuzz target",
        Command::new("cargo")
            .current_dir(root())
            .args(["+nightly", "fuzz", "run", "framing"])
            .arg(&working)
            .arg(root().join("fuzz/corpus/framing"))
            .arg("--")
            .arg(format!("-max_total_time={seconds}")),
    )
}

/// Builds the release binary and packs the tarball; returns its path.
fn dist() -> Result<PathBuf> {
    dist_of(&build_daemon(true)?)
}

/// Packs the tarball around the release binary `bin`; returns its path.
pub fn dist_of(bin: &Path) -> Result<PathBuf> {
    let name = format!("limiter-{}-{}-linux", env!("CARGO_PKG_VERSION"), env::consts::ARCH);
    let out = root().join("target/dist");
    let stage = out.join(&name);
    let _ = std::fs::remove_dir_all(&stage);
    let copy = |from: &Path, to: &str| -> Result<()> {
        let to = stage.join(to);
        std::fs::create_dir_all(to.parent().context("a parent")?)?;
        std::fs::copy(from, &to)
            .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
        Ok(())
    };
    copy(bin, "bin/limiter")?;
    copy(&root().join("examples/limiter.ini"), "etc/limiter.ini")?;
    // The README links the manual's pages: the tarball keeps the layout.
    for file in docs::shipped()? {
        copy(&root().join(&file), &format!("doc/{file}"))?;
    }
    for file in [
        "systemd/limiter.service",
        "systemd/limiter-bpffs.service",
        "systemd/limiter.socket",
        "kubernetes/limiter.yaml",
    ] {
        copy(&root().join("deploy").join(file), &format!("deploy/{file}"))?;
    }
    let tarball = out.join(format!("{name}.tar.gz"));
    status(
        "packing the tarball",
        Command::new("tar").arg("-czf").arg(&tarball).arg("-C").arg(&out).arg(&name),
    )?;
    eprintln!("xtask: {}", tarball.display());
    Ok(tarball)
}

fn run(args: &[String]) -> Result<()> {
    setup::ensure(setup::Purpose::Build)?;
    let bin = build_daemon(true)?;
    let mut daemon_args: Vec<String> = vec!["run".into()];
    if !args.iter().any(|a| a == "--config") {
        daemon_args.push("--config".into());
        daemon_args.push(root().join("examples/limiter.ini").display().to_string());
        // The demo cleans up after itself; a real deployment keeps the gate.
        daemon_args.push("--unload-on-exit".into());
    }
    daemon_args.extend(args.iter().cloned());
    eprintln!("xtask: {} {}", bin.display(), daemon_args.join(" "));
    status("the daemon", Command::new(bin).args(daemon_args))
}

/// The last commit whose daemon pins layout 2 (`limiter_common::LAYOUT_VERSION`).
pub const LAYOUT2_REV: &str = "e2a2f343b702a2566c7da2188551aa15f8502f75";

/// Builds the daemon of git revision `rev` in a worktree under `target/`,
/// with its own target directory `target/NAME` (benchmarks compare a
/// revision; the layout-migration test runs an older layout). Built once
/// per revision: a stamp beside the binary names the revision it is.
pub fn build_revision(rev: &str, name: &str, release: bool) -> Result<PathBuf> {
    let root = root();
    let target = root.join("target").join(name);
    let bin = target.join(if release { "release" } else { "debug" }).join("limiter");
    let stamp = target.join("built-revision");
    let full = Command::new("git").args(["rev-parse", rev]).current_dir(&root).output()?;
    anyhow::ensure!(
        full.status.success(),
        "git revision {rev} is not in this clone (a shallow clone?): {}",
        String::from_utf8_lossy(&full.stderr).trim()
    );
    let full = String::from_utf8_lossy(&full.stdout).trim().to_owned();
    if bin.is_file() && fs::read_to_string(&stamp).is_ok_and(|s| s.trim() == full) {
        eprintln!("xtask: limiter at {rev} already built: {}", bin.display());
        return Ok(bin);
    }
    let tree = root.join("target").join(format!("{name}-tree"));
    let remove = || {
        let _ = Command::new("git")
            .args(["worktree", "remove", "--force"])
            .arg(&tree)
            .current_dir(&root)
            .status();
    };
    remove();
    status(
        &format!("checking out {rev}"),
        Command::new("git").args(["worktree", "add", "--detach"]).arg(&tree).arg(rev).current_dir(&root),
    )?;
    let mut build = cargo();
    build
        .current_dir(&tree)
        .args(["build", "--package", "limiter", "--bin", "limiter"])
        .env("CARGO_TARGET_DIR", &target);
    if release {
        build.arg("--release");
    }
    let built = status(&format!("building limiter at {rev}"), &mut build);
    remove();
    built?;
    fs::write(&stamp, &full)?;
    Ok(bin)
}

fn test(filter: &[String]) -> Result<()> {
    setup::ensure(setup::Purpose::Test)?;
    // The release daemon (for the tarball and the soak) builds beside the
    // other builds, in a target directory of its own (cargo holds one
    // build at a time in each): its long serial end (fat LTO) leaves a
    // core the others take. Its output goes to a log, shown if it fails.
    let logs = root().join("target/test-logs");
    fs::create_dir_all(&logs)?;
    let aside = {
        let log = logs.join("builds-aside.log");
        std::thread::spawn(move || build_release_aside(&log))
    };
    // Unit tests: pure logic, no kernel, run in parallel.
    let mut unit = cargo();
    // `--include-ignored`: the one ignored unit test compares this machine
    // with what set-up installs, which holds only after set-up ran.
    unit.args(["test", "--package", "limiter-common", "--package", "limiter", "--package", "xtask"]);
    unit.args(["--package", "limiter-sim"]);
    unit.args(["--", "--include-ignored"]).args(filter);
    let unit = status("unit tests", &mut unit);
    // Integration tests: the real kernel, real sockets. A network namespace
    // switch is per thread and cgroup membership per process, so each
    // binary runs its tests one at a time, binaries side by side
    // ([`lanes`]). They are #[ignore]d for a plain `cargo test` (which
    // would run them in parallel, without the binary built); here they all
    // run.
    let built = unit.and_then(|()| {
        let bin = build_daemon(false)?;
        let binaries = lanes::build("limiter-tests")?;
        // The last limiter of pinned layout 2, for the layout-migration test.
        let layout2 = build_revision(LAYOUT2_REV, "layout2", false)?;
        Ok((bin, binaries, layout2))
    });
    let aside = aside.join().map_err(|_| anyhow::anyhow!("the release build panicked"))?;
    let (bin, binaries, layout2) = built?;
    let release = aside.with_context(|| {
        format!("the release build failed; its output: {}", logs.join("builds-aside.log").display())
    })?;
    // The release artifacts, for the tests that run them as shipped: the
    // tarball, the package and a second build of it (the upgrade), the
    // image as an OCI archive.
    let tarball = dist_of(&release)?;
    let deb = deb::build(&release, 1)?;
    let upgrade = deb::build(&release, 2)?;
    let image = root().join("target/dist/limiter-test-image.oci.tar");
    image::build(&release, &image::default_name(), Some(&image))?;
    let envs = [
        ("LIMITER_BIN", bin),
        ("LIMITER_LAYOUT2_BIN", layout2),
        ("LIMITER_DIST", tarball),
        ("LIMITER_DEB", deb),
        ("LIMITER_DEB_UPGRADE", upgrade),
        ("LIMITER_IMAGE", image),
    ];
    // The fleet's simulation, beside the black-box lanes (they mostly wait;
    // it computes), at the scheduler's idle class: it takes only the CPU
    // the lanes leave, so the daemons they time (a fleet's renewals, a
    // store's probes, within tens of milliseconds) never wait behind it.
    // Its output to a log, shown whole when it ends.
    let simulation = filter.is_empty().then(|| {
        let log = logs.join("simulation.log");
        std::thread::spawn(move || -> Result<()> {
            let out = fs::File::create(&log)?;
            let mut cmd = Command::new(suite_simulation());
            cmd.args(["--suite", SUITE_SEEDS]).stdout(out.try_clone()?).stderr(out);
            idle_class(&mut cmd);
            let ran = cmd.status().context("running the fleet's simulation");
            println!("\n==== simulation ====\n{}", fs::read_to_string(&log).unwrap_or_default());
            match ran {
                Ok(s) if s.success() => Ok(()),
                Ok(s) => bail!("the fleet's simulation failed ({s}): {}", log.display()),
                Err(e) => Err(e),
            }
        })
    });
    let lanes = lanes::run(binaries, lanes::lanes(), filter, &envs);
    let simulated = simulation
        .map_or(Ok(()), |t| t.join().map_err(|_| anyhow::anyhow!("the simulation's thread panicked"))?);
    lanes?;
    simulated?;
    // The short version of every soak scenario.
    if filter.is_empty() { soak_with(true, &release) } else { Ok(()) }
}
