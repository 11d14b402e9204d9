//! What the scheduler plugins share beyond the Kubernetes helpers: the default score
//! normalization (`plugins/helper.DefaultNormalizeScore`) and the plugin test builders. Node
//! affinity and taint matching live in `crate::helpers` (`nodeaffinity`, `taints`), where the
//! DaemonSet controller shares them; plugin arguments are decoded in `scheduler::plugin_args`.

use crate::scheduler::framework::NodeScore;

/// `DefaultNormalizeScore`: scales scores from 0..=max(scores) to 0..=`max_priority`, and with
/// `reverse` subtracts them from `max_priority` (all scores become `max_priority` when every
/// score is 0). Scores are assumed non-negative.
pub fn default_normalize_score(max_priority: i64, reverse: bool, scores: &mut [NodeScore]) {
    let max = scores.iter().map(|s| s.score).max().unwrap_or(0).max(0);
    if max == 0 {
        if reverse {
            scores.iter_mut().for_each(|s| s.score = max_priority);
        }
        return;
    }
    for s in scores.iter_mut() {
        let v = max_priority * s.score / max;
        s.score = if reverse { max_priority - v } else { v };
    }
}

#[cfg(test)]
#[path = "helper_tests.rs"]
mod tests;

/// Builders and a miniature framework for the plugin test tables.
#[cfg(test)]
#[path = "test_util.rs"]
pub(crate) mod test_util;
