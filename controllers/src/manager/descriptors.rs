//! The controllers the manager can run, one row each, as kube-controller-manager's
//! `NewControllerDescriptors`: the name `--controllers` takes, the other names it answers to, the
//! kube-controller-manager controller it replaces, whether `*` turns it on, a line of help and the
//! constructor. This table drives `--controllers` parsing, its help, the error for an unknown
//! name, the start order and what `cargo xtask cluster up --controllers kpr` turns off in
//! kube-controller-manager. A controller is added by adding its module and one row here.
//!
//! Owns the table only: how the selected controllers run (informers, leadership, failure) is
//! [`super`]'s.

use futures::future::BoxFuture;
use futures::FutureExt as _;
use kube::Client;

use super::{Concurrency, ManagerConfig};
use crate::endpoint::lbipam::pool::Pool;
use crate::error::{Error, Result};
use crate::runtime::informer::Informers;
use crate::{
    admission, auth, autoscaling, dra, endpoint, namespace, networking, node, quota, volume,
    workload,
};

/// A running controller: ends only on an error (or never).
pub type Task = BoxFuture<'static, Result<()>>;

/// What a constructor gets: the client, the informers every controller shares (a controller
/// registers its handlers on them when it is built; the manager starts them after every
/// constructor ran) and the settings from the command line.
pub struct ControllerContext<'a> {
    /// The process's API client (rate-limited as `--kube-api-qps` says).
    pub client: Client,
    /// The shared informers.
    pub informers: &'a Informers,
    /// Workers per controller.
    pub concurrency: Concurrency,
    /// lb-ipam's address pool (`--lb-pool`).
    pub lb_pool: Option<Pool>,
    /// The cluster CA the root-ca-cert-publisher publishes (`--root-ca-file`).
    pub root_ca_file: Option<std::path::PathBuf>,
    /// The CAs csrsigning signs with (`--cluster-signing-*`).
    pub signing: crate::auth::csrsigning::SigningConfig,
    /// The key serviceaccount-token signs with (`--service-account-private-key-file`).
    pub service_account_private_key_file: Option<std::path::PathBuf>,
}

/// One controller the manager can run.
pub struct ControllerDescriptor {
    /// Its name in `--controllers`.
    pub name: &'static str,
    /// Other names `--controllers` takes for it (kube-controller-manager's `<name>-controller`
    /// spellings, `endpoint`).
    pub aliases: &'static [&'static str],
    /// The kube-controller-manager controller it replaces (turned off there when kpr runs it).
    pub replaces: Option<&'static str>,
    /// Whether `*` turns it on (when what it [`needs`](Self::needs) is given).
    pub default_on: bool,
    /// A setting it cannot run without: selected without it, the manager refuses to start.
    pub needs: Option<Setting>,
    /// What it does, for `--help`.
    pub help: &'static str,
    /// Builds it (registering its informer handlers) and returns its work.
    pub new: fn(&ControllerContext<'_>) -> Result<Task>,
}

impl std::fmt::Debug for ControllerDescriptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

impl PartialEq for ControllerDescriptor {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

/// A command-line setting a controller needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setting {
    /// `--lb-pool`: a LoadBalancer address pool.
    LbPool,
    /// `--root-ca-file`: the cluster's CA bundle, as kube-controller-manager takes it.
    RootCaFile,
    /// `--cluster-signing-cert-file` and `--cluster-signing-key-file` (or a per-signer pair).
    ClusterSigning,
    /// `--allocate-node-cidrs` with `--cluster-cidr`.
    AllocateNodeCidrs,
    /// `--service-account-private-key-file`: the key legacy service-account tokens are signed with.
    ServiceAccountPrivateKeyFile,
}

impl Setting {
    /// Whether the command line gave it.
    pub fn given(self, cfg: &ManagerConfig) -> bool {
        match self {
            Setting::LbPool => cfg.lb_pool.is_some(),
            Setting::RootCaFile => cfg.root_ca_file.is_some(),
            Setting::ClusterSigning => cfg.signing.any(),
            Setting::AllocateNodeCidrs => cfg.concurrency.node_ipam.is_some(),
            Setting::ServiceAccountPrivateKeyFile => cfg.service_account_private_key_file.is_some(),
        }
    }

    /// The flag that gives it.
    pub fn flag(self) -> &'static str {
        match self {
            Setting::LbPool => "--lb-pool",
            Setting::RootCaFile => "--root-ca-file",
            Setting::ClusterSigning => "--cluster-signing-cert-file",
            Setting::AllocateNodeCidrs => "--allocate-node-cidrs",
            Setting::ServiceAccountPrivateKeyFile => "--service-account-private-key-file",
        }
    }

    /// What it is, for the error when it is missing.
    pub fn what(self) -> &'static str {
        match self {
            Setting::LbPool => "a LoadBalancer address pool, a CIDR (a.b.c.d/n) or a range (a-b)",
            Setting::RootCaFile => {
                "the PEM file of the CA that signed kube-apiserver's serving certificate, \
                 published in every namespace as the kube-root-ca.crt ConfigMap"
            }
            Setting::ClusterSigning => {
                "the PEM certificate and PKCS#8 key of the CA that signs approved \
                 CertificateSigningRequests (with --cluster-signing-key-file, or the per-signer \
                 --cluster-signing-<signer>-cert-file and -key-file pairs)"
            }
            Setting::AllocateNodeCidrs => {
                "--allocate-node-cidrs=true with --cluster-cidr: the pod CIDRs (one, or one per \
                 family) cut into one CIDR per Node"
            }
            Setting::ServiceAccountPrivateKeyFile => {
                "the PEM private key (RSA, or ECDSA P-256 / P-384) legacy service-account tokens \
                 are signed with, the pair of kube-apiserver's --service-account-key-file"
            }
        }
    }

    /// The error of a controller selected without it.
    pub fn missing(self, controller: &'static str) -> Error {
        Error::MissingSetting {
            controller,
            flag: self.flag(),
            what: self.what(),
        }
    }
}

/// Every controller, in start order (the garbage collector first, as upstream).
pub static CONTROLLERS: &[ControllerDescriptor] = &[
    ControllerDescriptor {
        name: "garbagecollector",
        aliases: &["garbage-collector-controller"],
        replaces: Some("garbage-collector-controller"),
        default_on: true,
        needs: None,
        help: "cascading deletion through ownerReferences",
        new: |cx| {
            let config = workload::garbagecollector::Config {
                workers: cx.concurrency.gc,
                ..Default::default()
            };
            let gc = workload::garbagecollector::new(cx.client.clone(), config);
            Ok(forever(gc.run()))
        },
    },
    ControllerDescriptor {
        name: "endpointslice",
        aliases: &["endpointslice-controller"],
        replaces: Some("endpointslice-controller"),
        default_on: true,
        needs: None,
        help: "EndpointSlices from Services and Pods",
        new: |cx| {
            let config = endpoint::endpointslice::Config {
                workers: usize::from(cx.concurrency.endpoints),
            };
            let c =
                endpoint::endpointslice::Controller::new(cx.client.clone(), cx.informers, config);
            Ok(forever(c.run()))
        },
    },
    ControllerDescriptor {
        name: "endpoints",
        aliases: &["endpoint", "endpoints-controller"],
        replaces: Some("endpoints-controller"),
        default_on: true,
        needs: None,
        help: "legacy Endpoints from Services and Pods",
        new: |cx| {
            let config = endpoint::endpoints::Config {
                workers: usize::from(cx.concurrency.endpoints),
            };
            let c = endpoint::endpoints::Controller::new(cx.client.clone(), cx.informers, config);
            Ok(forever(c.run()))
        },
    },
    ControllerDescriptor {
        name: "replicaset",
        aliases: &["replicaset-controller"],
        replaces: Some("replicaset-controller"),
        default_on: true,
        needs: None,
        help: "Pods of ReplicaSets",
        new: |cx| {
            let config = workload::replicaset::Config {
                workers: cx.concurrency.replicaset,
                ..Default::default()
            };
            let c = workload::replicaset::Controller::new(cx.client.clone(), cx.informers, config);
            Ok(forever(c.run()))
        },
    },
    ControllerDescriptor {
        name: "replicationcontroller",
        aliases: &["replicationcontroller-controller"],
        replaces: Some("replicationcontroller-controller"),
        default_on: true,
        needs: None,
        help: "Pods of ReplicationControllers (the ReplicaSet controller's algorithm)",
        new: |cx| {
            let config = workload::replicaset::Config {
                workers: cx.concurrency.replicationcontroller,
                ..Default::default()
            };
            let c = workload::replicaset::replication::new(cx.client.clone(), cx.informers, config);
            Ok(forever(c.run()))
        },
    },
    ControllerDescriptor {
        name: "podgc",
        aliases: &["pod-garbage-collector-controller"],
        replaces: Some("pod-garbage-collector-controller"),
        default_on: true,
        needs: None,
        help: "deletion of terminated Pods above --terminated-pod-gc-threshold, of Pods on deleted Nodes and of unscheduled terminating Pods",
        new: |cx| {
            let config = workload::podgc::Config {
                terminated_pod_gc_threshold: cx.concurrency.terminated_pod_gc_threshold,
                ..Default::default()
            };
            let c = workload::podgc::Controller::new(cx.client.clone(), cx.informers, config);
            Ok(forever(c.run()))
        },
    },
    ControllerDescriptor {
        name: "deployment",
        aliases: &["deployment-controller"],
        replaces: Some("deployment-controller"),
        default_on: true,
        needs: None,
        help: "ReplicaSets of Deployments",
        new: |cx| {
            let config = workload::deployment::Config {
                workers: cx.concurrency.deployment,
            };
            let c = workload::deployment::Controller::new(cx.client.clone(), cx.informers, config);
            Ok(forever(c.run()))
        },
    },
    ControllerDescriptor {
        name: "daemonset",
        aliases: &["daemonset-controller"],
        replaces: Some("daemonset-controller"),
        default_on: true,
        needs: None,
        help: "daemon Pods of DaemonSets",
        new: |cx| {
            let config = workload::daemonset::Config {
                workers: cx.concurrency.daemonset,
                ..Default::default()
            };
            let c = workload::daemonset::Controller::new(cx.client.clone(), cx.informers, config);
            Ok(forever(c.run()))
        },
    },
    ControllerDescriptor {
        name: "statefulset",
        aliases: &["statefulset-controller"],
        replaces: Some("statefulset-controller"),
        default_on: true,
        needs: None,
        help: "ordinal Pods and claims of StatefulSets",
        new: |cx| {
            let config = workload::statefulset::Config {
                workers: cx.concurrency.statefulset,
            };
            let c = workload::statefulset::Controller::new(cx.client.clone(), cx.informers, config);
            Ok(forever(c.run()))
        },
    },
    ControllerDescriptor {
        name: "job",
        aliases: &["job-controller"],
        replaces: Some("job-controller"),
        default_on: true,
        needs: None,
        help: "Pods of Jobs",
        new: |cx| {
            let config = workload::job::Config {
                workers: cx.concurrency.job,
                ..Default::default()
            };
            let c = workload::job::Controller::new(cx.client.clone(), cx.informers, config);
            Ok(forever(c.run()))
        },
    },
    ControllerDescriptor {
        name: "cronjob",
        aliases: &["cronjob-controller"],
        replaces: Some("cronjob-controller"),
        default_on: true,
        needs: None,
        help: "Jobs of CronJobs",
        new: |cx| {
            let config = workload::cronjob::Config {
                workers: cx.concurrency.cronjob,
                ..Default::default()
            };
            let c = workload::cronjob::Controller::new(cx.client.clone(), cx.informers, config);
            Ok(forever(c.run()))
        },
    },
    ControllerDescriptor {
        name: "ttl-after-finished",
        aliases: &["ttl-after-finished-controller"],
        replaces: Some("ttl-after-finished-controller"),
        default_on: true,
        needs: None,
        help: "deletion of finished Jobs after ttlSecondsAfterFinished",
        new: |cx| {
            let config = workload::ttlafterfinished::Config {
                workers: cx.concurrency.ttl_after_finished,
                ..Default::default()
            };
            let c = workload::ttlafterfinished::Controller::new(
                cx.client.clone(),
                cx.informers,
                config,
            );
            Ok(forever(c.run()))
        },
    },
    // Issue 38: the default ServiceAccount, the root CA ConfigMap and NoExecute taint eviction.
    ControllerDescriptor {
        name: "serviceaccount",
        aliases: &["serviceaccount-controller"],
        replaces: Some("serviceaccount-controller"),
        default_on: true,
        needs: None,
        help: "the default ServiceAccount in every active namespace",
        new: |cx| {
            let c = auth::serviceaccount::Controller::new(
                cx.client.clone(),
                cx.informers,
                auth::serviceaccount::Config::default(),
            );
            Ok(forever(c.run()))
        },
    },
    ControllerDescriptor {
        name: "root-ca-cert-publisher",
        aliases: &["root-ca-certificate-publisher-controller"],
        replaces: Some("root-ca-certificate-publisher-controller"),
        default_on: true,
        needs: Some(Setting::RootCaFile),
        help:
            "the kube-root-ca.crt ConfigMap (the cluster CA of --root-ca-file) in every namespace",
        new: |cx| {
            let path = cx
                .root_ca_file
                .as_deref()
                .ok_or_else(|| Setting::RootCaFile.missing("root-ca-cert-publisher"))?;
            let config = auth::rootcacertpublisher::Config::from_file(path)?;
            let c = auth::rootcacertpublisher::Controller::new(
                cx.client.clone(),
                cx.informers,
                config,
            )?;
            Ok(forever(c.run()))
        },
    },
    ControllerDescriptor {
        name: "taint-eviction-controller",
        aliases: &[],
        replaces: Some("taint-eviction-controller"),
        default_on: true,
        needs: None,
        help: "deletion of Pods not tolerating their Node's NoExecute taints",
        new: |cx| {
            let c = node::tainteviction::Controller::new(
                cx.client.clone(),
                cx.informers,
                node::tainteviction::Config::default(),
            );
            Ok(forever(c.run()))
        },
    },
    ControllerDescriptor {
        name: "namespace",
        aliases: &["namespace-controller"],
        replaces: Some("namespace-controller"),
        default_on: true,
        needs: None,
        help: "deletion of a terminating namespace's content (every namespaced resource, custom resources included) and its kubernetes finalizer",
        new: |cx| {
            let config = namespace::deletion::Config {
                workers: cx.concurrency.namespace,
                sync_period: cx.concurrency.namespace_sync_period,
                ..Default::default()
            };
            let c = namespace::deletion::Controller::new(cx.client.clone(), cx.informers, config);
            Ok(forever(c.run()))
        },
    },
    ControllerDescriptor {
        name: "horizontalpodautoscaling",
        aliases: &["horizontal-pod-autoscaler-controller"],
        replaces: Some("horizontal-pod-autoscaler-controller"),
        default_on: true,
        needs: None,
        help: "replica counts of scalable targets from resource metrics (autoscaling/v2)",
        new: |cx| {
            let c = autoscaling::podautoscaler::Controller::new(
                cx.client.clone(),
                cx.informers,
                cx.concurrency.horizontal_pod_autoscaler,
            );
            Ok(forever(c.run()))
        },
    },
    ControllerDescriptor {
        name: "disruption",
        aliases: &["disruption-controller"],
        replaces: Some("disruption-controller"),
        default_on: true,
        needs: None,
        help: "PodDisruptionBudget status (the budgets evictions and kubectl drain obey)",
        new: |cx| {
            let c = workload::disruption::Controller::new(
                cx.client.clone(),
                cx.informers,
                workload::disruption::Config::default(),
            );
            Ok(forever(c.run()))
        },
    },
    ControllerDescriptor {
        name: "resourcequota",
        aliases: &["resourcequota-controller"],
        replaces: Some("resourcequota-controller"),
        default_on: true,
        needs: None,
        help: "usage in ResourceQuotas' status, recomputed every --resource-quota-sync-period and on changes",
        new: |cx| {
            let config = quota::resourcequota::Config {
                workers: cx.concurrency.resourcequota,
                resync_period: cx.concurrency.resource_quota_sync_period,
            };
            let c = quota::resourcequota::Controller::new(cx.client.clone(), cx.informers, config);
            Ok(forever(c.run()))
        },
    },
    // Issue 39: storage (binding claims to volumes, the protection finalizers, ephemeral claims).
    ControllerDescriptor {
        name: "persistentvolume-binder",
        aliases: &["persistentvolume-binder-controller"],
        replaces: Some("persistentvolume-binder-controller"),
        default_on: true,
        needs: None,
        help: "binding of PersistentVolumeClaims to PersistentVolumes, the external-provisioner handshake and reclaiming released volumes",
        new: |cx| {
            let c = volume::persistentvolume::Controller::new(
                cx.client.clone(),
                cx.informers,
                volume::persistentvolume::Config {
                    sync_period: cx.concurrency.pvclaimbinder_sync_period,
                },
            );
            Ok(forever(c.run()))
        },
    },
    ControllerDescriptor {
        name: "persistentvolume-protection",
        aliases: &["persistentvolume-protection-controller"],
        replaces: Some("persistentvolume-protection-controller"),
        default_on: true,
        needs: None,
        help: "the kubernetes.io/pv-protection finalizer: a bound PersistentVolume stays until unbound",
        new: |cx| {
            let c = volume::pvprotection::Controller::new(cx.client.clone(), cx.informers);
            Ok(forever(c.run()))
        },
    },
    ControllerDescriptor {
        name: "persistentvolumeclaim-protection",
        aliases: &["persistentvolumeclaim-protection-controller"],
        replaces: Some("persistentvolumeclaim-protection-controller"),
        default_on: true,
        needs: None,
        help: "the kubernetes.io/pvc-protection finalizer: a claim stays while a Pod uses it",
        new: |cx| {
            let c = volume::pvcprotection::Controller::new(cx.client.clone(), cx.informers);
            Ok(forever(c.run()))
        },
    },
    ControllerDescriptor {
        name: "ephemeral-volume",
        aliases: &["ephemeral-volume-controller"],
        replaces: Some("ephemeral-volume-controller"),
        default_on: true,
        needs: None,
        help: "the PersistentVolumeClaims of Pods' generic ephemeral volumes",
        new: |cx| {
            let c = volume::ephemeral::Controller::new(cx.client.clone(), cx.informers);
            Ok(forever(c.run()))
        },
    },
    ControllerDescriptor {
        name: "persistentvolume-expander",
        aliases: &["persistentvolume-expander-controller"],
        replaces: Some("persistentvolume-expander-controller"),
        default_on: true,
        needs: None,
        help: "a Bound claim whose request grew is handed to its volume's resizer (the CSI external-resizer)",
        new: |cx| {
            let c = volume::expand::Controller::new(cx.client.clone(), cx.informers);
            Ok(forever(c.run()))
        },
    },
    ControllerDescriptor {
        name: "persistentvolume-attach-detach",
        aliases: &["persistentvolume-attach-detach-controller", "attachdetach"],
        replaces: Some("persistentvolume-attach-detach-controller"),
        default_on: true,
        needs: None,
        help: "VolumeAttachments for the CSI volumes of Pods on a node (the external-attacher's work), the node's volumesAttached, detach once unmounted",
        new: |cx| {
            let c = volume::attachdetach::Controller::new(cx.client.clone(), cx.informers);
            Ok(forever(c.run()))
        },
    },
    ControllerDescriptor {
        name: "resourceclaim",
        aliases: &["resourceclaim-controller"],
        replaces: Some("resourceclaim-controller"),
        default_on: true,
        needs: None,
        help: "ResourceClaims from Pods' ResourceClaimTemplates, their reservations for bound Pods, clean-up when the Pods are done",
        new: |cx| {
            let c = dra::resourceclaim::Controller::new(cx.client.clone(), cx.informers);
            Ok(forever(c.run()))
        },
    },
    ControllerDescriptor {
        name: "volumeattributesclass-protection",
        aliases: &["volumeattributesclass-protection-controller"],
        replaces: Some("volumeattributesclass-protection-controller"),
        default_on: true,
        needs: None,
        help: "the kubernetes.io/vac-protection finalizer: a VolumeAttributesClass stays while a claim or a volume names it",
        new: |cx| {
            let c = volume::vacprotection::Controller::new(cx.client.clone(), cx.informers);
            Ok(forever(c.run()))
        },
    },
    // Issue 43: the housekeeping controllers a kpr-only cluster needs.
    ControllerDescriptor {
        name: "clusterrole-aggregation",
        aliases: &["clusterrole-aggregation-controller"],
        replaces: Some("clusterrole-aggregation-controller"),
        default_on: true,
        needs: None,
        help: "the rules of ClusterRoles with an aggregationRule (admin, edit, view): the union of the ClusterRoles their selectors match",
        new: |cx| {
            let c = auth::clusterroleaggregation::Controller::new(cx.client.clone(), cx.informers);
            Ok(forever(c.run()))
        },
    },
    ControllerDescriptor {
        name: "ttl",
        aliases: &["ttl-controller"],
        replaces: Some("ttl-controller"),
        default_on: true,
        needs: None,
        help: "the node.alpha.kubernetes.io/ttl annotation (how long kubelets cache Secrets and ConfigMaps) from the cluster's size",
        new: |cx| {
            let c = node::ttl::Controller::new(cx.client.clone(), cx.informers);
            Ok(forever(c.run()))
        },
    },
    // Issue 43: Node health and pod CIDRs.
    ControllerDescriptor {
        name: "nodelifecycle",
        aliases: &["node-lifecycle-controller", "node-lifecycle"],
        replaces: Some("node-lifecycle-controller"),
        default_on: true,
        needs: None,
        help: "Node health from heartbeats and Leases (Ready=Unknown after --node-monitor-grace-period), the not-ready/unreachable and condition taints, Pods on NotReady Nodes marked not Ready",
        new: |cx| {
            let c = node::lifecycle::Controller::new(
                cx.client.clone(),
                cx.informers,
                cx.concurrency.node_lifecycle,
            );
            Ok(forever(c.run()))
        },
    },
    ControllerDescriptor {
        name: "nodeipam",
        aliases: &["node-ipam-controller", "node-ipam"],
        replaces: Some("node-ipam-controller"),
        default_on: true,
        needs: Some(Setting::AllocateNodeCidrs),
        help: "spec.podCIDRs for Nodes from --cluster-cidr (--allocate-node-cidrs), both families",
        new: |cx| {
            let config = cx
                .concurrency
                .node_ipam
                .ok_or_else(|| Setting::AllocateNodeCidrs.missing("nodeipam"))?;
            let c = node::ipam::Controller::new(cx.client.clone(), cx.informers, &config)?;
            Ok(async move { c.run().await }.boxed())
        },
    },
    ControllerDescriptor {
        name: "csrapproving",
        aliases: &["certificatesigningrequest-approving-controller"],
        replaces: Some("certificatesigningrequest-approving-controller"),
        default_on: true,
        needs: None,
        help: "approval of kubelets' client CertificateSigningRequests their requester may make (a SubjectAccessReview)",
        new: |cx| {
            let c = auth::csrapproving::Controller::new(cx.client.clone(), cx.informers);
            Ok(forever(c.run()))
        },
    },
    ControllerDescriptor {
        name: "csrsigning",
        aliases: &["certificatesigningrequest-signing-controller"],
        replaces: Some("certificatesigningrequest-signing-controller"),
        default_on: true,
        needs: Some(Setting::ClusterSigning),
        help: "certificates for approved CertificateSigningRequests of the kubernetes.io signers, from the CA of --cluster-signing-cert-file",
        new: |cx| {
            let signers =
                auth::csrsigning::Controller::all(&cx.client, cx.informers, &cx.signing)?;
            if signers.is_empty() {
                return Err(Setting::ClusterSigning.missing("csrsigning"));
            }
            let runs = signers.into_iter().map(|c| c.run());
            Ok(forever(futures::future::join_all(runs).map(|_| ())))
        },
    },
    ControllerDescriptor {
        name: "csrcleaner",
        aliases: &["certificatesigningrequest-cleaner-controller"],
        replaces: Some("certificatesigningrequest-cleaner-controller"),
        default_on: true,
        needs: None,
        help: "deletion of CertificateSigningRequests an hour after they were issued, denied or failed, a day after they were made, or once their certificate expired",
        new: |cx| {
            let c = auth::csrcleaner::Controller::new(cx.client.clone(), cx.informers);
            Ok(forever(c.run()))
        },
    },
    // Issue 43: endpointslice-mirroring, service-cidr and validatingadmissionpolicy-status.
    ControllerDescriptor {
        name: "endpointslicemirroring",
        aliases: &["endpointslice-mirroring-controller", "endpointslice-mirroring"],
        replaces: Some("endpointslice-mirroring-controller"),
        default_on: true,
        needs: None,
        help: "EndpointSlices mirroring the custom Endpoints of Services without a selector",
        new: |cx| {
            let c = endpoint::endpointslicemirroring::Controller::new(
                cx.client.clone(),
                cx.informers,
                cx.concurrency.mirroring,
            );
            Ok(forever(c.run()))
        },
    },
    ControllerDescriptor {
        name: "service-cidr",
        aliases: &["service-cidr-controller"],
        replaces: Some("service-cidr-controller"),
        default_on: true,
        needs: None,
        help: "the ServiceCIDR finalizer and Ready condition",
        new: |cx| {
            let c = networking::servicecidrs::Controller::new(cx.client.clone(), cx.informers);
            Ok(forever(c.run()))
        },
    },
    ControllerDescriptor {
        name: "validatingadmissionpolicy-status",
        aliases: &["validatingadmissionpolicy-status-controller"],
        replaces: Some("validatingadmissionpolicy-status-controller"),
        default_on: true,
        needs: None,
        help: "ValidatingAdmissionPolicy status: observedGeneration and typeChecking (no CEL type check)",
        new: |cx| {
            let config = admission::validatingadmissionpolicystatus::Config {
                workers: cx.concurrency.validating_admission_policy_status,
            };
            let c = admission::validatingadmissionpolicystatus::Controller::new(
                cx.client.clone(),
                cx.informers,
                config,
            );
            Ok(forever(c.run()))
        },
    },
    ControllerDescriptor {
        name: "serviceaccount-token",
        aliases: &["serviceaccount-token-controller"],
        replaces: Some("serviceaccount-token-controller"),
        default_on: true,
        needs: Some(Setting::ServiceAccountPrivateKeyFile),
        help: "the token, ca.crt and namespace of kubernetes.io/service-account-token Secrets (legacy tokens signed with --service-account-private-key-file), and their deletion with their ServiceAccount",
        new: |cx| {
            let path = cx
                .service_account_private_key_file
                .as_deref()
                .ok_or_else(|| Setting::ServiceAccountPrivateKeyFile.missing("serviceaccount-token"))?;
            let signer = auth::serviceaccounttoken::jwt::Signer::from_file(path)?;
            let root_ca = match cx.root_ca_file.as_deref() {
                Some(p) => auth::rootcacertpublisher::Config::from_file(p)?.root_ca.into_bytes(),
                None => Vec::new(),
            };
            let config = auth::serviceaccounttoken::Config {
                signer: std::sync::Arc::new(signer),
                root_ca,
                workers: cx.concurrency.serviceaccount_token,
            };
            let c = auth::serviceaccounttoken::Controller::new(cx.client.clone(), cx.informers, config);
            Ok(forever(c.run()))
        },
    },
    ControllerDescriptor {
        name: "legacy-serviceaccount-token-cleaner",
        aliases: &["legacy-serviceaccount-token-cleaner-controller", "legacy-service-account-token-cleaner"],
        replaces: Some("legacy-serviceaccount-token-cleaner-controller"),
        default_on: true,
        needs: None,
        help: "invalidation, then deletion, of auto-generated legacy service-account token Secrets unused for --legacy-service-account-token-clean-up-period",
        new: |cx| {
            let config = auth::legacytokencleaner::Config {
                clean_up_period: cx.concurrency.legacy_service_account_token_clean_up_period,
                ..Default::default()
            };
            let c = auth::legacytokencleaner::Controller::new(cx.client.clone(), cx.informers, config);
            Ok(forever(c.run()))
        },
    },
    ControllerDescriptor {
        name: "bootstrapsigner",
        aliases: &["bootstrap-signer-controller"],
        replaces: Some("bootstrap-signer-controller"),
        default_on: false,
        needs: None,
        help: "JWS signatures of the kube-public/cluster-info ConfigMap by every bootstrap token for signing",
        new: |cx| {
            let c = auth::bootstrapsigner::Controller::new(cx.client.clone(), cx.informers);
            Ok(forever(c.run()))
        },
    },
    ControllerDescriptor {
        name: "tokencleaner",
        aliases: &["token-cleaner-controller"],
        replaces: Some("token-cleaner-controller"),
        default_on: false,
        needs: None,
        help: "deletion of expired bootstrap token Secrets",
        new: |cx| {
            let c = auth::tokencleaner::Controller::new(cx.client.clone(), cx.informers);
            Ok(forever(c.run()))
        },
    },
    ControllerDescriptor {
        name: "lb-ipam",
        aliases: &[],
        replaces: None,
        default_on: true,
        needs: Some(Setting::LbPool),
        help: "LoadBalancer address allocation from --lb-pool",
        new: |cx| {
            let pool = cx
                .lb_pool
                .clone()
                .ok_or_else(|| Setting::LbPool.missing("lb-ipam"))?;
            let config = endpoint::lbipam::Config::new(pool);
            let c = endpoint::lbipam::Controller::new(cx.client.clone(), cx.informers, config);
            Ok(forever(c.run()))
        },
    },
];

/// A controller loop that never returns, as a [`Task`].
fn forever(run: impl std::future::Future<Output = ()> + Send + 'static) -> Task {
    async move {
        run.await;
        Ok(())
    }
    .boxed()
}

/// The descriptor a name or alias of `--controllers` names.
pub fn lookup(name: &str) -> Result<&'static ControllerDescriptor> {
    let name = name.trim();
    CONTROLLERS
        .iter()
        .find(|d| d.name == name || d.aliases.contains(&name))
        .ok_or_else(|| Error::UnknownController {
            name: name.to_string(),
            known: names().join(", "),
        })
}

/// Every controller's name, in start order.
pub fn names() -> Vec<&'static str> {
    CONTROLLERS.iter().map(|d| d.name).collect()
}

/// The kube-controller-manager controllers kpr's controller-manager replaces when it runs them
/// all (what `cargo xtask cluster up --controllers kpr` turns off upstream).
pub fn replaced_upstream() -> Vec<&'static str> {
    CONTROLLERS.iter().filter_map(|d| d.replaces).collect()
}

/// `--controllers`' help: the syntax and every controller with its line.
pub fn help() -> String {
    let mut out = String::from(
        "Controllers to run, as kube-controller-manager takes them: `*` turns on every controller \
         that is on by default, `name` turns one on, `-name` turns one off (a `-name` wins).\n",
    );
    for d in CONTROLLERS {
        let default = match (d.default_on, d.needs) {
            (false, _) => " (off by default)".to_string(),
            (true, None) => String::new(),
            (true, Some(s)) => format!(" (on by default only with {})", s.flag()),
        };
        let aliases = if d.aliases.is_empty() {
            String::new()
        } else {
            format!(" [also: {}]", d.aliases.join(", "))
        };
        out.push_str(&format!("  {}: {}{default}{aliases}\n", d.name, d.help));
    }
    out
}
