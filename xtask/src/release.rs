//! `cargo xtask release`: every artifact of one version from one release
//! build — the tarball, the Debian package, the image as an OCI archive —
//! in `target/dist`, with their SHA-256 sums (`SHA256SUMS`, as
//! `sha256sum -c` reads it). And the facts about the source they all
//! carry ([`Source`]).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, ensure};

/// What every artifact says about the source it was built from.
pub struct Source {
    pub version: &'static str,
    /// The commit, with `-dirty` when the work tree has changes.
    pub revision: String,
    /// The commit's time (seconds since 1970): the image's and the
    /// package's timestamps, so the same commit builds the same files.
    pub epoch: u64,
    pub repository: &'static str,
    pub licenses: &'static str,
    /// The daemon's one-line description (limiter/Cargo.toml).
    pub description: String,
}

impl Source {
    pub fn read() -> Result<Self> {
        let git = |args: &[&str]| -> Result<String> {
            let out = Command::new("git").args(args).current_dir(crate::root()).output()?;
            ensure!(out.status.success(), "git {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
        };
        let mut revision = git(&["rev-parse", "HEAD"])?;
        if !git(&["status", "--porcelain", "--untracked-files=no"])?.is_empty() {
            revision.push_str("-dirty");
        }
        let epoch = git(&["log", "-1", "--format=%ct"])?.parse().context("the commit's time")?;
        let manifest = std::fs::read_to_string(crate::root().join("limiter/Cargo.toml"))?;
        let description = manifest
            .lines()
            .find_map(|l| l.strip_prefix("description = \""))
            .and_then(|l| l.strip_suffix('"'))
            .context("limiter/Cargo.toml has no description line")?
            .to_owned();
        Ok(Self {
            version: env!("CARGO_PKG_VERSION"),
            revision,
            epoch,
            repository: env!("CARGO_PKG_REPOSITORY"),
            licenses: env!("CARGO_PKG_LICENSE"),
            description,
        })
    }

    /// The image's `org.opencontainers.image.*` labels.
    pub fn labels(&self) -> Result<Vec<(&'static str, String)>> {
        Ok(vec![
            ("org.opencontainers.image.title", "limiter".to_owned()),
            ("org.opencontainers.image.description", self.description.clone()),
            ("org.opencontainers.image.version", self.version.to_owned()),
            ("org.opencontainers.image.revision", self.revision.clone()),
            ("org.opencontainers.image.source", self.repository.to_owned()),
            ("org.opencontainers.image.licenses", self.licenses.to_owned()),
            ("org.opencontainers.image.created", rfc3339(self.epoch)?),
        ])
    }
}

/// `2026-12-05T04:00:00Z` for seconds since 1970 (coreutils' `date`).
pub fn rfc3339(epoch: u64) -> Result<String> {
    let out =
        Command::new("date").args(["-u", "+%Y-%m-%dT%H:%M:%SZ", "-d"]).arg(format!("@{epoch}")).output()?;
    ensure!(out.status.success(), "date: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// The artifacts of one release.
pub struct Artifacts {
    pub tarball: PathBuf,
    pub deb: PathBuf,
    pub image: PathBuf,
    pub sums: PathBuf,
}

/// Builds every artifact around the release binary `bin`.
pub fn artifacts(bin: &Path) -> Result<Artifacts> {
    let dist = crate::root().join("target/dist");
    let tarball = crate::dist_of(bin)?;
    let deb = crate::deb::build(bin, 1)?;
    let image = dist.join(format!("limiter-{}-image.oci.tar", env!("CARGO_PKG_VERSION")));
    let built = crate::image::build(bin, &crate::image::default_name(), Some(&image))?;
    if let Some((_, digest)) = &built.archive {
        eprintln!("xtask: image {} ({digest})", built.name);
    }
    let names: Vec<String> = [&tarball, &deb, &image]
        .iter()
        .map(|p| p.file_name().unwrap_or_default().to_string_lossy().into_owned())
        .collect();
    let out =
        Command::new("sha256sum").args(&names).current_dir(&dist).output().context("starting sha256sum")?;
    ensure!(out.status.success(), "sha256sum: {}", String::from_utf8_lossy(&out.stderr));
    let sums = dist.join("SHA256SUMS");
    std::fs::write(&sums, &out.stdout)?;
    Ok(Artifacts { tarball, deb, image, sums })
}

/// `cargo xtask release`.
pub fn main() -> Result<()> {
    let bin = crate::build_daemon(true)?;
    let a = artifacts(&bin)?;
    for path in [&a.tarball, &a.deb, &a.image, &a.sums] {
        println!("{}", path.display());
    }
    print!("{}", std::fs::read_to_string(&a.sums)?);
    Ok(())
}
