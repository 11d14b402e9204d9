//! The controller manager: runs the selected controllers, optionally only while holding the leader
//! Lease. Used by the `controller-manager` binary and by tests that run managers in-process.
//! Controllers are selected with kube-controller-manager's `--controllers` syntax and names; the
//! controllers (all but the garbage collector, which keeps monitors of its own) share one set of
//! informers.

use std::str::FromStr;

use futures::future::BoxFuture;
use futures::FutureExt as _;
use kube::Client;

use crate::endpoint::lbipam::pool::Pool;
use crate::error::{Error, Result};
use crate::runtime::informer::Informers;
use crate::runtime::leader::{self, LeaderConfig};
use crate::runtime::workers::AbortOnDrop;

/// A controller the manager can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ControllerKind {
    /// EndpointSlices from Services and Pods.
    EndpointSlice,
    /// Legacy Endpoints from Services and Pods.
    Endpoints,
    /// LoadBalancer address allocation.
    LbIpam,
    /// Pods of ReplicaSets.
    ReplicaSet,
    /// ReplicaSets of Deployments.
    Deployment,
    /// Cascading deletion through ownerReferences.
    GarbageCollector,
    /// Pods of Jobs.
    Job,
    /// Jobs of CronJobs.
    CronJob,
    /// Deletion of finished Jobs after `ttlSecondsAfterFinished`.
    TtlAfterFinished,
    /// Daemon Pods of DaemonSets.
    DaemonSet,
    /// Ordinal Pods and claims of StatefulSets.
    StatefulSet,
}

/// Every controller, in start order, with its name and the other names it answers to
/// (kube-controller-manager's `<name>-controller` spellings and the `endpoint` alias).
const CONTROLLERS: &[(ControllerKind, &str, &[&str])] = &[
    (
        ControllerKind::GarbageCollector,
        "garbagecollector",
        &["garbage-collector-controller"],
    ),
    (
        ControllerKind::EndpointSlice,
        "endpointslice",
        &["endpointslice-controller"],
    ),
    (
        ControllerKind::Endpoints,
        "endpoints",
        &["endpoint", "endpoints-controller"],
    ),
    (
        ControllerKind::ReplicaSet,
        "replicaset",
        &["replicaset-controller"],
    ),
    (
        ControllerKind::Deployment,
        "deployment",
        &["deployment-controller"],
    ),
    (
        ControllerKind::DaemonSet,
        "daemonset",
        &["daemonset-controller"],
    ),
    (
        ControllerKind::StatefulSet,
        "statefulset",
        &["statefulset-controller"],
    ),
    (ControllerKind::Job, "job", &["job-controller"]),
    (ControllerKind::CronJob, "cronjob", &["cronjob-controller"]),
    (
        ControllerKind::TtlAfterFinished,
        "ttl-after-finished",
        &["ttl-after-finished-controller"],
    ),
    (ControllerKind::LbIpam, "lb-ipam", &[]),
];

/// The names `--controllers` accepts (for error messages).
pub const KNOWN_NAMES: &[&str] = &[
    "garbagecollector",
    "endpointslice",
    "endpoints",
    "replicaset",
    "deployment",
    "daemonset",
    "statefulset",
    "job",
    "cronjob",
    "ttl-after-finished",
    "lb-ipam",
];

impl ControllerKind {
    /// The controller's name in `--controllers`.
    pub fn name(self) -> &'static str {
        CONTROLLERS
            .iter()
            .find(|(k, _, _)| *k == self)
            .map(|(_, n, _)| *n)
            .expect("every kind is listed")
    }

    /// Whether `*` includes it: every controller but lb-ipam, which needs a pool (`*` includes it
    /// when one is given).
    fn on_by_default(self, have_pool: bool) -> bool {
        self != ControllerKind::LbIpam || have_pool
    }
}

impl FromStr for ControllerKind {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim();
        CONTROLLERS
            .iter()
            .find(|(_, name, aliases)| *name == s || aliases.contains(&s))
            .map(|(k, _, _)| *k)
            .ok_or_else(|| Error::UnknownController(s.to_string()))
    }
}

/// Parses kube-controller-manager's `--controllers` syntax: `*` turns on every controller that
/// is on by default, `name` turns one on, `-name` turns one off (a `-name` wins over `name` and
/// `*`). `have_pool`: lb-ipam is on by default only with an address pool. The result is in start
/// order (the garbage collector first, as upstream).
pub fn parse_controllers_with(list: &str, have_pool: bool) -> Result<Vec<ControllerKind>> {
    let mut all = false;
    let mut on = Vec::new();
    let mut off = Vec::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if item == "*" {
            all = true;
        } else if let Some(name) = item.strip_prefix('-') {
            off.push(name.parse::<ControllerKind>()?);
        } else {
            on.push(item.parse::<ControllerKind>()?);
        }
    }
    Ok(CONTROLLERS
        .iter()
        .map(|(k, _, _)| *k)
        .filter(|k| !off.contains(k) && (on.contains(k) || (all && k.on_by_default(have_pool))))
        .collect())
}

/// [`parse_controllers_with`] without an address pool.
pub fn parse_controllers(list: &str) -> Result<Vec<ControllerKind>> {
    parse_controllers_with(list, false)
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
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct ManagerConfig {
    /// Controllers to run.
    pub controllers: Vec<ControllerKind>,
    /// Pool for lb-ipam (required when it runs).
    pub lb_pool: Option<Pool>,
    /// Run only while holding this Lease.
    pub leader: Option<LeaderConfig>,
    /// Workers per controller.
    pub concurrency: Concurrency,
}

/// Runs the controllers; with leader election, only while leading. Returns `Err(Leadership)` when
/// the Lease is lost (the caller should exit, as kube-controller-manager does).
pub async fn run(client: Client, cfg: ManagerConfig) -> Result<()> {
    let lbipam = lbipam_config(&cfg)?;
    let work = run_controllers(
        client.clone(),
        cfg.controllers.clone(),
        lbipam,
        cfg.concurrency,
    );
    match cfg.leader {
        Some(l) => leader::run_as_leader(client, l, work).await,
        None => {
            work.await;
            Ok(())
        }
    }
}

type Task = BoxFuture<'static, ()>;

/// lb-ipam's settings when it is selected; an error naming `--lb-pool` when it is selected
/// without a pool.
fn lbipam_config(cfg: &ManagerConfig) -> Result<Option<crate::endpoint::lbipam::Config>> {
    if !cfg.controllers.contains(&ControllerKind::LbIpam) {
        return Ok(None);
    }
    match &cfg.lb_pool {
        Some(pool) => Ok(Some(crate::endpoint::lbipam::Config::new(pool.clone()))),
        None => Err(Error::MissingSetting {
            controller: ControllerKind::LbIpam.name(),
            flag: "--lb-pool",
            what: "a LoadBalancer address pool, a CIDR (a.b.c.d/n) or a range (a-b)",
        }),
    }
}

/// The workload controllers share one set of informers with the endpoint controllers: each
/// registers its indexes and handlers when it is built, then the watches start; every controller
/// waits for the caches to sync.
fn workload_tasks(
    client: &Client,
    informers: &Informers,
    kinds: &[ControllerKind],
    concurrency: Concurrency,
) -> Vec<(ControllerKind, Task)> {
    let mut tasks: Vec<(ControllerKind, Task)> = Vec::new();
    for &kind in kinds {
        let task: Task = match kind {
            ControllerKind::ReplicaSet => crate::workload::replicaset::Controller::new(
                client.clone(),
                informers,
                crate::workload::replicaset::Config {
                    workers: concurrency.replicaset,
                    ..Default::default()
                },
            )
            .run()
            .boxed(),
            ControllerKind::Deployment => crate::workload::deployment::Controller::new(
                client.clone(),
                informers,
                crate::workload::deployment::Config {
                    workers: concurrency.deployment,
                },
            )
            .run()
            .boxed(),
            ControllerKind::GarbageCollector => crate::workload::garbagecollector::new(
                client.clone(),
                crate::workload::garbagecollector::Config {
                    workers: concurrency.gc,
                    ..Default::default()
                },
            )
            .run()
            .boxed(),
            ControllerKind::Job => crate::workload::job::Controller::new(
                client.clone(),
                informers,
                crate::workload::job::Config {
                    workers: concurrency.job,
                    ..Default::default()
                },
            )
            .run()
            .boxed(),
            ControllerKind::CronJob => crate::workload::cronjob::Controller::new(
                client.clone(),
                informers,
                crate::workload::cronjob::Config {
                    workers: concurrency.cronjob,
                    ..Default::default()
                },
            )
            .run()
            .boxed(),
            ControllerKind::TtlAfterFinished => crate::workload::ttlafterfinished::Controller::new(
                client.clone(),
                informers,
                crate::workload::ttlafterfinished::Config {
                    workers: concurrency.ttl_after_finished,
                    ..Default::default()
                },
            )
            .run()
            .boxed(),
            ControllerKind::DaemonSet => crate::workload::daemonset::Controller::new(
                client.clone(),
                informers,
                crate::workload::daemonset::Config {
                    workers: concurrency.daemonset,
                    ..Default::default()
                },
            )
            .run()
            .boxed(),
            ControllerKind::StatefulSet => crate::workload::statefulset::Controller::new(
                client.clone(),
                informers,
                crate::workload::statefulset::Config {
                    workers: concurrency.statefulset,
                },
            )
            .run()
            .boxed(),
            _ => continue,
        };
        tasks.push((kind, task));
    }
    tasks
}

/// The endpoint controllers on the same informers (lb-ipam when `lbipam` is given).
fn endpoint_tasks(
    client: &Client,
    informers: &Informers,
    kinds: &[ControllerKind],
    lbipam: Option<crate::endpoint::lbipam::Config>,
    concurrency: Concurrency,
) -> Vec<(ControllerKind, Task)> {
    use crate::endpoint::{endpoints, endpointslice, lbipam as lb};
    let workers = usize::from(concurrency.endpoints);
    let mut tasks: Vec<(ControllerKind, Task)> = Vec::new();
    for &kind in kinds {
        let task: Task = match kind {
            ControllerKind::EndpointSlice => {
                let config = endpointslice::Config { workers };
                endpointslice::Controller::new(client.clone(), informers, config)
                    .run()
                    .boxed()
            }
            ControllerKind::Endpoints => {
                let config = endpoints::Config { workers };
                endpoints::Controller::new(client.clone(), informers, config)
                    .run()
                    .boxed()
            }
            _ => continue,
        };
        tasks.push((kind, task));
    }
    if let Some(config) = lbipam {
        let task = lb::Controller::new(client.clone(), informers, config).run();
        tasks.push((ControllerKind::LbIpam, task.boxed()));
    }
    tasks
}

async fn run_controllers(
    client: Client,
    kinds: Vec<ControllerKind>,
    lbipam: Option<crate::endpoint::lbipam::Config>,
    concurrency: Concurrency,
) {
    // Held until the controllers stop: dropping the informers stops their watches.
    let informers = Informers::new(client.clone());
    let mut built = workload_tasks(&client, &informers, &kinds, concurrency);
    built.extend(endpoint_tasks(
        &client,
        &informers,
        &kinds,
        lbipam,
        concurrency,
    ));
    // Every controller has registered its indexes and handlers: the watches start now.
    if !built.is_empty() {
        informers.start();
    }
    let mut tasks = Vec::new();
    for (kind, task) in built {
        tracing::info!("starting controller {}", kind.name());
        tasks.push(tokio::spawn(task));
    }
    // Aborting this future (lost leadership) must stop every controller: abort on drop.
    let _guard = AbortOnDrop(tasks.iter().map(|t| t.abort_handle()).collect());
    for t in tasks {
        let _ = t.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ControllerKind::*;

    #[test]
    fn controllers_flag_takes_kube_controller_manager_syntax() {
        let cases: &[(&str, bool, &[ControllerKind])] = &[
            (
                "*",
                false,
                &[
                    GarbageCollector,
                    EndpointSlice,
                    Endpoints,
                    ReplicaSet,
                    Deployment,
                    DaemonSet,
                    StatefulSet,
                    Job,
                    CronJob,
                    TtlAfterFinished,
                ],
            ),
            (
                "*",
                true,
                &[
                    GarbageCollector,
                    EndpointSlice,
                    Endpoints,
                    ReplicaSet,
                    Deployment,
                    DaemonSet,
                    StatefulSet,
                    Job,
                    CronJob,
                    TtlAfterFinished,
                    LbIpam,
                ],
            ),
            (
                "*,-endpoints,-endpointslice",
                false,
                &[
                    GarbageCollector,
                    ReplicaSet,
                    Deployment,
                    DaemonSet,
                    StatefulSet,
                    Job,
                    CronJob,
                    TtlAfterFinished,
                ],
            ),
            (
                "replicaset,deployment,garbagecollector",
                false,
                &[GarbageCollector, ReplicaSet, Deployment],
            ),
            (
                "job-controller,cronjob,ttl-after-finished-controller",
                false,
                &[Job, CronJob, TtlAfterFinished],
            ),
            (
                "replicaset-controller,endpoint",
                false,
                &[Endpoints, ReplicaSet],
            ),
            (
                "statefulset-controller,daemonset",
                false,
                &[DaemonSet, StatefulSet],
            ),
            ("deployment,-deployment", false, &[]),
            (
                "endpointslice,endpoints,lb-ipam",
                false,
                &[EndpointSlice, Endpoints, LbIpam],
            ),
        ];
        for (list, pool, want) in cases {
            assert_eq!(
                parse_controllers_with(list, *pool).unwrap(),
                *want,
                "--controllers={list}"
            );
        }
    }

    #[test]
    fn lb_ipam_without_a_pool_is_an_error_naming_the_flag() {
        let cfg = |controllers: Vec<ControllerKind>, pool: Option<&str>| ManagerConfig {
            controllers,
            lb_pool: pool.map(|p| p.parse().unwrap()),
            leader: None,
            concurrency: Concurrency::default(),
        };
        let err = lbipam_config(&cfg(vec![EndpointSlice, LbIpam], None))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("lb-ipam") && err.contains("--lb-pool"),
            "{err}"
        );
        assert!(lbipam_config(&cfg(vec![EndpointSlice], None))
            .unwrap()
            .is_none());
        let with_pool = lbipam_config(&cfg(vec![LbIpam], Some("10.0.0.0/24"))).unwrap();
        assert_eq!(with_pool.unwrap().pool, "10.0.0.0/24".parse().unwrap());
    }

    #[test]
    fn unknown_controller_names_are_errors_listing_the_known_ones() {
        let err = parse_controllers("endpointslice,bootstrapsigner")
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"bootstrapsigner\""), "{err}");
        assert!(err.contains("replicaset"), "{err}");
        assert!(parse_controllers("-nope").is_err());
    }
}
