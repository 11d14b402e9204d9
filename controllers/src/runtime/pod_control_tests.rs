//! The pod control: the Pod a template makes. Creations and deletions against the reference
//! kube-apiserver are `controllers/tests/pod_control.rs`.

use serde_json::json;

use super::*;

fn owner_info(name: &str) -> OwnerInfo {
    OwnerInfo {
        api_version: "apps/v1".into(),
        kind: "ReplicaSet".into(),
        name: name.into(),
        uid: "uid-1".into(),
    }
}

#[test]
fn ctl_pod_from_template_as_get_pod_from_template() {
    let template: PodTemplateSpec = serde_json::from_value(json!({
        "metadata": {"name": "ignored", "labels": {"app": "web"}, "annotations": {},
                     "finalizers": ["f/x"]},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    }))
    .unwrap();
    let pod = pod_from_template(&template, &owner_info("web"));
    let meta = &pod.metadata;
    assert_eq!(meta.generate_name.as_deref(), Some("web-"));
    assert_eq!(meta.name, None, "the template's name is not the Pod's");
    assert_eq!(meta.labels.as_ref().unwrap()["app"], "web");
    assert_eq!(meta.annotations, None, "empty annotations are left out");
    assert_eq!(meta.finalizers.as_deref(), Some(&["f/x".to_string()][..]));
    let refs = meta.owner_references.as_ref().unwrap();
    assert_eq!(refs.len(), 1);
    assert_eq!(
        (
            refs[0].kind.as_str(),
            refs[0].controller,
            refs[0].block_owner_deletion
        ),
        ("ReplicaSet", Some(true), Some(true)),
        "the controller reference, as NewControllerRef"
    );
    assert_eq!(pod.spec, template.spec);

    let long = "a".repeat(MAX_NAME_LEN);
    assert_eq!(
        generate_name_prefix(&long),
        long,
        "no dash when it would make the name too long"
    );
    assert_eq!(
        generate_name_prefix(&"a".repeat(MAX_NAME_LEN - 1)).len(),
        MAX_NAME_LEN
    );
}
