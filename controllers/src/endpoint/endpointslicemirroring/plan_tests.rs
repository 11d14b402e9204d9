//! The mirroring plan's cases, after upstream's `reconciler_test.go` and `utils_test.go`.

use super::*;
use serde_json::json;

fn endpoints(v: serde_json::Value) -> Endpoints {
    let mut base = json!({"metadata": {"name": "svc", "namespace": "ns", "uid": "u1",
        "labels": {"team": "a"},
        "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "x", "note": "y"}}});
    base["subsets"] = v;
    serde_json::from_value(base).unwrap()
}

fn existing(p: &Plan, i: usize, name: &str) -> Arc<EndpointSlice> {
    let mut s = p.create[i].clone();
    s.metadata.name = Some(name.into());
    s.metadata.generate_name = None;
    s.metadata.resource_version = Some("7".into());
    Arc::new(s)
}

#[test]
fn one_slice_per_family_and_port_set_with_labels_owner_and_annotations() {
    let ep = endpoints(json!([
        {"addresses": [{"ip": "10.0.0.1", "hostname": "h1", "nodeName": "n1"},
                       {"ip": "2001:db8::1"}],
         "notReadyAddresses": [{"ip": "10.0.0.2"}],
         "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]},
        {"addresses": [{"ip": "10.0.0.3"}], "ports": [{"name": "dns", "port": 53, "protocol": "UDP"}]}
    ]));
    let p = plan(&ep, &[], 1000);
    assert_eq!((p.create.len(), p.update.len(), p.delete.len()), (3, 0, 0));
    let http4 = &p.create[0];
    assert_eq!(http4.address_type, "IPv4");
    assert_eq!(http4.metadata.generate_name.as_deref(), Some("svc-"));
    let eps = serde_json::to_value(&http4.endpoints).unwrap();
    assert_eq!(
        eps,
        json!([{"addresses": ["10.0.0.1"], "conditions": {"ready": true}, "hostname": "h1",
                "nodeName": "n1"},
               {"addresses": ["10.0.0.2"], "conditions": {"ready": false}}])
    );
    let labels = http4.labels();
    assert_eq!(labels[LABEL_MANAGED_BY], MANAGED_BY);
    assert_eq!(labels[LABEL_SERVICE_NAME], "svc");
    assert_eq!(labels["team"], "a");
    assert_eq!(
        http4.annotations(),
        &BTreeMap::from([("note".to_string(), "y".to_string())]),
        "the trigger time is not copied"
    );
    let o = &http4.owner_references()[0];
    assert_eq!(
        (o.kind.as_str(), o.uid.as_str(), o.controller),
        ("Endpoints", "u1", Some(true))
    );
    assert_eq!(p.create[1].address_type, "IPv6");
    assert_eq!(p.create[2].ports.as_ref().unwrap()[0].port, Some(53));
}

#[test]
fn unchanged_slices_are_left_alone_and_changes_rewrite_in_place() {
    let ep = endpoints(
        json!([{"addresses": [{"ip": "10.0.0.1"}, {"ip": "10.0.0.2"}],
                               "ports": [{"port": 80}]}]),
    );
    let first = plan(&ep, &[], 1000);
    let slice = existing(&first, 0, "svc-abc");
    assert!(plan(&ep, std::slice::from_ref(&slice), 1000).is_empty());
    // Address order does not matter.
    let reordered = endpoints(
        json!([{"addresses": [{"ip": "10.0.0.2"}, {"ip": "10.0.0.1"}],
                                      "ports": [{"port": 80}]}]),
    );
    assert!(plan(&reordered, std::slice::from_ref(&slice), 1000).is_empty());
    // A new address: the same slice rewritten, with the resourceVersion read.
    let more = endpoints(
        json!([{"addresses": [{"ip": "10.0.0.1"}, {"ip": "10.0.0.9"}],
                                 "ports": [{"port": 80}]}]),
    );
    let p = plan(&more, std::slice::from_ref(&slice), 1000);
    assert_eq!((p.create.len(), p.update.len(), p.delete.len()), (0, 1, 0));
    assert_eq!(p.update[0].metadata.name.as_deref(), Some("svc-abc"));
    assert_eq!(p.update[0].metadata.resource_version.as_deref(), Some("7"));
    // A label change on the Endpoints: rewritten too.
    let mut relabelled = ep.clone();
    relabelled.labels_mut().insert("team".into(), "b".into());
    assert_eq!(
        plan(&relabelled, std::slice::from_ref(&slice), 1000)
            .update
            .len(),
        1
    );
    // A second slice of the same key is deleted.
    let dup = existing(&first, 0, "svc-dup");
    let p = plan(&ep, &[slice.clone(), dup], 1000);
    assert_eq!(
        p.delete.iter().map(|s| s.name_any()).collect::<Vec<_>>(),
        ["svc-dup"]
    );
    // The Endpoints recreated (another uid): rewritten.
    let mut recreated = ep.clone();
    recreated.metadata.uid = Some("u2".into());
    assert_eq!(plan(&recreated, &[slice], 1000).update.len(), 1);
}

#[test]
fn a_port_change_recycles_the_slice_and_no_addresses_delete_it() {
    let ep = endpoints(json!([{"addresses": [{"ip": "10.0.0.1"}], "ports": [{"port": 80}]}]));
    let slice = existing(&plan(&ep, &[], 1000), 0, "svc-abc");
    let moved = endpoints(json!([{"addresses": [{"ip": "10.0.0.1"}], "ports": [{"port": 8080}]}]));
    let p = plan(&moved, std::slice::from_ref(&slice), 1000);
    assert_eq!((p.create.len(), p.update.len(), p.delete.len()), (0, 1, 0));
    assert_eq!(p.update[0].ports.as_ref().unwrap()[0].port, Some(8080));
    assert_eq!(p.update[0].metadata.name.as_deref(), Some("svc-abc"));
    let empty = endpoints(json!([]));
    assert_eq!(plan(&empty, &[slice], 1000).delete.len(), 1);
}

#[test]
fn repacking_merges_subsets_and_not_ready_wins() {
    let ep = endpoints(json!([
        {"addresses": [{"ip": "10.0.0.1"}], "ports": [{"port": 80}]},
        {"notReadyAddresses": [{"ip": "10.0.0.1"}], "ports": [{"port": 80}]},
        {"addresses": [{"ip": "10.0.0.2"}], "ports": [{"port": 80}]}
    ]));
    let p = plan(&ep, &[], 1000);
    assert_eq!(p.create.len(), 1);
    let eps = serde_json::to_value(&p.create[0].endpoints).unwrap();
    assert_eq!(
        eps,
        json!([{"addresses": ["10.0.0.2"], "conditions": {"ready": true}},
               {"addresses": ["10.0.0.1"], "conditions": {"ready": false}}])
    );
}

#[test]
fn invalid_and_excess_addresses_are_skipped_and_counted() {
    let ep = endpoints(
        json!([{"addresses": [{"ip": "10.0.0.1"}, {"ip": "not-an-ip"},
                                             {"ip": "10.0.0.2"}, {"ip": "10.0.0.3"}],
                               "ports": [{"port": 80}]}]),
    );
    let p = plan(&ep, &[], 2);
    assert_eq!(p.create[0].endpoints.len(), 2);
    assert_eq!((p.invalid, p.skipped), (1, 2));
    // IPv4-mapped IPv6 is IPv4, as Go's To4.
    let mapped =
        endpoints(json!([{"addresses": [{"ip": "::ffff:10.0.0.5"}], "ports": [{"port": 80}]}]));
    let p = plan(&mapped, &[], 10);
    assert_eq!(p.create[0].address_type, "IPv4");
    assert_eq!(p.create[0].endpoints[0].addresses, ["10.0.0.5"]);
}

#[test]
fn skip_mirror_and_leader_election_endpoints_are_not_mirrored() {
    let mut ep = endpoints(json!([]));
    assert!(should_mirror(&ep));
    ep.labels_mut()
        .insert(LABEL_SKIP_MIRROR.into(), "true".into());
    assert!(!should_mirror(&ep));
    ep.labels_mut()
        .insert(LABEL_SKIP_MIRROR.into(), "false".into());
    assert!(should_mirror(&ep));
    ep.annotations_mut()
        .insert(LEADER_ANNOTATION.into(), "{}".into());
    assert!(!should_mirror(&ep));
}
