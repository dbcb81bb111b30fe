//! Builds the kernel programs (`limiter-ebpf`, for `bpfel-unknown-none`, with
//! the nightly toolchain and bpf-linker) and leaves the object in `OUT_DIR`
//! for `include_bytes!`.
//!
//! The object depends only on the eBPF crate, the types it shares
//! (`limiter-common`), the lock file and the toolchain, never on the profile
//! or features `limiter` is built with; yet each of those builds runs this
//! script in a directory of its own, and aya-build compiles `core` for BPF
//! again in each (half a minute on two cores). So the object is kept in the
//! workspace's `target/ebpf-cache` (every target directory's builds share
//! it), named by a hash of everything it is made from, and copied from
//! there when it is already built.
use std::{
    collections::hash_map::DefaultHasher,
    fs,
    hash::Hasher as _,
    path::{Path, PathBuf},
    process::Command,
};

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let object = out.join("limiter");
    let cached = Some(root.join("target/ebpf-cache").join(format!("limiter-{:016x}", inputs_hash(&root))));
    if let Some(cached) = &cached
        && fs::copy(cached, &object).is_ok()
    {
        return;
    }
    let ebpf_dir = root.join("limiter-ebpf");
    let ebpf_dir = ebpf_dir.to_str().expect("workspace path is UTF-8");
    let package = aya_build::Package { name: "limiter-ebpf", root_dir: ebpf_dir, ..Default::default() };
    if let Err(e) = aya_build::build_ebpf([package], aya_build::Toolchain::default()) {
        // The usual cause is a missing prerequisite; say which command fixes it.
        panic!(
            "building the kernel programs failed: {e:#}\n\
             The eBPF build needs the nightly toolchain with rust-src, LLVM 22 and \
             bpf-linker 0.13.0: `cargo xtask setup` checks and installs them."
        );
    }
    if let Some(cached) = cached
        && let Some(dir) = cached.parent()
        && fs::create_dir_all(dir).is_ok()
    {
        // Written aside and renamed: a build beside this one never copies
        // half an object.
        let part = cached.with_extension(format!("part-{}", std::process::id()));
        if fs::copy(&object, &part).is_ok() {
            let _ = fs::rename(&part, &cached);
        }
    }
}

/// A hash of what the object is made from: the sources and manifests of
/// `limiter-ebpf` and `limiter-common`, the lock file, the nightly
/// toolchain's version and the environment aya-build reads. Cargo is told to
/// run this script again when any of the files changes.
fn inputs_hash(root: &Path) -> u64 {
    let mut h = DefaultHasher::new();
    let mut files = Vec::new();
    for dir in ["limiter-ebpf", "limiter-common"] {
        collect(&root.join(dir), &mut files);
    }
    files.push(root.join("Cargo.lock"));
    files.sort();
    for file in &files {
        println!("cargo:rerun-if-changed={}", file.display());
        h.write(file.strip_prefix(root).unwrap_or(file).to_string_lossy().as_bytes());
        h.write(&fs::read(file).unwrap_or_default());
    }
    let nightly = Command::new("rustc").arg("+nightly").arg("--version").output();
    h.write(&nightly.map(|o| o.stdout).unwrap_or_default());
    for var in [
        "AYA_BUILD_SKIP",
        "BPF_TARGET_ARCH",
        "AYA_BPF_TARGET_ARCH",
        "RUSTC_BOOTSTRAP",
        "CARGO_CFG_TARGET_ENDIAN",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
        h.write(var.as_bytes());
        h.write(std::env::var(var).unwrap_or_default().as_bytes());
    }
    h.finish()
}

/// Every file below `dir`, but build output.
fn collect(dir: &Path, files: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.file_name().is_some_and(|n| n == "target") {
            continue;
        }
        if path.is_dir() {
            collect(&path, files);
        } else {
            files.push(path);
        }
    }
}
