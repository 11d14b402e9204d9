//! DefaultBinder: binds a Pod by creating a Binding through the Pod's `binding` subresource
//! (namespace, name and UID of the Pod, target the Node), as upstream's defaultbinder; the API
//! server then sets `spec.nodeName` and the PodScheduled=True condition. The only plugin that
//! writes to the API.

use k8s_openapi::api::core::v1::{Binding, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::PostParams;
use kube::{Api, Client};

use crate::scheduler::framework::{BindPlugin, BoxFuture, CycleState, Plugin, Status};

pub const NAME: &str = "DefaultBinder";

/// Writes Bindings through `client`.
#[derive(Clone)]
pub struct DefaultBinder {
    client: Client,
}

impl DefaultBinder {
    /// DefaultBinder takes no args.
    pub fn new(client: Client) -> Self {
        DefaultBinder { client }
    }
}

impl Plugin for DefaultBinder {
    fn name(&self) -> &'static str {
        NAME
    }
}

/// The Binding upstream's DefaultBinder posts for `pod` on `node`.
pub fn binding(pod: &Pod, node: &str) -> Binding {
    Binding {
        metadata: ObjectMeta {
            namespace: pod.metadata.namespace.clone(),
            name: pod.metadata.name.clone(),
            uid: pod.metadata.uid.clone(),
            ..Default::default()
        },
        target: ObjectReference {
            kind: Some("Node".to_string()),
            name: Some(node.to_string()),
            ..Default::default()
        },
    }
}

impl BindPlugin for DefaultBinder {
    fn bind<'a>(
        &'a self,
        _state: &'a CycleState,
        pod: &'a Pod,
        node: &'a str,
    ) -> BoxFuture<'a, Status> {
        Box::pin(async move {
            let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
            match api
                .create_subresource::<Binding, serde_json::Value>(
                    "binding",
                    name,
                    &PostParams::default(),
                    &binding(pod, node),
                )
                .await
            {
                Ok(_) => Status::success(),
                Err(e) => Status::error(format!("binding {ns}/{name} to {node}: {e}")),
            }
        })
    }
}
