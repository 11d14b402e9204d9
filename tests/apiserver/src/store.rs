//! The in-memory object store: one resourceVersion counter, objects per resource type, a bounded
//! event history for watches, and the write semantics of the API server (create, update, patch,
//! delete with finalizers, status and binding subresources, Service clusterIP/nodePort allocation).
//!
//! Owns all object state. Knows nothing about HTTP; the `http` module translates requests into calls
//! here and `Error`s into `Status` responses.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::SystemTime;

use rand::Rng;
use serde_json::{json, Value};
use tokio::sync::broadcast;

use crate::patch::{self, PatchKind};
use crate::resources::{ResourceType, RESOURCES};
use crate::selector::{FieldSelector, LabelSelector};
use crate::Error;

/// What happened to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// Created.
    Added,
    /// Changed (including deletionTimestamp being set).
    Modified,
    /// Removed from the store.
    Deleted,
}

/// One change, as kept in the history and broadcast to watches.
#[derive(Debug)]
pub struct Event {
    /// The resourceVersion this change produced.
    pub rv: u64,
    /// The resource type.
    pub res: &'static ResourceType,
    /// What happened.
    pub kind: EventKind,
    /// The object after the change (for deletions: the last state, with the deletion's resourceVersion).
    pub object: Value,
    /// The object before the change (modifications only), for selector transitions.
    pub old: Option<Value>,
}

/// Which objects a list or watch wants.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Namespace from the request path (None: all namespaces).
    pub namespace: Option<String>,
    /// `labelSelector`.
    pub labels: LabelSelector,
    /// `fieldSelector`.
    pub fields: FieldSelector,
}

impl Filter {
    /// Whether one object passes the filter.
    pub fn matches(&self, obj: &Value) -> bool {
        let ns_ok = self
            .namespace
            .as_deref()
            .is_none_or(|ns| obj["metadata"]["namespace"].as_str() == Some(ns));
        ns_ok && self.labels.matches(obj) && self.fields.matches(obj)
    }
}

impl Event {
    /// The watch event a watcher with `filter` sees for this change, if any: an object that starts
    /// matching is ADDED, one that stops matching is DELETED.
    pub fn view(&self, res: &ResourceType, filter: &Filter) -> Option<(&'static str, &Value)> {
        if self.res != res {
            return None;
        }
        let now = filter.matches(&self.object);
        let before = self.old.as_ref().is_some_and(|o| filter.matches(o));
        match (self.kind, before, now) {
            (EventKind::Added, _, true) => Some(("ADDED", &self.object)),
            (EventKind::Deleted, _, true) => Some(("DELETED", &self.object)),
            (EventKind::Modified, true, true) => Some(("MODIFIED", &self.object)),
            (EventKind::Modified, false, true) => Some(("ADDED", &self.object)),
            (EventKind::Modified, true, false) => Some(("DELETED", &self.object)),
            _ => None,
        }
    }
}

type Key = (String, String);

/// The retained events after a version, and the live feed after them.
pub type WatchFeed = (Vec<Arc<Event>>, broadcast::Receiver<Arc<Event>>);

/// Where a Service's clusterIPs come from.
#[derive(Debug, Clone, Copy)]
pub struct ServiceCidr {
    /// First address of the range.
    pub base: Ipv4Addr,
    /// Prefix length.
    pub prefix: u8,
}

/// The whole server state, behind one mutex.
pub struct Store {
    rv: u64,
    objects: Vec<BTreeMap<Key, Value>>,
    history: VecDeque<Arc<Event>>,
    history_cap: usize,
    /// Every event with rv > compacted is still in the history.
    compacted: u64,
    tx: broadcast::Sender<Arc<Event>>,
    service_cidr: ServiceCidr,
    /// Allocated Service clusterIPs and nodePorts, kept in step with the stored Services.
    cluster_ips: HashSet<String>,
    node_ports: HashSet<u16>,
    ip_cursor: u64,
}

fn index(res: &ResourceType) -> usize {
    RESOURCES
        .iter()
        .position(|r| r == res)
        .expect("resource types come from RESOURCES")
}

/// RFC 3339 timestamp with seconds precision, as metav1.Time serialises.
pub fn now() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

fn random_uid() -> String {
    let b: [u8; 16] = rand::thread_rng().gen();
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::thread_rng();
    (0..5)
        .map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char)
        .collect()
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj["metadata"][field].as_str().filter(|s| !s.is_empty())
}

fn not_found(res: &ResourceType, name: &str) -> Error {
    Error::NotFound(format!("{} \"{name}\" not found", res.plural))
}

fn conflict(res: &ResourceType, name: &str) -> Error {
    Error::Conflict(format!(
        "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
        res.plural
    ))
}

/// Resources whose create ignores the status written by the client (as the real strategies do).
fn resets_status_on_create(res: &ResourceType) -> bool {
    res.status_subresource && !matches!(res.plural, "nodes" | "namespaces")
}

/// The part of an object whose change bumps `metadata.generation` (everything but metadata and status).
fn generation_part(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(m) = o.as_object_mut() {
        m.remove("metadata");
        m.remove("status");
    }
    o
}

impl Store {
    /// An empty store keeping at most `history_cap` events for watches.
    pub fn new(history_cap: usize, service_cidr: ServiceCidr) -> Self {
        let (tx, _) = broadcast::channel(history_cap.max(1024));
        Self {
            rv: 1,
            objects: RESOURCES.iter().map(|_| BTreeMap::new()).collect(),
            history: VecDeque::new(),
            history_cap: history_cap.max(1),
            compacted: 0,
            tx,
            service_cidr,
            cluster_ips: HashSet::new(),
            node_ports: HashSet::new(),
            ip_cursor: 10,
        }
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    /// Number of objects of one type.
    pub fn count(&self, res: &ResourceType) -> usize {
        self.objects[index(res)].len()
    }

    /// Forgets the event history up to now, so older resourceVersions answer 410 Gone.
    pub fn compact(&mut self) {
        self.history.clear();
        self.compacted = self.rv;
    }

    fn key(res: &ResourceType, ns: Option<&str>, name: &str) -> Key {
        let ns = if res.namespaced {
            ns.unwrap_or_default()
        } else {
            ""
        };
        (ns.to_string(), name.to_string())
    }

    fn record(
        &mut self,
        res: &'static ResourceType,
        kind: EventKind,
        object: Value,
        old: Option<Value>,
    ) {
        let ev = Arc::new(Event {
            rv: self.rv,
            res,
            kind,
            object,
            old,
        });
        if self.history.len() == self.history_cap {
            if let Some(front) = self.history.pop_front() {
                self.compacted = front.rv;
            }
        }
        self.history.push_back(ev.clone());
        let _ = self.tx.send(ev);
    }

    fn commit(&mut self, res: &'static ResourceType, mut obj: Value, old: Option<Value>) -> Value {
        self.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        let name = meta_str(&obj, "name").unwrap_or_default().to_string();
        let key = Self::key(res, meta_str(&obj, "namespace"), &name);
        self.objects[index(res)].insert(key, obj.clone());
        if is_service(res) {
            self.track_service(old.as_ref(), Some(&obj));
        }
        let kind = if old.is_some() {
            EventKind::Modified
        } else {
            EventKind::Added
        };
        self.record(res, kind, obj.clone(), old);
        obj
    }

    fn remove(&mut self, res: &'static ResourceType, key: &Key) -> Option<Value> {
        let mut obj = self.objects[index(res)].remove(key)?;
        self.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        if is_service(res) {
            self.track_service(Some(&obj), None);
        }
        self.record(res, EventKind::Deleted, obj.clone(), None);
        Some(obj)
    }

    /// Lists matching objects and the resourceVersion of the listing.
    pub fn list(&self, res: &ResourceType, filter: &Filter) -> (Vec<Value>, u64) {
        let items = self.objects[index(res)]
            .iter()
            .filter(|((ns, _), _)| filter.namespace.as_deref().is_none_or(|want| want == ns))
            .map(|(_, o)| o)
            .filter(|o| filter.matches(o))
            .cloned()
            .collect();
        (items, self.rv)
    }

    /// Reads one object.
    pub fn get(&self, res: &ResourceType, ns: Option<&str>, name: &str) -> Result<Value, Error> {
        self.objects[index(res)]
            .get(&Self::key(res, ns, name))
            .cloned()
            .ok_or_else(|| not_found(res, name))
    }

    /// Starts a watch: the retained events after `from` and a receiver for later ones, taken under
    /// the same lock so nothing falls between them. `Err(Gone)` when `from` was compacted away.
    pub fn watch_from(&self, from: u64) -> Result<WatchFeed, Error> {
        if from < self.compacted {
            return Err(Error::Gone(format!(
                "too old resource version: {from} ({})",
                self.compacted + 1
            )));
        }
        let backlog = self
            .history
            .iter()
            .filter(|e| e.rv > from)
            .cloned()
            .collect();
        Ok((backlog, self.tx.subscribe()))
    }

    /// Creates an object (POST). `keep_status` is for seeding from tests, bypassing the status reset.
    pub fn create(
        &mut self,
        res: &'static ResourceType,
        ns: Option<&str>,
        mut obj: Value,
        keep_status: bool,
    ) -> Result<Value, Error> {
        if !obj.is_object() {
            return Err(Error::BadRequest(format!(
                "{} body: expected a JSON object",
                res.kind
            )));
        }
        obj["apiVersion"] = json!(res.api_version());
        obj["kind"] = json!(res.kind);
        if !obj["metadata"].is_object() {
            obj["metadata"] = json!({});
        }
        let name = match (meta_str(&obj, "name"), meta_str(&obj, "generateName")) {
            (Some(n), _) => n.to_string(),
            (None, Some(prefix)) => format!("{prefix}{}", random_suffix()),
            (None, None) => {
                return Err(Error::Invalid(format!(
                    "{} metadata.name: Required value: name or generateName is required",
                    res.kind
                )))
            }
        };
        self.set_namespace(res, ns, &mut obj, &name)?;
        let key = Self::key(res, ns, &name);
        if self.objects[index(res)].contains_key(&key) {
            return Err(Error::AlreadyExists(format!(
                "{} \"{name}\" already exists",
                res.plural
            )));
        }
        let meta = obj["metadata"]
            .as_object_mut()
            .expect("made an object above");
        meta.insert("name".into(), json!(name));
        meta.insert("uid".into(), json!(random_uid()));
        meta.insert("creationTimestamp".into(), json!(now()));
        meta.insert("generation".into(), json!(1));
        for f in [
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "managedFields",
            "resourceVersion",
        ] {
            meta.remove(f);
        }
        if resets_status_on_create(res) && !keep_status {
            obj["status"] = match res.plural {
                "pods" => json!({"phase": "Pending"}),
                "services" => json!({"loadBalancer": {}}),
                _ => json!({}),
            };
        }
        if is_service(res) {
            self.default_service(&mut obj, None)?;
        }
        Ok(self.commit(res, obj, None))
    }

    fn set_namespace(
        &self,
        res: &ResourceType,
        ns: Option<&str>,
        obj: &mut Value,
        name: &str,
    ) -> Result<(), Error> {
        if !res.namespaced {
            if let Some(m) = obj["metadata"].as_object_mut() {
                m.remove("namespace");
            }
            return Ok(());
        }
        let Some(ns) = ns else {
            return Err(Error::BadRequest(format!(
                "{} \"{name}\": a namespaced resource needs a namespace in the path",
                res.kind
            )));
        };
        match meta_str(obj, "namespace") {
            Some(body_ns) if body_ns != ns => Err(Error::BadRequest(format!(
                "{} \"{name}\" metadata.namespace {body_ns:?}: the namespace of the provided object does not match the namespace sent on the request ({ns:?})",
                res.kind
            ))),
            _ => {
                obj["metadata"]["namespace"] = json!(ns);
                Ok(())
            }
        }
    }

    /// Replaces an object (PUT), or only its status when `status_only`.
    pub fn update(
        &mut self,
        res: &'static ResourceType,
        ns: Option<&str>,
        name: &str,
        mut obj: Value,
        status_only: bool,
    ) -> Result<Value, Error> {
        let key = Self::key(res, ns, name);
        let old = self.objects[index(res)]
            .get(&key)
            .cloned()
            .ok_or_else(|| not_found(res, name))?;
        if !obj.is_object() {
            return Err(Error::BadRequest(format!(
                "{} \"{name}\" body: expected a JSON object",
                res.kind
            )));
        }
        if let Some(body_name) = meta_str(&obj, "name") {
            if body_name != name {
                return Err(Error::BadRequest(format!(
                    "{} \"{name}\" metadata.name {body_name:?}: does not match the name in the URL",
                    res.kind
                )));
            }
        }
        if let Some(rv) = meta_str(&obj, "resourceVersion") {
            if Some(rv) != meta_str(&old, "resourceVersion") {
                return Err(conflict(res, name));
            }
        }
        if status_only {
            let status = obj["status"].take();
            obj = old.clone();
            obj["status"] = status;
        } else if res.status_subresource {
            obj["status"] = old["status"].clone();
        }
        self.finish_update(res, &key, obj, old)
    }

    /// Server-owned fields, generation, Service defaults, no-op detection and finalizer-gated removal.
    fn finish_update(
        &mut self,
        res: &'static ResourceType,
        key: &Key,
        mut obj: Value,
        old: Value,
    ) -> Result<Value, Error> {
        obj["apiVersion"] = json!(res.api_version());
        obj["kind"] = json!(res.kind);
        if !obj["metadata"].is_object() {
            obj["metadata"] = json!({});
        }
        for f in [
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
            "resourceVersion",
        ] {
            match old["metadata"].get(f) {
                Some(v) => obj["metadata"][f] = v.clone(),
                None => {
                    obj["metadata"].as_object_mut().expect("object").remove(f);
                }
            }
        }
        obj["metadata"]
            .as_object_mut()
            .expect("object")
            .remove("managedFields");
        if is_service(res) {
            self.default_service(&mut obj, Some(&old))?;
        }
        if generation_part(&obj) != generation_part(&old) {
            let g = old["metadata"]["generation"].as_i64().unwrap_or(0) + 1;
            obj["metadata"]["generation"] = json!(g);
        }
        let deleting = obj["metadata"]["deletionTimestamp"].is_string();
        let no_finalizers = obj["metadata"]["finalizers"]
            .as_array()
            .is_none_or(|f| f.is_empty());
        if deleting && no_finalizers {
            self.objects[index(res)].insert(key.clone(), obj);
            return Ok(self.remove(res, key).expect("inserted above"));
        }
        if obj == old {
            return Ok(old);
        }
        Ok(self.commit(res, obj, Some(old)))
    }

    /// Patches an object (PATCH), or its status when `status_only`. Server-side apply creates a
    /// missing object.
    pub fn patch(
        &mut self,
        res: &'static ResourceType,
        ns: Option<&str>,
        name: &str,
        kind: PatchKind,
        body: &Value,
        status_only: bool,
    ) -> Result<Value, Error> {
        let key = Self::key(res, ns, name);
        let Some(old) = self.objects[index(res)].get(&key).cloned() else {
            if kind == PatchKind::Apply && !status_only {
                let mut obj = body.clone();
                obj["metadata"]["name"] = json!(name);
                return self.create(res, ns, obj, false);
            }
            return Err(not_found(res, name));
        };
        let mut obj = old.clone();
        patch::apply(kind, &mut obj, body)?;
        if let Some(rv) = meta_str(&obj, "resourceVersion") {
            if Some(rv) != meta_str(&old, "resourceVersion") {
                return Err(conflict(res, name));
            }
        }
        if status_only {
            let status = obj["status"].take();
            obj = old.clone();
            obj["status"] = status;
        } else if res.status_subresource {
            obj["status"] = old["status"].clone();
        }
        self.finish_update(res, &key, obj, old)
    }

    /// Deletes an object: with finalizers it only gets a deletionTimestamp, otherwise it goes.
    /// `preconditions` are DeleteOptions.preconditions (uid, resourceVersion).
    pub fn delete(
        &mut self,
        res: &'static ResourceType,
        ns: Option<&str>,
        name: &str,
        preconditions: &Value,
    ) -> Result<Value, Error> {
        let key = Self::key(res, ns, name);
        let old = self.objects[index(res)]
            .get(&key)
            .cloned()
            .ok_or_else(|| not_found(res, name))?;
        for field in ["uid", "resourceVersion"] {
            if let Some(want) = preconditions[field].as_str() {
                if Some(want) != meta_str(&old, field) {
                    return Err(Error::Conflict(format!(
                        "Precondition failed for {} \"{name}\": {field} in precondition: {want}, {field} in object meta: {}",
                        res.plural,
                        meta_str(&old, field).unwrap_or_default()
                    )));
                }
            }
        }
        let has_finalizers = old["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        if !has_finalizers {
            return Ok(self.remove(res, &key).expect("present above"));
        }
        if old["metadata"]["deletionTimestamp"].is_string() {
            return Ok(old);
        }
        let mut obj = old.clone();
        obj["metadata"]["deletionTimestamp"] = json!(now());
        obj["metadata"]["deletionGracePeriodSeconds"] = json!(0);
        Ok(self.commit(res, obj, Some(old)))
    }

    /// Deletes every object passing `filter`; returns the deleted (or now terminating) objects.
    pub fn delete_collection(&mut self, res: &'static ResourceType, filter: &Filter) -> Vec<Value> {
        let (items, _) = self.list(res, filter);
        items
            .iter()
            .filter_map(|o| {
                let name = meta_str(o, "name")?.to_string();
                let ns = meta_str(o, "namespace").map(str::to_string);
                self.delete(res, ns.as_deref(), &name, &Value::Null).ok()
            })
            .collect()
    }

    /// The `pods/binding` subresource: sets `spec.nodeName` once.
    pub fn bind(
        &mut self,
        res: &'static ResourceType,
        ns: Option<&str>,
        name: &str,
        binding: &Value,
    ) -> Result<Value, Error> {
        let node = binding["target"]["name"]
            .as_str()
            .filter(|n| !n.is_empty())
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "Binding for pod \"{name}\" target.name: Required value"
                ))
            })?;
        let key = Self::key(res, ns, name);
        let old = self.objects[index(res)]
            .get(&key)
            .cloned()
            .ok_or_else(|| not_found(res, name))?;
        if let Some(current) = old["spec"]["nodeName"].as_str().filter(|n| !n.is_empty()) {
            return Err(Error::Conflict(format!(
                "pod {name} is already assigned to node \"{current}\""
            )));
        }
        if old["metadata"]["deletionTimestamp"].is_string() {
            return Err(Error::Conflict(format!(
                "pod {name} is being deleted, cannot be assigned to a host"
            )));
        }
        let mut obj = old.clone();
        obj["spec"]["nodeName"] = json!(node);
        self.commit(res, obj, Some(old));
        Ok(
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
        )
    }

    /// Service defaults and allocation: type, protocols, targetPorts, clusterIP(s), nodePorts.
    /// On update, values the client left out are kept from the stored object.
    fn default_service(&mut self, obj: &mut Value, old: Option<&Value>) -> Result<(), Error> {
        let spec = &mut obj["spec"];
        if !spec.is_object() {
            *spec = json!({});
        }
        if let Some(old) = old {
            for f in ["clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"] {
                if spec.get(f).is_none_or(Value::is_null) && !old["spec"][f].is_null() {
                    spec[f] = old["spec"][f].clone();
                }
            }
        }
        let ty = spec["type"].as_str().unwrap_or("ClusterIP").to_string();
        spec["type"] = json!(ty);
        if spec["sessionAffinity"].is_null() {
            spec["sessionAffinity"] = json!("None");
        }
        if ty == "ExternalName" {
            return Ok(());
        }
        if spec["internalTrafficPolicy"].is_null() {
            spec["internalTrafficPolicy"] = json!("Cluster");
        }
        let external = ty == "NodePort" || ty == "LoadBalancer";
        if external && spec["externalTrafficPolicy"].is_null() {
            spec["externalTrafficPolicy"] = json!("Cluster");
        }
        self.default_service_ports(spec, old, external);
        if spec["clusterIP"].as_str().is_none_or(str::is_empty) {
            let ip = self.allocate_cluster_ip()?;
            spec["clusterIP"] = json!(ip);
        }
        let ip = spec["clusterIP"].clone();
        if spec["clusterIPs"].as_array().is_none_or(|a| a.is_empty()) {
            spec["clusterIPs"] = json!([ip]);
        }
        if ip != json!("None") {
            if spec["ipFamilies"].is_null() {
                spec["ipFamilies"] = json!(["IPv4"]);
            }
            if spec["ipFamilyPolicy"].is_null() {
                spec["ipFamilyPolicy"] = json!("SingleStack");
            }
        }
        Ok(())
    }

    fn default_service_ports(&self, spec: &mut Value, old: Option<&Value>, external: bool) {
        let mut used = self.node_ports.clone();
        let Some(ports) = spec["ports"].as_array_mut() else {
            return;
        };
        for (i, p) in ports.iter_mut().enumerate() {
            if p["protocol"].is_null() {
                p["protocol"] = json!("TCP");
            }
            if p["targetPort"].is_null() {
                p["targetPort"] = p["port"].clone();
            }
            if !external {
                continue;
            }
            if p["nodePort"].is_null() {
                if let Some(np) = old
                    .and_then(|o| o["spec"]["ports"].get(i))
                    .map(|op| op["nodePort"].clone())
                {
                    p["nodePort"] = np;
                }
            }
            if p["nodePort"].is_null() {
                if let Some(np) = (30000u16..=32767).find(|n| !used.contains(n)) {
                    used.insert(np);
                    p["nodePort"] = json!(np);
                }
            }
        }
    }

    fn track_service(&mut self, old: Option<&Value>, new: Option<&Value>) {
        for (obj, add) in [(old, false), (new, true)] {
            let Some(obj) = obj else { continue };
            let ips = obj["spec"]["clusterIPs"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            for ip in ips
                .iter()
                .filter_map(Value::as_str)
                .filter(|ip| *ip != "None")
            {
                if add {
                    self.cluster_ips.insert(ip.to_string());
                } else {
                    self.cluster_ips.remove(ip);
                }
            }
            let ports = obj["spec"]["ports"].as_array().cloned().unwrap_or_default();
            for np in ports
                .iter()
                .filter_map(|p| p["nodePort"].as_u64().and_then(|n| u16::try_from(n).ok()))
            {
                if add {
                    self.node_ports.insert(np);
                } else {
                    self.node_ports.remove(&np);
                }
            }
        }
    }

    fn allocate_cluster_ip(&mut self) -> Result<String, Error> {
        let base = u32::from(self.service_cidr.base);
        let size = 1u64 << (32 - u32::from(self.service_cidr.prefix));
        let usable = size.saturating_sub(11);
        for _ in 0..usable {
            let off = self.ip_cursor;
            self.ip_cursor = if off + 2 >= size { 10 } else { off + 1 };
            let ip = Ipv4Addr::from(base.wrapping_add(off as u32)).to_string();
            if !self.cluster_ips.contains(&ip) {
                return Ok(ip);
            }
        }
        Err(Error::Internal(
            "Service spec.clusterIP: the service CIDR is exhausted".into(),
        ))
    }
}

fn is_service(res: &ResourceType) -> bool {
    res.plural == "services" && res.group.is_empty()
}
