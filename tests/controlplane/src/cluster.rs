//! One reference control plane: etcd and kube-apiserver on loopback (TLS, client certificates,
//! RBAC, a service-account issuer, a service CIDR), optionally kube-controller-manager,
//! kube-scheduler and kwok, each a [`Process`] with its log under the control plane's directory.
//!
//! Owns: the processes it starts, its directory, and the kubeconfigs it writes there. It never
//! binds anything but 127.0.0.1.

use std::fs;
use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use serde_json::json;

use crate::binaries::Binaries;
use crate::pki::{ClientCert, Pki};
use crate::process::{Lifetime, Process, Spec};

/// The service CIDR every reference API server allocates cluster IPs from.
pub const SERVICE_CIDR: &str = "10.96.0.0/16";
/// The pod CIDR kube-controller-manager and kwok are told about.
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";
/// The issuer of service-account tokens.
const SA_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
/// The CN of kube-apiserver's front-proxy client certificate, the one name aggregated API servers
/// accept the request headers from (kubeadm's).
const FRONT_PROXY_CLIENT: &str = "front-proxy-client";

/// Which upstream components run beside etcd and kube-apiserver.
#[derive(Debug, Clone)]
pub struct Options {
    /// Where logs, data, certificates and kubeconfigs go (created; emptied first).
    pub dir: PathBuf,
    pub lifetime: Lifetime,
    /// kube-controller-manager's `--controllers` value (e.g. `*` or `endpointslice`), if it runs.
    pub upstream_controllers: Option<String>,
    /// Whether kube-scheduler runs.
    pub upstream_scheduler: bool,
    /// Another scheduler program to run in kube-scheduler's place (kpr's `scheduler` binary),
    /// started by [`ControlPlane::start_scheduler_program`] with kube-scheduler's identity.
    pub scheduler_program: Option<PathBuf>,
    /// How many kwok nodes (0: kwok does not run).
    pub kwok_nodes: usize,
    /// Extra kube-apiserver flags (`--flag=value`), e.g. a short `--etcd-compaction-interval`.
    pub apiserver_flags: Vec<String>,
    /// Run the control plane inside a network namespace, reachable by nodes there (see
    /// [`Network`]); `None`: on this machine's loopback.
    pub network: Option<Network>,
    /// `--service-cluster-ip-range` of kube-apiserver and kube-controller-manager
    /// ([`SERVICE_CIDR`] unless a test needs more clusterIPs than it holds; two, comma-separated,
    /// for a dual-stack cluster).
    pub service_cidr: String,
    /// kube-controller-manager's `--cluster-cidr` ([`CLUSTER_CIDR`]; two, comma-separated, for a
    /// dual-stack cluster).
    pub cluster_cidr: String,
    /// An etcd data directory kept from an earlier control plane, copied in before etcd starts:
    /// the API server then serves that control plane's objects without their being written
    /// again (the proxies benchmark keeps the state of its large sizes this way).
    pub etcd_data: Option<PathBuf>,
}

/// The network namespace a control plane runs in when real nodes must reach it (and it them:
/// kube-apiserver connects to every kubelet for logs and exec), like kind's control-plane
/// container. This machine's clients reach it through a relay on 127.0.0.1 of the same port.
#[derive(Debug, Clone)]
pub struct Network {
    /// `/run/netns/<name>`, made by the caller.
    pub netns: PathBuf,
    /// The control plane's address in that namespace: kube-apiserver advertises it (the
    /// `kubernetes` Service's endpoint) and its serving certificate names it.
    pub address: Ipv4Addr,
}

impl Options {
    /// etcd and kube-apiserver only, owned by this process, in `dir`.
    pub fn minimal(dir: impl Into<PathBuf>) -> Options {
        Options {
            dir: dir.into(),
            lifetime: Lifetime::Owned,
            upstream_controllers: None,
            upstream_scheduler: false,
            scheduler_program: None,
            kwok_nodes: 0,
            apiserver_flags: Vec::new(),
            network: None,
            service_cidr: SERVICE_CIDR.to_string(),
            cluster_cidr: CLUSTER_CIDR.to_string(),
            etcd_data: None,
        }
    }
}

/// The loopback ports of one control plane.
#[derive(Debug, Clone, Copy)]
pub struct Ports {
    pub etcd_client: u16,
    pub etcd_peer: u16,
    pub apiserver: u16,
}

/// A running reference control plane. Dropping it stops every process it owns.
pub struct ControlPlane {
    pub dir: PathBuf,
    pub binaries: Binaries,
    pub pki: Pki,
    pub ports: Ports,
    opts: Options,
    admin: ClientCert,
    admin_kubeconfig: PathBuf,
    /// etcd first, then kube-apiserver, then the rest (stopped in reverse).
    processes: Vec<Process>,
}

impl ControlPlane {
    /// Starts etcd and kube-apiserver (and what `opts` asks for) and waits until the API server
    /// is ready. Errors carry the last lines of a process that died while starting.
    pub fn start(opts: Options) -> anyhow::Result<ControlPlane> {
        let binaries = Binaries::locate()?;
        let dir = opts.dir.clone();
        if dir.exists() {
            fs::remove_dir_all(&dir).with_context(|| format!("emptying {}", dir.display()))?;
        }
        fs::create_dir_all(dir.join("logs"))?;
        if let Some(from) = &opts.etcd_data {
            copy_dir(from, &dir.join("etcd"))?;
        }
        let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let kubernetes_vip = IpAddr::V4(Ipv4Addr::new(10, 96, 0, 1));
        let mut serving_ips = vec![loopback, kubernetes_vip];
        if let Some(network) = &opts.network {
            serving_ips.push(IpAddr::V4(network.address));
        }
        let pki = Pki::generate(&dir.join("pki"), &serving_ips)?;
        let admin = pki.client("admin", "kubernetes-admin", Some("system:masters"))?;
        let ports = free_ports()?;
        let mut cp = ControlPlane {
            admin_kubeconfig: dir.join("admin.kubeconfig"),
            dir,
            binaries,
            pki,
            ports,
            opts,
            admin,
            processes: Vec::new(),
        };
        write_kubeconfig(
            &cp.admin_kubeconfig,
            &cp.server_url(),
            &cp.pki.ca_cert,
            Auth::Cert(&cp.admin),
        )?;
        cp.start_etcd()?;
        cp.start_apiserver()?;
        cp.bootstrap()?;
        if let Some(controllers) = cp.opts.upstream_controllers.clone() {
            cp.start_upstream_controller_manager(&controllers)?;
        }
        if cp.opts.upstream_scheduler {
            cp.start_upstream_scheduler()?;
        }
        if let Some(program) = cp.opts.scheduler_program.clone() {
            cp.start_scheduler_program(&program, Vec::new())?;
        }
        if cp.opts.kwok_nodes > 0 {
            cp.start_kwok(cp.opts.kwok_nodes)?;
        }
        Ok(cp)
    }

    /// `https://127.0.0.1:<port>`.
    pub fn server_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.ports.apiserver)
    }

    /// The API server's URL for nodes in the control plane's network (its [`Network`] address),
    /// or [`ControlPlane::server_url`] without one.
    pub fn network_server_url(&self) -> String {
        match &self.opts.network {
            Some(network) => format!("https://{}:{}", network.address, self.ports.apiserver),
            None => self.server_url(),
        }
    }

    /// The admin kubeconfig (client certificate in `system:masters`).
    pub fn admin_kubeconfig(&self) -> &Path {
        &self.admin_kubeconfig
    }

    /// A kube client with the admin's credentials.
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        client_from(&self.admin_kubeconfig).await
    }

    /// `kubectl --kubeconfig <admin>` of the reference release.
    pub fn kubectl(&self) -> Command {
        let mut cmd = Command::new(self.binaries.path("kubectl"));
        cmd.arg("--kubeconfig").arg(&self.admin_kubeconfig);
        cmd
    }

    /// Runs kubectl with `args` (and `stdin`), returning stdout; an error carries stderr.
    pub fn kubectl_run(&self, args: &[&str], stdin: Option<&str>) -> anyhow::Result<String> {
        run_with_input(self.kubectl().args(args), stdin)
    }

    /// Writes a kubeconfig for a client certificate of user `name` (in `group`) and returns its
    /// path: how upstream components and tests act as a given user.
    pub fn kubeconfig_for_user(&self, name: &str, group: Option<&str>) -> anyhow::Result<PathBuf> {
        let stem = name.replace([':', '/'], "-");
        let cert = self.pki.client(&stem, name, group)?;
        let path = self.dir.join(format!("{stem}.kubeconfig"));
        write_kubeconfig(
            &path,
            &self.server_url(),
            &self.pki.ca_cert,
            Auth::Cert(&cert),
        )?;
        Ok(path)
    }

    /// Writes a kubeconfig authenticating with a bearer token (a ServiceAccount's), for `server`
    /// (this control plane's URL unless a relay stands in between).
    pub fn kubeconfig_for_token(
        &self,
        file: &str,
        token: &str,
        server: &str,
    ) -> anyhow::Result<PathBuf> {
        let path = self.dir.join(file);
        write_kubeconfig(&path, server, &self.pki.ca_cert, Auth::Token(token))?;
        Ok(path)
    }

    /// The admin kubeconfig's content with another server address (a relay in a namespace).
    pub fn admin_kubeconfig_for(&self, server: &str) -> anyhow::Result<String> {
        Ok(serde_json::to_string_pretty(&kubeconfig_json(
            server,
            &self.pki.ca_cert,
            Auth::Cert(&self.admin),
        )?)?)
    }

    /// A token for ServiceAccount `namespace/name` (TokenRequest, through kubectl).
    pub fn service_account_token(&self, namespace: &str, name: &str) -> anyhow::Result<String> {
        let out = self.kubectl_run(
            &[
                "create",
                "token",
                name,
                "-n",
                namespace,
                "--duration",
                "24h",
            ],
            None,
        )?;
        Ok(out.trim().to_string())
    }

    /// The log file of component `name`.
    pub fn log(&self, name: &str) -> PathBuf {
        self.logs_dir().join(format!("{name}.log"))
    }

    /// Where every process of this control plane logs (and a test's own processes may too).
    pub fn logs_dir(&self) -> PathBuf {
        self.dir.join("logs")
    }

    /// A guard that fails the test if a log of this control plane gains a Rust panic line
    /// before it is dropped (`what`: what the test is, for the message). An owned control
    /// plane checks its whole logs when dropped; a shared one (never dropped) relies on these.
    pub fn panic_guard(&self, what: &str) -> crate::PanicGuard {
        crate::PanicGuard::new(&self.logs_dir(), what)
    }

    /// Starts a reference component, in the control plane's network namespace if it has one.
    fn spawn(&mut self, name: &str, args: Vec<String>) -> anyhow::Result<()> {
        let program = self.binaries.path(name);
        let netns = self.opts.network.as_ref().map(|n| n.netns.clone());
        self.spawn_in(name, &program, args, Vec::new(), netns.as_deref())
    }

    /// Starts another process beside the control plane (kpr's controller-manager, say), with the
    /// same lifetime and its log in the same place; stopped with the rest.
    pub fn spawn_program(
        &mut self,
        name: &str,
        program: &Path,
        args: Vec<String>,
    ) -> anyhow::Result<()> {
        self.spawn_in(name, program, args, Vec::new(), None)
    }

    /// [`ControlPlane::spawn_program`] with environment variables, in network namespace `netns`
    /// (a node's kubelet and containerd) or ours.
    pub fn spawn_in(
        &mut self,
        name: &str,
        program: &Path,
        args: Vec<String>,
        env: Vec<(String, String)>,
        netns: Option<&Path>,
    ) -> anyhow::Result<()> {
        let spec = Spec {
            name: name.to_string(),
            program: program.to_path_buf(),
            args,
            env,
            log: self.log(name),
            netns: netns.map(Path::to_path_buf),
        };
        let process = Process::start(spec, self.opts.lifetime)?;
        self.processes.push(process);
        Ok(())
    }

    fn start_etcd(&mut self) -> anyhow::Result<()> {
        let data = self.dir.join("etcd");
        let p = self.ports;
        self.spawn(
            "etcd",
            vec![
                "--name=reference".into(),
                format!("--data-dir={}", data.display()),
                format!("--listen-client-urls=http://127.0.0.1:{}", p.etcd_client),
                format!("--advertise-client-urls=http://127.0.0.1:{}", p.etcd_client),
                format!("--listen-peer-urls=http://127.0.0.1:{}", p.etcd_peer),
                format!(
                    "--initial-advertise-peer-urls=http://127.0.0.1:{}",
                    p.etcd_peer
                ),
                format!(
                    "--initial-cluster=reference=http://127.0.0.1:{}",
                    p.etcd_peer
                ),
                // Tests throw the data away; fsync would only make them slower.
                "--unsafe-no-fsync".into(),
                "--log-level=warn".into(),
            ],
        )
    }

    /// Starts kube-apiserver (again, after [`ControlPlane::stop_apiserver`]: same port, same
    /// etcd) and waits until `/readyz` answers.
    pub fn start_apiserver(&mut self) -> anyhow::Result<()> {
        if self.find("kube-apiserver").is_some() {
            bail!("kube-apiserver is already running");
        }
        let pki = &self.pki;
        let (bind, advertise) = match &self.opts.network {
            Some(network) => ("0.0.0.0".to_string(), network.address.to_string()),
            None => ("127.0.0.1".to_string(), "127.0.0.1".to_string()),
        };
        let mut args = vec![
            format!("--etcd-servers=http://127.0.0.1:{}", self.ports.etcd_client),
            format!("--bind-address={bind}"),
            format!("--advertise-address={advertise}"),
            format!("--secure-port={}", self.ports.apiserver),
            format!("--tls-cert-file={}", pki.serving_cert.display()),
            format!("--tls-private-key-file={}", pki.serving_key.display()),
            format!("--client-ca-file={}", pki.ca_cert.display()),
            format!("--service-account-key-file={}", pki.sa_pub.display()),
            format!(
                "--service-account-signing-key-file={}",
                pki.sa_key.display()
            ),
            format!("--service-account-issuer={SA_ISSUER}"),
            format!("--service-cluster-ip-range={}", self.opts.service_cidr),
            "--authorization-mode=Node,RBAC".into(),
            "--allow-privileged=true".into(),
            "--profiling=false".into(),
        ];
        if self.opts.network.is_some() {
            // kubelets authorize kube-apiserver's logs/exec/port-forward requests by this.
            let kubelet_client = self.pki.client(
                "apiserver-kubelet-client",
                "kube-apiserver-kubelet-client",
                Some("system:masters"),
            )?;
            args.push(format!(
                "--kubelet-client-certificate={}",
                kubelet_client.cert.display()
            ));
            args.push(format!(
                "--kubelet-client-key={}",
                kubelet_client.key.display()
            ));
            args.push("--kubelet-preferred-address-types=InternalIP".into());
            // The aggregation layer as kubeadm configures it (the front proxy's client
            // certificate and the request headers an aggregated API server such as
            // metrics-server trusts), here from the cluster CA restricted to that one name.
            let front_proxy = self
                .pki
                .client("front-proxy-client", FRONT_PROXY_CLIENT, None)?;
            args.extend([
                format!("--proxy-client-cert-file={}", front_proxy.cert.display()),
                format!("--proxy-client-key-file={}", front_proxy.key.display()),
                format!("--requestheader-client-ca-file={}", pki.ca_cert.display()),
                format!("--requestheader-allowed-names={FRONT_PROXY_CLIENT}"),
                "--requestheader-username-headers=X-Remote-User".into(),
                "--requestheader-group-headers=X-Remote-Group".into(),
                "--requestheader-extra-headers-prefix=X-Remote-Extra-".into(),
                // The control plane runs beside the nodes, where no Service proxy runs: the
                // aggregator dials an APIService's endpoints, not its ClusterIP.
                "--enable-aggregator-routing=true".into(),
            ]);
        } else {
            // The `kubernetes` Service's endpoint would be 127.0.0.1, which EndpointSlice
            // validation refuses; nothing on loopback-only control planes can use it anyway.
            args.push("--endpoint-reconciler-type=none".into());
        }
        args.extend(self.opts.apiserver_flags.iter().cloned());
        self.spawn("kube-apiserver", args)?;
        self.start_relay()?;
        self.wait_ready(Duration::from_secs(90))
    }

    /// With a [`Network`]: socat on this machine's 127.0.0.1:<port>, each connection relayed
    /// from inside the namespace to the API server there (once; it outlives API server restarts).
    fn start_relay(&mut self) -> anyhow::Result<()> {
        let Some(network) = self.opts.network.clone() else {
            return Ok(());
        };
        if self.find("apiserver-relay").is_some() {
            return Ok(());
        }
        let socat = find_program("socat")?;
        let nsenter = find_program("nsenter")?;
        let port = self.ports.apiserver;
        // socat splits its address on ':', so the inner command goes in a script.
        let script = self.dir.join("apiserver-relay.sh");
        fs::write(
            &script,
            format!(
                "#!/bin/sh\nexec {} --net={} {} STDIO TCP:127.0.0.1:{port}\n",
                nsenter.display(),
                network.netns.display(),
                socat.display()
            ),
        )?;
        fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
        let args = vec![
            format!("TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork"),
            format!("EXEC:{}", script.display()),
        ];
        self.spawn_in("apiserver-relay", &socat, args, Vec::new(), None)
    }

    /// Stops kube-apiserver (SIGTERM; etcd keeps running): every watch is cut, every request
    /// refused until [`ControlPlane::start_apiserver`].
    pub fn stop_apiserver(&mut self) {
        self.stop("kube-apiserver");
    }

    /// Stops the named component if it runs.
    pub fn stop(&mut self, name: &str) {
        if let Some(i) = self.find(name) {
            let mut process = self.processes.remove(i);
            process.stop(Duration::from_secs(10));
        }
    }

    /// Kills the named component with SIGKILL (a crash: no Lease released, no request finished)
    /// and forgets it; false if it was not running.
    pub fn kill(&mut self, name: &str) -> bool {
        match self.find(name) {
            Some(i) => {
                self.processes.remove(i).kill();
                true
            }
            None => false,
        }
    }

    fn find(&self, name: &str) -> Option<usize> {
        self.processes.iter().position(|p| p.spec.name == name)
    }

    /// Waits until `/readyz` answers ok; fails early, with its log, if a process died.
    pub fn wait_ready(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            self.check_alive()?;
            let last = match self.kubectl_run(&["get", "--raw", "/readyz"], None) {
                Ok(out) if out.trim() == "ok" => return Ok(()),
                Ok(out) => out,
                Err(e) => format!("{e:#}"),
            };
            if Instant::now() > deadline {
                bail!(
                    "kube-apiserver not ready after {timeout:?}: {last}; last lines of its log:\n{}",
                    crate::process::tail(&self.log("kube-apiserver"), 30)
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// `Err` naming the first process that exited, with the last lines of its log.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        for p in &mut self.processes {
            p.check_alive()?;
        }
        Ok(())
    }

    /// What every fresh cluster needs before tests create Pods: the `default` ServiceAccount in
    /// `default` and `kube-system` (kube-controller-manager's serviceaccount controller makes
    /// them, and it may not run; the ServiceAccount admission plugin refuses Pods without one).
    fn bootstrap(&self) -> anyhow::Result<()> {
        for ns in ["default", "kube-system"] {
            self.ensure_default_service_account(ns)?;
        }
        Ok(())
    }

    /// Creates namespace `name` (if missing) with its `default` ServiceAccount.
    pub fn create_namespace(&self, name: &str) -> anyhow::Result<()> {
        let manifest = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
        self.kubectl_run(&["apply", "-f", "-"], Some(&manifest.to_string()))?;
        self.ensure_default_service_account(name)
    }

    fn ensure_default_service_account(&self, ns: &str) -> anyhow::Result<()> {
        let sa = json!({"apiVersion": "v1", "kind": "ServiceAccount",
                        "metadata": {"name": "default", "namespace": ns}});
        self.kubectl_run(&["apply", "-f", "-"], Some(&sa.to_string()))?;
        Ok(())
    }

    /// kube-controller-manager of the reference release with `--controllers=<controllers>`,
    /// under its own identity (`system:kube-controller-manager`), no leader election.
    pub fn start_upstream_controller_manager(&mut self, controllers: &str) -> anyhow::Result<()> {
        self.start_upstream_controller_manager_with(controllers, &[])
    }

    /// The same with extra flags (e.g. `--kube-api-qps=1000`).
    pub fn start_upstream_controller_manager_with(
        &mut self,
        controllers: &str,
        extra: &[&str],
    ) -> anyhow::Result<()> {
        let kubeconfig = self.kubeconfig_for_user("system:kube-controller-manager", None)?;
        let mut args = vec![
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--authentication-kubeconfig={}", kubeconfig.display()),
            format!("--authorization-kubeconfig={}", kubeconfig.display()),
            format!("--controllers={controllers}"),
            "--leader-elect=false".into(),
            "--secure-port=0".into(),
            format!(
                "--service-account-private-key-file={}",
                self.pki.sa_key.display()
            ),
            format!("--root-ca-file={}", self.pki.ca_cert.display()),
            "--use-service-account-credentials=true".into(),
            format!("--service-cluster-ip-range={}", self.opts.service_cidr),
            format!("--cluster-cidr={}", self.opts.cluster_cidr),
            format!("--cluster-signing-cert-file={}", self.pki.ca_cert.display()),
            format!("--cluster-signing-key-file={}", self.pki.ca_key.display()),
        ];
        args.extend(extra.iter().map(|a| a.to_string()));
        self.spawn("kube-controller-manager", args)
    }

    /// kube-scheduler of the reference release, as `system:kube-scheduler`.
    pub fn start_upstream_scheduler(&mut self) -> anyhow::Result<()> {
        let kubeconfig = self.kubeconfig_for_user("system:kube-scheduler", None)?;
        let args = vec![
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--authentication-kubeconfig={}", kubeconfig.display()),
            format!("--authorization-kubeconfig={}", kubeconfig.display()),
            "--leader-elect=false".into(),
            "--secure-port=0".into(),
        ];
        self.spawn("kube-scheduler", args)
    }

    /// A scheduler other than kube-scheduler (kpr's `scheduler`), as `system:kube-scheduler`
    /// with `--kubeconfig` and `extra` flags; its log is `kpr-scheduler.log`.
    pub fn start_scheduler_program(
        &mut self,
        program: &Path,
        extra: Vec<String>,
    ) -> anyhow::Result<()> {
        let kubeconfig = self.kubeconfig_for_user("system:kube-scheduler", None)?;
        let mut args = vec![format!("--kubeconfig={}", kubeconfig.display())];
        args.extend(extra);
        self.spawn_program("kpr-scheduler", program, args)
    }

    /// kwok managing `nodes` fake nodes `kwok-node-<i>` (created here), whose Pods become
    /// Running and Ready without containers.
    pub fn start_kwok(&mut self, nodes: usize) -> anyhow::Result<()> {
        let args = vec![
            format!("--kubeconfig={}", self.admin_kubeconfig.display()),
            "--manage-all-nodes=false".into(),
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake".into(),
            "--manage-nodes-with-label-selector=".into(),
            "--disregard-status-with-annotation-selector=kwok.x-k8s.io/status=custom".into(),
            "--disregard-status-with-label-selector=".into(),
            format!("--cidr={CLUSTER_CIDR}"),
            "--node-ip=10.0.0.1".into(),
            "--node-lease-duration-seconds=40".into(),
            "--server-address=127.0.0.1:0".into(),
        ];
        self.spawn("kwok", args)?;
        let mut items = Vec::new();
        for i in 0..nodes {
            items.push(kwok_node(&format!("kwok-node-{i}")));
        }
        let list = json!({"apiVersion": "v1", "kind": "List", "items": items});
        self.kubectl_run(&["apply", "-f", "-"], Some(&list.to_string()))?;
        Ok(())
    }

    /// Compacts etcd's history at its current revision, so a watch or list from an older
    /// resourceVersion gets 410 Gone (once the API server's watch cache no longer holds it).
    pub fn compact_etcd(&self) -> anyhow::Result<u64> {
        let endpoint = format!("http://127.0.0.1:{}", self.ports.etcd_client);
        let etcdctl = self.binaries.path("etcdctl");
        compact_etcd_with(|| Command::new(&etcdctl), &endpoint)
    }

    /// The pids of every running process (`cargo xtask cluster` records them).
    pub fn pids(&self) -> Vec<(String, u32)> {
        self.processes
            .iter()
            .map(|p| (p.spec.name.clone(), p.pid()))
            .collect()
    }

    /// Hands the processes over without stopping them (detached clusters outlive `up`).
    pub fn release(mut self) -> Vec<(String, u32)> {
        std::mem::take(&mut self.processes)
            .into_iter()
            .map(|p| (p.spec.name.clone(), p.release()))
            .collect()
    }
}

impl Drop for ControlPlane {
    /// Stops every process, then (owned control planes: a test's or a benchmark's) fails if
    /// any of them panicked (see [`crate::panics`]), unless the thread is panicking already.
    fn drop(&mut self) {
        while let Some(mut p) = self.processes.pop() {
            p.stop(Duration::from_secs(5));
        }
        if self.opts.lifetime == Lifetime::Owned {
            let what = format!("the life of the control plane in {}", self.dir.display());
            drop(crate::PanicGuard::from_start(&self.logs_dir(), &what));
        }
    }
}

/// Copies a directory tree (`cp -a`, reflinked where the filesystem can: an etcd of 100,000
/// Services is gigabytes).
pub fn copy_dir(from: &Path, to: &Path) -> anyhow::Result<()> {
    let status = Command::new("cp")
        .args(["-a", "--reflink=auto"])
        .arg(from)
        .arg(to)
        .status()
        .context("running cp")?;
    if !status.success() {
        bail!("cp -a {} {}: {status}", from.display(), to.display());
    }
    Ok(())
}

/// `name` on PATH or in the usual system directories.
pub fn find_program(name: &str) -> anyhow::Result<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    let found = path
        .split(':')
        .chain([
            "/usr/local/sbin",
            "/usr/local/bin",
            "/usr/sbin",
            "/usr/bin",
            "/sbin",
            "/bin",
        ])
        .map(|dir| Path::new(dir).join(name))
        .find(|p| p.is_file());
    found.with_context(|| format!("{name} is not installed (`cargo xtask setup` installs it)"))
}

fn kwok_node(name: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"node.alpha.kubernetes.io/ttl": "0", "kwok.x-k8s.io/node": "fake"},
            "labels": {"beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
                       "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": name,
                       "kubernetes.io/os": "linux", "kubernetes.io/role": "agent",
                       "node-role.kubernetes.io/agent": "", "type": "kwok"}
        },
        "status": {
            "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"},
            "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110"},
            "phase": "Running"
        }
    })
}

/// Three free loopback ports (held together while choosing, so they differ).
/// Where a control plane's ports are chosen: below the kernel's ephemeral range (32768 and up by
/// default) and the NodePort range (30000-32767). A port `bind(0)` returned and the caller closed
/// again goes back to the ephemeral pool, where any outgoing connection of a parallel test can
/// take it before etcd or kube-apiserver binds it ("address already in use"); these are never
/// handed out that way.
const PORTS: std::ops::Range<u16> = 20_000..30_000;

/// Three free ports from [`PORTS`], at random, never the same twice in this process.
fn free_ports() -> anyhow::Result<Ports> {
    use std::collections::BTreeSet;
    use std::hash::{BuildHasher, RandomState};
    use std::sync::Mutex;
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    let random = RandomState::new();
    let span = u64::from(PORTS.end - PORTS.start);
    let mut pick = |which: u64| -> anyhow::Result<u16> {
        for attempt in 0..1_000u64 {
            let port = PORTS.start + (random.hash_one((which, attempt)) % span) as u16;
            if !handed_out.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
                handed_out.insert(port);
                return Ok(port);
            }
        }
        bail!("no free port in {PORTS:?} after 1,000 tries")
    };
    Ok(Ports {
        etcd_client: pick(0)?,
        etcd_peer: pick(1)?,
        apiserver: pick(2)?,
    })
}

enum Auth<'a> {
    Cert(&'a ClientCert),
    Token(&'a str),
}

fn kubeconfig_json(server: &str, ca: &Path, auth: Auth<'_>) -> anyhow::Result<serde_json::Value> {
    let user = match auth {
        Auth::Cert(c) => json!({"client-certificate": c.cert, "client-key": c.key}),
        Auth::Token(t) => json!({"token": t}),
    };
    Ok(json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "reference", "cluster": {"server": server, "certificate-authority": ca}}],
        "users": [{"name": "user", "user": user}],
        "contexts": [{"name": "reference", "context": {"cluster": "reference", "user": "user"}}],
        "current-context": "reference",
    }))
}

/// A kubeconfig for a client certificate of this control plane's CA, for `server`.
pub(crate) fn write_kubeconfig_file(
    path: &Path,
    server: &str,
    pki: &Pki,
    cert: &ClientCert,
) -> anyhow::Result<()> {
    write_kubeconfig(path, server, &pki.ca_cert, Auth::Cert(cert))
}

fn write_kubeconfig(path: &Path, server: &str, ca: &Path, auth: Auth<'_>) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(&kubeconfig_json(server, ca, auth)?)?;
    fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// A kube client from a kubeconfig file.
pub async fn client_from(kubeconfig: &Path) -> anyhow::Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("reading {}", kubeconfig.display()))?;
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .with_context(|| format!("loading {}", kubeconfig.display()))?;
    Ok(kube::Client::try_from(config)?)
}

/// Compacts the history of the etcd at `endpoint` (a client URL) at its current revision, with
/// the `etcdctl` commands `etcdctl()` makes (a plain one, or one entering etcd's network
/// namespace); the revision.
pub fn compact_etcd_with(etcdctl: impl Fn() -> Command, endpoint: &str) -> anyhow::Result<u64> {
    let endpoint = format!("--endpoints={endpoint}");
    let status = run_with_input(
        etcdctl().args([&endpoint, "endpoint", "status", "-w", "json"]),
        None,
    )?;
    let parsed: serde_json::Value =
        serde_json::from_str(&status).context("parsing etcdctl endpoint status")?;
    let revision = parsed[0]["Status"]["header"]["revision"]
        .as_u64()
        .with_context(|| format!("no revision in etcdctl's status: {status}"))?;
    run_with_input(
        etcdctl().args([&endpoint, "compact", &revision.to_string(), "--physical"]),
        None,
    )?;
    Ok(revision)
}

fn run_with_input(cmd: &mut Command, stdin: Option<&str>) -> anyhow::Result<String> {
    use std::io::Write as _;
    use std::process::Stdio;
    let shown = format!("{cmd:?}");
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().with_context(|| format!("running {shown}"))?;
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .expect("piped stdin")
            .write_all(input.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "{shown} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
