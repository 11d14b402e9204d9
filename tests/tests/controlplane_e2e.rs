//! End to end through the control plane: Services and Pods written to the test API server, the
//! EndpointSlice controller turning them into slices, and the `proxy` agent (kube source, userspace
//! backend) in a node network namespace sending real connections to the pod namespaces.
//!
//! The API server listens twice: on the test's loopback (for the test and the controller) and on a
//! socket bound inside the node namespace (for the agent), both serving the same objects.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use controllers::manager::{self, ControllerKind, ManagerConfig};
use k8s_openapi::api::core::v1::{Pod, Service};
use kpr_tests::agent::proxy_binary;
use kpr_tests::cluster::{ClusterSpec, CLUSTER_CIDR, ECHO_PORT, NODE_IP, NODE_NAME, SERVICE_CIDR};
use kpr_tests::{tcp_request, Cluster, Netns};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use test_apiserver::TestApiServer;

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

async fn create_pod(client: &Client, name: &str, ip: &str) {
    let api: Api<Pod> = Api::namespaced(client.clone(), "default");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_objects_become_connections_through_controller_and_agent() {
    let cluster = Cluster::new(ClusterSpec::pods(2)).unwrap();
    let srv = TestApiServer::start().await.unwrap();
    let in_node = cluster
        .node
        .run(|| std::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap()
        .unwrap();
    let node_url = srv.serve_also(in_node).unwrap();
    let client = srv.client().unwrap();
    let cfg = ManagerConfig {
        controllers: vec![ControllerKind::EndpointSlice],
        lb_pool: None,
        leader: None,
        concurrency: 4,
    };
    let mgr = tokio::spawn(manager::run(client.clone(), cfg));

    let svc: Service = serde_json::from_value(json!({"metadata": {"name": "echo"},
        "spec": {"selector": {"app": "echo"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}))
    .unwrap();
    let svc = Api::<Service>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    let vip: std::net::IpAddr = svc.spec.unwrap().cluster_ip.unwrap().parse().unwrap();
    for p in &cluster.pods {
        create_pod(&client, &p.name, &p.ip.to_string()).await;
    }
    let dir = std::env::temp_dir().join(format!("kpr-cp-e2e-{}", std::process::id()));
    let _agent = AgentProcess::start(&cluster.node, &srv.kubeconfig_for(&node_url), &dir);

    let to = SocketAddr::new(vip, 80);
    eventually_answered_by(&cluster.podclient, to, &["pod0", "pod1"]).await;

    // Deleting a Pod through the API takes it out of rotation on the node.
    Api::<Pod>::namespaced(client.clone(), "default")
        .delete("pod1", &DeleteParams::default())
        .await
        .unwrap();
    eventually_answered_by(&cluster.podclient, to, &["pod0"]).await;

    // The API server goes away (every request 500, every watch cut): the node keeps serving the
    // last programmed state, and follows again once the server is back.
    let faults = srv.faults();
    faults.fail_for(Duration::from_secs(3));
    faults.drop_watches();
    assert_eq!(
        tally(&cluster.podclient, to, 6).as_deref(),
        Some(&["pod0".to_string()][..]),
        "served during the outage"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    create_pod(&client, "pod1", &cluster.pods[1].ip.to_string()).await;
    eventually_answered_by(&cluster.podclient, to, &["pod0", "pod1"]).await;
    mgr.abort();
}
