//! The controller manager: runs the selected controllers, optionally only while holding the leader
//! Lease. Used by the `controller-manager` binary and by tests that run managers in-process.
//! Which controllers exist, their names and constructors are the rows of [`descriptors`]; every
//! selected controller is built on one set of shared informers (one watch and one cache per
//! resource kind for the whole process), which start once every constructor has registered its
//! handlers. A controller that fails stops the manager with an error naming it.

pub mod descriptors;
pub mod upstream;

use futures::future::select_all;
use kube::Client;

pub use descriptors::{ControllerDescriptor, Setting, CONTROLLERS};

use crate::endpoint::lbipam::pool::Pool;
use crate::error::{Error, Result};
use crate::runtime::informer::Informers;
use crate::runtime::leader::{self, LeaderConfig};
use crate::runtime::workers::AbortOnDrop;

/// Parses kube-controller-manager's `--controllers` syntax: `*` turns on every controller that
/// is on by default, `name` turns one on, `-name` turns one off (a `-name` wins over `name` and
/// `*`). `given`: the settings the command line gave; a controller that [needs](ControllerDescriptor::needs)
/// one (lb-ipam an address pool, root-ca-cert-publisher the CA file) is on by default only with
/// it. The result is in start order (the garbage collector first, as upstream).
pub fn parse_controllers_with(
    list: &str,
    given: &[Setting],
) -> Result<Vec<&'static ControllerDescriptor>> {
    let mut all = false;
    let mut on = Vec::new();
    let mut off = Vec::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if item == "*" {
            all = true;
        } else if let Some(name) = item.strip_prefix('-') {
            off.push(descriptors::lookup(name)?.name);
        } else {
            on.push(descriptors::lookup(item)?.name);
        }
    }
    let default_on =
        |d: &ControllerDescriptor| d.default_on && d.needs.is_none_or(|s| given.contains(&s));
    Ok(CONTROLLERS
        .iter()
        .filter(|d| !off.contains(&d.name) && (on.contains(&d.name) || (all && default_on(d))))
        .collect())
}

/// [`parse_controllers_with`] without any setting.
pub fn parse_controllers(list: &str) -> Result<Vec<&'static ControllerDescriptor>> {
    parse_controllers_with(list, &[])
}

/// Workers per controller (kube-controller-manager's `--concurrent-*-syncs`).
#[derive(Debug, Clone, Copy)]
pub struct Concurrency {
    /// EndpointSlice and Endpoints reconciles at once.
    pub endpoints: u16,
    /// `--concurrent-replicaset-syncs` (upstream default 5).
    pub replicaset: usize,
    /// `--concurrent-deployment-syncs` (upstream default 5).
    pub deployment: usize,
    /// `--concurrent-gc-syncs` (upstream default 20).
    pub gc: usize,
    /// `--concurrent-job-syncs` (upstream default 5).
    pub job: usize,
    /// `--concurrent-cron-job-syncs` (upstream default 5).
    pub cronjob: usize,
    /// `--concurrent-ttl-after-finished-syncs` (upstream default 5).
    pub ttl_after_finished: usize,
    /// `--concurrent-daemonset-syncs` (upstream default 2).
    pub daemonset: usize,
    /// `--concurrent-statefulset-syncs` (upstream default 5).
    pub statefulset: usize,
    /// `--concurrent-rc-syncs` (upstream default 5).
    pub replicationcontroller: usize,
    /// `--terminated-pod-gc-threshold` (upstream default 12500; 0 turns the terminated-Pod
    /// collection off). Not a worker count: podgc's one setting, carried with the others.
    pub terminated_pod_gc_threshold: usize,
    /// `--concurrent-namespace-syncs` (upstream default 10).
    pub namespace: usize,
    /// `--namespace-sync-period` (upstream default 5 min): how often every terminating
    /// namespace is looked at again.
    pub namespace_sync_period: std::time::Duration,
    /// The horizontal Pod autoscaler's workers and `--horizontal-pod-autoscaler-*` settings.
    pub horizontal_pod_autoscaler: crate::autoscaling::podautoscaler::Config,
    /// `--concurrent-resource-quota-syncs` (upstream default 5).
    pub resourcequota: usize,
    /// `--resource-quota-sync-period` (upstream default 5 m). Not a worker count: the
    /// resourcequota controller's full recalculation period, carried with the others.
    pub resource_quota_sync_period: std::time::Duration,
    /// `--pvclaimbinder-sync-period` (upstream default 15 s): how often the
    /// persistentvolume-binder syncs every claim and volume again.
    pub pvclaimbinder_sync_period: std::time::Duration,
    /// The endpointslice-mirroring controller's `--mirroring-*` settings.
    pub mirroring: crate::endpoint::endpointslicemirroring::Config,
    /// `--concurrent-validating-admission-policy-status-syncs` (upstream default 5).
    pub validating_admission_policy_status: usize,
    /// The node lifecycle controller's `--node-monitor-*`, `--node-startup-grace-period` and
    /// eviction rate settings. Not a worker count: carried with the others.
    pub node_lifecycle: crate::node::lifecycle::Config,
    /// The node IPAM controller's settings, `None` without `--allocate-node-cidrs` (then it does
    /// not run, as upstream's does nothing).
    pub node_ipam: Option<crate::node::ipam::Config>,
    /// `--concurrent-serviceaccount-token-syncs` (upstream default 5).
    pub serviceaccount_token: usize,
    /// `--legacy-service-account-token-clean-up-period` (upstream default 365 days). Not a
    /// worker count: the legacy token cleaner's one setting, carried with the others.
    pub legacy_service_account_token_clean_up_period: std::time::Duration,
}

impl Default for Concurrency {
    fn default() -> Self {
        Self {
            endpoints: 16,
            replicaset: 5,
            deployment: 5,
            gc: 20,
            job: 5,
            cronjob: 5,
            ttl_after_finished: 5,
            daemonset: 2,
            statefulset: 5,
            replicationcontroller: 5,
            terminated_pod_gc_threshold: 12500,
            namespace: 10,
            namespace_sync_period: std::time::Duration::from_secs(300),
            horizontal_pod_autoscaler: Default::default(),
            resourcequota: 5,
            resource_quota_sync_period: std::time::Duration::from_secs(300),
            pvclaimbinder_sync_period: std::time::Duration::from_secs(15),
            mirroring: Default::default(),
            validating_admission_policy_status: 5,
            node_lifecycle: Default::default(),
            node_ipam: None,
            serviceaccount_token: 5,
            legacy_service_account_token_clean_up_period:
                crate::auth::legacytokencleaner::DEFAULT_CLEAN_UP_PERIOD,
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct ManagerConfig {
    /// Controllers to run, in start order ([`parse_controllers`]).
    pub controllers: Vec<&'static ControllerDescriptor>,
    /// Pool for lb-ipam (required when it runs).
    pub lb_pool: Option<Pool>,
    /// The cluster CA for root-ca-cert-publisher (required when it runs).
    pub root_ca_file: Option<std::path::PathBuf>,
    /// The CAs csrsigning signs with (`--cluster-signing-*`).
    pub signing: crate::auth::csrsigning::SigningConfig,
    /// The key serviceaccount-token signs tokens with (required when it runs).
    pub service_account_private_key_file: Option<std::path::PathBuf>,
    /// Run only while holding this Lease.
    pub leader: Option<LeaderConfig>,
    /// Workers per controller.
    pub concurrency: Concurrency,
}

/// Runs the controllers; with leader election, only while leading. Returns `Err(Leadership)` when
/// the Lease is lost (the caller should exit, as kube-controller-manager does), and the first
/// controller's error when one fails (a constructor's error before anything starts).
pub async fn run(client: Client, cfg: ManagerConfig) -> Result<()> {
    check_settings(&cfg)?;
    let work = run_controllers(client.clone(), cfg.clone());
    match cfg.leader {
        Some(l) => leader::run_as_leader(client, l, work).await,
        None => work.await,
    }
}

/// Every selected controller has what it [`needs`](ControllerDescriptor::needs): checked before
/// leader election, so a wrong command line fails at once.
fn check_settings(cfg: &ManagerConfig) -> Result<()> {
    for d in &cfg.controllers {
        if let Some(setting) = d.needs.filter(|s| !s.given(cfg)) {
            return Err(setting.missing(d.name));
        }
    }
    Ok(())
}

async fn run_controllers(client: Client, cfg: ManagerConfig) -> Result<()> {
    // Held until the controllers stop: dropping the informers stops their watches.
    let informers = Informers::new(client.clone());
    let cx = descriptors::ControllerContext {
        client,
        informers: &informers,
        concurrency: cfg.concurrency,
        lb_pool: cfg.lb_pool.clone(),
        root_ca_file: cfg.root_ca_file.clone(),
        signing: cfg.signing.clone(),
        service_account_private_key_file: cfg.service_account_private_key_file.clone(),
    };
    let mut built = Vec::new();
    for d in &cfg.controllers {
        let task = (d.new)(&cx).map_err(|e| Error::Controller {
            name: d.name,
            source: Box::new(e),
        })?;
        built.push((d.name, task));
    }
    if built.is_empty() {
        return Ok(());
    }
    informers.start();
    let mut names = Vec::new();
    let mut tasks = Vec::new();
    for (name, task) in built {
        tracing::info!("starting controller {name}");
        names.push(name);
        tasks.push(tokio::spawn(task));
    }
    // Aborting this future (lost leadership) must stop every controller: abort on drop.
    let _guard = AbortOnDrop(tasks.iter().map(|t| t.abort_handle()).collect());
    // Controllers run until the process ends; the first one to stop ends the manager.
    let (ended, i, _rest) = select_all(tasks).await;
    let name = names[i];
    let err = match ended {
        Ok(Ok(())) => Error::Controller {
            name,
            source: Box::new(Error::Invalid {
                object: format!("controller {name}"),
                reason: "stopped unexpectedly".into(),
            }),
        },
        Ok(Err(e)) => Error::Controller {
            name,
            source: Box::new(e),
        },
        Err(panic) => Error::Controller {
            name,
            source: Box::new(Error::Invalid {
                object: format!("controller {name}"),
                reason: format!("task failed: {panic}"),
            }),
        },
    };
    tracing::error!("{err}");
    Err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controllers_flag_takes_kube_controller_manager_syntax() {
        let cases: &[(&str, &[Setting], &[&str])] = &[
            (
                "*",
                &[],
                &[
                    "garbagecollector",
                    "endpointslice",
                    "endpoints",
                    "replicaset",
                    "replicationcontroller",
                    "podgc",
                    "deployment",
                    "daemonset",
                    "statefulset",
                    "job",
                    "cronjob",
                    "ttl-after-finished",
                    "serviceaccount",
                    "taint-eviction-controller",
                    "namespace",
                    "horizontalpodautoscaling",
                    "disruption",
                    "resourcequota",
                    "persistentvolume-binder",
                    "persistentvolume-protection",
                    "persistentvolumeclaim-protection",
                    "ephemeral-volume",
                    "persistentvolume-expander",
                    "persistentvolume-attach-detach",
                    "resourceclaim",
                    "volumeattributesclass-protection",
                    "clusterrole-aggregation",
                    "ttl",
                    "nodelifecycle",
                    "csrapproving",
                    "csrcleaner",
                    "endpointslicemirroring",
                    "service-cidr",
                    "validatingadmissionpolicy-status",
                    "legacy-serviceaccount-token-cleaner",
                ],
            ),
            (
                "*",
                &[Setting::LbPool],
                &[
                    "garbagecollector",
                    "endpointslice",
                    "endpoints",
                    "replicaset",
                    "replicationcontroller",
                    "podgc",
                    "deployment",
                    "daemonset",
                    "statefulset",
                    "job",
                    "cronjob",
                    "ttl-after-finished",
                    "serviceaccount",
                    "taint-eviction-controller",
                    "namespace",
                    "horizontalpodautoscaling",
                    "disruption",
                    "resourcequota",
                    "persistentvolume-binder",
                    "persistentvolume-protection",
                    "persistentvolumeclaim-protection",
                    "ephemeral-volume",
                    "persistentvolume-expander",
                    "persistentvolume-attach-detach",
                    "resourceclaim",
                    "volumeattributesclass-protection",
                    "clusterrole-aggregation",
                    "ttl",
                    "nodelifecycle",
                    "csrapproving",
                    "csrcleaner",
                    "endpointslicemirroring",
                    "service-cidr",
                    "validatingadmissionpolicy-status",
                    "legacy-serviceaccount-token-cleaner",
                    "lb-ipam",
                ],
            ),
            (
                "*,-endpoints,-endpointslice",
                &[],
                &[
                    "garbagecollector",
                    "replicaset",
                    "replicationcontroller",
                    "podgc",
                    "deployment",
                    "daemonset",
                    "statefulset",
                    "job",
                    "cronjob",
                    "ttl-after-finished",
                    "serviceaccount",
                    "taint-eviction-controller",
                    "namespace",
                    "horizontalpodautoscaling",
                    "disruption",
                    "resourcequota",
                    "persistentvolume-binder",
                    "persistentvolume-protection",
                    "persistentvolumeclaim-protection",
                    "ephemeral-volume",
                    "persistentvolume-expander",
                    "persistentvolume-attach-detach",
                    "resourceclaim",
                    "volumeattributesclass-protection",
                    "clusterrole-aggregation",
                    "ttl",
                    "nodelifecycle",
                    "csrapproving",
                    "csrcleaner",
                    "endpointslicemirroring",
                    "service-cidr",
                    "validatingadmissionpolicy-status",
                    "legacy-serviceaccount-token-cleaner",
                ],
            ),
            (
                "replicaset,deployment,garbagecollector",
                &[],
                &["garbagecollector", "replicaset", "deployment"],
            ),
            (
                "job-controller,cronjob,ttl-after-finished-controller",
                &[],
                &["job", "cronjob", "ttl-after-finished"],
            ),
            (
                "replicaset-controller,endpoint",
                &[],
                &["endpoints", "replicaset"],
            ),
            (
                "statefulset-controller,daemonset",
                &[],
                &["daemonset", "statefulset"],
            ),
            (
                "pod-garbage-collector-controller,replicationcontroller-controller",
                &[],
                &["replicationcontroller", "podgc"],
            ),
            ("deployment,-deployment", &[], &[]),
            (
                "endpointslice,endpoints,lb-ipam",
                &[],
                &["endpointslice", "endpoints", "lb-ipam"],
            ),
            (
                "*,-lb-ipam",
                &[Setting::LbPool, Setting::RootCaFile],
                &[
                    "garbagecollector",
                    "endpointslice",
                    "endpoints",
                    "replicaset",
                    "replicationcontroller",
                    "podgc",
                    "deployment",
                    "daemonset",
                    "statefulset",
                    "job",
                    "cronjob",
                    "ttl-after-finished",
                    "serviceaccount",
                    "root-ca-cert-publisher",
                    "taint-eviction-controller",
                    "namespace",
                    "horizontalpodautoscaling",
                    "disruption",
                    "resourcequota",
                    "persistentvolume-binder",
                    "persistentvolume-protection",
                    "persistentvolumeclaim-protection",
                    "ephemeral-volume",
                    "persistentvolume-expander",
                    "persistentvolume-attach-detach",
                    "resourceclaim",
                    "volumeattributesclass-protection",
                    "clusterrole-aggregation",
                    "ttl",
                    "nodelifecycle",
                    "csrapproving",
                    "csrcleaner",
                    "endpointslicemirroring",
                    "service-cidr",
                    "validatingadmissionpolicy-status",
                    "legacy-serviceaccount-token-cleaner",
                ],
            ),
            (
                "serviceaccount-controller,root-ca-certificate-publisher-controller,taint-eviction-controller",
                &[],
                &[
                    "serviceaccount",
                    "root-ca-cert-publisher",
                    "taint-eviction-controller",
                ],
            ),
            (
                "horizontal-pod-autoscaler-controller,namespace-controller",
                &[],
                &["namespace", "horizontalpodautoscaling"],
            ),
            (
                "resourcequota-controller",
                &[],
                &["resourcequota"],
            ),
            (
                "persistentvolume-binder-controller,persistentvolume-protection-controller,persistentvolumeclaim-protection-controller,ephemeral-volume-controller",
                &[],
                &[
                    "persistentvolume-binder",
                    "persistentvolume-protection",
                    "persistentvolumeclaim-protection",
                    "ephemeral-volume",
                ],
            ),
            (
                "*,-lb-ipam",
                &[Setting::ClusterSigning],
                &[
                    "garbagecollector",
                    "endpointslice",
                    "endpoints",
                    "replicaset",
                    "replicationcontroller",
                    "podgc",
                    "deployment",
                    "daemonset",
                    "statefulset",
                    "job",
                    "cronjob",
                    "ttl-after-finished",
                    "serviceaccount",
                    "taint-eviction-controller",
                    "namespace",
                    "horizontalpodautoscaling",
                    "disruption",
                    "resourcequota",
                    "persistentvolume-binder",
                    "persistentvolume-protection",
                    "persistentvolumeclaim-protection",
                    "ephemeral-volume",
                    "persistentvolume-expander",
                    "persistentvolume-attach-detach",
                    "resourceclaim",
                    "volumeattributesclass-protection",
                    "clusterrole-aggregation",
                    "ttl",
                    "nodelifecycle",
                    "csrapproving",
                    "csrsigning",
                    "csrcleaner",
                    "endpointslicemirroring",
                    "service-cidr",
                    "validatingadmissionpolicy-status",
                    "legacy-serviceaccount-token-cleaner",
                ],
            ),
            (
                "node-lifecycle-controller,node-ipam-controller",
                &[Setting::AllocateNodeCidrs],
                &["nodelifecycle", "nodeipam"],
            ),
            (
                "*,-lb-ipam,-csrsigning",
                &[Setting::AllocateNodeCidrs],
                &[
                    "garbagecollector",
                    "endpointslice",
                    "endpoints",
                    "replicaset",
                    "replicationcontroller",
                    "podgc",
                    "deployment",
                    "daemonset",
                    "statefulset",
                    "job",
                    "cronjob",
                    "ttl-after-finished",
                    "serviceaccount",
                    "taint-eviction-controller",
                    "namespace",
                    "horizontalpodautoscaling",
                    "disruption",
                    "resourcequota",
                    "persistentvolume-binder",
                    "persistentvolume-protection",
                    "persistentvolumeclaim-protection",
                    "ephemeral-volume",
                    "persistentvolume-expander",
                    "persistentvolume-attach-detach",
                    "resourceclaim",
                    "volumeattributesclass-protection",
                    "clusterrole-aggregation",
                    "ttl",
                    "nodelifecycle",
                    "nodeipam",
                    "csrapproving",
                    "csrcleaner",
                    "endpointslicemirroring",
                    "service-cidr",
                    "validatingadmissionpolicy-status",
                    "legacy-serviceaccount-token-cleaner",
                ],
            ),
            (
                "clusterrole-aggregation-controller,ttl-controller,certificatesigningrequest-approving-controller,certificatesigningrequest-signing-controller,certificatesigningrequest-cleaner-controller",
                &[],
                &[
                    "clusterrole-aggregation",
                    "ttl",
                    "csrapproving",
                    "csrsigning",
                    "csrcleaner",
                ],
            ),
        ];
        for (list, given, want) in cases {
            let got: Vec<&str> = parse_controllers_with(list, given)
                .unwrap()
                .iter()
                .map(|d| d.name)
                .collect();
            assert_eq!(got, *want, "--controllers={list}");
        }
    }

    #[test]
    fn unknown_controller_names_are_errors_listing_the_known_ones() {
        let err = parse_controllers("endpointslice,no-such-controller")
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"no-such-controller\""), "{err}");
        assert!(err.contains("replicaset"), "{err}");
        assert!(parse_controllers("-nope").is_err());
    }

    #[test]
    fn the_table_names_each_controller_once_and_its_upstream_counterpart() {
        let mut seen = std::collections::HashSet::new();
        for d in CONTROLLERS {
            for n in std::iter::once(&d.name).chain(d.aliases) {
                assert!(seen.insert(*n), "{n} names two controllers");
            }
            assert!(
                descriptors::help().contains(&format!("  {}: ", d.name)),
                "--controllers help lacks {}",
                d.name
            );
        }
        assert!(descriptors::replaced_upstream().contains(&"replicaset-controller"));
        assert!(!descriptors::replaced_upstream().is_empty());
    }

    #[test]
    fn lb_ipam_without_a_pool_is_an_error_naming_the_flag() {
        let cfg = |list: &str, pool: Option<&str>| ManagerConfig {
            controllers: parse_controllers(list).unwrap(),
            lb_pool: pool.map(|p| p.parse().unwrap()),
            root_ca_file: None,
            service_account_private_key_file: None,
            signing: Default::default(),
            leader: None,
            concurrency: Concurrency::default(),
        };
        let err = check_settings(&cfg("endpointslice,lb-ipam", None))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("lb-ipam") && err.contains("--lb-pool"),
            "{err}"
        );
        assert!(check_settings(&cfg("endpointslice,lb-ipam", Some("10.0.0.0/24"))).is_ok());
        assert!(check_settings(&cfg("*", None)).is_ok());
    }

    #[test]
    fn root_ca_cert_publisher_without_a_ca_file_is_an_error_naming_the_flag() {
        let cfg = |list: &str, file: Option<&str>| ManagerConfig {
            controllers: parse_controllers(list).unwrap(),
            lb_pool: None,
            root_ca_file: file.map(Into::into),
            service_account_private_key_file: None,
            signing: Default::default(),
            leader: None,
            concurrency: Concurrency::default(),
        };
        let err = check_settings(&cfg("serviceaccount,root-ca-cert-publisher", None))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("root-ca-cert-publisher") && err.contains("--root-ca-file"),
            "{err}"
        );
        assert!(check_settings(&cfg("root-ca-cert-publisher", Some("/etc/ca.crt"))).is_ok());
        assert!(
            !parse_controllers("*")
                .unwrap()
                .iter()
                .any(|d| d.name == "root-ca-cert-publisher"),
            "`*` leaves it off without the file, as lb-ipam without a pool"
        );
    }
}
