//! One scenario's namespace on a [`Cluster`], watched into the suite's model ([`Run`]), and what a
//! suite says about itself to get one ([`Suite`]).
//!
//! Owns: the namespaces of its runs (`<tag>-<n>`, left in place: the control plane goes with the
//! test binary), and the check that no process of the control plane panicked while a run was
//! open (the test fails when the run is dropped). Never sleeps to assert: every check waits for a state, bounded by the suite's
//! [`Suite::WAIT`], and fails with what was last seen and the controller manager's log.

use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use anyhow::{bail, Context as _};
use kube::{Api, Client};

use super::cluster::{Cluster, Flavour};
use super::watch::{Model, Recorder, Watched};

/// A suite: the model its watches feed, and the control plane it runs on.
pub trait Suite: Model + Sized {
    /// How long any one awaited state may take.
    const WAIT: Duration;
    /// Starts this suite's control plane for `flavour` (once per test binary and flavour, see
    /// [`Run::new`]).
    fn cluster(flavour: Flavour) -> anyhow::Result<Cluster>;
    /// A fresh model of namespace `ns` with the watches that feed it.
    fn watches(client: &Client, ns: &str) -> Recorder<Self>;
    /// The model in a few lines: what a failed wait shows.
    fn describe(&self) -> String;
}

/// One scenario's namespace with its watches.
pub struct Run<S> {
    pub cluster: Arc<Cluster>,
    /// What the run was made with: the namespace's prefix, and a scenario's name for what it
    /// creates outside the namespace (Nodes).
    pub tag: String,
    pub ns: String,
    pub client: Client,
    watched: Watched<S>,
    /// Fails the test when it ends if a process of the control plane (our controller manager,
    /// restarts included) printed a Rust panic while the run was open: a panic the workers
    /// caught and retried past is still a failure.
    _panics: controlplane::PanicGuard,
}

impl<S: Suite> Run<S> {
    /// A fresh namespace `<tag>-<n>` on this test binary's control plane of `flavour` (started on
    /// first use), watched.
    pub async fn new(flavour: Flavour, tag: &str) -> anyhow::Result<Run<S>> {
        Run::on(Self::shared(flavour)?, tag).await
    }

    /// This test binary's control plane of `flavour` for this suite, started on first use.
    pub fn shared(flavour: Flavour) -> anyhow::Result<Arc<Cluster>> {
        Cluster::shared(flavour, S::cluster)
    }

    /// A fresh namespace `<tag>-<n>` on `cluster`, watched.
    pub async fn on(cluster: Arc<Cluster>, tag: &str) -> anyhow::Result<Run<S>> {
        let (ns, panics) = tokio::task::block_in_place(|| {
            let cp = cluster.cp();
            let ns = cp.test_namespace(tag)?;
            let panics = cp.panic_guard(&format!("the run in namespace {ns}"));
            anyhow::Ok((ns, panics))
        })?;
        let client = controlplane::client_from(&cluster.kubeconfig).await?;
        let watched = S::watches(&client, &ns).start(S::WAIT).await?;
        Ok(Run {
            cluster,
            tag: tag.to_string(),
            ns,
            client,
            watched,
            _panics: panics,
        })
    }

    /// The model as the watches have shown it so far.
    pub fn lock(&self) -> MutexGuard<'_, S> {
        self.watched.lock()
    }

    /// A copy of the model.
    pub fn state(&self) -> S
    where
        S: Clone,
    {
        self.lock().clone()
    }

    /// Waits until `check` returns `Some` on the model, at most [`Suite::WAIT`]; fails early if
    /// a process of the control plane (the controller manager included) exited.
    pub async fn wait_for<T>(
        &self,
        what: &str,
        check: impl FnMut(&S) -> Option<T>,
    ) -> anyhow::Result<T> {
        self.wait_for_with(what, S::describe, check).await
    }

    /// [`Run::wait_for`] showing `describe` of the model when it times out.
    pub async fn wait_for_with<T>(
        &self,
        what: &str,
        describe: impl Fn(&S) -> String,
        check: impl FnMut(&S) -> Option<T>,
    ) -> anyhow::Result<T> {
        self.watched
            .wait_for(
                what,
                S::WAIT,
                || self.cluster.check_alive(),
                |s| format!("{}{}", describe(s), self.cluster.manager_log()),
                check,
            )
            .await
            .with_context(|| format!("[{:?}, namespace {}]", self.cluster.flavour, self.ns))
    }

    /// The `K`s of this run's namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
    {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Creates `obj` (JSON of a `K`) in this run's namespace.
    pub async fn create<K>(&self, obj: serde_json::Value) -> anyhow::Result<K>
    where
        K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + std::fmt::Debug
            + serde::de::DeserializeOwned
            + serde::Serialize,
    {
        let obj: K = serde_json::from_value(obj)?;
        self.api::<K>()
            .create(&Default::default(), &obj)
            .await
            .with_context(|| format!("creating {} in {}", K::kind(&()), self.ns))
    }

    /// kubectl in this run's namespace.
    pub async fn kubectl(&self, args: &[&str]) -> anyhow::Result<String> {
        self.kubectl_with(args, None).await
    }

    /// kubectl in this run's namespace, `stdin` piped in; bounded by [`Suite::WAIT`].
    pub async fn kubectl_with(
        &self,
        args: &[&str],
        stdin: Option<String>,
    ) -> anyhow::Result<String> {
        let mut cmd = self.cluster.kubectl_cmd();
        cmd.arg("-n").arg(&self.ns).args(args);
        run_command(cmd, stdin, S::WAIT).await
    }
}

/// Runs `cmd` with `stdin`, bounded by `wait`; stdout, or an error with stderr.
pub async fn run_command(
    mut cmd: tokio::process::Command,
    stdin: Option<String>,
    wait: Duration,
) -> anyhow::Result<String> {
    use std::process::Stdio;
    use tokio::io::AsyncWriteExt as _;
    let shown = format!("{:?}", cmd.as_std());
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().with_context(|| format!("running {shown}"))?;
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().context("the command's stdin")?;
        pipe.write_all(input.as_bytes()).await?;
    }
    let out = tokio::time::timeout(wait, child.wait_with_output())
        .await
        .with_context(|| format!("{shown} did not finish in {wait:?}"))??;
    if !out.status.success() {
        bail!(
            "{shown} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
