//! Real Kubernetes nodes on this machine: per node a containerd and a kubelet of the pinned
//! release, both in the node's network namespace (see [`crate::network`]), so the node's
//! hostNetwork pods (kube-proxy, kpr's agent) and its Service rules live there and nowhere else.
//! Pods get their addresses from the CNI bridge and host-local plugins (Debian's
//! containernetworking-plugins) in the node's pod CIDR.
//!
//! What this machine imposes, and why the configuration says so: cgroups are v1 (hybrid) and
//! there is no systemd, so the cgroup driver is cgroupfs and each kubelet gets a cgroup root of
//! its own (`/<node>`), which is also how [`teardown`] finds every container process; the VM
//! drops CAP_SYS_RESOURCE, so containerd must not lower oom_score_adj
//! (`restrict_oom_score_adj`); images are imported, never pulled: every registry's name is the
//! node's loopback in its /etc/hosts ([`CLOSED_REGISTRIES`]), so a missing image fails at once
//! and no registry name is looked up; image garbage collection is off so imported images stay.
//!
//! Owns: `<dir>/nodes/<node>` (configuration, state, logs' content), the cgroups `/<node>` and the
//! mounts containerd and kubelet make under the node directory. Not the namespaces
//! ([`crate::network`]) nor the control plane.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use serde_json::json;

use crate::cluster::{find_program, ControlPlane};
use crate::network::NodeAddress;

/// The cluster DNS Service's address and domain the kubelets hand to pods.
pub const CLUSTER_DNS: &str = "10.96.0.10";
pub const CLUSTER_DOMAIN: &str = "cluster.local";
/// The sandbox image containerd runs every pod's network holder from.
pub const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10.1";
/// The registries the nodes' containerd would pull from, each resolved to the node's own
/// loopback in the /etc/hosts containerd and kubelet see (their mount namespace's): nothing can be
/// pulled here (the images the nodes run are imported), so a pull fails at once with the image's
/// name (`dial tcp 127.0.0.1:443: connect: connection refused`) and no registry's name is sent
/// to the machine's resolver. upstream's e2e images name registry.k8s.io, gcr.io and
/// invalid.registry.k8s.io; the others are where manifests commonly pull from. (Debian 12's
/// containerd 1.6.20 did not apply a `server` of `certs.d/<registry>/hosts.toml`: it still
/// looked registry.k8s.io up.)
pub const CLOSED_REGISTRIES: &[&str] = &[
    "registry.k8s.io",
    "invalid.registry.k8s.io",
    "k8s.gcr.io",
    "gcr.io",
    "docker.io",
    "registry-1.docker.io",
    "index.docker.io",
    "quay.io",
    "ghcr.io",
    "mcr.microsoft.com",
    "public.ecr.aws",
];
/// Where kind's local-path-provisioner keeps a node's volumes: each node's own (see
/// start_containerd).
pub const LOCAL_PATH_DIR: &str = "/var/local-path-provisioner";

/// Where kubelet keeps its device-plugin socket, whatever its `--root-dir`: a node's own
/// directory is mounted there in its mount namespace.
pub const DEVICE_PLUGINS_DIR: &str = "/var/lib/kubelet/device-plugins";
/// Where Debian's containernetworking-plugins are.
const CNI_BIN_DIR: &str = "/usr/lib/cni";
/// The cgroup2 hierarchy of this hybrid-cgroup machine.
const CGROUP2_ROOT: &str = "/sys/fs/cgroup/unified";
/// cgroup v1 controllers a kubelet needs (its cgroup root must exist in each).
const CGROUP_CONTROLLERS: &[&str] = &[
    "cpu", "cpuacct", "cpuset", "memory", "pids", "blkio", "devices", "freezer", "hugetlb",
    "systemd",
];

/// One running node's files.
#[derive(Debug, Clone)]
pub struct Node {
    pub address: NodeAddress,
    pub dir: PathBuf,
}

impl Node {
    pub fn containerd_socket(&self) -> PathBuf {
        self.dir.join("containerd.sock")
    }

    /// `ctr` against this node's containerd, in the `k8s.io` namespace kubelet uses.
    pub fn ctr(&self) -> anyhow::Result<Command> {
        let mut cmd = Command::new(find_program("ctr")?);
        cmd.arg("--address")
            .arg(self.containerd_socket())
            .args(["--namespace", "k8s.io"]);
        Ok(cmd)
    }

    /// Imports an image archive into the node's containerd.
    pub fn import_image(&self, archive: &Path) -> anyhow::Result<()> {
        let out = self
            .ctr()?
            .args(["images", "import", "--no-unpack"])
            .arg(archive)
            .output()?;
        if !out.status.success() {
            bail!(
                "importing {} into {}: {}",
                archive.display(),
                self.address.name,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }
}

/// Starts containerd, imports `images`, then starts the kubelet of every node; returns once
/// every kubelet has registered its Node (Ready comes when a CNI configuration exists, which is
/// written before).
pub fn start(
    cp: &mut ControlPlane,
    nodes: &[NodeAddress],
    images: &[PathBuf],
) -> anyhow::Result<Vec<Node>> {
    let mut started = Vec::new();
    for address in nodes {
        let node = Node {
            address: address.clone(),
            dir: cp.dir.join("nodes").join(&address.name),
        };
        fs::create_dir_all(&node.dir)?;
        make_cgroup_root(&address.name)?;
        start_containerd(cp, &node)?;
        started.push(node);
    }
    for node in &started {
        wait_containerd(cp, node)?;
    }
    // Every node's imports at once (each node's one after the other: they share its content
    // store's lock).
    let imported = Instant::now();
    std::thread::scope(|scope| {
        let workers: Vec<_> = started
            .iter()
            .map(|node| {
                scope.spawn(move || -> anyhow::Result<()> {
                    for image in images {
                        node.import_image(image)?;
                    }
                    Ok(())
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().expect("an image import thread panicked"))
    })?;
    println!(
        "[ok] {} images imported into {} nodes in {:.1} s",
        images.len(),
        started.len(),
        imported.elapsed().as_secs_f64()
    );
    for node in &started {
        start_kubelet(cp, node)?;
    }
    Ok(started)
}

/// The machine's /etc/hosts with every [`CLOSED_REGISTRIES`] name on 127.0.0.1, for the node's
/// mount namespace.
fn write_closed_hosts(path: &Path) -> anyhow::Result<()> {
    let mut hosts = fs::read_to_string("/etc/hosts").unwrap_or_default();
    if !hosts.is_empty() && !hosts.ends_with('\n') {
        hosts.push('\n');
    }
    hosts.push_str("# Nothing is pulled on this node: its images are imported.\n");
    hosts.push_str(&format!("127.0.0.1 {}\n", CLOSED_REGISTRIES.join(" ")));
    fs::write(path, hosts)?;
    Ok(())
}

fn start_containerd(cp: &mut ControlPlane, node: &Node) -> anyhow::Result<()> {
    let dir = &node.dir;
    let cni_conf = dir.join("cni");
    fs::create_dir_all(&cni_conf)?;
    // One range per family: a dual-stack node's pods get an address of each.
    let mut ranges = vec![json!([{"subnet": node.address.pod_cidr}])];
    let mut routes = vec![json!({"dst": "0.0.0.0/0"})];
    if let Some(v6) = &node.address.v6 {
        ranges.push(json!([{"subnet": v6.pod_cidr}]));
        routes.push(json!({"dst": "::/0"}));
    }
    let conflist = json!({
        "cniVersion": "0.4.0",
        "name": "kpr-cluster",
        "plugins": [
            {
                "type": "bridge", "bridge": "cni0", "isGateway": true,
                // Pods keep their address to every destination: the cluster network routes the
                // pod CIDRs (kindnet does the same).
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": ranges,
                    "routes": routes,
                    "dataDir": dir.join("cni-ipam"),
                }
            },
            {"type": "portmap", "capabilities": {"portMappings": true}}
        ]
    });
    fs::write(
        cni_conf.join("10-kpr-cluster.conflist"),
        serde_json::to_string_pretty(&conflist)?,
    )?;
    let hosts = dir.join("hosts");
    write_closed_hosts(&hosts)?;
    let config = format!(
        r#"version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{socket}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{cni_conf}"
"#,
        root = dir.join("containerd/root").display(),
        state = dir.join("containerd/state").display(),
        socket = node.containerd_socket().display(),
        cni_conf = cni_conf.display(),
    );
    let config_path = dir.join("containerd.toml");
    fs::write(&config_path, config)?;
    let containerd = find_program("containerd")?;
    // The node's own UTS namespace (hostNetwork pods see the node's name as their hostname) and
    // mount namespace, as a kind node's container has: its own /run/netns (containerd's pod
    // namespaces are not left as files on this machine when the node goes), a bpffs of its own (two
    // nodes' agents must not share pins), its cgroup v2 subtree seen as the cgroup2 root (where
    // kpr's socket programs attach, covering this node's pods and nothing else), and shared
    // propagation (pods' Bidirectional mounts need it). kubelet joins it (see start_kubelet).
    // Its /var/local-path-provisioner is its own too (a directory of the node's): where kind's
    // local-path-provisioner keeps a node's volumes (xtask's `cluster up --local-path`), so a
    // volume made on one node is on that node only, as on kind's node containers.
    let name = &node.address.name;
    let local_path = dir.join("local-path-provisioner");
    fs::create_dir_all(&local_path)?;
    // kubelet's device-plugin socket is at a fixed path whatever its --root-dir
    // (/var/lib/kubelet/device-plugins/kubelet.sock): nodes sharing it race at start (one
    // kubelet removes the other's socket, or fails with "address already in use"), so each
    // node has its own directory there.
    let device_plugins = dir.join("device-plugins");
    fs::create_dir_all(&device_plugins)?;
    let script = dir.join("containerd.sh");
    fs::write(
        &script,
        format!(
            "#!/bin/sh\nset -e\necho $$ > {v2}/{name}/cgroup.procs\n\
             exec unshare --mount --uts --propagation private -- /bin/sh -c '\
             set -e; hostname {name}; mount --make-rshared /; mount -t bpf bpffs /sys/fs/bpf; \
             mkdir -p /run/netns; mount -t tmpfs -o mode=755 netns /run/netns; \
             mount --bind {v2}/{name} {v2}; mount --bind {hosts} /etc/hosts; \
             mkdir -p {LOCAL_PATH_DIR}; mount --bind {local_path} {LOCAL_PATH_DIR}; \
             mkdir -p {DEVICE_PLUGINS_DIR}; mount --bind {device_plugins} {DEVICE_PLUGINS_DIR}; \
             exec {containerd} --config={config}'\n",
            v2 = CGROUP2_ROOT,
            local_path = local_path.display(),
            device_plugins = device_plugins.display(),
            containerd = containerd.display(),
            config = config_path.display(),
            hosts = hosts.display(),
        ),
    )?;
    cp.spawn_in(
        &format!("{name}-containerd"),
        Path::new("/bin/sh"),
        vec![script.display().to_string()],
        vec![("PATH".into(), system_path())],
        Some(&node.address.netns),
    )
}

fn wait_containerd(cp: &mut ControlPlane, node: &Node) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        cp.check_alive()?;
        if node
            .ctr()?
            .arg("version")
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "{}'s containerd did not answer within 60 s; its log:\n{}",
                node.address.name,
                crate::process::tail(&cp.log(&format!("{}-containerd", node.address.name)), 30)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn start_kubelet(cp: &mut ControlPlane, node: &Node) -> anyhow::Result<()> {
    let name = &node.address.name;
    let dir = node.dir.join("kubelet");
    fs::create_dir_all(&dir)?;
    let stem = format!("node-{name}");
    let cert = cp
        .pki
        .client(&stem, &format!("system:node:{name}"), Some("system:nodes"))?;
    let kubeconfig = dir.join("kubeconfig");
    crate::cluster::write_kubeconfig_file(&kubeconfig, &cp.network_server_url(), &cp.pki, &cert)?;
    // A serving certificate from the cluster CA (as kubeadm's serverTLSBootstrap gets one signed),
    // not the kubelet's self-signed default: clients given the CA (metrics-server's
    // --kubelet-certificate-authority) verify the node by its name and addresses.
    let mut serving_names = vec![name.clone()];
    serving_names.extend(node.address.node_ips().split(',').map(str::to_string));
    let serving_names: Vec<&str> = serving_names.iter().map(String::as_str).collect();
    let serving = cp
        .pki
        .server(&format!("kubelet-serving-{name}"), &serving_names)?;
    let config = json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "authentication": {
            "anonymous": {"enabled": false},
            "webhook": {"enabled": true},
            "x509": {"clientCAFile": cp.pki.ca_cert},
        },
        "authorization": {"mode": "Webhook"},
        "tlsCertFile": serving.cert,
        "tlsPrivateKeyFile": serving.key,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": format!("/{name}"),
        "failCgroupV1": false,
        "failSwapOn": false,
        "containerRuntimeEndpoint": format!("unix://{}", node.containerd_socket().display()),
        "clusterDNS": [CLUSTER_DNS],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": "/etc/resolv.conf",
        "healthzBindAddress": "127.0.0.1",
        "readOnlyPort": 0,
        "serializeImagePulls": false,
        // Imported images are the only copies: never collect them, never evict for disk.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "0%",
                         "nodefs.inodesFree": "0%", "imagefs.available": "0%"},
        "enforceNodeAllocatable": [],
        "volumePluginDir": dir.join("volume-plugins"),
        // Not the machine's /var/log/pods, which every node (of every cluster) shares: a kubelet
        // deletes the directories of pods it does not know there (evictPodLogsDirectories), so
        // `kubectl logs` found nothing for the other nodes' pods.
        "podLogsDir": dir.join("pod-logs"),
        "podCIDR": node.address.pod_cidr,
        "maxPods": 110,
    });
    fs::create_dir_all(dir.join("pod-logs"))?;
    let config_path = dir.join("config.json");
    fs::write(&config_path, serde_json::to_string_pretty(&config)?)?;
    let kubelet = cp.binaries.path("kubelet");
    let containerd_pid = cp
        .pids()
        .into_iter()
        .find(|(n, _)| *n == format!("{name}-containerd"))
        .map(|(_, pid)| pid)
        .with_context(|| format!("{name}'s containerd is not running"))?;
    let args = [
        format!("--config={}", config_path.display()),
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--root-dir={}", dir.join("root").display()),
        format!("--cert-dir={}", dir.join("pki").display()),
        format!("--hostname-override={name}"),
        format!("--node-ip={}", node.address.node_ips()),
        "--v=1".into(),
    ];
    // In containerd's mount namespace (the node's): the volumes kubelet mounts for pods must be
    // where containerd looks for them.
    let script = dir.join("kubelet.sh");
    fs::write(
        &script,
        format!(
            "#!/bin/sh\nset -e\necho $$ > {CGROUP2_ROOT}/{name}/cgroup.procs\n\
             exec nsenter --mount=/proc/{containerd_pid}/ns/mnt --uts=/proc/{containerd_pid}/ns/uts -- {} {}\n",
            kubelet.display(),
            args.join(" ")
        ),
    )?;
    cp.spawn_in(
        &format!("{name}-kubelet"),
        Path::new("/bin/sh"),
        vec![script.display().to_string()],
        vec![("PATH".into(), system_path())],
        Some(&node.address.netns),
    )
}

/// Waits until every node is Ready.
pub fn wait_ready(cp: &mut ControlPlane, nodes: &[Node], timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        cp.check_alive()?;
        let out = cp
            .kubectl_run(
                &[
                    "get",
                    "nodes",
                    "-o",
                    "jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}",
                ],
                None,
            )
            .unwrap_or_default();
        let ready = |name: &str| out.lines().any(|l| l == format!("{name}=True"));
        let pending: Vec<_> = nodes
            .iter()
            .map(|n| n.address.name.as_str())
            .filter(|n| !ready(n))
            .collect();
        if pending.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            let logs: String = pending
                .iter()
                .map(|n| {
                    format!(
                        "--- {n}-kubelet:\n{}\n",
                        crate::process::tail(&cp.log(&format!("{n}-kubelet")), 20)
                    )
                })
                .collect();
            bail!("nodes not Ready after {timeout:?}: {pending:?}\n{logs}");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The cgroup root `/<node>` in every v1 controller (kubelet refuses a root that does not exist;
/// cpuset needs its cpus and mems before tasks may join), and in the cgroup2 hierarchy.
fn make_cgroup_root(node: &str) -> anyhow::Result<()> {
    let v2 = Path::new(CGROUP2_ROOT).join(node);
    fs::create_dir_all(&v2).with_context(|| format!("creating cgroup {}", v2.display()))?;
    for controller in CGROUP_CONTROLLERS {
        let base = Path::new("/sys/fs/cgroup").join(controller);
        if !base.is_dir() {
            continue;
        }
        let dir = base.join(node);
        fs::create_dir_all(&dir).with_context(|| format!("creating cgroup {}", dir.display()))?;
        if *controller == "cpuset" {
            for file in ["cpuset.cpus", "cpuset.mems"] {
                let parent = fs::read_to_string(base.join(file))?;
                fs::write(dir.join(file), parent.trim())
                    .with_context(|| format!("writing {}", dir.join(file).display()))?;
            }
        }
    }
    Ok(())
}

/// Kills every process in the node cgroups `/<node>` (the containers: their shims are gone
/// with containerd, so nothing else would), removes those cgroups, and unmounts what containerd
/// and kubelet mounted under `dir`. Safe to run on a half-started or already removed cluster.
pub fn teardown(node_names: &[String], dir: &Path) {
    for node in node_names {
        let pids_root = Path::new("/sys/fs/cgroup/pids").join(node);
        for _ in 0..20 {
            let pids = cgroup_pids(&pids_root);
            if pids.is_empty() {
                break;
            }
            for pid in pids {
                // SAFETY: kill has no memory effects.
                unsafe {
                    libc::kill(pid as libc::pid_t, libc::SIGKILL);
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    unmount_under(dir);
    for node in node_names {
        for controller in CGROUP_CONTROLLERS {
            remove_cgroup_tree(&Path::new("/sys/fs/cgroup").join(controller).join(node));
        }
        remove_cgroup_tree(&Path::new(CGROUP2_ROOT).join(node));
    }
}

fn cgroup_pids(dir: &Path) -> Vec<u32> {
    let mut pids = Vec::new();
    if let Ok(text) = fs::read_to_string(dir.join("cgroup.procs")) {
        pids.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
    }
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                pids.extend(cgroup_pids(&e.path()));
            }
        }
    }
    pids
}

fn remove_cgroup_tree(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&e.path());
            }
        }
    }
    let _ = fs::remove_dir(dir);
}

/// Unmounts (lazily, deepest first) every mount point under `dir`.
pub fn unmount_under(dir: &Path) {
    let Ok(mountinfo) = fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    // With the separator: `<target>/cluster` must not match `<target>/cluster-sw`'s mounts.
    let prefix = format!("{}/", dir.to_string_lossy());
    let mut points: Vec<String> = mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| p.replace("\\040", " "))
        .filter(|p| p.starts_with(&prefix))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    points.dedup();
    for point in points {
        let Ok(c) = std::ffi::CString::new(point) else {
            continue;
        };
        // SAFETY: a valid C string; MNT_DETACH cannot fail in a way that corrupts memory.
        unsafe {
            libc::umount2(c.as_ptr(), libc::MNT_DETACH);
        }
    }
}

/// The PATH containerd's CNI plugins, runc and kubelet's mount helpers are found on.
fn system_path() -> String {
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string()
}
