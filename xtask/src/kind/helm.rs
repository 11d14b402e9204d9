//! The chart (deploy/helm/kpr) on kind, as `cargo xtask cluster helm` does it on real nodes and as
//! the chart's README says: the kubectl-applied agent and controller-manager removed (and their
//! rules, deploy/cleanup.yaml), `helm install` (nftables, the controller-manager on), `helm
//! upgrade --reuse-values` to the eBPF backend, `helm uninstall`, each followed by the leftovers
//! check and the smoke test; after the uninstall nothing of the release is left in the API and,
//! after deploy/cleanup.yaml, nothing of any proxy on the nodes. Run by `--matrix` on its
//! dual-stack cluster (the chart's values for both families).

use anyhow::{ensure, Context as _};

use super::matrix::{run_once_cleanup, settled};
use super::{hybrid_cgroups, Kind, HYBRID_CGROUP2};
use crate::deploy;
use crate::exec::Cmd;

const RELEASE: &str = "kpr";

type Step = fn(&Kind) -> anyhow::Result<Vec<String>>;

/// The steps, in order; `--matrix` stops at the first that fails.
pub(super) const STEPS: &[(&str, Step)] = &[
    ("helm install (nftables)", install),
    ("helm upgrade (nftables -> ebpf)", upgrade),
    ("helm uninstall", uninstall),
];

/// helm in the engine's network namespace (where kind publishes the API server), with Helm's
/// homes under `<target>/helm/home` and kind's kubeconfig.
fn helm(kind: &Kind) -> Cmd {
    let mut cmd = Cmd::new("ip")
        .args(["netns", "exec", crate::docker::NETNS])
        .arg(crate::helm::binary())
        .env("KUBECONFIG", super::local_kubeconfig());
    for (key, value) in crate::helm::home_env() {
        cmd = cmd.env(key, value);
    }
    cmd.args(["--kube-context", &kind.context])
}

fn install(kind: &Kind) -> anyhow::Result<Vec<String>> {
    super::step("helm install");
    // What kubectl applied goes first: Helm does not adopt objects it did not make.
    let dir = kind.render_manifests()?;
    for file in [deploy::AGENT_MANIFEST, deploy::CONTROLLER_MANIFEST] {
        kind.kubectl()
            .args(["delete", "--wait=true", "--cascade=foreground", "-f"])
            .arg(dir.join(file))
            .run()?;
    }
    run_once_cleanup(kind)?;
    let mut cmd = helm(kind)
        .args(["install", RELEASE])
        .arg(crate::helm::chart_dir())
        .args(["--namespace", deploy::SYSTEM_NAMESPACE])
        .args(["--wait", "--timeout", "240s"])
        .args([
            "--set",
            &format!("apiServer.host={}", kind.render.api_server_host()),
        ])
        .args(["--set", "agent.backend=nftables"])
        .args(["--set", "controllerManager.enabled=true"]);
    if hybrid_cgroups() {
        cmd = cmd.args(["--set", &format!("agent.cgroupRoot={HYBRID_CGROUP2}")]);
    }
    if kind.render.ip_families == crate::deploy::IpFamilies::Dual {
        // deploy/kind-config-dual.yaml's ranges; NodePorts on every node address.
        cmd = cmd
            .args([
                "--set",
                "agent.clusterCIDRs={10.244.0.0/16,fd00:10:244::/56}",
            ])
            .args([
                "--set",
                "agent.serviceCIDRs={10.96.0.0/16,fd00:10:96::/112}",
            ])
            .args(["--set", "agent.nodePortAddresses=null"]);
    }
    cmd.run().context("helm install")?;
    let mut lines = settled(kind, "kpr nftables")?;
    lines.extend(kind.smoke_test(&dir, true)?);
    Ok(lines)
}

fn upgrade(kind: &Kind) -> anyhow::Result<Vec<String>> {
    super::step("helm upgrade to the eBPF backend");
    super::matrix::with_backend(kind, "ebpf").check_cgroup_scope()?;
    helm(kind)
        .args(["upgrade", RELEASE])
        .arg(crate::helm::chart_dir())
        .args(["--namespace", deploy::SYSTEM_NAMESPACE])
        .args(["--reuse-values", "--wait", "--timeout", "240s"])
        .args(["--set", "agent.backend=ebpf"])
        .run()
        .context("helm upgrade")?;
    kind.kubectl()
        .args(["rollout", "status", "daemonset/kpr-proxy", super::TIMEOUT])
        .args(["-n", deploy::SYSTEM_NAMESPACE])
        .run()?;
    let mut lines = settled(kind, "kpr ebpf")?;
    let dir = crate::target_dir().join("kind").join(&kind.render.cluster);
    lines.extend(kind.smoke_test(&dir, true)?);
    Ok(lines)
}

fn uninstall(kind: &Kind) -> anyhow::Result<Vec<String>> {
    super::step("helm uninstall");
    helm(kind)
        .args([
            "uninstall",
            RELEASE,
            "--namespace",
            deploy::SYSTEM_NAMESPACE,
        ])
        .args(["--wait", "--timeout", "180s"])
        .run()
        .context("helm uninstall")?;
    let selector = format!("app.kubernetes.io/instance={RELEASE}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let left = kind
            .kubectl()
            .args([
                "get",
                "daemonsets,deployments,replicasets,pods,serviceaccounts,configmaps,roles,\
                 rolebindings,clusterroles,clusterrolebindings",
                "-A",
                "-l",
                &selector,
                "-o",
                "name",
            ])
            .read()?;
        if left.trim().is_empty() {
            break;
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "objects of the release are left 120 s after helm uninstall:\n{left}"
        );
        std::thread::sleep(std::time::Duration::from_secs(2));
    }
    let records = kind
        .kubectl()
        .args(["get", "secrets", "-n", deploy::SYSTEM_NAMESPACE])
        .args(["-l", &format!("owner=helm,name={RELEASE}"), "-o", "name"])
        .read()?;
    ensure!(
        records.trim().is_empty(),
        "Helm's release records are left: {records}"
    );
    let listed = helm(kind)
        .args([
            "list",
            "--all",
            "--short",
            "--namespace",
            deploy::SYSTEM_NAMESPACE,
        ])
        .read()?;
    ensure!(listed.trim().is_empty(), "helm list still shows: {listed}");
    println!("[ok] nothing of the release is left in the API");
    run_once_cleanup(kind)?;
    settled(kind, "none")?;
    Ok(vec![
        "nothing of the release in the API; after deploy/cleanup.yaml nothing of any proxy on the nodes"
            .to_owned(),
    ])
}
