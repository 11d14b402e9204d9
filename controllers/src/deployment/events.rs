//! Events on Deployments as kube-controller-manager's recorder writes them: core/v1 Events from
//! component `deployment-controller`, one per distinct (type, reason, message) on an object, a
//! repeat within 10 minutes counted on the same Event (`count`, `lastTimestamp`). kube-rs's
//! events.k8s.io recorder folds every event of one reason into a single series, which would keep
//! only the first "Scaled up replica set ..." message. Best effort: failures are logged, never
//! returned, and publishing runs off the sync's path.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

/// The source component, as upstream names it.
pub const COMPONENT: &str = "deployment-controller";

/// A repeat later than this starts a new Event (client-go's aggregation window).
const REPEAT_WINDOW: Duration = Duration::from_secs(600);

/// What makes two events the same one.
type Key = (String, String, bool, String, String);

struct Seen {
    name: String,
    count: i32,
    at: Instant,
}

/// Publishes events.
#[derive(Clone)]
pub struct Events {
    client: Client,
    seen: Arc<Mutex<HashMap<Key, Seen>>>,
}

impl Events {
    /// A publisher using `client`.
    pub fn new(client: Client) -> Self {
        Self {
            client,
            seen: Arc::default(),
        }
    }

    /// Records an event on `regarding` in the background.
    pub fn publish(
        &self,
        regarding: &ObjectReference,
        warning: bool,
        reason: &str,
        message: String,
    ) {
        let this = self.clone();
        let regarding = regarding.clone();
        let reason = reason.to_string();
        tokio::spawn(async move {
            if let Err(e) = this.write(&regarding, warning, &reason, &message).await {
                tracing::debug!(reason, "recording event: {e}");
            }
        });
    }

    async fn write(
        &self,
        regarding: &ObjectReference,
        warning: bool,
        reason: &str,
        message: &str,
    ) -> Result<(), kube::Error> {
        let ns = regarding.namespace.clone().unwrap_or_default();
        let api: Api<Event> = Api::namespaced(self.client.clone(), &ns);
        let now = Time(Timestamp::now());
        let key = (
            ns.clone(),
            regarding.uid.clone().unwrap_or_default(),
            warning,
            reason.to_string(),
            message.to_string(),
        );
        let repeat = {
            let mut seen = self.seen.lock().expect("events lock");
            seen.retain(|_, s| s.at.elapsed() < REPEAT_WINDOW);
            seen.get_mut(&key).map(|s| {
                s.count += 1;
                s.at = Instant::now();
                (s.name.clone(), s.count)
            })
        };
        if let Some((name, count)) = repeat {
            let patch = json!({"count": count, "lastTimestamp": now});
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            return Ok(());
        }
        let name = format!(
            "{}.{:x}",
            regarding.name.as_deref().unwrap_or(COMPONENT),
            Timestamp::now().as_nanosecond()
        );
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(ns),
                ..Default::default()
            },
            involved_object: regarding.clone(),
            reason: Some(reason.into()),
            message: Some(message.into()),
            type_: Some(if warning { "Warning" } else { "Normal" }.into()),
            source: Some(EventSource {
                component: Some(COMPONENT.into()),
                host: None,
            }),
            reporting_component: Some(COMPONENT.into()),
            reporting_instance: Some(String::new()),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now.clone()),
            count: Some(1),
            ..Default::default()
        };
        api.create(&PostParams::default(), &event).await?;
        self.seen.lock().expect("events lock").insert(
            key,
            Seen {
                name,
                count: 1,
                at: Instant::now(),
            },
        );
        Ok(())
    }
}
