//! `cargo xtask cluster smoke`: `deploy/smoke.yaml` (the smoke test `cargo xtask kind` runs) on a
//! cluster with real nodes, checked from every node: a client pod on each node reaches the
//! ClusterIP Service by its DNS name and every node's NodePort, and each node itself (its network
//! namespace) reaches the ClusterIP and every node's NodePort. Every request must be answered.
//!
//! Owns: the `kpr-smoke` namespace's client pods; the requests and the report are `kind`'s.

use anyhow::Context as _;
use controlplane::network::netns_path;
use serde_json::json;

use super::Cluster;

/// This machine's cgroup2 hierarchy; each node's subtree is `<this>/<node>`.
const CGROUP2_ROOT: &str = "/sys/fs/cgroup/unified";
use crate::deploy;
use crate::exec::Cmd;
use crate::kind::{curl_loop, report};

pub fn run(cluster: &Cluster) -> anyhow::Result<()> {
    let state = super::read_state(cluster)?;
    let kubeconfig = state["kubeconfig"]
        .as_str()
        .context("the cluster's state names no kubeconfig")?
        .to_string();
    let kubectl = || {
        Cmd::new(crate::k8s::bin_dir().join("kubectl"))
            .arg("--kubeconfig")
            .arg(&kubeconfig)
    };
    let ns = ["-n", deploy::SMOKE_NAMESPACE];
    kubectl()
        .args(["apply", "-f"])
        .arg(deploy::deploy_dir().join(deploy::SMOKE_MANIFEST))
        .run()?;
    kubectl()
        .args(["rollout", "status", "deployment/echo", "--timeout=180s"])
        .args(ns)
        .run()?;
    let nodes_text = kubectl()
        .args([
            "get",
            "nodes",
            "-o",
            r#"jsonpath={range .items[*]}{.metadata.name} {.status.addresses[?(@.type=="InternalIP")].address}{"\n"}{end}"#,
        ])
        .read()?;
    let nodes: Vec<(String, String)> = nodes_text
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(n, ip)| (n.to_string(), ip.to_string()))
        .collect();
    anyhow::ensure!(!nodes.is_empty(), "the cluster has no nodes");
    let cluster_ip = kubectl()
        .args(["get", "service", "echo", "-o", "jsonpath={.spec.clusterIP}"])
        .args(ns)
        .read()?;
    for (node, _) in &nodes {
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("client-{node}"), "namespace": deploy::SMOKE_NAMESPACE},
            "spec": {
                "nodeName": node,
                "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "client",
                                "image": "registry.k8s.io/e2e-test-images/agnhost:2.56",
                                "args": ["pause"]}]
            }
        });
        let file = cluster.dir.join(format!("smoke-client-{node}.json"));
        std::fs::write(&file, pod.to_string())?;
        kubectl().args(["apply", "-f"]).arg(&file).run()?;
    }
    for (node, _) in &nodes {
        kubectl()
            .args([
                "wait",
                "--for=condition=Ready",
                &format!("pod/client-{node}"),
                "--timeout=120s",
            ])
            .args(ns)
            .run()?;
    }
    let by_name = format!(
        "http://echo.{}.svc.cluster.local/hostname",
        deploy::SMOKE_NAMESPACE
    );
    let mut checks: Vec<(String, Cmd, String)> = Vec::new();
    for (node, _) in &nodes {
        let in_pod = kubectl()
            .args(["exec", &format!("client-{node}")])
            .args(ns)
            .arg("--");
        let on_node = Cmd::new("nsenter")
            .arg(format!("--net={}", netns_path(node).display()))
            .arg("--");
        checks.push((
            format!("pod on {node} -> ClusterIP (by DNS name)"),
            in_pod.clone(),
            by_name.clone(),
        ));
        checks.push((
            format!("{node} -> ClusterIP"),
            on_node.clone(),
            format!("http://{cluster_ip}/hostname"),
        ));
        for (other, ip) in &nodes {
            let url = format!("http://{ip}:{}/hostname", deploy::SMOKE_NODE_PORT);
            checks.push((
                format!("pod on {node} -> NodePort of {other}"),
                in_pod.clone(),
                url.clone(),
            ));
            checks.push((
                format!("{node} -> NodePort of {other}"),
                on_node.clone(),
                url,
            ));
        }
    }
    let mut results = Vec::new();
    for (what, prefix, url) in &checks {
        let mut script = curl_loop(url);
        if let Some(node) = what.strip_suffix(" -> ClusterIP").or_else(|| {
            what.split_once(" -> NodePort")
                .map(|(n, _)| n)
                .filter(|n| !n.starts_with("pod on "))
        }) {
            // A process of the node: in its cgroup too, where the eBPF backend's socket programs
            // see its connections (a kind node's processes are all in its cgroup).
            script = format!("echo $$ > {CGROUP2_ROOT}/{node}/cgroup.procs; {script}");
        }
        let out = prefix.clone().args(["sh", "-c", &script]).read()?;
        results.push((what.as_str(), out));
    }
    report(&results, false)?;
    println!(
        "smoke: {} checks from {} nodes answered ({})",
        checks.len(),
        nodes.len(),
        state["proxy"].as_str().unwrap_or("?")
    );
    Ok(())
}
