//! The controller managers a suite compares ([`Flavour`]) and one reference control plane with
//! one of them ([`Cluster`]): etcd, kube-apiserver and what the suite's [`controlplane::Options`]
//! ask for (kube-scheduler, kwok nodes), plus either kube-controller-manager or this crate's
//! `controller-manager`, both with the same `--controllers`.
//!
//! Owns: the control planes it starts (stopped when the test binary exits) and the controller
//! manager's process in them (killed and restarted by the restart scenarios).

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use anyhow::{bail, Context as _};
use controlplane::{ControlPlane, Options};

/// Which controller manager runs the controllers under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Flavour {
    /// kube-controller-manager of the reference release.
    Upstream,
    /// This crate's `controller-manager`.
    Kpr,
}

impl Flavour {
    pub fn tag(self) -> &'static str {
        match self {
            Flavour::Upstream => "upstream",
            Flavour::Kpr => "kpr",
        }
    }
}

/// One control plane with its controller manager.
pub struct Cluster {
    pub flavour: Flavour,
    cp: Mutex<ControlPlane>,
    pub kubeconfig: PathBuf,
    kubectl: PathBuf,
    /// The `--controllers` both managers run with (kube-controller-manager's names; ours takes
    /// the same).
    controllers: String,
    /// Our manager's environment (RUST_LOG, say).
    env: Vec<(String, String)>,
    /// Flags both managers get besides `--controllers` (kube-controller-manager's names, e.g.
    /// `--horizontal-pod-autoscaler-sync-period=1s`; ours takes the same).
    flags: Vec<String>,
    /// The process name the controller manager runs under now (a restart gets a new one, so the
    /// first log stays).
    manager: Mutex<String>,
    restarts: Mutex<usize>,
}

impl Cluster {
    /// Starts the control plane of `opts` with kube-controller-manager running `controllers`
    /// (Upstream), runs `prepare` on it, then (Kpr) starts our `controller-manager` with
    /// `--controllers <controllers>` and the environment `env`.
    pub fn start(
        flavour: Flavour,
        controllers: &str,
        opts: Options,
        env: Vec<(String, String)>,
        prepare: impl FnOnce(&mut ControlPlane) -> anyhow::Result<()>,
    ) -> anyhow::Result<Cluster> {
        Self::start_inner(flavour, controllers, opts, env, Vec::new(), prepare)
    }

    /// As [`Cluster::start`], both managers also getting `flags`; kube-controller-manager then
    /// starts after `prepare`, as ours does.
    pub fn start_with_flags(
        flavour: Flavour,
        controllers: &str,
        opts: Options,
        flags: Vec<String>,
        prepare: impl FnOnce(&mut ControlPlane) -> anyhow::Result<()>,
    ) -> anyhow::Result<Cluster> {
        Self::start_inner(flavour, controllers, opts, Vec::new(), flags, prepare)
    }

    fn start_inner(
        flavour: Flavour,
        controllers: &str,
        opts: Options,
        env: Vec<(String, String)>,
        flags: Vec<String>,
        prepare: impl FnOnce(&mut ControlPlane) -> anyhow::Result<()>,
    ) -> anyhow::Result<Cluster> {
        let upstream_now = flavour == Flavour::Upstream && flags.is_empty();
        let opts = Options {
            upstream_controllers: upstream_now.then(|| controllers.to_string()),
            ..opts
        };
        let mut cp = ControlPlane::start(opts)?;
        prepare(&mut cp)?;
        if flavour == Flavour::Upstream && !upstream_now {
            let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
            cp.start_upstream_controller_manager_with(controllers, &flags)?;
        }
        let cluster = Cluster {
            flavour,
            kubeconfig: cp.admin_kubeconfig().to_path_buf(),
            kubectl: cp.binaries.path("kubectl"),
            cp: Mutex::new(cp),
            controllers: controllers.to_string(),
            env,
            flags,
            manager: Mutex::new("kube-controller-manager".into()),
            restarts: Mutex::new(0),
        };
        if flavour == Flavour::Kpr {
            cluster.start_ours("controller-manager")?;
        }
        Ok(cluster)
    }

    /// [`Cluster::start`] on a minimal control plane (no scheduler, no nodes) under the run
    /// directory `<suite>-<flavour>`, from a test on the runtime's thread; panics when it cannot
    /// start.
    pub fn start_minimal(flavour: Flavour, suite: &str, controllers: &str) -> Cluster {
        let opts = Options::minimal(controlplane::run_dir(&format!("{suite}-{}", flavour.tag())));
        tokio::task::block_in_place(|| {
            Cluster::start(flavour, controllers, opts, Vec::new(), |_| Ok(()))
        })
        .expect("starting the control plane")
    }

    /// Polls `check` every `poll` until it gives a value; after `wait`, fails naming `what`, the
    /// flavour and the controller manager's log.
    pub async fn eventually<T, F, Fut>(
        &self,
        what: &str,
        wait: Duration,
        poll: Duration,
        check: F,
    ) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let failure = |m| format!("{:?}: {m}\n{}", self.flavour, self.manager_log());
        super::wait::eventually(what, wait, poll, failure, check).await
    }

    /// [`Cluster::eventually`] for a check that says what it saw: a timeout shows the last.
    pub async fn eventually_showing<T, F, Fut>(
        &self,
        what: &str,
        wait: Duration,
        poll: Duration,
        mut check: F,
    ) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, String>>,
    {
        let last = Mutex::new(String::new());
        let failure = |m| {
            let last = last.lock().map(|l| l.clone()).unwrap_or_default();
            format!(
                "{:?}: {m}; last: {last}\n{}",
                self.flavour,
                self.manager_log()
            )
        };
        let last = &last;
        let check = move || {
            let f = check();
            async move {
                match f.await {
                    Ok(v) => Some(v),
                    Err(e) => {
                        if let Ok(mut l) = last.lock() {
                            *l = e;
                        }
                        None
                    }
                }
            }
        };
        super::wait::eventually(what, wait, poll, failure, check).await
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

    fn start_ours(&self, name: &str) -> anyhow::Result<()> {
        let program = PathBuf::from(env!("CARGO_BIN_EXE_controller-manager"));
        let args = vec![
            "--kubeconfig".to_string(),
            self.kubeconfig.display().to_string(),
            "--controllers".to_string(),
            self.controllers.clone(),
            // As kube-controller-manager gets it (root-ca-cert-publisher needs it).
            format!("--root-ca-file={}", self.cp().pki.ca_cert.display()),
            // As kube-controller-manager gets them (csrsigning signs with the cluster's CA).
            format!(
                "--cluster-signing-cert-file={}",
                self.cp().pki.ca_cert.display()
            ),
            format!(
                "--cluster-signing-key-file={}",
                self.cp().pki.ca_key.display()
            ),
            // As kube-controller-manager gets it (serviceaccount-token signs with the key whose
            // public half is kube-apiserver's --service-account-key-file).
            format!(
                "--service-account-private-key-file={}",
                self.cp().pki.sa_key.display()
            ),
        ];
        let args = args.into_iter().chain(self.flags.iter().cloned()).collect();
        self.cp()
            .spawn_in(name, &program, args, self.env.clone(), None)?;
        *self.manager.lock().unwrap() = name.to_string();
        Ok(())
    }

    /// Err naming the first process of the control plane (controller manager included) that
    /// exited, with its log's last lines.
    pub fn check_alive(&self) -> anyhow::Result<()> {
        self.cp().check_alive()
    }

    /// The controller manager's log file (of its latest start).
    pub fn manager_log_path(&self) -> PathBuf {
        let name = self.manager.lock().unwrap().clone();
        self.cp().log(&name)
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

    /// SIGKILLs the controller manager (no shutdown of any kind) and reaps it.
    pub fn kill_manager(&self) -> anyhow::Result<()> {
        let name = self.manager.lock().unwrap().clone();
        let mut cp = self.cp();
        let pid = cp
            .pids()
            .into_iter()
            .find(|(n, _)| *n == name)
            .map(|(_, pid)| pid)
            .with_context(|| format!("{name} is not running"))?;
        let status = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()?;
        if !status.success() {
            bail!("kill -KILL {pid} ({name}) failed: {status}");
        }
        // Reaps the killed process and forgets it (its SIGTERM finds nobody).
        cp.stop(&name);
        Ok(())
    }

    /// Starts the controller manager again after [`Cluster::kill_manager`].
    pub fn restart_manager(&self) -> anyhow::Result<()> {
        let n = {
            let mut r = self.restarts.lock().unwrap();
            *r += 1;
            *r
        };
        match self.flavour {
            Flavour::Upstream => {
                let flags: Vec<&str> = self.flags.iter().map(String::as_str).collect();
                self.cp()
                    .start_upstream_controller_manager_with(&self.controllers, &flags)
            }
            Flavour::Kpr => self.start_ours(&format!("controller-manager-restart-{n}")),
        }
    }

    /// kubectl of the reference release with the admin credentials.
    pub fn kubectl_cmd(&self) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(&self.kubectl);
        cmd.arg("--kubeconfig").arg(&self.kubeconfig);
        cmd.kill_on_drop(true);
        cmd
    }
}

/// Lifts the `node.kubernetes.io/not-ready:NoSchedule` taint the API server puts on every new
/// Node (admission's TaintNodesByCondition): kube-controller-manager's nodelifecycle controller
/// lifts it once the Node reports Ready, and neither flavour runs that controller, so the test
/// does it, the same for both.
pub fn lift_not_ready_taint(cp: &mut ControlPlane) -> anyhow::Result<()> {
    cp.kubectl_run(
        &[
            "taint",
            "nodes",
            "--all",
            "node.kubernetes.io/not-ready:NoSchedule-",
        ],
        None,
    )?;
    Ok(())
}

/// A client of `cluster` and the namespace `ns` made in it, with the `default` ServiceAccount the
/// API server's admission wants for Pods (a minimal cluster runs no serviceaccount controller).
pub async fn client_with_namespace(cluster: &Cluster, ns: &str) -> kube::Client {
    let client = controlplane::client_from(&cluster.kubeconfig)
        .await
        .unwrap();
    let nss: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client.clone());
    nss.create(
        &kube::api::PostParams::default(),
        &serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).unwrap(),
    )
    .await
    .unwrap_or_else(|e| panic!("creating namespace {ns}: {e}"));
    create_in::<k8s_openapi::api::core::v1::ServiceAccount>(
        &client,
        ns,
        serde_json::json!({"metadata": {"name": "default"}}),
    )
    .await;
    client
}

/// Creates the object `v` (its JSON) in the namespace `ns`; a failure panics naming its kind.
pub async fn create_in<K>(client: &kube::Client, ns: &str, v: serde_json::Value) -> K
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
{
    let obj: K = serde_json::from_value(v).unwrap();
    kube::Api::<K>::namespaced(client.clone(), ns)
        .create(&kube::api::PostParams::default(), &obj)
        .await
        .unwrap_or_else(|e| panic!("creating {}: {e}", K::kind(&())))
}
