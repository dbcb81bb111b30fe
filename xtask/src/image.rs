//! `cargo xtask image`: the OCI image the DaemonSet
//! (`deploy/kubernetes/limiter.yaml`) names, built from nothing (`buildah
//! from scratch`: no base image, no registry): the release binary, the
//! shared libraries it loads (as `ldd` lists them, copied from the build
//! host), `/etc/passwd` and `/etc/group` naming root and the daemon's user
//! — no shell, no package manager. The image's user is the daemon's
//! (65532): run as it is, it can only print its help; the manifest starts it
//! as root with the capabilities start-up needs, and the daemon drops to
//! 65532 itself (`run --user`).

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail, ensure};

use crate::release::Source;

/// The repository the manifest names; the tag is the version.
pub const REPOSITORY: &str = "registry.example.com/limiter";
/// Where the binary goes in the image (the package's path too).
pub const BINARY: &str = "/usr/sbin/limiter";
/// The daemon's user and group in the image and the manifest.
pub const UID: u32 = 65532;

/// The image's default name: the manifest's.
pub fn default_name() -> String {
    format!("{REPOSITORY}:{}", env!("CARGO_PKG_VERSION"))
}

/// What was built.
pub struct Built {
    pub name: String,
    /// The image's ID in local storage (`buildah images`).
    pub id: String,
    /// The digest of its manifest in local storage (a registry's after a
    /// push may differ: it compresses the layer anew).
    pub digest: String,
    /// The OCI archive, if one was written, and its manifest's digest.
    pub archive: Option<(PathBuf, String)>,
}

/// Builds the image `name` around the release binary `bin` in the local
/// container storage, and writes it as an OCI archive to `archive` if
/// given.
pub fn build(bin: &Path, name: &str, archive: Option<&Path>) -> Result<Built> {
    let source = Source::read()?;
    let stage = crate::root().join("target/image/rootfs");
    stage_rootfs(bin, &stage)?;
    let container = format!("limiter-image-{}", std::process::id());
    let buildah = |args: &[&str]| -> Result<String> {
        let out =
            Command::new("buildah").args(args).output().context("starting buildah (cargo xtask setup)")?;
        ensure!(
            out.status.success(),
            "buildah {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    buildah(&["from", "--name", &container, "scratch"])?;
    let built = (|| -> Result<String> {
        let stage = stage.display().to_string();
        buildah(&["copy", "--chown", "0:0", &container, &format!("{stage}/."), "/"])?;
        let user = format!("{UID}:{UID}");
        let entrypoint = format!("[\"{BINARY}\"]");
        let mut config = vec![
            "config",
            "--entrypoint",
            &entrypoint,
            "--cmd",
            "--help",
            "--user",
            &user,
            "--workingdir",
            "/",
            "--created-by",
            "cargo xtask image",
            "--os",
            "linux",
            "--arch",
            "amd64",
        ];
        let labels = source.labels()?;
        let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        for label in &labels {
            config.extend(["--label", label]);
        }
        config.push(&container);
        buildah(&config)?;
        let timestamp = source.epoch.to_string();
        buildah(&["commit", "--quiet", "--rm", "--timestamp", &timestamp, &container, name])
    })();
    if built.is_err() {
        let _ = Command::new("buildah").args(["rm", &container]).output();
    }
    let id = built?;
    let digest = buildah(&["inspect", "--type", "image", "--format", "{{.FromImageDigest}}", name])?;
    let archive = match archive {
        Some(path) => {
            if let Some(dir) = path.parent() {
                fs::create_dir_all(dir)?;
            }
            let _ = fs::remove_file(path);
            buildah(&["push", "--quiet", name, &format!("oci-archive:{}:{name}", path.display())])?;
            let digest = archive_digest(path)?;
            Some((path.to_path_buf(), digest))
        }
        None => None,
    };
    Ok(Built { name: name.to_owned(), id, digest, archive })
}

/// The files of the image, staged in `stage`: the binary, its libraries
/// at the paths the dynamic loader looks for them, and the two account
/// files.
fn stage_rootfs(bin: &Path, stage: &Path) -> Result<()> {
    let _ = fs::remove_dir_all(stage);
    let put = |from: &Path, to: &str, mode: u32| -> Result<()> {
        let dest = stage.join(to.trim_start_matches('/'));
        fs::create_dir_all(dest.parent().context("a parent")?)?;
        // fs::copy follows symbolic links: the file itself lands at the path.
        fs::copy(from, &dest).with_context(|| format!("copying {} into the image", from.display()))?;
        crate::set_mode(&dest, mode)
    };
    put(bin, BINARY, 0o755)?;
    for lib in runtime_libraries(bin)? {
        put(&lib, &lib.display().to_string(), 0o755)?;
    }
    let write = |to: &str, text: String| -> Result<()> {
        let dest = stage.join(to);
        fs::create_dir_all(dest.parent().context("a parent")?)?;
        fs::write(&dest, text)?;
        crate::set_mode(&dest, 0o644)
    };
    write(
        "etc/passwd",
        format!("root:x:0:0:root:/:/usr/sbin/nologin\nlimiter:x:{UID}:{UID}:limiter:/:/usr/sbin/nologin\n"),
    )?;
    write("etc/group", format!("root:x:0:\nlimiter:x:{UID}:\n"))?;
    Ok(())
}

/// The shared objects `bin` loads, the dynamic loader among them, as
/// `ldd` resolves them on this host.
pub fn runtime_libraries(bin: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd").arg(bin).output().context("starting ldd")?;
    ensure!(out.status.success(), "ldd {}: {}", bin.display(), String::from_utf8_lossy(&out.stderr));
    let mut libs = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let line = line.trim();
        // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)`, or the
        // loader alone: `/lib64/ld-linux-x86-64.so.2 (0x…)`; the vDSO has
        // no file.
        let path = match line.split_once(" => ") {
            Some((_, rest)) => rest,
            None => line,
        };
        let path = path.split(" (").next().unwrap_or_default();
        if path.starts_with('/') {
            libs.push(PathBuf::from(path));
        } else if !line.starts_with("linux-vdso") {
            bail!("ldd {}: a library it cannot place: {line}", bin.display());
        }
    }
    ensure!(!libs.is_empty(), "ldd {} listed no library (a static binary needs no staging)", bin.display());
    Ok(libs)
}

/// The digest of the image manifest in an OCI archive (its `index.json`'s
/// one entry).
fn archive_digest(archive: &Path) -> Result<String> {
    let out = Command::new("tar").arg("-xOf").arg(archive).arg("index.json").output()?;
    ensure!(out.status.success(), "reading index.json from {}", archive.display());
    let index: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    index["manifests"][0]["digest"]
        .as_str()
        .map(str::to_owned)
        .with_context(|| format!("{}: index.json names no manifest", archive.display()))
}

/// `cargo xtask image [--name NAME] [--archive FILE]`.
pub fn main(args: &[String]) -> Result<()> {
    let value = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned();
    let name = value("--name").unwrap_or_else(default_name);
    let archive = value("--archive").map(PathBuf::from);
    let bin = crate::build_daemon(true)?;
    let built = build(&bin, &name, archive.as_deref())?;
    println!("image   {}", built.name);
    println!("id      {}", built.id);
    println!("digest  {}", built.digest);
    if let Some((path, digest)) = &built.archive {
        println!("archive {} (its manifest: {digest})", path.display());
    }
    Ok(())
}
