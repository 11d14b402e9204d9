//! What the garbage collector watches and how it addresses owners, from the API server's
//! aggregated discovery (`/api` and `/apis`, two requests): the deletable resources (upstream
//! `GetDeletableResources`: each group-resource at its preferred version, kept when it supports
//! `delete`, `list` and `watch`) and a REST mapper from `apiVersion` + `kind` (what an owner
//! reference says) to the resource path and scope, over every served version. Group versions the
//! server marks stale are reported as failed, so the caller can keep their monitors (upstream's
//! partial-discovery rule). This module only reads discovery; it starts nothing.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use kube::core::discovery::v2::APIGroupDiscoveryList;
use kube::core::ApiResource;
use kube::Client;

pub use crate::helpers::discovery::Gvr;
use crate::helpers::discovery::{group_versions, is_namespaced};

/// Splits an `apiVersion` into group and version (`v1` is the core group); `None` when it has
/// more than one slash or an empty part.
pub fn parse_api_version(api_version: &str) -> Option<(&str, &str)> {
    match api_version.split_once('/') {
        None if !api_version.is_empty() => Some(("", api_version)),
        Some((g, v)) if !g.is_empty() && !v.is_empty() && !v.contains('/') => Some((g, v)),
        _ => None,
    }
}

/// A resource's kind and scope.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceInfo {
    /// The kind its objects have.
    pub kind: String,
    /// Namespaced (else cluster-scoped).
    pub namespaced: bool,
}

/// Where `apiVersion` + `kind` live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// The resource.
    pub gvr: Gvr,
    /// Its kind and scope.
    pub info: ResourceInfo,
}

impl Mapping {
    /// The kube-rs description of the resource, for a dynamic `Api`.
    pub fn api_resource(&self) -> ApiResource {
        api_resource(&self.gvr, &self.info)
    }
}

/// The kube-rs description of a resource.
pub fn api_resource(gvr: &Gvr, info: &ResourceInfo) -> ApiResource {
    gvr.api_resource(&info.kind)
}

/// `(group, version, kind)` to resource, over every served (non-stale) version.
#[derive(Clone, Debug, Default)]
pub struct RestMapper {
    by_gvk: HashMap<(String, String, String), Mapping>,
}

impl RestMapper {
    /// The resource serving `kind` at `api_version` (upstream `RESTMapping(groupKind, version)`).
    pub fn mapping(&self, api_version: &str, kind: &str) -> Option<&Mapping> {
        let (g, v) = parse_api_version(api_version)?;
        self.by_gvk
            .get(&(g.to_string(), v.to_string(), kind.to_string()))
    }
}

/// One discovery round's result.
#[derive(Clone, Debug, Default)]
pub struct Discovered {
    /// The resources to monitor, with their kinds and scopes.
    pub deletable: BTreeMap<Gvr, ResourceInfo>,
    /// Group versions the server reported stale (`group`, `version`).
    pub failed: BTreeSet<(String, String)>,
    /// The REST mapper of this round.
    pub mapper: RestMapper,
}

const REQUIRED_VERBS: [&str; 3] = ["delete", "list", "watch"];

/// Reads the aggregated discovery documents (`/api`'s then `/apis`', in that order, as the
/// server's group priority).
pub fn parse(lists: &[APIGroupDiscoveryList]) -> Discovered {
    let mut out = Discovered::default();
    // (group, resource) -> the version chosen.
    let mut preferred: BTreeMap<(String, String), (String, ResourceInfo, bool)> = BTreeMap::new();
    // Versions come in preference order: the first is the group's preferred version.
    for gv in group_versions(lists) {
        let (name, v) = (gv.group, gv.version);
        if gv.stale {
            out.failed.insert((name, v));
            continue;
        }
        for (plural, res) in gv.resources {
            let Some(kind) = res.response_kind.as_ref().and_then(|k| k.kind.clone()) else {
                continue;
            };
            let info = ResourceInfo {
                kind: kind.clone(),
                namespaced: is_namespaced(res),
            };
            let gvr = Gvr {
                group: name.clone(),
                version: v.clone(),
                resource: plural.clone(),
            };
            out.by_gvk_insert(&gvr, &info);
            // Upstream ServerPreferredResources: a group-resource at the preferred version,
            // else at the first version serving it.
            let deletable = REQUIRED_VERBS
                .iter()
                .all(|verb| res.verbs.iter().any(|x| x == verb));
            preferred
                .entry((name.clone(), plural))
                .or_insert((v.clone(), info, deletable));
        }
    }
    for ((group, resource), (version, info, deletable)) in preferred {
        if deletable {
            out.deletable.insert(
                Gvr {
                    group,
                    version,
                    resource,
                },
                info,
            );
        }
    }
    out
}

impl Discovered {
    fn by_gvk_insert(&mut self, gvr: &Gvr, info: &ResourceInfo) {
        self.mapper
            .by_gvk
            .entry((gvr.group.clone(), gvr.version.clone(), info.kind.clone()))
            .or_insert_with(|| Mapping {
                gvr: gvr.clone(),
                info: info.clone(),
            });
    }
}

/// Runs one discovery round against the API server.
pub async fn discover(client: &Client) -> Result<Discovered, kube::Error> {
    let core = client.list_core_api_versions_aggregated().await?;
    let apis = client.list_api_groups_aggregated().await?;
    Ok(parse(&[core, apis]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn list(v: serde_json::Value) -> APIGroupDiscoveryList {
        serde_json::from_value(v).unwrap()
    }

    fn res(name: &str, kind: &str, scope: &str, verbs: &[&str]) -> serde_json::Value {
        json!({"resource": name, "responseKind": {"kind": kind}, "scope": scope, "verbs": verbs})
    }

    const ALL: &[&str] = &[
        "create", "delete", "get", "list", "patch", "update", "watch",
    ];

    fn sample() -> Vec<APIGroupDiscoveryList> {
        vec![
            list(
                json!({"items": [{"metadata": {"name": ""}, "versions": [{"version": "v1", "resources": [
                    res("pods", "Pod", "Namespaced", ALL),
                    res("namespaces", "Namespace", "Cluster", ALL),
                    res("bindings", "Binding", "Namespaced", &["create"]),
                    res("componentstatuses", "ComponentStatus", "Cluster", &["get", "list"]),
                ]}]}]}),
            ),
            list(json!({"items": [
                {"metadata": {"name": "apps"}, "versions": [{"version": "v1", "resources": [
                    res("replicasets", "ReplicaSet", "Namespaced", ALL),
                ]}]},
                {"metadata": {"name": "example.com"}, "versions": [
                    {"version": "v2", "resources": [res("widgets", "Widget", "Namespaced", ALL)]},
                    {"version": "v1", "resources": [
                        res("widgets", "Widget", "Namespaced", ALL),
                        res("gadgets", "Gadget", "Cluster", ALL),
                    ]},
                ]},
                {"metadata": {"name": "metrics.example.com"}, "versions": [
                    {"version": "v1", "freshness": "Stale", "resources": [res("things", "Thing", "Namespaced", ALL)]},
                ]},
            ]})),
        ]
    }

    fn gvr(g: &str, v: &str, r: &str) -> Gvr {
        Gvr {
            group: g.into(),
            version: v.into(),
            resource: r.into(),
        }
    }

    #[test]
    fn gc2_deletable_resources_are_the_preferred_versions_with_delete_list_watch() {
        let d = parse(&sample());
        let got: Vec<String> = d.deletable.keys().map(|g| g.path()).collect();
        assert_eq!(
            got,
            [
                "v1/namespaces",
                "v1/pods",
                "apps/v1/replicasets",
                "example.com/v1/gadgets",
                "example.com/v2/widgets",
            ],
            "bindings (create only) and componentstatuses (no watch, no delete) are left out; \
             widgets at the preferred v2; gadgets only served at v1"
        );
        assert!(!d.deletable[&gvr("", "v1", "pods")].kind.is_empty());
        assert!(!d.deletable[&gvr("", "v1", "namespaces")].namespaced);
        assert_eq!(
            d.failed,
            BTreeSet::from([("metrics.example.com".to_string(), "v1".to_string())]),
            "a stale group version is reported failed, not dropped silently"
        );
    }

    #[test]
    fn gc7_rest_mapper_maps_every_served_version_and_scope() {
        let d = parse(&sample());
        let m = d.mapper.mapping("example.com/v1", "Widget").unwrap();
        assert_eq!(
            m.gvr,
            gvr("example.com", "v1", "widgets"),
            "non-preferred versions map too"
        );
        let m = d.mapper.mapping("v1", "Namespace").unwrap();
        assert!(!m.info.namespaced);
        assert_eq!(m.api_resource().api_version, "v1");
        assert!(
            d.mapper.mapping("apps/v1beta1", "ReplicaSet").is_none(),
            "unserved version"
        );
        assert!(
            d.mapper.mapping("apps/v1", "Pod").is_none(),
            "kind of another group"
        );
        assert!(
            d.mapper.mapping("a/b/c", "X").is_none(),
            "invalid apiVersion"
        );
        assert!(
            d.mapper
                .mapping("metrics.example.com/v1", "Thing")
                .is_none(),
            "stale"
        );
    }

    #[test]
    fn api_versions_parse_as_upstream() {
        assert_eq!(parse_api_version("v1"), Some(("", "v1")));
        assert_eq!(parse_api_version("apps/v1"), Some(("apps", "v1")));
        assert_eq!(parse_api_version(""), None);
        assert_eq!(parse_api_version("/v1"), None);
        assert_eq!(parse_api_version("a/b/c"), None);
    }
}
