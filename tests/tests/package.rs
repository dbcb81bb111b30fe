//! The Debian package (`cargo xtask deb`) as an operator installs it:
//! `dpkg -i` in a throwaway copy of this machine (an overlay over `/` in a
//! mount namespace of the test's own, entered with `chroot`: the real
//! dpkg, adduser and deb-systemd-helper run its maintainer scripts, and
//! nothing reaches the machine itself), then an upgrade to a second build
//! over an edited conffile, `systemd-analyze verify` on the installed
//! units, removal and purge; and lintian on the package.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use limiter_tests::process::{DEADLINE, run_with_deadline};

fn deb(var: &str) -> PathBuf {
    PathBuf::from(
        std::env::var_os(var)
            .unwrap_or_else(|| panic!("{var} is unset: run the suite with `cargo xtask test`")),
    )
}

/// Runs `steps` (a shell script, its `$R` the copy's root, `$OUT` a
/// directory its results go to) in a throwaway copy of this machine with
/// `a.deb` and `b.deb` in its `/tmp`; returns the results directory and
/// the script's output.
fn in_a_copy_of_the_machine(debs: [&Path; 2], steps: &str) -> (PathBuf, String, bool) {
    let dir = std::env::temp_dir().join(format!("ld-package-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::create_dir_all(dir.join("copy")).unwrap();
    // The upper layer on a tmpfs of the namespace's own: everything the
    // scripts write goes away with the namespace.
    let setup = r#"set -eu
C="$1/copy"
mount -t tmpfs -o mode=755 tmpfs "$C"
mkdir -p "$C/upper" "$C/work" "$C/root"
mount -t overlay overlay -o "lowerdir=/,upperdir=$C/upper,workdir=$C/work" "$C/root"
R="$C/root"
mount -t proc proc "$R/proc"
mount --rbind /dev "$R/dev"
mount -t tmpfs tmpfs "$R/run"
mount -t tmpfs tmpfs "$R/tmp"
cp "$2" "$R/tmp/a.deb"
cp "$3" "$R/tmp/b.deb"
mkdir "$R/tmp/out"
OUT=/tmp/out
in_copy() { chroot "$R" /usr/bin/env DEBIAN_FRONTEND=noninteractive PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@" </dev/null; }
status=0
( "#;
    let script =
        format!("{setup}\n{steps}\n) || status=$?\ncp -a \"$R/tmp/out/.\" \"$1/out/\"\nexit $status\n");
    let run = run_with_deadline(
        Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script, "sh"])
            .arg(&dir)
            .args(debs),
        DEADLINE,
    );
    let text = format!("{}{}", String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    (dir, text, run.status.success())
}

fn read(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join("out").join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
#[ignore = "black-box: the package, root, a mount namespace; run by `cargo xtask test`"]
fn the_package_installs_upgrades_over_an_edited_conffile_and_purges() {
    let (first, second) = (deb("LIMITER_DEB"), deb("LIMITER_DEB_UPGRADE"));
    let steps = r#"
set -eu
in_copy dpkg -i /tmp/a.deb > $R$OUT/install.txt 2>&1
in_copy dpkg-query -W -f '${Version} ${Status}\n' limiter > $R$OUT/installed.txt
in_copy getent passwd limiter > $R$OUT/user.txt
in_copy stat -c '%U:%G %a' /etc/limiter/limiter.ini > $R$OUT/conffile-mode.txt
in_copy dpkg-query -L limiter > $R$OUT/files.txt
in_copy /usr/sbin/limiter --version > $R$OUT/version.txt
in_copy /usr/sbin/limiter check-config /etc/limiter/limiter.ini > $R$OUT/check-config.txt 2>&1
ls "$R/etc/systemd/system/sysinit.target.wants/" > $R$OUT/enabled.txt 2>&1 || true
ls "$R/etc/systemd/system/multi-user.target.wants/" >> $R$OUT/enabled.txt 2>&1 || true
in_copy systemd-analyze verify /lib/systemd/system/limiter.service /lib/systemd/system/limiter-bpffs.service /lib/systemd/system/limiter.socket > $R$OUT/verify.txt 2>&1
in_copy zcat /usr/share/man/man8/limiter.8.gz > $R$OUT/man.txt
echo '# edited by the operator' >> "$R/etc/limiter/limiter.ini"
in_copy dpkg -i /tmp/b.deb > $R$OUT/upgrade.txt 2>&1
in_copy dpkg-query -W -f '${Version} ${Status}\n' limiter > $R$OUT/upgraded.txt
cp "$R/etc/limiter/limiter.ini" $R$OUT/conffile-after-upgrade.txt
ls "$R/etc/limiter" > $R$OUT/etc-after-upgrade.txt
in_copy stat -c '%U:%G %a' /etc/limiter/limiter.ini > $R$OUT/conffile-mode-after-upgrade.txt
in_copy dpkg -r limiter > $R$OUT/remove.txt 2>&1
ls "$R/etc/limiter" > $R$OUT/etc-after-remove.txt
test ! -e "$R/usr/sbin/limiter" && echo gone > $R$OUT/binary-after-remove.txt
in_copy dpkg -P limiter > $R$OUT/purge.txt 2>&1
test ! -e "$R/etc/limiter/limiter.ini" && echo gone > $R$OUT/conffile-after-purge.txt
in_copy dpkg-statoverride --list > $R$OUT/overrides-after-purge.txt || true
"#;
    let (dir, text, ok) = in_a_copy_of_the_machine([&first, &second], steps);
    let out = |name| read(&dir, name);
    assert!(
        ok,
        "the scripted install failed: {text}\ninstall: {}",
        std::fs::read_to_string(dir.join("out/install.txt")).unwrap_or_default()
    );
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(out("installed.txt").trim(), format!("{version}-1 install ok installed"));
    assert!(out("user.txt").starts_with("limiter:x:"), "{}", out("user.txt"));
    assert!(out("user.txt").trim().ends_with(":/nonexistent:/usr/sbin/nologin"), "{}", out("user.txt"));
    assert_eq!(out("conffile-mode.txt").trim(), "root:limiter 640");
    let files = out("files.txt");
    for file in [
        "/usr/sbin/limiter",
        "/lib/systemd/system/limiter.service",
        "/lib/systemd/system/limiter-bpffs.service",
        "/lib/systemd/system/limiter.socket",
        "/etc/limiter/limiter.ini",
        "/usr/share/man/man8/limiter.8.gz",
        "/usr/share/doc/limiter/copyright",
        "/usr/share/doc/limiter/README.md",
        "/usr/share/doc/limiter/docs/README.md",
        "/usr/share/doc/limiter/docs/configuration.md",
    ] {
        assert!(files.lines().any(|l| l == file), "{file} is not in the package:\n{files}");
    }
    assert_eq!(out("version.txt").trim(), format!("limiter {version}"));
    assert!(
        out("check-config.txt").starts_with("/etc/limiter/limiter.ini: OK"),
        "{}",
        out("check-config.txt")
    );
    // The bpffs unit enabled; the daemon left for the operator to enable.
    let enabled = out("enabled.txt");
    assert!(enabled.lines().any(|l| l == "limiter-bpffs.service"), "{enabled}");
    assert!(!enabled.lines().any(|l| l == "limiter.service"), "{enabled}");
    assert!(out("verify.txt").trim().is_empty(), "systemd-analyze verify: {}", out("verify.txt"));
    let man = out("man.txt");
    assert!(man.starts_with(".TH LIMITER 8"), "{man}");
    for verb in ["run", "check-config", "reload", "dump", "top", "unload", "prepare-node"] {
        assert!(man.contains(&format!(".SS {verb}\n")), "the man page lacks `{verb}`");
    }
    // The upgrade kept the edited file, asked nothing, left no copy beside it.
    assert_eq!(out("upgraded.txt").trim(), format!("{version}-2 install ok installed"));
    assert!(out("conffile-after-upgrade.txt").ends_with("# edited by the operator\n"));
    assert_eq!(out("etc-after-upgrade.txt").trim(), "limiter.ini", "{}", out("upgrade.txt"));
    assert_eq!(out("conffile-mode-after-upgrade.txt").trim(), "root:limiter 640");
    // Removal keeps the configuration; purge takes it and its override.
    assert_eq!(out("etc-after-remove.txt").trim(), "limiter.ini");
    assert_eq!(out("binary-after-remove.txt").trim(), "gone");
    assert_eq!(out("conffile-after-purge.txt").trim(), "gone");
    assert!(
        !out("overrides-after-purge.txt").contains("/etc/limiter"),
        "{}",
        out("overrides-after-purge.txt")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// lintian's findings on the package: none but the ones named here, each
/// with its reason.
const LINTIAN_ACCEPTED: &[(&str, &str)] = &[
    // The package is built for operators' own repositories, not uploaded
    // to Debian: no Debian bug to close.
    ("initial-upload-closes-no-bugs", "not a Debian upload"),
    // Rust bounds-checks its own buffers; the binary calls none of the
    // libc functions _FORTIFY_SOURCE replaces.
    ("hardening-no-fortify-functions", "a Rust binary"),
    // limiter needs systemd: Type=notify, the bpffs unit, socket
    // activation; there is no SysV init script to ship.
    ("package-supports-alternative-init-but-no-init.d-script", "systemd only"),
    // Words lintian finds in the binary's data (the eBPF object, tables),
    // not in any message.
    ("spelling-error-in-binary", "binary data, not text"),
];

#[test]
#[ignore = "black-box: the package built by `cargo xtask test`"]
fn lintian_finds_nothing_in_the_package() {
    let out = run_with_deadline(
        Command::new("lintian").args(["--tag-display-limit", "0", "--display-info"]).arg(deb("LIMITER_DEB")),
        DEADLINE,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    // lintian exits 2 when it could not check the package; an empty report
    // from a lintian that did not run must not pass.
    assert_ne!(out.status.code(), Some(2), "lintian failed to run: {}", String::from_utf8_lossy(&out.stderr));
    assert!(
        text.contains("limiter: initial-upload-closes-no-bugs"),
        "lintian's report lacks the one tag every build of this package has:\n{text}"
    );
    let findings: Vec<&str> = text
        .lines()
        .filter(|l| !LINTIAN_ACCEPTED.iter().any(|(tag, _)| l.contains(&format!(": {tag}"))))
        .collect();
    assert!(
        findings.is_empty(),
        "lintian:\n{}\n{}",
        findings.join("\n"),
        String::from_utf8_lossy(&out.stderr)
    );
}
