//! The volume binder's assume cache, as upstream's util/assumecache: the informers'
//! PersistentVolumes and PersistentVolumeClaims with the versions this scheduler has assumed
//! (a volume's claimRef set in Reserve, a claim's selected-node annotation) laid over them, so
//! that the next Pod's Filter does not take a volume an earlier Pod was given before the API
//! shows it.
//!
//! An assumed object wins while the informer's copy is not newer (its resourceVersion not
//! greater); once the informer shows a newer version (the API write, or anyone else's), that
//! one is read and the assumed copy dropped. [`AssumeCache::restore_pv`] /
//! [`AssumeCache::restore_pvc`] drop an assumption (Unreserve, a failed PreBind).
//!
//! Owns only the assumed copies; the informer objects are the scheduler's
//! ([`ClusterObjects`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::scheduler::framework::ClusterObjects;
use crate::scheduler::plugins::volume_util::volume_class;

/// Informer objects with assumed versions over them.
pub struct AssumeCache {
    objects: Arc<dyn ClusterObjects>,
    pvs: Mutex<HashMap<String, Arc<PersistentVolume>>>,
    pvcs: Mutex<HashMap<(String, String), Arc<PersistentVolumeClaim>>>,
}

/// resourceVersions are opaque, but the API server's are integers that only grow (upstream's
/// assume cache compares them the same way); an unparseable one counts as 0.
fn version(m: &ObjectMeta) -> u64 {
    m.resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The assumed copy when the informer's is not newer, else the informer's.
fn newest<K: Clone>(
    api: Option<Arc<K>>,
    assumed: Option<&Arc<K>>,
    meta: fn(&K) -> &ObjectMeta,
) -> (Option<Arc<K>>, bool) {
    match (api, assumed) {
        (Some(a), Some(s)) if version(meta(&a)) > version(meta(s)) => (Some(a), true),
        (_, Some(s)) => (Some(s.clone()), false),
        (a, None) => (a, false),
    }
}

impl AssumeCache {
    pub fn new(objects: Arc<dyn ClusterObjects>) -> AssumeCache {
        AssumeCache {
            objects,
            pvs: Mutex::default(),
            pvcs: Mutex::default(),
        }
    }

    pub fn objects(&self) -> &dyn ClusterObjects {
        &*self.objects
    }

    pub fn get_pv(&self, name: &str) -> Option<Arc<PersistentVolume>> {
        let mut pvs = self.pvs.lock().expect("assume cache lock");
        let (pv, stale) = newest(self.objects.persistent_volume(name), pvs.get(name), |p| {
            &p.metadata
        });
        if stale {
            pvs.remove(name);
        }
        pv
    }

    /// The informer's version, assumptions ignored (PreBind waits on it).
    pub fn get_api_pv(&self, name: &str) -> Option<Arc<PersistentVolume>> {
        self.objects.persistent_volume(name)
    }

    pub fn get_pvc(&self, ns: &str, name: &str) -> Option<Arc<PersistentVolumeClaim>> {
        let mut pvcs = self.pvcs.lock().expect("assume cache lock");
        let key = (ns.to_string(), name.to_string());
        let (pvc, stale) = newest(
            self.objects.persistent_volume_claim(ns, name),
            pvcs.get(&key),
            |p| &p.metadata,
        );
        if stale {
            pvcs.remove(&key);
        }
        pvc
    }

    pub fn get_api_pvc(&self, ns: &str, name: &str) -> Option<Arc<PersistentVolumeClaim>> {
        self.objects.persistent_volume_claim(ns, name)
    }

    /// The volumes of one class (upstream's ListPVs by class index), assumptions applied, in
    /// name order.
    pub fn list_pvs(&self, class: &str) -> Vec<Arc<PersistentVolume>> {
        let pvs = self.pvs.lock().expect("assume cache lock");
        self.objects
            .persistent_volumes()
            .into_iter()
            .filter_map(|api| {
                let name = api.metadata.name.clone().unwrap_or_default();
                newest(Some(api), pvs.get(&name), |p| &p.metadata).0
            })
            .filter(|pv| volume_class(pv) == class)
            .collect()
    }

    /// Assumes `pv` (a modified copy of the version the cache shows). Refused when the cache
    /// already shows a newer version, as upstream's Assume.
    pub fn assume_pv(&self, pv: PersistentVolume) -> Result<(), String> {
        let name = pv.metadata.name.clone().unwrap_or_default();
        if let Some(cur) = self.get_pv(&name) {
            if version(&pv.metadata) < version(&cur.metadata) {
                return Err(format!(
                    "PersistentVolume {name:?}: out of sync: the cache has version {:?}, assumed {:?}",
                    cur.metadata.resource_version, pv.metadata.resource_version
                ));
            }
        }
        self.pvs
            .lock()
            .expect("assume cache lock")
            .insert(name, Arc::new(pv));
        Ok(())
    }

    pub fn assume_pvc(&self, pvc: PersistentVolumeClaim) -> Result<(), String> {
        let key = (
            pvc.metadata.namespace.clone().unwrap_or_default(),
            pvc.metadata.name.clone().unwrap_or_default(),
        );
        if let Some(cur) = self.get_pvc(&key.0, &key.1) {
            if version(&pvc.metadata) < version(&cur.metadata) {
                return Err(format!(
                    "PersistentVolumeClaim \"{}/{}\": out of sync: the cache has version {:?}, assumed {:?}",
                    key.0, key.1, cur.metadata.resource_version, pvc.metadata.resource_version
                ));
            }
        }
        self.pvcs
            .lock()
            .expect("assume cache lock")
            .insert(key, Arc::new(pvc));
        Ok(())
    }

    pub fn restore_pv(&self, name: &str) {
        self.pvs.lock().expect("assume cache lock").remove(name);
    }

    pub fn restore_pvc(&self, ns: &str, name: &str) {
        self.pvcs
            .lock()
            .expect("assume cache lock")
            .remove(&(ns.to_string(), name.to_string()));
    }
}
