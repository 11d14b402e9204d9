//! Named cases for the graph builder: each case feeds a sequence of changes and checks what the
//! last one asks for, and the graph it leaves.

use super::*;

fn api_version_of(kind: &str) -> &'static str {
    match kind {
        "ReplicaSet" | "Deployment" => "apps/v1",
        _ => "v1",
    }
}

fn oref(kind: &str, name: &str, uid: &str, block: Option<bool>) -> OwnerReference {
    OwnerReference {
        api_version: api_version_of(kind).into(),
        kind: kind.into(),
        name: name.into(),
        uid: uid.into(),
        controller: Some(true),
        block_owner_deletion: block,
    }
}

fn owner(kind: &str, name: &str, uid: &str) -> OwnerReference {
    oref(kind, name, uid, Some(true))
}

fn id(kind: &str, ns: &str, name: &str, uid: &str) -> ObjectRef {
    ObjectRef {
        api_version: api_version_of(kind).into(),
        kind: kind.into(),
        namespace: ns.into(),
        name: name.into(),
        uid: uid.into(),
    }
}

/// One graph event as a monitor reports it (every field of the event is a parameter).
#[allow(clippy::too_many_arguments)]
fn ev(
    event_type: EventType,
    kind: &str,
    ns: &str,
    name: &str,
    uid: &str,
    owners: Vec<OwnerReference>,
    flags: Flags,
    old: Option<Flags>,
) -> GraphEvent {
    GraphEvent {
        event_type,
        virtual_: false,
        api_version: api_version_of(kind).into(),
        kind: kind.into(),
        object: Meta {
            uid: uid.into(),
            name: name.into(),
            namespace: ns.into(),
            owners,
            flags,
        },
        old,
    }
}

fn add(kind: &str, ns: &str, name: &str, uid: &str, owners: Vec<OwnerReference>) -> GraphEvent {
    ev(
        EventType::Add,
        kind,
        ns,
        name,
        uid,
        owners,
        Flags::default(),
        None,
    )
}

fn update(
    kind: &str,
    ns: &str,
    name: &str,
    uid: &str,
    owners: Vec<OwnerReference>,
    old: Flags,
    new: Flags,
) -> GraphEvent {
    ev(
        EventType::Update,
        kind,
        ns,
        name,
        uid,
        owners,
        new,
        Some(old),
    )
}

fn del(kind: &str, ns: &str, name: &str, uid: &str) -> GraphEvent {
    ev(
        EventType::Delete,
        kind,
        ns,
        name,
        uid,
        vec![],
        Flags::default(),
        None,
    )
}

fn deleting(orphan: bool, fg: bool) -> Flags {
    Flags {
        being_deleted: true,
        orphan_finalizer: orphan,
        delete_dependents_finalizer: fg,
    }
}

const NONE: Flags = Flags {
    being_deleted: false,
    orphan_finalizer: false,
    delete_dependents_finalizer: false,
};

/// Feeds every event, returns the last one's effects.
fn run(g: &mut Graph, events: &[GraphEvent]) -> Vec<Effect> {
    let mut last = Vec::new();
    for e in events {
        last = g.process(e);
    }
    last
}

use Effect::*;

#[test]
fn graph_routing() {
    let rs = || add("ReplicaSet", "a", "rs", "r", vec![]);
    let pod = || add("Pod", "a", "p", "p", vec![owner("ReplicaSet", "rs", "r")]);
    let cases: Vec<(&str, Vec<GraphEvent>, Vec<Effect>)> = vec![
        (
            "GC-2 a dependent seen before its owner: a virtual owner, queued to verify it",
            vec![pod()],
            vec![AttemptToDelete(id("ReplicaSet", "a", "rs", "r"))],
        ),
        (
            "GC-2 the owner observed after its dependent: the virtual node becomes real, nothing queued",
            vec![pod(), rs()],
            vec![],
        ),
        (
            "GC-2 a dependent of an observed owner: linked, nothing queued",
            vec![rs(), pod()],
            vec![],
        ),
        (
            "GC-1 background: owner gone, its coordinates absent and its dependents queued",
            vec![rs(), pod(), del("ReplicaSet", "a", "rs", "r")],
            vec![
                AbsentOwner(id("ReplicaSet", "a", "rs", "r")),
                AttemptToDelete(id("Pod", "a", "p", "p")),
            ],
        ),
        (
            "GC-1 an owner without dependents goes without a trace",
            vec![rs(), del("ReplicaSet", "a", "rs", "r")],
            vec![],
        ),
        (
            "GC-4 foreground: deletion starting with foregroundDeletion queues the dependents, then the owner",
            vec![
                rs(),
                pod(),
                update("ReplicaSet", "a", "rs", "r", vec![], NONE, deleting(false, true)),
            ],
            vec![
                AttemptToDelete(id("Pod", "a", "p", "p")),
                AttemptToDelete(id("ReplicaSet", "a", "rs", "r")),
            ],
        ),
        (
            "GC-6 orphan: deletion starting with the orphan finalizer queues the owner for orphaning",
            vec![
                rs(),
                pod(),
                update("ReplicaSet", "a", "rs", "r", vec![], NONE, deleting(true, false)),
            ],
            vec![AttemptToOrphan(id("ReplicaSet", "a", "rs", "r"))],
        ),
        (
            "GC-6 orphan wins over foreground when both finalizers are present",
            vec![
                rs(),
                update("ReplicaSet", "a", "rs", "r", vec![], NONE, deleting(true, true)),
            ],
            vec![AttemptToOrphan(id("ReplicaSet", "a", "rs", "r"))],
        ),
        (
            "GC-6 an update repeating the same deletion state queues nothing",
            vec![
                rs(),
                update("ReplicaSet", "a", "rs", "r", vec![], NONE, deleting(true, false)),
                update("ReplicaSet", "a", "rs", "r", vec![], deleting(true, false), deleting(true, false)),
            ],
            vec![],
        ),
        (
            "GC-5 a creation folded with its deletion (one event) still routes the finalizer",
            vec![ev(EventType::Add, "ReplicaSet", "a", "rs", "r", vec![], deleting(true, false), None)],
            vec![AttemptToOrphan(id("ReplicaSet", "a", "rs", "r"))],
        ),
        (
            "GC-4 a dependent dropping its blocking reference unblocks the owner",
            vec![rs(), pod(), update("Pod", "a", "p", "p", vec![], NONE, NONE)],
            vec![AttemptToDelete(id("ReplicaSet", "a", "rs", "r"))],
        ),
        (
            "GC-4 a dependent turning blockOwnerDeletion off unblocks the owner",
            vec![
                rs(),
                pod(),
                update("Pod", "a", "p", "p", vec![oref("ReplicaSet", "rs", "r", Some(false))], NONE, NONE),
            ],
            vec![AttemptToDelete(id("ReplicaSet", "a", "rs", "r"))],
        ),
        (
            "GC-4 dropping a non-blocking reference unblocks nothing",
            vec![
                rs(),
                add("Pod", "a", "p", "p", vec![oref("ReplicaSet", "rs", "r", None)]),
                update("Pod", "a", "p", "p", vec![], NONE, NONE),
            ],
            vec![],
        ),
        (
            "GC-4 a dependent gone while its owner deletes dependents re-queues the owner",
            vec![
                rs(),
                pod(),
                update("ReplicaSet", "a", "rs", "r", vec![], NONE, deleting(false, true)),
                del("Pod", "a", "p", "p"),
            ],
            vec![AttemptToDelete(id("ReplicaSet", "a", "rs", "r"))],
        ),
        (
            "GC-7 a dependent in another namespace than its observed owner: warning, and verified",
            vec![rs(), add("Pod", "b", "q", "q", vec![owner("ReplicaSet", "rs", "r")])],
            vec![
                InvalidNamespaceOwnerRef {
                    dependent: id("Pod", "b", "q", "q"),
                    owner: id("ReplicaSet", "b", "rs", "r"),
                },
                AttemptToDelete(id("Pod", "b", "q", "q")),
            ],
        ),
        (
            "GC-7 bad child first, then good parent: warning, and the child verified",
            vec![add("Pod", "b", "q", "q", vec![owner("ReplicaSet", "rs", "r")]), rs()],
            vec![
                InvalidNamespaceOwnerRef {
                    dependent: id("Pod", "b", "q", "q"),
                    owner: id("ReplicaSet", "b", "rs", "r"),
                },
                AttemptToDelete(id("Pod", "b", "q", "q")),
            ],
        ),
        (
            "GC-7 a cluster-scoped owner may be referenced from any namespace",
            vec![
                add("Node", "", "n1", "n", vec![]),
                add("Pod", "b", "q", "q", vec![owner("Node", "n1", "n")]),
            ],
            vec![],
        ),
        (
            "GC-7 a reference naming an observed owner's uid with other coordinates: the dependent is verified",
            vec![rs(), add("Pod", "a", "q", "q", vec![owner("ReplicaSet", "other-name", "r")])],
            vec![AttemptToDelete(id("Pod", "a", "q", "q"))],
        ),
        (
            "GC-7 a cluster-scoped child's virtual owner referenced from a namespace: the namespaced dependent is verified",
            vec![
                add("Node", "", "n1", "n1", vec![owner("ConfigMap", "cm", "c")]),
                add("Pod", "a", "q", "q", vec![owner("ConfigMap", "cm", "c")]),
            ],
            vec![AttemptToDelete(id("Pod", "a", "q", "q"))],
        ),
        (
            "GC-3 a virtual owner verified absent: removed, coordinates absent, dependents queued",
            vec![pod(), GraphEvent::virtual_delete(&id("ReplicaSet", "a", "rs", "r"))],
            vec![
                AbsentOwner(id("ReplicaSet", "a", "rs", "r")),
                AttemptToDelete(id("Pod", "a", "p", "p")),
            ],
        ),
        (
            "GC-7 a virtual owner whose dependents disagree on its coordinates: the matching ones are queued, the node tries the next coordinates",
            vec![
                pod(),
                add("Pod", "a", "q", "q", vec![owner("Deployment", "d", "r")]),
                GraphEvent::virtual_delete(&id("ReplicaSet", "a", "rs", "r")),
            ],
            vec![
                AbsentOwner(id("ReplicaSet", "a", "rs", "r")),
                AttemptToDelete(id("Pod", "a", "p", "p")),
                AttemptToDeleteRateLimited(id("Deployment", "a", "d", "r")),
            ],
        ),
        (
            "GC-7 a virtual delete of other coordinates than an observed node's: only the dependents naming them are dangling",
            vec![
                rs(),
                pod(),
                add("Pod", "a", "q", "q", vec![owner("ReplicaSet", "old-name", "r")]),
                GraphEvent::virtual_delete(&id("ReplicaSet", "a", "old-name", "r")),
            ],
            vec![
                AbsentOwner(id("ReplicaSet", "a", "old-name", "r")),
                AttemptToDelete(id("Pod", "a", "q", "q")),
            ],
        ),
        (
            "GC-2 a delete of an unknown uid is ignored",
            vec![del("Pod", "a", "zz", "zz")],
            vec![],
        ),
    ];
    for (name, events, want) in cases {
        let mut g = Graph::new();
        assert_eq!(run(&mut g, &events), want, "{name}");
    }
}

#[test]
fn gc2_graph_state_after_changes() {
    let mut g = Graph::new();
    g.process(&add(
        "Pod",
        "a",
        "p",
        "p",
        vec![owner("ReplicaSet", "rs", "r")],
    ));
    assert!(
        g.node("r").unwrap().virtual_,
        "GC-2 an unobserved owner is virtual"
    );
    assert_eq!(g.dependents("r").len(), 1);

    g.process(&add(
        "ReplicaSet",
        "a",
        "rs",
        "r",
        vec![owner("Deployment", "d", "d")],
    ));
    let r = g.node("r").unwrap();
    assert!(!r.virtual_, "observed");
    assert_eq!(r.dependents_len(), 1, "edges survive the observation");
    assert!(
        g.node("d").unwrap().virtual_,
        "its own owner is virtual now"
    );

    // GC-2 a new apiVersion for the same object updates the identity, keeps the edges.
    let mut moved = add(
        "ReplicaSet",
        "a",
        "rs",
        "r",
        vec![owner("Deployment", "d", "d")],
    );
    moved.event_type = EventType::Update;
    moved.api_version = "apps/v1beta2".into();
    assert!(g.process(&moved).is_empty());
    assert_eq!(g.node("r").unwrap().identity.api_version, "apps/v1beta2");
    assert_eq!(g.dependents("d").len(), 1);
    assert_eq!(g.dependents("r").len(), 1);

    // GC-4 deletion state is recorded on the node.
    g.process(&update(
        "ReplicaSet",
        "a",
        "rs",
        "r",
        vec![owner("Deployment", "d", "d")],
        NONE,
        deleting(false, true),
    ));
    let r = g.node("r").unwrap();
    assert!(r.being_deleted && r.deleting_dependents);

    // GC-1 removing the dependent removes the edge.
    g.process(&del("Pod", "a", "p", "p"));
    assert!(g.dependents("r").is_empty());
    assert_eq!(g.len(), 2);
}

#[test]
fn gc4_blocking_dependents_are_those_with_block_owner_deletion() {
    let mut g = Graph::new();
    g.process(&add("ReplicaSet", "a", "rs", "r", vec![]));
    g.process(&add(
        "Pod",
        "a",
        "blocking",
        "p1",
        vec![oref("ReplicaSet", "rs", "r", Some(true))],
    ));
    g.process(&add(
        "Pod",
        "a",
        "unset",
        "p2",
        vec![oref("ReplicaSet", "rs", "r", None)],
    ));
    g.process(&add(
        "Pod",
        "a",
        "off",
        "p3",
        vec![oref("ReplicaSet", "rs", "r", Some(false))],
    ));
    let names: Vec<&str> = g
        .blocking_dependents("r")
        .iter()
        .map(|n| n.identity.name.as_str())
        .collect();
    assert_eq!(names, ["blocking"]);
    assert_eq!(g.dependents("r").len(), 3);
}

#[test]
fn gc4_references_diffs() {
    let a = oref("ReplicaSet", "a", "ua", Some(true));
    let b = oref("ReplicaSet", "b", "ub", Some(true));
    let b_off = oref("ReplicaSet", "b", "ub", Some(false));
    let c = oref("ReplicaSet", "c", "uc", None);
    type Diff = (
        Vec<OwnerReference>,
        Vec<OwnerReference>,
        Vec<(OwnerReference, OwnerReference)>,
    );
    let cases: Vec<(&str, Vec<OwnerReference>, Vec<OwnerReference>, Diff)> = vec![
        (
            "no change",
            vec![a.clone()],
            vec![a.clone()],
            (vec![], vec![], vec![]),
        ),
        (
            "added",
            vec![a.clone()],
            vec![a.clone(), c.clone()],
            (vec![c.clone()], vec![], vec![]),
        ),
        (
            "removed",
            vec![a.clone(), b.clone()],
            vec![b.clone()],
            (vec![], vec![a.clone()], vec![]),
        ),
        (
            "changed blockOwnerDeletion",
            vec![b.clone()],
            vec![b_off.clone()],
            (vec![], vec![], vec![(b.clone(), b_off.clone())]),
        ),
    ];
    for (name, old, new, want) in cases {
        assert_eq!(references_diffs(&old, &new), want, "{name}");
    }
}

#[test]
fn gc5_deletion_starts_with_finalizer() {
    let cases = [
        (
            "GC-6 add already deleting with orphan",
            None,
            deleting(true, false),
            true,
            true,
        ),
        (
            "GC-6 update to deleting with orphan",
            Some(NONE),
            deleting(true, false),
            true,
            true,
        ),
        (
            "GC-6 finalizer added while deleting",
            Some(deleting(false, false)),
            deleting(true, false),
            true,
            true,
        ),
        (
            "GC-6 already deleting with orphan",
            Some(deleting(true, false)),
            deleting(true, false),
            true,
            false,
        ),
        (
            "GC-6 not deleting",
            None,
            Flags {
                orphan_finalizer: true,
                ..NONE
            },
            true,
            false,
        ),
        (
            "GC-4 update to deleting with foregroundDeletion",
            Some(NONE),
            deleting(false, true),
            false,
            true,
        ),
        (
            "GC-4 orphan does not start foreground",
            Some(NONE),
            deleting(true, false),
            false,
            false,
        ),
    ];
    for (name, old, new, orphan, want) in cases {
        assert_eq!(
            deletion_starts_with_finalizer(old, new, orphan),
            want,
            "{name}"
        );
    }
}

#[test]
fn gc7_object_ref_text_is_upstreams() {
    assert_eq!(
        id("ReplicaSet", "a", "rs", "r").to_string(),
        "[apps/v1/ReplicaSet, namespace: a, name: rs, uid: r]"
    );
}
