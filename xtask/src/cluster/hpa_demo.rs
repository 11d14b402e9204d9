//! `cargo xtask cluster hpa-demo`: the HorizontalPodAutoscaler on real metrics, on a cluster up
//! with `--nodes N --metrics-server`. A Deployment of upstream's resource-consumer image (CPU
//! request 100m) and an autoscaling/v2 HPA at 50 % CPU utilization (1 to 5 replicas, scale-down
//! stabilization window shortened to 60 s so the demo ends in minutes); CPU load driven as
//! upstream's e2e ResourceConsumer drives it (POST `/ConsumeCPU` through the API server's Pod
//! proxy, the total split evenly over the Ready Pods, renewed every period), then stopped. Prints
//! the replicas and the HPA's status over time and the HPA's Events, and writes them as Markdown
//! to `<cluster dir>/hpa-demo.md`. Whoever runs the HPA controller (kube-controller-manager or
//! kpr's controller-manager) is what is shown: run it on one cluster of each, side by side.
//!
//! Owns the `hpa-demo` namespace (deleted first and at the end).

use std::fmt::Write as _;
use std::fs;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::Args;
use serde_json::Value;

use super::switch::Live;
use super::Cluster;
use crate::exec::Cmd;

const NAMESPACE: &str = "hpa-demo";
const NAME: &str = "consumer";
const IMAGE: &str = "registry.k8s.io/e2e-test-images/resource-consumer:1.13";

#[derive(Debug, Args)]
pub struct HpaDemoArgs {
    /// Total CPU load while loaded, in millicores, split over the Ready Pods (with 100m requests
    /// and a 50 % target, 250 asks for 5 Pods).
    #[arg(long, default_value_t = 250)]
    pub millicores: u32,
    /// How long the load runs, in seconds.
    #[arg(long, default_value_t = 240)]
    pub load_seconds: u64,
    /// How long to watch after the load stops, at most, in seconds (the demo ends early once the
    /// HPA is back at minReplicas).
    #[arg(long, default_value_t = 300)]
    pub idle_seconds: u64,
}

/// How often the load is renewed (each request consumes for this long) and a row is recorded.
const PERIOD: Duration = Duration::from_secs(15);

fn manifest() -> String {
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: {NAME}
  namespace: {NAMESPACE}
spec:
  replicas: 1
  selector:
    matchLabels: {{app: {NAME}}}
  template:
    metadata:
      labels: {{app: {NAME}}}
    spec:
      containers:
      - name: {NAME}
        image: {IMAGE}
        imagePullPolicy: IfNotPresent
        ports: [{{containerPort: 8080}}]
        readinessProbe:
          tcpSocket: {{port: 8080}}
          periodSeconds: 2
        resources:
          requests: {{cpu: 100m, memory: 50Mi}}
          limits: {{cpu: 500m, memory: 200Mi}}
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: {NAME}
  namespace: {NAMESPACE}
spec:
  scaleTargetRef: {{apiVersion: apps/v1, kind: Deployment, name: {NAME}}}
  minReplicas: 1
  maxReplicas: 5
  metrics:
  - type: Resource
    resource:
      name: cpu
      target: {{type: Utilization, averageUtilization: 50}}
  behavior:
    scaleDown:
      stabilizationWindowSeconds: 60
"#
    )
}

struct Kube<'a> {
    live: &'a Live,
}

impl Kube<'_> {
    fn run(&self, args: &[&str]) -> anyhow::Result<String> {
        Cmd::new(crate::k8s::bin_dir().join("kubectl"))
            .arg("--kubeconfig")
            .arg(&self.live.kubeconfig)
            .args(args)
            .quiet()
            .read()
    }

    fn json(&self, args: &[&str]) -> anyhow::Result<Value> {
        let mut full = args.to_vec();
        full.extend(["-o", "json"]);
        Ok(serde_json::from_str(&self.run(&full)?)?)
    }
}

/// One observation.
struct Row {
    at: u64,
    phase: &'static str,
    load_per_pod: u32,
    ready: usize,
    spec_replicas: i64,
    utilization: String,
    desired: i64,
}

pub fn run(cluster: &Cluster, args: &HpaDemoArgs) -> anyhow::Result<()> {
    let live = Live::open(cluster)?;
    let state = super::read_state(cluster)?;
    if state["metrics_server"].as_bool() != Some(true) {
        bail!(
            "cluster {0} runs no metrics-server: `cargo xtask cluster --name {0} up --nodes N \
             --metrics-server`",
            cluster.name
        );
    }
    let kube = Kube { live: &live };
    let _ = kube.run(&["delete", "namespace", NAMESPACE, "--wait=true"]);
    kube.run(&["create", "namespace", NAMESPACE])?;
    let path = cluster.dir.join("hpa-demo.yaml");
    fs::write(&path, manifest())?;
    kube.run(&["apply", "-f", &path.display().to_string()])?;
    kube.run(&[
        "-n",
        NAMESPACE,
        "rollout",
        "status",
        &format!("deployment/{NAME}"),
        "--timeout=180s",
    ])?;
    println!(
        "[ok] {NAME} ready; {} m of load for {} s",
        args.millicores, args.load_seconds
    );
    let started = Instant::now();
    let mut rows = Vec::new();
    let load_until = Duration::from_secs(args.load_seconds);
    let end = load_until + Duration::from_secs(args.idle_seconds);
    let mut at_min_since: Option<Duration> = None;
    loop {
        let elapsed = started.elapsed();
        let loading = elapsed < load_until;
        let pods = ready_pods(&kube)?;
        let per_pod = if loading && !pods.is_empty() {
            args.millicores / pods.len() as u32
        } else {
            0
        };
        if per_pod > 0 {
            for pod in &pods {
                // Upstream's ResourceConsumer posts through the API server's proxy too.
                let uri = format!(
                    "/api/v1/namespaces/{NAMESPACE}/pods/{pod}:8080/proxy/ConsumeCPU?millicores={per_pod}&durationSec={}",
                    PERIOD.as_secs()
                );
                if let Err(e) = kube.run(&["create", "--raw", &uri, "-f", "/dev/null"]) {
                    println!("[warn] ConsumeCPU on {pod}: {e:#}");
                }
            }
        }
        let hpa = kube.json(&["-n", NAMESPACE, "get", "hpa", NAME])?;
        let deployment = kube.json(&["-n", NAMESPACE, "get", "deployment", NAME])?;
        let utilization = hpa["status"]["currentMetrics"][0]["resource"]["current"]
            ["averageUtilization"]
            .as_i64()
            .map_or("-".to_string(), |u| format!("{u} %"));
        let row = Row {
            at: elapsed.as_secs(),
            phase: if loading { "load" } else { "idle" },
            load_per_pod: per_pod,
            ready: pods.len(),
            spec_replicas: deployment["spec"]["replicas"].as_i64().unwrap_or(-1),
            utilization,
            desired: hpa["status"]["desiredReplicas"].as_i64().unwrap_or(-1),
        };
        println!(
            "t={:>4}s {} load/pod={:>3}m ready={} replicas={} cpu={} desired={}",
            row.at,
            row.phase,
            row.load_per_pod,
            row.ready,
            row.spec_replicas,
            row.utilization,
            row.desired
        );
        let at_min = !loading && row.spec_replicas == 1 && row.ready == 1;
        rows.push(row);
        at_min_since = match (at_min, at_min_since) {
            (true, None) => Some(elapsed),
            (true, since) => since,
            (false, _) => None,
        };
        // Back at minReplicas for two periods after the load: done.
        if at_min_since.is_some_and(|since| elapsed - since >= 2 * PERIOD) || elapsed >= end {
            break;
        }
        let next = PERIOD * (rows.len() as u32);
        if let Some(wait) = next.checked_sub(started.elapsed()) {
            std::thread::sleep(wait);
        }
    }
    let events = kube.run(&[
        "-n",
        NAMESPACE,
        "get",
        "events",
        "--field-selector",
        &format!("involvedObject.kind=HorizontalPodAutoscaler,involvedObject.name={NAME}"),
        "--sort-by=.firstTimestamp",
        "-o",
        "custom-columns=FIRST:.firstTimestamp,COUNT:.count,REASON:.reason,SOURCE:.source.component,MESSAGE:.message",
    ])?;
    let max = rows.iter().map(|r| r.spec_replicas).max().unwrap_or(0);
    let last = rows.last().map_or(0, |r| r.spec_replicas);
    let mut report = String::new();
    writeln!(
        report,
        "cluster {} ({}): {} m total for {} s, then none; max replicas {max}, last {last}\n",
        cluster.name,
        controllers_of(&state),
        args.millicores,
        args.load_seconds
    )?;
    writeln!(
        report,
        "| t (s) | phase | load per Pod (m) | Ready Pods | replicas | HPA CPU | desired |"
    )?;
    writeln!(report, "|---|---|---|---|---|---|---|")?;
    for r in &rows {
        writeln!(
            report,
            "| {} | {} | {} | {} | {} | {} | {} |",
            r.at, r.phase, r.load_per_pod, r.ready, r.spec_replicas, r.utilization, r.desired
        )?;
    }
    writeln!(report, "\nEvents of the HPA:\n\n```\n{}```", events)?;
    let out = cluster.dir.join("hpa-demo.md");
    fs::write(&out, &report).with_context(|| format!("writing {}", out.display()))?;
    println!("{report}\n(written to {})", out.display());
    let _ = kube.run(&["delete", "namespace", NAMESPACE, "--wait=false"]);
    if max <= 1 {
        bail!("the HPA never scaled {NAME} up under load");
    }
    if last != 1 {
        bail!("the HPA did not scale {NAME} back to 1 after the load (last {last})");
    }
    Ok(())
}

/// The names of the Deployment's Ready Pods.
fn ready_pods(kube: &Kube) -> anyhow::Result<Vec<String>> {
    let list = kube.json(&["-n", NAMESPACE, "get", "pods", "-l", &format!("app={NAME}")])?;
    Ok(list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .filter(|p| {
            p["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string))
        .collect())
}

/// Who runs the controllers, from the processes state.json lists.
fn controllers_of(state: &Value) -> &'static str {
    let kpr = state["processes"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|p| p["name"] == "kpr-controller-manager");
    if kpr {
        "kpr's controller-manager"
    } else {
        "kube-controller-manager"
    }
}
