//! Certificates for the TLS tests, made by the real `openssl` (Debian's,
//! installed by `cargo xtask setup`).

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use crate::process::run_with_deadline;

/// A self-signed P-256 certificate for `localhost` and 127.0.0.1 whose
/// subject is `CN=cn`, valid for 30 days: `(cert, key)` in `dir`.
pub fn self_signed(dir: &Path, cn: &str) -> (PathBuf, PathBuf) {
    let (cert, key) = (dir.join(format!("{cn}.crt")), dir.join(format!("{cn}.key")));
    let out = run_with_deadline(
        Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-days",
                "30",
            ])
            .args(["-subj", &format!("/CN={cn}"), "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert),
        Duration::from_secs(20),
    );
    assert!(
        out.status.success(),
        "openssl req (cargo xtask setup installs openssl): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (cert, key)
}
