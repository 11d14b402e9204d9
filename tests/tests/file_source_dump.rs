//! A dump of the real API server given to the file source programs what the kube source programs
//! from that server. A private reference control plane (etcd and kube-apiserver, nothing else) is
//! filled through kubectl with a realistic mix of Services and EndpointSlices (written directly:
//! no controller runs), then the `proxy` agent (userspace backend, the same flags every time) runs
//! in a node network namespace three times, one after the other:
//!
//! 1. `--source kube`, through a relay bound inside the node namespace: the reference;
//! 2. `--source file:DIR` with `kubectl get services,endpointslices -A -o yaml` in DIR;
//! 3. `--source file:DIR` with the same dump as `-o json`.
//!
//! `proxy inspect --json` (the agent's `/state`) and `proxy inspect` must be the same for all
//! three, but for the last sync's time and counts (see [`programmed`]), and the LoadBalancer's
//! healthCheckNodePort (which inspect does not show) must answer alike. Before any agent runs,
//! the objects the file source parses from each dump must equal those the API lists (but for
//! `managedFields`, see [`by_name`]), which covers fields inspect does not show (zones, hints,
//! source ranges, labels and annotations). Then a second file goes into each file source's directory: what `kubectl get` prints for
//! a Pod and a ConfigMap of the same server (a List of kinds the file source cannot use) with
//! kubernetes.io's example Service (no clusterIP) added as its first item. `proxy inspect` must
//! list exactly those three items under "input problems", naming the file, the object and the
//! field, while every programmed Service stays identical to the kube source's.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

use controlplane::{ControlPlane, Options, Relay};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kpr_tests::agent::{proxy_binary, HEALTHZ_ADDR, METRICS_ADDR};
use kpr_tests::cluster::{ClusterSpec, CLUSTER_CIDR, NODE_IP, NODE_NAME, SERVICE_CIDR};
use kpr_tests::{http_get, Cluster, Netns};
use kube::api::{Api, ListParams};
use proxy::source::file::parse_manifests;
use serde_json::{json, Value};

/// How long an agent may take to become healthy or to pick up a changed directory. A bound on
/// waiting only: nothing asserts how fast it was.
const WAIT: Duration = Duration::from_secs(60);

/// One `proxy run` in the node namespace; killed on drop, its log printed when the test failed.
struct AgentProcess<'n> {
    label: String,
    node: &'n Netns,
    child: Child,
    log: PathBuf,
}

impl<'n> AgentProcess<'n> {
    /// Starts `proxy run` with `source` (and `extra` flags, e.g. `--kubeconfig`). Every other
    /// flag is the same for every source, as `kpr_tests::Agent` passes them.
    fn start(node: &'n Netns, label: &str, dir: &Path, source: &str, extra: &[&str]) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let log = dir.join(format!("agent-{label}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let nodeport = format!("{NODE_IP}/32");
        let mut cmd = node.exec(proxy_binary().unwrap()).unwrap();
        cmd.args(["run", "--backend", "userspace", "--source", source])
            .args(["--balance", "round-robin", "--hostname-override", NODE_NAME])
            .args(["--cluster-cidr", CLUSTER_CIDR])
            .args(["--service-cluster-ip-range", SERVICE_CIDR])
            .args(["--nodeport-addresses", &nodeport])
            .args(["--min-sync-period", "100ms", "--sync-period", "30s"])
            .args(["--udp-idle-timeout", "60s"])
            .args(["--metrics-bind-address", METRICS_ADDR])
            .args(["--healthz-bind-address", "0.0.0.0:10256"])
            .args(extra)
            .env("NO_COLOR", "1")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out);
        let agent = AgentProcess {
            label: label.into(),
            node,
            child: cmd.spawn().unwrap(),
            log,
        };
        agent.wait_healthy();
        agent
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn check_running(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!(
                "the {} agent exited ({status}); its log:\n{}",
                self.label,
                self.log()
            );
        }
    }

    /// Waits for `/healthz` 200: the first sync, of the source's whole initial listing, is done.
    fn wait_healthy(&self) {
        let addr: SocketAddr = HEALTHZ_ADDR.parse().unwrap();
        let deadline = Instant::now() + WAIT;
        loop {
            let last = match http_get(self.node, addr, "/healthz", Duration::from_secs(2)) {
                Ok((200, _)) => return,
                Ok((code, body)) => format!("{code} {body}"),
                Err(e) => e.to_string(),
            };
            assert!(
                Instant::now() < deadline,
                "the {} agent: /healthz not 200 after {WAIT:?} (last: {last}); its log:\n{}",
                self.label,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// What the agent's healthCheckNodePort server answers on `port` (status, body).
    fn health_check(&self, port: u16) -> (u16, String) {
        let addr = SocketAddr::from((NODE_IP, port));
        http_get(self.node, addr, "/healthz", Duration::from_secs(2))
            .unwrap_or_else(|e| panic!("{} agent: GET {addr}/healthz: {e}", self.label))
    }

    /// `proxy inspect ARGS` run in the node namespace, as an operator would.
    fn inspect_output(&self, args: &[&str]) -> String {
        let out: Output = self
            .node
            .exec(proxy_binary().unwrap())
            .unwrap()
            .arg("inspect")
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{} agent: proxy inspect {args:?}: {out:?}",
            self.label
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// `proxy inspect --json`, parsed.
    fn inspect_json(&self) -> Value {
        serde_json::from_str(&self.inspect_output(&["--json"])).unwrap()
    }

    /// Polls `proxy inspect --json` until `ready` holds.
    fn wait_for(&mut self, what: &str, ready: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + WAIT;
        loop {
            self.check_running();
            let state = self.inspect_json();
            if ready(&state) {
                return state;
            }
            assert!(
                Instant::now() < deadline,
                "the {} agent: waited {WAIT:?} for {what}; last state:\n{}",
                self.label,
                serde_json::to_string_pretty(&state).unwrap()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for AgentProcess<'_> {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "---- {} agent log ----\n{}---- end ----",
                self.label,
                self.log()
            );
        }
    }
}

/// The Services and EndpointSlices written to the server, as one `kubectl apply` List.
fn workload(pod_ips: &[String]) -> Value {
    let svc = |ns: &str, name: &str, spec: Value| {
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": name, "namespace": ns, "labels": {"app.kubernetes.io/name": name}},
               "spec": spec})
    };
    let slice = |ns: &str, name: &str, service: &str, ports: Value, endpoints: Value| {
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
               "metadata": {"name": name, "namespace": ns,
                            "labels": {"kubernetes.io/service-name": service,
                                       "endpointslice.kubernetes.io/managed-by": "kpr-tests"}},
               "addressType": "IPv4", "ports": ports, "endpoints": endpoints})
    };
    let ep = |ip: &str, node: &str, zone: &str, conditions: Value| json!({"addresses": [ip], "nodeName": node, "zone": zone, "conditions": conditions});
    let ready = || json!({"ready": true, "serving": true, "terminating": false});
    let not_ready = || json!({"ready": false, "serving": false, "terminating": false});
    let terminating = || json!({"ready": false, "serving": true, "terminating": true});
    let items = vec![
        // ClusterIP, named ports (one by a named targetPort), least-connection by annotation.
        {
            let mut s = svc(
                "shop",
                "web",
                json!({"selector": {"app": "web"}, "ports": [
                    {"name": "http", "port": 80, "targetPort": "http"},
                    {"name": "https", "port": 443, "targetPort": 8443, "appProtocol": "https"}]}),
            );
            s["metadata"]["annotations"] = json!({"kpr.io/balance": "least-conn"});
            s
        },
        slice(
            "shop",
            "web-7xk2p",
            "web",
            json!([{"name": "http", "port": 8080, "protocol": "TCP"},
                   {"name": "https", "port": 8443, "protocol": "TCP", "appProtocol": "https"}]),
            json!([
                {"addresses": [pod_ips[0]], "nodeName": NODE_NAME, "zone": "zone-a",
                 "conditions": ready(), "hints": {"forZones": [{"name": "zone-a"}]},
                 "targetRef": {"kind": "Pod", "namespace": "shop", "name": "web-0"}},
                ep(&pod_ips[1], "node-b", "zone-b", ready()),
                ep("10.244.9.10", NODE_NAME, "zone-a", not_ready()),
                ep("10.244.9.11", "node-b", "zone-b", terminating()),
            ]),
        ),
        // A second slice of the same Service: endpoints are merged over slices.
        slice(
            "shop",
            "web-m4q9z",
            "web",
            json!([{"name": "http", "port": 8080, "protocol": "TCP"},
                   {"name": "https", "port": 8443, "protocol": "TCP", "appProtocol": "https"}]),
            json!([ep("10.244.9.12", "node-c", "zone-c", ready())]),
        ),
        // Session affinity, one unnamed port; labels and annotations whose values a YAML reader
        // could take for something else than strings (kubectl quotes them; YAML 1.1 and 1.2 read
        // some differently), compared object by object below.
        {
            let mut s = svc(
                "shop",
                "sticky",
                json!({"selector": {"app": "sticky"}, "sessionAffinity": "ClientIP",
                       "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 600}},
                       "ports": [{"port": 8080, "targetPort": 8080}]}),
            );
            s["metadata"]["labels"] = json!({"app.kubernetes.io/name": "sticky",
                "example.com/bool": "true", "example.com/octal": "010", "example.com/float": "1e3",
                "example.com/underscore": "1_000", "example.com/yes": "yes", "example.com/off": "off"});
            s["metadata"]["annotations"] = json!({
                "example.com/null": "null", "example.com/tilde": "~", "example.com/empty": "",
                "example.com/date": "2024-01-02", "example.com/hex": "0x1F",
                "example.com/sexagesimal": "1:20", "example.com/inf": ".inf",
                "example.com/colon": "a: b", "example.com/comment": "a #b",
                "example.com/multiline": "line one\nline two\n", "example.com/unicode": "café – ✓",
                "example.com/spaces": "  padded  ", "example.com/json": "{\"a\": [1, 2]}"});
            s
        },
        slice(
            "shop",
            "sticky-abcde",
            "sticky",
            json!([{"name": "", "port": 8080, "protocol": "TCP"}]),
            json!([
                ep("10.244.9.20", NODE_NAME, "zone-a", ready()),
                ep("10.244.9.21", "node-b", "zone-b", ready())
            ]),
        ),
        // TCP and UDP on one port number, internalTrafficPolicy Local.
        svc(
            "shop",
            "dns",
            json!({"selector": {"app": "dns"}, "internalTrafficPolicy": "Local", "ports": [
                {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 5353},
                {"name": "dns-udp", "port": 53, "protocol": "UDP", "targetPort": 5353}]}),
        ),
        slice(
            "shop",
            "dns-q8w2e",
            "dns",
            json!([{"name": "dns-tcp", "port": 5353, "protocol": "TCP"},
                   {"name": "dns-udp", "port": 5353, "protocol": "UDP"}]),
            json!([
                ep("10.244.9.30", NODE_NAME, "zone-a", ready()),
                ep("10.244.9.31", "node-b", "zone-b", ready())
            ]),
        ),
        // Headless, with its slice (not proxied).
        svc(
            "shop",
            "db",
            json!({"clusterIP": "None", "selector": {"app": "db"},
                   "ports": [{"name": "pg", "port": 5432}]}),
        ),
        slice(
            "shop",
            "db-h7t3k",
            "db",
            json!([{"name": "pg", "port": 5432, "protocol": "TCP"}]),
            json!([{"addresses": ["10.244.9.40"], "hostname": "db-0", "nodeName": NODE_NAME,
                    "conditions": ready()}]),
        ),
        // ExternalName (not proxied, no clusterIP).
        svc(
            "shop",
            "alias",
            json!({"type": "ExternalName", "externalName": "db.example.com"}),
        ),
        // NodePort with a fixed nodePort.
        svc(
            "edge",
            "np",
            json!({"type": "NodePort", "selector": {"app": "np"},
                   "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}]}),
        ),
        slice(
            "edge",
            "np-2kd8s",
            "np",
            json!([{"name": "http", "port": 8080, "protocol": "TCP"}]),
            json!([ep("10.244.9.50", NODE_NAME, "zone-a", ready())]),
        ),
        // LoadBalancer, externalTrafficPolicy Local (healthCheckNodePort and nodePort allocated
        // by the server), source ranges; its status is written below.
        svc(
            "edge",
            "lb",
            json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local",
                   "selector": {"app": "lb"},
                   "loadBalancerSourceRanges": ["0.0.0.0/0"],
                   "ports": [{"name": "https", "port": 443, "targetPort": 8443}]}),
        ),
        slice(
            "edge",
            "lb-v9c4n",
            "lb",
            json!([{"name": "https", "port": 8443, "protocol": "TCP"}]),
            json!([
                ep("10.244.9.60", NODE_NAME, "zone-a", ready()),
                ep("10.244.9.61", "node-b", "zone-b", ready()),
                ep("10.244.9.62", NODE_NAME, "zone-a", terminating())
            ]),
        ),
        // externalIPs.
        svc(
            "edge",
            "ext",
            json!({"selector": {"app": "ext"}, "externalIPs": ["192.0.2.50"],
                   "ports": [{"name": "http", "port": 8080, "targetPort": 8080}]}),
        ),
        slice(
            "edge",
            "ext-p3m7x",
            "ext",
            json!([{"name": "http", "port": 8080, "protocol": "TCP"}]),
            json!([ep("10.244.9.70", "node-b", "zone-b", ready())]),
        ),
    ];
    json!({"apiVersion": "v1", "kind": "List", "items": items})
}

/// What may differ between sources: `last_sync` (when the last sync ran, how long it took, how
/// many service ports and operations it touched) depends on how the listing arrived (the kube
/// source sends Services and EndpointSlices as two listings from two watchers, the file source
/// both at once), not on what was programmed. Input problems are compared separately.
fn programmed(state: &Value) -> Value {
    json!({
        "backend": state["backend"],
        "synced": state["synced"],
        "services": state["services"],
    })
}

fn service_names(state: &Value) -> Vec<String> {
    state["services"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_string())
        .collect()
}

/// Panics, naming every service port that differs (and how), unless `other` programmed exactly
/// what `reference` did.
fn assert_same_programmed(reference: &Value, other: &Value, label: &str) {
    let (a, b) = (programmed(reference), programmed(other));
    if a == b {
        return;
    }
    let find = |state: &Value, name: &str| {
        state["services"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == name)
            .cloned()
    };
    let mut names = service_names(reference);
    names.extend(service_names(other));
    names.sort();
    names.dedup();
    let mut report = String::new();
    for name in names {
        let (x, y) = (find(reference, &name), find(other, &name));
        if x != y {
            report.push_str(&format!(
                "{name}:\n  kube:  {}\n  {label}: {}\n",
                x.map_or("(absent)".into(), |v| v.to_string()),
                y.map_or("(absent)".into(), |v| v.to_string()),
            ));
        }
    }
    panic!(
        "the {label} source programmed something else than the kube source \
         (backend/synced: {} {} vs {} {}; order of service ports may differ):\n{report}",
        a["backend"], a["synced"], b["backend"], b["synced"]
    );
}

/// `proxy inspect`'s text without its first line (the last sync's time and counts) and without
/// the input problems.
fn printed_services(text: &str) -> String {
    let body = text.split_once('\n').map_or("", |(_, rest)| rest);
    body.split_once("\ninput problems:\n")
        .map_or(body, |(services, _)| services)
        .to_string()
}

/// The lines under "input problems:" of `proxy inspect`.
fn printed_problems(text: &str) -> Vec<String> {
    text.split_once("\ninput problems:\n")
        .map(|(_, p)| p.lines().map(|l| l.trim().to_string()).collect())
        .unwrap_or_default()
}

/// Services and EndpointSlices by `namespace/name`, as comparable JSON. `managedFields` is
/// cleared: `kubectl get` leaves it out of what it prints (`--show-managed-fields=false`), a watch
/// carries it, and nothing in the agent reads it.
fn by_name<K: kube::Resource + serde::Serialize + Clone>(
    objects: &[K],
) -> std::collections::BTreeMap<String, Value> {
    objects
        .iter()
        .map(|o| {
            let mut o = o.clone();
            o.meta_mut().managed_fields = None;
            let key = format!(
                "{}/{}",
                o.meta().namespace.as_deref().unwrap_or(""),
                o.meta().name.as_deref().unwrap_or("")
            );
            (key, serde_json::to_value(&o).unwrap())
        })
        .collect()
}

/// Panics, naming every object that differs, unless the file source's objects are the API's.
fn assert_same_objects(
    what: &str,
    api: &std::collections::BTreeMap<String, Value>,
    file: &std::collections::BTreeMap<String, Value>,
) {
    if api == file {
        return;
    }
    let mut report = String::new();
    for key in api.keys().chain(file.keys()) {
        let (a, f) = (api.get(key), file.get(key));
        if a != f && !report.contains(&format!("{key}:\n")) {
            report.push_str(&format!(
                "{key}:\n  API:  {}\n  file: {}\n",
                a.map_or("(absent)".into(), Value::to_string),
                f.map_or("(absent)".into(), Value::to_string)
            ));
        }
    }
    panic!("{what}: the file source read other objects than the API serves:\n{report}");
}

/// Every Service and EndpointSlice the API server lists, as the kube source's watchers get them.
fn api_listing(cp: &ControlPlane) -> (Vec<Service>, Vec<EndpointSlice>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = cp.client().await.unwrap();
        let lp = ListParams::default();
        let services = Api::<Service>::all(client.clone()).list(&lp).await.unwrap();
        let slices = Api::<EndpointSlice>::all(client).list(&lp).await.unwrap();
        (services.items, slices.items)
    })
}

/// kubernetes.io's example Service ("Defining a Service"), written without a clusterIP.
const EXAMPLE_SERVICE_YAML: &str = "\
- apiVersion: v1
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

fn example_service() -> Value {
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "my-service"},
           "spec": {"selector": {"app.kubernetes.io/name": "MyApp"},
                    "ports": [{"protocol": "TCP", "port": 80, "targetPort": 9376}]}})
}

/// The input problems `file` must produce: the example Service as items[0], then every object of
/// `listed` (kubectl's List of the Pod and the ConfigMap) at its index plus one.
fn wanted_problems(file: &Path, listed: &Value) -> Vec<String> {
    let file = file.display();
    let mut wanted = vec![format!(
        "{file}: Service default/my-service: items[0].spec.clusterIP: missing: the file source \
         has no IP allocator"
    )];
    for (i, item) in listed["items"].as_array().unwrap().iter().enumerate() {
        let kind = item["kind"].as_str().unwrap();
        let meta = &item["metadata"];
        wanted.push(format!(
            "{file}: {kind} {}/{}: items[{}].kind: the file source uses only Service, \
             EndpointSlice and Node objects (and Lists of them); a {kind} is not used",
            meta["namespace"].as_str().unwrap(),
            meta["name"].as_str().unwrap(),
            i + 1
        ));
    }
    wanted
}

/// What the kube source's agent showed.
struct Reference {
    /// `proxy inspect --json`.
    state: Value,
    /// `proxy inspect`.
    text: String,
    /// The LoadBalancer's healthCheckNodePort (not part of what inspect shows) and its answer.
    health_check_port: u16,
    health: (u16, String),
}

/// Runs the file source on `dump` (named `dump_name`) in a fresh directory, compares it with the
/// reference, then adds `extra` (named `extra_name`) and checks the problems it causes.
fn check_file_source(
    node: &Netns,
    run: &Path,
    format: &str,
    reference: &Reference,
    (dump_name, dump): (&str, &str),
    (extra_name, extra): (&str, &str),
    listed: &Value,
) {
    let (reference_text, health) = (&reference.text, &reference.health);
    let (reference, health_check_port) = (&reference.state, reference.health_check_port);
    let dir = run.join(format!("manifests-{format}"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(dump_name), dump).unwrap();
    let source = format!("file:{}", dir.display());
    let mut agent = AgentProcess::start(node, format, run, &source, &[]);
    let state = agent.wait_for("synced", |s| s["synced"] == true);
    assert_same_programmed(reference, &state, format);
    assert_eq!(
        state["errors"],
        json!([]),
        "{format}: the dump alone has no input problems"
    );
    let text = agent.inspect_output(&[]);
    assert_eq!(
        printed_services(&text),
        printed_services(reference_text),
        "{format}: proxy inspect prints the same services"
    );
    assert_eq!(
        agent.health_check(health_check_port),
        *health,
        "{format}: the healthCheckNodePort answers as the kube source's"
    );

    // The second file: written aside, then renamed in, as an editor or `kubectl ... > f` might.
    let tmp = dir.join(format!(".{extra_name}.tmp"));
    std::fs::write(&tmp, extra).unwrap();
    std::fs::rename(&tmp, dir.join(extra_name)).unwrap();
    let wanted = wanted_problems(&dir.join(extra_name), listed);
    let state = agent.wait_for("the second file's input problems", |s| {
        s["errors"]
            .as_array()
            .is_some_and(|e| e.len() >= wanted.len())
    });
    let errors: Vec<String> = state["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        errors.len(),
        wanted.len(),
        "{format}: exactly the second file's items: {errors:#?}"
    );
    let text = agent.inspect_output(&[]);
    let printed = printed_problems(&text);
    for want in &wanted {
        assert!(
            errors.iter().any(|e| e.starts_with(want.as_str())),
            "{format}: {want:?} missing from /state's errors {errors:#?}"
        );
        assert!(
            printed.iter().any(|e| e.starts_with(want.as_str())),
            "{format}: {want:?} missing from proxy inspect's input problems:\n{text}"
        );
    }
    assert_same_programmed(reference, &state, &format!("{format} + {extra_name}"));
    assert_eq!(
        printed_services(&text),
        printed_services(reference_text),
        "{format} + {extra_name}: proxy inspect prints the same services"
    );
}

#[test]
fn a_dump_of_the_api_server_programs_what_the_kube_source_programs() {
    let cluster = Cluster::new(ClusterSpec::pods(2)).unwrap();
    let pod_ips: Vec<String> = cluster.pod_ips().iter().map(|ip| ip.to_string()).collect();
    // A control plane of this test's own: the dump must hold nothing but this test's objects.
    let cp = ControlPlane::start(Options::minimal(controlplane::run_dir("dump"))).unwrap();
    for ns in ["shop", "edge"] {
        cp.create_namespace(ns).unwrap();
    }
    cp.kubectl_run(&["apply", "-f", "-"], Some(&workload(&pod_ips).to_string()))
        .unwrap();
    let status = json!({"status": {"loadBalancer": {"ingress": [
        {"ip": "198.51.100.10", "ipMode": "VIP"},
        {"ip": "198.51.100.11", "ipMode": "Proxy"},
        {"hostname": "lb.example.com"}]}}});
    cp.kubectl_run(
        &[
            "patch",
            "service",
            "lb",
            "-n",
            "edge",
            "--subresource=status",
            "--type=merge",
            "-p",
            &status.to_string(),
        ],
        None,
    )
    .unwrap();
    // What `kubectl get all` would add: objects of other kinds, here a Pod and a ConfigMap.
    let others = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": "web-0", "namespace": "shop", "labels": {"app": "web"}},
         "spec": {"containers": [{"name": "web", "image": "nginx:1.27",
                                  "ports": [{"name": "http", "containerPort": 8080}]}]}},
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": "web-config", "namespace": "shop"},
         "data": {"listen": "8080", "enabled": "yes"}}]});
    cp.kubectl_run(&["apply", "-f", "-"], Some(&others.to_string()))
        .unwrap();

    let get = |what: &[&str], format: &str| {
        let mut args = vec!["get"];
        args.extend_from_slice(what);
        args.extend(["-o", format]);
        cp.kubectl_run(&args, None).unwrap()
    };
    let all = ["services,endpointslices", "-A"];
    let dump_yaml = get(&all, "yaml");
    let dump_json = get(&all, "json");
    let other_objects = ["pod/web-0", "configmap/web-config", "-n", "shop"];
    let others_yaml = get(&other_objects, "yaml");
    let others_json = get(&other_objects, "json");
    let listed: Value = serde_json::from_str(&others_json).unwrap();
    assert_eq!(listed["kind"], "List", "{others_json}");
    assert_eq!(
        listed["items"].as_array().unwrap().len(),
        2,
        "{others_json}"
    );
    // The example Service becomes items[0] of kubectl's own List, in each format.
    assert_eq!(
        others_yaml.matches("\nitems:\n").count(),
        1,
        "kubectl's YAML List: {others_yaml}"
    );
    let extra_yaml = others_yaml.replacen(
        "\nitems:\n",
        &format!("\nitems:\n{EXAMPLE_SERVICE_YAML}"),
        1,
    );
    let mut extra_json = listed.clone();
    extra_json["items"]
        .as_array_mut()
        .unwrap()
        .insert(0, example_service());
    let extra_json = serde_json::to_string_pretty(&extra_json).unwrap();
    let dumped: Value = serde_json::from_str(&dump_json).unwrap();
    assert_eq!(dumped["kind"], "List");
    assert_eq!(
        dumped["items"].as_array().unwrap().len(),
        // 8 Services of the workload, 8 EndpointSlices, the `kubernetes` Service.
        17,
        "the dump holds the workload and the default `kubernetes` Service: {dump_json}"
    );

    // The objects themselves: what the file source reads from each dump is what the API serves.
    let (services, slices) = api_listing(&cp);
    let (api_services, api_slices) = (by_name(&services), by_name(&slices));
    for (name, text) in [("dump.yaml", &dump_yaml), ("dump.json", &dump_json)] {
        let parsed = parse_manifests(Path::new(name), text);
        assert!(parsed.errors.is_empty(), "{name}: {:#?}", parsed.errors);
        assert_same_objects(name, &api_services, &by_name(&parsed.services));
        assert_same_objects(name, &api_slices, &by_name(&parsed.slices));
    }

    // The reference: the kube source against the server, through a relay in the node namespace.
    let run = cp.dir.join("file-source-dump");
    std::fs::create_dir_all(&run).unwrap();
    let in_node = cluster
        .node
        .run(|| TcpListener::bind("127.0.0.1:0"))
        .unwrap()
        .unwrap();
    let api: SocketAddr = format!("127.0.0.1:{}", cp.ports.apiserver).parse().unwrap();
    let relay = Relay::start(in_node, api).unwrap();
    let kubeconfig = run.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        cp.admin_kubeconfig_for(&format!("https://{}", relay.addr()))
            .unwrap(),
    )
    .unwrap();
    let health_check_port = dumped["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["kind"] == "Service" && o["metadata"]["name"] == "lb")
        .and_then(|lb| lb["spec"]["healthCheckNodePort"].as_u64())
        .and_then(|p| u16::try_from(p).ok())
        .unwrap_or_else(|| panic!("no healthCheckNodePort allocated for edge/lb: {dump_json}"));
    let kube_reference = {
        let mut kube = AgentProcess::start(
            &cluster.node,
            "kube",
            &run,
            "kube",
            &["--kubeconfig", kubeconfig.to_str().unwrap()],
        );
        let state = kube.wait_for("synced", |s| s["synced"] == true);
        Reference {
            text: kube.inspect_output(&[]),
            health: kube.health_check(health_check_port),
            health_check_port,
            state,
        }
    };
    drop(relay);
    let reference = &kube_reference.state;
    assert_eq!(
        kube_reference.health.0, 200,
        "edge/lb has a ready endpoint on this node: {:?}",
        kube_reference.health
    );

    // The reference programs what the workload asks for, so that comparing with it means
    // something: every proxied port, none of the headless and ExternalName Services.
    assert_eq!(
        service_names(reference),
        [
            "default/kubernetes:https/TCP",
            "edge/ext:http/TCP",
            "edge/lb:https/TCP",
            "edge/np:http/TCP",
            "shop/dns:dns-tcp/TCP",
            "shop/dns:dns-udp/UDP",
            "shop/sticky/TCP",
            "shop/web:http/TCP",
            "shop/web:https/TCP",
        ],
        "{reference:#}"
    );
    assert_eq!(reference["errors"], json!([]), "{reference:#}");
    let port = |name: &str| {
        reference["services"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == name)
            .unwrap()
            .clone()
    };
    let web = port("shop/web:http/TCP");
    assert_eq!(web["algorithm"], "least-conn", "{web:#}");
    assert_eq!(web["endpoints"].as_array().unwrap().len(), 5, "{web:#}");
    let lb = port("edge/lb:https/TCP");
    assert_eq!(lb["load_balancer_ips"], json!(["198.51.100.10"]), "{lb:#}");
    assert_eq!(lb["external_local"], true, "{lb:#}");
    assert_ne!(lb["node_port"], 0, "{lb:#}");
    assert_eq!(port("edge/np:http/TCP")["node_port"], 30080);
    assert_eq!(
        port("edge/ext:http/TCP")["external_ips"],
        json!(["192.0.2.50"])
    );
    assert_eq!(port("shop/sticky/TCP")["affinity_seconds"], 600);
    assert_eq!(port("shop/dns:dns-udp/UDP")["internal_local"], true);

    check_file_source(
        &cluster.node,
        &run,
        "yaml",
        &kube_reference,
        ("dump.yaml", &dump_yaml),
        ("others.yaml", &extra_yaml),
        &listed,
    );
    check_file_source(
        &cluster.node,
        &run,
        "json",
        &kube_reference,
        ("dump.json", &dump_json),
        ("others.json", &extra_json),
        &listed,
    );
}
