//! A second, unprivileged user for one test: created with `useradd` (a
//! system user with its own group, no home, no login shell), removed with
//! `userdel` on drop; and commands run as that user (`setpriv`, no
//! supplementary groups, no capabilities).

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::atomic::{AtomicU32, Ordering},
};

use anyhow::{Context as _, Result, bail};

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A user that exists while this value lives.
pub struct TempUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

impl TempUser {
    pub fn create() -> Result<Self> {
        // At most 32 characters, as useradd wants.
        let name = format!("ltu{}x{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed));
        let out = Command::new("useradd")
            .args(["--system", "--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin", &name])
            .output()
            .context("useradd (cargo xtask setup names its package)")?;
        if !out.status.success() {
            bail!("useradd {name}: {}", String::from_utf8_lossy(&out.stderr));
        }
        let field = |flag: &str| -> Result<u32> {
            let out = Command::new("id").args([flag, &name]).output()?;
            Ok(String::from_utf8_lossy(&out.stdout).trim().parse()?)
        };
        let user = Self { uid: field("-u")?, gid: field("-g")?, name };
        Ok(user)
    }

    /// `program args…` run as this user.
    pub fn command(&self, program: impl AsRef<Path>, args: &[&str]) -> Command {
        let mut cmd = Command::new("setpriv");
        cmd.arg(format!("--reuid={}", self.uid))
            .arg(format!("--regid={}", self.gid))
            .args(["--clear-groups", "--inh-caps=-all", "--"])
            .arg(program.as_ref())
            .args(args);
        cmd
    }

    /// Runs `program args…` as this user and waits for it.
    pub fn run(&self, program: impl AsRef<Path>, args: &[&str]) -> Output {
        let program: PathBuf = program.as_ref().into();
        self.command(&program, args).output().unwrap_or_else(|e| panic!("setpriv {}: {e}", program.display()))
    }
}

impl Drop for TempUser {
    fn drop(&mut self) {
        // Only the user this value created, by its own name.
        let _ = Command::new("userdel").arg(&self.name).output();
    }
}
