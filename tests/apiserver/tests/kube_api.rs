//! kube::Api against the test API server: the protocol pieces controllers depend on.

use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Binding, ObjectReference, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{
    DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use serde_json::json;
use test_apiserver::TestApiServer;

fn service(name: &str, labels: serde_json::Value) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"selector": {"app": name}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}
    }))
    .unwrap()
}

fn pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
        "status": {"phase": "Running", "podIP": "10.0.0.9"}
    }))
    .unwrap()
}

fn code(e: &kube::Error) -> u16 {
    match e {
        kube::Error::Api(s) => s.code,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn discovery_lists_the_served_groups() {
    let srv = TestApiServer::start().await.unwrap();
    let client = srv.client().unwrap();
    let discovery = kube::discovery::Discovery::new(client.clone())
        .run()
        .await
        .unwrap();
    let groups: Vec<String> = discovery.groups().map(|g| g.name().to_string()).collect();
    for want in ["", "discovery.k8s.io", "coordination.k8s.io"] {
        assert!(
            groups.iter().any(|g| g == want),
            "group {want:?} missing from {groups:?}"
        );
    }
    let (ar, _) = discovery
        .resolve_gvk(&kube::api::GroupVersionKind::gvk(
            "discovery.k8s.io",
            "v1",
            "EndpointSlice",
        ))
        .unwrap();
    assert_eq!(ar.plural, "endpointslices");
    assert_eq!(client.apiserver_version().await.unwrap().major, "1");
}

#[tokio::test]
async fn create_allocates_and_rejects_duplicates() {
    let srv = TestApiServer::start().await.unwrap();
    let api: Api<Service> = Api::namespaced(srv.client().unwrap(), "ns1");
    let a = api
        .create(&PostParams::default(), &service("a", json!({"tier": "fe"})))
        .await
        .unwrap();
    assert!(
        a.uid().is_some() && a.resource_version().is_some() && a.creation_timestamp().is_some()
    );
    let spec = a.spec.unwrap();
    assert_eq!(spec.cluster_ip.as_deref(), Some("10.96.0.10"));
    assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
    assert_eq!(spec.ports.unwrap()[0].protocol.as_deref(), Some("TCP"));
    let err = api
        .create(&PostParams::default(), &service("a", json!({})))
        .await
        .unwrap_err();
    assert_eq!(code(&err), 409);
    let mut gen = service("", json!({}));
    gen.metadata.generate_name = Some("gen-".into());
    let g = api.create(&PostParams::default(), &gen).await.unwrap();
    assert!(
        g.name_any().starts_with("gen-") && g.name_any().len() == 9,
        "{}",
        g.name_any()
    );
    assert_ne!(g.spec.unwrap().cluster_ip.as_deref(), Some("10.96.0.10"));
}

#[tokio::test]
async fn list_filters_by_namespace_labels_and_fields() {
    let srv = TestApiServer::start().await.unwrap();
    let client = srv.client().unwrap();
    for (ns, name, tier) in [("a", "s1", "fe"), ("a", "s2", "be"), ("b", "s3", "fe")] {
        let api: Api<Service> = Api::namespaced(client.clone(), ns);
        api.create(
            &PostParams::default(),
            &service(name, json!({"tier": tier})),
        )
        .await
        .unwrap();
    }
    let names = |l: kube::core::ObjectList<Service>| {
        l.items.iter().map(|s| s.name_any()).collect::<Vec<_>>()
    };
    let all: Api<Service> = Api::all(client.clone());
    let ns_a: Api<Service> = Api::namespaced(client, "a");
    let cases: Vec<(&str, &Api<Service>, ListParams, Vec<&str>)> = vec![
        (
            "everything",
            &all,
            ListParams::default(),
            vec!["s1", "s2", "s3"],
        ),
        (
            "namespace a",
            &ns_a,
            ListParams::default(),
            vec!["s1", "s2"],
        ),
        (
            "label equality",
            &all,
            ListParams::default().labels("tier=fe"),
            vec!["s1", "s3"],
        ),
        (
            "label inequality",
            &all,
            ListParams::default().labels("tier!=fe"),
            vec!["s2"],
        ),
        (
            "label exists",
            &all,
            ListParams::default().labels("tier"),
            vec!["s1", "s2", "s3"],
        ),
        (
            "field name",
            &all,
            ListParams::default().fields("metadata.name=s3"),
            vec!["s3"],
        ),
        (
            "field namespace",
            &all,
            ListParams::default().fields("metadata.namespace=a,metadata.name!=s1"),
            vec!["s2"],
        ),
    ];
    for (case, api, lp, want) in cases {
        let list = api.list(&lp).await.unwrap();
        assert!(list.metadata.resource_version.is_some(), "{case}");
        assert_eq!(names(list), want, "{case}");
    }
}

#[tokio::test]
async fn update_with_stale_version_conflicts_and_no_op_keeps_version() {
    let srv = TestApiServer::start().await.unwrap();
    let api: Api<Lease> = Api::namespaced(srv.client().unwrap(), "kube-system");
    let lease: Lease =
        serde_json::from_value(json!({"metadata": {"name": "l"}, "spec": {"holderIdentity": "a"}}))
            .unwrap();
    let first = api.create(&PostParams::default(), &lease).await.unwrap();
    let mut second = first.clone();
    second.spec.as_mut().unwrap().holder_identity = Some("b".into());
    let second = api
        .replace("l", &PostParams::default(), &second)
        .await
        .unwrap();
    assert_eq!(second.metadata.generation, Some(2));
    let err = api
        .replace("l", &PostParams::default(), &first)
        .await
        .unwrap_err();
    assert_eq!(code(&err), 409);
    let same = api
        .replace("l", &PostParams::default(), &second)
        .await
        .unwrap();
    assert_eq!(
        same.resource_version(),
        second.resource_version(),
        "a no-op update must not bump the version"
    );
}

#[tokio::test]
async fn status_is_a_subresource_and_binding_sets_the_node() {
    let srv = TestApiServer::start().await.unwrap();
    let api: Api<Pod> = Api::namespaced(srv.client().unwrap(), "default");
    let created = api.create(&PostParams::default(), &pod("p")).await.unwrap();
    let status = created.status.clone().unwrap();
    assert_eq!(
        (status.phase.as_deref(), status.pod_ip.as_deref()),
        (Some("Pending"), None),
        "create resets status"
    );
    let mut p = created.clone();
    p.status = pod("p").status;
    let p = api
        .replace_status("p", &PostParams::default(), &p)
        .await
        .unwrap();
    assert_eq!(
        p.status.as_ref().unwrap().pod_ip.as_deref(),
        Some("10.0.0.9")
    );
    let mut main = p.clone();
    main.status.as_mut().unwrap().pod_ip = Some("1.1.1.1".into());
    main.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("x".into(), "y".into());
    let main = api
        .replace("p", &PostParams::default(), &main)
        .await
        .unwrap();
    assert_eq!(
        main.status.unwrap().pod_ip.as_deref(),
        Some("10.0.0.9"),
        "main resource update ignores status"
    );
    let patch = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
    let p = api
        .patch_status("p", &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .unwrap();
    assert_eq!(p.status.unwrap().conditions.unwrap()[0].type_, "Ready");
    let binding = Binding {
        metadata: kube::api::ObjectMeta {
            name: Some("p".into()),
            ..Default::default()
        },
        target: ObjectReference {
            kind: Some("Node".into()),
            name: Some("node-1".into()),
            ..Default::default()
        },
    };
    let _: serde_json::Value = api
        .create_subresource("binding", "p", &PostParams::default(), &binding)
        .await
        .unwrap();
    assert_eq!(
        api.get("p")
            .await
            .unwrap()
            .spec
            .unwrap()
            .node_name
            .as_deref(),
        Some("node-1")
    );
    let again: Result<serde_json::Value, _> = api
        .create_subresource("binding", "p", &PostParams::default(), &binding)
        .await;
    assert_eq!(code(&again.unwrap_err()), 409);
}

#[tokio::test]
async fn patches_merge_apply_and_json() {
    let srv = TestApiServer::start().await.unwrap();
    let api: Api<Service> = Api::namespaced(srv.client().unwrap(), "default");
    api.create(&PostParams::default(), &service("s", json!({"a": "1"})))
        .await
        .unwrap();
    let merged = api
        .patch(
            "s",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"b": "2", "a": null}}})),
        )
        .await
        .unwrap();
    assert_eq!(
        merged.labels().clone().into_iter().collect::<Vec<_>>(),
        vec![("b".to_string(), "2".to_string())]
    );
    let json_patch: json_patch::Patch = serde_json::from_value(
        json!([{"op": "add", "path": "/metadata/annotations", "value": {"k": "v"}}]),
    )
    .unwrap();
    let jp = api
        .patch("s", &PatchParams::default(), &Patch::<()>::Json(json_patch))
        .await
        .unwrap();
    assert_eq!(jp.annotations().get("k").map(String::as_str), Some("v"));
    let applied = api
        .patch("t", &PatchParams::apply("test").force(), &Patch::Apply(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "t"}, "spec": {"ports": [{"port": 53}]}})))
        .await
        .unwrap();
    assert!(
        applied.spec.unwrap().cluster_ip.is_some(),
        "apply creates a missing object"
    );
    let stale = json!({"metadata": {"resourceVersion": "1", "labels": {"c": "3"}}});
    assert_eq!(
        code(
            &api.patch("s", &PatchParams::default(), &Patch::Merge(stale))
                .await
                .unwrap_err()
        ),
        409
    );
}

#[tokio::test]
async fn delete_waits_for_finalizers() {
    let srv = TestApiServer::start().await.unwrap();
    let api: Api<Service> = Api::namespaced(srv.client().unwrap(), "default");
    let mut s = service("f", json!({}));
    s.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    api.create(&PostParams::default(), &s).await.unwrap();
    api.delete("f", &DeleteParams::default()).await.unwrap();
    let held = api.get("f").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());
    api.patch(
        "f",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert_eq!(code(&api.get("f").await.unwrap_err()), 404);
    assert_eq!(
        code(&api.delete("f", &DeleteParams::default()).await.unwrap_err()),
        404
    );
}

#[tokio::test]
async fn watch_streams_changes_bookmarks_and_410() {
    let srv = TestApiServer::builder()
        .bookmark_interval(Duration::from_millis(100))
        .start()
        .await
        .unwrap();
    let api: Api<EndpointSlice> = Api::namespaced(srv.client().unwrap(), "default");
    let rv = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let slice: EndpointSlice = serde_json::from_value(json!({"metadata": {"name": "e", "labels": {"kubernetes.io/service-name": "s"}}, "addressType": "IPv4", "endpoints": []})).unwrap();
    api.create(&PostParams::default(), &slice).await.unwrap();
    api.patch(
        "e",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"kubernetes.io/service-name": "t"}}})),
    )
    .await
    .unwrap();
    api.delete("e", &DeleteParams::default()).await.unwrap();
    let mut stream = api
        .watch(
            &WatchParams {
                bookmarks: true,
                ..WatchParams::default()
            }
            .labels("kubernetes.io/service-name=s"),
            &rv,
        )
        .await
        .unwrap()
        .boxed();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        match tokio::time::timeout(Duration::from_secs(5), stream.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            WatchEvent::Added(o) => seen.push(format!("ADDED {}", o.name_any())),
            WatchEvent::Modified(o) => seen.push(format!("MODIFIED {}", o.name_any())),
            WatchEvent::Deleted(o) => seen.push(format!("DELETED {}", o.name_any())),
            WatchEvent::Bookmark(_) => seen.push("BOOKMARK".into()),
            WatchEvent::Error(e) => panic!("unexpected error event {e:?}"),
        }
    }
    assert_eq!(
        seen,
        ["ADDED e", "DELETED e", "BOOKMARK"],
        "leaving the selector is a DELETED event"
    );
    srv.compact();
    let mut old = api
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    match old.try_next().await.unwrap().unwrap() {
        WatchEvent::Error(e) => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
        other => panic!("expected 410, got {other:?}"),
    }
}

#[tokio::test]
async fn faults_fail_stall_and_drop_watches() {
    let srv = TestApiServer::start().await.unwrap();
    let api: Api<Pod> = Api::namespaced(srv.client().unwrap(), "default");
    let faults = srv.faults();
    faults.fail_next(2);
    for _ in 0..2 {
        assert_eq!(
            code(&api.list(&ListParams::default()).await.unwrap_err()),
            500
        );
    }
    api.list(&ListParams::default()).await.unwrap();
    faults.forbid("pods");
    assert_eq!(
        code(&api.list(&ListParams::default()).await.unwrap_err()),
        403
    );
    faults.allow("pods");
    api.list(&ListParams::default()).await.unwrap();
    faults.stall(Duration::from_millis(300), None);
    let t = Instant::now();
    api.list(&ListParams::default()).await.unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "stalled request took {:?}",
        t.elapsed()
    );
    faults.clear();

    // A kube-runtime watcher keeps delivering across dropped watches and a window of 500s.
    let mut events = watcher(api.clone(), watcher::Config::default()).boxed();
    let first = tokio::time::timeout(Duration::from_secs(5), events.try_next())
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(first, Some(watcher::Event::Init)));
    faults.fail_for(Duration::from_millis(200));
    faults.drop_watches();
    let pods = Api::<Pod>::namespaced(srv.client().unwrap(), "default");
    tokio::time::sleep(Duration::from_millis(250)).await;
    pods.create(&PostParams::default(), &pod("after-fault"))
        .await
        .unwrap();
    let found = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(ev) = events.try_next().await.transpose() {
            match ev {
                Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p))
                    if p.name_any() == "after-fault" =>
                {
                    return true
                }
                _ => continue,
            }
        }
        false
    })
    .await
    .unwrap();
    assert!(
        found,
        "watcher resumed and saw the pod created after the faults"
    );
}

#[tokio::test]
async fn streaming_list_watchers_get_initial_events_and_the_end_bookmark() {
    let srv = TestApiServer::start().await.unwrap();
    let api: Api<Pod> = Api::namespaced(srv.client().unwrap(), "default");
    for name in ["a", "b"] {
        api.create(&PostParams::default(), &pod(name))
            .await
            .unwrap();
    }
    let mut events = watcher(api.clone(), watcher::Config::default().streaming_lists()).boxed();
    let mut seen = Vec::new();
    while !seen.iter().any(|s| s == "InitDone") {
        let ev = tokio::time::timeout(Duration::from_secs(5), events.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        seen.push(match ev {
            watcher::Event::Init => "Init".to_string(),
            watcher::Event::InitApply(p) => format!("InitApply {}", p.name_any()),
            watcher::Event::InitDone => "InitDone".to_string(),
            watcher::Event::Apply(p) => format!("Apply {}", p.name_any()),
            watcher::Event::Delete(p) => format!("Delete {}", p.name_any()),
        });
    }
    assert_eq!(seen, ["Init", "InitApply a", "InitApply b", "InitDone"]);
    api.create(&PostParams::default(), &pod("c")).await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(5), events.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(
        matches!(next, watcher::Event::Apply(ref p) if p.name_any() == "c"),
        "{next:?}"
    );
}

#[tokio::test]
async fn paginated_lists_come_from_one_snapshot() {
    let srv = TestApiServer::start().await.unwrap();
    let api: Api<Pod> = Api::namespaced(srv.client().unwrap(), "default");
    for name in ["a", "b", "c", "d", "e"] {
        api.create(&PostParams::default(), &pod(name))
            .await
            .unwrap();
    }
    let first = api.list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!(first.items.len(), 2);
    assert_eq!(first.metadata.remaining_item_count, Some(3));
    api.create(&PostParams::default(), &pod("late"))
        .await
        .unwrap();
    let mut names: Vec<String> = first.items.iter().map(|p| p.name_any()).collect();
    let mut token = first.metadata.continue_.clone();
    while let Some(t) = token.filter(|t| !t.is_empty()) {
        let page = api
            .list(&ListParams::default().limit(2).continue_token(&t))
            .await
            .unwrap();
        assert_eq!(
            page.metadata.resource_version, first.metadata.resource_version,
            "every page at the first page's version"
        );
        names.extend(page.items.iter().map(|p| p.name_any()));
        token = page.metadata.continue_;
    }
    assert_eq!(
        names,
        ["a", "b", "c", "d", "e"],
        "an object created between pages is not in this listing"
    );
    let bad = api
        .list(&ListParams::default().limit(2).continue_token("999:2"))
        .await
        .unwrap_err();
    assert_eq!(code(&bad), 410);
}
