//! Fuzzing the agent's manifest parser: the cargo-fuzz crate `proxy/fuzz` (target `manifests`,
//! over `proxy::source::file::parse_manifests`), built with the pinned nightly.
//!
//! [`smoke`] is the short run a test pass can afford: the committed seeds
//! (`proxy/fuzz/corpus/manifests`) plus a scratch corpus under the target directory that grows from
//! run to run, for a fixed time. A crash, a failed invariant, an input slower than
//! [`INPUT_TIMEOUT_S`] or one using more than [`RSS_LIMIT_MB`] fails it; libFuzzer leaves the input in
//! `proxy/fuzz/artifacts/manifests/`.

use std::fs;

use anyhow::Context as _;

use crate::exec::Cmd;
use crate::setup::{cargo_home, find_on_path, pinned_nightly, rustup_home};

/// The fuzz target (`proxy/fuzz/fuzz_targets/manifests.rs`).
pub const TARGET: &str = "manifests";
/// The longest one input may take, in seconds: parsing is linear and bounded, so anything near
/// this is a bug (the inputs are at most [`MAX_LEN`] bytes).
pub const INPUT_TIMEOUT_S: u64 = 5;
/// The largest input libFuzzer makes, in bytes.
pub const MAX_LEN: usize = 32 * 1024;
/// The most memory the fuzzing process may use.
pub const RSS_LIMIT_MB: u64 = 2048;

/// Installs cargo-fuzz unless it is already there (PATH or `$CARGO_HOME/bin`).
pub fn ensure_cargo_fuzz() -> anyhow::Result<()> {
    if let Some(found) = find_on_path("cargo-fuzz")
        .or_else(|| Some(cargo_home().join("bin/cargo-fuzz")).filter(|p| p.is_file()))
    {
        println!("[ok] cargo-fuzz already installed ({})", found.display());
        return Ok(());
    }
    println!("[install] cargo-fuzz (about 60 s)");
    Cmd::new("cargo")
        .args(["install", "cargo-fuzz", "--locked"])
        .run()
}

/// Runs the `manifests` fuzz target for `seconds`. Fails when libFuzzer finds a crash.
pub fn smoke(seconds: u64) -> anyhow::Result<()> {
    ensure_cargo_fuzz()?;
    let root = crate::workspace_root();
    let fuzz_dir = root.join("proxy/fuzz");
    let seeds = fuzz_dir.join("corpus").join(TARGET);
    let corpus = crate::target_dir().join("fuzz-corpus").join(TARGET);
    fs::create_dir_all(&corpus).with_context(|| format!("creating {}", corpus.display()))?;
    let toolchain = nightly()?;
    Cmd::new("cargo")
        .arg(format!("+{toolchain}"))
        .args(["fuzz", "run", "--fuzz-dir"])
        .arg(&fuzz_dir)
        // Its own target directory: the sanitizer flags would rebuild the workspace's every time.
        .arg("--target-dir")
        .arg(crate::target_dir().join("fuzz"))
        // Coverage-guided only: the parser is safe Rust, where AddressSanitizer finds nothing
        // that a panic would not, and its instrumentation doubles the build and the run.
        .args(["--sanitizer", "none"])
        .arg(TARGET)
        // New inputs go to the first directory, never to the committed seeds.
        .arg(&corpus)
        .arg(&seeds)
        .arg("--")
        .arg(format!("-max_total_time={seconds}"))
        .arg(format!("-timeout={INPUT_TIMEOUT_S}"))
        .arg(format!("-max_len={MAX_LEN}"))
        .arg(format!("-rss_limit_mb={RSS_LIMIT_MB}"))
        .arg(format!("-dict={}", fuzz_dir.join("yaml.dict").display()))
        .arg("-print_final_stats=1")
        // The eBPF object is not needed to parse manifests.
        .env("KPR_SKIP_EBPF", "1")
        .dir(root.join("proxy"))
        .run()
        .with_context(|| {
            format!(
                "fuzzing {TARGET} found a failure: the input is in {}; rerun it with \
                 `cd proxy && KPR_SKIP_EBPF=1 cargo +{toolchain} fuzz run {TARGET} <file>`",
                fuzz_dir.join("artifacts").join(TARGET).display()
            )
        })
}

/// The toolchain cargo-fuzz builds with (its sanitizers need a nightly): the project's pinned one
/// (`proxy-ebpf/rust-toolchain.toml`, installed by `cargo xtask setup`), or the plain `nightly`
/// when that dated one is not installed.
fn nightly() -> anyhow::Result<String> {
    let pinned = pinned_nightly()?;
    let toolchains = rustup_home()?.join("toolchains");
    let installed = fs::read_dir(&toolchains)
        .with_context(|| format!("reading {}", toolchains.display()))?
        .filter_map(Result::ok)
        .any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("{pinned}-"))
        });
    Ok(if installed { pinned } else { "nightly".into() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fuzz_crate_has_its_target_and_seeds() {
        let fuzz_dir = crate::workspace_root().join("proxy/fuzz");
        let manifest = fs::read_to_string(fuzz_dir.join("Cargo.toml")).unwrap();
        assert!(
            manifest.contains(&format!("name = \"{TARGET}\"")),
            "{manifest}"
        );
        assert!(fuzz_dir.join("yaml.dict").is_file());
        let seeds = fs::read_dir(fuzz_dir.join("corpus").join(TARGET))
            .unwrap()
            .count();
        assert!(seeds >= 3, "{seeds} seeds");
        // Outside the root workspace, like proxy-ebpf: only cargo-fuzz builds it.
        assert!(manifest.lines().any(|l| l == "[workspace]"), "{manifest}");
    }
}
