//! `controller-manager`: runs the kpr control plane controllers against a Kubernetes API server.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use controllers::endpoint::lbipam::pool::Pool;
use controllers::manager::{self, ManagerConfig, Setting};
use controllers::runtime::leader::LeaderConfig;

/// Runs kpr's controllers (the list is in `--help` under `--controllers`) against a Kubernetes
/// API server.
#[derive(Debug, Parser)]
#[command(name = "controller-manager", version)]
struct Args {
    /// Kubeconfig file (default: in-cluster config or ~/.kube/config).
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Controllers to run (`*`, `name`, `-name`; see --help for the list).
    #[arg(long, default_value = "*", long_help = manager::descriptors::help())]
    controllers: String,
    /// LoadBalancer address pool: a CIDR (10.0.0.0/24) or a range (10.0.0.10-10.0.0.20).
    #[arg(long)]
    lb_pool: Option<Pool>,
    /// The `endpointslice.kubernetes.io/managed-by` value of the slices the endpointslice
    /// controller writes and owns (kpr's flag). Default: kube-controller-manager's, as it
    /// replaces that controller and takes over its slices; another value runs it beside
    /// kube-controller-manager's own, each with its slices.
    #[arg(long, default_value = controllers::endpoint::endpointslice::plan::MANAGED_BY)]
    endpointslice_managed_by: String,
    /// The cluster's root CA (PEM), published in every namespace as the kube-root-ca.crt
    /// ConfigMap by root-ca-cert-publisher (kube-controller-manager's flag; without it that
    /// controller does not run).
    #[arg(long)]
    root_ca_file: Option<PathBuf>,
    /// The PEM certificate of the CA csrsigning signs every kubernetes.io signer's approved
    /// requests with (kube-controller-manager's flag; without it or a per-signer pair, csrsigning
    /// does not run).
    #[arg(long)]
    cluster_signing_cert_file: Option<PathBuf>,
    /// Its PEM (PKCS#8) key.
    #[arg(long)]
    cluster_signing_key_file: Option<PathBuf>,
    /// The CA of kubernetes.io/kubelet-serving only (with its key file).
    #[arg(long)]
    cluster_signing_kubelet_serving_cert_file: Option<PathBuf>,
    #[arg(long)]
    cluster_signing_kubelet_serving_key_file: Option<PathBuf>,
    /// The CA of kubernetes.io/kube-apiserver-client-kubelet only (with its key file).
    #[arg(long)]
    cluster_signing_kubelet_client_cert_file: Option<PathBuf>,
    #[arg(long)]
    cluster_signing_kubelet_client_key_file: Option<PathBuf>,
    /// The CA of kubernetes.io/kube-apiserver-client only (with its key file).
    #[arg(long)]
    cluster_signing_kube_apiserver_client_cert_file: Option<PathBuf>,
    #[arg(long)]
    cluster_signing_kube_apiserver_client_key_file: Option<PathBuf>,
    /// The CA of kubernetes.io/legacy-unknown only (with its key file).
    #[arg(long)]
    cluster_signing_legacy_unknown_cert_file: Option<PathBuf>,
    #[arg(long)]
    cluster_signing_legacy_unknown_key_file: Option<PathBuf>,
    /// The longest life of a signed certificate (a request's spec.expirationSeconds may ask for
    /// less).
    #[arg(long, default_value = "8760h", value_parser = humantime::parse_duration)]
    cluster_signing_duration: Duration,
    /// The PEM private key (RSA, or ECDSA P-256 / P-384) serviceaccount-token signs legacy
    /// service-account tokens with (kube-controller-manager's flag; the pair of kube-apiserver's
    /// --service-account-key-file; without it serviceaccount-token does not run).
    #[arg(long)]
    service_account_private_key_file: Option<PathBuf>,
    /// Token Secrets and ServiceAccounts synced at once by serviceaccount-token
    /// (kube-controller-manager's `--concurrent-serviceaccount-token-syncs`).
    #[arg(long, default_value_t = 5)]
    concurrent_serviceaccount_token_syncs: usize,
    /// How long an auto-generated legacy token Secret must be unused before the
    /// legacy-serviceaccount-token-cleaner invalidates it, and then invalid before it deletes it
    /// (kube-controller-manager's flag, a Go-style duration such as 8760h0m0s).
    #[arg(long, default_value = "8760h", value_parser = humantime::parse_duration)]
    legacy_service_account_token_clean_up_period: Duration,
    /// Run controllers only while holding the leader Lease.
    #[arg(long)]
    leader_elect: bool,
    /// Namespace of the leader Lease.
    #[arg(long, default_value = "kube-system")]
    leader_elect_namespace: String,
    /// Name of the leader Lease.
    #[arg(long, default_value = "kpr-controller-manager")]
    leader_elect_name: String,
    /// Identity in the Lease (default: hostname_pid).
    #[arg(long)]
    leader_elect_identity: Option<String>,
    /// Lease validity without renewal.
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    leader_elect_lease_duration: Duration,
    /// How long a leader keeps working without a successful renewal.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    leader_elect_renew_deadline: Duration,
    /// How often candidates try to acquire or renew.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    leader_elect_retry_period: Duration,
    /// EndpointSlice and Endpoints reconciles running at once.
    #[arg(long, default_value_t = 16)]
    concurrency: u16,
    /// ReplicaSets synced at once.
    #[arg(long, default_value_t = 5)]
    concurrent_replicaset_syncs: usize,
    /// Deployments synced at once.
    #[arg(long, default_value_t = 5)]
    concurrent_deployment_syncs: usize,
    /// Garbage collector workers.
    #[arg(long, default_value_t = 20)]
    concurrent_gc_syncs: usize,
    /// Jobs synced at once (kube-controller-manager's `--concurrent-job-syncs`).
    #[arg(long, default_value_t = 5)]
    concurrent_job_syncs: usize,
    /// CronJobs synced at once (kube-controller-manager's `--concurrent-cron-job-syncs`).
    #[arg(long, default_value_t = 5)]
    concurrent_cron_job_syncs: usize,
    /// Finished Jobs checked for their TTL at once (`--concurrent-ttl-after-finished-syncs`).
    #[arg(long, default_value_t = 5)]
    concurrent_ttl_after_finished_syncs: usize,
    /// DaemonSets synced at once (kube-controller-manager's `--concurrent-daemonset-syncs`).
    #[arg(long, default_value_t = 2)]
    concurrent_daemonset_syncs: usize,
    /// StatefulSets synced at once (kube-controller-manager's `--concurrent-statefulset-syncs`).
    #[arg(long, default_value_t = 5)]
    concurrent_statefulset_syncs: usize,
    /// ReplicationControllers synced at once (kube-controller-manager's `--concurrent-rc-syncs`).
    #[arg(long, default_value_t = 5)]
    concurrent_rc_syncs: usize,
    /// Terminated Pods (Succeeded or Failed) kept before podgc deletes the oldest
    /// (kube-controller-manager's `--terminated-pod-gc-threshold`; 0: never).
    #[arg(long, default_value_t = 12500)]
    terminated_pod_gc_threshold: usize,
    /// Endpoints mirrored at once by endpointslice-mirroring
    /// (`--mirroring-concurrent-service-endpoint-syncs`).
    #[arg(long, default_value_t = 5)]
    mirroring_concurrent_service_endpoint_syncs: usize,
    /// Endpoints of one subset mirrored at most (`--mirroring-max-endpoints-per-subset`).
    #[arg(long, default_value_t = 1000)]
    mirroring_max_endpoints_per_subset: usize,
    /// How long a mirrored slice's change waits to be synced with the next ones
    /// (`--mirroring-endpointslice-updates-batch-period`).
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    mirroring_endpointslice_updates_batch_period: Duration,
    /// ValidatingAdmissionPolicies synced at once
    /// (`--concurrent-validating-admission-policy-status-syncs`).
    #[arg(long, default_value_t = 5)]
    concurrent_validating_admission_policy_status_syncs: usize,
    /// Namespaces synced at once (kube-controller-manager's `--concurrent-namespace-syncs`).
    #[arg(long, default_value_t = 10)]
    concurrent_namespace_syncs: usize,
    /// How often every terminating namespace is looked at again (kube-controller-manager's
    /// `--namespace-sync-period`).
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    namespace_sync_period: Duration,
    /// HorizontalPodAutoscalers synced at once (`--concurrent-horizontal-pod-autoscaler-syncs`).
    #[arg(long, default_value_t = 5)]
    concurrent_horizontal_pod_autoscaler_syncs: usize,
    /// How often each HorizontalPodAutoscaler is synced.
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    horizontal_pod_autoscaler_sync_period: std::time::Duration,
    /// How far from 1 the usage ratio must be for the autoscaler to scale.
    #[arg(long, default_value_t = 0.1)]
    horizontal_pod_autoscaler_tolerance: f64,
    /// The window over which the autoscaler takes the highest recommendation before a scale-down.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    horizontal_pod_autoscaler_downscale_stabilization: std::time::Duration,
    /// After a Pod starts, how long its CPU samples may be skipped as not yet representative.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    horizontal_pod_autoscaler_cpu_initialization_period: std::time::Duration,
    /// After a Pod starts, how long a readiness change counts as its initial readiness.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    horizontal_pod_autoscaler_initial_readiness_delay: std::time::Duration,
    /// ResourceQuotas synced at once, per queue (kube-controller-manager's
    /// `--concurrent-resource-quota-syncs`).
    #[arg(long, default_value_t = 5)]
    concurrent_resource_quota_syncs: usize,
    /// How often every ResourceQuota's usage is recomputed in full (kube-controller-manager's
    /// `--resource-quota-sync-period`, a Go-style duration such as 5m0s).
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    resource_quota_sync_period: Duration,
    /// How often the persistentvolume-binder syncs every claim and volume again
    /// (kube-controller-manager's `--pvclaimbinder-sync-period`).
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    pvclaimbinder_sync_period: Duration,
    /// How often the node lifecycle controller looks at every Node's health
    /// (kube-controller-manager's `--node-monitor-period`).
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    node_monitor_period: Duration,
    /// How long a Node that never reported may stay quiet before it is marked Unknown.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    node_startup_grace_period: Duration,
    /// How long a Node's kubelet may stay quiet (no Ready heartbeat, no Lease renewal) before its
    /// conditions become Unknown.
    #[arg(long, default_value = "50s", value_parser = humantime::parse_duration)]
    node_monitor_grace_period: Duration,
    /// Nodes a second tainted NoExecute (so their Pods evicted) per healthy zone.
    #[arg(long, default_value_t = 0.1)]
    node_eviction_rate: f32,
    /// The same in an unhealthy zone (0 in zones of at most --large-cluster-size-threshold Nodes).
    #[arg(long, default_value_t = 0.01)]
    secondary_node_eviction_rate: f32,
    /// Nodes from which a zone counts as large for --secondary-node-eviction-rate.
    #[arg(long, default_value_t = 50)]
    large_cluster_size_threshold: i32,
    /// The not-Ready fraction (of at least 3 Nodes) from which a zone is unhealthy.
    #[arg(long, default_value_t = 0.55)]
    unhealthy_zone_threshold: f32,
    /// Give Nodes pod CIDRs from --cluster-cidr (nodeipam runs only with it).
    #[arg(long, num_args = 0..=1, default_value_t = false, default_missing_value = "true", action = clap::ArgAction::Set)]
    allocate_node_cidrs: bool,
    /// The pod CIDRs: one, or one per family, comma-separated.
    #[arg(long, default_value = "")]
    cluster_cidr: String,
    /// The Service CIDRs (one, or one per family), never handed to Nodes.
    #[arg(long, default_value = "")]
    service_cluster_ip_range: String,
    /// Node CIDR prefix length (single-stack; default 24 for IPv4, 64 for IPv6; 0: unset).
    #[arg(long)]
    node_cidr_mask_size: Option<u8>,
    /// IPv4 node CIDR prefix length (default 24; 0: unset).
    #[arg(long)]
    node_cidr_mask_size_ipv4: Option<u8>,
    /// IPv6 node CIDR prefix length (default 64; 0: unset).
    #[arg(long)]
    node_cidr_mask_size_ipv6: Option<u8>,
    /// Serve Prometheus metrics (`/metrics`, kube-controller-manager's workqueue metric names)
    /// and `/healthz` on this address, e.g. 127.0.0.1:10267 (default: not served).
    #[arg(long)]
    metrics_bind_address: Option<std::net::SocketAddr>,
    /// How often the C allocator hands freed memory back to the kernel (`malloc_trim`, as Go's
    /// scavenger does under kube-controller-manager); 0: never.
    #[arg(long, default_value = "1m", value_parser = humantime::parse_duration)]
    allocator_trim_interval: Duration,
    /// Start watches with streaming lists (`sendInitialEvents`, kube-apiserver v1.32 and later
    /// by default); `--watch-list=false` lists then watches, for API servers without them.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    watch_list: bool,
    /// Fault injection, for the lagging-watch scenario (docs/RELIABILITY.md): every watch event
    /// is applied this long after it was read (e.g. 3s). Not for production.
    #[arg(long, hide = true, value_parser = humantime::parse_duration)]
    fault_watch_delay: Option<std::time::Duration>,
    /// Requests a second to the API server, on average, from every controller together
    /// (kube-controller-manager's flag; its default is 20). 0 or below: no client-side limit,
    /// the default here, leaving the API server's priority and fairness to protect it.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    kube_api_qps: f32,
    /// Requests allowed at once after a quiet spell, with --kube-api-qps.
    #[arg(long, default_value_t = 30)]
    kube_api_burst: u32,
}

use controllers::runtime::process::{client, identity, run_until_signalled, serve_metrics};

fn main() -> anyhow::Result<()> {
    controllers::runtime::process::main(run())
}

async fn run() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        // Colours only on a terminal: logs written to files stay plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();
    let args = Args::parse();
    tokio::spawn(controllers::runtime::allocator::trim_every(
        args.allocator_trim_interval,
    ));
    let signing = signing_config(&args)?;
    let set = |m: Option<u8>| m.filter(|m| *m != 0);
    let node_ipam = controllers::node::ipam::Config::from_flags(&controllers::node::ipam::Flags {
        allocate_node_cidrs: args.allocate_node_cidrs,
        cluster_cidr: args.cluster_cidr.clone(),
        service_cluster_ip_range: args.service_cluster_ip_range.clone(),
        node_cidr_mask_size: set(args.node_cidr_mask_size),
        node_cidr_mask_size_ipv4: set(args.node_cidr_mask_size_ipv4),
        node_cidr_mask_size_ipv6: set(args.node_cidr_mask_size_ipv6),
    })
    .map_err(|e| anyhow::anyhow!(e))
    .context("node IPAM flags")?;
    let given: Vec<Setting> = [
        (Setting::AllocateNodeCidrs, node_ipam.is_some()),
        (Setting::LbPool, args.lb_pool.is_some()),
        (Setting::RootCaFile, args.root_ca_file.is_some()),
        (Setting::ClusterSigning, signing.any()),
        (
            Setting::ServiceAccountPrivateKeyFile,
            args.service_account_private_key_file.is_some(),
        ),
    ]
    .into_iter()
    .filter_map(|(s, on)| on.then_some(s))
    .collect();
    let controllers =
        manager::parse_controllers_with(&args.controllers, &given).context("--controllers")?;
    let leader = args.leader_elect.then(|| LeaderConfig {
        lease_duration: args.leader_elect_lease_duration,
        renew_deadline: args.leader_elect_renew_deadline,
        retry_period: args.leader_elect_retry_period,
        ..LeaderConfig::new(
            &args.leader_elect_namespace,
            &args.leader_elect_name,
            &args.leader_elect_identity.clone().unwrap_or_else(identity),
        )
    });
    controllers::runtime::informer::set_watch_list(args.watch_list);
    if let Some(delay) = args.fault_watch_delay {
        tracing::warn!(?delay, "fault injection: every watch event is applied late");
        controllers::runtime::informer::set_watch_delay(delay);
    }
    let limit = controllers::runtime::ratelimit::ClientLimit {
        qps: args.kube_api_qps,
        burst: args.kube_api_burst,
    };
    let client = client(args.kubeconfig.as_deref(), limit).await?;
    controllers::endpoint::endpointslice::plan::set_managed_by(&args.endpointslice_managed_by)
        .map_err(|e| anyhow::anyhow!(e))?;
    let cfg = ManagerConfig {
        controllers,
        lb_pool: args.lb_pool,
        root_ca_file: args.root_ca_file,
        signing,
        service_account_private_key_file: args.service_account_private_key_file,
        leader: leader.clone(),
        concurrency: manager::Concurrency {
            endpoints: args.concurrency,
            replicaset: args.concurrent_replicaset_syncs,
            deployment: args.concurrent_deployment_syncs,
            gc: args.concurrent_gc_syncs,
            job: args.concurrent_job_syncs,
            cronjob: args.concurrent_cron_job_syncs,
            ttl_after_finished: args.concurrent_ttl_after_finished_syncs,
            daemonset: args.concurrent_daemonset_syncs,
            statefulset: args.concurrent_statefulset_syncs,
            replicationcontroller: args.concurrent_rc_syncs,
            terminated_pod_gc_threshold: args.terminated_pod_gc_threshold,
            namespace: args.concurrent_namespace_syncs,
            namespace_sync_period: args.namespace_sync_period,
            horizontal_pod_autoscaler: controllers::autoscaling::podautoscaler::Config {
                workers: args.concurrent_horizontal_pod_autoscaler_syncs,
                sync_period: args.horizontal_pod_autoscaler_sync_period,
                settings: controllers::autoscaling::podautoscaler::plan::Settings {
                    tolerance: args.horizontal_pod_autoscaler_tolerance,
                    downscale_stabilization: args.horizontal_pod_autoscaler_downscale_stabilization,
                    cpu_initialization_period: args
                        .horizontal_pod_autoscaler_cpu_initialization_period,
                    initial_readiness_delay: args.horizontal_pod_autoscaler_initial_readiness_delay,
                },
            },
            resourcequota: args.concurrent_resource_quota_syncs,
            resource_quota_sync_period: args.resource_quota_sync_period,
            pvclaimbinder_sync_period: args.pvclaimbinder_sync_period,
            mirroring: controllers::endpoint::endpointslicemirroring::Config {
                workers: args.mirroring_concurrent_service_endpoint_syncs,
                max_endpoints_per_subset: args.mirroring_max_endpoints_per_subset,
                batch_period: args.mirroring_endpointslice_updates_batch_period,
            },
            validating_admission_policy_status: args
                .concurrent_validating_admission_policy_status_syncs,
            node_lifecycle: controllers::node::lifecycle::Config {
                node_monitor_period: args.node_monitor_period,
                node_startup_grace_period: args.node_startup_grace_period,
                node_monitor_grace_period: args.node_monitor_grace_period,
                rates: controllers::node::lifecycle::plan::Rates {
                    eviction: args.node_eviction_rate,
                    secondary_eviction: args.secondary_node_eviction_rate,
                    large_cluster_threshold: args.large_cluster_size_threshold,
                    unhealthy_zone_threshold: args.unhealthy_zone_threshold,
                },
            },
            node_ipam,
            serviceaccount_token: args.concurrent_serviceaccount_token_syncs,
            legacy_service_account_token_clean_up_period: args
                .legacy_service_account_token_clean_up_period,
        },
    };
    if let Some(addr) = args.metrics_bind_address {
        let listener = serve_metrics(addr);
        tokio::spawn(async move {
            if let Err(e) = listener.await {
                tracing::error!("{e:#}");
                std::process::exit(1);
            }
        });
    }
    let names: Vec<&str> = cfg.controllers.iter().map(|d| d.name).collect();
    tracing::info!("controller-manager starting: {}", names.join(","));
    let work = manager::run(client.clone(), cfg);
    run_until_signalled(&client, leader.as_ref(), "controller-manager", work).await
}

/// The `--cluster-signing-*` flags: a certificate without its key (or the reverse) is an error
/// naming both flags.
fn signing_config(args: &Args) -> anyhow::Result<controllers::auth::csrsigning::SigningConfig> {
    use controllers::auth::csrsigning::{CaFiles, SigningConfig};
    use controllers::helpers::csr;
    fn pair(
        what: &str,
        cert: &Option<PathBuf>,
        key: &Option<PathBuf>,
    ) -> anyhow::Result<Option<CaFiles>> {
        match (cert, key) {
            (Some(cert), Some(key)) => Ok(Some(CaFiles {
                cert: cert.clone(),
                key: key.clone(),
            })),
            (None, None) => Ok(None),
            _ => anyhow::bail!(
                "--cluster-signing-{what}cert-file and --cluster-signing-{what}key-file go together"
            ),
        }
    }
    let mut config = SigningConfig {
        default: pair(
            "",
            &args.cluster_signing_cert_file,
            &args.cluster_signing_key_file,
        )?,
        duration: args.cluster_signing_duration,
        ..Default::default()
    };
    for (signer, what, cert, key) in [
        (
            csr::KUBELET_SERVING,
            "kubelet-serving-",
            &args.cluster_signing_kubelet_serving_cert_file,
            &args.cluster_signing_kubelet_serving_key_file,
        ),
        (
            csr::KUBE_APISERVER_CLIENT_KUBELET,
            "kubelet-client-",
            &args.cluster_signing_kubelet_client_cert_file,
            &args.cluster_signing_kubelet_client_key_file,
        ),
        (
            csr::KUBE_APISERVER_CLIENT,
            "kube-apiserver-client-",
            &args.cluster_signing_kube_apiserver_client_cert_file,
            &args.cluster_signing_kube_apiserver_client_key_file,
        ),
        (
            csr::LEGACY_UNKNOWN,
            "legacy-unknown-",
            &args.cluster_signing_legacy_unknown_cert_file,
            &args.cluster_signing_legacy_unknown_key_file,
        ),
    ] {
        if let Some(files) = pair(what, cert, key)? {
            config.per_signer.insert(signer, files);
        }
    }
    Ok(config)
}
