//! `cargo xtask`: the project's automation (setup, test, demo, kind), as a library so that tests can
//! check the deploy manifests against the same image name and rendering that `cargo xtask kind` uses.

use std::env;
use std::path::{Path, PathBuf};

pub mod bench;
pub mod busybox_build;
pub mod cluster;
pub mod deploy;
pub mod docker;
pub mod e2e_images;
pub mod exec;
pub mod fuzz;
pub mod helm;
pub mod image_build;
pub mod images;
pub mod k8s;
pub mod kind;
pub mod kind_image;
pub mod kind_tools;
pub mod load;
pub mod local_path;
pub mod metrics_server;
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
        target_dir().join(self.name())
    }

    /// `release` or `debug`, as the flag and the target directory spell it.
    pub fn name(self) -> &'static str {
        match self {
            Profile::Release => "release",
            Profile::Debug => "debug",
        }
    }
}

/// Cargo's target directory: `$CARGO_TARGET_DIR` (relative to the root) or `<root>/target`.
pub fn target_dir() -> PathBuf {
    let root = workspace_root();
    env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), |dir| root.join(dir))
}

/// Free space, in bytes, on the filesystem holding `path` (for an unprivileged user: `df`'s
/// "Avail"), or None when it cannot be asked. CI disks fill up; every report that could be
/// explained by a full disk prints this.
pub fn free_bytes(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: c_path is a valid NUL-terminated string and stat points to writable memory of the
    // right type; statvfs fills it completely when it returns 0.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), stat.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it initialised the struct.
    let stat = unsafe { stat.assume_init() };
    Some(stat.f_bavail.saturating_mul(stat.f_frsize))
}

/// Bytes as GiB, for messages.
pub fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// `free_bytes` of the target directory (or its nearest existing parent) as "12.3 GiB free".
pub fn free_disk_summary() -> String {
    let mut dir = target_dir();
    while !dir.exists() {
        if !dir.pop() {
            break;
        }
    }
    match free_bytes(&dir) {
        Some(b) => format!("{:.1} GiB free", gib(b)),
        None => "free space unknown".into(),
    }
}
