//! The DaemonSet's own command line, for backends `backends`, run for real: the agent starts in the
//! node namespace of a namespace cluster with exactly the DaemonSet's arguments (the downward API
//! values filled in as the kubelet would), except `--source=kube` (no API server here: the file
//! source gets the same objects) and the host paths (a temp directory instead of the node's
//! /run/kpr mounts). Its liveness and readiness probes must pass as the kubelet runs them
//! (GET http://<node IP>:10266, kpr's readiness address), `proxy inspect` with its default address (what
//! `kubectl exec ds/kpr-proxy -- proxy inspect` runs) must show the Service, and the ClusterIP and
//! the NodePort on `--nodeport-addresses=$(NODE_IP)/32` must reach the endpoint. A table another
//! backend left behind before the agent started must be gone after its first sync
//! (`--cleanup-other-backends`).

use std::fs;
use std::net::{SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Probe;
use kpr_tests::cluster::{ClusterSpec, NODE_IP as HARNESS_NODE_IP, NODE_NAME as HARNESS_NODE};
use kpr_tests::netns::unique_prefix;
use kpr_tests::{http_get, tcp_request, yaml, Cluster, EndpointSlice, Service};

use xtask::deploy::{self, Render};

mod deploy_common;

use deploy_common::*;

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
    harness_argv(&agent_container(&objects(&render)), dir)
}

/// `container`'s agent argv as [`daemonset_argv`] has it; a `--config` points at
/// `dir/config.conf`.
fn harness_argv(container: &k8s_openapi::api::core::v1::Container, dir: &Path) -> Vec<String> {
    let argv = agent_argv(container);
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
            Some(("--config", _)) => format!("--config={}", dir.join("config.conf").display()),
            _ => a,
        })
        .collect()
}

fn start(cluster: &Cluster, backend: &str) -> Running {
    let dir = std::env::temp_dir().join(format!("{}-daemonset-args", unique_prefix()));
    let args = daemonset_argv(backend, &dir);
    assert!(args.contains(&format!("--backend={backend}")), "{args:?}");
    start_with(cluster, dir, &args)
}

/// The agent in `cluster`'s node with `args` (their file source is `dir/manifests`, written
/// here: a NodePort Service with every pod as its endpoint).
fn start_with(cluster: &Cluster, dir: PathBuf, args: &[String]) -> Running {
    fs::create_dir_all(dir.join("manifests")).unwrap();
    let svc = Service::new("web")
        .cluster_ip("10.96.0.10")
        .tcp(80, 8080)
        .named("http")
        .node_port(30080);
    let slice = EndpointSlice::for_service(&svc).ready_all(cluster.pod_ips());
    fs::write(dir.join("manifests/web.yaml"), yaml(&[&svc, &slice])).unwrap();
    let log = fs::File::create(dir.join("agent.log")).unwrap();
    let child = cluster
        .node
        .exec(kpr_tests::agent::proxy_binary().unwrap())
        .unwrap()
        .args(args)
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

/// Plants a table another backend leaves behind, before the agent starts; returns it.
fn plant_other_backends_table(cluster: &Cluster, backend: &str) -> &'static str {
    let (_, table) = LEFTOVERS.iter().find(|(b, _)| *b != backend).unwrap();
    let planted = nft(cluster, &format!("add table {table}"));
    assert!(planted.status.success(), "planting {table}: {planted:?}");
    table
}

/// The agent (`--cleanup-other-backends`, as the DaemonSet runs it) removes the planted table
/// once its first sync is done, and says so. The line is logged once every other backend is
/// cleaned, which can be after the planted table is gone: both are waited for.
fn other_backends_cleaned_up(cluster: &Cluster, running: &Running, backend: &str, table: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let gone = !nft(cluster, &format!("list table {table}"))
            .status
            .success();
        let log = running.log();
        let logged = log.contains("backend's state is cleaned up");
        if gone && logged {
            let programmed = log.find("initial listing programmed");
            let cleaned = log.find("backend's state is cleaned up");
            assert!(
                matches!((programmed, cleaned), (Some(p), Some(c)) if p < c),
                "{backend}: the cleanup is logged after the first sync:\n{log}"
            );
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{backend}: 10 s after start, the other backend's table {table} is {} and the \
             cleanup is {}logged:\n{log}",
            if gone { "gone" } else { "still there" },
            if logged { "" } else { "not " },
        );
        sleep(Duration::from_millis(100));
    }
}

/// The privileged `mount-bpffs` init container's script, run twice in a private mount namespace
/// on a plain directory standing for the node's /sys/fs/bpf: the first run mounts bpffs there,
/// the second sees it and mounts nothing. Under the host's shell and stat (GNU, as in
/// deploy/Dockerfile's image) and under busybox's (as in the image `cargo xtask cluster` builds,
/// whose stat has no name for bpffs: the script once mounted a new one on every start there).
#[test]
fn mount_bpffs_init_container_mounts_bpffs_once() {
    for shell in ["sh", "/bin/busybox sh"] {
        mount_bpffs_once_under(shell);
    }
}

fn mount_bpffs_once_under(shell: &str) {
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
        "{script} && {script} && stat -f -c %t {d} && grep -c ' {d} ' /proc/self/mounts",
        d = dir.display()
    );
    // unshare: the mount lives and dies with this private mount namespace.
    let out = std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private"])
        .args(shell.split(' '))
        .args(["-c", &check])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let _ = fs::remove_dir(&dir);
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{shell}: {check}: {printed}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        printed.lines().collect::<Vec<_>>(),
        ["cafe4a11", "1"],
        "{shell}: mounted once: {printed}"
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
fn daemonset_runs_an_agent_that_passes_its_probes_serves_and_cleans_up_the_other_backends() {
    for backend in BACKENDS {
        let cluster = Cluster::new(ClusterSpec::pods(1)).unwrap();
        let table = plant_other_backends_table(&cluster, backend);
        let running = start(&cluster, backend);
        let container = agent_container(&objects(&Render::default()));
        kubelet_probe(
            &cluster,
            "readiness",
            container.readiness_probe.as_ref().unwrap(),
            Duration::from_secs(20),
        );
        other_backends_cleaned_up(&cluster, &running, backend, table);
        kubelet_probe(
            &cluster,
            "liveness",
            container.liveness_probe.as_ref().unwrap(),
            T,
        );
        let inspect = proxy_inspect(&cluster);
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
        let via_cluster_ip = tcp_request(&cluster.podclient, "10.96.0.10:80".parse().unwrap(), T);
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

/// `proxy inspect` in the node's namespace (its default address, as `kubectl exec` runs it).
fn proxy_inspect(cluster: &Cluster) -> std::process::Output {
    cluster
        .node
        .exec(kpr_tests::agent::proxy_binary().unwrap())
        .unwrap()
        .arg("inspect")
        .output()
        .unwrap()
}

/// What an agent serves, as a user reads it: `proxy inspect` without its first line (the sync's
/// timing) and the nftables table it programmed.
fn served(cluster: &Cluster, what: &str) -> (String, String) {
    let container = agent_container(&objects(&Render::default()));
    kubelet_probe(
        cluster,
        &format!("{what}: readiness"),
        container.readiness_probe.as_ref().unwrap(),
        Duration::from_secs(20),
    );
    let inspect = proxy_inspect(cluster);
    assert!(
        inspect.status.success(),
        "{what}: proxy inspect: {inspect:?}"
    );
    let inspect = String::from_utf8_lossy(&inspect.stdout);
    let table = nft(cluster, "list table ip kpr");
    assert!(
        table.status.success(),
        "{what}: nft list table ip kpr: {table:?}"
    );
    (
        inspect.lines().skip(1).collect::<Vec<_>>().join("\n"),
        String::from_utf8_lossy(&table.stdout).into_owned(),
    )
}

/// kube-proxy's own configuration, the `kube-proxy` ConfigMap of the real-node cluster
/// (xtask/k8s/manifests/kube-proxy.yaml, what kubeadm makes), fed to the agent as the chart
/// passes it (`agent.kubeProxyConfig.enabled`: `--config` and only the flags the file has no
/// field for), gives the same `proxy inspect` and the same nftables table as deploy/proxy.yaml's
/// flags; a field kpr does not know is named in the log, and nothing else changes.
#[test]
fn kube_proxys_configmap_gives_what_the_daemonsets_flags_give() {
    let flags = {
        let cluster = Cluster::new(ClusterSpec::pods(2)).unwrap();
        let running = start(&cluster, deploy::DEFAULT_BACKEND);
        let got = served(&cluster, "deploy/proxy.yaml's flags");
        drop(running);
        got
    };
    let chart = std::process::Command::new(xtask::helm::binary())
        .envs(xtask::helm::home_env())
        .args(["template", "kpr"])
        .arg(xtask::helm::chart_dir())
        .args(["--namespace", deploy::SYSTEM_NAMESPACE])
        .args(["--set", "agent.kubeProxyConfig.enabled=true"])
        .output()
        .unwrap_or_else(|e| panic!("helm ({e}): `cargo xtask setup --helm` builds it"));
    assert!(chart.status.success(), "helm template: {chart:?}");
    let chart = objects_of("deploy/helm/kpr", &String::from_utf8_lossy(&chart.stdout));
    let configmap =
        xtask::cluster::nodes::kube_proxy_configmap_for(6443, deploy::IpFamilies::Ipv4).unwrap();
    let config: k8s_openapi::api::core::v1::ConfigMap = serde_saphyr::from_str(&configmap).unwrap();
    let config = config.data.unwrap()["config.conf"].clone();
    for (what, text) in [
        ("the cluster's kube-proxy ConfigMap", config.clone()),
        (
            "that ConfigMap with a field kpr does not know",
            format!("{config}notAKubeProxyField: 1\n"),
        ),
    ] {
        let cluster = Cluster::new(ClusterSpec::pods(2)).unwrap();
        let dir = std::env::temp_dir().join(format!("{}-kube-proxy-config", unique_prefix()));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("config.conf"), &text).unwrap();
        let args = harness_argv(&agent_container(&chart), &dir);
        for dropped in ["--cluster-cidr", "--nodeport-addresses", "--sync-period"] {
            assert!(
                !args.iter().any(|a| a.starts_with(dropped)),
                "{what}: the chart passes {dropped} beside --config: {args:?}"
            );
        }
        assert!(args.iter().any(|a| a.starts_with("--config=")), "{args:?}");
        let running = start_with(&cluster, dir, &args);
        let got = served(&cluster, what);
        let log = running.log();
        drop(running);
        assert_eq!(got.0, flags.0, "{what}: proxy inspect differs\n{log}");
        assert_eq!(got.1, flags.1, "{what}: the nftables table differs\n{log}");
        assert_eq!(
            log.contains("notAKubeProxyField"),
            text.contains("notAKubeProxyField"),
            "{what}: the unknown field is named, and only then:\n{log}"
        );
    }
}
