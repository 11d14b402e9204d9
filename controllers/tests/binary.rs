//! The `controller-manager` binary against the reference kube-apiserver (etcd behind it, TLS,
//! RBAC; one control plane for this test binary): two processes with `--leader-elect`, one leads
//! (the `kpr-controller-manager` Lease in kube-system) and writes EndpointSlices; killing it hands
//! the Lease to the other (which runs with `--kube-api-qps`); SIGTERM makes the leader release the
//! Lease and exit cleanly.
//!
//! The processes use the admin kubeconfig; running under the ServiceAccount and RBAC of
//! deploy/controller-manager.yaml is `controller_manager_rbac.rs`. The
//! test acts as the kubelet (writes Pod status); assertions are about its own namespace.

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use tokio::process::{Child, Command};

/// How long any one expected state may take to appear.
const WAIT: Duration = Duration::from_secs(60);

/// One controller-manager, its output in `<logs>/controller-manager-<identity>.log` (where the
/// test's [`controlplane::PanicGuard`] reads it).
fn spawn(kubeconfig: &Path, logs: &Path, identity: &str, extra: &[&str]) -> Child {
    let log = std::fs::File::create(logs.join(format!("controller-manager-{identity}.log")))
        .expect("creating the controller-manager's log");
    Command::new(env!("CARGO_BIN_EXE_controller-manager"))
        .args([
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--controllers",
            "endpointslice,endpoints",
        ])
        .args([
            "--leader-elect",
            "--leader-elect-namespace",
            "kube-system",
            "--leader-elect-identity",
            identity,
        ])
        .args([
            "--leader-elect-lease-duration",
            "2s",
            "--leader-elect-renew-deadline",
            "1500ms",
            "--leader-elect-retry-period",
            "200ms",
        ])
        .args(extra)
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("spawning controller-manager")
}

async fn holder(client: &Client) -> Option<String> {
    let lease = Api::<Lease>::namespaced(client.clone(), "kube-system")
        .get_opt("kpr-controller-manager")
        .await
        .ok()??;
    lease.spec?.holder_identity
}

async fn wait_for<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !f().await {
        assert!(start.elapsed() < WAIT, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A Service and one Pod behind it, Running and Ready at `ip` (status written as a kubelet would).
async fn service_with_pod(client: &Client, ns: &str, name: &str, ip: &str) {
    let svc: Service = serde_json::from_value(json!({"metadata": {"name": name},
        "spec": {"selector": {"app": name}, "ports": [{"port": 80}]}}))
    .unwrap();
    Api::<Service>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    // The Pod's Node exists, as on a real cluster: a Pod on an unknown Node gets no endpoint.
    let node_name = format!("{ns}-node");
    let node: Node = serde_json::from_value(json!({"metadata": {"name": node_name}})).unwrap();
    match Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("creating Node {node_name}: {e}"),
    }
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": name, "labels": {"app": name}},
        "spec": {"nodeName": node_name, "containers": [{"name": "c", "image": "registry.invalid/app:1"}]}}))
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let status = json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": "True"}]}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap();
}

async fn has_endpoint(client: &Client, ns: &str, svc: &str, ip: &str) -> bool {
    let lp = ListParams::default().labels(&format!("kubernetes.io/service-name={svc}"));
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), ns)
        .list(&lp)
        .await
        .unwrap()
        .items;
    slices
        .iter()
        .flat_map(|s| s.endpoints.iter())
        .any(|e| e.addresses == [ip])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_binaries_elect_one_leader_and_fail_over() {
    let cp = controlplane::shared().unwrap();
    let ns = cp.test_namespace("binary").unwrap();
    let client = cp.client().await.unwrap();
    let logs = cp.logs_dir();
    // Either process panicking fails the test, caught and retried or not.
    let panics = cp.panic_guard("two_binaries_elect_one_leader_and_fail_over");

    let kubeconfig = cp.admin_kubeconfig();
    let mut a = spawn(kubeconfig, &logs, "cm-a", &[]);
    wait_for("cm-a to lead", || async {
        holder(&client).await.as_deref() == Some("cm-a")
    })
    .await;
    // The second runs with a client rate limit: its leader election and controllers work
    // through it as they do without one.
    let mut b = spawn(
        kubeconfig,
        &logs,
        "cm-b",
        &["--kube-api-qps", "50", "--kube-api-burst", "10"],
    );
    service_with_pod(&client, &ns, "first", "10.1.0.1").await;
    wait_for("an EndpointSlice written by the leader", || {
        has_endpoint(&client, &ns, "first", "10.1.0.1")
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        holder(&client).await.as_deref(),
        Some("cm-a"),
        "the follower does not steal a renewed lease"
    );
    assert!(
        b.try_wait().unwrap().is_none(),
        "the follower keeps waiting"
    );

    a.kill().await.unwrap();
    wait_for("cm-b to take over", || async {
        holder(&client).await.as_deref() == Some("cm-b")
    })
    .await;
    service_with_pod(&client, &ns, "second", "10.1.0.2").await;
    wait_for("an EndpointSlice written by the new leader", || {
        has_endpoint(&client, &ns, "second", "10.1.0.2")
    })
    .await;

    // SIGTERM makes the leader release the Lease and exit cleanly.
    let pid = pid_of(&b);
    send_sigterm(pid);
    let status = tokio::time::timeout(Duration::from_secs(10), b.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "controller-manager exit status {status}");
    assert_eq!(
        holder(&client).await,
        None,
        "the Lease was released on shutdown"
    );
    panics.finish();
}

fn pid_of(c: &Child) -> i32 {
    i32::try_from(c.id().expect("child still running")).unwrap()
}

fn send_sigterm(pid: i32) {
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}
