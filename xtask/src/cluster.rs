//! `cargo xtask cluster up|down|env|status`: a reference control plane on this machine (etcd and
//! kube-apiserver of the pinned release on loopback, with TLS and RBAC; optionally
//! kube-controller-manager or kpr's controller-manager, kube-scheduler, and kwok nodes), left
//! running in the background for kubectl, the agent and benchmarks.
//!
//! `up` records what it started in `<target>/cluster/state.json`; `down` stops every process whose
//! command line names the cluster's directory (so also those of an `up` interrupted half-way or
//! a state file lost), and Ctrl-C during `up` does the same. Owns `<target>/cluster`.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::{Args, Subcommand, ValueEnum};
use controlplane::{ControlPlane, Lifetime, Options};
use serde_json::json;

use crate::exec::Cmd;
use crate::{target_dir, workspace_root};

#[derive(Debug, Args)]
pub struct ClusterArgs {
    #[command(subcommand)]
    pub command: ClusterCommand,
}

#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Start the control plane in the background and print how to use it.
    Up(UpArgs),
    /// Stop every process of the cluster and remove its directory.
    Down,
    /// Print `export KUBECONFIG=...` (and PATH for the reference kubectl) to eval.
    Env,
    /// Which processes run; a dead one is shown with the last lines of its log.
    Status,
}

#[derive(Debug, Args)]
pub struct UpArgs {
    /// Who runs the controllers: kube-controller-manager, kpr's controller-manager, or nobody.
    #[arg(long, value_enum, default_value_t = Who::Upstream)]
    pub controllers: Who,
    /// Who schedules Pods: kube-scheduler, kpr's scheduler, or nobody.
    #[arg(long, value_enum, default_value_t = Who::Upstream)]
    pub scheduler: Who,
    /// How many kwok nodes (simulated: their Pods become Running and Ready without containers).
    #[arg(long, default_value_t = 0)]
    pub kwok_nodes: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Who {
    Upstream,
    Kpr,
    None,
}

pub fn run(args: &ClusterArgs) -> anyhow::Result<()> {
    match &args.command {
        ClusterCommand::Up(up_args) => up(up_args),
        ClusterCommand::Down => down(),
        ClusterCommand::Env => env(),
        ClusterCommand::Status => status(),
    }
}

fn cluster_dir() -> PathBuf {
    target_dir().join("cluster")
}

fn state_path() -> PathBuf {
    cluster_dir().join("state.json")
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

fn up(args: &UpArgs) -> anyhow::Result<()> {
    if state_path().exists() || !processes_of(&cluster_dir()).is_empty() {
        bail!(
            "a cluster already runs in {} (or its processes do): `cargo xtask cluster down` first",
            cluster_dir().display()
        );
    }
    if args.scheduler == Who::Kpr {
        bail!("--scheduler kpr: kpr's scheduler does not exist yet; use upstream or none");
    }
    crate::k8s::build()?;
    let controller_manager = if args.controllers == Who::Kpr {
        Cmd::new("cargo")
            .args(["build", "-p", "controllers", "--bin", "controller-manager"])
            .dir(workspace_root())
            .run()?;
        Some(target_dir().join("debug/controller-manager"))
    } else {
        None
    };
    // The processes are detached (sessions of their own), so Ctrl-C reaches only this process:
    // catch it and take down what was started so far.
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t);
    }
    let opts = Options {
        lifetime: Lifetime::Detached,
        upstream_controllers: (args.controllers == Who::Upstream).then(|| "*".to_string()),
        upstream_scheduler: args.scheduler == Who::Upstream,
        kwok_nodes: args.kwok_nodes,
        ..Options::minimal(cluster_dir())
    };
    let starting = std::thread::spawn(move || -> anyhow::Result<ControlPlane> {
        let mut cp = ControlPlane::start(opts)?;
        if let Some(binary) = controller_manager {
            let args = vec![
                format!("--kubeconfig={}", cp.admin_kubeconfig().display()),
                "--controllers=endpointslice,endpoints".to_string(),
            ];
            cp.spawn_program("kpr-controller-manager", &binary, args)?;
        }
        Ok(cp)
    });
    while !starting.is_finished() {
        if INTERRUPTED.load(Ordering::SeqCst) {
            eprintln!("interrupted: stopping what was started");
            stop_all(&cluster_dir());
            std::process::exit(130);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let cp = match starting.join() {
        Ok(Ok(cp)) => cp,
        Ok(Err(e)) => {
            stop_all(&cluster_dir());
            return Err(e.context("starting the cluster (everything started was stopped)"));
        }
        Err(_) => {
            stop_all(&cluster_dir());
            bail!("starting the cluster panicked (everything started was stopped)");
        }
    };
    let kubeconfig = cp.admin_kubeconfig().to_path_buf();
    let server = cp.server_url();
    let logs = cp.dir.join("logs");
    let processes: Vec<_> = cp
        .release()
        .into_iter()
        .map(|(name, pid)| json!({"name": name, "pid": pid, "log": logs.join(format!("{name}.log"))}))
        .collect();
    let state = json!({
        "server": server, "kubeconfig": kubeconfig,
        "kubernetes": controlplane::kubernetes_version(), "processes": processes,
    });
    fs::write(state_path(), serde_json::to_string_pretty(&state)?)?;
    println!(
        "cluster up: Kubernetes {} at {server}",
        controlplane::kubernetes_version()
    );
    for p in &processes {
        println!(
            "  {:<24} pid {:<8} log {}",
            p["name"].as_str().unwrap_or("?"),
            p["pid"],
            p["log"].as_str().unwrap_or("?")
        );
    }
    println!("use it with:  eval \"$(cargo xtask cluster env)\"; kubectl get nodes");
    println!("stop it with: cargo xtask cluster down");
    Ok(())
}

fn down() -> anyhow::Result<()> {
    let dir = cluster_dir();
    let stopped = stop_all(&dir);
    if dir.exists() {
        fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    println!("cluster down: {stopped} processes stopped");
    Ok(())
}

fn env() -> anyhow::Result<()> {
    let state = read_state()?;
    let kubeconfig = state["kubeconfig"].as_str().unwrap_or_default();
    println!("export KUBECONFIG={kubeconfig}");
    println!("export PATH={}:$PATH", crate::k8s::bin_dir().display());
    Ok(())
}

fn status() -> anyhow::Result<()> {
    let state = read_state()?;
    println!("server {}", state["server"].as_str().unwrap_or("?"));
    let mut dead = 0;
    for p in state["processes"].as_array().into_iter().flatten() {
        let name = p["name"].as_str().unwrap_or("?");
        let pid = p["pid"].as_u64().unwrap_or(0) as u32;
        if controlplane::process::alive(pid) {
            println!("[running] {name} (pid {pid})");
        } else {
            dead += 1;
            let log = PathBuf::from(p["log"].as_str().unwrap_or_default());
            println!(
                "[DEAD] {name} (pid {pid}); last lines of {}:\n{}",
                log.display(),
                controlplane::process::tail(&log, 20)
            );
        }
    }
    if dead > 0 {
        bail!("{dead} cluster processes are not running");
    }
    Ok(())
}

fn read_state() -> anyhow::Result<serde_json::Value> {
    let path = state_path();
    let text = fs::read_to_string(&path).with_context(|| {
        format!(
            "no cluster is up ({} is missing): `cargo xtask cluster up`",
            path.display()
        )
    })?;
    Ok(serde_json::from_str(&text)?)
}

/// Every process whose command line mentions `dir` (each component is given a file in it).
fn processes_of(dir: &Path) -> Vec<u32> {
    let needle = dir.to_string_lossy().into_owned();
    let me = std::process::id();
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(&needle))
                .unwrap_or(false)
        })
        .collect()
}

/// Stops every process of the cluster in `dir`; returns how many there were.
fn stop_all(dir: &Path) -> usize {
    let pids = processes_of(dir);
    std::thread::scope(|s| {
        for &pid in &pids {
            s.spawn(move || controlplane::process::terminate(pid, Duration::from_secs(10)));
        }
    });
    pids.len()
}
