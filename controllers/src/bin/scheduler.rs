//! `scheduler`: kpr's Pod scheduler, a drop-in for kube-scheduler (KubeSchedulerConfiguration v1
//! profiles, the default plugins and weights of v1.34, leader election, its metric names).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use controllers::runtime::informer::Informers;
use controllers::runtime::leader::{self, LeaderConfig};
use controllers::scheduler::config::{self, KubeSchedulerConfiguration};
use controllers::scheduler::registry::{BuildContext, Registry};
use controllers::scheduler::scheduler::{self, InformerObjects, Scheduler, Settings};

/// Schedules Pods whose schedulerName is one of the configured profiles onto nodes.
#[derive(Debug, Parser)]
#[command(name = "scheduler", version)]
struct Args {
    /// Kubeconfig file (default: in-cluster config or ~/.kube/config).
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1) file; without one, the
    /// default profile `default-scheduler`.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Schedule only while holding the leader Lease (default: the config's
    /// leaderElection.leaderElect, else off).
    #[arg(long)]
    leader_elect: Option<bool>,
    /// Namespace of the leader Lease (default: the config's, else kube-system).
    #[arg(long)]
    leader_elect_resource_namespace: Option<String>,
    /// Name of the leader Lease (default: the config's, else kpr-scheduler).
    #[arg(long)]
    leader_elect_resource_name: Option<String>,
    /// Identity in the Lease (default: hostname_pid).
    #[arg(long)]
    leader_elect_identity: Option<String>,
    /// Serve Prometheus metrics (`/metrics`, kube-scheduler's metric names) and `/healthz` on
    /// this address, e.g. 127.0.0.1:10259 (default: not served).
    #[arg(long)]
    metrics_bind_address: Option<std::net::SocketAddr>,
    /// How often the C allocator hands freed memory back to the kernel (`malloc_trim`, as Go's
    /// scavenger does under kube-scheduler); 0: never.
    #[arg(long, default_value = "1m", value_parser = humantime::parse_duration)]
    allocator_trim_interval: Duration,
    /// Log verbosity as kube-scheduler's -v: 0-3 info, 4-5 debug, 6 and more trace (RUST_LOG,
    /// when set, wins).
    #[arg(short = 'v', long = "v", default_value_t = 0)]
    verbosity: u8,
}

use controllers::runtime::process::{client, identity, run_until_signalled, serve_metrics};

fn duration(field: &str, v: Option<&str>, default: Duration) -> anyhow::Result<Duration> {
    match v {
        None => Ok(default),
        Some(s) => humantime::parse_duration(s).with_context(|| format!("{field}: {s:?}")),
    }
}

fn main() -> anyhow::Result<()> {
    controllers::runtime::process::main(run())
}

async fn run() -> anyhow::Result<()> {
    let args = Args::parse();
    let level = match args.verbosity {
        0..=3 => "info",
        4..=5 => "debug",
        _ => "trace",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| format!("warn,controllers={level},scheduler={level}").into()),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();
    tokio::spawn(controllers::runtime::allocator::trim_every(
        args.allocator_trim_interval,
    ));
    let file: KubeSchedulerConfiguration = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading --config {}", path.display()))?;
            config::parse(&text).map_err(|e| anyhow::anyhow!("--config {}: {e}", path.display()))?
        }
        None => KubeSchedulerConfiguration::default(),
    };
    let limit = file.client_limit().map_err(|e| match &args.config {
        Some(p) => anyhow::anyhow!("--config {}: {e}", p.display()),
        None => anyhow::anyhow!("default configuration: {e}"),
    })?;
    let client = client(args.kubeconfig.as_deref(), limit).await?;
    let informers = Informers::new(client.clone());
    let ctx = BuildContext {
        objects: Arc::new(InformerObjects::new(&informers)),
        client: Some(client.clone()),
        ..BuildContext::default()
    };
    let cfg = config::build(&file, &Registry::builtin(), &ctx).map_err(|e| match &args.config {
        Some(p) => anyhow::anyhow!("--config {}: {e}", p.display()),
        None => anyhow::anyhow!("default configuration: {e}"),
    })?;
    let le = cfg.leader_election.clone().unwrap_or_default();
    let leader = args
        .leader_elect
        .or(le.leader_elect)
        .unwrap_or(false)
        .then(|| -> anyhow::Result<LeaderConfig> {
            Ok(LeaderConfig {
                lease_duration: duration(
                    "leaderElection.leaseDuration",
                    le.lease_duration.as_deref(),
                    Duration::from_secs(15),
                )?,
                renew_deadline: duration(
                    "leaderElection.renewDeadline",
                    le.renew_deadline.as_deref(),
                    Duration::from_secs(10),
                )?,
                retry_period: duration(
                    "leaderElection.retryPeriod",
                    le.retry_period.as_deref(),
                    Duration::from_secs(2),
                )?,
                ..LeaderConfig::new(
                    args.leader_elect_resource_namespace
                        .as_deref()
                        .or(le.resource_namespace.as_deref())
                        .unwrap_or("kube-system"),
                    args.leader_elect_resource_name
                        .as_deref()
                        .or(le.resource_name.as_deref())
                        .unwrap_or("kpr-scheduler"),
                    &args.leader_elect_identity.clone().unwrap_or_else(identity),
                )
            })
        })
        .transpose()?;
    let settings = Settings {
        parallelism: cfg.parallelism,
        percentage_of_nodes_to_score: cfg.percentage_of_nodes_to_score,
        backoff: cfg.backoff,
        // Upstream v1.34 never expires assumed Pods (durationToExpireAssumedPod = 0).
        assumed_ttl: None,
    };
    let names: Vec<String> = cfg.profiles.iter().map(|p| p.name.clone()).collect();
    let sched = Scheduler::new(client.clone(), &informers, cfg.profiles, &settings)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    if let Some(addr) = args.metrics_bind_address {
        tokio::spawn(async move {
            if let Err(e) = serve_metrics(addr).await {
                tracing::error!("{e:#}");
                std::process::exit(1);
            }
        });
    }
    tracing::info!("scheduler starting: profiles {}", names.join(","));
    let work = async move {
        scheduler::run(informers, sched).await;
        Ok(())
    };
    let led = async {
        match leader.clone() {
            Some(l) => leader::run_as_leader(client.clone(), l, work).await,
            None => work.await,
        }
    };
    run_until_signalled(&client, leader.as_ref(), "scheduler", led).await
}
