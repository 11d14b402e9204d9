//! Discovery as the namespace controller reads it: client-go's `ServerPreferredResources` rules
//! (preferred version, first version serving a resource, subresources left out, stale group
//! versions as failures), the namespaced and `delete` filters, and `ParseGroupVersion`.

use serde_json::json;

use super::*;

fn doc(v: serde_json::Value) -> APIGroupDiscoveryList {
    serde_json::from_value(json!({"apiVersion": "apidiscovery.k8s.io/v2",
        "kind": "APIGroupDiscoveryList", "metadata": {}, "items": v}))
    .unwrap()
}

fn res(name: &str, scope: &str, verbs: &[&str]) -> serde_json::Value {
    json!({"resource": name, "scope": scope, "verbs": verbs,
           "responseKind": {"group": "", "version": "", "kind": "K"}})
}

const ALL: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "watch",
];

fn sample() -> Vec<APIGroupDiscoveryList> {
    let core = doc(
        json!([{"metadata": {"name": ""}, "versions": [{"version": "v1", "resources": [
            res("pods", "Namespaced", ALL),
            res("nodes", "Cluster", ALL),
            res("bindings", "Namespaced", &["create"]),
            res("pods/status", "Namespaced", &["get"]),
        ]}]}]),
    );
    let apis = doc(json!([
        {"metadata": {"name": "example.com"}, "versions": [
            {"version": "v2", "resources": [res("widgets", "Namespaced", ALL)]},
            {"version": "v1", "resources": [
                res("widgets", "Namespaced", ALL),
                res("gadgets", "Namespaced", &["delete", "get", "list"]),
            ]},
        ]},
        {"metadata": {"name": "metrics.k8s.io"}, "versions": [
            {"version": "v1beta1", "freshness": "Stale", "resources": [res("pods", "Namespaced", &["get", "list"])]},
        ]},
    ]));
    vec![core, apis]
}

#[test]
fn namespaced_resources_at_their_preferred_version() {
    let d = preferred_namespaced(&sample());
    let lists: Vec<(String, Vec<String>)> = d
        .lists
        .iter()
        .map(|l| {
            (
                l.group_version.clone(),
                l.resources.iter().map(|r| r.name.clone()).collect(),
            )
        })
        .collect();
    assert_eq!(
        lists,
        vec![
            ("v1".into(), vec!["bindings".into(), "pods".into()]),
            // widgets at v2 (preferred), gadgets only at v1 which serves it.
            ("example.com/v2".into(), vec!["widgets".into()]),
            ("example.com/v1".into(), vec!["gadgets".into()]),
        ]
    );
}

#[test]
fn stale_group_versions_are_reported_as_client_go_does() {
    let d = preferred_namespaced(&sample());
    assert_eq!(
        d.error().as_deref(),
        Some("unable to retrieve the complete list of server APIs: metrics.k8s.io/v1beta1: stale GroupVersion discovery: metrics.k8s.io/v1beta1")
    );
    assert_eq!(preferred_namespaced(&sample()[..1]).error(), None);
}

#[test]
fn only_what_can_be_deleted_is_kept() {
    let d = preferred_namespaced(&sample());
    let gvrs = group_version_resources(&supporting(&d.lists, &["delete"])).unwrap();
    assert_eq!(
        gvr_set(&gvrs),
        [
            Gvr::pods(),
            Gvr::new("example.com", "v2", "widgets"),
            Gvr::new("example.com", "v1", "gadgets"),
        ]
        .into()
    );
    let gadgets = &gvrs[&Gvr::new("example.com", "v1", "gadgets")];
    assert!(gadgets.supports("list") && !gadgets.supports("deletecollection"));
}

#[test]
fn group_versions_parse_as_apimachinery_does() {
    assert_eq!(parse_group_version("v1"), Ok((String::new(), "v1".into())));
    assert_eq!(
        parse_group_version("apps/v1"),
        Ok(("apps".into(), "v1".into()))
    );
    assert_eq!(parse_group_version(""), Ok((String::new(), String::new())));
    assert_eq!(parse_group_version("/"), Ok((String::new(), String::new())));
    assert_eq!(
        parse_group_version("a/b/c"),
        Err("unexpected GroupVersion string: a/b/c".into())
    );
    let bad = vec![ResourceList {
        group_version: "a/b/c".into(),
        resources: vec![Resource {
            name: "x".into(),
            verbs: vec!["delete".into()],
        }],
    }];
    assert!(group_version_resources(&bad).is_err());
}

#[test]
fn the_display_of_a_gvr_is_go_s() {
    assert_eq!(Gvr::pods().go_string(), "{ v1 pods}");
    assert_eq!(Gvr::pods().api_version(), "v1");
    assert_eq!(gvr_api_version(), "example.com/v1");
}

fn gvr_api_version() -> String {
    Gvr::new("example.com", "v1", "widgets").api_version()
}
