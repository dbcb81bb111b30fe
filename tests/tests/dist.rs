//! The release tarball (`cargo xtask dist`) runs on its own: unpacked in a
//! clean directory and run with a bare environment (no cargo, rustc, LLVM
//! or bpf-linker on PATH), the binary answers `--version` and validates the
//! configuration it ships with; the units and manifest are inside.

use std::{path::PathBuf, process::Command};

use limiter_tests::process::{DEADLINE, run_with_deadline};

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn the_release_tarball_runs_from_a_clean_directory() {
    let tarball = PathBuf::from(
        std::env::var_os("LIMITER_DIST")
            .expect("LIMITER_DIST is unset: run the suite with `cargo xtask test`"),
    );
    let dir = std::env::temp_dir().join(format!("limiter-dist-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let out = run_with_deadline(Command::new("tar").arg("-xzf").arg(&tarball).arg("-C").arg(&dir), DEADLINE);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let root = std::fs::read_dir(&dir).unwrap().flatten().next().unwrap().path();
    for file in [
        "bin/limiter",
        "etc/limiter.ini",
        "doc/README.md",
        "doc/BENCHMARKS.md",
        "doc/docs/TOOLCHAIN.md",
        "doc/docs/README.md",
        "doc/docs/configuration.md",
        "deploy/systemd/limiter.service",
        "deploy/systemd/limiter-bpffs.service",
        "deploy/systemd/limiter.socket",
        "deploy/kubernetes/limiter.yaml",
    ] {
        assert!(root.join(file).is_file(), "{file} is missing from {}", tarball.display());
    }
    let bare = |args: &[&str]| {
        run_with_deadline(
            Command::new(root.join("bin/limiter"))
                .args(args)
                .current_dir(&root)
                .env_clear()
                .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
            DEADLINE,
        )
    };
    let out = bare(&["--version"]);
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), format!("limiter {}", env!("CARGO_PKG_VERSION")));
    let out = bare(&["check-config", "etc/limiter.ini"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.starts_with("etc/limiter.ini: OK"),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The kernel programs are inside the binary (aya embeds the object).
    let binary = std::fs::read(root.join("bin/limiter")).unwrap();
    assert!(binary.windows(13).any(|w| w == b"limiter_count"), "no eBPF object embedded");
    let _ = std::fs::remove_dir_all(&dir);
}
