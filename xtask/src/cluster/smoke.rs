//! `cargo xtask cluster smoke`: `deploy/smoke.yaml` (the smoke test `cargo xtask kind` runs) on a
//! cluster with real nodes, checked from every node, from a pod on every node and from outside the
//! nodes (the cluster network's hub, where a client of the cluster's Docker network would be), in
//! IPv4 and, on a dual-stack cluster, in IPv6 too:
//! - the ClusterIP Service (by DNS name, and by its IPv6 clusterIP) and every node's NodePort
//!   answer every request;
//! - client addresses are what the traffic policies say: a pod reaching the ClusterIP is seen with
//!   its own address; a client outside the nodes is masqueraded on `echo-nodeport`
//!   (externalTrafficPolicy Cluster) and seen with its own address on `echo-local` (Local). kpr's
//!   userspace backend opens its own connection to the endpoint, so there the endpoint sees the
//!   node instead, as docs/E2E.md says: the smoke expects that of it.
//!
//! Owns: the `kpr-smoke` namespace's client pods and the checks; the curl loop and the answer
//! count are `kind`'s.

use std::collections::BTreeSet;

use anyhow::{ensure, Context as _};
use controlplane::network::{netns_path, GATEWAY, GATEWAY6};
use serde_json::json;

use super::Cluster;
use crate::deploy::{self, IpFamilies, Render};
use crate::exec::Cmd;
use crate::kind::{curl_loop, of_family, report};

/// This machine's cgroup2 hierarchy; each node's subtree is `<this>/<node>`.
const CGROUP2_ROOT: &str = "/sys/fs/cgroup/unified";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    V4,
    V6,
}

impl Family {
    fn name(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }

    fn is_v6(self) -> bool {
        self == Family::V6
    }

    /// `http://ip:port/path`, the address in brackets for IPv6.
    fn url(self, ip: &str, port: Option<u16>, path: &str) -> String {
        let host = match self {
            Family::V4 => ip.to_string(),
            Family::V6 => format!("[{ip}]"),
        };
        match port {
            Some(port) => format!("http://{host}:{port}{path}"),
            None => format!("http://{host}{path}"),
        }
    }

    /// The address a client outside the nodes has (the cluster network's gateway).
    fn outside(self) -> String {
        match self {
            Family::V4 => GATEWAY.to_string(),
            Family::V6 => GATEWAY6.to_string(),
        }
    }
}

/// What a check's answers must show.
#[derive(Debug, Clone)]
enum Expect {
    /// Every request answered (by an echo pod's name).
    Answered,
    /// Every answer (agnhost's `/clientip`: `ip:port`) names this client address.
    ClientIs(String),
    /// No answer names this client address: it was masqueraded.
    ClientIsNot(String),
}

struct Check {
    what: String,
    prefix: Cmd,
    url: String,
    /// A node's process: run in the node's cgroup, where the eBPF backend's socket programs see
    /// its connections (a kind node's processes are all in its cgroup).
    node_cgroup: Option<String>,
    expect: Expect,
}

/// A node's name, its InternalIPs and the addresses of its client pod (space-separated, as
/// kubectl prints them).
struct NodeView {
    name: String,
    ips: String,
    client_ips: String,
}

pub fn run(cluster: &Cluster) -> anyhow::Result<()> {
    let state = super::read_state(cluster)?;
    let kubeconfig = state["kubeconfig"]
        .as_str()
        .context("the cluster's state names no kubeconfig")?
        .to_string();
    let families = super::state_ip_families(&state);
    let proxy = state["proxy"].as_str().unwrap_or("?").to_string();
    // The one proxy that cannot keep a client's address (see the module comment).
    let keeps_clients = proxy != "kpr userspace";
    let kubectl = || {
        Cmd::new(crate::k8s::bin_dir().join("kubectl"))
            .arg("--kubeconfig")
            .arg(&kubeconfig)
    };
    let ns = ["-n", deploy::SMOKE_NAMESPACE];
    let render = Render {
        ip_families: families,
        ..Render::default()
    };
    let manifest = cluster.dir.join(deploy::SMOKE_MANIFEST);
    std::fs::write(
        &manifest,
        deploy::render_file(deploy::SMOKE_MANIFEST, &render)?,
    )?;
    kubectl().args(["apply", "-f"]).arg(&manifest).run()?;
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
    let mut nodes: Vec<NodeView> = nodes_text
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(name, ips)| NodeView {
            name: name.to_string(),
            ips: ips.to_string(),
            client_ips: String::new(),
        })
        .collect();
    ensure!(!nodes.is_empty(), "the cluster has no nodes");
    for node in &nodes {
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("client-{}", node.name), "namespace": deploy::SMOKE_NAMESPACE},
            "spec": {
                "nodeName": node.name,
                "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "client",
                                "image": "registry.k8s.io/e2e-test-images/agnhost:2.56",
                                "args": ["pause"]}]
            }
        });
        let file = cluster.dir.join(format!("smoke-client-{}.json", node.name));
        std::fs::write(&file, pod.to_string())?;
        kubectl().args(["apply", "-f"]).arg(&file).run()?;
    }
    for node in &mut nodes {
        let pod = format!("pod/client-{}", node.name);
        kubectl()
            .args(["wait", "--for=condition=Ready", &pod, "--timeout=120s"])
            .args(ns)
            .run()?;
        node.client_ips = kubectl()
            .args(["get", &pod, "-o", "jsonpath={.status.podIPs[*].ip}"])
            .args(ns)
            .read()?;
    }
    // echo-local answers only on the nodes with an echo pod.
    let echo_nodes: BTreeSet<String> = kubectl()
        .args(["get", "pods", "-l", "app=echo", "-o"])
        .arg("jsonpath={.items[*].spec.nodeName}")
        .args(ns)
        .read()?
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let family_list: &[Family] = match families {
        IpFamilies::Ipv4 => &[Family::V4],
        IpFamilies::Dual => &[Family::V4, Family::V6],
    };
    let mut checks = Vec::new();
    for &family in family_list {
        let cluster_ip = kubectl()
            .args(["get", "service", "echo", "-o"])
            .arg(match family {
                Family::V4 => "jsonpath={.spec.clusterIPs[0]}",
                Family::V6 => "jsonpath={.spec.clusterIPs[1]}",
            })
            .args(ns)
            .read()?;
        ensure!(
            of_family(&cluster_ip, family.is_v6()).is_some(),
            "Service echo has no {} clusterIP (clusterIPs: {cluster_ip:?})",
            family.name()
        );
        checks.extend(family_checks(
            family,
            &cluster_ip,
            &nodes,
            &echo_nodes,
            &kubectl,
            &cluster.name,
            keeps_clients,
        )?);
    }
    let mut answered = Vec::new();
    let mut clients = Vec::new();
    for check in &checks {
        let mut script = curl_loop(&check.url);
        if let Some(node) = &check.node_cgroup {
            script = format!("echo $$ > {CGROUP2_ROOT}/{node}/cgroup.procs; {script}");
        }
        let out = check
            .prefix
            .clone()
            .args(["sh", "-c", &script])
            .read()
            .with_context(|| format!("{}: {}", check.what, check.url))?;
        match &check.expect {
            Expect::Answered => answered.push((check.what.as_str(), out)),
            expect => clients.push((check.what.as_str(), expect, out)),
        }
    }
    report(&answered, false)?;
    report_clients(&clients)?;
    println!(
        "smoke: {} checks ({}) from {} node(s), a pod on each and outside them answered ({})",
        checks.len(),
        family_list
            .iter()
            .map(|f| f.name())
            .collect::<Vec<_>>()
            .join(" and "),
        nodes.len(),
        proxy
    );
    Ok(())
}

/// Every check of one family.
fn family_checks(
    family: Family,
    cluster_ip: &str,
    nodes: &[NodeView],
    echo_nodes: &BTreeSet<String>,
    kubectl: &dyn Fn() -> Cmd,
    cluster: &str,
    keeps_clients: bool,
) -> anyhow::Result<Vec<Check>> {
    // The client address a proxy that keeps it shows, or for one that cannot, anything else.
    let preserved = |ip: String| {
        if keeps_clients {
            Expect::ClientIs(ip)
        } else {
            Expect::ClientIsNot(ip)
        }
    };
    let ns = ["-n", deploy::SMOKE_NAMESPACE];
    let fam = family.name();
    let node_ip = |node: &NodeView| {
        of_family(&node.ips, family.is_v6())
            .map(str::to_string)
            .with_context(|| format!("node {} has no {fam} InternalIP: {:?}", node.name, node.ips))
    };
    let outside = Cmd::new("nsenter")
        .arg(format!(
            "--net={}",
            netns_path(&format!("{cluster}-net")).display()
        ))
        .arg("--");
    let mut checks = Vec::new();
    for node in nodes {
        let in_pod = kubectl()
            .args(["exec", &format!("client-{}", node.name)])
            .args(ns)
            .arg("--");
        let on_node = Cmd::new("nsenter")
            .arg(format!("--net={}", netns_path(&node.name).display()))
            .arg("--");
        let pod_ip = of_family(&node.client_ips, family.is_v6()).with_context(|| {
            format!(
                "the client pod on {} has no {fam} address: {:?}",
                node.name, node.client_ips
            )
        })?;
        let (by_name, what) = match family {
            // The cluster DNS Service is IPv4: the IPv6 clusterIP is reached by address.
            Family::V4 => (
                format!(
                    "http://echo.{}.svc.cluster.local/hostname",
                    deploy::SMOKE_NAMESPACE
                ),
                "ClusterIP (by DNS name)",
            ),
            Family::V6 => (family.url(cluster_ip, None, "/hostname"), "ClusterIP"),
        };
        checks.push(Check {
            what: format!("{fam}: pod on {} -> {what}", node.name),
            prefix: in_pod.clone(),
            url: by_name,
            node_cgroup: None,
            expect: Expect::Answered,
        });
        checks.push(Check {
            what: format!("{fam}: pod on {} -> ClusterIP, client address", node.name),
            prefix: in_pod.clone(),
            url: family.url(cluster_ip, None, "/clientip"),
            node_cgroup: None,
            expect: preserved(pod_ip.to_string()),
        });
        checks.push(Check {
            what: format!("{fam}: {} -> ClusterIP", node.name),
            prefix: on_node.clone(),
            url: family.url(cluster_ip, None, "/hostname"),
            node_cgroup: Some(node.name.clone()),
            expect: Expect::Answered,
        });
        for other in nodes {
            let url = family.url(&node_ip(other)?, Some(deploy::SMOKE_NODE_PORT), "/hostname");
            checks.push(Check {
                what: format!("{fam}: pod on {} -> NodePort of {}", node.name, other.name),
                prefix: in_pod.clone(),
                url: url.clone(),
                node_cgroup: None,
                expect: Expect::Answered,
            });
            checks.push(Check {
                what: format!("{fam}: {} -> NodePort of {}", node.name, other.name),
                prefix: on_node.clone(),
                url,
                node_cgroup: Some(node.name.clone()),
                expect: Expect::Answered,
            });
        }
        let ip = node_ip(node)?;
        checks.push(Check {
            what: format!("{fam}: outside -> NodePort of {}", node.name),
            prefix: outside.clone(),
            url: family.url(&ip, Some(deploy::SMOKE_NODE_PORT), "/hostname"),
            node_cgroup: None,
            expect: Expect::Answered,
        });
        checks.push(Check {
            what: format!(
                "{fam}: outside -> NodePort of {} (policy Cluster), client address",
                node.name
            ),
            prefix: outside.clone(),
            url: family.url(&ip, Some(deploy::SMOKE_NODE_PORT), "/clientip"),
            node_cgroup: None,
            expect: Expect::ClientIsNot(family.outside()),
        });
        if echo_nodes.contains(&node.name) {
            checks.push(Check {
                what: format!(
                    "{fam}: outside -> NodePort of {} (policy Local), client address",
                    node.name
                ),
                prefix: outside.clone(),
                url: family.url(&ip, Some(deploy::SMOKE_LOCAL_NODE_PORT), "/clientip"),
                node_cgroup: None,
                expect: preserved(family.outside()),
            });
        }
    }
    Ok(checks)
}

/// The client address in one answer of agnhost's `/clientip` (`ip:port`, `[ip]:port` for IPv6).
fn client_of(answer: &str) -> Option<&str> {
    let (ip, port) = answer.trim().rsplit_once(':')?;
    port.parse::<u16>().ok()?;
    Some(ip.trim_start_matches('[').trim_end_matches(']'))
}

/// Prints the client address each check's server saw; every answer must be as expected.
fn report_clients(results: &[(&str, &Expect, String)]) -> anyhow::Result<()> {
    for (what, expect, out) in results {
        let seen: Vec<&str> = out
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| client_of(l).unwrap_or(l))
            .collect();
        let mut distinct = seen.clone();
        distinct.sort_unstable();
        distinct.dedup();
        let (ok, verdict) = match expect {
            Expect::ClientIs(ip) => (seen.iter().all(|s| s == ip), "preserved"),
            Expect::ClientIsNot(ip) => (seen.iter().all(|s| s != ip), "not the client's"),
            Expect::Answered => (true, "answered"),
        };
        println!(
            "{what}: {} answers, client seen as {} ({verdict}: {})",
            seen.len(),
            distinct.join(", "),
            if ok { "as expected" } else { "NOT as expected" }
        );
        ensure!(
            seen.len() == crate::kind::SMOKE_REQUESTS,
            "{what}: expected {} answers, got {}",
            crate::kind::SMOKE_REQUESTS,
            seen.len()
        );
        ensure!(
            ok,
            "{what}: the echo server saw the client as {distinct:?}; expected {expect:?}"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_addresses_are_read_from_both_families() {
        assert_eq!(client_of("10.244.1.5:43210"), Some("10.244.1.5"));
        assert_eq!(
            client_of("[fd00:10:244:1::5]:43210"),
            Some("fd00:10:244:1::5")
        );
        assert_eq!(client_of("no address"), None);
    }

    #[test]
    fn urls_bracket_ipv6_addresses() {
        assert_eq!(
            Family::V6.url("fd00:10:96::a", Some(30080), "/hostname"),
            "http://[fd00:10:96::a]:30080/hostname"
        );
        assert_eq!(
            Family::V4.url("10.96.0.10", None, "/clientip"),
            "http://10.96.0.10/clientip"
        );
    }
}
