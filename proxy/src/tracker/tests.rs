//! Change tracking: what a sync is told, and that it is told only what changed.

use super::*;

fn node() -> NodeContext {
    NodeContext {
        node_name: "node-a".into(),
        ..NodeContext::default()
    }
}

fn service(name: &str, ip: &str, ports: &str) -> Service {
    serde_saphyr::from_str(&format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  clusterIP: {ip}\n  ports: {ports}\n"
    ))
    .unwrap()
}

fn slice(name: &str, svc: &str, addrs: &[&str]) -> EndpointSlice {
    let eps: Vec<String> = addrs
        .iter()
        .map(|a| format!("{{addresses: [{a}]}}"))
        .collect();
    serde_saphyr::from_str(&format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}, namespace: default, labels: {{kubernetes.io/service-name: {svc}}}}}\naddressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints: [{}]\n",
        eps.join(", ")
    ))
    .unwrap()
}

fn names(c: &ChangeSet) -> Vec<String> {
    names_of(&c.changed)
}

fn names_of(set: &BTreeSet<ServicePortName>) -> Vec<String> {
    set.iter().map(|n| n.to_string()).collect()
}

#[test]
fn first_sync_is_full_then_only_touched_services() {
    let mut t = Tracker::new(Algorithm::RoundRobin, node());
    t.apply_service(&service("a", "10.96.0.1", "[{name: http, port: 80}]"));
    t.apply_service(&service("b", "10.96.0.2", "[{name: http, port: 80}]"));
    t.apply_slice(&slice("a-1", "a", &["10.244.1.2"]));
    let c = t.take_changes();
    assert!(c.full);
    assert_eq!(names(&c), vec!["default/a:http/TCP", "default/b:http/TCP"]);
    assert!(
        c.became_reachable.is_empty(),
        "TCP ports keep no conntrack state to clean"
    );
    assert_eq!(
        t.state()
            .get(c.changed.iter().next().unwrap())
            .unwrap()
            .endpoints[0]
            .port,
        8080
    );

    t.apply_slice(&slice("a-1", "a", &["10.244.1.2", "10.244.2.2"]));
    let c = t.take_changes();
    assert!(!c.full);
    assert_eq!(names(&c), vec!["default/a:http/TCP"]);
    assert!(c.removed_endpoints.is_empty());

    t.apply_slice(&slice("a-1", "a", &["10.244.1.2", "10.244.2.2"]));
    assert!(
        t.take_changes().is_empty(),
        "re-applying the same slice changes nothing"
    );
}

#[test]
fn removed_endpoints_and_deleted_services_are_reported() {
    let mut t = Tracker::new(Algorithm::RoundRobin, node());
    t.apply_service(&service(
        "a",
        "10.96.0.1",
        "[{name: http, port: 80, protocol: UDP}]",
    ));
    let mut s = slice("a-1", "a", &["10.244.1.2", "10.244.2.2"]);
    s.ports.as_mut().unwrap()[0].protocol = Some("UDP".into());
    t.apply_slice(&s);
    t.take_changes();
    s.endpoints.truncate(1);
    t.apply_slice(&s);
    let c = t.take_changes();
    let gone: Vec<String> = c
        .removed_endpoints
        .values()
        .flatten()
        .map(|e| e.socket_addr().to_string())
        .collect();
    assert_eq!(gone, vec!["10.244.2.2:8080"]);

    t.delete_service("default", "a");
    let c = t.take_changes();
    assert_eq!(names(&c), vec!["default/a:http/UDP"]);
    assert!(t.state().is_empty());
    assert_eq!(c.removed_endpoints.values().flatten().count(), 1);
}

#[test]
fn zero_to_some_endpoints_is_flagged() {
    let mut t = Tracker::new(Algorithm::RoundRobin, node());
    t.apply_service(&service(
        "a",
        "10.96.0.1",
        "[{name: http, port: 80, protocol: UDP}]",
    ));
    assert!(t.take_changes().became_reachable.is_empty());
    let mut s = slice("a-1", "a", &["10.244.1.2"]);
    s.ports.as_mut().unwrap()[0].protocol = Some("UDP".into());
    t.apply_slice(&s);
    assert_eq!(
        names_of(&t.take_changes().became_reachable),
        vec!["default/a:http/UDP"]
    );
}

#[test]
fn a_tcp_port_that_becomes_reachable_is_not_flagged() {
    // Its conntrack entries are not cleaned, so nobody needs its name.
    let mut t = Tracker::new(Algorithm::RoundRobin, node());
    t.apply_service(&service("a", "10.96.0.1", "[{name: http, port: 80}]"));
    t.take_changes();
    t.apply_slice(&slice("a-1", "a", &["10.244.1.2"]));
    let c = t.take_changes();
    assert_eq!(names(&c), vec!["default/a:http/TCP"]);
    assert!(c.became_reachable.is_empty());
}

#[test]
fn replace_all_deletes_what_the_listing_lacks() {
    let mut t = Tracker::new(Algorithm::RoundRobin, node());
    t.apply_service(&service("a", "10.96.0.1", "[{name: http, port: 80}]"));
    t.apply_service(&service("b", "10.96.0.2", "[{name: http, port: 80}]"));
    t.apply_slice(&slice("a-1", "a", &["10.244.1.2"]));
    t.take_changes();
    t.replace_all(
        &[service("b", "10.96.0.2", "[{name: http, port: 80}]")],
        &[],
    );
    let c = t.take_changes();
    assert_eq!(
        names(&c),
        vec!["default/a:http/TCP"],
        "b unchanged, a deleted"
    );
    assert_eq!(t.state().len(), 1);
}

#[test]
fn a_service_with_one_slice_of_one_port_programs_the_slices_own_list() {
    let mut t = Tracker::new(Algorithm::RoundRobin, node());
    t.apply_service(&service("a", "10.96.0.1", "[{name: http, port: 80}]"));
    // Listed out of order and with a duplicate: the slice keeps the merged, sorted list.
    t.apply_slice(&slice(
        "a-1",
        "a",
        &["10.244.2.2", "10.244.1.2", "10.244.2.2"],
    ));
    t.take_changes();
    let port = t.state().iter().next().unwrap().1;
    let listed = &t.slices[&("default".into(), "a-1".into())];
    assert!(
        Arc::ptr_eq(&port.endpoints, &listed.endpoints),
        "one list, not a copy per holder"
    );
    assert!(Arc::ptr_eq(&port.selected.cluster, &port.endpoints));
    assert!(Arc::ptr_eq(&port.selected.external, &port.endpoints));
    let addrs: Vec<String> = port
        .endpoints
        .iter()
        .map(|e| e.socket_addr().to_string())
        .collect();
    assert_eq!(addrs, ["10.244.1.2:8080", "10.244.2.2:8080"]);

    // A second slice: the port's list is merged from both, the first slice's list untouched.
    t.apply_slice(&slice("a-2", "a", &["10.244.3.2"]));
    t.take_changes();
    let port = t.state().iter().next().unwrap().1;
    assert_eq!(port.endpoints.len(), 3);
    assert_eq!(
        t.slices[&("default".into(), "a-1".into())].endpoints.len(),
        2
    );
}

#[test]
fn a_slice_of_another_family_or_port_gives_the_port_no_endpoints() {
    let mut t = Tracker::new(Algorithm::RoundRobin, node());
    t.apply_service(&service("a", "fd00::1", "[{name: http, port: 80}]"));
    t.apply_service(&service("b", "10.96.0.2", "[{name: web, port: 80}]"));
    t.apply_slice(&slice("a-1", "a", &["10.244.1.2"]));
    t.apply_slice(&slice("b-1", "b", &["10.244.1.2"]));
    t.take_changes();
    for (name, port) in t.state().iter() {
        assert!(port.endpoints.is_empty(), "{name}: {:?}", port.endpoints);
    }
}

#[test]
fn slices_of_one_service_merge_and_deduplicate() {
    let mut t = Tracker::new(Algorithm::RoundRobin, node());
    t.apply_service(&service("a", "10.96.0.1", "[{name: http, port: 80}]"));
    t.apply_slice(&slice("a-1", "a", &["10.244.1.2", "10.244.2.2"]));
    t.apply_slice(&slice("a-2", "a", &["10.244.2.2", "10.244.3.2"]));
    t.take_changes();
    let eps = &t.state().iter().next().unwrap().1.endpoints;
    assert_eq!(eps.len(), 3);
    t.delete_slice("default", "a-2");
    t.take_changes();
    assert_eq!(t.state().iter().next().unwrap().1.endpoints.len(), 2);
}

#[test]
fn slice_names_stay_sorted_and_inline_when_one() {
    let name = |s: &str| -> Arc<str> { s.into() };
    let mut names = SliceNames::default();
    names.insert(&name("a-2"));
    assert!(matches!(names, SliceNames::One(_)));
    names.insert(&name("a-1"));
    names.insert(&name("a-3"));
    names.insert(&name("a-1"));
    let listed: Vec<&str> = names.as_slice().iter().map(|n| &**n).collect();
    assert_eq!(listed, ["a-1", "a-2", "a-3"]);
    assert!(!names.remove("a-2"));
    assert!(!names.remove("a-9"), "an unknown name removes nothing");
    assert!(!names.remove("a-1"));
    assert!(matches!(&names, SliceNames::One(n) if &**n == "a-3"));
    assert!(names.remove("a-3"), "the last name leaves none");
    assert!(names.as_slice().is_empty());
}
