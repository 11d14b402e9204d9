use super::*;
use crate::model::Algorithm;

/// `kubectl get services,endpointslices -A -o yaml` of a small kind cluster (Kubernetes 1.34):
/// the `kubernetes` Service, a NodePort, an eTP=Local LoadBalancer with status, a headless and an
/// ExternalName Service, CoreDNS, and their EndpointSlices (hints, zones, nodeName, targetRef,
/// managedFields).
const KUBECTL_YAML: &str = include_str!("testdata/kubectl-list.yaml");
/// The same, `-o json`.
const KUBECTL_JSON: &str = include_str!("testdata/kubectl-list.json");

/// The Service of kubernetes.io's "Service" page: no clusterIP (the API server allocates one).
const DOCS_EXAMPLE: &str = "apiVersion: v1
kind: Service
metadata:
  name: my-service
spec:
  selector:
    app.kubernetes.io/name: MyApp
  ports:
    - protocol: TCP
      port: 80
      targetPort: 9376
";

fn names<
    T: k8s_openapi::Metadata<Ty = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>,
>(
    objects: &[T],
) -> Vec<String> {
    objects
        .iter()
        .map(|o| crate::convert::object_name(o.metadata()))
        .collect()
}

/// `namespace/name` of converted Services.
fn keys(entries: &[crate::convert::ServiceEntry]) -> Vec<String> {
    entries
        .iter()
        .map(|e| format!("{}/{}", e.key.0, e.key.1))
        .collect()
}

fn messages(p: &ParsedFile) -> Vec<String> {
    error_messages(&p.errors)
}

fn error_messages(errors: &[InvalidObject]) -> Vec<String> {
    errors.iter().map(|e| e.to_string()).collect()
}

#[test]
fn malformed_document_names_file_document_and_field_and_keeps_the_rest() {
    let text = "apiVersion: v1\nkind: Service\nmetadata: {name: good}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: bad, namespace: shop}\nspec: {clusterIP: 10.96.0.2, ports: [{port: eighty}]}\n";
    let p = parse_manifests(Path::new("/m/svc.yaml"), text);
    assert_eq!(p.services.len(), 1);
    assert_eq!(p.errors.len(), 1);
    let msg = p.errors[0].to_string();
    assert!(
        msg.starts_with("/m/svc.yaml: Service shop/bad: spec.ports[0].port: invalid type"),
        "{msg}"
    );
}

#[test]
fn yaml_syntax_error_names_the_line() {
    let p = parse_manifests(
        Path::new("/m/x.yaml"),
        "kind: Service\nmetadata: {name: [\n",
    );
    assert_eq!(p.errors.len(), 1);
    assert!(
        p.errors[0]
            .to_string()
            .starts_with("/m/x.yaml: document #0: line"),
        "{}",
        p.errors[0]
    );
}

#[test]
fn a_syntax_error_keeps_the_documents_before_it() {
    let text = "kind: Service\nmetadata: {name: a}\nspec: {clusterIP: 10.96.0.1}\n---\nkind: Service\nmetadata: {name: [\n";
    let p = parse_manifests(Path::new("/m/x.yaml"), text);
    assert_eq!(names(&p.services), ["default/a"]);
    assert_eq!(p.errors.len(), 1, "{:?}", messages(&p));
    assert_eq!(p.errors[0].object, "#1");
    assert_eq!(p.errors[0].field, "line 6", "{}", p.errors[0]);
}

#[test]
fn missing_kind_and_unusable_kinds_are_reported() {
    let p = parse_manifests(
        Path::new("/m/y.yaml"),
        "metadata: {name: a}\n---\nkind: ConfigMap\nmetadata: {name: b, namespace: shop}\n",
    );
    assert_eq!(messages(&p), [
        "/m/y.yaml: document default/a: kind: missing",
        "/m/y.yaml: ConfigMap shop/b: kind: the file source uses only Service, EndpointSlice and \
         Node objects (and Lists of them); a ConfigMap is not used",
    ]);
}

#[test]
fn a_document_that_is_not_a_mapping_is_reported() {
    let p = parse_manifests(Path::new("/m/s.yaml"), "just a string\n---\n- a\n- b\n");
    assert_eq!(messages(&p), [
        "/m/s.yaml: document #0: <document>: a Kubernetes object must be a mapping, not a string",
        "/m/s.yaml: document #1: <document>: a Kubernetes object must be a mapping, not a sequence",
    ]);
}

/// What the test cluster's dump must give, from YAML or JSON.
fn check_kubectl_dump(p: &ParsedFile) {
    assert!(p.errors.is_empty(), "{:#?}", messages(p));
    assert_eq!(
        names(&p.services),
        [
            "default/kubernetes",
            "shop/web",
            "shop/shop-lb",
            "shop/db",
            "shop/payments",
            "kube-system/kube-dns"
        ]
    );
    assert_eq!(
        names(&p.slices),
        [
            "default/kubernetes",
            "shop/web-x7k2p",
            "shop/db-4vnqz",
            "kube-system/kube-dns-9fhz4"
        ]
    );
    let lb = &p.services[2];
    let spec = lb.spec.as_ref().unwrap();
    assert_eq!(spec.health_check_node_port, Some(31456));
    let ingress = lb
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref())
        .unwrap();
    assert_eq!(ingress[0].ip.as_deref(), Some("172.18.255.200"));
    let web = &p.slices[1].endpoints;
    assert_eq!(web[0].zone.as_deref(), Some("zone-a"));
    assert_eq!(web[0].node_name.as_deref(), Some("kpr-worker"));
    assert_eq!(web[1].conditions.as_ref().unwrap().terminating, Some(true));

    // What the tracker makes of them: the headless and ExternalName Services are not proxied (as
    // kube-proxy), and that is not a problem; the others are.
    let mut tracker = crate::tracker::Tracker::new(
        crate::model::Algorithm::RoundRobin,
        crate::selection::NodeContext::default(),
    );
    tracker.replace_all(&p.services, &p.slices);
    tracker.take_changes();
    assert_eq!(
        tracker.errors().count(),
        0,
        "{:?}",
        tracker.errors().collect::<Vec<_>>()
    );
    let mut ports: Vec<String> = tracker.state().names().map(|k| k.to_string()).collect();
    ports.sort();
    assert_eq!(
        ports,
        [
            "default/kubernetes:https/TCP",
            "kube-system/kube-dns:dns-tcp/TCP",
            "kube-system/kube-dns:dns/UDP",
            "kube-system/kube-dns:metrics/TCP",
            "shop/shop-lb:https/TCP",
            "shop/web:http/TCP",
        ]
    );
}

#[test]
fn a_kubectl_yaml_list_is_served_item_by_item() {
    check_kubectl_dump(&parse_manifests(Path::new("/m/dump.yaml"), KUBECTL_YAML));
}

#[test]
fn a_kubectl_json_list_is_served_item_by_item() {
    check_kubectl_dump(&parse_manifests(Path::new("/m/dump.json"), KUBECTL_JSON));
}

#[test]
fn list_items_are_served_exactly_as_separate_documents() {
    let list = parse_manifests(Path::new("/m/dump.yaml"), KUBECTL_YAML);
    let value: Value = serde_json::from_str(KUBECTL_JSON).unwrap();
    // One JSON document per item, one after the other (a JSON stream), and as YAML documents.
    let items = value["items"].as_array().unwrap();
    let stream: String = items.iter().map(|i| format!("{i}\n")).collect();
    let docs: String = items.iter().map(|i| format!("---\n{i}\n")).collect();
    for (name, text) in [("/m/each.json", stream), ("/m/each.yaml", docs)] {
        let separate = parse_manifests(Path::new(name), &text);
        assert!(separate.errors.is_empty(), "{:?}", messages(&separate));
        assert_eq!(separate.services, list.services, "{name}");
        assert_eq!(separate.slices, list.slices, "{name}");
    }
}

#[test]
fn typed_lists_give_their_items_a_kind_before_or_after_the_items() {
    // As the API server returns a ServiceList (items without kind, `kind` first)...
    let json = r#"{"kind":"ServiceList","apiVersion":"v1","metadata":{"resourceVersion":"4123"},
        "items":[{"metadata":{"name":"a","namespace":"x"},"spec":{"clusterIP":"10.96.0.7"}}]}"#;
    let p = parse_manifests(Path::new("/m/l.json"), json);
    assert!(p.errors.is_empty(), "{:?}", messages(&p));
    assert_eq!(names(&p.services), ["x/a"]);
    // ...and as YAML with sorted keys (`items` before `kind`).
    let yaml = "apiVersion: discovery.k8s.io/v1\nitems:\n- addressType: IPv4\n  endpoints: []\n  \
                metadata: {name: a-1, namespace: x, labels: {kubernetes.io/service-name: a}}\n\
                kind: EndpointSliceList\nmetadata: {resourceVersion: \"9\"}\n";
    let p = parse_manifests(Path::new("/m/l.yaml"), yaml);
    assert!(p.errors.is_empty(), "{:?}", messages(&p));
    assert_eq!(names(&p.slices), ["x/a-1"]);
}

#[test]
fn list_items_the_source_cannot_use_are_reported_and_the_rest_is_served() {
    let text = "apiVersion: v1
items:
- apiVersion: v1
  kind: Service
  metadata: {name: a, namespace: x}
  spec: {clusterIP: 10.96.0.7, ports: [{port: 80}]}
- apiVersion: v1
  kind: Pod
  metadata: {name: web-0, namespace: x}
  spec: {containers: [{name: c, image: nginx}]}
- metadata: {name: kindless, namespace: x}
- just a string
- apiVersion: v1
  kind: Service
  metadata: {name: bad, namespace: x}
  spec: {clusterIP: 10.96.0.8, ports: [{port: eighty}]}
- kind: List
  items: []
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: a-1, namespace: x, labels: {kubernetes.io/service-name: a}}
  addressType: IPv4
  endpoints: [{addresses: [10.244.1.2]}]
kind: List
metadata:
  resourceVersion: \"\"
";
    let p = parse_manifests(Path::new("/m/dump.yaml"), text);
    assert_eq!(names(&p.services), ["x/a"]);
    assert_eq!(names(&p.slices), ["x/a-1"]);
    let msgs = messages(&p);
    assert_eq!(msgs.len(), 5, "{msgs:#?}");
    assert_eq!(
        msgs[0],
        "/m/dump.yaml: Pod x/web-0: items[1].kind: the file source uses only Service, \
         EndpointSlice and Node objects (and Lists of them); a Pod is not used"
    );
    // In item order, although the kind-less item could only be looked at after the List's kind.
    assert_eq!(
        msgs[1],
        "/m/dump.yaml: document x/kindless: items[2].kind: missing"
    );
    assert_eq!(
        msgs[2],
        "/m/dump.yaml: document #0: items[3]: a List item must be an object, not a string"
    );
    assert!(
        msgs[3]
            .starts_with("/m/dump.yaml: Service x/bad: items[4].spec.ports[0].port: invalid type"),
        "{}",
        msgs[3]
    );
    assert!(
        msgs[4].starts_with("/m/dump.yaml: List #0: items[5].kind: "),
        "{}",
        msgs[4]
    );
}

#[test]
fn a_service_without_cluster_ip_is_reported_not_dropped_in_silence() {
    let p = parse_manifests(Path::new("/m/docs.yaml"), DOCS_EXAMPLE);
    assert_eq!(names(&p.services), ["default/my-service"]);
    let msgs = messages(&p);
    assert_eq!(msgs.len(), 1, "{msgs:?}");
    assert!(
        msgs[0].starts_with(
            "/m/docs.yaml: Service default/my-service: spec.clusterIP: missing: the file source \
             has no IP allocator"
        ),
        "{}",
        msgs[0]
    );
    // Inside a List the field says which item.
    let list = format!(
        "{{\"apiVersion\": \"v1\", \"kind\": \"List\", \"items\": [{}]}}",
        serde_json::to_string(&serde_saphyr::from_str::<Value>(DOCS_EXAMPLE).unwrap()).unwrap()
    );
    let p = parse_manifests(Path::new("/m/docs.json"), &list);
    assert_eq!(p.errors.len(), 1);
    assert_eq!(p.errors[0].field, "items[0].spec.clusterIP");
    // Headless and ExternalName Services are not programmed by design: no problem there.
    let p = parse_manifests(
        Path::new("/m/ok.yaml"),
        "kind: Service\nmetadata: {name: h}\nspec: {clusterIP: None}\n---\n\
         kind: Service\nmetadata: {name: e}\nspec: {type: ExternalName, externalName: x.example}\n",
    );
    assert!(p.errors.is_empty(), "{:?}", messages(&p));
    assert_eq!(p.services.len(), 2);
}

#[test]
fn yaml_scalars_are_read_as_yaml_1_2() {
    // `yes` is a string in YAML 1.2 (a label value), `010` too (a name written with a leading zero).
    let p = parse_manifests(
        Path::new("/m/s.yaml"),
        "kind: Service\nmetadata: {name: s, labels: {a: yes, b: 010}}\nspec: {clusterIP: 10.96.0.1}\n",
    );
    assert!(p.errors.is_empty(), "{:?}", messages(&p));
    let labels = p.services[0].metadata.labels.as_ref().unwrap();
    assert_eq!(labels["a"], "yes");
    assert_eq!(labels["b"], "010");
}

#[test]
fn duplicate_keys_are_reported() {
    let p = parse_manifests(
        Path::new("/m/d.yaml"),
        "kind: Service\nkind: Service\nmetadata: {name: s}\n",
    );
    assert_eq!(p.errors.len(), 1, "{:?}", messages(&p));
    let p = parse_manifests(
        Path::new("/m/d.json"),
        r#"{"kind": "List", "items": [], "items": []}"#,
    );
    assert_eq!(p.errors.len(), 1, "{:?}", messages(&p));
    assert!(
        p.errors[0].message.contains("duplicate field `items`"),
        "{}",
        p.errors[0]
    );
}

/// `n` bytes of `[`, as the value of a Service's metadata.
fn nested_brackets(n: usize) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {}\n",
        "[".repeat(n)
    )
}

#[test]
fn deeply_nested_brackets_are_rejected_by_the_depth_limit() {
    for size in [200 << 10, 1 << 20] {
        let p = parse_manifests(Path::new("/m/deep.yaml"), &nested_brackets(size));
        assert!(p.services.is_empty());
        assert_eq!(p.errors.len(), 1, "{size}: {:?}", messages(&p));
        let e = &p.errors[0];
        assert_eq!(e.file.as_deref(), Some(Path::new("/m/deep.yaml")));
        assert_eq!(e.field, "line 3", "{e}");
        assert!(
            e.message.contains("recursion limit exceeded"),
            "{size}: {e}"
        );
        assert!(e.message.contains(&limits_hint()), "{size}: {e}");
        let json = format!(
            "{{\"kind\": \"Service\", \"metadata\": {}",
            "[".repeat(size)
        );
        let p = parse_manifests(Path::new("/m/deep.json"), &json);
        assert_eq!(p.errors.len(), 1, "{size}: {:?}", messages(&p));
        assert!(
            p.errors[0].message.contains("recursion limit exceeded"),
            "{}",
            p.errors[0]
        );
    }
    // Block nesting (indentation) is bounded the same way.
    let block: String = (0..200).map(|i| format!("{}a:\n", " ".repeat(i))).collect();
    let p = parse_manifests(Path::new("/m/block.yaml"), &block);
    assert_eq!(p.errors.len(), 1, "{:?}", messages(&p));
    assert!(p.errors[0].message.contains("Depth"), "{}", p.errors[0]);
    assert!(
        p.errors[0].message.contains(&limits_hint()),
        "{}",
        p.errors[0]
    );
}

#[test]
fn nesting_up_to_the_limit_is_accepted() {
    // An annotation value does not count, but managedFields does: 60 levels there still parse.
    let deep = format!(
        "kind: Service\nmetadata:\n  name: s\n  managedFields:\n  - fieldsV1: {}{}\n\
         spec: {{clusterIP: 10.96.0.1}}\n",
        "{a: ".repeat(58),
        "}".repeat(58)
    );
    let p = parse_manifests(Path::new("/m/deep.yaml"), &deep);
    assert!(p.errors.is_empty(), "{:?}", messages(&p));
    assert_eq!(p.services.len(), 1);
}

#[test]
fn the_billion_laughs_are_rejected() {
    let mut text = String::from("a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    for i in 1..10 {
        let refs = vec![format!("*a{}", i - 1); 10].join(", ");
        text.push_str(&format!("a{i}: &a{i} [{refs}]\n"));
    }
    text.push_str("kind: Service\nmetadata: {name: lol}\nspec: {clusterIP: 10.96.0.1}\n");
    let p = parse_manifests(Path::new("/m/lol.yaml"), &text);
    assert!(p.services.is_empty());
    assert_eq!(p.errors.len(), 1, "{:?}", messages(&p));
    let e = &p.errors[0];
    assert_eq!(e.file.as_deref(), Some(Path::new("/m/lol.yaml")));
    assert!(e.message.contains("alias replay limit exceeded"), "{e}");
    assert!(e.message.contains(&limits_hint()), "{e}");
}

#[test]
fn a_few_aliases_are_fine_but_not_thousands_of_anchors() {
    let text = "kind: Service\nmetadata: {name: s, labels: &l {app: web}, annotations: *l}\n\
                spec: {clusterIP: 10.96.0.1, selector: *l}\n";
    let p = parse_manifests(Path::new("/m/a.yaml"), text);
    assert!(p.errors.is_empty(), "{:?}", messages(&p));
    assert_eq!(
        p.services[0]
            .spec
            .as_ref()
            .unwrap()
            .selector
            .as_ref()
            .unwrap()["app"],
        "web"
    );
    let many: String = (0..=MAX_ALIASES)
        .map(|i| format!("a{i}: &x{i} b\n"))
        .collect();
    let p = parse_manifests(Path::new("/m/a.yaml"), &many);
    assert_eq!(p.errors.len(), 1, "{:?}", messages(&p));
    assert!(p.errors[0].message.contains("Anchors"), "{}", p.errors[0]);
}

/// A scratch directory removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("kpr-file-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const ONE_SERVICE: &str = "kind: Service\nmetadata: {name: a}\nspec: {clusterIP: 10.96.0.1}\n";

#[test]
fn entries_that_are_not_files_are_reported() {
    let dir = Scratch::new("entries");
    dir.write("a.yaml", ONE_SERVICE);
    std::fs::create_dir(dir.0.join("sub.yaml")).unwrap();
    std::os::unix::fs::symlink(dir.0.join("gone.yaml"), dir.0.join("dangling.yml")).unwrap();
    nix::unistd::mkfifo(&dir.0.join("pipe.json"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    std::os::unix::fs::symlink(dir.0.join("a.yaml"), dir.0.join("link.yaml")).unwrap();
    dir.write("notes.txt", "not a manifest");
    let p = ManifestDir::new(&dir.0, Algorithm::RoundRobin).load();
    // The symbolic link to a.yaml is a file like any other.
    assert_eq!(keys(&p.services), ["default/a", "default/a"]);
    let mut msgs: Vec<String> = p
        .errors
        .iter()
        .map(|e| format!("{} {} {}: {}", e.kind, e.object, e.field, e.message))
        .collect();
    msgs.sort();
    assert_eq!(msgs.len(), 3, "{msgs:#?}");
    assert!(
        msgs[0].starts_with("file dangling.yml type: a symbolic link to ")
            && msgs[0].ends_with("gone.yaml, which does not exist"),
        "{}",
        msgs[0]
    );
    assert_eq!(msgs[1], "file pipe.json type: not a regular file");
    assert!(
        msgs[2].starts_with("file sub.yaml type: a directory"),
        "{}",
        msgs[2]
    );
    assert_eq!(
        p.errors[0].file.as_deref(),
        Some(dir.0.join("dangling.yml").as_path())
    );
}

#[test]
fn a_file_over_the_size_limit_is_reported_unread_and_the_others_are_served() {
    let dir = Scratch::new("size");
    dir.write("a.yaml", ONE_SERVICE);
    // Sparse: nothing of it is ever read.
    let big = std::fs::File::create(dir.0.join("big.yaml")).unwrap();
    big.set_len(MAX_FILE_BYTES + 1).unwrap();
    let p = ManifestDir::new(&dir.0, Algorithm::RoundRobin).load();
    assert_eq!(keys(&p.services), ["default/a"]);
    assert_eq!(
        error_messages(&p.errors),
        [format!(
            "{}: file big.yaml: size: {} bytes, over the file source's limit of {MAX_FILE_BYTES} \
             bytes: not read (split it into several files)",
            dir.0.join("big.yaml").display(),
            MAX_FILE_BYTES + 1
        )]
    );
}

#[test]
fn a_hostile_file_is_reported_and_the_others_are_served() {
    let dir = Scratch::new("hostile");
    dir.write("a.yaml", ONE_SERVICE);
    dir.write("deep.yaml", &nested_brackets(1 << 20));
    dir.write("bin.yaml", "kind: Service\n\u{0}\u{1}");
    std::fs::write(
        dir.0.join("latin1.yaml"),
        b"kind: Service\nmetadata: {name: caf\xe9}\n",
    )
    .unwrap();
    let p = ManifestDir::new(&dir.0, Algorithm::RoundRobin).load();
    assert_eq!(keys(&p.services), ["default/a"]);
    let msgs = error_messages(&p.errors);
    assert_eq!(msgs.len(), 3, "{msgs:#?}");
    assert!(
        msgs.iter().any(|m| m.contains("bin.yaml: document #0")),
        "{msgs:#?}"
    );
    assert!(
        msgs.iter()
            .any(|m| m.contains("deep.yaml: document #0: line 3")),
        "{msgs:#?}"
    );
    assert!(
        msgs.iter().any(|m| m.contains(
            "latin1.yaml: file latin1.yaml: encoding: not UTF-8 (invalid byte at offset 34)"
        )),
        "{msgs:#?}"
    );
}

#[test]
fn files_are_reread_only_when_they_change() {
    let dir = Scratch::new("reread");
    let path = dir.write("a.yaml", ONE_SERVICE);
    let mut manifests = ManifestDir::new(&dir.0, Algorithm::RoundRobin);
    assert_eq!(keys(&manifests.load().services), ["default/a"]);
    // Same size and modification time: the cached parse is used.
    let meta = std::fs::metadata(&path).unwrap();
    std::fs::write(&path, ONE_SERVICE.replace("name: a", "name: b")).unwrap();
    let times = std::fs::FileTimes::new().set_modified(meta.modified().unwrap());
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_times(times)
        .unwrap();
    assert_eq!(keys(&manifests.load().services), ["default/a"]);
    // A change of size is seen.
    std::fs::write(&path, ONE_SERVICE.replace("name: a", "name: abc")).unwrap();
    assert_eq!(keys(&manifests.load().services), ["default/abc"]);
    std::fs::remove_file(&path).unwrap();
    assert!(manifests.load().services.is_empty());
}

#[test]
fn an_unchanged_directory_sends_no_listing() {
    let dir = Scratch::new("unchanged");
    let path = dir.write("a.yaml", ONE_SERVICE);
    dir.write("b.txt", "not a manifest");
    std::fs::create_dir(dir.0.join("sub.yaml")).unwrap();
    let mut manifests = ManifestDir::new(&dir.0, Algorithm::RoundRobin);
    let first = manifests
        .load_changed()
        .expect("the first load is a listing");
    assert_eq!(keys(&first.services), ["default/a"]);
    assert_eq!(first.errors.len(), 1, "{:?}", first.errors);
    assert_eq!(manifests.load_changed(), None, "nothing changed");
    // A problem going away is a change, as is a file changing.
    std::fs::remove_dir(dir.0.join("sub.yaml")).unwrap();
    let fixed = manifests.load_changed().expect("a problem went away");
    assert!(fixed.errors.is_empty());
    assert_eq!(manifests.load_changed(), None);
    std::fs::write(&path, ONE_SERVICE.replace("name: a", "name: abc")).unwrap();
    let changed = manifests.load_changed().expect("a file changed");
    assert_eq!(keys(&changed.services), ["default/abc"]);
    // `load` always answers with the whole listing.
    assert_eq!(manifests.load(), changed);
}

#[test]
fn node_manifests_give_their_zone_and_are_checked() {
    let text = "apiVersion: v1
kind: NodeList
items:
  - metadata:
      name: node-a
      labels:
        topology.kubernetes.io/zone: zone-a
  - metadata:
      name: node-b
---
apiVersion: v1
kind: Node
metadata:
  labels:
    topology.kubernetes.io/zone: zone-c
";
    let parsed = parse_manifests(Path::new("nodes.yaml"), text);
    assert_eq!(
        parsed.nodes,
        [
            NodeEntry {
                name: "node-a".into(),
                zone: Some("zone-a".into())
            },
            NodeEntry {
                name: "node-b".into(),
                zone: None
            },
        ]
    );
    assert_eq!(parsed.errors.len(), 1, "{:?}", parsed.errors);
    let e = &parsed.errors[0];
    assert_eq!((e.kind.as_str(), e.object.as_str()), ("Node", "#1"));
    assert_eq!(e.field, "metadata.name");
    let listing = Listing::convert(parsed, Algorithm::RoundRobin);
    assert_eq!(listing.zone_of("node-a").as_deref(), Some("zone-a"));
    assert_eq!(listing.zone_of("node-b"), None, "unlabelled");
    assert_eq!(listing.zone_of("node-x"), None, "no manifest");
}
