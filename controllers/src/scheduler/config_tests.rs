use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use super::*;
use crate::scheduler::framework::{
    BindPlugin, BoxFuture, CycleState, FilterPlugin, NodeInfo, Plugin, QueueSortPlugin,
    QueuedPodInfo, ScorePlugin, Status,
};
use crate::scheduler::plugin_args::PluginArgs;

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

/// Typed args for the fake `NodePorts`: `limit` in 0..=10.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
struct FakeArgs {
    limit: i32,
}

impl PluginArgs for FakeArgs {
    const KIND: &'static str = "NodePortsArgs";
    fn validate(&self, path: &str) -> Vec<String> {
        if (0..=10).contains(&self.limit) {
            return Vec::new();
        }
        vec![format!(
            "{path}.limit: Invalid value: {}: not in valid range [0, 10]",
            self.limit
        )]
    }
}

/// Default plugin names over fakes: filters, scorers (some both), sort, binder; `NodePorts`
/// takes [`FakeArgs`].
fn registry() -> Registry {
    let mut r = Registry::new();
    for name in ["NodeUnschedulable", "NodeName"] {
        r.register(name, move |_| {
            Ok(Built::new(name).filter(Arc::new(Fake(name))))
        });
    }
    r.register_with_args("NodePorts", |_: FakeArgs, _| {
        Ok(Built::new("NodePorts").filter(Arc::new(Fake("NodePorts"))))
    });
    for name in ["TaintToleration", "NodeAffinity"] {
        r.register(name, move |_| {
            let p = Arc::new(Fake(name));
            Ok(Built::new(name).filter(p.clone()).score(p))
        });
    }
    r.register("ImageLocality", |_| {
        Ok(Built::new("ImageLocality").score(Arc::new(Fake("ImageLocality"))))
    });
    r.register("PrioritySort", |_| {
        Ok(Built::new("PrioritySort").queue_sort(Arc::new(Fake("PrioritySort"))))
    });
    r.register("OtherSort", |_| {
        Ok(Built::new("OtherSort").queue_sort(Arc::new(Fake("OtherSort"))))
    });
    r.register("DefaultBinder", |_| {
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
            "profiles:\n- plugins:\n    multiPoint:\n      enabled:\n      - name: DynamicResources\n",
            Err("profiles[0].plugins.multiPoint.enabled[0].name: DynamicResources is not supported by this scheduler (it needs the DRA machinery, which is not built)"),
        ),
        (
            "a plugin at a point it does not extend",
            "profiles:\n- plugins:\n    score:\n      enabled:\n      - name: NodeName\n",
            Err("profiles[0].plugins.score.enabled[0].name: plugin \"NodeName\" does not extend ScorePlugin"),
        ),
        (
            "args of an unknown field name the field under the pluginConfig entry",
            "profiles:\n- pluginConfig:\n  - name: NodeAffinity\n  - name: NodePorts\n    args: {bad: true}\n",
            Err("profiles[0].pluginConfig[1].args.bad: unknown field `bad`, expected `limit`"),
        ),
        (
            "args that do not validate name the field",
            "profiles:\n- schedulerName: a\n- schedulerName: b\n  pluginConfig:\n  - name: NodePorts\n    args: {limit: 11}\n",
            Err("profiles[1].pluginConfig[0].args.limit: Invalid value: 11: not in valid range [0, 10]"),
        ),
        (
            "args of another kind",
            "profiles:\n- pluginConfig:\n  - name: NodePorts\n    args: {kind: NodeAffinityArgs}\n",
            Err("profiles[0].pluginConfig[0].args.kind: Invalid value: \"NodeAffinityArgs\""),
        ),
        (
            "args for a plugin without args are ignored, as upstream",
            "profiles:\n- pluginConfig:\n  - name: NodeName\n    args: {anything: 1}\n  - name: NodePorts\n    args: {kind: NodePortsArgs, apiVersion: kubescheduler.config.k8s.io/v1, limit: 3}\n",
            Ok(vec![
                "default-scheduler: filter=NodeUnschedulable,NodeName,TaintToleration,NodeAffinity,NodePorts score=TaintToleration:3,NodeAffinity:2,ImageLocality:1",
            ]),
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

/// The built-in registry with a binder that needs no API client.
fn builtin() -> Registry {
    let mut r = Registry::builtin();
    r.register("DefaultBinder", |_| {
        Ok(Built::new("DefaultBinder").bind(Arc::new(Fake("DefaultBinder"))))
    });
    r
}

#[test]
fn builtin_plugin_args_are_typed_and_validated_naming_the_field() {
    let with_args = |name: &str, args: &str| -> Result<(), String> {
        let yaml = format!("profiles:\n- pluginConfig:\n  - name: {name}\n    args: {args}\n");
        build(&parse(&yaml)?, &builtin(), &BuildContext::default()).map(|_| ())
    };
    let good = [
        ("NodeResourcesFit", "null"),
        (
            "NodeResourcesFit",
            "{kind: NodeResourcesFitArgs, apiVersion: kubescheduler.config.k8s.io/v1, ignoredResources: [example.com/foo], ignoredResourceGroups: [example.com], scoringStrategy: {type: RequestedToCapacityRatio, resources: [{name: cpu}], requestedToCapacityRatio: {shape: [{utilization: 0, score: 0}, {utilization: 100, score: 10}]}}}",
        ),
        ("NodeResourcesFit", "{scoringStrategy: {type: MostAllocated}}"),
        (
            "NodeResourcesBalancedAllocation",
            "{resources: [{name: cpu, weight: 1}, {name: example.com/gpu}]}",
        ),
        (
            "PodTopologySpread",
            "{defaultingType: List, defaultConstraints: [{maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: ScheduleAnyway}]}",
        ),
        ("PodTopologySpread", "{defaultingType: ''}"),
        (
            "InterPodAffinity",
            "{hardPodAffinityWeight: 0, ignorePreferredTermsOfExistingPods: true}",
        ),
        (
            "NodeAffinity",
            "{addedAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: zone, operator: In, values: [a]}]}]}}}",
        ),
        (
            "DefaultPreemption",
            "{minCandidateNodesPercentage: 0, minCandidateNodesAbsolute: 5}",
        ),
        ("VolumeBinding", "{bindTimeoutSeconds: 30}"),
    ];
    for (name, args) in good {
        if let Err(e) = with_args(name, args) {
            panic!("{name} {args}: {e}");
        }
    }
    let at = "profiles[0].pluginConfig[0].args";
    let bad = [
        (
            "NodeResourcesFit",
            "{scoringStrategy: {type: Random}}",
            format!("{at}.scoringStrategy.type: unknown variant `Random`, expected one of `LeastAllocated`, `MostAllocated`, `RequestedToCapacityRatio`"),
        ),
        (
            "NodeResourcesFit",
            "{scoringStrategy: {resources: [{name: cpu}]}}",
            format!("{at}.scoringStrategy.type: Unsupported value: \"\": supported values: \"LeastAllocated\", \"MostAllocated\", \"RequestedToCapacityRatio\""),
        ),
        (
            "NodeResourcesFit",
            "{scoringStrategy: {type: MostAllocated, requestedToCapacityRatio: {shape: [{utilization: 0, score: 1}]}}}",
            format!("{at}.scoringStrategy.requestedToCapacityRatio: Forbidden: must be nil when type is not RequestedToCapacityRatio"),
        ),
        (
            "NodeResourcesFit",
            "{scoringStrategy: {type: RequestedToCapacityRatio}}",
            format!("{at}.scoringStrategy.requestedToCapacityRatio: Required value"),
        ),
        (
            "NodeResourcesFit",
            "{scoringStrategy: {type: MostAllocated, resources: [{name: cpu, weight: 101}]}}",
            format!("{at}.scoringStrategy.resources[0].weight: Invalid value: 101: resource weight of cpu not in valid range (0, 100]"),
        ),
        (
            "NodeResourcesFit",
            "{scoringStrategy: {type: MostAllocated, resources: [{name: cpu, wieght: 1}]}}",
            format!("{at}.scoringStrategy.resources[0].wieght: unknown field `wieght`"),
        ),
        (
            "NodeResourcesFit",
            "{ignoredResourceGroups: [example.com/x]}",
            format!("{at}.ignoredResourceGroups[0]: Invalid value: \"example.com/x\": resource group name can't contain '/'"),
        ),
        (
            "NodeResourcesBalancedAllocation",
            "{resources: [{name: cpu, weight: 2}, {name: cpu}]}",
            format!("{at}.resources[0].weight: Invalid value: 2: must be 1; {at}.resources[1].name: Duplicate value: \"cpu\""),
        ),
        (
            "PodTopologySpread",
            "{defaultingType: Sometimes}",
            format!("{at}.defaultingType: unknown variant `Sometimes`"),
        ),
        (
            "PodTopologySpread",
            "{defaultConstraints: [{maxSkew: 1, topologyKey: zone, whenUnsatisfiable: ScheduleAnyway}]}",
            format!("{at}.defaultingType: Invalid value: \"System\": when .defaultConstraints are not empty"),
        ),
        (
            "PodTopologySpread",
            "{defaultingType: List, defaultConstraints: [{maxSkew: 0, topologyKey: zone, whenUnsatisfiable: Never}]}",
            format!("{at}.defaultConstraints[0].maxSkew: Invalid value: 0: not in valid range (0, inf); {at}.defaultConstraints[0].whenUnsatisfiable: Unsupported value: \"Never\""),
        ),
        (
            "PodTopologySpread",
            "{defaultingType: List, defaultConstraints: [{maxSkew: 1, topologyKey: 'a b', whenUnsatisfiable: DoNotSchedule}, {maxSkew: 2, topologyKey: 'a b', whenUnsatisfiable: DoNotSchedule}]}",
            format!("{at}.defaultConstraints[0].topologyKey: Invalid value: \"a b\""),
        ),
        (
            "PodTopologySpread",
            "{defaultingType: List, defaultConstraints: [{maxSkew: 1, topologyKey: zone, whenUnsatisfiable: DoNotSchedule}, {maxSkew: 2, topologyKey: zone, whenUnsatisfiable: DoNotSchedule, labelSelector: {}}]}",
            format!("{at}.defaultConstraints[1].labelSelector: Forbidden: constraint must not define a selector, as they deduced for each pod; {at}.defaultConstraints[1]: Duplicate value: \"{{zone, DoNotSchedule}}\""),
        ),
        (
            "InterPodAffinity",
            "{hardPodAffinityWeight: 101}",
            format!("{at}.hardPodAffinityWeight: Invalid value: 101: not in valid range [0, 100]"),
        ),
        (
            "InterPodAffinity",
            "weight",
            format!("{at}: must be an object (InterPodAffinityArgs), not \"weight\""),
        ),
        (
            "NodeAffinity",
            "{addedAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: zone, operator: Bad}]}]}}}",
            format!("{at}.addedAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator"),
        ),
        (
            "DefaultPreemption",
            "{minCandidateNodesPercentage: 0, minCandidateNodesAbsolute: 0}",
            format!("{at}.minCandidateNodesPercentage: Invalid value: 0: cannot be zero at the same time as minCandidateNodesAbsolute; {at}.minCandidateNodesAbsolute: Invalid value: 0: cannot be zero at the same time as minCandidateNodesPercentage"),
        ),
        (
            "DefaultPreemption",
            "{minCandidateNodesPercentage: ten}",
            format!("{at}.minCandidateNodesPercentage: invalid type: string \"ten\", expected i32"),
        ),
        (
            "DefaultPreemption",
            "{kind: InterPodAffinityArgs}",
            format!("{at}.kind: Invalid value: \"InterPodAffinityArgs\": args for this plugin are DefaultPreemptionArgs"),
        ),
        (
            "VolumeBinding",
            "{bindTimeoutSeconds: -1}",
            format!("{at}.bindTimeoutSeconds: Invalid value: -1: invalid BindTimeoutSeconds, should not be a negative value"),
        ),
        (
            "VolumeBinding",
            "{shape: []}",
            format!("{at}.shape: Invalid value: unexpected field `shape`, remove it or turn on the feature gate StorageCapacityScoring"),
        ),
    ];
    for (name, args, want) in bad {
        match with_args(name, args) {
            Ok(()) => panic!("{name} {args}: built, want {want}"),
            Err(e) => assert!(
                e.starts_with(&want),
                "{name} {args}:\n got {e}\nwant {want}"
            ),
        }
    }
}
