//! ImageLocality (Score): prefers nodes that already have the Pod's container images, weighted by
//! image size and by how widely the image is spread over the cluster (an image on every node
//! says little), scaled between a 23 MiB floor and 1000 MiB per container. Upstream v1.34's
//! `imagelocality` plugin; reads the node's `status.images` as the snapshot summarizes them.
//!
//! Upstream has no PreScore: its Score reads the number of nodes from the snapshot lister. Our
//! Score gets only the node, so this plugin also implements PreScore, which records the snapshot's
//! node count and the Pod's normalized image names once per Pod; the runtime must run it as a
//! PreScore plugin too (Score without that state is an error).

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use crate::scheduler::framework::{
    CycleState, NodeInfo, Plugin, PreScorePlugin, ScorePlugin, Snapshot, Status, MAX_NODE_SCORE,
};

pub const NAME: &str = "ImageLocality";

const PRE_SCORE_STATE_KEY: &str = "PreScoreImageLocality";

const MB: i64 = 1024 * 1024;
/// Below this sum the score is 0 (smaller images download fast anyway).
const MIN_THRESHOLD: i64 = 23 * MB;
/// The sum that scores 100, per container.
const MAX_CONTAINER_THRESHOLD: i64 = 1000 * MB;

/// The plugin; it has no arguments.
#[derive(Debug, Default)]
pub struct ImageLocality;

impl ImageLocality {
    /// The plugin has no arguments; any given are ignored, as upstream ignores them.
    pub fn new() -> Self {
        ImageLocality
    }
}

/// The Pod's image names (init containers then containers, `:latest` added where no tag is
/// given) and the number of nodes in the cycle's snapshot.
#[derive(Debug, Clone)]
struct PreScoreState {
    images: Arc<[String]>,
    total_nodes: usize,
}

/// `normalizedImageName`: an image without a tag (no ':' after the last '/') gets `:latest`.
pub fn normalized_image_name(name: &str) -> String {
    let colon = name.rfind(':').map_or(-1, |i| i as i64);
    let slash = name.rfind('/').map_or(-1, |i| i as i64);
    if colon <= slash {
        format!("{name}:latest")
    } else {
        name.to_string()
    }
}

fn pod_images(pod: &Pod) -> Vec<String> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    spec.init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .map(|c| normalized_image_name(c.image.as_deref().unwrap_or_default()))
        .collect()
}

/// `calculatePriority`: the summed image score clamped to [23 MiB, 1000 MiB x containers] and
/// scaled to 0..=100.
fn calculate_priority(sum: i64, containers: usize) -> i64 {
    let max_threshold = MAX_CONTAINER_THRESHOLD * containers as i64;
    let sum = if sum < MIN_THRESHOLD {
        MIN_THRESHOLD
    } else {
        sum.min(max_threshold)
    };
    if max_threshold == MIN_THRESHOLD {
        return 0;
    }
    MAX_NODE_SCORE * (sum - MIN_THRESHOLD) / (max_threshold - MIN_THRESHOLD)
}

impl Plugin for ImageLocality {
    fn name(&self) -> &'static str {
        NAME
    }
}

impl PreScorePlugin for ImageLocality {
    fn pre_score(
        &self,
        state: &mut CycleState,
        pod: &Pod,
        _nodes: &[Arc<NodeInfo>],
        snapshot: &Snapshot,
    ) -> Status {
        state.write(
            PRE_SCORE_STATE_KEY,
            PreScoreState {
                images: pod_images(pod).into(),
                total_nodes: snapshot.nodes.len(),
            },
        );
        Status::success()
    }
}

impl ScorePlugin for ImageLocality {
    fn score(&self, state: &CycleState, _pod: &Pod, node: &NodeInfo) -> Result<i64, Status> {
        let Some(s) = state.read::<PreScoreState>(PRE_SCORE_STATE_KEY) else {
            return Err(Status::error(format!(
                "reading {PRE_SCORE_STATE_KEY:?} from cycleState: not found (ImageLocality's PreScore must run)"
            )));
        };
        let total = s.total_nodes.max(1) as f64;
        let sum: i64 = s
            .images
            .iter()
            .filter_map(|name| node.image_states.get(name))
            // `scaledImageScore`: size times the share of nodes that have it.
            .map(|st| (st.size as f64 * (st.num_nodes as f64 / total)) as i64)
            .sum();
        Ok(calculate_priority(sum, s.images.len()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::plugins::helper::test_util::*;
    use serde_json::{json, Value};

    /// A node whose status lists these images: (names, size in MiB).
    fn image_node(name: &str, images: &[(&[&str], i64)]) -> NodeInfo {
        let images: Vec<Value> = images
            .iter()
            .map(|(names, mb)| json!({"names": names, "sizeBytes": mb * MB}))
            .collect();
        node_info(node(name, json!({"status": {"images": images}})), vec![])
    }

    fn images_pod(containers: &[&str], init: &[&str]) -> Pod {
        let c = |prefix: &str, images: &[&str]| -> Value {
            images
                .iter()
                .enumerate()
                .map(|(i, img)| json!({"name": format!("{prefix}{i}"), "image": img}))
                .collect()
        };
        let mut p = pod(json!({}));
        let spec = p.spec.as_mut().unwrap();
        spec.containers = serde_json::from_value(c("c", containers)).unwrap();
        if !init.is_empty() {
            spec.init_containers = Some(serde_json::from_value(c("i", init)).unwrap());
        }
        p
    }

    // Upstream TestImageLocalityPriority.
    #[test]
    fn score_per_node() {
        let n403002000 = |n: &str| {
            image_node(
                n,
                &[
                    (&["gcr.io/40:latest", "gcr.io/40:v1", "gcr.io/40:v1"], 40),
                    (&["gcr.io/300:latest", "gcr.io/300:v1"], 300),
                    (&["gcr.io/2000:latest"], 2000),
                ],
            )
        };
        let n25010 = |n: &str| {
            image_node(
                n,
                &[
                    (&["gcr.io/250:latest"], 250),
                    (&["gcr.io/10:latest", "gcr.io/10:v1"], 10),
                ],
            )
        };
        let n60040900 = |n: &str| {
            image_node(
                n,
                &[
                    (&["gcr.io/600:latest"], 600),
                    (&["gcr.io/40:latest"], 40),
                    (&["gcr.io/900:latest"], 900),
                ],
            )
        };
        let n300600900 = |n: &str| {
            image_node(
                n,
                &[
                    (&["gcr.io/300:latest"], 300),
                    (&["gcr.io/600:latest"], 600),
                    (&["gcr.io/900:latest"], 900),
                ],
            )
        };
        let n400030 = |n: &str| {
            image_node(
                n,
                &[(&["gcr.io/4000:latest"], 4000), (&["gcr.io/30:latest"], 30)],
            )
        };
        let n203040 = |n: &str| {
            image_node(
                n,
                &[
                    (&["gcr.io/20:latest"], 20),
                    (&["gcr.io/30:latest"], 30),
                    (&["gcr.io/40:latest"], 40),
                ],
            )
        };
        let empty = |n: &str| image_node(n, &[]);
        let cases = vec![
            (
                "two images spread on two nodes, prefer the larger image one",
                images_pod(&["gcr.io/40", "gcr.io/250"], &[]),
                vec![n403002000("node1"), n25010("node2")],
                vec![0, 5],
            ),
            (
                "two images on one node, prefer this node",
                images_pod(&["gcr.io/40", "gcr.io/300"], &[]),
                vec![n403002000("node1"), n25010("node2")],
                vec![7, 0],
            ),
            (
                "if exceed limit, use limit",
                images_pod(&["gcr.io/10", "gcr.io/4000"], &[]),
                vec![n400030("node1"), n25010("node2")],
                vec![100, 0],
            ),
            (
                "if exceed limit, use limit (with a node without images)",
                images_pod(&["gcr.io/10", "gcr.io/4000"], &[]),
                vec![n400030("node1"), n25010("node2"), empty("node3")],
                vec![66, 0, 0],
            ),
            (
                "pod with multiple large images, node2 is preferred",
                images_pod(&["gcr.io/300", "gcr.io/600", "gcr.io/900"], &[]),
                vec![n60040900("node1"), n300600900("node2"), empty("node3")],
                vec![32, 36, 0],
            ),
            (
                "pod with multiple small images",
                images_pod(&["gcr.io/30", "gcr.io/40"], &[]),
                vec![n203040("node1"), n400030("node2")],
                vec![1, 0],
            ),
            (
                "init containers count",
                images_pod(&["gcr.io/30"], &["gcr.io/300"]),
                vec![n403002000("node1"), n203040("node2")],
                vec![6, 0],
            ),
        ];
        for (name, p, nodes, want) in cases {
            let got = run_score(Some(&ImageLocality), &ImageLocality, &p, &snapshot(nodes));
            assert_eq!(got, Some(want), "{name}");
        }
    }

    #[test]
    fn image_names_get_latest_when_untagged() {
        for (name, want) in [
            ("nginx", "nginx:latest"),
            ("nginx:1.2", "nginx:1.2"),
            ("gcr.io/40", "gcr.io/40:latest"),
            ("localhost:5000/app", "localhost:5000/app:latest"),
            ("localhost:5000/app:v1", "localhost:5000/app:v1"),
            ("", ":latest"),
        ] {
            assert_eq!(normalized_image_name(name), want, "{name}");
        }
    }

    #[test]
    fn score_without_prescore_is_an_error() {
        let n = image_node("n", &[]);
        assert!(ImageLocality
            .score(&CycleState::new(), &images_pod(&["a"], &[]), &n)
            .is_err());
    }
}
