//! Root test: `proxy trace --backend nftables` against real traffic. An nftables agent runs in a
//! test cluster's node namespace; for each Service kind, what `proxy trace` (run in the node's
//! namespace) reports is compared with where connections from the pod client really went: the
//! endpoint set of a round-robin Service, a single endpoint, a session-affinity entry, a reject,
//! and a drop. Every namespace is the test's own.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use kpr_tests::agent::proxy_binary;
use kpr_tests::cluster::PODCLIENT_IP;
use kpr_tests::{tcp_request, yaml, Agent, AgentOptions, ClientError, Cluster, ClusterSpec};
use kpr_tests::{EndpointSlice, Service};

/// `proxy trace --backend nftables SRC DST` in the node's namespace: its output.
fn trace(cluster: &Cluster, dst: &str) -> String {
    let out = cluster
        .node
        .exec(proxy_binary().unwrap())
        .unwrap()
        .args([
            "trace",
            "--backend",
            "nftables",
            &PODCLIENT_IP.to_string(),
            dst,
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "proxy trace {dst}: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

fn decision(text: &str) -> &str {
    text.lines()
        .find_map(|l| l.strip_prefix("decision: "))
        .unwrap_or_else(|| panic!("no decision in:\n{text}"))
}

/// Where a connection from the pod client to `dst` was answered (the endpoint's address).
fn answered_by(cluster: &Cluster, dst: &str) -> Result<SocketAddr, ClientError> {
    let reply = tcp_request(
        &cluster.podclient,
        dst.parse().unwrap(),
        Duration::from_secs(2),
    )?;
    let pod = cluster
        .pod(&reply.pod)
        .expect("a pod of the cluster answered");
    Ok(SocketAddr::new(
        IpAddr::V4(pod.ip),
        kpr_tests::cluster::ECHO_PORT,
    ))
}

#[test]
fn trace_names_where_connections_go() {
    let cluster = Cluster::new(ClusterSpec::pods(2)).unwrap();
    let [p0, p1] = [cluster.pods[0].ip, cluster.pods[1].ip];
    let web = Service::new("web").cluster_ip("10.96.0.10").tcp(80, 8080);
    let web_eps = EndpointSlice::for_service(&web).ready_all([p0, p1]);
    let single = Service::new("single")
        .cluster_ip("10.96.0.13")
        .tcp(80, 8080);
    let single_eps = EndpointSlice::for_service(&single).ready(p1);
    let sticky = Service::new("sticky")
        .cluster_ip("10.96.0.12")
        .tcp(80, 8080)
        .affinity(600);
    let sticky_eps = EndpointSlice::for_service(&sticky).ready_all([p0, p1]);
    let empty = Service::new("empty").cluster_ip("10.96.0.11").tcp(80, 8080);
    let files = [(
        "svc.yaml",
        yaml(&[
            &web,
            &web_eps,
            &single,
            &single_eps,
            &sticky,
            &sticky_eps,
            &empty,
        ]),
    )];
    let agent = Agent::start(&cluster.node, &AgentOptions::backend("nftables"), &files).unwrap();
    agent
        .wait_for("the four Services", Duration::from_secs(10), |s| {
            s.services.len() >= 4
        })
        .unwrap();
    let (e0, e1) = (format!("{p0}:8080"), format!("{p1}:8080"));

    // Round robin over both endpoints: every connection lands on one of those trace names.
    let text = trace(&cluster, "10.96.0.10:80");
    assert!(text.contains("-> from_pod"), "{text}");
    assert_eq!(
        decision(&text),
        format!("dnat to one of {e0}, {e1} (round robin over 2 slots)")
    );
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..4 {
        seen.insert(answered_by(&cluster, "10.96.0.10:80").unwrap().to_string());
    }
    assert_eq!(
        seen,
        [e0.clone(), e1.clone()].into(),
        "both traced endpoints answer"
    );

    // One endpoint: trace names it, and it answers.
    let text = trace(&cluster, "10.96.0.13:80");
    assert_eq!(decision(&text), format!("dnat to {e1} (its only endpoint)"));
    assert_eq!(
        answered_by(&cluster, "10.96.0.13:80").unwrap().to_string(),
        e1
    );

    // Session affinity: before any connection the client has no entry; after one, trace names
    // the endpoint it got, and the next connection goes there too.
    let text = trace(&cluster, "10.96.0.12:80");
    assert!(text.contains("no entry for"), "{text}");
    let first = answered_by(&cluster, "10.96.0.12:80").unwrap();
    let text = trace(&cluster, "10.96.0.12:80");
    assert_eq!(
        decision(&text),
        format!("dnat to {first} (session affinity)"),
        "{text}"
    );
    assert_eq!(answered_by(&cluster, "10.96.0.12:80").unwrap(), first);

    // No endpoint: rejected, and the connection is refused.
    let text = trace(&cluster, "10.96.0.11:80");
    assert_eq!(
        decision(&text),
        "reject (the Service has no usable endpoint)"
    );
    assert!(
        matches!(
            answered_by(&cluster, "10.96.0.11:80"),
            Err(ClientError::Refused | ClientError::Reset)
        ),
        "an empty Service is rejected"
    );

    // An address of the Service CIDR no Service has: dropped, the connection gets no answer.
    let text = trace(&cluster, "10.96.0.99:80");
    assert_eq!(
        decision(&text),
        "drop (an unallocated address of the Service CIDR)"
    );
    let unanswered = answered_by(&cluster, "10.96.0.99:80");
    assert!(
        matches!(unanswered, Err(ClientError::Timeout)),
        "{unanswered:?}"
    );
    drop(agent);
}
