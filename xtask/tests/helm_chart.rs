//! The Helm chart (deploy/helm/kpr) with Helm itself (built by `cargo xtask setup --helm`):
//! `helm lint --strict` for each value set below; `helm template` of each, parsed into k8s-openapi
//! types (round trip, as deploy_manifests.rs does for deploy/), the agent's arguments parsed by
//! the agent's own command line, and every rendered set accepted by the real API server
//! (`kubectl apply --dry-run=server`, as controlplane_e2e.rs does for deploy/); the defaults render
//! exactly deploy/'s pod specs and RBAC; the RBAC follows the controllers listed; a bad value
//! fails the rendering with a message naming it.
//!
//! `cargo xtask cluster helm` installs, upgrades and uninstalls the chart on real nodes.

mod deploy_common;

use std::collections::BTreeSet;
use std::path::Path;

use k8s_openapi::api::core::v1::PodSpec;
use k8s_openapi::api::rbac::v1::PolicyRule;
use proxy::cli::Backend;
use xtask::deploy::{self, Render};
use xtask::helm;

use deploy_common::*;

/// `helm template kpr <chart> -n <namespace> --set ...`; Err carries helm's message.
fn template(namespace: &str, sets: &[&str]) -> Result<String, String> {
    let mut cmd = std::process::Command::new(helm::binary());
    cmd.envs(helm::home_env())
        .args(["template", "kpr"])
        .arg(helm::chart_dir())
        .args(["--namespace", namespace]);
    for set in sets {
        cmd.args(["--set", set]);
    }
    let out = cmd.output().unwrap_or_else(|e| {
        panic!(
            "running {}: {e} (`cargo xtask setup --helm` builds it)",
            helm::binary().display()
        )
    });
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).expect("helm writes UTF-8"))
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn rendered(namespace: &str, sets: &[&str]) -> String {
    template(namespace, sets).unwrap_or_else(|e| panic!("helm template {sets:?}: {e}"))
}

/// The value sets every check below renders: the defaults (kind, nftables), every backend with
/// dual-stack ranges, the kube-proxy ConfigMap, and the controller-manager and scheduler in each
/// of their modes, in kube-system and in a namespace of its own.
const VALUE_SETS: &[(&str, &[&str])] = &[
    ("kube-system", &[]),
    (
        "kube-system",
        &[
            "agent.backend=ebpf",
            "agent.balance=maglev",
            "agent.maglevTableSize=65537",
            "agent.clusterCIDRs={10.244.0.0/16,fd00:10:244::/56}",
            "agent.serviceCIDRs={10.96.0.0/16,fd00:10:96::/112}",
            "agent.nodePortAddresses=null",
            "agent.masqueradeAll=true",
            "agent.cgroupRoot=/sys/fs/cgroup/unified",
            "apiServer.host=192.0.2.1",
            "apiServer.port=34567",
        ],
    ),
    (
        "kube-system",
        &["agent.backend=iptables", "agent.podSockets=false"],
    ),
    (
        "kube-system",
        &["agent.backend=userspace", "agent.balance=least-conn"],
    ),
    (
        "kube-system",
        &[
            "agent.kubeProxyConfig.enabled=true",
            "apiServer.host=",
            "agent.extraArgs={--conntrack-max-per-core=0}",
            "controllerManager.enabled=true",
            "controllerManager.controllers={*}",
            "controllerManager.lbPool=",
            "scheduler.enabled=true",
            "scheduler.mode=replace",
            "scheduler.nodeName=kpr-control-plane",
        ],
    ),
    (
        "kpr-system",
        &[
            "controllerManager.enabled=true",
            "controllerManager.controllers={lb-ipam,endpointslice,endpoints}",
            "scheduler.enabled=true",
            "scheduler.schedulerName=other-scheduler",
            "scheduler.leaderElect=false",
        ],
    ),
];

#[test]
fn helm_lint_passes_for_every_value_set() {
    for (namespace, sets) in VALUE_SETS {
        let mut cmd = helm::helm(None)
            .args(["lint", "--strict"])
            .arg(helm::chart_dir())
            .args(["--namespace", namespace])
            .quiet();
        for set in *sets {
            cmd = cmd.args(["--set", set]);
        }
        let out = cmd
            .read()
            .unwrap_or_else(|e| panic!("helm lint --strict {sets:?}: {e:#}"));
        assert!(out.contains("0 chart(s) failed"), "{sets:?}: {out}");
    }
}

/// Each value set renders objects that parse without losing a field, and an agent command line
/// the agent accepts with the values asked for.
#[test]
fn every_value_set_renders_objects_and_an_agent_command_line_that_parse() {
    for (namespace, sets) in VALUE_SETS {
        let text = rendered(namespace, sets);
        let objects = objects_of("deploy/helm/kpr", &text);
        let ds = objects.daemon_set(deploy::AGENT_DAEMONSET);
        assert_eq!(ds.metadata.namespace.as_deref(), Some(*namespace));
        let container = pod_spec(ds).containers[0].clone();
        let pod_sockets = !sets.contains(&"agent.podSockets=false");
        assert_agent_privileges(&format!("{sets:?}"), &container, pod_sockets);
        let run = run_args(&agent_argv(&container));
        let set = |key: &str| sets.iter().find_map(|s| s.strip_prefix(&format!("{key}=")));
        let backend = match set("agent.backend").unwrap_or(deploy::DEFAULT_BACKEND) {
            "userspace" => Backend::Userspace,
            "iptables" => Backend::Iptables,
            "nftables" => Backend::Nftables,
            "ebpf" => Backend::Ebpf,
            other => panic!("{other}"),
        };
        assert_eq!(run.backend, backend, "{sets:?}");
        assert_eq!(
            run.balance.to_string(),
            set("agent.balance").unwrap_or("round-robin"),
            "{sets:?}"
        );
        let from_file = set("agent.kubeProxyConfig.enabled") == Some("true");
        assert_eq!(
            run.config.as_deref(),
            from_file.then_some(Path::new("/var/lib/kube-proxy/config.conf")),
            "{sets:?}"
        );
        // With the kube-proxy ConfigMap its fields are not passed as flags (they would win).
        for flag in [
            "cluster_cidr",
            "nodeport_addresses",
            "sync_period",
            "min_sync_period",
        ] {
            assert_eq!(
                !run.was_given(flag),
                from_file
                    || (flag == "nodeport_addresses" && set("agent.nodePortAddresses").is_some()),
                "{flag} given with {sets:?}"
            );
        }
        if !from_file {
            let cidrs: Vec<String> = run.cluster_cidr.iter().map(|c| c.to_string()).collect();
            let expected = set("agent.clusterCIDRs").unwrap_or("{10.244.0.0/16}");
            assert_eq!(format!("{{{}}}", cidrs.join(",")), expected, "{sets:?}");
        }
        let spec = pod_spec(ds);
        let mounts_config = spec.volumes.iter().flatten().any(|v| {
            v.config_map
                .as_ref()
                .is_some_and(|c| c.name == "kube-proxy")
        });
        assert_eq!(mounts_config, from_file, "{sets:?}");
        let env = env_values(&container);
        match set("apiServer.host") {
            Some("") => assert!(!env.contains_key("KUBERNETES_SERVICE_HOST"), "{env:?}"),
            host => {
                assert_eq!(
                    env.get("KUBERNETES_SERVICE_HOST").copied(),
                    Some(host.unwrap_or("kpr-control-plane"))
                );
                assert_eq!(
                    env.get("KUBERNETES_SERVICE_PORT").copied(),
                    Some(set("apiServer.port").unwrap_or("6443"))
                );
            }
        }
        assert!(
            run.cleanup_other_backends,
            "the agent cleans up around its backend: {sets:?}"
        );
    }
}

/// The defaults are deploy/: the same pod specs and RBAC rules as deploy/proxy.yaml,
/// deploy/controller-manager.yaml and deploy/scheduler.yaml (and with every controller, also
/// deploy/workload-controllers.yaml's roles), so the chart and the manifests cannot drift apart.
#[test]
fn the_defaults_render_what_deploy_holds() {
    let chart = objects_of(
        "deploy/helm/kpr",
        &rendered(
            "kube-system",
            &["controllerManager.enabled=true", "scheduler.enabled=true"],
        ),
    );
    let manifests = objects(&Render::default());
    let spec_of_ds = |o: &Objects| pod_spec(o.daemon_set(deploy::AGENT_DAEMONSET)).clone();
    assert_same_pod_spec(
        "DaemonSet kpr-proxy",
        spec_of_ds(&chart),
        spec_of_ds(&manifests),
    );
    for name in [deploy::CONTROLLER_DEPLOYMENT, deploy::SCHEDULER_DEPLOYMENT] {
        let spec = |o: &Objects| {
            o.deployment(name)
                .spec
                .as_ref()
                .and_then(|s| s.template.spec.clone())
                .unwrap()
        };
        assert_same_pod_spec(
            &format!("Deployment {name}"),
            spec(&chart),
            spec(&manifests),
        );
    }
    let scheduler_config = |o: &Objects| {
        o.config_maps
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some("kpr-scheduler"))
            .and_then(|c| c.data.clone())
            .unwrap()
    };
    assert_eq!(scheduler_config(&chart), scheduler_config(&manifests));
    let all = objects_of(
        "deploy/helm/kpr",
        &rendered(
            "kube-system",
            &[
                "controllerManager.enabled=true",
                "controllerManager.controllers={*}",
            ],
        ),
    );
    for role in [
        "kpr-proxy",
        "kpr-controller-manager",
        "kpr-scheduler",
        "kpr-workload-controllers",
        GC_ROLE,
    ] {
        let from = if role == "kpr-scheduler" {
            &chart
        } else {
            &all
        };
        assert_eq!(
            from.cluster_role(role).rules,
            manifests.cluster_role(role).rules,
            "ClusterRole {role}"
        );
    }
    for name in ["kpr-controller-manager", "kpr-scheduler"] {
        let rules = |o: &Objects| -> Option<Vec<PolicyRule>> {
            o.roles
                .iter()
                .find(|r| r.metadata.name.as_deref() == Some(name))
                .and_then(|r| r.rules.clone())
        };
        assert_eq!(rules(&chart), rules(&manifests), "Role {name}");
    }
}

fn assert_same_pod_spec(what: &str, chart: PodSpec, manifest: PodSpec) {
    let chart = serde_json::to_value(chart).unwrap();
    let manifest = serde_json::to_value(manifest).unwrap();
    assert_eq!(
        chart, manifest,
        "{what}: the chart's defaults differ from deploy/"
    );
}

/// Which ClusterRoles the controller-manager gets for the controllers it runs.
#[test]
fn the_controller_managers_rbac_follows_its_controllers() {
    let cases: &[(&str, &[&str])] = &[
        ("{lb-ipam}", &["kpr-controller-manager"]),
        ("{endpointslice,endpoints}", &["kpr-controller-manager"]),
        (
            "{lb-ipam,job}",
            &["kpr-controller-manager", "kpr-workload-controllers"],
        ),
        ("{garbagecollector}", &["kpr-controller-manager", GC_ROLE]),
        (
            "{*}",
            &[
                "kpr-controller-manager",
                "kpr-workload-controllers",
                GC_ROLE,
                "kpr-namespace-controller",
            ],
        ),
        (
            "{*,-garbagecollector,-namespace}",
            &["kpr-controller-manager", "kpr-workload-controllers"],
        ),
        (
            "{namespace}",
            &["kpr-controller-manager", "kpr-namespace-controller"],
        ),
    ];
    for (controllers, roles) in cases {
        let text = rendered(
            "kube-system",
            &[
                "controllerManager.enabled=true",
                &format!("controllerManager.controllers={controllers}"),
            ],
        );
        let objects = objects_of("deploy/helm/kpr", &text);
        let got: BTreeSet<&str> = objects
            .cluster_roles
            .iter()
            .filter_map(|r| r.metadata.name.as_deref())
            .filter(|n| *n != "kpr-proxy")
            .collect();
        assert_eq!(got, roles.iter().copied().collect(), "{controllers}");
        let bound: BTreeSet<&str> = objects
            .cluster_role_bindings
            .iter()
            .map(|b| b.role_ref.name.as_str())
            .filter(|n| *n != "kpr-proxy")
            .collect();
        assert_eq!(bound, got, "{controllers}: each role is bound");
        let args = objects
            .deployment(deploy::CONTROLLER_DEPLOYMENT)
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .map(|s| s.containers[0].args.clone().unwrap_or_default())
            .unwrap();
        let list = controllers.trim_matches(['{', '}']);
        assert!(
            args.contains(&format!("--controllers={list}")),
            "{controllers}: {args:?}"
        );
    }
}

/// A value the chart cannot honour fails the rendering, naming the value.
#[test]
fn bad_values_are_refused_by_name() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["agent.backend=ipvs"],
            "agent.backend: \"ipvs\" is not a kpr backend",
        ),
        (&["apiServer.host="], "apiServer.host is required"),
        (
            &["scheduler.enabled=true", "scheduler.mode=replace"],
            "scheduler.nodeName is required in mode replace",
        ),
        (
            &["scheduler.enabled=true", "scheduler.mode=third"],
            "scheduler.mode: \"third\" is neither second nor replace",
        ),
        (
            &[
                "scheduler.enabled=true",
                "scheduler.schedulerName=default-scheduler",
            ],
            "use scheduler.mode=replace",
        ),
        (
            &[
                "controllerManager.enabled=true",
                "controllerManager.controllers=null",
            ],
            "controllerManager.controllers: list the controllers",
        ),
    ];
    for (sets, message) in cases {
        let err = template("kube-system", sets).expect_err(&format!("{sets:?} renders"));
        assert!(err.contains(message), "{sets:?}: {err}");
    }
}

/// Every value set is accepted by the real API server's validation and admission.
#[test]
fn every_value_set_passes_a_server_side_dry_run() {
    let cp = controlplane::shared().unwrap();
    cp.create_namespace("kpr-system").unwrap();
    for (namespace, sets) in VALUE_SETS {
        let text = rendered(namespace, sets);
        let out = cp
            .kubectl_run(&["apply", "--dry-run=server", "-f", "-"], Some(&text))
            .unwrap_or_else(|e| panic!("{sets:?}: {e:#}"));
        let applied = out
            .lines()
            .filter(|l| l.contains("(server dry run)"))
            .count();
        assert_eq!(
            applied,
            documents("deploy/helm/kpr", &text).len(),
            "{sets:?}: every object is accepted:\n{out}"
        );
    }
}
