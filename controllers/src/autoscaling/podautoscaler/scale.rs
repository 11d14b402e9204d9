//! The scale subresource of any scalable resource (upstream's scale client over a RESTMapper):
//! the target's `apiVersion` and `kind` are resolved to its resource through the API server's
//! discovery of that group version (cached, so a sync costs no discovery), and its `/scale` is
//! read and written. A kind the group version does not serve is upstream's error, `no matches
//! for kind "K" in group "G"`; a target that does not exist or has no scale subresource is the
//! API server's answer to the read.
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
    /// The resource of `kind` in `api_version`.
    pub async fn resolve(
        &self,
        client: &Client,
        api_version: &str,
        kind: &str,
    ) -> Result<ApiResource, String> {
        let key = (api_version.to_string(), kind.to_string());
        if let Some((ar, at)) = self.cache.lock().expect("resolver lock").get(&key) {
            if at.elapsed() < RESOLVED_TTL {
                return Ok(ar.clone());
            }
        }
        let (group, version) = match api_version.split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", api_version),
        };
        if version.is_empty() || api_version.matches('/').count() > 1 {
            return Err(format!("unexpected GroupVersion string: {api_version}"));
        }
        let no_match = || format!("no matches for kind {kind:?} in group {group:?}");
        let listed = if group.is_empty() {
            client.list_core_api_resources(version).await
        } else {
            client.list_api_group_resources(api_version).await
        };
        let list: APIResourceList = match listed {
            Ok(list) => list,
            Err(kube::Error::Api(s)) if s.code == 404 => return Err(no_match()),
            Err(e) => return Err(message(&e)),
        };
        let found = list
            .resources
            .iter()
            .find(|r| r.kind == kind && !r.name.contains('/'))
            .ok_or_else(no_match)?;
        let ar = ApiResource {
            group: group.to_string(),
            version: version.to_string(),
            api_version: api_version.to_string(),
            kind: kind.to_string(),
            plural: found.name.clone(),
        };
        self.cache
            .lock()
            .expect("resolver lock")
            .insert(key, (ar.clone(), Instant::now()));
        Ok(ar)
    }
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
