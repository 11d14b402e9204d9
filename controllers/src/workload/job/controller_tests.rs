//! The Job controller's event handlers (JOB-2): which Jobs a Pod or Job change queues (at once,
//! or on the orphan queue), which creation and finalizer-removal expectations it observes.
//! Events go through the informers' own dispatch; the client is never used (nothing syncs).
//! Pod events queue their Job after the 1 s batch period: those keys are not ready yet, so the
//! tests read the expectations and the orphan queue, which Pod events change at once.

use super::*;
use kube::runtime::watcher::Event;
use serde_json::json;

use crate::runtime::cached_pod::CachedPod;
use crate::runtime::informer::Informer;
use crate::runtime::testing::{drain, offline, owned_pod};

struct World {
    controller: Arc<Controller>,
    jobs: Arc<Informer<Job>>,
    pods: Arc<Informer<CachedPod>>,
    _informers: Arc<Informers>,
}

fn job(name: &str, uid: &str, finished: bool) -> Job {
    let conds = if finished {
        json!([{"type": "Complete", "status": "True"}])
    } else {
        json!([])
    };
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns", "uid": uid, "generation": 1,
                     "resourceVersion": "1"},
        "spec": {"selector": {"matchLabels": {"job": name}},
                 "template": {"metadata": {"labels": {"job": name}}, "spec": {"containers": []}}},
        "status": {"conditions": conds},
    }))
    .unwrap()
}

fn world() -> World {
    let (controller, informers) = offline(|c, i| Controller::new(c, i, Config::default()));
    let w = World {
        controller,
        jobs: informers.get::<Job>(),
        pods: informers.get::<CachedPod>(),
        _informers: informers,
    };
    w.jobs.dispatch(&Event::Apply(job("pi", "uid-pi", false)));
    w.jobs
        .dispatch(&Event::Apply(job("done", "uid-done", true)));
    w
}

/// A Pod of Job `owner` (name, uid), with or without the tracking finalizer.
fn pod(name: &str, rv: &str, owner: Option<(&str, &str)>, finalizer: bool) -> CachedPod {
    let mut v = owned_pod(name, rv, json!({"job": "pi"}), ("batch/v1", "Job"), owner);
    if finalizer {
        v["metadata"]["finalizers"] = json!([TRACKING_FINALIZER]);
    }
    serde_json::from_value(v).unwrap()
}

#[tokio::test]
async fn job2_handlers_queue_jobs_and_observe_expectations() {
    let w = world();
    let c = &w.controller;
    assert_eq!(
        drain(&c.queue).await,
        ["ns/pi", "ns/done"],
        "JOB-2 a new Job is synced at once"
    );

    c.pod_control.expect("ns/pi", 2, &[]);
    w.pods
        .dispatch(&Event::Apply(pod("a", "1", Some(("pi", "uid-pi")), true)));
    assert_eq!(
        c.pod_control.expectations().pending("ns/pi"),
        Some((1, 0)),
        "JOB-2 a created Pod is observed"
    );
    w.pods.dispatch(&Event::Apply(pod(
        "x",
        "1",
        Some(("pi", "uid-other")),
        true,
    )));
    assert_eq!(
        c.pod_control.expectations().pending("ns/pi"),
        Some((1, 0)),
        "JOB-2 a Pod of a re-created Job (other uid) is not ours"
    );

    c.finalizer_expectations
        .lock()
        .unwrap()
        .entry("ns/pi".into())
        .or_default()
        .insert("uid-a".into());
    w.pods
        .dispatch(&Event::Apply(pod("a", "2", Some(("pi", "uid-pi")), false)));
    assert!(
        c.finalizer_expectations.lock().unwrap()["ns/pi"].is_empty(),
        "the finalizer removal of a Pod is observed"
    );

    // Orphans with the finalizer, and Pods of finished Jobs, go to the orphan queue.
    drain(&c.orphans).await;
    w.pods
        .dispatch(&Event::Apply(pod("orphan", "1", None, true)));
    w.pods
        .dispatch(&Event::Apply(pod("plain", "1", None, false)));
    w.pods.dispatch(&Event::Delete(pod(
        "late",
        "1",
        Some(("done", "uid-done")),
        true,
    )));
    assert_eq!(
        drain(&c.orphans).await,
        [
            OrphanKey::Pod("ns".into(), "orphan".into()),
            OrphanKey::Pod("ns".into(), "late".into()),
        ],
        "an orphan with the finalizer, and a Pod of a finished Job, lose the finalizer"
    );

    // A finished Job's update queues its Pods for finalizer removal, not a sync.
    drain(&c.queue).await;
    let mut finished = job("pi", "uid-pi", true);
    finished.metadata.resource_version = Some("2".into());
    w.jobs.dispatch(&Event::Apply(finished));
    assert_eq!(drain(&c.queue).await, Vec::<String>::new());
    assert_eq!(
        drain(&c.orphans).await,
        [OrphanKey::Job("ns".into(), "uid-pi".into())]
    );

    // A deleted Job: synced once more (to forget it), its Pods' finalizers removed.
    w.jobs
        .dispatch(&Event::Delete(job("done", "uid-done", true)));
    assert_eq!(drain(&c.queue).await, ["ns/done"]);
    assert_eq!(
        drain(&c.orphans).await,
        [OrphanKey::Job("ns".into(), "uid-done".into())]
    );
}
