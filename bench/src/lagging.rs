//! A controller manager whose watch lags (issue 42, scenario 6): kpr's `controller-manager` with
//! every watch event applied 3 s late (`--fault-watch-delay`, fault injection), its own writes
//! going through at once, while ReplicaSets and StatefulSets scale up and down every 4 s and Jobs
//! run; beside the same manager without the lag and kube-controller-manager (which has no such
//! switch: its row is the reference without lag). A controller acting on its cache without
//! expectations for its own creations and deletions would create a Pod twice (more live Pods than
//! either the old or the new replica count) or delete too many (fewer live Pods than the new,
//! smaller count while scaling down), or run a Job Pod more often than its completions.
//!
//! Measured from a watch on the Pods (this process's, without lag): the largest overshoot and
//! undershoot per ReplicaSet and StatefulSet, Job Pods succeeded beyond the completions, and
//! whether everything converged ("last scale to converged" counts from one step, 4 s, after the
//! last scale). On the reference control plane with kwok nodes and
//! kube-scheduler, as the workload controllers benchmark starts them.
//!
//! Owns `<out>/lagging-watch.{json,md}`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use futures::StreamExt as _;
use k8s_openapi::api::apps::v1::{ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde::Serialize;
use serde_json::json;

use crate::workload_controllers::{start_control_plane, start_manager, Files, Manager, IMAGE};

const CONTROLLERS: &str =
    "replicaset-controller,statefulset-controller,job-controller,garbage-collector-controller";
/// The replica counts every ReplicaSet and StatefulSet goes through, one step every [`STEP`].
const SCALES: &[i32] = &[10, 3, 12, 5];
const STEP: Duration = Duration::from_secs(4);
const REPLICA_SETS: usize = 10;
const STATEFUL_SETS: usize = 3;
const JOBS: usize = 5;
const COMPLETIONS: i32 = 10;
const NODES: usize = 10;

pub const JSON_FILE: &str = "lagging-watch.json";
pub const MARKDOWN_FILE: &str = "lagging-watch.md";

/// One row.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Row {
    pub manager: String,
    pub watch_delay_seconds: f64,
    /// Live Pods above both the previous and the current replica count, largest over the run and
    /// the owners.
    pub overshoot: i64,
    /// Live Pods below the new count while scaling down (and below what was live when the
    /// scale-down was written: Pods still being created then are not a surplus deletion), largest.
    pub undershoot: i64,
    /// Job Pods succeeded beyond the completions, summed.
    pub extra_job_pods: usize,
    /// Last scale to everything at its final count and every Job complete.
    pub converged_seconds: Option<f64>,
    pub error: Option<String>,
}

#[derive(Default)]
struct Tracker {
    /// Owner name -> live Pod names.
    live: BTreeMap<String, BTreeSet<String>>,
    /// Owner name -> (previous, current) desired count.
    desired: BTreeMap<String, (i32, i32)>,
    /// Owner name -> live Pods when its count last went down: a scale-down may leave no fewer
    /// than the smaller of that and the new count.
    floor: BTreeMap<String, i64>,
    /// Job name -> Pods seen Succeeded.
    succeeded: BTreeMap<String, BTreeSet<String>>,
    overshoot: i64,
    undershoot: i64,
}

impl Tracker {
    fn observe(&mut self, owner: &str) {
        let Some(&(prev, now)) = self.desired.get(owner) else {
            return;
        };
        let live = self.live.get(owner).map_or(0, |s| s.len()) as i64;
        self.overshoot = self.overshoot.max(live - i64::from(prev.max(now)));
        if now < prev {
            let floor = self
                .floor
                .get(owner)
                .copied()
                .unwrap_or(0)
                .min(i64::from(now));
            self.undershoot = self.undershoot.max(floor - live);
        }
    }
}

fn owner_of(pod: &Pod) -> Option<(String, String)> {
    pod.metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|r| r.controller == Some(true))
        .map(|r| (r.kind.clone(), r.name.clone()))
}

fn apply(tracker: &Mutex<Tracker>, pod: &Pod, deleted: bool) {
    let Some((kind, owner)) = owner_of(pod) else {
        return;
    };
    let name = pod.metadata.name.clone().unwrap_or_default();
    let phase = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default();
    let mut t = tracker.lock().expect("tracker");
    if kind == "Job" {
        if phase == "Succeeded" {
            t.succeeded.entry(owner).or_default().insert(name);
        }
        return;
    }
    let live = !deleted
        && pod.metadata.deletion_timestamp.is_none()
        && !matches!(phase, "Succeeded" | "Failed");
    let set = t.live.entry(owner.clone()).or_default();
    if live {
        set.insert(name);
    } else {
        set.remove(&name);
    }
    t.observe(&owner);
}

pub fn run(out_dir: &Path, delay: Duration) -> anyhow::Result<(Vec<Row>, Vec<String>)> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let (policy, kwok_config) = crate::workload_controllers::write_config_files(out_dir)?;
    let files = Files {
        audit_policy: &policy,
        kwok_config: &kwok_config,
    };
    let rows = [
        (Manager::Kpr, Duration::ZERO),
        (Manager::Kpr, delay),
        (Manager::Upstream, Duration::ZERO),
    ];
    let mut out = Vec::new();
    let mut failures = Vec::new();
    for (manager, lag) in rows {
        let mut row = Row {
            manager: match manager {
                Manager::Kpr => "kpr controller-manager".into(),
                _ => "kube-controller-manager".into(),
            },
            watch_delay_seconds: lag.as_secs_f64(),
            ..Row::default()
        };
        println!(
            "bench: lagging watch, {} with watch delay {:?}",
            row.manager, lag
        );
        if let Err(e) = measure(&rt, manager, lag, files, &mut row) {
            let e = format!("{e:#}");
            failures.push(format!("lagging watch, {} {:?}: {e}", row.manager, lag));
            row.error = Some(e);
        }
        println!("{}", line(&row));
        out.push(row);
    }
    std::fs::write(out_dir.join(JSON_FILE), serde_json::to_string_pretty(&out)?)?;
    std::fs::write(out_dir.join(MARKDOWN_FILE), markdown(&out))?;
    println!("{}", markdown(&out));
    Ok((out, failures))
}

fn measure(
    rt: &tokio::runtime::Runtime,
    manager: Manager,
    lag: Duration,
    files: Files<'_>,
    row: &mut Row,
) -> anyhow::Result<()> {
    let tag = format!("lagging-{}-{}", manager.tag(), lag.as_secs());
    let (mut cp, client, _) = start_control_plane(rt, &tag, NODES, files)?;
    let ns = cp.test_namespace("lag")?;
    let delay_flag = format!("--fault-watch-delay={}s", lag.as_secs());
    let extra: Vec<&str> = if lag.is_zero() {
        Vec::new()
    } else {
        vec![delay_flag.as_str()]
    };
    start_manager(&mut cp, manager, CONTROLLERS, &extra)?;
    let tracker = Arc::new(Mutex::new(Tracker::default()));
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let watching = {
        let tracker = tracker.clone();
        rt.spawn(async move {
            let mut stream = watcher::watcher(pods, watcher::Config::default()).boxed();
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => {
                        apply(&tracker, &p, false)
                    }
                    Ok(watcher::Event::Delete(p)) => apply(&tracker, &p, true),
                    _ => {}
                }
            }
        })
    };
    let rss: Api<ReplicaSet> = Api::namespaced(client.clone(), &ns);
    let stss: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    let template = |app: &str| {
        json!({"metadata": {"labels": {"app": app}},
        "spec": {"containers": [{"name": "c", "image": IMAGE}]}})
    };
    rt.block_on(async {
        for i in 0..REPLICA_SETS {
            let name = format!("rs-{i}");
            tracker
                .lock()
                .expect("tracker")
                .desired
                .insert(name.clone(), (0, 0));
            rss.create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {"replicas": 0, "selector": {"matchLabels": {"app": name}},
                         "template": template(&name)}}))?,
            )
            .await?;
        }
        for i in 0..STATEFUL_SETS {
            let name = format!("sts-{i}");
            tracker
                .lock()
                .expect("tracker")
                .desired
                .insert(name.clone(), (0, 0));
            stss.create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {"replicas": 0, "serviceName": name, "podManagementPolicy": "Parallel",
                         "selector": {"matchLabels": {"app": name}},
                         "template": template(&name)}}))?,
            )
            .await?;
        }
        for i in 0..JOBS {
            let name = format!("job-{i}");
            let mut t = template(&name);
            t["spec"]["restartPolicy"] = json!("Never");
            jobs.create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {"completions": COMPLETIONS, "parallelism": 5, "template": t}}))?,
            )
            .await?;
        }
        anyhow::Ok(())
    })
    .context("creating the workloads")?;
    // The scale steps, all owners at once.
    for &n in SCALES {
        rt.block_on(async {
            let patch = json!({"spec": {"replicas": n}});
            for (kind, count) in [("rs", REPLICA_SETS), ("sts", STATEFUL_SETS)] {
                for i in 0..count {
                    let name = format!("{kind}-{i}");
                    {
                        let mut t = tracker.lock().expect("tracker");
                        let d = t.desired.entry(name.clone()).or_default();
                        *d = (d.1, n);
                        let live = t.live.get(&name).map_or(0, |s| s.len()) as i64;
                        t.floor.insert(name.clone(), live);
                    }
                    if kind == "rs" {
                        rss.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                            .await?;
                    } else {
                        stss.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                            .await?;
                    }
                }
            }
            anyhow::Ok(())
        })
        .with_context(|| format!("scaling to {n}"))?;
        std::thread::sleep(STEP);
    }
    let last = *SCALES.last().expect("scales");
    let started = Instant::now();
    let deadline = started + Duration::from_secs(180);
    loop {
        let owners_done = {
            let t = tracker.lock().expect("tracker");
            t.desired
                .keys()
                .all(|o| t.live.get(o).map_or(0, |s| s.len()) == last as usize)
        };
        let done = rt.block_on(async {
            let jobs_done = jobs
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .filter(|j| j.status.as_ref().and_then(|s| s.succeeded) == Some(COMPLETIONS))
                .count()
                == JOBS;
            anyhow::Ok(owners_done && jobs_done)
        })?;
        if done {
            row.converged_seconds = Some(started.elapsed().as_secs_f64());
            break;
        }
        if Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    // A while longer, for a late duplicate to show.
    std::thread::sleep(Duration::from_secs(5) + lag);
    watching.abort();
    cp.check_alive()?;
    let t = tracker.lock().expect("tracker");
    row.overshoot = t.overshoot;
    row.undershoot = t.undershoot;
    row.extra_job_pods = t
        .succeeded
        .values()
        .map(|s| s.len().saturating_sub(COMPLETIONS as usize))
        .sum();
    if row.converged_seconds.is_none() {
        bail!("not converged 180 s after the last scale");
    }
    Ok(())
}

fn line(r: &Row) -> String {
    format!(
        "| {} | {:.0} | {} | {} | {} | {} |",
        r.manager,
        r.watch_delay_seconds,
        r.overshoot,
        r.undershoot,
        r.extra_job_pods,
        r.converged_seconds
            .map(|s| format!("{s:.1}"))
            .unwrap_or_else(|| "-".into())
    )
}

pub fn markdown(rows: &[Row]) -> String {
    let mut out = String::from(
        "| manager | watch delay (s) | largest overshoot (Pods) | largest undershoot (Pods) | extra Job Pods | last scale to converged (s) |\n|---|---|---|---|---|---|\n",
    );
    for r in rows {
        out.push_str(&line(r));
        out.push('\n');
        if let Some(e) = &r.error {
            out.push_str(&format!(
                "\n{} ({} s): {e}\n",
                r.manager, r.watch_delay_seconds
            ));
        }
    }
    out
}
