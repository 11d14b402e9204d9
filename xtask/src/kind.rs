//! `cargo xtask kind`: kpr on a local kind cluster with kube-proxy disabled. Creates the cluster
//! from deploy/kind-config.yaml, builds and loads the image, deploys the agent and the
//! controller-manager, waits for them, and runs a smoke test (echo servers behind a ClusterIP and a
//! NodePort Service, reached from a pod and from a node). `--down` deletes the cluster; `--dry-run`
//! prints every step and the rendered manifests without Docker.
//!
//! `--local` runs it where no registry can be reached and no Docker engine runs (this project's
//! machines): the engine of `cargo xtask docker` in its own network namespace (kind's network,
//! its published ports and everything the nodes do stay there; kubectl runs in that namespace),
//! kind from `<target>/kind/bin`, the node image and the runtime base built here
//! ([`crate::kind_image`]), kpr's image from binaries built on the host
//! (deploy/Dockerfile.prebuilt). Its kubeconfig is `<target>/kind/kubeconfig`. `--local --down`
//! also stops the engine and checks the machine's network state is what it was before `up`.

use std::cell::RefCell;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _};
use clap::Args;

use crate::deploy::{self, IpFamilies, Render};
use crate::docker::{self, Engine};
use crate::exec::Cmd;
use crate::setup::find_on_path;
use crate::{kind_image, kind_tools, target_dir, workspace_root, Profile};

mod helm;
mod matrix;

#[derive(Debug, Clone, Args)]
pub struct KindArgs {
    /// Dataplane backend the agent DaemonSet runs with.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(deploy::BACKENDS), default_value = deploy::DEFAULT_BACKEND)]
    pub backend: String,
    /// Name of the kind cluster (kubectl context `kind-NAME`).
    #[arg(long, default_value = deploy::DEFAULT_CLUSTER)]
    pub cluster: String,
    /// Delete the cluster instead of creating it.
    #[arg(long)]
    pub down: bool,
    /// Print every step and the rendered manifests; run nothing (works without Docker).
    #[arg(long)]
    pub dry_run: bool,
    /// The cluster's address families: `dual` creates it from deploy/kind-config-dual.yaml,
    /// renders the agent for both families and smoke-tests the Services over IPv6 too (needs a
    /// backend that serves IPv6: nftables or iptables).
    #[arg(long, value_enum, default_value_t = IpFamilies::Ipv4)]
    pub ip_family: IpFamilies,
    /// Build everything here and run on the engine of `cargo xtask docker` (see the module doc);
    /// `cargo xtask setup --kind` installs what it needs.
    #[arg(long)]
    pub local: bool,
    /// With --local: which cargo build of kpr's binaries the image carries.
    #[arg(long, value_enum, default_value_t = Profile::Release)]
    pub binaries: Profile,
    /// With --local: kpr's image from binaries built on the host (deploy/Dockerfile.prebuilt,
    /// `--binaries`) or from deploy/Dockerfile itself, its Rust build stage included, on the
    /// build base `cargo xtask docker image` makes (xtask/src/image_build.rs).
    #[arg(long, value_enum, default_value_t = ImageSource::Prebuilt)]
    pub image: ImageSource,
    /// With --local: every backend, switching, the rollback to kube-proxy and forward again, then
    /// a dual-stack cluster through every backend, each followed by the smoke test; prints a table
    /// (also `<target>/kind/MATRIX.md`) and deletes the clusters it made.
    #[arg(long, requires = "local", conflicts_with_all = ["down", "ip_family", "backend"])]
    pub matrix: bool,
}

/// Where `--local` gets kpr's image from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ImageSource {
    /// deploy/Dockerfile.prebuilt with the host's `cargo build`.
    Prebuilt,
    /// deploy/Dockerfile (`cargo xtask docker image`), tagged kpr:dev.
    Dockerfile,
}

/// How many requests each smoke check sends.
pub(crate) const SMOKE_REQUESTS: usize = 6;
const TIMEOUT: &str = "--timeout=300s";

pub fn run(args: &KindArgs) -> anyhow::Result<()> {
    if args.local && !args.dry_run {
        return run_local(args);
    }
    check_tools(args.dry_run)?;
    let kind = Kind::new(args, None);
    if args.down {
        return kind
            .cmd("kind")
            .args(["delete", "cluster", "--name", &args.cluster])
            .run();
    }
    up(&kind)
}

fn up(kind: &Kind) -> anyhow::Result<()> {
    let existed = kind.timed("create the cluster", || kind.create_cluster())?;
    kind.timed("build and load the image", || kind.build_and_load_image())?;
    let dir = kind.render_manifests()?;
    kind.timed("deploy", || kind.deploy(&dir, existed))?;
    kind.timed("smoke test", || kind.smoke_test(&dir, true))?;
    kind.print_times();
    let kubectl = match &kind.local {
        Some(_) => format!(
            "KUBECONFIG={} ip netns exec {} kubectl",
            local_kubeconfig().display(),
            docker::NETNS
        ),
        None => "kubectl".to_string(),
    };
    println!(
        "\nkpr ({}) runs on kind cluster {:?}: {kubectl} --context {} -n {} get pods",
        kind.render.backend,
        kind.render.cluster,
        kind.context,
        deploy::SYSTEM_NAMESPACE
    );
    Ok(())
}

/// `--local`: see the module doc.
fn run_local(args: &KindArgs) -> anyhow::Result<()> {
    let before = docker::state_before_up();
    if args.down {
        let kind = Kind::new(args, docker::running());
        if kind.local.is_some() {
            kind.cmd("kind")
                .args(["delete", "cluster", "--name", &args.cluster])
                .run()?;
        }
        docker::down()?;
        let _ = fs::remove_file(local_kubeconfig());
        return match fs::read_to_string(&before) {
            Ok(saved) => {
                docker::compare(&saved, &docker::host_network_state()?, "after --down")?;
                fs::remove_file(&before)?;
                Ok(())
            }
            Err(_) => {
                println!("(no network state saved by `up` to compare with)");
                Ok(())
            }
        };
    }
    let started = Instant::now();
    for (what, path) in [
        ("kind", kind_tools::kind_binary()),
        ("kubeadm", kind_tools::bin_dir().join("kubeadm")),
        ("kubectl", crate::k8s::bin_dir().join("kubectl")),
        ("kubelet", crate::k8s::bin_dir().join("kubelet")),
    ] {
        ensure!(
            path.is_file(),
            "{what} is missing ({}): `cargo xtask setup --k8s --kind` builds it",
            path.display()
        );
    }
    fs::create_dir_all(local_dir())?;
    let engine = docker::up_saving_state()?;
    let kind = Kind::new(args, Some(engine));
    let engine = kind.local.as_ref().expect("local");
    let node_image = kind.timed("build the node image", || kind_image::node_image(engine))?;
    kind.timed("import the runtime base", || {
        kind_image::runtime_base(engine)
    })?;
    let kind = Kind {
        node_image: Some(node_image),
        ..kind
    };
    let result = if args.matrix {
        matrix::run(&kind)
    } else {
        up(&kind)
    };
    println!(
        "cargo xtask kind --local: {:.0} s in all; `cargo xtask kind --local --down` deletes the \
         cluster and stops the engine",
        started.elapsed().as_secs_f64()
    );
    result
}

/// Where the cgroup2 hierarchy is mounted on a machine with hybrid cgroups.
const HYBRID_CGROUP2: &str = "/sys/fs/cgroup/unified";

/// Whether this machine mounts cgroup2 at [`HYBRID_CGROUP2`] (its kind nodes then do too).
fn hybrid_cgroups() -> bool {
    fs::read_to_string("/proc/self/mountinfo").is_ok_and(|text| {
        text.lines().any(|line| {
            line.split(' ').nth(4) == Some(HYBRID_CGROUP2)
                && line
                    .split(" - ")
                    .nth(1)
                    .is_some_and(|r| r.starts_with("cgroup2 "))
        })
    })
}

/// `<target>/kind`.
fn local_dir() -> PathBuf {
    target_dir().join("kind")
}

/// The kubeconfig kind writes with `--local` (never the user's `~/.kube/config`).
pub fn local_kubeconfig() -> PathBuf {
    local_dir().join("kubeconfig")
}

/// docker, kind and kubectl on PATH; says which are missing and where to get them.
fn check_tools(dry_run: bool) -> anyhow::Result<()> {
    let tools = [
        (
            "docker",
            "a Docker engine: https://docs.docker.com/engine/install/debian/",
        ),
        (
            "kind",
            "https://kind.sigs.k8s.io/docs/user/quick-start/#installation",
        ),
        (
            "kubectl",
            "https://kubernetes.io/docs/tasks/tools/install-kubectl-linux/",
        ),
    ];
    let mut missing = Vec::new();
    for (tool, hint) in tools {
        match find_on_path(tool) {
            Some(path) => println!("[ok] {tool} found ({})", path.display()),
            None => {
                println!("[missing] {tool}: install {hint}");
                missing.push(tool);
            }
        }
    }
    if missing.is_empty() || dry_run {
        if !missing.is_empty() {
            println!("dry run: continuing without {}", missing.join(", "));
        }
        return Ok(());
    }
    bail!(
        "cargo xtask kind needs {} (see the lines above); `--dry-run` shows the steps without them",
        missing.join(", ")
    )
}

struct Kind {
    render: Render,
    context: String,
    dry_run: bool,
    root: PathBuf,
    /// `--local`: the engine everything runs on.
    local: Option<Engine>,
    /// `--local`: the node image built here.
    node_image: Option<String>,
    binaries: Profile,
    image: ImageSource,
    times: RefCell<Vec<(String, Duration)>>,
}

impl Kind {
    fn new(args: &KindArgs, local: Option<Engine>) -> Self {
        Kind {
            render: Render {
                backend: args.backend.clone(),
                cluster: args.cluster.clone(),
                ip_families: args.ip_family,
            },
            context: format!("kind-{}", args.cluster),
            dry_run: args.dry_run,
            root: workspace_root(),
            local,
            node_image: None,
            binaries: args.binaries,
            image: args.image,
            times: RefCell::new(Vec::new()),
        }
    }

    /// `program`; with `--local`, kind and docker talk to the local engine (kind finds Debian's
    /// client of the engine's release first on PATH) and kubectl runs in its network namespace.
    fn cmd(&self, program: &str) -> Cmd {
        let Some(engine) = &self.local else {
            return Cmd::new(program).dry_run(self.dry_run);
        };
        match program {
            "docker" => engine.docker(),
            "kubectl" => Cmd::new("ip")
                .args(["netns", "exec", docker::NETNS])
                .arg(crate::k8s::bin_dir().join("kubectl"))
                .env("KUBECONFIG", local_kubeconfig()),
            "kind" => {
                let path = local_dir().join("path");
                let _ = fs::create_dir_all(&path);
                let link = path.join("docker");
                if fs::read_link(&link).ok() != Some(docker::client()) {
                    let _ = fs::remove_file(&link);
                    let _ = std::os::unix::fs::symlink(docker::client(), &link);
                }
                let search = std::env::var_os("PATH").unwrap_or_default();
                let mut dirs = vec![path];
                dirs.extend(std::env::split_paths(&search));
                Cmd::new(kind_tools::kind_binary())
                    .env("DOCKER_HOST", engine.host())
                    .env("KUBECONFIG", local_kubeconfig())
                    .env(
                        "PATH",
                        std::env::join_paths(dirs).unwrap_or_else(|_| search.clone()),
                    )
            }
            other => Cmd::new(other),
        }
    }

    fn kubectl(&self) -> Cmd {
        self.cmd("kubectl").args(["--context", &self.context])
    }

    /// Runs one step and keeps its time for [`Kind::print_times`].
    fn timed<T>(&self, what: &str, f: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<T> {
        let started = Instant::now();
        let result = f();
        let took = started.elapsed();
        println!("[time] {what}: {:.0} s", took.as_secs_f64());
        self.times.borrow_mut().push((what.to_string(), took));
        result
    }

    fn print_times(&self) {
        step("times");
        for (what, took) in self.times.borrow().iter() {
            println!("{what}: {:.0} s", took.as_secs_f64());
        }
    }

    /// Creates the cluster unless it exists; returns whether it existed.
    fn create_cluster(&self) -> anyhow::Result<bool> {
        step(&format!(
            "create the cluster (kube-proxy disabled, {})",
            self.render.kind_config()
        ));
        let clusters = self.cmd("kind").args(["get", "clusters"]).read()?;
        if clusters.lines().any(|c| c.trim() == self.render.cluster) {
            println!("[ok] kind cluster {:?} already exists", self.render.cluster);
            return Ok(true);
        }
        let config = deploy::deploy_dir().join(self.render.kind_config());
        let mut create = self
            .cmd("kind")
            .args([
                "create",
                "cluster",
                "--name",
                &self.render.cluster,
                "--config",
            ])
            .arg(&config);
        if let Some(image) = &self.node_image {
            create = create.args(["--image", image]);
        }
        create.run()?;
        Ok(false)
    }

    fn build_and_load_image(&self) -> anyhow::Result<()> {
        step("build the image and load it into the nodes");
        if let Some(engine) = &self.local {
            if self.image == ImageSource::Dockerfile {
                crate::image_build::build(engine)?;
                engine
                    .docker()
                    .args(["tag", crate::image_build::IMAGE, deploy::IMAGE])
                    .run()?;
            } else {
                self.build_prebuilt_image()?;
            }
        } else {
            let dockerfile = deploy::deploy_dir().join(deploy::DOCKERFILE);
            self.cmd("docker")
                .args(["build", "-t", deploy::IMAGE, "-f"])
                .arg(&dockerfile)
                .arg(&self.root)
                .run()?;
        }
        self.cmd("kind")
            .args([
                "load",
                "docker-image",
                deploy::IMAGE,
                "--name",
                &self.render.cluster,
            ])
            .run()
    }

    /// `--local`: kpr's binaries built on the host (debug info stripped, as a shipped image
    /// would be), then deploy/Dockerfile.prebuilt on [`kind_image::RUNTIME_BASE`].
    fn build_prebuilt_image(&self) -> anyhow::Result<()> {
        let mut build =
            Cmd::new("cargo").args(["build", "-p", "proxy", "-p", "controllers", "--bins"]);
        if self.binaries == Profile::Release {
            build = build.arg("--release");
        }
        build.dir(&self.root).run()?;
        let context = local_dir().join("image-context");
        fs::create_dir_all(&context)?;
        for name in ["proxy", "controller-manager", "scheduler"] {
            Cmd::new("objcopy")
                .arg("--strip-debug")
                .arg(self.binaries.dir().join(name))
                .arg(context.join(name))
                .run()
                .with_context(|| format!("stripping {name} for the image"))?;
        }
        let started = Instant::now();
        self.cmd("docker")
            .args(["build", "-t", deploy::IMAGE, "-f"])
            .arg(deploy::deploy_dir().join("Dockerfile.prebuilt"))
            .args([
                "--build-arg",
                &format!("RUNTIME_BASE={}", kind_image::RUNTIME_BASE),
            ])
            .arg(&context)
            .run()?;
        let size = self
            .cmd("docker")
            .args(["image", "inspect", "-f", "{{.Size}}", deploy::IMAGE])
            .read()?;
        let size: f64 = size.trim().parse().unwrap_or(0.0);
        println!(
            "[ok] {} built in {:.0} s, {:.0} MiB",
            deploy::IMAGE,
            started.elapsed().as_secs_f64(),
            size / (1u64 << 20) as f64
        );
        Ok(())
    }

    /// Writes the rendered manifests to `target/kind/<cluster>/` (printing them on a dry run).
    fn render_manifests(&self) -> anyhow::Result<PathBuf> {
        step(&format!(
            "render the manifests (backend {})",
            self.render.backend
        ));
        let dir = target_dir().join("kind").join(&self.render.cluster);
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        for file in [
            deploy::AGENT_MANIFEST,
            deploy::CONTROLLER_MANIFEST,
            deploy::SMOKE_MANIFEST,
        ] {
            let mut text = deploy::render_file(file, &self.render)?;
            // The nodes share this machine's cgroup layout: on hybrid cgroups (v1 controllers,
            // cgroup2 under unified/) the agent's cgroup v2 root is there.
            if self.local.is_some() && file == deploy::AGENT_MANIFEST && hybrid_cgroups() {
                text = deploy::with_cgroup_root(&text, HYBRID_CGROUP2)?;
            }
            let path = dir.join(file);
            fs::write(&path, &text).with_context(|| format!("writing {}", path.display()))?;
            println!("rendered {}", path.display());
            if self.dry_run {
                println!("---8<--- {file}\n{text}---8<---");
            }
        }
        Ok(dir)
    }

    /// Applies the agent and the controller-manager and waits for them. On an existing cluster the
    /// pods are restarted too: the image keeps its tag, so `apply` alone would not pick up a rebuild.
    fn deploy(&self, dir: &Path, existed: bool) -> anyhow::Result<()> {
        step("deploy the agent and the controller-manager");
        self.check_cgroup_scope()?;
        for file in [deploy::AGENT_MANIFEST, deploy::CONTROLLER_MANIFEST] {
            self.kubectl()
                .args(["apply", "-f"])
                .arg(dir.join(file))
                .run()?;
        }
        let ns = ["-n", deploy::SYSTEM_NAMESPACE];
        let ds = format!("daemonset/{}", deploy::AGENT_DAEMONSET);
        let deployment = format!("deployment/{}", deploy::CONTROLLER_DEPLOYMENT);
        if existed || self.dry_run {
            if self.dry_run {
                println!("(only when the cluster already existed:)");
            }
            self.kubectl()
                .args(["rollout", "restart", &ds, &deployment])
                .args(ns)
                .run()?;
        }
        self.kubectl()
            .args(["rollout", "status", &ds, TIMEOUT])
            .args(ns)
            .run()?;
        // Nodes become Ready once the CNI runs, and the CNI needs Service routing: ours.
        self.kubectl()
            .args(["wait", "--for=condition=Ready", "nodes", "--all", TIMEOUT])
            .run()?;
        self.kubectl()
            .args(["rollout", "status", &deployment, TIMEOUT])
            .args(ns)
            .run()?;
        if self.local.is_some() {
            self.coredns_ready()?;
        }
        Ok(())
    }

    /// CoreDNS answering through the Service proxy. Seen here (2026-12-02): CoreDNS pods that
    /// started before any Service proxy ran kept failing to list from 10.96.0.1 (i/o timeout) after
    /// kpr served it. If they are not ready within a minute, what they and the nodes' conntrack
    /// tables say about 10.96.0.1 is printed, then they are restarted.
    fn coredns_ready(&self) -> anyhow::Result<()> {
        let coredns = ["-n", "kube-system", "deployment/coredns"];
        let ready = self
            .kubectl()
            .args(["rollout", "status", "--timeout=60s"])
            .args(coredns)
            .run();
        if ready.is_ok() {
            println!("[ok] CoreDNS ready without a restart");
            return Ok(());
        }
        println!("CoreDNS is not ready a minute after the agent: what it and the nodes say");
        let _ = self
            .kubectl()
            .args(["logs", "--tail=8", "--prefix", "-l", "k8s-app=kube-dns"])
            .args(["-n", "kube-system"])
            .run();
        for node in self.node_names() {
            let _ = self
                .cmd("docker")
                .args(["exec", &node, "conntrack", "-L", "-d", "10.96.0.1"])
                .run();
        }
        self.kubectl()
            .args(["rollout", "restart"])
            .args(coredns)
            .run()?;
        self.kubectl()
            .args(["rollout", "status", TIMEOUT])
            .args(coredns)
            .run()
    }

    /// `--local` with the eBPF backend: the cgroup v2 root the agent attaches its socket programs
    /// to must be the node's own, not this machine's. A node with hybrid cgroups and no cgroup
    /// namespace (dockerd 20.10 on cgroup v1) is given a cgroup2 mount of the whole hierarchy;
    /// programs attached there would rewrite every process's connect() on the machine.
    fn check_cgroup_scope(&self) -> anyhow::Result<()> {
        if self.local.is_none() || self.render.backend != "ebpf" || self.dry_run {
            return Ok(());
        }
        use std::os::unix::fs::MetadataExt as _;
        let root = if hybrid_cgroups() {
            HYBRID_CGROUP2
        } else {
            "/sys/fs/cgroup"
        };
        let host = fs::metadata(root)?.ino();
        for node in self.node_names() {
            let inode = self
                .cmd("docker")
                .args(["exec", &node, "stat", "-c", "%i", root])
                .quiet()
                .read()?;
            ensure!(
                inode.trim() != host.to_string(),
                "{node}: its {root} is this machine's cgroup2 root (inode {host}): the eBPF \
                 agent would attach there for every process of the machine; refusing"
            );
            println!(
                "[ok] {node}: {root} is its own cgroup (inode {}), not the machine's",
                inode.trim()
            );
        }
        Ok(())
    }

    /// The cluster's node containers.
    fn node_names(&self) -> Vec<String> {
        self.cmd("kind")
            .args(["get", "nodes", "--name", &self.render.cluster])
            .read()
            .map(|out| {
                out.lines()
                    .map(|l| l.trim().to_owned())
                    .filter(|l| !l.is_empty())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// `--local`: the smoke test's image (agnhost), made by [`crate::images`] from the reference
    /// build, loaded into the nodes (the node image carries only what kubeadm and kind deploy).
    fn load_smoke_image(&self) -> anyhow::Result<()> {
        let image = crate::images::agnhost(&crate::k8s::bin_dir().join("agnhost"))?;
        let loaded = self.node_names().iter().all(|node| {
            self.cmd("docker")
                .args(["exec", node, "crictl", "inspecti", &image.name])
                .quiet()
                .read()
                .is_ok()
        });
        if loaded {
            return Ok(());
        }
        let archive = local_dir().join("agnhost.tar");
        crate::images::write_archive_cached(&image, &archive)?;
        self.cmd("kind")
            .args(["load", "image-archive"])
            .arg(&archive)
            .args(["--name", &self.render.cluster])
            .run()
    }

    /// Returns the answers' summary lines; `kpr_runs`: print `proxy inspect` from the agent too.
    fn smoke_test(&self, dir: &Path, kpr_runs: bool) -> anyhow::Result<Vec<String>> {
        step("smoke test: ClusterIP from a pod, ClusterIP and NodePort from a node (and over IPv6 on a dual-stack cluster)");
        let ns = ["-n", deploy::SMOKE_NAMESPACE];
        if self.local.is_some() {
            self.load_smoke_image()?;
        }
        self.kubectl()
            .args(["apply", "-f"])
            .arg(dir.join(deploy::SMOKE_MANIFEST))
            .run()?;
        self.kubectl()
            .args(["rollout", "status", "deployment/echo", TIMEOUT])
            .args(ns)
            .run()?;
        self.kubectl()
            .args(["wait", "--for=condition=Ready", "pod/client", TIMEOUT])
            .args(ns)
            .run()?;
        let cluster_ip = self.jsonpath(
            &["get", "service", "echo", "-n", deploy::SMOKE_NAMESPACE],
            "{.spec.clusterIP}",
            "ECHO_CLUSTER_IP",
        )?;
        let node = self.render.api_server_host();
        // One InternalIP per family on a dual-stack node.
        let node_ips = self.jsonpath(
            &["get", "node", &node],
            r#"{.status.addresses[?(@.type=="InternalIP")].address}"#,
            "NODE_IP",
        )?;
        let node_ip = of_family(&node_ips, false).unwrap_or("NODE_IP").to_owned();
        let dual = self.render.ip_families == IpFamilies::Dual;
        let by_name = format!(
            "http://echo.{}.svc.cluster.local/hostname",
            deploy::SMOKE_NAMESPACE
        );
        let in_pod = self.kubectl().args(["exec", "client"]).args(ns).arg("--");
        let on_node = self.cmd("docker").args(["exec", &node]);
        let mut checks = vec![];
        if dual {
            let cluster_ip6 = self.jsonpath(
                &["get", "service", "echo", "-n", deploy::SMOKE_NAMESPACE],
                "{.spec.clusterIPs[1]}",
                "ECHO_CLUSTER_IP6",
            )?;
            let node_ip6 = of_family(&node_ips, true)
                .map(str::to_owned)
                .or_else(|| self.dry_run.then(|| "NODE_IP6".to_owned()))
                .context("the dual-stack node has no IPv6 InternalIP")?;
            checks.extend([
                (
                    "pod -> ClusterIP over IPv6",
                    in_pod.clone(),
                    format!("-6 http://[{cluster_ip6}]/hostname"),
                ),
                (
                    "node -> ClusterIP over IPv6",
                    on_node.clone(),
                    format!("-6 http://[{cluster_ip6}]/hostname"),
                ),
                (
                    "node -> NodePort over IPv6",
                    on_node.clone(),
                    format!(
                        "-6 http://[{node_ip6}]:{}/hostname",
                        deploy::SMOKE_NODE_PORT
                    ),
                ),
            ]);
        }
        checks.extend([
            ("pod -> ClusterIP (by DNS name)", in_pod, by_name),
            (
                "node -> ClusterIP",
                on_node.clone(),
                format!("http://{cluster_ip}/hostname"),
            ),
            (
                "node -> NodePort",
                on_node,
                format!("http://{node_ip}:{}/hostname", deploy::SMOKE_NODE_PORT),
            ),
        ]);
        let mut results = Vec::new();
        for (what, prefix, url) in checks {
            let out = prefix.args(["sh", "-c", &curl_loop(&url)]).read()?;
            results.push((what, out));
        }
        if kpr_runs {
            self.kubectl()
                .args([
                    "exec",
                    "-n",
                    deploy::SYSTEM_NAMESPACE,
                    &format!("daemonset/{}", deploy::AGENT_DAEMONSET),
                ])
                .args(["--", "proxy", "inspect"])
                .run()?;
        }
        report(&results, self.dry_run)
    }

    /// One value read from the cluster; on a dry run, `placeholder` stands in for it.
    fn jsonpath(&self, get: &[&str], path: &str, placeholder: &str) -> anyhow::Result<String> {
        let out = self
            .kubectl()
            .args(get)
            .arg(format!("-o=jsonpath={path}"))
            .read()?;
        let value = if self.dry_run {
            placeholder
        } else {
            out.trim()
        };
        ensure!(
            !value.is_empty(),
            "`kubectl {}` with jsonpath {path} returned nothing",
            get.join(" ")
        );
        Ok(value.to_owned())
    }
}

/// A shell loop that fails on the first request that gets no answer.
/// `url` may start with curl flags (`-6 http://[..]/`); `-g` keeps IPv6 brackets literal.
pub(crate) fn curl_loop(url: &str) -> String {
    format!(
        "set -e; for i in $(seq {SMOKE_REQUESTS}); do curl -g -sS --max-time 5 {url}; echo; done"
    )
}

/// The first address of one family among space-separated `addrs`.
pub(crate) fn of_family(addrs: &str, v6: bool) -> Option<&str> {
    addrs.split_whitespace().find(|a| {
        a.parse::<std::net::IpAddr>()
            .map_or(a.contains(':') == v6, |ip| ip.is_ipv6() == v6)
    })
}

/// Prints which echo pods answered each check; every request must have been answered.
pub(crate) fn report(results: &[(&str, String)], dry_run: bool) -> anyhow::Result<Vec<String>> {
    step("smoke test result");
    if dry_run {
        println!("dry run: no requests were sent");
        return Ok(Vec::new());
    }
    let mut lines = Vec::new();
    for (what, out) in results {
        let answers: Vec<&str> = out
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        let mut pods = answers.clone();
        pods.sort_unstable();
        pods.dedup();
        let line = format!(
            "{what}: {}/{SMOKE_REQUESTS} answered, by {}",
            answers.len(),
            pods.join(", ")
        );
        println!("{line}");
        lines.push(line);
        ensure!(
            answers.len() == SMOKE_REQUESTS,
            "{what}: expected {SMOKE_REQUESTS} answers, got {}",
            answers.len()
        );
    }
    Ok(lines)
}

fn step(what: &str) {
    println!("\n==> {what}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn curl_loop_stops_at_the_first_failure() {
        let script = curl_loop("http://10.96.0.10/hostname");
        assert!(script.starts_with("set -e;"));
        assert!(script.contains("seq 6"));
        assert!(script.contains("curl -g -sS --max-time 5 http://10.96.0.10/hostname"));
    }

    #[test]
    fn dry_run_renders_the_chosen_backend_without_docker() {
        let cluster = format!("xtask-test-{}", std::process::id());
        let args = KindArgs {
            backend: "ebpf".into(),
            cluster: cluster.clone(),
            down: false,
            dry_run: true,
            ip_family: IpFamilies::Ipv4,
            local: false,
            binaries: Profile::Release,
            image: ImageSource::Prebuilt,
            matrix: false,
        };
        run(&args).unwrap();
        let dir = target_dir().join("kind").join(&cluster);
        let agent = fs::read_to_string(dir.join(deploy::AGENT_MANIFEST)).unwrap();
        let smoke = fs::read_to_string(dir.join(deploy::SMOKE_MANIFEST)).unwrap();
        fs::remove_dir_all(&dir).unwrap();
        assert_eq!(agent.matches("value: ebpf # backend").count(), 1, "{agent}");
        assert!(agent.contains(&format!("value: {cluster}-control-plane")));
        assert!(smoke.contains("nodePort: 30080"));
    }

    #[test]
    fn dry_run_dual_stack_renders_both_families() {
        let cluster = format!("xtask-test-dual-{}", std::process::id());
        let args = KindArgs {
            backend: "ebpf".into(),
            cluster: cluster.clone(),
            down: false,
            dry_run: true,
            ip_family: IpFamilies::Dual,
            local: false,
            binaries: Profile::Release,
            image: ImageSource::Prebuilt,
            matrix: false,
        };
        run(&args).unwrap();
        let dir = target_dir().join("kind").join(&cluster);
        let agent = fs::read_to_string(dir.join(deploy::AGENT_MANIFEST)).unwrap();
        let smoke = fs::read_to_string(dir.join(deploy::SMOKE_MANIFEST)).unwrap();
        fs::remove_dir_all(&dir).unwrap();
        assert!(agent.contains("--cluster-cidr=10.244.0.0/16,fd00:10:244::/56"));
        assert!(agent.contains("--service-cluster-ip-range=10.96.0.0/16,fd00:10:96::/112"));
        assert!(!agent.contains("--nodeport-addresses"), "{agent}");
        // echo (ClusterIP), echo-nodeport and echo-local (NodePort).
        assert_eq!(smoke.matches("ipFamilyPolicy: PreferDualStack").count(), 3);
    }

    #[test]
    fn report_requires_every_answer() {
        let short = [("pod -> ClusterIP", "echo-a\necho-b\n".to_owned())];
        let err = report(&short, false).unwrap_err().to_string();
        assert!(err.contains("expected 6 answers, got 2"), "{err}");
        let full = [("pod -> ClusterIP", "a\nb\na\nb\na\nb\n".to_owned())];
        assert_eq!(
            report(&full, false).unwrap(),
            ["pod -> ClusterIP: 6/6 answered, by a, b"]
        );
    }
}
