//! Placement quality, differentially: the same workload (162 Pods in seven groups: soft and
//! hard zone spread, hard hostname spread, preferred node affinity, preferred pod affinity to
//! anchors that repel each other, plain) is scheduled by kube-scheduler and by ours, each on
//! twelve identical nodes of its own (3 zones, 4/8/16/8 CPUs per zone, every other node
//! disk=ssd), [`TRIALS`] times each, all at the same time, Pods created in the same interleaved
//! order, each once the one before it is bound (or unschedulable); then per-node requested CPU
//! and memory fractions, spread
//! skew per constraint and preferred-affinity satisfaction are compared, the mean over ours no
//! worse than the mean over kube-scheduler's within [`TOLERANCE`]. Neither scheduler is
//! deterministic (both pick at random among equally scored nodes, and a different pick early
//! changes every later score), hence trials and tolerances rather than equal placements.
//!
//! Why one Pod at a time: with creates in flight, the order in which Pods reach a scheduler's
//! queue depends on the machine's load, and the order moves these metrics more than the
//! schedulers do (a group placed after all the others gives a different minimum memory fraction
//! by more than the tolerance; docs/SCHEDULER.md, "Placement quality"). Decided one by one, both
//! schedulers see the same sequence of cluster states up to their own tie-breaks. Six trials
//! each: with identical distributions, a comparison of means over three trials within these
//! tolerances still fails about one run in 260; over six, about one in 10,000.
//!
//! Owns: namespaces `place-<impl>-<trial>` and nodes `<impl>-<trial>-n*` (label and taint
//! `kpr.test/set=<impl>-<trial>`, which only that run's Pods select and tolerate).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, PostParams, WatchEvent, WatchParams};
use kube::{Api, Client};
use serde_json::{json, Value};

use super::diff_cluster::{create_nodes, namespace, node_of, scheduled_condition, Impl, NodeSpec};

const SET: &str = "kpr.test/set";
const ZONE: &str = "topology.kubernetes.io/zone";
const HOST: &str = "kubernetes.io/hostname";
const NODES: usize = 12;
/// For the whole workload of one set (a deadline against a stuck scheduler, not a measure).
const WAIT: Duration = Duration::from_secs(240);

/// Placement runs per scheduler: one run is at the mercy of random tie-breaking, so the
/// comparison is between the means over the trials.
pub const TRIALS: usize = 6;

/// One placement run: its scheduler and trial number (nodes, namespace and label value
/// `<impl>-<trial>`).
#[derive(Debug, Clone, Copy)]
pub struct Set {
    pub imp: Impl,
    pub trial: usize,
}

impl Set {
    pub fn all() -> Vec<Set> {
        Impl::BOTH
            .iter()
            .flat_map(|&imp| (0..TRIALS).map(move |trial| Set { imp, trial }))
            .collect()
    }

    fn tag(self) -> String {
        format!("{}-{}", self.imp.tag(), self.trial)
    }
}

fn ns(set: Set) -> String {
    format!("place-{}", set.tag())
}

/// Node i: zone z(i mod 3), CPU 4/8/16/8 by i div 3 (every zone has the same capacity),
/// disk=ssd on even i.
fn node_shape(i: usize) -> (String, u64, u64, bool) {
    let (cpu, mem_gi) = [(4, 8), (8, 16), (16, 32), (8, 16)][i / 3];
    (format!("z{}", i % 3), cpu, mem_gi, i.is_multiple_of(2))
}

pub fn nodes(set: Set) -> Vec<NodeSpec> {
    (0..NODES)
        .map(|i| {
            let (zone, cpu, mem, ssd) = node_shape(i);
            let mut labels: BTreeMap<String, String> =
                [(SET.to_string(), set.tag()), (ZONE.to_string(), zone)].into();
            if ssd {
                labels.insert("disk".into(), "ssd".into());
            }
            NodeSpec {
                name: format!("{}-n{i:02}", set.tag()),
                labels,
                taints: vec![json!({"key": SET, "value": set.tag(), "effect": "NoSchedule"})],
                allocatable: [
                    ("cpu".to_string(), cpu.to_string()),
                    ("memory".to_string(), format!("{mem}Gi")),
                    ("pods".to_string(), "110".to_string()),
                ]
                .into(),
                unschedulable: false,
            }
        })
        .collect()
}

/// One group of identical Pods (label `app=<name>`).
struct Group {
    name: &'static str,
    count: usize,
    cpu_m: u64,
    mem_mi: u64,
    /// Merged into the spec.
    extra: Value,
}

fn groups() -> Vec<Group> {
    let sel = |app: &str| json!({"matchLabels": {"app": app}});
    let spread = |key: &str, when: &str, app: &str| {
        json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": key,
            "whenUnsatisfiable": when, "labelSelector": sel(app)}]})
    };
    vec![
        Group {
            name: "web",
            count: 48,
            cpu_m: 500,
            mem_mi: 512,
            extra: spread(ZONE, "ScheduleAnyway", "web"),
        },
        Group {
            name: "db",
            count: 24,
            cpu_m: 1000,
            mem_mi: 2048,
            extra: spread(ZONE, "DoNotSchedule", "db"),
        },
        Group {
            name: "cache",
            count: 24,
            cpu_m: 250,
            mem_mi: 1024,
            extra: json!({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 80, "preference": {"matchExpressions": [
                    {"key": "disk", "operator": "In", "values": ["ssd"]}]}}]}}}),
        },
        // Before the sidecars in each turn, so that the first sidecar finds one; one per node
        // at most (or the sidecars' preferred terms, which attract anchors too, pile them up).
        Group {
            name: "anchor",
            count: 6,
            cpu_m: 500,
            mem_mi: 512,
            extra: json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": sel("anchor"), "topologyKey": HOST}]}}}),
        },
        Group {
            name: "sidecar",
            count: 24,
            cpu_m: 100,
            mem_mi: 128,
            extra: json!({"affinity": {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 100, "podAffinityTerm": {"labelSelector": sel("anchor"), "topologyKey": HOST}}]}}}),
        },
        Group {
            name: "batch",
            count: 12,
            cpu_m: 500,
            mem_mi: 1024,
            extra: json!({}),
        },
        Group {
            name: "spread-host",
            count: 24,
            cpu_m: 200,
            mem_mi: 256,
            extra: spread(HOST, "DoNotSchedule", "spread-host"),
        },
    ]
}

/// The Pods in creation order: the groups interleaved, one of each in turn.
fn workload(set: Set) -> Vec<(Pod, &'static str)> {
    let groups = groups();
    let most = groups.iter().map(|g| g.count).max().unwrap_or(0);
    let mut out = Vec::new();
    for k in 0..most {
        for g in groups.iter().filter(|g| k < g.count) {
            let mut spec = json!({
                "schedulerName": set.imp.place_name(),
                "nodeSelector": {SET: set.tag()},
                "tolerations": [{"key": SET, "operator": "Equal", "value": set.tag(), "effect": "NoSchedule"}],
                "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "c", "image": "busybox", "resources": {"requests": {
                    "cpu": format!("{}m", g.cpu_m), "memory": format!("{}Mi", g.mem_mi)}}}],
            });
            spec.as_object_mut()
                .unwrap()
                .extend(g.extra.as_object().cloned().unwrap_or_default());
            let pod = json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("{}-{k}", g.name), "labels": {"app": g.name}},
                "spec": spec});
            out.push((serde_json::from_value(pod).expect("a valid Pod"), g.name));
        }
    }
    out
}

/// Namespaces and nodes of both sets (before the schedulers start).
pub async fn setup(client: &Client) -> anyhow::Result<()> {
    for set in Set::all() {
        namespace(client, &ns(set)).await?;
        create_nodes(client, &nodes(set)).await?;
    }
    Ok(())
}

fn stats(v: &[f64]) -> (f64, f64, f64, f64) {
    let n = v.len().max(1) as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
    let max = v.iter().cloned().fold(f64::MIN, f64::max);
    let min = v.iter().cloned().fold(f64::MAX, f64::min);
    (max, min, mean, var.sqrt())
}

/// One scheduler's result.
#[derive(Debug, Clone, Default)]
pub struct Placement {
    pub total: usize,
    pub bound: usize,
    /// Requested CPU / allocatable, per node.
    pub cpu: Vec<f64>,
    pub mem: Vec<f64>,
    /// Group → (topology key, max - min Pods of the group per domain, maxSkew, hard).
    pub skew: BTreeMap<&'static str, (&'static str, usize, usize, bool)>,
    /// Share of `cache` Pods on disk=ssd nodes (preferred node affinity).
    pub ssd_share: f64,
    /// Share of `sidecar` Pods on a node with an `anchor` Pod (preferred pod affinity).
    pub colocated_share: f64,
    /// Group → its Pods per zone z0, z1, z2.
    pub zones: BTreeMap<&'static str, [usize; 3]>,
    /// First create to last decision.
    pub elapsed: Duration,
}

/// Creates the workload of `set` and waits until every Pod is bound or unschedulable.
pub async fn run(client: &Client, set: Set) -> anyhow::Result<Placement> {
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns(set));
    let pods = workload(set);
    let start = Instant::now();
    let deadline = start + WAIT;
    // Each Pod once the one before it is decided, seen through one watch of the namespace.
    let rv = api
        .list_metadata(&ListParams::default().limit(1))
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    let mut events = api.watch(&WatchParams::default(), &rv).await?.boxed();
    for (p, _) in &pods {
        let name = p.metadata.name.clone().unwrap_or_default();
        api.create(&PostParams::default(), p)
            .await
            .with_context(|| format!("{}: creating {name}", set.tag()))?;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let ev = tokio::time::timeout(left, events.next())
                .await
                .map_err(|_| anyhow::anyhow!("{}: after {WAIT:?}, {name} undecided", set.tag()))?
                .with_context(|| format!("{}: the watch ended", set.tag()))??;
            let pod = match ev {
                WatchEvent::Added(p) | WatchEvent::Modified(p) => p,
                WatchEvent::Error(e) => bail!("{}: watch error: {e:?}", set.tag()),
                _ => continue,
            };
            let decided = node_of(&pod).is_some()
                || scheduled_condition(&pod).is_some_and(|(r, _)| r == "Unschedulable");
            if pod.metadata.name.as_deref() == Some(name.as_str()) && decided {
                break;
            }
        }
    }
    let list = loop {
        let list = api.list(&ListParams::default()).await?;
        let undecided = list
            .items
            .iter()
            .filter(|p| {
                node_of(p).is_none()
                    && scheduled_condition(p).is_none_or(|(r, _)| r != "Unschedulable")
            })
            .count();
        if list.items.len() == pods.len() && undecided == 0 {
            break list;
        }
        if Instant::now() > deadline {
            bail!(
                "{}: after {WAIT:?}, {undecided} of {} Pods neither bound nor unschedulable",
                set.tag(),
                pods.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let elapsed = start.elapsed();
    let group_of: BTreeMap<String, &'static str> = pods
        .iter()
        .map(|(p, g)| (p.metadata.name.clone().unwrap_or_default(), *g))
        .collect();
    let groups = groups();
    let node_specs = nodes(set);
    // node → group → Pods.
    let mut on: BTreeMap<&str, BTreeMap<&str, usize>> = BTreeMap::new();
    let mut bound = 0;
    for p in &list.items {
        let Some(n) = node_of(p) else { continue };
        let Some(node) = node_specs.iter().find(|s| s.name == n) else {
            bail!(
                "{}: Pod {:?} bound to {n}, not one of its set",
                set.tag(),
                p.metadata.name
            );
        };
        let g = group_of[p.metadata.name.as_deref().unwrap_or_default()];
        *on.entry(node.name.as_str())
            .or_default()
            .entry(g)
            .or_default() += 1;
        bound += 1;
    }
    let mut cpu = Vec::new();
    let mut mem = Vec::new();
    for (i, n) in node_specs.iter().enumerate() {
        let (_, c, m, _) = node_shape(i);
        let here = on.get(n.name.as_str());
        let (mut rc, mut rm) = (0u64, 0u64);
        for g in &groups {
            let k = here.and_then(|h| h.get(g.name)).copied().unwrap_or(0) as u64;
            rc += k * g.cpu_m;
            rm += k * g.mem_mi;
        }
        cpu.push(rc as f64 / (c * 1000) as f64);
        mem.push(rm as f64 / (m * 1024) as f64);
    }
    let count = |g: &str, n: &NodeSpec| {
        on.get(n.name.as_str())
            .and_then(|h| h.get(g))
            .copied()
            .unwrap_or(0)
    };
    let mut skew = BTreeMap::new();
    for (g, key, hard) in [
        ("web", ZONE, false),
        ("db", ZONE, true),
        ("spread-host", HOST, true),
    ] {
        let mut domains: BTreeMap<String, usize> = BTreeMap::new();
        for n in &node_specs {
            let d = if key == HOST {
                n.name.clone()
            } else {
                n.labels[ZONE].clone()
            };
            *domains.entry(d).or_default() += count(g, n);
        }
        let max = domains.values().max().copied().unwrap_or(0);
        let min = domains.values().min().copied().unwrap_or(0);
        skew.insert(g, (key, max - min, 1, hard));
    }
    let share = |g: &str, ok: &dyn Fn(&NodeSpec) -> bool| {
        let all: usize = node_specs.iter().map(|n| count(g, n)).sum();
        let good: usize = node_specs
            .iter()
            .filter(|n| ok(n))
            .map(|n| count(g, n))
            .sum();
        if all == 0 {
            0.0
        } else {
            good as f64 / all as f64
        }
    };
    let mut zones = BTreeMap::new();
    for g in &groups {
        let mut per = [0; 3];
        for (i, n) in node_specs.iter().enumerate() {
            per[i % 3] += count(g.name, n);
        }
        zones.insert(g.name, per);
    }
    let ssd_share = share("cache", &|n| n.labels.contains_key("disk"));
    let colocated_share = share("sidecar", &|n| count("anchor", n) > 0);
    Ok(Placement {
        total: pods.len(),
        bound,
        cpu,
        mem,
        skew,
        ssd_share,
        colocated_share,
        zones,
        elapsed,
    })
}

/// How much worse than kube-scheduler ours may be: both pick at random among equal scores.
pub struct Tolerance {
    /// On the max, min and standard deviation of per-node requested CPU and memory fractions.
    pub utilisation: f64,
    /// On a soft (ScheduleAnyway) constraint's skew, in Pods.
    pub soft_skew: f64,
    /// On a preferred-affinity satisfaction share.
    pub share: f64,
}

pub const TOLERANCE: Tolerance = Tolerance {
    utilisation: 0.05,
    soft_skew: 2.0,
    share: 0.10,
};

fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let v: Vec<f64> = v.collect();
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// A table cell: the mean over the trials, and their range.
fn cell(v: &[f64], digits: usize) -> String {
    let lo = v.iter().cloned().fold(f64::MAX, f64::min);
    let hi = v.iter().cloned().fold(f64::MIN, f64::max);
    format!(
        "{:.d$} ({:.d$}-{:.d$})",
        mean(v.iter().cloned()),
        lo,
        hi,
        d = digits
    )
}

/// The table (means over the trials, ranges in parentheses), and every way ours is worse than
/// kube-scheduler's beyond [`TOLERANCE`], mean against mean.
pub fn compare(up: &[Placement], kpr: &[Placement]) -> (String, Vec<String>) {
    let t = &TOLERANCE;
    let mut rows: Vec<(String, String, String)> = Vec::new();
    let mut worse = Vec::new();
    let mut hard_violations = Vec::new();
    // (name, per-trial values of each, higher is worse, tolerance, digits)
    let mut metric = |name: String,
                      f: &dyn Fn(&Placement) -> f64,
                      higher_worse: bool,
                      tol: f64,
                      digits: usize| {
        let u: Vec<f64> = up.iter().map(f).collect();
        let k: Vec<f64> = kpr.iter().map(f).collect();
        let (mu, mk) = (mean(u.iter().cloned()), mean(k.iter().cloned()));
        rows.push((name.clone(), cell(&u, digits), cell(&k, digits)));
        let bad = if higher_worse {
            mk > mu + tol
        } else {
            mk < mu - tol
        };
        if bad {
            let sign = if higher_worse { '+' } else { '-' };
            worse.push(format!(
                "{name}: mean {mk:.3} against kube-scheduler's {mu:.3} {sign} {tol}"
            ));
        }
    };
    metric(
        format!("Pods bound (of {})", up[0].total),
        &|p| p.bound as f64,
        false,
        0.0,
        1,
    );
    for (what, pick) in [
        (
            "cpu",
            (|p: &Placement| &p.cpu) as fn(&Placement) -> &Vec<f64>,
        ),
        ("memory", |p: &Placement| &p.mem),
    ] {
        metric(
            format!("{what} requested fraction, max over nodes"),
            &|p| stats(pick(p)).0,
            true,
            t.utilisation,
            3,
        );
        metric(
            format!("{what} requested fraction, min over nodes"),
            &|p| stats(pick(p)).1,
            false,
            t.utilisation,
            3,
        );
        metric(
            format!("{what} requested fraction, stddev over nodes"),
            &|p| stats(pick(p)).3,
            true,
            t.utilisation,
            3,
        );
    }
    let first = &up[0];
    for (g, (key, _, max_skew, hard)) in &first.skew {
        let kind = if *hard {
            "DoNotSchedule"
        } else {
            "ScheduleAnyway"
        };
        // A hard constraint's skew may not exceed maxSkew at all (either scheduler).
        let tol = if *hard { 0.0 } else { t.soft_skew };
        metric(
            format!("skew of {g} over {key} ({kind}, maxSkew {max_skew})"),
            &|p| p.skew[g].1 as f64,
            true,
            tol,
            1,
        );
        for (who, runs) in [("kube-scheduler", up), ("kpr", kpr)] {
            if *hard && runs.iter().any(|p| p.skew[g].1 > *max_skew) {
                hard_violations.push(format!("{who}: hard skew of {g} above maxSkew {max_skew}"));
            }
        }
    }
    metric(
        "cache on disk=ssd (preferred node affinity)".into(),
        &|p| p.ssd_share,
        false,
        t.share,
        3,
    );
    metric(
        "sidecar next to an anchor (preferred pod affinity)".into(),
        &|p| p.colocated_share,
        false,
        t.share,
        3,
    );
    worse.extend(hard_violations);
    rows.push((
        "first create to last decision (s)".into(),
        cell(
            &up.iter()
                .map(|p| p.elapsed.as_secs_f64())
                .collect::<Vec<_>>(),
            1,
        ),
        cell(
            &kpr.iter()
                .map(|p| p.elapsed.as_secs_f64())
                .collect::<Vec<_>>(),
            1,
        ),
    ));
    let mut s = format!(
        "{:<56} {:>22} {:>22}\n",
        format!("placement, {TRIALS} trials each: mean (range)"),
        "kube-scheduler",
        "kpr"
    );
    for (a, b, c) in rows {
        s += &format!("{a:<56} {b:>22} {c:>22}\n");
    }
    for (who, runs) in [("kube-scheduler", up), ("kpr", kpr)] {
        for (i, p) in runs.iter().enumerate() {
            let zones: Vec<String> = p
                .zones
                .iter()
                .map(|(g, z)| format!("{g} {}/{}/{}", z[0], z[1], z[2]))
                .collect();
            s += &format!("{who} trial {i}, Pods per zone: {}\n", zones.join(", "));
        }
    }
    (s, worse)
}
