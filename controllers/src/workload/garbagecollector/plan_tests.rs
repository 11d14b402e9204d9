//! Named cases for the garbage collector's decisions.

use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

fn oref(name: &str, uid: &str, block: Option<bool>) -> OwnerReference {
    OwnerReference {
        api_version: "apps/v1".into(),
        kind: "ReplicaSet".into(),
        name: name.into(),
        uid: uid.into(),
        controller: Some(true),
        block_owner_deletion: block,
    }
}

fn meta(uid: &str, deleting: bool, finalizers: &[&str]) -> ObjectMeta {
    ObjectMeta {
        uid: Some(uid.into()),
        deletion_timestamp: deleting.then(|| Time("2026-01-01T00:00:00Z".parse().unwrap())),
        finalizers: Some(finalizers.iter().map(|f| f.to_string()).collect()),
        ..ObjectMeta::default()
    }
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn gc3_owner_classification() {
    let r = oref("rs", "u1", Some(true));
    let cases: Vec<(&str, Option<ObjectMeta>, OwnerClass)> = vec![
        (
            "GC-3 dangling: the owner is not found",
            None,
            OwnerClass::Dangling,
        ),
        (
            "GC-3 dangling: another object has the owner's name (uid mismatch)",
            Some(meta("u2", false, &[])),
            OwnerClass::Dangling,
        ),
        (
            "GC-3 solid: the owner exists",
            Some(meta("u1", false, &[])),
            OwnerClass::Solid,
        ),
        (
            "GC-3 solid: being deleted without foregroundDeletion (background or orphan)",
            Some(meta("u1", true, &["orphan"])),
            OwnerClass::Solid,
        ),
        (
            "GC-3 solid: foregroundDeletion present but not yet being deleted",
            Some(meta("u1", false, &["foregroundDeletion"])),
            OwnerClass::Solid,
        ),
        (
            "GC-3 waiting: being deleted with foregroundDeletion",
            Some(meta("u1", true, &["foregroundDeletion"])),
            OwnerClass::WaitingForDependentsDeletion,
        ),
    ];
    for (name, found, want) in cases {
        assert_eq!(classify_owner(&r, found.as_ref()), want, "{name}");
    }
}

#[test]
fn gc3_three_way_decision() {
    let solid = oref("solid", "s", Some(true));
    let gone = oref("gone", "g", Some(true));
    let waiting = oref("waiting", "w", Some(true));
    let c = |s: &[&OwnerReference], d: &[&OwnerReference], w: &[&OwnerReference]| Classified {
        solid: s.iter().map(|r| (*r).clone()).collect(),
        dangling: d.iter().map(|r| (*r).clone()).collect(),
        waiting: w.iter().map(|r| (*r).clone()).collect(),
    };
    type Case = (&'static str, Classified, Vec<bool>, Vec<String>, Decision);
    let cases: Vec<Case> = vec![
        (
            "GC-3 (a) only solid owners: keep, nothing to patch",
            c(&[&solid], &[], &[]),
            vec![],
            vec![],
            Decision::Keep,
        ),
        (
            "GC-3 (a) a solid owner and dangling and waiting ones: patch those out, dangling first",
            c(&[&solid], &[&gone], &[&waiting]),
            vec![false],
            vec![],
            Decision::RemoveReferences(strings(&["g", "w"])),
        ),
        (
            "GC-3 (b) waiting owner and the item has dependents: foreground delete",
            c(&[], &[&gone], &[&waiting]),
            vec![false, false],
            vec![],
            Decision::DeleteForeground {
                unblock_first: false,
            },
        ),
        (
            "GC-3 (b) a dependent itself deleting dependents: unblock first to avoid a cycle",
            c(&[], &[], &[&waiting]),
            vec![false, true],
            vec![],
            Decision::DeleteForeground {
                unblock_first: true,
            },
        ),
        (
            "GC-3 (c) waiting owner but no dependents: background delete",
            c(&[], &[], &[&waiting]),
            vec![],
            vec![],
            Decision::Delete(PropagationPolicy::Background),
        ),
        (
            "GC-1 (c) every owner dangling: background delete",
            c(&[], &[&gone], &[]),
            vec![true],
            vec![],
            Decision::Delete(PropagationPolicy::Background),
        ),
        (
            "GC-3 (c) the item's orphan finalizer gives Orphan",
            c(&[], &[&gone], &[]),
            vec![],
            strings(&["example.com/x", "orphan"]),
            Decision::Delete(PropagationPolicy::Orphan),
        ),
        (
            "GC-3 (c) the item's foregroundDeletion finalizer gives Foreground",
            c(&[], &[&gone], &[]),
            vec![],
            strings(&["foregroundDeletion"]),
            Decision::Delete(PropagationPolicy::Foreground),
        ),
        (
            "GC-3 (c) orphan wins over foregroundDeletion",
            c(&[], &[&gone], &[]),
            vec![],
            strings(&["foregroundDeletion", "orphan"]),
            Decision::Delete(PropagationPolicy::Orphan),
        ),
    ];
    for (name, classified, deps, finalizers, want) in cases {
        assert_eq!(decide(&classified, &deps, &finalizers), want, "{name}");
    }
}

#[test]
fn gc3_patches() {
    let a = oref("a", "ua", Some(true));
    let b = oref("b", "ub", None);
    let cases: Vec<(&str, Value, Value)> = vec![
        (
            "GC-3 (a) / GC-6 strategic merge: delete directives by owner uid, guarded by the item's uid",
            delete_owner_refs_strategic("dep", &strings(&["ua", "ux"])),
            json!({"metadata": {"ownerReferences": [
                {"$patch": "delete", "uid": "ua"}, {"$patch": "delete", "uid": "ux"}], "uid": "dep"}}),
        ),
        (
            "GC-3 (a) / GC-6 JSON merge fallback: the remaining list at the read resourceVersion",
            delete_owner_refs_merge("7", &[a.clone(), b.clone()], &strings(&["ua"])),
            json!({"metadata": {"resourceVersion": "7", "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "b", "uid": "ub", "controller": true}]}}),
        ),
        (
            "GC-6 JSON merge fallback removing the last reference writes null",
            delete_owner_refs_merge("7", std::slice::from_ref(&a), &strings(&["ua"])),
            json!({"metadata": {"resourceVersion": "7", "ownerReferences": null}}),
        ),
        (
            "GC-3 (b) unblock: only the blocking references, set to false",
            unblock_owner_refs_strategic("dep", &[a.clone(), b.clone()]),
            json!({"metadata": {"uid": "dep", "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "a", "uid": "ua",
                 "controller": true, "blockOwnerDeletion": false}]}}),
        ),
        (
            "GC-3 (b) unblock fallback: every reference with blockOwnerDeletion=false",
            unblock_owner_refs_merge("9", &[a.clone(), b.clone()]),
            json!({"metadata": {"resourceVersion": "9", "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "a", "uid": "ua",
                 "controller": true, "blockOwnerDeletion": false},
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "b", "uid": "ub",
                 "controller": true, "blockOwnerDeletion": false}]}}),
        ),
        (
            "GC-5 finalizer removal: the rest, guarded by resourceVersion",
            finalizers_merge("3", &strings(&["example.com/x"])),
            json!({"metadata": {"resourceVersion": "3", "finalizers": ["example.com/x"]}}),
        ),
        (
            "GC-5 removing the last finalizer writes null",
            finalizers_merge("3", &[]),
            json!({"metadata": {"resourceVersion": "3", "finalizers": null}}),
        ),
    ];
    for (name, got, want) in cases {
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn gc5_each_finalizer_removes_only_itself() {
    type Case = (&'static str, Vec<String>, &'static str, Option<Vec<String>>);
    let cases: Vec<Case> = vec![
        (
            "GC-6 orphan removed, others kept",
            strings(&["a", "orphan", "b"]),
            "orphan",
            Some(strings(&["a", "b"])),
        ),
        (
            "GC-4 foregroundDeletion removed",
            strings(&["foregroundDeletion"]),
            "foregroundDeletion",
            Some(vec![]),
        ),
        (
            "GC-5 already gone: nothing to write",
            strings(&["a"]),
            "orphan",
            None,
        ),
    ];
    for (name, have, target, want) in cases {
        assert_eq!(without_finalizer(&have, target), want, "{name}");
    }
}

#[test]
fn gc3_delete_conflict_retries_without_resource_version_only_when_owners_are_unchanged() {
    let owners = vec![oref("gone", "g", Some(true))];
    let live = |uid: &str, rv: &str, owners: Vec<OwnerReference>| ObjectMeta {
        uid: Some(uid.into()),
        resource_version: Some(rv.into()),
        owner_references: Some(owners),
        ..ObjectMeta::default()
    };
    let cases = [
        (
            "GC-3 only the resourceVersion moved: retry",
            live("u", "6", owners.clone()),
            true,
        ),
        (
            "GC-3 owner references changed meanwhile: do not delete",
            live("u", "6", vec![oref("new", "n", Some(true))]),
            false,
        ),
        (
            "GC-3 another object under the name: do not delete",
            live("v", "6", owners.clone()),
            false,
        ),
        (
            "GC-3 same resourceVersion: the conflict was not ours",
            live("u", "5", owners.clone()),
            false,
        ),
    ];
    for (name, l, want) in cases {
        assert_eq!(
            retry_delete_without_resource_version("u", "5", &owners, &l),
            want,
            "{name}"
        );
    }
}

#[test]
fn gc7_where_owners_are_looked_up() {
    let cases = [
        (
            "GC-7 a namespaced owner is looked up in the dependent's namespace",
            true,
            "a",
            Ok(Some("a")),
        ),
        (
            "GC-7 a cluster-scoped owner is looked up cluster-wide",
            false,
            "a",
            Ok(None),
        ),
        (
            "GC-7 cluster-scoped dependent, cluster-scoped owner",
            false,
            "",
            Ok(None),
        ),
        (
            "GC-7 a cluster-scoped dependent cannot name a namespaced owner",
            true,
            "",
            Err(NamespacedOwnerOfClusterScoped),
        ),
    ];
    for (name, namespaced, ns, want) in cases {
        assert_eq!(lookup_namespace(namespaced, ns), want, "{name}");
    }
}
