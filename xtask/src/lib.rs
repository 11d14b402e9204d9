//! `cargo xtask`: the project's automation (setup, test, demo, kind), as a library so that tests can
//! check the deploy manifests against the same image name and rendering that `cargo xtask kind` uses.

use std::env;
use std::path::{Path, PathBuf};

pub mod bench;
pub mod cluster;
pub mod deploy;
pub mod exec;
pub mod fuzz;
pub mod images;
pub mod k8s;
pub mod kind;
pub mod setup;
pub mod test;
pub mod vm;

/// The repository root (the directory holding the workspace Cargo.toml).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_owned()
}

/// Which cargo build of kpr's own binaries a command runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Profile {
    /// `--release`, as shipped: what benchmarks measure and images carry by default.
    Release,
    /// The plain `cargo build` the test suites use: `cargo xtask test` runs its benchmark and
    /// cluster smokes on these to skip a second, optimised build (their numbers are not results).
    Debug,
}

impl Profile {
    /// `<target>/release` or `<target>/debug`.
    pub fn dir(self) -> PathBuf {
        target_dir().join(match self {
            Profile::Release => "release",
            Profile::Debug => "debug",
        })
    }
}

/// Cargo's target directory: `$CARGO_TARGET_DIR` (relative to the root) or `<root>/target`.
pub fn target_dir() -> PathBuf {
    let root = workspace_root();
    env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), |dir| root.join(dir))
}
