//! What a namespace holds, as the namespace controller discovers it (client-go's
//! `ServerPreferredNamespacedResources` over the API server's aggregated discovery, then
//! `FilteredBy(SupportsAllVerbs{delete})` and `GroupVersionResources`): every namespaced
//! group-resource at its group's preferred version (else the first version serving it), custom
//! resources and aggregated APIs included, with its verbs. Group versions the server marks stale
//! are failures, reported with the rest (discovery is partial, not fatal, as upstream).
//!
//! Owns: reading discovery documents. Pure: the apply layer fetches them.

use std::collections::{BTreeMap, BTreeSet};

use kube::core::discovery::v2::APIGroupDiscoveryList;

pub use crate::helpers::discovery::Gvr;
use crate::helpers::discovery::{group_version, group_versions, is_namespaced};

/// One discovered resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resource {
    /// Plural name.
    pub name: String,
    /// The verbs it supports.
    pub verbs: Vec<String>,
}

impl Resource {
    /// Whether discovery lists `verb` for it.
    pub fn supports(&self, verb: &str) -> bool {
        self.verbs.iter().any(|v| v == verb)
    }
}

/// The resources of one group version (`metav1.APIResourceList`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceList {
    /// `group/version` as the server spells it.
    pub group_version: String,
    /// Its resources.
    pub resources: Vec<Resource>,
}

/// One discovery round.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Discovered {
    /// The namespaced resources at their preferred versions, one list per group version.
    pub lists: Vec<ResourceList>,
    /// Group versions the server could not describe, with why (`group/version` ->
    /// `stale GroupVersion discovery: group/version`).
    pub failed: BTreeMap<String, String>,
}

impl Discovered {
    /// client-go's `ErrGroupDiscoveryFailed` text, when some group versions failed.
    pub fn error(&self) -> Option<String> {
        if self.failed.is_empty() {
            return None;
        }
        let mut groups: Vec<String> = self
            .failed
            .iter()
            .map(|(gv, why)| format!("{gv}: {why}"))
            .collect();
        groups.sort();
        Some(format!(
            "unable to retrieve the complete list of server APIs: {}",
            groups.join(", ")
        ))
    }
}

/// `ServerPreferredNamespacedResources` over the aggregated discovery documents (`/api`'s then
/// `/apis`'): within a group, versions come in preference order and the first fresh one is
/// preferred; a group-resource is taken at the preferred version, else at the first version
/// serving it. Subresources are left out.
pub fn preferred_namespaced(docs: &[APIGroupDiscoveryList]) -> Discovered {
    let mut out = Discovered::default();
    // (group, resource) -> (version, resource, namespaced), and each group's preferred version.
    let mut chosen: BTreeMap<(String, String), (String, Resource, bool)> = BTreeMap::new();
    let mut preferred: BTreeMap<String, String> = BTreeMap::new();
    // Group versions in discovery order, for a stable output.
    let mut order: Vec<(String, String)> = Vec::new();
    for gv in group_versions(docs) {
        let (name, v) = (gv.group, gv.version);
        if gv.stale {
            let gv = group_version(&name, &v);
            out.failed
                .insert(gv.clone(), format!("stale GroupVersion discovery: {gv}"));
            continue;
        }
        preferred.entry(name.clone()).or_insert_with(|| v.clone());
        order.push((name.clone(), v.clone()));
        for (plural, res) in gv.resources {
            let key = (name.clone(), plural.clone());
            let is_preferred = preferred.get(&name) == Some(&v);
            if chosen.contains_key(&key) && !is_preferred {
                continue; // only the preferred version overrides
            }
            let resource = Resource {
                name: plural,
                verbs: res.verbs.clone(),
            };
            chosen.insert(key, (v.clone(), resource, is_namespaced(res)));
        }
    }
    for (group, version) in order {
        let resources: Vec<Resource> = chosen
            .iter()
            .filter(|((g, _), (v, _, namespaced))| *g == group && *v == version && *namespaced)
            .map(|(_, (_, r, _))| r.clone())
            .collect();
        // FilteredBy drops the lists left empty.
        if !resources.is_empty() {
            out.lists.push(ResourceList {
                group_version: group_version(&group, &version),
                resources,
            });
        }
    }
    out
}

/// The resources that support every one of `verbs` (`FilteredBy(SupportsAllVerbs)`; lists left
/// empty are dropped).
pub fn supporting(lists: &[ResourceList], verbs: &[&str]) -> Vec<ResourceList> {
    lists
        .iter()
        .filter_map(|l| {
            let resources: Vec<Resource> = l
                .resources
                .iter()
                .filter(|r| verbs.iter().all(|v| r.supports(v)))
                .cloned()
                .collect();
            (!resources.is_empty()).then(|| ResourceList {
                group_version: l.group_version.clone(),
                resources,
            })
        })
        .collect()
}

/// apimachinery's `schema.ParseGroupVersion`: `""` and `"/"` are the empty group version, `v` the
/// core group's, `g/v` a group's; more slashes are an error.
pub fn parse_group_version(gv: &str) -> Result<(String, String), String> {
    if gv.is_empty() || gv == "/" {
        return Ok((String::new(), String::new()));
    }
    match gv.matches('/').count() {
        0 => Ok((String::new(), gv.to_string())),
        1 => {
            let (g, v) = gv.split_once('/').expect("one slash");
            Ok((g.to_string(), v.to_string()))
        }
        _ => Err(format!("unexpected GroupVersion string: {gv}")),
    }
}

/// `discovery.GroupVersionResources`: every resource of the lists with its parsed group version;
/// the first list whose group version does not parse makes the whole an error (so nothing is
/// deleted in that round, as upstream).
pub fn group_version_resources(lists: &[ResourceList]) -> Result<BTreeMap<Gvr, Resource>, String> {
    let mut out = BTreeMap::new();
    for l in lists {
        let (group, version) = parse_group_version(&l.group_version)?;
        for r in &l.resources {
            out.insert(
                Gvr {
                    group: group.clone(),
                    version: version.clone(),
                    resource: r.name.clone(),
                },
                r.clone(),
            );
        }
    }
    Ok(out)
}

/// The set of group/version/resources, for tests and logs.
pub fn gvr_set(gvrs: &BTreeMap<Gvr, Resource>) -> BTreeSet<Gvr> {
    gvrs.keys().cloned().collect()
}

#[cfg(test)]
#[path = "discovery_tests.rs"]
mod tests;
