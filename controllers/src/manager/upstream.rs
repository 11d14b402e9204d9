//! kube-controller-manager's own controller list, of the pinned release (v1.34): every name its
//! `--controllers` takes and whether it runs in a cluster like the project's (no cloud provider,
//! default feature gates, `--service-account-private-key-file` given, `--allocate-node-cidrs`
//! not). With [`super::descriptors`]' `replaces` column this says which controllers a cluster
//! still needs kube-controller-manager for, so `cargo xtask cluster up --controllers kpr` starts it
//! only for those (and not at all when there are none) and `--controllers kpr-only` can name what
//! nobody runs.
//!
//! Owns the upstream list only; kpr's own controllers are [`super::descriptors`]'.

use super::descriptors::replaced_upstream;

/// Whether a kube-controller-manager controller runs under `--controllers=*` in such a cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamDefault {
    /// `*` turns it on and it starts.
    Runs,
    /// In `ControllersDisabledByDefault`: only named in `--controllers` turns it on.
    OffByDefault,
    /// `*` turns it on, but it does nothing without a cloud provider.
    NeedsCloud,
    /// `*` turns it on, but its feature gate is off by default in this release.
    NeedsFeatureGate(&'static str),
    /// `*` turns it on, but it returns disabled without this flag (which the clusters here do
    /// not give kube-controller-manager).
    NeedsFlag(&'static str),
}

/// Every controller `kube-controller-manager --help` lists for `--controllers` (v1.34.4), with
/// what `*` does with it here.
pub const UPSTREAM_CONTROLLERS: &[(&str, UpstreamDefault)] = {
    use UpstreamDefault::*;
    &[
        ("bootstrap-signer-controller", OffByDefault),
        ("certificatesigningrequest-approving-controller", Runs),
        ("certificatesigningrequest-cleaner-controller", Runs),
        ("certificatesigningrequest-signing-controller", Runs),
        ("cloud-node-lifecycle-controller", NeedsCloud),
        ("clusterrole-aggregation-controller", Runs),
        ("cronjob-controller", Runs),
        ("daemonset-controller", Runs),
        ("deployment-controller", Runs),
        (
            "device-taint-eviction-controller",
            NeedsFeatureGate("DRADeviceTaints"),
        ),
        ("disruption-controller", Runs),
        ("endpoints-controller", Runs),
        ("endpointslice-controller", Runs),
        ("endpointslice-mirroring-controller", Runs),
        ("ephemeral-volume-controller", Runs),
        ("garbage-collector-controller", Runs),
        ("horizontal-pod-autoscaler-controller", Runs),
        ("job-controller", Runs),
        (
            "kube-apiserver-serving-clustertrustbundle-publisher-controller",
            NeedsFeatureGate("ClusterTrustBundle"),
        ),
        ("legacy-serviceaccount-token-cleaner-controller", Runs),
        ("namespace-controller", Runs),
        ("node-ipam-controller", NeedsFlag("--allocate-node-cidrs")),
        ("node-lifecycle-controller", Runs),
        ("node-route-controller", NeedsCloud),
        ("persistentvolume-attach-detach-controller", Runs),
        ("persistentvolume-binder-controller", Runs),
        ("persistentvolume-expander-controller", Runs),
        ("persistentvolume-protection-controller", Runs),
        ("persistentvolumeclaim-protection-controller", Runs),
        ("pod-garbage-collector-controller", Runs),
        (
            "podcertificaterequest-cleaner-controller",
            NeedsFeatureGate("PodCertificateRequest"),
        ),
        ("replicaset-controller", Runs),
        ("replicationcontroller-controller", Runs),
        ("resourceclaim-controller", Runs),
        ("resourcequota-controller", Runs),
        ("root-ca-certificate-publisher-controller", Runs),
        ("selinux-warning-controller", OffByDefault),
        ("service-cidr-controller", Runs),
        ("service-lb-controller", NeedsCloud),
        ("serviceaccount-controller", Runs),
        ("serviceaccount-token-controller", Runs),
        ("statefulset-controller", Runs),
        (
            "storage-version-migrator-controller",
            NeedsFeatureGate("StorageVersionMigrator"),
        ),
        (
            "storageversion-garbage-collector-controller",
            NeedsFeatureGate("StorageVersionAPI"),
        ),
        ("taint-eviction-controller", Runs),
        ("token-cleaner-controller", OffByDefault),
        ("ttl-after-finished-controller", Runs),
        ("ttl-controller", Runs),
        ("validatingadmissionpolicy-status-controller", Runs),
        ("volumeattributesclass-protection-controller", Runs),
    ]
};

/// The kube-controller-manager controllers that run by default here and kpr has no replacement
/// for: what a cluster without kube-controller-manager lacks. Empty when kpr runs them all.
pub fn not_replaced() -> Vec<&'static str> {
    let replaced = replaced_upstream();
    UPSTREAM_CONTROLLERS
        .iter()
        .filter(|(name, default)| *default == UpstreamDefault::Runs && !replaced.contains(name))
        .map(|(name, _)| *name)
        .collect()
}

/// kube-controller-manager's `--controllers` value that runs what [`not_replaced`] lists and
/// nothing else, or `None` when that is nothing (kube-controller-manager need not run).
pub fn upstream_remainder() -> Option<String> {
    let rest = not_replaced();
    (!rest.is_empty()).then(|| rest.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every controller kpr says it replaces is one kube-controller-manager has: a misspelt
    /// `replaces` would leave the upstream controller running beside kpr's.
    #[test]
    fn every_replaced_name_is_an_upstream_controller() {
        for name in replaced_upstream() {
            assert!(
                UPSTREAM_CONTROLLERS.iter().any(|(n, _)| *n == name),
                "descriptor replaces {name:?}, which kube-controller-manager v1.34 does not have"
            );
        }
    }

    #[test]
    fn the_remainder_lists_exactly_the_running_controllers_kpr_lacks() {
        let rest = not_replaced();
        let replaced = replaced_upstream();
        for (name, default) in UPSTREAM_CONTROLLERS {
            let expected = *default == UpstreamDefault::Runs && !replaced.contains(name);
            assert_eq!(rest.contains(name), expected, "{name}");
        }
        match upstream_remainder() {
            Some(list) => assert_eq!(list.split(',').count(), rest.len()),
            None => assert!(rest.is_empty()),
        }
        // Controllers off by default or without a cloud are never asked of kube-controller-manager.
        assert!(!rest.contains(&"bootstrap-signer-controller"));
        assert!(!rest.contains(&"service-lb-controller"));
    }

    /// The names are kube-controller-manager's `--controllers` list, sorted as its help prints
    /// them, without repeats.
    #[test]
    fn the_list_is_sorted_and_unique() {
        let names: Vec<_> = UPSTREAM_CONTROLLERS.iter().map(|(n, _)| *n).collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(names, sorted);
    }
}
