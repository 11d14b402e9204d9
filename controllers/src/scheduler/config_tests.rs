use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use super::*;
use crate::scheduler::framework::{
    BindPlugin, BoxFuture, CycleState, FilterPlugin, NodeInfo, Plugin, QueueSortPlugin,
    QueuedPodInfo, ScorePlugin, Status,
};

/// A plugin that extends whatever the test registry says; does nothing.
struct Fake(&'static str);
impl Plugin for Fake {
    fn name(&self) -> &'static str {
        self.0
    }
}
impl FilterPlugin for Fake {
    fn filter(&self, _: &CycleState, _: &Pod, _: &NodeInfo) -> Status {
        Status::success()
    }
}
impl ScorePlugin for Fake {
    fn score(&self, _: &CycleState, _: &Pod, _: &NodeInfo) -> Result<i64, Status> {
        Ok(0)
    }
}
impl QueueSortPlugin for Fake {
    fn less(&self, _: &QueuedPodInfo, _: &QueuedPodInfo) -> bool {
        false
    }
}
impl BindPlugin for Fake {
    fn bind<'a>(&'a self, _: &'a CycleState, _: &'a Pod, _: &'a str) -> BoxFuture<'a, Status> {
        Box::pin(async { Status::success() })
    }
}

/// Default plugin names over fakes: filters, scorers (some both), sort, binder; `NodePorts`
/// validates its args (`bad: true` is rejected).
fn registry() -> Registry {
    let mut r = Registry::new();
    for name in ["NodeUnschedulable", "NodeName", "NodePorts"] {
        r.register(name, move |args, _| {
            if args.and_then(|a| a.get("bad")).is_some() {
                return Err("bad: unknown field".to_string());
            }
            Ok(Built::new(name).filter(Arc::new(Fake(name))))
        });
    }
    for name in ["TaintToleration", "NodeAffinity"] {
        r.register(name, move |_, _| {
            let p = Arc::new(Fake(name));
            Ok(Built::new(name).filter(p.clone()).score(p))
        });
    }
    r.register("ImageLocality", |_, _| {
        Ok(Built::new("ImageLocality").score(Arc::new(Fake("ImageLocality"))))
    });
    r.register("PrioritySort", |_, _| {
        Ok(Built::new("PrioritySort").queue_sort(Arc::new(Fake("PrioritySort"))))
    });
    r.register("OtherSort", |_, _| {
        Ok(Built::new("OtherSort").queue_sort(Arc::new(Fake("OtherSort"))))
    });
    r.register("DefaultBinder", |_, _| {
        Ok(Built::new("DefaultBinder").bind(Arc::new(Fake("DefaultBinder"))))
    });
    r
}

/// "profile: filter=a,b score=c:3,d:1" for comparing built profiles.
fn describe(fw: &Framework) -> String {
    let filters: Vec<&str> = fw.filter.iter().map(|p| p.name()).collect();
    let scores: Vec<String> = fw
        .score
        .iter()
        .map(|(p, w)| format!("{}:{w}", p.name()))
        .collect();
    format!(
        "{}: filter={} score={}",
        fw.name,
        filters.join(","),
        scores.join(",")
    )
}

fn build_yaml(yaml: &str) -> Result<Vec<String>, String> {
    let cfg = parse(yaml)?;
    let c = build(&cfg, &registry(), &BuildContext::default())?;
    Ok(c.profiles.iter().map(|p| describe(p)).collect())
}

#[test]
fn profiles_build_as_upstream_merges_and_expands_them() {
    type Case<'a> = (&'a str, &'a str, Result<Vec<&'a str>, &'a str>);
    let cases: Vec<Case> = vec![
        (
            "no file: the default profile, default order and weights",
            "",
            Ok(vec![
                "default-scheduler: filter=NodeUnschedulable,NodeName,TaintToleration,NodeAffinity,NodePorts score=TaintToleration:3,NodeAffinity:2,ImageLocality:1",
            ]),
        ),
        (
            "a score-point entry overrides the multiPoint weight and goes first",
            "profiles:\n- plugins:\n    score:\n      enabled:\n      - name: ImageLocality\n        weight: 5\n",
            Ok(vec![
                "default-scheduler: filter=NodeUnschedulable,NodeName,TaintToleration,NodeAffinity,NodePorts score=ImageLocality:5,TaintToleration:3,NodeAffinity:2",
            ]),
        ),
        (
            "disabled at one point only",
            "profiles:\n- plugins:\n    score:\n      disabled:\n      - name: TaintToleration\n",
            Ok(vec![
                "default-scheduler: filter=NodeUnschedulable,NodeName,TaintToleration,NodeAffinity,NodePorts score=NodeAffinity:2,ImageLocality:1",
            ]),
        ),
        (
            "all scores disabled with '*'",
            "profiles:\n- plugins:\n    score:\n      disabled:\n      - name: '*'\n",
            Ok(vec![
                "default-scheduler: filter=NodeUnschedulable,NodeName,TaintToleration,NodeAffinity,NodePorts score=",
            ]),
        ),
        (
            "multiPoint re-weighting in place, two profiles",
            "profiles:\n- schedulerName: a\n- schedulerName: b\n  plugins:\n    multiPoint:\n      enabled:\n      - name: NodeAffinity\n        weight: 7\n      disabled:\n      - name: NodeName\n",
            Ok(vec![
                "a: filter=NodeUnschedulable,NodeName,TaintToleration,NodeAffinity,NodePorts score=TaintToleration:3,NodeAffinity:2,ImageLocality:1",
                "b: filter=NodeUnschedulable,TaintToleration,NodeAffinity,NodePorts score=TaintToleration:3,NodeAffinity:7,ImageLocality:1",
            ]),
        ),
        (
            "an unknown plugin names its field",
            "profiles:\n- plugins:\n    filter:\n      enabled:\n      - name: Nope\n",
            Err("profiles[0].plugins.filter.enabled[0].name: unknown plugin \"Nope\""),
        ),
        (
            "a plugin this scheduler does not build is refused by name",
            "profiles:\n- plugins:\n    multiPoint:\n      enabled:\n      - name: VolumeBinding\n",
            Err("profiles[0].plugins.multiPoint.enabled[0].name: VolumeBinding is not supported by this scheduler (it needs the PersistentVolume / CSI / DRA machinery, which is not built)"),
        ),
        (
            "a plugin at a point it does not extend",
            "profiles:\n- plugins:\n    score:\n      enabled:\n      - name: NodeName\n",
            Err("profiles[0].plugins.score.enabled[0].name: plugin \"NodeName\" does not extend ScorePlugin"),
        ),
        (
            "bad args name the pluginConfig entry",
            "profiles:\n- pluginConfig:\n  - name: NodeAffinity\n  - name: NodePorts\n    args: {bad: true}\n",
            Err("profiles[0].pluginConfig[1].args: NodePorts: bad: unknown field"),
        ),
        (
            "pluginConfig for an unknown plugin",
            "profiles:\n- pluginConfig:\n  - name: Nope\n",
            Err("profiles[0].pluginConfig[0].name: unknown plugin \"Nope\""),
        ),
        (
            "an unknown field names its path",
            "profiles:\n- schedulerNam: x\n",
            Err("profiles[0].schedulerNam: unknown field `schedulerNam`"),
        ),
        (
            "duplicate profiles",
            "profiles:\n- schedulerName: a\n- schedulerName: a\n",
            Err("profiles[1].schedulerName: duplicate profile \"a\""),
        ),
        (
            "profiles must share the queue sort",
            "profiles:\n- schedulerName: a\n- schedulerName: b\n  plugins:\n    queueSort:\n      enabled: [{name: OtherSort}]\n      disabled: [{name: '*'}]\n",
            Err("profiles[1].plugins.queueSort: all profiles must have the same queue sort plugin (\"PrioritySort\" and \"OtherSort\")"),
        ),
        (
            "percentageOfNodesToScore out of range",
            "percentageOfNodesToScore: 101\n",
            Err("percentageOfNodesToScore: 101 is not in 0..=100"),
        ),
        (
            "another apiVersion",
            "apiVersion: kubescheduler.config.k8s.io/v1beta3\n",
            Err("apiVersion: \"kubescheduler.config.k8s.io/v1beta3\" is not supported (only kubescheduler.config.k8s.io/v1)"),
        ),
    ];
    for (name, yaml, want) in cases {
        let got = build_yaml(yaml);
        match (&got, &want) {
            (Ok(g), Ok(w)) => assert_eq!(g, w, "{name}"),
            (Err(g), Err(w)) => assert!(g.starts_with(w), "{name}: got {g:?}, want {w:?}"),
            _ => panic!("{name}: got {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn top_level_settings_are_read() {
    let cfg = parse(
        "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nparallelism: 4\npercentageOfNodesToScore: 30\npodInitialBackoffSeconds: 2\npodMaxBackoffSeconds: 20\nleaderElection:\n  leaderElect: false\nclientConnection:\n  qps: 50\n",
    )
    .unwrap();
    let c = build(&cfg, &registry(), &BuildContext::default()).unwrap();
    assert_eq!(c.parallelism, 4);
    assert_eq!(c.percentage_of_nodes_to_score, 30);
    assert_eq!(c.backoff.initial.as_secs(), 2);
    assert_eq!(c.backoff.max.as_secs(), 20);
    let limit = cfg.client_limit().unwrap();
    assert_eq!(
        (limit.qps, limit.burst),
        (50.0, 100),
        "burst defaults as upstream's"
    );
}

#[test]
fn client_connection_limits_the_client_and_bad_values_are_named() {
    let limit = |yaml: &str| parse(yaml).unwrap().client_limit();
    let none = limit("{}").unwrap();
    assert!(none.layer().is_none(), "no qps: no limit");
    let set = limit("clientConnection:\n  qps: 200\n  burst: 400\n").unwrap();
    assert_eq!((set.qps, set.burst), (200.0, 400));
    assert!(limit("clientConnection:\n  qps: -1\n")
        .unwrap()
        .layer()
        .is_none());
    let e = limit("clientConnection:\n  qps: fast\n").unwrap_err();
    assert!(e.contains("clientConnection.qps"), "{e}");
    let e = limit("clientConnection:\n  qps: 5\n  burst: -3\n").unwrap_err();
    assert!(e.contains("clientConnection.burst"), "{e}");
}
