//! What `deploy/` is checked against: the one image name, the manifest files, and the rendering
//! `cargo xtask kind` applies (the committed manifests are valid as they are, for the default backend
//! and cluster; rendering substitutes the chosen backend and the cluster's API server host).

use std::fs;
use std::path::PathBuf;

use anyhow::{bail, Context as _};

use crate::workspace_root;

/// The image `cargo xtask kind` builds from deploy/Dockerfile and loads into kind; the manifests
/// reference exactly this (with `imagePullPolicy: Never`: it only exists where it was loaded).
pub const IMAGE: &str = "kpr:dev";
/// The backends the agent accepts (`proxy run --backend`).
pub const BACKENDS: &[&str] = &["userspace", "iptables", "nftables", "ebpf"];
/// The backend the committed DaemonSet runs with.
pub const DEFAULT_BACKEND: &str = "nftables";
/// The kind cluster name the committed manifests are written for.
pub const DEFAULT_CLUSTER: &str = "kpr";

pub const KIND_CONFIG: &str = "kind-config.yaml";
/// The dual-stack cluster (`--ip-family dual`).
pub const KIND_CONFIG_DUAL: &str = "kind-config-dual.yaml";
pub const DOCKERFILE: &str = "Dockerfile";
/// The agent: ServiceAccount, ClusterRole, ClusterRoleBinding, DaemonSet.
pub const AGENT_MANIFEST: &str = "proxy.yaml";
/// The controller-manager: ServiceAccount, RBAC, Deployment.
pub const CONTROLLER_MANIFEST: &str = "controller-manager.yaml";
/// The workload controllers' and garbage collector's RBAC, for the controller-manager's account.
pub const WORKLOAD_MANIFEST: &str = "workload-controllers.yaml";
/// The smoke test's echo Deployment, ClusterIP and NodePort Services and client Pod.
pub const SMOKE_MANIFEST: &str = "smoke.yaml";
/// The rollback to kube-proxy: a DaemonSet that runs `proxy cleanup --backend all` on every node.
pub const CLEANUP_MANIFEST: &str = "cleanup.yaml";
/// Replacing kube-proxy on a running cluster: a DaemonSet that runs `kube-proxy --cleanup` (the
/// cluster's own kube-proxy image) on every node.
pub const KUBE_PROXY_CLEANUP_MANIFEST: &str = "kube-proxy-cleanup.yaml";
/// kpr's scheduler as a second scheduler (`schedulerName: kpr-scheduler`): ServiceAccount, RBAC,
/// its KubeSchedulerConfiguration, Deployment.
pub const SCHEDULER_MANIFEST: &str = "scheduler.yaml";
/// Every Kubernetes manifest in deploy/.
pub const MANIFESTS: &[&str] = &[
    AGENT_MANIFEST,
    CONTROLLER_MANIFEST,
    WORKLOAD_MANIFEST,
    SMOKE_MANIFEST,
    CLEANUP_MANIFEST,
    KUBE_PROXY_CLEANUP_MANIFEST,
    SCHEDULER_MANIFEST,
];

/// Names the smoke test and the manifests share.
pub const AGENT_DAEMONSET: &str = "kpr-proxy";
/// The DaemonSets of [`CLEANUP_MANIFEST`] and [`KUBE_PROXY_CLEANUP_MANIFEST`].
pub const CLEANUP_DAEMONSET: &str = "kpr-cleanup";
pub const KUBE_PROXY_CLEANUP_DAEMONSET: &str = "kube-proxy-cleanup";
pub const CONTROLLER_DEPLOYMENT: &str = "kpr-controller-manager";
pub const SCHEDULER_DEPLOYMENT: &str = "kpr-scheduler";
pub const SYSTEM_NAMESPACE: &str = "kube-system";
pub const SMOKE_NAMESPACE: &str = "kpr-smoke";
pub const SMOKE_NODE_PORT: u16 = 30080;
/// The nodePort of `echo-local`, the smoke Service with externalTrafficPolicy Local.
pub const SMOKE_LOCAL_NODE_PORT: u16 = 30081;

/// How the committed agent manifest sets the backend (`KPR_BACKEND`, read by the agent's
/// `--backend=$(KPR_BACKEND)`).
const BACKEND_VALUE: &str = "value: nftables # backend";

pub fn deploy_dir() -> PathBuf {
    workspace_root().join("deploy")
}

/// The address families of the cluster (kind's `networking.ipFamily`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum IpFamilies {
    /// IPv4 only (deploy/kind-config.yaml, the committed manifests as they are).
    #[default]
    Ipv4,
    /// IPv4 and IPv6 (deploy/kind-config-dual.yaml): pods and Services get both.
    Dual,
}

/// The agent arguments a dual-stack rendering rewrites: (committed, dual-stack). Without
/// `--nodeport-addresses` the agent takes nodePorts on every address of the node, of both
/// families (the downward API has no field for the node's IPv6 address).
const DUAL_STACK_ARGS: &[(&str, &str)] = &[
    (
        "- --cluster-cidr=10.244.0.0/16\n",
        "- --cluster-cidr=10.244.0.0/16,fd00:10:244::/56\n",
    ),
    (
        "- --service-cluster-ip-range=10.96.0.0/16\n",
        "- --service-cluster-ip-range=10.96.0.0/16,fd00:10:96::/112\n",
    ),
    ("            - --nodeport-addresses=$(NODE_IP)/32\n", ""),
];

/// How the smoke Services ask for both families in a dual-stack rendering.
const SMOKE_SERVICE_SPECS: &[&str] = &["spec:\n  type: ClusterIP\n", "spec:\n  type: NodePort\n"];

/// What a rendering substitutes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Render {
    pub backend: String,
    pub cluster: String,
    pub ip_families: IpFamilies,
}

impl Default for Render {
    fn default() -> Self {
        Render {
            backend: DEFAULT_BACKEND.to_owned(),
            cluster: DEFAULT_CLUSTER.to_owned(),
            ip_families: IpFamilies::Ipv4,
        }
    }
}

impl Render {
    /// The kind configuration of the cluster's families.
    pub fn kind_config(&self) -> &'static str {
        match self.ip_families {
            IpFamilies::Ipv4 => KIND_CONFIG,
            IpFamilies::Dual => KIND_CONFIG_DUAL,
        }
    }

    /// The host the agent reaches the API server at: kind's control-plane container, resolved by
    /// Docker's DNS, because the agent is what makes the `kubernetes` Service address work.
    pub fn api_server_host(&self) -> String {
        format!("{}-control-plane", self.cluster)
    }
}

/// Reads `deploy/<file>` and renders it.
pub fn render_file(file: &str, render: &Render) -> anyhow::Result<String> {
    let path = deploy_dir().join(file);
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    render_text(file, &text, render)
}

/// Substitutes the backend (the `value: nftables # backend` lines) and the API server host
/// (`kpr-control-plane`). The agent manifest must contain both, so a manifest edit cannot silently
/// stop the substitution from happening.
pub fn render_text(file: &str, text: &str, render: &Render) -> anyhow::Result<String> {
    if !BACKENDS.contains(&render.backend.as_str()) {
        bail!(
            "unknown backend {:?}: expected one of {}",
            render.backend,
            BACKENDS.join(", ")
        );
    }
    let default_host = Render::default().api_server_host();
    let mut tokens = Vec::new();
    if file == AGENT_MANIFEST {
        tokens.extend([BACKEND_VALUE, default_host.as_str()]);
        if render.ip_families == IpFamilies::Dual {
            tokens.extend(DUAL_STACK_ARGS.iter().map(|(from, _)| *from));
        }
    }
    if file == SMOKE_MANIFEST && render.ip_families == IpFamilies::Dual {
        tokens.extend(SMOKE_SERVICE_SPECS);
    }
    for token in tokens {
        if !text.contains(token) {
            bail!("deploy/{file}: expected {token:?} (the text xtask substitutes), found none");
        }
    }
    let backend_value = BACKEND_VALUE.replace(DEFAULT_BACKEND, &render.backend);
    let mut out = text
        .replace(BACKEND_VALUE, &backend_value)
        .replace(&default_host, &render.api_server_host());
    if render.ip_families == IpFamilies::Dual {
        for (from, to) in DUAL_STACK_ARGS {
            out = out.replace(from, to);
        }
        for spec in SMOKE_SERVICE_SPECS {
            out = out.replace(spec, &format!("{spec}  ipFamilyPolicy: PreferDualStack\n"));
        }
    }
    Ok(out)
}

/// How the committed agent manifest sets the API server's port (kind's).
const PORT_VALUE: &str = "- name: KUBERNETES_SERVICE_PORT\n              value: \"6443\"";

/// For a cluster whose API server is not kind's control-plane container (`cargo xtask cluster up
/// --nodes N`): points a rendered agent manifest at `host:port` instead.
pub fn with_api_server(
    rendered: &str,
    render: &Render,
    host: &str,
    port: u16,
) -> anyhow::Result<String> {
    let kind_host = format!("value: {}", render.api_server_host());
    for token in [PORT_VALUE, kind_host.as_str()] {
        if !rendered.contains(token) {
            bail!("deploy/{AGENT_MANIFEST}: expected {token:?} (the text xtask substitutes), found none");
        }
    }
    let port_value = PORT_VALUE.replace("6443", &port.to_string());
    Ok(rendered
        .replace(PORT_VALUE, &port_value)
        .replace(&kind_host, &format!("value: {host}")))
}

/// The committed agent manifest's cgroup v2 root: a pure cgroup v2 node's (kind's).
const CGROUP_ROOT_VALUE: &str = "path: /sys/fs/cgroup\n            type: Directory";

/// For nodes with hybrid cgroups (v1 controllers, cgroup2 at /sys/fs/cgroup/unified, as on the
/// machines `cargo xtask cluster` runs on): mounts `root` as the agent's cgroup v2 root instead.
pub fn with_cgroup_root(rendered: &str, root: &str) -> anyhow::Result<String> {
    with_cgroup_root_in(AGENT_MANIFEST, rendered, root)
}

/// [`with_cgroup_root`] for any manifest of deploy/ that mounts the cgroup v2 root the same way
/// (the agent's and [`CLEANUP_MANIFEST`], which must clean up where the agent attached).
pub fn with_cgroup_root_in(file: &str, rendered: &str, root: &str) -> anyhow::Result<String> {
    if !rendered.contains(CGROUP_ROOT_VALUE) {
        bail!("deploy/{file}: expected {CGROUP_ROOT_VALUE:?} (the text xtask substitutes), found none");
    }
    Ok(rendered.replace(
        CGROUP_ROOT_VALUE,
        &CGROUP_ROOT_VALUE.replace("/sys/fs/cgroup", root),
    ))
}

/// How [`KUBE_PROXY_CLEANUP_MANIFEST`] names the kube-proxy image (a tag follows).
const KUBE_PROXY_IMAGE: &str = "image: registry.k8s.io/kube-proxy:";

/// [`KUBE_PROXY_CLEANUP_MANIFEST`] with the kube-proxy image of the cluster's release `version`
/// (`v1.34.4`): `kube-proxy --cleanup` must be the release that wrote the rules.
pub fn with_kube_proxy_version(rendered: &str, version: &str) -> anyhow::Result<String> {
    if !rendered.contains(KUBE_PROXY_IMAGE) {
        bail!("deploy/{KUBE_PROXY_CLEANUP_MANIFEST}: expected {KUBE_PROXY_IMAGE:?} (the text xtask substitutes), found none");
    }
    let lines: Vec<String> = rendered
        .split('\n')
        .map(|line| match line.find(KUBE_PROXY_IMAGE) {
            Some(at) => format!("{}{version}", &line[..at + KUBE_PROXY_IMAGE.len()]),
            None => line.to_string(),
        })
        .collect();
    Ok(lines.join("\n"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_agent_manifest_points_at_another_api_server() {
        let render = Render::default();
        let text = render_file(AGENT_MANIFEST, &render).unwrap();
        let text = with_api_server(&text, &render, "172.18.0.1", 34567).unwrap();
        assert!(text.contains("value: 172.18.0.1"), "{text}");
        assert!(text.contains("value: \"34567\""), "{text}");
        assert!(!text.contains("kpr-control-plane"));
    }

    use super::*;

    #[test]
    fn agent_manifest_renders_every_backend_and_cluster() {
        for backend in BACKENDS {
            let render = Render {
                backend: backend.to_string(),
                cluster: "dev".into(),
                ..Render::default()
            };
            let text = render_file(AGENT_MANIFEST, &render).unwrap();
            let value = format!("value: {backend} # backend");
            assert_eq!(
                text.matches(&value).count(),
                1,
                "{backend}: the agent's KPR_BACKEND (no cleanup init container: the agent cleans up)"
            );
            assert!(text.contains("dev-control-plane"));
            assert!(!text.contains("kpr-control-plane"));
        }
    }

    #[test]
    fn the_cleanup_manifests_render_for_these_clusters() {
        let text = render_file(CLEANUP_MANIFEST, &Render::default()).unwrap();
        let text = with_cgroup_root_in(CLEANUP_MANIFEST, &text, "/sys/fs/cgroup/unified").unwrap();
        assert!(text.contains("path: /sys/fs/cgroup/unified\n"), "{text}");
        let text = render_file(KUBE_PROXY_CLEANUP_MANIFEST, &Render::default()).unwrap();
        let text = with_kube_proxy_version(&text, "v1.99.0").unwrap();
        assert!(
            text.contains("image: registry.k8s.io/kube-proxy:v1.99.0\n"),
            "{text}"
        );
        assert_eq!(text.matches("kube-proxy:").count(), 1, "{text}");
        let err = with_kube_proxy_version("image: kpr:dev", "v1.99.0").unwrap_err();
        assert!(err.to_string().contains("kube-proxy-cleanup.yaml"), "{err}");
    }

    #[test]
    fn unknown_backend_is_refused() {
        let render = Render {
            backend: "ipvs".into(),
            ..Render::default()
        };
        let err = render_text(AGENT_MANIFEST, "", &render)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown backend \"ipvs\""), "{err}");
    }

    #[test]
    fn a_manifest_without_the_backend_value_is_an_error() {
        let err = render_text(
            AGENT_MANIFEST,
            "value: kpr-control-plane",
            &Render::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("expected \"value: nftables # backend\""),
            "{err}"
        );
    }
}
