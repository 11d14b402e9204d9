//! The StatefulSet controller end to end against the reference control plane with kwok nodes,
//! once with kube-controller-manager (`upstream_*`), once with our `controller-manager`
//! (`kpr_*`), and the two runs compared (`differential_*`). One control plane per flavour; the
//! scenarios of both flavours run concurrently, once per test binary, on the first test that
//! asks. The scenarios are in `statefulset/scenarios.rs`; docs/WORKLOADS.md lists what they
//! prove and the accepted differences.
//!
//! Requires the reference binaries (`cargo xtask setup --k8s`).

mod common;
/// This suite's own modules, in `statefulset/`.
mod statefulset {
    pub mod harness;
    pub mod scenarios;
}

use statefulset::{harness, scenarios};

use std::collections::BTreeMap;
use std::sync::Arc;

use harness::{Flavour, Run};
use scenarios::Outcome;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Scenario {
    Ordered,
    Partition,
    Retention,
}

const ALL: [Scenario; 3] = [Scenario::Ordered, Scenario::Partition, Scenario::Retention];

type Results = Arc<BTreeMap<(Flavour, Scenario), Result<Outcome, String>>>;

async fn run_one(flavour: Flavour, scenario: Scenario) -> anyhow::Result<Outcome> {
    let tag = format!("{scenario:?}").to_lowercase();
    let run = Run::new(flavour, &tag).await?;
    match scenario {
        Scenario::Ordered => scenarios::ordered(&run).await,
        Scenario::Partition => scenarios::partition(&run).await,
        Scenario::Retention => scenarios::retention(&run).await,
    }
}

/// Every scenario's outcome under both flavours, all run concurrently on first request (the two
/// control planes start one after the other, so the machine is not asked for both at once).
async fn results() -> Results {
    static MEMO: tokio::sync::OnceCell<Results> = tokio::sync::OnceCell::const_new();
    MEMO.get_or_init(|| async {
        let mut out = BTreeMap::new();
        let mut runs = Vec::new();
        for flavour in [Flavour::Upstream, Flavour::Kpr] {
            if let Err(e) = Run::shared(flavour) {
                let e = format!("{e:#}");
                for s in ALL {
                    out.insert((flavour, s), Err(e.clone()));
                }
                continue;
            }
            for s in ALL {
                runs.push(async move {
                    let r = run_one(flavour, s)
                        .await
                        .map_err(|e| format!("{flavour:?} {s:?}: {e:#}"));
                    ((flavour, s), r)
                });
            }
        }
        out.extend(futures::future::join_all(runs).await);
        Arc::new(out)
    })
    .await
    .clone()
}

async fn check(flavour: Flavour, scenario: Scenario) {
    let all = results().await;
    let o = match &all[&(flavour, scenario)] {
        Ok(o) => o,
        Err(e) => panic!("{e}"),
    };
    if std::env::var_os("KPR_STS_SHOW").is_some() {
        eprintln!("{flavour:?} {scenario:?}: {:#}", o.record);
    }
    assert!(
        o.problems.is_empty(),
        "{flavour:?} {scenario:?} broke {} expectation(s):\n{}\nrecord: {:#}",
        o.problems.len(),
        o.problems.join("\n"),
        o.record
    );
}

/// The two flavours' records must be equal: every field is an observable both controllers
/// produce the same way (docs/WORKLOADS.md lists what is left out and why).
async fn differential(scenario: Scenario) {
    let all = results().await;
    match (
        &all[&(Flavour::Upstream, scenario)],
        &all[&(Flavour::Kpr, scenario)],
    ) {
        (Ok(up), Ok(ours)) => assert_eq!(
            ours.record, up.record,
            "{scenario:?}: kpr's record (left) differs from kube-controller-manager's (right)"
        ),
        (u, o) => panic!("{scenario:?} did not run on both: upstream {u:?}, kpr {o:?}"),
    }
}

common::scenario_tests! {
    Ordered => upstream_ordered_ready_scale_and_claims, kpr_ordered_ready_scale_and_claims, differential_ordered_ready_scale_and_claims;
    Partition => upstream_partitioned_rolling_update, kpr_partitioned_rolling_update, differential_partitioned_rolling_update;
    Retention => upstream_parallel_retention_delete, kpr_parallel_retention_delete, differential_parallel_retention_delete;
}
