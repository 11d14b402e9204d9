//! NodePorts (PreFilter, Filter): a Pod asking for host ports fits a node only if none of them
//! is in use there (same protocol and port, on the same host IP or where either side binds
//! 0.0.0.0), as upstream v1.34's `nodeports` plugin. Reads the Pod's ports (containers and
//! sidecar init containers) and the node's used ports; preemption needs no PreFilter extension
//! because the state is only the Pod's own ports.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use crate::scheduler::framework::types::{host_ports, HostPort};
use crate::scheduler::framework::{
    CycleState, FilterPlugin, NodeInfo, Plugin, PreFilterPlugin, PreFilterResult, Snapshot, Status,
};

pub const NAME: &str = "NodePorts";

const PRE_FILTER_STATE_KEY: &str = "PreFilterNodePorts";

/// Upstream's ErrReason.
pub const ERR_REASON: &str = "node(s) didn't have free ports for the requested pod ports";

/// Binding to this host IP takes the port on every address.
const BIND_ALL: &str = "0.0.0.0";

/// The plugin; it has no arguments.
#[derive(Debug, Default)]
pub struct NodePorts;

impl NodePorts {
    /// The plugin has no arguments; any given are ignored, as upstream ignores them.
    pub fn new() -> Self {
        NodePorts
    }
}

/// The Pod's host ports, computed once per Pod.
#[derive(Debug, Clone)]
struct PreFilterState(Arc<[HostPort]>);

fn protocol(p: &str) -> &str {
    if p.is_empty() {
        "TCP"
    } else {
        p
    }
}

/// Whether `want` conflicts with a port in use (`HostPortInfo.CheckConflict`): same protocol and
/// port, and either `want` binds 0.0.0.0 or the used port is on 0.0.0.0 or on the same IP.
fn conflicts(want: &HostPort, used: &[HostPort]) -> bool {
    if want.port <= 0 {
        return false;
    }
    let want_ip = if want.ip.is_empty() {
        BIND_ALL
    } else {
        &want.ip
    };
    let want_proto = protocol(&want.protocol);
    used.iter().any(|u| {
        u.port == want.port
            && protocol(&u.protocol) == want_proto
            && (want_ip == BIND_ALL || u.ip.is_empty() || u.ip == BIND_ALL || u.ip == want_ip)
    })
}

/// Whether the node has all of these host ports free (upstream `fitsPorts`).
pub fn fits_ports(want: &[HostPort], node: &NodeInfo) -> bool {
    !want.iter().any(|w| conflicts(w, &node.used_ports))
}

/// Whether the Pod's host ports are free on the node (upstream `nodeports.Fits`).
pub fn fits(pod: &Pod, node: &NodeInfo) -> bool {
    fits_ports(&host_ports(pod), node)
}

impl Plugin for NodePorts {
    fn name(&self) -> &'static str {
        NAME
    }
}

impl PreFilterPlugin for NodePorts {
    fn pre_filter(
        &self,
        state: &mut CycleState,
        pod: &Pod,
        _snapshot: &Snapshot,
    ) -> (Option<PreFilterResult>, Status) {
        let ports = host_ports(pod);
        if ports.is_empty() {
            return (None, Status::skip());
        }
        state.write(PRE_FILTER_STATE_KEY, PreFilterState(ports.into()));
        (None, Status::success())
    }
}

impl FilterPlugin for NodePorts {
    fn filter(&self, state: &CycleState, _pod: &Pod, node: &NodeInfo) -> Status {
        let Some(s) = state.read::<PreFilterState>(PRE_FILTER_STATE_KEY) else {
            return Status::error(format!(
                "reading {PRE_FILTER_STATE_KEY:?} from cycleState: not found"
            ));
        };
        if fits_ports(&s.0, node) {
            Status::success()
        } else {
            Status::unschedulable(ERR_REASON)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::plugins::helper::test_util::*;
    use serde_json::{json, Value};

    /// A Pod with one container using these "PROTO/IP/PORT" host ports.
    fn with_ports(name: &str, ports: &[&str]) -> Pod {
        let ports: Vec<Value> = ports
            .iter()
            .map(|p| {
                let parts: Vec<&str> = p.split('/').collect();
                let port: i32 = parts[2].parse().unwrap();
                json!({"containerPort": port, "hostPort": port, "protocol": parts[0], "hostIP": parts[1]})
            })
            .collect();
        pod(json!({"metadata": {"name": name, "uid": name},
                   "spec": {"containers": [{"name": "c", "ports": ports}]}}))
    }

    // Upstream TestNodePorts: the Pod, the ports in use on the node, the Filter result.
    #[test]
    fn filter_per_node() {
        let conflict = || {
            vec![status(
                crate::scheduler::framework::Code::Unschedulable,
                &[ERR_REASON],
            )]
        };
        let cases: Vec<(&str, Pod, Vec<&str>, Vec<Status>)> = vec![
            (
                "other port",
                with_ports("m1", &["UDP/127.0.0.1/8080"]),
                vec!["UDP/127.0.0.1/9090"],
                vec![ok()],
            ),
            (
                "same udp port",
                with_ports("m1", &["UDP/127.0.0.1/8080"]),
                vec!["UDP/127.0.0.1/8080"],
                conflict(),
            ),
            (
                "same tcp port",
                with_ports("m1", &["TCP/127.0.0.1/8080"]),
                vec!["TCP/127.0.0.1/8080"],
                conflict(),
            ),
            (
                "different host ip",
                with_ports("m1", &["TCP/127.0.0.1/8080"]),
                vec!["TCP/127.0.0.2/8080"],
                vec![ok()],
            ),
            (
                "different protocol",
                with_ports("m1", &["UDP/127.0.0.1/8080"]),
                vec!["TCP/127.0.0.1/8080"],
                vec![ok()],
            ),
            (
                "second udp port conflict",
                with_ports("m1", &["UDP/127.0.0.1/8000", "UDP/127.0.0.1/8080"]),
                vec!["UDP/127.0.0.1/8080"],
                conflict(),
            ),
            (
                "first tcp port conflict",
                with_ports("m1", &["TCP/127.0.0.1/8001", "UDP/127.0.0.1/8080"]),
                vec!["TCP/127.0.0.1/8001", "UDP/127.0.0.1/8081"],
                conflict(),
            ),
            (
                "conflict due to the Pod's 0.0.0.0",
                with_ports("m1", &["TCP/0.0.0.0/8001"]),
                vec!["TCP/127.0.0.1/8001"],
                conflict(),
            ),
            (
                "conflict due to the Pod's second port on 0.0.0.0",
                with_ports("m1", &["TCP/10.0.10.10/8001", "TCP/0.0.0.0/8001"]),
                vec!["TCP/127.0.0.1/8001"],
                conflict(),
            ),
            (
                "conflict with 0.0.0.0 in use",
                with_ports("m1", &["TCP/127.0.0.1/8001"]),
                vec!["TCP/0.0.0.0/8001"],
                conflict(),
            ),
            (
                "0.0.0.0 in use, other protocol",
                with_ports("m1", &["UDP/127.0.0.1/8001"]),
                vec!["TCP/0.0.0.0/8001"],
                vec![ok()],
            ),
            (
                "UDP conflict with 0.0.0.0 in use",
                with_ports("m1", &["UDP/127.0.0.1/8001"]),
                vec!["TCP/0.0.0.0/8001", "UDP/0.0.0.0/8001"],
                conflict(),
            ),
            (
                "an empty host IP means 0.0.0.0",
                with_ports("m1", &["TCP//8001"]),
                vec!["TCP/127.0.0.1/8001"],
                conflict(),
            ),
            (
                "a sidecar init container's host port counts",
                pod(
                    json!({"spec": {"initContainers": [{"name": "s", "restartPolicy": "Always",
                    "ports": [{"containerPort": 8001, "hostPort": 8001, "protocol": "TCP"}]}]}}),
                ),
                vec!["TCP/0.0.0.0/8001"],
                conflict(),
            ),
        ];
        for (name, p, used, want) in cases {
            let existing = with_ports("existing", &used);
            let snap = snapshot(vec![node_info(node("n1", json!({})), vec![existing])]);
            assert_eq!(
                run_filter(Some(&NodePorts), &NodePorts, &p, &snap),
                want,
                "{name}"
            );
            assert_eq!(
                fits(&p, &snap.nodes[0]),
                want[0].is_success(),
                "{name}: fits"
            );
        }
    }

    #[test]
    fn prefilter_skips_pods_without_host_ports() {
        let cases = [
            ("no ports", pod(json!({}))),
            (
                "container port without host port",
                pod(
                    json!({"spec": {"containers": [{"name": "c", "ports": [{"containerPort": 80}]}]}}),
                ),
            ),
            (
                "a non-sidecar init container's host port does not count",
                pod(json!({"spec": {"initContainers": [{"name": "i",
                    "ports": [{"containerPort": 8001, "hostPort": 8001}]}]}})),
            ),
        ];
        for (name, p) in cases {
            let (_, s) = NodePorts.pre_filter(&mut CycleState::new(), &p, &Snapshot::default());
            assert!(s.is_skip(), "{name}: {s}");
        }
    }
}
