//! What the scheduler plugins share beyond the Kubernetes helpers: the default score
//! normalization (`plugins/helper.DefaultNormalizeScore`) and the decoding of plugin arguments.
//! Node affinity and taint matching live in [`crate::helpers::nodeaffinity`] and
//! [`crate::helpers::taints`] (re-exported here for the plugins), where the DaemonSet controller
//! shares them.

pub use crate::helpers::nodeaffinity::*;
pub use crate::helpers::taints::*;
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

/// A plugin's args object (`<kind>` as in KubeSchedulerConfiguration `pluginConfig[].args`):
/// `None` when absent or null; an error naming the field when it is not an object or has a field
/// other than `fields` (plus `apiVersion` / `kind`), as the strict config decoder rejects them.
pub fn args_object<'a>(
    args: Option<&'a serde_json::Value>,
    kind: &str,
    fields: &[&str],
) -> Result<Option<&'a serde_json::Map<String, serde_json::Value>>, String> {
    let Some(args) = args.filter(|a| !a.is_null()) else {
        return Ok(None);
    };
    let Some(obj) = args.as_object() else {
        return Err(format!("{kind}: must be an object"));
    };
    for key in obj.keys() {
        if !fields.contains(&key.as_str()) && key != "apiVersion" && key != "kind" {
            return Err(format!("{kind}.{key}: unknown field"));
        }
    }
    Ok(Some(obj))
}

/// One field of an args object, deserialized; `Ok(None)` when absent or null.
pub fn args_field<T: serde::de::DeserializeOwned>(
    obj: Option<&serde_json::Map<String, serde_json::Value>>,
    kind: &str,
    field: &str,
) -> Result<Option<T>, String> {
    match obj.and_then(|o| o.get(field)).filter(|v| !v.is_null()) {
        None => Ok(None),
        Some(v) => T::deserialize(v)
            .map(Some)
            .map_err(|e| format!("{kind}.{field}: {e}")),
    }
}

#[cfg(test)]
#[path = "helper_tests.rs"]
mod tests;

/// Builders and a miniature framework for the plugin test tables.
#[cfg(test)]
#[path = "test_util.rs"]
pub(crate) mod test_util;
