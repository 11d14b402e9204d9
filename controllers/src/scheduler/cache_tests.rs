use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::json;

use super::*;

fn node(name: &str, zone: Option<&str>) -> Arc<Node> {
    let mut labels = json!({});
    if let Some(z) = zone {
        labels = json!({"topology.kubernetes.io/zone": z, "topology.kubernetes.io/region": "r"});
    }
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels},
            "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}}
        }))
        .unwrap(),
    )
}

fn pod(name: &str, node: Option<&str>, cpu: &str) -> Arc<Pod> {
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": name},
            "spec": {"nodeName": node, "containers": [
                {"name": "c", "resources": {"requests": {"cpu": cpu}}}
            ]}
        }))
        .unwrap(),
    )
}

fn requested(c: &Cache, n: &str) -> i64 {
    c.node(n).map(|i| i.requested.milli_cpu).unwrap_or(-1)
}

#[test]
fn node_tree_interleaves_zones_in_insertion_order() {
    type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, Vec<&'a str>, Vec<&'a str>);
    let cases: [Case; 4] = [
        (
            "one zone keeps insertion order",
            vec![("a", "z1"), ("b", "z1")],
            vec![],
            vec!["a", "b"],
        ),
        (
            "two zones alternate",
            vec![
                ("a", "z1"),
                ("b", "z1"),
                ("c", "z2"),
                ("d", "z1"),
                ("e", "z2"),
            ],
            vec![],
            vec!["a", "c", "b", "e", "d"],
        ),
        (
            "removing a zone's last node drops the zone",
            vec![("a", "z1"), ("b", "z2"), ("c", "z1")],
            vec!["b"],
            vec!["a", "c"],
        ),
        (
            "a node re-added to another zone moves",
            vec![("a", "z1"), ("b", "z2"), ("a", "z2")],
            vec![],
            vec!["b", "a"],
        ),
    ];
    for (name, adds, removes, want) in cases {
        let mut t = NodeTree::default();
        for (n, z) in adds {
            t.add(n, z.to_string());
        }
        for n in removes {
            t.remove(n);
        }
        assert_eq!(t.list(), want, "{name}");
    }
}

#[test]
fn assume_confirm_forget_and_expire() {
    let t0 = Instant::now();
    type Step = Box<dyn Fn(&mut Cache)>;
    // (name, steps, node n1 requested millicores, n2's, pod "p" assumed)
    type Case<'a> = (&'a str, Vec<Step>, i64, i64, bool);
    let cases: Vec<Case> = vec![
        (
            "assume counts the pod on its node",
            vec![Box::new(|c| c.assume(pod("p", None, "1"), "n1").unwrap())],
            1000,
            0,
            true,
        ),
        (
            "forget undoes assume",
            vec![
                Box::new(|c| c.assume(pod("p", None, "1"), "n1").unwrap()),
                Box::new(|c| c.forget("p").unwrap()),
            ],
            0,
            0,
            false,
        ),
        (
            "the watch's bound pod confirms the assumed one",
            vec![
                Box::new(|c| c.assume(pod("p", None, "1"), "n1").unwrap()),
                Box::new(|c| c.add_pod(pod("p", Some("n1"), "1"))),
            ],
            1000,
            0,
            false,
        ),
        (
            "bound elsewhere than assumed: the watch wins",
            vec![
                Box::new(|c| c.assume(pod("p", None, "1"), "n1").unwrap()),
                Box::new(|c| c.add_pod(pod("p", Some("n2"), "1"))),
            ],
            0,
            1000,
            false,
        ),
        (
            "an assumed pod expires after the TTL once binding finished",
            vec![
                Box::new(|c| c.assume(pod("p", None, "1"), "n1").unwrap()),
                Box::new(move |c| c.finish_binding("p", t0)),
                Box::new(move |c| {
                    assert_eq!(c.cleanup_expired(t0 + Duration::from_secs(31)), ["p"]);
                }),
            ],
            0,
            0,
            false,
        ),
        (
            "an assumed pod whose binding has not finished never expires",
            vec![
                Box::new(|c| c.assume(pod("p", None, "1"), "n1").unwrap()),
                Box::new(move |c| {
                    assert!(c.cleanup_expired(t0 + Duration::from_secs(3600)).is_empty());
                }),
            ],
            1000,
            0,
            true,
        ),
        (
            "a deleted pod leaves its node",
            vec![
                Box::new(|c| c.add_pod(pod("p", Some("n2"), "500m"))),
                Box::new(|c| c.remove_pod("p")),
            ],
            0,
            0,
            false,
        ),
    ];
    for (name, steps, n1, n2, assumed) in cases {
        let mut c = Cache::new(Some(Duration::from_secs(30)));
        c.add_node(node("n1", None));
        c.add_node(node("n2", None));
        for s in &steps {
            s(&mut c);
        }
        assert_eq!(
            (requested(&c, "n1"), requested(&c, "n2"), c.is_assumed("p")),
            (n1, n2, assumed),
            "{name}"
        );
    }
    let mut c = Cache::new(None);
    c.add_node(node("n1", None));
    c.assume(pod("p", None, "1"), "n1").unwrap();
    assert_eq!(
        c.assume(pod("p", None, "1"), "n1"),
        Err(CacheError::AlreadyCached("ns/p".into())),
        "assuming twice is refused"
    );
}

#[test]
fn snapshot_is_incremental_and_shares_unchanged_nodes() {
    let mut c = Cache::new(None);
    for (n, z) in [("a", "z1"), ("b", "z2"), ("c", "z1")] {
        c.add_node(node(n, Some(z)));
    }
    let mut snap = Snapshot::default();
    c.update_snapshot(&mut snap);
    let order: Vec<&str> = snap.nodes.iter().map(|n| n.name()).collect();
    assert_eq!(order, ["a", "b", "c"], "zone-interleaved");
    let before: Vec<Arc<NodeInfo>> = snap.nodes.clone();
    c.add_pod(pod("p", Some("b"), "1"));
    c.update_snapshot(&mut snap);
    assert!(
        Arc::ptr_eq(&before[0], &snap.nodes[0]),
        "a unchanged: shared"
    );
    assert!(
        Arc::ptr_eq(&before[2], &snap.nodes[2]),
        "c unchanged: shared"
    );
    assert!(!Arc::ptr_eq(&before[1], &snap.nodes[1]), "b replaced");
    assert_eq!(snap.nodes[1].requested.milli_cpu, 1000);
    assert_eq!(
        before[1].requested.milli_cpu, 0,
        "the old snapshot is not mutated"
    );
    c.remove_node("a");
    c.update_snapshot(&mut snap);
    let order: Vec<&str> = snap.nodes.iter().map(|n| n.name()).collect();
    // Zones keep their first-seen order: z1 (now only c) still comes before z2.
    assert_eq!(order, ["c", "b"]);
    assert_eq!(snap.index.get("b"), Some(&1));
    // A pod on a node the cache has not seen yet is kept, the node is not listed until it comes.
    c.add_pod(pod("q", Some("d"), "1"));
    c.update_snapshot(&mut snap);
    assert_eq!(snap.nodes.len(), 2);
    c.add_node(node("d", Some("z2")));
    c.update_snapshot(&mut snap);
    assert_eq!(snap.get("d").unwrap().requested.milli_cpu, 1000);
}
