//! Indexed completion mode (kube-controller-manager v1.34's `indexed_job_utils.go`): completion
//! indexes of Pods, the ordered interval lists of `status.completedIndexes` / `failedIndexes`
//! ("1,3-5,7"), the first pending indexes to create, and the Pods to remove for repeated or
//! out-of-range indexes. Pure; owns no state.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use crate::runtime::cached_pod::CachedPod;
use k8s_openapi::api::batch::v1::Job;

/// The annotation (and, since PodIndexLabel, label) carrying a Pod's completion index.
pub const COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";
/// Failures counted against an index (backoffLimitPerIndex).
pub const INDEX_FAILURE_COUNT: &str = "batch.kubernetes.io/job-index-failure-count";
/// Failures of an index ignored by the pod failure policy.
pub const INDEX_IGNORED_FAILURE_COUNT: &str = "batch.kubernetes.io/job-index-ignored-failure-count";
/// The environment variable carrying the index into containers.
pub const COMPLETION_INDEX_ENV: &str = "JOB_COMPLETION_INDEX";
/// Upstream's `names.MaxGeneratedNameLength` (63 - 5 random characters).
const MAX_GENERATED_NAME_LENGTH: usize = 58;

/// Whether the Job's completion mode is Indexed.
pub fn is_indexed(job: &Job) -> bool {
    job.spec.as_ref().and_then(|s| s.completion_mode.as_deref()) == Some("Indexed")
}

/// A Pod's completion index from its annotation; `None` when absent, malformed or negative.
pub fn completion_index(pod: &CachedPod) -> Option<i32> {
    let v = pod.metadata.annotations.as_ref()?.get(COMPLETION_INDEX)?;
    v.parse::<i32>().ok().filter(|i| *i >= 0)
}

/// The index if it is valid for `completions`.
pub fn valid_index(pod: &CachedPod, completions: i32) -> Option<i32> {
    completion_index(pod).filter(|i| *i < completions)
}

/// An ordered list of disjoint, non-adjacent closed intervals of indexes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Intervals(pub Vec<(i32, i32)>);

impl Intervals {
    /// Parses "1,3-5,7", dropping what is at or beyond `completions` (upstream's
    /// `parseIndexesFromString`; corrupt parts are skipped).
    pub fn parse(s: &str, completions: i32) -> Intervals {
        let mut out: Vec<(i32, i32)> = Vec::new();
        if s.is_empty() {
            return Intervals(out);
        }
        for part in s.split(',') {
            let mut limits = part.split('-');
            let Some(Ok(first)) = limits.next().map(str::parse::<i32>) else {
                continue;
            };
            if first >= completions {
                break;
            }
            let last = match limits.next() {
                Some(l) => match l.parse::<i32>() {
                    Ok(l) => l.min(completions - 1),
                    Err(_) => continue,
                },
                None => first,
            };
            match out.last_mut() {
                Some(prev) if prev.1 == first - 1 => prev.1 = last,
                _ => out.push((first, last)),
            }
        }
        Intervals(out)
    }

    /// Merges two interval lists.
    pub fn merge(&self, other: &Intervals) -> Intervals {
        let mut all: Vec<(i32, i32)> = self.0.iter().chain(other.0.iter()).copied().collect();
        all.sort();
        let mut out: Vec<(i32, i32)> = Vec::new();
        for iv in all {
            match out.last_mut() {
                Some(last) if iv.0 <= last.1 + 1 => last.1 = last.1.max(iv.1),
                _ => out.push(iv),
            }
        }
        Intervals(out)
    }

    /// Adds single indexes.
    pub fn with_indexes(&self, indexes: impl IntoIterator<Item = i32>) -> Intervals {
        self.merge(&Intervals(indexes.into_iter().map(|i| (i, i)).collect()))
    }

    /// How many indexes.
    pub fn total(&self) -> i32 {
        self.0.iter().map(|(a, b)| b - a + 1).sum()
    }

    /// Whether `ix` is in the list.
    pub fn has(&self, ix: i32) -> bool {
        self.0.iter().any(|(a, b)| *a <= ix && ix <= *b)
    }

    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Display for Intervals {
    /// "1,3-5,7"; a two-index interval is written "3,4", as upstream.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (a, b)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{a}")?;
            if b > a {
                let sep = if *b == a + 1 { "," } else { "-" };
                write!(f, "{sep}{b}")?;
            }
        }
        Ok(())
    }
}

/// The distinct indexes of `pods`.
pub fn indexes_of<'a>(pods: impl IntoIterator<Item = &'a Arc<CachedPod>>) -> BTreeSet<i32> {
    pods.into_iter()
        .filter_map(|p| completion_index(p))
        .collect()
}

/// Up to `count` indexes below `completions` that are neither succeeded, active, nor in `other`
/// (terminating Pods' indexes when only failed Pods are replaced, failed indexes), lowest first
/// (`firstPendingIndexes`).
pub fn first_pending(
    count: usize,
    completions: i32,
    succeeded: &Intervals,
    active: &BTreeSet<i32>,
    other: &Intervals,
) -> Vec<i32> {
    if count == 0 {
        return Vec::new();
    }
    let busy = succeeded.with_indexes(active.iter().copied()).merge(other);
    (0..completions)
        .filter(|i| !busy.has(*i))
        .take(count)
        .collect()
}

/// `appendDuplicatedIndexPodsForRemoval`: of `pods` (active), those to remove because their
/// index is missing or out of range, or repeated (all but the last in deletion order stay... as
/// upstream: the Pods ranked first for deletion go, one per index is kept); and the Pods left.
pub fn duplicated_for_removal(
    pods: &[Arc<CachedPod>],
    completions: i32,
    sort: impl Fn(&mut Vec<Arc<CachedPod>>),
) -> (Vec<Arc<CachedPod>>, Vec<Arc<CachedPod>>) {
    let mut rm = Vec::new();
    let mut left = Vec::new();
    let mut by_index: HashMap<i32, Vec<Arc<CachedPod>>> = HashMap::new();
    let mut order = Vec::new();
    for p in pods {
        match completion_index(p) {
            Some(ix) if ix < completions => {
                by_index
                    .entry(ix)
                    .or_insert_with(|| {
                        order.push(ix);
                        Vec::new()
                    })
                    .push(p.clone());
            }
            _ => rm.push(p.clone()),
        }
    }
    order.sort();
    for ix in order {
        let mut group = by_index.remove(&ix).unwrap_or_default();
        if group.len() > 1 {
            sort(&mut group);
        }
        let keep = group.pop().expect("non-empty group");
        rm.extend(group);
        left.push(keep);
    }
    (rm, left)
}

/// `podGenerateNameWithIndex`: `<job>-<index>-`, the job name cut so the prefix fits.
pub fn generate_name_with_index(job: &str, index: i32) -> String {
    let suffix = format!("-{index}-");
    let prefix = format!("{job}{suffix}");
    if prefix.len() > MAX_GENERATED_NAME_LENGTH {
        let keep = MAX_GENERATED_NAME_LENGTH - suffix.len();
        let mut cut = keep.min(job.len());
        while !job.is_char_boundary(cut) {
            cut -= 1;
        }
        return format!("{}{suffix}", &job[..cut]);
    }
    prefix
}

fn annotation_i32(pod: &CachedPod, key: &str) -> i32 {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .and_then(|v| v.parse::<i64>().ok())
        .filter(|v| (0..=i64::from(i32::MAX)).contains(v))
        .map(|v| v as i32)
        .unwrap_or(0)
}

/// The failures counted against the Pod's index so far.
pub fn index_failure_count(pod: &CachedPod) -> i32 {
    annotation_i32(pod, INDEX_FAILURE_COUNT)
}

/// Counted plus ignored failures of the Pod's index.
pub fn index_absolute_failure_count(pod: &CachedPod) -> i32 {
    annotation_i32(pod, INDEX_FAILURE_COUNT) + annotation_i32(pod, INDEX_IGNORED_FAILURE_COUNT)
}

/// Counted and ignored failure counts of the Pod's index.
pub fn index_failure_counts(pod: &CachedPod) -> (i32, i32) {
    (
        annotation_i32(pod, INDEX_FAILURE_COUNT),
        annotation_i32(pod, INDEX_IGNORED_FAILURE_COUNT),
    )
}
