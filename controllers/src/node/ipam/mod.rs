//! The node IPAM controller (kube-controller-manager v1.34's `node-ipam-controller`,
//! `pkg/controller/nodeipam` with its `RangeAllocator`): with `--allocate-node-cidrs`, every Node
//! without `spec.podCIDRs` gets one CIDR of each cluster CIDR (`--cluster-cidr`, one or one per
//! family), cut to `--node-cidr-mask-size` (or `-ipv4` / `-ipv6`; 24 and 64 by default), written
//! as `spec.podCIDR` and `spec.podCIDRs` with one strategic merge patch.
//!
//! Owns: those two fields (written once, when empty) and the taken-CIDR sets. At start, after the
//! Node cache syncs, the Service ranges (`--service-cluster-ip-range`, one or two) and every
//! Node's existing CIDRs are marked taken, as upstream's constructor does from its Node list; a
//! Node carrying a CIDR outside the cluster CIDRs stops the controller with an error naming the
//! Node, as it stops upstream's constructor. A deleted Node's CIDRs are released. A full range
//! gives the Node a `CIDRNotAvailable` Event (Normal, "Node <name> status is now:
//! CIDRNotAvailable", source `cidrAllocator`) and the Node is retried with back-off; a patch
//! failing three times gives `CIDRAssignmentFailed` and releases the CIDRs.
//!
//! As upstream: the work queue `cidrallocator_node`, 30 workers, allocation in [`cidrset`]'s
//! order (the next free CIDR after the last one handed out), so both allocators fed the same
//! Nodes in the same order assign the same CIDRs. CIDRs patched onto a Node are remembered until
//! the Node cache shows them: another change of the Node synced in between (the differential
//! suite saw one) would otherwise allocate a second time, skipping a CIDR. Metrics: upstream's
//! `node_ipam_controller_cidrset_*` per cluster CIDR.

pub mod cidrset;

use std::sync::{Arc, Mutex, OnceLock};

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use serde_json::json;
use std::sync::atomic::AtomicU64;

use crate::error::{Error, Result};
use crate::runtime::cache::Indexed;
use crate::runtime::events::Recorder;
use crate::runtime::informer::{EventHandlers, Informers};
use crate::runtime::queue::WorkQueue;
use crate::runtime::workers::{run_key_workers, wait_for_caches, SyncKey};

use cidrset::CidrSet;

/// The controller's name in logs.
pub const NAME: &str = "node-ipam-controller";

/// Its Events' source (upstream's range allocator records as `cidrAllocator`).
pub const EVENT_SOURCE: &str = "cidrAllocator";

/// The work queue's name, as upstream.
pub const QUEUE_NAME: &str = "cidrallocator_node";

/// Workers (upstream's `cidrUpdateWorkers`; no flag sets it).
pub const WORKERS: usize = 30;

/// Tries of the CIDR patch (`cidrUpdateRetries`).
const PATCH_TRIES: usize = 3;

/// Default node mask sizes (`defaultNodeMaskCIDRIPv4` / `IPv6`).
pub const DEFAULT_MASK_V4: u8 = 24;
pub const DEFAULT_MASK_V6: u8 = 64;

/// The controller's settings, from kube-controller-manager's flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// The cluster CIDRs (one, or one per family) and the node mask size of each.
    pub cluster_cidrs: [Option<(IpNet, u8)>; 2],
    /// The Service ranges, kept out of the sets.
    pub service_cidrs: [Option<IpNet>; 2],
}

/// The node-ipam flags as given.
#[derive(Debug, Clone, Default)]
pub struct Flags {
    pub allocate_node_cidrs: bool,
    pub cluster_cidr: String,
    pub service_cluster_ip_range: String,
    pub node_cidr_mask_size: Option<u8>,
    pub node_cidr_mask_size_ipv4: Option<u8>,
    pub node_cidr_mask_size_ipv6: Option<u8>,
}

fn is_v6(n: &IpNet) -> bool {
    matches!(n, IpNet::V6(_))
}

impl Config {
    /// `startNodeIpamController`'s checks: `None` without `--allocate-node-cidrs` (the controller
    /// does nothing, as upstream); the cluster CIDRs parsed (`validateCIDRs`: at most two, two
    /// of different families); the mask sizes chosen as `setNodeCIDRMaskSizes` does; the Service
    /// ranges (at most two, two of different families).
    pub fn from_flags(f: &Flags) -> std::result::Result<Option<Config>, String> {
        if !f.allocate_node_cidrs {
            return Ok(None);
        }
        let parse = |list: &str, flag: &str| -> std::result::Result<Vec<IpNet>, String> {
            list.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| {
                    s.parse::<IpNet>()
                        .map(|n| n.trunc())
                        .map_err(|e| format!("{flag}: {s:?} is not a CIDR: {e}"))
                })
                .collect()
        };
        let cluster = parse(&f.cluster_cidr, "--cluster-cidr")?;
        if cluster.is_empty() {
            return Err("--allocate-node-cidrs needs --cluster-cidr".into());
        }
        if cluster.len() > 2 {
            return Err(format!(
                "--cluster-cidr: length of clusterCIDRs is:{} more than max allowed of 2",
                cluster.len()
            ));
        }
        let dual = cluster.len() == 2;
        if dual && is_v6(&cluster[0]) == is_v6(&cluster[1]) {
            return Err("--cluster-cidr: len of ClusterCIDRs==2 and they are not configured as dual stack (at least one from each IPFamily".into());
        }
        let (mut v4, mut v6) = (DEFAULT_MASK_V4, DEFAULT_MASK_V6);
        if dual {
            if f.node_cidr_mask_size.is_some() {
                return Err(
                    "usage of --node-cidr-mask-size is not allowed with dual-stack clusters".into(),
                );
            }
            v4 = f.node_cidr_mask_size_ipv4.unwrap_or(v4);
            v6 = f.node_cidr_mask_size_ipv6.unwrap_or(v6);
        } else if let Some(m) = f.node_cidr_mask_size {
            if f.node_cidr_mask_size_ipv4.is_some() || f.node_cidr_mask_size_ipv6.is_some() {
                return Err("usage of --node-cidr-mask-size-ipv4 and --node-cidr-mask-size-ipv6 is not allowed if --node-cidr-mask-size is set. For dual-stack clusters please unset it and use IPFamily specific flags".into());
            }
            (v4, v6) = (m, m);
        } else {
            let single_v6 = is_v6(&cluster[0]);
            if let Some(m) = f.node_cidr_mask_size_ipv4 {
                if single_v6 {
                    return Err("usage of --node-cidr-mask-size-ipv4 is not allowed for a single-stack IPv6 cluster".into());
                }
                v4 = m;
            }
            if let Some(m) = f.node_cidr_mask_size_ipv6 {
                if !single_v6 {
                    return Err("usage of --node-cidr-mask-size-ipv6 is not allowed for a single-stack IPv4 cluster".into());
                }
                v6 = m;
            }
        }
        let mut cluster_cidrs = [None; 2];
        for (i, c) in cluster.iter().enumerate() {
            let mask = if is_v6(c) { v6 } else { v4 };
            // Checked here so a wrong size fails at start, not at the first Node.
            CidrSet::new(*c, mask).map_err(|e| format!("--cluster-cidr {c}: {e}"))?;
            cluster_cidrs[i] = Some((*c, mask));
        }
        let services = parse(&f.service_cluster_ip_range, "--service-cluster-ip-range")?;
        if services.len() > 2 {
            return Err("--service-cluster-ip-range can not contain more than two entries".into());
        }
        if services.len() == 2 && is_v6(&services[0]) == is_v6(&services[1]) {
            return Err(
                "serviceCIDR and secondaryServiceCIDR are not dualstack (from different IPfamiles)"
                    .into(),
            );
        }
        let mut service_cidrs = [None; 2];
        for (i, s) in services.iter().enumerate() {
            service_cidrs[i] = Some(*s);
        }
        Ok(Some(Config {
            cluster_cidrs,
            service_cidrs,
        }))
    }
}

/// What a Node needs from the allocator ([`plan`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Gone or being deleted: nothing.
    Nothing,
    /// It has CIDRs: mark them taken (`occupyCIDRs`).
    Occupy(Vec<IpNet>),
    /// It has none: allocate one per cluster CIDR.
    Allocate,
}

/// `syncNode` / `AllocateOrOccupyCIDR`'s decision. A CIDR that does not parse is an error
/// naming the Node and the field.
pub fn plan(node: Option<&Node>) -> Result<Step> {
    let Some(node) = node else {
        return Ok(Step::Nothing);
    };
    if node.metadata.deletion_timestamp.is_some() {
        return Ok(Step::Nothing);
    }
    let cidrs = node_cidrs(node)?;
    Ok(if cidrs.is_empty() {
        Step::Allocate
    } else {
        Step::Occupy(cidrs)
    })
}

/// The Node's `spec.podCIDRs`, parsed.
pub fn node_cidrs(node: &Node) -> Result<Vec<IpNet>> {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    node.spec
        .as_ref()
        .and_then(|s| s.pod_cidrs.as_ref())
        .into_iter()
        .flatten()
        .map(|c| {
            // ParseCIDRSloppy: the address need not be the network's.
            c.parse::<IpNet>()
                .map(|n| n.trunc())
                .map_err(|e| Error::Invalid {
                    object: format!("Node {name}"),
                    reason: format!("spec.podCIDRs: {c:?} is not a CIDR: {e}"),
                })
        })
        .collect()
}

/// The allocator's state: one set per cluster CIDR.
#[derive(Debug)]
pub struct Allocator {
    sets: Vec<CidrSet>,
}

impl Allocator {
    /// The sets, with the Service ranges taken (`filterOutServiceRange`: only a range
    /// overlapping a cluster CIDR).
    pub fn new(config: &Config) -> Result<Allocator> {
        let mut sets = Vec::new();
        for (cidr, mask) in config.cluster_cidrs.iter().flatten() {
            let set = CidrSet::new(*cidr, *mask).map_err(|e| Error::Invalid {
                object: format!("--cluster-cidr {cidr}"),
                reason: e.to_string(),
            })?;
            metrics()
                .max
                .get_or_create(&label(&set))
                .set(set.max_cidrs() as i64);
            sets.push(set);
        }
        let mut this = Allocator { sets };
        for service in config.service_cidrs.iter().flatten() {
            for set in &mut this.sets {
                let c = set.cluster();
                let overlaps = c.contains(&service.network()) || service.contains(&c);
                if overlaps && c.max_prefix_len() == service.max_prefix_len() {
                    if let Err(e) = set.occupy(*service) {
                        tracing::error!(controller = NAME, cidr = %c, service = %service, "error filtering out service cidr: {e}");
                    }
                }
            }
            this.observe_usage();
        }
        Ok(this)
    }

    fn observe_usage(&self) {
        for set in &self.sets {
            metrics()
                .usage
                .get_or_create(&label(set))
                .set(set.allocated() as f64 / set.max_cidrs() as f64);
        }
    }

    /// `occupyCIDRs`: the i-th CIDR goes to the i-th set.
    pub fn occupy(&mut self, node: &str, cidrs: &[IpNet]) -> Result<()> {
        let invalid = |reason: String| Error::Invalid {
            object: format!("Node {node}"),
            reason,
        };
        for (i, c) in cidrs.iter().enumerate() {
            let Some(set) = self.sets.get_mut(i) else {
                return Err(invalid(format!("spec.podCIDRs[{i}] {c}: there is no cluster CIDR at that index (--cluster-cidr has {})", cidrs.len().min(i))));
            };
            let n = set
                .occupy(*c)
                .map_err(|e| invalid(format!("spec.podCIDRs[{i}] {c}: {e}")))?;
            metrics()
                .allocations
                .get_or_create(&label(set))
                .inc_by(n as u64);
        }
        self.observe_usage();
        Ok(())
    }

    /// `ReleaseCIDR`.
    pub fn release(&mut self, node: &str, cidrs: &[IpNet]) -> Result<()> {
        for (i, c) in cidrs.iter().enumerate() {
            let Some(set) = self.sets.get_mut(i) else {
                continue;
            };
            let n = set.release(*c).map_err(|e| Error::Invalid {
                object: format!("Node {node}"),
                reason: format!("releasing spec.podCIDRs[{i}] {c}: {e}"),
            })?;
            metrics()
                .releases
                .get_or_create(&label(set))
                .inc_by(n as u64);
        }
        self.observe_usage();
        Ok(())
    }

    /// One CIDR from each set, or `None` when one is full (what was taken from the others is
    /// kept, as upstream does).
    pub fn allocate(&mut self) -> Option<Vec<IpNet>> {
        let mut out = Vec::new();
        for set in &mut self.sets {
            let (c, tries) = set.allocate_next().ok()?;
            let l = label(set);
            metrics().allocations.get_or_create(&l).inc();
            metrics().tries.get_or_create(&l).observe(tries as f64);
            out.push(c);
        }
        self.observe_usage();
        Some(out)
    }
}

/// The metrics' label: `clusterCIDR` (a name the label derive cannot spell).
type CidrLabel = Vec<(String, String)>;

fn label(set: &CidrSet) -> CidrLabel {
    vec![("clusterCIDR".to_string(), set.cluster().to_string())]
}

struct Metrics {
    allocations: Family<CidrLabel, Counter>,
    releases: Family<CidrLabel, Counter>,
    max: Family<CidrLabel, Gauge>,
    usage: Family<CidrLabel, Gauge<f64, AtomicU64>>,
    tries: Family<CidrLabel, Histogram>,
}

fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(|| {
        let m = Metrics {
            allocations: Family::default(),
            releases: Family::default(),
            max: Family::default(),
            usage: Family::default(),
            tries: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(1.0, 5.0, 5))
            }),
        };
        crate::runtime::metrics::with_registry(|r| {
            r.register(
                "node_ipam_controller_cidrset_cidrs_allocations",
                "Counter measuring total number of CIDR allocations.",
                m.allocations.clone(),
            );
            r.register(
                "node_ipam_controller_cidrset_cidrs_releases",
                "Counter measuring total number of CIDR releases.",
                m.releases.clone(),
            );
            // Upstream's spelling.
            r.register(
                "node_ipam_controller_cirdset_max_cidrs",
                "Maximum number of CIDRs that can be allocated.",
                m.max.clone(),
            );
            r.register(
                "node_ipam_controller_cidrset_usage_cidrs",
                "Gauge measuring percentage of allocated CIDRs.",
                m.usage.clone(),
            );
            r.register(
                "node_ipam_controller_cidrset_allocation_tries_per_request",
                "Number of endpoints added on each Service sync",
                m.tries.clone(),
            );
        });
        m
    })
}

/// The running controller.
pub struct Controller {
    client: Client,
    recorder: Recorder,
    nodes: Arc<Indexed<Node>>,
    queue: Arc<WorkQueue<String>>,
    allocator: Mutex<Allocator>,
    /// Deletions seen before the start-up occupy pass, released after it.
    started: Mutex<bool>,
    /// CIDRs patched onto a Node that the Node cache does not show yet: a sync of that Node in
    /// between (another change of it queued it again) must not allocate a second time.
    written: Mutex<std::collections::HashMap<String, Vec<IpNet>>>,
}

impl Controller {
    /// Builds the sets and registers the handlers on the Node informer.
    pub fn new(client: Client, informers: &Informers, config: &Config) -> Result<Arc<Controller>> {
        let informer = informers.get::<Node>();
        let this = Arc::new(Controller {
            recorder: Recorder::new(client.clone(), EVENT_SOURCE),
            client,
            nodes: informer.cache(),
            queue: WorkQueue::new(QUEUE_NAME),
            allocator: Mutex::new(Allocator::new(config)?),
            started: Mutex::new(false),
            written: Mutex::default(),
        });
        informer.on_events_of(
            &this,
            EventHandlers {
                added: |c, n| c.enqueue(n),
                updated: |c, _, n| c.enqueue(n),
                deleted: |c, n| c.release(n),
            },
        );
        Ok(this)
    }

    fn enqueue(&self, node: &Node) {
        if let Some(name) = node.metadata.name.clone() {
            self.queue.add(name);
        }
    }

    fn release(&self, node: &Node) {
        // Before the start-up pass the Node was never occupied: nothing to release.
        if !*self.started.lock().expect("started lock") {
            return;
        }
        let name = node.metadata.name.as_deref().unwrap_or_default();
        let written = self.written.lock().expect("written lock").remove(name);
        let result = node_cidrs(node).and_then(|cidrs| {
            // Deleted before the cache showed the CIDRs written to it: those are the ones.
            let cidrs = if cidrs.is_empty() {
                written.unwrap_or_default()
            } else {
                cidrs
            };
            self.allocator
                .lock()
                .expect("allocator lock")
                .release(name, &cidrs)
        });
        if let Err(e) = result {
            tracing::error!(
                controller = NAME,
                "error while processing CIDR Release: {e}"
            );
        }
    }

    /// Waits for the Node cache, occupies what the Nodes carry, then runs the workers.
    pub async fn run(self: Arc<Self>) -> Result<()> {
        wait_for_caches(NAME, &[&*self.nodes]).await;
        {
            let mut allocator = self.allocator.lock().expect("allocator lock");
            let mut nodes = self.nodes.all();
            nodes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
            for node in nodes {
                let cidrs = node_cidrs(&node)?;
                if !cidrs.is_empty() {
                    let name = node.metadata.name.as_deref().unwrap_or_default();
                    allocator.occupy(name, &cidrs)?;
                }
            }
            *self.started.lock().expect("started lock") = true;
        }
        tracing::info!(controller = NAME, "controller started");
        run_key_workers(&self, &self.queue, WORKERS).await;
        Ok(())
    }

    /// Stops the workers.
    pub fn shut_down(&self) {
        self.queue.shut_down();
    }

    fn status_event(&self, node: &Node, status: &str) {
        let name = node.metadata.name.clone().unwrap_or_default();
        self.recorder.publish(
            &ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(name.clone()),
                uid: node.metadata.uid.clone(),
                ..Default::default()
            },
            false,
            status,
            format!("Node {name} status is now: {status}"),
        );
    }

    /// `updateCIDRsAllocation`: the CIDRs patched in, tried [`PATCH_TRIES`] times; a Node
    /// that got CIDRs meanwhile keeps them and ours are released.
    async fn assign(&self, node: &Node, cidrs: Vec<IpNet>) -> Result<()> {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        let strings: Vec<String> = cidrs.iter().map(IpNet::to_string).collect();
        let current = self
            .nodes
            .get("", name)
            .map(|n| node_cidrs(&n))
            .transpose()?
            .unwrap_or_default();
        if current == cidrs {
            return Ok(());
        }
        if !current.is_empty() {
            tracing::error!(
                controller = NAME,
                node = name,
                "node already has a CIDR allocated; releasing the new one"
            );
            let _ = self
                .allocator
                .lock()
                .expect("allocator lock")
                .release(name, &cidrs);
            return Ok(());
        }
        let api: Api<Node> = Api::all(self.client.clone());
        let patch = json!({"spec": {"podCIDR": strings[0], "podCIDRs": strings}});
        let mut last = None;
        for _ in 0..PATCH_TRIES {
            match api
                .patch(name, &PatchParams::default(), &Patch::Strategic(&patch))
                .await
            {
                Ok(_) => {
                    self.written
                        .lock()
                        .expect("written lock")
                        .insert(name.to_string(), cidrs.clone());
                    tracing::info!(controller = NAME, node = name, pod_cidrs = ?strings, "set node PodCIDR");
                    return Ok(());
                }
                Err(e) => last = Some(e),
            }
        }
        let e = last.expect("tried");
        self.status_event(node, "CIDRAssignmentFailed");
        let timeout = matches!(&e, kube::Error::Api(s) if s.code == 504);
        if !timeout {
            let _ = self
                .allocator
                .lock()
                .expect("allocator lock")
                .release(name, &cidrs);
        }
        Err(Error::kube(
            "patching spec.podCIDRs of",
            format!("Node {name}"),
            e,
        ))
    }
}

impl SyncKey for Controller {
    async fn sync(&self, name: &str) -> Result<()> {
        let node = self.nodes.get("", name);
        match plan(node.as_deref())? {
            Step::Nothing => Ok(()),
            Step::Occupy(cidrs) => {
                self.written.lock().expect("written lock").remove(name);
                self.allocator
                    .lock()
                    .expect("allocator lock")
                    .occupy(name, &cidrs)
            }
            Step::Allocate => {
                if self
                    .written
                    .lock()
                    .expect("written lock")
                    .contains_key(name)
                {
                    return Ok(()); // Written already; the cache has not caught up.
                }
                let node = node.expect("planned from a Node");
                let Some(cidrs) = self.allocator.lock().expect("allocator lock").allocate() else {
                    self.status_event(&node, "CIDRNotAvailable");
                    return Err(Error::Invalid {
                        object: format!("Node {name}"),
                        reason: "failed to allocate spec.podCIDRs: no remaining CIDRs in the cluster CIDR".into(),
                    });
                };
                self.assign(&node, cidrs).await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(cluster: &str) -> Flags {
        Flags {
            allocate_node_cidrs: true,
            cluster_cidr: cluster.into(),
            ..Default::default()
        }
    }

    /// `setNodeCIDRMaskSizes` / `validateCIDRs` cases.
    #[test]
    fn flags_are_checked_as_kube_controller_manager_does() {
        assert_eq!(Config::from_flags(&Flags::default()), Ok(None));
        let c = Config::from_flags(&flags("10.244.0.0/16"))
            .unwrap()
            .unwrap();
        assert_eq!(
            c.cluster_cidrs[0],
            Some(("10.244.0.0/16".parse().unwrap(), 24))
        );
        let c = Config::from_flags(&flags("10.244.0.0/16,fd00:10:244::/56"))
            .unwrap()
            .unwrap();
        assert_eq!(c.cluster_cidrs[1].unwrap().1, 64);
        let mut f = flags("10.244.0.0/16,fd00:10:244::/56");
        f.node_cidr_mask_size = Some(24);
        assert!(Config::from_flags(&f).unwrap_err().contains("dual-stack"));
        f.node_cidr_mask_size = None;
        f.node_cidr_mask_size_ipv4 = Some(26);
        f.node_cidr_mask_size_ipv6 = Some(120);
        assert!(
            Config::from_flags(&f).unwrap_err().contains("too big"),
            "IPv6: at most 16 bits more than the cluster CIDR"
        );
        f.node_cidr_mask_size_ipv6 = Some(72);
        let c = Config::from_flags(&f).unwrap().unwrap();
        assert_eq!(
            (c.cluster_cidrs[0].unwrap().1, c.cluster_cidrs[1].unwrap().1),
            (26, 72)
        );
        assert!(Config::from_flags(&flags("10.0.0.0/16,10.1.0.0/16")).is_err());
        assert!(Config::from_flags(&flags("")).is_err());
        let mut f = flags("10.244.0.0/16");
        f.node_cidr_mask_size_ipv6 = Some(64);
        assert!(Config::from_flags(&f)
            .unwrap_err()
            .contains("single-stack IPv4"));
        let mut f = flags("10.244.0.0/16");
        f.node_cidr_mask_size = Some(25);
        f.node_cidr_mask_size_ipv4 = Some(25);
        assert!(Config::from_flags(&f).is_err());
        let mut f = flags("10.244.0.0/16");
        f.service_cluster_ip_range = "10.96.0.0/16,10.97.0.0/16".into();
        assert!(Config::from_flags(&f).unwrap_err().contains("dualstack"));
    }

    #[test]
    fn service_ranges_inside_the_cluster_cidr_are_never_handed_out() {
        let mut f = flags("10.0.0.0/22");
        f.service_cluster_ip_range = "10.0.1.0/24,fd00::/112".into();
        let c = Config::from_flags(&f).unwrap().unwrap();
        let mut a = Allocator::new(&c).unwrap();
        let got: Vec<String> = std::iter::from_fn(|| a.allocate())
            .map(|v| v[0].to_string())
            .collect();
        assert_eq!(got, ["10.0.0.0/24", "10.0.2.0/24", "10.0.3.0/24"]);
    }

    #[test]
    fn both_families_release_and_occupy() {
        let c = Config::from_flags(&flags("10.244.0.0/23,fd00:10:244::/63"))
            .unwrap()
            .unwrap();
        let mut a = Allocator::new(&c).unwrap();
        let first = a.allocate().unwrap();
        assert_eq!(
            first.iter().map(|n| n.to_string()).collect::<Vec<_>>(),
            ["10.244.0.0/24", "fd00:10:244::/64"]
        );
        let second = a.allocate().unwrap();
        assert_eq!(a.allocate(), None, "full");
        a.release("n", &first).unwrap();
        assert_eq!(a.allocate().unwrap(), first);
        a.release("n", &second).unwrap();
        a.occupy("m", &second).unwrap();
        assert_eq!(a.allocate(), None);
        assert!(a.occupy("x", &["10.0.0.0/24".parse().unwrap()]).is_err());
    }

    #[test]
    fn the_plan_occupies_existing_cidrs_and_skips_deleting_nodes() {
        let node = |v: serde_json::Value| -> Node { serde_json::from_value(v).unwrap() };
        assert_eq!(plan(None).unwrap(), Step::Nothing);
        assert_eq!(
            plan(Some(&node(json!({"metadata": {"name": "a"}})))).unwrap(),
            Step::Allocate
        );
        assert_eq!(
            plan(Some(&node(json!({"metadata": {"name": "a"},
                "spec": {"podCIDRs": ["10.244.3.7/24"]}}))))
            .unwrap(),
            Step::Occupy(vec!["10.244.3.0/24".parse().unwrap()])
        );
        assert_eq!(
            plan(Some(&node(json!({"metadata": {"name": "a",
                "deletionTimestamp": "2026-01-01T00:00:00Z", "finalizers": ["x"]}}))))
            .unwrap(),
            Step::Nothing
        );
        let err = plan(Some(&node(
            json!({"metadata": {"name": "a"}, "spec": {"podCIDRs": ["nope"]}}),
        )))
        .unwrap_err();
        assert!(err.to_string().contains("Node a") && err.to_string().contains("spec.podCIDRs"));
    }
}
