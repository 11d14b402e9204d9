//! The quota evaluators (upstream's `pkg/quota/v1/evaluator/core` and `generic`): which resource
//! names each one tracks, what one object uses, which scopes an object matches, the sum over a
//! namespace's objects, and the status a quota gets from it (`syncResourceQuota`'s arithmetic).
//!
//! Owns only pure functions over objects handed in; where the objects come from is
//! [`super`]'s. Quantities are summed and printed as upstream ([`Quantity`]).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, ResourceQuota, ResourceQuotaStatus, ScopedResourceSelectorRequirement,
    Service,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;
use k8s_openapi::jiff::Timestamp;

use crate::helpers::quantity::{Format, Quantity};
use crate::runtime::cached_pod::{CachedPod, CachedResources};

/// Resource name -> quantity (`corev1.ResourceList`).
pub type ResourceList = BTreeMap<String, Quantity>;

/// The resources the Pod evaluator tracks by name.
const POD_RESOURCES: [&str; 11] = [
    "count/pods",
    "cpu",
    "memory",
    "ephemeral-storage",
    "requests.cpu",
    "requests.memory",
    "requests.ephemeral-storage",
    "limits.cpu",
    "limits.memory",
    "limits.ephemeral-storage",
    "pods",
];
/// Prefixes of Pod resources tracked under any name (huge pages of every size).
const POD_RESOURCE_PREFIXES: [&str; 2] = ["hugepages-", "requests.hugepages-"];
const SERVICE_RESOURCES: [&str; 4] = [
    "services",
    "count/services",
    "services.loadbalancers",
    "services.nodeports",
];
const PVC_RESOURCES: [&str; 2] = ["persistentvolumeclaims", "requests.storage"];
const PVC_COUNT: &str = "count/persistentvolumeclaims";
/// `<class>.storageclass.storage.k8s.io/<resource>`: a PVC resource of one storage class.
pub const STORAGE_CLASS_SUFFIX: &str = ".storageclass.storage.k8s.io/";
/// The annotation that named a claim's class before `storageClassName`.
const BETA_STORAGE_CLASS_ANNOTATION: &str = "volume.beta.kubernetes.io/storage-class";

/// The object counts with a name of their own besides `count/<resource>` (upstream's
/// `legacyObjectCountAliases`), as (resource, alias); all in the core group.
const LEGACY_ALIASES: [(&str, &str); 4] = [
    ("configmaps", "configmaps"),
    ("resourcequotas", "resourcequotas"),
    ("replicationcontrollers", "replicationcontrollers"),
    ("secrets", "secrets"),
];

/// Resources quota never counts (upstream's `DefaultIgnoredResources`).
const IGNORED: [(&str, &str); 1] = [("", "events")];

/// A group and resource (`schema.GroupResource`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupResource {
    /// The API group ("" for the core group).
    pub group: String,
    /// The plural resource name.
    pub resource: String,
}

impl GroupResource {
    /// A core-group resource.
    pub fn core(resource: &str) -> Self {
        Self {
            group: String::new(),
            resource: resource.to_string(),
        }
    }

    /// Its object count name: `count/<resource>` in the core group, else
    /// `count/<resource>.<group>`.
    pub fn count_name(&self) -> String {
        if self.group.is_empty() {
            format!("count/{}", self.resource)
        } else {
            format!("count/{}.{}", self.resource, self.group)
        }
    }
}

impl std::fmt::Display for GroupResource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.group.is_empty() {
            f.write_str(&self.resource)
        } else {
            write!(f, "{}.{}", self.resource, self.group)
        }
    }
}

/// An evaluator: what computes the usage of a set of resource names.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Evaluator {
    /// Pods: compute resources, `pods`, `count/pods`.
    Pods,
    /// Services: `services`, load balancers, node ports.
    Services,
    /// PersistentVolumeClaims: claims and storage, in total and by storage class.
    Claims,
    /// Any other resource's object count (`count/<resource>.<group>`, the legacy aliases).
    Count(GroupResource),
}

/// Whether `name` is an extended resource as quota takes it: not native (a `/` in it and no
/// `kubernetes.io/`), under `requests.` (extended resources cannot be overcommitted, so only
/// requests are quota'd).
fn is_extended_for_quota(name: &str) -> bool {
    name.starts_with("requests.") && !is_native(name)
}

fn is_native(name: &str) -> bool {
    !name.contains('/') || name.contains("kubernetes.io/")
}

/// An extended resource a container may request (`helper.IsExtendedResourceName`).
fn is_extended(name: &str) -> bool {
    !is_native(name) && !name.starts_with("requests.")
}

impl Evaluator {
    /// The evaluator tracking resource `name`, if any. A `Count` evaluator exists only for a
    /// resource the API server serves (the caller checks through discovery).
    pub fn of(name: &str) -> Option<Evaluator> {
        if POD_RESOURCES.contains(&name)
            || POD_RESOURCE_PREFIXES.iter().any(|p| name.starts_with(p))
            || is_extended_for_quota(name)
        {
            return Some(Evaluator::Pods);
        }
        if SERVICE_RESOURCES.contains(&name) {
            return Some(Evaluator::Services);
        }
        if name == PVC_COUNT
            || PVC_RESOURCES.contains(&name)
            || PVC_RESOURCES
                .iter()
                .any(|r| name.ends_with(&format!("{STORAGE_CLASS_SUFFIX}{r}")))
        {
            return Some(Evaluator::Claims);
        }
        if let Some((resource, _)) = LEGACY_ALIASES.iter().find(|(_, a)| *a == name) {
            return Some(Evaluator::Count(GroupResource::core(resource)));
        }
        let counted = name.strip_prefix("count/")?;
        let (resource, group) = counted.split_once('.').unwrap_or((counted, ""));
        if resource.is_empty() || IGNORED.contains(&(group, resource)) {
            return None;
        }
        Some(Evaluator::Count(GroupResource {
            group: group.to_string(),
            resource: resource.to_string(),
        }))
    }

    /// Whether this evaluator tracks `name` (upstream's `MatchingResources` of one name).
    pub fn tracks(&self, name: &str) -> bool {
        Evaluator::of(name).as_ref() == Some(self)
    }
}

/// One scope requirement: a quota's `spec.scopes` entry (operator Exists) or a `scopeSelector`
/// expression.
#[derive(Debug, Clone, PartialEq)]
pub struct ScopeRequirement {
    /// The scope name (`Terminating`, `BestEffort`, `PriorityClass`...).
    pub scope: String,
    /// `In`, `NotIn`, `Exists`, `DoesNotExist`.
    pub operator: String,
    /// The values of `In` and `NotIn`.
    pub values: Vec<String>,
}

/// A quota's scope requirements: each of `spec.scopes` as Exists, then its selector's
/// expressions (`getScopeSelectorsFromQuota`'s list; every one must match).
pub fn scope_requirements(quota: &ResourceQuota) -> Vec<ScopeRequirement> {
    let spec = quota.spec.as_ref();
    let mut out: Vec<ScopeRequirement> = spec
        .and_then(|s| s.scopes.as_ref())
        .into_iter()
        .flatten()
        .map(|scope| ScopeRequirement {
            scope: scope.clone(),
            operator: "Exists".into(),
            values: Vec::new(),
        })
        .collect();
    let exprs = spec
        .and_then(|s| s.scope_selector.as_ref())
        .and_then(|s| s.match_expressions.as_ref());
    out.extend(
        exprs
            .into_iter()
            .flatten()
            .map(|e: &ScopedResourceSelectorRequirement| ScopeRequirement {
                scope: e.scope_name.clone(),
                operator: e.operator.clone(),
                values: e.values.clone().unwrap_or_default(),
            }),
    );
    out
}

fn quantities(list: Option<&BTreeMap<String, ApiQuantity>>) -> ResourceList {
    list.into_iter()
        .flatten()
        .filter_map(|(k, v)| Quantity::parse(&v.0).ok().map(|q| (k.clone(), q)))
        .collect()
}

/// `addResourceList`: adds each of `other` into `list`.
fn add_into(list: &mut ResourceList, other: &ResourceList) {
    for (k, v) in other {
        list.entry(k.clone()).and_modify(|q| q.add(v)).or_insert(*v);
    }
}

/// `maxResourceList`: each of `other` that is larger (or missing) replaces `list`'s.
fn max_into(list: &mut ResourceList, other: &ResourceList) {
    for (k, v) in other {
        match list.get(k) {
            Some(q) if q >= v => {}
            _ => {
                list.insert(k.clone(), *v);
            }
        }
    }
}

/// Which of a container's lists: requests or limits.
#[derive(Clone, Copy)]
enum Side {
    Requests,
    Limits,
}

fn side(r: Option<&CachedResources>, side: Side) -> ResourceList {
    quantities(r.and_then(|r| match side {
        Side::Requests => r.requests.as_ref(),
        Side::Limits => r.limits.as_ref(),
    }))
}

/// A Pod's aggregate requests or limits (component-helpers' `PodRequests` / `PodLimits` with
/// in-place resize and Pod-level resources on, as v1.34 defaults them): the containers' sum (each
/// the larger of its spec and what its status says the runtime actuated), the larger of that and
/// any init container's (a non-restartable one plus the restartable ones before it; restartable
/// init containers, sidecars, add to the sum), Pod-level CPU and memory replacing the aggregate,
/// and the overhead: every overhead resource for requests, only those with a limit for limits.
fn pod_aggregate(pod: &CachedPod, which: Side) -> ResourceList {
    let Some(spec) = pod.spec.as_ref() else {
        return ResourceList::new();
    };
    let statuses: BTreeMap<&str, &CachedResources> = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|cs| cs.resources.as_ref().map(|r| (cs.name.as_str(), r)))
        .collect();
    let mut total = ResourceList::new();
    for c in &spec.containers {
        let mut own = side(c.resources.as_ref(), which);
        if let Some(actuated) = statuses.get(c.name.as_str()) {
            max_into(&mut own, &side(Some(actuated), which));
        }
        add_into(&mut total, &own);
    }
    let mut restartable = ResourceList::new();
    let mut init_max = ResourceList::new();
    for c in spec.init_containers.iter().flatten() {
        let own = side(c.resources.as_ref(), which);
        let effective = if c.restart_policy.as_deref() == Some("Always") {
            add_into(&mut total, &own);
            add_into(&mut restartable, &own);
            restartable.clone()
        } else {
            let mut tmp = own;
            add_into(&mut tmp, &restartable);
            tmp
        };
        max_into(&mut init_max, &effective);
    }
    max_into(&mut total, &init_max);
    let pod_level = side(spec.resources.as_ref(), which);
    for (k, v) in pod_level {
        if k == "cpu" || k == "memory" {
            total.insert(k, v);
        }
    }
    let overhead = quantities(spec.overhead.as_ref());
    match which {
        Side::Requests => add_into(&mut total, &overhead),
        Side::Limits => {
            for (k, v) in &overhead {
                if let Some(q) = total.get_mut(k) {
                    q.add(v);
                }
            }
        }
    }
    total
}

/// Whether a Pod is charged for compute resources (`QuotaV1Pod`): not Succeeded or Failed, and
/// not terminating past its grace period (a Pod stuck terminating on a lost node must not block
/// its replacement).
pub fn pod_charged(pod: &CachedPod, now: Timestamp) -> bool {
    if pod.is_terminal() {
        return false;
    }
    let meta = &pod.metadata;
    if let (Some(deleted), Some(grace)) = (
        meta.deletion_timestamp.as_ref(),
        meta.deletion_grace_period_seconds,
    ) {
        let end = deleted.0 + Duration::from_secs(u64::try_from(grace).unwrap_or(0));
        if now > end {
            return false;
        }
    }
    true
}

/// What a Pod uses (`PodUsageFunc`): `count/pods` always (every Pod in storage); when it is
/// [charged](pod_charged), `pods`, its requests as `cpu`/`requests.cpu` (memory, ephemeral
/// storage alike), its limits as `limits.*`, huge pages under both names and extended resources
/// as `requests.<name>`.
pub fn pod_usage(pod: &CachedPod, now: Timestamp) -> ResourceList {
    let mut out = ResourceList::from([("count/pods".to_string(), Quantity::from_int(1))]);
    if !pod_charged(pod, now) {
        return out;
    }
    let requests = pod_aggregate(pod, Side::Requests);
    let limits = pod_aggregate(pod, Side::Limits);
    out.insert("pods".into(), Quantity::from_int(1));
    for r in ["cpu", "memory", "ephemeral-storage"] {
        if let Some(q) = requests.get(r) {
            out.insert(r.to_string(), *q);
            out.insert(format!("requests.{r}"), *q);
        }
        if let Some(q) = limits.get(r) {
            out.insert(format!("limits.{r}"), *q);
        }
    }
    for (name, q) in &requests {
        if name.starts_with("hugepages-") {
            out.insert(name.clone(), *q);
            out.insert(format!("requests.{name}"), *q);
        }
        if is_extended(name) {
            out.insert(format!("requests.{name}"), *q);
        }
    }
    out
}

fn positive_cpu_or_memory(list: &ResourceList) -> bool {
    list.iter()
        .any(|(k, v)| (k == "cpu" || k == "memory") && *v > Quantity::zero(Format::DecimalSi))
}

/// Whether a Pod is BestEffort: its `status.qosClass` when the API server set it, else no
/// container, init container or Pod-level resources with a positive CPU or memory request or
/// limit (`GetPodQOS`).
pub fn is_best_effort(pod: &CachedPod) -> bool {
    if let Some(qos) = pod.status.as_ref().and_then(|s| s.qos_class.as_deref()) {
        if !qos.is_empty() {
            return qos == "BestEffort";
        }
    }
    let Some(spec) = pod.spec.as_ref() else {
        return true;
    };
    let lists = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .map(|c| c.resources.as_ref())
        .chain([spec.resources.as_ref()]);
    !lists.into_iter().any(|r| {
        positive_cpu_or_memory(&side(r, Side::Requests))
            || positive_cpu_or_memory(&side(r, Side::Limits))
    })
}

/// `activeDeadlineSeconds` set (to 0 or more): the Pod ends by itself.
pub fn is_terminating(pod: &CachedPod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.active_deadline_seconds)
        .is_some_and(|d| d >= 0)
}

/// Whether a Pod's affinity names other namespaces (a term with `namespaces` or a
/// `namespaceSelector`, required or preferred, affinity or anti-affinity).
pub fn uses_cross_namespace_affinity(pod: &CachedPod) -> bool {
    let Some(aff) = pod.spec.as_ref().and_then(|s| s.affinity.as_deref()) else {
        return false;
    };
    let crosses = |t: &k8s_openapi::api::core::v1::PodAffinityTerm| {
        t.namespaces.as_ref().is_some_and(|n| !n.is_empty()) || t.namespace_selector.is_some()
    };
    let a = aff.pod_affinity.as_ref();
    let anti = aff.pod_anti_affinity.as_ref();
    let required = a
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .into_iter()
        .flatten()
        .chain(
            anti.and_then(|a| {
                a.required_during_scheduling_ignored_during_execution
                    .as_ref()
            })
            .into_iter()
            .flatten(),
        );
    let preferred = a
        .and_then(|a| {
            a.preferred_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .into_iter()
        .flatten()
        .chain(
            anti.and_then(|a| {
                a.preferred_during_scheduling_ignored_during_execution
                    .as_ref()
            })
            .into_iter()
            .flatten(),
        )
        .map(|w| &w.pod_affinity_term);
    required.chain(preferred).any(crosses)
}

/// Whether a Pod matches one scope requirement (`podMatchesScopeFunc`). PriorityClass
/// expressions select on the Pod's `priorityClassName` as a label named `PriorityClass`; an
/// unknown scope matches nothing.
pub fn pod_matches_scope(req: &ScopeRequirement, pod: &CachedPod) -> bool {
    match req.scope.as_str() {
        "Terminating" => is_terminating(pod),
        "NotTerminating" => !is_terminating(pod),
        "BestEffort" => is_best_effort(pod),
        "NotBestEffort" => !is_best_effort(pod),
        "CrossNamespacePodAffinity" => uses_cross_namespace_affinity(pod),
        "PriorityClass" => {
            let class = pod
                .spec
                .as_ref()
                .and_then(|s| s.priority_class_name.as_deref())
                .filter(|c| !c.is_empty());
            match req.operator.as_str() {
                "Exists" => class.is_some(),
                "DoesNotExist" => class.is_none(),
                "In" => class.is_some_and(|c| req.values.iter().any(|v| v == c)),
                "NotIn" => !class.is_some_and(|c| req.values.iter().any(|v| v == c)),
                _ => false,
            }
        }
        _ => false,
    }
}

/// A Service's quota type (`GetQuotaServiceType`): NodePort, LoadBalancer or none.
pub fn service_quota_type(svc: &Service) -> &str {
    let t = svc
        .spec
        .as_ref()
        .and_then(|s| s.type_.as_deref())
        .unwrap_or_default();
    if matches!(t, "NodePort" | "LoadBalancer") {
        t
    } else {
        ""
    }
}

/// What a Service uses: `services` and `count/services` 1; `services.nodeports` its ports for a
/// NodePort or LoadBalancer Service (for a LoadBalancer with `allocateLoadBalancerNodePorts:
/// false`, only the ports that name a node port), else 0; `services.loadbalancers` 1 for a
/// LoadBalancer, else 0.
pub fn service_usage(svc: &Service) -> ResourceList {
    let spec = svc.spec.as_ref();
    let ports = spec.and_then(|s| s.ports.as_ref());
    let all_ports = ports.map_or(0, Vec::len) as i64;
    let mut out = ResourceList::from([
        ("count/services".to_string(), Quantity::from_int(1)),
        ("services".to_string(), Quantity::from_int(1)),
        (
            "services.loadbalancers".to_string(),
            Quantity::zero(Format::DecimalSi),
        ),
        (
            "services.nodeports".to_string(),
            Quantity::zero(Format::DecimalSi),
        ),
    ]);
    match service_quota_type(svc) {
        "NodePort" => {
            out.insert("services.nodeports".into(), Quantity::from_int(all_ports));
        }
        "LoadBalancer" => {
            let node_ports =
                if spec.and_then(|s| s.allocate_load_balancer_node_ports) == Some(false) {
                    ports
                        .into_iter()
                        .flatten()
                        .filter(|p| p.node_port.is_some_and(|n| n != 0))
                        .count() as i64
                } else {
                    all_ports
                };
            out.insert("services.nodeports".into(), Quantity::from_int(node_ports));
            out.insert("services.loadbalancers".into(), Quantity::from_int(1));
        }
        _ => {}
    }
    out
}

/// A claim's storage class: the beta annotation when present, else `storageClassName`.
pub fn claim_class(pvc: &PersistentVolumeClaim) -> &str {
    if let Some(c) = pvc
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(BETA_STORAGE_CLASS_ANNOTATION))
    {
        return c;
    }
    pvc.spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
        .unwrap_or_default()
}

/// The storage a claim is charged: its request rounded up to whole bytes, or what the status
/// says was allocated when that is larger (a failed expansion being recovered).
pub fn claim_storage(pvc: &PersistentVolumeClaim) -> Option<Quantity> {
    let request = pvc
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .and_then(|q| Quantity::parse(&q.0).ok())?
        .round_up_whole();
    let allocated = pvc
        .status
        .as_ref()
        .and_then(|s| s.allocated_resources.as_ref())
        .and_then(|r| r.get("storage"))
        .and_then(|q| Quantity::parse(&q.0).ok());
    Some(match allocated {
        Some(a) if a > request => a.round_up_whole(),
        _ => request,
    })
}

/// What a claim uses: `persistentvolumeclaims` and `count/persistentvolumeclaims` 1,
/// `requests.storage`, and both again under its class's names when it has a class.
pub fn claim_usage(pvc: &PersistentVolumeClaim) -> ResourceList {
    let mut out = ResourceList::from([
        ("persistentvolumeclaims".to_string(), Quantity::from_int(1)),
        (PVC_COUNT.to_string(), Quantity::from_int(1)),
    ]);
    let class = claim_class(pvc);
    if !class.is_empty() {
        out.insert(
            format!("{class}{STORAGE_CLASS_SUFFIX}persistentvolumeclaims"),
            Quantity::from_int(1),
        );
    }
    if let Some(storage) = claim_storage(pvc) {
        out.insert("requests.storage".into(), storage);
        if !class.is_empty() {
            out.insert(
                format!("{class}{STORAGE_CLASS_SUFFIX}requests.storage"),
                storage,
            );
        }
    }
    out
}

/// Whether a claim change must resync its namespace's quotas (`RequiresQuotaReplenish`): its
/// allocated storage changed.
pub fn claim_needs_replenish(old: &PersistentVolumeClaim, new: &PersistentVolumeClaim) -> bool {
    let allocated = |p: &PersistentVolumeClaim| {
        p.status
            .as_ref()
            .and_then(|s| s.allocated_resources.as_ref())
            .and_then(|r| r.get("storage"))
            .and_then(|q| Quantity::parse(&q.0).ok())
    };
    allocated(old) != allocated(new)
}

/// The usage of `resources` (one evaluator's) over a namespace's `items`
/// (`CalculateUsageStats`): each resource starts at 0 and every item matching every scope
/// requirement adds its usage. Evaluators other than the Pods' match no scope, so a scoped quota
/// counts none of their objects (the API server only admits scoped quotas of Pod resources).
pub fn usage_of<T>(
    resources: &BTreeSet<String>,
    scopes: &[ScopeRequirement],
    items: impl IntoIterator<Item = T>,
    matches: impl Fn(&ScopeRequirement, &T) -> bool,
    usage: impl Fn(&T) -> ResourceList,
) -> ResourceList {
    let mut out: ResourceList = resources
        .iter()
        .map(|r| (r.clone(), Quantity::zero(Format::DecimalSi)))
        .collect();
    for item in items {
        if scopes.iter().all(|s| matches(s, &item)) {
            add_into(&mut out, &usage(&item));
        }
    }
    out.retain(|k, _| resources.contains(k));
    out
}

/// A resource list of the API (`spec.hard`, `status.used`) as quantities; unparseable entries
/// (which the API server never stores) are left out.
pub fn parse_list(list: Option<&BTreeMap<String, ApiQuantity>>) -> ResourceList {
    quantities(list)
}

fn to_api(list: &ResourceList) -> BTreeMap<String, ApiQuantity> {
    list.iter()
        .map(|(k, v)| (k.clone(), ApiQuantity(v.to_string())))
        .collect()
}

/// Same keys, equal values (`quota.Equals`).
fn equal(a: &ResourceList, b: &ResourceList) -> bool {
    a.len() == b.len() && a.iter().all(|(k, v)| b.get(k) == Some(v))
}

/// The status a quota gets from `new_usage` (the usage of the resources an evaluator computed),
/// or `None` when its status already says so (`syncResourceQuota`): `hard` mirrors `spec.hard`;
/// `used` is the previous `used` with every computed resource replaced, kept to the resources
/// `spec.hard` names. A resource no evaluator tracks keeps what `used` said (nothing, unless the
/// admission plugin put a value there).
pub fn next_status(quota: &ResourceQuota, new_usage: &ResourceList) -> Option<ResourceQuotaStatus> {
    let hard = parse_list(quota.spec.as_ref().and_then(|s| s.hard.as_ref()));
    let status = quota.status.as_ref();
    let old_hard = status.and_then(|s| s.hard.as_ref());
    let old_used = status.and_then(|s| s.used.as_ref());
    let mut dirty =
        old_hard.is_none() || old_used.is_none() || !equal(&hard, &parse_list(old_hard));
    let previous = parse_list(old_used);
    let mut used = previous.clone();
    for (k, v) in new_usage {
        used.insert(k.clone(), *v);
    }
    used.retain(|k, _| hard.contains_key(k));
    dirty = dirty || !equal(&used, &previous);
    dirty.then(|| ResourceQuotaStatus {
        hard: Some(to_api(&hard)),
        used: Some(to_api(&used)),
    })
}

/// Whether a quota must be synced before the others (`addQuota`'s priority): its `spec.hard`
/// differs from `status.hard`, or `status.hard` names a resource `status.used` lacks that an
/// evaluator tracks (`tracked` says which do).
pub fn needs_priority(quota: &ResourceQuota, tracked: impl Fn(&str) -> bool) -> bool {
    let hard = parse_list(quota.spec.as_ref().and_then(|s| s.hard.as_ref()));
    let status = quota.status.as_ref();
    let status_hard = status.and_then(|s| s.hard.as_ref());
    if !equal(&hard, &parse_list(status_hard)) {
        return true;
    }
    let used = status.and_then(|s| s.used.as_ref());
    status_hard
        .into_iter()
        .flatten()
        .any(|(name, _)| !used.is_some_and(|u| u.contains_key(name)) && tracked(name))
}
