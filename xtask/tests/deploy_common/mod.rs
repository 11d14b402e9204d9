//! What the deploy/ checks share: the manifests rendered and parsed into k8s-openapi types, the
//! agent's container and command line, and the flags every agent run must pass.

#![allow(
    dead_code,
    unused_imports,
    reason = "the static and the live deploy tests each use part of it"
)]

use clap::Parser;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, Namespace, Pod, PodSpec, Service, ServiceAccount,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use proxy::cli::{Backend, Command, RunArgs};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::net::SocketAddr;
use std::path::Path;
use xtask::deploy::{self, Render};

/// The flags the DaemonSet must pass beyond every flag the netns harness passes
/// (`kpr_tests::agent::HARNESS_FLAGS`): the README's agent command line also sets the minimum
/// sync period.
pub const AGENT_FLAGS: &[&str] = &["--min-sync-period"];

/// What the agent's cleanup containers may add; anything else (SYS_ADMIN, ALL, ...) fails the
/// check.
pub const AGENT_CAPABILITIES: &[&str] = &["NET_ADMIN", "NET_RAW", "BPF", "PERFMON"];

/// What the agent container itself adds beyond [`AGENT_CAPABILITIES`]: SYS_ADMIN, to enter the
/// Pods' network namespaces and destroy sockets connected to removed endpoints (the chart's
/// `agent.podSockets`, on by default).
pub const POD_SOCKETS_CAPABILITY: &str = "SYS_ADMIN";

/// Sample values the downward API would give on a kind worker.
pub const NODE_NAME: &str = "kpr-worker";
pub const NODE_IP: &str = "172.18.0.3";

pub fn deploy_file(name: &str) -> String {
    let path = deploy::deploy_dir().join(name);
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The YAML documents of a manifest text, as generic values, with where each came from.
pub fn documents(file: &str, text: &str) -> Vec<serde_json::Value> {
    serde_saphyr::from_multiple::<serde_json::Value>(text)
        .unwrap_or_else(|e| panic!("deploy/{file}: not YAML: {e}"))
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

/// Parses one document into `T` and checks that `T` serializes back to the same JSON: a field the
/// type does not know (a typo, a wrong nesting) would be dropped and show up as a difference.
pub fn typed<T: DeserializeOwned + Serialize>(file: &str, doc: &serde_json::Value) -> T {
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

pub fn field<'a>(value: &'a serde_json::Value, key: &str) -> &'a str {
    value[key].as_str().unwrap_or("?")
}

/// Every object of a rendered manifest set, by kind.
#[derive(Default)]
pub struct Objects {
    pub daemon_sets: Vec<DaemonSet>,
    pub deployments: Vec<Deployment>,
    pub service_accounts: Vec<ServiceAccount>,
    pub cluster_roles: Vec<ClusterRole>,
    pub cluster_role_bindings: Vec<ClusterRoleBinding>,
    pub roles: Vec<Role>,
    pub role_bindings: Vec<RoleBinding>,
    pub services: Vec<Service>,
    pub pods: Vec<Pod>,
    pub namespaces: Vec<Namespace>,
    pub config_maps: Vec<ConfigMap>,
}

impl Objects {
    pub fn add(&mut self, file: &str, doc: &serde_json::Value) {
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
            "ConfigMap" => self.config_maps.push(typed(file, doc)),
            other => panic!("deploy/{file}: kind {other:?} is not checked by this test; add it"),
        }
    }

    pub fn daemon_set(&self, name: &str) -> &DaemonSet {
        let found = self
            .daemon_sets
            .iter()
            .find(|d| d.metadata.name.as_deref() == Some(name));
        found.unwrap_or_else(|| panic!("no DaemonSet {name}"))
    }

    pub fn deployment(&self, name: &str) -> &Deployment {
        let found = self
            .deployments
            .iter()
            .find(|d| d.metadata.name.as_deref() == Some(name));
        found.unwrap_or_else(|| panic!("no Deployment {name}"))
    }

    pub fn cluster_role(&self, name: &str) -> &ClusterRole {
        let found = self
            .cluster_roles
            .iter()
            .find(|r| r.metadata.name.as_deref() == Some(name));
        found.unwrap_or_else(|| panic!("no ClusterRole {name}"))
    }
}

/// The objects of a rendered text (`what` names it in errors).
pub fn objects_of(what: &str, text: &str) -> Objects {
    let mut objects = Objects::default();
    for doc in documents(what, text) {
        objects.add(what, &doc);
    }
    objects
}

pub fn objects(render: &Render) -> Objects {
    let mut objects = Objects::default();
    for file in deploy::MANIFESTS {
        let text = deploy::render_file(file, render).unwrap_or_else(|e| panic!("{e:#}"));
        for doc in documents(file, &text) {
            objects.add(file, &doc);
        }
    }
    objects
}

pub fn pod_spec(ds: &DaemonSet) -> &PodSpec {
    ds.spec
        .as_ref()
        .expect("a DaemonSet spec")
        .template
        .spec
        .as_ref()
        .expect("DaemonSet has a pod spec")
}

pub fn agent_container(objects: &Objects) -> Container {
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
pub fn agent_argv(container: &Container) -> Vec<String> {
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

/// Parsed as the agent parses its command line (which flags were given is recorded).
pub fn run_args(argv: &[String]) -> RunArgs {
    let cli = proxy::cli::parse_from(argv)
        .unwrap_or_else(|e| panic!("the DaemonSet's arguments {argv:?} do not parse:\n{e}"));
    match cli.command {
        Command::Run(args) => *args,
        other => panic!("the DaemonSet runs {other:?}, not `proxy run`"),
    }
}

/// The kind cluster config, as generic YAML (kind's types are not Kubernetes API types).
pub fn kind_config() -> serde_json::Value {
    kind_config_file(deploy::KIND_CONFIG)
}

/// One of deploy/'s kind configs.
pub fn kind_config_file(file: &str) -> serde_json::Value {
    let text = deploy_file(file);
    let docs = documents(file, &text);
    assert_eq!(docs.len(), 1, "deploy/{file} holds one document");
    docs[0].clone()
}

/// The garbage collector's role: every kind (found by discovery), but only these verbs.
pub const GC_ROLE: &str = "kpr-garbage-collector";

pub fn grants(rules: &[PolicyRule], group: &str, resource: &str, verb: &str) -> bool {
    rules.iter().any(|r| {
        r.api_groups.iter().flatten().any(|g| g == group)
            && r.resources.iter().flatten().any(|x| x == resource)
            && r.verbs.iter().any(|v| v == verb)
    })
}

/// The plain `value:` environment variables of a container.
pub fn env_values(container: &Container) -> BTreeMap<&str, &str> {
    container
        .env
        .iter()
        .flatten()
        .filter_map(|e| Some((e.name.as_str(), e.value.as_deref()?)))
        .collect()
}

/// Not privileged, no privilege escalation, every capability dropped but the agent's.
/// `container` is not privileged, drops everything and adds [`AGENT_CAPABILITIES`], plus
/// [`POD_SOCKETS_CAPABILITY`] when `pod_sockets`.
pub fn assert_agent_privileges(what: &str, container: &Container, pod_sockets: bool) {
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
    let mut expect: BTreeSet<&str> = AGENT_CAPABILITIES.iter().copied().collect();
    if pod_sockets {
        expect.insert(POD_SOCKETS_CAPABILITY);
    }
    assert_eq!(added, expect, "{what}: capabilities added");
}

pub fn init_container<'a>(spec: &'a PodSpec, name: &str) -> &'a Container {
    let found = spec
        .init_containers
        .iter()
        .flatten()
        .find(|c| c.name == name);
    found.unwrap_or_else(|| panic!("no init container {name}"))
}
