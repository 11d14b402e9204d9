//! Which controller owns a Pod and its scale, as upstream's `finders`: the Pod's controller
//! reference is tried as a ReplicationController, as a ReplicaSet owned by a Deployment (the
//! Deployment's scale), as a ReplicaSet owned by no Deployment, as a StatefulSet (all four from
//! the caches), and then as anything with a scale subresource (a GET of `<resource>/scale`, the
//! kind mapped to its resource through discovery). A reference whose kind the API server does not
//! serve, or whose resource has no scale subresource, is an error naming it; one whose object is
//! missing or has another uid is not found.
//!
//! Owns the lookups only; adding the scales up is the controller's.

use std::sync::Arc;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::ReplicationController;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::core::{DynamicObject, GroupVersionKind};
use kube::{Api, Client};

use crate::helpers::meta::controller_of;
use crate::runtime::apierrors::{api_message, is_not_found};
use crate::runtime::cache::Indexed;

/// A controller found for a Pod: its uid and its desired replicas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerScale {
    pub uid: String,
    pub scale: i32,
}

/// The versions of `Scale` a scale subresource may serve (client-go's `ScaleVersions`).
const SCALE_VERSIONS: [(&str, &str); 4] = [
    ("autoscaling", "v1"),
    ("extensions", "v1beta1"),
    ("apps", "v1beta1"),
    ("apps", "v1beta2"),
];

/// The caches the local finders read.
pub trait Lookup {
    fn replication_controller(&self, ns: &str, name: &str) -> Option<Arc<ReplicationController>>;
    fn replica_set(&self, ns: &str, name: &str) -> Option<Arc<ReplicaSet>>;
    fn deployment(&self, ns: &str, name: &str) -> Option<Arc<Deployment>>;
    fn stateful_set(&self, ns: &str, name: &str) -> Option<Arc<StatefulSet>>;
}

/// The shared informers' caches of the four kinds.
pub struct Caches {
    pub rcs: Arc<Indexed<ReplicationController>>,
    pub rss: Arc<Indexed<ReplicaSet>>,
    pub deployments: Arc<Indexed<Deployment>>,
    pub statefulsets: Arc<Indexed<StatefulSet>>,
}

impl Lookup for Caches {
    fn replication_controller(&self, ns: &str, name: &str) -> Option<Arc<ReplicationController>> {
        self.rcs.get(ns, name)
    }
    fn replica_set(&self, ns: &str, name: &str) -> Option<Arc<ReplicaSet>> {
        self.rss.get(ns, name)
    }
    fn deployment(&self, ns: &str, name: &str) -> Option<Arc<Deployment>> {
        self.deployments.get(ns, name)
    }
    fn stateful_set(&self, ns: &str, name: &str) -> Option<Arc<StatefulSet>> {
        self.statefulsets.get(ns, name)
    }
}

/// `schema.ParseGroupVersion`: the group of an apiVersion (`""` for `v1`).
pub fn group_of(api_version: &str) -> Result<&str, String> {
    match api_version.split('/').collect::<Vec<_>>()[..] {
        [] | [_] => Ok(""),
        [g, _] => Ok(g),
        _ => Err(format!("unexpected GroupVersion string: {api_version}")),
    }
}

/// `verifyGroupKind`: the reference is of `kind` in one of `groups`.
fn is_kind(r: &OwnerReference, kind: &str, groups: &[&str]) -> Result<bool, String> {
    let group = group_of(&r.api_version)?;
    Ok(r.kind == kind && groups.contains(&group))
}

/// The four finders over the caches, in upstream's order (ReplicationController, Deployment,
/// ReplicaSet, StatefulSet); `Ok(None)` when none of them knows the reference (the caller then
/// tries the scale subresource).
pub fn find_cached(
    caches: &impl Lookup,
    r: &OwnerReference,
    ns: &str,
) -> Result<Option<ControllerScale>, String> {
    let found = |uid: Option<&String>, replicas: Option<i32>| {
        (uid == Some(&r.uid)).then(|| ControllerScale {
            uid: r.uid.clone(),
            scale: replicas.unwrap_or(1),
        })
    };
    if is_kind(r, "ReplicationController", &[""])? {
        if let Some(rc) = caches.replication_controller(ns, &r.name) {
            let replicas = rc.spec.as_ref().and_then(|s| s.replicas);
            if let Some(c) = found(rc.metadata.uid.as_ref(), replicas) {
                return Ok(Some(c));
            }
        }
    }
    if is_kind(r, "ReplicaSet", &["apps", "extensions"])? {
        if let Some(rs) = caches.replica_set(ns, &r.name) {
            if rs.metadata.uid.as_ref() == Some(&r.uid) {
                match controller_of(&rs.metadata) {
                    // A Deployment's ReplicaSet counts as its Deployment.
                    Some(d_ref) if d_ref.kind == "Deployment" => {
                        if is_kind(d_ref, "Deployment", &["apps", "extensions"])? {
                            if let Some(d) = caches.deployment(ns, &d_ref.name) {
                                if d.metadata.uid.as_ref() == Some(&d_ref.uid) {
                                    return Ok(Some(ControllerScale {
                                        uid: d_ref.uid.clone(),
                                        scale: d
                                            .spec
                                            .as_ref()
                                            .and_then(|s| s.replicas)
                                            .unwrap_or(1),
                                    }));
                                }
                            }
                        }
                    }
                    _ => {
                        let replicas = rs.spec.as_ref().and_then(|s| s.replicas);
                        return Ok(found(rs.metadata.uid.as_ref(), replicas));
                    }
                }
            }
        }
    }
    if is_kind(r, "StatefulSet", &["apps"])? {
        if let Some(ss) = caches.stateful_set(ns, &r.name) {
            let replicas = ss.spec.as_ref().and_then(|s| s.replicas);
            if let Some(c) = found(ss.metadata.uid.as_ref(), replicas) {
                return Ok(Some(c));
            }
        }
    }
    Ok(None)
}

/// `getScaleController`: the reference's kind mapped to its resource (discovery of its group
/// version), then the scale subresource read. Errors as upstream words them: an unserved kind,
/// a resource without a scale subresource.
pub async fn find_by_scale(
    client: &Client,
    r: &OwnerReference,
    ns: &str,
) -> Result<Option<ControllerScale>, String> {
    let group = group_of(&r.api_version)?;
    let version = r.api_version.rsplit('/').next().unwrap_or_default();
    let gvk = GroupVersionKind::gvk(group, version, &r.kind);
    let (ar, caps) = match kube::discovery::pinned_kind(client, &gvk).await {
        Ok(found) => found,
        Err(kube::Error::Discovery(_)) => {
            return Err(no_match(r));
        }
        Err(e) if is_not_found(&e) => return Err(no_match(r)),
        Err(e) => return Err(api_message(&e)),
    };
    let has_scale = caps.subresources.iter().any(|(sub, _)| {
        sub.plural == "scale"
            && sub.kind == "Scale"
            && SCALE_VERSIONS.contains(&(sub.group.as_str(), sub.version.as_str()))
    });
    if !has_scale {
        let gr = if ar.group.is_empty() {
            ar.plural.clone()
        } else {
            format!("{}.{}", ar.plural, ar.group)
        };
        return Err(format!("{gr} does not implement the scale subresource"));
    }
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
    match api.get_scale(&r.name).await {
        Ok(scale) => {
            let uid = scale.metadata.uid.unwrap_or_default();
            Ok((uid == r.uid).then(|| ControllerScale {
                uid,
                scale: scale.spec.and_then(|s| s.replicas).unwrap_or(0),
            }))
        }
        Err(e) if is_not_found(&e) => Ok(None),
        Err(e) => Err(api_message(&e)),
    }
}

/// The RESTMapper's error for a kind the API server does not serve.
fn no_match(r: &OwnerReference) -> String {
    format!(
        "no matches for kind {:?} in version {:?}",
        r.kind, r.api_version
    )
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use serde_json::json;

    use super::*;

    #[derive(Default)]
    struct Fake {
        objects: HashMap<(&'static str, String), serde_json::Value>,
    }

    impl Fake {
        fn with(mut self, kind: &'static str, v: serde_json::Value) -> Self {
            let name = v["metadata"]["name"].as_str().unwrap().to_string();
            self.objects.insert((kind, name), v);
            self
        }
        fn get<K: serde::de::DeserializeOwned>(
            &self,
            kind: &'static str,
            name: &str,
        ) -> Option<Arc<K>> {
            let v = self.objects.get(&(kind, name.to_string()))?;
            Some(Arc::new(serde_json::from_value(v.clone()).unwrap()))
        }
    }

    impl Lookup for Fake {
        fn replication_controller(&self, _: &str, n: &str) -> Option<Arc<ReplicationController>> {
            self.get("rc", n)
        }
        fn replica_set(&self, _: &str, n: &str) -> Option<Arc<ReplicaSet>> {
            self.get("rs", n)
        }
        fn deployment(&self, _: &str, n: &str) -> Option<Arc<Deployment>> {
            self.get("deploy", n)
        }
        fn stateful_set(&self, _: &str, n: &str) -> Option<Arc<StatefulSet>> {
            self.get("ss", n)
        }
    }

    fn obj(
        name: &str,
        uid: &str,
        replicas: i32,
        owner: Option<(&str, &str, &str)>,
    ) -> serde_json::Value {
        let mut v = json!({"metadata": {"name": name, "uid": uid}, "spec": {"replicas": replicas,
            "selector": {}, "template": {}}});
        if let Some((kind, n, u)) = owner {
            v["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": kind,
                "name": n, "uid": u, "controller": true}]);
        }
        v
    }

    fn r(api_version: &str, kind: &str, name: &str, uid: &str) -> OwnerReference {
        OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: name.into(),
            uid: uid.into(),
            controller: Some(true),
            ..Default::default()
        }
    }

    /// upstream's TestBasicFinderFunctions and TestDeploymentFinderFunction, restated.
    #[test]
    fn pods_controllers_are_found_in_the_caches() {
        let caches = Fake::default()
            .with("rc", obj("rc", "rc-uid", 3, None))
            .with("rs", obj("rs", "rs-uid", 5, None))
            .with(
                "rs",
                obj("drs", "drs-uid", 2, Some(("Deployment", "d", "d-uid"))),
            )
            .with("deploy", obj("d", "d-uid", 10, None))
            .with(
                "rs",
                obj(
                    "lost",
                    "lost-uid",
                    4,
                    Some(("Deployment", "gone", "gone-uid")),
                ),
            )
            .with("ss", obj("ss", "ss-uid", 7, None));
        let found = |s: i32, uid: &str| {
            Ok(Some(ControllerScale {
                uid: uid.into(),
                scale: s,
            }))
        };
        let cases = [
            (
                "an RC",
                r("v1", "ReplicationController", "rc", "rc-uid"),
                found(3, "rc-uid"),
            ),
            (
                "a ReplicaSet",
                r("apps/v1", "ReplicaSet", "rs", "rs-uid"),
                found(5, "rs-uid"),
            ),
            (
                "an extensions ReplicaSet",
                r("extensions/v1beta1", "ReplicaSet", "rs", "rs-uid"),
                found(5, "rs-uid"),
            ),
            (
                "a Deployment's ReplicaSet: the Deployment",
                r("apps/v1", "ReplicaSet", "drs", "drs-uid"),
                found(10, "d-uid"),
            ),
            (
                "a ReplicaSet of a missing Deployment: not here",
                r("apps/v1", "ReplicaSet", "lost", "lost-uid"),
                Ok(None),
            ),
            (
                "a StatefulSet",
                r("apps/v1", "StatefulSet", "ss", "ss-uid"),
                found(7, "ss-uid"),
            ),
            (
                "another uid",
                r("apps/v1", "ReplicaSet", "rs", "old-uid"),
                Ok(None),
            ),
            ("missing", r("apps/v1", "ReplicaSet", "nope", "x"), Ok(None)),
            (
                "a kind of another group",
                r("example.com/v1", "ReplicaSet", "rs", "rs-uid"),
                Ok(None),
            ),
            (
                "an RC in apps",
                r("apps/v1", "ReplicationController", "rc", "rc-uid"),
                Ok(None),
            ),
            (
                "a malformed apiVersion",
                r("a/b/c", "ReplicaSet", "rs", "rs-uid"),
                Err("unexpected GroupVersion string: a/b/c".to_string()),
            ),
        ];
        for (what, reference, want) in cases {
            assert_eq!(find_cached(&caches, &reference, "ns"), want, "{what}");
        }
    }
}
