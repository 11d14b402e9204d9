//! The TTL controller (kube-controller-manager v1.34's `ttl-controller`, `pkg/controller/ttl`):
//! the `node.alpha.kubernetes.io/ttl` annotation on every Node, the seconds a kubelet may cache
//! Secrets and ConfigMaps before fetching them again, from the cluster's size.
//!
//! Owns: that annotation (a strategic merge patch of it alone, written when missing, unparsable
//! or different). The size is counted from the Node informer's adds and deletes, and the TTL
//! moves one step of upstream's table at a time with its hysteresis (the ranges overlap, so a
//! cluster at the edge of one does not flap): 0 s up to 100 Nodes, 15 s past 100 until it falls
//! under 90, 30 s past 500 until under 450, 60 s past 1000 until under 900, 300 s past 2000
//! until under 1800. Every Node update queues the Node (kubelets report status every few
//! seconds, so a size change reaches every Node soon), as upstream. Five workers, the work queue
//! `ttlcontroller`.

use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

use crate::error::{Error, Result};
use crate::runtime::cache::Indexed;
use crate::runtime::informer::{EventHandlers, Informers};
use crate::runtime::queue::WorkQueue;
use crate::runtime::workers::{run_controller, SyncKey};

/// The controller's name in logs, as upstream.
pub const NAME: &str = "ttl-controller";

/// The work queue's name, as upstream.
pub const QUEUE_NAME: &str = "ttlcontroller";

/// The annotation (`v1.ObjectTTLAnnotationKey`).
pub const ANNOTATION: &str = "node.alpha.kubernetes.io/ttl";

/// Workers: kube-controller-manager starts five (no flag sets it).
pub const WORKERS: usize = 5;

/// One step of the table: the TTL holds while the size stays within `[min, max]`.
struct Boundary {
    min: usize,
    max: usize,
    ttl_seconds: i64,
}

/// Upstream's `ttlBoundaries`.
const BOUNDARIES: [Boundary; 5] = [
    Boundary {
        min: 0,
        max: 100,
        ttl_seconds: 0,
    },
    Boundary {
        min: 90,
        max: 500,
        ttl_seconds: 15,
    },
    Boundary {
        min: 450,
        max: 1000,
        ttl_seconds: 30,
    },
    Boundary {
        min: 900,
        max: 2000,
        ttl_seconds: 60,
    },
    Boundary {
        min: 1800,
        max: i32::MAX as usize,
        ttl_seconds: 300,
    },
];

/// The cluster's size and the step of the table it is on.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Sizing {
    pub nodes: usize,
    step: usize,
}

impl Sizing {
    /// A Node was added: past the step's maximum, one step up.
    pub fn added(&mut self) {
        self.nodes += 1;
        if self.nodes > BOUNDARIES[self.step].max && self.step + 1 < BOUNDARIES.len() {
            self.step += 1;
        }
    }

    /// A Node was deleted: under the step's minimum, one step down.
    pub fn deleted(&mut self) {
        self.nodes = self.nodes.saturating_sub(1);
        if self.nodes < BOUNDARIES[self.step].min && self.step > 0 {
            self.step -= 1;
        }
    }

    /// The TTL every Node should carry.
    pub fn desired_ttl_seconds(&self) -> i64 {
        BOUNDARIES[self.step].ttl_seconds
    }
}

/// The annotation value to write on `node`, or `None` when it carries `desired` already (a
/// value that is not an integer counts as missing, as upstream's `strconv.Atoi`).
pub fn plan(node: &Node, desired: i64) -> Option<String> {
    let current = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION))
        .and_then(|v| atoi(v));
    (current != Some(desired)).then(|| desired.to_string())
}

/// Go's `strconv.Atoi`: an optional sign and decimal digits, nothing else.
fn atoi(s: &str) -> Option<i64> {
    let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// The running controller.
pub struct Controller {
    client: Client,
    nodes: Arc<Indexed<Node>>,
    sizing: Mutex<Sizing>,
    queue: Arc<WorkQueue<String>>,
}

impl Controller {
    /// Registers the controller's handlers on the Node informer.
    pub fn new(client: Client, informers: &Informers) -> Arc<Controller> {
        let informer = informers.get::<Node>();
        let this = Arc::new(Controller {
            client,
            nodes: informer.cache(),
            sizing: Mutex::new(Sizing::default()),
            queue: WorkQueue::new(QUEUE_NAME),
        });
        informer.on_events_of(
            &this,
            EventHandlers {
                added: |c, n| {
                    c.sizing.lock().expect("sizing lock").added();
                    c.enqueue(n);
                },
                updated: |c, _, n| c.enqueue(n),
                // The Node is gone: nothing to write.
                deleted: |c, _| c.sizing.lock().expect("sizing lock").deleted(),
            },
        );
        this
    }

    fn enqueue(&self, node: &Node) {
        if let Some(name) = node.metadata.name.clone() {
            self.queue.add(name);
        }
    }

    /// The size counted so far and the TTL it gives.
    pub fn sizing(&self) -> Sizing {
        *self.sizing.lock().expect("sizing lock")
    }

    /// Waits for the cache, then runs the workers.
    pub async fn run(self: Arc<Self>) {
        run_controller(&self, NAME, &[&*self.nodes], &self.queue, WORKERS).await;
    }

    /// Stops the workers.
    pub fn shut_down(&self) {
        self.queue.shut_down();
    }
}

impl SyncKey for Controller {
    /// `updateNodeIfNeeded`.
    async fn sync(&self, name: &str) -> Result<()> {
        let Some(node) = self.nodes.get("", name) else {
            return Ok(());
        };
        let desired = self.sizing().desired_ttl_seconds();
        let Some(value) = plan(&node, desired) else {
            return Ok(());
        };
        let api: Api<Node> = Api::all(self.client.clone());
        let patch = json!({"metadata": {"annotations": {ANNOTATION: value}}});
        api.patch(name, &PatchParams::default(), &Patch::Strategic(patch))
            .await
            .map(|_| tracing::debug!(node = name, ttl = desired, "changed ttl annotation"))
            .map_err(|e| Error::kube("annotating", format!("Node {name}"), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Upstream's `TestPatchNode` / `TestUpdateNodeIfNeeded` cases: what the annotation becomes.
    #[test]
    fn the_annotation_is_written_when_missing_wrong_or_unparsable() {
        let node = |ann: Option<&str>| -> Node {
            let mut v = json!({"metadata": {"name": "n"}});
            if let Some(a) = ann {
                v["metadata"]["annotations"] = json!({ANNOTATION: a});
            }
            serde_json::from_value(v).unwrap()
        };
        assert_eq!(plan(&node(None), 0), Some("0".into()));
        assert_eq!(plan(&node(Some("0")), 0), None);
        assert_eq!(plan(&node(Some("15")), 15), None);
        assert_eq!(plan(&node(Some("0")), 15), Some("15".into()));
        assert_eq!(plan(&node(Some("300")), 60), Some("60".into()));
        assert_eq!(plan(&node(Some("abc")), 0), Some("0".into()));
        assert_eq!(
            plan(&node(Some(" 0")), 0),
            Some("0".into()),
            "Atoi: no spaces"
        );
        assert_eq!(plan(&node(Some("+15")), 15), None, "Atoi takes a sign");
    }

    /// Upstream's `TestDesiredTTL` table: the TTL after adds and deletes from a starting size
    /// and step.
    #[test]
    fn upstream_desired_ttl_table() {
        let cases: [(&str, bool, usize, usize, i64); 12] = [
            // (what, add (else delete), nodes before, step before, TTL after)
            ("add to empty", true, 0, 0, 0),
            ("add to 99", true, 99, 0, 0),
            ("add to 100: step up", true, 100, 0, 15),
            ("add within step 1", true, 101, 1, 15),
            ("add to 500: step up", true, 500, 1, 30),
            ("add to 1000: step up", true, 1000, 2, 60),
            ("add to 2000: step up", true, 2000, 3, 300),
            ("add past the last", true, 3000, 4, 300),
            ("delete to 90: stays", false, 91, 1, 15),
            ("delete to 89: step down", false, 90, 1, 0),
            ("delete to 449: step down", false, 450, 2, 15),
            ("delete to 1799: step down", false, 1800, 4, 60),
        ];
        for (what, add, nodes, step, want) in cases {
            let mut s = Sizing { nodes, step };
            if add {
                s.added();
            } else {
                s.deleted();
            }
            assert_eq!(s.desired_ttl_seconds(), want, "{what}");
        }
    }

    #[test]
    fn the_ranges_overlap_so_the_edge_does_not_flap() {
        let mut s = Sizing::default();
        for _ in 0..101 {
            s.added();
        }
        assert_eq!(s.desired_ttl_seconds(), 15);
        // Back to 95, 100, 95: 15 s throughout (the step holds down to 90).
        for _ in 0..6 {
            s.deleted();
        }
        assert_eq!((s.nodes, s.desired_ttl_seconds()), (95, 15));
        for _ in 0..5 {
            s.added();
        }
        assert_eq!(s.desired_ttl_seconds(), 15);
        for _ in 0..11 {
            s.deleted();
        }
        assert_eq!((s.nodes, s.desired_ttl_seconds()), (89, 0));
        // A climb to 600 at once moves one step per add: 30 s.
        for _ in 0..511 {
            s.added();
        }
        assert_eq!((s.nodes, s.desired_ttl_seconds()), (600, 30));
    }
}
