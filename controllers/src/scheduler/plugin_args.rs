//! Plugin arguments (`profiles[].pluginConfig[].args`) as typed values: upstream's
//! pkg/scheduler/apis/config `types_pluginargs.go`, with the v1 defaulting (`v1/defaults.go`,
//! [`PluginArgs::set_defaults`]) and the validation (`validation/validation_pluginargs.go`,
//! [`PluginArgs::validate`]).
//!
//! [`decode`] reads an args object strictly, as kube-scheduler's strict decoder does: a field the
//! kind does not have, a value of the wrong type or an unknown enum value is an error naming the
//! field from the file's root (`profiles[0].pluginConfig[1].args.scoringStrategy.type: unknown
//! variant ...`, through serde_path_to_error); `apiVersion` and `kind` may be given and must be
//! `kubescheduler.config.k8s.io/v1` and the plugin's kind. Validation errors name their field the
//! same way, in upstream's wording (`...: Invalid value: 101: not in valid range [0, 100]`).
//! The Kubernetes API types embedded in args (NodeAffinity, TopologySpreadConstraint) are read by
//! k8s-openapi, which ignores unknown fields inside them.
//!
//! Owns only the values, their defaults and their validation; plugins receive them validated
//! (the [`registry`](super::registry) decodes before it constructs).

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{NodeAffinity, TopologySpreadConstraint};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;

use super::config::API_VERSION;
use crate::helpers::nodeaffinity::{validate_label_key, NodeSelector, PreferredSchedulingTerms};

/// A plugin's typed args.
pub trait PluginArgs: DeserializeOwned + Default {
    /// The args kind (`<plugin name>Args`).
    const KIND: &'static str;

    /// The v1 defaulting, after decoding (`SetDefaults_<Kind>`).
    fn set_defaults(&mut self) {}

    /// Every invalid field, each error naming it under `path` (`Validate<Kind>`).
    fn validate(&self, path: &str) -> Vec<String>;
}

/// Decodes, defaults and validates one plugin's args; `path` is where they are in the file
/// (`profiles[0].pluginConfig[1].args`). Absent or null args are the defaults.
pub fn decode<A: PluginArgs>(args: Option<&Value>, path: &str) -> Result<A, String> {
    let mut value = match args {
        None | Some(Value::Null) => Value::Object(Default::default()),
        Some(v) => v.clone(),
    };
    // Checked here: serde would also read a list into a struct, field by field.
    let Some(obj) = value.as_object_mut() else {
        return Err(format!(
            "{path}: must be an object ({}), not {value}",
            A::KIND
        ));
    };
    if let Some(kind) = obj.remove("kind") {
        if kind.as_str() != Some(A::KIND) {
            return Err(format!(
                "{path}.kind: Invalid value: {kind}: args for this plugin are {}",
                A::KIND
            ));
        }
    }
    if let Some(v) = obj.remove("apiVersion") {
        if v.as_str() != Some(API_VERSION) {
            return Err(format!(
                "{path}.apiVersion: Invalid value: {v}: only {API_VERSION} is supported"
            ));
        }
    }
    let mut args: A = serde_path_to_error::deserialize(value).map_err(|e| {
        let at = e.path().to_string();
        let at = if at == "." {
            path.to_string()
        } else {
            format!("{path}.{at}")
        };
        format!("{at}: {}", e.into_inner())
    })?;
    args.set_defaults();
    let errs = args.validate(path);
    if errs.is_empty() {
        Ok(args)
    } else {
        Err(errs.join("; "))
    }
}

/// Test convenience: args that must decode and validate, with the kind as the path.
#[cfg(test)]
pub(crate) fn valid<A: PluginArgs>(args: Option<&Value>) -> A {
    decode(args, A::KIND).unwrap_or_else(|e| panic!("{e}"))
}

/// Upstream's field.Invalid wording.
fn invalid(path: &str, value: impl std::fmt::Display, detail: &str) -> String {
    format!("{path}: Invalid value: {value}: {detail}")
}

// ---------------------------------------------------------------------------------------------
// DefaultPreemption
// ---------------------------------------------------------------------------------------------

/// DefaultPreemptionArgs.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct DefaultPreemptionArgs {
    /// Candidates to find, as a percentage of the nodes considered (0..=100, default 10).
    pub min_candidate_nodes_percentage: i32,
    /// At least this many candidates (>= 0, default 100).
    pub min_candidate_nodes_absolute: i32,
}

impl Default for DefaultPreemptionArgs {
    fn default() -> Self {
        DefaultPreemptionArgs {
            min_candidate_nodes_percentage: 10,
            min_candidate_nodes_absolute: 100,
        }
    }
}

impl PluginArgs for DefaultPreemptionArgs {
    const KIND: &'static str = "DefaultPreemptionArgs";

    fn validate(&self, path: &str) -> Vec<String> {
        let pct_path = format!("{path}.minCandidateNodesPercentage");
        let abs_path = format!("{path}.minCandidateNodesAbsolute");
        let (p, a) = (
            self.min_candidate_nodes_percentage,
            self.min_candidate_nodes_absolute,
        );
        let mut errs = Vec::new();
        if !(0..=100).contains(&p) {
            errs.push(invalid(&pct_path, p, "not in valid range [0, 100]"));
        }
        if a < 0 {
            errs.push(invalid(&abs_path, a, "not in valid range [0, inf)"));
        }
        if p == 0 && a == 0 {
            errs.push(invalid(
                &pct_path,
                p,
                "cannot be zero at the same time as minCandidateNodesAbsolute",
            ));
            errs.push(invalid(
                &abs_path,
                a,
                "cannot be zero at the same time as minCandidateNodesPercentage",
            ));
        }
        errs
    }
}

// ---------------------------------------------------------------------------------------------
// InterPodAffinity
// ---------------------------------------------------------------------------------------------

/// `DefaultHardPodAffinityWeight`.
pub const DEFAULT_HARD_POD_AFFINITY_WEIGHT: i32 = 1;
const MAX_HARD_POD_AFFINITY_WEIGHT: i32 = 100;

/// InterPodAffinityArgs.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct InterPodAffinityArgs {
    /// Weight of an existing Pod's required affinity term that the incoming Pod matches, in
    /// scoring (0..=100, default 1).
    pub hard_pod_affinity_weight: i32,
    /// Score only by the incoming Pod's preferred terms when it has some, and skip scoring
    /// entirely when it has none.
    pub ignore_preferred_terms_of_existing_pods: bool,
}

impl Default for InterPodAffinityArgs {
    fn default() -> Self {
        InterPodAffinityArgs {
            hard_pod_affinity_weight: DEFAULT_HARD_POD_AFFINITY_WEIGHT,
            ignore_preferred_terms_of_existing_pods: false,
        }
    }
}

impl PluginArgs for InterPodAffinityArgs {
    const KIND: &'static str = "InterPodAffinityArgs";

    fn validate(&self, path: &str) -> Vec<String> {
        let w = self.hard_pod_affinity_weight;
        if (0..=MAX_HARD_POD_AFFINITY_WEIGHT).contains(&w) {
            return Vec::new();
        }
        vec![invalid(
            &format!("{path}.hardPodAffinityWeight"),
            w,
            &format!("not in valid range [0, {MAX_HARD_POD_AFFINITY_WEIGHT}]"),
        )]
    }
}

// ---------------------------------------------------------------------------------------------
// NodeAffinity
// ---------------------------------------------------------------------------------------------

/// NodeAffinityArgs: a node affinity every Pod of the profile must also satisfy (required) and
/// is scored by (preferred).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct NodeAffinityArgs {
    pub added_affinity: Option<NodeAffinity>,
}

impl PluginArgs for NodeAffinityArgs {
    const KIND: &'static str = "NodeAffinityArgs";

    fn validate(&self, path: &str) -> Vec<String> {
        let Some(added) = &self.added_affinity else {
            return Vec::new();
        };
        let mut errs = Vec::new();
        if let Some(ns) = &added.required_during_scheduling_ignored_during_execution {
            let at = format!("{path}.addedAffinity.requiredDuringSchedulingIgnoredDuringExecution");
            errs.extend(NodeSelector::parse_strict(ns, &at).err());
        }
        if let Some(terms) = added
            .preferred_during_scheduling_ignored_during_execution
            .as_deref()
            .filter(|t| !t.is_empty())
        {
            let at =
                format!("{path}.addedAffinity.preferredDuringSchedulingIgnoredDuringExecution");
            errs.extend(PreferredSchedulingTerms::parse(terms, &at).err());
        }
        errs
    }
}

// ---------------------------------------------------------------------------------------------
// NodeResourcesFit and NodeResourcesBalancedAllocation
// ---------------------------------------------------------------------------------------------

/// Shape scores are 0..=10 in the config (`MaxCustomPriorityScore`).
pub const MAX_CUSTOM_PRIORITY_SCORE: i32 = 10;

/// One resource of a scoring strategy (`ResourceSpec`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResourceSpec {
    pub name: String,
    /// 0 or absent means 1 (v1 defaulting).
    #[serde(default)]
    pub weight: i64,
}

/// cpu:1, memory:1 (v1 `defaultResourceSpec`).
pub fn default_resources() -> Vec<ResourceSpec> {
    ["cpu", "memory"]
        .into_iter()
        .map(|name| ResourceSpec {
            name: name.to_string(),
            weight: 1,
        })
        .collect()
}

/// One point of a utilization -> score shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UtilizationShapePoint {
    #[serde(default)]
    pub utilization: i32,
    #[serde(default)]
    pub score: i32,
}

/// `RequestedToCapacityRatioParam`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RequestedToCapacityRatioParam {
    pub shape: Vec<UtilizationShapePoint>,
}

/// `ScoringStrategyType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum ScoringStrategyType {
    LeastAllocated,
    MostAllocated,
    RequestedToCapacityRatio,
}

impl ScoringStrategyType {
    const SUPPORTED: &'static str =
        "supported values: \"LeastAllocated\", \"MostAllocated\", \"RequestedToCapacityRatio\"";
}

/// `ScoringStrategy`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ScoringStrategy {
    /// None when the file gives none (upstream's empty string, which validation rejects).
    #[serde(rename = "type")]
    pub type_: Option<ScoringStrategyType>,
    pub resources: Vec<ResourceSpec>,
    pub requested_to_capacity_ratio: Option<RequestedToCapacityRatioParam>,
}

/// NodeResourcesFitArgs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct NodeResourcesFitArgs {
    /// Extended resources Filter does not check.
    pub ignored_resources: Vec<String>,
    /// Groups (the part before `/`) of extended resources Filter does not check.
    pub ignored_resource_groups: Vec<String>,
    /// Always set once defaulted.
    pub scoring_strategy: Option<ScoringStrategy>,
}

impl PluginArgs for NodeResourcesFitArgs {
    const KIND: &'static str = "NodeResourcesFitArgs";

    fn set_defaults(&mut self) {
        let s = self
            .scoring_strategy
            .get_or_insert_with(|| ScoringStrategy {
                type_: Some(ScoringStrategyType::LeastAllocated),
                ..Default::default()
            });
        if s.resources.is_empty() {
            s.resources = default_resources();
        }
        for r in &mut s.resources {
            if r.weight == 0 {
                r.weight = 1;
            }
        }
    }

    fn validate(&self, path: &str) -> Vec<String> {
        let mut errs = Vec::new();
        for (i, r) in self.ignored_resources.iter().enumerate() {
            if let Err(e) = validate_label_key(r) {
                errs.push(invalid(
                    &format!("{path}.ignoredResources[{i}]"),
                    format_args!("{r:?}"),
                    &e,
                ));
            }
        }
        for (i, g) in self.ignored_resource_groups.iter().enumerate() {
            let at = format!("{path}.ignoredResourceGroups[{i}]");
            if g.contains('/') {
                errs.push(invalid(
                    &at,
                    format_args!("{g:?}"),
                    "resource group name can't contain '/'",
                ));
            }
            if let Err(e) = validate_label_key(g) {
                errs.push(invalid(&at, format_args!("{g:?}"), &e));
            }
        }
        let at = format!("{path}.scoringStrategy");
        let Some(s) = &self.scoring_strategy else {
            errs.push(format!(
                "{at}: Required value: ScoringStrategy field is required"
            ));
            return errs;
        };
        if s.type_.is_none() {
            errs.push(format!(
                "{at}.type: Unsupported value: \"\": {}",
                ScoringStrategyType::SUPPORTED
            ));
        }
        for (i, r) in s.resources.iter().enumerate() {
            if r.weight <= 0 || r.weight > 100 {
                errs.push(invalid(
                    &format!("{at}.resources[{i}].weight"),
                    r.weight,
                    &format!("resource weight of {} not in valid range (0, 100]", r.name),
                ));
            }
        }
        let ratio_at = format!("{at}.requestedToCapacityRatio");
        match (s.type_, &s.requested_to_capacity_ratio) {
            (Some(ScoringStrategyType::RequestedToCapacityRatio), None) => errs.push(format!(
                "{ratio_at}: Required value: must be specified when type is RequestedToCapacityRatio"
            )),
            (Some(ScoringStrategyType::RequestedToCapacityRatio), Some(r)) => {
                errs.extend(validate_function_shape(
                    &r.shape,
                    &format!("{ratio_at}.shape"),
                ));
            }
            (_, Some(_)) => errs.push(format!(
                "{ratio_at}: Forbidden: must be nil when type is not RequestedToCapacityRatio"
            )),
            (_, None) => {}
        }
        errs
    }
}

/// `validateFunctionShape`: at least one point, utilization strictly increasing in 0..=100,
/// scores in 0..=10.
fn validate_function_shape(shape: &[UtilizationShapePoint], path: &str) -> Vec<String> {
    if shape.is_empty() {
        return vec![format!(
            "{path}: Required value: at least one point must be specified"
        )];
    }
    let mut errs = Vec::new();
    if let Some(i) = (1..shape.len()).find(|&i| shape[i - 1].utilization >= shape[i].utilization) {
        errs.push(invalid(
            &format!("{path}[{i}].utilization"),
            shape[i].utilization,
            "values must be sorted in increasing order",
        ));
    }
    for (i, p) in shape.iter().enumerate() {
        if !(0..=100).contains(&p.utilization) {
            errs.push(invalid(
                &format!("{path}[{i}].utilization"),
                p.utilization,
                "not in valid range [0, 100]",
            ));
        }
        if !(0..=MAX_CUSTOM_PRIORITY_SCORE).contains(&p.score) {
            errs.push(invalid(
                &format!("{path}[{i}].score"),
                p.score,
                &format!("not in valid range [0, {MAX_CUSTOM_PRIORITY_SCORE}]"),
            ));
        }
    }
    errs
}

/// NodeResourcesBalancedAllocationArgs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct NodeResourcesBalancedAllocationArgs {
    pub resources: Vec<ResourceSpec>,
}

impl PluginArgs for NodeResourcesBalancedAllocationArgs {
    const KIND: &'static str = "NodeResourcesBalancedAllocationArgs";

    fn set_defaults(&mut self) {
        if self.resources.is_empty() {
            self.resources = default_resources();
        }
        for r in &mut self.resources {
            if r.weight == 0 {
                r.weight = 1;
            }
        }
    }

    fn validate(&self, path: &str) -> Vec<String> {
        let mut errs = Vec::new();
        let mut seen = BTreeSet::new();
        for (i, r) in self.resources.iter().enumerate() {
            if !seen.insert(r.name.as_str()) {
                errs.push(format!(
                    "{path}.resources[{i}].name: Duplicate value: {:?}",
                    r.name
                ));
            }
            if r.weight != 1 {
                errs.push(invalid(
                    &format!("{path}.resources[{i}].weight"),
                    r.weight,
                    "must be 1",
                ));
            }
        }
        errs
    }
}

// ---------------------------------------------------------------------------------------------
// PodTopologySpread
// ---------------------------------------------------------------------------------------------

/// `defaultingType` (an empty string is System, as v1 defaulting makes it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum DefaultingType {
    /// The built-in defaults (hostname maxSkew 3, zone maxSkew 5, ScheduleAnyway).
    #[default]
    #[serde(alias = "")]
    System,
    /// The `defaultConstraints` of the args.
    List,
}

/// PodTopologySpreadArgs.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct PodTopologySpreadArgs {
    pub default_constraints: Vec<TopologySpreadConstraint>,
    pub defaulting_type: DefaultingType,
}

pub const DO_NOT_SCHEDULE: &str = "DoNotSchedule";
pub const SCHEDULE_ANYWAY: &str = "ScheduleAnyway";

impl PluginArgs for PodTopologySpreadArgs {
    const KIND: &'static str = "PodTopologySpreadArgs";

    fn validate(&self, path: &str) -> Vec<String> {
        let mut errs = Vec::new();
        if self.defaulting_type == DefaultingType::System && !self.default_constraints.is_empty() {
            errs.push(invalid(
                &format!("{path}.defaultingType"),
                "\"System\"",
                "when .defaultConstraints are not empty",
            ));
        }
        let cs = &self.default_constraints;
        for (i, c) in cs.iter().enumerate() {
            let at = format!("{path}.defaultConstraints[{i}]");
            if c.max_skew <= 0 {
                errs.push(invalid(
                    &format!("{at}.maxSkew"),
                    c.max_skew,
                    "not in valid range (0, inf)",
                ));
            }
            if c.topology_key.is_empty() {
                errs.push(format!(
                    "{at}.topologyKey: Required value: can not be empty"
                ));
            } else if let Err(e) = validate_label_key(&c.topology_key) {
                errs.push(invalid(
                    &format!("{at}.topologyKey"),
                    format_args!("{:?}", c.topology_key),
                    &e,
                ));
            }
            let w = c.when_unsatisfiable.as_str();
            if w.is_empty() {
                errs.push(format!(
                    "{at}.whenUnsatisfiable: Required value: can not be empty"
                ));
            } else if w != DO_NOT_SCHEDULE && w != SCHEDULE_ANYWAY {
                errs.push(format!(
                    "{at}.whenUnsatisfiable: Unsupported value: {w:?}: supported values: \"{DO_NOT_SCHEDULE}\", \"{SCHEDULE_ANYWAY}\""
                ));
            }
            if c.label_selector.is_some() {
                errs.push(format!(
                    "{at}.labelSelector: Forbidden: constraint must not define a selector, as they deduced for each pod"
                ));
            }
            let repeated = cs[..i].iter().any(|o| {
                o.topology_key == c.topology_key && o.when_unsatisfiable == c.when_unsatisfiable
            });
            if repeated {
                errs.push(format!(
                    "{at}: Duplicate value: \"{{{}, {}}}\"",
                    c.topology_key, c.when_unsatisfiable
                ));
            }
        }
        errs
    }
}

// ---------------------------------------------------------------------------------------------
// VolumeBinding
// ---------------------------------------------------------------------------------------------

/// VolumeBindingArgs: PreBind's wait for the PV controller is bounded by `bindTimeoutSeconds`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct VolumeBindingArgs {
    /// Default 600.
    pub bind_timeout_seconds: i64,
    /// Only with the StorageCapacityScoring feature (alpha, off in v1.34): an error here.
    pub shape: Option<Vec<UtilizationShapePoint>>,
}

impl Default for VolumeBindingArgs {
    fn default() -> Self {
        VolumeBindingArgs {
            bind_timeout_seconds: 600,
            shape: None,
        }
    }
}

impl PluginArgs for VolumeBindingArgs {
    const KIND: &'static str = "VolumeBindingArgs";

    fn validate(&self, path: &str) -> Vec<String> {
        let mut errs = Vec::new();
        if self.bind_timeout_seconds < 0 {
            errs.push(invalid(
                &format!("{path}.bindTimeoutSeconds"),
                self.bind_timeout_seconds,
                "invalid BindTimeoutSeconds, should not be a negative value",
            ));
        }
        if self.shape.is_some() {
            errs.push(format!(
                "{path}.shape: Invalid value: unexpected field `shape`, remove it or turn on the feature gate StorageCapacityScoring"
            ));
        }
        errs
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn absent_args_are_the_v1_defaults() {
        let fit: NodeResourcesFitArgs = decode(None, "args").unwrap();
        let s = fit.scoring_strategy.unwrap();
        assert_eq!(s.type_, Some(ScoringStrategyType::LeastAllocated));
        assert_eq!(s.resources, default_resources());
        let fit: NodeResourcesFitArgs = decode(
            Some(&json!({"scoringStrategy": {"type": "MostAllocated", "resources": [{"name": "cpu"}]}})),
            "args",
        )
        .unwrap();
        let s = fit.scoring_strategy.unwrap();
        assert_eq!(s.resources[0].weight, 1, "weight 0 defaults to 1");
        let pre: DefaultPreemptionArgs =
            decode(Some(&json!({"minCandidateNodesAbsolute": 0})), "args").unwrap();
        assert_eq!(
            (
                pre.min_candidate_nodes_percentage,
                pre.min_candidate_nodes_absolute
            ),
            (10, 0),
            "an absent field defaults, a given 0 stays"
        );
        let ipa: InterPodAffinityArgs = decode(Some(&Value::Null), "args").unwrap();
        assert_eq!(ipa, InterPodAffinityArgs::default());
        let pts: PodTopologySpreadArgs =
            decode(Some(&json!({"defaultingType": ""})), "args").unwrap();
        assert_eq!(pts.defaulting_type, DefaultingType::System);
        let ba: NodeResourcesBalancedAllocationArgs = decode(None, "args").unwrap();
        assert_eq!(ba.resources, default_resources());
        let vb: VolumeBindingArgs = decode(None, "args").unwrap();
        assert_eq!(vb.bind_timeout_seconds, 600);
    }

    #[test]
    fn kind_and_api_version_are_checked() {
        let ok = json!({"kind": "InterPodAffinityArgs", "apiVersion": API_VERSION, "hardPodAffinityWeight": 7});
        let a: InterPodAffinityArgs = decode(Some(&ok), "args").unwrap();
        assert_eq!(a.hard_pod_affinity_weight, 7);
        let e = decode::<InterPodAffinityArgs>(Some(&json!({"kind": "NodeAffinityArgs"})), "args")
            .unwrap_err();
        assert!(
            e.starts_with("args.kind: Invalid value: \"NodeAffinityArgs\""),
            "{e}"
        );
        let e = decode::<InterPodAffinityArgs>(
            Some(&json!({"apiVersion": "kubescheduler.config.k8s.io/v1beta3"})),
            "args",
        )
        .unwrap_err();
        assert!(e.starts_with("args.apiVersion: Invalid value"), "{e}");
        let e = decode::<InterPodAffinityArgs>(Some(&json!("weight")), "args").unwrap_err();
        assert_eq!(
            e,
            "args: must be an object (InterPodAffinityArgs), not \"weight\""
        );
        let e = decode::<InterPodAffinityArgs>(Some(&json!([101, true])), "args").unwrap_err();
        assert!(e.starts_with("args: must be an object"), "{e}");
    }
}
