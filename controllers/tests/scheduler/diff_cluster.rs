//! The differential test's control plane: etcd and kube-apiserver (no kwok, no controller
//! manager: nodes and fixture Pods are plain API objects, which is all a scheduler reads) and four
//! schedulers, each serving one schedulerName of its own:
//!
//! - `upstream-probe` (kube-scheduler) and `kpr-probe` (ours) as user `kpr-probe-scheduler`,
//!   whose ClusterRole is `system:kube-scheduler`'s without `pods/binding`: a Pod either
//!   scheduler finds a node for fails its binding (PodScheduled=False, SchedulerError,
//!   "forbidden") and never changes the cluster, so every probe sees the same state;
//! - `upstream-place` and `kpr-place` as `system:kube-scheduler`, binding as usual.
//!
//! Owns: its control plane (stopped when dropped), the RBAC objects and scheduler configuration
//! files it writes. Never sleeps to assert: readiness is a canary Pod's PodScheduled condition.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use controlplane::{ControlPlane, Options};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{json, Value};

/// The user the probe schedulers act as (no `pods/binding`).
const PROBE_USER: &str = "kpr-probe-scheduler";

/// Which implementation a scheduler is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Impl {
    Upstream,
    Kpr,
}

impl Impl {
    pub const BOTH: [Impl; 2] = [Impl::Upstream, Impl::Kpr];

    pub fn tag(self) -> &'static str {
        match self {
            Impl::Upstream => "upstream",
            Impl::Kpr => "kpr",
        }
    }

    /// The schedulerName of its probe profile (binding refused).
    pub fn probe_name(self) -> String {
        format!("{}-probe", self.tag())
    }

    /// The schedulerName of its placement profile (binding allowed).
    pub fn place_name(self) -> String {
        format!("{}-place", self.tag())
    }
}

/// The control plane and an admin client.
pub struct DiffCluster {
    pub cp: ControlPlane,
    pub client: Client,
}

impl DiffCluster {
    /// etcd and kube-apiserver, and the probe user's RBAC; the schedulers start later
    /// ([`DiffCluster::start_schedulers`]), once the nodes and fixture Pods exist.
    pub async fn start(tag: &str) -> anyhow::Result<DiffCluster> {
        let cp = tokio::task::block_in_place(|| {
            ControlPlane::start(Options::minimal(controlplane::run_dir(tag)))
        })?;
        let client = cp.client().await?;
        probe_rbac(&client).await?;
        Ok(DiffCluster { cp, client })
    }

    /// Starts the four schedulers and waits until each has answered a canary Pod.
    pub async fn start_schedulers(&mut self) -> anyhow::Result<()> {
        let probe_kc = self.cp.kubeconfig_for_user(PROBE_USER, None)?;
        let place_kc = self.cp.kubeconfig_for_user("system:kube-scheduler", None)?;
        let kpr = Path::new(env!("CARGO_BIN_EXE_scheduler"));
        let upstream = self.cp.binaries.path("kube-scheduler");
        for imp in Impl::BOTH {
            for (name, kc) in [(imp.probe_name(), &probe_kc), (imp.place_name(), &place_kc)] {
                let config = json!({
                    "apiVersion": "kubescheduler.config.k8s.io/v1",
                    "kind": "KubeSchedulerConfiguration",
                    // No client-side rate limit (ours has none): the probes' refused bindings
                    // and their retries would otherwise queue behind kube-scheduler's default
                    // 50 requests/s.
                    "clientConnection": {"kubeconfig": kc, "qps": -1},
                    "leaderElection": {"leaderElect": false},
                    "profiles": [{"schedulerName": name}],
                });
                let file = self.cp.dir.join(format!("{name}.config.json"));
                std::fs::write(&file, serde_json::to_vec_pretty(&config)?)
                    .with_context(|| format!("writing {}", file.display()))?;
                // KPR_SCHED_DIFF_VERBOSE=1: the placement schedulers log every weighted plugin
                // score and decision (kube-scheduler -v=10, ours --v=10), to replay placements
                // decision by decision (docs/SCHEDULER.md, "Placement quality"). kube-scheduler's
                // log is then ~35 MB and slow: diagnosis only.
                let verbose = name.ends_with("-place")
                    && std::env::var_os("KPR_SCHED_DIFF_VERBOSE").is_some();
                match imp {
                    Impl::Upstream => self.cp.spawn_program(
                        &name,
                        &upstream,
                        [
                            format!("--config={}", file.display()),
                            "--secure-port=0".into(),
                        ]
                        .into_iter()
                        .chain(verbose.then(|| "-v=10".to_string()))
                        .collect(),
                    )?,
                    Impl::Kpr => self.cp.spawn_program(
                        &name,
                        kpr,
                        [
                            format!("--kubeconfig={}", kc.display()),
                            format!("--config={}", file.display()),
                        ]
                        .into_iter()
                        .chain(verbose.then(|| "--v=10".to_string()))
                        .collect(),
                    )?,
                }
            }
        }
        self.await_schedulers().await
    }

    /// One unschedulable canary Pod per schedulerName; each must get its PodScheduled=False
    /// condition (the scheduler is up and its caches synced: both schedule only after that).
    async fn await_schedulers(&self) -> anyhow::Result<()> {
        let ns = "diff-canary";
        namespace(&self.client, ns).await?;
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let names: Vec<String> = Impl::BOTH
            .iter()
            .flat_map(|i| [i.probe_name(), i.place_name()])
            .collect();
        for n in &names {
            let pod = json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": n},
                "spec": {"schedulerName": n, "nodeSelector": {"kpr.test/nowhere": "x"},
                    "containers": [{"name": "c", "image": "busybox"}]}});
            pods.create(&PostParams::default(), &serde_json::from_value(pod)?)
                .await
                .with_context(|| format!("creating canary {n}"))?;
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let list = pods.list(&ListParams::default()).await?;
            let waiting: Vec<String> = list
                .items
                .iter()
                .filter(|p| scheduled_condition(p).is_none())
                .filter_map(|p| p.metadata.name.clone())
                .collect();
            if waiting.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "schedulers {waiting:?} never answered their canary Pod (logs in {})",
                    self.cp.dir.join("logs").display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        pods.delete_collection(
            &DeleteParams::default().grace_period(0),
            &Default::default(),
        )
        .await?;
        Ok(())
    }
}

/// `system:kube-scheduler`'s rules without the binding subresource, for [`PROBE_USER`], plus
/// `system:volume-scheduler` as kube-scheduler's own user has.
async fn probe_rbac(client: &Client) -> anyhow::Result<()> {
    let roles: Api<ClusterRole> = Api::all(client.clone());
    let upstream = roles
        .get("system:kube-scheduler")
        .await
        .context("reading ClusterRole system:kube-scheduler")?;
    let rules: Vec<Value> = upstream
        .rules
        .unwrap_or_default()
        .into_iter()
        .filter_map(|mut r| {
            let resources = r.resources.take().map(|rs| {
                rs.into_iter()
                    .filter(|x| x != "bindings" && x != "pods/binding")
                    .collect::<Vec<_>>()
            });
            if resources.as_ref().is_some_and(|rs| rs.is_empty()) {
                return None;
            }
            r.resources = resources;
            serde_json::to_value(r).ok()
        })
        .collect();
    roles
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": PROBE_USER}, "rules": rules}))?,
        )
        .await
        .context("creating the probe schedulers' ClusterRole")?;
    let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    for role in [PROBE_USER, "system:volume-scheduler"] {
        let b = json!({
            "metadata": {"name": format!("{PROBE_USER}-{}", role.replace(':', "-"))},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": PROBE_USER}],
        });
        bindings
            .create(&PostParams::default(), &serde_json::from_value(b)?)
            .await
            .with_context(|| format!("binding {role} to {PROBE_USER}"))?;
    }
    Ok(())
}

/// Creates namespace `ns` and its `default` ServiceAccount (no controller manager makes it, and
/// Pod admission wants it).
pub async fn namespace(client: &Client, ns: &str) -> anyhow::Result<()> {
    let nss: Api<Namespace> = Api::all(client.clone());
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": ns}}))?,
    )
    .await
    .with_context(|| format!("creating namespace {ns}"))?;
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    sas.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "default"}}))?,
    )
    .await
    .with_context(|| format!("{ns}: creating the default ServiceAccount"))?;
    Ok(())
}

/// A Node as the test describes it: name, labels, taints (in this order), allocatable (=
/// capacity) and whether it is cordoned.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Value>,
    pub allocatable: BTreeMap<String, String>,
    pub unschedulable: bool,
}

/// Creates the nodes. The API server taints a new Node not-ready (admission's
/// TaintNodesByCondition) and no node lifecycle controller runs here to lift it: the taints are
/// set again after the create.
pub async fn create_nodes(client: &Client, nodes: &[NodeSpec]) -> anyhow::Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    let created = futures::future::join_all(nodes.iter().map(|n| {
        let api = api.clone();
        async move {
            let mut labels = n.labels.clone();
            labels.insert("kubernetes.io/hostname".into(), n.name.clone());
            let node = json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": n.name, "labels": labels},
                "spec": {"unschedulable": n.unschedulable},
                "status": {"allocatable": n.allocatable, "capacity": n.allocatable},
            });
            api.create(&PostParams::default(), &serde_json::from_value(node)?)
                .await
                .with_context(|| format!("creating node {}", n.name))?;
            api.patch(
                &n.name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"taints": n.taints}})),
            )
            .await
            .with_context(|| format!("setting node {}'s taints", n.name))?;
            anyhow::Ok(())
        }
    }))
    .await;
    created.into_iter().collect()
}

/// The PodScheduled=False condition's (reason, message), if the Pod has one.
pub fn scheduled_condition(p: &Pod) -> Option<(String, String)> {
    p.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")
        .map(|c| {
            (
                c.reason.clone().unwrap_or_default(),
                c.message.clone().unwrap_or_default(),
            )
        })
}

/// The node a Pod is bound to.
pub fn node_of(p: &Pod) -> Option<&str> {
    p.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}
