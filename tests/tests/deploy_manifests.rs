//! deploy/ checked against what the agent and `cargo xtask kind` expect. Every manifest parses into
//! k8s-openapi types and serializes back to the same document (so a misspelled field is not silently
//! dropped); the agent's RBAC is read-only; its DaemonSet has the capabilities, host mounts, probe,
//! tolerations and image xtask builds; and its arguments, rendered for every backend, parse with the
//! agent's own command line (`proxy::cli::Cli`) and cover every flag the netns tests pass.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::net::SocketAddr;
use std::path::Path;

use clap::Parser;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Container, Namespace, Pod, PodSpec, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use proxy::cli::{Backend, Cli, Command, RunArgs};
use serde::de::DeserializeOwned;
use serde::Serialize;
use xtask::deploy::{self, Render};

/// The flags the README's agent command line and the netns harness (tests/src/agent.rs) give
/// `proxy run`; the DaemonSet must pass each of them too. `flags_in_the_harness` additionally reads
/// the harness source so that a flag added there without the DaemonSet fails this test.
const AGENT_FLAGS: &[&str] = &[
    "--backend",
    "--source",
    "--balance",
    "--hostname-override",
    "--cluster-cidr",
    "--service-cluster-ip-range",
    "--nodeport-addresses",
    "--min-sync-period",
    "--sync-period",
    "--udp-idle-timeout",
    "--metrics-bind-address",
    "--healthz-bind-address",
];

/// What the agent container may add; anything else (SYS_ADMIN, ALL, ...) fails the check.
const AGENT_CAPABILITIES: &[&str] = &["NET_ADMIN", "NET_RAW", "BPF", "PERFMON"];

/// Sample values the downward API would give on a kind worker.
const NODE_NAME: &str = "kpr-worker";
const NODE_IP: &str = "172.18.0.3";

fn deploy_file(name: &str) -> String {
    let path = deploy::deploy_dir().join(name);
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The YAML documents of a manifest text, as generic values, with where each came from.
fn documents(file: &str, text: &str) -> Vec<serde_json::Value> {
    serde_saphyr::from_multiple::<serde_json::Value>(text)
        .unwrap_or_else(|e| panic!("deploy/{file}: not YAML: {e}"))
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

/// Parses one document into `T` and checks that `T` serializes back to the same JSON: a field the
/// type does not know (a typo, a wrong nesting) would be dropped and show up as a difference.
fn typed<T: DeserializeOwned + Serialize>(file: &str, doc: &serde_json::Value) -> T {
    let what = format!(
        "deploy/{file} {} {}",
        field(doc, "kind"),
        field(&doc["metadata"], "name")
    );
    let parsed: T = serde_json::from_value(doc.clone()).unwrap_or_else(|e| panic!("{what}: {e}"));
    let original = serde_json::to_value(doc).unwrap_or_else(|e| panic!("{what}: {e}"));
    let back = serde_json::to_value(&parsed).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(
        back, original,
        "{what}: fields were lost or changed by parsing (misspelled or misplaced?)"
    );
    parsed
}

fn field<'a>(value: &'a serde_json::Value, key: &str) -> &'a str {
    value[key].as_str().unwrap_or("?")
}

/// Every object of a rendered manifest set, by kind.
#[derive(Default)]
struct Objects {
    daemon_sets: Vec<DaemonSet>,
    deployments: Vec<Deployment>,
    service_accounts: Vec<ServiceAccount>,
    cluster_roles: Vec<ClusterRole>,
    cluster_role_bindings: Vec<ClusterRoleBinding>,
    roles: Vec<Role>,
    role_bindings: Vec<RoleBinding>,
    services: Vec<Service>,
    pods: Vec<Pod>,
    namespaces: Vec<Namespace>,
}

impl Objects {
    fn add(&mut self, file: &str, doc: &serde_json::Value) {
        match field(doc, "kind") {
            "DaemonSet" => self.daemon_sets.push(typed(file, doc)),
            "Deployment" => self.deployments.push(typed(file, doc)),
            "ServiceAccount" => self.service_accounts.push(typed(file, doc)),
            "ClusterRole" => self.cluster_roles.push(typed(file, doc)),
            "ClusterRoleBinding" => self.cluster_role_bindings.push(typed(file, doc)),
            "Role" => self.roles.push(typed(file, doc)),
            "RoleBinding" => self.role_bindings.push(typed(file, doc)),
            "Service" => self.services.push(typed(file, doc)),
            "Pod" => self.pods.push(typed(file, doc)),
            "Namespace" => self.namespaces.push(typed(file, doc)),
            other => panic!("deploy/{file}: kind {other:?} is not checked by this test; add it"),
        }
    }

    fn daemon_set(&self, name: &str) -> &DaemonSet {
        let found = self
            .daemon_sets
            .iter()
            .find(|d| d.metadata.name.as_deref() == Some(name));
        found.unwrap_or_else(|| panic!("no DaemonSet {name}"))
    }

    fn deployment(&self, name: &str) -> &Deployment {
        let found = self
            .deployments
            .iter()
            .find(|d| d.metadata.name.as_deref() == Some(name));
        found.unwrap_or_else(|| panic!("no Deployment {name}"))
    }

    fn cluster_role(&self, name: &str) -> &ClusterRole {
        let found = self
            .cluster_roles
            .iter()
            .find(|r| r.metadata.name.as_deref() == Some(name));
        found.unwrap_or_else(|| panic!("no ClusterRole {name}"))
    }
}

fn objects(render: &Render) -> Objects {
    let mut objects = Objects::default();
    for file in deploy::MANIFESTS {
        let text = deploy::render_file(file, render).unwrap_or_else(|e| panic!("{e:#}"));
        for doc in documents(file, &text) {
            objects.add(file, &doc);
        }
    }
    objects
}

fn pod_spec(ds: &DaemonSet) -> &PodSpec {
    ds.spec
        .as_ref()
        .expect("a DaemonSet spec")
        .template
        .spec
        .as_ref()
        .expect("DaemonSet has a pod spec")
}

fn agent_container(objects: &Objects) -> Container {
    let spec = pod_spec(objects.daemon_set(deploy::AGENT_DAEMONSET));
    assert_eq!(
        spec.containers.len(),
        1,
        "the agent DaemonSet runs one container"
    );
    spec.containers[0].clone()
}

/// The agent's command line with `$(VAR)` replaced the way the kubelet would, after checking that
/// each variable comes from the downward API field it should.
fn agent_argv(container: &Container) -> Vec<String> {
    let sources: BTreeMap<&str, &str> = container
        .env
        .iter()
        .flatten()
        .filter_map(|e| {
            let path = e
                .value_from
                .as_ref()?
                .field_ref
                .as_ref()?
                .field_path
                .as_str();
            Some((e.name.as_str(), path))
        })
        .collect();
    assert_eq!(
        sources.get("NODE_NAME"),
        Some(&"spec.nodeName"),
        "NODE_NAME from the downward API"
    );
    assert_eq!(
        sources.get("NODE_IP"),
        Some(&"status.hostIP"),
        "NODE_IP from the downward API"
    );
    let command = container.command.clone().unwrap_or_default();
    assert_eq!(command, ["/usr/local/bin/proxy"], "the agent's command");
    let mut values = env_values(container);
    values.insert("NODE_NAME", NODE_NAME);
    values.insert("NODE_IP", NODE_IP);
    let args = container.args.clone().unwrap_or_default();
    let substituted = args.iter().map(|a| {
        values.iter().fold(a.clone(), |a, (name, value)| {
            a.replace(&format!("$({name})"), value)
        })
    });
    let argv: Vec<String> = std::iter::once("proxy".to_owned())
        .chain(substituted)
        .collect();
    assert!(
        !argv.iter().any(|a| a.contains("$(")),
        "an unresolved $(VAR) in {argv:?}"
    );
    argv
}

fn run_args(argv: &[String]) -> RunArgs {
    let cli = Cli::try_parse_from(argv)
        .unwrap_or_else(|e| panic!("the DaemonSet's arguments {argv:?} do not parse:\n{e}"));
    match cli.command {
        Command::Run(args) => *args,
        other => panic!("the DaemonSet runs {other:?}, not `proxy run`"),
    }
}

/// The kind cluster config, as generic YAML (kind's types are not Kubernetes API types).
fn kind_config() -> serde_json::Value {
    let text = deploy_file(deploy::KIND_CONFIG);
    let docs = documents(deploy::KIND_CONFIG, &text);
    assert_eq!(
        docs.len(),
        1,
        "deploy/{} holds one document",
        deploy::KIND_CONFIG
    );
    docs[0].clone()
}

#[test]
fn every_yaml_file_in_deploy_is_checked() {
    let dir = deploy::deploy_dir();
    let mut checked: BTreeSet<&str> = deploy::MANIFESTS.iter().copied().collect();
    checked.insert(deploy::KIND_CONFIG);
    for entry in fs::read_dir(&dir).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if Path::new(&name)
            .extension()
            .is_some_and(|e| e == "yaml" || e == "yml")
        {
            assert!(
                checked.contains(name.as_str()),
                "deploy/{name} is not in xtask::deploy::MANIFESTS"
            );
        }
    }
    // Parsing (with the round trip) happens here for the committed form of every manifest.
    let objects = objects(&Render::default());
    assert_eq!(
        objects.daemon_sets.len(),
        3,
        "the agent, the rollback cleanup and kube-proxy's cleanup"
    );
    assert_eq!(objects.namespaces.len(), 1);
}

#[test]
fn agent_rbac_is_exactly_read_only() {
    let objects = objects(&Render::default());
    let role = objects.cluster_role("kpr-proxy");
    let mut granted = BTreeSet::new();
    for rule in role.rules.iter().flatten() {
        let verbs: BTreeSet<&str> = rule.verbs.iter().map(String::as_str).collect();
        assert_eq!(
            verbs,
            BTreeSet::from(["get", "list", "watch"]),
            "agent rule {rule:?}"
        );
        assert!(
            rule.non_resource_urls.is_none() && rule.resource_names.is_none(),
            "{rule:?}"
        );
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                granted.insert(format!("{group}/{resource}"));
            }
        }
    }
    let expected = BTreeSet::from([
        "/services".to_owned(),
        "/nodes".into(),
        "discovery.k8s.io/endpointslices".into(),
    ]);
    assert_eq!(
        granted, expected,
        "the agent reads Services, EndpointSlices and Nodes, nothing else"
    );
    let spec = pod_spec(objects.daemon_set(deploy::AGENT_DAEMONSET));
    let account = spec
        .service_account_name
        .as_deref()
        .expect("the DaemonSet names its ServiceAccount");
    let binding = objects
        .cluster_role_bindings
        .iter()
        .find(|b| b.role_ref.name == "kpr-proxy")
        .expect("a ClusterRoleBinding for kpr-proxy");
    assert_eq!(binding.role_ref.kind, "ClusterRole");
    let subjects = binding.subjects.as_deref().unwrap_or_default();
    assert!(
        subjects.iter().any(|s| s.kind == "ServiceAccount"
            && s.name == account
            && s.namespace.as_deref() == Some(deploy::SYSTEM_NAMESPACE)),
        "the binding's subjects {subjects:?} include the DaemonSet's ServiceAccount {account}"
    );
    assert!(objects
        .service_accounts
        .iter()
        .any(|a| a.metadata.name.as_deref() == Some(account)));
}

/// The garbage collector's role: every kind (found by discovery), but only these verbs.
const GC_ROLE: &str = "kpr-garbage-collector";

#[test]
fn no_role_grants_wildcards_but_the_garbage_collectors_read_patch_delete() {
    let objects = objects(&Render::default());
    let gc: Vec<_> = objects
        .cluster_roles
        .iter()
        .filter(|r| r.metadata.name.as_deref() == Some(GC_ROLE))
        .flat_map(|r| r.rules.iter().flatten())
        .collect();
    assert_eq!(gc.len(), 1, "{GC_ROLE} has one rule");
    assert_eq!(
        gc[0].verbs,
        ["get", "list", "watch", "patch", "update", "delete"],
        "{GC_ROLE} creates nothing and cannot escalate, bind or impersonate"
    );
    let rules = objects
        .cluster_roles
        .iter()
        .filter(|r| r.metadata.name.as_deref() != Some(GC_ROLE))
        .flat_map(|r| r.rules.iter().flatten())
        .chain(objects.roles.iter().flat_map(|r| r.rules.iter().flatten()));
    for rule in rules {
        let words = rule
            .verbs
            .iter()
            .chain(rule.resources.iter().flatten())
            .chain(rule.api_groups.iter().flatten());
        assert!(!words.clone().any(|w| w == "*"), "wildcard in {rule:?}");
    }
}

fn grants(rules: &[PolicyRule], group: &str, resource: &str, verb: &str) -> bool {
    rules.iter().any(|r| {
        r.api_groups.iter().flatten().any(|g| g == group)
            && r.resources.iter().flatten().any(|x| x == resource)
            && r.verbs.iter().any(|v| v == verb)
    })
}

#[test]
fn controller_manager_rbac_covers_its_controllers_and_no_more() {
    let objects = objects(&Render::default());
    let rules = objects
        .cluster_role("kpr-controller-manager")
        .rules
        .clone()
        .unwrap_or_default();
    // (group, resource, verbs granted); every other verb on these, and any other resource, is not.
    let expected: &[(&str, &str, &[&str])] = &[
        ("", "pods", &["list", "watch"]),
        ("", "nodes", &["list", "watch"]),
        ("", "services", &["get", "list", "watch", "patch"]),
        ("", "services/status", &["patch"]),
        (
            "",
            "endpoints",
            &["list", "watch", "create", "update", "delete"],
        ),
        (
            "discovery.k8s.io",
            "endpointslices",
            &["list", "watch", "create", "update", "delete"],
        ),
    ];
    let all_verbs = [
        "get",
        "list",
        "watch",
        "create",
        "update",
        "patch",
        "delete",
        "deletecollection",
    ];
    for (group, resource, verbs) in expected {
        for verb in all_verbs {
            assert_eq!(
                grants(&rules, group, resource, verb),
                verbs.contains(&verb),
                "{verb} {group}/{resource}"
            );
        }
    }
    let granted: BTreeSet<(String, String)> = rules
        .iter()
        .flat_map(|r| {
            let groups = r.api_groups.clone().unwrap_or_default();
            let resources = r.resources.clone().unwrap_or_default();
            groups
                .into_iter()
                .flat_map(move |g| resources.clone().into_iter().map(move |x| (g.clone(), x)))
        })
        .collect();
    let listed: BTreeSet<(String, String)> = expected
        .iter()
        .map(|(g, r, _)| (g.to_string(), r.to_string()))
        .collect();
    assert_eq!(
        granted, listed,
        "resources the controller-manager may touch"
    );
    let role = objects
        .roles
        .iter()
        .find(|r| r.metadata.name.as_deref() == Some("kpr-controller-manager"))
        .expect("a Role for leader election");
    assert_eq!(
        role.metadata.namespace.as_deref(),
        Some(deploy::SYSTEM_NAMESPACE)
    );
    let lease_rules = role.rules.clone().unwrap_or_default();
    for verb in ["get", "create", "update"] {
        assert!(
            grants(&lease_rules, "coordination.k8s.io", "leases", verb),
            "{verb} leases"
        );
    }
    let deployment = objects.deployment(deploy::CONTROLLER_DEPLOYMENT);
    let pod = deployment
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap();
    let account = pod.service_account_name.as_deref().unwrap();
    let bound = |subjects: Option<&Vec<k8s_openapi::api::rbac::v1::Subject>>| {
        subjects.into_iter().flatten().any(|s| s.name == account)
    };
    assert!(objects
        .cluster_role_bindings
        .iter()
        .any(|b| b.role_ref.name == "kpr-controller-manager" && bound(b.subjects.as_ref())));
    assert!(objects
        .role_bindings
        .iter()
        .any(|b| b.role_ref.name == "kpr-controller-manager" && bound(b.subjects.as_ref())));
}

/// The Deployment's arguments are accepted by the real `controller-manager` binary: with an extra
/// `--kubeconfig` that does not exist, it must get past argument parsing and fail on the file.
#[test]
fn controller_manager_arguments_parse_with_the_real_binary() {
    let objects = objects(&Render::default());
    let pod = objects
        .deployment(deploy::CONTROLLER_DEPLOYMENT)
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .clone()
        .unwrap();
    let container = &pod.containers[0];
    assert_eq!(
        container.command.as_deref(),
        Some(&["/usr/local/bin/controller-manager".to_owned()][..])
    );
    let args = container.args.clone().unwrap_or_default();
    assert!(args.iter().any(|a| a == "--leader-elect"), "{args:?}");
    let binary = kpr_tests::agent::proxy_binary()
        .unwrap()
        .with_file_name("controller-manager");
    assert!(
        binary.is_file(),
        "no {}: cargo build -p controllers --bins (cargo xtask test does)",
        binary.display()
    );
    let missing = std::env::temp_dir().join(format!(
        "{}-no-such-kubeconfig",
        kpr_tests::netns::unique_prefix()
    ));
    let out = std::process::Command::new(&binary)
        .args(&args)
        .arg("--kubeconfig")
        .arg(&missing)
        .env_remove("KUBECONFIG")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_ne!(
        out.status.code(),
        Some(2),
        "clap rejected {args:?}:\n{stderr}"
    );
    assert!(
        stderr.contains("reading kubeconfig"),
        "{args:?} parsed, then: {stderr}"
    );
}

#[test]
fn agent_runs_on_every_node_with_host_network_and_high_priority() {
    let objects = objects(&Render::default());
    let spec = pod_spec(objects.daemon_set(deploy::AGENT_DAEMONSET));
    assert_eq!(spec.host_network, Some(true));
    assert_eq!(
        spec.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    assert_eq!(
        spec.dns_policy.as_deref(),
        Some("Default"),
        "cluster DNS needs the proxy itself"
    );
    let tolerations = spec.tolerations.as_deref().unwrap_or_default();
    assert!(
        tolerations
            .iter()
            .any(|t| t.operator.as_deref() == Some("Exists")
                && t.key.is_none()
                && t.effect.is_none()),
        "a toleration of every taint, found {tolerations:?}"
    );
}

/// The plain `value:` environment variables of a container.
fn env_values(container: &Container) -> BTreeMap<&str, &str> {
    container
        .env
        .iter()
        .flatten()
        .filter_map(|e| Some((e.name.as_str(), e.value.as_deref()?)))
        .collect()
}

/// Not privileged, no privilege escalation, every capability dropped but the agent's.
fn assert_agent_privileges(what: &str, container: &Container) {
    let security = container
        .security_context
        .clone()
        .unwrap_or_else(|| panic!("{what} sets a securityContext"));
    assert_ne!(security.privileged, Some(true), "{what} is not privileged");
    assert_eq!(security.allow_privilege_escalation, Some(false), "{what}");
    let caps = security
        .capabilities
        .unwrap_or_else(|| panic!("{what} lists capabilities"));
    assert_eq!(
        caps.drop.as_deref(),
        Some(&["ALL".to_owned()][..]),
        "{what}: everything else is dropped"
    );
    let added: BTreeSet<&str> = caps.add.iter().flatten().map(String::as_str).collect();
    assert_eq!(
        added,
        AGENT_CAPABILITIES.iter().copied().collect(),
        "{what}: capabilities added"
    );
}

fn init_container<'a>(spec: &'a PodSpec, name: &str) -> &'a Container {
    let found = spec
        .init_containers
        .iter()
        .flatten()
        .find(|c| c.name == name);
    found.unwrap_or_else(|| panic!("no init container {name}"))
}

#[test]
fn agent_has_only_the_capabilities_it_needs_and_is_not_privileged() {
    let objects = objects(&Render::default());
    assert_agent_privileges("the agent", &agent_container(&objects));
    let spec = pod_spec(objects.daemon_set(deploy::AGENT_DAEMONSET));
    let names: Vec<&str> = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(
        names,
        ["mount-bpffs", "cleanup-other-backends"],
        "init containers"
    );
    assert_agent_privileges(
        "cleanup-other-backends",
        init_container(spec, "cleanup-other-backends"),
    );
    let cleanup = pod_spec(objects.daemon_set("kpr-cleanup"));
    assert_agent_privileges("kpr-cleanup's cleanup", init_container(cleanup, "cleanup"));
}

/// Of kpr's own manifests: kube-proxy-cleanup.yaml runs upstream's `kube-proxy --cleanup` as
/// upstream's DaemonSet runs kube-proxy (`kube_proxy_cleanup_runs_the_clusters_own_kube_proxy`).
#[test]
fn the_only_privileged_container_mounts_bpffs_and_nothing_else() {
    let objects = objects(&Render::default());
    let mut specs: Vec<&PodSpec> = objects
        .daemon_sets
        .iter()
        .filter(|d| d.metadata.name.as_deref() != Some(deploy::KUBE_PROXY_CLEANUP_DAEMONSET))
        .map(pod_spec)
        .collect();
    specs.extend(
        objects
            .deployments
            .iter()
            .filter_map(|d| d.spec.as_ref()?.template.spec.as_ref()),
    );
    specs.extend(objects.pods.iter().filter_map(|p| p.spec.as_ref()));
    let privileged: Vec<&Container> = specs
        .iter()
        .flat_map(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
        })
        .filter(|c| c.security_context.as_ref().and_then(|s| s.privileged) == Some(true))
        .collect();
    let names: Vec<&str> = privileged.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["mount-bpffs"], "privileged containers");
    let init = privileged[0];
    let script = init.command.clone().unwrap_or_default().join(" ");
    assert!(
        script.contains("mount -t bpf bpffs /run/kpr/bpffs"),
        "{script}"
    );
    assert!(
        !script.contains(';') && !script.contains("&&"),
        "the privileged container does one thing: {script}"
    );
    let mounts = init.volume_mounts.as_deref().unwrap_or_default();
    assert_eq!(mounts.len(), 1, "mount-bpffs sees only bpffs");
    assert_eq!(
        (
            mounts[0].name.as_str(),
            mounts[0].mount_propagation.as_deref()
        ),
        ("bpffs", Some("Bidirectional"))
    );
}

#[test]
fn switching_backends_cleans_up_every_other_backend_first() {
    for backend in deploy::BACKENDS {
        let render = Render {
            backend: backend.to_string(),
            ..Render::default()
        };
        let objects = objects(&render);
        let spec = pod_spec(objects.daemon_set(deploy::AGENT_DAEMONSET));
        let init = init_container(spec, "cleanup-other-backends");
        assert_eq!(
            env_values(init).get("KPR_BACKEND"),
            Some(backend),
            "init container's backend"
        );
        assert_eq!(
            env_values(&agent_container(&objects)).get("KPR_BACKEND"),
            Some(backend),
            "agent's backend"
        );
        let command = init.command.clone().unwrap_or_default();
        assert_eq!(command[..2], ["/bin/sh", "-c"], "a shell script");
        let script = &command[2];
        let loop_over = format!("for b in {};", deploy::BACKENDS.join(" "));
        assert!(script.contains(&loop_over), "{script}");
        assert!(
            script.contains(
                r#"[ "$b" = "$KPR_BACKEND" ] || /usr/local/bin/proxy cleanup --backend "$b""#
            ),
            "{script}"
        );
        assert!(
            script.starts_with("set -e;"),
            "a failed cleanup stops the pod: {script}"
        );
        // The cleanup uses the same pin and cgroup paths the agent runs with.
        let args = run_args(&agent_argv(&agent_container(&objects)));
        let paths = format!(
            "--bpffs-path {} --cgroup-path {}",
            args.bpffs_path.display(),
            args.cgroup_path.as_ref().unwrap().display()
        );
        assert!(script.contains(&paths), "{script} should use {paths}");
    }
}

#[test]
fn rollback_daemonset_cleans_up_every_backend() {
    let objects = objects(&Render::default());
    let spec = pod_spec(objects.daemon_set("kpr-cleanup"));
    let command = init_container(spec, "cleanup")
        .command
        .clone()
        .unwrap_or_default();
    let argv: Vec<&str> = std::iter::once("proxy")
        .chain(command.iter().skip(1).map(String::as_str))
        .collect();
    let cli = Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    let Command::Cleanup(args) = cli.command else {
        panic!("{argv:?} is not `proxy cleanup`")
    };
    assert_eq!(args.backend, "all");
    assert_eq!(args.bpffs_path, Path::new("/run/kpr/bpffs/kpr"));
    assert_eq!(
        spec.automount_service_account_token,
        Some(false),
        "no API access needed"
    );
    assert_eq!(
        spec.host_network,
        Some(true),
        "the node's network namespace is the one to clean"
    );
}

/// deploy/kube-proxy-cleanup.yaml: upstream's own `kube-proxy --cleanup`, from the image of the
/// release the reference cluster runs (the committed tag is the pinned version, and rendering it
/// for that version changes nothing), privileged in the host network as kube-proxy's DaemonSet,
/// without API access, then a pause container (the nodes' sandbox image) so that `rollout status`
/// completes.
#[test]
fn kube_proxy_cleanup_runs_the_clusters_own_kube_proxy() {
    let objects = objects(&Render::default());
    let ds = objects.daemon_set(deploy::KUBE_PROXY_CLEANUP_DAEMONSET);
    assert_eq!(
        ds.metadata.namespace.as_deref(),
        Some(deploy::SYSTEM_NAMESPACE)
    );
    let spec = pod_spec(ds);
    assert_eq!(
        spec.host_network,
        Some(true),
        "the node's rules are cleaned"
    );
    assert_eq!(spec.automount_service_account_token, Some(false));
    assert!(spec
        .tolerations
        .iter()
        .flatten()
        .any(|t| t.operator.as_deref() == Some("Exists") && t.key.is_none()));
    let init = init_container(spec, "cleanup");
    let version = controlplane::kubernetes_version();
    assert_eq!(
        init.image.as_deref(),
        Some(format!("registry.k8s.io/kube-proxy:{version}").as_str()),
        "the pinned release's kube-proxy"
    );
    assert_eq!(
        init.command.as_deref(),
        Some(
            &[
                "/usr/local/bin/kube-proxy".to_owned(),
                "--cleanup".to_owned()
            ][..]
        )
    );
    assert!(init.args.is_none());
    assert_eq!(
        init.security_context.as_ref().and_then(|s| s.privileged),
        Some(true)
    );
    let text = deploy_file(deploy::KUBE_PROXY_CLEANUP_MANIFEST);
    assert_eq!(
        deploy::with_kube_proxy_version(&text, version).unwrap(),
        text,
        "rendering for the pinned release is the committed manifest"
    );
    assert_eq!(spec.containers.len(), 1);
    let done = &spec.containers[0];
    assert_eq!(
        done.image.as_deref(),
        Some(controlplane::nodes::PAUSE_IMAGE)
    );
    assert_ne!(
        done.security_context.as_ref().and_then(|s| s.privileged),
        Some(true)
    );
}

#[test]
fn agent_mounts_bpffs_cgroup2_xtables_lock_and_modules_from_the_host() {
    let objects = objects(&Render::default());
    let spec = pod_spec(objects.daemon_set(deploy::AGENT_DAEMONSET));
    let container = agent_container(&objects);
    let mounts: BTreeMap<&str, (&str, bool)> = container
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| {
            (
                m.name.as_str(),
                (m.mount_path.as_str(), m.read_only == Some(true)),
            )
        })
        .collect();
    let host: BTreeMap<&str, (&str, Option<&str>)> = spec
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| {
            let h = v.host_path.as_ref()?;
            Some((v.name.as_str(), (h.path.as_str(), h.type_.as_deref())))
        })
        .collect();
    let expect = [
        ("bpffs", "/sys/fs/bpf", false),
        ("cgroup", "/sys/fs/cgroup", false),
        ("xtables-lock", "/run/xtables.lock", false),
        ("lib-modules", "/lib/modules", true),
    ];
    for (name, host_path, read_only) in expect {
        assert_eq!(
            host.get(name).map(|h| h.0),
            Some(host_path),
            "volume {name} is hostPath {host_path}"
        );
        let (_, ro) = mounts
            .get(name)
            .unwrap_or_else(|| panic!("volume {name} is mounted"));
        assert_eq!(*ro, read_only, "volume {name} read-only");
    }
    assert_eq!(
        host["xtables-lock"].1,
        Some("FileOrCreate"),
        "the lock file is created if missing"
    );
    assert_eq!(
        mounts["xtables-lock"].0, "/run/xtables.lock",
        "iptables looks for its lock there"
    );
    assert_eq!(mounts["lib-modules"].0, "/lib/modules");
    // The agent's pin and attach paths point into those mounts.
    let args = run_args(&agent_argv(&container));
    assert_eq!(
        args.cgroup_path.as_deref(),
        Some(Path::new(mounts["cgroup"].0)),
        "--cgroup-path is the cgroup2 mount"
    );
    assert!(
        args.bpffs_path.starts_with(mounts["bpffs"].0),
        "--bpffs-path {:?} is inside the bpffs mount",
        args.bpffs_path
    );
}

#[test]
fn agent_liveness_probe_is_healthz_on_the_healthz_port() {
    let objects = objects(&Render::default());
    let container = agent_container(&objects);
    let args = run_args(&agent_argv(&container));
    for (what, probe) in [
        ("liveness", &container.liveness_probe),
        ("readiness", &container.readiness_probe),
    ] {
        let get = probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .unwrap_or_else(|| panic!("an HTTP {what} probe"));
        assert_eq!(get.path.as_deref(), Some("/healthz"), "{what} probe path");
        let port = match &get.port {
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(p) => *p,
            other => panic!("{what} probe port {other:?} should be a number"),
        };
        assert_eq!(port, 10256);
        assert_eq!(
            u16::try_from(port).ok(),
            Some(args.healthz_bind_address.port()),
            "{what} probe port = --healthz-bind-address port"
        );
    }
    assert!(
        args.healthz_bind_address.ip().is_unspecified(),
        "the kubelet probes the node address"
    );
    assert_eq!(
        args.metrics_bind_address,
        "127.0.0.1:10249".parse::<SocketAddr>().unwrap()
    );
}

#[test]
fn every_kpr_container_runs_the_image_xtask_builds() {
    let objects = objects(&Render::default());
    let mut specs: Vec<&PodSpec> = objects.daemon_sets.iter().map(pod_spec).collect();
    specs.extend(
        objects
            .deployments
            .iter()
            .filter_map(|d| d.spec.as_ref()?.template.spec.as_ref()),
    );
    let mut kpr_containers = 0;
    for spec in specs {
        for c in spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
        {
            let Some(image) = c.image.as_deref() else {
                panic!("container {} has no image", c.name)
            };
            if image.starts_with("kpr") {
                assert_eq!(image, deploy::IMAGE, "container {}", c.name);
                assert_eq!(
                    c.image_pull_policy.as_deref(),
                    Some("Never"),
                    "{}: the image is loaded, not pulled",
                    c.name
                );
                kpr_containers += 1;
            }
        }
    }
    assert_eq!(
        kpr_containers, 6,
        "agent and its 2 init containers, controller-manager, rollback cleanup and its init container"
    );
}

#[test]
fn agent_arguments_parse_with_the_agent_cli_for_every_backend() {
    let kind = kind_config();
    let pod_subnet = kind["networking"]["podSubnet"].as_str().unwrap();
    let service_subnet = kind["networking"]["serviceSubnet"].as_str().unwrap();
    let backends = [
        ("userspace", Backend::Userspace),
        ("iptables", Backend::Iptables),
        ("nftables", Backend::Nftables),
        ("ebpf", Backend::Ebpf),
    ];
    assert_eq!(backends.len(), deploy::BACKENDS.len());
    for (name, backend) in backends {
        let render = Render {
            backend: name.into(),
            cluster: "dev".into(),
        };
        let objects = objects(&render);
        let container = agent_container(&objects);
        let args = run_args(&agent_argv(&container));
        assert_eq!(args.backend, backend, "rendered for {name}");
        assert_eq!(args.hostname_override.as_deref(), Some(NODE_NAME));
        let cidrs = |v: &[ipnet::IpNet]| v.iter().map(ToString::to_string).collect::<Vec<_>>();
        assert_eq!(
            cidrs(&args.cluster_cidr),
            [pod_subnet],
            "--cluster-cidr is kind's podSubnet"
        );
        assert_eq!(
            cidrs(&args.service_cluster_ip_range),
            [service_subnet],
            "--service-cluster-ip-range is kind's serviceSubnet"
        );
        assert_eq!(cidrs(&args.nodeport_addresses), [format!("{NODE_IP}/32")]);
        assert_eq!(args.source, proxy::cli::SourceArg::Kube);
        let env = env_values(&container);
        assert_eq!(
            env.get("KUBERNETES_SERVICE_HOST").copied(),
            Some(render.api_server_host().as_str())
        );
    }
}

#[test]
fn daemonset_passes_every_flag_the_netns_tests_pass() {
    let objects = objects(&Render::default());
    let argv = agent_argv(&agent_container(&objects));
    let given: BTreeSet<&str> = argv
        .iter()
        .filter_map(|a| a.split('=').next().filter(|f| f.starts_with("--")))
        .collect();
    for flag in AGENT_FLAGS.iter().copied().chain(flags_in_the_harness()) {
        assert!(
            given.contains(flag),
            "the DaemonSet does not pass {flag} (given: {given:?})"
        );
    }
}

/// The `"--flag"` literals of the harness's command-line builder (`fn run_args` in
/// tests/src/agent.rs: the flags every netns test passes; optional ones come from the tests).
fn flags_in_the_harness() -> Vec<&'static str> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/agent.rs");
    let source =
        fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let start = source
        .find("fn run_args(")
        .unwrap_or_else(|| panic!("no `fn run_args(` in {}: update this test", path.display()));
    let body = &source[start..];
    let body = &body[..body.find("\n    }\n").unwrap_or(body.len())];
    let flags: Vec<&'static str> = body
        .split('"')
        .skip(1)
        .step_by(2)
        .filter(|s| {
            s.starts_with("--")
                && s.len() > 2
                && s[2..].chars().all(|c| c.is_ascii_lowercase() || c == '-')
        })
        .map(|s| &*Box::leak(s.to_owned().into_boxed_str()))
        .collect();
    assert!(
        flags.contains(&"--backend") && flags.contains(&"--healthz-bind-address"),
        "found no flags in {}'s run_args: {flags:?}",
        path.display()
    );
    flags
}

#[test]
fn kind_config_disables_kube_proxy() {
    let kind = kind_config();
    assert_eq!(kind["kind"].as_str(), Some("Cluster"));
    assert_eq!(kind["apiVersion"].as_str(), Some("kind.x-k8s.io/v1alpha4"));
    assert_eq!(kind["networking"]["kubeProxyMode"].as_str(), Some("none"));
    let roles: Vec<&str> = kind["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["role"].as_str().unwrap())
        .collect();
    assert_eq!(
        roles,
        ["control-plane", "worker"],
        "the smoke test spreads echo pods over two nodes"
    );
}

#[test]
fn smoke_test_services_match_what_xtask_queries() {
    let objects = objects(&Render::default());
    let ns = |s: &Service| s.metadata.namespace.clone();
    assert!(objects
        .services
        .iter()
        .all(|s| ns(s).as_deref() == Some(deploy::SMOKE_NAMESPACE)));
    let echo = objects
        .services
        .iter()
        .find(|s| s.metadata.name.as_deref() == Some("echo"))
        .expect("Service echo");
    assert_eq!(
        echo.spec.as_ref().unwrap().type_.as_deref(),
        Some("ClusterIP")
    );
    let node_port = objects
        .services
        .iter()
        .filter_map(|s| s.spec.as_ref())
        .filter(|s| s.type_.as_deref() == Some("NodePort"))
        .flat_map(|s| s.ports.iter().flatten())
        .find_map(|p| p.node_port);
    assert_eq!(node_port, Some(i32::from(deploy::SMOKE_NODE_PORT)));
    assert!(objects
        .pods
        .iter()
        .any(|p| p.metadata.name.as_deref() == Some("client")));
    assert!(objects
        .deployments
        .iter()
        .any(|d| d.metadata.name.as_deref() == Some("echo")));
}

#[test]
fn dockerfile_builds_the_agent_with_ebpf_and_ships_nft_and_iptables() {
    let text = deploy_file(deploy::DOCKERFILE);
    let stages: Vec<&str> = text.split("\nFROM ").collect();
    assert_eq!(stages.len(), 3, "a build stage and a runtime stage");
    let (build, runtime) = (stages[1], stages[2]);
    assert!(
        build.contains("cargo install bpf-linker")
            && build.contains("LLVM_PREFIX=/usr/lib/llvm-22")
    );
    assert!(build.contains("--component rust-src"));
    assert!(build.contains("cargo build --release --locked -p proxy -p controllers --bins"));
    assert!(
        !text.contains("KPR_SKIP_EBPF=1"),
        "the image's agent has its eBPF programs"
    );
    assert!(
        runtime.starts_with("debian:bookworm-slim"),
        "a small Debian base"
    );
    for package in ["nftables", "iptables", "conntrack"] {
        assert!(
            runtime.contains(package),
            "the runtime image installs {package}"
        );
    }
    assert!(
        runtime.contains("COPY --from=build /out/proxy /out/controller-manager /usr/local/bin/")
    );
    let ignore = deploy_file("Dockerfile.dockerignore");
    assert!(
        ignore.lines().any(|l| l == "target"),
        "target/ stays out of the build context"
    );
}

/// The DaemonSet's own command line, for backends `backends`, run for real: the agent starts in the
/// node namespace of a namespace cluster with exactly the DaemonSet's arguments (the downward API
/// values filled in as the kubelet would), except `--source=kube` (no API server here: the file
/// source gets the same objects) and the host paths (a temp directory instead of the node's
/// /run/kpr mounts). Its liveness and readiness probes must pass as the kubelet runs them
/// (GET http://<node IP>:10256/healthz), `proxy inspect` with its default address (what
/// `kubectl exec ds/kpr-proxy -- proxy inspect` runs) must show the Service, and the ClusterIP and
/// the NodePort on `--nodeport-addresses=$(NODE_IP)/32` must reach the endpoint. Before the agent
/// starts, the `cleanup-other-backends` init container's script runs as rendered and must remove a
/// table that another backend left behind.
mod live {
    use std::fs;
    use std::net::{SocketAddr, SocketAddrV4};
    use std::path::PathBuf;
    use std::process::{Child, Stdio};
    use std::thread::sleep;
    use std::time::{Duration, Instant};

    use k8s_openapi::api::core::v1::Probe;
    use kpr_tests::cluster::{ClusterSpec, NODE_IP as HARNESS_NODE_IP, NODE_NAME as HARNESS_NODE};
    use kpr_tests::netns::unique_prefix;
    use kpr_tests::{http_get, tcp_request, yaml, Cluster, EndpointSlice, Service};

    use super::*;

    /// Every backend whose translation applies to the harness's clients as they are: not `ebpf`,
    /// whose socket programs translate only for processes inside the agent's cgroup (its own
    /// suites run clients there). The first is the DaemonSet's default, what `cargo xtask kind`
    /// deploys.
    const BACKENDS: &[&str] = &[deploy::DEFAULT_BACKEND, "iptables", "userspace"];
    const T: Duration = Duration::from_secs(3);

    /// Kills the agent and removes its directory on drop; prints its log when the test fails.
    struct Running {
        child: Child,
        dir: PathBuf,
    }

    impl Running {
        fn log(&self) -> String {
            fs::read_to_string(self.dir.join("agent.log")).unwrap_or_default()
        }
    }

    impl Drop for Running {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
            if std::thread::panicking() {
                eprintln!("---- agent log ----\n{}---- end ----", self.log());
            }
            let _ = fs::remove_dir_all(&self.dir);
        }
    }

    /// The DaemonSet's argv with the kubelet's substitutions for the harness node, the file source
    /// and temp paths.
    fn daemonset_argv(backend: &str, dir: &Path) -> Vec<String> {
        let render = Render {
            backend: backend.into(),
            ..Render::default()
        };
        let container = agent_container(&objects(&render));
        let argv = agent_argv(&container);
        let node_ip = HARNESS_NODE_IP.to_string();
        argv.into_iter()
            .skip(1)
            .map(|a| match a.split_once('=') {
                Some(("--source", "kube")) => {
                    format!("--source=file:{}", dir.join("manifests").display())
                }
                Some(("--hostname-override", _)) => format!("--hostname-override={HARNESS_NODE}"),
                Some(("--nodeport-addresses", v)) => {
                    format!("--nodeport-addresses={}", v.replace(NODE_IP, &node_ip))
                }
                Some(("--cgroup-path", _)) => {
                    format!("--cgroup-path={}", dir.join("cgroup").display())
                }
                Some(("--bpffs-path", _)) => {
                    format!("--bpffs-path={}", dir.join("bpffs").display())
                }
                _ => a,
            })
            .collect()
    }

    fn start(cluster: &Cluster, backend: &str) -> Running {
        let dir = std::env::temp_dir().join(format!("{}-daemonset-args", unique_prefix()));
        fs::create_dir_all(dir.join("manifests")).unwrap();
        let svc = Service::new("web")
            .cluster_ip("10.96.0.10")
            .tcp(80, 8080)
            .named("http")
            .node_port(30080);
        let slice = EndpointSlice::for_service(&svc).ready_all(cluster.pod_ips());
        fs::write(dir.join("manifests/web.yaml"), yaml(&[&svc, &slice])).unwrap();
        let args = daemonset_argv(backend, &dir);
        assert!(args.contains(&format!("--backend={backend}")), "{args:?}");
        let log = fs::File::create(dir.join("agent.log")).unwrap();
        let child = cluster
            .node
            .exec(kpr_tests::agent::proxy_binary().unwrap())
            .unwrap()
            .args(&args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        Running { child, dir }
    }

    /// Runs `probe` the way the kubelet does against a hostNetwork pod (the node's address).
    fn kubelet_probe(cluster: &Cluster, what: &str, probe: &Probe, within: Duration) {
        let get = probe.http_get.as_ref().unwrap();
        let port = match get.port {
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(p) => {
                u16::try_from(p).unwrap()
            }
            ref other => panic!("{what} port {other:?}"),
        };
        let to = SocketAddr::V4(SocketAddrV4::new(HARNESS_NODE_IP, port));
        let path = get.path.as_deref().unwrap();
        let deadline = Instant::now() + within;
        loop {
            match http_get(&cluster.node, to, path, T) {
                Ok((200, _)) => return,
                other if Instant::now() > deadline => {
                    panic!("{what} probe GET {to}{path}: {other:?}")
                }
                _ => sleep(Duration::from_millis(200)),
            }
        }
    }

    /// The nftables table each rule-writing backend owns, to plant as a leftover of a previous
    /// backend: (backend, nft family and table).
    const LEFTOVERS: &[(&str, &str)] = &[("nftables", "ip kpr"), ("userspace", "ip kpr-userspace")];

    fn nft(cluster: &Cluster, args: &str) -> std::process::Output {
        let mut cmd = cluster.node.exec("nft").unwrap();
        cmd.args(args.split(' '))
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// Runs the rendered `cleanup-other-backends` init container's script in the node namespace
    /// (with the agent binary and temp paths in place of the image's): it must succeed, and it must
    /// remove a table another backend left behind.
    fn cleanup_other_backends(cluster: &Cluster, backend: &str) {
        let render = Render {
            backend: backend.into(),
            ..Render::default()
        };
        let objects = objects(&render);
        let init = init_container(
            pod_spec(objects.daemon_set(deploy::AGENT_DAEMONSET)),
            "cleanup-other-backends",
        );
        let dir = std::env::temp_dir().join(format!("{}-cleanup", unique_prefix()));
        let binary = kpr_tests::agent::proxy_binary().unwrap();
        let script = init.command.as_ref().unwrap()[2]
            .replace("/usr/local/bin/proxy", &binary.display().to_string())
            .replace("/run/kpr/", &format!("{}/", dir.display()));
        let (other, table) = LEFTOVERS.iter().find(|(b, _)| *b != backend).unwrap();
        let planted = nft(cluster, &format!("add table {table}"));
        assert!(planted.status.success(), "planting {table}: {planted:?}");
        let out = cluster
            .node
            .exec("sh")
            .unwrap()
            .args(["-c", &script])
            .env("KPR_BACKEND", env_values(init)["KPR_BACKEND"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let _ = fs::remove_dir_all(&dir);
        assert!(
            out.status.success(),
            "{backend}: cleanup-other-backends failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let left = nft(cluster, &format!("list table {table}"));
        assert!(
            !left.status.success(),
            "{backend}: the {other} backend's table {table} is still there"
        );
    }

    /// The privileged `mount-bpffs` init container's script, run twice in a private mount namespace
    /// on a plain directory standing for the node's /sys/fs/bpf: the first run mounts bpffs there,
    /// the second sees it and mounts nothing.
    #[test]
    fn mount_bpffs_init_container_mounts_bpffs_once() {
        let objects = objects(&Render::default());
        let init = init_container(
            pod_spec(objects.daemon_set(deploy::AGENT_DAEMONSET)),
            "mount-bpffs",
        );
        let command = init.command.clone().unwrap();
        assert_eq!(command[..2], ["/bin/sh", "-c"]);
        let dir = std::env::temp_dir().join(format!("{}-bpffs", unique_prefix()));
        fs::create_dir_all(&dir).unwrap();
        let script = command[2].replace("/run/kpr/bpffs", &dir.display().to_string());
        let check = format!(
            "{script} && {script} && stat -f -c %T {d} && grep -c ' {d} ' /proc/self/mounts",
            d = dir.display()
        );
        // unshare: the mount lives and dies with this private mount namespace.
        let out = std::process::Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &check])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let _ = fs::remove_dir(&dir);
        let printed = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{check}: {printed}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            printed.lines().collect::<Vec<_>>(),
            ["bpf_fs", "1"],
            "mounted once: {printed}"
        );
    }

    /// deploy/cleanup.yaml's command (the rollback), run in a node namespace with leftovers of
    /// every rule backend: it succeeds and they are gone.
    #[test]
    fn rollback_cleanup_removes_every_backends_leftovers() {
        let cluster = Cluster::new(ClusterSpec::pods(0)).unwrap();
        for (_, table) in LEFTOVERS {
            let planted = nft(&cluster, &format!("add table {table}"));
            assert!(planted.status.success(), "planting {table}: {planted:?}");
        }
        let objects = objects(&Render::default());
        let init = init_container(pod_spec(objects.daemon_set("kpr-cleanup")), "cleanup");
        let dir = std::env::temp_dir().join(format!("{}-rollback", unique_prefix()));
        let command = init.command.clone().unwrap();
        let args = command[1..]
            .iter()
            .map(|a| a.replace("/run/kpr/", &format!("{}/", dir.display())));
        let out = cluster
            .node
            .exec(kpr_tests::agent::proxy_binary().unwrap())
            .unwrap()
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let _ = fs::remove_dir_all(&dir);
        let printed = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{command:?}: {printed}");
        for backend in deploy::BACKENDS {
            assert!(
                printed.contains(&format!("{backend}: cleaned up")),
                "{backend} not cleaned: {printed}"
            );
        }
        for (backend, table) in LEFTOVERS {
            let left = nft(&cluster, &format!("list table {table}"));
            assert!(
                !left.status.success(),
                "the {backend} backend's table {table} is still there"
            );
        }
    }

    /// deploy/kube-proxy-cleanup.yaml's command, with the reference build's kube-proxy, in a node
    /// namespace where kube-proxy's nftables tables (both families) and iptables chains were
    /// left: it succeeds and they are gone.
    #[test]
    fn kube_proxy_cleanup_removes_kube_proxys_rules() {
        let cluster = Cluster::new(ClusterSpec::pods(0)).unwrap();
        let node = |program: &str, args: &str| {
            let out = cluster
                .node
                .exec(program)
                .unwrap()
                .args(args.split(' ').filter(|a| !a.is_empty()))
                .stdin(Stdio::null())
                .output()
                .unwrap();
            (
                out.status.success(),
                format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            )
        };
        let plant = [
            ("nft", "add table ip kube-proxy"),
            ("nft", "add table ip6 kube-proxy"),
            ("iptables", "-t nat -N KUBE-SERVICES"),
            ("iptables", "-t nat -N KUBE-SVC-ABCDEFGHIJKLMNOP"),
            ("iptables", "-t filter -N KUBE-FORWARD"),
        ];
        for (program, args) in plant {
            let (ok, out) = node(program, args);
            assert!(ok, "{program} {args}: {out}");
        }
        let objects = objects(&Render::default());
        let init = init_container(
            pod_spec(objects.daemon_set(deploy::KUBE_PROXY_CLEANUP_DAEMONSET)),
            "cleanup",
        );
        let command = init.command.clone().unwrap();
        let binary = controlplane::Binaries::locate().unwrap().path("kube-proxy");
        let (ok, out) = node(&binary.display().to_string(), &command[1..].join(" "));
        assert!(ok, "{command:?}: {out}");
        for table in ["ip kube-proxy", "ip6 kube-proxy"] {
            let (listed, _) = node("nft", &format!("list table {table}"));
            assert!(!listed, "{table} is still there after {command:?}: {out}");
        }
        let (_, saved) = node("iptables-save", "");
        assert!(
            !saved.contains("KUBE-SERVICES")
                && !saved.contains("KUBE-SVC-")
                && !saved.contains("KUBE-FORWARD"),
            "kube-proxy's chains are still there after {command:?}:\n{saved}"
        );
    }

    #[test]
    fn daemonset_cleans_up_then_runs_an_agent_that_passes_its_probes_and_serves() {
        for backend in BACKENDS {
            let cluster = Cluster::new(ClusterSpec::pods(1)).unwrap();
            cleanup_other_backends(&cluster, backend);
            let running = start(&cluster, backend);
            let container = agent_container(&objects(&Render::default()));
            kubelet_probe(
                &cluster,
                "readiness",
                container.readiness_probe.as_ref().unwrap(),
                Duration::from_secs(20),
            );
            kubelet_probe(
                &cluster,
                "liveness",
                container.liveness_probe.as_ref().unwrap(),
                T,
            );
            let inspect = cluster
                .node
                .exec(kpr_tests::agent::proxy_binary().unwrap())
                .unwrap()
                .arg("inspect")
                .output()
                .unwrap();
            let printed = String::from_utf8_lossy(&inspect.stdout);
            assert!(
                inspect.status.success(),
                "{backend}: proxy inspect: {}",
                String::from_utf8_lossy(&inspect.stderr)
            );
            assert!(
                printed.contains(&format!("backend {backend}")) && printed.contains("default/web"),
                "{backend}: {printed}"
            );
            let pod = &cluster.pods[0].name;
            let via_cluster_ip =
                tcp_request(&cluster.podclient, "10.96.0.10:80".parse().unwrap(), T);
            assert_eq!(
                via_cluster_ip.map(|r| r.pod).ok().as_ref(),
                Some(pod),
                "{backend}: clusterIP from a pod"
            );
            let node_port = SocketAddr::V4(SocketAddrV4::new(HARNESS_NODE_IP, 30080));
            let via_node_port = tcp_request(&cluster.client, node_port, T);
            assert_eq!(
                via_node_port.map(|r| r.pod).ok().as_ref(),
                Some(pod),
                "{backend}: nodePort from outside"
            );
            drop(running);
        }
    }
}
