//! Named cases for the Deployment plan, and whole rollouts stepped through it against a small
//! model of the API server, the ReplicaSet controller and the kubelets.

use super::*;
use std::collections::BTreeMap;

use crate::runtime::cached_pod::CachedPod;
use serde_json::json;

const T0: i64 = 1_700_000_000;

fn at(s: i64) -> Timestamp {
    Timestamp::from_second(s).unwrap()
}

fn time(s: i64) -> String {
    at(s).to_string()
}

fn rolling(surge: Value, unavailable: Value) -> Value {
    json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable}})
}

fn deployment(replicas: i32, strategy: Value) -> Deployment {
    serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "ns", "uid": "d-uid", "generation": 1},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
                 "strategy": strategy,
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "c", "image": "v1"}]}}}
    }))
    .unwrap()
}

fn image(d: &Deployment) -> String {
    d.spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0]
        .image
        .clone()
        .unwrap()
}

/// A template change (kubectl set image): a new generation.
fn set_image(d: &mut Deployment, image: &str) {
    crate::runtime::testing::set_template_image(&mut d.spec.as_mut().unwrap().template, image);
    *d.metadata.generation.get_or_insert(0) += 1;
}

fn set_replicas(d: &mut Deployment, n: i32) {
    d.spec.as_mut().unwrap().replicas = Some(n);
    *d.metadata.generation.get_or_insert(0) += 1;
}

/// A ReplicaSet of `d` running `image`, `replicas` of them available, last scaled for
/// `scaled_for` (desired-replicas and max-replicas as `scaled_for` would have set them).
fn owned_rs(
    name: &str,
    image: &str,
    replicas: i32,
    created: i64,
    rev: i64,
    scaled_for: &Deployment,
) -> ReplicaSet {
    let desired = super::replicas(scaled_for);
    let max = desired + max_surge(&with_defaults(scaled_for));
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                     "generation": 1, "creationTimestamp": time(created),
                     "labels": {"app": "web", POD_TEMPLATE_HASH: name},
                     "annotations": {REVISION: rev.to_string(), DESIRED_REPLICAS: desired.to_string(),
                                     MAX_REPLICAS: max.to_string()},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web",
                                          "uid": "d-uid", "controller": true, "blockOwnerDeletion": true}]},
        "spec": {"replicas": replicas,
                 "selector": {"matchLabels": {"app": "web", POD_TEMPLATE_HASH: name}},
                 "template": {"metadata": {"labels": {"app": "web", POD_TEMPLATE_HASH: name}},
                              "spec": {"containers": [{"name": "c", "image": image}]}}},
        "status": {"replicas": replicas, "readyReplicas": replicas, "availableReplicas": replicas,
                   "observedGeneration": 1}
    }))
    .unwrap()
}

fn none(_: &str) -> Option<Arc<ReplicaSet>> {
    None
}

fn pod(name: &str, phase: &str) -> Arc<CachedPod> {
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns"},
            "status": {"phase": phase}
        }))
        .unwrap(),
    )
}

/// How fast new Pods become available in [`World::settle`].
#[derive(Clone, Copy)]
enum Ready {
    /// All at once.
    All,
    /// This many per ReplicaSet per step.
    PerStep(i32),
    /// Never.
    Never,
}

/// The API server, ReplicaSet controller and kubelets as far as the plan sees them.
struct World {
    d: Deployment,
    rss: Vec<ReplicaSet>,
    /// ReplicaSets of the namespace the Deployment does not control.
    others: Vec<ReplicaSet>,
    pods: HashMap<String, Vec<Arc<CachedPod>>>,
    now: i64,
    /// Every ReplicaSet size written (created or scaled), in order.
    scaled: Vec<(String, i32)>,
    deleted: Vec<String>,
    events: Vec<String>,
}

impl World {
    fn new(d: Deployment) -> Self {
        World {
            d,
            rss: Vec::new(),
            others: Vec::new(),
            pods: HashMap::new(),
            now: T0 + 1_000,
            scaled: Vec::new(),
            deleted: Vec::new(),
            events: Vec::new(),
        }
    }

    fn with(mut self, rs: ReplicaSet) -> Self {
        self.rss.push(rs);
        self
    }

    fn plan(&self) -> Plan {
        let rss: Vec<Arc<ReplicaSet>> = self.rss.iter().cloned().map(Arc::new).collect();
        let all: Vec<Arc<ReplicaSet>> = rss
            .iter()
            .cloned()
            .chain(self.others.iter().cloned().map(Arc::new))
            .collect();
        let lookup = move |n: &str| all.iter().find(|r| r.name_any() == n).cloned();
        plan(&Input {
            deployment: &self.d,
            replica_sets: &rss,
            pods: &self.pods,
            replica_set_named: &lookup,
            now: at(self.now),
        })
    }

    /// Carries the plan out as the API server would.
    fn apply(&mut self, p: &Plan) {
        for a in &p.actions {
            match a {
                Action::CreateReplicaSet { rs, .. } => {
                    let mut rs = (**rs).clone();
                    let name = rs.name_any();
                    rs.metadata.uid = Some(format!("uid-{name}"));
                    rs.metadata.creation_timestamp = Some(Time(at(self.now)));
                    rs.metadata.generation = Some(1);
                    rs.status = Some(Default::default());
                    self.scaled.push((name, rs_replicas(&rs)));
                    self.rss.push(rs);
                }
                Action::UpdateReplicaSet(rs) => {
                    let name = rs.name_any();
                    let cur = self.rss.iter_mut().find(|r| r.name_any() == name).unwrap();
                    if rs_replicas(cur) != rs_replicas(rs) {
                        self.scaled.push((name, rs_replicas(rs)));
                    }
                    if cur.spec != rs.spec {
                        *cur.metadata.generation.get_or_insert(0) += 1;
                    }
                    cur.spec = rs.spec.clone();
                    cur.metadata.annotations = rs.metadata.annotations.clone();
                }
                Action::DeleteReplicaSet { name } => {
                    self.rss.retain(|r| r.name_any() != *name);
                    self.deleted.push(name.clone());
                }
                Action::UpdateStatus { deployment, .. } => {
                    self.d.status = deployment.status.clone();
                    self.d.metadata.annotations = deployment.metadata.annotations.clone();
                }
                Action::UpdateDeployment(d) => {
                    if d.spec != self.d.spec {
                        *self.d.metadata.generation.get_or_insert(0) += 1;
                    }
                    self.d.spec = d.spec.clone();
                    self.d.metadata.annotations = d.metadata.annotations.clone();
                }
                Action::Event {
                    reason, message, ..
                } => self.events.push(format!("{reason}: {message}")),
            }
        }
    }

    fn sync(&mut self) -> Plan {
        let p = self.plan();
        self.apply(&p);
        self.now += 1;
        p
    }

    /// The ReplicaSet controller and kubelets catch up: every ReplicaSet has spec.replicas Pods
    /// (scale-down removes available ones first), of which `ready` more become available.
    fn settle(&mut self, ready: Ready) {
        for rs in &mut self.rss {
            let n = rs_replicas(rs);
            let generation = rs.metadata.generation;
            let s = rs.status.get_or_insert_with(Default::default);
            let avail = s.available_replicas.unwrap_or(0).min(n);
            let avail = match ready {
                Ready::All => n,
                Ready::PerStep(k) => (avail + k).min(n),
                Ready::Never => avail,
            };
            s.replicas = n;
            s.available_replicas = Some(avail);
            s.ready_replicas = Some(avail);
            s.observed_generation = generation;
        }
    }

    fn size(&self, name: &str) -> i32 {
        rs_replicas(self.rss.iter().find(|r| r.name_any() == name).unwrap())
    }

    fn rs(&self, name: &str) -> &ReplicaSet {
        self.rss.iter().find(|r| r.name_any() == name).unwrap()
    }

    /// The name of the ReplicaSet running `image`.
    fn rs_running(&self, image: &str) -> Option<String> {
        self.rss
            .iter()
            .find(|r| rs_template(r).spec.unwrap().containers[0].image.as_deref() == Some(image))
            .map(|r| r.name_any())
    }

    fn condition(&self, ty: &str) -> Option<(String, String, String)> {
        condition_of(&self.d, ty).map(|c| {
            (
                c.status.clone(),
                c.reason.clone().unwrap_or_default(),
                c.message.clone().unwrap_or_default(),
            )
        })
    }

    fn status(&self) -> DeploymentStatus {
        self.d.status.clone().unwrap_or_default()
    }

    /// Syncs and settles until a sync writes nothing.
    fn run(&mut self, ready: Ready, max_steps: usize) {
        for _ in 0..max_steps {
            self.settle(ready);
            let p = self.sync();
            if p.actions.iter().all(|a| matches!(a, Action::Event { .. })) {
                return;
            }
        }
        panic!("no steady state after {max_steps} steps: {:?}", self.scaled);
    }
}

fn kinds(p: &Plan) -> Vec<&'static str> {
    p.actions
        .iter()
        .map(|a| match a {
            Action::CreateReplicaSet { .. } => "create",
            Action::UpdateReplicaSet(_) => "update-rs",
            Action::DeleteReplicaSet { .. } => "delete-rs",
            Action::UpdateStatus { .. } => "status",
            Action::UpdateDeployment(_) => "update-deployment",
            Action::Event { .. } => "event",
        })
        .collect()
}

/// A Deployment of `replicas` whose one ReplicaSet (`web-old`, image v1, revision 1) is fully
/// available, then given image v2.
fn mid_change(replicas: i32, strategy: Value) -> World {
    let d = deployment(replicas, strategy);
    let old = owned_rs("web-old", "v1", replicas, T0, 1, &d);
    let mut w = World::new(d).with(old);
    set_image(&mut w.d, "v2");
    w
}

#[test]
fn dep1_a_new_deployment_creates_its_replica_set() {
    let mut w = World::new(deployment(3, json!({})));
    let p = w.plan();
    assert_eq!(
        kinds(&p),
        ["create", "event", "status", "status"],
        "DEP-1 actions"
    );
    let Action::CreateReplicaSet { rs, .. } = &p.actions[0] else {
        unreachable!()
    };
    let hash = compute_hash(&w.d.spec.as_ref().unwrap().template, None);
    assert_eq!(
        rs.name_any(),
        format!("web-{hash}"),
        "DEP-1 <deployment>-<hash>"
    );
    let label =
        |m: Option<&BTreeMap<String, String>>| m.and_then(|l| l.get(POD_TEMPLATE_HASH)).cloned();
    let spec = rs.spec.as_ref().unwrap();
    assert_eq!(
        label(rs.metadata.labels.as_ref()),
        Some(hash.clone()),
        "DEP-1 label on the ReplicaSet"
    );
    assert_eq!(
        label(spec.selector.match_labels.as_ref()),
        Some(hash.clone()),
        "DEP-1 label in the selector"
    );
    assert_eq!(
        label(
            spec.template
                .as_ref()
                .unwrap()
                .metadata
                .as_ref()
                .unwrap()
                .labels
                .as_ref()
        ),
        Some(hash.clone()),
        "DEP-1 label in the Pod template"
    );
    assert_eq!(
        spec.replicas,
        Some(3),
        "DEP-1 created at full size (nothing else runs)"
    );
    let ann = rs.metadata.annotations.clone().unwrap();
    assert_eq!(
        ann[REVISION], "1",
        "DEP-1 the first ReplicaSet is revision 1"
    );
    assert_eq!(
        (ann[DESIRED_REPLICAS].as_str(), ann[MAX_REPLICAS].as_str()),
        ("3", "4"),
        "DEP-7 desired 3, max 4"
    );
    let owner = &rs.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (
            owner.kind.as_str(),
            owner.uid.as_str(),
            owner.controller,
            owner.block_owner_deletion
        ),
        ("Deployment", "d-uid", Some(true), Some(true)),
        "CTL-6 controller reference"
    );
    w.apply(&p);
    assert_eq!(
        w.d.metadata.annotations.as_ref().unwrap()[REVISION],
        "1",
        "DEP-1 the Deployment's revision"
    );
    assert_eq!(
        w.condition(PROGRESSING),
        Some((
            "True".into(),
            REASON_NEW_RS_CREATED.into(),
            format!("Created new replica set \"web-{hash}\"")
        )),
        "DEP-18 NewReplicaSetCreated"
    );
    assert_eq!(
        w.events,
        [format!(
            "ScalingReplicaSet: Scaled up replica set web-{hash} from 0 to 3"
        )]
    );
}

#[test]
fn dep1_hash_collisions_bump_collision_count() {
    let d = deployment(2, json!({}));
    let hash = compute_hash(&d.spec.as_ref().unwrap().template, None);
    let name = format!("web-{hash}");
    struct Case {
        name: &'static str,
        taken_by: ReplicaSet,
        want_kinds: &'static [&'static str],
        want_error: bool,
        want_collisions: Option<i32>,
    }
    let mut foreign = owned_rs(&name, "other", 1, T0, 1, &d);
    foreign.metadata.owner_references = None;
    let mut ours_unclaimed = owned_rs(&name, "v1", 2, T0, 1, &d);
    ours_unclaimed.spec.as_mut().unwrap().template =
        Some(d.spec.as_ref().unwrap().template.clone());
    let cases = [
        Case {
            name:
                "DEP-1 a ReplicaSet with another template holds the name: collisionCount 1, retry",
            taken_by: foreign,
            want_kinds: &["status"],
            want_error: true,
            want_collisions: Some(1),
        },
        Case {
            name:
                "DEP-1 our own ReplicaSet with our template holds the name: it is used, not created",
            taken_by: ours_unclaimed,
            want_kinds: &["status", "status"],
            want_error: false,
            want_collisions: None,
        },
    ];
    for c in cases {
        let mut w = World::new(d.clone());
        w.others.push(c.taken_by);
        let p = w.plan();
        assert_eq!(kinds(&p), c.want_kinds, "{}", c.name);
        assert_eq!(p.error.is_some(), c.want_error, "{}: {:?}", c.name, p.error);
        w.apply(&p);
        assert_eq!(w.status().collision_count, c.want_collisions, "{}", c.name);
        if c.want_error {
            let p = w.plan();
            let Action::CreateReplicaSet { rs, .. } = &p.actions[0] else {
                panic!("{}: {:?}", c.name, kinds(&p))
            };
            let moved = compute_hash(&d.spec.as_ref().unwrap().template, Some(1));
            assert_eq!(
                rs.name_any(),
                format!("web-{moved}"),
                "{}: the next name",
                c.name
            );
        }
    }
}

#[test]
fn dep3_dispatch() {
    struct Case {
        name: &'static str,
        world: World,
        want_kinds: &'static [&'static str],
        want_error: bool,
    }
    let mut deleting = World::new(deployment(3, json!({})));
    deleting.d.metadata.deletion_timestamp = Some(Time(at(T0)));
    let unknown = World::new(deployment(3, json!({"type": "BlueGreen"})));
    let steady = {
        let d = deployment(3, json!({}));
        let mut w = World::new(d.clone()).with(owned_rs("web-a", "v1", 3, T0, 1, &d));
        w.run(Ready::All, 5);
        w
    };
    let cases = [
        Case {
            name: "DEP-3 a Deployment being deleted only gets its status written",
            world: deleting,
            want_kinds: &["status"],
            want_error: false,
        },
        Case {
            name: "DEP-3 an unknown strategy type is an error",
            world: unknown,
            want_kinds: &[],
            want_error: true,
        },
        Case {
            name: "CTL-4 a Deployment in its desired state needs no write",
            world: steady,
            want_kinds: &[],
            want_error: false,
        },
    ];
    for c in cases {
        let p = c.world.plan();
        assert_eq!(kinds(&p), c.want_kinds, "{}", c.name);
        assert_eq!(p.error.is_some(), c.want_error, "{}: {:?}", c.name, p.error);
    }
}

/// Upstream's scale cases: (name, deployment replicas and surge, its previous replicas and
/// surge, new ReplicaSet, old ReplicaSets, the sizes expected after `scale`).
#[test]
fn dep6_proportional_scaling() {
    type Rs = (&'static str, i32, i64);
    struct Case {
        name: &'static str,
        now: (i32, i32),
        before: (i32, i32),
        new: Option<Rs>,
        old: &'static [Rs],
        /// desired-replicas annotations that differ from `before`.
        desired: &'static [(&'static str, i32)],
        want: &'static [(&'static str, i32)],
    }
    const NEWER: i64 = T0 + 7200;
    const OLD: i64 = T0 + 3600;
    const OLDER: i64 = T0;
    let cases = [
        Case {
            name: "DEP-6 one active ReplicaSet takes the new size: 10 -> 12",
            now: (12, 0),
            before: (10, 0),
            new: Some(("v1", 10, NEWER)),
            old: &[],
            desired: &[],
            want: &[("v1", 12)],
        },
        Case {
            name: "DEP-6 one active ReplicaSet: 10 -> 5",
            now: (5, 0),
            before: (10, 0),
            new: Some(("v1", 10, NEWER)),
            old: &[],
            desired: &[],
            want: &[("v1", 5)],
        },
        Case {
            name: "DEP-6 proportional: 5 -> 10",
            now: (10, 0),
            before: (5, 0),
            new: Some(("v2", 2, NEWER)),
            old: &[("v1", 3, OLD)],
            desired: &[],
            want: &[("v2", 4), ("v1", 6)],
        },
        Case {
            name: "DEP-6 proportional: 5 -> 3",
            now: (3, 0),
            before: (5, 0),
            new: Some(("v2", 2, NEWER)),
            old: &[("v1", 3, OLD)],
            desired: &[],
            want: &[("v2", 1), ("v1", 2)],
        },
        Case {
            name: "DEP-6 proportional: 9 -> 4",
            now: (4, 0),
            before: (9, 0),
            new: Some(("v2", 8, NEWER)),
            old: &[("v1", 1, OLD)],
            desired: &[],
            want: &[("v2", 4), ("v1", 0)],
        },
        Case {
            name: "DEP-6 proportional: 7 -> 10",
            now: (10, 0),
            before: (7, 0),
            new: Some(("v3", 2, NEWER)),
            old: &[("v2", 3, OLD), ("v1", 2, OLDER)],
            desired: &[],
            want: &[("v3", 3), ("v2", 4), ("v1", 3)],
        },
        Case {
            name: "DEP-6 proportional: 13 -> 8",
            now: (8, 0),
            before: (13, 0),
            new: Some(("v3", 2, NEWER)),
            old: &[("v2", 8, OLD), ("v1", 3, OLDER)],
            desired: &[],
            want: &[("v3", 1), ("v2", 5), ("v1", 2)],
        },
        Case {
            name: "DEP-6 leftover to the first in order (newest when scaling up): 3 -> 4",
            now: (4, 0),
            before: (3, 0),
            new: Some(("v3", 1, NEWER)),
            old: &[("v2", 1, OLD), ("v1", 1, OLDER)],
            desired: &[],
            want: &[("v3", 2), ("v2", 1), ("v1", 1)],
        },
        Case {
            name: "DEP-6 leftover to the first in order (oldest when scaling down): 3 -> 2",
            now: (2, 0),
            before: (3, 0),
            new: Some(("v3", 1, NEWER)),
            old: &[("v2", 1, OLD), ("v1", 1, OLDER)],
            desired: &[],
            want: &[("v3", 1), ("v2", 1), ("v1", 0)],
        },
        Case {
            name: "DEP-6 proportional without a new ReplicaSet: 4 -> 5",
            now: (5, 0),
            before: (4, 0),
            new: None,
            old: &[("v2", 2, OLD), ("v1", 2, OLDER)],
            desired: &[],
            want: &[("v2", 3), ("v1", 2)],
        },
        Case {
            name: "DEP-6 to zero: 6 -> 0",
            now: (0, 0),
            before: (6, 0),
            new: Some(("v3", 3, NEWER)),
            old: &[("v2", 2, OLD), ("v1", 1, OLDER)],
            desired: &[],
            want: &[("v3", 0), ("v2", 0), ("v1", 0)],
        },
        Case {
            name: "DEP-6 none active: the new ReplicaSet takes it all: 0 -> 6",
            now: (6, 0),
            before: (6, 0),
            new: Some(("v3", 0, NEWER)),
            old: &[("v2", 0, OLD), ("v1", 0, OLDER)],
            desired: &[],
            want: &[("v3", 6), ("v2", 0), ("v1", 0)],
        },
        Case {
            name: "DEP-6 a ReplicaSet scaled for another size catches up (max-replicas 3)",
            now: (5, 0),
            before: (5, 0),
            new: Some(("v3", 2, NEWER)),
            old: &[("v2", 1, OLD), ("v1", 1, OLDER)],
            desired: &[("v2", 3)],
            want: &[("v3", 2), ("v2", 2), ("v1", 1)],
        },
        Case {
            name: "DEP-6 with surge: 10 (+2) -> 20 (+2)",
            now: (20, 2),
            before: (10, 2),
            new: Some(("v2", 6, NEWER)),
            old: &[("v1", 6, OLD)],
            desired: &[],
            want: &[("v2", 11), ("v1", 11)],
        },
        Case {
            name: "DEP-6 size and surge change together: 10 (+3) -> 50 (+6)",
            now: (50, 6),
            before: (10, 3),
            new: Some(("v2", 5, NEWER)),
            old: &[("v1", 8, OLD)],
            desired: &[],
            want: &[("v2", 22), ("v1", 34)],
        },
        Case {
            name: "DEP-6 size and template change together: old ones share it, 10 -> 14",
            now: (14, 0),
            before: (10, 0),
            new: None,
            old: &[("v2", 7, NEWER), ("v1", 3, OLD)],
            desired: &[],
            want: &[("v2", 10), ("v1", 4)],
        },
    ];
    for c in cases {
        let d = deployment(c.now.0, rolling(json!(c.now.1), json!(0)));
        let image = |v: &str| {
            if Some(v) == c.new.map(|n| n.0) {
                "v-current".to_string()
            } else {
                format!("image-{v}")
            }
        };
        let mut w = World::new(d.clone());
        set_image(&mut w.d, "v-current");
        for (i, &(v, n, created)) in c.new.iter().chain(c.old.iter()).enumerate() {
            let desired = c
                .desired
                .iter()
                .find(|x| x.0 == v)
                .map_or(c.before.0, |x| x.1);
            let scaled_for = deployment(desired, rolling(json!(c.before.1), json!(0)));
            w.rss.push(owned_rs(
                v,
                &image(v),
                n,
                created,
                i as i64 + 1,
                &scaled_for,
            ));
        }
        let rss: Vec<Arc<ReplicaSet>> = w.rss.iter().cloned().map(Arc::new).collect();
        let pods = HashMap::new();
        let input = Input {
            deployment: &w.d,
            replica_sets: &rss,
            pods: &pods,
            replica_set_named: &none,
            now: at(T0 + 9999),
        };
        let mut p = Planner::new(&input);
        let (new, old) = p
            .get_all_replica_sets_and_sync_revision(false)
            .unwrap_or_else(|_| panic!("{}", c.name));
        p.scale(new, &old);
        for (name, want) in c.want {
            let got = rs_replicas(p.rss.iter().find(|r| r.name_any() == *name).unwrap());
            assert_eq!(got, *want, "{}: {name}", c.name);
        }
    }
}

#[test]
fn dep4_scaling_events_are_read_from_desired_replicas() {
    // A rollout in the middle (new 2, old 2 of 3, surge 1), then kubectl scale 3 -> 6.
    let d = deployment(3, rolling(json!(1), json!(0)));
    let mut w = World::new(d.clone())
        .with(owned_rs("web-old", "v1", 2, T0, 1, &d))
        .with(owned_rs("web-new", "v2", 2, T0 + 10, 2, &d));
    set_image(&mut w.d, "v2");
    let p = w.plan();
    assert!(
        !p.actions
            .iter()
            .any(|a| matches!(a, Action::UpdateReplicaSet(rs) if rs_replicas(rs) > 2)),
        "DEP-4 no scaling event while desired-replicas = spec.replicas: {:?}",
        kinds(&p)
    );
    set_replicas(&mut w.d, 6);
    let p = w.sync();
    assert_eq!(
        (w.size("web-new"), w.size("web-old")),
        (4, 3),
        "DEP-4 desired-replicas 3 != 6: proportional scale to 7 (6 + surge 1): {:?}",
        kinds(&p)
    );
    for name in ["web-new", "web-old"] {
        let ann = w.rs(name).metadata.annotations.clone().unwrap();
        assert_eq!(
            (ann[DESIRED_REPLICAS].as_str(), ann[MAX_REPLICAS].as_str()),
            ("6", "7"),
            "DEP-7 {name} annotated for 6 (+ surge 1)"
        );
    }
}

#[test]
fn dep11_reconcile_new_replica_set() {
    /// Old and new ReplicaSet sizes (all available) → the new one's size after the step.
    struct Case {
        name: &'static str,
        replicas: i32,
        surge: i32,
        old: i32,
        new: i32,
        want: Option<i32>,
    }
    let case = |name, replicas, surge, old, new, want| Case {
        name,
        replicas,
        surge,
        old,
        new,
        want,
    };
    let cases = [
        case(
            "DEP-11 no surge, old at full size: wait",
            10,
            0,
            10,
            0,
            None,
        ),
        case(
            "DEP-11 surge 2 over a full old ReplicaSet: up 2",
            10,
            2,
            10,
            0,
            Some(2),
        ),
        case(
            "DEP-11 room left by a smaller old ReplicaSet: up to 7",
            10,
            2,
            5,
            0,
            Some(7),
        ),
        case("DEP-11 surge used up: wait", 10, 2, 10, 2, None),
        case(
            "DEP-11 above spec.replicas: down to it",
            10,
            2,
            2,
            11,
            Some(10),
        ),
    ];
    for Case {
        name,
        replicas,
        surge,
        old: old_n,
        new: new_n,
        want,
    } in cases
    {
        let d = deployment(replicas, rolling(json!(surge), json!(0)));
        let rss = [
            Arc::new(owned_rs("new", "v1", new_n, T0 + 1, 2, &d)),
            Arc::new(owned_rs("old", "v0", old_n, T0, 1, &d)),
        ];
        let pods = HashMap::new();
        let input = Input {
            deployment: &d,
            replica_sets: &rss,
            pods: &pods,
            replica_set_named: &none,
            now: at(T0),
        };
        let mut p = Planner::new(&input);
        let new = p.rss.iter().position(|r| r.name_any() == "new").unwrap();
        let scaled = p
            .reconcile_new_replica_set(&[0, 1], new)
            .unwrap_or_else(|_| panic!("{name}"));
        assert_eq!(scaled, want.is_some(), "{name}");
        if let Some(n) = want {
            assert_eq!(rs_replicas(&p.rss[new]), n, "{name}");
        }
    }
}

#[test]
fn dep12_reconcile_old_replica_sets() {
    /// Sizes and available Pods of the old and the new ReplicaSet → the old one's size after
    /// the step.
    struct Case {
        name: &'static str,
        replicas: i32,
        unavailable: i32,
        old: (i32, i32),
        new: (i32, i32),
        want: Option<i32>,
    }
    let case = |name, replicas, unavailable, old, new, want| Case {
        name,
        replicas,
        unavailable,
        old,
        new,
        want,
    };
    let cases = [
        case(
            "DEP-12 maxUnavailable 0 (becomes 1 with no surge): down 1",
            10,
            0,
            (10, 10),
            (0, 0),
            Some(9),
        ),
        case(
            "DEP-12 maxUnavailable 2: down 2",
            10,
            2,
            (10, 10),
            (0, 0),
            Some(8),
        ),
        case(
            "DEP-12 2 unhealthy old replicas are cleaned up first",
            10,
            2,
            (10, 8),
            (0, 0),
            Some(8),
        ),
        case(
            "DEP-12 1 unhealthy cleaned up, 1 available scaled down",
            10,
            2,
            (10, 9),
            (0, 0),
            Some(8),
        ),
        case(
            "DEP-12 the new ReplicaSet's unavailable Pods count as missing: no scale-down",
            10,
            2,
            (8, 8),
            (2, 0),
            None,
        ),
        case(
            "DEP-12 more available than desired (status behind): upstream stops, so do we",
            10,
            2,
            (10, 12),
            (0, 0),
            None,
        ),
    ];
    for Case {
        name,
        replicas,
        unavailable,
        old: (old_n, old_avail),
        new: (new_n, new_avail),
        want,
    } in cases
    {
        let d = deployment(replicas, rolling(json!(0), json!(unavailable)));
        let mut old = owned_rs("old", "v0", old_n, T0, 1, &d);
        old.status.as_mut().unwrap().available_replicas = Some(old_avail);
        let mut new = owned_rs("new", "v1", new_n, T0 + 1, 2, &d);
        new.status.as_mut().unwrap().available_replicas = Some(new_avail);
        let rss = [Arc::new(old), Arc::new(new)];
        let pods = HashMap::new();
        let input = Input {
            deployment: &d,
            replica_sets: &rss,
            pods: &pods,
            replica_set_named: &none,
            now: at(T0),
        };
        let mut p = Planner::new(&input);
        let scaled = p.reconcile_old_replica_sets(&[0, 1], vec![0], 1);
        assert_eq!(scaled, want.is_some(), "{name}: {:?}", kinds(&p.out));
        if let Some(n) = want {
            assert_eq!(rs_replicas(&p.rss[0]), n, "{name}");
        }
    }
}

#[test]
fn dep13_three_replicas_alternate_new_and_old() {
    let mut w = mid_change(3, json!({}));
    w.run(Ready::All, 30);
    let new = w.rs_running("v2").unwrap();
    let seq: Vec<String> = w
        .scaled
        .iter()
        .map(|(n, r)| format!("{} {r}", if *n == new { "new" } else { "old" }))
        .collect();
    assert_eq!(
        seq,
        ["new 1", "old 2", "new 2", "old 1", "new 3", "old 0"],
        "DEP-13 the observable sequence"
    );
    let ann = w.d.metadata.annotations.clone().unwrap();
    assert_eq!(
        ann[REVISION], "2",
        "DEP-1 the second template is revision 2"
    );
}

/// Every state of a 10-replica rollout with maxSurge 3 / maxUnavailable 2 stays within
/// 13 Pods and at least 8 available, however fast Pods become ready.
#[test]
fn dep9_rollout_never_exceeds_surge_or_unavailability() {
    for (name, ready) in [
        ("DEP-9 Pods ready at once", Ready::All),
        ("DEP-9 one Pod ready per step", Ready::PerStep(1)),
        ("DEP-9 two Pods ready per step", Ready::PerStep(2)),
    ] {
        let mut w = mid_change(10, rolling(json!(3), json!(2)));
        let check = |w: &World, when: &str| {
            let total: i32 = w.rss.iter().map(rs_replicas).sum();
            let pods: i32 = w.rss.iter().map(rs_status_replicas).sum();
            let available: i32 = w.rss.iter().map(rs_available).sum();
            assert!(
                total <= 13 && pods <= 13,
                "{name}: {total} replicas, {pods} Pods {when}"
            );
            assert!(available >= 8, "{name}: {available} available {when}");
        };
        let mut done = false;
        for step in 0..200 {
            let p = w.sync();
            check(&w, &format!("after sync {step}"));
            // Pods created and deleted, not yet ready.
            w.settle(Ready::Never);
            check(&w, &format!("after Pods of step {step} exist"));
            w.settle(ready);
            check(&w, &format!("after Pods of step {step} are ready"));
            if p.actions.iter().all(|a| matches!(a, Action::Event { .. })) {
                done = true;
                break;
            }
        }
        assert!(done, "{name}: no steady state");
        let new = w.rs_running("v2").unwrap();
        assert_eq!((w.size(&new), w.size("web-old")), (10, 0), "{name}");
        assert_eq!(
            w.scaled.first(),
            Some(&(new.clone(), 3)),
            "{name}: the new ReplicaSet starts at maxSurge"
        );
        assert_eq!(
            w.condition(PROGRESSING).map(|c| c.1),
            Some(REASON_NEW_RS_AVAILABLE.to_string()),
            "{name}"
        );
    }
}

#[test]
fn dep8_recreate_scales_down_waits_then_creates() {
    let mut w = mid_change(3, json!({"type": "Recreate"}));
    w.pods.insert(
        "uid-web-old".into(),
        vec![
            pod("a", "Running"),
            pod("b", "Succeeded"),
            pod("c", "Running"),
        ],
    );
    let p = w.sync();
    assert!(
        !kinds(&p).contains(&"create"),
        "DEP-8 old ReplicaSets go to 0 before anything is created"
    );
    assert_eq!(w.size("web-old"), 0, "DEP-8");
    w.settle(Ready::All);
    let p = w.sync();
    assert!(
        !kinds(&p).contains(&"create"),
        "DEP-8 old Pods still running: wait ({:?})",
        kinds(&p)
    );
    w.pods.insert(
        "uid-web-old".into(),
        vec![pod("b", "Succeeded"), pod("d", "Failed")],
    );
    let p = w.sync();
    assert_eq!(
        kinds(&p).first(),
        Some(&"create"),
        "DEP-8 terminated Pods do not hold the new ReplicaSet back"
    );
    let new = w.rs_running("v2").unwrap();
    assert_eq!(
        w.size(&new),
        3,
        "DEP-8 the new ReplicaSet is created at full size"
    );
    w.run(Ready::All, 10);
    assert_eq!(
        w.condition(PROGRESSING).map(|c| c.1),
        Some(REASON_NEW_RS_AVAILABLE.to_string()),
        "DEP-8 completes"
    );
}

#[test]
fn dep14_revision_history_cleanup() {
    let mut d = deployment(2, json!({}));
    d.spec.as_mut().unwrap().revision_history_limit = Some(2);
    let mut w = World::new(d.clone());
    for rev in 1..=5 {
        let mut rs = owned_rs(
            &format!("r{rev}"),
            &format!("old{rev}"),
            0,
            T0 + rev,
            rev,
            &d,
        );
        if rev == 2 {
            // Still has a Pod: kept although its revision is old.
            rs.status.as_mut().unwrap().replicas = 1;
        }
        if rev == 3 {
            // Its scale-down is not observed yet: kept.
            rs.metadata.generation = Some(2);
        }
        w.rss.push(rs);
    }
    w.rss.push(owned_rs("current", "v1", 2, T0 + 10, 6, &d));
    // Cleanup runs when the status read says complete (here ahead of r2's last Pod).
    w.d.status = Some(
        serde_json::from_value(json!({"observedGeneration": 1, "replicas": 2,
            "updatedReplicas": 2, "availableReplicas": 2}))
        .unwrap(),
    );
    w.sync();
    assert_eq!(
        w.deleted,
        ["r1"],
        "DEP-14 the 3 lowest revisions beyond the limit, only if empty and observed"
    );

    // A paused Deployment is cleaned up too (DEP-5).
    let mut w = World::new(d.clone());
    for rev in 1..=4 {
        w.rss.push(owned_rs(
            &format!("r{rev}"),
            &format!("old{rev}"),
            0,
            T0 + rev,
            rev,
            &d,
        ));
    }
    w.rss.push(owned_rs("current", "v1", 2, T0 + 10, 6, &d));
    w.d.spec.as_mut().unwrap().paused = Some(true);
    w.sync();
    assert_eq!(w.deleted, ["r1", "r2"], "DEP-5 paused Deployments clean up");

    let mut unlimited = d.clone();
    unlimited.spec.as_mut().unwrap().revision_history_limit = Some(i32::MAX);
    let mut w = World::new(unlimited.clone());
    for rev in 1..=4 {
        w.rss.push(owned_rs(
            &format!("r{rev}"),
            &format!("old{rev}"),
            0,
            T0 + rev,
            rev,
            &d,
        ));
    }
    w.rss.push(owned_rs("current", "v1", 2, T0 + 10, 6, &d));
    w.run(Ready::All, 5);
    assert!(w.deleted.is_empty(), "DEP-14 i32::MAX keeps everything");
}

#[test]
fn dep15_rollback_by_template_reuses_the_replica_set_with_a_new_revision() {
    let mut w = mid_change(3, json!({}));
    w.run(Ready::All, 30);
    let v2 = w.rs_running("v2").unwrap();
    assert_eq!((w.size("web-old"), w.size(&v2)), (0, 3));
    // kubectl rollout undo: the template of revision 1 back into the Deployment.
    set_image(&mut w.d, "v1");
    let p = w.sync();
    assert!(
        !kinds(&p).contains(&"create"),
        "DEP-15 no new ReplicaSet: {:?}",
        kinds(&p)
    );
    let ann = w.rs("web-old").metadata.annotations.clone().unwrap();
    assert_eq!(
        (ann[REVISION].as_str(), ann[REVISION_HISTORY].as_str()),
        ("3", "1"),
        "DEP-15 the reused ReplicaSet gets max + 1, its old revision in history (as upstream)"
    );
    assert_eq!(w.d.metadata.annotations.as_ref().unwrap()[REVISION], "3");
    w.settle(Ready::All);
    w.run(Ready::All, 30);
    assert_eq!(
        (w.size("web-old"), w.size(&v2)),
        (3, 0),
        "DEP-15 rolled back"
    );
    assert_eq!(w.rss.len(), 2, "DEP-15 still two ReplicaSets");
}

#[test]
fn dep15_legacy_rollback_annotation() {
    let mut w = mid_change(3, json!({}));
    w.run(Ready::All, 30);
    w.d.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(DEPRECATED_ROLLBACK_TO.into(), "0".into());
    let p = w.sync();
    assert_eq!(
        kinds(&p),
        ["update-deployment", "event"],
        "DEP-15 legacy rollback"
    );
    assert_eq!(
        image(&w.d),
        "v1",
        "DEP-15 revision 0 means the previous one"
    );
    assert!(
        !w.d.metadata
            .annotations
            .as_ref()
            .unwrap()
            .contains_key(DEPRECATED_ROLLBACK_TO),
        "DEP-15 the request is cleared"
    );
    assert_eq!(
        w.events.last().unwrap(),
        "DeploymentRollback: Rolled back deployment \"web\" to revision 1"
    );
    w.d.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(DEPRECATED_ROLLBACK_TO.into(), "42".into());
    w.sync();
    assert_eq!(
        w.events.last().unwrap(),
        "DeploymentRollbackRevisionNotFound: Unable to find the revision to rollback to."
    );
}

#[test]
fn dep16_pause_and_resume() {
    let mut w = mid_change(4, rolling(json!(1), json!(0)));
    w.d.spec.as_mut().unwrap().paused = Some(true);
    let p = w.sync();
    assert!(
        !kinds(&p).contains(&"create"),
        "DEP-16 a paused template change does not roll out"
    );
    assert_eq!(
        w.condition(PROGRESSING),
        Some((
            "Unknown".into(),
            REASON_PAUSED.into(),
            "Deployment is paused".into()
        )),
        "DEP-16"
    );
    set_replicas(&mut w.d, 6);
    w.sync();
    assert_eq!(
        w.size("web-old"),
        6,
        "DEP-16 a paused Deployment still scales"
    );
    w.settle(Ready::All);
    w.d.spec.as_mut().unwrap().paused = Some(false);
    let p = w.plan();
    let Action::UpdateStatus { deployment, .. } = &p.actions[0] else {
        panic!("{:?}", kinds(&p))
    };
    let resumed = condition_of(deployment, PROGRESSING).unwrap();
    assert_eq!(
        (resumed.status.as_str(), resumed.reason.as_deref()),
        ("Unknown", Some(REASON_RESUMED)),
        "DEP-16 resumed"
    );
    assert!(
        kinds(&p).contains(&"create"),
        "DEP-16 resuming continues the rollout"
    );
}

/// Pauses the Deployment (one spec change, one generation).
fn pause(d: &mut Deployment) {
    d.spec.as_mut().unwrap().paused = Some(true);
    *d.metadata.generation.get_or_insert(0) += 1;
}

#[test]
fn dep16_paused_at_zero_replicas() {
    // Issue 37: a Deployment of 1 available replica, then `paused: true, replicas: 0` in one
    // patch. Upstream scales the ReplicaSet to 0, then drops replicas / availableReplicas,
    // observes every generation and keeps Progressing Unknown DeploymentPaused; with no old
    // ReplicaSet and the new one inactive, `FindActiveOrLatest` takes the new one.
    let paused_cond = Some((
        "Unknown".to_string(),
        REASON_PAUSED.to_string(),
        "Deployment is paused".to_string(),
    ));
    let mut w = World::new(deployment(1, json!({})));
    w.run(Ready::All, 10);
    let rs = w.rss[0].name_any();
    assert_eq!(w.status().available_replicas, Some(1));
    w.d.spec.as_mut().unwrap().paused = Some(true);
    set_replicas(&mut w.d, 0);
    assert_eq!(w.d.metadata.generation, Some(2));
    w.sync();
    assert_eq!(w.size(&rs), 0, "the ReplicaSet scaled to 0 while paused");
    assert_eq!(w.condition(PROGRESSING), paused_cond, "DeploymentPaused");
    assert_eq!(w.status().observed_generation, Some(2));
    // The ReplicaSet controller reports 0; the next syncs (no active ReplicaSet, no old one)
    // must neither panic nor keep the old counts.
    w.settle(Ready::All);
    w.sync();
    let st = w.status();
    assert_eq!(
        (
            st.replicas,
            st.available_replicas,
            st.ready_replicas,
            st.updated_replicas
        ),
        (None, None, None, None),
        "replicas and availableReplicas dropped"
    );
    assert_eq!(st.observed_generation, Some(2));
    assert_eq!(w.condition(PROGRESSING), paused_cond);
    let p = w.sync();
    assert!(
        p.actions.is_empty(),
        "steady while paused at 0: {:?}",
        kinds(&p)
    );
    // A later spec change while paused is observed (kubectl rollout status waits for it) and
    // rolls nothing out.
    set_image(&mut w.d, "v2");
    let p = w.sync();
    assert!(!kinds(&p).contains(&"create"), "{:?}", kinds(&p));
    assert_eq!(w.status().observed_generation, Some(3));
    assert_eq!(w.rss.len(), 1);

    // Created with 0 replicas, then paused: the Paused condition comes, the generation is
    // observed.
    let mut w = World::new(deployment(0, json!({})));
    w.run(Ready::All, 10);
    assert_eq!(w.rss.len(), 1, "the ReplicaSet exists, at 0");
    assert_eq!(w.size(&w.rss[0].name_any()), 0);
    pause(&mut w.d);
    w.run(Ready::All, 10);
    assert_eq!(
        w.condition(PROGRESSING),
        paused_cond,
        "paused at 0 replicas"
    );
    assert_eq!(w.status().observed_generation, Some(2));
    assert_eq!(w.status().replicas, None);
}

#[test]
fn dep18_status_and_conditions() {
    // Complete.
    let mut w = mid_change(3, json!({}));
    w.run(Ready::All, 30);
    let new = w.rs_running("v2").unwrap();
    let s = w.status();
    assert_eq!(
        (
            s.observed_generation,
            s.replicas,
            s.updated_replicas,
            s.ready_replicas,
            s.available_replicas,
            s.unavailable_replicas
        ),
        (Some(2), Some(3), Some(3), Some(3), Some(3), None),
        "DEP-18 counts of a complete rollout"
    );
    assert_eq!(
        w.condition(PROGRESSING),
        Some((
            "True".into(),
            REASON_NEW_RS_AVAILABLE.into(),
            format!("ReplicaSet \"{new}\" has successfully progressed.")
        )),
        "DEP-18 complete"
    );
    assert_eq!(
        w.condition(AVAILABLE),
        Some((
            "True".into(),
            REASON_MIN_AVAILABLE.into(),
            "Deployment has minimum availability.".into()
        )),
        "DEP-18 available"
    );

    // Stuck: new Pods never become available.
    let mut w = mid_change(3, json!({}));
    for _ in 0..5 {
        w.sync();
        w.settle(Ready::Never);
    }
    let new = w.rs_running("v2").unwrap();
    assert_eq!(
        w.condition(PROGRESSING).map(|c| c.1),
        Some(REASON_RS_UPDATED.to_string()),
        "DEP-18 progressing"
    );
    let p = w.plan();
    let last = condition_of(&w.d, PROGRESSING)
        .unwrap()
        .last_update_time
        .clone()
        .unwrap()
        .0;
    let left = last.as_second() + 600 - w.now;
    assert_eq!(
        kinds(&p),
        Vec::<&str>::new(),
        "DEP-18 nothing to write while waiting"
    );
    assert_eq!(
        p.requeue,
        Some(Requeue::After(Duration::from_secs(left as u64 + 1))),
        "DEP-18 a resync when the deadline passes"
    );
    w.now = last.as_second() + 601;
    w.sync();
    assert_eq!(
        w.condition(PROGRESSING),
        Some((
            "False".into(),
            REASON_TIMED_OUT.into(),
            format!("ReplicaSet \"{new}\" has timed out progressing.")
        )),
        "DEP-18 ProgressDeadlineExceeded"
    );
    assert_eq!(w.plan().requeue, None, "DEP-18 no resync once timed out");

    // Available False.
    let d = deployment(4, rolling(json!(0), json!(1)));
    let mut rs = owned_rs("web-a", "v1", 4, T0, 1, &d);
    rs.status.as_mut().unwrap().available_replicas = Some(2);
    let mut w = World::new(d).with(rs);
    w.sync();
    assert_eq!(
        w.condition(AVAILABLE),
        Some((
            "False".into(),
            REASON_MIN_UNAVAILABLE.into(),
            "Deployment does not have minimum availability.".into()
        )),
        "DEP-18 2 available < 4 - 1"
    );
    assert_eq!(w.status().unavailable_replicas, Some(2));

    // ReplicaFailure copied; no deadline, no Progressing.
    let mut d = deployment(1, json!({}));
    d.spec.as_mut().unwrap().progress_deadline_seconds = Some(i32::MAX);
    let mut rs = owned_rs("web-a", "v1", 1, T0, 1, &d);
    rs.status.as_mut().unwrap().conditions = Some(vec![serde_json::from_value(json!({
        "type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": "quota",
        "lastTransitionTime": time(T0)
    }))
    .unwrap()]);
    rs.spec.as_mut().unwrap().template = Some(d.spec.as_ref().unwrap().template.clone());
    let mut w = World::new(d).with(rs);
    w.sync();
    assert_eq!(
        w.condition(PROGRESSING),
        None,
        "DEP-18 no progress deadline: no Progressing"
    );
    assert_eq!(
        w.condition(REPLICA_FAILURE),
        Some(("True".into(), "FailedCreate".into(), "quota".into())),
        "DEP-18 ReplicaFailure from the ReplicaSet"
    );
}

#[test]
fn dep18_create_failure_and_selecting_all() {
    let d = deployment(1, json!({}));
    // The plan hands over its working copy, defaults applied (progressDeadlineSeconds 600).
    let actions = create_failed(&with_defaults(&d), "web-abc", "quota exceeded", at(T0));
    let Action::UpdateStatus {
        deployment,
        best_effort,
    } = &actions[0]
    else {
        panic!()
    };
    let c = condition_of(deployment, PROGRESSING).unwrap();
    assert_eq!(
        (
            c.status.as_str(),
            c.reason.as_deref(),
            c.message.as_deref(),
            *best_effort
        ),
        (
            "False",
            Some(REASON_RS_CREATE_ERROR),
            Some("Failed to create new replica set \"web-abc\": quota exceeded"),
            true
        ),
        "DEP-18 ReplicaSetCreateError"
    );
    assert!(matches!(
        actions[1],
        Action::Event {
            warning: true,
            reason: REASON_RS_CREATE_ERROR,
            ..
        }
    ));

    let mut all: Deployment = d.clone();
    all.spec.as_mut().unwrap().selector = Default::default();
    all.metadata.generation = Some(3);
    let p = selecting_all(&all).expect("DEP-3 an empty selector is refused");
    assert_eq!(
        kinds(&p),
        ["event", "status"],
        "DEP-3 warning and observedGeneration"
    );
    assert!(selecting_all(&d).is_none());
}

#[test]
fn dep9_percent_values_reach_the_plan() {
    // 25% of 10: surge 3 (2.5 up), so the new ReplicaSet starts at 3.
    let mut w = mid_change(10, rolling(json!("25%"), json!("25%")));
    w.sync();
    let new = w.rs_running("v2").unwrap();
    assert_eq!(w.size(&new), 3, "DEP-9 surge 25% of 10 rounds up to 3");
    let mut w = mid_change(
        10,
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "x"}}),
    );
    let p = w.sync();
    assert!(
        p.error.is_some(),
        "DEP-9 an invalid maxSurge is an error naming the field"
    );
    assert!(p.error.unwrap().contains("maxSurge"));
}
