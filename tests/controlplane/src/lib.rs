//! TEST INFRASTRUCTURE ONLY: the reference Kubernetes control plane (etcd, kube-apiserver and,
//! when asked, kube-controller-manager, kube-scheduler and kwok of one pinned release) started on
//! loopback with TLS and RBAC, for the integration suites, the benchmarks and
//! `cargo xtask cluster`. The binaries are built by `cargo xtask setup --k8s`.
//!
//! ```no_run
//! # async fn f() -> anyhow::Result<()> {
//! let cp = controlplane::shared()?;              // one per test binary
//! let ns = cp.test_namespace("kube-source")?;    // each test gets its own namespace
//! let client = cp.client().await?;               // admin credentials
//! # Ok(()) }
//! ```
//!
//! Modules: [`binaries`] (where the binaries are, the pinned version), [`pki`] (certificates),
//! [`process`] (one process and its log), [`panics`] (a Rust panic in a log fails the test),
//! [`cluster`] (a control plane), [`relay`] (a TCP relay a
//! test can cut: a partition between a node and the API server), [`network`] (network
//! namespaces for a cluster with real nodes) and [`nodes`] (their containerd and kubelet).

pub mod binaries;
pub mod cluster;
pub mod metrics_server;
pub mod network;
pub mod nodes;
pub mod panics;
pub mod pki;
pub mod process;
pub mod relay;

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

pub use binaries::{kubernetes_version, Binaries};
pub use cluster::{client_from, ControlPlane, Network, Options, CLUSTER_CIDR, SERVICE_CIDR};
pub use panics::PanicGuard;
pub use process::Lifetime;
pub use relay::Relay;

/// The control plane shared by every test of this test binary: started on first use, stopped
/// when the binary exits (its processes carry the parent-death signal).
pub fn shared() -> anyhow::Result<&'static ControlPlane> {
    static SHARED: OnceLock<Result<ControlPlane, String>> = OnceLock::new();
    let started = SHARED.get_or_init(|| {
        ControlPlane::start(Options::minimal(run_dir("shared"))).map_err(|e| format!("{e:#}"))
    });
    match started {
        Ok(cp) => Ok(cp),
        Err(e) => anyhow::bail!("starting the shared reference control plane: {e}"),
    }
}

/// A directory for one control plane of this process: `<target>/controlplane/<exe>-<tag>.pid<pid>`.
/// Directories of processes that no longer run are removed on the way.
pub fn run_dir(tag: &str) -> PathBuf {
    let base = binaries::target_dir().join("controlplane");
    remove_stale(&base);
    let exe = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "process".into());
    base.join(format!("{exe}-{tag}.pid{}", std::process::id()))
}

/// The process a run directory belongs to: the number after its last `.pid`. Only that: the
/// executable's name and the tag may hold numbers too (`kpr-bench-bench-proxies-20000`), and
/// taking one of those for the owner would delete a live control plane's etcd data.
fn owner_pid(dir_name: &str) -> Option<u32> {
    dir_name.rsplit_once(".pid")?.1.parse().ok()
}

fn remove_stale(base: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if owner_pid(&name).is_some_and(|pid| !process::alive(pid)) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

impl ControlPlane {
    /// A fresh namespace `<tag>-<n>` (with its `default` ServiceAccount) for one test.
    pub fn test_namespace(&self, tag: &str) -> anyhow::Result<String> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name = format!("{tag}-{}", NEXT.fetch_add(1, Ordering::SeqCst));
        self.create_namespace(&name)?;
        Ok(name)
    }
}

#[cfg(test)]
mod run_dir_tests {
    use super::owner_pid;

    #[test]
    fn only_the_pid_marker_names_the_owner() {
        assert_eq!(
            owner_pid("kpr-bench-bench-proxies-20000.pid5187"),
            Some(5187)
        );
        assert_eq!(
            owner_pid("topology-400a609307f1a547-shared.pid14105"),
            Some(14105)
        );
        assert_eq!(owner_pid("kpr-bench-5187-bench-proxies-20000"), None);
        assert_eq!(owner_pid("x.pid12ab"), None);
    }
}
