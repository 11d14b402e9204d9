//! Which PersistentVolume a claim gets (upstream's `persistentVolumeOrderedIndex.findByClaim` in
//! `pkg/controller/volume/persistentvolume/index.go` and component-helpers'
//! `storage/volume.FindMatchingVolume`, the PV controller's path: no Node), and the predicates
//! around binding (`IsVolumeBoundToClaim`, `checkVolumeSatisfyClaim`, volume modes, classes).
//!
//! Owns matching only; pure over the objects given.
//!
//! The volumes are grouped by their access-mode set; the groups holding every mode the claim asks
//! for are tried fewest modes first, and within a group: a volume pre-bound to the claim (its
//! claimRef names the claim) wins outright; otherwise the smallest Available volume of the
//! claim's class, big enough, of its volumeMode, matching its selector, not being deleted. With
//! delayed binding (a WaitForFirstConsumer class) only pre-bound volumes are taken: the
//! scheduler picks the others.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};

use crate::helpers::quantity::Quantity;
use crate::helpers::selector::Selector;

/// The beta annotation naming a claim's or volume's class (still read by upstream).
pub const ANN_BETA_STORAGE_CLASS: &str = "volume.beta.kubernetes.io/storage-class";

/// A claim's class (`GetPersistentVolumeClaimClass`): the beta annotation first, then
/// `spec.storageClassName`, else "".
pub fn claim_class(claim: &PersistentVolumeClaim) -> String {
    if let Some(c) = claim
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANN_BETA_STORAGE_CLASS))
    {
        return c.clone();
    }
    claim
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.clone())
        .unwrap_or_default()
}

/// Whether the claim names a class at all, "" included (`PersistentVolumeClaimHasClass`).
pub fn claim_has_class(claim: &PersistentVolumeClaim) -> bool {
    claim
        .spec
        .as_ref()
        .is_some_and(|s| s.storage_class_name.is_some())
        || claim
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(ANN_BETA_STORAGE_CLASS))
}

/// A volume's class (`GetPersistentVolumeClass`).
pub fn volume_class(volume: &PersistentVolume) -> String {
    if let Some(c) = volume
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANN_BETA_STORAGE_CLASS))
    {
        return c.clone();
    }
    volume
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.clone())
        .unwrap_or_default()
}

/// The volume's `status.phase` ("" when unset).
pub fn volume_phase(volume: &PersistentVolume) -> &str {
    volume
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

/// The claim's `status.phase` ("" when unset).
pub fn claim_phase(claim: &PersistentVolumeClaim) -> &str {
    claim
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

/// The claim's `spec.volumeName` ("" when unset).
pub fn claim_volume_name(claim: &PersistentVolumeClaim) -> &str {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .unwrap_or_default()
}

/// The volume's `spec.claimRef` as `(namespace, name, uid)`, "" for what is unset.
pub fn claim_ref(volume: &PersistentVolume) -> Option<(&str, &str, &str)> {
    let r = volume.spec.as_ref()?.claim_ref.as_ref()?;
    Some((
        r.namespace.as_deref().unwrap_or_default(),
        r.name.as_deref().unwrap_or_default(),
        r.uid.as_deref().unwrap_or_default(),
    ))
}

/// Whether the volume is pre-bound or bound to the claim (`IsVolumeBoundToClaim`): its claimRef
/// names the claim and, when it has a uid, the claim's uid.
pub fn is_volume_bound_to_claim(volume: &PersistentVolume, claim: &PersistentVolumeClaim) -> bool {
    let Some((ns, name, uid)) = claim_ref(volume) else {
        return false;
    };
    let meta = &claim.metadata;
    if Some(name) != meta.name.as_deref() || Some(ns) != meta.namespace.as_deref() {
        return false;
    }
    uid.is_empty() || Some(uid) == meta.uid.as_deref()
}

/// A storage quantity of a resource list ("0" when missing or unreadable, as a zero
/// `resource.Quantity`).
fn storage_of(
    list: Option<
        &std::collections::BTreeMap<
            String,
            k8s_openapi::apimachinery::pkg::api::resource::Quantity,
        >,
    >,
) -> Quantity {
    list.and_then(|l| l.get("storage"))
        .and_then(|q| Quantity::parse(&q.0).ok())
        .unwrap_or_default()
}

/// The storage the claim requests.
pub fn requested_storage(claim: &PersistentVolumeClaim) -> Quantity {
    storage_of(
        claim
            .spec
            .as_ref()
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| r.requests.as_ref()),
    )
}

/// The volume's storage capacity.
pub fn volume_capacity(volume: &PersistentVolume) -> Quantity {
    storage_of(volume.spec.as_ref().and_then(|s| s.capacity.as_ref()))
}

/// Whether the claim's and the volume's volumeModes differ, an unset one being Filesystem
/// (`CheckVolumeModeMismatches`).
pub fn volume_mode_mismatch(claim: &PersistentVolumeClaim, volume: &PersistentVolume) -> bool {
    let wanted = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_mode.as_deref())
        .unwrap_or("Filesystem");
    let has = volume
        .spec
        .as_ref()
        .and_then(|s| s.volume_mode.as_deref())
        .unwrap_or("Filesystem");
    wanted != has
}

fn claim_modes(claim: &PersistentVolumeClaim) -> &[String] {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.access_modes.as_deref())
        .unwrap_or_default()
}

fn volume_modes(volume: &PersistentVolume) -> &[String] {
    volume
        .spec
        .as_ref()
        .and_then(|s| s.access_modes.as_deref())
        .unwrap_or_default()
}

/// Whether the volume has every access mode the claim asks for (`CheckAccessModes`).
pub fn has_access_modes(claim: &PersistentVolumeClaim, volume: &PersistentVolume) -> bool {
    let has = volume_modes(volume);
    claim_modes(claim).iter().all(|m| has.contains(m))
}

fn vac_of_claim(claim: &PersistentVolumeClaim) -> &str {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_attributes_class_name.as_deref())
        .unwrap_or_default()
}

fn vac_of_volume(volume: &PersistentVolume) -> &str {
    volume
        .spec
        .as_ref()
        .and_then(|s| s.volume_attributes_class_name.as_deref())
        .unwrap_or_default()
}

/// Why the volume a claim names in `spec.volumeName` cannot be bound to it
/// (`checkVolumeSatisfyClaim`, VolumeAttributesClass on as in v1.34), `None` when it can.
pub fn volume_unsatisfying(
    volume: &PersistentVolume,
    claim: &PersistentVolumeClaim,
) -> Option<String> {
    let name = volume.metadata.name.as_deref().unwrap_or_default();
    if volume.metadata.deletion_timestamp.is_some() {
        return Some(format!("the volume is marked for deletion {name:?}"));
    }
    // Upstream compares `Quantity.Value()`s (whole units, rounded up).
    if volume_capacity(volume).value() < requested_storage(claim).value() {
        return Some("requested PV is too small".into());
    }
    if volume_class(volume) != claim_class(claim) {
        return Some("storageClassName does not match".into());
    }
    if vac_of_claim(claim) != vac_of_volume(volume) {
        return Some("volumeAttributesClassName does not match".into());
    }
    if volume_mode_mismatch(claim, volume) {
        return Some("incompatible volumeMode".into());
    }
    if !has_access_modes(claim, volume) {
        return Some("incompatible accessMode".into());
    }
    None
}

/// `findBestMatchForClaim`: the volume of `volumes` the claim binds to, `None` when none fits;
/// `Err` when the claim's selector cannot be read (the message names the claim).
pub fn find_best_match<'a>(
    claim: &PersistentVolumeClaim,
    volumes: &'a [std::sync::Arc<PersistentVolume>],
    delay_binding: bool,
) -> Result<Option<&'a PersistentVolume>, String> {
    // The index's keys: every access-mode set some volume has, as upstream's `accessmodes` index
    // (modes kept in its fixed order: RWO, ROX, RWX, RWOP).
    let order = [
        "ReadWriteOnce",
        "ReadOnlyMany",
        "ReadWriteMany",
        "ReadWriteOncePod",
    ];
    let key_of = |v: &PersistentVolume| -> Vec<String> {
        let modes = volume_modes(v);
        order
            .iter()
            .filter(|m| modes.iter().any(|x| x == *m))
            .map(|m| m.to_string())
            .collect()
    };
    let keys: BTreeSet<Vec<String>> = volumes.iter().map(|v| key_of(v)).collect();
    let wanted = claim_modes(claim);
    let mut groups: Vec<&Vec<String>> = keys
        .iter()
        .filter(|k| wanted.iter().all(|m| k.contains(m)))
        .collect();
    // Fewest modes first (a stable sort; upstream's `sort.Sort` order among equal lengths is
    // its index's).
    groups.sort_by_key(|k| k.len());
    for key in groups {
        let group: Vec<&PersistentVolume> = volumes
            .iter()
            .map(|v| &**v)
            .filter(|v| &key_of(v) == key)
            .collect();
        if let Some(v) = find_matching_volume(claim, &group, delay_binding)? {
            return Ok(Some(v));
        }
    }
    Ok(None)
}

/// `FindMatchingVolume` without a Node (the PV controller's path).
pub fn find_matching_volume<'a>(
    claim: &PersistentVolumeClaim,
    volumes: &[&'a PersistentVolume],
    delay_binding: bool,
) -> Result<Option<&'a PersistentVolume>, String> {
    let key = format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or_default(),
        claim.metadata.name.as_deref().unwrap_or_default()
    );
    let requested = requested_storage(claim);
    let class = claim_class(claim);
    let selector = match claim.spec.as_ref().and_then(|s| s.selector.as_ref()) {
        Some(sel) => Some(Selector::parse(Some(sel)).map_err(|e| {
            format!("error creating internal label selector for claim: {key}: {e}")
        })?),
        None => None,
    };
    let mut smallest: Option<(&PersistentVolume, Quantity)> = None;
    for &volume in volumes {
        if claim_ref(volume).is_some() && !is_volume_bound_to_claim(volume, claim) {
            continue;
        }
        let size = volume_capacity(volume);
        if size < requested {
            continue;
        }
        if volume_mode_mismatch(claim, volume) {
            continue;
        }
        if vac_of_claim(claim) != vac_of_volume(volume) {
            continue;
        }
        if volume.metadata.deletion_timestamp.is_some() {
            continue;
        }
        if is_volume_bound_to_claim(volume, claim) {
            return Ok(Some(volume));
        }
        if delay_binding {
            continue;
        }
        if volume_phase(volume) != "Available" {
            continue;
        }
        if let Some(sel) = &selector {
            if !sel.matches(volume.metadata.labels.as_ref()) {
                continue;
            }
        }
        if volume_class(volume) != class {
            continue;
        }
        if smallest.as_ref().is_none_or(|(_, q)| *q > size) {
            smallest = Some((volume, size));
        }
    }
    Ok(smallest.map(|(v, _)| v))
}
