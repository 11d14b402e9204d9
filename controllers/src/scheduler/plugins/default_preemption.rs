//! DefaultPreemption, as kube-scheduler v1.34's `defaultpreemption` plugin and the preemption
//! `Evaluator` it runs: when no node passed Filter, decide whether the Pod may preempt, simulate
//! evicting lower-priority Pods on the nodes whose failure preemption could fix (status
//! Unschedulable, never UnschedulableAndUnresolvable), and pick one node and its victims.
//!
//! Per node (`selectVictimsOnNode`): remove every lower-priority Pod, run the profile's Filter
//! plugins through [`FilterRunner`] (with the PreFilter states updated by `remove_pod`), then
//! reprieve as many Pods as possible, those whose eviction would violate a PodDisruptionBudget
//! first, each group by priority descending. Candidates are searched from a random offset until
//! `max(numNodes * minCandidateNodesPercentage / 100, minCandidateNodesAbsolute)` are found with
//! at least one not violating a PDB; `pickOneNodeForPreemption` orders them by fewest PDB
//! violations, lowest highest-victim priority, smallest priority sum, fewest victims, latest start
//! of the highest-priority victims, then the first found.
//!
//! Owns no state and performs no API call: the runtime evicts the victims, sets the preemptor's
//! nominatedNodeName and clears lower-priority nominations on that node. The dry run walks nodes
//! in order (upstream runs it in parallel and stops at whatever the workers found first); the
//! random offset is injectable ([`DefaultPreemption::with_offset`]) for tests.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use rand::Rng;

use crate::helpers::selector::Selector;
use crate::scheduler::framework::{
    ClusterObjects, Code, CycleState, FilterRunner, NodeInfo, Plugin, PodInfo, PostFilterPlugin,
    PostFilterResult, Snapshot, Status,
};
use crate::scheduler::plugin_args::DefaultPreemptionArgs;

/// The plugin's name in configurations and reasons.
pub const NAME: &str = "DefaultPreemption";

/// The status of a node with no lower-priority Pod to evict.
pub const NO_VICTIMS: &str = "No preemption victims found for incoming pod";
/// The status of the nodes preemption did not consider.
pub const NOT_HELPFUL: &str = "Preemption is not helpful for scheduling";

/// Picks the dry run's starting offset in `0..n` (`rand.Int31n`).
pub type OffsetSource = Box<dyn Fn(usize) -> usize + Send + Sync>;

/// The DefaultPreemption plugin.
pub struct DefaultPreemption {
    args: DefaultPreemptionArgs,
    objects: Arc<dyn ClusterObjects>,
    offset: OffsetSource,
}

impl DefaultPreemption {
    /// Builds the plugin from its validated args; `objects` provides the PodDisruptionBudgets.
    pub fn new(args: DefaultPreemptionArgs, objects: Arc<dyn ClusterObjects>) -> Self {
        DefaultPreemption {
            args,
            objects,
            offset: Box::new(|n| rand::thread_rng().gen_range(0..n)),
        }
    }

    /// Replaces the random starting offset of the candidate search (tests).
    pub fn with_offset(mut self, offset: impl Fn(usize) -> usize + Send + Sync + 'static) -> Self {
        self.offset = Box::new(offset);
        self
    }

    /// The effective args.
    pub fn args(&self) -> &DefaultPreemptionArgs {
        &self.args
    }

    /// `calculateNumCandidates`.
    pub fn num_candidates(&self, num_nodes: usize) -> usize {
        let n = num_nodes * self.args.min_candidate_nodes_percentage as usize / 100;
        n.max(self.args.min_candidate_nodes_absolute as usize)
            .min(num_nodes)
    }
}

impl Plugin for DefaultPreemption {
    fn name(&self) -> &'static str {
        NAME
    }
}

fn priority(pod: &Pod) -> i64 {
    i64::from(pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0))
}

/// The Pod's start time in nanoseconds; a Pod not started yet counts as starting now, i.e. after
/// every started one.
fn start_time(pod: &Pod) -> i128 {
    pod.status
        .as_ref()
        .and_then(|s| s.start_time.as_ref())
        .map_or(i128::MAX, |t| t.0.as_nanosecond())
}

/// `MoreImportantPod`: higher priority, then earlier start.
fn more_important(a: &Pod, b: &Pod) -> std::cmp::Ordering {
    priority(b)
        .cmp(&priority(a))
        .then_with(|| start_time(a).cmp(&start_time(b)))
}

/// Deleted, with the DisruptionTarget condition the scheduler sets when preempting.
fn terminating_by_preemption(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "DisruptionTarget"))
            .is_some_and(|c| {
                c.status == "True" && c.reason.as_deref() == Some("PreemptionByScheduler")
            })
}

/// One node the Pod fits on after evicting `victims`.
#[derive(Debug, Clone)]
struct Candidate {
    node: String,
    /// Sorted by importance, highest first.
    victims: Vec<Arc<Pod>>,
    pdb_violations: usize,
}

/// The PDBs of one namespace with their parsed selectors (an invalid or empty selector matches
/// nothing, so such PDBs are left out).
struct Budgets(Vec<(Arc<PodDisruptionBudget>, Selector)>);

impl Budgets {
    fn load(objects: &dyn ClusterObjects, namespace: &str) -> Budgets {
        Budgets(
            objects
                .pod_disruption_budgets(namespace)
                .into_iter()
                .filter_map(|pdb| {
                    let sel = pdb.spec.as_ref().and_then(|s| s.selector.as_ref())?;
                    let parsed = Selector::parse(Some(sel)).ok()?;
                    (!parsed.is_everything()).then_some((pdb, parsed))
                })
                .collect(),
        )
    }
}

/// `filterPodsWithPDBViolation`: splits the (sorted) Pods into those whose eviction would take a
/// matching PDB's disruptionsAllowed below zero and the rest, keeping their order.
fn split_by_pdb_violation(
    pods: Vec<PodInfo>,
    budgets: &HashMap<String, Budgets>,
) -> (Vec<PodInfo>, Vec<PodInfo>) {
    let mut allowed: HashMap<(String, usize), i64> = HashMap::new();
    let (mut violating, mut ok) = (Vec::new(), Vec::new());
    for p in pods {
        let mut violated = false;
        let labels = p.pod.metadata.labels.as_ref();
        if labels.is_some_and(|l| !l.is_empty()) {
            let ns = p.namespace().to_string();
            for (i, (pdb, sel)) in budgets
                .get(&ns)
                .map(|b| b.0.as_slice())
                .unwrap_or_default()
                .iter()
                .enumerate()
            {
                if !sel.matches(labels) {
                    continue;
                }
                let status = pdb.status.as_ref();
                if status
                    .and_then(|s| s.disrupted_pods.as_ref())
                    .is_some_and(|d| d.contains_key(p.name()))
                {
                    continue;
                }
                let left = allowed
                    .entry((ns.clone(), i))
                    .or_insert_with(|| i64::from(status.map_or(0, |s| s.disruptions_allowed)));
                *left -= 1;
                if *left < 0 {
                    violated = true;
                }
            }
        }
        if violated {
            violating.push(p);
        } else {
            ok.push(p);
        }
    }
    (violating, ok)
}

impl DefaultPreemption {
    /// `PodEligibleToPreemptOthers`.
    fn eligible(
        &self,
        pod: &Pod,
        snapshot: &Snapshot,
        filtered: &HashMap<String, Status>,
    ) -> Result<(), &'static str> {
        if pod
            .spec
            .as_ref()
            .and_then(|s| s.preemption_policy.as_deref())
            == Some("Never")
        {
            return Err("not eligible due to preemptionPolicy=Never.");
        }
        let nominated = pod
            .status
            .as_ref()
            .and_then(|s| s.nominated_node_name.as_deref())
            .unwrap_or_default();
        if nominated.is_empty() {
            return Ok(());
        }
        // A nominated node the filters now call unresolvable (or did not see) is no reason to
        // wait: preempt again elsewhere.
        let code = filtered
            .get(nominated)
            .map_or(Code::UnschedulableAndUnresolvable, |s| s.code);
        if code == Code::UnschedulableAndUnresolvable {
            return Ok(());
        }
        if let Some(node) = snapshot.get(nominated) {
            let p = priority(pod);
            if node
                .pods
                .iter()
                .any(|v| priority(&v.pod) < p && terminating_by_preemption(&v.pod))
            {
                return Err("not eligible due to a terminating pod on the nominated node.");
            }
        }
        Ok(())
    }

    /// `SelectVictimsOnNode`: the victims on one node and how many of them violate a PDB, or the
    /// status that says why preemption cannot help there.
    fn select_victims_on_node(
        &self,
        state: &mut CycleState,
        pod: &Pod,
        node: &NodeInfo,
        budgets: &HashMap<String, Budgets>,
        fw: &dyn FilterRunner,
    ) -> Result<(Vec<Arc<Pod>>, usize), Status> {
        let mut node = node.clone();
        let p = priority(pod);
        let mut potential: Vec<PodInfo> = node
            .pods
            .iter()
            .filter(|v| priority(&v.pod) < p)
            .cloned()
            .collect();
        if potential.is_empty() {
            return Err(Status::unresolvable(NO_VICTIMS));
        }
        let remove = |node: &mut NodeInfo, state: &mut CycleState, v: &PodInfo| {
            node.remove_pod(v.uid());
            let st = fw.remove_pod(state, pod, v, node);
            if st.is_success() {
                Ok(())
            } else {
                Err(Status::error(st.reasons.join(", ")))
            }
        };
        for v in &potential {
            remove(&mut node, state, v)?;
        }
        let st = fw.run_filters(state, pod, &node);
        if !st.is_success() {
            return Err(st);
        }
        potential.sort_by(|a, b| more_important(&a.pod, &b.pod));
        let (violating, non_violating) = split_by_pdb_violation(potential, budgets);
        let both = !violating.is_empty() && !non_violating.is_empty();
        let mut victims: Vec<PodInfo> = Vec::new();
        let mut violations = 0;
        for (group, is_violating) in [(violating, true), (non_violating, false)] {
            for v in group {
                node.add_pod(v.clone());
                let st = fw.add_pod(state, pod, &v, &node);
                if !st.is_success() {
                    return Err(Status::error(st.reasons.join(", ")));
                }
                if !fw.run_filters(state, pod, &node).is_success() {
                    remove(&mut node, state, &v)?;
                    victims.push(v);
                    if is_violating {
                        violations += 1;
                    }
                }
            }
        }
        if both {
            victims.sort_by(|a, b| more_important(&a.pod, &b.pod));
        }
        Ok((victims.into_iter().map(|v| v.pod).collect(), violations))
    }

    /// `DryRunPreemption`: candidates from `offset` on, and the status of every node that is not
    /// one.
    fn dry_run(
        &self,
        state: &CycleState,
        pod: &Pod,
        potential: &[&Arc<NodeInfo>],
        fw: &dyn FilterRunner,
    ) -> (Vec<Candidate>, BTreeMap<String, Status>) {
        let mut namespaces: Vec<&str> = potential
            .iter()
            .flat_map(|n| n.pods.iter().map(|p| p.namespace()))
            .collect();
        namespaces.sort_unstable();
        namespaces.dedup();
        let budgets: HashMap<String, Budgets> = namespaces
            .into_iter()
            .map(|ns| (ns.to_string(), Budgets::load(self.objects.as_ref(), ns)))
            .collect();
        let offset = (self.offset)(potential.len()) % potential.len();
        let wanted = self.num_candidates(potential.len());
        let (mut non_violating, mut violating) = (Vec::new(), Vec::new());
        let mut statuses = BTreeMap::new();
        for i in 0..potential.len() {
            let node = potential[(offset + i) % potential.len()];
            let mut copy = state.clone();
            match self.select_victims_on_node(&mut copy, pod, node, &budgets, fw) {
                Ok((victims, _)) if victims.is_empty() => {
                    let msg = format!("expected at least one victim pod on node {:?}", node.name());
                    statuses.insert(node.name().to_string(), Status::error(msg));
                }
                Ok((victims, pdb_violations)) => {
                    let c = Candidate {
                        node: node.name().to_string(),
                        victims,
                        pdb_violations,
                    };
                    if pdb_violations == 0 {
                        non_violating.push(c);
                    } else {
                        violating.push(c);
                    }
                    if !non_violating.is_empty() && non_violating.len() + violating.len() >= wanted
                    {
                        break;
                    }
                }
                Err(st) => {
                    statuses.insert(node.name().to_string(), st);
                }
            }
        }
        non_violating.extend(violating);
        (non_violating, statuses)
    }
}

/// `pickOneNodeForPreemption` with the default score functions; ties go to the first candidate.
fn pick_one(candidates: &[Candidate]) -> Option<&Candidate> {
    type ScoreFn = fn(&Candidate) -> i128;
    let funcs: [ScoreFn; 5] = [
        |c| -(c.pdb_violations as i128),
        |c| -i128::from(c.victims.first().map_or(0, |p| priority(p))),
        |c| {
            // Priorities shifted to be non-negative, so that fewer Pods of negative priority do not
            // lose to more of them.
            -c.victims
                .iter()
                .map(|p| i128::from(priority(p)) + i128::from(i32::MAX) + 1)
                .sum::<i128>()
        },
        |c| -(c.victims.len() as i128),
        |c| {
            // The earliest start among the highest-priority victims: the later, the better.
            let top = c.victims.iter().map(|p| priority(p)).max().unwrap_or(0);
            c.victims
                .iter()
                .filter(|p| priority(p) == top)
                .map(|p| start_time(p))
                .min()
                .unwrap_or(i128::MIN)
        },
    ];
    let mut remaining: Vec<&Candidate> = candidates.iter().collect();
    for f in funcs {
        if remaining.len() <= 1 {
            break;
        }
        let best = remaining.iter().map(|c| f(c)).max()?;
        remaining.retain(|c| f(c) == best);
    }
    remaining.first().copied()
}

/// `FitError.Error()` for the preemption diagnosis: "0/N nodes are available: " and the sorted
/// histogram of reasons, the nodes without a status counted as [`NOT_HELPFUL`].
fn fit_error(num_nodes: usize, statuses: &BTreeMap<String, Status>) -> String {
    let mut hist: BTreeMap<&str, usize> = BTreeMap::new();
    for st in statuses.values() {
        for r in &st.reasons {
            *hist.entry(r.as_str()).or_default() += 1;
        }
    }
    if statuses.len() < num_nodes {
        *hist.entry(NOT_HELPFUL).or_default() += num_nodes - statuses.len();
    }
    let mut parts: Vec<String> = hist.iter().map(|(r, n)| format!("{n} {r}")).collect();
    parts.sort();
    let mut msg = format!("0/{num_nodes} nodes are available:");
    if !parts.is_empty() {
        msg.push_str(&format!(" {}.", parts.join(", ")));
    }
    msg
}

impl PostFilterPlugin for DefaultPreemption {
    fn post_filter(
        &self,
        state: &CycleState,
        pod: &Pod,
        snapshot: &Snapshot,
        filtered: &HashMap<String, Status>,
        framework: &dyn FilterRunner,
    ) -> (Option<PostFilterResult>, Status) {
        if let Err(msg) = self.eligible(pod, snapshot, filtered) {
            return (
                None,
                Status::unschedulable(format!("preemption: {msg}")).with_plugin(NAME),
            );
        }
        if snapshot.nodes.is_empty() {
            return (
                None,
                Status::error("preemption: no nodes available").with_plugin(NAME),
            );
        }
        // Only nodes a Filter rejected as Unschedulable may be helped by evicting Pods.
        let potential: Vec<&Arc<NodeInfo>> = snapshot
            .nodes
            .iter()
            .filter(|n| {
                filtered
                    .get(n.name())
                    .is_some_and(|s| s.code == Code::Unschedulable)
            })
            .collect();
        let (candidates, statuses) = if potential.is_empty() {
            (Vec::new(), BTreeMap::new())
        } else {
            self.dry_run(state, pod, &potential, framework)
        };
        if candidates.is_empty() {
            if let Some(err) = statuses.values().find(|s| s.code == Code::Error) {
                return (
                    None,
                    Status::error(format!("preemption: {}", err.reasons.join(", ")))
                        .with_plugin(NAME),
                );
            }
            // No node helps: clear any earlier nomination and report why, per node.
            return (
                Some(PostFilterResult {
                    nominated_node: String::new(),
                    victims: Vec::new(),
                }),
                Status::unschedulable(format!(
                    "preemption: {}",
                    fit_error(snapshot.nodes.len(), &statuses)
                ))
                .with_plugin(NAME),
            );
        }
        let Some(best) = pick_one(&candidates) else {
            return (
                None,
                Status::unschedulable("preemption: no candidate node for preemption")
                    .with_plugin(NAME),
            );
        };
        (
            Some(PostFilterResult {
                nominated_node: best.node.clone(),
                victims: best.victims.clone(),
            }),
            Status::success(),
        )
    }
}

#[cfg(test)]
#[path = "default_preemption_tests.rs"]
mod tests;
