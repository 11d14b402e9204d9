use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

use super::*;
use crate::scheduler::plugins::priority_sort::PrioritySort;
use crate::scheduler::plugins::scheduling_gates::SchedulingGates;

fn pod(name: &str, priority: i32, gates: &[&str]) -> Arc<Pod> {
    let gates: Vec<_> = gates.iter().map(|g| json!({ "name": g })).collect();
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": name},
            "spec": {"containers": [], "priority": priority, "schedulingGates": gates}
        }))
        .unwrap(),
    )
}

fn queue() -> QueueCore {
    let mut pre: HashMap<String, Vec<Arc<dyn PreEnqueuePlugin>>> = HashMap::new();
    pre.insert(
        "default-scheduler".into(),
        vec![Arc::new(SchedulingGates) as Arc<dyn PreEnqueuePlugin>],
    );
    QueueCore::new(Arc::new(PrioritySort), pre, Backoff::default())
}

fn names(q: &mut QueueCore) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(p) = q.pop() {
        out.push(p.pod.metadata.name.clone().unwrap());
        q.done(&out.last().unwrap().clone());
    }
    out
}

/// Pops `name` and fails it with these plugins.
fn fail(q: &mut QueueCore, name: &str, plugins: &[&'static str], now: Instant) {
    let mut info = q.pop().expect("a pod to pop");
    assert_eq!(info.pod.metadata.name.as_deref(), Some(name));
    info.unschedulable_plugins = plugins.iter().copied().collect::<BTreeSet<_>>();
    q.add_unschedulable(info, now);
}

#[test]
fn active_queue_orders_by_priority_then_arrival() {
    let t0 = Instant::now();
    let mut q = queue();
    q.add(pod("low", 0, &[]), t0);
    q.add(pod("high", 100, &[]), t0 + Duration::from_millis(2));
    q.add(pod("low-later", 0, &[]), t0 + Duration::from_millis(3));
    q.add(pod("mid", 50, &[]), t0 + Duration::from_millis(1));
    assert_eq!(names(&mut q), ["high", "mid", "low", "low-later"]);
}

#[test]
fn backoff_doubles_from_initial_to_max() {
    let b = Backoff::default();
    let got: Vec<u64> = (1..=6).map(|a| b.duration(a).as_secs()).collect();
    assert_eq!(got, [1, 2, 4, 8, 10, 10]);
}

#[test]
fn queue_moves_follow_events_backoff_and_timeouts() {
    let t0 = Instant::now();
    let s = |n: u64| t0 + Duration::from_secs(n);
    type Step<'a> = Box<dyn Fn(&mut QueueCore) + 'a>;
    type Case<'a> = (&'a str, Vec<Step<'a>>, Option<Location>);
    let cases: Vec<Case> = vec![
        (
            "gated pod waits in the pool, not active",
            vec![Box::new(|q| q.add(pod("p", 0, &["g"]), t0))],
            Some(Location::Gated),
        ),
        (
            "gated pod becomes active when its gates are removed",
            vec![
                Box::new(|q| q.add(pod("p", 0, &["g"]), t0)),
                Box::new(|q| q.update(pod("p", 0, &[]), s(1))),
            ],
            Some(Location::Active),
        ),
        (
            "gated pod is not moved by cluster events",
            vec![
                Box::new(|q| q.add(pod("p", 0, &["g"]), t0)),
                Box::new(|q| q.on_event(ClusterEvent::NodeAdd, s(1))),
            ],
            Some(Location::Gated),
        ),
        (
            "rejected pod waits for an event",
            vec![
                Box::new(|q| q.add(pod("p", 0, &[]), t0)),
                Box::new(|q| fail(q, "p", &["NodeResourcesFit"], s(1))),
            ],
            Some(Location::Unschedulable),
        ),
        (
            "an event its plugin cares about moves it to backoff while backing off",
            vec![
                Box::new(|q| q.add(pod("p", 0, &[]), t0)),
                Box::new(|q| fail(q, "p", &["NodeResourcesFit"], s(1))),
                Box::new(|q| q.on_event(ClusterEvent::AssignedPodDelete, s(1))),
            ],
            Some(Location::Backoff),
        ),
        (
            "an event after the backoff moves it straight to active",
            vec![
                Box::new(|q| q.add(pod("p", 0, &[]), t0)),
                Box::new(|q| fail(q, "p", &["NodeResourcesFit"], s(1))),
                Box::new(|q| q.on_event(ClusterEvent::NodeAdd, s(5))),
            ],
            Some(Location::Active),
        ),
        (
            "an event no rejecting plugin cares about leaves it",
            vec![
                Box::new(|q| q.add(pod("p", 0, &[]), t0)),
                Box::new(|q| fail(q, "p", &["TaintToleration"], s(1))),
                Box::new(|q| q.on_event(ClusterEvent::AssignedPodDelete, s(5))),
            ],
            Some(Location::Unschedulable),
        ),
        (
            "an event while in flight sends the rejected pod to backoff",
            vec![
                Box::new(|q| q.add(pod("p", 0, &[]), t0)),
                Box::new(|q| {
                    let mut info = q.pop().unwrap();
                    q.on_event(ClusterEvent::NodeAdd, s(1));
                    info.unschedulable_plugins = ["NodeAffinity"].into_iter().collect();
                    q.add_unschedulable(info, s(1));
                }),
            ],
            Some(Location::Backoff),
        ),
        (
            "an update of the pod while in flight sends it to backoff",
            vec![
                Box::new(|q| q.add(pod("p", 0, &[]), t0)),
                Box::new(|q| {
                    let mut info = q.pop().unwrap();
                    q.update(pod("p", 1, &[]), s(1));
                    info.unschedulable_plugins = ["NodeAffinity"].into_iter().collect();
                    q.add_unschedulable(info, s(1));
                }),
            ],
            Some(Location::Backoff),
        ),
        (
            "an error (no rejecting plugin) goes to backoff",
            vec![
                Box::new(|q| q.add(pod("p", 0, &[]), t0)),
                Box::new(|q| fail(q, "p", &[], s(1))),
            ],
            Some(Location::Backoff),
        ),
        (
            "backoff flushes to active once expired (1 s after the first failure)",
            vec![
                Box::new(|q| q.add(pod("p", 0, &[]), t0)),
                Box::new(|q| fail(q, "p", &[], s(1))),
                Box::new(|q| q.flush_backoff(s(2))),
            ],
            Some(Location::Active),
        ),
        (
            "backoff does not flush early",
            vec![
                Box::new(|q| q.add(pod("p", 0, &[]), t0)),
                Box::new(|q| fail(q, "p", &[], s(1))),
                Box::new(|q| q.flush_backoff(s(1) + Duration::from_millis(500))),
            ],
            Some(Location::Backoff),
        ),
        (
            "unschedulable pods are flushed after 5 minutes",
            vec![
                Box::new(|q| q.add(pod("p", 0, &[]), t0)),
                Box::new(|q| fail(q, "p", &["TaintToleration"], s(1))),
                Box::new(|q| q.flush_unschedulable(s(302))),
            ],
            Some(Location::Active),
        ),
        (
            "unschedulable pods are not flushed before 5 minutes",
            vec![
                Box::new(|q| q.add(pod("p", 0, &[]), t0)),
                Box::new(|q| fail(q, "p", &["TaintToleration"], s(1))),
                Box::new(|q| q.flush_unschedulable(s(200))),
            ],
            Some(Location::Unschedulable),
        ),
        (
            "a spec update moves an unschedulable pod",
            vec![
                Box::new(|q| q.add(pod("p", 0, &[]), t0)),
                Box::new(|q| fail(q, "p", &["TaintToleration"], s(1))),
                Box::new(|q| q.update(pod("p", 5, &[]), s(20))),
            ],
            Some(Location::Active),
        ),
        (
            "delete removes it from the pool",
            vec![
                Box::new(|q| q.add(pod("p", 0, &[]), t0)),
                Box::new(|q| fail(q, "p", &["TaintToleration"], s(1))),
                Box::new(|q| q.delete("p")),
            ],
            None,
        ),
    ];
    for (name, steps, want) in cases {
        let mut q = queue();
        for step in &steps {
            step(&mut q);
        }
        assert_eq!(q.location("p"), want, "{name}");
    }
}

#[test]
fn pending_counts_each_queue() {
    let t0 = Instant::now();
    let mut q = queue();
    q.add(pod("a", 0, &[]), t0);
    q.add(pod("b", 0, &["g"]), t0);
    q.add(pod("c", 1, &[]), t0);
    fail(&mut q, "c", &["NodeAffinity"], t0);
    q.add(pod("d", 2, &[]), t0);
    fail(&mut q, "d", &[], t0);
    assert_eq!(
        q.pending(),
        Pending {
            active: 1,
            backoff: 1,
            unschedulable: 1,
            gated: 1
        }
    );
}

#[test]
fn nominations_follow_status_and_preemption() {
    let t0 = Instant::now();
    let mut q = queue();
    let mut p: Pod = (*pod("p", 10, &[])).clone();
    p.status = Some(k8s_openapi::api::core::v1::PodStatus {
        nominated_node_name: Some("n1".into()),
        ..Default::default()
    });
    q.add(Arc::new(p), t0);
    assert_eq!(q.nominated_for("n1").len(), 1, "status nominates");
    // An update without nominatedNodeName keeps the nomination (the write may be in flight).
    q.update(pod("p", 10, &[]), t0);
    assert_eq!(q.nominated_for("n1").len(), 1, "kept on update");
    q.add_nominated(pod("p", 10, &[]), "n2");
    assert!(
        q.nominated_for("n1").is_empty(),
        "moved by a new nomination"
    );
    assert_eq!(q.nominated_for("n2").len(), 1);
    q.delete("p");
    assert!(!q.has_nominated(), "deleted with the pod");
}

/// Upstream's async preemption (SchedulerAsyncPreemption, on since v1.33): a preemptor whose
/// victims' API calls are under way is held by DefaultPreemption's PreEnqueue
/// (IsPodRunningPreemption) whatever moves it, until the watch shows its last victim deleted
/// (v1.35's lastVictimsPendingPreemption); that deletion's event then moves it as its rejecting
/// plugin's hint says.
#[test]
fn preemptor_is_gated_while_its_preemption_runs() {
    let t0 = Instant::now();
    let s = |n: u64| t0 + Duration::from_secs(n);
    type Step<'a> = Box<dyn Fn(&mut QueueCore) + 'a>;
    type Case<'a> = (&'a str, Vec<Step<'a>>, Option<Location>);
    // Pops p, starts its preemption and fails it on NodeResourcesFit, as the cycle does.
    let preempt_and_fail = |q: &mut QueueCore, now: Instant| {
        let mut info = q.pop().expect("p");
        q.begin_preemption("p");
        info.unschedulable_plugins = ["NodeResourcesFit"].into_iter().collect();
        q.add_unschedulable(info, now);
    };
    let cases: Vec<Case> = vec![
        (
            "an earlier victim's deletion during the preemption: gated, not active",
            vec![
                Box::new(|q| q.add(pod("p", 10, &[]), t0)),
                Box::new(move |q| preempt_and_fail(q, s(1))),
                Box::new(|q| q.on_event(ClusterEvent::AssignedPodDelete, s(5))),
            ],
            Some(Location::Gated),
        ),
        (
            "a deletion seen while in flight gates it rather than send it to backoff",
            vec![
                Box::new(|q| q.add(pod("p", 10, &[]), t0)),
                Box::new(|q| {
                    let mut info = q.pop().unwrap();
                    q.begin_preemption("p");
                    q.on_event(ClusterEvent::AssignedPodDelete, s(1));
                    info.unschedulable_plugins = ["NodeResourcesFit"].into_iter().collect();
                    q.add_unschedulable(info, s(1));
                }),
                Box::new(|q| q.flush_backoff(s(3))),
            ],
            Some(Location::Gated),
        ),
        (
            "an update of the gated preemptor (its nomination written) keeps it gated",
            vec![
                Box::new(|q| q.add(pod("p", 10, &[]), t0)),
                Box::new(move |q| preempt_and_fail(q, s(1))),
                Box::new(|q| q.on_event(ClusterEvent::AssignedPodDelete, s(5))),
                Box::new(|q| q.update(pod("p", 11, &[]), s(6))),
            ],
            Some(Location::Gated),
        ),
        (
            "the preemption's end lifts the gate: it waits for the last victim's deletion",
            vec![
                Box::new(|q| q.add(pod("p", 10, &[]), t0)),
                Box::new(move |q| preempt_and_fail(q, s(1))),
                Box::new(|q| q.on_event(ClusterEvent::AssignedPodDelete, s(5))),
                Box::new(|q| q.end_preemption("p")),
            ],
            Some(Location::Unschedulable),
        ),
        (
            "the last victim's deletion after the end moves it",
            vec![
                Box::new(|q| q.add(pod("p", 10, &[]), t0)),
                Box::new(move |q| preempt_and_fail(q, s(1))),
                Box::new(|q| q.end_preemption("p")),
                Box::new(|q| q.on_event(ClusterEvent::AssignedPodDelete, s(5))),
            ],
            Some(Location::Active),
        ),
        (
            "a victim's DisruptionTarget patch or deletionTimestamp (another update of an \
             assigned Pod) moves nothing",
            vec![
                Box::new(|q| q.add(pod("p", 10, &[]), t0)),
                Box::new(move |q| preempt_and_fail(q, s(1))),
                Box::new(|q| q.end_preemption("p")),
                Box::new(|q| q.on_event(ClusterEvent::AssignedPodOtherUpdate, s(5))),
            ],
            Some(Location::Unschedulable),
        ),
        (
            "other Pods' deletions while the last victim is pending leave it gated",
            vec![
                Box::new(|q| q.add(pod("p", 10, &[]), t0)),
                Box::new(move |q| preempt_and_fail(q, s(1))),
                Box::new(|q| q.await_last_victim("p", "v3")),
                Box::new(|q| q.victim_gone("other")),
                Box::new(|q| q.on_event(ClusterEvent::AssignedPodDelete, s(5))),
            ],
            Some(Location::Gated),
        ),
        (
            "the last victim's deletion ends the preemption and its event moves the preemptor",
            vec![
                Box::new(|q| q.add(pod("p", 10, &[]), t0)),
                Box::new(move |q| preempt_and_fail(q, s(1))),
                Box::new(|q| q.await_last_victim("p", "v3")),
                Box::new(|q| q.on_event(ClusterEvent::AssignedPodDelete, s(5))),
                Box::new(|q| q.victim_gone("v3")),
                Box::new(|q| q.on_event(ClusterEvent::AssignedPodDelete, s(6))),
            ],
            Some(Location::Active),
        ),
        (
            "a failed preemption activates the preemptor at once",
            vec![
                Box::new(|q| q.add(pod("p", 10, &[]), t0)),
                Box::new(move |q| preempt_and_fail(q, s(1))),
                Box::new(|q| q.end_preemption("p")),
                Box::new(|q| q.activate("p", s(1))),
            ],
            Some(Location::Active),
        ),
        (
            "deleting the preemptor forgets its preemption",
            vec![
                Box::new(|q| q.add(pod("p", 10, &[]), t0)),
                Box::new(move |q| preempt_and_fail(q, s(1))),
                Box::new(|q| q.delete("p")),
                Box::new(|q| q.add(pod("p", 10, &[]), s(2))),
            ],
            Some(Location::Active),
        ),
    ];
    for (name, steps, want) in cases {
        let mut q = queue();
        for step in &steps {
            step(&mut q);
        }
        assert_eq!(q.location("p"), want, "{name}");
    }
}

/// Which assigned-Pod events move a Pod rejected by each plugin, as upstream's queueing hints
/// for an assigned Pod's add, update and delete: NodeResourcesFit only for a deletion or lowered
/// requests (isSchedulableAfterPodEvent), the affinity and spreading plugins for an add, a label
/// change or a deletion, and nobody for another update (a status patch such as a preemption
/// victim's DisruptionTarget condition, or its deletionTimestamp).
#[test]
fn upstream_queueing_hint_rows_for_assigned_pod_events() {
    use ClusterEvent::*;
    let rows: [(&str, [(ClusterEvent, bool); 5]); 5] = [
        (
            "NodeResourcesFit",
            [
                (AssignedPodAdd, false),
                (AssignedPodLabelUpdate, false),
                (AssignedPodScaleDown, true),
                (AssignedPodOtherUpdate, false),
                (AssignedPodDelete, true),
            ],
        ),
        (
            "InterPodAffinity",
            [
                (AssignedPodAdd, true),
                (AssignedPodLabelUpdate, true),
                (AssignedPodScaleDown, false),
                (AssignedPodOtherUpdate, false),
                (AssignedPodDelete, true),
            ],
        ),
        (
            "PodTopologySpread",
            [
                (AssignedPodAdd, true),
                (AssignedPodLabelUpdate, true),
                (AssignedPodScaleDown, false),
                (AssignedPodOtherUpdate, false),
                (AssignedPodDelete, true),
            ],
        ),
        (
            "NodePorts",
            [
                (AssignedPodAdd, false),
                (AssignedPodLabelUpdate, false),
                (AssignedPodScaleDown, false),
                (AssignedPodOtherUpdate, false),
                (AssignedPodDelete, true),
            ],
        ),
        (
            "TaintToleration",
            [
                (AssignedPodAdd, false),
                (AssignedPodLabelUpdate, false),
                (AssignedPodScaleDown, false),
                (AssignedPodOtherUpdate, false),
                (AssignedPodDelete, false),
            ],
        ),
    ];
    for (plugin, events) in rows {
        for (event, want) in events {
            assert_eq!(
                plugin_interested(plugin, event),
                want,
                "{plugin} on {event:?}"
            );
        }
    }
}

/// Upstream's SchedulerPopFromBackoffQ (on since v1.33): with nothing active, pop takes the
/// unschedulable Pod whose backoff ends first, never one that failed with an error (its own
/// backoff queue upstream) nor one its preemption still gates; an active Pod always comes first.
#[test]
fn pop_takes_from_backoff_when_nothing_is_active() {
    let t0 = Instant::now();
    let ms = |n: u64| t0 + Duration::from_millis(n);
    let popped = |q: &mut QueueCore| q.pop().map(|i| i.pod.metadata.name.clone().unwrap());

    let mut q = queue();
    q.add(pod("late", 0, &[]), ms(0));
    q.add(pod("early", 0, &[]), ms(1));
    q.add(pod("error", 0, &[]), ms(2));
    q.add(pod("gated", 0, &[]), ms(3));
    fail(&mut q, "late", &["NodeResourcesFit"], ms(500));
    fail(&mut q, "early", &["NodeResourcesFit"], ms(100));
    fail(&mut q, "error", &[], ms(100));
    fail(&mut q, "gated", &["NodeResourcesFit"], ms(50));
    q.begin_preemption("gated");
    // A deletion moves the three rejected by NodeResourcesFit to backoff (backing off till 1 s
    // after their failure).
    q.on_event(ClusterEvent::AssignedPodDelete, ms(600));
    for name in ["late", "early", "error"] {
        assert_eq!(q.location(name), Some(Location::Backoff), "{name}");
    }
    assert_eq!(q.location("gated"), Some(Location::Gated));
    q.add(pod("active", 0, &[]), ms(600));
    assert_eq!(popped(&mut q).as_deref(), Some("active"), "active first");
    q.done("active");
    assert_eq!(
        popped(&mut q).as_deref(),
        Some("early"),
        "earliest backoff end"
    );
    q.done("early");
    assert_eq!(popped(&mut q).as_deref(), Some("late"));
    q.done("late");
    assert_eq!(popped(&mut q), None, "errored and preempting pods stay");
    assert_eq!(q.location("error"), Some(Location::Backoff));
    q.end_preemption("gated");
    assert_eq!(popped(&mut q), None, "waits for its last victim's deletion");
    q.on_event(ClusterEvent::AssignedPodDelete, ms(700));
    assert_eq!(popped(&mut q).as_deref(), Some("gated"));
}
