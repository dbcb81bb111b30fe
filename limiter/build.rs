//! Builds the kernel programs (`limiter-ebpf`, for `bpfel-unknown-none`, with
//! the nightly toolchain and bpf-linker) and leaves the object in `OUT_DIR`
//! for `include_bytes!`.
use std::path::Path;

fn main() {
    let ebpf_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../limiter-ebpf");
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
}
