//! The apps row's quota workload (`--apps-workloads quota`): kpr's ResourceQuota controller next
//! to kube-controller-manager's over N objects, on a fresh reference control plane of its own,
//! started as the other apps workloads' are ([`wc::start_control_plane`]: audit log, one kwok
//! node).
//!
//! Before the manager starts, in one namespace: N objects, half Pods (a fifth of them
//! BestEffort, the others requesting [`CPU_REQUEST`] and [`MEMORY_REQUEST`]; bound through
//! `spec.nodeName` to a Node kwok does not manage, so nothing changes them), a quarter ConfigMaps
//! and the rest Secrets, [`WRITE_CONCURRENCY`] writes in flight; then three ResourceQuotas
//! without status (created after the objects: the quota admission refuses creations in a
//! namespace whose quota has no status yet): object counts (`pods`, `configmaps`, `secrets`,
//! `count/configmaps`), compute (`requests.cpu`, `requests.memory`) and a `NotBestEffort`-scoped
//! `pods`. The expected usage is computed from a listing of the namespace.
//!
//! Phases: the manager starts with only `--controllers=resourcequota`; the clock runs from its
//! start until a watch sees every quota's `status.used` equal to the expected usage (so it
//! includes the manager's start-up and its listing of the N objects: what scales here). Then a
//! tenth of the Pods (none of them BestEffort) and of the ConfigMaps is deleted, and the second clock runs
//! from the first deletion until the usage shows them gone (the replenishment path: each
//! deletion is seen through a watch). Requests, CPU and peak memory are the process's whole life
//! until then.
//!
//! Owns: its control plane. The row is [`apps_bench`]'s ([`AppsRun`]).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, ResourceQuota, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;

use super::apps_bench::{AppsRun, Phase, Sizes};
use super::workload_controllers::{
    self as wc, count_requests, cpu_seconds, guarded, vm_hwm_kib, Files, Manager, IMAGE,
    WRITE_CONCURRENCY,
};

/// The Node the Pods are bound to; kwok does not manage it.
pub const NODE: &str = "quota-node";
/// Each Pod's requests but a BestEffort fifth's.
pub const CPU_REQUEST: &str = "10m";
pub const MEMORY_REQUEST: &str = "16Mi";
const CPU_REQUEST_MILLI: i128 = 10;
const MEMORY_REQUEST_MILLI: i128 = 16 * 1024 * 1024 * 1000;
/// Every hard limit: far above any size run, so no creation would be refused.
const HARD: &str = "1000000";

/// What each quota tracks (its `spec.hard` keys, and a scope).
const QUOTAS: &[(&str, &[&str], Option<&str>)] = &[
    (
        "objects",
        &["pods", "configmaps", "secrets", "count/configmaps"],
        None,
    ),
    ("compute", &["requests.cpu", "requests.memory"], None),
    ("not-best-effort", &["pods"], Some("NotBestEffort")),
];

/// One object of the namespace: which kind, its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Pod { best_effort: bool },
    ConfigMap,
    Secret,
}

/// The `i`th of `n` objects: the first half Pods (every fifth BestEffort), a quarter ConfigMaps,
/// the rest Secrets.
fn kind_of(i: usize, n: usize) -> Kind {
    if i < n / 2 {
        Kind::Pod {
            best_effort: i.is_multiple_of(5),
        }
    } else if i < n / 2 + n / 4 {
        Kind::ConfigMap
    } else {
        Kind::Secret
    }
}

fn object_name(i: usize) -> String {
    format!("o-{i:05}")
}

/// Measures the workload under `manager` on a control plane of its own into `run`.
pub(crate) fn measure(
    rt: &tokio::runtime::Runtime,
    manager: Manager,
    z: Sizes,
    files: Files<'_>,
    run: &mut AppsRun,
) -> anyhow::Result<()> {
    let n = z.quota_objects;
    let tag = format!("apps-quota-{}", manager.tag());
    let (mut cp, client, audit_log) = wc::start_control_plane(rt, &tag, 1, files)?;
    let ns = cp.test_namespace("quota")?;

    let clock = Instant::now();
    rt.block_on(guarded(
        &mut cp,
        Duration::from_secs(600 + n as u64 / 20),
        create_objects(client.clone(), &ns, n),
    ))
    .with_context(|| format!("creating {n} objects"))?;
    println!(
        "  {}: quota: {n} objects created in {:.1} s",
        manager.name(),
        clock.elapsed().as_secs_f64()
    );
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), &ns);
    for &(name, keys, scope) in QUOTAS {
        let hard: BTreeMap<&str, &str> = keys.iter().map(|&k| (k, HARD)).collect();
        let mut spec = json!({"hard": hard});
        if let Some(scope) = scope {
            spec["scopes"] = json!([scope]);
        }
        let quota: ResourceQuota =
            serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec}))?;
        rt.block_on(quotas.create(&PostParams::default(), &quota))
            .with_context(|| format!("creating ResourceQuota {ns}/{name}"))?;
    }
    let expected = rt.block_on(expected_usage(&client, &ns))?;

    // The watch is listed before the clock starts.
    let (tx, mut seen) = tokio::sync::watch::channel(BTreeMap::new());
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let tracker = rt.spawn(track(quotas.clone(), tx, ready_tx));
    rt.block_on(ready_rx)
        .context("the watch ended before its first listing")?;

    let label = format!("{}: quota", manager.name());
    let t1 = Timestamp::now();
    let clock = Instant::now();
    let (flags, pid) = wc::start_manager(&mut cp, manager, "resourcequota", &[])?;
    run.flags = flags;
    let timeout = Duration::from_secs(300 + n as u64 / 20);
    let what = format!("the usage of {n} objects");
    let first = wait_usage(&mut seen, &expected, &label, &what);
    if let Err(e) = rt.block_on(guarded(&mut cp, timeout, first)) {
        bail!(
            "{e:#}: want {expected:?}; the manager's log: {}",
            wc::manager_log_tail(&cp, manager)
        );
    }
    let seconds = clock.elapsed().as_secs_f64();
    let cpu = cpu_seconds(pid)?;
    run.phases.push(Phase {
        name: format!("usage of {n}"),
        seconds,
        cpu_seconds: cpu,
    });
    println!("  {label}: usage of {n} objects recorded {seconds:.2} s after the manager started");

    // A tenth of the Pods (none BestEffort) and of the ConfigMaps.
    let deleted: Vec<(Kind, String)> = (0..n)
        .filter(|i| i % 10 == 1)
        .map(|i| (kind_of(i, n), object_name(i)))
        .filter(|(k, _)| !matches!(k, Kind::Secret))
        .collect();
    let t2 = Timestamp::now();
    let clock = Instant::now();
    rt.block_on(guarded(
        &mut cp,
        timeout,
        delete_objects(client.clone(), &ns, &deleted),
    ))?;
    let after = rt.block_on(expected_usage(&client, &ns))?;
    let what = format!("{} deletions", deleted.len());
    let second = wait_usage(&mut seen, &after, &label, &what);
    if let Err(e) = rt.block_on(guarded(&mut cp, timeout, second)) {
        bail!(
            "{e:#}: want {after:?}; the manager's log: {}",
            wc::manager_log_tail(&cp, manager)
        );
    }
    let seconds = clock.elapsed().as_secs_f64();
    run.phases.push(Phase {
        name: format!("{} deleted", deleted.len()),
        seconds,
        cpu_seconds: cpu_seconds(pid)? - cpu,
    });
    run.peak_memory_mib = Some(vm_hwm_kib(pid)? as f64 / 1024.0);
    let t3 = Timestamp::now();
    tracker.abort();
    println!(
        "  {label}: {} deletions recorded {seconds:.2} s after the first",
        deleted.len()
    );
    run.check = Some(format!(
        "Usage recorded as counted from the listings: {after:?}"
    ));

    cp.stop(manager.process());
    match count_requests(&audit_log, [t1, t2, t3]) {
        Ok(q) => run.requests = Some(q),
        Err(e) => run.error = Some(format!("counting requests: {e:#}")),
    }
    Ok(())
}

/// Waits until `seen` shows `expected`, saying what it still waits for every 30 s.
async fn wait_usage(
    seen: &mut tokio::sync::watch::Receiver<BTreeMap<String, Usage>>,
    expected: &BTreeMap<String, Usage>,
    label: &str,
    what: &str,
) -> anyhow::Result<()> {
    let mut report = tokio::time::interval(Duration::from_secs(30));
    report.tick().await;
    loop {
        if *seen.borrow_and_update() == *expected {
            return Ok(());
        }
        tokio::select! {
            changed = seen.changed() => changed.context("the watch ended")?,
            _ = report.tick() => println!("  {label}: waiting for {what}: {:?}", *seen.borrow()),
        }
    }
}

/// The Node (no kwok annotation) and the `n` objects of [`kind_of`].
async fn create_objects(client: kube::Client, ns: &str, n: usize) -> anyhow::Result<()> {
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}},
    }))?;
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .with_context(|| format!("creating Node {NODE}"))?;
    let (pods, configmaps, secrets): (Api<Pod>, Api<ConfigMap>, Api<Secret>) = (
        Api::namespaced(client.clone(), ns),
        Api::namespaced(client.clone(), ns),
        Api::namespaced(client, ns),
    );
    let pp = PostParams::default();
    futures::stream::iter(0..n)
        .map(|i| {
            let (pods, configmaps, secrets, pp) = (
                pods.clone(),
                configmaps.clone(),
                secrets.clone(),
                pp.clone(),
            );
            async move {
                let name = object_name(i);
                let meta = json!({"name": name});
                match kind_of(i, n) {
                    Kind::Pod { best_effort } => {
                        let mut container = json!({"name": "c", "image": IMAGE});
                        if !best_effort {
                            container["resources"] = json!({"requests":
                                {"cpu": CPU_REQUEST, "memory": MEMORY_REQUEST}});
                        }
                        let pod: Pod = serde_json::from_value(json!({"metadata": meta,
                            "spec": {"nodeName": NODE, "containers": [container]}}))?;
                        pods.create(&pp, &pod).await.map(drop)
                    }
                    Kind::ConfigMap => {
                        let cm: ConfigMap =
                            serde_json::from_value(json!({"metadata": meta, "data": {"k": "v"}}))?;
                        configmaps.create(&pp, &cm).await.map(drop)
                    }
                    Kind::Secret => {
                        let s: Secret = serde_json::from_value(
                            json!({"metadata": meta, "stringData": {"k": "v"}}),
                        )?;
                        secrets.create(&pp, &s).await.map(drop)
                    }
                }
                .with_context(|| format!("creating {name} ({:?})", kind_of(i, n)))
            }
        })
        .buffer_unordered(WRITE_CONCURRENCY)
        .try_collect::<()>()
        .await
}

/// Deletes `objects` (Pods with no grace period: no kubelet would confirm them).
async fn delete_objects(
    client: kube::Client,
    ns: &str,
    objects: &[(Kind, String)],
) -> anyhow::Result<()> {
    let (pods, configmaps): (Api<Pod>, Api<ConfigMap>) = (
        Api::namespaced(client.clone(), ns),
        Api::namespaced(client, ns),
    );
    futures::stream::iter(objects)
        .map(|(kind, name)| {
            let (pods, configmaps) = (pods.clone(), configmaps.clone());
            async move {
                match kind {
                    Kind::Pod { .. } => pods
                        .delete(name, &DeleteParams::default().grace_period(0))
                        .await
                        .map(drop),
                    _ => configmaps
                        .delete(name, &DeleteParams::default())
                        .await
                        .map(drop),
                }
                .with_context(|| format!("deleting {name}"))
            }
        })
        .buffer_unordered(WRITE_CONCURRENCY)
        .try_collect::<()>()
        .await
}

/// A quota's usage: resource name to milli-units, as compared (the two managers may write the
/// same quantity in different forms; upstream canonicalises, and so does kpr).
type Usage = BTreeMap<String, i128>;

/// Each quota's expected `status.used`, counted from listings of `ns`.
async fn expected_usage(
    client: &kube::Client,
    ns: &str,
) -> anyhow::Result<BTreeMap<String, Usage>> {
    let lp = ListParams::default();
    let pods = Api::<Pod>::namespaced(client.clone(), ns).list(&lp).await?;
    let configmaps = Api::<ConfigMap>::namespaced(client.clone(), ns)
        .list(&lp)
        .await?
        .items
        .len() as i128;
    let secrets = Api::<Secret>::namespaced(client.clone(), ns)
        .list(&lp)
        .await?
        .items
        .len() as i128;
    let (mut all, mut not_best_effort, mut cpu, mut memory) = (0i128, 0i128, 0i128, 0i128);
    for p in &pods.items {
        let requests = p
            .spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .and_then(|c| c.resources.as_ref())
            .and_then(|r| r.requests.as_ref());
        all += 1;
        if let Some(r) = requests {
            not_best_effort += 1;
            if r.contains_key("cpu") {
                cpu += CPU_REQUEST_MILLI;
            }
            if r.contains_key("memory") {
                memory += MEMORY_REQUEST_MILLI;
            }
        }
    }
    let usage = |v: &[(&str, i128)]| -> Usage { v.iter().map(|&(k, n)| (k.into(), n)).collect() };
    Ok(BTreeMap::from([
        (
            "objects".into(),
            usage(&[
                ("pods", all * 1000),
                ("configmaps", configmaps * 1000),
                ("secrets", secrets * 1000),
                ("count/configmaps", configmaps * 1000),
            ]),
        ),
        (
            "compute".into(),
            usage(&[("requests.cpu", cpu), ("requests.memory", memory)]),
        ),
        (
            "not-best-effort".into(),
            usage(&[("pods", not_best_effort * 1000)]),
        ),
    ]))
}

/// Publishes every quota's `status.used` (milli-units) after each change; quotas whose status
/// has a quantity it cannot read publish it as -1 (never equal to an expected usage). Signals
/// `ready` after the first listing.
async fn track(
    api: Api<ResourceQuota>,
    tx: tokio::sync::watch::Sender<BTreeMap<String, Usage>>,
    ready: tokio::sync::oneshot::Sender<()>,
) -> anyhow::Result<()> {
    let mut stream = std::pin::pin!(watcher(api, watcher::Config::default()));
    let mut ready = Some(ready);
    let mut used: BTreeMap<String, Usage> = BTreeMap::new();
    let read = |q: &ResourceQuota| -> Usage {
        q.status
            .as_ref()
            .and_then(|s| s.used.as_ref())
            .map(|u| {
                u.iter()
                    .map(|(k, v)| (k.clone(), milli(&v.0).unwrap_or(-1)))
                    .collect()
            })
            .unwrap_or_default()
    };
    while let Some(event) = stream.try_next().await? {
        match event {
            watcher::Event::Init => used.clear(),
            watcher::Event::InitApply(q) | watcher::Event::Apply(q) => {
                used.insert(q.metadata.name.clone().unwrap_or_default(), read(&q));
            }
            watcher::Event::InitDone => {
                if let Some(tx) = ready.take() {
                    let _ = tx.send(());
                }
            }
            watcher::Event::Delete(q) => {
                used.remove(q.metadata.name.as_deref().unwrap_or_default());
            }
        }
        tx.send_replace(used.clone());
    }
    Ok(())
}

/// A quantity in milli-units, for the forms a quota's usage takes (a decimal number with an
/// optional `m`, SI `k M G T` or binary `Ki Mi Gi Ti` suffix); `None` for anything else.
fn milli(text: &str) -> Option<i128> {
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let multiplier: i128 = match suffix {
        "m" => 1,
        "" => 1_000,
        "k" => 1_000_000,
        "M" => 1_000_000_000,
        "G" => 1_000_000_000_000,
        "T" => 1_000_000_000_000_000,
        "Ki" => 1_024 * 1_000,
        "Mi" => 1_024 * 1_024 * 1_000,
        "Gi" => 1_024 * 1_024 * 1_024 * 1_000,
        "Ti" => 1_024 * 1_024 * 1_024 * 1_024 * 1_000,
        _ => return None,
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let whole: i128 = whole.parse().ok()?;
    let mut value = whole * multiplier;
    let mut scale = multiplier;
    for digit in fraction.chars() {
        scale /= 10;
        value += i128::from(digit.to_digit(10)?) * scale;
    }
    Some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_read_in_every_form_a_quota_writes() {
        let cases = [
            ("0", Some(0)),
            ("5", Some(5_000)),
            ("10m", Some(10)),
            ("1500m", Some(1_500)),
            ("40", Some(40_000)),
            ("1.5", Some(1_500)),
            ("16Mi", Some(MEMORY_REQUEST_MILLI)),
            ("62500Mi", Some(62_500 * MEMORY_REQUEST_MILLI / 16)),
            ("1Gi", Some(64 * MEMORY_REQUEST_MILLI)),
            ("2k", Some(2_000_000)),
            ("1e3", None),
            ("x", None),
        ];
        for (text, want) in cases {
            assert_eq!(milli(text), want, "{text}");
        }
    }

    #[test]
    fn objects_are_half_pods_a_quarter_configmaps_the_rest_secrets() {
        let n = 20;
        let kinds: Vec<Kind> = (0..n).map(|i| kind_of(i, n)).collect();
        let pods = kinds
            .iter()
            .filter(|k| matches!(k, Kind::Pod { .. }))
            .count();
        let best_effort = kinds
            .iter()
            .filter(|k| matches!(k, Kind::Pod { best_effort: true }))
            .count();
        let configmaps = kinds.iter().filter(|k| **k == Kind::ConfigMap).count();
        assert_eq!((pods, best_effort, configmaps), (10, 2, 5));
        assert_eq!(n - pods - configmaps, 5);
        assert!(object_name(9) < object_name(10));
    }
}
