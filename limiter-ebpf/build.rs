//! The kernel programs are linked by `bpf-linker-v3` (see
//! .cargo/config.toml); rebuild them when either linker changes.
fn main() {
    println!("cargo:rerun-if-changed=bpf-linker-v3");
    if let Ok(linker) = which::which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    }
}
