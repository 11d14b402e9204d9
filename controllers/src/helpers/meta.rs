//! Object metadata as apimachinery's `metav1` helpers read it: the controller owner reference
//! (`GetControllerOf`), the `Kind ns/name` controllers name an object by in errors and logs, and
//! whether a Namespace is Active.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;

/// `Kind ns/name` of an object, for errors and logs.
pub fn object_name<K: Resource<DynamicType = ()>>(obj: &K) -> String {
    format!(
        "{} {}/{}",
        K::kind(&()),
        obj.meta().namespace.as_deref().unwrap_or_default(),
        obj.meta().name.as_deref().unwrap_or_default()
    )
}

/// [`object_name`] as a method, so it reads the same through an `Arc` (`job.object_name()` on an
/// `Arc<Job>` or a `&Job`).
pub trait ObjectName {
    /// `Kind ns/name`.
    fn object_name(&self) -> String;
}

impl<K: Resource<DynamicType = ()>> ObjectName for K {
    fn object_name(&self) -> String {
        object_name(self)
    }
}

/// The owner reference with `controller: true` (`metav1.GetControllerOf`).
pub fn controller_of(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
}

/// [`controller_of`] an object.
pub fn controller_of_object<K: Resource>(obj: &K) -> Option<&OwnerReference> {
    controller_of(obj.meta())
}

/// The UID of the object's controller, if it has one.
pub fn controller_uid(meta: &ObjectMeta) -> Option<&str> {
    controller_of(meta).map(|r| r.uid.as_str())
}

/// Whether a Namespace is Active (`status.phase`; one being deleted is `Terminating`).
pub fn namespace_is_active(ns: &k8s_openapi::api::core::v1::Namespace) -> bool {
    ns.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Active")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::ReplicaSet;
    use serde_json::json;

    #[test]
    fn controller_is_the_reference_marked_controller() {
        let rs: ReplicaSet = serde_json::from_value(json!({
            "metadata": {"name": "web-1", "namespace": "ns", "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "c", "uid": "u1"},
                {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "u2",
                 "controller": true},
            ]}
        }))
        .unwrap();
        assert_eq!(controller_uid(&rs.metadata), Some("u2"));
        assert_eq!(object_name(&rs), "ReplicaSet ns/web-1");
        assert_eq!(controller_of(&ObjectMeta::default()), None);
    }
}
