//! DEP-2: which informer events queue which Deployment.

use super::*;
use crate::runtime::cached_pod::CachedPod;
use crate::runtime::informer;
use crate::runtime::testing::{controller_ref, drain_sorted, offline};
use kube::runtime::watcher::Event as Watch;
use serde_json::{json, Value};

fn deployment(name: &str, uid: &str, strategy: &str) -> Deployment {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": "1"},
        "spec": {"selector": {"matchLabels": {"app": name}}, "strategy": {"type": strategy},
                 "template": {"metadata": {"labels": {"app": name}}}}
    }))
    .unwrap()
}

fn controller(kind: &str, name: &str, uid: &str) -> Value {
    controller_ref("apps/v1", kind, name, uid)
}

fn replica_set(name: &str, app: &str, rv: &str, owner: Option<(&str, &str)>) -> ReplicaSet {
    let mut meta = json!({"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                          "resourceVersion": rv, "labels": {"app": app}});
    if let Some((d, uid)) = owner {
        meta["ownerReferences"] = controller("Deployment", d, uid);
    }
    serde_json::from_value(
        json!({"metadata": meta, "spec": {"selector": {"matchLabels": {"app": app}}}}),
    )
    .unwrap()
}

fn pod(name: &str, app: &str, rs: &str) -> CachedPod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"), "resourceVersion": "1",
                     "labels": {"app": app}, "ownerReferences": controller("ReplicaSet", rs, &format!("uid-{rs}"))}
    }))
    .unwrap()
}

struct Fixture {
    _informers: Arc<Informers>,
    ctl: Arc<Controller>,
    d: Arc<informer::Informer<Deployment>>,
    rs: Arc<informer::Informer<ReplicaSet>>,
    pods: Arc<informer::Informer<CachedPod>>,
}

impl Fixture {
    fn new() -> Fixture {
        let (ctl, informers) = offline(|c, i| Controller::new(c, i, Config::default()));
        let f = Fixture {
            d: informers.get::<Deployment>(),
            rs: informers.get::<ReplicaSet>(),
            pods: informers.get::<CachedPod>(),
            _informers: informers,
            ctl,
        };
        f.d.dispatch(&Watch::Init);
        f.d.dispatch(&Watch::InitDone);
        f.rs.dispatch(&Watch::Init);
        f.rs.dispatch(&Watch::InitDone);
        f.pods.dispatch(&Watch::Init);
        f.pods.dispatch(&Watch::InitDone);
        f
    }

    async fn drain(&self) -> Vec<String> {
        drain_sorted(self.ctl.queue()).await
    }
}

#[tokio::test]
async fn dep2_deployment_and_replica_set_events() {
    let f = Fixture::new();
    f.d.dispatch(&Watch::Apply(deployment("web", "uid-web", "RollingUpdate")));
    f.d.dispatch(&Watch::Apply(deployment("db", "uid-db", "RollingUpdate")));
    assert_eq!(
        f.drain().await,
        ["ns/db", "ns/web"],
        "DEP-2 Deployment adds"
    );

    struct Case {
        name: &'static str,
        event: Watch<ReplicaSet>,
        want: &'static [&'static str],
    }
    let cases = [
        Case {
            name: "DEP-2 an owned ReplicaSet's add queues its Deployment",
            event: Watch::Apply(replica_set("web-1", "web", "1", Some(("web", "uid-web")))),
            want: &["ns/web"],
        },
        Case {
            name: "DEP-2 an update without a new resourceVersion queues nothing",
            event: Watch::Apply(replica_set("web-1", "web", "1", Some(("web", "uid-web")))),
            want: &[],
        },
        Case {
            name: "DEP-2 a reference to a Deployment of another uid is not followed",
            event: Watch::Apply(replica_set("web-2", "web", "1", Some(("web", "uid-old")))),
            want: &[],
        },
        Case {
            name: "DEP-2 an orphan queues the Deployments selecting it",
            event: Watch::Apply(replica_set("orphan", "db", "1", None)),
            want: &["ns/db"],
        },
        Case {
            name: "DEP-2 a controller change queues the old and the new controller",
            event: Watch::Apply(replica_set("web-1", "web", "2", Some(("db", "uid-db")))),
            want: &["ns/db", "ns/web"],
        },
        Case {
            name: "DEP-2 an owned ReplicaSet's deletion queues its Deployment",
            event: Watch::Delete(replica_set("web-1", "web", "3", Some(("db", "uid-db")))),
            want: &["ns/db"],
        },
        Case {
            name: "DEP-2 an orphan's deletion concerns nobody",
            event: Watch::Delete(replica_set("orphan", "db", "2", None)),
            want: &[],
        },
    ];
    for c in cases {
        f.rs.dispatch(&c.event);
        assert_eq!(f.drain().await, c.want, "{}", c.name);
    }
}

#[tokio::test]
async fn dep2_pod_deletion_wakes_a_recreate_deployment_without_pods() {
    let f = Fixture::new();
    f.d.dispatch(&Watch::Apply(deployment("re", "uid-re", "Recreate")));
    f.d.dispatch(&Watch::Apply(deployment("ru", "uid-ru", "RollingUpdate")));
    f.rs.dispatch(&Watch::Apply(replica_set(
        "re-1",
        "re",
        "1",
        Some(("re", "uid-re")),
    )));
    f.rs.dispatch(&Watch::Apply(replica_set(
        "ru-1",
        "ru",
        "1",
        Some(("ru", "uid-ru")),
    )));
    for p in [
        pod("a", "re", "re-1"),
        pod("b", "re", "re-1"),
        pod("c", "ru", "ru-1"),
    ] {
        f.pods.dispatch(&Watch::Apply(p));
    }
    f.drain().await;
    let cases = [
        ("DEP-2 a Pod left: no sync", pod("a", "re", "re-1"), &[][..]),
        (
            "DEP-2 the last Pod of a Recreate Deployment: sync",
            pod("b", "re", "re-1"),
            &["ns/re"][..],
        ),
        (
            "DEP-2 RollingUpdate Deployments do not wait on Pods",
            pod("c", "ru", "ru-1"),
            &[][..],
        ),
    ];
    for (name, p, want) in cases {
        f.pods.dispatch(&Watch::Delete(p));
        assert_eq!(f.drain().await, want, "{name}");
    }
}
