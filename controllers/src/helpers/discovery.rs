//! Group/version/resources and the API server's aggregated discovery documents, as apimachinery's
//! `schema.GroupVersionResource` and client-go's discovery read them: the [`Gvr`] type (with Go's
//! rendering and the path rendering), `group/version` strings, and one walk over the documents'
//! group versions and top-level resources, which the controllers reading discovery (garbage
//! collector, namespace deletion) each filter their own way.
//!
//! Pure: the caller fetches the documents.

use kube::core::discovery::v2::{APIGroupDiscoveryList, APIResourceDiscovery};
use kube::core::ApiResource;

/// A group/version/resource. It has no `Display`: say which rendering a message wants
/// ([`Gvr::go_string`] or [`Gvr::path`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Gvr {
    /// API group (empty for the core group).
    pub group: String,
    /// Version.
    pub version: String,
    /// Plural resource name.
    pub resource: String,
}

impl Gvr {
    /// A group/version/resource from its parts.
    pub fn new(group: &str, version: &str, resource: &str) -> Gvr {
        Gvr {
            group: group.to_string(),
            version: version.to_string(),
            resource: resource.to_string(),
        }
    }

    /// `core/v1` Pods.
    pub fn pods() -> Gvr {
        Gvr::new("", "v1", "pods")
    }

    /// `group/version`, or `version` for the core group.
    pub fn api_version(&self) -> String {
        group_version(&self.group, &self.version)
    }

    /// How Go's `%v` prints a `schema.GroupVersionResource` (`{ v1 pods}`,
    /// `{apps v1 deployments}`), which upstream's messages show.
    pub fn go_string(&self) -> String {
        format!("{{{} {} {}}}", self.group, self.version, self.resource)
    }

    /// `group/version/resource`, or `version/resource` for the core group (`v1/pods`).
    pub fn path(&self) -> String {
        format!("{}/{}", self.api_version(), self.resource)
    }

    /// The kube-rs description of the resource, for a dynamic `Api` (`kind` may be empty when
    /// only its path is used).
    pub fn api_resource(&self, kind: &str) -> ApiResource {
        ApiResource {
            group: self.group.clone(),
            version: self.version.clone(),
            api_version: self.api_version(),
            kind: kind.to_string(),
            plural: self.resource.clone(),
        }
    }
}

/// `group/version`, or `version` for the core group.
pub fn group_version(group: &str, version: &str) -> String {
    if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    }
}

/// One group version of the aggregated discovery documents.
#[derive(Clone, Debug)]
pub struct DiscoveredVersion<'a> {
    /// API group (empty for the core group).
    pub group: String,
    /// Version.
    pub version: String,
    /// The server marks it stale (it could not describe it): a discovery failure.
    pub stale: bool,
    /// Its top-level resources (subresources left out) by plural name, in the document's order.
    pub resources: Vec<(String, &'a APIResourceDiscovery)>,
}

/// The group versions of aggregated discovery documents (`/api`'s then `/apis`'), in their order:
/// groups in the server's priority order, each group's versions in preference order (the first
/// is the group's preferred version). Versions without a name are skipped.
pub fn group_versions(docs: &[APIGroupDiscoveryList]) -> Vec<DiscoveredVersion<'_>> {
    let mut out = Vec::new();
    for group in docs.iter().flat_map(|d| &d.items) {
        let name = group
            .metadata
            .as_ref()
            .and_then(|m| m.name.clone())
            .unwrap_or_default();
        for version in &group.versions {
            let Some(v) = version.version.clone() else {
                continue;
            };
            let resources = version
                .resources
                .iter()
                .filter_map(|r| Some((r.resource.clone()?, r)))
                .filter(|(plural, _)| !plural.contains('/'))
                .collect();
            out.push(DiscoveredVersion {
                group: name.clone(),
                version: v,
                stale: version.freshness.as_deref() == Some("Stale"),
                resources,
            });
        }
    }
    out
}

/// Whether discovery scopes the resource to namespaces.
pub fn is_namespaced(r: &APIResourceDiscovery) -> bool {
    r.scope.as_deref() == Some("Namespaced")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gvr_renders_as_go_and_as_a_path() {
        assert_eq!(Gvr::pods().go_string(), "{ v1 pods}");
        assert_eq!(Gvr::pods().path(), "v1/pods");
        let deployments = Gvr::new("apps", "v1", "deployments");
        assert_eq!(deployments.go_string(), "{apps v1 deployments}");
        assert_eq!(deployments.path(), "apps/v1/deployments");
        assert_eq!(deployments.api_version(), "apps/v1");
        assert_eq!(
            deployments.api_resource("Deployment").api_version,
            "apps/v1"
        );
    }
}
