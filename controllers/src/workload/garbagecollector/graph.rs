//! The garbage collector's owner/dependent graph (upstream's `GraphBuilder` state and
//! `processGraphChanges`), as pure data: [`Graph::process`] applies one observed (or virtual)
//! change and returns what must happen next ([`Effect`]: items for the attempt-to-delete and
//! attempt-to-orphan queues, owners now known to be absent, invalid-namespace warnings). It owns
//! the nodes and their edges; it never talks to the API server and never touches the queues
//! itself, so every routing rule is unit-tested (`graph_tests.rs`).
//!
//! Nodes are keyed by uid. An owner referenced before (or without) being observed is a *virtual*
//! node: its coordinates are the first referencing dependent's guess (apiVersion, kind, name, the
//! dependent's namespace) until a watch event shows the real object, and it is queued for
//! attempt-to-delete so the workers verify it against the API server (GC-2, GC-7).

use std::collections::{HashMap, HashSet};
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

/// `metadata.finalizers` entry asking the GC to orphan the dependents before the object goes.
pub const FINALIZER_ORPHAN: &str = "orphan";
/// `metadata.finalizers` entry asking the GC to delete the blocking dependents first.
pub const FINALIZER_DELETE_DEPENDENTS: &str = "foregroundDeletion";

/// An object's coordinates as the graph knows them (upstream `objectReference`): the owner
/// reference coordinates plus the namespace (empty for cluster-scoped objects).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ObjectRef {
    /// `apps/v1`, `v1`, ...
    pub api_version: String,
    /// `ReplicaSet`, ...
    pub kind: String,
    /// Empty for cluster-scoped objects (and for virtual owners referenced from one).
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid`.
    pub uid: String,
}

impl ObjectRef {
    /// The coordinates an owner reference names, placed in `namespace`.
    pub fn from_owner(owner: &OwnerReference, namespace: &str) -> Self {
        Self {
            api_version: owner.api_version.clone(),
            kind: owner.kind.clone(),
            namespace: namespace.to_string(),
            name: owner.name.clone(),
            uid: owner.uid.clone(),
        }
    }

    /// Whether `owner` names exactly these coordinates (uid, name, kind, apiVersion; upstream
    /// `ownerReferenceMatchesCoordinates`).
    pub fn matches_owner(&self, owner: &OwnerReference) -> bool {
        owner.uid == self.uid
            && owner.name == self.name
            && owner.kind == self.kind
            && owner.api_version == self.api_version
    }

    /// Upstream's `referenceLessThan`: kind, apiVersion, namespace, name, uid.
    fn sort_key(&self) -> (&str, &str, &str, &str, &str) {
        (
            &self.kind,
            &self.api_version,
            &self.namespace,
            &self.name,
            &self.uid,
        )
    }
}

impl fmt::Display for ObjectRef {
    /// Upstream's text form, which its warning events quote.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[{}/{}, namespace: {}, name: {}, uid: {}]",
            self.api_version, self.kind, self.namespace, self.name, self.uid
        )
    }
}

/// What the graph needs of one object's state.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Meta {
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace` (empty when cluster-scoped).
    pub namespace: String,
    /// `metadata.ownerReferences`.
    pub owners: Vec<OwnerReference>,
    /// The part of the state compared between an update's old and new versions.
    pub flags: Flags,
}

/// Deletion state: whether `deletionTimestamp` is set and which GC finalizers are present.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flags {
    /// `metadata.deletionTimestamp` is set.
    pub being_deleted: bool,
    /// `orphan` is among the finalizers.
    pub orphan_finalizer: bool,
    /// `foregroundDeletion` is among the finalizers.
    pub delete_dependents_finalizer: bool,
}

impl Flags {
    /// The flags of an object with this deletion timestamp state and these finalizers.
    pub fn new(being_deleted: bool, finalizers: &[String]) -> Self {
        Self {
            being_deleted,
            orphan_finalizer: finalizers.iter().any(|f| f == FINALIZER_ORPHAN),
            delete_dependents_finalizer: finalizers
                .iter()
                .any(|f| f == FINALIZER_DELETE_DEPENDENTS),
        }
    }
}

/// Kind of change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    /// First observation.
    Add,
    /// A later version.
    Update,
    /// The object is gone.
    Delete,
}

/// One change fed to the graph (upstream `event`).
#[derive(Clone, Debug, PartialEq)]
pub struct GraphEvent {
    /// Add, update or delete.
    pub event_type: EventType,
    /// Not observed by a watch: a worker found the object absent (upstream's virtual delete).
    pub virtual_: bool,
    /// The apiVersion of the watched resource (or of the virtual node's coordinates).
    pub api_version: String,
    /// Its kind.
    pub kind: String,
    /// The object's state in this change.
    pub object: Meta,
    /// For an update: the previous version's deletion state.
    pub old: Option<Flags>,
}

impl GraphEvent {
    /// The identity this event shows (upstream `identityFromEvent`).
    pub fn identity(&self) -> ObjectRef {
        ObjectRef {
            api_version: self.api_version.clone(),
            kind: self.kind.clone(),
            namespace: self.object.namespace.clone(),
            name: self.object.name.clone(),
            uid: self.object.uid.clone(),
        }
    }

    /// The virtual delete event a worker enqueues for `identity` when the API server does not
    /// have it (upstream `enqueueVirtualDeleteEvent`).
    pub fn virtual_delete(identity: &ObjectRef) -> Self {
        Self {
            event_type: EventType::Delete,
            virtual_: true,
            api_version: identity.api_version.clone(),
            kind: identity.kind.clone(),
            object: Meta {
                uid: identity.uid.clone(),
                name: identity.name.clone(),
                namespace: identity.namespace.clone(),
                ..Meta::default()
            },
            old: None,
        }
    }
}

/// What the graph asks of the rest of the garbage collector after a change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Queue this node for attempt-to-delete.
    AttemptToDelete(ObjectRef),
    /// Queue this node for attempt-to-delete after its rate-limited delay.
    AttemptToDeleteRateLimited(ObjectRef),
    /// Queue this node for attempt-to-orphan.
    AttemptToOrphan(ObjectRef),
    /// Record these coordinates as verified absent (the absent-owner cache).
    AbsentOwner(ObjectRef),
    /// Warn (event `OwnerRefInvalidNamespace` on `dependent`) that `owner`, as the dependent
    /// references it in its own namespace, does not exist there (GC-7).
    InvalidNamespaceOwnerRef {
        /// The object carrying the bad reference.
        dependent: ObjectRef,
        /// The referenced coordinates, placed in the dependent's namespace.
        owner: ObjectRef,
    },
}

/// One object (or virtual owner) of the graph.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Node {
    /// Coordinates (observed, or guessed for a virtual node).
    pub identity: ObjectRef,
    /// Uids of the nodes that list this one among their owners.
    dependents: HashSet<String>,
    /// The object's `ownerReferences` as last observed.
    pub owners: Vec<OwnerReference>,
    /// `deletionTimestamp` set with the `foregroundDeletion` finalizer.
    pub deleting_dependents: bool,
    /// `deletionTimestamp` set (one-way).
    pub being_deleted: bool,
    /// Never observed by a watch.
    pub virtual_: bool,
}

impl Node {
    /// How many dependents the node has.
    pub fn dependents_len(&self) -> usize {
        self.dependents.len()
    }
}

/// The owner/dependent graph, keyed by uid.
#[derive(Debug, Default)]
pub struct Graph {
    nodes: HashMap<String, Node>,
}

/// Upstream `referencesDiffs`: owner references added, removed, and changed (same uid, other
/// fields differ, as `(old, new)`).
pub fn references_diffs(
    old: &[OwnerReference],
    new: &[OwnerReference],
) -> (
    Vec<OwnerReference>,
    Vec<OwnerReference>,
    Vec<(OwnerReference, OwnerReference)>,
) {
    let mut old_by_uid: HashMap<&str, &OwnerReference> =
        old.iter().map(|r| (r.uid.as_str(), r)).collect();
    let mut added = Vec::new();
    let mut changed = Vec::new();
    for r in new {
        match old_by_uid.remove(r.uid.as_str()) {
            Some(o) => {
                if o != r {
                    changed.push((o.clone(), r.clone()));
                }
            }
            None => added.push(r.clone()),
        }
    }
    // Keep the old list's order for the removed ones (upstream iterates a set: any order).
    let removed = old
        .iter()
        .filter(|r| old_by_uid.contains_key(r.uid.as_str()))
        .cloned()
        .collect();
    (added, removed, changed)
}

/// Upstream `deletionStartsWithFinalizer`: the new version is being deleted with the finalizer
/// and the old one (if any) was not.
pub fn deletion_starts_with_finalizer(old: Option<Flags>, new: Flags, orphan: bool) -> bool {
    let has = |f: Flags| {
        if orphan {
            f.orphan_finalizer
        } else {
            f.delete_dependents_finalizer
        }
    };
    if !new.being_deleted || !has(new) {
        return false;
    }
    match old {
        None => true,
        Some(o) => !o.being_deleted || !has(o),
    }
}

fn blocks(r: &OwnerReference) -> bool {
    r.block_owner_deletion == Some(true)
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Self {
        Self::default()
    }

    /// The node with this uid.
    pub fn node(&self, uid: &str) -> Option<&Node> {
        self.nodes.get(uid)
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the graph has no node.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Forgets everything (a new run rebuilds the graph from fresh watches).
    pub fn clear(&mut self) {
        self.nodes.clear();
    }

    /// The dependents of `uid`, in no particular order.
    pub fn dependents(&self, uid: &str) -> Vec<&Node> {
        self.nodes
            .get(uid)
            .map(|n| {
                n.dependents
                    .iter()
                    .filter_map(|d| self.nodes.get(d))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Upstream `blockingDependents`: dependents whose reference to `uid` has
    /// `blockOwnerDeletion=true`.
    pub fn blocking_dependents(&self, uid: &str) -> Vec<&Node> {
        self.dependents(uid)
            .into_iter()
            .filter(|d| d.owners.iter().any(|o| o.uid == uid && blocks(o)))
            .collect()
    }

    /// Applies one change and returns what must follow (upstream `processGraphChanges`).
    pub fn process(&mut self, ev: &GraphEvent) -> Vec<Effect> {
        let mut fx = Vec::new();
        let uid = ev.object.uid.clone();
        let found = self.nodes.contains_key(&uid);

        if found && !ev.virtual_ && self.nodes[&uid].virtual_ {
            // The first watch observation of a node that so far was only referenced.
            let observed = ev.identity();
            if observed != self.nodes[&uid].identity {
                // Dependents that named other coordinates may be wrong: verify them (the
                // "bad child, then good parent" order; the other order is in add_dependents).
                let (_, invalid) = self.partition_dependents(&uid, &observed);
                for dep in invalid {
                    let dep = &self.nodes[&dep];
                    if !observed.namespace.is_empty()
                        && dep.identity.namespace != observed.namespace
                    {
                        if let Some(e) = invalid_namespace(dep, &observed.uid) {
                            fx.push(e);
                        }
                    }
                    fx.push(Effect::AttemptToDelete(dep.identity.clone()));
                }
                self.nodes.get_mut(&uid).expect("found").identity = observed;
            }
            self.nodes.get_mut(&uid).expect("found").virtual_ = false;
        }

        match ev.event_type {
            EventType::Add | EventType::Update if !found => {
                let flags = ev.object.flags;
                let node = Node {
                    identity: ev.identity(),
                    dependents: HashSet::new(),
                    owners: ev.object.owners.clone(),
                    deleting_dependents: flags.being_deleted && flags.delete_dependents_finalizer,
                    being_deleted: flags.being_deleted,
                    virtual_: false,
                };
                self.nodes.insert(uid.clone(), node);
                let owners = ev.object.owners.clone();
                self.add_dependent_to_owners(&uid, &owners, &mut fx);
                // A watch may have folded a creation and a deletion into one event.
                self.process_transitions(ev.old, flags, &uid, &mut fx);
            }
            EventType::Add | EventType::Update => {
                if !ev.virtual_ {
                    // A kind served again under another apiVersion (or kind) keeps its node.
                    let n = self.nodes.get_mut(&uid).expect("found");
                    if n.identity.api_version != ev.api_version || n.identity.kind != ev.kind {
                        n.identity.api_version = ev.api_version.clone();
                        n.identity.kind = ev.kind.clone();
                    }
                }
                let (added, removed, changed) =
                    references_diffs(&self.nodes[&uid].owners, &ev.object.owners);
                if !added.is_empty() || !removed.is_empty() || !changed.is_empty() {
                    // Owners waiting for this dependent's deletion may be unblocked now.
                    self.add_unblocked_owners(&removed, &changed, &mut fx);
                    self.nodes.get_mut(&uid).expect("found").owners = ev.object.owners.clone();
                    self.add_dependent_to_owners(&uid, &added, &mut fx);
                    for r in &removed {
                        if let Some(o) = self.nodes.get_mut(&r.uid) {
                            o.dependents.remove(&uid);
                        }
                    }
                }
                if ev.object.flags.being_deleted {
                    self.nodes.get_mut(&uid).expect("found").being_deleted = true;
                }
                self.process_transitions(ev.old, ev.object.flags, &uid, &mut fx);
            }
            EventType::Delete => {
                if !found {
                    return fx;
                }
                let mut remove = true;
                if ev.virtual_ {
                    let deleted = ev.identity();
                    let existing = &self.nodes[&uid];
                    if existing.virtual_ {
                        // Unsure of the virtual node's coordinates: dependents may disagree.
                        let (matching, nonmatching) = self.partition_dependents(&uid, &deleted);
                        if !nonmatching.is_empty() {
                            remove = false;
                            if !matching.is_empty() {
                                fx.push(Effect::AbsentOwner(deleted.clone()));
                                for d in &matching {
                                    fx.push(Effect::AttemptToDelete(
                                        self.nodes[d].identity.clone(),
                                    ));
                                }
                            }
                            if existing.identity == deleted {
                                // Try the next coordinates the other dependents use.
                                if let Some(alt) =
                                    self.alternate_owner_identity(&nonmatching, &deleted)
                                {
                                    self.nodes.get_mut(&uid).expect("found").identity = alt.clone();
                                    fx.push(Effect::AttemptToDeleteRateLimited(alt));
                                }
                            }
                        }
                    } else if existing.identity != deleted {
                        // An observed node outlives a virtual delete of other coordinates; the
                        // dependents naming those coordinates are dangling.
                        remove = false;
                        let (matching, _) = self.partition_dependents(&uid, &deleted);
                        if !matching.is_empty() {
                            fx.push(Effect::AbsentOwner(deleted.clone()));
                            for d in &matching {
                                fx.push(Effect::AttemptToDelete(self.nodes[d].identity.clone()));
                            }
                        }
                    }
                }
                if remove {
                    let node = self.nodes.remove(&uid).expect("found");
                    for o in &node.owners {
                        if let Some(owner) = self.nodes.get_mut(&o.uid) {
                            owner.dependents.remove(&uid);
                        }
                    }
                    if !node.dependents.is_empty() {
                        fx.push(Effect::AbsentOwner(ev.identity()));
                    }
                    let mut deps: Vec<&Node> = node
                        .dependents
                        .iter()
                        .filter_map(|d| self.nodes.get(d))
                        .collect();
                    deps.sort_by(|a, b| a.identity.sort_key().cmp(&b.identity.sort_key()));
                    for d in deps {
                        fx.push(Effect::AttemptToDelete(d.identity.clone()));
                    }
                    for o in &node.owners {
                        // An owner deleting its dependents may be done now.
                        if let Some(owner) = self.nodes.get(&o.uid) {
                            if owner.deleting_dependents {
                                fx.push(Effect::AttemptToDelete(owner.identity.clone()));
                            }
                        }
                    }
                }
            }
        }
        fx
    }

    /// Upstream `addDependentToOwners`: links `uid` under each owner, creating virtual owners
    /// (queued for verification) and queueing the dependent when a reference looks invalid.
    fn add_dependent_to_owners(
        &mut self,
        uid: &str,
        owners: &[OwnerReference],
        fx: &mut Vec<Effect>,
    ) {
        let dep_identity = self.nodes[uid].identity.clone();
        let mut potentially_invalid = false;
        for owner in owners {
            match self.nodes.get_mut(&owner.uid) {
                None => {
                    let identity = ObjectRef::from_owner(owner, &dep_identity.namespace);
                    let mut node = Node {
                        identity: identity.clone(),
                        virtual_: true,
                        ..Node::default()
                    };
                    node.dependents.insert(uid.to_string());
                    self.nodes.insert(owner.uid.clone(), node);
                    // The workers ask the API server whether it exists.
                    fx.push(Effect::AttemptToDelete(identity));
                }
                Some(owner_node) => {
                    owner_node.dependents.insert(uid.to_string());
                    if potentially_invalid {
                        continue;
                    }
                    let owner_ns = &owner_node.identity.namespace;
                    let owner_is_namespaced = !owner_ns.is_empty();
                    if owner_is_namespaced && *owner_ns != dep_identity.namespace {
                        // GC-7: a namespaced owner must be in the dependent's namespace.
                        if !owner_node.virtual_ {
                            if let Some(e) = invalid_namespace(&self.nodes[uid], &owner.uid) {
                                fx.push(e);
                            }
                        }
                        potentially_invalid = true;
                    } else if !owner_node.identity.matches_owner(owner) {
                        potentially_invalid = true;
                    } else if !owner_is_namespaced
                        && *owner_ns != dep_identity.namespace
                        && owner_node.virtual_
                    {
                        // A cluster-scoped child's guess for a virtual owner, referenced from a
                        // namespace: possibly a namespaced owner named from a cluster-scoped child.
                        potentially_invalid = true;
                    }
                }
            }
        }
        if potentially_invalid {
            fx.push(Effect::AttemptToDelete(dep_identity));
        }
    }

    /// Upstream `addUnblockedOwnersToDeleteQueue`.
    fn add_unblocked_owners(
        &self,
        removed: &[OwnerReference],
        changed: &[(OwnerReference, OwnerReference)],
        fx: &mut Vec<Effect>,
    ) {
        for r in removed.iter().filter(|r| blocks(r)) {
            if let Some(n) = self.nodes.get(&r.uid) {
                fx.push(Effect::AttemptToDelete(n.identity.clone()));
            }
        }
        for (old, new) in changed {
            if blocks(old) && !blocks(new) {
                if let Some(n) = self.nodes.get(&new.uid) {
                    fx.push(Effect::AttemptToDelete(n.identity.clone()));
                }
            }
        }
    }

    /// Upstream `processTransitions`: deletion starting with the orphan finalizer queues the node
    /// for orphaning; with the foregroundDeletion finalizer, its dependents and itself for
    /// deletion.
    fn process_transitions(
        &mut self,
        old: Option<Flags>,
        new: Flags,
        uid: &str,
        fx: &mut Vec<Effect>,
    ) {
        if deletion_starts_with_finalizer(old, new, true) {
            fx.push(Effect::AttemptToOrphan(self.nodes[uid].identity.clone()));
            return;
        }
        if deletion_starts_with_finalizer(old, new, false) {
            // A node created virtually did not know it; set it here in every case.
            let n = self.nodes.get_mut(uid).expect("node");
            n.deleting_dependents = true;
            let mut deps: Vec<&Node> = self.dependents(uid);
            deps.sort_by(|a, b| a.identity.sort_key().cmp(&b.identity.sort_key()));
            for d in deps {
                fx.push(Effect::AttemptToDelete(d.identity.clone()));
            }
            fx.push(Effect::AttemptToDelete(self.nodes[uid].identity.clone()));
        }
    }

    /// Upstream `partitionDependents`: the dependents of `uid` whose reference matches
    /// `identity`, and those with a reference to the uid that does not (a dependent can be in
    /// both). Sorted by identity for determinism.
    fn partition_dependents(&self, uid: &str, identity: &ObjectRef) -> (Vec<String>, Vec<String>) {
        let owner_is_namespaced = !identity.namespace.is_empty();
        let mut matching = Vec::new();
        let mut nonmatching = Vec::new();
        let mut deps = self.dependents(uid);
        deps.sort_by(|a, b| a.identity.sort_key().cmp(&b.identity.sort_key()));
        for dep in deps {
            let mut found_match = false;
            let mut found_mismatch = false;
            if owner_is_namespaced && identity.namespace != dep.identity.namespace {
                found_mismatch = true;
            } else {
                for r in dep.owners.iter().filter(|r| r.uid == identity.uid) {
                    if identity.matches_owner(r) {
                        found_match = true;
                    } else {
                        found_mismatch = true;
                    }
                }
            }
            if found_match {
                matching.push(dep.identity.uid.clone());
            }
            if found_mismatch {
                nonmatching.push(dep.identity.uid.clone());
            }
        }
        (matching, nonmatching)
    }

    /// Upstream `getAlternateOwnerIdentity`: among the coordinates `deps` use for the absent
    /// identity's uid, the first one after it in [`ObjectRef::sort_key`] order, else the first.
    fn alternate_owner_identity(&self, deps: &[String], absent: &ObjectRef) -> Option<ObjectRef> {
        let absent_cluster_scoped = absent.namespace.is_empty();
        let mut seen: HashSet<ObjectRef> = HashSet::from([absent.clone()]);
        let mut first: Option<ObjectRef> = None;
        let mut first_following: Option<ObjectRef> = None;
        for dep in deps.iter().filter_map(|d| self.nodes.get(d)) {
            for r in dep.owners.iter().filter(|r| r.uid == absent.uid) {
                if absent.matches_owner(r)
                    && (absent_cluster_scoped || absent.namespace == dep.identity.namespace)
                {
                    continue;
                }
                let mut alt = ObjectRef::from_owner(r, &dep.identity.namespace);
                if absent_cluster_scoped
                    && alt.api_version == absent.api_version
                    && alt.kind == absent.kind
                {
                    // This apiVersion/kind is known to be cluster-scoped.
                    alt.namespace.clear();
                }
                if !seen.insert(alt.clone()) {
                    continue;
                }
                if first.as_ref().is_none_or(|f| alt.sort_key() < f.sort_key()) {
                    first = Some(alt.clone());
                }
                if absent.sort_key() < alt.sort_key()
                    && first_following
                        .as_ref()
                        .is_none_or(|f| alt.sort_key() < f.sort_key())
                {
                    first_following = Some(alt);
                }
            }
        }
        first_following.or(first)
    }
}

/// Upstream `reportInvalidNamespaceOwnerRef`: the warning for `dep`'s reference to `owner_uid`.
fn invalid_namespace(dep: &Node, owner_uid: &str) -> Option<Effect> {
    let r = dep.owners.iter().find(|r| r.uid == owner_uid)?;
    Some(Effect::InvalidNamespaceOwnerRef {
        dependent: dep.identity.clone(),
        owner: ObjectRef::from_owner(r, &dep.identity.namespace),
    })
}

#[cfg(test)]
#[path = "graph_tests.rs"]
mod tests;
