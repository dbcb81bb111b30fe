//! `cargo xtask deb`: `limiter_VERSION-REV_amd64.deb`, packed with
//! `dpkg-deb` from a staged tree (no debhelper): the binary in
//! `/usr/sbin`, the three systemd units in `/lib/systemd/system` (the files
//! of `deploy/systemd`, their `/usr/local` paths moved to the package's),
//! `/etc/limiter/limiter.ini` as a conffile (root:limiter 0640 by
//! `dpkg-statoverride`), the `limiter` system user, the bpffs unit
//! enabled, the manual in `/usr/share/doc/limiter` and a man page generated
//! from `limiter --help`.
//!
//! limiter.service is installed but not enabled: the ports it gates are the
//! operator's choice, so it starts once they edited the file and ran
//! `systemctl enable --now limiter` (an upgrade restarts it if it runs).

use std::{
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, ensure};

use crate::release::Source;

/// The package's maintainer line.
const MAINTAINER: &str = "limiter developers <limiter@example.invalid>";
/// The units, as `deploy/systemd` names them.
pub const UNITS: &[&str] = &["limiter.service", "limiter-bpffs.service", "limiter.socket"];
/// The conffile.
pub const CONFIG: &str = "/etc/limiter/limiter.ini";

/// Where the tarball's paths go in the package: one rule for the units'
/// `ExecStart=`, their `Documentation=` and anything else that names them.
pub fn packaged(unit: &str) -> String {
    unit.replace("/usr/local/bin/", "/usr/sbin/").replace("/usr/local/share/", "/usr/share/")
}

/// Builds the package (Debian revision `revision`) around the release
/// binary `bin`; returns its path in `target/dist`.
pub fn build(bin: &Path, revision: u32) -> Result<PathBuf> {
    let source = Source::read()?;
    let version = format!("{}-{revision}", source.version);
    let name = format!("limiter_{version}_amd64");
    let work = crate::root().join("target/deb");
    let stage = work.join(&name);
    let _ = fs::remove_dir_all(&stage);
    let root = crate::root();
    let put = |to: &str, bytes: &[u8], mode: u32| -> Result<()> {
        let dest = stage.join(to.trim_start_matches('/'));
        fs::create_dir_all(dest.parent().context("a parent")?)?;
        fs::write(&dest, bytes).with_context(|| format!("writing {}", dest.display()))?;
        crate::set_mode(&dest, mode)
    };
    // The binary, stripped of its symbol table (the tarball keeps it).
    let binary = stage.join("usr/sbin/limiter");
    fs::create_dir_all(binary.parent().context("a parent")?)?;
    fs::copy(bin, &binary)?;
    crate::status(
        "stripping the binary",
        Command::new("strip").args(["--strip-unneeded", "--remove-section=.comment"]).arg(&binary),
    )?;
    crate::set_mode(&binary, 0o755)?;
    for unit in UNITS {
        let text = fs::read_to_string(root.join("deploy/systemd").join(unit))?;
        put(&format!("lib/systemd/system/{unit}"), packaged(&text).as_bytes(), 0o644)?;
    }
    // 0644 as shipped; root:limiter 0640 once postinst's override applies.
    put(CONFIG, &fs::read(root.join("examples/limiter.ini"))?, 0o644)?;
    let doc = "usr/share/doc/limiter";
    for file in crate::docs::shipped()? {
        put(&format!("{doc}/{file}"), &fs::read(root.join(&file))?, 0o644)?;
    }
    put(&format!("{doc}/copyright"), copyright(&source).as_bytes(), 0o644)?;
    put(&format!("{doc}/changelog.Debian.gz"), &gzip(changelog(&source, &version)?.as_bytes())?, 0o644)?;
    put("usr/share/man/man8/limiter.8.gz", &gzip(man_page(bin, &source)?.as_bytes())?, 0o644)?;

    let installed_kib = tree_size(&stage)?.div_ceil(1024);
    let depends = shlib_depends(&binary, &work)?;
    let control = format!(
        "Package: limiter\n\
         Version: {version}\n\
         Architecture: amd64\n\
         Maintainer: {MAINTAINER}\n\
         Installed-Size: {installed_kib}\n\
         Depends: adduser, {depends}\n\
         Section: net\n\
         Priority: optional\n\
         Homepage: {}\n\
         Description: {}\n {}\n",
        source.repository,
        "overload admission at the SYN (eBPF) and at HTTP (503)",
        LONG_DESCRIPTION.trim().replace('\n', "\n "),
    );
    put("DEBIAN/control", control.as_bytes(), 0o644)?;
    put("DEBIAN/conffiles", format!("{CONFIG}\n").as_bytes(), 0o644)?;
    put("DEBIAN/postinst", POSTINST.as_bytes(), 0o755)?;
    put("DEBIAN/prerm", PRERM.as_bytes(), 0o755)?;
    put("DEBIAN/postrm", POSTRM.as_bytes(), 0o755)?;
    put("DEBIAN/md5sums", md5sums(&stage)?.as_bytes(), 0o644)?;

    let dist = root.join("target/dist");
    fs::create_dir_all(&dist)?;
    let deb = dist.join(format!("{name}.deb"));
    crate::status(
        "packing the Debian package",
        Command::new("dpkg-deb")
            .args(["--root-owner-group", "-Zxz", "--build"])
            .arg(&stage)
            .arg(&deb)
            .env("SOURCE_DATE_EPOCH", source.epoch.to_string()),
    )?;
    Ok(deb)
}

const LONG_DESCRIPTION: &str = "
limiter keeps a server alive under overload. In the kernel, with eBPF, it
counts established TCP connections per local port and refuses a new one
to a full port at the SYN, with a RST. As an HTTP reverse proxy it answers
503 the instant a limit is reached (a global limit, slots kept for /debug/
paths, per-session and per-web-client limits) and a circuit breaker stops
sending work to a failing upstream.
.
limiter.service is installed disabled: edit /etc/limiter/limiter.ini, then
run systemctl enable --now limiter.";

const POSTINST: &str = r#"#!/bin/sh
set -e

if [ "$1" = "configure" ]; then
    # The daemon drops to this user once the gate is loaded.
    if ! getent passwd limiter >/dev/null; then
        adduser --system --group --no-create-home --home /nonexistent --quiet limiter
    fi
    # Reloads re-read the file as that user: root:limiter 0640, kept by
    # dpkg across upgrades (unless an administrator set another override).
    if ! dpkg-statoverride --list /etc/limiter/limiter.ini >/dev/null 2>&1; then
        dpkg-statoverride --update --add root limiter 0640 /etc/limiter/limiter.ini
    fi
fi

if [ "$1" = "configure" ] || [ "$1" = "abort-upgrade" ] || [ "$1" = "abort-deconfigure" ] || [ "$1" = "abort-remove" ]; then
    # bpffs for the pins: enabled on a new install, left as the
    # administrator set it on an upgrade. limiter.service is enabled by
    # the administrator once the configuration names their ports.
    deb-systemd-helper unmask limiter-bpffs.service >/dev/null || true
    if deb-systemd-helper --quiet was-enabled limiter-bpffs.service; then
        deb-systemd-helper enable limiter-bpffs.service >/dev/null || true
    else
        deb-systemd-helper update-state limiter-bpffs.service >/dev/null || true
    fi
    for unit in limiter.service limiter.socket; do
        deb-systemd-helper update-state "$unit" >/dev/null || true
    done
    if [ -d /run/systemd/system ]; then
        systemctl --system daemon-reload >/dev/null || true
        deb-systemd-invoke start limiter-bpffs.service >/dev/null || true
        # An upgrade: the new binary serves (the gate stays pinned).
        if [ -n "$2" ]; then
            deb-systemd-invoke try-restart limiter.service >/dev/null || true
        fi
    fi
fi
"#;

const PRERM: &str = r#"#!/bin/sh
set -e

if [ "$1" = "remove" ]; then
    if [ -d /run/systemd/system ]; then
        deb-systemd-invoke stop limiter.service limiter.socket >/dev/null || true
    fi
    # The gate outlives the daemon (pinned): without the binary nothing
    # could detach it, so removing the package removes the gate.
    if [ -e /sys/fs/bpf/limiter ] && command -v limiter >/dev/null; then
        limiter unload --config /etc/limiter/limiter.ini || true
    fi
fi
"#;

const POSTRM: &str = r#"#!/bin/sh
set -e

if [ "$1" = "remove" ] && [ -d /run/systemd/system ]; then
    systemctl --system daemon-reload >/dev/null || true
fi

if [ "$1" = "remove" ] && [ -x "/usr/bin/deb-systemd-helper" ]; then
    deb-systemd-helper mask limiter.service limiter-bpffs.service limiter.socket >/dev/null || true
fi

if [ "$1" = "purge" ]; then
    if [ -x "/usr/bin/deb-systemd-helper" ]; then
        deb-systemd-helper purge limiter.service limiter-bpffs.service limiter.socket >/dev/null || true
        deb-systemd-helper unmask limiter.service limiter-bpffs.service limiter.socket >/dev/null || true
    fi
    if dpkg-statoverride --list /etc/limiter/limiter.ini >/dev/null 2>&1; then
        dpkg-statoverride --remove /etc/limiter/limiter.ini
    fi
    rm -rf /var/log/limiter
fi
"#;

fn copyright(source: &Source) -> String {
    format!(
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\
         Upstream-Name: limiter\n\
         Source: {}\n\
         \n\
         Files: *\n\
         Copyright: 2026 limiter developers\n\
         License: MIT or Apache-2.0\n\
         \n\
         License: MIT\n{}\n\
         \n\
         License: Apache-2.0\n \
         Licensed under the Apache License, Version 2.0 (the \"License\"); you may\n \
         not use this file except in compliance with the License.\n \
         .\n \
         On Debian systems, the full text of the Apache License, Version 2.0 can\n \
         be found in the file `/usr/share/common-licenses/Apache-2.0'.\n",
        source.repository,
        MIT.trim()
            .lines()
            .map(|l| if l.is_empty() { " .".to_owned() } else { format!(" {l}") })
            .collect::<Vec<_>>()
            .join("\n"),
    )
}

const MIT: &str = "
Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the \"Software\"), to deal
in the Software without restriction, including without limitation the rights
to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in
all copies or substantial portions of the Software.

THE SOFTWARE IS PROVIDED \"AS IS\", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN
THE SOFTWARE.";

fn changelog(source: &Source, version: &str) -> Result<String> {
    let out = Command::new("date").args(["-u", "-R", "-d"]).arg(format!("@{}", source.epoch)).output()?;
    ensure!(out.status.success(), "date: {}", String::from_utf8_lossy(&out.stderr));
    let date = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    Ok(format!(
        "limiter ({version}) unstable; urgency=medium\n\n  * limiter {} built from {}.\n\n -- {MAINTAINER}  {date}\n",
        source.version, source.revision
    ))
}

/// `gzip -9n`: no name, no time, so the same input packs the same.
fn gzip(bytes: &[u8]) -> Result<Vec<u8>> {
    use std::io::Write as _;
    let mut child = Command::new("gzip")
        .args(["-9n", "-c"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("starting gzip")?;
    child.stdin.take().context("gzip's stdin")?.write_all(bytes)?;
    let out = child.wait_with_output()?;
    ensure!(out.status.success(), "gzip failed");
    Ok(out.stdout)
}

/// The man page, limiter(8): the help of `limiter` and of each verb, as
/// the binary prints it, and where the manual is.
pub fn man_page(bin: &Path, source: &Source) -> Result<String> {
    let help = |args: &[&str]| -> Result<String> {
        let out = Command::new(bin).args(args).arg("--help").env("COLUMNS", "78").output()?;
        ensure!(out.status.success(), "{} {} --help failed", bin.display(), args.join(" "));
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let top = help(&[])?;
    let verbs: Vec<String> = top
        .split("Commands:\n")
        .nth(1)
        .context("`limiter --help` lists no commands")?
        .lines()
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .filter(|v| v != "help")
        .collect();
    let mut page = String::new();
    let date = crate::release::rfc3339(source.epoch)?;
    writeln!(
        page,
        ".TH LIMITER 8 \"{}\" \"limiter {}\" \"System Administration\"",
        &date[..10],
        source.version
    )?;
    writeln!(page, ".SH NAME\nlimiter \\- {}", roff(&source.description))?;
    writeln!(page, ".SH SYNOPSIS\n.B limiter\n.I COMMAND\n[\\fIOPTIONS\\fR]")?;
    writeln!(page, ".SH DESCRIPTION")?;
    for para in LONG_DESCRIPTION.trim().split("\n.\n") {
        writeln!(page, ".PP\n{}", roff(para))?;
    }
    writeln!(page, ".SH COMMANDS")?;
    for verb in &verbs {
        writeln!(page, ".SS {verb}\n.nf\n{}.fi", roff(&help(&[verb])?))?;
    }
    writeln!(
        page,
        ".SH EXIT STATUS\n0 success; 78 (EX_CONFIG) the configuration is wrong (restarting will not fix it); \
         1 the environment failed (worth retrying); 2 usage.\n\
         .SH FILES\n.TP\n{CONFIG}\nthe configuration (a conffile)\n.TP\n/sys/fs/bpf/limiter\nthe pinned kernel gate\n\
         .TP\n/lib/systemd/system/limiter.service\nthe unit (limiter.socket keeps the listeners across restarts)\n\
         .SH SEE ALSO\nThe manual: /usr/share/doc/limiter/docs/README.md (docs/ in the source, {}).",
        roff(source.repository)
    )?;
    Ok(page)
}

/// Text as roff reads it literally.
fn roff(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let line = line.replace('\\', "\\e").replace('-', "\\-");
        if line.starts_with('.') || line.starts_with('\'') {
            out.push_str("\\&");
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// `dpkg-shlibdeps`' dependencies of the binary (libc6, libgcc-s1 with
/// their least versions).
fn shlib_depends(binary: &Path, work: &Path) -> Result<String> {
    let dir = work.join("shlibdeps");
    fs::create_dir_all(dir.join("debian"))?;
    fs::write(dir.join("debian/control"), "Source: limiter\n\nPackage: limiter\nArchitecture: any\n")?;
    let out = Command::new("dpkg-shlibdeps")
        .arg("-O")
        .arg(format!("-e{}", binary.display()))
        .current_dir(&dir)
        .output()
        .context("starting dpkg-shlibdeps (dpkg-dev; cargo xtask setup)")?;
    ensure!(out.status.success(), "dpkg-shlibdeps: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("shlibs:Depends="))
        .map(str::to_owned)
        .context("dpkg-shlibdeps printed no shlibs:Depends")
}

/// `DEBIAN/md5sums`: every file outside DEBIAN (conffiles included).
fn md5sums(stage: &Path) -> Result<String> {
    let mut files = Vec::new();
    walk(stage, &mut files)?;
    let relative: Vec<String> = files
        .iter()
        .filter_map(|f| f.strip_prefix(stage).ok())
        .filter(|f| !f.starts_with("DEBIAN"))
        .map(|f| f.display().to_string())
        .collect();
    let out = Command::new("md5sum").args(&relative).current_dir(stage).output()?;
    ensure!(out.status.success(), "md5sum: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn tree_size(dir: &Path) -> Result<u64> {
    let mut files = Vec::new();
    walk(dir, &mut files)?;
    Ok(files
        .iter()
        .filter(|f| !f.strip_prefix(dir).is_ok_and(|r| r.starts_with("DEBIAN")))
        .map(|f| f.metadata().map_or(0, |m| m.len()))
        .sum())
}

fn walk(dir: &Path, files: &mut Vec<PathBuf>) -> Result<()> {
    let mut entries: Vec<_> = fs::read_dir(dir)?.collect::<std::io::Result<_>>()?;
    entries.sort_by_key(fs::DirEntry::file_name);
    for entry in entries {
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            walk(&path, files)?;
        } else {
            files.push(path);
        }
    }
    Ok(())
}

/// `cargo xtask deb [--revision N]`.
pub fn main(args: &[String]) -> Result<()> {
    let revision = match args.iter().position(|a| a == "--revision").and_then(|i| args.get(i + 1)) {
        Some(n) => n.parse().context("--revision takes a number")?,
        None => 1,
    };
    let bin = crate::build_daemon(true)?;
    println!("{}", build(&bin, revision)?.display());
    Ok(())
}
