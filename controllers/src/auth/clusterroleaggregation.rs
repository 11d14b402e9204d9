//! The ClusterRole aggregation controller (kube-controller-manager v1.34's
//! `clusterrole-aggregation-controller`, `pkg/controller/clusterroleaggregation`): a ClusterRole
//! with an `aggregationRule` gets, as its `rules`, the union of the rules of every other
//! ClusterRole one of its `clusterRoleSelectors` matches. The API server's bootstrap `admin`,
//! `edit` and `view` roles (and `system:aggregate-to-*`) are built this way, so without it they
//! stay empty and every test namespace's "admin" RoleBinding grants nothing.
//!
//! Owns: the `rules` of aggregated ClusterRoles, written by server-side apply with the field
//! manager `clusterrole-aggregation-controller` (forced), as upstream. The union is built in
//! selector order, the matching roles of each selector by name, each rule kept once (rules are
//! compared whole, an empty list the same as none); the role itself is skipped. As upstream,
//! any ClusterRole change queues every aggregated ClusterRole (the dependency graph is not
//! tracked: roles are few). Five workers, the work queue `ClusterRoleAggregator`.

use std::sync::Arc;

use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

use crate::error::{Error, Result};
use crate::helpers::selector::Selector;
use crate::runtime::cache::Indexed;
use crate::runtime::informer::Informers;
use crate::runtime::queue::WorkQueue;
use crate::runtime::workers::{run_controller, SyncKey};

/// The controller's name in logs and its field manager, as upstream.
pub const NAME: &str = "clusterrole-aggregation-controller";

/// The work queue's name (its metrics' `name` label), as upstream.
pub const QUEUE_NAME: &str = "ClusterRoleAggregator";

/// Workers: kube-controller-manager starts five (no flag sets it).
pub const WORKERS: usize = 5;

/// The rules `role` should have: `Ok(None)` when it has no aggregation rule or its rules are
/// right already, `Ok(Some(rules))` otherwise; an error when a selector does not parse
/// (`LabelSelectorAsSelector`'s), naming the role.
pub fn plan(role: &ClusterRole, all: &[Arc<ClusterRole>]) -> Result<Option<Vec<PolicyRule>>> {
    let Some(rule) = role.aggregation_rule.as_ref() else {
        return Ok(None);
    };
    let name = role.metadata.name.as_deref().unwrap_or_default();
    let mut sorted: Vec<&ClusterRole> = all.iter().map(|r| &**r).collect();
    sorted.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut union: Vec<PolicyRule> = Vec::new();
    for sel in rule.cluster_role_selectors.iter().flatten() {
        let selector = Selector::parse(Some(sel)).map_err(|reason| Error::Invalid {
            object: format!("ClusterRole {name}"),
            reason: format!("aggregationRule.clusterRoleSelectors: {reason}"),
        })?;
        for other in &sorted {
            if other.metadata.name.as_deref() == Some(name)
                || !selector.matches(other.metadata.labels.as_ref())
            {
                continue;
            }
            for r in other.rules.iter().flatten() {
                if !union.iter().any(|u| same_rule(u, r)) {
                    union.push(r.clone());
                }
            }
        }
    }
    let current = role.rules.as_deref().unwrap_or_default();
    let unchanged =
        union.len() == current.len() && union.iter().zip(current).all(|(a, b)| same_rule(a, b));
    Ok((!unchanged).then_some(union))
}

/// `equality.Semantic.DeepEqual` of two rules: a missing list equals an empty one.
fn same_rule(a: &PolicyRule, b: &PolicyRule) -> bool {
    fn list(l: &Option<Vec<String>>) -> &[String] {
        l.as_deref().unwrap_or_default()
    }
    a.verbs == b.verbs
        && list(&a.api_groups) == list(&b.api_groups)
        && list(&a.resources) == list(&b.resources)
        && list(&a.resource_names) == list(&b.resource_names)
        && list(&a.non_resource_urls) == list(&b.non_resource_urls)
}

/// The apply configuration upstream sends: the name and the rules (with their five fields; an
/// empty union sends no `rules`, so the field manager's earlier rules are removed).
pub fn apply_body(name: &str, rules: &[PolicyRule]) -> serde_json::Value {
    let mut body = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name},
    });
    if !rules.is_empty() {
        body["rules"] = serde_json::to_value(rules).unwrap_or_default();
    }
    body
}

/// The running controller.
pub struct Controller {
    client: Client,
    roles: Arc<Indexed<ClusterRole>>,
    queue: Arc<WorkQueue<String>>,
}

impl Controller {
    /// Registers the controller's handler on the ClusterRole informer.
    pub fn new(client: Client, informers: &Informers) -> Arc<Controller> {
        let informer = informers.get::<ClusterRole>();
        let this = Arc::new(Controller {
            client,
            roles: informer.cache(),
            queue: WorkQueue::new(QUEUE_NAME),
        });
        informer.on_change_of(&this, |c, _, _| c.enqueue_aggregated());
        this
    }

    /// Queues every ClusterRole with an aggregation rule.
    fn enqueue_aggregated(&self) {
        for r in self.roles.all() {
            if r.aggregation_rule.is_some() {
                if let Some(name) = r.metadata.name.clone() {
                    self.queue.add(name);
                }
            }
        }
    }

    /// Waits for the cache, then runs the workers.
    pub async fn run(self: Arc<Self>) {
        run_controller(&self, NAME, &[&*self.roles], &self.queue, WORKERS).await;
    }

    /// Stops the workers.
    pub fn shut_down(&self) {
        self.queue.shut_down();
    }
}

impl SyncKey for Controller {
    /// `syncClusterRole`.
    async fn sync(&self, name: &str) -> Result<()> {
        let Some(role) = self.roles.get("", name) else {
            return Ok(());
        };
        let Some(rules) = plan(&role, &self.roles.all())? else {
            return Ok(());
        };
        let api: Api<ClusterRole> = Api::all(self.client.clone());
        api.patch(
            name,
            &PatchParams::apply(NAME).force(),
            &Patch::Apply(apply_body(name, &rules)),
        )
        .await
        .map(|_| ())
        .map_err(|e| Error::kube("applying", format!("ClusterRole {name}"), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn role(v: serde_json::Value) -> Arc<ClusterRole> {
        Arc::new(serde_json::from_value(v).unwrap())
    }

    fn rule(verb: &str, resource: &str) -> serde_json::Value {
        json!({"apiGroups": [""], "resources": [resource], "verbs": [verb]})
    }

    fn rules(v: serde_json::Value) -> Vec<PolicyRule> {
        serde_json::from_value(v).unwrap()
    }

    /// One case: what it is, the role synced, the other roles in the cache, the rules written.
    type Case = (
        &'static str,
        Arc<ClusterRole>,
        Vec<Arc<ClusterRole>>,
        Option<serde_json::Value>,
    );

    /// Upstream's `TestSyncClusterRole` table, in its terms: the roles in the cache, the one
    /// synced, and the rules written (or none).
    #[test]
    fn upstream_sync_cluster_role_table() {
        let hammer = role(
            json!({"metadata": {"name": "hammer", "labels": {"foo": "bar"}},
            "rules": [rule("hammer", "nails")]}),
        );
        let chisel = role(
            json!({"metadata": {"name": "chisel", "labels": {"foo": "bar"}},
            "rules": [rule("chisel", "marble")]}),
        );
        let sanding = role(
            json!({"metadata": {"name": "sanding", "labels": {"other": "baz"}},
            "rules": [rule("sand", "wood")]}),
        );
        let aggregated = |selectors: serde_json::Value, current: serde_json::Value| {
            role(json!({"metadata": {"name": "aggregated"},
                "aggregationRule": {"clusterRoleSelectors": selectors}, "rules": current}))
        };
        let foo_bar = json!([{"matchLabels": {"foo": "bar"}}]);
        let both = json!([{"matchLabels": {"foo": "bar"}}, {"matchLabels": {"other": "baz"}}]);
        let cases: Vec<Case> = vec![
            (
                "no aggregation rule: nothing",
                role(json!({"metadata": {"name": "plain"}, "rules": [rule("get", "pods")]})),
                vec![hammer.clone()],
                None,
            ),
            (
                "no matching roles, no rules: nothing",
                aggregated(json!([{"matchLabels": {"none": "match"}}]), json!([])),
                vec![hammer.clone(), chisel.clone()],
                None,
            ),
            (
                "no matching roles, rules left: emptied",
                aggregated(
                    json!([{"matchLabels": {"none": "match"}}]),
                    json!([rule("x", "y")]),
                ),
                vec![hammer.clone()],
                Some(json!([])),
            ),
            (
                "union of the matching roles, sorted by name",
                aggregated(foo_bar.clone(), json!([])),
                vec![hammer.clone(), chisel.clone(), sanding.clone()],
                Some(json!([rule("chisel", "marble"), rule("hammer", "nails")])),
            ),
            (
                "already right: nothing",
                aggregated(
                    foo_bar.clone(),
                    json!([rule("chisel", "marble"), rule("hammer", "nails")]),
                ),
                vec![hammer.clone(), chisel.clone(), sanding.clone()],
                None,
            ),
            (
                "right rules in another order: rewritten",
                aggregated(
                    foo_bar.clone(),
                    json!([rule("hammer", "nails"), rule("chisel", "marble")]),
                ),
                vec![hammer.clone(), chisel.clone()],
                Some(json!([rule("chisel", "marble"), rule("hammer", "nails")])),
            ),
            (
                "two selectors: in selector order, each rule once",
                aggregated(both.clone(), json!([])),
                vec![
                    sanding.clone(),
                    hammer.clone(),
                    role(
                        json!({"metadata": {"name": "dup", "labels": {"other": "baz"}},
                        "rules": [rule("hammer", "nails"), rule("sand", "wood")]}),
                    ),
                ],
                Some(json!([rule("hammer", "nails"), rule("sand", "wood")])),
            ),
        ];
        for (what, synced, mut cache, want) in cases {
            cache.push(synced.clone());
            let got = plan(&synced, &cache).unwrap();
            assert_eq!(got, want.map(rules), "{what}");
        }
    }

    #[test]
    fn the_role_itself_is_skipped_and_missing_lists_equal_empty_ones() {
        let itself = role(json!({"metadata": {"name": "self", "labels": {"a": "b"}},
            "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"a": "b"}}]},
            "rules": [rule("get", "pods")]}));
        let got = plan(&itself, std::slice::from_ref(&itself)).unwrap();
        assert_eq!(got, Some(vec![]), "its own rules are not aggregated");

        // `resourceNames: []` in one role equals no resourceNames in the other.
        let a = role(json!({"metadata": {"name": "a", "labels": {"k": "v"}},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"], "resourceNames": []}]}));
        let agg = role(json!({"metadata": {"name": "agg"},
            "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"k": "v"}}]},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}));
        assert_eq!(plan(&agg, &[a, agg.clone()]).unwrap(), None);
    }

    #[test]
    fn a_bad_selector_is_an_error_naming_the_role() {
        let agg = role(json!({"metadata": {"name": "broken"},
            "aggregationRule": {"clusterRoleSelectors": [{"matchExpressions":
                [{"key": "k", "operator": "Bogus"}]}]}}));
        let err = plan(&agg, std::slice::from_ref(&agg))
            .unwrap_err()
            .to_string();
        assert!(err.contains("ClusterRole broken"), "{err}");
    }

    #[test]
    fn the_apply_body_carries_only_name_and_rules() {
        let body = apply_body("view", &rules(json!([rule("get", "pods")])));
        assert_eq!(body["metadata"], json!({"name": "view"}));
        assert_eq!(body["rules"], json!([rule("get", "pods")]));
        assert!(apply_body("view", &[]).get("rules").is_none());
    }
}
