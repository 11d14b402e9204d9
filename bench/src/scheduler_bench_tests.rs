use super::*;

#[test]
fn sizes_parse_and_are_checked_against_the_nodes_room() {
    let cases: [(&str, &str, Result<Size, &str>); 7] = [
        (
            "the issue's small size",
            "500x1000",
            Ok(Size {
                nodes: 500,
                pods: 1000,
            }),
        ),
        (
            "underscores and spaces",
            " 5_000x10_000 ",
            Ok(Size {
                nodes: 5000,
                pods: 10000,
            }),
        ),
        ("no separator", "500", Err("is not NODESxPODS")),
        ("not a number", "ax10", Err("nodes \"a\" is not a number")),
        ("zero Pods", "10x0", Err("Pods must be at least 1")),
        (
            // 40 Pods of 100m fit a 4-CPU node; 10 nodes hold 400 with the 10 init Pods.
            "more Pods than the nodes' CPU holds",
            "10x391",
            Err("do not fit on 10 nodes"),
        ),
        (
            "exactly the nodes' CPU",
            "10x390",
            Ok(Size {
                nodes: 10,
                pods: 390,
            }),
        ),
    ];
    for (name, input, want) in cases {
        match (Size::parse(input), want) {
            (Ok(got), Ok(want)) => assert_eq!(got, want, "{name}"),
            (Err(e), Err(want)) => assert!(format!("{e:#}").contains(want), "{name}: {e:#}"),
            (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
        }
    }
    assert_eq!(Size::parse("500x1000").unwrap().init_pods(), 500);
    assert_eq!(Size::parse("5000x10000").unwrap().init_pods(), 1000);
}

#[test]
fn nearest_rank_percentiles() {
    let hundred: Vec<f64> = (1..=100).map(f64::from).collect();
    let cases: [(&str, &[f64], f64, Option<f64>); 6] = [
        ("empty", &[], 0.5, None),
        ("one sample is every percentile", &[7.0], 0.99, Some(7.0)),
        ("p50 of 1..=100", &hundred, 0.5, Some(50.0)),
        ("p99 of 1..=100", &hundred, 0.99, Some(99.0)),
        ("p100 is the max", &hundred, 1.0, Some(100.0)),
        ("p50 of two is the lower", &[1.0, 2.0], 0.5, Some(1.0)),
    ];
    for (name, sorted, q, want) in cases {
        assert_eq!(percentile(sorted, q), want, "{name}");
    }
}

#[test]
fn skew_and_stddev() {
    let cases: [(&str, &[usize], usize, f64); 4] = [
        ("none", &[], 0, 0.0),
        ("even", &[4, 4, 4], 0, 0.0),
        ("one empty node", &[2, 2, 0, 4], 4, 2f64.sqrt()),
        ("two values", &[1, 3], 2, 1.0),
    ];
    for (name, counts, want_skew, want_sd) in cases {
        assert_eq!(skew(counts), want_skew, "{name}");
        assert!((stddev(counts) - want_sd).abs() < 1e-9, "{name}");
    }
}

#[test]
fn placement_counts_empty_nodes_and_only_measured_pods_per_zone() {
    let nodes: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
    let zone_of: HashMap<String, String> = [("a", "z1"), ("b", "z2"), ("c", "z2")]
        .iter()
        .map(|(n, z)| (n.to_string(), z.to_string()))
        .collect();
    // Node c holds nothing; the init Pod on a counts per node, not per zone.
    let bound = [("a", false), ("a", true), ("b", true), ("b", true)];
    let p = Placement::of(&nodes, &bound, Some(&zone_of));
    assert_eq!(
        p,
        Placement {
            per_node_min: 0,
            per_node_max: 2,
            per_node_stddev: stddev(&[2, 2, 0]),
            zones: BTreeMap::from([("z1".into(), 1), ("z2".into(), 2)]),
            zone_skew: Some(1),
            victims: None,
        }
    );
    let p = Placement::of(&nodes, &bound, None);
    assert_eq!((p.zone_skew, p.zones.len()), (None, 0), "no zones: no skew");
}

/// Two scrapes as kube-scheduler (Prometheus text) and kpr's scheduler (OpenMetrics, with an
/// exemplar and a second label set) write them.
const UPSTREAM_TEXT: &str = "\
# HELP scheduler_scheduling_algorithm_duration_seconds [ALPHA] Scheduling algorithm latency in seconds
# TYPE scheduler_scheduling_algorithm_duration_seconds histogram
scheduler_scheduling_algorithm_duration_seconds_bucket{le=\"0.001\"} 10
scheduler_scheduling_algorithm_duration_seconds_bucket{le=\"0.002\"} 30
scheduler_scheduling_algorithm_duration_seconds_bucket{le=\"0.004\"} 40
scheduler_scheduling_algorithm_duration_seconds_bucket{le=\"+Inf\"} 40
scheduler_scheduling_algorithm_duration_seconds_sum 0.05
scheduler_scheduling_algorithm_duration_seconds_count 40
scheduler_scheduling_attempt_duration_seconds_bucket{profile=\"default-scheduler\",result=\"scheduled\",le=\"0.001\"} 3
";

const KPR_TEXT: &str = "\
# TYPE scheduler_scheduling_algorithm_duration_seconds histogram
scheduler_scheduling_algorithm_duration_seconds_sum 0.01
scheduler_scheduling_algorithm_duration_seconds_count 4
scheduler_scheduling_algorithm_duration_seconds_bucket{le=\"0.001\"} 2 # {trace_id=\"x\"} 0.0005
scheduler_scheduling_algorithm_duration_seconds_bucket{profile=\"b\",le=\"0.001\"} 1
scheduler_scheduling_algorithm_duration_seconds_bucket{le=\"+Inf\"} 3
scheduler_scheduling_algorithm_duration_seconds_bucket{profile=\"b\",le=\"+Inf\"} 1
# EOF
";

#[test]
fn histograms_parse_from_both_schedulers_text() {
    const NAME: &str = "scheduler_scheduling_algorithm_duration_seconds";
    let h = Histogram::parse(UPSTREAM_TEXT, NAME).unwrap().unwrap();
    assert_eq!(
        h.buckets,
        vec![
            (0.001, 10.0),
            (0.002, 30.0),
            (0.004, 40.0),
            (f64::INFINITY, 40.0)
        ],
        "only the named histogram's buckets"
    );
    let h = Histogram::parse(KPR_TEXT, NAME).unwrap().unwrap();
    assert_eq!(
        h.buckets,
        vec![(0.001, 3.0), (f64::INFINITY, 4.0)],
        "label sets summed, exemplar ignored"
    );
    assert_eq!(Histogram::parse("other_metric 1\n", NAME).unwrap(), None);
    let err = Histogram::parse(&format!("{NAME}_bucket{{le=\"0.1\"}} 1\n"), NAME).unwrap_err();
    assert!(format!("{err:#}").contains("no +Inf bucket"), "{err:#}");
    let err = Histogram::parse(&format!("{NAME}_bucket{{le=\"x\"}} 1\n"), NAME).unwrap_err();
    assert!(format!("{err:#}").contains("le \"x\""), "{err:#}");
}

#[test]
fn histogram_quantiles_as_prometheus_interpolates() {
    let h = Histogram {
        buckets: vec![
            (0.001, 10.0),
            (0.002, 30.0),
            (0.004, 40.0),
            (f64::INFINITY, 40.0),
        ],
    };
    let tail = Histogram {
        buckets: vec![(0.001, 1.0), (0.002, 1.0), (f64::INFINITY, 4.0)],
    };
    let empty = Histogram {
        buckets: vec![(0.001, 0.0), (f64::INFINITY, 0.0)],
    };
    let cases: [(&str, &Histogram, f64, Option<f64>); 6] = [
        ("inside the first bucket, from 0", &h, 0.125, Some(0.0005)),
        (
            "rank 20 of 40, half way through (1, 2] ms",
            &h,
            0.5,
            Some(0.0015),
        ),
        (
            "p99 in (2, 4] ms",
            &h,
            0.99,
            Some(0.002 + 0.002 * 9.6 / 10.0),
        ),
        (
            "in +Inf: the highest finite bound",
            &tail,
            0.99,
            Some(0.002),
        ),
        ("nothing observed", &empty, 0.5, None),
        ("p100 at a bucket's top", &h, 1.0, Some(0.004)),
    ];
    for (name, h, q, want) in cases {
        let got = h.quantile(q);
        match (got, want) {
            (Some(g), Some(w)) => assert!((g - w).abs() < 1e-12, "{name}: {g} != {w}"),
            _ => assert_eq!(got, want, "{name}"),
        }
    }
}

#[test]
fn histogram_difference_between_scrapes() {
    let before = Histogram {
        buckets: vec![(0.001, 5.0), (f64::INFINITY, 6.0)],
    };
    let after = Histogram {
        buckets: vec![(0.001, 15.0), (f64::INFINITY, 26.0)],
    };
    assert_eq!(
        after.since(&before).unwrap().buckets,
        vec![(0.001, 10.0), (f64::INFINITY, 20.0)]
    );
    assert_eq!(after.since(&Histogram::default()).unwrap(), after);
    let other = Histogram {
        buckets: vec![(0.002, 1.0), (f64::INFINITY, 1.0)],
    };
    assert!(after.since(&other).is_err(), "different buckets");
}

#[test]
fn limit_decided_from_the_time_behind_creation_and_the_cpu_then() {
    let cases = [
        (
            "bound within 1 s of the last create",
            5.0,
            0.9,
            Some(0.1),
            Limit::Creation,
        ),
        (
            "within 10 % of a long run",
            100.0,
            9.0,
            Some(1.0),
            Limit::Creation,
        ),
        ("behind and idle", 10.0, 5.0, Some(0.2), Limit::ApiServer),
        ("behind and busy", 10.0, 5.0, Some(0.9), Limit::Scheduler),
        ("behind, CPU unknown", 10.0, 5.0, None, Limit::Scheduler),
    ];
    for (name, seconds, behind, cores, want) in cases {
        assert_eq!(Limit::decide(seconds, behind, cores), want, "{name}");
    }
}

fn event(id: &str, verb: &str, resource: &str, code: u16, at: &str) -> String {
    let (res, sub) = resource.split_once('/').unwrap_or((resource, ""));
    let mut object = json!({"resource": res, "namespace": "sched-0"});
    if !sub.is_empty() {
        object["subresource"] = json!(sub);
    }
    json!({"kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "Metadata",
           "auditID": id, "stage": "ResponseComplete", "verb": verb,
           "user": {"username": SCHEDULER_USER},
           "objectRef": object, "responseStatus": {"metadata": {}, "code": code},
           "requestReceivedTimestamp": at, "stageTimestamp": at})
    .to_string()
}

#[test]
fn requests_counted_once_each_by_phase() {
    let started = event("w", "watch", "pods", 200, "2026-01-01T00:00:01Z")
        .replace("ResponseComplete", "ResponseStarted");
    let log = [
        started,
        event("a", "create", "pods/binding", 201, "2026-01-01T00:00:10Z"),
        event("b", "create", "pods/binding", 409, "2026-01-01T00:00:15Z"),
        event("c", "create", "events", 201, "2026-01-01T00:00:16Z"),
        event("w", "watch", "pods", 200, "2026-01-01T00:00:01Z"),
        event("d", "get", "nodes", 200, "2026-01-01T00:00:20Z"),
        String::new(),
    ]
    .join("\n");
    let at = |s: &str| s.parse::<Timestamp>().unwrap();
    let r = count_requests(
        &log,
        [at("2026-01-01T00:00:10Z"), at("2026-01-01T00:00:20Z")],
    )
    .unwrap();
    assert_eq!(
        r,
        Requests {
            startup: 1,
            measured: 3,
            after: 1,
            total: 5,
            by_kind: BTreeMap::from([
                ("create events".into(), 1),
                ("create pods/binding".into(), 2),
                ("get nodes".into(), 1),
                ("watch pods".into(), 1),
            ]),
            measured_by_kind: BTreeMap::from([
                ("create events".into(), 1),
                ("create pods/binding".into(), 2),
            ]),
            failed_by_code: BTreeMap::from([(409, 1)]),
        }
    );
    let err = count_requests("{not json", [at("2026-01-01T00:00:00Z"); 2]).unwrap_err();
    assert!(format!("{err:#}").contains("line 1"), "{err:#}");
}

#[test]
fn measured_topology_pods_carry_the_constraint_and_kwoks_annotation() {
    let spread = PodSpec {
        workload: Workload::TopologySpreading,
        role: MEASURED,
    };
    let init = PodSpec {
        workload: Workload::TopologySpreading,
        role: "init",
    };
    let basic = PodSpec {
        workload: Workload::Basic,
        role: MEASURED,
    };
    for (name, spec, constrained) in [
        ("measured spreading Pod", spread, true),
        ("init Pod of the spreading workload", init, false),
        ("basic Pod", basic, false),
    ] {
        let p = pod("m-0", spec);
        let annotations = p.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(
            annotations.get(KWOK_DISREGARD.0).map(String::as_str),
            Some(KWOK_DISREGARD.1),
            "{name}"
        );
        let constraints = p
            .spec
            .unwrap()
            .topology_spread_constraints
            .unwrap_or_default();
        assert_eq!(!constraints.is_empty(), constrained, "{name}");
        if let Some(c) = constraints.first() {
            assert_eq!(
                (
                    c.max_skew,
                    c.topology_key.as_str(),
                    c.when_unsatisfiable.as_str()
                ),
                (1, ZONE_LABEL, "DoNotSchedule"),
                "{name}"
            );
        }
    }
}

#[test]
fn the_scheduler_perf_workloads_scale_and_shape_their_pods_as_upstream() {
    let size = Size {
        nodes: 500,
        pods: 1000,
    };
    // scheduler_perf's 500Nodes cases: init Pods, and the measured Pods that can be placed.
    let cases = [
        (Workload::Basic, 500, 1000),
        (Workload::TopologySpreading, 500, 1000),
        (Workload::PodAntiAffinity, 100, 400),
        (Workload::PodAffinity, 500, 1000),
        (Workload::NodeAffinity, 500, 1000),
        (Workload::PreferredTopologySpreading, 1000, 1000),
        (Workload::Preemption, 2000, 500),
        (Workload::CsiPvs, 500, 1000),
    ];
    for (w, init, measured) in cases {
        assert_eq!(
            (w.init_pods(size), w.measured_pods(size)),
            (init, measured),
            "{w:?}"
        );
        assert_eq!(
            Workload::parse(w.name()).unwrap(),
            w,
            "{w:?} by its upstream name"
        );
    }
    assert_eq!(
        Workload::parse_list(&["all".into()]).unwrap().len(),
        Workload::NAMES.len()
    );
    assert_eq!(
        Workload::parse_list(&["basic".into(), "all".into()]).unwrap()[0],
        Workload::Basic
    );
    assert!(Workload::parse("nope").is_err());

    let measured = |w| {
        pod(
            "m-0",
            PodSpec {
                workload: w,
                role: MEASURED,
            },
        )
    };
    let init = |w| {
        pod(
            "i-0",
            PodSpec {
                workload: w,
                role: "init",
            },
        )
    };
    let cpu = |p: &Pod| {
        p.spec.as_ref().unwrap().containers[0]
            .resources
            .as_ref()
            .unwrap()
            .requests
            .as_ref()
            .unwrap()["cpu"]
            .0
            .clone()
    };
    // Anti-affinity: every Pod, on the hostname, against its own label.
    for p in [
        measured(Workload::PodAntiAffinity),
        init(Workload::PodAntiAffinity),
    ] {
        let term = &p
            .spec
            .as_ref()
            .unwrap()
            .affinity
            .as_ref()
            .unwrap()
            .pod_anti_affinity
            .as_ref()
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .as_ref()
            .unwrap()[0];
        assert_eq!(term.topology_key, "kubernetes.io/hostname");
        let labels = p.metadata.labels.as_ref().unwrap();
        assert_eq!(labels.get("color").map(String::as_str), Some("green"));
    }
    let p = measured(Workload::PodAffinity);
    let term = &p
        .spec
        .as_ref()
        .unwrap()
        .affinity
        .as_ref()
        .unwrap()
        .pod_affinity
        .as_ref()
        .unwrap()
        .required_during_scheduling_ignored_during_execution
        .as_ref()
        .unwrap()[0];
    assert_eq!(term.topology_key, ZONE_LABEL);
    let p = init(Workload::NodeAffinity);
    assert!(p
        .spec
        .as_ref()
        .unwrap()
        .affinity
        .as_ref()
        .unwrap()
        .node_affinity
        .is_some());
    let p = measured(Workload::PreferredTopologySpreading);
    let c = &p
        .spec
        .as_ref()
        .unwrap()
        .topology_spread_constraints
        .as_ref()
        .unwrap()[0];
    assert_eq!(
        (c.max_skew, c.when_unsatisfiable.as_str()),
        (5, "ScheduleAnyway")
    );
    assert!(init(Workload::PreferredTopologySpreading)
        .spec
        .unwrap()
        .topology_spread_constraints
        .is_none());
    // Preemption: 900m of priority 0, then 3 CPU of the high class.
    let (low, high) = (init(Workload::Preemption), measured(Workload::Preemption));
    assert_eq!(
        (cpu(&low), cpu(&high)),
        ("900m".to_string(), "3000m".to_string())
    );
    assert_eq!(low.spec.as_ref().unwrap().priority_class_name, None);
    assert_eq!(
        high.spec.as_ref().unwrap().priority_class_name.as_deref(),
        Some(HIGH_PRIORITY_CLASS)
    );
    // Zones: three for the spreading workloads, one for the affinity ones.
    assert_eq!(
        Workload::PreferredTopologySpreading.zone(4).as_deref(),
        Some("zone-1")
    );
    assert_eq!(Workload::NodeAffinity.zone(4).as_deref(), Some("zone1"));
    assert_eq!(Workload::Preemption.zone(4), None);
    // CSI volumes: each Pod its own claim, the other workloads none.
    for (p, claim) in [
        (init(Workload::CsiPvs), "pvc-i-0"),
        (measured(Workload::CsiPvs), "pvc-m-0"),
    ] {
        let volumes = p.spec.as_ref().unwrap().volumes.as_ref().unwrap();
        assert_eq!(volumes.len(), 1);
        assert_eq!(
            volumes[0]
                .persistent_volume_claim
                .as_ref()
                .unwrap()
                .claim_name,
            claim
        );
    }
    assert!(measured(Workload::Basic).spec.unwrap().volumes.is_none());
    // More volumes than the nodes allow are not asked for: 39 per node, 10 nodes.
    let small = Size {
        nodes: 10,
        pods: 1000,
    };
    assert_eq!(Workload::CsiPvs.measured_pods(small), 390 - 10);
    let nodes = node("n", None, true);
    assert_eq!(
        nodes.status.unwrap().allocatable.unwrap()["attachable-volumes-csi-ebs.csi.aws.com"].0,
        "39"
    );
}
