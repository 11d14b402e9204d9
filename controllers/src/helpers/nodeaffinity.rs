//! Node affinity as upstream's `component-helpers/scheduling/corev1` (and `nodeaffinity`) match
//! it: node selector terms and requirements (labels and `metadata.name` fields), a Pod's required
//! node affinity (`nodeSelector` plus `requiredDuringSchedulingIgnoredDuringExecution`, optionally
//! with a scheduler-enforced added affinity), preferred scheduling terms and their weights, and the
//! label key/value validation they need.
//!
//! Shared by the scheduler's plugins and the DaemonSet controller, which decides where daemon Pods
//! may run with the same rules. Everything is parsed once per Pod and then matched against many
//! nodes without allocating. Owns no state and makes no API call.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Node, NodeAffinity, NodeSelector as ApiNodeSelector, NodeSelectorRequirement,
    NodeSelectorTerm as ApiNodeSelectorTerm, Pod, PreferredSchedulingTerm,
};

/// The only field a node selector's `matchFields` can name.
pub const OBJECT_NAME_FIELD: &str = "metadata.name";

/// One parsed `matchExpressions` requirement on node labels.
#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelOp {
    In(Vec<String>),
    NotIn(Vec<String>),
    /// A `nodeSelector` entry (`labels.SelectorFromSet`): the label exists with this value.
    Equals(String),
    Exists,
    DoesNotExist,
    Gt(i64),
    Lt(i64),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct LabelRequirement {
    key: String,
    op: LabelOp,
}

impl LabelRequirement {
    fn matches(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        let value = labels.and_then(|l| l.get(&self.key));
        match &self.op {
            LabelOp::In(values) => value.is_some_and(|v| values.iter().any(|x| x == v)),
            LabelOp::NotIn(values) => value.is_none_or(|v| !values.iter().any(|x| x == v)),
            LabelOp::Equals(want) => value.is_some_and(|v| v == want),
            LabelOp::Exists => value.is_some(),
            LabelOp::DoesNotExist => value.is_none(),
            // A label that is not an integer never matches Gt / Lt.
            LabelOp::Gt(n) => value
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v > *n),
            LabelOp::Lt(n) => value
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v < *n),
        }
    }
}

/// One parsed `matchFields` requirement (`fields.OneTermEqualSelector` / `NotEqual`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct FieldRequirement {
    key: String,
    value: String,
    equal: bool,
}

impl FieldRequirement {
    /// A node's fields are only `metadata.name`; any other key reads as "" (as `fields.Set`).
    fn matches(&self, node_name: &str) -> bool {
        let actual = if self.key == OBJECT_NAME_FIELD {
            node_name
        } else {
            ""
        };
        (actual == self.value) == self.equal
    }
}

/// A parsed `NodeSelectorTerm`: its label requirements and field requirements are ANDed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSelectorTerm {
    /// None when the term has no `matchExpressions` (no constraint on labels).
    labels: Option<Vec<LabelRequirement>>,
    /// None when the term has no `matchFields`.
    fields: Option<Vec<FieldRequirement>>,
    /// The first parse error; a term with one never matches.
    error: Option<String>,
}

impl NodeSelectorTerm {
    /// Parses a term; `path` names it in errors (e.g. `nodeSelectorTerms[0]`).
    pub fn parse(term: &ApiNodeSelectorTerm, path: &str) -> NodeSelectorTerm {
        let mut errors = Vec::new();
        let labels = term
            .match_expressions
            .as_deref()
            .filter(|e| !e.is_empty())
            .map(|exprs| {
                exprs
                    .iter()
                    .enumerate()
                    .filter_map(|(i, r)| {
                        parse_label_requirement(r)
                            .map_err(|e| errors.push(format!("{path}.matchExpressions[{i}]{e}")))
                            .ok()
                    })
                    .collect()
            });
        let fields = term
            .match_fields
            .as_deref()
            .filter(|f| !f.is_empty())
            .map(|reqs| {
                reqs.iter()
                    .enumerate()
                    .filter_map(|(i, r)| {
                        parse_field_requirement(r)
                            .map_err(|e| errors.push(format!("{path}.matchFields[{i}]{e}")))
                            .ok()
                    })
                    .collect()
            });
        NodeSelectorTerm {
            labels,
            fields,
            error: (!errors.is_empty()).then(|| errors.join("; ")),
        }
    }

    /// The parse error, if any.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// Whether the node's labels and name satisfy the term. As upstream, `matchFields` are not
    /// checked against a node without a name.
    pub fn matches(&self, node: &Node) -> bool {
        if self.error.is_some() {
            return false;
        }
        if let Some(reqs) = &self.labels {
            let labels = node.metadata.labels.as_ref();
            if !reqs.iter().all(|r| r.matches(labels)) {
                return false;
            }
        }
        if let Some(reqs) = &self.fields {
            let name = node.metadata.name.as_deref().unwrap_or_default();
            if !name.is_empty() && !reqs.iter().all(|r| r.matches(name)) {
                return false;
            }
        }
        true
    }
}

fn is_empty_term(term: &ApiNodeSelectorTerm) -> bool {
    term.match_expressions
        .as_deref()
        .unwrap_or_default()
        .is_empty()
        && term.match_fields.as_deref().unwrap_or_default().is_empty()
}

fn parse_label_requirement(r: &NodeSelectorRequirement) -> Result<LabelRequirement, String> {
    let values = r.values.as_deref().unwrap_or_default();
    if let Err(e) = validate_label_key(&r.key) {
        return Err(format!(".key: Invalid value {:?}: {e}", r.key));
    }
    for (i, v) in values.iter().enumerate() {
        if let Err(e) = validate_label_value(v) {
            return Err(format!(".values[{i}]: Invalid value {v:?}: {e}"));
        }
    }
    let op = match r.operator.as_str() {
        "In" | "NotIn" if values.is_empty() => {
            return Err(".values: for 'in', 'notin' operators, values set can't be empty".into())
        }
        "In" => LabelOp::In(values.to_vec()),
        "NotIn" => LabelOp::NotIn(values.to_vec()),
        "Exists" | "DoesNotExist" if !values.is_empty() => {
            return Err(".values: values set must be empty for exists and does not exist".into())
        }
        "Exists" => LabelOp::Exists,
        "DoesNotExist" => LabelOp::DoesNotExist,
        "Gt" | "Lt" => {
            let [v] = values else {
                return Err(
                    ".values: for 'Gt', 'Lt' operators, exactly one value is required".into(),
                );
            };
            let n = v.parse::<i64>().map_err(|_| {
                format!(".values[0]: Invalid value {v:?}: for 'Gt', 'Lt' operators, the value must be an integer")
            })?;
            if r.operator == "Gt" {
                LabelOp::Gt(n)
            } else {
                LabelOp::Lt(n)
            }
        }
        other => {
            return Err(format!(
                ".operator: Unsupported value: {other:?}: supported values: \"In\", \"NotIn\", \"Exists\", \"DoesNotExist\", \"Gt\", \"Lt\""
            ))
        }
    };
    Ok(LabelRequirement {
        key: r.key.clone(),
        op,
    })
}

fn parse_field_requirement(r: &NodeSelectorRequirement) -> Result<FieldRequirement, String> {
    let values = r.values.as_deref().unwrap_or_default();
    let equal = match r.operator.as_str() {
        "In" => true,
        "NotIn" => false,
        other => {
            return Err(format!(
                ".operator: Unsupported value: {other:?}: supported values: \"In\", \"NotIn\""
            ))
        }
    };
    let [value] = values else {
        return Err(format!(
            ".values: Invalid value {values:?}: must have one element"
        ));
    };
    Ok(FieldRequirement {
        key: r.key.clone(),
        value: value.clone(),
        equal,
    })
}

fn is_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|label| {
            let b = label.as_bytes();
            !b.is_empty()
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}

/// A label key (`validation.IsQualifiedName`): `[prefix/]name`, prefix a DNS subdomain, name at
/// most 63 alphanumerics, '-', '_', '.', starting and ending alphanumeric.
pub fn validate_label_key(key: &str) -> Result<(), String> {
    let name = match key.split_once('/') {
        Some((prefix, name)) => {
            if name.contains('/') {
                return Err("a qualified name must consist of at most one '/'".into());
            }
            if prefix.is_empty() || !is_dns1123_subdomain(prefix) {
                return Err("prefix part must be a lowercase RFC 1123 subdomain".into());
            }
            name
        }
        None => key,
    };
    if name.is_empty() || name.len() > 63 || !is_name_part(name) {
        return Err("name part must be at most 63 alphanumeric characters, '-', '_' or '.', starting and ending with an alphanumeric character".into());
    }
    Ok(())
}

/// A label value (`validation.IsValidLabelValue`): empty, or as a key's name part.
pub fn validate_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() || (value.len() <= 63 && is_name_part(value)) {
        Ok(())
    } else {
        Err("a valid label must be an empty string or at most 63 alphanumeric characters, '-', '_' or '.', starting and ending with an alphanumeric character".into())
    }
}

/// A parsed `NodeSelector`: terms are ORed; empty terms are dropped (they match nothing), and a
/// selector without terms matches no node. This is upstream's `LazyErrorNodeSelector`: a term
/// that failed to parse simply never matches.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeSelector {
    terms: Vec<NodeSelectorTerm>,
}

impl NodeSelector {
    /// Parses leniently: a term's parse error only makes that term match nothing.
    pub fn parse(selector: &ApiNodeSelector) -> NodeSelector {
        NodeSelector {
            terms: selector
                .node_selector_terms
                .iter()
                .enumerate()
                .filter(|(_, t)| !is_empty_term(t))
                .map(|(i, t)| NodeSelectorTerm::parse(t, &format!("nodeSelectorTerms[{i}]")))
                .collect(),
        }
    }

    /// Parses strictly (`NewNodeSelector`, for configuration): any term's error is an error
    /// naming the field under `path`.
    pub fn parse_strict(selector: &ApiNodeSelector, path: &str) -> Result<NodeSelector, String> {
        let s = NodeSelector::parse(selector);
        let errors: Vec<String> = s
            .terms
            .iter()
            .filter_map(|t| t.error().map(|e| format!("{path}.{e}")))
            .collect();
        if errors.is_empty() {
            Ok(s)
        } else {
            Err(errors.join("; "))
        }
    }

    /// Whether any term matches the node (parse errors ignored, as every caller upstream does).
    pub fn matches(&self, node: &Node) -> bool {
        self.terms.iter().any(|t| t.matches(node))
    }
}

/// Whether the node matches these API node selector terms (`MatchNodeSelectorTerms`).
pub fn match_node_selector_terms(node: &Node, selector: &ApiNodeSelector) -> bool {
    NodeSelector::parse(selector).matches(node)
}

/// A Pod's hard node constraints: its `nodeSelector` (every pair must be a node label) and its
/// `requiredDuringSchedulingIgnoredDuringExecution` node affinity (`GetRequiredNodeAffinity`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RequiredNodeAffinity {
    /// None when the Pod's nodeSelector is empty.
    node_selector: Option<Vec<LabelRequirement>>,
    /// None when the Pod has no required node affinity.
    affinity: Option<NodeSelector>,
}

impl RequiredNodeAffinity {
    pub fn from_pod(pod: &Pod) -> RequiredNodeAffinity {
        let spec = pod.spec.as_ref();
        let node_selector = spec
            .and_then(|s| s.node_selector.as_ref())
            .filter(|m| !m.is_empty())
            .map(|m| {
                m.iter()
                    .map(|(k, v)| LabelRequirement {
                        key: k.clone(),
                        op: LabelOp::Equals(v.clone()),
                    })
                    .collect()
            });
        let affinity = required_node_selector(pod).map(NodeSelector::parse);
        RequiredNodeAffinity {
            node_selector,
            affinity,
        }
    }

    /// Whether the Pod may be placed on the node by its own constraints.
    pub fn matches(&self, node: &Node) -> bool {
        if let Some(reqs) = &self.node_selector {
            let labels = node.metadata.labels.as_ref();
            if !reqs.iter().all(|r| r.matches(labels)) {
                return false;
            }
        }
        self.affinity.as_ref().is_none_or(|a| a.matches(node))
    }
}

/// The Pod's `affinity.nodeAffinity`, if any.
pub fn pod_node_affinity(pod: &Pod) -> Option<&NodeAffinity> {
    pod.spec.as_ref()?.affinity.as_ref()?.node_affinity.as_ref()
}

/// The Pod's `requiredDuringSchedulingIgnoredDuringExecution` node selector, if any.
pub fn required_node_selector(pod: &Pod) -> Option<&ApiNodeSelector> {
    pod_node_affinity(pod)?
        .required_during_scheduling_ignored_during_execution
        .as_ref()
}

/// Why a node fails [`node_matches_pod`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AffinityMismatch {
    /// The scheduler profile's `addedAffinity` rejects the node.
    Enforced,
    /// The Pod's nodeSelector / required node affinity rejects it.
    Pod,
}

/// Whether the node satisfies the scheduler-enforced `added` affinity (if any) and then the Pod's
/// own required affinity, in the order the NodeAffinity plugin checks them.
pub fn node_matches_pod(
    required: &RequiredNodeAffinity,
    added: Option<&NodeSelector>,
    node: &Node,
) -> Result<(), AffinityMismatch> {
    if added.is_some_and(|a| !a.matches(node)) {
        return Err(AffinityMismatch::Enforced);
    }
    if !required.matches(node) {
        return Err(AffinityMismatch::Pod);
    }
    Ok(())
}

/// Parsed `preferredDuringSchedulingIgnoredDuringExecution` terms: a node's score is the sum of
/// the weights of the terms it matches. Terms with weight 0 or no requirements are dropped.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PreferredSchedulingTerms {
    terms: Vec<(NodeSelectorTerm, i64)>,
}

impl PreferredSchedulingTerms {
    /// Parses the terms; any term's parse error is an error naming it under `path`
    /// (`NewPreferredSchedulingTerms`).
    pub fn parse(
        terms: &[PreferredSchedulingTerm],
        path: &str,
    ) -> Result<PreferredSchedulingTerms, String> {
        let mut errors = Vec::new();
        let mut parsed = Vec::with_capacity(terms.len());
        for (i, t) in terms.iter().enumerate() {
            if t.weight == 0 || is_empty_term(&t.preference) {
                continue;
            }
            let term = NodeSelectorTerm::parse(&t.preference, &format!("{path}[{i}].preference"));
            match term.error() {
                Some(e) => errors.push(e.to_string()),
                None => parsed.push((term, i64::from(t.weight))),
            }
        }
        if errors.is_empty() {
            Ok(PreferredSchedulingTerms { terms: parsed })
        } else {
            Err(errors.join("; "))
        }
    }

    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// The sum of the weights of the terms the node matches.
    pub fn score(&self, node: &Node) -> i64 {
        self.terms
            .iter()
            .filter(|(t, _)| t.matches(node))
            .map(|(_, w)| w)
            .sum()
    }
}

#[cfg(test)]
#[path = "nodeaffinity_tests.rs"]
mod tests;
