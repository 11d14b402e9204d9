//! Rebuilds the eBPF object when the linker changes (a new bpf-linker may emit different code).
use which::which;

fn main() {
    match which("bpf-linker") {
        Ok(path) => println!("cargo:rerun-if-changed={}", path.display()),
        Err(err) => println!("cargo:warning=bpf-linker not found on PATH: {err}"),
    }
}
