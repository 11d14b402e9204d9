//! The event correlator: counting, aggregation and the spam filter, with an injected clock.

use super::*;
use futures::future::BoxFuture;

fn rs_ref(name: &str, uid: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("apps/v1".into()),
        kind: Some("ReplicaSet".into()),
        namespace: Some("ns".into()),
        name: Some(name.into()),
        uid: Some(uid.into()),
        resource_version: Some("7".into()),
        ..Default::default()
    }
}

/// One event published at `secs` seconds (wall clock and monotonic clock agree).
struct Step {
    secs: u64,
    object: &'static str,
    reason: &'static str,
    message: String,
}

fn step(secs: u64, reason: &'static str, message: &str) -> Step {
    Step {
        secs,
        object: "web",
        reason,
        message: message.to_string(),
    }
}

/// What a write looks like: "create|patch NAME count MESSAGE" or "skip", with the name's
/// nanoseconds replaced by the second it was made at.
fn run(steps: Vec<Step>) -> Vec<String> {
    let start = Instant::now();
    let mut c = Correlator::default();
    steps
        .into_iter()
        .map(|s| {
            let at = Timestamp::from_second(1_000 + s.secs as i64).unwrap();
            let e = make_event(
                "replicaset-controller",
                &rs_ref(s.object, &format!("uid-{}", s.object)),
                NORMAL,
                s.reason,
                s.message,
                at,
            );
            let write = c.correlate(e, start + Duration::from_secs(s.secs));
            let (verb, e) = match write {
                Write::Skip => return "skip".to_string(),
                Write::Create(e) => ("create", e),
                Write::Patch(e) => ("patch", e),
            };
            let name = e.metadata.name.clone().unwrap();
            let (object, nanos) = name.rsplit_once('.').unwrap();
            let made = i64::from_str_radix(nanos, 16).unwrap() / 1_000_000_000 - 1_000;
            let first = e.first_timestamp.as_ref().unwrap().0.as_second() - 1_000;
            let last = e.last_timestamp.as_ref().unwrap().0.as_second() - 1_000;
            format!(
                "{verb} {object}@{made} count={} first={first} last={last} {}",
                e.count.unwrap(),
                e.message.unwrap()
            )
        })
        .collect()
}

#[test]
fn correlation() {
    let created = |i: usize| step(i as u64, "SuccessfulCreate", &format!("Created pod: p{i}"));
    let cases: Vec<(&str, Vec<Step>, Vec<String>)> = vec![
        (
            "CTL events: an identical event is counted on the first Event",
            vec![
                step(0, "ScalingReplicaSet", "Scaled up to 3"),
                step(5, "ScalingReplicaSet", "Scaled up to 3"),
                step(9, "ScalingReplicaSet", "Scaled up to 3"),
            ],
            vec![
                "create web@0 count=1 first=0 last=0 Scaled up to 3".into(),
                "patch web@0 count=2 first=0 last=5 Scaled up to 3".into(),
                "patch web@0 count=3 first=0 last=9 Scaled up to 3".into(),
            ],
        ),
        (
            "CTL events: counting has no window (client-go's logger only forgets by LRU)",
            vec![step(0, "R", "m"), step(3_600, "R", "m")],
            vec![
                "create web@0 count=1 first=0 last=0 m".into(),
                "patch web@0 count=2 first=0 last=3600 m".into(),
            ],
        ),
        (
            "CTL events: other messages, reasons and objects are separate Events",
            vec![
                step(0, "R", "a"),
                step(1, "R", "b"),
                step(2, "S", "a"),
                Step {
                    object: "db",
                    ..step(3, "R", "a")
                },
            ],
            vec![
                "create web@0 count=1 first=0 last=0 a".into(),
                "create web@1 count=1 first=1 last=1 b".into(),
                "create web@2 count=1 first=2 last=2 a".into(),
                "create db@3 count=1 first=3 last=3 a".into(),
            ],
        ),
        (
            "CTL events: from the 10th distinct message of a reason they are combined",
            (1..=12).map(created).collect(),
            (1..=9)
                .map(|i| format!("create web@{i} count=1 first={i} last={i} Created pod: p{i}"))
                .chain([
                    "create web@10 count=1 first=10 last=10 (combined from similar events): Created pod: p10".into(),
                    "patch web@10 count=2 first=10 last=11 (combined from similar events): Created pod: p11".into(),
                    "patch web@10 count=3 first=10 last=12 (combined from similar events): Created pod: p12".into(),
                ])
                .collect(),
        ),
        (
            "CTL events: similar events more than 10 minutes apart start a new group",
            (1..=9)
                .map(created)
                .chain([step(700, "SuccessfulCreate", "Created pod: late")])
                .collect(),
            (1..=9)
                .map(|i| format!("create web@{i} count=1 first={i} last={i} Created pod: p{i}"))
                .chain(["create web@700 count=1 first=700 last=700 Created pod: late".into()])
                .collect(),
        ),
        (
            "CTL events: 25 events per object at once, then one per 5 minutes",
            (0..27)
                .map(|i| step(0, "R", &format!("m{}", i % 2)))
                .chain([step(300, "R", "m0"), step(301, "R", "m0")])
                .collect(),
            (0..25)
                .map(|i| {
                    let (verb, m) = (if i < 2 { "create" } else { "patch" }, i % 2);
                    format!("{verb} web@0 count={} first=0 last=0 m{m}", i / 2 + 1)
                })
                .chain([
                    "skip".into(),
                    "skip".into(),
                    // The dropped repeats were still counted.
                    "patch web@0 count=15 first=0 last=300 m0".into(),
                    "skip".into(),
                ])
                .collect(),
        ),
    ];
    for (name, steps, want) in cases {
        assert_eq!(run(steps), want, "{name}");
    }
}

#[test]
fn update_state_takes_the_servers_name_and_count() {
    let start = Instant::now();
    let mut c = Correlator::default();
    let at = Timestamp::from_second(1_000).unwrap();
    let e = make_event("c", &rs_ref("web", "u"), WARNING, "R", "m".into(), at);
    let Write::Create(mut written) = c.correlate(e.clone(), start) else {
        panic!("first event not created");
    };
    written.metadata.name = Some("server-name".into());
    written.metadata.resource_version = Some("42".into());
    written.count = Some(5);
    c.update_state(&written, start);
    let Write::Patch(p) = c.correlate(e, start) else {
        panic!("repeat not patched");
    };
    assert_eq!(p.metadata.name.as_deref(), Some("server-name"));
    assert_eq!(p.metadata.resource_version.as_deref(), Some("42"));
    assert_eq!(p.count, Some(6));
    assert_eq!(p.type_.as_deref(), Some(WARNING));
}

#[test]
fn make_event_fields() {
    let at = Timestamp::from_second(1_000).unwrap();
    let mut cluster = rs_ref("node-1", "u");
    cluster.namespace = None;
    let e = make_event(
        "deployment-controller",
        &cluster,
        NORMAL,
        "R",
        "m".into(),
        at,
    );
    assert_eq!(e.metadata.namespace.as_deref(), Some("default"));
    assert_eq!(
        e.metadata.name.as_deref(),
        Some(format!("node-1.{:x}", at.as_nanosecond()).as_str())
    );
    assert_eq!(
        e.source.and_then(|s| s.component).as_deref(),
        Some("deployment-controller")
    );
    assert_eq!(e.involved_object.resource_version.as_deref(), Some("7"));
    assert_eq!(e.count, Some(1));
    assert_eq!(e.first_timestamp, e.last_timestamp);
}

/// What the fake API server saw: each write in the order it started, and the most writes at once.
#[derive(Default)]
struct Seen {
    writes: Vec<(String, &'static str, String, i32)>,
    in_flight: usize,
    most: usize,
}

/// A fake API server's write: records the write in `seen`, answers after `latency` with the
/// Event given a resourceVersion.
fn recording_sink(
    seen: &Arc<Mutex<Seen>>,
    latency: Duration,
) -> impl Fn(Write) -> BoxFuture<'static, Result<Event, kube::Error>> + Clone + Send + Sync + 'static
{
    let seen = seen.clone();
    move |w: Write| {
        let seen = seen.clone();
        Box::pin(async move {
            let (kind, mut e) = match w {
                Write::Create(e) => ("create", e),
                Write::Patch(e) => ("patch", e),
                Write::Skip => unreachable!("skips are not written"),
            };
            {
                let mut s = seen.lock().unwrap();
                s.writes.push((
                    e.involved_object.name.clone().unwrap_or_default(),
                    kind,
                    e.metadata.name.clone().unwrap_or_default(),
                    e.count.unwrap_or_default(),
                ));
                s.in_flight += 1;
                s.most = s.most.max(s.in_flight);
            }
            tokio::time::sleep(latency).await;
            seen.lock().unwrap().in_flight -= 1;
            e.metadata.resource_version = Some("1".into());
            Ok(e)
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_objects_concurrently_and_each_objects_events_in_order() {
    // 100 objects, two identical events each (a create, then a patch counting 2), through an API
    // server answering every write after 20 ms: one write at a time would take 4 s.
    const OBJECTS: usize = 100;
    const LATENCY: Duration = Duration::from_millis(20);
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let sink = recording_sink(&seen, LATENCY);
    let (tx, rx) = mpsc::channel(MAX_QUEUED);
    let writer = tokio::spawn(write_all(rx, WRITERS, Correlator::default(), sink));
    let start = Instant::now();
    let at = Timestamp::now();
    for round in 0..2 {
        for i in 0..OBJECTS {
            let name = format!("pod-{i}");
            let mut e = make_event(
                "default-scheduler",
                &rs_ref(&name, &format!("uid-{i}")),
                NORMAL,
                "Scheduled",
                format!("Successfully assigned ns/{name} to node-1"),
                at,
            );
            if round == 1 {
                // A later event's own name; the count patches the first one's.
                e.metadata.name = Some(format!("{name}.later"));
            }
            tx.send(e).await.unwrap();
        }
    }
    drop(tx);
    writer.await.unwrap();
    // The dispatcher is done; its per-object writers finish within a few latencies.
    while seen.lock().unwrap().writes.len() < 2 * OBJECTS || seen.lock().unwrap().in_flight > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "after 2 s only {} of {} writes",
            seen.lock().unwrap().writes.len(),
            2 * OBJECTS
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = start.elapsed();
    let s = seen.lock().unwrap();
    assert!(
        elapsed < Duration::from_secs(1),
        "{} writes of {LATENCY:?} took {elapsed:?}: not concurrent",
        s.writes.len()
    );
    assert!(
        s.most > 1 && s.most <= WRITERS,
        "most writes at once {}, want 2..={WRITERS}",
        s.most
    );
    for i in 0..OBJECTS {
        let name = format!("pod-{i}");
        let mine: Vec<_> = s.writes.iter().filter(|w| w.0 == name).collect();
        assert_eq!(mine.len(), 2, "{name}: {mine:?}");
        assert_eq!((mine[0].1, mine[0].3), ("create", 1), "{name}: {mine:?}");
        assert_eq!((mine[1].1, mine[1].3), ("patch", 2), "{name}: {mine:?}");
        assert_eq!(
            mine[0].2, mine[1].2,
            "{name}: the patch names the created Event"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controllers_recorder_writes_one_event_at_a_time_in_the_order_published() {
    // tools/record (kube-controller-manager's controllers) has one sink goroutine.
    const OBJECTS: usize = 20;
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let sink = recording_sink(&seen, Duration::from_millis(2));
    let (tx, rx) = mpsc::channel(MAX_QUEUED);
    let writer = tokio::spawn(write_all(rx, 1, Correlator::default(), sink));
    let at = Timestamp::now();
    for i in 0..OBJECTS {
        let name = format!("rs-{i}");
        tx.send(make_event(
            "replicaset-controller",
            &rs_ref(&name, &format!("uid-{i}")),
            NORMAL,
            "SuccessfulCreate",
            format!("Created pod: {name}-a"),
            at,
        ))
        .await
        .unwrap();
    }
    drop(tx);
    writer.await.unwrap();
    while seen.lock().unwrap().writes.len() < OBJECTS || seen.lock().unwrap().in_flight > 0 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let s = seen.lock().unwrap();
    assert_eq!(s.most, 1, "writes at once");
    let order: Vec<_> = s.writes.iter().map(|w| w.0.clone()).collect();
    let want: Vec<_> = (0..OBJECTS).map(|i| format!("rs-{i}")).collect();
    assert_eq!(order, want, "written in the order published");
}

/// The scheduler's correlator (`tools/events`' time bound): an event not seen for
/// [`SERIES_FINISH`] is forgotten at the next sweep, so a repeat after that is a new Event and
/// the caches hold only the last minutes' objects; `tools/record`'s keeps both until evicted.
#[test]
fn a_forgetting_correlator_drops_what_it_has_not_seen_for_its_age() {
    let start = Instant::now();
    let at = |secs: u64| Timestamp::from_second(1_000 + secs as i64).unwrap();
    let event = |pod: &str, secs: u64| {
        make_event(
            "default-scheduler",
            &rs_ref(pod, pod),
            NORMAL,
            "Scheduled",
            format!("Successfully assigned ns/{pod} to node-1"),
            at(secs),
        )
    };
    let mut forgetting = Correlator::forgetting_after(SERIES_FINISH);
    let mut keeping = Correlator::default();
    let six = SERIES_FINISH.as_secs();
    for c in [&mut forgetting, &mut keeping] {
        // A thousand Pods' Events in the first minute, one Pod's again now and then.
        for i in 0..1_000 {
            let secs = i * 60 / 1_000;
            assert!(matches!(
                c.correlate(
                    event(&format!("p{i}"), secs),
                    start + Duration::from_secs(secs)
                ),
                Write::Create(_)
            ));
        }
        for secs in (60..=2 * six + 60).step_by(60) {
            c.correlate(event("p0", secs), start + Duration::from_secs(secs));
        }
    }
    // Three caches, one entry each per Pod.
    assert_eq!(keeping.len(), 3_000);
    assert_eq!(forgetting.len(), 3, "only p0, seen every minute, is left");
    let late = 2 * six + 120;
    let again =
        |c: &mut Correlator| c.correlate(event("p1", late), start + Duration::from_secs(late));
    assert!(matches!(again(&mut keeping), Write::Patch(e) if e.count == Some(2)));
    assert!(matches!(again(&mut forgetting), Write::Create(e) if e.count == Some(1)));
}

/// Before its age an entry is kept, whatever the sweeps: a sweep drops only what is older.
#[test]
fn a_forgetting_correlator_keeps_what_it_saw_within_its_age() {
    let start = Instant::now();
    let mut c = Correlator::forgetting_after(Duration::from_secs(60));
    let at = Timestamp::from_second(1_000).unwrap();
    let e = |name: &str| make_event("s", &rs_ref(name, name), NORMAL, "R", "m".into(), at);
    c.correlate(e("a"), start);
    c.correlate(e("b"), start + Duration::from_secs(50));
    // The sweep due at 60 s drops nothing (a is 60 s old, not more); the next is due at 120 s.
    c.correlate(e("c"), start + Duration::from_secs(60));
    assert_eq!(c.len(), 9);
    c.correlate(e("d"), start + Duration::from_secs(115));
    assert_eq!(c.len(), 12);
    // At 120 s a and b (70 s) go; c (60 s) and d stay.
    c.correlate(e("d"), start + Duration::from_secs(120));
    assert_eq!(c.len(), 6);
    assert!(matches!(
        c.correlate(e("c"), start + Duration::from_secs(121)),
        Write::Patch(_)
    ));
}
