//! Reading the Events a controller recorded, as the suites check them.

use k8s_openapi::api::core::v1::Event;
use kube::api::ListParams;
use kube::Api;

/// The Events the field selector `fields` picks (`involvedObject.name=...,reason=...`) that
/// `component` recorded.
pub async fn recorded_by(api: &Api<Event>, fields: &str, component: &str) -> Vec<Event> {
    api.list(&ListParams::default().fields(fields))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.source.as_ref().and_then(|s| s.component.as_deref()) == Some(component))
        .collect()
}
