//! `cargo xtask cluster statefulset-demo`: a StatefulSet keeps its data, on a cluster up with
//! `--nodes N --local-path` (kind's default storage: local-path-provisioner, StorageClass
//! `standard`, WaitForFirstConsumer, reclaim Delete). The Kubernetes tutorial's StatefulSet
//! ("StatefulSet Basics": headless Service `nginx`, StatefulSet `web`, 3 replicas of nginx, a
//! 1Gi claim `www` each from `volumeClaimTemplates`, the default class) and then, each step
//! timed and checked:
//!
//! 1. the 3 replicas Ready, each claim Bound to a volume with node affinity to its Pod's node,
//!    whose directory is on that node (`<cluster dir>/nodes/<node>/local-path-provisioner`, each
//!    node's own /var/local-path-provisioner) and on no other;
//! 2. each replica writes its name and a token to its volume (nginx's index.html); its Pod is
//!    deleted; the new Pod lands on the node of its volume, and nginx serves the file back
//!    (through the API server's Pod proxy);
//! 3. scale to 1 and back to 3: the claims stay (retention policy Retain), web-1 and web-2 find
//!    their files again;
//! 4. `persistentVolumeClaimRetentionPolicy.whenScaled: Delete`, scale to 1: the claims of web-1
//!    and web-2 are deleted, their volumes too (reclaim Delete) and their directories on the
//!    nodes;
//! 5. the namespace deleted: web-0's claim goes with it, and its volume and directory too.
//!
//! Whoever runs the controllers and the scheduler is what is shown: run it on one cluster of
//! each, side by side. Writes the table as Markdown to `<cluster dir>/statefulset-demo.md`.
//!
//! Owns the `sts-demo` namespace (deleted first and at the end).

use std::fmt::Write as _;
use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use serde_json::Value;

use super::switch::Live;
use super::Cluster;
use crate::exec::Cmd;

const NAMESPACE: &str = "sts-demo";
const IMAGE: &str = "registry.k8s.io/e2e-test-images/nginx:1.15-4";
const REPLICAS: usize = 3;
/// How long one step may take before the demo fails.
const STEP_TIMEOUT: Duration = Duration::from_secs(240);

/// The tutorial's manifest (its image is one the nodes have; same shape otherwise).
fn manifest() -> String {
    format!(
        r#"apiVersion: v1
kind: Service
metadata:
  name: nginx
  namespace: {NAMESPACE}
  labels: {{app: nginx}}
spec:
  ports:
  - port: 80
    name: web
  clusterIP: None
  selector: {{app: nginx}}
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: web
  namespace: {NAMESPACE}
spec:
  serviceName: nginx
  replicas: {REPLICAS}
  minReadySeconds: 0
  selector:
    matchLabels: {{app: nginx}}
  template:
    metadata:
      labels: {{app: nginx}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: nginx
        image: {IMAGE}
        imagePullPolicy: IfNotPresent
        ports:
        - containerPort: 80
          name: web
        readinessProbe:
          tcpSocket: {{port: 80}}
          periodSeconds: 1
        volumeMounts:
        - name: www
          mountPath: /usr/share/nginx/html
  volumeClaimTemplates:
  - metadata:
      name: www
    spec:
      accessModes: ["ReadWriteOnce"]
      resources:
        requests:
          storage: 1Gi
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

    fn items(&self, args: &[&str]) -> anyhow::Result<Vec<Value>> {
        Ok(self.json(args)?["items"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }
}

/// Polls `check` every second until it gives a value; fails after [`STEP_TIMEOUT`] with the last
/// reason it gave.
fn wait<T>(
    what: &str,
    mut check: impl FnMut() -> anyhow::Result<Result<T, String>>,
) -> anyhow::Result<T> {
    let deadline = Instant::now() + STEP_TIMEOUT;
    loop {
        let last = match check() {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(reason)) => reason,
            Err(e) => format!("{e:#}"),
        };
        if Instant::now() >= deadline {
            bail!(
                "{what}: not within {} s (last: {last})",
                STEP_TIMEOUT.as_secs()
            );
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// One replica's placement: its Pod's node and UID, its claim's volume and that volume's node.
#[derive(Debug, Clone)]
struct Placement {
    pod_uid: String,
    node: String,
    volume: String,
    volume_node: String,
    /// The volume's directory (the PV's hostPath).
    path: String,
}

/// A step of the report.
struct Step {
    what: String,
    seconds: f64,
    outcome: String,
}

struct Demo<'a> {
    kube: Kube<'a>,
    cluster: &'a Cluster,
    nodes: Vec<String>,
    steps: Vec<Step>,
}

impl Demo<'_> {
    fn record(&mut self, what: &str, started: Instant, outcome: String) {
        let seconds = started.elapsed().as_secs_f64();
        println!("[ok] {what} ({seconds:.1} s): {outcome}");
        self.steps.push(Step {
            what: what.to_string(),
            seconds,
            outcome,
        });
    }

    /// The volume's directory on `node`, seen from this machine.
    fn dir_on(&self, node: &str, path: &str) -> PathBuf {
        let base = path
            .strip_prefix(&format!("{}/", controlplane::nodes::LOCAL_PATH_DIR))
            .unwrap_or(path);
        self.cluster
            .dir
            .join("nodes")
            .join(node)
            .join("local-path-provisioner")
            .join(base)
    }

    /// The nodes whose local-path directory holds the volume.
    fn holders(&self, path: &str) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|n| self.dir_on(n, path).is_dir())
            .cloned()
            .collect()
    }

    /// Replica `i` Ready (a Pod other than `not_uid`), its claim Bound: where each is.
    fn placement(
        &self,
        i: usize,
        not_uid: Option<&str>,
    ) -> anyhow::Result<Result<Placement, String>> {
        let pod = format!("web-{i}");
        let p = match self.kube.json(&["-n", NAMESPACE, "get", "pod", &pod]) {
            Ok(p) => p,
            Err(_) => return Ok(Err(format!("{pod} does not exist"))),
        };
        let uid = p["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if Some(uid.as_str()) == not_uid || !p["metadata"]["deletionTimestamp"].is_null() {
            return Ok(Err(format!("{pod} is still the deleted Pod")));
        }
        let ready = p["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        if !ready {
            return Ok(Err(format!(
                "{pod} not Ready (phase {}, conditions {})",
                p["status"]["phase"], p["status"]["conditions"]
            )));
        }
        let node = p["spec"]["nodeName"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let claim = self
            .kube
            .json(&["-n", NAMESPACE, "get", "pvc", &format!("www-{pod}")])?;
        if claim["status"]["phase"] != "Bound" {
            return Ok(Err(format!("www-{pod} is {}", claim["status"]["phase"])));
        }
        let volume = claim["spec"]["volumeName"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let pv = self.kube.json(&["get", "pv", &volume])?;
        let volume_node = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]
            ["matchExpressions"][0]["values"][0]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let path = pv["spec"]["hostPath"]["path"]
            .as_str()
            .or_else(|| pv["spec"]["local"]["path"].as_str())
            .unwrap_or_default()
            .to_string();
        Ok(Ok(Placement {
            pod_uid: uid,
            node,
            volume,
            volume_node,
            path,
        }))
    }

    /// Replica `i`'s placement, checked: on the node of its volume, whose directory is there
    /// and nowhere else.
    fn placed(&self, i: usize, not_uid: Option<&str>) -> anyhow::Result<Placement> {
        let p = wait(&format!("web-{i} Ready with its claim Bound"), || {
            self.placement(i, not_uid)
        })?;
        if p.node != p.volume_node {
            bail!(
                "web-{i} runs on {} but its volume {} is on {}",
                p.node,
                p.volume,
                p.volume_node
            );
        }
        let holders = self.holders(&p.path);
        if holders != [p.node.clone()] {
            bail!(
                "web-{i}'s volume {} ({}) should be on {} only; it is on {holders:?}",
                p.volume,
                p.path,
                p.node
            );
        }
        Ok(p)
    }

    /// What nginx of replica `i` serves (through the API server's Pod proxy).
    fn served(&self, i: usize) -> anyhow::Result<String> {
        self.kube.run(&[
            "get",
            "--raw",
            &format!("/api/v1/namespaces/{NAMESPACE}/pods/web-{i}:80/proxy/index.html"),
        ])
    }

    /// The claims of the namespace, by name.
    fn claims(&self) -> anyhow::Result<Vec<String>> {
        Ok(self
            .kube
            .items(&["-n", NAMESPACE, "get", "pvc"])?
            .iter()
            .filter(|c| c["metadata"]["deletionTimestamp"].is_null())
            .filter_map(|c| c["metadata"]["name"].as_str().map(str::to_string))
            .collect())
    }

    fn scale(&self, replicas: usize) -> anyhow::Result<()> {
        self.kube.run(&[
            "-n",
            NAMESPACE,
            "scale",
            "statefulset/web",
            &format!("--replicas={replicas}"),
        ])?;
        wait(&format!("web scaled to {replicas}"), || {
            let pods = self
                .kube
                .items(&["-n", NAMESPACE, "get", "pods", "-l", "app=nginx"])?;
            let ready = pods
                .iter()
                .filter(|p| {
                    p["status"]["conditions"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                })
                .count();
            if pods.len() == replicas && ready == replicas {
                Ok(Ok(()))
            } else {
                Ok(Err(format!("{} Pods, {ready} Ready", pods.len())))
            }
        })
    }

    /// Waits until the volumes are gone from the API and their directories from the nodes.
    fn volumes_gone(&self, gone: &[&Placement]) -> anyhow::Result<()> {
        wait("the volumes deleted, and their directories", || {
            for p in gone {
                if self
                    .kube
                    .run(&["get", "pv", &p.volume, "-o", "name"])
                    .is_ok()
                {
                    let phase = self
                        .kube
                        .run(&["get", "pv", &p.volume, "-o", "jsonpath={.status.phase}"])
                        .unwrap_or_default();
                    return Ok(Err(format!("{} still exists ({phase})", p.volume)));
                }
                let holders = self.holders(&p.path);
                if !holders.is_empty() {
                    return Ok(Err(format!("{} still on {holders:?}", p.path)));
                }
            }
            Ok(Ok(()))
        })
    }
}

pub fn run(cluster: &Cluster) -> anyhow::Result<()> {
    let live = Live::open(cluster)?;
    let state = super::read_state(cluster)?;
    if state["local_path"].as_bool() != Some(true) {
        bail!(
            "cluster {0} has no local storage: `cargo xtask cluster --name {0} up --nodes N \
             --local-path`",
            cluster.name
        );
    }
    let kube = Kube { live: &live };
    let nodes: Vec<String> = kube
        .items(&["get", "nodes"])?
        .iter()
        .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    let _ = kube.run(&["delete", "namespace", NAMESPACE, "--wait=true"]);
    kube.run(&["create", "namespace", NAMESPACE])?;
    let mut demo = Demo {
        kube,
        cluster,
        nodes,
        steps: Vec::new(),
    };
    let result = script(&mut demo);
    let mut report = String::new();
    writeln!(
        report,
        "cluster {} ({}, {}): the tutorial StatefulSet `web` ({REPLICAS} replicas, a 1Gi claim \
         each, StorageClass {})\n",
        cluster.name,
        who(
            &state,
            "kpr-controller-manager",
            "kpr's controller-manager",
            "kube-controller-manager"
        ),
        who(&state, "kpr-scheduler", "kpr's scheduler", "kube-scheduler"),
        crate::local_path::STORAGE_CLASS
    )?;
    writeln!(report, "| step | seconds | outcome |\n|---|---|---|")?;
    for s in &demo.steps {
        writeln!(report, "| {} | {:.1} | {} |", s.what, s.seconds, s.outcome)?;
    }
    if let Err(e) = &result {
        writeln!(report, "\nFAILED: {e:#}")?;
    }
    let out = cluster.dir.join("statefulset-demo.md");
    fs::write(&out, &report).with_context(|| format!("writing {}", out.display()))?;
    println!("{report}\n(written to {})", out.display());
    result
}

/// Whether state.json lists a process named `name`.
fn who(state: &Value, name: &str, yes: &'static str, no: &'static str) -> &'static str {
    let found = state["processes"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|p| p["name"] == name);
    if found {
        yes
    } else {
        no
    }
}

fn script(demo: &mut Demo) -> anyhow::Result<()> {
    // 1. The StatefulSet runs, each replica on the node of its volume.
    let started = Instant::now();
    let path = demo.cluster.dir.join("statefulset-demo.yaml");
    fs::write(&path, manifest())?;
    demo.kube
        .run(&["apply", "-f", &path.display().to_string()])?;
    let mut placements = Vec::new();
    for i in 0..REPLICAS {
        placements.push(demo.placed(i, None)?);
    }
    let where_: Vec<String> = placements
        .iter()
        .enumerate()
        .map(|(i, p)| format!("web-{i} on {} (volume {})", p.node, short(&p.volume)))
        .collect();
    demo.record(
        "3 replicas Ready, claims Bound, each volume on its Pod's node only",
        started,
        where_.join(", "),
    );

    // 2. Each replica writes its file; its Pod is deleted; the new one finds it.
    let started = Instant::now();
    let mut tokens = Vec::new();
    for (i, placement) in placements.iter_mut().enumerate() {
        let token = format!("web-{i} {}", &placement.pod_uid[..8]);
        demo.kube.run(&[
            "-n",
            NAMESPACE,
            "exec",
            &format!("web-{i}"),
            "--",
            "sh",
            "-c",
            &format!("echo '{token}' > /usr/share/nginx/html/index.html"),
        ])?;
        demo.kube.run(&[
            "-n",
            NAMESPACE,
            "delete",
            "pod",
            &format!("web-{i}"),
            "--wait=false",
        ])?;
        let again = demo.placed(i, Some(&placement.pod_uid))?;
        if again.volume != placement.volume {
            bail!(
                "web-{i} came back with volume {} instead of {}",
                again.volume,
                placement.volume
            );
        }
        let served = wait(&format!("web-{i} serving its file"), || {
            Ok(demo.served(i).map_err(|e| format!("{e:#}")))
        })?;
        if served.trim() != token {
            bail!("web-{i} serves {served:?}, not what it wrote ({token:?})");
        }
        tokens.push(token);
        *placement = again;
    }
    let read: Vec<String> = placements
        .iter()
        .enumerate()
        .map(|(i, p)| format!("web-{i} back on {}", p.node))
        .collect();
    demo.record(
        "each replica writes a file, its Pod deleted: the new Pod on its volume's node reads it",
        started,
        read.join(", "),
    );

    // 3. Scale to 1 and back: the claims stay.
    let started = Instant::now();
    demo.scale(1)?;
    let claims = demo.claims()?;
    if claims.len() != REPLICAS {
        bail!("after scaling to 1 (whenScaled: Retain) the claims are {claims:?}");
    }
    demo.scale(REPLICAS)?;
    for (i, placement) in placements.iter().enumerate().skip(1) {
        let again = demo.placed(i, Some(&placement.pod_uid))?;
        if again.volume != placement.volume {
            bail!(
                "web-{i} came back with volume {} instead of {}",
                again.volume,
                placement.volume
            );
        }
        let served = demo.served(i)?;
        if served.trim() != tokens[i] {
            bail!(
                "web-{i} serves {served:?} after scaling back, not {:?}",
                tokens[i]
            );
        }
    }
    demo.record(
        "scale to 1 and back to 3 (whenScaled: Retain)",
        started,
        format!(
            "{} claims kept; web-1, web-2 read their files again",
            claims.len()
        ),
    );

    // 4. whenScaled: Delete, scale to 1: the surplus claims go, and their volumes.
    let started = Instant::now();
    demo.kube.run(&[
        "-n",
        NAMESPACE,
        "patch",
        "statefulset/web",
        "--type=merge",
        "-p",
        r#"{"spec":{"persistentVolumeClaimRetentionPolicy":{"whenScaled":"Delete","whenDeleted":"Retain"}}}"#,
    ])?;
    demo.scale(1)?;
    wait("the claims of web-1 and web-2 deleted", || {
        let claims = demo.claims()?;
        if claims == ["www-web-0"] {
            Ok(Ok(()))
        } else {
            Ok(Err(format!("claims {claims:?}")))
        }
    })?;
    let surplus: Vec<&Placement> = placements.iter().skip(1).collect();
    demo.volumes_gone(&surplus)?;
    demo.record(
        "whenScaled: Delete, scale to 1",
        started,
        "www-web-1, www-web-2 deleted; their volumes deleted (reclaim Delete) and their \
         directories removed from the nodes"
            .into(),
    );

    // 5. The namespace deleted: web-0's claim and volume go.
    let started = Instant::now();
    demo.kube.run(&[
        "delete",
        "namespace",
        NAMESPACE,
        "--wait=true",
        "--timeout=240s",
    ])?;
    demo.volumes_gone(&[&placements[0]])?;
    demo.record(
        "namespace deleted",
        started,
        format!(
            "www-web-0 gone with it; volume {} deleted and its directory removed from {}",
            short(&placements[0].volume),
            placements[0].node
        ),
    );
    Ok(())
}

/// `pvc-1234abcd-…` as `pvc-1234abcd`.
fn short(volume: &str) -> String {
    volume.chars().take(12).collect()
}
