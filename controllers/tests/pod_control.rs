//! The runtime's pod control against the reference kube-apiserver (`cargo xtask setup --k8s` builds
//! it; without it the test fails): creations and deletions, the Events they record and the
//! expectations they leave.

use std::time::Duration;

mod common;

use common::events::recorded_by;

use controllers::runtime::events::Recorder;
use controllers::runtime::pod_control::*;
use controllers::Error;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::{Event, Namespace, Pod};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, ResourceExt as _};
use serde_json::json;

fn pod(labels: serde_json::Value, image: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"generateName": "web-", "labels": labels},
        "spec": {"containers": [{"name": "c", "image": image}]},
    }))
    .unwrap()
}

/// `(reason, message)` of the Events our component recorded about `owner`, once `n` are there.
async fn events(api: &Api<Event>, owner: &Owner, n: usize) -> Vec<(String, String)> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let fields = format!(
            "involvedObject.name={}",
            owner.reference.name.as_deref().unwrap_or_default()
        );
        let mut found: Vec<(String, String)> = recorded_by(api, &fields, "pod-control-test")
            .await
            .into_iter()
            .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
            .collect();
        if found.len() >= n {
            found.sort();
            return found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {n} events, have {found:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl10_creations_and_deletions_against_the_reference_api_server() {
    let opts = controlplane::Options::minimal(controlplane::run_dir("pod-control"));
    let cp = tokio::task::block_in_place(|| controlplane::ControlPlane::start(opts)).unwrap();
    let client = cp.client().await.unwrap();
    let namespace = cp.test_namespace("podctl").unwrap();
    let rs_api: Api<ReplicaSet> = Api::namespaced(client.clone(), &namespace);
    let rs: ReplicaSet = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "c", "image": "i"}]}}},
    }))
    .unwrap();
    let rs = rs_api.create(&PostParams::default(), &rs).await.unwrap();
    let owner = Owner::of(&rs, format!("ReplicaSet {namespace}/web"));
    assert_eq!(owner.key, format!("{namespace}/web"));
    let pc = PodControl::new(
        client.clone(),
        Recorder::new(client.clone(), "pod-control-test"),
    );
    let event_api: Api<Event> = Api::namespaced(client.clone(), &namespace);

    // Three creations, all made: expected, none observed yet.
    pc.expect(&owner.key, 3, &[]);
    let created = pc
        .create_pods(&owner, 3, |_| Ok(pod(json!({"app": "web"}), "i")))
        .await;
    assert!(created.error.is_none(), "{:?}", created.error);
    assert_eq!(created.done, 3);
    assert_eq!(pc.expectations().pending(&owner.key), Some((3, 0)));
    let names: Vec<String> = Api::<Pod>::namespaced(client.clone(), &namespace)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|p| p.name_any())
        .collect();
    assert_eq!(names.len(), 3);
    assert!(names.iter().all(|n| n.starts_with("web-")));

    // CTL-10 the second creation is refused (an invalid Pod): its batch (1, then 2) ends the
    // creations; the refused one and the never attempted are observed at once.
    pc.expect(&owner.key, 6, &[]);
    let created = pc
        .create_pods(&owner, 6, |i| {
            Ok(pod(json!({"app": "web"}), if i == 1 { "" } else { "i" }))
        })
        .await;
    let err = created.error.expect("the invalid Pod fails");
    assert!(
        matches!(&err, Error::Kube { source, .. } if source_code(source) == 422),
        "{err}"
    );
    assert_eq!(
        created.done, 2,
        "the first batch and the valid one of the second"
    );
    assert_eq!(
        pc.expectations().pending(&owner.key),
        Some((2, 0)),
        "one failed and three never attempted: observed"
    );

    // Deletions: two Pods and one already gone.
    let mut victims = names[..2].to_vec();
    victims.push("web-gone".into());
    let keys: Vec<String> = victims.iter().map(|n| format!("{namespace}/{n}")).collect();
    pc.expect(&owner.key, 0, &keys);
    let deleted = pc.delete_pods(&owner, &victims).await;
    assert!(matches!(
        deleted.as_slice(),
        [Deleted::Deleted, Deleted::Deleted, Deleted::Gone]
    ));
    assert_eq!(
        pc.expectations().pending(&owner.key),
        Some((0, 2)),
        "the deletion of a Pod already gone is observed at once"
    );

    let invalid_message = events(&event_api, &owner, 8)
        .await
        .into_iter()
        .filter(|(reason, _)| reason == FAILED_CREATE)
        .collect::<Vec<_>>();
    assert_eq!(invalid_message.len(), 1, "one FailedCreate");
    assert!(
        invalid_message[0].1.starts_with("Error creating: "),
        "{invalid_message:?}"
    );
    let all = events(&event_api, &owner, 8).await;
    let count = |reason: &str| all.iter().filter(|(r, _)| r == reason).count();
    assert_eq!(
        (
            count(SUCCESSFUL_CREATE),
            count(FAILED_CREATE),
            count(SUCCESSFUL_DELETE),
            count(FAILED_DELETE)
        ),
        (5, 1, 2, 0),
        "no FailedDelete for a Pod already gone: {all:?}"
    );
    for n in &victims[..2] {
        assert!(all.contains(&(SUCCESSFUL_DELETE.to_string(), format!("Deleted pod: {n}"))));
    }

    // A namespace being deleted (no namespace controller runs here, so it stays Terminating):
    // creations are refused without an Event, counted as done, and observed.
    let ns_api: Api<Namespace> = Api::all(client.clone());
    ns_api
        .delete(&namespace, &DeleteParams::default())
        .await
        .unwrap();
    pc.expect(&owner.key, 2, &[]);
    let created = pc
        .create_pods(&owner, 2, |_| Ok(pod(json!({"app": "web"}), "i")))
        .await;
    assert!(created.error.is_none(), "{:?}", created.error);
    assert_eq!(created.done, 2);
    assert_eq!(pc.expectations().pending(&owner.key), Some((0, 0)));
    assert!(pc.expectations().satisfied(&owner.key));
}

fn source_code(e: &kube::Error) -> u16 {
    controllers::runtime::apierrors::status(e).map_or(0, |s| s.code)
}
