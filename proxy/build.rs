//! Builds the eBPF object (`proxy-ebpf`) for `bpfel-unknown-none` with aya-build and leaves it at
//! `$OUT_DIR/proxy-ebpf`, where `dataplane::ebpf` embeds it with `include_bytes_aligned!`.
//!
//! `KPR_SKIP_EBPF=1` skips the eBPF build (for `cargo check`/clippy on machines without
//! bpf-linker): an empty object is embedded and the ebpf backend refuses to start.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context as _};
use aya_build::{Package, Toolchain};

const SKIP_ENV: &str = "KPR_SKIP_EBPF";
const EBPF_PACKAGE: &str = "proxy-ebpf";

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-env-changed={SKIP_ENV}");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").ok_or_else(|| anyhow!("OUT_DIR not set"))?);
    let object = out_dir.join(EBPF_PACKAGE);
    if skip_requested() {
        println!(
            "cargo:warning={SKIP_ENV}=1: the eBPF programs are NOT built; the `ebpf` backend of this \
             agent will refuse to start (rebuild without {SKIP_ENV} and with bpf-linker installed)"
        );
        fs::write(&object, b"").with_context(|| format!("writing empty {}", object.display()))?;
        return Ok(());
    }
    build_ebpf_object()
}

fn skip_requested() -> bool {
    env::var(SKIP_ENV).is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
}

/// Runs aya-build from inside `proxy-ebpf/`: the crate is excluded from the host workspace, so the
/// nested `cargo build --package proxy-ebpf` must run where that crate is its own workspace root.
fn build_ebpf_object() -> anyhow::Result<()> {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR")?);
    let root = manifest_dir
        .parent()
        .ok_or_else(|| anyhow!("{} has no parent", manifest_dir.display()))?;
    let ebpf_dir = root.join(EBPF_PACKAGE);
    let common_dir = root.join("proxy-common");
    ensure_bpf_linker()?;
    // aya-build watches the eBPF crate; the shared map types live in proxy-common.
    println!(
        "cargo:rerun-if-changed={}",
        common_dir.join("src").display()
    );
    println!(
        "cargo:rerun-if-changed={}",
        common_dir.join("Cargo.toml").display()
    );
    env::set_current_dir(&ebpf_dir)
        .with_context(|| format!("entering the eBPF crate at {}", ebpf_dir.display()))?;
    // aya-build only uses root_dir for rerun-if-changed; watching `src` (not the whole crate)
    // keeps a manual clippy run's `proxy-ebpf/target` from triggering rebuilds.
    // Only files that exist: cargo reruns a build script on every build while a watched path is
    // missing (the eBPF crate has no build.rs; adding one changes its Cargo.toml's `build` or is
    // picked up on the next change of a watched file).
    for file in ["Cargo.toml", "Cargo.lock", "build.rs"] {
        let path = ebpf_dir.join(file);
        if path.exists() {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
    let ebpf_src = ebpf_dir.join("src");
    let package = Package {
        name: EBPF_PACKAGE,
        root_dir: path_str(&ebpf_src)?,
        ..Default::default()
    };
    // aya-build forwards the nested cargo's stderr as cargo warnings, which cargo replays on every
    // build of `proxy`; keep the progress lines out so that only real diagnostics show.
    env::set_var("CARGO_TERM_QUIET", "true");
    let toolchain_file = ebpf_dir.join("rust-toolchain.toml");
    println!("cargo:rerun-if-changed={}", toolchain_file.display());
    let channel = pinned_nightly(&toolchain_file)?;
    aya_build::build_ebpf([package], Toolchain::Custom(&channel))
        .with_context(|| format!("building the eBPF programs in {}", ebpf_dir.display()))
}

/// The dated nightly the eBPF crate is pinned to (`channel = "..."` in its rust-toolchain.toml).
fn pinned_nightly(file: &Path) -> anyhow::Result<String> {
    let text = fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    text.lines()
        .find_map(|line| {
            let (key, value) = line.split_once('=')?;
            (key.trim() == "channel").then(|| value.trim().trim_matches('"').to_string())
        })
        .ok_or_else(|| anyhow!("no `channel = \"...\"` in {}", file.display()))
}

fn ensure_bpf_linker() -> anyhow::Result<()> {
    let found = env::var_os("PATH")
        .map(|paths| env::split_paths(&paths).any(|dir| dir.join("bpf-linker").is_file()))
        .unwrap_or(false);
    if found {
        return Ok(());
    }
    Err(anyhow!(
        "bpf-linker was not found on PATH; it is needed to build the eBPF programs. Install it \
         (`cargo xtask setup` does, or by hand: LLVM_PREFIX=/usr/lib/llvm-22 cargo install \
         bpf-linker --no-default-features --features llvm-22) or set {SKIP_ENV}=1 to build an \
         agent without the ebpf backend"
    ))
}

fn path_str(path: &Path) -> anyhow::Result<&str> {
    path.to_str()
        .ok_or_else(|| anyhow!("path {} is not UTF-8", path.display()))
}
