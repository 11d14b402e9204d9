//! The real nodes of `cargo xtask cluster up --nodes N`: what they run and what is deployed on
//! them. Builds the images (none can be pulled here: every image is made from files of this
//! machine and imported into each node's containerd), creates the cluster network, starts the
//! nodes, then deploys the Service proxy exactly as a user would (`kubectl apply` of
//! deploy/proxy.yaml for kpr, of xtask/k8s/manifests/kube-proxy.yaml for the reference runs) and
//! CoreDNS.
//!
//! Owns: `<target>/cluster-images` and the deployment order. The node processes and the
//! namespaces are `controlplane::nodes` and `controlplane::network`.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::ValueEnum;
use controlplane::network::{self, ClusterNetwork, GATEWAY};
use controlplane::{ControlPlane, Network};
use deploy::IpFamilies;

use super::{Cluster, UpArgs};
use crate::deploy::{self, Render};
use crate::exec::Cmd;
use crate::{images, target_dir, workspace_root};

/// The Service proxy on the nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Proxy {
    /// kpr's agent, deploy/proxy.yaml.
    Kpr,
    /// kube-proxy of the pinned release (the reference).
    KubeProxy,
    /// No Service proxy at all.
    None,
}

/// kube-proxy's modes this machine's kernel can run (it has no IPVS).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    Iptables,
    Nftables,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Iptables => "iptables",
            Mode::Nftables => "nftables",
        }
    }
}

/// Which proxy, with its backend or mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyChoice {
    pub proxy: Proxy,
    pub backend: String,
    pub mode: Mode,
}

impl ProxyChoice {
    pub fn from_args(args: &UpArgs) -> ProxyChoice {
        ProxyChoice {
            proxy: args.proxy,
            backend: args.backend.clone(),
            mode: args.mode,
        }
    }

    /// `kpr nftables`, `kube-proxy iptables`, `none`.
    pub fn describe(&self) -> String {
        match self.proxy {
            Proxy::Kpr => format!("kpr {}", self.backend),
            Proxy::KubeProxy => format!("kube-proxy {}", self.mode.as_str()),
            Proxy::None => "none".into(),
        }
    }
}

/// Images and network, ready before the control plane starts.
pub struct RealNodes {
    network: ClusterNetwork,
    images: Vec<PathBuf>,
    /// Deploy metrics-server once CoreDNS is ready (its image is among `images`).
    metrics_server: bool,
    /// Deploy the local-path-provisioner once CoreDNS is ready (its image is among `images`).
    local_path: bool,
}

/// Builds kpr's binaries (`--binaries`) and the images, and creates the cluster network.
pub fn prepare(cluster: &Cluster, args: &UpArgs) -> anyhow::Result<RealNodes> {
    crate::bench::build(args.binaries)?;
    let mut images = build_images(args.binaries)?;
    if args.metrics_server {
        images.push(metrics_server_image()?);
    }
    if args.local_path {
        images.push(local_path_image()?);
    }
    let dual = args.ip_family == IpFamilies::Dual;
    let network = ClusterNetwork::plan(&cluster.name, args.nodes, dual)?;
    network.create()?;
    Ok(RealNodes {
        network,
        images,
        metrics_server: args.metrics_server,
        local_path: args.local_path,
    })
}

impl RealNodes {
    /// Where the control plane runs: the hub of the cluster network, at its gateway address.
    pub fn control_plane_network(&self) -> Network {
        Network {
            netns: self.network.hub_netns(),
            address: GATEWAY,
        }
    }

    /// The network's address families.
    pub fn ip_families(&self) -> IpFamilies {
        if self.network.dual_stack {
            IpFamilies::Dual
        } else {
            IpFamilies::Ipv4
        }
    }

    /// Starts the nodes, waits for them to be Ready, deploys the proxy and CoreDNS.
    pub fn start(self, cp: &mut ControlPlane, proxy: &ProxyChoice) -> anyhow::Result<()> {
        let nodes = controlplane::nodes::start(cp, &self.network.nodes, &self.images)?;
        controlplane::nodes::wait_ready(cp, &nodes, Duration::from_secs(120))?;
        println!("[ok] {} nodes Ready", nodes.len());
        deploy_proxy(cp, proxy, self.ip_families())?;
        apply(cp, &fs::read_to_string(manifest("coredns.yaml"))?)?;
        if proxy.proxy == Proxy::None {
            // CoreDNS reaches the API server through the `kubernetes` Service: nothing serves it.
            println!("[note] no Service proxy: CoreDNS will not become ready");
            return Ok(());
        }
        rollout(cp, "deployment/coredns", Duration::from_secs(180))?;
        println!("[ok] CoreDNS ready");
        if self.metrics_server {
            crate::metrics_server::deploy(cp, self.network.nodes.len())?;
        }
        if self.local_path {
            crate::local_path::deploy(cp)?;
        }
        Ok(())
    }
}

/// Applies the proxy's manifest and waits for its DaemonSet.
pub fn deploy_proxy(
    cp: &ControlPlane,
    choice: &ProxyChoice,
    families: IpFamilies,
) -> anyhow::Result<()> {
    match choice.proxy {
        Proxy::None => return Ok(()),
        Proxy::Kpr => {
            apply(cp, &kpr_manifest(cp, &choice.backend, families)?)?;
            rollout(
                cp,
                &format!("daemonset/{}", deploy::AGENT_DAEMONSET),
                Duration::from_secs(180),
            )?;
        }
        Proxy::KubeProxy => {
            apply(cp, &kube_proxy_manifest(cp, choice.mode, families)?)?;
            rollout(cp, "daemonset/kube-proxy", Duration::from_secs(180))?;
        }
    }
    println!("[ok] {} runs on every node", choice.describe());
    Ok(())
}

/// deploy/proxy.yaml rendered for `backend` and the cluster's families, pointed at this
/// cluster's API server.
pub fn kpr_manifest(
    cp: &ControlPlane,
    backend: &str,
    families: IpFamilies,
) -> anyhow::Result<String> {
    kpr_manifest_for(cp.ports.apiserver, backend, families)
}

/// [`kpr_manifest`] for a cluster whose API server listens on `apiserver_port` (a running one,
/// known from its state file: `cargo xtask cluster proxy`).
pub fn kpr_manifest_for(
    apiserver_port: u16,
    backend: &str,
    families: IpFamilies,
) -> anyhow::Result<String> {
    let render = Render {
        backend: backend.to_string(),
        ip_families: families,
        ..Render::default()
    };
    let text = deploy::render_file(deploy::AGENT_MANIFEST, &render)?;
    let text = deploy::with_api_server(&text, &render, &GATEWAY.to_string(), apiserver_port)?;
    // These nodes see their own cgroup2 subtree there (controlplane::nodes).
    deploy::with_cgroup_root(&text, "/sys/fs/cgroup/unified")
}

/// xtask/k8s/manifests/kube-proxy.yaml for `mode` and the cluster's families.
pub fn kube_proxy_manifest(
    cp: &ControlPlane,
    mode: Mode,
    families: IpFamilies,
) -> anyhow::Result<String> {
    kube_proxy_manifest_for(cp.ports.apiserver, mode, families)
}

/// kube-proxy's `clusterCIDR` in the committed manifest, and what a dual-stack cluster's is.
const KUBE_PROXY_CLUSTER_CIDR: (&str, &str) = (
    "clusterCIDR: 10.244.0.0/16",
    "clusterCIDR: 10.244.0.0/16,fd00:10:244::/56",
);

/// [`kube_proxy_manifest`] for a cluster whose API server listens on `apiserver_port`.
pub fn kube_proxy_manifest_for(
    apiserver_port: u16,
    mode: Mode,
    families: IpFamilies,
) -> anyhow::Result<String> {
    let text = fs::read_to_string(manifest("kube-proxy.yaml"))?;
    for token in [
        "mode: MODE",
        "API_SERVER",
        "KUBERNETES_VERSION",
        KUBE_PROXY_CLUSTER_CIDR.0,
    ] {
        if !text.contains(token) {
            bail!("xtask/k8s/manifests/kube-proxy.yaml: expected {token:?}, found none");
        }
    }
    let text = match families {
        IpFamilies::Ipv4 => text,
        IpFamilies::Dual => text.replace(KUBE_PROXY_CLUSTER_CIDR.0, KUBE_PROXY_CLUSTER_CIDR.1),
    };
    Ok(text
        .replace("mode: MODE", &format!("mode: {}", mode.as_str()))
        .replace("API_SERVER", &format!("{GATEWAY}:{apiserver_port}"))
        .replace("KUBERNETES_VERSION", controlplane::kubernetes_version()))
}

/// The `kube-proxy` ConfigMap of [`kube_proxy_manifest_for`] (what kubeadm makes: its
/// `config.conf` is the KubeProxyConfiguration), nftables mode.
pub fn kube_proxy_configmap_for(
    apiserver_port: u16,
    families: IpFamilies,
) -> anyhow::Result<String> {
    let text = kube_proxy_manifest_for(apiserver_port, Mode::Nftables, families)?;
    text.split("\n---\n")
        .find(|doc| doc.contains("kind: ConfigMap") && doc.contains("name: kube-proxy"))
        .map(str::to_string)
        .context("xtask/k8s/manifests/kube-proxy.yaml has no kube-proxy ConfigMap")
}

fn manifest(file: &str) -> PathBuf {
    workspace_root().join("xtask/k8s/manifests").join(file)
}

pub fn apply(cp: &ControlPlane, text: &str) -> anyhow::Result<()> {
    cp.kubectl_run(&["apply", "-f", "-"], Some(text))?;
    Ok(())
}

/// `kubectl -n kube-system rollout status <what>`.
pub fn rollout(cp: &ControlPlane, what: &str, timeout: Duration) -> anyhow::Result<()> {
    let timeout = format!("--timeout={}s", timeout.as_secs());
    let waited = cp.kubectl_run(
        &[
            "-n",
            deploy::SYSTEM_NAMESPACE,
            "rollout",
            "status",
            what,
            &timeout,
        ],
        None,
    );
    if let Err(e) = waited {
        let pods = cp
            .kubectl_run(&["get", "pods", "-A", "-o", "wide"], None)
            .unwrap_or_else(|e| format!("{e:#}"));
        let events = cp
            .kubectl_run(&["get", "events", "-A", "--sort-by=.lastTimestamp"], None)
            .unwrap_or_else(|e| format!("{e:#}"));
        let events: Vec<&str> = events.lines().rev().take(25).collect();
        return Err(e.context(format!(
            "waiting for {what} in {}; pods:\n{pods}\nlatest events:\n{}",
            deploy::SYSTEM_NAMESPACE,
            events.into_iter().rev().collect::<Vec<_>>().join("\n")
        )));
    }
    Ok(())
}

/// Builds every image the nodes run into `<target>/cluster-images` and returns the archives.
pub fn build_images(binaries: crate::Profile) -> anyhow::Result<Vec<PathBuf>> {
    let out = target_dir().join("cluster-images");
    fs::create_dir_all(&out)?;
    let bin = crate::k8s::bin_dir();
    let pause = images::pause_binary();
    images::build_pause(&pause)?;
    let list = vec![
        ("pause".to_string(), Ok(images::pause(&pause))),
        ("busybox".into(), images::busybox()),
        ("agnhost".into(), images::agnhost(&bin.join("agnhost"))),
        ("coredns".into(), Ok(coredns_image(&bin.join("coredns")))),
        ("kpr".into(), kpr_image(binaries, &out)),
        (
            "kube-proxy".into(),
            images::kube_proxy(&bin.join("kube-proxy")),
        ),
    ];
    // The images upstream's e2e specs run, those that can be made here (crate::e2e_images).
    let e2e = crate::e2e_images::images(&out)?
        .into_iter()
        .map(|(file, image)| (file, Ok(image)));
    let mut archives = Vec::new();
    let mut written = 0;
    for (file, image) in list.into_iter().chain(e2e) {
        let image = image.with_context(|| format!("assembling the {file} image"))?;
        let path = out.join(format!("{file}.tar"));
        // Unchanged inputs, unchanged archive: a second `up` writes only kpr's.
        if images::write_archive_cached(&image, &path)
            .with_context(|| format!("writing the {file} image to {}", path.display()))?
        {
            written += 1;
        }
        archives.push(path);
    }
    println!(
        "[ok] {} images in {} ({written} written, the others unchanged)",
        archives.len(),
        out.display()
    );
    Ok(archives)
}

/// kpr's image ([`images::kpr_agent`]) from the `binaries` build, stripped into `out` first.
pub fn kpr_image(binaries: crate::Profile, out: &Path) -> anyhow::Result<images::Image> {
    // Both profiles keep debug info (release for profiling); the image does without (241 MiB
    // to a fraction of it), as a shipped image would.
    let stripped = ["proxy", "controller-manager"].map(|name| out.join(format!("{name}.stripped")));
    for (name, dest) in ["proxy", "controller-manager"].iter().zip(&stripped) {
        Cmd::new("objcopy")
            .arg("--strip-debug")
            .arg(binaries.dir().join(name))
            .arg(dest)
            .run()
            .with_context(|| format!("stripping {name} for the image"))?;
    }
    images::kpr_agent(&stripped[0], &stripped[1])
}

/// metrics-server's image in `<target>/cluster-images` (built first if the pinned module changed).
fn metrics_server_image() -> anyhow::Result<PathBuf> {
    let binary = crate::metrics_server::build()?;
    let image = crate::metrics_server::image(&binary, &crate::metrics_server::version()?);
    let path = target_dir().join("cluster-images/metrics-server.tar");
    images::write_archive_cached(&image, &path)
        .with_context(|| format!("writing the metrics-server image to {}", path.display()))?;
    Ok(path)
}

/// The local-path-provisioner's image in `<target>/cluster-images` (built first if the pinned
/// module changed).
fn local_path_image() -> anyhow::Result<PathBuf> {
    let binary = crate::local_path::build()?;
    let image = crate::local_path::image(&binary, &crate::local_path::version()?);
    let path = target_dir().join("cluster-images/local-path-provisioner.tar");
    images::write_archive_cached(&image, &path).with_context(|| {
        format!(
            "writing the local-path-provisioner image to {}",
            path.display()
        )
    })?;
    Ok(path)
}

pub(crate) fn coredns_image(binary: &Path) -> images::Image {
    images::Image {
        name: "registry.k8s.io/coredns/coredns:v1.12.1".into(),
        entrypoint: vec!["/coredns".into()],
        cmd: Vec::new(),
        env: Vec::new(),
        user: None,
        entries: vec![images::Entry::File {
            src: binary.to_path_buf(),
            dest: "/coredns".into(),
            mode: Some(0o755),
        }],
    }
}

/// Kills the nodes' containers, unmounts, removes their cgroups and the cluster's namespaces.
pub fn teardown(cluster: &Cluster) {
    let prefix = format!("{}-node-", cluster.name);
    let names: Vec<String> = fs::read_dir("/sys/fs/cgroup/pids")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| {
            n.strip_prefix(&prefix)
                .is_some_and(|i| i.parse::<usize>().is_ok())
        })
        .collect();
    controlplane::nodes::teardown(&names, &cluster.dir);
    if let Err(e) = network::delete_namespaces(&cluster.name) {
        eprintln!(
            "warning: deleting the namespaces of cluster {}: {e:#}",
            cluster.name
        );
    }
}
