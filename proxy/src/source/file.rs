//! The `file:DIR` source: a directory of Service and EndpointSlice manifests, reloaded on change.
//! A Node manifest named like the agent's node gives the node its zone (the
//! `topology.kubernetes.io/zone` label) for topology hints, as the Node object does through the API.
//!
//! Every `*.yaml`, `*.yml` and `*.json` entry of the directory is read: multi-document YAML, one
//! object per document, or what `kubectl get services,endpointslices -A -o yaml|json` writes (a
//! `kind: List`, or a typed `ServiceList` / `EndpointSliceList`, whose items are served exactly as
//! if each were its own document). Files are re-read only when their modification time or size
//! changed.
//!
//! Nothing in the directory is trusted. Every problem is reported (it ends up in `proxy inspect`'s
//! "input problems" and the log) with the file, the object (`Kind namespace/name`, or `#N` for the
//! Nth document when it has no readable name) and the field, and never stops the rest: the other
//! documents of the file, the other items of a List and the other files keep being served.
//! Reported rather than skipped: a document or List item of a kind the source cannot use, a
//! Service without a clusterIP (there is no allocator here), a directory or dangling symbolic link
//! with a manifest's name, a file over [`MAX_FILE_BYTES`] (not even read), and a file that breaks
//! one of the parser's limits ([`MAX_DEPTH`], [`MAX_ALIASES`], [`MAX_ALIAS_EXPANSION`]).
//!
//! Parsing takes time linear in the file's size: YAML goes through serde-saphyr with the limits
//! above, JSON (`*.json`) through serde_json (recursion limit 128). A List is converted one item at
//! a time, so a dump of 20,000 Services never exists as one generic value. Files are read and
//! parsed on blocking threads, several at once, never on the async runtime.

use std::collections::HashMap;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use notify::Watcher;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::{Map, Value};
use tokio::sync::mpsc;

use super::SourceEvent;
use crate::convert::{ServiceEntry, SliceEntry};
use crate::error::InvalidObject;
use crate::model::Algorithm;

/// The largest manifest file read, in bytes (256 MiB); a larger one is reported without being
/// read. `kubectl get services,endpointslices -A -o yaml` of a cluster with 20,000 Services (one
/// EndpointSlice of two endpoints each, managedFields and last-applied annotations included) is
/// 79 MB, and 167 MB with `-o json` (kubectl indents JSON by four spaces), so this fits such dumps
/// with room to spare while bounding what one file can cost: parsing is linear, and the release
/// agent lists that YAML dump about 6 s after it starts, the JSON one 1.5 s.
pub const MAX_FILE_BYTES: u64 = 256 << 20;

/// The deepest nesting of mappings and sequences in a YAML document. Kubernetes objects need about
/// 15 (managedFields' `fieldsV1` is the deepest part), 17 inside a List. JSON is bounded by
/// serde_json's recursion limit (128).
pub const MAX_DEPTH: usize = 64;

/// The most aliases (`*name`) and anchors (`&name`) in one YAML document. kubectl never writes
/// them; a hand-written manifest uses a few.
pub const MAX_ALIASES: usize = 1_000;

/// The most parser events aliases may replay in one YAML document, bounding what expanding them
/// costs (the "billion laughs" document is ten aliases to ten aliases, nine levels deep).
pub const MAX_ALIAS_EXPANSION: usize = 100_000;

/// The kinds of object the file source serves.
const SERVED_KINDS: &str =
    "the file source uses only Service, EndpointSlice and Node objects (and Lists of them)";

/// A Node manifest: its name and the zone it is labelled with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeEntry {
    pub name: String,
    pub zone: Option<String>,
}

/// What one manifest file holds.
#[derive(Debug, Default, Clone)]
pub struct ParsedFile {
    pub services: Vec<Service>,
    pub slices: Vec<EndpointSlice>,
    pub nodes: Vec<NodeEntry>,
    pub errors: Vec<InvalidObject>,
}

/// A problem found while parsing a document, before the file and document index are known.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Problem {
    /// The List item it is about, if any (problems are reported in item order).
    item: Option<usize>,
    /// The object's kind, when it has one.
    kind: Option<String>,
    /// `namespace/name`, when readable.
    object: Option<String>,
    field: String,
    message: String,
}

impl Problem {
    fn into_invalid(self, file: &Path, doc: usize) -> InvalidObject {
        InvalidObject {
            file: Some(file.to_path_buf()),
            kind: self.kind.unwrap_or_else(|| "document".into()),
            object: self.object.unwrap_or_else(|| format!("#{doc}")),
            field: self.field,
            message: self.message,
        }
    }
}

/// The objects of one document (or of a List's items) and its problems.
#[derive(Debug, Default)]
struct Found {
    services: Vec<Service>,
    slices: Vec<EndpointSlice>,
    nodes: Vec<NodeEntry>,
    problems: Vec<Problem>,
}

/// The item kind a list kind holds, for items that do not say (a typed list's items have no `kind`
/// when they come straight from the API server).
fn item_kind_of(list_kind: &str) -> Option<&'static str> {
    match list_kind {
        "ServiceList" => Some("Service"),
        "EndpointSliceList" => Some("EndpointSlice"),
        "NodeList" => Some("Node"),
        _ => None,
    }
}

fn is_list_kind(kind: &str) -> bool {
    kind == "List" || item_kind_of(kind).is_some()
}

/// `field` prefixed with where the object sits (`items[3]`), or `<document>` for the whole of it.
fn field_at(prefix: &str, path: &str) -> String {
    match (prefix.is_empty(), path == "." || path.is_empty()) {
        (true, true) => "<document>".into(),
        (true, false) => path.into(),
        (false, true) => prefix.into(),
        (false, false) => format!("{prefix}.{path}"),
    }
}

fn typed<T: de::DeserializeOwned>(value: Value, prefix: &str) -> Result<T, (String, String)> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        (field_at(prefix, &path), e.into_inner().to_string())
    })
}

/// `namespace/name` of a generic object, when it has a name.
fn name_of(value: &Value) -> Option<String> {
    let meta = value.get("metadata")?;
    let name = meta.get("name")?.as_str()?;
    let ns = meta
        .get("namespace")
        .and_then(Value::as_str)
        .unwrap_or("default");
    Some(format!("{ns}/{name}"))
}

/// Converts one object (a document, or List item number `item`) of the given kind into `found`.
/// Lists are not objects here: a List inside a List is reported like any unusable kind.
fn use_object(value: Value, kind: &str, item: Option<usize>, found: &mut Found) {
    let prefix = &item.map(|i| format!("items[{i}]")).unwrap_or_default();
    let object = name_of(&value);
    let problem = |field: String, message: String| Problem {
        item,
        kind: Some(kind.to_string()),
        object: object.clone(),
        field,
        message,
    };
    match kind {
        "Service" => match typed::<Service>(value, prefix) {
            Ok(svc) => {
                if crate::convert::skip_reason(&svc) == Some(crate::convert::NO_CLUSTER_IP) {
                    found.problems.push(problem(
                        field_at(prefix, "spec.clusterIP"),
                        "missing: the file source has no IP allocator, so a Service needs its \
                         clusterIP written out (or None for a headless Service); without one \
                         nothing of it is programmed, not its nodePort, externalIPs or \
                         load-balancer IPs either"
                            .into(),
                    ));
                }
                found.services.push(svc);
            }
            Err((field, message)) => found.problems.push(problem(field, message)),
        },
        "EndpointSlice" => match typed::<EndpointSlice>(value, prefix) {
            Ok(slice) => found.slices.push(slice),
            Err((field, message)) => found.problems.push(problem(field, message)),
        },
        "Node" => match typed::<Node>(value, prefix) {
            Ok(node) => match node.metadata.name {
                Some(name) => found.nodes.push(NodeEntry {
                    name,
                    zone: node
                        .metadata
                        .labels
                        .and_then(|mut l| l.remove(super::kube::ZONE_LABEL)),
                }),
                None => found.problems.push(problem(
                    field_at(prefix, "metadata.name"),
                    "missing: a Node is matched to the agent's node by its name".into(),
                )),
            },
            Err((field, message)) => found.problems.push(problem(field, message)),
        },
        other => found.problems.push(problem(
            field_at(prefix, "kind"),
            format!("{SERVED_KINDS}; a {other} is not used"),
        )),
    }
}

/// Converts one List item (`items[index]`). `list_kind` is the List's kind when already known.
fn use_item(index: usize, item: Value, list_kind: &str, found: &mut Found) {
    let prefix = format!("items[{index}]");
    if !item.is_object() {
        found.problems.push(Problem {
            item: Some(index),
            kind: None,
            object: None,
            field: prefix,
            message: format!("a List item must be an object, not {}", json_type(&item)),
        });
        return;
    }
    let kind = match item.get("kind") {
        Some(Value::String(k)) if !k.is_empty() => k.clone(),
        None | Some(Value::Null) => match item_kind_of(list_kind) {
            Some(k) => k.to_string(),
            None => {
                found.problems.push(Problem {
                    item: Some(index),
                    kind: None,
                    object: name_of(&item),
                    field: format!("{prefix}.kind"),
                    message: "missing".into(),
                });
                return;
            }
        },
        Some(other) => {
            found.problems.push(Problem {
                item: Some(index),
                kind: None,
                object: name_of(&item),
                field: format!("{prefix}.kind"),
                message: format!("must be a string, not {}", json_type(other)),
            });
            return;
        }
    };
    use_object(item, &kind, Some(index), found);
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a sequence",
        Value::Object(_) => "a mapping",
    }
}

/// One top-level document as the parser streams it: every field but `items` as a generic value,
/// and the items (if any) converted one at a time as they are read.
#[derive(Debug)]
enum Document {
    Object {
        fields: Map<String, Value>,
        /// Items converted as read (their kind was known).
        items: Found,
        /// Items that could not be converted yet: no `kind` of their own, and the List's kind came
        /// after them (YAML from kubectl sorts `items` before `kind`).
        pending: Vec<(usize, Value)>,
    },
    /// A document that is not a mapping (a scalar or a sequence).
    NotAnObject(&'static str),
}

impl<'de> Deserialize<'de> for Document {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(DocumentVisitor)
    }
}

struct DocumentVisitor;

impl<'de> Visitor<'de> for DocumentVisitor {
    type Value = Document;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a Kubernetes object or List")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Document, A::Error> {
        let mut fields = Map::new();
        let mut items = Found::default();
        let mut pending = Vec::new();
        let mut has_items = false;
        while let Some(key) = map.next_key::<String>()? {
            if key == "items" {
                if has_items {
                    return Err(de::Error::custom("duplicate field `items`"));
                }
                has_items = true;
                let list_kind = fields
                    .get("kind")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                map.next_value_seed(ItemsSeed {
                    list_kind,
                    found: &mut items,
                    pending: &mut pending,
                })?;
            } else {
                let value: Value = map.next_value()?;
                if fields.insert(key.clone(), value).is_some() {
                    return Err(de::Error::custom(format_args!("duplicate field `{key}`")));
                }
            }
        }
        Ok(Document::Object {
            fields,
            items,
            pending,
        })
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Document, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Document::NotAnObject("a sequence"))
    }

    fn visit_bool<E>(self, _: bool) -> Result<Document, E> {
        Ok(Document::NotAnObject("a boolean"))
    }

    fn visit_i64<E>(self, _: i64) -> Result<Document, E> {
        Ok(Document::NotAnObject("a number"))
    }

    fn visit_u64<E>(self, _: u64) -> Result<Document, E> {
        Ok(Document::NotAnObject("a number"))
    }

    fn visit_i128<E>(self, _: i128) -> Result<Document, E> {
        Ok(Document::NotAnObject("a number"))
    }

    fn visit_u128<E>(self, _: u128) -> Result<Document, E> {
        Ok(Document::NotAnObject("a number"))
    }

    fn visit_f64<E>(self, _: f64) -> Result<Document, E> {
        Ok(Document::NotAnObject("a number"))
    }

    fn visit_str<E>(self, _: &str) -> Result<Document, E> {
        Ok(Document::NotAnObject("a string"))
    }

    fn visit_bytes<E>(self, _: &[u8]) -> Result<Document, E> {
        Ok(Document::NotAnObject("binary data"))
    }

    fn visit_unit<E>(self) -> Result<Document, E> {
        Ok(Document::NotAnObject("null"))
    }

    fn visit_none<E>(self) -> Result<Document, E> {
        Ok(Document::NotAnObject("null"))
    }

    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<Document, D::Error> {
        d.deserialize_any(self)
    }
}

/// A List's `items`, converted one item at a time.
struct ItemsSeed<'a> {
    list_kind: Option<String>,
    found: &'a mut Found,
    pending: &'a mut Vec<(usize, Value)>,
}

impl<'de> DeserializeSeed<'de> for ItemsSeed<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ItemsSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("`items`: a sequence of objects")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut index = 0;
        while let Some(item) = seq.next_element::<Value>()? {
            let has_kind = item.get("kind").is_some_and(|k| !k.is_null());
            match &self.list_kind {
                Some(list_kind) => use_item(index, item, list_kind, self.found),
                None if has_kind || !item.is_object() => use_item(index, item, "", self.found),
                None => self.pending.push((index, item)),
            }
            index += 1;
        }
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_none<E>(self) -> Result<(), E> {
        Ok(())
    }
}

impl Document {
    /// What the document contributes, once it is complete.
    fn into_found(self) -> Found {
        let (fields, items, pending) = match self {
            Document::NotAnObject(what) => {
                return Found {
                    problems: vec![Problem {
                        item: None,
                        kind: None,
                        object: None,
                        field: "<document>".into(),
                        message: format!("a Kubernetes object must be a mapping, not {what}"),
                    }],
                    ..Found::default()
                }
            }
            Document::Object {
                fields,
                items,
                pending,
            } => (fields, items, pending),
        };
        let kind = match fields.get("kind") {
            Some(Value::String(k)) if !k.is_empty() => k.clone(),
            other => {
                let message = match other {
                    None | Some(Value::Null) => "missing".into(),
                    Some(Value::String(_)) => "empty".into(),
                    Some(v) => format!("must be a string, not {}", json_type(v)),
                };
                return Found {
                    problems: vec![Problem {
                        item: None,
                        kind: None,
                        object: name_of(&Value::Object(fields)),
                        field: "kind".into(),
                        message,
                    }],
                    ..Found::default()
                };
            }
        };
        if is_list_kind(&kind) {
            let mut found = items;
            if !pending.is_empty() {
                for (index, item) in pending {
                    use_item(index, item, &kind, &mut found);
                }
                found.problems.sort_by_key(|p| p.item);
            }
            return found;
        }
        // Not a List: `items`, if there was one, is an unknown field like any other (Kubernetes
        // ignores those too), so what was read of it is dropped.
        let mut found = Found::default();
        use_object(Value::Object(fields), &kind, None, &mut found);
        found
    }
}

/// The YAML parser's options: the limits of this module, YAML 1.2 scalars (as serde_yaml read
/// them: `yes` is a string, `010` and `1_000` are strings), duplicate keys rejected.
fn yaml_options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_reader_input_bytes: Some(MAX_FILE_BYTES as usize),
            max_depth: MAX_DEPTH,
            flow_nesting_limit: MAX_DEPTH,
            max_aliases: MAX_ALIASES,
            max_anchors: MAX_ALIASES,
            // The file size bounds these (each event takes at least a byte or two); the defaults
            // (a million events, 250,000 nodes) would refuse a kubectl dump of a large cluster.
            max_events: MAX_FILE_BYTES as usize,
            max_nodes: MAX_FILE_BYTES as usize,
            max_total_scalar_bytes: MAX_FILE_BYTES as usize,
        },
        alias_limits: serde_saphyr::alias_limits! {
            max_total_replayed_events: MAX_ALIAS_EXPANSION,
        },
        strict_booleans: true,
        leading_zero_numbers_as_strings: true,
        underscored_numbers_as_strings: true,
        with_snippet: false,
    }
}

/// Appended to the message of a YAML document that broke one of the limits.
fn limits_hint() -> String {
    format!(
        " (the file source's YAML limits: nesting depth {MAX_DEPTH}, {MAX_ALIASES} anchors and \
         {MAX_ALIASES} aliases, {MAX_ALIAS_EXPANSION} events replayed from aliases, per document)"
    )
}

/// Whether serde-saphyr's message is about one of [`yaml_options`]' limits rather than the syntax.
/// (Its nesting limit comes from the parser as a plain message, so the text is what tells.)
fn is_limit(message: &str) -> bool {
    [
        "budget breached",
        "recursion limit exceeded",
        "alias replay",
        "alias expansion",
    ]
    .iter()
    .any(|m| message.contains(m))
}

/// Whether a file is parsed as JSON (by its name) rather than YAML.
fn is_json(file: &Path) -> bool {
    file.extension().is_some_and(|e| e == "json")
}

/// Parses one manifest file's text: YAML, or JSON when the file is named `*.json`. Errors name the
/// file, the object (`namespace/name` when readable, else the document index) and the field.
pub fn parse_manifests(file: &Path, text: &str) -> ParsedFile {
    let mut out = ParsedFile::default();
    let add = |out: &mut ParsedFile, doc: usize, found: Found| {
        out.services.extend(found.services);
        out.slices.extend(found.slices);
        out.nodes.extend(found.nodes);
        out.errors.extend(
            found
                .problems
                .into_iter()
                .map(|p| p.into_invalid(file, doc)),
        );
    };
    let syntax = |doc: usize, line: Option<u64>, message: String| {
        Problem {
            item: None,
            kind: None,
            object: None,
            field: line.map_or_else(|| "<document>".into(), |l| format!("line {l}")),
            message,
        }
        .into_invalid(file, doc)
    };
    if is_json(file) {
        let stream = serde_json::Deserializer::from_str(text).into_iter::<Document>();
        for (i, doc) in stream.enumerate() {
            match doc {
                Ok(doc) => add(&mut out, i, doc.into_found()),
                Err(e) => {
                    out.errors
                        .push(syntax(i, Some(e.line() as u64), e.to_string()));
                    break;
                }
            }
        }
    } else {
        let mut reader = text.as_bytes();
        let stream = serde_saphyr::read_with_options::<_, Document>(&mut reader, yaml_options());
        for (i, doc) in stream.enumerate() {
            match doc {
                Ok(doc) => add(&mut out, i, doc.into_found()),
                // The iterator goes on after an error inside a document, and ends after a syntax
                // error or a broken limit.
                Err(e) => {
                    let line = e.location().map(|l| l.line());
                    let mut message = e.without_snippet().to_string();
                    if is_limit(&message) {
                        message.push_str(&limits_hint());
                    }
                    out.errors.push(syntax(i, line, message));
                }
            }
        }
    }
    out
}

/// A problem with a directory entry as a whole (not with a document in it).
fn file_error(path: &Path, field: &str, message: impl Into<String>) -> InvalidObject {
    InvalidObject {
        file: Some(path.to_path_buf()),
        kind: "file".into(),
        object: path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        field: field.into(),
        message: message.into(),
    }
}

/// Reads and parses one regular file, with the size bound checked before and while reading (the
/// file may grow in between). Opening does not block on a FIFO.
fn read_and_parse(path: &Path) -> ParsedFile {
    use std::os::unix::fs::OpenOptionsExt;
    let only = |e: InvalidObject| ParsedFile {
        errors: vec![e],
        ..ParsedFile::default()
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path);
    let file = match file {
        Ok(f) => f,
        Err(e) => return only(file_error(path, "read", e.to_string())),
    };
    match file.metadata() {
        Ok(m) if m.is_file() => {}
        Ok(_) => return only(file_error(path, "type", "not a regular file")),
        Err(e) => return only(file_error(path, "read", e.to_string())),
    }
    let mut bytes = Vec::new();
    if let Err(e) = file.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes) {
        return only(file_error(path, "read", e.to_string()));
    }
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return only(too_large(path, bytes.len() as u64));
    }
    match String::from_utf8(bytes) {
        Ok(text) => parse_manifests(path, &text),
        Err(e) => only(file_error(
            path,
            "encoding",
            format!(
                "not UTF-8 (invalid byte at offset {})",
                e.utf8_error().valid_up_to()
            ),
        )),
    }
}

fn too_large(path: &Path, len: u64) -> InvalidObject {
    file_error(
        path,
        "size",
        format!(
            "{len} bytes, over the file source's limit of {MAX_FILE_BYTES} bytes: not read \
             (split it into several files)"
        ),
    )
}

/// A directory entry with a manifest's name.
#[derive(Debug)]
enum Entry {
    /// A regular file (possibly through a symbolic link): its modification time and size.
    File(Option<SystemTime>, u64),
    /// Something that cannot be read as a manifest: why.
    Unusable(InvalidObject),
}

fn entry(path: &Path) -> Entry {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => Entry::File(m.modified().ok(), m.len()),
        Ok(m) if m.is_dir() => Entry::Unusable(file_error(
            path,
            "type",
            "a directory, not a manifest file (the file source does not read subdirectories)",
        )),
        Ok(_) => Entry::Unusable(file_error(path, "type", "not a regular file")),
        Err(e) => {
            let message = match std::fs::read_link(path) {
                Ok(target) if e.kind() == std::io::ErrorKind::NotFound => format!(
                    "a symbolic link to {}, which does not exist",
                    target.display()
                ),
                _ => e.to_string(),
            };
            Entry::Unusable(file_error(path, "type", message))
        }
    }
}

/// What the directory serves: every file's objects, converted, and every problem.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Listing {
    pub services: Vec<ServiceEntry>,
    pub slices: Vec<SliceEntry>,
    pub nodes: Vec<NodeEntry>,
    pub errors: Vec<InvalidObject>,
}

impl Listing {
    /// The zone of the Node named `node` (the first such manifest); `None` without one.
    pub fn zone_of(&self, node: &str) -> Option<String> {
        self.nodes
            .iter()
            .find(|n| n.name == node)
            .and_then(|n| n.zone.clone())
    }

    /// Converts a parsed file's objects, dropping the Kubernetes objects.
    fn convert(parsed: ParsedFile, default_algorithm: Algorithm) -> Listing {
        Listing {
            services: parsed
                .services
                .iter()
                .map(|s| ServiceEntry::new(s, default_algorithm))
                .collect(),
            slices: parsed.slices.iter().map(SliceEntry::new).collect(),
            nodes: parsed.nodes,
            errors: parsed.errors,
        }
    }
}

/// Reads a directory of manifests, re-parsing only the files that changed since the last call.
/// What it keeps of a file is its converted listing, not the Kubernetes objects.
#[derive(Debug)]
pub struct ManifestDir {
    dir: PathBuf,
    default_algorithm: Algorithm,
    cache: HashMap<PathBuf, (Option<SystemTime>, u64, Listing)>,
    /// The files and the problems outside any file of the last load, to tell a load that found
    /// nothing new.
    last: Option<(Vec<PathBuf>, Vec<InvalidObject>)>,
}

impl ManifestDir {
    /// `default_algorithm` is the node's `--balance`, for Services that do not choose their own.
    pub fn new(dir: impl Into<PathBuf>, default_algorithm: Algorithm) -> Self {
        ManifestDir {
            dir: dir.into(),
            default_algorithm,
            cache: HashMap::new(),
            last: None,
        }
    }

    /// Every entry named `*.yaml`, `*.yml` or `*.json`, whatever it is, sorted by name.
    fn manifest_names(&self) -> std::io::Result<Vec<PathBuf>> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(&self.dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                matches!(
                    p.extension().and_then(|e| e.to_str()),
                    Some("yaml" | "yml" | "json")
                )
            })
            .collect();
        files.sort();
        Ok(files)
    }

    /// Loads the directory: every Service, every EndpointSlice, every problem.
    pub fn load(&mut self) -> Listing {
        self.load_changed()
            .unwrap_or_else(|| self.listing(&self.last.clone().unwrap_or_default()))
    }

    /// Loads the directory, or returns `None` when no file and no problem changed since the last
    /// load: a periodic rescan of an unchanged directory costs a `stat` per file, not a listing.
    pub fn load_changed(&mut self) -> Option<Listing> {
        let names = match self.manifest_names() {
            Ok(f) => f,
            Err(e) => {
                let error = InvalidObject {
                    file: Some(self.dir.clone()),
                    kind: "directory".into(),
                    object: self.dir.display().to_string(),
                    field: "<directory>".into(),
                    message: e.to_string(),
                };
                return self.changed_to((Vec::new(), vec![error]), true);
            }
        };
        let mut files = Vec::new();
        let mut changed = Vec::new();
        let mut outside = Vec::new();
        for path in names {
            match entry(&path) {
                Entry::File(mtime, len) => {
                    let fresh = self
                        .cache
                        .get(&path)
                        .is_some_and(|(t, l, _)| *t == mtime && *l == len);
                    if !fresh {
                        changed.push((path.clone(), mtime, len));
                    }
                    files.push(path);
                }
                Entry::Unusable(e) => outside.push(e),
            }
        }
        self.cache.retain(|p, _| files.contains(p));
        let reparsed = !changed.is_empty();
        for (path, mtime, len, parsed) in parse_all(changed, self.default_algorithm) {
            self.cache.insert(path, (mtime, len, parsed));
        }
        self.changed_to((files, outside), reparsed)
    }

    /// Records `now` as the last load; the listing when it or a file differs from the last.
    fn changed_to(
        &mut self,
        now: (Vec<PathBuf>, Vec<InvalidObject>),
        reparsed: bool,
    ) -> Option<Listing> {
        if !reparsed && self.last.as_ref() == Some(&now) {
            return None;
        }
        let listing = self.listing(&now);
        self.last = Some(now);
        Some(listing)
    }

    /// The problems outside any file, then every cached file's objects (in file order), sized
    /// exactly: growing the vectors by doubling costs spare capacity at 20,000 Services.
    fn listing(&self, (files, outside): &(Vec<PathBuf>, Vec<InvalidObject>)) -> Listing {
        let cached: Vec<&Listing> = files
            .iter()
            .filter_map(|p| self.cache.get(p))
            .map(|c| &c.2)
            .collect();
        let mut all = Listing {
            errors: outside.clone(),
            ..Listing::default()
        };
        all.services
            .reserve_exact(cached.iter().map(|p| p.services.len()).sum());
        all.slices
            .reserve_exact(cached.iter().map(|p| p.slices.len()).sum());
        for parsed in cached {
            all.services.extend(parsed.services.iter().cloned());
            all.slices.extend(parsed.slices.iter().cloned());
            all.nodes.extend(parsed.nodes.iter().cloned());
            all.errors.extend(parsed.errors.iter().cloned());
        }
        all
    }
}

type Changed = (PathBuf, Option<SystemTime>, u64);

/// Reads and parses the changed files, on up to one thread per core, so that a large file does
/// not hold up the small ones more than it must. A file whose size is over the bound is reported
/// without being opened.
fn parse_all(
    changed: Vec<Changed>,
    default_algorithm: Algorithm,
) -> Vec<(PathBuf, Option<SystemTime>, u64, Listing)> {
    let parse = |(path, mtime, len): &Changed| {
        let parsed = if *len > MAX_FILE_BYTES {
            ParsedFile {
                errors: vec![too_large(path, *len)],
                ..ParsedFile::default()
            }
        } else {
            read_and_parse(path)
        };
        let mut listing = Listing::convert(parsed, default_algorithm);
        // The cache lives as long as the source: no spare capacity.
        listing.services.shrink_to_fit();
        listing.slices.shrink_to_fit();
        (path.clone(), *mtime, *len, listing)
    };
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(changed.len());
    if threads <= 1 {
        return changed.iter().map(parse).collect();
    }
    let next = AtomicUsize::new(0);
    let done = Mutex::new(Vec::with_capacity(changed.len()));
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(c) = changed.get(i) else { break };
                let parsed = parse(c);
                done.lock().unwrap_or_else(|p| p.into_inner()).push(parsed);
            });
        }
    });
    done.into_inner().unwrap_or_else(|p| p.into_inner())
}

/// What the source last told the tracker about the node's zone (`None`: nothing yet).
#[derive(Debug, Default)]
struct NodeZone {
    node_name: String,
    sent: Option<Option<String>>,
}

/// Loads the directory on a blocking thread and sends the listing if anything changed since the
/// last, the node's zone first when that changed. `None` when the receiver is gone.
async fn send_listing(
    dir: ManifestDir,
    zone: &mut NodeZone,
    tx: &mpsc::Sender<SourceEvent>,
) -> Option<ManifestDir> {
    let loaded = tokio::task::spawn_blocking(move || {
        let mut dir = dir;
        let listing = dir.load_changed();
        (dir, listing)
    })
    .await;
    let (dir, listing) = match loaded {
        Ok(l) => l,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => return None,
    };
    let Some(listing) = listing else {
        return Some(dir);
    };
    let node_zone = listing.zone_of(&zone.node_name);
    if zone.sent.as_ref() != Some(&node_zone) {
        zone.sent = Some(node_zone.clone());
        if tx.send(SourceEvent::NodeZone(node_zone)).await.is_err() {
            return None;
        }
    }
    let source = format!("file:{}", dir.dir.display());
    let sent = tx
        .send(SourceEvent::SourceErrors {
            source,
            errors: listing.errors,
        })
        .await
        .is_ok()
        && tx
            .send(SourceEvent::ReplaceServices(listing.services))
            .await
            .is_ok()
        && tx
            .send(SourceEvent::ReplaceSlices(listing.slices))
            .await
            .is_ok();
    sent.then_some(dir)
}

/// Runs the file source until the receiver goes away: an initial listing, `Synced`, then a new
/// listing whenever the directory changes (inotify, with a periodic rescan as a safety net).
/// `default_algorithm` is the node's `--balance`; `node_name` picks the Node manifest that gives
/// the node its zone.
pub async fn run(
    dir: PathBuf,
    tx: mpsc::Sender<SourceEvent>,
    rescan: Duration,
    default_algorithm: Algorithm,
    node_name: String,
) -> Result<(), notify::Error> {
    let mut zone = NodeZone {
        node_name,
        sent: None,
    };
    let (wake_tx, mut wake_rx) = mpsc::channel::<()>(1);
    let mut watcher = notify::recommended_watcher(move |_res: notify::Result<notify::Event>| {
        let _ = wake_tx.try_send(());
    })?;
    watcher.watch(&dir, notify::RecursiveMode::NonRecursive)?;
    let Some(mut manifests) =
        send_listing(ManifestDir::new(&dir, default_algorithm), &mut zone, &tx).await
    else {
        return Ok(());
    };
    if tx.send(SourceEvent::Synced).await.is_err() {
        return Ok(());
    }
    loop {
        tokio::select! {
            woke = wake_rx.recv() => {
                if woke.is_none() { return Ok(()); }
                // Editors write in several steps: let them finish before re-reading.
                tokio::time::sleep(Duration::from_millis(50)).await;
                while wake_rx.try_recv().is_ok() {}
            }
            _ = tokio::time::sleep(rescan) => {}
        }
        match send_listing(manifests, &mut zone, &tx).await {
            Some(m) => manifests = m,
            None => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests;
