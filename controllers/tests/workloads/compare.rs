//! Each scenario runs once per flavour per test binary ([`outcome`] remembers it), whichever
//! test asks first: the per-flavour tests check a run's own expectations, the differential tests
//! compare the two runs' records ([`differences`]).
//!
//! Owns: the memo. Records are already normalised by the scenarios (ReplicaSets by role, Pods
//! by part); nothing else is set aside here, so any difference fails.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use super::harness::{Flavour, Run};
use super::scenarios::{self, Outcome};

/// The scenarios both flavours run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scenario {
    RolloutAndUndo,
    ProportionalScaling,
    ScaleDownRanking,
    CascadingDeletion,
    ReleaseRelabelledPod,
    PausedAtZero,
}

pub type Shared = Arc<Result<Outcome, String>>;

async fn run(flavour: Flavour, scenario: Scenario) -> anyhow::Result<Outcome> {
    let tag = format!("{scenario:?}").to_lowercase();
    let run = Run::new(flavour, &tag).await?;
    match scenario {
        Scenario::RolloutAndUndo => scenarios::rollout_and_undo(&run).await,
        Scenario::ProportionalScaling => scenarios::proportional_scaling(&run).await,
        Scenario::ScaleDownRanking => scenarios::scale_down_ranking(&run).await,
        Scenario::CascadingDeletion => scenarios::cascading_deletion(&run).await,
        Scenario::ReleaseRelabelledPod => scenarios::release_relabelled_pod(&run).await,
        Scenario::PausedAtZero => scenarios::paused_at_zero(&run).await,
    }
}

/// The outcome of `scenario` under `flavour`, run on first request.
pub async fn outcome(flavour: Flavour, scenario: Scenario) -> Shared {
    type Cell = Arc<tokio::sync::OnceCell<Shared>>;
    static MEMO: Mutex<BTreeMap<(Flavour, Scenario), Cell>> = Mutex::new(BTreeMap::new());
    let cell = MEMO
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry((flavour, scenario))
        .or_default()
        .clone();
    cell.get_or_init(|| async move {
        Arc::new(
            run(flavour, scenario)
                .await
                .map_err(|e| format!("{flavour:?} {scenario:?}: {e:#}")),
        )
    })
    .await
    .clone()
}

/// Panics unless the run succeeded and met its expectations.
pub async fn check(flavour: Flavour, scenario: Scenario) {
    let shared = outcome(flavour, scenario).await;
    let outcome = match &*shared {
        Ok(o) => o,
        Err(e) => panic!("{e}"),
    };
    if std::env::var_os("KPR_WORKLOADS_SHOW").is_some() {
        eprintln!(
            "{flavour:?} {scenario:?}: {:#}",
            serde_json::json!(outcome.record)
        );
    }
    assert!(
        outcome.problems.is_empty(),
        "{flavour:?} {scenario:?} broke {} expectation(s):\n{}\nrecord: {:#?}",
        outcome.problems.len(),
        outcome.problems.join("\n"),
        outcome.record
    );
}

/// The keys on which two records differ, each with both values.
pub fn differences(upstream: &Outcome, kpr: &Outcome) -> Vec<String> {
    let keys: BTreeSet<&String> = upstream.record.keys().chain(kpr.record.keys()).collect();
    keys.into_iter()
        .filter_map(|k| {
            let (a, b) = (upstream.record.get(k), kpr.record.get(k));
            (a != b).then(|| {
                format!(
                    "{k}:\n  kube-controller-manager: {}\n  kpr:                     {}",
                    show(a),
                    show(b)
                )
            })
        })
        .collect()
}

fn show(v: Option<&serde_json::Value>) -> String {
    v.map_or_else(|| "(not recorded)".into(), |v| v.to_string())
}

/// Runs `scenario` under both flavours (concurrently) and panics on any difference.
pub async fn differential(scenario: Scenario) {
    let (upstream, kpr) = tokio::join!(
        outcome(Flavour::Upstream, scenario),
        outcome(Flavour::Kpr, scenario)
    );
    let upstream = match &*upstream {
        Ok(o) => o,
        Err(e) => panic!("the reference run failed, nothing to compare with: {e}"),
    };
    let kpr = match &*kpr {
        Ok(o) => o,
        Err(e) => panic!("{e}"),
    };
    let diffs = differences(upstream, kpr);
    assert!(
        diffs.is_empty(),
        "{scenario:?}: kpr differs from kube-controller-manager in {} place(s):\n{}",
        diffs.len(),
        diffs.join("\n")
    );
}
