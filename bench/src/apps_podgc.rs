//! The apps row's podgc workload (`--apps-workloads podgc`): kpr's PodGC controller next to
//! kube-controller-manager's over N terminated Pods with `--terminated-pod-gc-threshold=T` (the
//! same flag for both), on a fresh reference control plane of its own, started as the other apps
//! workloads' are ([`wc::start_control_plane`]: audit log, one kwok node).
//!
//! Before the manager starts: a Node [`NODE`] that kwok does not manage (it lacks the
//! `kwok.x-k8s.io/node` annotation kwok selects on, so kwok's default Pod stages never touch its
//! Pods; and it exists, so none of them is an orphan to the controller), and N Pods bound to it
//! through `spec.nodeName`, each made Succeeded or Failed (alternately) through the status
//! subresource, [`WRITE_CONCURRENCY`] writes in flight. Then the manager starts with only
//! `--controllers=podgc` and the threshold; the clock runs from its start until a watch counts T
//! terminated Pods left (both run a pass once their caches are synced, then every 20 s). The
//! clock therefore includes the manager's start-up and its listing of the N Pods: that is what
//! scales here. Requests, CPU and peak memory are the process's whole life until then.
//!
//! Then the Pods left are compared with the newest T by upstream's order (`gcTerminated` deletes
//! the oldest first by creation time, then name; none of these is Evicted): the row's check says
//! whether they are those.
//!
//! Owns: its control plane. The row is [`apps_bench`]'s ([`AppsRun`]).

use std::collections::{BTreeSet, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use controlplane::ControlPlane;
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;

use super::apps_bench::{AppsRun, Phase, Sizes};
use super::workload_controllers::{
    self as wc, count_requests, cpu_seconds, guarded, vm_hwm_kib, Files, Manager, IMAGE,
    WRITE_CONCURRENCY,
};

/// The Node the terminated Pods are bound to; kwok does not manage it.
pub const NODE: &str = "podgc-node";

/// Measures the workload under `manager` on a control plane of its own into `run`.
pub(crate) fn measure(
    rt: &tokio::runtime::Runtime,
    manager: Manager,
    z: Sizes,
    files: Files<'_>,
    run: &mut AppsRun,
) -> anyhow::Result<()> {
    let (n, keep) = (z.podgc_pods, z.podgc_threshold);
    let tag = format!("apps-podgc-{}", manager.tag());
    let (mut cp, client, audit_log) = wc::start_control_plane(rt, &tag, 1, files)?;
    let ns = cp.test_namespace("podgc")?;
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);

    let clock = Instant::now();
    rt.block_on(guarded(
        &mut cp,
        Duration::from_secs(600 + n as u64 / 20),
        create_terminated(client.clone(), api.clone(), n),
    ))
    .with_context(|| format!("creating {n} terminated Pods"))?;
    println!(
        "  {}: podgc: {n} terminated Pods created in {:.1} s",
        manager.name(),
        clock.elapsed().as_secs_f64()
    );
    let listed = rt.block_on(api.list(&ListParams::default()))?.items;
    let terminated = listed.iter().filter(|p| is_terminated(p)).count();
    if terminated != n {
        bail!("{terminated} of the {n} Pods created are terminated");
    }
    let expected = newest(
        listed
            .iter()
            .map(|p| {
                let m = &p.metadata;
                (
                    m.creation_timestamp.as_ref().map(|t| t.0),
                    m.name.clone().unwrap_or_default(),
                )
            })
            .collect(),
        keep,
    );

    // The watch is listed before the clock starts.
    let (count_tx, mut count) = tokio::sync::watch::channel(usize::MAX);
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let tracker = rt.spawn(track(api.clone(), count_tx, ready_tx));
    rt.block_on(ready_rx)
        .context("the watch ended before its first listing")?;

    let t1 = Timestamp::now();
    let clock = Instant::now();
    let threshold = format!("--terminated-pod-gc-threshold={keep}");
    let (flags, pid) = wc::start_manager(&mut cp, manager, "podgc", &[&threshold])?;
    run.flags = flags;
    let label = format!("{}: podgc", manager.name());
    let wait = async {
        let mut report = tokio::time::interval(Duration::from_secs(30));
        report.tick().await;
        loop {
            let left = *count.borrow_and_update();
            if left <= keep {
                return anyhow::Ok(());
            }
            tokio::select! {
                changed = count.changed() => changed.context("the watch ended")?,
                _ = report.tick() => println!(
                    "  {label}: {left} terminated Pods left after {:.0} s",
                    clock.elapsed().as_secs_f64()
                ),
            }
        }
    };
    let timeout = Duration::from_secs(600 + n as u64 / 2);
    if let Err(e) = rt.block_on(guarded(&mut cp, timeout, wait)) {
        bail!(
            "{e:#}: {} terminated Pods left, want {keep}; the manager's log: {}",
            *count.borrow(),
            wc::manager_log_tail(&cp, manager)
        );
    }
    let seconds = clock.elapsed().as_secs_f64();
    let cpu = cpu_seconds(pid)?;
    run.peak_memory_mib = Some(vm_hwm_kib(pid)? as f64 / 1024.0);
    let t2 = Timestamp::now();
    tracker.abort();
    run.phases.push(Phase {
        name: format!("{keep} left"),
        seconds,
        cpu_seconds: cpu,
    });
    println!("  {label}: {keep} terminated Pods left {seconds:.2} s after the manager started");

    let left: BTreeSet<String> = rt
        .block_on(api.list(&ListParams::default()))?
        .items
        .iter()
        .filter(|p| is_terminated(p))
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    let check = check(&left, &expected);
    println!("  {label}: {check}");
    run.check = Some(check);

    finish(&mut cp, manager, &audit_log, [t1, t2, t2], run);
    Ok(())
}

/// Stops the manager (requests in flight are logged on the way out) and counts its requests.
fn finish(
    cp: &mut ControlPlane,
    manager: Manager,
    audit_log: &Path,
    window: [Timestamp; 3],
    run: &mut AppsRun,
) {
    cp.stop(manager.process());
    match count_requests(audit_log, window) {
        Ok(q) => {
            println!(
                "  {}: podgc: {} API requests from its start to done",
                manager.name(),
                q.work()
            );
            run.requests = Some(q);
        }
        Err(e) => run.error = Some(format!("counting requests: {e:#}")),
    }
}

/// The Node (no kwok annotation) and `n` Pods `p-<i>` bound to it, each then made Succeeded or
/// Failed (alternately) through the status subresource.
async fn create_terminated(client: kube::Client, api: Api<Pod>, n: usize) -> anyhow::Result<()> {
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}},
    }))?;
    Api::<Node>::all(client)
        .create(&PostParams::default(), &node)
        .await
        .with_context(|| format!("creating Node {NODE}"))?;
    futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                let name = pod_name(i);
                let pod: Pod = serde_json::from_value(json!({
                    "metadata": {"name": name},
                    "spec": {
                        "nodeName": NODE,
                        "restartPolicy": "Never",
                        "containers": [{"name": "c", "image": IMAGE}],
                    },
                }))?;
                api.create(&PostParams::default(), &pod)
                    .await
                    .with_context(|| format!("creating Pod {name}"))?;
                let phase = if i % 2 == 0 { "Succeeded" } else { "Failed" };
                let status = json!({"status": {"phase": phase}});
                api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                    .await
                    .with_context(|| format!("making Pod {name} {phase}"))?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(WRITE_CONCURRENCY)
        .try_collect::<()>()
        .await
}

fn pod_name(i: usize) -> String {
    format!("p-{i:05}")
}

fn is_terminated(p: &Pod) -> bool {
    matches!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// Publishes how many of `api`'s Pods are terminated (after each listing is complete: a
/// re-listing replaces the set, so a deletion missed while the watch was down is not counted).
/// Signals `ready` after the first listing.
async fn track(
    api: Api<Pod>,
    tx: tokio::sync::watch::Sender<usize>,
    ready: tokio::sync::oneshot::Sender<()>,
) -> anyhow::Result<()> {
    let mut stream = std::pin::pin!(watcher(api, watcher::Config::default()));
    let mut ready = Some(ready);
    let mut terminated: HashSet<String> = HashSet::new();
    let mut listing: Option<HashSet<String>> = None;
    while let Some(event) = stream.try_next().await? {
        match event {
            watcher::Event::Init => listing = Some(HashSet::new()),
            watcher::Event::InitApply(p) => {
                if is_terminated(&p) {
                    let set = listing.as_mut().unwrap_or(&mut terminated);
                    set.insert(p.metadata.name.unwrap_or_default());
                }
            }
            watcher::Event::InitDone => {
                if let Some(set) = listing.take() {
                    terminated = set;
                }
                if let Some(tx) = ready.take() {
                    let _ = tx.send(());
                }
            }
            watcher::Event::Apply(p) => {
                let name = p.metadata.name.clone().unwrap_or_default();
                if is_terminated(&p) {
                    terminated.insert(name);
                } else {
                    terminated.remove(&name);
                }
            }
            watcher::Event::Delete(p) => {
                terminated.remove(p.metadata.name.as_deref().unwrap_or_default());
            }
        }
        if listing.is_none() {
            tx.send_if_modified(|c| std::mem::replace(c, terminated.len()) != terminated.len());
        }
    }
    Ok(())
}

/// The names of the `keep` Pods upstream's `gcTerminated` keeps of `pods` (creation time, name),
/// none of them Evicted: it deletes the oldest first, by creation time, then name.
fn newest(mut pods: Vec<(Option<Timestamp>, String)>, keep: usize) -> BTreeSet<String> {
    pods.sort();
    let skip = pods.len().saturating_sub(keep);
    pods.into_iter().skip(skip).map(|(_, name)| name).collect()
}

/// Whether the terminated Pods `left` are the `expected` newest, as the report says it.
fn check(left: &BTreeSet<String>, expected: &BTreeSet<String>) -> String {
    if left == expected {
        return format!(
            "Kept exactly the newest {} (by creation time, then name)",
            expected.len()
        );
    }
    let kept = left.intersection(expected).count();
    let mut others = left.difference(expected);
    let example = others
        .next()
        .map_or(String::new(), |name| format!(", e.g. {name}"));
    format!(
        "Kept {kept} of the newest {} and {} others{example}",
        expected.len(),
        left.len() - kept
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(second: i64) -> Option<Timestamp> {
        Some(Timestamp::from_second(1_780_000_000 + second).unwrap())
    }

    #[test]
    fn the_newest_are_kept_by_creation_time_then_name() {
        let pods = vec![
            (at(2), "p-00003".to_string()),
            (at(1), "p-00009".to_string()),
            (at(2), "p-00001".to_string()),
            (at(3), "p-00000".to_string()),
            (at(2), "p-00002".to_string()),
        ];
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        let cases = [
            ("keep one: the latest creation", 1, names(&["p-00000"])),
            (
                "keep two: ties in a second go by name, the greater kept",
                2,
                names(&["p-00000", "p-00003"]),
            ),
            (
                "keep four: only the oldest second's Pod goes",
                4,
                names(&["p-00000", "p-00001", "p-00002", "p-00003"]),
            ),
            (
                "keep more than there are: all",
                9,
                names(&["p-00000", "p-00001", "p-00002", "p-00003", "p-00009"]),
            ),
        ];
        for (name, keep, want) in cases {
            assert_eq!(newest(pods.clone(), keep), want, "{name}");
        }
    }

    #[test]
    fn the_check_says_what_was_kept() {
        let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        let expected = set(&["p-3", "p-4"]);
        assert_eq!(
            check(&set(&["p-3", "p-4"]), &expected),
            "Kept exactly the newest 2 (by creation time, then name)"
        );
        assert_eq!(
            check(&set(&["p-1", "p-4"]), &expected),
            "Kept 1 of the newest 2 and 1 others, e.g. p-1"
        );
        assert_eq!(
            check(&set(&["p-4"]), &expected),
            "Kept 1 of the newest 2 and 0 others"
        );
    }

    #[test]
    fn pod_names_sort_in_creation_order() {
        assert!(pod_name(9) < pod_name(10));
        assert!(pod_name(9_999) < pod_name(10_000));
        assert_eq!(pod_name(42), "p-00042");
    }

    #[test]
    fn terminated_is_succeeded_or_failed() {
        let pod = |phase: Option<&str>| {
            serde_json::from_value::<Pod>(json!({"metadata": {"name": "p"},
                "status": {"phase": phase}}))
            .unwrap()
        };
        assert!(is_terminated(&pod(Some("Succeeded"))));
        assert!(is_terminated(&pod(Some("Failed"))));
        assert!(!is_terminated(&pod(Some("Running"))));
        assert!(!is_terminated(&pod(None)));
    }
}
