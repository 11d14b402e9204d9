//! The machinery every workload controller runs on, as kube-controller-manager's controllers do:
//!
//! - [`informer`]: one shared watch per resource kind for all controllers, feeding an indexed
//!   cache ([`crate::runtime::cache::Indexed`]) and the controllers' event handlers;
//! - [`queue`]: a rate-limited work queue (client-go's semantics: deduplicated keys, an item being
//!   processed is re-queued only after `done`, per-item exponential backoff with an overall token
//!   bucket, `forget` on success), with workqueue metrics under kube-controller-manager's names
//!   ([`metrics`]);
//! - [`workers`]: N workers per controller draining a queue;
//! - [`expectations`]: the creations and deletions a controller is still waiting to observe, and
//!   which of the read-your-writes mechanisms (expectations, [`written`]) fits which write;
//! - [`written`]: the objects a controller wrote by name that its cache has not shown yet;
//! - [`unseen_creations`]: the Pods a controller created (with `generateName`) that its Pod
//!   informer has not shown yet, read back so a sync need not wait for the watch;
//! - [`pod_control`]: creating a controller's Pods from its template and deleting them, with
//!   their Events and expectations (client-go's `RealPodControl`);
//! - [`apierrors`]: what an API error means (not found, already exists, conflict, namespace
//!   being deleted, the server's message);
//! - [`batch`]: slow-start batches of API calls;
//! - [`claim`]: the controller-ref manager (adopt matching orphans, release owned objects that no
//!   longer match);
//! - [`events`]: core/v1 Events, correlated as client-go's recorder does;
//! - [`cached_pod`]: what the caches keep of a Pod (the fields controllers read);
//! - [`pods`]: which Pods count (active) and which go first on scale-down;
//! - [`cache`]: the indexed in-memory store behind every informer;
//! - [`history`]: ControllerRevision history (StatefulSet and DaemonSet);
//! - [`leader`]: Lease-based leader election;
//! - [`ratelimit`]: the client-side request limit (`--kube-api-qps` / `--kube-api-burst`);
//! - [`allocator`]: the C allocator's arenas, periodic trims and heap metrics;
//! - [`process`]: what the binaries share around their work (start, client, identity, `/metrics`,
//!   running until a signal);
//! - `testing` (test builds only): what the controllers' handler tests share.
//!
//! Nothing here knows a particular controller, and nothing here imports one (the layers test,
//! `controllers/tests/layers.rs`, keeps it so); controllers never talk to each other through it
//! except by watching the objects they write.

pub mod allocator;
pub mod apierrors;
pub mod batch;
pub mod cache;
pub mod cached_pod;
pub mod claim;
pub mod events;
pub mod expectations;
pub mod history;
pub mod informer;
pub mod leader;
pub mod metrics;
pub mod pod_control;
pub mod pods;
pub mod process;
pub mod queue;
pub mod ratelimit;
pub mod unseen_creations;
pub mod workers;
pub mod written;

#[cfg(test)]
pub mod testing;
