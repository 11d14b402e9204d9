//! The hashes controllers name objects by, as upstream computes them: the pod-template hash of
//! ReplicaSets and DaemonSet Pods (`controller.ComputeHash`, FNV-32a), the FNV-1 of
//! ControllerRevisions, and `rand.SafeEncodeString` that turns a hash into a name suffix.
//!
//! Pure functions; which object carries which hash is the callers' business.

use k8s_openapi::api::core::v1::PodTemplateSpec;
use serde_json::Value;

/// The label (on ReplicaSet selector, labels and Pod template) that tells a Deployment's
/// ReplicaSets apart (`apps.DefaultDeploymentUniqueLabelKey`).
pub const POD_TEMPLATE_HASH: &str = "pod-template-hash";

/// JSON of a Pod template with nulls, empty lists and empty maps left out at every depth, and
/// optionally without the pod-template-hash label: the form in which two templates are compared
/// and hashed. Leaving empties out follows `apiequality.Semantic.DeepEqual`, for which a nil and
/// an empty slice or map are equal (the API server drops both from JSON anyway).
pub fn template_form(template: &PodTemplateSpec, drop_hash_label: bool) -> Value {
    let mut v = serde_json::to_value(template).unwrap_or(Value::Null);
    if drop_hash_label {
        if let Some(labels) = v
            .get_mut("metadata")
            .and_then(|m| m.get_mut("labels"))
            .and_then(Value::as_object_mut)
        {
            labels.remove(POD_TEMPLATE_HASH);
        }
    }
    prune(v).unwrap_or(Value::Null)
}

fn prune(v: Value) -> Option<Value> {
    match v {
        Value::Null => None,
        Value::Array(items) => {
            let items: Vec<Value> = items
                .into_iter()
                .map(|i| prune(i).unwrap_or(Value::Null))
                .collect();
            (!items.is_empty()).then_some(Value::Array(items))
        }
        Value::Object(map) => {
            let map: serde_json::Map<String, Value> = map
                .into_iter()
                .filter_map(|(k, v)| prune(v).map(|v| (k, v)))
                .collect();
            (!map.is_empty()).then_some(Value::Object(map))
        }
        other => Some(other),
    }
}

/// Writes `v` as JSON with object keys sorted, whatever map type serde_json was built with.
fn canonical_json(v: &Value, out: &mut String) {
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                canonical_json(&map[k], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical_json(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// 32-bit FNV-1a (Go's `fnv.New32a`): the pod-template hash.
struct Fnv32a(u32);

impl Fnv32a {
    fn new() -> Self {
        Fnv32a(0x811c_9dc5)
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u32::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0193);
        }
    }
}

/// The characters of `rand.SafeEncodeString` (no vowels, no 0/1/3, so no words).
const SAFE_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// `rand.SafeEncodeString`: every character (rune, as upstream) mapped onto [`SAFE_ALPHABET`].
pub fn safe_encode(s: &str) -> String {
    s.chars()
        .map(|c| SAFE_ALPHABET[(c as usize) % SAFE_ALPHABET.len()] as char)
        .collect()
}

/// 32-bit FNV-1 (Go's `fnv.New32`, multiply then xor) over `parts` as one stream: the
/// ControllerRevision hash.
pub fn fnv1_32(parts: &[&[u8]]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for part in parts {
        for b in *part {
            h = h.wrapping_mul(0x0100_0193);
            h ^= u32::from(*b);
        }
    }
    h
}

/// The pod-template hash (`controller.ComputeHash`): FNV-32a over the template, then over
/// `collisionCount` when set (as 8 bytes, its little-endian u32 and four zero bytes, as upstream
/// writes it), printed in decimal and safe-encoded.
///
/// Upstream feeds the hash with Go's spew dump of its PodTemplateSpec struct, which cannot be
/// reproduced outside Go; this hashes the template's canonical JSON instead ([`template_form`]
/// with sorted keys). The same template therefore gets another name than under
/// kube-controller-manager, but names stay deterministic, a collisionCount bump still moves to
/// a new name, and ReplicaSets are found by template equality, never by name, so a Deployment
/// moved between the two controllers keeps its ReplicaSets.
pub fn compute_hash(template: &PodTemplateSpec, collision_count: Option<i32>) -> String {
    let mut json = String::new();
    canonical_json(&template_form(template, false), &mut json);
    let mut h = Fnv32a::new();
    h.write(json.as_bytes());
    if let Some(c) = collision_count {
        let mut bytes = [0u8; 8];
        bytes[..4].copy_from_slice(&(c as u32).to_le_bytes());
        h.write(&bytes);
    }
    safe_encode(&h.0.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_and_safe_encoding_match_go() {
        // Reference values of Go's hash/fnv New32a and New32 and rand.SafeEncodeString.
        let mut h = Fnv32a::new();
        assert_eq!(h.0, 0x811c_9dc5, "FNV-32a offset basis");
        h.write(b"a");
        assert_eq!(h.0, 0xe40c_292c, "FNV-32a of \"a\"");
        let cases: &[(&str, &[u8], u32)] = &[
            ("empty input is the offset basis", b"", 0x811c_9dc5),
            ("one byte: multiply then xor", b"a", 0x050c_5d7e),
            ("FNV-1 of foobar", b"foobar", 0x31f0_b262),
        ];
        for (name, input, want) in cases {
            assert_eq!(fnv1_32(&[input]), *want, "{name}");
        }
        assert_eq!(
            fnv1_32(&[b"foo", b"bar"]),
            fnv1_32(&[b"foobar"]),
            "parts hash as one stream"
        );
        assert_eq!(safe_encode("0123456789"), "456789bcdf");
    }
}
