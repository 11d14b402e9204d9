//! The `file:DIR` source: a directory of Service and EndpointSlice manifests, reloaded on change.
//!
//! Every `*.yaml`, `*.yml` and `*.json` file in the directory is read (multi-document YAML allowed).
//! A file that does not parse is reported with its path, the document and the field; the objects of
//! every other file, and the valid documents of the same file, keep being served. Files are re-read
//! only when their modification time or size changed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use notify::Watcher;
use serde::Deserialize;
use tokio::sync::mpsc;

use super::SourceEvent;
use crate::error::InvalidObject;

/// What one manifest file holds.
#[derive(Debug, Default, Clone)]
pub struct ParsedFile {
    pub services: Vec<Service>,
    pub slices: Vec<EndpointSlice>,
    pub errors: Vec<InvalidObject>,
}

fn doc_error(
    file: &Path,
    doc: usize,
    object: Option<String>,
    field: String,
    message: String,
) -> InvalidObject {
    InvalidObject {
        file: Some(file.to_path_buf()),
        kind: "document".into(),
        object: object.unwrap_or_else(|| format!("#{doc}")),
        field,
        message,
    }
}

fn typed<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> Result<T, (String, String)> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        (
            if path == "." {
                "<document>".into()
            } else {
                path
            },
            e.into_inner().to_string(),
        )
    })
}

/// Parses one manifest file's text. Errors name the file, the document (index, or namespace/name
/// when readable) and the field.
pub fn parse_manifests(file: &Path, text: &str) -> ParsedFile {
    let mut out = ParsedFile::default();
    for (i, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let value = match serde_yaml::Value::deserialize(doc) {
            Ok(serde_yaml::Value::Null) => continue,
            Ok(v) => v,
            Err(e) => {
                let loc = e
                    .location()
                    .map(|l| format!("line {}", l.line()))
                    .unwrap_or_else(|| "<document>".into());
                out.errors
                    .push(doc_error(file, i, None, loc, e.to_string()));
                break;
            }
        };
        let json = match serde_json::to_value(&value) {
            Ok(j) => j,
            Err(e) => {
                out.errors
                    .push(doc_error(file, i, None, "<document>".into(), e.to_string()));
                continue;
            }
        };
        let name = json.get("metadata").and_then(|m| {
            let n = m.get("name")?.as_str()?;
            let ns = m
                .get("namespace")
                .and_then(|v| v.as_str())
                .unwrap_or("default");
            Some(format!("{ns}/{n}"))
        });
        let kind = json
            .get("kind")
            .and_then(|k| k.as_str())
            .unwrap_or("")
            .to_string();
        let result = match kind.as_str() {
            "Service" => typed::<Service>(json).map(|s| out.services.push(s)),
            "EndpointSlice" => typed::<EndpointSlice>(json).map(|s| out.slices.push(s)),
            "" => Err(("kind".into(), "missing".into())),
            other => {
                tracing::debug!(file = %file.display(), "ignoring document {i} of kind {other}");
                Ok(())
            }
        };
        if let Err((field, message)) = result {
            let mut err = doc_error(file, i, name, field, message);
            if !kind.is_empty() {
                err.kind = kind;
            }
            out.errors.push(err);
        }
    }
    out
}

/// Reads a directory of manifests, re-parsing only the files that changed since the last call.
#[derive(Debug, Default)]
pub struct ManifestDir {
    dir: PathBuf,
    cache: HashMap<PathBuf, (Option<SystemTime>, u64, ParsedFile)>,
}

impl ManifestDir {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        ManifestDir {
            dir: dir.into(),
            cache: HashMap::new(),
        }
    }

    fn manifest_files(&self) -> std::io::Result<Vec<PathBuf>> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(&self.dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file())
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
    pub fn load(&mut self) -> ParsedFile {
        let mut all = ParsedFile::default();
        let files = match self.manifest_files() {
            Ok(f) => f,
            Err(e) => {
                all.errors.push(doc_error(
                    &self.dir,
                    0,
                    Some("<directory>".into()),
                    "<directory>".into(),
                    e.to_string(),
                ));
                return all;
            }
        };
        self.cache.retain(|p, _| files.contains(p));
        for path in &files {
            let meta = std::fs::metadata(path).ok();
            let (mtime, len) = (
                meta.as_ref().and_then(|m| m.modified().ok()),
                meta.as_ref().map_or(0, |m| m.len()),
            );
            let fresh = self
                .cache
                .get(path)
                .is_some_and(|(t, l, _)| *t == mtime && *l == len);
            if !fresh {
                let mut parsed = match std::fs::read_to_string(path) {
                    Ok(text) => parse_manifests(path, &text),
                    Err(e) => ParsedFile {
                        errors: vec![doc_error(path, 0, None, "<file>".into(), e.to_string())],
                        ..Default::default()
                    },
                };
                // The cache lives as long as the source: no spare capacity (k8s objects are
                // large, ~1 KiB each before their strings).
                parsed.services.shrink_to_fit();
                parsed.slices.shrink_to_fit();
                self.cache.insert(path.clone(), (mtime, len, parsed));
            }
        }
        self.listing(&files, all)
    }

    /// Copies every cached file's objects (in file order) into `all`, sized exactly: growing the
    /// vectors by doubling cost ~40 MiB of spare capacity at 20,000 Services.
    fn listing(&self, files: &[PathBuf], mut all: ParsedFile) -> ParsedFile {
        let cached: Vec<&ParsedFile> = files
            .iter()
            .filter_map(|p| self.cache.get(p))
            .map(|c| &c.2)
            .collect();
        all.services
            .reserve_exact(cached.iter().map(|p| p.services.len()).sum());
        all.slices
            .reserve_exact(cached.iter().map(|p| p.slices.len()).sum());
        for parsed in cached {
            all.services.extend(parsed.services.iter().cloned());
            all.slices.extend(parsed.slices.iter().cloned());
            all.errors.extend(parsed.errors.iter().cloned());
        }
        all
    }
}

async fn send_listing(dir: &mut ManifestDir, tx: &mpsc::Sender<SourceEvent>) -> bool {
    let parsed = dir.load();
    let source = format!("file:{}", dir.dir.display());
    tx.send(SourceEvent::SourceErrors {
        source,
        errors: parsed.errors,
    })
    .await
    .is_ok()
        && tx
            .send(SourceEvent::ReplaceServices(parsed.services))
            .await
            .is_ok()
        && tx
            .send(SourceEvent::ReplaceSlices(parsed.slices))
            .await
            .is_ok()
}

/// Runs the file source until the receiver goes away: an initial listing, `Synced`, then a new
/// listing whenever the directory changes (inotify, with a periodic rescan as a safety net).
pub async fn run(
    dir: PathBuf,
    tx: mpsc::Sender<SourceEvent>,
    rescan: Duration,
) -> Result<(), notify::Error> {
    let (wake_tx, mut wake_rx) = mpsc::channel::<()>(1);
    let mut watcher = notify::recommended_watcher(move |_res: notify::Result<notify::Event>| {
        let _ = wake_tx.try_send(());
    })?;
    watcher.watch(&dir, notify::RecursiveMode::NonRecursive)?;
    let mut manifests = ManifestDir::new(&dir);
    if !send_listing(&mut manifests, &tx).await || tx.send(SourceEvent::Synced).await.is_err() {
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
        if !send_listing(&mut manifests, &tx).await {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_document_names_file_document_and_field_and_keeps_the_rest() {
        let text = "apiVersion: v1\nkind: Service\nmetadata: {name: good}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: bad, namespace: shop}\nspec: {clusterIP: 10.96.0.2, ports: [{port: eighty}]}\n";
        let p = parse_manifests(Path::new("/m/svc.yaml"), text);
        assert_eq!(p.services.len(), 1);
        assert_eq!(p.errors.len(), 1);
        let msg = p.errors[0].to_string();
        assert!(
            msg.starts_with("/m/svc.yaml: Service shop/bad: spec.ports[0].port: invalid type"),
            "{msg}"
        );
    }

    #[test]
    fn yaml_syntax_error_names_the_line() {
        let p = parse_manifests(
            Path::new("/m/x.yaml"),
            "kind: Service\nmetadata: {name: [\n",
        );
        assert_eq!(p.errors.len(), 1);
        assert!(
            p.errors[0]
                .to_string()
                .starts_with("/m/x.yaml: document #0: line"),
            "{}",
            p.errors[0]
        );
    }

    #[test]
    fn missing_kind_is_an_error_and_other_kinds_are_ignored() {
        let p = parse_manifests(
            Path::new("/m/y.yaml"),
            "metadata: {name: a}\n---\nkind: ConfigMap\nmetadata: {name: b}\n",
        );
        assert_eq!(p.errors.len(), 1);
        assert_eq!(p.errors[0].field, "kind");
    }
}
