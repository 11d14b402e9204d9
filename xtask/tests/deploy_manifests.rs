//! deploy/ checked against what the agent and `cargo xtask kind` expect. Every manifest parses into
//! k8s-openapi types and serializes back to the same document (so a misspelled field is not silently
//! dropped); the agent's RBAC is read-only; its DaemonSet has the capabilities, host mounts, probe,
//! tolerations and image xtask builds; and its arguments, rendered for every backend, parse with the
//! agent's own command line (`proxy::cli::Cli`) and cover every flag the netns tests pass.
//!
//! These checks read files only; `deploy_live.rs` runs the DaemonSet's command line for real.

mod deploy_common;

use clap::Parser;
use k8s_openapi::api::core::v1::{Container, PodSpec, Service};
use proxy::cli::{Backend, Cli, Command};
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::net::SocketAddr;
use std::path::Path;
use xtask::deploy::{self, IpFamilies, Render};

use deploy_common::*;

#[test]
fn every_yaml_file_in_deploy_is_checked() {
    let dir = deploy::deploy_dir();
    let mut checked: BTreeSet<&str> = deploy::MANIFESTS.iter().copied().collect();
    checked.insert(deploy::KIND_CONFIG);
    checked.insert(deploy::KIND_CONFIG_DUAL);
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

/// The wildcard rules kube-controller-manager's own roles have too, each for a controller that
/// acts on kinds found at run time: (role, resources, verbs). Anything else with a `*` fails.
const WILDCARD_RULES: [(&str, &str, &[&str]); 2] = [
    // namespace-controller: empties a terminating namespace of every namespaced kind.
    (
        "kpr-namespace-controller",
        "*",
        &["get", "list", "delete", "deletecollection"],
    ),
    // horizontal-pod-autoscaler and disruption: the scale subresource of any scalable kind.
    ("kpr-workload-controllers", "*/scale", &["get", "update"]),
];

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
        .flat_map(|r| {
            let name = r.metadata.name.clone().unwrap_or_default();
            r.rules
                .iter()
                .flatten()
                .map(move |rule| (name.clone(), rule))
        })
        .chain(objects.roles.iter().flat_map(|r| {
            let name = r.metadata.name.clone().unwrap_or_default();
            r.rules
                .iter()
                .flatten()
                .map(move |rule| (name.clone(), rule))
        }));
    for (role, rule) in rules {
        let allowed = WILDCARD_RULES.iter().any(|(r, res, verbs)| {
            *r == role
                && rule.resources.as_deref() == Some(&[res.to_string()][..])
                && rule.verbs == *verbs
        });
        if allowed {
            continue;
        }
        let words = rule
            .verbs
            .iter()
            .chain(rule.resources.iter().flatten())
            .chain(rule.api_groups.iter().flatten());
        assert!(
            !words.clone().any(|w| w == "*"),
            "wildcard in {role}: {rule:?}"
        );
    }
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

#[test]
fn agent_has_only_the_capabilities_it_needs_and_is_not_privileged() {
    let objects = objects(&Render::default());
    assert_agent_privileges("the agent", &agent_container(&objects), true);
    let spec = pod_spec(objects.daemon_set(deploy::AGENT_DAEMONSET));
    let names: Vec<&str> = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| c.name.as_str())
        .collect();
    // The other backends' cleanup is the agent's own, after its first sync (make before break).
    assert_eq!(names, ["mount-bpffs"], "init containers");
    let cleanup = pod_spec(objects.daemon_set("kpr-cleanup"));
    assert_agent_privileges(
        "kpr-cleanup's cleanup",
        init_container(cleanup, "cleanup"),
        false,
    );
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
fn switching_backends_cleans_up_every_other_backend_after_the_first_sync() {
    for backend in deploy::BACKENDS {
        let render = Render {
            backend: backend.to_string(),
            ..Render::default()
        };
        let objects = objects(&render);
        assert_eq!(
            env_values(&agent_container(&objects)).get("KPR_BACKEND"),
            Some(backend),
            "agent's backend"
        );
        // The agent removes the other backends' state itself once its first sync is done
        // (`--cleanup-other-backends`, with the pin and cgroup paths it runs with); an init
        // container doing it before the agent started left the node unserved meanwhile.
        let args = run_args(&agent_argv(&agent_container(&objects)));
        assert!(
            args.cleanup_other_backends,
            "{backend}: --cleanup-other-backends"
        );
        assert_eq!(args.backend.as_str(), *backend);
        assert!(
            args.cgroup_path.is_some(),
            "the eBPF cleanup needs the cgroup"
        );
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
    assert_eq!(args.backend, proxy::cli::CleanupTarget::All);
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
        ("proc-sys-net", "/proc/sys/net", false),
        ("netns", "/run/netns", true),
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
    assert_eq!(
        mounts["netns"].0,
        proxy::dataplane::ebpf::sockterm::NETNS_DIR,
        "the Pods' namespaces where the agent looks for them"
    );
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
    assert_eq!(
        args.sysctl_net_path,
        Path::new(mounts["proc-sys-net"].0),
        "--sysctl-net-path is the node's writable /proc/sys/net"
    );
}

#[test]
fn agent_probes_are_kprs_own_readiness_address() {
    let objects = objects(&Render::default());
    let container = agent_container(&objects);
    let args = run_args(&agent_argv(&container));
    let readiness = args
        .readiness_bind_address
        .expect("--readiness-bind-address: the probes' port, which kube-proxy does not hold");
    assert!(
        readiness.ip().is_unspecified(),
        "the kubelet probes the node address"
    );
    assert_ne!(
        readiness.port(),
        args.healthz_bind_address.port(),
        "a probe of the healthz port is answered by kube-proxy while it still runs"
    );
    for (what, probe, path) in [
        ("liveness", &container.liveness_probe, "/healthz"),
        ("readiness", &container.readiness_probe, "/readyz"),
    ] {
        let get = probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .unwrap_or_else(|| panic!("an HTTP {what} probe"));
        assert_eq!(get.path.as_deref(), Some(path), "{what} probe path");
        let port = match &get.port {
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(p) => *p,
            other => panic!("{what} probe port {other:?} should be a number"),
        };
        assert_eq!(port, 10266);
        assert_eq!(
            u16::try_from(port).ok(),
            Some(readiness.port()),
            "{what} probe port = --readiness-bind-address port"
        );
    }
    assert_eq!(args.healthz_bind_address.port(), 10256, "kube-proxy's port");
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
        "agent and its init container, controller-manager, scheduler, rollback cleanup and its \
         init container"
    );
}

/// The dual-stack cluster and the agent rendered for it name the same subnets, of both families.
#[test]
fn dual_stack_kind_config_matches_the_dual_stack_agent() {
    let kind = kind_config_file(deploy::KIND_CONFIG_DUAL);
    let net = &kind["networking"];
    assert_eq!(net["ipFamily"], "dual");
    assert_eq!(net["kubeProxyMode"], "none");
    let render = Render {
        ip_families: IpFamilies::Dual,
        ..Render::default()
    };
    let args = run_args(&agent_argv(&agent_container(&objects(&render))));
    let joined = |v: &[ipnet::IpNet]| {
        v.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    };
    assert_eq!(
        joined(&args.cluster_cidr),
        net["podSubnet"].as_str().unwrap()
    );
    assert_eq!(
        joined(&args.service_cluster_ip_range),
        net["serviceSubnet"].as_str().unwrap()
    );
    assert!(
        args.nodeport_addresses.is_empty(),
        "nodePorts on every node address, of both families"
    );
    assert!(args.cluster_cidr.iter().any(|n| n.addr().is_ipv6()));
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
            ..Render::default()
        };
        let objects = objects(&render);
        let container = agent_container(&objects);
        let args = run_args(&agent_argv(&container));
        assert_eq!(args.backend, backend, "rendered for {name}");
        assert_eq!(args.hostname_override.as_deref(), Some(NODE_NAME));
        fn cidrs<T: ToString>(v: &[T]) -> Vec<String> {
            v.iter().map(ToString::to_string).collect()
        }
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
    for flag in AGENT_FLAGS
        .iter()
        .chain(kpr_tests::agent::HARNESS_FLAGS.iter())
    {
        assert!(
            given.contains(flag),
            "the DaemonSet does not pass {flag} (given: {given:?})"
        );
    }
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
    // The toolchains as `cargo xtask setup` installs them: LLVM 22 from the same packages, the
    // nightly from the file that pins it (proxy/build.rs builds the eBPF crate with that one, so
    // a bare `nightly` would be a different compiler), bpf-linker with the same features.
    for package in [
        "llvm-22-dev",
        "libpolly-22-dev",
        "libzstd-dev",
        "zlib1g-dev",
    ] {
        assert!(
            xtask::setup::APT_PACKAGES.contains(&package) && build.contains(package),
            "{package}"
        );
    }
    assert!(
        build.contains("COPY proxy-ebpf/rust-toolchain.toml "),
        "the nightly is read from proxy-ebpf/rust-toolchain.toml"
    );
    let channel = xtask::setup::pinned_nightly().unwrap();
    assert!(
        !text.contains(&channel),
        "the pin ({channel}) is read from the file, not copied into the Dockerfile"
    );
    assert!(
        build.contains(
            r#"rustup toolchain install "$channel" --profile minimal --component rust-src"#
        ),
        "{build}"
    );
    assert!(
        !build.contains("toolchain install nightly"),
        "not the moving `nightly`"
    );
    assert!(
        build.contains("grep -q '^LLVM version: 22\\.'"),
        "the nightly's LLVM is checked"
    );
    assert!(build.contains(
        "LLVM_PREFIX=/usr/lib/llvm-22 LLVM_SYS_221_PREFIX=/usr/lib/llvm-22 \\\n    cargo install \
         bpf-linker --locked --no-default-features --features llvm-22"
    ));
    let setup = fs::read_to_string(xtask::workspace_root().join("xtask/src/setup.rs")).unwrap();
    for same in [
        "\"--features\",\n            \"llvm-22\",",
        r#".env("LLVM_SYS_221_PREFIX", LLVM_PREFIX)"#,
        r#"const LLVM_PREFIX: &str = "/usr/lib/llvm-22";"#,
    ] {
        assert!(
            setup.contains(same),
            "setup.rs changed ({same}): update the Dockerfile with it"
        );
    }
    assert!(build.contains("cargo build --release --locked -p proxy -p controllers --bins"));
    assert!(build.contains(
        "cp target/release/proxy target/release/controller-manager target/release/scheduler /out/"
    ));
    assert!(
        !text.contains("KPR_SKIP_EBPF=1"),
        "the image's agent has its eBPF programs"
    );
    // The runtime base is an argument (kind --local builds on a Debian base made here, where no
    // registry is reachable); its default is the small Debian one.
    assert!(
        text.contains("\nARG RUNTIME_BASE=debian:bookworm-slim\n")
            && runtime.starts_with("${RUNTIME_BASE}"),
        "a small Debian base"
    );
    for package in ["nftables", "iptables", "conntrack"] {
        assert!(
            runtime.contains(package),
            "the runtime image installs {package}"
        );
    }
    assert!(runtime.contains(
        "COPY --from=build /out/proxy /out/controller-manager /out/scheduler /usr/local/bin/"
    ));
    let ignore = deploy_file("Dockerfile.dockerignore");
    assert!(
        ignore.lines().any(|l| l == "target"),
        "target/ stays out of the build context"
    );
}

/// kpr's scheduler runs as a second scheduler under its own schedulerName, with kube-scheduler's
/// rights it needs, and the real binary accepts its arguments and configuration.
#[test]
fn scheduler_runs_as_a_second_scheduler_with_its_own_name() {
    let objects = objects(&Render::default());
    let deployment = objects.deployment(deploy::SCHEDULER_DEPLOYMENT);
    let pod = deployment
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .clone()
        .unwrap();
    assert_eq!(pod.service_account_name.as_deref(), Some("kpr-scheduler"));
    assert_eq!(
        pod.scheduler_name, None,
        "kube-scheduler places the scheduler itself"
    );
    let container = &pod.containers[0];
    assert_eq!(
        container.command.as_deref(),
        Some(&["/usr/local/bin/scheduler".to_owned()][..])
    );
    let security = container.security_context.clone().unwrap();
    assert_eq!(security.run_as_non_root, Some(true));
    assert_eq!(security.allow_privilege_escalation, Some(false));
    // The configuration: the ConfigMap's key, mounted where --config points.
    let args = container.args.clone().unwrap_or_default();
    let config_path = args
        .iter()
        .find_map(|a| a.strip_prefix("--config="))
        .expect("--config");
    let mount = container
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| config_path.starts_with(&format!("{}/", m.mount_path)))
        .expect("the config file is mounted");
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == mount.name)
        .unwrap();
    let cm_name = volume.config_map.as_ref().unwrap().name.clone();
    let cm = objects
        .config_maps
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some(cm_name.as_str()))
        .unwrap();
    let key = Path::new(config_path)
        .file_name()
        .unwrap()
        .to_str()
        .unwrap();
    let config = cm.data.as_ref().unwrap().get(key).expect("the mounted key");
    let parsed: serde_json::Value = serde_saphyr::from_str(config).unwrap();
    assert_eq!(parsed["profiles"][0]["schedulerName"], "kpr-scheduler");
    assert_eq!(parsed["profiles"].as_array().unwrap().len(), 1);
    assert_eq!(parsed["leaderElection"]["resourceName"], "kpr-scheduler");
    // What kube-scheduler's system:kube-scheduler grants and this scheduler uses.
    let role = objects.cluster_role("kpr-scheduler");
    let rules = role.rules.as_deref().unwrap_or_default();
    for (group, resource, verb) in [
        ("", "pods", "watch"),
        ("", "pods", "delete"),
        ("", "pods/binding", "create"),
        ("", "pods/status", "patch"),
        ("", "nodes", "list"),
        ("", "namespaces", "list"),
        ("", "services", "list"),
        ("", "replicationcontrollers", "list"),
        ("apps", "replicasets", "list"),
        ("apps", "statefulsets", "list"),
        ("policy", "poddisruptionbudgets", "list"),
        ("", "events", "create"),
    ] {
        assert!(
            grants(rules, group, resource, verb),
            "{verb} {group}/{resource}"
        );
    }
    assert!(
        !rules.iter().any(|r| r.verbs.iter().any(|v| v == "*")
            || r.resources
                .iter()
                .flatten()
                .any(|x| x == "*" || x == "secrets")),
        "no wildcard, no secrets"
    );
    // The real binary gets past its flags and the configuration file, then fails on the missing
    // kubeconfig.
    let binary = kpr_tests::agent::proxy_binary()
        .unwrap()
        .with_file_name("scheduler");
    assert!(
        binary.is_file(),
        "no {}: cargo build -p controllers --bins (cargo xtask test does)",
        binary.display()
    );
    let dir = std::env::temp_dir().join(format!("{}-scheduler", kpr_tests::netns::unique_prefix()));
    fs::create_dir_all(&dir).unwrap();
    let file = dir.join(key);
    fs::write(&file, config).unwrap();
    let args: Vec<String> = args
        .iter()
        .map(|a| match a.strip_prefix("--config=") {
            Some(_) => format!("--config={}", file.display()),
            None => a.replace("0.0.0.0:10259", "127.0.0.1:0"),
        })
        .collect();
    let out = std::process::Command::new(&binary)
        .args(&args)
        .arg("--kubeconfig")
        .arg(dir.join("no-such-kubeconfig"))
        .env_remove("KUBECONFIG")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    fs::remove_dir_all(&dir).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_ne!(
        out.status.code(),
        Some(2),
        "clap rejected {args:?}:\n{stderr}"
    );
    assert!(
        !stderr.contains("--config"),
        "the configuration is rejected: {stderr}"
    );
    assert!(
        stderr.contains("kubeconfig"),
        "{args:?} parsed, then: {stderr}"
    );
}

/// The `kube-proxy` ConfigMap `kubeadm init` (v1.34) writes, for a cluster whose kube-proxy runs
/// in nftables mode (`KubeProxyConfiguration` `mode: nftables` in kubeadm's config) with kind's
/// pod subnet: `config.conf` has every v1alpha1 field, most null or zero for kube-proxy to default.
const KUBEADM_KUBE_PROXY_CONFIGMAP: &str = r#"apiVersion: v1
kind: ConfigMap
metadata:
  name: kube-proxy
  namespace: kube-system
  labels:
    app: kube-proxy
data:
  config.conf: |-
    apiVersion: kubeproxy.config.k8s.io/v1alpha1
    bindAddress: 0.0.0.0
    bindAddressHardFail: false
    clientConnection:
      acceptContentTypes: ""
      burst: 0
      contentType: ""
      kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
      qps: 0
    clusterCIDR: 10.244.0.0/16
    configSyncPeriod: 0s
    conntrack:
      maxPerCore: null
      min: null
      tcpBeLiberal: false
      tcpCloseWaitTimeout: null
      tcpEstablishedTimeout: null
      udpStreamTimeout: 0s
      udpTimeout: 0s
    detectLocal:
      bridgeInterface: ""
      interfaceNamePrefix: ""
    detectLocalMode: ""
    enableProfiling: false
    healthzBindAddress: ""
    hostnameOverride: ""
    iptables:
      localhostNodePorts: null
      masqueradeAll: false
      masqueradeBit: null
      minSyncPeriod: 0s
      syncPeriod: 0s
    ipvs:
      excludeCIDRs: null
      minSyncPeriod: 0s
      scheduler: ""
      strictARP: false
      syncPeriod: 0s
      tcpFinTimeout: 0s
      tcpTimeout: 0s
      udpTimeout: 0s
    kind: KubeProxyConfiguration
    logging:
      flushFrequency: 0
      options:
        json:
          infoBufferSize: "0"
        text:
          infoBufferSize: "0"
      verbosity: 0
    metricsBindAddress: ""
    mode: nftables
    nftables:
      masqueradeAll: false
      masqueradeBit: null
      minSyncPeriod: 0s
      syncPeriod: 0s
    nodePortAddresses: null
    oomScoreAdj: null
    portRange: ""
    showHiddenMetricsForVersion: ""
    winkernel:
      enableDSR: false
      forwardHealthCheckVip: false
      networkName: ""
      rootHnsEndpointName: ""
      sourceVip: ""
  kubeconfig.conf: |-
    apiVersion: v1
    kind: Config
    clusters:
    - cluster:
        certificate-authority: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt
        server: https://kpr-control-plane:6443
      name: default
    contexts:
    - context:
        cluster: default
        namespace: default
        user: default
      name: default
    current-context: default
    users:
    - name: default
      user:
        tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token
"#;

/// The cluster's kube-proxy ConfigMap, given to `proxy run --config` with only the flags that have
/// no KubeProxyConfiguration field (and kubeadm's own `--hostname-override`), resolves to what the
/// DaemonSet's flags give today.
#[test]
fn kubeadms_kube_proxy_configmap_resolves_like_the_daemonsets_flags() {
    use proxy::kube_proxy_config::{apply, parse, Severity};
    let objects = objects(&Render::default());
    let flags_argv = agent_argv(&agent_container(&objects));
    let from_flags = run_args(&flags_argv);
    assert_eq!(from_flags.config, None, "the DaemonSet passes flags only");

    let cm: k8s_openapi::api::core::v1::ConfigMap =
        serde_saphyr::from_str(KUBEADM_KUBE_PROXY_CONFIGMAP).unwrap();
    let conf = &cm.data.as_ref().unwrap()["config.conf"];
    // The DaemonSet's flags that a KubeProxyConfiguration cannot express (kpr's own) or that
    // kubeadm's kube-proxy DaemonSet passes itself (--hostname-override).
    let kept = [
        "--source=",
        "--balance=",
        "--service-cluster-ip-range=",
        "--udp-idle-timeout=",
        "--cgroup-path=",
        "--bpffs-path=",
        "--sysctl-net-path=",
        "--hostname-override=",
        "--nodeport-addresses=",
        "--readiness-bind-address=",
        "--cleanup-other-backends",
    ];
    let mut file_argv: Vec<String> = vec![
        "proxy".into(),
        "run".into(),
        "--config=/var/lib/kube-proxy/config.conf".into(),
    ];
    file_argv.extend(
        flags_argv
            .iter()
            .filter(|a| kept.iter().any(|k| a.starts_with(k)))
            .cloned(),
    );
    assert_eq!(
        file_argv.len(),
        3 + kept.len(),
        "each kept flag is in the DaemonSet: {flags_argv:?}"
    );
    let (mut from_file, findings) = apply(&parse(conf).unwrap(), &run_args(&file_argv)).unwrap();
    assert!(
        findings.iter().all(|f| f.severity < Severity::Warning),
        "{findings:?}"
    );
    // kubeadm's file names the kubeconfig of the same ConfigMap (the Pod's service account and
    // the API server's address, as the DaemonSet's in-cluster client with KUBERNETES_SERVICE_HOST).
    assert_eq!(
        from_file.kubeconfig.as_deref(),
        Some(Path::new("/var/lib/kube-proxy/kubeconfig.conf"))
    );
    from_file.kubeconfig = None;
    let mut from_flags = from_flags;
    from_file.given.clear();
    from_flags.given.clear();
    assert_eq!(from_file, from_flags);
}
