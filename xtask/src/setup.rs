//! The one set-up step every verb goes through: find each prerequisite,
//! install only what is missing, say what was found or installed.
//!
//! Detection is written against a [`Host`] (a root prefix, a `PATH`, the
//! rustup and cargo homes) so tests can point it at an empty fake machine
//! and prove that a cold machine really gets every install step.

use std::{
    collections::BTreeSet,
    env, fs,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context as _, Result, bail};

/// The bpf-linker release that builds against LLVM 22 (docs/TOOLCHAIN.md).
pub const BPF_LINKER_VERSION: &str = "0.13.0";
/// Where Debian's `llvm-22-dev` puts LLVM; bpf-linker's build looks here.
pub const LLVM_PREFIX: &str = "/usr/lib/llvm-22";
/// The toolchain `aya-build` runs the eBPF build with.
pub const NIGHTLY: &str = "nightly";

/// Debian packages bpf-linker links against.
pub const BUILD_PACKAGES: &[&str] = &["llvm-22-dev", "libpolly-22-dev", "libzstd-dev", "zlib1g-dev"];
/// Debian packages `cargo xtask image`, `deb` and `release` run: buildah
/// (the image, from scratch) and dpkg-dev (`dpkg-shlibdeps`, the package's
/// dependencies).
pub const PACKAGING_PACKAGES: &[&str] = &["buildah", "dpkg-dev"];
/// Where a program comes from on a fresh Debian machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provider {
    /// Part of Debian's base system (an Essential or required package,
    /// named here for the record): set-up installs nothing for it.
    Base(&'static str),
    /// A Debian package that set-up installs.
    Debian(&'static str),
    /// A PyPI package that set-up installs, at this version, into the
    /// virtualenv under `target/tools/venv`.
    PyPi { package: &'static str, version: &'static str },
}

/// One program a test, benchmark or soak scenario starts.
#[derive(Clone, Copy, Debug)]
pub struct Program {
    pub name: &'static str,
    pub provider: Provider,
}

const fn base(name: &'static str, package: &'static str) -> Program {
    Program { name, provider: Provider::Base(package) }
}

const fn debian(name: &'static str, package: &'static str) -> Program {
    Program { name, provider: Provider::Debian(package) }
}

/// Every program started by the sources under `tests/` (the black-box
/// tests, their harness, the benchmarks and the soak), and where it comes
/// from: the one table set-up installs from ([`debian_packages`],
/// [`pypi`]); `programs.rs` holds it to the sources.
pub const PROGRAMS: &[Program] = &[
    // Network namespaces, veths, sockets' view.
    debian("ip", "iproute2"),
    debian("ss", "iproute2"),
    debian("nsenter", "util-linux"),
    debian("ethtool", "ethtool"),
    debian("sysctl", "procps"),
    // An independent view of what is attached.
    debian("bpftool", "bpftool"),
    // systemd units and socket activation (systemd is not PID 1 here).
    debian("systemd-analyze", "systemd"),
    debian("systemd-socket-activate", "systemd"),
    // `limiter top` in a real terminal.
    debian("tmux", "tmux"),
    // The real TLS and HTTP/2 clients.
    debian("curl", "curl"),
    debian("openssl", "openssl"),
    debian("h2load", "nghttp2-client"),
    debian("nghttp", "nghttp2-client"),
    // Python's `ssl`, for TLS cases no ordinary client makes.
    debian("python3", "python3"),
    // Lints a real scrape and runs the alerting rules' unit tests.
    debian("promtool", "prometheus"),
    // The peers and load generators the benchmarks and soak run.
    debian("nginx", "nginx"),
    // The second HTTP peer of `bench http` (Debian's HAProxy 2.6).
    debian("haproxy", "haproxy"),
    debian("wrk", "wrk"),
    debian("iptables", "iptables"),
    // Counted rows: instructions and system calls per request.
    debian("valgrind", "valgrind"),
    // What BENCHMARKS.md tells a reader to run on the kept counted outputs.
    debian("callgrind_annotate", "valgrind"),
    debian("strace", "strace"),
    // The real upstream the smuggling and pool tests put behind limiter:
    // Debian's Jetty 9.4 (its jars in /usr/share/java, and the Java runtime
    // it depends on runs it), and the compiler of its one servlet
    // (tests/jetty/LimiterUpstream.java).
    debian("java", "jetty9"),
    debian("javac", "default-jdk-headless"),
    // The fleet's shared store (fleet.store): Debian's Redis 7, one server
    // or a cluster of three started by the tests and the fleet benchmark,
    // and its client, which creates the cluster.
    debian("redis-server", "redis-server"),
    debian("redis-cli", "redis-tools"),
    // Sentinel, for the fleet's store found through it (redis+sentinel://).
    debian("redis-sentinel", "redis-sentinel"),
    // Builds the shim that steps a test Redis' wall clock (an LD_PRELOAD
    // library: libfaketime recurses under Redis' allocator).
    debian("gcc", "gcc"),
    // `cargo xtask test` and `bench http --before` build older revisions
    // in a git worktree.
    debian("git", "git"),
    // The Kubernetes manifest's schema validator (started by its path in
    // the virtualenv, so the scan does not see it).
    Program {
        name: "kubernetes-validate",
        provider: Provider::PyPi { package: "kubernetes-validate", version: "1.37.0" },
    },
    // The image run as the DaemonSet runs it (tests/tests/image.rs), and
    // the package installed in a throwaway copy of the machine
    // (tests/tests/package.rs: its script runs dpkg, chroot, getent and
    // zcat there, and the package's own scripts adduser and
    // deb-systemd-helper), then linted.
    debian("crun", "crun"),
    debian("unshare", "util-linux"),
    debian("lintian", "lintian"),
    debian("adduser", "adduser"),
    debian("deb-systemd-helper", "init-system-helpers"),
    base("dpkg", "dpkg"),
    base("dpkg-query", "dpkg"),
    base("chroot", "coreutils"),
    base("getent", "libc-bin"),
    base("zcat", "gzip"),
    // A second, unprivileged user for the tests of who can do what.
    base("useradd", "passwd"),
    base("userdel", "passwd"),
    base("id", "coreutils"),
    base("ln", "coreutils"),
    // A bpffs instance of a test's own (mode 700, or 1777 to be refused).
    base("mount", "mount"),
    base("umount", "mount"),
    debian("setpriv", "util-linux"),
    base("sh", "dash"),
    base("echo", "coreutils"),
    base("sleep", "coreutils"),
    base("date", "coreutils"),
    base("tar", "tar"),
];

/// The Debian packages set-up installs for the tests, benchmarks and soak,
/// in table order, each once; plus `python3-venv`, which the PyPI
/// programs' virtualenv needs.
pub fn debian_packages() -> Vec<&'static str> {
    let mut packages: Vec<&'static str> = Vec::new();
    let mut add = |p| {
        if !packages.contains(&p) {
            packages.push(p);
        }
    };
    for program in PROGRAMS {
        match program.provider {
            Provider::Debian(p) => add(p),
            Provider::PyPi { .. } => add("python3-venv"),
            Provider::Base(_) => {}
        }
    }
    packages
}

/// The programs of the table that `package` provides, for set-up's
/// messages ("prometheus (promtool)").
pub fn provided_by(package: &str) -> Vec<&'static str> {
    PROGRAMS
        .iter()
        .filter(|p| matches!(p.provider, Provider::Debian(d) if d == package))
        .map(|p| p.name)
        .collect()
}

/// The PyPI packages set-up installs, with their versions.
pub fn pypi() -> Vec<(&'static str, &'static str)> {
    PROGRAMS
        .iter()
        .filter_map(|p| match p.provider {
            Provider::PyPi { package, version } => Some((package, version)),
            _ => None,
        })
        .collect()
}

/// The Kubernetes schema validator the deployment test runs: the PyPI
/// entry of [`PROGRAMS`], installed into a virtualenv under
/// `target/tools`.
fn k8s_validator() -> (&'static str, &'static str) {
    let pypi = pypi();
    assert_eq!(pypi.len(), 1, "set-up installs one PyPI package, into one virtualenv: {pypi:?}");
    pypi[0]
}

/// What a verb needs beyond the eBPF build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// Building and running the daemon.
    Build,
    /// Building it and packing its image and Debian package.
    Package,
    /// The tests, the benchmarks and the soak: every program they start
    /// ([`PROGRAMS`]), one set for all three.
    Test,
}

impl Purpose {
    fn packages(self) -> Vec<&'static str> {
        let mut packages = BUILD_PACKAGES.to_vec();
        if self != Self::Build {
            packages.extend(PACKAGING_PACKAGES);
        }
        if self == Self::Test {
            for p in debian_packages() {
                if !packages.contains(&p) {
                    packages.push(p);
                }
            }
        }
        packages
    }
}

/// The machine as seen by the probe (`$CARGO_HOME/bin` is part of `path`).
#[derive(Clone, Debug)]
pub struct Host {
    /// Prefix for absolute system paths (`/` on the real machine).
    pub root: PathBuf,
    /// Directories searched for executables.
    pub path: Vec<PathBuf>,
    pub rustup_home: PathBuf,
    /// The host triple whose nightly toolchain builds the eBPF crate.
    pub triple: String,
    /// Where tools installed for the tests live (`target/tools`).
    pub tools: PathBuf,
}

impl Host {
    /// The machine this process runs on.
    pub fn current() -> Self {
        let home = env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
        let rustup_home = env::var_os("RUSTUP_HOME").map_or_else(|| home.join(".rustup"), PathBuf::from);
        let cargo_home = env::var_os("CARGO_HOME").map_or_else(|| home.join(".cargo"), PathBuf::from);
        let mut path: Vec<PathBuf> =
            env::var_os("PATH").map(|p| env::split_paths(&p).collect()).unwrap_or_default();
        // `cargo install` puts bpf-linker here even when PATH lacks it.
        path.push(cargo_home.join("bin"));
        Self {
            root: PathBuf::from("/"),
            path,
            rustup_home,
            triple: format!("{}-unknown-linux-gnu", env::consts::ARCH),
            tools: crate::root().join("target/tools"),
        }
    }

    fn sys(&self, absolute: &str) -> PathBuf {
        self.root.join(absolute.trim_start_matches('/'))
    }

    fn which(&self, name: &str) -> Option<PathBuf> {
        self.path.iter().map(|dir| dir.join(name)).find(|p| p.is_file())
    }

    fn nightly_dir(&self) -> PathBuf {
        self.rustup_home.join("toolchains").join(format!("{NIGHTLY}-{}", self.triple))
    }

    /// Installed Debian packages, from dpkg's own status database.
    fn installed_packages(&self) -> BTreeSet<String> {
        let status = fs::read_to_string(self.sys("/var/lib/dpkg/status")).unwrap_or_default();
        let mut installed = BTreeSet::new();
        for stanza in status.split("\n\n") {
            let mut name = None;
            let mut ok = false;
            for line in stanza.lines() {
                if let Some(n) = line.strip_prefix("Package: ") {
                    name = Some(n.trim());
                } else if let Some(s) = line.strip_prefix("Status: ") {
                    ok = s.trim() == "install ok installed";
                }
            }
            if let (Some(name), true) = (name, ok) {
                installed.insert(name.to_owned());
            }
        }
        installed
    }
}

/// One prerequisite and what the probe found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Need {
    Rustup,
    NightlyToolchain,
    RustSrc,
    Packages(Vec<String>),
    BpfLinker {
        found: Option<String>,
    },
    /// The Kubernetes schema validator, in `venv`.
    K8sValidator {
        venv: PathBuf,
    },
}

impl Need {
    pub fn describe(&self) -> String {
        match self {
            Self::Rustup => "rustup (the eBPF crate is built with `rustup run nightly`)".into(),
            Self::NightlyToolchain => "the nightly Rust toolchain".into(),
            Self::RustSrc => "rust-src for the nightly toolchain (build-std=core)".into(),
            Self::Packages(p) => {
                let named: Vec<String> = p
                    .iter()
                    .map(|package| match provided_by(package).as_slice() {
                        [] => package.clone(),
                        programs => format!("{package} ({})", programs.join(", ")),
                    })
                    .collect();
                format!("Debian packages: {}", named.join(" "))
            }
            Self::BpfLinker { found: None } => format!("bpf-linker {BPF_LINKER_VERSION}"),
            Self::BpfLinker { found: Some(v) } => {
                format!("bpf-linker {BPF_LINKER_VERSION} (found {v})")
            }
            Self::K8sValidator { venv } => {
                let (package, version) = k8s_validator();
                format!("{package} {version} (PyPI) in {}", venv.display())
            }
        }
    }
}

/// The probe's report: what is present (with a detail) and what is missing.
#[derive(Debug, Default)]
pub struct Report {
    pub present: Vec<String>,
    pub missing: Vec<Need>,
}

/// Looks at the host without changing anything.
pub fn probe(host: &Host, purpose: Purpose) -> Report {
    let mut report = Report::default();

    match host.which("rustup") {
        Some(p) => report.present.push(format!("rustup at {}", p.display())),
        None => report.missing.push(Need::Rustup),
    }
    let nightly = host.nightly_dir();
    if nightly.join("bin").join("rustc").is_file() {
        report.present.push(format!("nightly toolchain at {}", nightly.display()));
        let core = nightly.join("lib/rustlib/src/rust/library/core/Cargo.toml");
        if core.is_file() {
            report.present.push("rust-src for nightly".into());
        } else {
            report.missing.push(Need::RustSrc);
        }
    } else {
        report.missing.push(Need::NightlyToolchain);
        report.missing.push(Need::RustSrc);
    }

    let installed = host.installed_packages();
    let (have, lack): (Vec<_>, Vec<_>) = purpose.packages().into_iter().partition(|p| installed.contains(*p));
    if !have.is_empty() {
        report.present.push(format!("Debian packages: {}", have.join(" ")));
    }
    if !lack.is_empty() {
        report.missing.push(Need::Packages(lack.into_iter().map(str::to_owned).collect()));
    }

    match host.which("bpf-linker") {
        Some(p) => match linker_version(&p) {
            Some(v) if v == BPF_LINKER_VERSION => {
                report.present.push(format!("bpf-linker {v} at {}", p.display()));
            }
            found => report.missing.push(Need::BpfLinker { found }),
        },
        None => report.missing.push(Need::BpfLinker { found: None }),
    }
    if purpose == Purpose::Test {
        let venv = host.tools.join("venv");
        if validator_marker(&venv).is_file() {
            let (package, version) = k8s_validator();
            report.present.push(format!("{package} {version} in {}", venv.display()));
        } else {
            report.missing.push(Need::K8sValidator { venv });
        }
    }
    report
}

/// Written once the validator's install finished, so a half-made venv is
/// redone.
fn validator_marker(venv: &Path) -> PathBuf {
    let (package, version) = k8s_validator();
    venv.join(format!(".{package}-{version}"))
}

fn linker_version(path: &Path) -> Option<String> {
    let out = Command::new(path).arg("--version").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    // "bpf-linker 0.13.0"
    text.split_whitespace().nth(1).map(str::to_owned)
}

/// Probes, installs what is missing, probes again to prove it worked.
pub fn ensure(purpose: Purpose) -> Result<()> {
    let started = Instant::now();
    let host = Host::current();
    let report = probe(&host, purpose);
    for p in &report.present {
        eprintln!("setup: found {p}");
    }
    if report.missing.is_empty() {
        eprintln!("setup: everything present ({} ms)", started.elapsed().as_millis());
        return Ok(());
    }
    for need in &report.missing {
        eprintln!("setup: missing {}", need.describe());
    }
    // Order matters: bpf-linker is built against the LLVM packages.
    let mut missing = report.missing.clone();
    missing.sort_by_key(|n| match n {
        Need::Rustup => 0,
        Need::NightlyToolchain => 1,
        Need::RustSrc => 2,
        Need::Packages(_) => 3,
        Need::BpfLinker { .. } => 4,
        Need::K8sValidator { .. } => 5,
    });
    for need in &missing {
        install(need)?;
    }
    let again = probe(&host, purpose);
    if !again.missing.is_empty() {
        let names: Vec<_> = again.missing.iter().map(Need::describe).collect();
        bail!("set-up installed what it could, but these are still missing: {}", names.join("; "));
    }
    eprintln!("setup: done in {} s", started.elapsed().as_secs());
    Ok(())
}

fn install(need: &Need) -> Result<()> {
    match need {
        Need::Rustup => bail!(
            "rustup is not on PATH; install it from https://rustup.rs (the eBPF crate needs a nightly toolchain)"
        ),
        Need::NightlyToolchain => run(
            "installing the nightly toolchain",
            Command::new("rustup").args([
                "toolchain",
                "install",
                NIGHTLY,
                "--profile",
                "minimal",
                "--component",
                "rust-src",
            ]),
        ),
        Need::RustSrc => run(
            "adding rust-src to the nightly toolchain",
            Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", NIGHTLY]),
        ),
        Need::Packages(packages) => {
            require_root(&format!("apt-get install {}", packages.join(" ")))?;
            run("refreshing Debian's package lists", Command::new("apt-get").args(["update", "-q"]))?;
            run(
                &format!("installing {}", packages.join(" ")),
                Command::new("apt-get")
                    .args(["install", "-y", "-q", "--no-install-recommends"])
                    .args(packages)
                    .env("DEBIAN_FRONTEND", "noninteractive"),
            )
        }
        Need::BpfLinker { .. } => run(
            &format!("building bpf-linker {BPF_LINKER_VERSION} against LLVM 22 (about 70 s)"),
            Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
                .args(["install", "bpf-linker", "--version", BPF_LINKER_VERSION, "--locked", "--force"])
                .args(["--no-default-features", "--features", "llvm-22"])
                .env("LLVM_PREFIX", LLVM_PREFIX),
        ),
        Need::K8sValidator { venv } => {
            let _ = fs::remove_dir_all(venv);
            fs::create_dir_all(venv.parent().unwrap_or(venv))?;
            run("creating a Python virtualenv", Command::new("python3").args(["-m", "venv"]).arg(venv))?;
            let (package, version) = k8s_validator();
            run(
                &format!("installing {package} {version} from PyPI"),
                Command::new(venv.join("bin/pip")).args([
                    "install",
                    "--quiet",
                    &format!("{package}=={version}"),
                ]),
            )?;
            fs::write(validator_marker(venv), "")?;
            Ok(())
        }
    }
}

fn require_root(what: &str) -> Result<()> {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    let uid_is_root =
        status.lines().find_map(|l| l.strip_prefix("Uid:")).and_then(|l| l.split_whitespace().nth(1))
            == Some("0");
    if uid_is_root {
        Ok(())
    } else {
        bail!("`{what}` needs root; run this command as root (or install them yourself and rerun)")
    }
}

fn run(what: &str, cmd: &mut Command) -> Result<()> {
    eprintln!("setup: {what}: {cmd:?}");
    let status = cmd.status().with_context(|| format!("{what}: could not start {cmd:?}"))?;
    if !status.success() {
        bail!("{what} failed ({status}): {cmd:?}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn empty_host(dir: &Path) -> Host {
        Host {
            root: dir.join("root"),
            path: vec![dir.join("bin")],
            rustup_home: dir.join("rustup"),
            triple: "x86_64-unknown-linux-gnu".into(),
            tools: dir.join("tools"),
        }
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = env::temp_dir().join(format!("xtask-setup-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn an_empty_machine_needs_every_install_step() {
        let dir = scratch("empty");
        let report = probe(&empty_host(&dir), Purpose::Test);
        let packages = Purpose::Test.packages();
        assert!(packages.contains(&"prometheus"), "promtool's package: {packages:?}");
        assert_eq!(
            report.missing,
            vec![
                Need::Rustup,
                Need::NightlyToolchain,
                Need::RustSrc,
                Need::Packages(packages.iter().map(|s| s.to_string()).collect()),
                Need::BpfLinker { found: None },
                Need::K8sValidator { venv: dir.join("tools/venv") },
            ]
        );
        assert!(report.present.is_empty(), "{:?}", report.present);
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn partial_machines_need_exactly_the_rest() {
        let dir = scratch("partial");
        let host = empty_host(&dir);
        // A nightly without rust-src, half the packages (one only half-installed),
        // and a bpf-linker of the wrong version.
        let rustc = host.nightly_dir().join("bin/rustc");
        fs::create_dir_all(rustc.parent().unwrap()).unwrap();
        fs::write(&rustc, "").unwrap();
        let status = host.sys("/var/lib/dpkg/status");
        fs::create_dir_all(status.parent().unwrap()).unwrap();
        fs::write(
            &status,
            "Package: llvm-22-dev\nStatus: install ok installed\n\n\
             Package: zlib1g-dev\nStatus: install ok installed\n\n\
             Package: libzstd-dev\nStatus: deinstall ok config-files\n",
        )
        .unwrap();
        let linker = dir.join("bin/bpf-linker");
        fs::create_dir_all(linker.parent().unwrap()).unwrap();
        fs::write(&linker, "#!/bin/sh\necho bpf-linker 0.12.1\n").unwrap();
        Command::new("chmod").arg("+x").arg(&linker).status().unwrap();

        let report = probe(&host, Purpose::Build);
        assert_eq!(
            report.missing,
            vec![
                Need::Rustup,
                Need::RustSrc,
                Need::Packages(vec!["libpolly-22-dev".into(), "libzstd-dev".into()]),
                Need::BpfLinker { found: Some("0.12.1".into()) },
            ]
        );

        // Completing it makes the plan empty but for rustup.
        let core = host.nightly_dir().join("lib/rustlib/src/rust/library/core/Cargo.toml");
        fs::create_dir_all(core.parent().unwrap()).unwrap();
        fs::write(&core, "").unwrap();
        fs::write(&linker, "#!/bin/sh\necho bpf-linker 0.13.0\n").unwrap();
        fs::write(
            &status,
            "Package: llvm-22-dev\nStatus: install ok installed\n\n\
             Package: libpolly-22-dev\nStatus: install ok installed\n\n\
             Package: libzstd-dev\nStatus: install ok installed\n\n\
             Package: zlib1g-dev\nStatus: install ok installed\n",
        )
        .unwrap();
        fs::write(dir.join("bin/rustup"), "").unwrap();
        let report = probe(&host, Purpose::Build);
        assert_eq!(report.missing, vec![]);
        assert_eq!(report.present.len(), 5, "{:?}", report.present);
        fs::remove_dir_all(dir).unwrap();
    }

    /// On the machine the suite runs on, set-up has just run: the probe must
    /// agree that nothing is missing, or set-up and probe disagree.
    #[test]
    #[ignore = "holds only after set-up ran: `cargo xtask test` runs it"]
    fn this_machine_is_complete_after_setup() {
        let report = probe(&Host::current(), Purpose::Test);
        assert!(report.missing.is_empty(), "{:?}", report.missing);
    }
}
