//! One kpr backend under the benchmark: a worker thread inside the node namespace owns the
//! `Dataplane` (built with `proxy::dataplane::build`) and runs the syncs the benchmark times; the
//! client measurements run from the pod-client namespace; then the real `proxy` agent is started
//! with the same Services from files, for its first-sync time and peak RSS.

use std::net::SocketAddr;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _};
use kpr_tests::{Agent, AgentOptions, Cgroup, Netns};
use proxy::dataplane::{BackendConfig, Dataplane};
use proxy::model::{Algorithm, IpFamily, ServicePortName};
use proxy::state::{ChangeSet, PortState, ProxyState, SyncStats};
use serde::Serialize;

use super::traffic::{self, InCgroup, Latency};
use super::workload::{backend_config, service_cidrs_of, Workload, SERVICE_PORT};
use super::{kernel_memory_kib, Plan};

type Job = Box<dyn FnOnce(&mut dyn Dataplane, &mut ProxyState) + Send>;

/// The thread in the node namespace that owns one dataplane and the state it was last synced
/// with; dropping it cleans the dataplane up.
///
/// The worker keeps its own `ProxyState` and changes it in place, as the agent's change tracker
/// does, so a timed incremental sync sees a state that was not rebuilt for it. Cloning the whole
/// state per change and dropping the previous clone on this thread between timed syncs put
/// glibc's frees into the measurement (nftables one change at 20,000: 4.94 / 21.97 ms p50 / p99
/// that way, 2.87 / 18.22 ms this way; docs/BENCHMARKS.md).
pub struct Worker {
    tx: Option<mpsc::Sender<Job>>,
    handle: Option<JoinHandle<()>>,
}

impl Worker {
    /// Builds `backend` on a new thread inside `ns`.
    pub fn start(ns: &Netns, backend: &str, cfg: BackendConfig) -> anyhow::Result<Worker> {
        let (tx, rx) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = mpsc::channel();
        let name = backend.to_string();
        let handle = ns.spawn(move || {
            // The userspace backend runs its proxies on the tokio runtime it is built in; the
            // runtime's threads inherit this thread's namespace.
            let rt = match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready_tx.send(Err(format!("starting a tokio runtime: {e}")));
                    return;
                }
            };
            let _entered = rt.enter();
            serve(&name, &cfg, &rx, &ready_tx);
        })?;
        let worker = Worker {
            tx: Some(tx),
            handle: Some(handle),
        };
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(worker),
            Ok(Err(e)) => Err(anyhow!("building backend {backend}: {e}")),
            Err(_) => Err(anyhow!(
                "building backend {backend}: the worker thread died"
            )),
        }
    }

    /// Runs `f` on the worker thread with the dataplane and the worker's state, and returns its
    /// result.
    fn call<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut dyn Dataplane, &mut ProxyState) -> T + Send + 'static,
    ) -> anyhow::Result<T> {
        let (tx, rx) = mpsc::channel();
        let job: Job = Box::new(move |dp, state| {
            let _ = tx.send(f(dp, state));
        });
        self.tx
            .as_ref()
            .expect("set until drop")
            .send(job)
            .map_err(|_| anyhow!("the dataplane worker thread is gone"))?;
        rx.recv()
            .map_err(|_| anyhow!("the dataplane worker thread panicked"))
    }

    /// One timed sync of `changes`. Untimed first: a full sync replaces the worker's state with
    /// `state`; an incremental one copies only the service ports `changes` names (their
    /// Service, endpoints and selection, or their removal) into it.
    pub fn sync(
        &self,
        state: &ProxyState,
        changes: ChangeSet,
    ) -> anyhow::Result<(Duration, SyncStats)> {
        let update = if changes.full {
            StateUpdate::Replace(Box::new(state.clone()))
        } else {
            StateUpdate::Patch(
                changes
                    .changed
                    .iter()
                    .map(|spn| PortPatch::from_state(state, spn))
                    .collect(),
            )
        };
        self.call(move |dp, mine| {
            update.apply(mine);
            let start = Instant::now();
            let stats = dp.sync(mine, &changes);
            (start.elapsed(), stats)
        })
        .and_then(|(t, stats)| Ok((t, stats.map_err(|e| anyhow!("sync: {e}"))?)))
    }
}

/// How the worker's state becomes the caller's before a sync.
enum StateUpdate {
    Replace(Box<ProxyState>),
    Patch(Vec<PortPatch>),
}

impl StateUpdate {
    fn apply(self, state: &mut ProxyState) {
        match self {
            StateUpdate::Replace(new) => *state = *new,
            StateUpdate::Patch(ports) => ports.into_iter().for_each(|p| p.apply(state)),
        }
    }
}

/// One service port as the caller's state has it (`None`: absent there).
struct PortPatch {
    spn: ServicePortName,
    port: Option<PortState>,
}

impl PortPatch {
    fn from_state(state: &ProxyState, spn: &ServicePortName) -> PortPatch {
        PortPatch {
            spn: spn.clone(),
            port: state.get(spn).cloned(),
        }
    }

    fn apply(self, state: &mut ProxyState) {
        match self.port {
            Some(port) => {
                state.insert(port);
            }
            None => {
                state.remove(&self.spn);
            }
        }
    }
}

/// The worker thread's body: build, then run jobs until the channel closes, then clean up.
fn serve(
    name: &str,
    cfg: &BackendConfig,
    rx: &mpsc::Receiver<Job>,
    ready: &mpsc::Sender<Result<(), String>>,
) {
    match name
        .parse()
        .and_then(|backend| proxy::dataplane::build(backend, cfg))
    {
        Ok(mut dp) => {
            let _ = ready.send(Ok(()));
            let mut state = ProxyState::default();
            for job in rx {
                job(dp.as_mut(), &mut state);
            }
            if let Err(e) = dp.cleanup() {
                eprintln!("warning: cleanup of backend {name}: {e}");
            }
        }
        Err(e) => {
            let _ = ready.send(Err(e.to_string()));
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Everything measured for one kpr backend.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BackendResult {
    pub first_sync_ms: f64,
    pub sync_operations: usize,
    pub change_p50_ms: f64,
    pub change_p99_ms: f64,
    pub changes: usize,
    pub kernel_mem_kib: Option<i64>,
    pub latency_10: Option<Latency>,
    pub latency_n: Option<Latency>,
    pub rps_ratio: Option<f64>,
    pub rps: Option<f64>,
    /// Straight to a pod from the same namespace and process (cgroup included), interleaved
    /// with the Service samples of `latency_n`.
    pub direct: Option<Latency>,
    /// Median over blocks of the Service/direct p50 ratio.
    pub direct_latency_ratio: Option<f64>,
    /// Median over blocks of the Service/loopback p50 ratio at 10 Services and at N (see
    /// `LOOPBACK_SERVER`): `@N / @10` is their quotient.
    pub loopback_ratio_10: Option<f64>,
    pub loopback_ratio_n: Option<f64>,
    pub rr_deviation_pct: Option<f64>,
    pub lc_spread: Option<String>,
    pub agent_first_sync_s: Option<f64>,
    pub agent_vmhwm_mib: Option<f64>,
    pub notes: Vec<String>,
    /// Failures after the dataplane was measured (the agent run).
    pub errors: Vec<String>,
}

/// The agent's `--backend` and `--iptables-mode` for a benchmark backend name
/// (`iptables-legacy` and `iptables-nft` are the iptables backend in one mode).
pub fn backend_and_mode(name: &str) -> (&str, Option<&'static str>) {
    match name {
        "iptables-legacy" => ("iptables", Some("legacy")),
        "iptables-nft" => ("iptables", Some("nft")),
        other => (other, None),
    }
}

/// The namespaces, cgroup and bpffs directory one backend runs in.
pub struct Env {
    pub cluster: super::Site,
    pub cgroup: Option<Cgroup>,
    pub bpffs: std::path::PathBuf,
    /// `--iptables-mode`, for the iptables backend.
    pub iptables_mode: Option<&'static str>,
    /// The workload's family (IPv6: a dual-stack site, IPv6-only Services).
    pub family: IpFamily,
}

impl Env {
    pub fn new(plan: &Plan, backend: &str, family: IpFamily) -> anyhow::Result<Env> {
        let cluster = super::site_of(plan.endpoints, family == IpFamily::V6)?;
        let cgroup = (backend == "ebpf")
            .then(|| Cgroup::new("bench"))
            .transpose()?;
        let bpffs =
            std::path::PathBuf::from("/sys/fs/bpf").join(format!("{}-bench", cluster.prefix()));
        Ok(Env {
            cluster,
            cgroup,
            bpffs,
            iptables_mode: backend_and_mode(backend).1,
            family,
        })
    }

    fn config(&self, services: usize) -> BackendConfig {
        let mut cfg = backend_config(services, self.family, self.cgroup.as_ref(), &self.bpffs);
        cfg.iptables_mode = self.iptables_mode.map(str::to_string);
        cfg
    }

    fn workload(&self, plan: &Plan, services: usize) -> Workload {
        Workload {
            services,
            endpoints: plan.endpoints,
            pods: self.cluster.pod_ips(),
            pods6: self.cluster.pod_ip6s(),
            family: self.family,
        }
    }

    /// Pod 0's server in the workload's family (the "direct to the pod" reference).
    fn direct(&self) -> SocketAddr {
        let pod = &self.cluster.pods[0];
        match (self.family, pod.ip6) {
            (IpFamily::V6, Some(ip6)) => SocketAddr::from((ip6, pod.echo_addr().port())),
            _ => pod.echo_addr(),
        }
    }

    /// Runs `f` with this process in the eBPF test cgroup when there is one.
    fn as_client<T>(&self, f: impl FnOnce(&Netns) -> anyhow::Result<T>) -> anyhow::Result<T> {
        let _in = self.cgroup.as_ref().map(InCgroup::enter).transpose()?;
        f(&self.cluster.podclient)
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.bpffs);
    }
}

fn last_addr(w: &Workload) -> SocketAddr {
    SocketAddr::new(w.service_ip(w.services - 1), SERVICE_PORT)
}

/// Measures one backend with a workload of `family`; an error means the backend failed (not
/// available, or broken).
pub fn run(plan: &Plan, name: &str, family: IpFamily) -> anyhow::Result<BackendResult> {
    let env = Env::new(plan, name, family)?;
    let backend = backend_and_mode(name).0;
    let mut result = BackendResult::default();
    small(plan, &env, backend, &mut result).context("at 10 Services")?;
    large(plan, &env, backend, &mut result)
        .with_context(|| format!("at {} Services", plan.services))?;
    // The dataplane numbers stand even when the agent does not converge; the run still fails.
    if let Err(e) = agent(plan, &env, backend, &mut result) {
        result.errors.push(format!(
            "proxy agent with {} Services: {e:#}",
            plan.services
        ));
    }
    Ok(result)
}

fn small(plan: &Plan, env: &Env, backend: &str, r: &mut BackendResult) -> anyhow::Result<()> {
    let w = env.workload(plan, 10);
    let worker = Worker::start(&env.cluster.node, backend, env.config(10))?;
    worker.sync(&w.state(), full())?;
    let lo = env.cluster.loopback_addr();
    let p = env.as_client(|ns| {
        traffic::paired(ns, last_addr(&w), lo, plan.latency_samples, Duration::ZERO)
    })?;
    (r.latency_10, r.loopback_ratio_10) = (Some(p.service), Some(p.latency_ratio));
    r.notes.push(format!(
        "at 10 Services: loopback reference p50 {:.0} µs, Service/loopback {:.2}",
        p.direct.p50_us, p.latency_ratio
    ));
    Ok(())
}

fn full() -> ChangeSet {
    ChangeSet {
        full: true,
        ..ChangeSet::default()
    }
}

fn large(plan: &Plan, env: &Env, backend: &str, r: &mut BackendResult) -> anyhow::Result<()> {
    let w = env.workload(plan, plan.services);
    let mut state = w.state();
    let worker = Worker::start(&env.cluster.node, backend, env.config(plan.services))?;
    let before = kernel_memory_kib();
    let (t, stats) = worker.sync(&state, full()).context("first full sync")?;
    r.first_sync_ms = t.as_secs_f64() * 1e3;
    r.sync_operations = stats.operations;
    r.kernel_mem_kib = before.zip(kernel_memory_kib()).map(|(a, b)| b - a);
    println!(
        "  {backend}: first full sync of {} Services: {:.1} ms",
        plan.services, r.first_sync_ms
    );
    let mut times = Vec::with_capacity(plan.changes);
    let started = Instant::now();
    for k in 0..plan.changes {
        if k >= 3 && started.elapsed() > plan.change_budget {
            r.notes.push(format!(
                "changes stopped after {k} of {} (time budget {:?})",
                plan.changes, plan.change_budget
            ));
            break;
        }
        // Spread over the Services, deterministically from the seed.
        let i = (plan.seed as usize).wrapping_add(k * 7_919) % plan.services;
        for ready in [false, true] {
            let changes = w.flip_endpoint(&mut state, i, ready);
            let (t, _) = worker
                .sync(&state, changes)
                .with_context(|| format!("change {k}"))?;
            times.push(t);
        }
    }
    let lat = traffic::summarize(times);
    println!(
        "  {backend}: one change: p50 {:.2} ms, p99 {:.2} ms over {} syncs",
        lat.p50_us / 1e3,
        lat.p99_us / 1e3,
        lat.samples
    );
    (r.change_p50_ms, r.change_p99_ms, r.changes) =
        (lat.p50_us / 1e3, lat.p99_us / 1e3, lat.samples);
    let target = last_addr(&w);
    let direct = env.direct();
    env.as_client(|ns| {
        let p = traffic::paired(ns, target, direct, plan.latency_samples, plan.rate_time)?;
        (r.latency_n, r.direct) = (Some(p.service), Some(p.direct));
        r.direct_latency_ratio = Some(p.latency_ratio);
        let lo = env.cluster.loopback_addr();
        let l = traffic::paired(ns, target, lo, plan.latency_samples, Duration::ZERO)?;
        r.loopback_ratio_n = Some(l.latency_ratio);
        r.notes.push(format!(
            "at {} Services: loopback reference p50 {:.0} µs, Service/loopback {:.2}",
            plan.services, l.direct.p50_us, l.latency_ratio
        ));
        r.rps = Some(p.service_rps);
        r.rps_ratio = Some(p.service_rps / p.direct_rps);
        let counts = traffic::distribution(ns, target, plan.rr_connections)?;
        r.rr_deviation_pct = Some(traffic::max_deviation_pct(&counts, plan.endpoints));
        Ok(())
    })?;
    r.lc_spread = Some(least_conn(plan, env, &worker, &w, &mut state));
    Ok(())
}

/// Held long connections per pod under least-connection (and under round-robin, for contrast);
/// a backend that refuses least-connection is reported, not failed.
fn least_conn(
    plan: &Plan,
    env: &Env,
    worker: &Worker,
    w: &Workload,
    state: &mut ProxyState,
) -> String {
    let last = plan.services - 1;
    let target = last_addr(w);
    let mix = |env: &Env| {
        env.as_client(|ns| traffic::held_spread(ns, target, plan.long_conns, plan.short_per_long))
            .map(|per_pod| traffic::spread(&per_pod, plan.endpoints))
    };
    let rr = mix(env);
    let changes = w.set_algorithm(state, last, Algorithm::LeastConn);
    if let Err(e) = worker.sync(state, changes) {
        return format!("least-conn refused: {e:#}");
    }
    let lc = mix(env);
    match (lc, rr) {
        (Ok(lc), Ok(rr)) => format!("{lc} (rr {rr})"),
        (Err(e), _) | (_, Err(e)) => format!("error: {e:#}"),
    }
}

fn agent(plan: &Plan, env: &Env, backend: &str, r: &mut BackendResult) -> anyhow::Result<()> {
    let w = env.workload(plan, plan.services);
    let files = w.manifests();
    let files: Vec<(&str, String)> = files.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    let mut opts = AgentOptions::backend(backend);
    opts.ready_timeout = plan.agent_timeout;
    if let Some(mode) = env.iptables_mode {
        opts.extra_args
            .extend(["--iptables-mode".to_string(), mode.to_string()]);
    }
    if env.family == IpFamily::V6 {
        opts = opts.dual_stack();
    }
    for cidr in service_cidrs_of(plan.services, env.family)
        .into_iter()
        .skip(1)
    {
        opts.extra_args
            .extend(["--service-cluster-ip-range".to_string(), cidr]);
    }
    if let Some(cg) = &env.cgroup {
        opts = opts.cgroup(cg);
    }
    let start = Instant::now();
    let agent = Agent::start(&env.cluster.node, &opts, &files)?;
    // The agent's own log line, read from its file, rather than `/state` (16 MB of JSON at
    // 20,000 Services) polled twenty times a second beside the agent; `/state` is read once.
    agent.wait_for_log("initial listing programmed", plan.agent_timeout)?;
    r.agent_first_sync_s = Some(start.elapsed().as_secs_f64());
    let state = agent.state()?;
    if !state.synced || state.services.len() != plan.services {
        anyhow::bail!(
            "the agent logged its first sync but /state shows {} of {} Services (synced: {})",
            state.services.len(),
            plan.services,
            state.synced
        );
    }
    println!(
        "  {backend}: agent shows {} Services after {:.1} s",
        plan.services,
        start.elapsed().as_secs_f64()
    );
    r.agent_vmhwm_mib = agent_vmhwm_kib(&env.cluster.node).map(|k| k as f64 / 1024.0);
    Ok(())
}

/// VmHWM of the `proxy` process running in `ns`.
fn agent_vmhwm_kib(ns: &Netns) -> Option<u64> {
    crate::workload_controllers::vm_hwm_kib(pid_named(ns, "proxy")?).ok()
}

/// The process called `comm` (as /proc/PID/comm gives it) in `ns`.
pub fn pid_named(ns: &Netns, comm: &str) -> Option<u32> {
    ns.pids().into_iter().find_map(|pid| {
        let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
        (name.trim() == comm)
            .then(|| u32::try_from(pid).ok())
            .flatten()
    })
}
