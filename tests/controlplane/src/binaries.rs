//! Where the reference binaries are: `<target>/k8s/bin`, built by `cargo xtask setup --k8s` from
//! the versions pinned in `xtask/k8s/go.mod` (or `$KPR_K8S_BIN`).
//!
//! Owns: finding them; building them is xtask's job.

use std::path::{Path, PathBuf};

use anyhow::bail;

/// The pinning module `cargo xtask setup --k8s` builds from.
const GO_MOD: &str = include_str!("../../../xtask/k8s/go.mod");

/// The Kubernetes release every reference component is built from, as xtask/k8s/go.mod pins it
/// (e.g. `v1.34.4`).
pub fn kubernetes_version() -> &'static str {
    GO_MOD
        .lines()
        .find_map(|line| {
            let mut words = line.split_whitespace();
            (words.next() == Some("k8s.io/kubernetes")).then(|| words.next())?
        })
        .expect("xtask/k8s/go.mod requires k8s.io/kubernetes")
}

/// The binaries every control plane needs.
const REQUIRED: &[&str] = &["etcd", "etcdctl", "kube-apiserver", "kubectl"];

/// The directory holding the reference binaries.
#[derive(Debug, Clone)]
pub struct Binaries {
    dir: PathBuf,
}

impl Binaries {
    /// Finds the directory and checks the required binaries are in it.
    pub fn locate() -> anyhow::Result<Binaries> {
        let dir = match std::env::var_os("KPR_K8S_BIN") {
            Some(dir) => PathBuf::from(dir),
            None => default_dir(),
        };
        let missing: Vec<&str> = REQUIRED
            .iter()
            .copied()
            .filter(|b| !dir.join(b).is_file())
            .collect();
        if !missing.is_empty() {
            bail!(
                "the reference Kubernetes binaries {missing:?} are not in {}: build them with \
                 `cargo xtask setup --k8s` (Kubernetes {}, etcd, kwok)",
                dir.display(),
                kubernetes_version()
            );
        }
        Ok(Binaries { dir })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

/// `<target>/k8s/bin`: `$CARGO_TARGET_DIR` (at run time, then at build time), else the
/// workspace's `target/`.
pub fn default_dir() -> PathBuf {
    target_dir().join("k8s/bin")
}

/// The cargo target directory this crate was built into.
pub fn target_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = option_env!("CARGO_TARGET_DIR") {
        return PathBuf::from(dir);
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target")
}
