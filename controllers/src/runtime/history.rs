//! ControllerRevision history shared by the StatefulSet and DaemonSet controllers, as upstream's
//! `pkg/controller/history`: revision data encoded byte for byte as Go's `encoding/json` encodes
//! a `map[string]interface{}` (so hashes, and with them revision names, equal
//! kube-controller-manager's for the same data), the FNV-1 hash with the collision count as
//! probe, names `<owner>-<hash>`, ordering, equality, the owned-or-orphan listing, creation with
//! collision handling, renumbering, adoption and truncation to a history limit.
//!
//! It knows no owner kind: callers pass the owner ([`OwnerInfo`]), the labels and the data. It
//! never decides what a revision holds (that is the owning controller's) and never lists
//! anything itself: the callers' caches hold the revisions.

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{json, Value};

use crate::error::{Error, Result};
use crate::helpers::hash::{fnv1_32, safe_encode};
use crate::helpers::selector::Selector;
use crate::runtime::apierrors::{is_already_exists, is_not_found};
use crate::runtime::claim::OwnerInfo;
use crate::runtime::informer::controller_uid;

/// The label holding the hash of a revision's data (`history.ControllerRevisionHashLabel`).
pub const HASH_LABEL: &str = "controller.kubernetes.io/hash";

/// Longest owner-name prefix kept in a revision name, so `<prefix>-<hash>` stays within 253.
const MAX_PREFIX: usize = 223;

/// How many name collisions [`create`] resolves before giving up. Upstream loops without bound;
/// a bound turns a pathological loop into an error naming the revision.
const MAX_COLLISIONS: usize = 100;

/// The bytes Go's `json.Marshal` writes for `value` after it was decoded into
/// `map[string]interface{}`: compact, object keys sorted (serde_json's map is ordered by key, as
/// Go sorts map keys), and `<`, `>`, `&`, U+2028 and U+2029 escaped as `\u003c`... (Go's HTML-safe
/// default). These characters can only occur inside strings, so escaping them in the output is
/// the same as escaping them while encoding.
pub fn go_json(value: &Value) -> Vec<u8> {
    let s = serde_json::to_string(value).expect("a JSON value always serializes");
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out.into_bytes()
}

/// `history.HashControllerRevision`: FNV-1 of the encoded data, then the decimal probe (the
/// collision count) when there is one, safe-encoded.
pub fn hash(data: &Value, probe: Option<i32>) -> String {
    let raw = go_json(data);
    let probe = probe.map(|p| p.to_string()).unwrap_or_default();
    safe_encode(&fnv1_32(&[&raw, probe.as_bytes()]).to_string())
}

/// `history.ControllerRevisionName`: `<prefix>-<hash>`, the prefix cut to 223 bytes.
pub fn revision_name(prefix: &str, hash: &str) -> String {
    let mut end = prefix.len().min(MAX_PREFIX);
    while !prefix.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}-{hash}", &prefix[..end])
}

/// The data of a revision (`null` when absent).
pub fn data(rev: &ControllerRevision) -> &Value {
    static NULL: Value = Value::Null;
    rev.data.as_ref().map(|d| &d.0).unwrap_or(&NULL)
}

/// `history.NewControllerRevision`: a revision of `owner` in `namespace` holding `data`,
/// labelled with `labels` plus [`HASH_LABEL`], controlled by the owner, named from the hash
/// with `collision_count` as probe.
pub fn new_revision(
    owner: &OwnerInfo,
    namespace: &str,
    labels: &BTreeMap<String, String>,
    data: Value,
    revision: i64,
    collision_count: i32,
) -> ControllerRevision {
    let hash = hash(&data, Some(collision_count));
    let mut labels = labels.clone();
    labels.insert(HASH_LABEL.to_string(), hash.clone());
    ControllerRevision {
        metadata: ObjectMeta {
            name: Some(revision_name(&owner.name, &hash)),
            namespace: Some(namespace.to_string()),
            labels: Some(labels),
            owner_references: Some(vec![owner.controller_ref()]),
            ..ObjectMeta::default()
        },
        data: Some(RawExtension(data)),
        revision,
    }
}

/// `byRevision.Less`: by revision number, then creation time, then name.
pub fn compare(a: &ControllerRevision, b: &ControllerRevision) -> Ordering {
    a.revision
        .cmp(&b.revision)
        .then_with(|| {
            let t = |r: &ControllerRevision| r.metadata.creation_timestamp.as_ref().map(|t| t.0);
            t(a).cmp(&t(b))
        })
        .then_with(|| a.metadata.name.cmp(&b.metadata.name))
}

/// `history.SortControllerRevisions` (stable).
pub fn sort(revisions: &mut [Arc<ControllerRevision>]) {
    revisions.sort_by(|a, b| compare(a, b));
}

fn label_hash(rev: &ControllerRevision) -> Option<u32> {
    let s = rev.labels().get(HASH_LABEL)?;
    // Upstream parses the label as a base-10 int32; safe-encoded hashes never parse, so in
    // practice only the data decides.
    s.parse::<i32>().ok().map(|v| v as u32)
}

/// `history.EqualRevision`: equal hash labels (when both parse) and equal data.
pub fn equal(a: &ControllerRevision, b: &ControllerRevision) -> bool {
    if let (Some(x), Some(y)) = (label_hash(a), label_hash(b)) {
        if x != y {
            return false;
        }
    }
    data(a) == data(b)
}

/// `history.FindEqualRevisions`: the revisions equal to `needle`, in their order.
pub fn find_equal(
    revisions: &[Arc<ControllerRevision>],
    needle: &ControllerRevision,
) -> Vec<Arc<ControllerRevision>> {
    revisions
        .iter()
        .filter(|r| equal(r, needle))
        .cloned()
        .collect()
}

/// The next revision number after sorted `revisions`: 1 for none, else the last plus one.
pub fn next_revision(sorted: &[Arc<ControllerRevision>]) -> i64 {
    sorted.last().map(|r| r.revision + 1).unwrap_or(1)
}

/// `ListControllerRevisions`: the revisions matching `selector` that the owner `owner_uid`
/// controls or no one controls.
pub fn owned_or_orphan(
    candidates: impl IntoIterator<Item = Arc<ControllerRevision>>,
    selector: &Selector,
    owner_uid: &str,
) -> Vec<Arc<ControllerRevision>> {
    candidates
        .into_iter()
        .filter(|r| selector.matches(r.metadata.labels.as_ref()))
        .filter(|r| controller_uid(r.as_ref()).is_none_or(|uid| uid == owner_uid))
        .collect()
}

/// Truncation to a history limit: the revisions not in `live`, oldest first (`sorted` must be
/// sorted), beyond the newest `limit` of them. A negative limit keeps everything.
pub fn to_truncate(
    sorted: &[Arc<ControllerRevision>],
    live: &HashSet<&str>,
    limit: i32,
) -> Vec<Arc<ControllerRevision>> {
    let history: Vec<_> = sorted
        .iter()
        .filter(|r| !live.contains(r.name_any().as_str()))
        .cloned()
        .collect();
    let Ok(limit) = usize::try_from(limit) else {
        return Vec::new();
    };
    let excess = history.len().saturating_sub(limit);
    history.into_iter().take(excess).collect()
}

fn kube_err(action: &'static str, ns: &str, name: &str, e: kube::Error) -> Error {
    Error::Kube {
        action,
        object: format!("{ns}/{name}"),
        source: Box::new(e),
    }
}

/// `CreateControllerRevision`: creates `revision` (built by [`new_revision`]) under the owner's
/// name, re-hashing with `*collision_count` and raising it for as long as the name is taken by a
/// revision with other data. An existing revision with the same data is returned as created.
pub async fn create(
    api: &Api<ControllerRevision>,
    owner: &OwnerInfo,
    revision: &ControllerRevision,
    collision_count: &mut i32,
) -> Result<ControllerRevision> {
    let ns = revision.namespace().unwrap_or_default();
    for _ in 0..MAX_COLLISIONS {
        let hash = hash(data(revision), Some(*collision_count));
        let mut attempt = revision.clone();
        attempt.metadata.name = Some(revision_name(&owner.name, &hash));
        let name = attempt.name_any();
        match api.create(&PostParams::default(), &attempt).await {
            Ok(created) => return Ok(created),
            Err(e) if is_already_exists(&e) => {
                let existing = api
                    .get(&name)
                    .await
                    .map_err(|e| kube_err("reading ControllerRevision", &ns, &name, e))?;
                if data(&existing) == data(&attempt) {
                    return Ok(existing);
                }
                *collision_count += 1;
            }
            Err(e) => return Err(kube_err("creating ControllerRevision", &ns, &name, e)),
        }
    }
    Err(Error::Invalid {
        object: format!("ControllerRevision {ns}/{}", owner.name),
        reason: format!("metadata.name: still colliding after {MAX_COLLISIONS} collision counts"),
    })
}

/// `UpdateControllerRevision`: sets the revision number of an existing revision (a rollback to
/// it), with the object's resourceVersion as precondition so a concurrent change fails the sync
/// and is retried from the cache.
pub async fn renumber(
    api: &Api<ControllerRevision>,
    revision: &ControllerRevision,
    new_revision: i64,
) -> Result<ControllerRevision> {
    if revision.revision == new_revision {
        return Ok(revision.clone());
    }
    let mut updated = revision.clone();
    updated.revision = new_revision;
    let name = revision.name_any();
    api.replace(&name, &PostParams::default(), &updated)
        .await
        .map_err(|e| {
            kube_err(
                "renumbering ControllerRevision",
                &revision.namespace().unwrap_or_default(),
                &name,
                e,
            )
        })
}

/// `AdoptControllerRevision`: makes `owner` the controller of the orphan `revision` (strategic
/// merge on ownerReferences, the revision's uid as precondition).
pub async fn adopt(
    api: &Api<ControllerRevision>,
    owner: &OwnerInfo,
    revision: &ControllerRevision,
) -> Result<ControllerRevision> {
    let name = revision.name_any();
    let ns = revision.namespace().unwrap_or_default();
    if let Some(uid) = controller_uid(revision) {
        return Err(Error::Adoption {
            owner: format!("{} {}", owner.kind, owner.name),
            reason: format!("ControllerRevision {ns}/{name} is controlled by {uid}"),
        });
    }
    let patch = json!({"metadata": {
        "ownerReferences": [owner.controller_ref()],
        "uid": revision.metadata.uid,
    }});
    api.patch(&name, &PatchParams::default(), &Patch::Strategic(patch))
        .await
        .map_err(|e| kube_err("adopting ControllerRevision", &ns, &name, e))
}

/// Deletes a revision; one already gone counts as deleted.
pub async fn delete(api: &Api<ControllerRevision>, revision: &ControllerRevision) -> Result<()> {
    let name = revision.name_any();
    match api.delete(&name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        Err(e) => Err(kube_err(
            "deleting ControllerRevision",
            &revision.namespace().unwrap_or_default(),
            &name,
            e,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn owner() -> OwnerInfo {
        OwnerInfo {
            api_version: "apps/v1".into(),
            kind: "StatefulSet".into(),
            name: "web".into(),
            uid: "u1".into(),
        }
    }

    fn rev(name: &str, number: i64, created: i64, data: Value) -> Arc<ControllerRevision> {
        let mut r = new_revision(&owner(), "ns", &BTreeMap::new(), data, number, 0);
        r.metadata.name = Some(name.into());
        r.metadata.creation_timestamp = Some(Time(
            k8s_openapi::jiff::Timestamp::from_second(created).unwrap(),
        ));
        Arc::new(r)
    }

    #[test]
    fn go_json_sorts_keys_and_escapes_html() {
        let v = json!({"b": 1, "a": {"z": "<&>", "$patch": "replace"}, "c": [true, null]});
        assert_eq!(
            String::from_utf8(go_json(&v)).unwrap(),
            r#"{"a":{"$patch":"replace","z":"\u003c\u0026\u003e"},"b":1,"c":[true,null]}"#
        );
    }

    #[test]
    fn hash_and_names() {
        let data = json!({"spec": {"template": {"$patch": "replace"}}});
        let cases = [
            ("no probe is FNV-1 of the data alone", None, {
                let h = fnv1_32(&[&go_json(&data)]);
                safe_encode(&h.to_string())
            }),
            ("probe 0 appends the digit 0", Some(0), {
                let h = fnv1_32(&[&go_json(&data), b"0"]);
                safe_encode(&h.to_string())
            }),
            ("probe 12 appends 12", Some(12), {
                let h = fnv1_32(&[&go_json(&data), b"12"]);
                safe_encode(&h.to_string())
            }),
        ];
        for (name, probe, want) in cases {
            assert_eq!(hash(&data, probe), want, "{name}");
        }
        assert_ne!(hash(&data, Some(0)), hash(&data, Some(1)));
        assert_eq!(revision_name("web", "abc"), "web-abc");
        let long = "x".repeat(300);
        assert_eq!(revision_name(&long, "h").len(), MAX_PREFIX + 2);
        let r = new_revision(
            &owner(),
            "ns",
            &BTreeMap::from([("app".into(), "web".into())]),
            data.clone(),
            3,
            0,
        );
        let h = hash(&data, Some(0));
        assert_eq!(
            r.metadata.name.as_deref(),
            Some(format!("web-{h}").as_str())
        );
        assert_eq!(r.labels().get(HASH_LABEL), Some(&h));
        assert_eq!(r.labels().get("app").map(String::as_str), Some("web"));
        assert_eq!(controller_uid(&r), Some("u1"));
        assert_eq!(r.revision, 3);
    }

    #[test]
    fn sort_equality_and_next_revision() {
        let mut revs = vec![
            rev("c", 2, 10, json!(1)),
            rev("b", 1, 20, json!(2)),
            rev("a", 1, 20, json!(3)),
            rev("d", 1, 5, json!(1)),
        ];
        sort(&mut revs);
        let names: Vec<_> = revs.iter().map(|r| r.name_any()).collect();
        assert_eq!(
            names,
            ["d", "a", "b", "c"],
            "by number, then creation, then name"
        );
        assert_eq!(next_revision(&revs), 3);
        assert_eq!(next_revision(&[]), 1);
        let eq: Vec<_> = find_equal(&revs, &rev("x", 9, 0, json!(1)))
            .iter()
            .map(|r| r.name_any())
            .collect();
        assert_eq!(eq, ["d", "c"], "equal data, order kept");
    }

    #[test]
    fn truncation_keeps_live_and_the_newest_limit() {
        let revs: Vec<_> = (1..=5)
            .map(|i| rev(&format!("r{i}"), i, i, json!(i)))
            .collect();
        let cases: &[(&str, &[&str], i32, &[&str])] = &[
            ("limit 10 keeps all", &[], 10, &[]),
            ("limit 2 deletes the oldest 3", &[], 2, &["r1", "r2", "r3"]),
            (
                "live revisions never count nor go",
                &["r1", "r5"],
                1,
                &["r2", "r3"],
            ),
            (
                "limit 0 deletes every non-live",
                &["r3"],
                0,
                &["r1", "r2", "r4", "r5"],
            ),
            ("negative limit keeps all", &[], -1, &[]),
        ];
        for (name, live, limit, want) in cases {
            let live: HashSet<&str> = live.iter().copied().collect();
            let got: Vec<_> = to_truncate(&revs, &live, *limit)
                .iter()
                .map(|r| r.name_any())
                .collect();
            assert_eq!(got, *want, "{name}");
        }
    }

    #[test]
    fn listing_keeps_owned_and_orphans_matching_the_selector() {
        let sel = Selector::from_labels(&BTreeMap::from([("app".into(), "web".into())]));
        let mk = |name: &str, app: &str, owner: Option<&str>| {
            let mut r = new_revision(
                &owner_with(owner.unwrap_or("u1")),
                "ns",
                &BTreeMap::from([("app".into(), app.into())]),
                json!(name),
                1,
                0,
            );
            r.metadata.name = Some(name.into());
            if owner.is_none() {
                r.metadata.owner_references = None;
            }
            Arc::new(r)
        };
        fn owner_with(uid: &str) -> OwnerInfo {
            OwnerInfo {
                uid: uid.into(),
                ..owner()
            }
        }
        let got: Vec<_> = owned_or_orphan(
            [
                mk("ours", "web", Some("u1")),
                mk("orphan", "web", None),
                mk("theirs", "web", Some("u2")),
                mk("other-app", "db", Some("u1")),
            ],
            &sel,
            "u1",
        )
        .iter()
        .map(|r| r.name_any())
        .collect();
        assert_eq!(got, ["ours", "orphan"]);
    }
}
