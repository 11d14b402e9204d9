//! Patch application: JSON merge patch (RFC 7386), JSON patch (RFC 6902), an approximation of
//! strategic merge patch, and server-side apply approximated as a merge.
//!
//! Strategic merge patch here knows the merge keys of the lists kube-rs controllers patch
//! (containers, ports, conditions, ownerReferences, env, volumes, ...), the `$patch: delete` and
//! `$patch: replace` directives, `$deleteFromPrimitiveList/<field>`, and merges `finalizers` as a set.
//! Every other list is replaced, as in a JSON merge patch. It does not know per-type schemas.

use serde_json::{Map, Value};

use crate::Error;

/// The patch flavours distinguished by `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    /// `application/merge-patch+json`.
    Merge,
    /// `application/strategic-merge-patch+json`.
    Strategic,
    /// `application/json-patch+json`.
    Json,
    /// `application/apply-patch+yaml` (server-side apply, approximated as a merge).
    Apply,
}

impl PatchKind {
    /// Maps a request content type to a patch kind.
    pub fn from_content_type(ct: &str) -> Result<Self, Error> {
        let ct = ct.split(';').next().unwrap_or("").trim();
        match ct {
            "application/merge-patch+json" => Ok(Self::Merge),
            "application/strategic-merge-patch+json" => Ok(Self::Strategic),
            "application/json-patch+json" => Ok(Self::Json),
            "application/apply-patch+yaml" | "application/apply-patch+json" => Ok(Self::Apply),
            other => Err(Error::UnsupportedMediaType(format!(
                "Content-Type {other:?}: expected a merge, strategic merge, JSON or apply patch"
            ))),
        }
    }
}

/// Applies `patch` (already parsed) to `doc`.
pub fn apply(kind: PatchKind, doc: &mut Value, patch: &Value) -> Result<(), Error> {
    match kind {
        PatchKind::Merge | PatchKind::Apply => {
            json_patch::merge(doc, patch);
            Ok(())
        }
        PatchKind::Strategic => {
            strategic_merge(doc, patch, "");
            Ok(())
        }
        PatchKind::Json => {
            let p: json_patch::Patch = serde_json::from_value(patch.clone())
                .map_err(|e| Error::BadRequest(format!("JSON patch body: {e}")))?;
            json_patch::patch(doc, &p).map_err(|e| Error::Invalid(format!("JSON patch: {e}")))
        }
    }
}

/// The merge key of a list field, by field name, as in the Kubernetes API's patch strategies.
fn merge_key(field: &str) -> Option<&'static str> {
    Some(match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "volumes"
        | "volumeMounts" => "name",
        "conditions" => "type",
        "ownerReferences" => "uid",
        "ports" => "port",
        "imagePullSecrets" => "name",
        "tolerations" => "key",
        "hostAliases" => "ip",
        "podIPs" | "hostIPs" => "ip",
        _ => return None,
    })
}

/// Container ports merge by `containerPort`, service ports by `port`.
fn list_key(field: &str, items: &[Value]) -> Option<&'static str> {
    let key = merge_key(field)?;
    if field == "ports" && items.iter().any(|i| i.get("containerPort").is_some()) {
        return Some("containerPort");
    }
    Some(key)
}

fn strategic_merge(doc: &mut Value, patch: &Value, field: &str) {
    let Value::Object(p) = patch else {
        *doc = patch.clone();
        return;
    };
    if p.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut p = p.clone();
        p.remove("$patch");
        *doc = Value::Object(p);
        return;
    }
    if !doc.is_object() {
        *doc = Value::Object(Map::new());
    }
    let target = doc.as_object_mut().expect("made an object above");
    for (k, v) in p {
        if let Some(list_field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(cur)), Value::Array(del)) = (target.get_mut(list_field), v) {
                cur.retain(|x| !del.contains(x));
            }
            continue;
        }
        if k.starts_with('$') {
            continue;
        }
        if v.is_null() {
            target.remove(k);
            continue;
        }
        let cur = target.entry(k.clone()).or_insert(Value::Null);
        merge_field(cur, v, k);
    }
    let _ = field;
}

fn merge_field(cur: &mut Value, v: &Value, key: &str) {
    match v {
        Value::Array(items) if key == "finalizers" => {
            let mut out = cur.as_array().cloned().unwrap_or_default();
            for i in items {
                if !out.contains(i) {
                    out.push(i.clone());
                }
            }
            *cur = Value::Array(out);
        }
        Value::Array(items) => match list_key(key, items) {
            Some(mk) if cur.is_array() => merge_keyed_list(cur, items, mk),
            _ => {
                *cur = Value::Array(
                    items
                        .iter()
                        .filter(|i| i.get("$patch").is_none())
                        .cloned()
                        .collect(),
                )
            }
        },
        Value::Object(_) => strategic_merge(cur, v, key),
        _ => *cur = v.clone(),
    }
}

fn merge_keyed_list(cur: &mut Value, items: &[Value], mk: &str) {
    let list = cur.as_array_mut().expect("checked by caller");
    if items
        .iter()
        .any(|i| i.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        *list = items
            .iter()
            .filter(|i| i.get("$patch").is_none())
            .cloned()
            .collect();
        return;
    }
    for item in items {
        let key = item.get(mk);
        let pos = list.iter().position(|e| key.is_some() && e.get(mk) == key);
        let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
        match (pos, delete) {
            (Some(i), true) => {
                list.remove(i);
            }
            (None, true) => {}
            (Some(i), false) => strategic_merge(&mut list[i], item, ""),
            (None, false) => list.push(item.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_replaces_lists_and_removes_nulls() {
        let mut doc = json!({"a": 1, "b": [1, 2], "c": {"d": 1}});
        apply(
            PatchKind::Merge,
            &mut doc,
            &json!({"a": null, "b": [3], "c": {"e": 2}}),
        )
        .unwrap();
        assert_eq!(doc, json!({"b": [3], "c": {"d": 1, "e": 2}}));
    }

    #[test]
    fn strategic_merge_merges_conditions_by_type() {
        let mut doc = json!({"status": {"conditions": [{"type": "Ready", "status": "False"},
                                                       {"type": "PodScheduled", "status": "True"}]}});
        let patch = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        apply(PatchKind::Strategic, &mut doc, &patch).unwrap();
        assert_eq!(
            doc["status"]["conditions"],
            json!([{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}])
        );
    }

    #[test]
    fn strategic_merge_deletes_owner_reference_by_uid() {
        let mut doc = json!({"metadata": {"ownerReferences": [{"uid": "1", "name": "a"}, {"uid": "2", "name": "b"}]}});
        let patch = json!({"metadata": {"ownerReferences": [{"$patch": "delete", "uid": "1"}]}});
        apply(PatchKind::Strategic, &mut doc, &patch).unwrap();
        assert_eq!(
            doc["metadata"]["ownerReferences"],
            json!([{"uid": "2", "name": "b"}])
        );
    }

    #[test]
    fn strategic_merge_unions_finalizers_and_deletes_from_primitive_list() {
        let mut doc = json!({"metadata": {"finalizers": ["a"]}});
        apply(
            PatchKind::Strategic,
            &mut doc,
            &json!({"metadata": {"finalizers": ["b", "a"]}}),
        )
        .unwrap();
        assert_eq!(doc["metadata"]["finalizers"], json!(["a", "b"]));
        let del = json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}});
        apply(PatchKind::Strategic, &mut doc, &del).unwrap();
        assert_eq!(doc["metadata"]["finalizers"], json!(["b"]));
    }

    #[test]
    fn json_patch_applies_and_reports_failures() {
        let mut doc = json!({"a": 1});
        apply(
            PatchKind::Json,
            &mut doc,
            &json!([{"op": "replace", "path": "/a", "value": 2}]),
        )
        .unwrap();
        assert_eq!(doc, json!({"a": 2}));
        let err = apply(
            PatchKind::Json,
            &mut doc,
            &json!([{"op": "test", "path": "/a", "value": 3}]),
        );
        assert!(err.is_err());
    }
}
