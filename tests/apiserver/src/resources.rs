//! The resource types the test API server knows, and the discovery documents built from them.
//!
//! Owns only static type information (group, version, plural, kind, scope, subresources); no state.

use serde_json::{json, Value};

/// One served resource type.
#[derive(Debug, PartialEq, Eq)]
pub struct ResourceType {
    /// API group; empty for the core group.
    pub group: &'static str,
    /// API version inside the group.
    pub version: &'static str,
    /// Plural name used in URLs.
    pub plural: &'static str,
    /// Kind written into objects.
    pub kind: &'static str,
    /// Whether objects live in a namespace.
    pub namespaced: bool,
    /// Whether `status` is a subresource (then the main resource ignores status writes).
    pub status_subresource: bool,
}

impl ResourceType {
    /// `v1` for the core group, `group/version` otherwise.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

const fn rt(
    group: &'static str,
    version: &'static str,
    plural: &'static str,
    kind: &'static str,
    namespaced: bool,
    status_subresource: bool,
) -> ResourceType {
    ResourceType {
        group,
        version,
        plural,
        kind,
        namespaced,
        status_subresource,
    }
}

/// Every resource type served. Extend here to serve more (any JSON object is stored as written).
pub static RESOURCES: &[ResourceType] = &[
    rt("", "v1", "services", "Service", true, true),
    rt("", "v1", "pods", "Pod", true, true),
    rt("", "v1", "endpoints", "Endpoints", true, false),
    rt("", "v1", "nodes", "Node", false, true),
    rt("", "v1", "namespaces", "Namespace", false, true),
    rt("", "v1", "configmaps", "ConfigMap", true, false),
    rt("", "v1", "events", "Event", true, false),
    rt(
        "discovery.k8s.io",
        "v1",
        "endpointslices",
        "EndpointSlice",
        true,
        false,
    ),
    rt("coordination.k8s.io", "v1", "leases", "Lease", true, false),
    rt("apps", "v1", "replicasets", "ReplicaSet", true, true),
    rt("apps", "v1", "deployments", "Deployment", true, true),
    rt("apps", "v1", "statefulsets", "StatefulSet", true, true),
    rt("apps", "v1", "daemonsets", "DaemonSet", true, true),
    rt("batch", "v1", "jobs", "Job", true, true),
    rt("batch", "v1", "cronjobs", "CronJob", true, true),
    rt("events.k8s.io", "v1", "events", "Event", true, false),
];

/// Finds a resource type by group, version and plural.
pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static ResourceType> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// Finds a resource type by its plural name alone (used by the server handle).
pub fn by_plural(plural: &str) -> Option<&'static ResourceType> {
    RESOURCES.iter().find(|r| r.plural == plural)
}

fn groups() -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    for r in RESOURCES.iter().filter(|r| !r.group.is_empty()) {
        if !out.contains(&(r.group, r.version)) {
            out.push((r.group, r.version));
        }
    }
    out
}

/// `GET /api`.
pub fn core_versions() -> Value {
    json!({"kind": "APIVersions", "versions": ["v1"],
           "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]})
}

fn group_doc(group: &str, version: &str) -> Value {
    let gv = json!({"groupVersion": format!("{group}/{version}"), "version": version});
    json!({"name": group, "versions": [gv.clone()], "preferredVersion": gv})
}

/// `GET /apis`.
pub fn group_list() -> Value {
    let groups: Vec<Value> = groups().into_iter().map(|(g, v)| group_doc(g, v)).collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `GET /apis/{group}`, if the group is served.
pub fn group(group: &str) -> Option<Value> {
    let (g, v) = groups().into_iter().find(|(g, _)| *g == group)?;
    let mut doc = group_doc(g, v);
    doc["kind"] = json!("APIGroup");
    doc["apiVersion"] = json!("v1");
    Some(doc)
}

/// `GET /api/v1` or `GET /apis/{group}/{version}`, if that group version is served.
pub fn resource_list(group: &str, version: &str) -> Option<Value> {
    let mut resources = Vec::new();
    for r in RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        resources.push(json!({
            "name": r.plural, "singularName": r.kind.to_lowercase(), "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
        }));
        if r.status_subresource {
            resources.push(
                json!({"name": format!("{}/status", r.plural), "singularName": "",
                "namespaced": r.namespaced, "kind": r.kind, "verbs": ["get", "patch", "update"]}),
            );
        }
        if r.plural == "pods" && r.group.is_empty() {
            resources.push(
                json!({"name": "pods/binding", "singularName": "", "namespaced": true,
                "kind": "Binding", "verbs": ["create"]}),
            );
        }
    }
    if resources.is_empty() {
        return None;
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}

/// `GET /version`.
pub fn version() -> Value {
    json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0-kpr-test-apiserver",
           "gitCommit": "", "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
           "goVersion": "none", "compiler": "rustc", "platform": "linux/amd64"})
}
