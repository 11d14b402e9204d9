//! Named cases for the EndpointSlice plan.

use super::*;
use crate::runtime::cached_pod::CachedPod;
use serde_json::json;

fn svc_with(extra: serde_json::Value) -> Service {
    let mut v = json!({
        "metadata": {"name": "web", "namespace": "ns", "uid": "svc-uid", "labels": {"team": "a"}},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]}
    });
    json_patch::merge(&mut v, &extra);
    serde_json::from_value(v).unwrap()
}

fn svc() -> Service {
    svc_with(json!({}))
}

fn pod_full(i: usize, ready: bool, container_port: i32, terminating: bool) -> Arc<CachedPod> {
    let mut meta = json!({"name": format!("p{i}"), "namespace": "ns", "uid": format!("uid-{i}"), "labels": {"app": "web"}});
    if terminating {
        meta["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    }
    let ip = format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256);
    Arc::new(
        serde_json::from_value(json!({
            "metadata": meta,
            "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "x", "ports": [{"name": "http", "containerPort": container_port}]}]},
            "status": {"phase": "Running", "podIP": ip,
                       "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
        }))
        .unwrap(),
    )
}

fn pods(n: usize) -> Vec<Arc<CachedPod>> {
    (0..n).map(|i| pod_full(i, true, 8080, false)).collect()
}

/// Gives created slices names and resourceVersions, as the API server would.
fn materialize(plan: &Plan, existing: &[Arc<EndpointSlice>]) -> Vec<Arc<EndpointSlice>> {
    let mut out: BTreeMap<String, Arc<EndpointSlice>> =
        existing.iter().map(|s| (s.name_any(), s.clone())).collect();
    for s in &plan.delete {
        out.remove(&s.name_any());
    }
    for s in &plan.update {
        out.insert(s.name_any(), Arc::new(s.clone()));
    }
    for (i, s) in plan.create.iter().enumerate() {
        let mut s = s.clone();
        s.metadata.name = Some(format!("web-{}-{i}", out.len()));
        out.insert(s.name_any(), Arc::new(s));
    }
    out.into_values().collect()
}

fn sizes(slices: &[Arc<EndpointSlice>]) -> Vec<usize> {
    let mut v: Vec<usize> = slices.iter().map(|s| endpoints_of(s).len()).collect();
    v.sort_unstable_by(|a, b| b.cmp(a));
    v
}

fn counts(p: &Plan) -> (usize, usize, usize) {
    (p.create.len(), p.update.len(), p.delete.len())
}

#[test]
fn packing_from_cold_start() {
    let cases: [(&str, usize, Vec<usize>); 5] = [
        ("0 endpoints: one empty placeholder", 0, vec![0]),
        ("1 endpoint", 1, vec![1]),
        ("100 endpoints fill one slice", 100, vec![100]),
        ("101 endpoints need two", 101, vec![100, 1]),
        ("250 endpoints need three", 250, vec![100, 100, 50]),
    ];
    for (name, n, want) in cases {
        let p = plan(&svc(), &pods(n), &[]);
        assert_eq!(counts(&p), (want.len(), 0, 0), "{name}");
        assert_eq!(sizes(&materialize(&p, &[])), want, "{name}");
        let again = plan(&svc(), &pods(n), &materialize(&p, &[]));
        assert!(
            again.is_empty(),
            "{name}: a second pass over its own result changes nothing: {again:?}"
        );
    }
}

#[test]
fn slices_carry_labels_owner_ports_and_endpoint_fields() {
    let p = plan(&svc(), &pods(1), &[]);
    let s = &p.create[0];
    assert_eq!(s.metadata.generate_name.as_deref(), Some("web-"));
    assert_eq!(s.labels()[LABEL_SERVICE_NAME], "web");
    assert_eq!(s.labels()[LABEL_MANAGED_BY], MANAGED_BY);
    assert_eq!(s.labels()["team"], "a", "service labels are copied");
    let owner = &s.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
        ("Service", "svc-uid", Some(true))
    );
    assert_eq!(s.address_type, "IPv4");
    let port = &s.ports.as_ref().unwrap()[0];
    assert_eq!(
        (port.name.as_deref(), port.port, port.protocol.as_deref()),
        (Some("http"), Some(8080), Some("TCP"))
    );
    let ep = &endpoints_of(s)[0];
    assert_eq!(ep.addresses, ["10.0.0.0"]);
    assert_eq!(ep.node_name.as_deref(), Some("node-1"));
    assert_eq!(ep.target_ref.as_ref().unwrap().name.as_deref(), Some("p0"));
}

#[test]
fn named_ports_resolving_differently_split_slices() {
    let ps = vec![
        pod_full(0, true, 8080, false),
        pod_full(1, true, 9090, false),
        pod_full(2, true, 8080, false),
    ];
    let p = plan(&svc(), &ps, &[]);
    let mut got: Vec<(i32, usize)> = p
        .create
        .iter()
        .map(|s| {
            (
                s.ports.as_ref().unwrap()[0].port.unwrap(),
                endpoints_of(s).len(),
            )
        })
        .collect();
    got.sort_unstable();
    assert_eq!(got, [(8080, 2), (9090, 1)]);
}

#[test]
fn a_pod_without_the_named_port_gets_no_port() {
    let mut pod = (*pod_full(0, true, 8080, false)).clone();
    pod.spec.as_mut().unwrap().containers[0].ports = None;
    let p = plan(&svc(), &[Arc::new(pod)], &[]);
    assert_eq!(p.create[0].ports.as_deref(), Some(&[][..]));
    assert_eq!(endpoints_of(&p.create[0]).len(), 1);
}

#[test]
fn conditions_follow_pod_state() {
    let ps = vec![
        pod_full(0, true, 8080, false),
        pod_full(1, false, 8080, false),
        pod_full(2, true, 8080, true),
    ];
    let cond = |s: &Service| -> Vec<(bool, bool, bool)> {
        let p = plan(s, &ps, &[]);
        p.create[0]
            .endpoints
            .iter()
            .map(|e| {
                let c = e.conditions.as_ref().unwrap();
                (c.ready.unwrap(), c.serving.unwrap(), c.terminating.unwrap())
            })
            .collect()
    };
    assert_eq!(
        cond(&svc()),
        [
            (true, true, false),
            (false, false, false),
            (false, true, true)
        ],
        "ready / unready / terminating-but-serving"
    );
    assert_eq!(
        cond(&svc_with(
            json!({"spec": {"publishNotReadyAddresses": true}})
        )),
        [
            (true, true, false),
            (true, false, false),
            (true, true, true)
        ],
        "publishNotReadyAddresses makes every endpoint ready"
    );
}

#[test]
fn pods_without_ip_or_terminal_are_left_out() {
    let mut no_ip = (*pod_full(0, true, 8080, false)).clone();
    no_ip.status.as_mut().unwrap().pod_ip = None;
    let mut done = (*pod_full(1, true, 8080, false)).clone();
    done.status.as_mut().unwrap().phase = Some("Succeeded".into());
    let p = plan(
        &svc(),
        &[
            Arc::new(no_ip),
            Arc::new(done),
            pod_full(2, true, 8080, false),
        ],
        &[],
    );
    assert_eq!(sizes(&materialize(&p, &[])), [1]);
}

#[test]
fn churn_is_minimal() {
    let base = pods(250);
    let existing = materialize(&plan(&svc(), &base, &[]), &[]);

    let mut fewer = base.clone();
    fewer.remove(120);
    let p = plan(&svc(), &fewer, &existing);
    assert_eq!(
        counts(&p),
        (0, 1, 0),
        "removing one pod updates only its slice"
    );

    let mut more = fewer.clone();
    more.push(pod_full(1000, true, 8080, false));
    let after_removal = materialize(&p, &existing);
    let p = plan(&svc(), &more, &after_removal);
    assert_eq!(
        counts(&p),
        (0, 1, 0),
        "a new pod goes into a slice with room, no new slice"
    );

    let mut flipped = base.clone();
    flipped[5] = pod_full(5, false, 8080, false);
    let p = plan(&svc(), &flipped, &existing);
    assert_eq!(
        counts(&p),
        (0, 1, 0),
        "a readiness change updates one slice"
    );
    assert!(endpoints_of(&p.update[0])
        .iter()
        .any(|e| e.addresses[0] == "10.0.0.5"));

    let p = plan(&svc(), &pods(300), &existing);
    assert_eq!(
        counts(&p),
        (0, 1, 0),
        "50 new endpoints fit the half-full slice"
    );
    assert_eq!(sizes(&materialize(&p, &existing)), [100, 100, 100]);

    let p = plan(&svc(), &pods(301), &existing);
    assert_eq!(
        counts(&p),
        (1, 1, 0),
        "51 new endpoints: the half-full slice is filled first, one new slice"
    );
    assert_eq!(sizes(&materialize(&p, &existing)), [100, 100, 100, 1]);

    let mut grown = existing.clone();
    for n in [260, 275, 290, 305] {
        let p = plan(&svc(), &pods(n), &grown);
        assert_eq!(
            p.create.len(),
            usize::from(n > 300),
            "growing to {n}: new slices only when the others are full"
        );
        grown = materialize(&p, &grown);
    }
    assert_eq!(sizes(&grown), [100, 100, 100, 5]);
}

#[test]
fn emptying_a_service_keeps_one_placeholder() {
    let existing = materialize(&plan(&svc(), &pods(150), &[]), &[]);
    let p = plan(&svc(), &[], &existing);
    assert_eq!(counts(&p), (0, 1, 1));
    assert!(endpoints_of(&p.update[0]).is_empty());
    let after = materialize(&p, &existing);
    assert!(
        plan(&svc(), &[], &after).is_empty(),
        "the placeholder is stable"
    );
    let p = plan(&svc(), &pods(3), &after);
    assert_eq!(
        counts(&p),
        (0, 1, 0),
        "endpoints with ports go into the port-less placeholder, as upstream's finalize"
    );
    assert_eq!(p.update[0].name_any(), after[0].name_any());
    assert_eq!(endpoints_of(&p.update[0]).len(), 3);
}

#[test]
fn creations_take_over_deletions_of_the_same_address_type_and_owner() {
    // A port change: the old slice's ports are no longer wanted; the new slice reuses its name.
    let existing = materialize(&plan(&svc(), &pods(3), &[]), &[]);
    let renamed =
        svc_with(json!({"spec": {"ports": [{"name": "web", "port": 81, "targetPort": 8080}]}}));
    let p = plan(&renamed, &pods(3), &existing);
    assert_eq!(counts(&p), (0, 1, 0));
    assert_eq!(p.update[0].name_any(), existing[0].name_any());
    // A slice of an earlier Service of the same name (another uid) is deleted, not reused.
    let mut stale = (*existing[0]).clone();
    for o in stale.metadata.owner_references.iter_mut().flatten() {
        o.uid = "an-earlier-service".into();
    }
    let p = plan(&svc(), &pods(3), &[Arc::new(stale)]);
    assert_eq!(counts(&p), (1, 0, 1));
}

#[test]
fn no_selector_or_external_name_deletes_managed_slices_only() {
    let mut existing = materialize(&plan(&svc(), &pods(3), &[]), &[]);
    let mut foreign = (*existing[0]).clone();
    foreign.metadata.name = Some("someone-else".into());
    foreign
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(LABEL_MANAGED_BY.into(), "other".into());
    existing.push(Arc::new(foreign));
    let no_selector = svc_with(json!({"spec": {"selector": null}}));
    assert_eq!(counts(&plan(&no_selector, &pods(3), &existing)), (0, 0, 1));
    let external = svc_with(json!({"spec": {"type": "ExternalName"}}));
    assert_eq!(counts(&plan(&external, &pods(3), &existing)), (0, 0, 1));
}

#[test]
fn dual_stack_services_get_one_slice_per_family() {
    let s = svc_with(json!({"spec": {"ipFamilies": ["IPv4", "IPv6"]}}));
    let mut p6 = (*pod_full(0, true, 8080, false)).clone();
    p6.status.as_mut().unwrap().pod_ips = Some(vec![
        serde_json::from_value(json!({"ip": "10.0.0.0"})).unwrap(),
        serde_json::from_value(json!({"ip": "fd00::1"})).unwrap(),
    ]);
    let p = plan(&s, &[Arc::new(p6)], &[]);
    let mut types: Vec<&str> = p.create.iter().map(|s| s.address_type.as_str()).collect();
    types.sort_unstable();
    assert_eq!(types, ["IPv4", "IPv6"]);
}

fn zone_a(node: &str) -> NodeInfo {
    match node {
        "node-1" => NodeInfo::Known {
            zone: Some("zone-a".into()),
        },
        _ => NodeInfo::Missing,
    }
}

#[test]
fn endpoints_carry_the_zone_of_their_node() {
    let p = plan_with_nodes(&svc(), &pods(1), &[], &zone_a);
    assert_eq!(
        endpoints_of(&p.create[0])[0].zone.as_deref(),
        Some("zone-a")
    );
    let existing = materialize(&p, &[]);
    let moved = |_: &str| NodeInfo::Known {
        zone: Some("zone-b".into()),
    };
    assert_eq!(
        counts(&plan_with_nodes(&svc(), &pods(1), &existing, &moved)),
        (0, 1, 0),
        "a zone change updates the slice"
    );
}

#[test]
fn pods_on_missing_nodes_follow_what_is_known_of_nodes() {
    let on = |i: usize, node: Option<&str>| -> Arc<CachedPod> {
        let mut p = (*pod_full(i, i.is_multiple_of(2), 8080, false)).clone();
        p.spec.as_mut().unwrap().node_name = node.map(str::to_string);
        Arc::new(p)
    };
    // p0 on a known Node, p1 (not ready) and p2 on a Node that does not exist, p3 without a Node.
    let pods = [
        on(0, Some("node-1")),
        on(1, Some("node-gone")),
        on(2, Some("node-gone")),
        on(3, None),
    ];
    let publish = svc_with(json!({"spec": {"publishNotReadyAddresses": true}}));
    let unknown_node_zone = |n: &str| match n {
        "node-gone" => NodeInfo::Known { zone: None },
        other => zone_a(other),
    };
    let not_readable = |_: &str| NodeInfo::Unreadable;
    type Case<'a> = (
        &'a str,
        &'a Service,
        NodeOf<'a>,
        Vec<(&'a str, Option<&'a str>)>,
    );
    let cases: [Case<'_>; 4] = [
        (
            "Node cache synced: Pods on missing Nodes are left out, as upstream",
            &svc(),
            &zone_a,
            vec![("p0", Some("zone-a"))],
        ),
        (
            "publishNotReadyAddresses keeps them, without a zone",
            &publish,
            &zone_a,
            vec![
                ("p0", Some("zone-a")),
                ("p1", None),
                ("p2", None),
                ("p3", None),
            ],
        ),
        (
            "Nodes not readable: nothing is known, every Pod is kept without a zone",
            &svc(),
            &not_readable,
            vec![("p0", None), ("p1", None), ("p2", None), ("p3", None)],
        ),
        (
            "a Node without a zone label is not a missing Node",
            &svc(),
            &unknown_node_zone,
            vec![("p0", Some("zone-a")), ("p1", None), ("p2", None)],
        ),
    ];
    for (name, svc, node_of, want) in cases {
        let p = plan_with_nodes(svc, &pods, &[], node_of);
        let mut got: Vec<(String, Option<String>)> = p
            .create
            .iter()
            .flat_map(|s| endpoints_of(s).iter())
            .map(|e| {
                let pod = e.target_ref.as_ref().and_then(|r| r.name.clone());
                (pod.unwrap_or_default(), e.zone.clone())
            })
            .collect();
        got.sort();
        let want: Vec<(String, Option<String>)> = want
            .into_iter()
            .map(|(n, z)| (n.to_string(), z.map(str::to_string)))
            .collect();
        assert_eq!(got, want, "{name}");
    }
    // The only Pod's Node goes away: its endpoint leaves, the Service keeps an empty placeholder.
    let existing = materialize(&plan_with_nodes(&svc(), &pods[..1], &[], &zone_a), &[]);
    let gone = |_: &str| NodeInfo::Missing;
    let p = plan_with_nodes(&svc(), &pods[..1], &existing, &gone);
    let after = materialize(&p, &existing);
    assert_eq!(sizes(&after), [0], "placeholder only");
}

#[test]
fn named_ports_resolve_on_sidecars_after_containers() {
    let with_sidecar = |main: Option<serde_json::Value>| -> Arc<CachedPod> {
        let mut pod = (*pod_full(0, true, 8080, false)).clone();
        let spec = pod.spec.as_mut().unwrap();
        spec.containers[0].ports = main.map(|p| serde_json::from_value(p).unwrap());
        spec.init_containers = Some(vec![
            serde_json::from_value(json!({"name": "plain-init", "image": "x",
                "ports": [{"name": "http", "containerPort": 7000}]}))
            .unwrap(),
            serde_json::from_value(
                json!({"name": "sidecar", "image": "x", "restartPolicy": "Always",
                "ports": [{"name": "http", "containerPort": 8443}]}),
            )
            .unwrap(),
        ]);
        Arc::new(pod)
    };
    let port_of = |pod: Arc<CachedPod>| {
        let p = plan(&svc(), &[pod], &[]);
        p.create[0].ports.as_ref().unwrap()[0].port
    };
    assert_eq!(
        port_of(with_sidecar(None)),
        Some(8443),
        "a restartable init container's port; a plain init container's is not used"
    );
    assert_eq!(
        port_of(with_sidecar(Some(
            json!([{"name": "http", "containerPort": 9000}])
        ))),
        Some(9000),
        "containers come first"
    );
}

#[test]
fn traffic_distribution_gives_ready_endpoints_hints() {
    let zone_of = zone_a;
    let hints_of = |svc: &Service, ready: bool| {
        let p = plan_with_nodes(svc, &[pod_full(0, ready, 8080, false)], &[], &zone_of);
        endpoints_of(&p.create[0])[0].hints.clone()
    };
    let zones = |h: &Option<EndpointHints>| {
        h.as_ref()
            .and_then(|h| h.for_zones.clone())
            .map(|z| z.into_iter().map(|z| z.name).collect::<Vec<_>>())
    };
    let nodes = |h: &Option<EndpointHints>| {
        h.as_ref()
            .and_then(|h| h.for_nodes.clone())
            .map(|n| n.into_iter().map(|n| n.name).collect::<Vec<_>>())
    };
    assert_eq!(
        hints_of(&svc(), true),
        None,
        "no trafficDistribution: no hints"
    );
    for td in ["PreferClose", "PreferSameZone"] {
        let s = svc_with(json!({"spec": {"trafficDistribution": td}}));
        let h = hints_of(&s, true);
        assert_eq!(zones(&h), Some(vec!["zone-a".to_string()]), "{td}");
        assert_eq!(nodes(&h), None, "{td}");
        assert_eq!(
            hints_of(&s, false),
            None,
            "{td}: not-ready endpoints get none"
        );
    }
    let same_node = svc_with(json!({"spec": {"trafficDistribution": "PreferSameNode"}}));
    let h = hints_of(&same_node, true);
    assert_eq!(zones(&h), Some(vec!["zone-a".to_string()]));
    assert_eq!(nodes(&h), Some(vec!["node-1".to_string()]));
    let auto = svc_with(
        json!({"metadata": {"annotations": {"service.kubernetes.io/topology-mode": "Auto"}},
                               "spec": {"trafficDistribution": "PreferClose"}}),
    );
    assert_eq!(
        hints_of(&auto, true),
        None,
        "topology-mode Auto wins over trafficDistribution"
    );
    // No zone known: PreferClose has nothing to say.
    let close = svc_with(json!({"spec": {"trafficDistribution": "PreferClose"}}));
    let p = plan(&close, &[pod_full(0, true, 8080, false)], &[]);
    assert_eq!(endpoints_of(&p.create[0])[0].hints, None);
    // Switching trafficDistribution on updates the existing slice in place.
    let plain = plan_with_nodes(&svc(), &[pod_full(0, true, 8080, false)], &[], &zone_of);
    let existing = materialize(&plain, &[]);
    let again = plan_with_nodes(
        &close,
        &[pod_full(0, true, 8080, false)],
        &existing,
        &zone_of,
    );
    assert_eq!(counts(&again), (0, 1, 0));
}
