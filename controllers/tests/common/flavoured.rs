//! What the differential test binaries (batch, daemonset, statefulset) share: the two controller
//! managers they compare ([`Flavour`]) and one reference control plane per flavour ([`Cluster`]),
//! started once per test binary and stopped when it exits. Each binary's harness says what its
//! control plane holds (kwok nodes, scheduler, what to prepare before the manager starts).

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use anyhow::bail;
use controlplane::{ControlPlane, Options};

/// Which controller manager runs the controllers under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Flavour {
    /// kube-controller-manager of the reference release.
    Upstream,
    /// This crate's `controller-manager`.
    Kpr,
}

/// One control plane with its controller manager.
pub struct Cluster {
    pub flavour: Flavour,
    cp: Mutex<ControlPlane>,
    pub kubeconfig: PathBuf,
}

impl Cluster {
    /// Starts the control plane of `opts` with kube-controller-manager running `controllers`
    /// (Upstream), runs `prepare` on it, then (Kpr) starts our `controller-manager` with
    /// `--controllers <controllers>` and the environment `env`. Both managers take the same names.
    pub fn start(
        flavour: Flavour,
        controllers: &str,
        opts: Options,
        env: Vec<(String, String)>,
        prepare: impl FnOnce(&mut ControlPlane) -> anyhow::Result<()>,
    ) -> anyhow::Result<Cluster> {
        let opts = Options {
            upstream_controllers: (flavour == Flavour::Upstream).then(|| controllers.to_string()),
            ..opts
        };
        let mut cp = ControlPlane::start(opts)?;
        prepare(&mut cp)?;
        let kubeconfig = cp.admin_kubeconfig().to_path_buf();
        if flavour == Flavour::Kpr {
            let program = PathBuf::from(env!("CARGO_BIN_EXE_controller-manager"));
            let args = vec![
                "--kubeconfig".to_string(),
                kubeconfig.display().to_string(),
                "--controllers".to_string(),
                controllers.to_string(),
            ];
            cp.spawn_in("controller-manager", &program, args, env, None)?;
        }
        Ok(Cluster {
            flavour,
            cp: Mutex::new(cp),
            kubeconfig,
        })
    }

    /// The control plane of `flavour` for this test binary, made by `start` on first use.
    pub fn shared(
        flavour: Flavour,
        start: impl FnOnce(Flavour) -> anyhow::Result<Cluster>,
    ) -> anyhow::Result<Arc<Cluster>> {
        static UPSTREAM: OnceLock<Result<Arc<Cluster>, String>> = OnceLock::new();
        static KPR: OnceLock<Result<Arc<Cluster>, String>> = OnceLock::new();
        let cell = match flavour {
            Flavour::Upstream => &UPSTREAM,
            Flavour::Kpr => &KPR,
        };
        let started = tokio::task::block_in_place(|| {
            cell.get_or_init(|| start(flavour).map(Arc::new).map_err(|e| format!("{e:#}")))
        });
        match started {
            Ok(c) => Ok(c.clone()),
            Err(e) => bail!("starting the {flavour:?} control plane: {e}"),
        }
    }

    pub fn cp(&self) -> MutexGuard<'_, ControlPlane> {
        self.cp.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The controller manager's log file.
    pub fn manager_log_path(&self) -> PathBuf {
        let name = match self.flavour {
            Flavour::Upstream => "kube-controller-manager",
            Flavour::Kpr => "controller-manager",
        };
        self.cp().log(name)
    }

    /// The last lines of the controller manager's log.
    pub fn manager_log(&self) -> String {
        let log = self.manager_log_path();
        format!(
            "last lines of {}:\n{}",
            log.display(),
            controlplane::process::tail(&log, 30)
        )
    }
}

/// Waits until `check` returns `Some` on the scenario's `state` (re-checked on every `changed`,
/// at least every 250 ms), at most `wait`; the error shows the namespace as last seen
/// (`describe`) and the manager's log.
#[allow(clippy::too_many_arguments)]
pub async fn wait_for<S, T>(
    cluster: &Cluster,
    ns: &str,
    state: &Mutex<S>,
    changed: &tokio::sync::watch::Sender<u64>,
    wait: Duration,
    what: &str,
    describe: impl Fn(&S) -> String,
    mut check: impl FnMut(&S) -> Option<T>,
) -> anyhow::Result<T> {
    let start = Instant::now();
    let mut rx = changed.subscribe();
    loop {
        rx.borrow_and_update();
        {
            let s = state.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(t) = check(&s) {
                return Ok(t);
            }
            if start.elapsed() > wait {
                bail!(
                    "[{:?}, namespace {ns}] timed out after {wait:?} waiting for {what}; last seen:\n{}{}",
                    cluster.flavour,
                    describe(&s),
                    cluster.manager_log()
                );
            }
        }
        let _ = tokio::time::timeout(Duration::from_millis(250), rx.changed()).await;
    }
}
