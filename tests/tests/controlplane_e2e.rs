//! End to end through the reference control plane: Services and Pods written to the real
//! kube-apiserver, our EndpointSlice controller turning them into slices, and the `proxy` agent
//! (kube source, userspace backend) in a node network namespace sending real connections to the
//! pod namespaces. The agent runs under exactly the ServiceAccount and ClusterRole of
//! deploy/proxy.yaml, applied with kubectl, so the real RBAC authorizer proves it needs nothing
//! more. The API server listens on the test's loopback only; the agent reaches it through a relay
//! bound inside the node namespace. Every manifest of deploy/ passes a server-side dry run.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use controllers::manager::{self, ManagerConfig};
use controlplane::{ControlPlane, Options, Relay};
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kpr_tests::agent::proxy_binary;
use kpr_tests::cluster::{ClusterSpec, CLUSTER_CIDR, ECHO_PORT, NODE_IP, NODE_NAME, SERVICE_CIDR};
use kpr_tests::{tcp_request, Cluster, Netns};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

/// The agent process; killed on drop, its log printed when the test failed.
struct AgentProcess {
    child: Child,
    dir: PathBuf,
}

impl AgentProcess {
    fn start(node: &Netns, kubeconfig: &str, dir: &Path) -> AgentProcess {
        std::fs::create_dir_all(dir).unwrap();
        let kc = dir.join("kubeconfig");
        std::fs::write(&kc, kubeconfig).unwrap();
        let log = std::fs::File::create(dir.join("agent.log")).unwrap();
        let mut cmd = node.exec(proxy_binary().unwrap()).unwrap();
        cmd.args([
            "run",
            "--backend",
            "userspace",
            "--source",
            "kube",
            "--kubeconfig",
            kc.to_str().unwrap(),
        ])
        .args([
            "--hostname-override",
            NODE_NAME,
            "--cluster-cidr",
            CLUSTER_CIDR,
        ])
        .args([
            "--service-cluster-ip-range",
            SERVICE_CIDR,
            "--nodeport-addresses",
            &format!("{NODE_IP}/32"),
        ])
        .args(["--min-sync-period", "100ms", "--sync-period", "30s"])
        .args([
            "--metrics-bind-address",
            "127.0.0.1:10249",
            "--healthz-bind-address",
            "0.0.0.0:10256",
        ])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log);
        AgentProcess {
            child: cmd.spawn().unwrap(),
            dir: dir.to_path_buf(),
        }
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(self.dir.join("agent.log")).unwrap_or_default();
            eprintln!("---- agent log ----\n{log}");
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn create_pod(client: &Client, ns: &str, name: &str, ip: &str) {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "echo"}},
        "spec": {"nodeName": NODE_NAME, "containers": [{"name": "echo", "image": "x",
                 "ports": [{"name": "http", "containerPort": ECHO_PORT}]}]}
    }))
    .unwrap();
    api.create(&PostParams::default(), &pod).await.unwrap();
    let status = json!({"status": {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap();
}

/// Which pods answered `n` connections from `ns` to `to` (None: some connection failed). Blocking
/// calls run in place so the runtime's other worker keeps serving the API.
fn tally(ns: &Netns, to: SocketAddr, n: usize) -> Option<Vec<String>> {
    tokio::task::block_in_place(|| {
        let mut pods: Vec<String> = Vec::new();
        for _ in 0..n {
            pods.push(tcp_request(ns, to, Duration::from_secs(2)).ok()?.pod);
        }
        pods.sort();
        pods.dedup();
        Some(pods)
    })
}

async fn eventually_answered_by(ns: &Netns, to: SocketAddr, want: &[&str]) {
    let start = Instant::now();
    loop {
        let got = tally(ns, to, 12);
        if got.as_deref().is_some_and(|g| g == want) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "connections to {to} answered by {got:?}, want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn workspace_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

/// The node the agent runs as, so its own Node object can be read (deploy/proxy.yaml grants it).
async fn create_node(client: &Client) {
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": NODE_NAME, "labels": {"kubernetes.io/hostname": NODE_NAME}},
        "status": {"addresses": [{"type": "InternalIP", "address": NODE_IP.to_string()}]}
    }))
    .unwrap();
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_objects_become_connections_through_controller_and_agent() {
    let cluster = Cluster::new(ClusterSpec::pods(2)).unwrap();
    // A control plane of this test's own: its API server is stopped and restarted below.
    let mut cp = ControlPlane::start(Options::minimal(controlplane::run_dir("e2e"))).unwrap();
    let client = cp.client().await.unwrap();
    let ns = cp.test_namespace("e2e").unwrap();
    create_node(&client).await;

    // The agent's identity: deploy/proxy.yaml as a user would apply it.
    cp.kubectl_run(
        &[
            "apply",
            "-f",
            workspace_file("deploy/proxy.yaml").to_str().unwrap(),
        ],
        None,
    )
    .unwrap();
    let token = cp
        .service_account_token("kube-system", "kpr-proxy")
        .unwrap();
    let in_node = cluster
        .node
        .run(|| std::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap()
        .unwrap();
    let api_addr: SocketAddr = format!("127.0.0.1:{}", cp.ports.apiserver).parse().unwrap();
    let relay = Relay::start(in_node, api_addr).unwrap();
    let agent_kubeconfig = cp
        .kubeconfig_for_token(
            "kpr-proxy.kubeconfig",
            &token,
            &format!("https://{}", relay.addr()),
        )
        .unwrap();
    // The real authorizer agrees with the manifest: what the agent needs, and nothing more.
    let can = |verb: &str, resource: &str| {
        cp.kubectl_run(
            &[
                "auth",
                "can-i",
                verb,
                resource,
                "--all-namespaces",
                "--as",
                "system:serviceaccount:kube-system:kpr-proxy",
            ],
            None,
        )
        .map(|out| out.trim() == "yes")
        .unwrap_or(false)
    };
    for (verb, resource) in [
        ("watch", "services"),
        ("watch", "endpointslices.discovery.k8s.io"),
        ("get", "nodes"),
    ] {
        assert!(can(verb, resource), "kpr-proxy may {verb} {resource}");
    }
    for (verb, resource) in [
        ("update", "services"),
        ("create", "endpointslices.discovery.k8s.io"),
        ("list", "secrets"),
        ("list", "pods"),
    ] {
        assert!(!can(verb, resource), "kpr-proxy may not {verb} {resource}");
    }

    let cfg = ManagerConfig {
        controllers: manager::parse_controllers("endpointslice").unwrap(),
        lb_pool: None,
        root_ca_file: None,
        signing: Default::default(),
        service_account_private_key_file: None,
        leader: None,
        concurrency: controllers::manager::Concurrency {
            endpoints: 4,
            ..Default::default()
        },
    };
    let mgr = tokio::spawn(manager::run(client.clone(), cfg));

    let svc: Service = serde_json::from_value(json!({"metadata": {"name": "echo"},
        "spec": {"selector": {"app": "echo"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}))
    .unwrap();
    let svc = Api::<Service>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    let vip: std::net::IpAddr = svc.spec.unwrap().cluster_ip.unwrap().parse().unwrap();
    for p in &cluster.pods {
        create_pod(&client, &ns, &p.name, &p.ip.to_string()).await;
    }
    let dir = cp.dir.join("agent");
    let kubeconfig = std::fs::read_to_string(&agent_kubeconfig).unwrap();
    let agent = AgentProcess::start(&cluster.node, &kubeconfig, &dir);

    let to = SocketAddr::new(vip, 80);
    eventually_answered_by(&cluster.podclient, to, &["pod0", "pod1"]).await;

    // Deleting a Pod through the API takes it out of rotation on the node.
    Api::<Pod>::namespaced(client.clone(), &ns)
        .delete("pod1", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    eventually_answered_by(&cluster.podclient, to, &["pod0"]).await;

    // Under the ServiceAccount of deploy/proxy.yaml, nothing the agent asked for was refused. Checked
    // before the restart below: a restarted API server may refuse requests (403) for the moment
    // between accepting connections and its authorizer's caches filling, which says nothing
    // about the manifest's RBAC.
    let log = std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
    assert!(
        !log.contains("forbidden") && !log.contains("Forbidden"),
        "the agent was refused something under its own RBAC:\n{log}"
    );

    // The API server stops (every watch cut, every request refused): the node keeps serving the
    // last programmed state, and follows again once the server is back.
    cp.stop_apiserver();
    assert_eq!(
        tally(&cluster.podclient, to, 6).as_deref(),
        Some(&["pod0".to_string()][..]),
        "served during the outage"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        tally(&cluster.podclient, to, 6).as_deref(),
        Some(&["pod0".to_string()][..]),
        "still served, seconds into the outage"
    );
    cp.start_apiserver().unwrap();
    let client = cp.client().await.unwrap();
    create_pod(&client, &ns, "pod1", &cluster.pods[1].ip.to_string()).await;
    eventually_answered_by(&cluster.podclient, to, &["pod0", "pod1"]).await;
    mgr.abort();
    drop(agent);
}

/// Every manifest of deploy/ is accepted by the real API server's validation and admission
/// (`kubectl apply --dry-run=server`); the kind-config*.yaml files are kind's own configuration, not
/// API objects, and are parsed by xtask/tests/deploy_manifests.rs instead. A dry run creates nothing, so
/// the namespace smoke.yaml declares for its other objects is created first.
#[test]
fn every_deploy_manifest_passes_a_server_side_dry_run() {
    let cp = controlplane::shared().unwrap();
    cp.create_namespace("kpr-smoke").unwrap();
    let mut checked = Vec::new();
    for entry in std::fs::read_dir(workspace_file("deploy")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.ends_with(".yaml") || name.starts_with("kind-config") {
            continue;
        }
        let out = cp
            .kubectl_run(
                &["apply", "--dry-run=server", "-f", path.to_str().unwrap()],
                None,
            )
            .unwrap_or_else(|e| panic!("{name}: {e:#}"));
        assert!(out.contains("(server dry run)"), "{name}: {out}");
        checked.push(name);
    }
    checked.sort();
    assert_eq!(
        checked,
        [
            "cleanup.yaml",
            "controller-manager.yaml",
            "kube-proxy-cleanup.yaml",
            "proxy.yaml",
            "scheduler.yaml",
            "smoke.yaml",
            "workload-controllers.yaml"
        ]
    );
}
