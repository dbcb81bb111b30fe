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
    generate(dir, cn, &["subjectAltName=DNS:localhost,IP:127.0.0.1".to_owned()])
}

/// A self-signed leaf (not a CA: webpki refuses a CA certificate as a
/// server's) for the names in `san` (`subjectAltName` syntax:
/// `IP:10.77.0.1`, `DNS:name`), for a client that trusts it as its root.
pub fn self_signed_for(dir: &Path, cn: &str, san: &str) -> (PathBuf, PathBuf) {
    generate(dir, cn, &[format!("subjectAltName={san}"), "basicConstraints=critical,CA:FALSE".to_owned()])
}

/// `openssl req -x509` with the extensions `exts`.
fn generate(dir: &Path, cn: &str, exts: &[String]) -> (PathBuf, PathBuf) {
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
            .args(["-subj", &format!("/CN={cn}")])
            .args(exts.iter().flat_map(|e| ["-addext", e.as_str()]))
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
