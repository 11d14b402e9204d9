//! Runs the `proxy` agent inside a node namespace with the file source, and reads what it reports.
//!
//! Owns: the agent process, its manifest directory and its log file. The guard stops the agent
//! (SIGTERM, then SIGKILL) and removes the directory on drop, printing the agent's log when the test
//! is panicking (or always with `KPR_TEST_LOG=1`).

use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde::Deserialize;

use crate::client::http_get;
use crate::cluster::{
    CLUSTER_CIDR, CLUSTER_CIDR6, NODE_IP, NODE_IP6, NODE_NAME, SERVICE_CIDR, SERVICE_CIDR6,
};
use crate::netns::{unique_prefix, Netns};
use crate::HarnessError;

/// Where the agent serves `/healthz` (inside the node namespace).
pub const HEALTHZ_ADDR: &str = "127.0.0.1:10256";
/// Where the agent serves metrics and `/state` (inside the node namespace).
pub const METRICS_ADDR: &str = "127.0.0.1:10249";

/// The flags every harness run gives `proxy run`, in order, each with its value (`run_args`);
/// optional flags come from the options. deploy/'s DaemonSet must pass each of these too (its
/// test reads this list).
pub const HARNESS_FLAGS: [&str; 11] = [
    "--backend",
    "--source",
    "--balance",
    "--hostname-override",
    "--cluster-cidr",
    "--service-cluster-ip-range",
    "--nodeport-addresses",
    "--sync-period",
    "--udp-idle-timeout",
    "--metrics-bind-address",
    "--healthz-bind-address",
];

/// How the agent is started.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// `userspace`, `nftables`, `iptables` or `ebpf`.
    pub backend: String,
    /// `round-robin` or `least-conn`.
    pub balance: String,
    /// More flags (`--masquerade-all`, `--cgroup-path DIR`, ...).
    pub extra_args: Vec<String>,
    /// How long to wait for the first healthy `/healthz`.
    pub ready_timeout: Duration,
    /// `--cgroup-path` (required for `ebpf`: never the machine's root cgroup).
    pub cgroup: Option<PathBuf>,
    /// The `proxy` binary; `None` means [`proxy_binary`].
    pub binary: Option<PathBuf>,
    /// Pass the IPv6 cluster CIDR, service CIDR and node address as well (for
    /// `ClusterSpec::dual_stack` clusters).
    pub dual_stack: bool,
    /// `--source kube --kubeconfig PATH` instead of the file source (the manifests passed to
    /// [`Agent::start`] are then written but not read).
    pub kubeconfig: Option<PathBuf>,
    /// `--min-sync-period`: 100 ms for the suites (their changes should show at once); `None`
    /// leaves the agent's default, as a benchmark comparing it with kube-proxy's defaults does.
    pub min_sync_period: Option<String>,
}

/// Set (seconds) where everything runs slower than on the host, e.g. by `cargo xtask vm` in
/// its emulated (TCG) guests, where loading the eBPF programs alone can take most of 30 s.
pub const READY_TIMEOUT_ENV: &str = "KPR_TEST_READY_TIMEOUT";

/// 30 s, or the seconds in [`READY_TIMEOUT_ENV`] when that is set to a number.
fn default_ready_timeout() -> Duration {
    let secs = std::env::var(READY_TIMEOUT_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    Duration::from_secs(secs)
}

impl AgentOptions {
    pub fn backend(backend: &str) -> AgentOptions {
        AgentOptions {
            backend: backend.into(),
            balance: "round-robin".into(),
            extra_args: Vec::new(),
            ready_timeout: default_ready_timeout(),
            cgroup: None,
            binary: None,
            dual_stack: false,
            kubeconfig: None,
            min_sync_period: Some("100ms".into()),
        }
    }

    /// Fed by the API server of this kubeconfig (`--source kube`).
    pub fn kube(mut self, kubeconfig: impl Into<PathBuf>) -> Self {
        self.kubeconfig = Some(kubeconfig.into());
        self
    }

    /// The agent's own `--min-sync-period` default instead of the suites' 100 ms.
    pub fn default_min_sync_period(mut self) -> Self {
        self.min_sync_period = None;
        self
    }

    /// IPv4 and IPv6 CIDRs in the flags.
    pub fn dual_stack(mut self) -> Self {
        self.dual_stack = true;
        self
    }

    /// Run this `proxy` binary instead of the default one.
    pub fn binary(mut self, path: impl Into<PathBuf>) -> Self {
        self.binary = Some(path.into());
        self
    }

    /// Attach the eBPF socket programs to this test cgroup.
    pub fn cgroup(mut self, cgroup: &crate::cgroup::Cgroup) -> Self {
        self.cgroup = Some(cgroup.path().to_path_buf());
        self
    }

    pub fn balance(mut self, balance: &str) -> Self {
        self.balance = balance.into();
        self
    }

    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.extra_args.push(arg.into());
        self
    }
}

/// The directory of this harness's debug binaries: under `$CARGO_TARGET_DIR` (at run time, then
/// at build time), else under the workspace's `target/`.
pub fn debug_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .or_else(|| option_env!("CARGO_TARGET_DIR").map(PathBuf::from))
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"))
        .join("debug")
}

/// The `proxy` binary: `$KPR_PROXY_BIN`, else `proxy` in [`debug_dir`].
pub fn proxy_binary() -> Result<PathBuf, HarnessError> {
    let path = match std::env::var_os("KPR_PROXY_BIN") {
        Some(p) => PathBuf::from(p),
        None => debug_dir().join("proxy"),
    };
    if !path.is_file() {
        return Err(HarnessError::Agent(format!(
            "no proxy binary at {}: build it: cargo build -p proxy (cargo xtask test does this)",
            path.display()
        )));
    }
    Ok(path)
}

/// Runs a one-shot `proxy` command (`inspect`, `trace`, `cleanup`), panics with its stdout and
/// stderr when it fails, echoes it to the test's log and returns its stdout.
pub fn proxy_stdout(cmd: &mut std::process::Command) -> String {
    let shown = format!("{cmd:?}");
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {shown}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{shown}: {}\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("$ {shown}\n{stdout}");
    stdout
}

/// A running agent. Borrow of the node namespace keeps the namespace alive longer than the agent.
#[derive(Debug)]
pub struct Agent<'n> {
    node: &'n Netns,
    child: Mutex<Option<Child>>,
    dir: PathBuf,
    manifests: PathBuf,
    log: PathBuf,
    opts: AgentOptions,
    /// The eBPF backend's private `--bpffs-path`, removed on drop.
    bpffs: Option<PathBuf>,
    binary: PathBuf,
}

impl<'n> Agent<'n> {
    /// Writes `manifests` (file name, content) into a fresh directory, starts
    /// `proxy run --source file:DIR` in `node` and waits until `/healthz` answers 200.
    pub fn start(
        node: &'n Netns,
        opts: &AgentOptions,
        manifests: &[(&str, String)],
    ) -> Result<Agent<'n>, HarnessError> {
        let binary = match &opts.binary {
            Some(b) => b.clone(),
            None => proxy_binary()?,
        };
        let dir = std::env::temp_dir().join(format!("{}-agent", unique_prefix()));
        let manifest_dir = dir.join("manifests");
        fs::create_dir_all(&manifest_dir).map_err(|e| HarnessError::Io {
            what: format!("creating {}", manifest_dir.display()),
            source: e,
        })?;
        let bpffs =
            (opts.backend == "ebpf").then(|| PathBuf::from("/sys/fs/bpf").join(unique_prefix()));
        let agent = Agent {
            node,
            opts: opts.clone(),
            binary,
            child: Mutex::new(None),
            log: dir.join("agent.log"),
            dir,
            manifests: manifest_dir,
            bpffs,
        };
        for (name, content) in manifests {
            agent.write_manifest(name, content)?;
        }
        agent.spawn()?;
        Ok(agent)
    }

    /// Stops the agent and starts it again with the same flags and manifests (the log continues).
    pub fn restart(&self) -> Result<(), HarnessError> {
        self.stop();
        self.spawn()
    }

    /// As [`Agent::restart`], with `args` added to its flags from now on (an upgrade that
    /// changes a setting, on the same pins and manifests).
    pub fn restart_with(&mut self, args: &[&str]) -> Result<(), HarnessError> {
        self.opts
            .extra_args
            .extend(args.iter().map(|a| a.to_string()));
        self.restart()
    }

    /// Starts the process (appending to the log) and waits for the first healthy `/healthz`.
    fn spawn(&self) -> Result<(), HarnessError> {
        let io = |what: String| move |e| HarnessError::Io { what, source: e };
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(io(format!("opening {}", self.log.display())))?;
        let log_err = log
            .try_clone()
            .map_err(io("duplicating the log handle".into()))?;
        let mut cmd = self.node.exec(&self.binary)?;
        cmd.args(self.run_args()?)
            .env("NO_COLOR", "1")
            .env("RUST_LIB_BACKTRACE", "0")
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err);
        let child = cmd
            .spawn()
            .map_err(io(format!("spawning {}", self.binary.display())))?;
        *self.child.lock().unwrap_or_else(|p| p.into_inner()) = Some(child);
        self.wait_healthy(self.opts.ready_timeout)
    }

    /// `run` and every flag, in the order of the agent's usage line.
    fn run_args(&self) -> Result<Vec<String>, HarnessError> {
        let o = &self.opts;
        let source = match &o.kubeconfig {
            Some(_) => "kube".to_string(),
            None => format!("file:{}", self.manifests.display()),
        };
        let (cluster, services, nodeport) = if o.dual_stack {
            (
                format!("{CLUSTER_CIDR},{CLUSTER_CIDR6}"),
                format!("{SERVICE_CIDR},{SERVICE_CIDR6}"),
                format!("{NODE_IP}/32,{NODE_IP6}/128"),
            )
        } else {
            (
                CLUSTER_CIDR.into(),
                SERVICE_CIDR.into(),
                format!("{NODE_IP}/32"),
            )
        };
        let values: [String; HARNESS_FLAGS.len()] = [
            o.backend.clone(),
            source,
            o.balance.clone(),
            NODE_NAME.into(),
            cluster,
            services,
            nodeport,
            "30s".into(),
            "60s".into(),
            METRICS_ADDR.into(),
            "0.0.0.0:10256".into(),
        ];
        let mut args = vec!["run".to_string()];
        for (flag, value) in HARNESS_FLAGS.iter().zip(values) {
            args.extend([flag.to_string(), value]);
        }
        args.extend(self.optional_args());
        args.extend(self.isolation_args()?);
        args.extend(o.extra_args.iter().cloned());
        Ok(args)
    }

    /// Flags only some runs pass: the suites' short minimum sync period, a benchmark's kubeconfig.
    fn optional_args(&self) -> Vec<String> {
        let o = &self.opts;
        let mut args = Vec::new();
        if let Some(period) = &o.min_sync_period {
            args.extend(["--min-sync-period".to_string(), period.clone()]);
        }
        if let Some(kubeconfig) = &o.kubeconfig {
            args.extend(["--kubeconfig".to_string(), kubeconfig.display().to_string()]);
        }
        args
    }

    /// Flags that keep an eBPF agent off the machine's own cgroup and pins.
    fn isolation_args(&self) -> Result<Vec<String>, HarnessError> {
        let mut args = Vec::new();
        if let Some(bpffs) = &self.bpffs {
            let Some(cgroup) = &self.opts.cgroup else {
                return Err(HarnessError::Agent(
                    "the ebpf backend needs a test cgroup: AgentOptions::cgroup(&Cgroup::new(..)?)"
                        .into(),
                ));
            };
            args.extend(["--cgroup-path".to_string(), cgroup.display().to_string()]);
            args.extend(["--bpffs-path".to_string(), bpffs.display().to_string()]);
        }
        Ok(args)
    }

    /// The directory the file source watches.
    pub fn manifest_dir(&self) -> &Path {
        &self.manifests
    }

    /// Writes (or replaces) one manifest file atomically (write a hidden temp file, then rename).
    pub fn write_manifest(&self, name: &str, content: &str) -> Result<(), HarnessError> {
        let tmp = self.manifests.join(format!(".{name}.tmp"));
        let path = self.manifests.join(name);
        fs::write(&tmp, content)
            .and_then(|_| fs::rename(&tmp, &path))
            .map_err(|e| HarnessError::Io {
                what: format!("writing {}", path.display()),
                source: e,
            })
    }

    /// Removes one manifest file.
    pub fn remove_manifest(&self, name: &str) -> Result<(), HarnessError> {
        let path = self.manifests.join(name);
        fs::remove_file(&path).map_err(|e| HarnessError::Io {
            what: format!("removing {}", path.display()),
            source: e,
        })
    }

    /// Everything the agent printed so far.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `GET /healthz` from inside the node namespace: (status, body).
    pub fn healthz(&self) -> Result<(u16, String), HarnessError> {
        let addr: SocketAddr = HEALTHZ_ADDR.parse().expect("constant");
        http_get(self.node, addr, "/healthz", Duration::from_secs(2))
            .map_err(|e| HarnessError::Agent(format!("GET /healthz: {e}")))
    }

    /// `GET /metrics` (Prometheus text) from inside the node namespace.
    pub fn metrics(&self) -> Result<String, HarnessError> {
        let addr: SocketAddr = METRICS_ADDR.parse().expect("constant");
        match http_get(self.node, addr, "/metrics", Duration::from_secs(2)) {
            Ok((200, body)) => Ok(body),
            Ok((status, body)) => Err(HarnessError::Agent(format!(
                "GET /metrics answered {status}: {body}"
            ))),
            Err(e) => Err(HarnessError::Agent(format!("GET /metrics: {e}"))),
        }
    }

    /// `GET /state`, parsed.
    pub fn state(&self) -> Result<State, HarnessError> {
        let addr: SocketAddr = METRICS_ADDR.parse().expect("constant");
        let (status, body) = http_get(self.node, addr, "/state", Duration::from_secs(2))
            .map_err(|e| HarnessError::Agent(format!("GET /state: {e}")))?;
        if status != 200 {
            return Err(HarnessError::Agent(format!(
                "GET /state answered {status}: {body}"
            )));
        }
        let raw: serde_json::Value = serde_json::from_str(&body)
            .map_err(|e| HarnessError::Agent(format!("GET /state: not JSON ({e}): {body}")))?;
        let mut state: State = serde_json::from_value(raw.clone()).map_err(|e| {
            HarnessError::Agent(format!("GET /state: unexpected shape ({e}): {body}"))
        })?;
        state.raw = raw;
        Ok(state)
    }

    /// Polls `/state` until `ready` holds on a settled state (bounded by `timeout`); the error
    /// shows the last state. Settled: nothing received is left unprogrammed, or the last sync
    /// failed (a test may wait for that). `/state`'s services are the agent's model, ahead of the
    /// dataplane until the next sync: a test that sends traffic as soon as a Service appears
    /// there races the sync.
    pub fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        ready: impl Fn(&State) -> bool,
    ) -> Result<State, HarnessError> {
        let deadline = Instant::now() + timeout;
        loop {
            self.check_running()?;
            let last = self.state();
            if let Ok(s) = &last {
                if s.settled() && ready(s) {
                    return last;
                }
            }
            if Instant::now() > deadline {
                let shown = match last {
                    Ok(s) => serde_json::to_string_pretty(&s.raw).unwrap_or_default(),
                    Err(e) => e.to_string(),
                };
                return Err(HarnessError::Agent(format!(
                    "waited {timeout:?} for {what}; last state: {shown}"
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Polls the agent log until it contains `needle` (bounded by `timeout`).
    pub fn wait_for_log(&self, needle: &str, timeout: Duration) -> Result<String, HarnessError> {
        let deadline = Instant::now() + timeout;
        loop {
            let log = self.log();
            if log.contains(needle) {
                return Ok(log);
            }
            if Instant::now() > deadline {
                return Err(HarnessError::Agent(format!(
                    "waited {timeout:?} for {needle:?} in the agent log"
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn check_running(&self) -> Result<(), HarnessError> {
        let mut guard = self.child.lock().unwrap_or_else(|p| p.into_inner());
        let exited = match guard.as_mut() {
            Some(child) => child.try_wait().ok().flatten().map(|s| s.to_string()),
            None => Some("stopped".to_string()),
        };
        match exited {
            Some(status) => Err(HarnessError::Agent(format!(
                "the agent exited ({status}); its log:\n{}",
                self.log()
            ))),
            None => Ok(()),
        }
    }

    fn wait_healthy(&self, timeout: Duration) -> Result<(), HarnessError> {
        let deadline = Instant::now() + timeout;
        let mut last = String::from("no answer yet");
        while Instant::now() < deadline {
            self.check_running()?;
            match self.healthz() {
                Ok((200, _)) => return Ok(()),
                Ok((code, body)) => last = format!("{code} {body}"),
                Err(e) => last = e.to_string(),
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(HarnessError::Agent(format!(
            "/healthz not 200 after {timeout:?} (last: {last}); agent log:\n{}",
            self.log()
        )))
    }

    fn take_child(&self) -> Option<Child> {
        self.child.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// Kills the agent with SIGKILL (no chance to clean up) and reaps it. `restart` starts it again.
    pub fn kill(&self) -> Option<std::process::ExitStatus> {
        let mut child = self.take_child()?;
        let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
        child.wait().ok()
    }

    /// The eBPF backend's `--bpffs-path` (None for other backends).
    pub fn bpffs_path(&self) -> Option<&Path> {
        self.bpffs.as_deref()
    }

    /// The proxy binary this agent runs (for `proxy inspect`, `trace`, `cleanup`).
    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// Stops the agent: SIGTERM, up to 5 s grace, then SIGKILL. Returns its exit status.
    pub fn stop(&self) -> Option<std::process::ExitStatus> {
        let mut child = self.take_child()?;
        let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        child.wait().ok()
    }
}

impl Drop for Agent<'_> {
    fn drop(&mut self) {
        let status = self.stop();
        if std::thread::panicking() || std::env::var_os("KPR_TEST_LOG").is_some() {
            eprintln!(
                "---- agent log ({}, exit {status:?}) ----\n{}---- end of agent log ----",
                self.log.display(),
                self.log()
            );
        }
        if let Some(bpffs) = &self.bpffs {
            if let Ok(mut c) = self.node.exec(&self.binary) {
                let _ = c
                    .args(["cleanup", "--backend", "ebpf", "--bpffs-path"])
                    .arg(bpffs)
                    .output();
            }
            let _ = fs::remove_dir_all(bpffs);
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// `GET /state` as the tests read it (unknown fields ignored; `raw` keeps everything).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct State {
    pub backend: String,
    pub synced: bool,
    /// Changes the agent has and has not programmed yet.
    #[serde(default)]
    pub pending: bool,
    pub services: Vec<ServiceState>,
    /// Input problems (bad manifests), each naming its object and field.
    pub errors: Vec<String>,
    pub last_sync: Option<serde_json::Value>,
    #[serde(skip)]
    pub raw: serde_json::Value,
}

impl State {
    /// Whether the dataplane has caught up with the model: nothing pending, or the last sync
    /// failed (what it failed on stays pending until a retry succeeds).
    pub fn settled(&self) -> bool {
        let failed = self
            .last_sync
            .as_ref()
            .and_then(|l| l.get("error"))
            .is_some_and(|e| !e.is_null());
        !self.pending || failed
    }

    /// The service port whose name is `name` (`ns/svc:port/TCP` or `ns/svc/TCP`).
    pub fn service(&self, name: &str) -> Option<&ServiceState> {
        self.services.iter().find(|s| s.name == name)
    }
}

/// One service port in `/state`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct ServiceState {
    pub name: String,
    pub cluster_ips: Vec<String>,
    pub port: u16,
    pub protocol: String,
    pub node_port: u16,
    pub algorithm: String,
    pub endpoints: Vec<EndpointState>,
    /// Families of its addresses that are not programmed, each with the reason.
    pub unserved: Vec<String>,
}

impl ServiceState {
    /// Endpoint addresses (`ip:port`).
    pub fn endpoint_addrs(&self) -> Vec<String> {
        self.endpoints.iter().map(|e| e.addr.clone()).collect()
    }
}

/// One endpoint in `/state`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct EndpointState {
    pub addr: String,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    pub active: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn script(body: &str) -> (PathBuf, impl Drop) {
        struct Rm(PathBuf);
        impl Drop for Rm {
            fn drop(&mut self) {
                let _ = fs::remove_file(&self.0);
            }
        }
        let path = std::env::temp_dir().join(format!("{}-fake-proxy", unique_prefix()));
        fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        (path.clone(), Rm(path))
    }

    #[test]
    #[cfg_attr(
        not(feature = "root"),
        ignore = "needs root: the kpr-tests/root test gate (cargo xtask test opens it)"
    )]
    fn an_agent_that_exits_at_once_fails_start_with_its_log() {
        let node = Netns::new("agent").unwrap();
        let (bin, _rm) = script("echo \"bad flag: $2\" >&2; exit 3");
        let opts = AgentOptions::backend("userspace").binary(&bin);
        let err = Agent::start(&node, &opts, &[]).unwrap_err().to_string();
        assert!(err.contains("the agent exited"), "{err}");
        assert!(
            err.contains("bad flag: --backend"),
            "the log is part of the error: {err}"
        );
    }

    #[test]
    #[cfg_attr(
        not(feature = "root"),
        ignore = "needs root: the kpr-tests/root test gate (cargo xtask test opens it)"
    )]
    fn an_agent_that_never_gets_healthy_times_out_and_is_killed() {
        let node = Netns::new("agent").unwrap();
        let (bin, _rm) = script("echo started; exec sleep 600");
        let mut opts = AgentOptions::backend("userspace").binary(&bin);
        opts.ready_timeout = Duration::from_millis(500);
        let started = Instant::now();
        let err = Agent::start(&node, &opts, &[]).unwrap_err().to_string();
        assert!(err.contains("/healthz not 200"), "{err}");
        assert!(err.contains("started"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(8));
        let deadline = Instant::now() + Duration::from_secs(5);
        while !node.pids().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            node.pids().is_empty(),
            "the failed agent was stopped: {:?}",
            node.pids()
        );
    }

    #[test]
    #[cfg_attr(
        not(feature = "root"),
        ignore = "needs root: the kpr-tests/root test gate (cargo xtask test opens it)"
    )]
    fn the_ebpf_backend_is_refused_without_a_test_cgroup() {
        let node = Netns::new("agent").unwrap();
        let (bin, _rm) = script("exit 0");
        let opts = AgentOptions::backend("ebpf").binary(&bin);
        let err = Agent::start(&node, &opts, &[]).unwrap_err().to_string();
        assert!(err.contains("needs a test cgroup"), "{err}");
    }

    #[test]
    #[cfg_attr(
        not(feature = "root"),
        ignore = "needs root: the kpr-tests/root test gate (cargo xtask test opens it)"
    )]
    fn manifests_are_written_before_the_agent_starts_and_flags_follow_the_contract() {
        let node = Netns::new("agent").unwrap();
        // Records its arguments and the manifest directory listing, then exits.
        let (bin, _rm) = script("echo \"$@\"; ls \"${5#file:}\"; exit 1");
        let opts = AgentOptions::backend("nftables")
            .balance("least-conn")
            .arg("--masquerade-all");
        let opts = opts.binary(&bin);
        let err = Agent::start(&node, &opts, &[("web.yaml", "kind: Service\n".into())])
            .unwrap_err()
            .to_string();
        for want in [
            "run --backend nftables --source file:",
            "--balance least-conn",
            "--hostname-override node",
            "--cluster-cidr 10.244.0.0/16",
            "--service-cluster-ip-range 10.96.0.0/16",
            "--nodeport-addresses 192.0.2.1/32",
            "--healthz-bind-address 0.0.0.0:10256",
            "--masquerade-all",
            "web.yaml",
        ] {
            assert!(err.contains(want), "{want:?} missing from: {err}");
        }
    }
}
