//! The scale subresource of any scalable resource (upstream's scale client over a RESTMapper):
//! the target's group (from its `apiVersion`) and `kind` are resolved to its resource through the
//! API server's discovery of that group, in any version it serves, the preferred one first, as
//! upstream's `RESTMappings(groupKind)` does: the version the `apiVersion` names need not be served
//! (upstream's e2e specs still write `apps/v1beta2`). Cached, so a sync costs no discovery; its
//! `/scale` is read and written. A kind no version of the group serves is upstream's error, `no
//! matches for kind "K" in group "G"`; a target that does not exist or has no scale subresource is
//! the API server's answer to the read.
//!
//! Owns: this resolution and the two requests.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::autoscaling::v1::Scale;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResourceList;
use kube::api::{ApiResource, DynamicObject, PostParams};
use kube::{Api, Client};

/// How long a resolved kind is trusted before it is looked up again (upstream resets its
/// discovery cache when a lookup misses; a miss here is never cached).
const RESOLVED_TTL: Duration = Duration::from_secs(300);

/// Resolves kinds to resources, caching what it found.
#[derive(Default)]
pub struct Resolver {
    cache: Mutex<HashMap<(String, String), (ApiResource, Instant)>>,
}

/// The message of an API error as the API server wrote it.
pub fn message(e: &kube::Error) -> String {
    crate::runtime::apierrors::api_message(e)
}

impl Resolver {
    /// The resource of `kind` in the group `api_version` names.
    pub async fn resolve(
        &self,
        client: &Client,
        api_version: &str,
        kind: &str,
    ) -> Result<ApiResource, String> {
        let (group, version) = match api_version.split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", api_version),
        };
        if version.is_empty() || api_version.matches('/').count() > 1 {
            return Err(format!("unexpected GroupVersion string: {api_version}"));
        }
        let key = (group.to_string(), kind.to_string());
        if let Some((ar, at)) = self.cache.lock().expect("resolver lock").get(&key) {
            if at.elapsed() < RESOLVED_TTL {
                return Ok(ar.clone());
            }
        }
        let no_match = || format!("no matches for kind {kind:?} in group {group:?}");
        let versions = if group.is_empty() {
            vec!["v1".to_string()]
        } else {
            let groups = client.list_api_groups().await.map_err(|e| message(&e))?;
            let Some(served) = groups.groups.into_iter().find(|g| g.name == group) else {
                return Err(no_match());
            };
            served_versions(
                served.preferred_version.map(|v| v.version),
                served.versions.into_iter().map(|v| v.version),
            )
        };
        for version in versions {
            let group_version = if group.is_empty() {
                version.clone()
            } else {
                format!("{group}/{version}")
            };
            let listed = if group.is_empty() {
                client.list_core_api_resources(&version).await
            } else {
                client.list_api_group_resources(&group_version).await
            };
            let list: APIResourceList = match listed {
                Ok(list) => list,
                Err(kube::Error::Api(s)) if s.code == 404 => continue,
                Err(e) => return Err(message(&e)),
            };
            let Some(found) = list
                .resources
                .iter()
                .find(|r| r.kind == kind && !r.name.contains('/'))
            else {
                continue;
            };
            let ar = ApiResource {
                group: group.to_string(),
                version,
                api_version: group_version,
                kind: kind.to_string(),
                plural: found.name.clone(),
            };
            self.cache
                .lock()
                .expect("resolver lock")
                .insert(key, (ar.clone(), Instant::now()));
            return Ok(ar);
        }
        Err(no_match())
    }
}

/// The versions to look a kind up in: the preferred one first, then the others in the order the
/// API server lists them (upstream's RESTMapper's priority).
fn served_versions(
    preferred: Option<String>,
    listed: impl IntoIterator<Item = String>,
) -> Vec<String> {
    let mut versions: Vec<String> = preferred.into_iter().collect();
    for version in listed {
        if !versions.contains(&version) {
            versions.push(version);
        }
    }
    versions
}

/// Reads the scale of `name`.
pub async fn get(
    client: &Client,
    ar: &ApiResource,
    namespace: &str,
    name: &str,
) -> Result<Scale, String> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, ar);
    api.get_scale(name).await.map_err(|e| message(&e))
}

/// Writes `scale` (an update: a stale resourceVersion is a conflict).
pub async fn update(
    client: &Client,
    ar: &ApiResource,
    namespace: &str,
    scale: &Scale,
) -> Result<Scale, kube::Error> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, ar);
    let name = scale.metadata.name.clone().unwrap_or_default();
    api.replace_scale(&name, &PostParams::default(), scale)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_preferred_version_is_tried_first_then_the_listed_order() {
        let listed = ["v1beta1", "v1", "v2"].map(String::from);
        assert_eq!(
            served_versions(Some("v1".into()), listed.clone()),
            ["v1", "v1beta1", "v2"]
        );
        assert_eq!(served_versions(None, listed), ["v1beta1", "v1", "v2"]);
    }
}
