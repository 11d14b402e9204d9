//! `cargo xtask cluster helm`: the chart (deploy/helm/kpr) installed, upgraded and uninstalled
//! with Helm (built from its pinned module) on a running cluster with real nodes, as a user does
//! it, each step followed by the checks a user would want:
//! 1. `helm install` with `--backend` (and the controller-manager, lb-ipam), waited for; CoreDNS
//!    becomes ready through it; the leftovers check; `cluster smoke`.
//! 2. `helm upgrade --reuse-values` to `--upgrade-to` with the cluster's `kube-proxy` ConfigMap
//!    mounted (`agent.kubeProxyConfig.enabled`: the ConfigMap kubeadm would have made, from
//!    xtask/k8s/manifests/kube-proxy.yaml); each new agent removes the previous backend's
//!    state after its first sync; the leftovers check; `cluster smoke`.
//! 3. `helm uninstall`, waited for; no object of the release is left in the API (by its
//!    `app.kubernetes.io/instance` label, and Helm's release Secrets); then deploy/cleanup.yaml,
//!    as after removing any Service proxy (the chart's README, "Uninstall"), and the nodes hold
//!    nothing of any proxy.
//!
//! The cluster must run no Service proxy (`cluster up --nodes N --proxy none`), so that the
//! chart's objects are its own. Owns `<cluster dir>/helm` (the values as passed).

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _};
use clap::Args;
use controlplane::network::GATEWAY;

use super::nodes::{Proxy, ProxyChoice};
use super::switch::{self, Live};
use super::Cluster;
use crate::deploy::{self, IpFamilies};
use crate::exec::Cmd;

#[derive(Debug, Clone, Args)]
pub struct HelmArgs {
    /// The backend `helm install` sets.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(deploy::BACKENDS), default_value = deploy::DEFAULT_BACKEND)]
    pub backend: String,
    /// The backend `helm upgrade` switches to.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(deploy::BACKENDS), default_value = "ebpf")]
    pub upgrade_to: String,
}

/// The release's name.
const RELEASE: &str = "kpr";
/// The cluster's kube-proxy ConfigMap, as kubeadm names it.
const KUBE_PROXY_CONFIGMAP: &str = "kube-proxy";

/// `cargo xtask cluster helm`.
pub fn run(cluster: &Cluster, args: &HelmArgs) -> anyhow::Result<()> {
    crate::helm::build()?;
    let live = Live::open(cluster)?;
    let running = live.proxy()?;
    if running.proxy != Proxy::None {
        bail!(
            "the cluster runs {}: the chart is installed on a cluster without a Service proxy \
             (`cargo xtask cluster up --nodes N --proxy none`)",
            running.describe()
        );
    }
    let mut steps: Vec<(String, f64)> = Vec::new();
    let started = Instant::now();
    install(&live, &args.backend)?;
    steps.push((
        format!("helm install ({})", args.backend),
        started.elapsed().as_secs_f64(),
    ));
    let at = Instant::now();
    check(&live)?;
    steps.push(("leftovers + smoke".into(), at.elapsed().as_secs_f64()));

    let at = Instant::now();
    upgrade(&live, &args.upgrade_to)?;
    steps.push((
        format!(
            "helm upgrade ({} -> {}, kube-proxy ConfigMap)",
            args.backend, args.upgrade_to
        ),
        at.elapsed().as_secs_f64(),
    ));
    let at = Instant::now();
    check(&live)?;
    steps.push(("leftovers + smoke".into(), at.elapsed().as_secs_f64()));

    let at = Instant::now();
    uninstall(&live)?;
    steps.push((
        "helm uninstall + cleanup, nothing left".into(),
        at.elapsed().as_secs_f64(),
    ));
    println!("\n== cluster helm: every step passed");
    for (step, seconds) in &steps {
        println!("  {step:<52} {seconds:>6.0} s");
    }
    println!(
        "  {:<52} {:>6.0} s",
        "total",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `helm` against the cluster.
fn helm(live: &Live) -> Cmd {
    crate::helm::helm(Some(&live.kubeconfig))
}

/// The values this cluster needs beyond the chart's defaults: its API server (at the cluster
/// network's gateway), the nodes' cgroup2 root, and both families' ranges on a dual-stack one.
fn cluster_values(live: &Live) -> Vec<String> {
    let mut values = vec![
        format!("apiServer.host={GATEWAY}"),
        format!("apiServer.port={}", live.apiserver_port),
        format!("agent.cgroupRoot={}", switch::CGROUP2_ROOT),
    ];
    if live.ip_families == IpFamilies::Dual {
        values.extend([
            format!(
                "agent.clusterCIDRs={{{},{}}}",
                controlplane::CLUSTER_CIDR,
                controlplane::network::CLUSTER_CIDR6
            ),
            format!(
                "agent.serviceCIDRs={{{},{}}}",
                controlplane::SERVICE_CIDR,
                controlplane::network::SERVICE_CIDR6
            ),
            "agent.nodePortAddresses=null".to_string(),
        ]);
    }
    values
}

fn with_sets(mut cmd: Cmd, values: &[String]) -> Cmd {
    for value in values {
        cmd = cmd.args(["--set", value]);
    }
    cmd
}

fn kpr(backend: &str) -> ProxyChoice {
    ProxyChoice {
        proxy: Proxy::Kpr,
        backend: backend.to_string(),
        mode: super::nodes::Mode::Nftables,
    }
}

fn install(live: &Live, backend: &str) -> anyhow::Result<()> {
    println!("== helm install ({backend})");
    let mut values = cluster_values(live);
    values.extend([
        format!("agent.backend={backend}"),
        "controllerManager.enabled=true".to_string(),
    ]);
    live.set_proxy(&kpr(backend))?;
    with_sets(
        helm(live)
            .args(["install", RELEASE])
            .arg(crate::helm::chart_dir())
            .args(["--namespace", deploy::SYSTEM_NAMESPACE])
            .args(["--wait", "--timeout", "240s"]),
        &values,
    )
    .run()
    .context("helm install")?;
    live.rollout(deploy::AGENT_DAEMONSET)?;
    // CoreDNS reaches the API server through the `kubernetes` Service: ready once kpr serves it.
    live.kubectl(&[
        "-n",
        deploy::SYSTEM_NAMESPACE,
        "rollout",
        "status",
        "deployment/coredns",
        "--timeout=180s",
    ])?;
    live.kubectl(&[
        "-n",
        deploy::SYSTEM_NAMESPACE,
        "rollout",
        "status",
        &format!("deployment/{}", deploy::CONTROLLER_DEPLOYMENT),
        "--timeout=120s",
    ])?;
    Ok(())
}

fn upgrade(live: &Live, backend: &str) -> anyhow::Result<()> {
    println!("== helm upgrade ({backend}, the cluster's kube-proxy ConfigMap)");
    let configmap = kube_proxy_configmap(live)?;
    let path = live.write_manifest("kube-proxy-configmap.yaml", &configmap)?;
    live.kubectl(&["apply", "-f", &path.to_string_lossy()])?;
    let values = [
        format!("agent.backend={backend}"),
        "agent.kubeProxyConfig.enabled=true".to_string(),
    ];
    live.set_proxy(&kpr(backend))?;
    with_sets(
        helm(live)
            .args(["upgrade", RELEASE])
            .arg(crate::helm::chart_dir())
            .args(["--namespace", deploy::SYSTEM_NAMESPACE])
            .args(["--reuse-values", "--wait", "--timeout", "240s"]),
        &values,
    )
    .run()
    .context("helm upgrade")?;
    live.rollout(deploy::AGENT_DAEMONSET)?;
    // The agent now runs with the file: its command line says so.
    let args = live.kubectl(&[
        "-n",
        deploy::SYSTEM_NAMESPACE,
        "get",
        "daemonset",
        deploy::AGENT_DAEMONSET,
        "-o",
        "jsonpath={.spec.template.spec.containers[0].args}",
    ])?;
    ensure!(
        args.contains("--config=/var/lib/kube-proxy/config.conf")
            && !args.contains("--cluster-cidr"),
        "the upgraded agent does not take its settings from the ConfigMap: {args}"
    );
    Ok(())
}

/// The `kube-proxy` ConfigMap of xtask/k8s/manifests/kube-proxy.yaml (what kubeadm makes), for
/// this cluster's API server.
fn kube_proxy_configmap(live: &Live) -> anyhow::Result<String> {
    super::nodes::kube_proxy_configmap_for(live.apiserver_port, live.ip_families)
}

/// After each install and upgrade: every node programmed by the new backend, nothing of
/// another, and the smoke test.
fn check(live: &Live) -> anyhow::Result<()> {
    switch::settle(live)?;
    switch::require_clean(live)?;
    super::smoke::run(&live.cluster)
}

fn uninstall(live: &Live) -> anyhow::Result<()> {
    println!("== helm uninstall");
    helm(live)
        .args(["uninstall", RELEASE])
        .args(["--namespace", deploy::SYSTEM_NAMESPACE])
        .args(["--wait", "--timeout", "180s"])
        .run()
        .context("helm uninstall")?;
    live.set_proxy(&switch::none())?;
    wait_for_no_pods(live)?;
    let selector = format!("app.kubernetes.io/instance={RELEASE}");
    let left = live.kubectl(&[
        "get",
        "daemonsets,deployments,replicasets,pods,serviceaccounts,configmaps,roles,rolebindings,\
         clusterroles,clusterrolebindings",
        "-A",
        "-l",
        &selector,
        "-o",
        "name",
    ])?;
    ensure!(
        left.trim().is_empty(),
        "objects of the release are left after helm uninstall:\n{left}"
    );
    let releases = live.kubectl(&[
        "-n",
        deploy::SYSTEM_NAMESPACE,
        "get",
        "secrets",
        "-l",
        &format!("owner=helm,name={RELEASE}"),
        "-o",
        "name",
    ])?;
    ensure!(
        releases.trim().is_empty(),
        "Helm's release records are left: {releases}"
    );
    let listed = helm(live)
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
    // Not the chart's: the ConfigMap kubeadm would have made.
    live.kubectl(&[
        "-n",
        deploy::SYSTEM_NAMESPACE,
        "delete",
        "configmap",
        KUBE_PROXY_CONFIGMAP,
    ])?;
    // The nodes keep the last backend's rules, as after removing kube-proxy: the cleanup
    // DaemonSet removes them (README, "Roll back to kube-proxy"; the chart's README).
    let text = deploy::render_file(deploy::CLEANUP_MANIFEST, &deploy::Render::default())?;
    let text = deploy::with_cgroup_root_in(deploy::CLEANUP_MANIFEST, &text, switch::CGROUP2_ROOT)?;
    live.run_once(deploy::CLEANUP_MANIFEST, &text, deploy::CLEANUP_DAEMONSET)?;
    // With `none` running, state of any Service proxy is a leftover.
    let found = switch::check(live)?;
    ensure!(
        found.is_empty(),
        "after helm uninstall and the cleanup, the nodes still hold:\n  {}",
        found.join("\n  ")
    );
    println!("[ok] the nodes hold nothing of any Service proxy");
    Ok(())
}

/// The agent's and controller-manager's Pods are gone (uninstall deletes their controllers; the
/// Pods terminate after).
fn wait_for_no_pods(live: &Live) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let pods = live.kubectl(&[
            "-n",
            deploy::SYSTEM_NAMESPACE,
            "get",
            "pods",
            "-l",
            "app.kubernetes.io/name in (kpr-proxy,kpr-controller-manager)",
            "-o",
            "name",
        ])?;
        if pods.trim().is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("pods of the release still exist 120 s after helm uninstall: {pods}");
        }
        std::thread::sleep(Duration::from_secs(2));
    }
}
